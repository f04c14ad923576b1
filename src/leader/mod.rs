//! Leader only: the Lease, the certificate authority, rotation and the upkeep of the
//! MutatingWebhookConfiguration (issue 4; docs/architecture.md §5, §6). Every replica also keeps
//! a small report Lease and its readiness gate here.
//!
//! - `election`: the claim, renewed every `--lease-renew`; `lease_lock`: the Lease itself,
//!   created, taken, renewed and released with the resourceVersion just read, so two replicas
//!   racing for a free Lease cannot both win. Every leader write also carries a
//!   resourceVersion precondition (replace with the version read, or create when absent) and
//!   re-checks the claim (Lease held, renew deadline not passed) right before it goes out; when
//!   the claim is lost the leader task is aborted before any further write.
//! - `ca`: CA (ECDSA P-256) and serving leaves with rcgen; parsing with x509-parser; chain
//!   checks with webpki, as the API server does them.
//! - `rotation`: the pure decision (bootstrap, leaf at 2/3 of its life, CA rotation in four
//!   phases, forced rotation, recovery), table-tested. `store`: how that state lives in the CA
//!   Secret's data and annotations, so a new leader finishes what the old one started.
//! - `webhook_config`: the desired configuration and the drift check (pure); `controller`
//!   repairs it by watch plus a resync every 5 s at most.
//! - `replicas`: how the leader knows what every ready replica serves. Each replica (leader or
//!   not) renews its own Lease `<lease-name>-replica-<identity>` every `--lease-renew`, with
//!   annotations `overcommit.dev/leaf-sha256` (the leaf it serves), `overcommit.dev/ca-sha256`
//!   (the CA in the live caBundle that leaf chains to) and `overcommit.dev/ready`. The leader
//!   counts only fresh reports (renewTime + leaseDurationSeconds in the future) and deletes
//!   reports stale for over a minute. The old CA is dropped only when every fresh ready report
//!   names the new CA. The same works for pods in a cluster and for processes on the local
//!   control plane. A replica that cannot reach the API server cannot report; it also cannot
//!   see caBundle changes, and its report expires, so it stops blocking the rotation — that is
//!   the one case where the leader trusts the readiness gate of the Service alone.
//! - `readiness`: a replica is ready only while its leaf chains to a CA in the live caBundle
//!   and is not expired.
//! - `rotate_request`: `kube-overcommit rotate [--ca]` sets `overcommit.dev/rotate` on the serving
//!   Secret; the leader acts on it and clears it.
//! - `policy_status`: while leading, the `status` of every OvercommitPolicy, batched (at most
//!   one write per policy every 5 s, only when it differs); computed by
//!   `overcommit_core::policy_report`.
//! - `nudge` (pure) and `nudger` (its I/O): while leading, an empty status PATCH to each node
//!   the policies would change, so that a policy change reaches nodes whose kubelet is quiet.
//! - `pressure`: while leading, the taint `overcommit.dev/pressure:NoSchedule` on nodes whose
//!   usage is above a policy's high watermark (`spec.pressure`), until it held below low.
//! - `raw_allocatable_gauge`: while leading, `kube_overcommit_node_raw_allocatable` from a metadata-only
//!   watch of nodes (`raw_allocatable`: the pure reading of the annotation); cleared when
//!   leadership is lost, so one replica per cluster exports it.

pub mod ca;
pub mod cert_source;
pub mod controller;
pub mod election;
pub mod eviction;
pub mod hand_over;
pub mod in_process;
pub mod in_process_policy;
pub mod in_process_upkeep;
pub mod lease_lock;
pub mod metrics;
pub mod node_events;
pub mod nudge;
pub mod nudger;
pub mod policy_status;
pub mod pressure;
pub mod raw_allocatable;
pub mod raw_allocatable_gauge;
pub mod readiness;
pub mod replicas;
pub mod rotate_request;
pub mod rotation;
pub mod store;
pub mod webhook_config;

/// The default name of the webhook configurations and of the compiled admission policy and
/// binding (`--webhook-config-name`; `compile-inprocess` takes the same flag).
pub const DEFAULT_CONFIG_NAME: &str = "kube-overcommit";
/// The default ServiceAccount of the replicas (`--service-account`).
pub const DEFAULT_SERVICE_ACCOUNT: &str = "kube-overcommit";

