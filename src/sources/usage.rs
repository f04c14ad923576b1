//! The usage caches of `serve`, behind [`NodeUsageSource`]: the lean pod index (requested sums
//! per node, fed by `sources::pods`) and the NodeMetrics history (fed by [`poll`]: a list of
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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use overcommit_core::node::history::{Poll, Sample, UsageHistory};
use overcommit_core::node::usage::NodeUsage;
use overcommit_core::pod_index::{Phase, PodIndex, Requested};
use overcommit_core::quantity::QuantityError;

use super::PolicyStore;
use super::node_metrics::{self, MetricsError, NodeSample};
use crate::admission::{Clock, NodeUsageSource};
use crate::metrics::{Metrics, ReloadLabels, ReloadResult, UsageCache, UsageCacheLabels};
use crate::shutdown::Signal;

/// Samples are kept this long before the first usage policy says otherwise.
const DEFAULT_KEEP: Duration = Duration::from_secs(15 * 60);

/// The pod index and the usage history, shared by the feeders and the review path.
#[derive(Debug)]
pub struct UsageCaches {
    pods: RwLock<PodIndex>,
    pods_synced: AtomicBool,
    history: RwLock<UsageHistory>,
    metrics: Arc<Metrics>,
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    // A panic while a feeder held the lock leaves at worst one pod or poll half-applied;
    // keep serving (the next list or poll repairs it).
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

/// A pod's index entry: `namespace/name`, node, cpu and memory requests as the scheduler
/// counts them, phase.
pub fn apply_pod(index: &mut PodIndex, pod: &Pod) -> Result<(), QuantityError> {
    let key = format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    );
    let phase = Phase::from_status(pod.status.as_ref().and_then(|s| s.phase.as_deref()));
    let requests = match crate::pods::scheduler_requests(pod) {
        Ok(requests) => requests,
        Err(e) => {
            // Unreadable: not counted (as if it had no requests), and said so.
            index.remove(&key);
            return Err(e);
        }
    };
    let units = |resource: &str| {
        requests
            .get(resource)
            .map_or(0, |v| u64::try_from(*v).unwrap_or(u64::MAX))
    };
    let requested = Requested {
        cpu_millis: units("cpu"),
        memory_bytes: units("memory"),
    };
    let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    index.apply(&key, node, requested, phase);
    Ok(())
}

impl UsageCaches {
    pub fn new(metrics: Arc<Metrics>) -> Arc<Self> {
        let caches = Self {
            pods: RwLock::new(PodIndex::default()),
            pods_synced: AtomicBool::new(false),
            history: RwLock::new(UsageHistory::new(DEFAULT_KEEP)),
            metrics,
        };
        caches.set_synced_gauge(UsageCache::pods, false);
        caches.set_synced_gauge(UsageCache::metrics, false);
        Arc::new(caches)
    }

    fn set_synced_gauge(&self, cache: UsageCache, synced: bool) {
        self.metrics
            .usage_synced
            .get_or_create(&UsageCacheLabels { cache })
            .set(i64::from(synced));
    }

    /// The pod watch listed every pod: the index is replaced at once.
    pub fn replace_pods(&self, index: PodIndex) {
        let len = index.len();
        *write(&self.pods) = index;
        self.pods_synced.store(true, Ordering::Release);
        self.set_synced_gauge(UsageCache::pods, true);
        self.metrics
            .usage_pods
            .set(i64::try_from(len).unwrap_or(i64::MAX));
    }

    /// A pod added or changed.
    pub fn apply_pod(&self, pod: &Pod) -> Result<(), QuantityError> {
        let mut index = write(&self.pods);
        let result = apply_pod(&mut index, pod);
        let len = index.len();
        drop(index);
        self.metrics
            .usage_pods
            .set(i64::try_from(len).unwrap_or(i64::MAX));
        result
    }

    pub fn delete_pod(&self, namespace: &str, name: &str) {
        let mut index = write(&self.pods);
        index.remove(&format!("{namespace}/{name}"));
        let len = index.len();
        drop(index);
        self.metrics
            .usage_pods
            .set(i64::try_from(len).unwrap_or(i64::MAX));
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
                        at_ms: s.at_ms.unwrap_or(now_ms),
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
            .usage_nodes
            .set(i64::try_from(nodes).unwrap_or(i64::MAX));
        let result = if polled.is_ok() {
            ReloadResult::success
        } else {
            ReloadResult::error
        };
        self.metrics
            .usage_polls
            .get_or_create(&ReloadLabels { result })
            .inc();
    }

    /// The `/readyz` detail: None while there is nothing to say (no usage policy in force, or
    /// everything synced and answering).
    pub fn detail(&self, usage_policy: bool) -> Option<String> {
        if !usage_policy {
            return None;
        }
        let pods = self.pods_synced.load(Ordering::Acquire);
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

impl NodeUsageSource for UsageCaches {
    fn node_usage(&self, node: &str, window: Duration) -> Option<NodeUsage> {
        let requested = read(&self.pods).requested(node);
        let pods_synced = self.pods_synced.load(Ordering::Acquire);
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

/// Resolves once a policy with `spec.usage` is in force (checked every second), or never
/// before `shutdown` (then false).
pub async fn usage_policy_seen(store: &PolicyStore, shutdown: &Signal) -> bool {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.stopped() => return false,
        }
        if store.current().has_usage() {
            return true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use overcommit_core::node::usage::UsageView;

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

    fn sample(node: &str, at_ms: i64, cpu: u128) -> NodeSample {
        NodeSample {
            node: node.into(),
            cpu_millis: Some(cpu),
            memory_bytes: Some(1),
            at_ms: Some(at_ms),
        }
    }

    fn cpu(caches: &UsageCaches, node: &str) -> Option<UsageView> {
        caches
            .node_usage(node, Duration::from_secs(600))
            .and_then(|u| u.cpu)
    }

    #[test]
    fn views_follow_pods_and_polls_and_say_when_not_synced() {
        let metrics = Arc::new(Metrics::new());
        let caches = UsageCaches::new(metrics.clone());
        assert_eq!(caches.detail(false), None); // no usage policy: nothing to say
        assert!(
            caches
                .detail(true)
                .is_some_and(|d| d.contains("pods not listed yet"))
        );
        // Listed: two pods on n1, one unreadable (left out, reported).
        let mut index = PodIndex::default();
        assert!(apply_pod(&mut index, &bound("p1", "n1", "500m", "Running")).is_ok());
        assert!(apply_pod(&mut index, &bound("bad", "n1", "lots", "Running")).is_err());
        caches.replace_pods(index);
        assert!(
            caches
                .apply_pod(&bound("p2", "n1", "250m", "Pending"))
                .is_ok()
        );
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
            view.map(|v| (
                v.synced,
                v.peak_usage,
                v.polls_since_sample,
                v.metrics_failing
            )),
            Some((true, 900, Some(0), false))
        );
        assert_eq!(caches.detail(true), None);
        // A pod finishing leaves the sum; a deleted one too.
        assert!(
            caches
                .apply_pod(&bound("p2", "n1", "250m", "Succeeded"))
                .is_ok()
        );
        caches.delete_pod("a", "p1");
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
}
