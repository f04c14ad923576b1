//! The usage caches of `serve`, behind [`NodeUsageSource`]: the lean pod index (requested sums
//! per node; `sources::pod_cache::PodCache`, shared with the request cap, fed by the one pod watch)
//! and the NodeMetrics history (fed by [`poll`]: a list of
//! metrics.k8s.io every `--usage-interval`), both in `overcommit_core` (pure); this file is the
//! I/O and the locking.
//!
//! The review path asks [`UsageCaches::node_usage`] only for a node whose policy has
//! `spec.usage`: two read locks, each held for a hash lookup (and, for the history, a pass over
//! the node's samples in the window), no allocation.
//!
//! Until the pod index has listed once and one poll has succeeded, every view says not synced,
//! and the usage rule keeps the stored allocatable (`FallbackReason::NotSynced` when there is
//! none to keep); `/readyz` says so in a detail line, `kube_overcommit_usage_synced` in a gauge.
//!
//! The feeders run only while a policy with `spec.usage` or `spec.pressure` is in force ([`feeders`], applied by
//! [`run`]): the poller, and the pod watch unless the request cap's watch feeds the index
//! already. A feeder that stops takes its cache with it (cleared, not synced), so a usage
//! policy that appears later starts from a fresh list and poll, never from old samples.
//! `kube_overcommit_usage_feeder_running` says which feeders run.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use overcommit_core::node::history::{Poll, Sample, UsageHistory};
use overcommit_core::node::usage::NodeUsage;
use overcommit_core::pressure::Polled;

use super::PolicyStore;
use super::metrics::{UsageCache, UsageCacheLabels, UsageMetrics};
use super::node_metrics::{self, MetricsError, NodeSample};
use super::pod_cache::PodCache;
use crate::admission::{Clock, NodeUsageSource};
use crate::metrics::{ReloadLabels, ReloadResult};
use crate::shutdown::Signal;

/// Samples are kept this long before the first usage policy says otherwise.
const DEFAULT_KEEP: Duration = Duration::from_secs(15 * 60);

/// The pod index and the usage history, shared by the feeders and the review path.
#[derive(Debug)]
pub struct UsageCaches {
    pods: Arc<PodCache>,
    history: RwLock<UsageHistory>,
    metrics: UsageMetrics,
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    // A panic while a feeder held the lock leaves at worst one pod or poll half-applied;
    // keep serving (the next list or poll repairs it).
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

impl UsageCaches {
    /// `poll_interval`: `--usage-interval` (a sample's staleness is counted in it); `pods`: the
    /// shared pod index.
    pub fn new(metrics: UsageMetrics, poll_interval: Duration, pods: Arc<PodCache>) -> Arc<Self> {
        let caches = Self {
            pods,
            history: RwLock::new(UsageHistory::new(DEFAULT_KEEP, poll_interval)),
            metrics,
        };
        caches.set_synced_gauge(UsageCache::metrics, false);
        caches.set_running(Feeders::default());
        Arc::new(caches)
    }

    /// Say which feeders run (`kube_overcommit_usage_feeder_running`); `pods` counts the
    /// request cap's watch when it feeds this index.
    fn set_running(&self, running: Feeders) {
        for (cache, on) in [
            (UsageCache::metrics, running.poller),
            (UsageCache::pods, running.pod_watch),
        ] {
            self.metrics
                .feeder_running
                .get_or_create(&UsageCacheLabels { cache })
                .set(i64::from(on));
        }
    }

    /// The poller stopped: its samples go, metrics.k8s.io is not synced.
    fn clear_metrics(&self) {
        write(&self.history).clear();
        self.set_synced_gauge(UsageCache::metrics, false);
        self.metrics.nodes.set(0);
    }

    fn set_synced_gauge(&self, cache: UsageCache, synced: bool) {
        self.metrics.set_synced(cache, synced);
    }

    /// The shared pod index this reads.
    pub fn pods(&self) -> &Arc<PodCache> {
        &self.pods
    }

