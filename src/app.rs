//! The composition root of `kube-overcommit serve`: builds and wires every part, then shuts
//! them down in one ordered place. The parts take small values (metrics, readiness flags, the
//! shutdown signal) and know nothing of each other.
//!
//! Start: metrics, readiness, certificate (read once before listening), policy source,
//! webhook port, probe port, leader. Shutdown on SIGTERM/SIGINT: `/readyz` fails at once, new
//! connections are still accepted for `--shutdown-delay` (while endpoints update; every HTTP/1.1
//! response then says `Connection: close`, so clients retire keep-alive connections), then the
//! listener closes and open connections drain (requests in flight finish; HTTP/1.1 gets
//! `Connection: close`, HTTP/2 a GOAWAY); background tasks stop; the process exits within
//! `--shutdown-grace` whatever happens. A second signal exits at once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::signal::unix::{Signal as UnixSignal, SignalKind, signal};
use tokio::task::JoinHandle;

use crate::admission::{Clock, Settings};
use crate::duration::duration_arg;
use crate::events::{EventMetrics, Recorder};
use crate::leader::{self, LeaderArgs, readiness::ServedCertificate};
use crate::metrics::Metrics;
use crate::probes::{self, ProbeArgs, Readiness, ReadyFlag};
use crate::server::metrics::ServerMetrics;
use crate::server::serving_cert::{CertReloader, CertResolver};
use crate::server::{Server, ServerArgs, tls_config};
use crate::shutdown::{self, Signal, Trigger};
use crate::sources::metrics::{PolicyMetrics, UsageMetrics};
use crate::sources::pod_cache::PodCache;
use crate::sources::usage::UsageCaches;
use crate::sources::{self, PolicyStore, SourceArgs, file::FileSource};
use crate::webhook::{Webhook, WebhookMetrics};

/// Flags of `serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub server: ServerArgs,

    #[command(flatten)]
    pub probes: ProbeArgs,

    #[command(flatten)]
    pub source: SourceArgs,

    #[command(flatten)]
    pub leader: LeaderArgs,

    /// The webhook's own namespace (its pods are never mutated). Falls back to POD_NAMESPACE,
    /// then the service account's namespace file.
    #[arg(long, env = "KUBE_OVERCOMMIT_NAMESPACE")]
    pub namespace: Option<String>,

    /// After SIGTERM, keep accepting new connections this long (while the Service's endpoints
    /// drop this replica) before draining, answering HTTP/1.1 requests with `Connection: close`
    /// so that clients retire their keep-alive connections. Counts against --shutdown-grace.
    #[arg(long, env = "KUBE_OVERCOMMIT_SHUTDOWN_DELAY", default_value = "0s", value_parser = duration_arg)]
    pub shutdown_delay: Duration,

    /// Do not watch the TLS directory and the policy file for changes (for filesystems without
    /// inotify); rely on the periodic re-reads alone.
    #[arg(long, env = "KUBE_OVERCOMMIT_NO_FILE_WATCH")]
    pub no_file_watch: bool,

    /// Shut down (as on SIGTERM) when the process with this id is gone: tests pass their own
    /// id so that nothing they start outlives them.
    #[arg(long, env = "KUBE_OVERCOMMIT_EXIT_WITH_PID", hide = true)]
    pub exit_with_pid: Option<u32>,

    /// The process exits at most this long after SIGTERM, drained or not.
    #[arg(long, env = "KUBE_OVERCOMMIT_SHUTDOWN_GRACE", default_value = "25s", value_parser = duration_arg)]
    pub shutdown_grace: Duration,

    /// Serve POST /validate: the placement cap of OvercommitPolicy spec.requestCap, checked on
    /// pods/binding and on pods created with spec.nodeName. Watches every node and every
    /// non-terminal pod (in-cluster config or KUBECONFIG).
    #[arg(long, env = "KUBE_OVERCOMMIT_REQUEST_CAP")]
    pub request_cap: bool,

    /// Quiet heartbeats: on a node this webhook inflates, a status update whose conditions
    /// differ from the stored ones only in their lastHeartbeatTime gets the stored times back
    /// while those are younger than this, so that it stores nothing. Set it to the kubelets'
    /// nodeStatusReportFrequency (5m by default, the default here too): a heartbeat is then
    /// stored as often as on a node without the webhook. 0 turns it off. The leader compiles it
    /// into the in-process policy too (`--mode`).
    #[arg(long, env = "KUBE_OVERCOMMIT_HEARTBEAT_REFRESH", default_value = "5m", value_parser = duration_arg)]
    pub heartbeat_refresh: Duration,

    /// Which path serves the static policies' node rule: `webhook` (this server),
    /// `in-process` (the leader keeps them compiled into a MutatingAdmissionPolicy and binding
    /// that the API server runs; refuses to start where the API server does not serve
    /// admissionregistration.k8s.io/v1 mutatingadmissionpolicies and bindings), or `auto`
    /// (in-process where served, webhook otherwise). Policies with spec.usage,
    /// spec.requestCap or spec.rollout stay on the webhook.
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_MODE",
        value_enum,
        default_value = "webhook"
    )]
    pub mode: crate::mode::Mode,

    /// In-process mode: who writes the compiled MutatingAdmissionPolicy. `leader`: the leader
    /// updates the one the install ships (deploy/components/in-process; it cannot create it);
    /// `operator`: nothing here writes it or its binding, the operator applies
    /// `compile-inprocess`'s output (deploy/components/in-process-operator). Either way the
    /// webhook leaves the static policies' nodes to it only while both objects are what this
    /// replica compiles from the policies in force.
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_IN_PROCESS_POLICY",
        value_enum,
        default_value = "leader"
    )]
    pub in_process_policy: crate::mode::InProcessPolicy,

    /// Usage policies (spec.usage): list NodeMetrics from metrics.k8s.io this often. A node's
    /// newest sample older (by its own timestamp) than its window plus 3 intervals, or a failed
    /// poll, makes its policy fall back to nodeRatios. The poller and the pod watch run only
    /// while a policy with spec.usage is in force.
    #[arg(long, env = "KUBE_OVERCOMMIT_USAGE_INTERVAL", default_value = "30s", value_parser = duration_arg)]
    pub usage_interval: Duration,
}

