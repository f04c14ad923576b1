//! The sources' metrics (registered by this part): the policy sources' (`PolicyMetrics`:
//! policies loaded, (re)loads, refusals) and the usage caches' and their feeders'
//! (`UsageMetrics`: synced, running, polls of metrics.k8s.io, nodes and pods held).

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::metrics::{ReloadLabels, ReloadResult};

/// `source` + `result` labels of the policy reload counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyReloadLabels {
    pub source: PolicySourceLabel,
    pub result: ReloadResult,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum PolicySourceLabel {
    file,
    crd,
}

/// `cache` label of the usage caches' synced gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UsageCacheLabels {
    pub cache: UsageCache,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum UsageCache {
    /// The pod index (a watch of non-terminal pods).
    pods,
    /// NodeMetrics from metrics.k8s.io.
    metrics,
}

/// The policy sources' metrics.
#[derive(Clone, Debug, Default)]
pub struct PolicyMetrics {
    /// Policies in the set currently used for reviews.
    pub loaded: Gauge,
    /// Policy (re)loads by source and result.
    pub reloads: Family<PolicyReloadLabels, Counter>,
    /// Policy objects refused by validation (CRD source; the file source refuses whole files).
    pub refused: Counter,
}

impl PolicyMetrics {
    /// Create and register them.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "policies_loaded",
            "Policies in the set used for reviews",
            m.loaded.clone(),
        );
        registry.register(
            "policy_reloads",
            "Policy (re)loads by source and result",
            m.reloads.clone(),
        );
        registry.register(
            "policies_refused",
            "Policy objects refused by validation",
            m.refused.clone(),
        );
        m
    }
}

/// The usage caches' and their feeders' metrics.
#[derive(Clone, Debug, Default)]
pub struct UsageMetrics {
    /// Whether each usage cache has been read completely (1) or not yet (0).
    pub synced: Family<UsageCacheLabels, Gauge>,
    /// Polls of metrics.k8s.io by result.
    pub polls: Family<ReloadLabels, Counter>,
    /// Whether each usage cache's feeder runs in this replica (1) or not (0).
    pub feeder_running: Family<UsageCacheLabels, Gauge>,
    /// Nodes with usage samples in the window.
    pub nodes: Gauge,
    /// Pods in the shared lean pod index (usage policies, the request cap).
    pub pods: Gauge,
}

impl UsageMetrics {
    /// Create and register them.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "usage_synced",
            "Whether this replica's usage cache has been read completely (1) or not yet (0): pods (the pod index), metrics (metrics.k8s.io); 0 while its feeder is stopped",
            m.synced.clone(),
        );
        registry.register(
            "usage_feeder_running",
            "Whether this replica feeds the usage cache (1) or not (0): metrics (the metrics.k8s.io poller), pods (a pod watch, the usage task's own or the request cap's); the usage feeders run only while a usage policy is in force",
            m.feeder_running.clone(),
        );
        registry.register(
            "usage_polls",
            "Polls of metrics.k8s.io NodeMetrics by result",
            m.polls.clone(),
        );
        registry.register(
            "usage_nodes",
            "Nodes with usage samples in the longest usage window",
            m.nodes.clone(),
        );
        registry.register(
            "usage_pods",
            "Pods in the lean pod index usage policies and the request cap read (non-terminal, bound or pending)",
            m.pods.clone(),
        );
        m
    }

    /// Set whether `cache` has been read completely.
    pub fn set_synced(&self, cache: UsageCache, synced: bool) {
        self.synced
            .get_or_create(&UsageCacheLabels { cache })
            .set(i64::from(synced));
    }
}