    /// Record one poll of metrics.k8s.io made at `now_ms`; samples are kept for `keep`.
    pub fn record_poll(
        &self,
        now_ms: i64,
        keep: Duration,
        polled: &Result<Vec<NodeSample>, MetricsError>,
    ) {
        let samples: Vec<(&str, Sample)> = match polled {
            Ok(listed) => listed
                .iter()
                .map(|s| {
                    let units =
                        |v: Option<u128>| v.map_or(0, |v| u64::try_from(v).unwrap_or(u64::MAX));
                    let sample = Sample {
                        // No timestamp: as if measured when listed.
                        at_ms: s.at_ms.unwrap_or(now_ms),
                        // No readable window: 0, stale the soonest.
                        window_ms: s.window_ms.unwrap_or(0),
                        cpu_millis: units(s.cpu_millis),
                        memory_bytes: units(s.memory_bytes),
                    };
                    (s.node.as_str(), sample)
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        let poll = match polled {
            Ok(_) => Poll::Listed(&samples),
            Err(_) => Poll::Failed,
        };
        let mut history = write(&self.history);
        history.set_keep(keep);
        history.record(now_ms, poll);
        let (synced, nodes) = (history.synced(), history.nodes());
        drop(history);
        self.set_synced_gauge(UsageCache::metrics, synced);
        self.metrics
            .nodes
            .set(i64::try_from(nodes).unwrap_or(i64::MAX));
        let result = if polled.is_ok() {
            ReloadResult::success
        } else {
            ReloadResult::error
        };
        self.metrics
            .polls
            .get_or_create(&ReloadLabels { result })
            .inc();
    }

    /// The `/readyz` detail: None while there is nothing to say (no usage policy in force, or
    /// everything synced and answering).
    pub fn detail(&self, usage_policy: bool) -> Option<String> {
        if !usage_policy {
            return None;
        }
        let pods = self.pods.synced();
        let (metrics, failing) = {
            let history = read(&self.history);
            (history.synced(), history.last_failed())
        };
        if !pods || !metrics {
            let said =
                |synced, done: &'static str, not: &'static str| if synced { done } else { not };
            return Some(format!(
                "caches not synced (pods {}, metrics.k8s.io {}): the stored allocatable is kept",
                said(pods, "listed", "not listed yet"),
                said(metrics, "read", "not read yet"),
            ));
        }
        failing.then(|| {
            "metrics.k8s.io failing: usage policies take their fallback (nodeRatios or raw)"
                .to_string()
        })
    }
}

impl UsageCaches {
    /// What the last polls gave for `node`: its newest sample (the pressure taint's input).
    pub fn polled(&self, node: &str) -> Polled {
        let history = read(&self.history);
        Polled {
            synced: history.synced(),
            metrics_failing: history.last_failed(),
            sample: history.latest(node),
            poll_interval_ms: history.poll_interval_ms(),
        }
    }
}

impl NodeUsageSource for UsageCaches {
    fn node_usage(&self, node: &str, window: Duration) -> Option<NodeUsage> {
        let requested = self.pods.read().requested(node);
        let pods_synced = self.pods.synced();
        let now_ms = Clock::System.now_ms();
        Some(read(&self.history).usage(node, window, now_ms, requested, pods_synced))
    }
}

/// Poll metrics.k8s.io every `interval` until `shutdown` says stop, keeping samples for the
/// longest window of the policies in force. `client` must not retry (see `node_metrics`); a
/// poll that takes longer than `interval` counts as failed.
pub async fn poll(
    client: kube::Client,
    caches: Arc<UsageCaches>,
    store: PolicyStore,
    interval: Duration,
    shutdown: Signal,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut was_failing = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.stopped() => return,
        }
        let polled = match tokio::time::timeout(interval, node_metrics::list(&client)).await {
            Ok(result) => result,
            Err(_) => Err(MetricsError::Timeout),
        };
        match (&polled, was_failing) {
            (Err(e), false) => {
                tracing::warn!(error = %e, "polling metrics.k8s.io failed: usage policies take their fallback");
            }
            (Ok(listed), true) => {
                tracing::info!(nodes = listed.len(), "metrics.k8s.io answers again");
            }
            _ => {}
        }
        was_failing = polled.is_err();
        let keep = store
            .current()
            .longest_usage_window()
            .unwrap_or(DEFAULT_KEEP);
        caches.record_poll(Clock::System.now_ms(), keep, &polled);
    }
}

/// Whether a policy in force reads the poller's samples: usage, the pressure taint or memory
/// relief (the last two need no pod index, but the pod watch is cheap beside the poller and
/// keeps one rule).
fn reads_samples(set: &overcommit_core::policy::PolicySet) -> bool {
    set.has_usage() || set.has_pressure() || set.has_eviction()
}

/// Which usage feeders run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Feeders {
    /// The metrics.k8s.io poller.
    pub poller: bool,
    /// A pod watch feeding the usage pod index (the usage task's own, or the request cap's).
    pub pod_watch: bool,
}

/// What should run: everything while a usage policy is in force, nothing otherwise; the pod
/// index is fed by the request cap's watch whenever `--request-cap` runs one (`cap_watch`),
/// so the usage task never starts a second one.
pub fn feeders(usage_in_force: bool, cap_watch: bool) -> Feeders {
    Feeders {
        poller: usage_in_force,
        pod_watch: usage_in_force || cap_watch,
    }
}

/// The clients of the usage task: one for the pod watch, one without retries for
/// metrics.k8s.io (a 503 must count as a failed poll at once). Both name themselves
/// `kube-overcommit/VERSION (usage)` in their User-Agent.
pub type Clients = (kube::Client, kube::Client);

/// A feeder task started by [`run`].
struct Task(tokio::task::JoinHandle<()>);

impl Task {
    /// Stop it and wait until it has (its watch or request dropped).
    async fn stop(self) {
        self.0.abort();
        let _ = self.0.await;
    }
}

/// Start and stop the usage feeders as usage policies come and go (checked every `check`) until
/// `shutdown`: the poller every `interval`, and the usage task's own pod watch unless
/// `cap_watch` (the request cap's watch feeds the index). `clients` is called when a feeder
/// first needs the API server; if it fails, usage policies keep the stored allocatable or
/// fall back (not synced), and it is tried again at the next check.
pub async fn run<F, Fut, E>(
    caches: Arc<UsageCaches>,
    store: PolicyStore,
    interval: Duration,
    check: Duration,
    cap_watch: bool,
    mut clients: F,
    shutdown: Signal,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Clients, E>>,
    E: std::fmt::Display,
{
    let mut tick = tokio::time::interval(check);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut built: Option<Clients> = None;
    let mut client_error_logged = false;
    let (mut poller, mut pod_watch): (Option<Task>, Option<Task>) = (None, None);
    caches.set_running(feeders(false, cap_watch));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.stopped() => break,
        }
        let want = feeders(reads_samples(&store.current()), cap_watch);
        let own_watch = want.pod_watch && !cap_watch;
        if (want.poller && poller.is_none()) || (own_watch && pod_watch.is_none()) {
            if built.is_none() {
                match clients().await {
                    Ok(c) => built = Some(c),
                    Err(e) => {
                        if !client_error_logged {
                            tracing::error!(error = %e, "usage policies need the API server (pods, metrics.k8s.io): no client; they keep the stored allocatable or fall back");
                            client_error_logged = true;
                        }
                        continue;
                    }
                }
            }
            let Some((client, metrics_client)) = built.clone() else {
                continue;
            };
            if want.poller && poller.is_none() {
                tracing::info!(interval = ?interval, "a usage policy is in force: polling metrics.k8s.io");
                poller = Some(Task(tokio::spawn(poll(
                    metrics_client,
                    caches.clone(),
                    store.clone(),
                    interval,
                    shutdown.clone(),
                ))));
            }
            if own_watch && pod_watch.is_none() {
                tracing::info!("a usage policy is in force: watching pods");
                let api = kube::Api::all(client);
                let pods = caches.pods.clone();
                pod_watch = Some(Task(tokio::spawn(super::pods::watch(api, pods, None))));
            }
        }
        if !want.poller
            && let Some(task) = poller.take()
        {
            task.stop().await;
            caches.clear_metrics();
            tracing::info!("no usage policy in force: stopped polling metrics.k8s.io");
        }
        if !own_watch && let Some(task) = pod_watch.take() {
            task.stop().await;
            caches.pods.clear();
            tracing::info!("no usage policy in force: stopped watching pods");
        }
        caches.set_running(Feeders {
            poller: poller.is_some(),
            pod_watch: pod_watch.is_some() || cap_watch,
        });
    }
    for task in [poller, pod_watch].into_iter().flatten() {
        task.stop().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use crate::sources::metrics::{PolicyMetrics, PolicySourceLabel};
    use crate::sources::pod_cache::index_pod;
    use k8s_openapi::api::core::v1::Pod;
    use overcommit_core::node::usage::UsageView;
    use overcommit_core::pod_index::PodIndex;
    use std::sync::atomic::Ordering;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"))
    }