/// The user name the API server gives ServiceAccount `name` of `namespace`.
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use self::cert_source::CertSource;
use self::controller::{Controller, ControllerSettings};
use self::election::{Claim, ElectionSettings};
use self::eviction::{EvictionMetrics, ReliefContext, ReliefSettings};
use self::in_process::InProcessContext;
use self::metrics::LeaderMetrics;
use self::nudger::{NudgeMetrics, NudgeSettings};
use self::pressure::{PressureContext, PressureMetrics};
use self::readiness::{ReadinessCheck, ServedCertificate};
use self::webhook_config::WebhookSettings;
use crate::duration::duration_arg;
use crate::events::Recorder;
use crate::metrics::Metrics;
use crate::shutdown::Signal;
use crate::sources::usage::UsageCaches;

fn timeout_arg(text: &str) -> Result<i32, String> {
    let n: i64 = text
        .trim()
        .parse()
        .map_err(|_| format!("not a number: {text:?}"))?;
    webhook_config::valid_timeout(n)
}

fn rate_arg(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(rate) if rate.is_finite() && (0.0..=1000.0).contains(&rate) => Ok(rate),
        _ => Err(format!("not a rate from 0 to 1000 per second: {text:?}")),
    }
}

/// Leader, certificate and webhook-configuration flags (flattened into `serve`).
#[derive(Debug, Clone, clap::Args)]
pub struct LeaderArgs {
    /// Namespace of the webhook's Service, Secrets and Leases: `serve`'s own --namespace
    /// (KUBE_OVERCOMMIT_NAMESPACE, else POD_NAMESPACE), set by `serve` before `start`.
    #[arg(skip = String::from("kube-overcommit"))]
    pub namespace: String,
    /// `serve --request-cap`, set by `serve` before `start`: the leader then also keeps the
    /// ValidatingWebhookConfiguration of the placement cap (same name as the mutating one).
    #[arg(skip)]
    pub request_cap: bool,
    /// `serve --usage-interval`, set by `serve` before `start`: how often memory relief judges
    /// the nodes (zero: 30s).
    #[arg(skip)]
    pub usage_interval: Duration,
    /// `serve --policy-file`, set by `serve` before `start`: the policies in force are not
    /// OvercommitPolicy objects, so the leader keeps no policy status (there is none to keep,
    /// and the CRD may not be installed).
    #[arg(skip)]
    pub policy_file: bool,
    /// Name of the Service the API server calls.
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_SERVICE_NAME",
        default_value = "kube-overcommit"
    )]
    pub service_name: String,
    /// Name of the MutatingWebhookConfiguration the leader keeps in place.
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_WEBHOOK_CONFIG_NAME",
        default_value = DEFAULT_CONFIG_NAME
    )]
    pub webhook_config_name: String,
    /// Secret holding the serving leaf (tls.crt, tls.key, ca.crt); mounted into replicas.
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_SERVING_SECRET",
        default_value = "kube-overcommit-tls"
    )]
    pub serving_secret: String,
    /// Secret holding the CA key; never mounted.
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_CA_SECRET",
        default_value = "kube-overcommit-ca"
    )]
    pub ca_secret: String,
    /// Name of the leader Lease.
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_LEASE_NAME",
        default_value = "kube-overcommit-leader"
    )]
    pub lease_name: String,
    /// How long a Lease is valid without renewal: whole seconds, more than 2.2 x
    /// --lease-renew (`election::check_timing`).
    #[arg(long, env = "KUBE_OVERCOMMIT_LEASE_TTL", default_value = "15s", value_parser = duration_arg)]
    pub lease_ttl: Duration,
    /// How often the Lease (and each replica report) is renewed: whole seconds, at least 1s.
    #[arg(long, env = "KUBE_OVERCOMMIT_LEASE_RENEW", default_value = "5s", value_parser = duration_arg)]
    pub lease_renew: Duration,
    /// Identity in the Leases (default: POD_NAME, else the hostname).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Lifetime of a new CA.
    #[arg(long, env = "KUBE_OVERCOMMIT_CA_VALIDITY", default_value = "365d", value_parser = duration_arg)]
    pub ca_validity: Duration,
    /// Lifetime of a serving leaf (rotated at 2/3 of it).
    #[arg(long, env = "KUBE_OVERCOMMIT_LEAF_VALIDITY", default_value = "7d", value_parser = duration_arg)]
    pub leaf_validity: Duration,
    /// Longest time between two evaluations of the certificates (capped at 5 s for upkeep).
    #[arg(long, env = "KUBE_OVERCOMMIT_CHECK_INTERVAL", default_value = "5s", value_parser = duration_arg)]
    pub check_interval: Duration,
    /// How long a new CA is published before leaves come from it; longer than the kubelet's
    /// Secret volume sync.
    #[arg(long, env = "KUBE_OVERCOMMIT_PROPAGATION_DELAY", default_value = "120s", value_parser = duration_arg)]
    pub propagation_delay: Duration,
    /// timeoutSeconds of the webhooks, 1 to 5.
    #[arg(long, env = "KUBE_OVERCOMMIT_WEBHOOK_TIMEOUT_SECONDS", default_value = "2", value_parser = timeout_arg)]
    pub webhook_timeout_seconds: i32,
    /// Where the serving certificate comes from: `leader` (its own CA, rotation, Secret and
    /// caBundle) or `cert-manager` (a Certificate's Secret; cainjector fills the caBundle).
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_CERT_SOURCE",
        value_enum,
        default_value = "leader"
    )]
    pub cert_source: CertSource,
    /// With --cert-source=cert-manager: the Certificate (in --namespace) whose CA cainjector
    /// injects (`cert-manager.io/inject-ca-from`).
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_CERT_MANAGER_CERTIFICATE",
        default_value = "kube-overcommit"
    )]
    pub cert_manager_certificate: String,
    /// With --cert-source=cert-manager: inject `ca.crt` of this Secret instead
    /// (`cert-manager.io/inject-ca-from-secret`): the CA's own Secret, so that a re-keyed CA is
    /// trusted before any leaf comes from it.
    #[arg(long, env = "KUBE_OVERCOMMIT_CERT_MANAGER_CA_SECRET")]
    pub cert_manager_ca_secret: Option<String>,
    /// The ServiceAccount the replicas run as (in --namespace): the node webhook and the
    /// compiled policy take its node status writes, the leader's nudges.
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_SERVICE_ACCOUNT",
        default_value = DEFAULT_SERVICE_ACCOUNT
    )]
    pub service_account: String,
    /// Nudges per second: empty status PATCHes to nodes the policies would change (0: none).
    #[arg(long, env = "KUBE_OVERCOMMIT_NUDGE_RATE", default_value = "50", value_parser = rate_arg)]
    pub nudge_rate: f64,
    /// Run the leader election (default: on when a kube config is available).
    #[arg(long, env = "KUBE_OVERCOMMIT_LEADER_ELECTION")]
    pub leader_election: Option<bool>,
}