const SA_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

fn own_namespace(flag: Option<&str>) -> String {
    if let Some(ns) = flag.filter(|s| !s.is_empty()) {
        return ns.to_owned();
    }
    if let Ok(ns) = std::env::var("POD_NAMESPACE")
        && !ns.is_empty()
    {
        return ns;
    }
    match std::fs::read_to_string(SA_NAMESPACE_FILE) {
        Ok(ns) if !ns.trim().is_empty() => ns.trim().to_owned(),
        _ => "kube-overcommit".to_owned(),
    }
}

/// Resolves when process `pid` no longer exists; never for `None`.
async fn process_gone(pid: Option<u32>) {
    let Some(pid) = pid else {
        return std::future::pending().await;
    };
    let proc_dir = std::path::PathBuf::from(format!("/proc/{pid}"));
    while proc_dir.exists() {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The leader's readiness gate reads the leaf the server's resolver serves.
impl ServedCertificate for CertResolver {
    fn leaf_der(&self) -> Option<Vec<u8>> {
        CertResolver::leaf_der(self)
    }
}

/// What every part shares.
struct Shared {
    metrics: Arc<Metrics>,
    readiness: Readiness,
    shutdown: Signal,
    namespace: String,
    /// `serve`'s one Kubernetes client, or why there is none.
    cluster: Result<Cluster, String>,
}

/// The one Kubernetes client of `serve`, built here and handed to every part (clones share its
/// connection pool), and the configuration it came from, for the one part that needs variants
/// of it (the usage task: its own User-Agent, and no retries for metrics.k8s.io).
#[derive(Clone)]
struct Cluster {
    config: kube::Config,
    client: kube::Client,
}

impl Cluster {
    /// In-cluster configuration or KUBECONFIG, as `kube::Client::try_default`. The error is
    /// kept as text: parts that need the API server fail with it and their own reason, the
    /// others run without one (`--policy-file` alone).
    async fn infer() -> Result<Self, String> {
        let config = kube::Config::infer()
            .await
            .map_err(|e| kube::Error::InferConfig(e).to_string())?;
        let client = kube::Client::try_from(config.clone()).map_err(|e| e.to_string())?;
        Ok(Self { config, client })
    }
}

impl Shared {
    /// The client, or why there is none.
    fn client(&self) -> Result<kube::Client, String> {
        self.cluster
            .as_ref()
            .map(|c| c.client.clone())
            .map_err(Clone::clone)
    }
}

/// What runs until shutdown.
struct Running {
    not_shutting_down: ReadyFlag,
    server: JoinHandle<()>,
    /// Stopped after the webhook port drained.
    background: Vec<JoinHandle<()>>,
    leader: Option<leader::Running>,
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let (trigger, signal) = shutdown::channel();
    let readiness = Readiness::new();
    let not_shutting_down = readiness.condition("not-shutting-down", true);
    let shared = Shared {
        metrics: Arc::new(Metrics::new()),
        readiness,
        shutdown: signal,
        namespace: own_namespace(args.namespace.as_deref()),
        cluster: Cluster::infer().await,
    };
    let mut running = start(&args, &shared, not_shutting_down).await?;
    let mut signals = Signals::install()?;
    let which = tokio::select! {
        which = signals.first(args.exit_with_pid) => which,
        r = &mut running.server => {
            anyhow::bail!("webhook server stopped unexpectedly: {r:?}");
        }
    };
    shut_down(&args, running, trigger, signals, which).await;
    Ok(())
}

/// Start every part; returns what runs until shutdown.
async fn start(
    args: &ServeArgs,
    shared: &Shared,
    not_shutting_down: ReadyFlag,
) -> anyhow::Result<Running> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cert_ready = shared.readiness.condition("certificate", false);
    let policies_synced = shared.readiness.condition("policies", false);
    // Each part registers its own metrics in the one registry.
    let server_metrics = shared.metrics.with_registry(ServerMetrics::new);
    let (resolver, reloader) =
        load_certificate(args, shared, provider.clone(), cert_ready, &server_metrics);
    let policy_metrics = shared.metrics.with_registry(PolicyMetrics::new);
    let store = PolicyStore::new(policy_metrics, policies_synced);
    let source = start_policy_source(args, shared, store.clone())?;
    let in_process = in_process_context(args, shared, &store).await?;
    let path = in_process.path;

    // The lean pod index both the usage rule and the request cap read, fed by one pod watch.
    let usage_metrics = shared.metrics.with_registry(UsageMetrics::new);
    let pods = PodCache::new(usage_metrics.clone());
    let usage = UsageCaches::new(usage_metrics, args.usage_interval, pods.clone());
    let (detail, in_force) = (usage.clone(), store.clone());
    shared.readiness.add_detail("usage", move || {
        detail.detail(in_force.current().has_usage())
    });
    let (events, events_task) = start_events(args, shared).await;
    let (placement, placement_tasks) = start_placement(args, shared, &pods, &events).await?;
    let usage_task = start_usage(args, shared, store.clone(), usage.clone(), args.request_cap)?;
    let settings = Settings {
        own_namespace: shared.namespace.clone(),
        heartbeat_refresh: args.heartbeat_refresh,
        clock: Clock::System,
        usage: Some(usage.clone()),
        in_process: in_process.flag.clone(),
    };
    let webhook = webhook(args, shared, &store, settings, placement);
    let server = Server::bind(
        &args.server,
        tls_config(&args.server, provider, resolver.clone())?,
        webhook,
        server_metrics,
    )
    .await?;
    let webhook_addr = server.local_addr()?;
    let (probe_addr, probe_serve) = probes::bind(
        &args.probes,
        shared.readiness.clone(),
        shared.metrics.clone(),
        shared.shutdown.clone(),
    )
    .await?;
    log_listening(args, shared, webhook_addr, probe_addr);

    let reloader = tokio::spawn(reloader.run(
        args.server.cert_reload_interval,
        !args.no_file_watch,
        shared.shutdown.clone(),
    ));
    let probes = tokio::spawn(probe_serve);
    let server = tokio::spawn(server.run(shared.shutdown.clone()));
    let leader = start_leader(args, shared, resolver, in_process, events, usage).await?;
    if path == crate::mode::Path::InProcess && leader.is_none() {
        anyhow::bail!(
            "--mode {}: the leader keeps the compiled policy, and the leader part is off (--leader-election=false)",
            args.mode.as_str()
        );
    }
    Ok(Running {
        not_shutting_down,
        server,
        background: [reloader, source, probes, usage_task]
            .into_iter()
            .chain(placement_tasks)
            .chain(events_task)
            .collect(),
        leader,
    })
}

/// The handler of both endpoints, with its metrics.
fn webhook(
    args: &ServeArgs,
    shared: &Shared,
    store: &PolicyStore,
    settings: Settings,
    placement: Option<Arc<dyn crate::placement::PlacementSource>>,
) -> Arc<Webhook> {
    Arc::new(Webhook {
        policies: store.cell(),
        settings,
        metrics: shared.metrics.with_registry(WebhookMetrics::new),
        max_body_bytes: usize::try_from(args.server.max_body_bytes).unwrap_or(usize::MAX),
        body_timeout: args.server.body_read_timeout,
        placement,
    })
}

/// The static policies' path (`--mode`, decided once here) and what the in-process parts share.
async fn in_process_context(
    args: &ServeArgs,
    shared: &Shared,
    store: &PolicyStore,
) -> anyhow::Result<leader::in_process::InProcessContext> {
    let path = crate::mode::resolve(args.mode, shared.client().ok().as_ref()).await?;
    tracing::info!(
        mode = args.mode.as_str(),
        path = path.as_str(),
        in_process_policy = args.in_process_policy.as_str(),
        "static policies' path"
    );
    Ok(leader::in_process::InProcessContext {
        path,
        writer: args.in_process_policy,
        policies: store.clone(),
        heartbeat_refresh: args.heartbeat_refresh,
        nudger: leader::service_account_user(&shared.namespace, &args.leader.service_account),
        flag: Default::default(),
        in_force: shared
            .metrics
            .with_registry(leader::in_process::in_force_gauge),
    })
}

fn log_listening(args: &ServeArgs, shared: &Shared, webhook: SocketAddr, probes: SocketAddr) {
    tracing::info!(
        webhook = %webhook,
        probes = %probes,
        namespace = %shared.namespace,
        policy_source = if args.source.policy_file.is_some() { "file" } else { "crd" },
        "listening"
    );
}

/// The certificate: read once now so that a mounted pair serves from the first connection.
fn load_certificate(
    args: &ServeArgs,
    shared: &Shared,
    provider: Arc<rustls::crypto::CryptoProvider>,
    cert_ready: ReadyFlag,
    metrics: &ServerMetrics,
) -> (Arc<CertResolver>, CertReloader) {
    let resolver = Arc::new(CertResolver::new());
    let mut reloader = CertReloader::new(
        args.server.tls_dir.clone(),
        resolver.clone(),
        provider,
        metrics.clone(),
        cert_ready,
    );
    reloader.reload();
    let not_after = metrics.cert_not_after_seconds.clone();
    shared
        .readiness
        .add_check("certificate-unexpired", move || {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            not_after.get() > now
        });
    (resolver, reloader)
}

/// The caches behind /validate, with `--request-cap`: the node watch, and the one pod watch
/// into the shared pod index (which usage policies read too), for as long as the replica serves.
async fn start_placement(
    args: &ServeArgs,
    shared: &Shared,
    pods: &Arc<PodCache>,
    events: &Recorder,
) -> anyhow::Result<(
    Option<Arc<dyn crate::placement::PlacementSource>>,
    Vec<JoinHandle<()>>,
)> {
    if !args.request_cap {
        return Ok((None, Vec::new()));
    }
    let client = shared
        .client()
        .map_err(anyhow::Error::msg)
        .context("--request-cap watches nodes and pods: no Kubernetes client configuration")?;
    let placement = sources::placement::WatchedPlacement::new(pods.clone(), Some(client.clone()));
    let nodes = tokio::spawn(sources::placement::run(
        client.clone(),
        placement.clone(),
        shared.shutdown.clone(),
    ));
    let watch = tokio::spawn(watch_pods(
        client,
        pods.clone(),
        placement.clone(),
        shared.shutdown.clone(),
    ));
    let denials = tokio::spawn(crate::placement::denials::report(
        placement.denials(),
        events.clone(),
        shared.shutdown.clone(),
    ));
    Ok((Some(Arc::new(placement)), vec![nodes, watch, denials]))
}

/// The pod watch, with the cap's ledger, until `shutdown` says stop.
async fn watch_pods(
    client: kube::Client,
    pods: Arc<PodCache>,
    placement: sources::placement::WatchedPlacement,
    shutdown: Signal,
) {
    tokio::select! {
        () = sources::pods::watch(kube::Api::all(client), pods, Some(placement)) => {}
        _ = shutdown.stopped() => {}
    }
}

/// The usage caches' feeders, running while a policy with `spec.usage` is in force (a
/// cluster without usage policies pays nothing, and removing the last one stops them): the
/// metrics.k8s.io poller, and the pod watch unless `--request-cap` already runs it
/// (`cap_watch`). Without them, usage policies keep the stored allocatable or fall back (not
/// synced).
fn start_usage(
    args: &ServeArgs,
    shared: &Shared,
    store: PolicyStore,
    usage: Arc<UsageCaches>,
    cap_watch: bool,
) -> anyhow::Result<JoinHandle<()>> {
    if args.usage_interval.is_zero() {
        anyhow::bail!("--usage-interval must be longer than 0");
    }
    // Variants of `serve`'s one configuration: the audit log tells the usage task's requests by
    // their User-Agent (tests/cluster/e2e/usage_test.go).
    let config = shared
        .cluster
        .as_ref()
        .map(|c| c.config.clone())
        .map_err(Clone::clone);
    let clients = move || {
        let config = config.clone();
        async move { usage_clients(config.map_err(anyhow::Error::msg)?) }
    };
    Ok(tokio::spawn(sources::usage::run(
        usage,
        store,
        args.usage_interval,
        Duration::from_secs(1),
        cap_watch,
        clients,
        shared.shutdown.clone(),
    )))
}

/// The usage task's clients, from `serve`'s configuration.
fn usage_clients(config: kube::Config) -> anyhow::Result<sources::usage::Clients> {
    let config = named(
        config,
        concat!("kube-overcommit/", env!("CARGO_PKG_VERSION"), " (usage)"),
    );
    let mut once = config.clone();
    once.default_retry = false;
    Ok((
        kube::Client::try_from(config)?,
        kube::Client::try_from(once)?,
    ))
}

/// `config` naming itself `agent` in its User-Agent (the audit log tells the parts apart).
fn named(mut config: kube::Config, agent: &'static str) -> kube::Config {
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(agent),
    ));
    config
}

