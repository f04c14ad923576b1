//! `kube-overcommit serve`: start every part, then shut down in one ordered place.
//!
//! Start: metrics, readiness, certificate (read once before listening), policy source,
//! webhook port, probe port. Shutdown on SIGTERM/SIGINT: `/readyz` fails at once, new
//! connections are still accepted for `--shutdown-delay` (while endpoints update), then the
//! listener closes and open connections drain (requests in flight finish; HTTP/1.1 gets
//! `Connection: close`, HTTP/2 a GOAWAY); background tasks stop; the process exits within
//! `--shutdown-grace` whatever happens. A second signal exits at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};

use super::certs::{CertReloader, CertResolver};
use super::routes::App;
use super::{Server, ServerArgs, tls_config};
use crate::admission::Settings;
use crate::duration::duration_arg;
use crate::metrics::Metrics;
use crate::probes::{self, ProbeArgs, Readiness};
use crate::shutdown::{self, Signal};
use crate::sources::{self, PolicyStore, SourceArgs, file::FileSource};

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
    pub leader: crate::leader::LeaderArgs,

    /// The webhook's own namespace (its pods are never mutated). Falls back to POD_NAMESPACE,
    /// then the service account's namespace file.
    #[arg(long, env = "KUBE_OVERCOMMIT_NAMESPACE")]
    pub namespace: Option<String>,

    /// After SIGTERM, keep accepting new connections this long (while the Service's endpoints
    /// drop this replica) before draining. Counts against --shutdown-grace.
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

/// Shared handles other long-running parts (the leader) plug into.
#[derive(Clone)]
pub struct Context {
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
    /// Stops background tasks (after the webhook port drained).
    pub shutdown: Signal,
    pub namespace: String,
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let metrics = Arc::new(Metrics::new());
    let readiness = Readiness::new();
    let not_shutting_down = readiness.condition("not-shutting-down", true);
    let cert_ready = readiness.condition("certificate", false);
    let policies_synced = readiness.condition("policies", false);
    let (trigger, stopping) = shutdown::channel();
    let namespace = own_namespace(args.namespace.as_deref());

    // Certificate: read once now so that a mounted pair serves from the first connection.
    let resolver = Arc::new(CertResolver::new());
    let mut reloader = CertReloader::new(
        args.server.tls_dir.clone(),
        resolver.clone(),
        provider.clone(),
        metrics.clone(),
        cert_ready,
    );
    reloader.reload();
    let not_after = metrics.cert_not_after_seconds.clone();
    readiness.add_check("certificate-unexpired", move || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        not_after.get() > now
    });

    // Policies.
    let store = PolicyStore::new(metrics.clone(), policies_synced);
    let source_task = match &args.source.policy_file {
        Some(path) => {
            let mut file = FileSource::new(path.clone(), store.clone());
            file.reload();
            let interval = args.source.policy_reload_interval;
            let stop = stopping.clone();
            let watch_files = !args.no_file_watch;
            tokio::spawn(async move { file.run(interval, watch_files, stop).await })
        }
        None => {
            let client = kube::Client::try_default()
                .await
                .map_err(sources::SourceError::from)
                .context("no --policy-file, so watching OvercommitPolicy needs a cluster")?;
            let stop = stopping.clone();
            let store = store.clone();
            tokio::spawn(async move { sources::crd::run(client, store, stop).await })
        }
    };

    // Ports.
    let app = Arc::new(App {
        policies: store.cell(),
        settings: Settings {
            own_namespace: namespace.clone(),
        },
        metrics: metrics.clone(),
        max_body_bytes: usize::try_from(args.server.max_body_bytes).unwrap_or(usize::MAX),
        body_timeout: args.server.body_read_timeout,
    });
    let server = Server::bind(
        &args.server,
        tls_config(provider, resolver.clone())?,
        app,
        metrics.clone(),
    )
    .await?;
    let webhook_addr = server.local_addr()?;
    let (probe_addr, probe_serve) = probes::bind(
        &args.probes,
        readiness.clone(),
        metrics.clone(),
        stopping.clone(),
    )
    .await?;
    tracing::info!(
        webhook = %webhook_addr,
        probes = %probe_addr,
        namespace = %namespace,
        policy_source = if args.source.policy_file.is_some() { "file" } else { "crd" },
        "listening"
    );

    let reloader_task = tokio::spawn(reloader.run(
        args.server.cert_reload_interval,
        !args.no_file_watch,
        stopping.clone(),
    ));
    let probe_task = tokio::spawn(probe_serve);
    let mut server_task = tokio::spawn(server.run(stopping.clone()));

    // Other parts (the leader, issue 4) start here with a `Context`.
    let context = Context {
        metrics: metrics.clone(),
        readiness: readiness.clone(),
        shutdown: stopping.clone(),
        namespace,
    };
    let leader = crate::leader::start_in_serve(&args.leader, &context, resolver.clone()).await?;

    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let which = tokio::select! {
        _ = sigterm.recv() => "SIGTERM",
        _ = sigint.recv() => "SIGINT",
        _ = process_gone(args.exit_with_pid) => "watched process exited",
        r = &mut server_task => {
            anyhow::bail!("webhook server stopped unexpectedly: {r:?}");
        }
    };

    // Ordered shutdown.
    let started = Instant::now();
    not_shutting_down.set(false);
    tracing::info!(signal = which, grace = ?args.shutdown_grace, "shutting down: not ready");
    tokio::spawn(async move {
        tokio::select! {
            _ = sigterm.recv() => {}
            _ = sigint.recv() => {}
        }
        tracing::warn!("second signal: exiting now");
        std::process::exit(1);
    });
    let grace_left = |started: Instant| args.shutdown_grace.saturating_sub(started.elapsed());
    tokio::time::sleep(args.shutdown_delay.min(grace_left(started))).await;
    trigger.drain();
    // Keep a margin for stopping the rest within the grace period.
    let drain_budget = grace_left(started).saturating_sub(Duration::from_millis(200));
    match tokio::time::timeout(drain_budget, &mut server_task).await {
        Ok(_) => tracing::info!(elapsed = ?started.elapsed(), "webhook port drained"),
        Err(_) => {
            tracing::warn!("grace period over with connections still open; closing them");
            server_task.abort();
        }
    }
    trigger.stop();
    let rest = async {
        let _ = reloader_task.await;
        let _ = source_task.await;
        let _ = probe_task.await;
        if let Some(leader) = leader {
            leader.stopped().await;
        }
    };
    // The leader steps down and the replica report is deleted here: a few API calls.
    let _ = tokio::time::timeout(Duration::from_millis(500), rest).await;
    tracing::info!(elapsed = ?started.elapsed(), "stopped");
    Ok(())
}