/// Why the leader part could not start.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error(transparent)]
    LeaseTiming(#[from] election::TimingError),
    #[error("--leaf-validity must be at least 3 s and not longer than --ca-validity")]
    Validity,
    #[error("no identity: set --identity or POD_NAME (the hostname could not be read)")]
    NoIdentity,
    /// Why `serve` has no client (the text of the client's own error).
    #[error("--leader-election needs a cluster: {0}")]
    NoCluster(String),
}

impl LeaderArgs {
    pub fn validate(&self) -> Result<(), LeaderError> {
        election::check_timing(self.lease_ttl, self.lease_renew)?;
        if self.leaf_validity < Duration::from_secs(3) || self.leaf_validity > self.ca_validity {
            return Err(LeaderError::Validity);
        }
        Ok(())
    }

    pub fn identity(&self) -> Result<String, LeaderError> {
        if let Some(id) = self.identity.as_ref().filter(|s| !s.trim().is_empty()) {
            return Ok(id.trim().to_string());
        }
        std::env::var("HOSTNAME")
            .ok()
            .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .ok_or(LeaderError::NoIdentity)
    }

    /// The user whose node status writes are the nudges: the ServiceAccount's.
    pub fn nudger(&self) -> String {
        service_account_user(&self.namespace, &self.service_account)
    }

    fn relief(&self) -> ReliefSettings {
        let interval = if self.usage_interval.is_zero() {
            Duration::from_secs(30)
        } else {
            self.usage_interval
        };
        ReliefSettings {
            interval,
            exempt_namespaces: webhook_config::exempt_namespaces(&self.namespace),
        }
    }

    fn nudge(&self) -> NudgeSettings {
        NudgeSettings {
            rate: self.nudge_rate,
            nudger: self.nudger(),
        }
    }

    /// The DNS name the API server dials (and the leaf must carry).
    pub fn server_name(&self) -> String {
        format!("{}.{}.svc", self.service_name, self.namespace)
    }