/// Memory relief's client: `serve`'s configuration without retries (a refused eviction moves on
/// to the next pod at once).
fn relief_client(shared: &Shared) -> Result<kube::Client, String> {
    let config = shared
        .cluster
        .as_ref()
        .map_err(Clone::clone)?
        .config
        .clone();
    let mut config = named(
        config,
        concat!("kube-overcommit/", env!("CARGO_PKG_VERSION"), " (relief)"),
    );
    config.default_retry = false;
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

/// The policy file (read once now) or, without one, the OvercommitPolicy watch.
fn start_policy_source(
    args: &ServeArgs,
    shared: &Shared,
    store: PolicyStore,
) -> anyhow::Result<JoinHandle<()>> {
    let shutdown = shared.shutdown.clone();
    match &args.source.policy_file {
        Some(path) => {
            let mut file = FileSource::new(path.clone(), store);
            file.reload();
            let interval = args.source.policy_reload_interval;
            let watch_files = !args.no_file_watch;
            Ok(tokio::spawn(file.run(interval, watch_files, shutdown)))
        }
        None => {
            let client = shared
                .client()
                .map_err(sources::SourceError::NoCluster)
                .context("no --policy-file, so watching OvercommitPolicy needs a cluster")?;
            Ok(tokio::spawn(sources::crd::run(client, store, shutdown)))
        }
    }
}

/// This replica's Events: one publisher, for the leader and the placement cap. Without a
/// Kubernetes client configuration (`--policy-file` alone) notes are dropped and counted.
async fn start_events(args: &ServeArgs, shared: &Shared) -> (Recorder, Option<JoinHandle<()>>) {
    let metrics = EventMetrics::default();
    shared.metrics.with_registry(|r| metrics.register(r));
    let client = shared.client().ok();
    let instance = args
        .leader
        .identity()
        .unwrap_or_else(|_| "kube-overcommit".into());
    Recorder::start(client, instance, metrics, shared.shutdown.clone())
}

/// The leader part; its readiness gate becomes the `certificate-trusted` condition.
async fn start_leader(
    args: &ServeArgs,
    shared: &Shared,
    served: Arc<CertResolver>,
    in_process: leader::in_process::InProcessContext,
    events: Recorder,
    usage: Arc<UsageCaches>,
) -> anyhow::Result<Option<leader::Running>> {
    let context = leader::ServeContext {
        in_process,
        events,
        usage: (usage, args.usage_interval),
        relief_client: relief_client(shared),
        metrics: shared.metrics.clone(),
        namespace: shared.namespace.clone(),
        request_cap: args.request_cap,
        usage_interval: args.usage_interval,
        policy_file: args.source.policy_file.is_some(),
        shutdown: shared.shutdown.clone(),
        served,
        client: shared.client(),
    };
    let running = leader::start_in_serve(&args.leader, context).await?;
    if let Some(running) = &running {
        let check = running.readiness.clone();
        shared
            .readiness
            .add_check("certificate-trusted", move || check.is_ready());
    }
    Ok(running)
}

/// SIGTERM and SIGINT.
struct Signals {
    term: UnixSignal,
    int: UnixSignal,
}

impl Signals {
    fn install() -> anyhow::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }

    /// The first reason to shut down.
    async fn first(&mut self, exit_with_pid: Option<u32>) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
            _ = process_gone(exit_with_pid) => "watched process exited",
        }
    }

    /// A second signal exits at once, whatever is still running.
    fn exit_on_next(mut self) {
        tokio::spawn(async move {
            tokio::select! {
                _ = self.term.recv() => {}
                _ = self.int.recv() => {}
            }
            tracing::warn!("second signal: exiting now");
            std::process::exit(1);
        });
    }
}