    fn bound(name: &str, node: &str, cpu: &str, phase: &str) -> Pod {
        pod(serde_json::json!({
            "metadata": {"name": name, "namespace": "a"},
            "spec": {"nodeName": node, "containers": [
                {"name": "app", "resources": {"requests": {"cpu": cpu, "memory": "1Mi"}}}
            ]},
            "status": {"phase": phase}
        }))
    }

    /// A pod event, as the watch applies it.
    fn apply(
        caches: &UsageCaches,
        pod: &Pod,
    ) -> Result<(), overcommit_core::quantity::QuantityError> {
        let observed = crate::sources::pod_cache::lean(pod)?;
        caches
            .pods
            .apply(&crate::sources::pod_cache::key(pod), observed);
        Ok(())
    }

    fn sample(node: &str, at_ms: i64, cpu: u128) -> NodeSample {
        NodeSample {
            node: node.into(),
            cpu_millis: Some(cpu),
            memory_bytes: Some(1),
            at_ms: Some(at_ms),
            window_ms: Some(10_000),
        }
    }

    fn cpu(caches: &UsageCaches, node: &str) -> Option<UsageView> {
        caches
            .node_usage(node, Duration::from_secs(600))
            .and_then(|u| u.cpu)
    }

    #[test]
    fn views_follow_pods_and_polls_and_say_when_not_synced() {
        let metrics = Metrics::new();
        let usage = metrics.with_registry(UsageMetrics::new);
        let caches = UsageCaches::new(usage.clone(), Duration::from_secs(30), PodCache::new(usage));
        assert_eq!(caches.detail(false), None); // no usage policy: nothing to say
        assert!(
            caches
                .detail(true)
                .is_some_and(|d| d.contains("pods not listed yet"))
        );
        // Listed: two pods on n1, one unreadable (left out, reported).
        let mut index = PodIndex::default();
        assert!(index_pod(&mut index, &bound("p1", "n1", "500m", "Running")).is_ok());
        assert!(index_pod(&mut index, &bound("bad", "n1", "lots", "Running")).is_err());
        caches.pods.replace(index);
        assert!(apply(&caches, &bound("p2", "n1", "250m", "Pending")).is_ok());
        assert!(
            caches
                .detail(true)
                .is_some_and(|d| d.contains("pods listed, metrics.k8s.io not read yet"))
        );
        assert_eq!(
            cpu(&caches, "n1").map(|v| (v.synced, v.requested)),
            Some((false, 750))
        );
        // One poll: synced; peak in the window; age in polls.
        let now = Clock::System.now_ms();
        caches.record_poll(now, DEFAULT_KEEP, &Ok(vec![sample("n1", now - 1000, 900)]));
        let view = cpu(&caches, "n1");
        assert_eq!(
            view.map(|v| (v.synced, v.peak_usage, v.metrics_failing)),
            Some((true, 900, false))
        );
        // Aged by its own timestamp (a second before the poll), with its window.
        assert!(
            view.is_some_and(
                |v| v.sample_age_ms.is_some_and(|a| (1000..60_000).contains(&a))
                    && v.sample_window_ms == 10_000
                    && v.poll_interval_ms == 30_000
            ),
            "{view:?}"
        );
        assert_eq!(caches.detail(true), None);
        // A pod finishing leaves the sum; a deleted one too.
        assert!(apply(&caches, &bound("p2", "n1", "250m", "Succeeded")).is_ok());
        caches.pods.delete("a/p1");
        assert_eq!(cpu(&caches, "n1").map(|v| v.requested), Some(0));
        // A failed poll: failing, said so, counted.
        caches.record_poll(now, DEFAULT_KEEP, &Err(MetricsError::Unavailable));
        assert!(cpu(&caches, "n1").is_some_and(|v| v.metrics_failing));
        assert!(caches.detail(true).is_some_and(|d| d.contains("failing")));
        let text = metrics.encode();
        for line in [
            "kube_overcommit_usage_polls_total{result=\"error\"} 1",
            "kube_overcommit_usage_polls_total{result=\"success\"} 1",
            "kube_overcommit_usage_synced{cache=\"pods\"} 1",
            "kube_overcommit_usage_synced{cache=\"metrics\"} 1",
            "kube_overcommit_usage_nodes 1",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
    }

    #[test]
    fn feeders_run_only_while_a_usage_policy_is_in_force() {
        // (usage policy in force, request cap's watch) -> (poller, pod watch feeding the index)
        let cases = [
            (false, false, false, false),
            (true, false, true, true),
            (false, true, false, true),
            (true, true, true, true),
        ];
        for (usage, cap, poller, pod_watch) in cases {
            assert_eq!(
                feeders(usage, cap),
                Feeders { poller, pod_watch },
                "usage {usage} cap {cap}"
            );
        }
    }

    /// The tests' period of policy checks (`serve`: a second).
    const CHECK: Duration = Duration::from_millis(20);

    fn policy_set(spec: &str) -> overcommit_core::policy::PolicySet {
        let yaml = format!(
            "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata:\n  name: p\nspec:\n{spec}\n"
        );
        overcommit_core::policy::parse_policy_file(&yaml)
            .and_then(overcommit_core::policy::PolicySet::new)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Wait up to 10 s for every line in `metrics`' text.
    async fn wait_for(metrics: &Metrics, lines: &[&str]) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let text = metrics.encode();
            if lines.iter().all(|l| text.contains(l)) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{lines:?} not all in\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Metrics, caches (30 s polls) and an empty policy store.
    fn parts() -> (Arc<Metrics>, Arc<UsageCaches>, PolicyStore) {
        let metrics = Arc::new(Metrics::new());
        let usage = metrics.with_registry(UsageMetrics::new);
        let caches = UsageCaches::new(usage.clone(), Duration::from_secs(30), PodCache::new(usage));
        let readiness = crate::probes::Readiness::new();
        let policies = metrics.with_registry(PolicyMetrics::new);
        let store = PolicyStore::new(policies, readiness.condition("policies", false));
        (metrics, caches, store)
    }

    /// Clients of an API server that refuses every connection.
    async fn refused_clients() -> Result<Clients, String> {
        let uri: http::Uri = "http://127.0.0.1:1".parse().map_err(|e| format!("{e}"))?;
        let client = kube::Client::try_from(kube::Config::new(uri)).map_err(|e| e.to_string())?;
        Ok((client.clone(), client))
    }

    /// [`run`] with 30 s polls and checks every `CHECK`.
    fn spawn_run<F, Fut>(
        caches: &Arc<UsageCaches>,
        store: &PolicyStore,
        cap_watch: bool,
        clients: F,
    ) -> (crate::shutdown::Trigger, tokio::task::JoinHandle<()>)
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<Clients, String>> + Send + 'static,
    {
        let (trigger, shutdown) = crate::shutdown::channel();
        let task = tokio::spawn(run(
            caches.clone(),
            store.clone(),
            Duration::from_secs(30),
            CHECK,
            cap_watch,
            clients,
            shutdown,
        ));
        (trigger, task)
    }

    /// A usage policy starts the feeders; removing it stops them and clears their caches (not
    /// synced, nothing kept); a new one starts them again. The API server here refuses
    /// connections: what runs is said by the gauges.
    #[tokio::test]
    async fn feeders_start_stop_and_start_again_with_usage_policies() {
        let (metrics, caches, store) = parts();
        let built = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = built.clone();
        let clients = move || {
            let count = count.clone();
            async move {
                count.fetch_add(1, Ordering::SeqCst);
                refused_clients().await
            }
        };
        let (trigger, task) = spawn_run(&caches, &store, false, clients);
        let stopped = [
            "kube_overcommit_usage_feeder_running{cache=\"metrics\"} 0",
            "kube_overcommit_usage_feeder_running{cache=\"pods\"} 0",
            "kube_overcommit_usage_synced{cache=\"metrics\"} 0",
            "kube_overcommit_usage_synced{cache=\"pods\"} 0",
        ];
        let running = [
            "kube_overcommit_usage_feeder_running{cache=\"metrics\"} 1",
            "kube_overcommit_usage_feeder_running{cache=\"pods\"} 1",
        ];
        // A static policy: nothing runs, no client is built.
        store.publish(
            policy_set("  nodeRatios: {cpu: \"2\"}"),
            PolicySourceLabel::file,
        );
        wait_for(&metrics, &stopped).await;
        // An absence: observed over 20 checks.
        tokio::time::sleep(CHECK * 20).await;
        wait_for(&metrics, &stopped).await;
        assert_eq!(built.load(Ordering::SeqCst), 0);
        // A usage policy: both run.
        let usage = "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"4\"}}";
        store.publish(policy_set(usage), PolicySourceLabel::file);
        wait_for(&metrics, &running).await;
        // Pretend both caches synced (the API server here refuses every connection).
        let mut index = PodIndex::default();
        assert!(index_pod(&mut index, &bound("p1", "n1", "500m", "Running")).is_ok());
        caches.pods.replace(index);
        let now = Clock::System.now_ms();
        caches.record_poll(now, DEFAULT_KEEP, &Ok(vec![sample("n1", now, 900)]));
        assert!(cpu(&caches, "n1").is_some_and(|v| v.synced && v.requested == 500));
        // Removed: both stop, their caches are cleared and not synced.
        store.publish(
            policy_set("  nodeRatios: {cpu: \"2\"}"),
            PolicySourceLabel::file,
        );
        wait_for(&metrics, &stopped).await;
        wait_for(
            &metrics,
            &[
                "kube_overcommit_usage_nodes 0",
                "kube_overcommit_usage_pods 0",
            ],
        )
        .await;
        let view = cpu(&caches, "n1");
        assert!(
            view.is_some_and(|v| !v.synced && v.requested == 0 && v.sample_age_ms.is_none()),
            "{view:?}"
        );
        assert_eq!(caches.detail(false), None);
        // Back: running again, the clients built once.
        store.publish(policy_set(usage), PolicySourceLabel::file);
        wait_for(&metrics, &running).await;
        assert!(
            caches
                .detail(true)
                .is_some_and(|d| d.contains("not synced"))
        );
        assert_eq!(built.load(Ordering::SeqCst), 1);
        trigger.stop();
        let ended = tokio::time::timeout(Duration::from_secs(10), task).await;
        assert!(matches!(ended, Ok(Ok(()))), "{ended:?}");
    }

    /// With the request cap's watch feeding the index, the usage task never watches pods and
    /// never clears the index; the poller still follows usage policies.
    #[tokio::test]
    async fn with_the_cap_watch_only_the_poller_follows_usage_policies() {
        let (metrics, caches, store) = parts();
        let mut index = PodIndex::default();
        assert!(index_pod(&mut index, &bound("p1", "n1", "500m", "Running")).is_ok());
        caches.pods.replace(index);
        let (trigger, task) = spawn_run(&caches, &store, true, refused_clients);
        let usage = "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"4\"}}";
        store.publish(policy_set(usage), PolicySourceLabel::file);
        wait_for(
            &metrics,
            &[
                "kube_overcommit_usage_feeder_running{cache=\"metrics\"} 1",
                "kube_overcommit_usage_feeder_running{cache=\"pods\"} 1",
            ],
        )
        .await;
        store.publish(
            policy_set("  nodeRatios: {cpu: \"2\"}"),
            PolicySourceLabel::file,
        );
        wait_for(
            &metrics,
            &[
                "kube_overcommit_usage_feeder_running{cache=\"metrics\"} 0",
                "kube_overcommit_usage_feeder_running{cache=\"pods\"} 1",
                "kube_overcommit_usage_synced{cache=\"pods\"} 1",
            ],
        )
        .await;
        assert_eq!(cpu(&caches, "n1").map(|v| v.requested), Some(500));
        trigger.stop();
        let ended = tokio::time::timeout(Duration::from_secs(10), task).await;
        assert!(matches!(ended, Ok(Ok(()))), "{ended:?}");
    }
}