    fn controller(&self) -> ControllerSettings {
        ControllerSettings {
            namespace: self.namespace.clone(),
            service_name: self.service_name.clone(),
            ca_secret: self.ca_secret.clone(),
            serving_secret: self.serving_secret.clone(),
            lease_name: self.lease_name.clone(),
            ca_validity: self.ca_validity,
            leaf_validity: self.leaf_validity,
            check_interval: self.check_interval,
            propagation_delay: self.propagation_delay,
            cert_source: self.cert_source,
            webhook: self.webhook(),
            policy_status: !self.policy_file,
        }
    }

    fn webhook(&self) -> WebhookSettings {
        WebhookSettings {
            config_name: self.webhook_config_name.clone(),
            namespace: self.namespace.clone(),
            service_name: self.service_name.clone(),
            timeout_seconds: self.webhook_timeout_seconds,
            request_cap: self.request_cap,
            nudger: self.nudger(),
            injection: cert_source::injection(
                self.cert_source,
                &self.namespace,
                &self.cert_manager_certificate,
                self.cert_manager_ca_secret.as_deref(),
            ),
        }
    }
}

/// What `start` leaves running.
pub struct Running {
    /// The readiness gate for /readyz.
    pub readiness: ReadinessCheck,
    /// This replica's leadership.
    pub claim: Claim,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Wait for the tasks to end after shutdown (they step down and delete the report).
    pub async fn stopped(self) {
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// What the leader part reports through: its metrics, and Events; and what the pressure taint
/// reads (the usage caches).
#[derive(Clone)]
pub struct Reporting {
    pub leader: LeaderMetrics,
    pub nudge: NudgeMetrics,
    pub relief: ReliefContext,
    pub events: Recorder,
    pub pressure: PressureContext,
}

/// Start the replica report, the caBundle watch and (when enabled) the election with the
/// leader loop. Everything ends when `shutdown` says stop.
pub fn start(
    client: Client,
    args: &LeaderArgs,
    election: bool,
    served: Arc<dyn ServedCertificate>,
    reporting: Reporting,
    in_process: InProcessContext,
    shutdown: Signal,
) -> Result<Running, LeaderError> {
    let Reporting {
        leader: metrics,
        nudge,
        relief,
        events,
        pressure,
    } = reporting;
    args.validate()?;
    let identity = args.identity()?;
    let mut tasks = Vec::new();

    let (bundle_tx, bundle_rx) = watch::channel(None);
    let configs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    tasks.push(tokio::spawn(readiness::watch_ca_bundle(
        configs,
        args.webhook_config_name.clone(),
        bundle_tx,
        shutdown.clone(),
    )));
    let readiness = ReadinessCheck::new(bundle_rx, served, args.server_name());

    tasks.push(tokio::spawn(report_loop(
        metrics.clone(),
        Api::namespaced(client.clone(), &args.namespace),
        ReportSettings {
            lease_name: args.lease_name.clone(),
            identity: identity.clone(),
            ttl: args.lease_ttl,
            renew: args.lease_renew,
        },
        readiness.clone(),
        shutdown.clone(),
    )));

    tasks.push(tokio::spawn(in_process::keep_flag(
        client.clone(),
        args.webhook_config_name.clone(),
        in_process.clone(),
        shutdown.clone(),
    )));

    let claim = if election {
        let (claim, election_task, leader_task) = start_election(
            client,
            args,
            &identity,
            (metrics, nudge, events, pressure, relief),
            in_process,
            shutdown,
        );
        tasks.extend([election_task, leader_task]);
        claim
    } else {
        Claim::never()
    };
    tracing::info!(%identity, election, "leader part started");
    Ok(Running {
        readiness,
        claim,
        tasks,
    })
}

/// The election and the supervisor of the leader loop: (claim, election task, supervisor).
fn start_election(
    client: Client,
    args: &LeaderArgs,
    identity: &str,
    (metrics, nudge, events, pressure, relief): (
        LeaderMetrics,
        NudgeMetrics,
        Recorder,
        PressureContext,
        ReliefContext,
    ),
    in_process: InProcessContext,
    shutdown: Signal,
) -> (Claim, JoinHandle<()>, JoinHandle<()>) {
    let gauge = metrics.leader.clone();
    let (claim, election_task) = election::spawn(
        client.clone(),
        ElectionSettings {
            namespace: args.namespace.clone(),
            lease_name: args.lease_name.clone(),
            identity: identity.to_owned(),
            ttl: args.lease_ttl,
            renew: args.lease_renew,
        },
        shutdown.clone(),
        move |leading| {
            gauge.set(i64::from(leading));
        },
    );
    let leader_task = tokio::spawn(supervise(
        client,
        args.controller(),
        claim.clone(),
        (metrics, nudge, args.nudge(), events, pressure),
        (relief, args.relief()),
        in_process,
        shutdown,
    ));
    (claim, election_task, leader_task)
}

/// What the leader tasks report through and read, besides the client and the claim.
type LeaderParts = (
    LeaderMetrics,
    NudgeMetrics,
    NudgeSettings,
    Recorder,
    PressureContext,
);

/// Run the leader loop while leading; abort it the moment leadership is lost.
async fn supervise(
    client: Client,
    settings: ControllerSettings,
    claim: Claim,
    (metrics, nudge_metrics, nudge, events, pressure): LeaderParts,
    (relief_context, relief): (ReliefContext, ReliefSettings),
    in_process: InProcessContext,
    shutdown: Signal,
) {
    let mut leading = claim.subscribe();
    loop {
        tokio::select! {
            r = leading.wait_for(|l| *l) => if r.is_err() { return },
            _ = shutdown.stopped() => return,
        }
        tracing::info!("leading: starting the certificate authority and configuration upkeep");
        let controller = Controller::new(
            client.clone(),
            settings.clone(),
            claim.clone(),
            metrics.clone(),
            in_process.clone(),
        );
        let mut task = tokio::spawn(controller.run());
        let node_task = tokio::spawn(raw_allocatable_gauge::run(
            Api::all(client.clone()),
            metrics.clone(),
        ));
        let status_task = settings.policy_status.then(|| {
            tokio::spawn(policy_status::run(
                client.clone(),
                claim.clone(),
                in_process.clone(),
                metrics.policy_status.clone(),
                events.clone(),
            ))
        });
        let nudge_task = tokio::spawn(nudger::run(
            client.clone(),
            in_process.policies.clone(),
            claim.clone(),
            nudge.clone(),
            nudge_metrics.clone(),
        ));
        let pressure_task = tokio::spawn(pressure::run(
            client.clone(),
            in_process.policies.clone(),
            claim.clone(),
            pressure.clone(),
            events.clone(),
        ));
        let relief_task = tokio::spawn(eviction::run(
            in_process.policies.clone(),
            claim.clone(),
            relief.clone(),
            relief_context.clone(),
            events.clone(),
        ));
        let (mut ended_by_itself, mut stopping) = (false, false);
        tokio::select! {
            _ = leading.wait_for(|l| !*l) => {}
            _ = shutdown.stopped() => stopping = true,
            _ = &mut task => ended_by_itself = true,
        }
        task.abort();
        status_task.iter().for_each(JoinHandle::abort);
        stop(nudge_task, || nudge_metrics.clear()).await;
        stop(pressure_task, || pressure.metrics.clear()).await;
        stop(relief_task, || relief_context.metrics.clear()).await;
        stop(node_task, || raw_allocatable_gauge::clear(&metrics)).await;
        if stopping {
            return;
        }
        if ended_by_itself {
            // The loop saw its claim expire before the election task did: let that catch up.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tracing::info!("not leading: leader tasks stopped");
    }
}

/// Abort a leader task and clear what it exported once it has stopped: only then can no late
/// update bring a series back.
async fn stop(task: JoinHandle<()>, clear: impl FnOnce()) {
    task.abort();
    let _ = task.await;
    clear();
}

/// Where and how often a replica reports.
struct ReportSettings {
    lease_name: String,
    identity: String,
    ttl: Duration,
    renew: Duration,
}

/// Renew this replica's report Lease; delete it on shutdown.
async fn report_loop(
    metrics: LeaderMetrics,
    api: Api<Lease>,
    settings: ReportSettings,
    readiness: ReadinessCheck,
    shutdown: Signal,
) {
    let name = replicas::replica_lease_name(&settings.lease_name, &settings.identity);
    let mut last = None;
    loop {
        let report = readiness.report();
        set_expiry_metrics(&metrics, &readiness);
        if last.as_ref() != Some(&report) {
            tracing::info!(ready = report.ready, leaf = ?report.leaf, issuer = ?report.issuer, "replica report");
        }
        let lease = replicas::report_lease(
            &settings.lease_name,
            &settings.identity,
            settings.ttl,
            jiff::Timestamp::now(),
            &report,
        );
        match tokio::time::timeout(settings.renew, replicas::write_report(&api, &lease)).await {
            Ok(Ok(())) => last = Some(report),
            Ok(Err(e)) => tracing::warn!(error = %e, "could not renew the replica report"),
            Err(_) => tracing::warn!("replica report renewal timed out"),
        }
        if next_report_due(&readiness, last.as_ref(), settings.renew, &shutdown).await
            == ReportDue::Stopping
        {
            replicas::delete_report(&api, &name).await;
            return;
        }
    }
}

fn set_expiry_metrics(metrics: &LeaderMetrics, readiness: &ReadinessCheck) {
    let now = jiff::Timestamp::now();
    let (leaf_end, ca_end) = readiness.expiry();
    let secs =
        |t: Option<jiff::Timestamp>| t.map_or(0.0, |t| (t.as_second() - now.as_second()) as f64);
    metrics.leaf_expiry_seconds.set(secs(leaf_end));
    metrics.ca_expiry_seconds.set(secs(ca_end));
}

#[derive(Debug, PartialEq, Eq)]
enum ReportDue {
    Now,
    Stopping,
}

/// Report again soon after a change of what is served, else every renew period.
async fn next_report_due(
    readiness: &ReadinessCheck,
    last: Option<&replicas::SelfReport>,
    renew: Duration,
    shutdown: &Signal,
) -> ReportDue {
    let deadline = tokio::time::Instant::now() + renew;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => return ReportDue::Now,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {
                if last != Some(&readiness.report()) { return ReportDue::Now }
            }
            _ = shutdown.stopped() => return ReportDue::Stopping,
        }
    }
}

/// What the leader part takes from `serve`.
#[derive(Clone)]
pub struct ServeContext {
    /// The shared registry; the leader's metrics are added to it.
    pub metrics: Arc<Metrics>,
    /// The webhook's own namespace: that of its Service, Secrets and Leases.
    pub namespace: String,
    /// `serve --request-cap`: keep the validating configuration of the cap too.
    pub request_cap: bool,
    /// `serve --usage-interval`: how often memory relief judges the nodes.
    pub usage_interval: Duration,
    /// `serve --policy-file` given: no policy status to keep.
    pub policy_file: bool,
    pub shutdown: Signal,
    /// The leaf this replica serves, for the readiness gate and the replica report.
    pub served: Arc<dyn ServedCertificate>,
    /// `serve --mode`: the path, the policy set it compiles, the webhook's flag.
    pub in_process: InProcessContext,
    /// The replica's Events.
    pub events: Recorder,
    /// `serve`'s one client, or why there is none.
    pub client: Result<Client, String>,
    /// The usage caches and `--usage-interval`, which the pressure taint and relief read.
    pub usage: (Arc<UsageCaches>, Duration),
    /// `serve`'s configuration without retries, for memory relief (`eviction`), or why none.
    pub relief_client: Result<Client, String>,
}

/// Start the leader part inside `serve`: the namespace comes from `serve`, metrics go to the
/// shared registry. The caller adds `Running::readiness` to /readyz. Off (None) when
/// --leader-election=false, or when it is not set and no kube config is available.
pub async fn start_in_serve(
    args: &LeaderArgs,
    context: ServeContext,
) -> Result<Option<Running>, LeaderError> {
    if args.leader_election == Some(false) {
        tracing::info!("leader election off (--leader-election=false)");
        return Ok(None);
    }
    let client = match context.client {
        Ok(c) => c,
        Err(e) if args.leader_election.is_none() => {
            tracing::info!(error = %e, "no kube config: leader election and certificate management off");
            return Ok(None);
        }
        Err(e) => return Err(LeaderError::NoCluster(e)),
    };
    let mut args = args.clone();
    args.namespace = context.namespace;
    args.request_cap = context.request_cap;
    args.usage_interval = context.usage_interval;
    args.policy_file = context.policy_file;
    let reporting = Reporting {
        leader: context.metrics.with_registry(LeaderMetrics::new),
        nudge: context.metrics.with_registry(NudgeMetrics::new),
        relief: ReliefContext {
            metrics: context.metrics.with_registry(EvictionMetrics::new),
            client: context.relief_client,
            usage: context.usage.0.clone(),
        },
        events: context.events,
        pressure: PressureContext {
            usage: context.usage.0,
            interval: context.usage.1,
            metrics: context.metrics.with_registry(PressureMetrics::new),
        },
    };
    start(
        client,
        &args,
        true,
        context.served,
        reporting,
        context.in_process,
        context.shutdown,
    )
    .map(Some)
}