/// Ordered shutdown: not ready, delay, drain the webhook port, stop the rest; all within
/// --shutdown-grace.
async fn shut_down(
    args: &ServeArgs,
    mut running: Running,
    trigger: Trigger,
    signals: Signals,
    which: &'static str,
) {
    let started = Instant::now();
    running.not_shutting_down.set(false);
    trigger.retire();
    tracing::info!(signal = which, grace = ?args.shutdown_grace, "shutting down: not ready, retiring keep-alive connections");
    signals.exit_on_next();
    let grace_left = || args.shutdown_grace.saturating_sub(started.elapsed());
    tokio::time::sleep(args.shutdown_delay.min(grace_left())).await;
    trigger.drain();
    // Keep a margin for stopping the rest within the grace period.
    let drain_budget = grace_left().saturating_sub(Duration::from_millis(200));
    match tokio::time::timeout(drain_budget, &mut running.server).await {
        Ok(_) => tracing::info!(elapsed = ?started.elapsed(), "webhook port drained"),
        Err(_) => {
            tracing::warn!("grace period over with connections still open; closing them");
            running.server.abort();
        }
    }
    trigger.stop();
    let rest = async {
        for task in running.background {
            let _ = task.await;
        }
        if let Some(leader) = running.leader {
            leader.stopped().await;
        }
    };
    // The leader steps down and the replica report is deleted here: a few API calls.
    let _ = tokio::time::timeout(Duration::from_millis(500), rest).await;
    tracing::info!(elapsed = ?started.elapsed(), "stopped");
}
