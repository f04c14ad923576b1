//! The lean pod index of `serve` ([`PodCache`]): one `overcommit_core::pod_index::PodIndex`,
//! shared by the usage rule (requested sums per node) and the request cap (the pod being bound,
//! and the sums), fed by the one pod watch (`sources::pods`), and what the index keeps of a Pod
//! object ([`lean`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use k8s_openapi::api::core::v1::Pod;
use overcommit_core::pod_index::{Observed, Phase, PodIndex, Requested};
use overcommit_core::quantity::QuantityError;

use super::metrics::{UsageCache, UsageMetrics};

/// The shared lean pod index, and whether the watch has listed every pod since it started.
#[derive(Debug)]
pub struct PodCache {
    index: RwLock<PodIndex>,
    synced: AtomicBool,
    metrics: UsageMetrics,
}

impl PodCache {
    /// Empty, not synced (`kube_overcommit_usage_synced{cache="pods"}` 0).
    pub fn new(metrics: UsageMetrics) -> Arc<Self> {
        let cache = Self {
            index: RwLock::new(PodIndex::default()),
            synced: AtomicBool::new(false),
            metrics,
        };
        cache.set_synced(false);
        Arc::new(cache)
    }

    /// Read the index (held for a lookup or two: the watch waits meanwhile).
    pub fn read(&self) -> RwLockReadGuard<'_, PodIndex> {
        // A panic while the watch held the lock leaves at worst one pod half-applied; keep
        // serving (the next list repairs it).
        self.index.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, PodIndex> {
        self.index.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the watch has listed every pod (and not been stopped since).
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    fn set_synced(&self, synced: bool) {
        self.synced.store(synced, Ordering::Release);
        self.metrics.set_synced(UsageCache::pods, synced);
    }

    fn count(&self, len: usize) {
        self.metrics
            .pods
            .set(i64::try_from(len).unwrap_or(i64::MAX));
    }

    /// The watch listed every pod: the index is replaced at once.
    pub fn replace(&self, index: PodIndex) {
        let len = index.len();
        *self.write() = index;
        self.set_synced(true);
        self.count(len);
    }

    /// A pod added or changed, by `namespace/name` (read by [`lean`]).
    pub fn apply(&self, key: &str, pod: Observed<'_>) {
        let mut index = self.write();
        index.apply(key, pod);
        let len = index.len();
        drop(index);
        self.count(len);
    }

    /// A pod deleted, by `namespace/name`.
    pub fn delete(&self, key: &str) {
        let mut index = self.write();
        index.remove(key);
        let len = index.len();
        drop(index);
        self.count(len);
    }

    /// The watch stopped: the index goes, not synced.
    pub fn clear(&self) {
        *self.write() = PodIndex::default();
        self.set_synced(false);
        self.count(0);
    }
}

/// A pod's `namespace/name`, the index's key.
pub fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// What the index keeps of a pod: its cpu and memory requests as the scheduler counts them,
/// node, phase and whether the cap exempts it.
pub fn lean(pod: &Pod) -> Result<Observed<'_>, QuantityError> {
    let requests = crate::pods::scheduler_requests(pod)?;
    let units = |resource: &str| {
        requests
            .get(resource)
            .map_or(0, |v| u64::try_from(*v).unwrap_or(u64::MAX))
    };
    Ok(Observed {
        node: pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        requested: Requested {
            cpu_millis: units("cpu"),
            memory_bytes: units("memory"),
        },
        exempt: crate::placement::pod::exempt(pod),
        phase: Phase::from_status(pod.status.as_ref().and_then(|s| s.phase.as_deref())),
    })
}

/// Apply a pod to `index`; an unreadable one leaves it (not counted, as if it had no requests;
/// its placements then fail open) and is returned as the error.
pub fn index_pod(index: &mut PodIndex, pod: &Pod) -> Result<(), QuantityError> {
    let key = key(pod);
    match lean(pod) {
        Ok(observed) => {
            index.apply(&key, observed);
            Ok(())
        }
        Err(e) => {
            index.remove(&key);
            Err(e)
        }
    }
}
