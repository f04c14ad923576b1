//! Prometheus metrics: one [`Metrics`] value per process, shared as `Arc<Metrics>`.
//!
//! The review hot path only touches pre-created counters (one atomic add) and a lock-free
//! histogram, never a registry lock or a label-map lookup. Other modules (the leader) register
//! their own metrics into the same registry through [`Metrics::register`] or
//! [`Metrics::with_registry`]; everything is exported by `/metrics` on the probe port.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{
    EncodeLabelSet, EncodeLabelValue, EncodeMetric, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Metric, Registry};

use crate::admission::{Outcome, ReviewResource, UsageFallbacks};
use overcommit_core::node::usage::FallbackReason;

/// Prefix of every metric name this binary exports.
pub const PREFIX: &str = "kube_overcommit";

/// `resource` label of the reviews counter.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ResourceLabel {
    node,
    pod,
    other,
}

impl From<ReviewResource> for ResourceLabel {
    fn from(r: ReviewResource) -> Self {
        match r {
            ReviewResource::Node => Self::node,
            ReviewResource::Pod => Self::pod,
            ReviewResource::Other => Self::other,
        }
    }
}

/// `operation` label of the reviews counter (the AdmissionReview operation).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(clippy::upper_case_acronyms)]
pub enum OperationLabel {
    CREATE,
    UPDATE,
    DELETE,
    CONNECT,
    /// Unknown or missing (e.g. a body that was not a review).
    #[allow(non_camel_case_types)]
    none,
}

impl OperationLabel {
    pub fn from_operation(op: &str) -> Self {
        match op {
            "CREATE" => Self::CREATE,
            "UPDATE" => Self::UPDATE,
            "DELETE" => Self::DELETE,
            "CONNECT" => Self::CONNECT,
            _ => Self::none,
        }
    }
}

/// `outcome` label of the reviews counter.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum OutcomeLabel {
    patched,
    unchanged,
    failed_open,
    bad_request,
}

impl From<Outcome> for OutcomeLabel {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Patched => Self::patched,
            Outcome::Unchanged => Self::unchanged,
            Outcome::FailedOpen => Self::failed_open,
            Outcome::BadRequest => Self::bad_request,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabels {
    pub resource: ResourceLabel,
    pub operation: OperationLabel,
    pub outcome: OutcomeLabel,
}

/// `result` label of reload counters.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ReloadResult {
    success,
    error,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    pub result: ReloadResult,
}

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

/// `outcome` label of the heartbeats-kept counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HeartbeatsKeptLabels {
    pub outcome: OutcomeLabel,
}

/// `outcome` label of the placement reviews counter (/validate): `denied` is capMode Enforce
/// over the cap, `warned` capMode Warn over the cap, `exempted` a DaemonSet's or critical pod
/// over the cap (allowed).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PlacementLabels {
    pub outcome: PlacementOutcomeLabel,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum PlacementOutcomeLabel {
    allowed,
    denied,
    warned,
    exempted,
    failed_open,
    bad_request,
}

impl From<crate::placement::CapOutcome> for PlacementOutcomeLabel {
    fn from(o: crate::placement::CapOutcome) -> Self {
        use crate::placement::CapOutcome;
        match o {
            CapOutcome::Allowed => Self::allowed,
            CapOutcome::Denied => Self::denied,
            CapOutcome::Warned => Self::warned,
            CapOutcome::Exempted => Self::exempted,
            CapOutcome::FailedOpen => Self::failed_open,
            CapOutcome::BadRequest => Self::bad_request,
        }
    }
}

/// `reason` label of the placement reviews that failed open (`PlacementError::reason`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailedOpenLabels {
    pub reason: &'static str,
}

/// `result` label of the reads of pods /validate's index did not hold yet.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodReadLabels {
    pub result: PodReadLabel,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum PodReadLabel {
    found,
    not_found,
    failed,
}

impl From<crate::placement::PodLookup> for PodReadLabel {
    fn from(l: crate::placement::PodLookup) -> Self {
        use crate::placement::PodLookup;
        match l {
            PodLookup::Found => Self::found,
            PodLookup::NotFound => Self::not_found,
            PodLookup::Failed => Self::failed,
        }
    }
}

/// HTTP responses that never reached admission (`status` label), e.g. 404, 405, 413, 415.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectLabels {
    pub status: u16,
}

/// `reason` label of the usage fallbacks counter (`FallbackReason::as_str`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FallbackLabels {
    pub reason: &'static str,
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

const RESOURCES: [ResourceLabel; 3] = [
    ResourceLabel::node,
    ResourceLabel::pod,
    ResourceLabel::other,
];
const OPERATIONS: [OperationLabel; 5] = [
    OperationLabel::CREATE,
    OperationLabel::UPDATE,
    OperationLabel::DELETE,
    OperationLabel::CONNECT,
    OperationLabel::none,
];
const OUTCOMES: [OutcomeLabel; 4] = [
    OutcomeLabel::patched,
    OutcomeLabel::unchanged,
    OutcomeLabel::failed_open,
    OutcomeLabel::bad_request,
];

/// All metrics of the process.
pub struct Metrics {
    registry: Mutex<Registry>,
    /// Reviews by resource, operation and outcome; pre-created, indexed by [`Self::review_index`].
    reviews: Vec<Counter>,
    /// Node status reviews whose stored heartbeats were put back (quiet heartbeats), by
    /// outcome (patched: something else changed too; unchanged never happens: keeping a
    /// heartbeat is a patch).
    pub heartbeats_kept: Family<HeartbeatsKeptLabels, Counter>,
    /// /validate reviews (the request cap) by outcome.
    pub placement_reviews: Family<PlacementLabels, Counter>,
    /// Reads (GET) of pods a binding named that /validate's pod index did not hold yet, by result.
    pub placement_pod_reads: Family<PodReadLabels, Counter>,
    /// /validate reviews that failed open (allowed undecided), by reason.
    pub placement_failed_open: Family<FailedOpenLabels, Counter>,
    /// Time from request headers to response, for every /mutate request answered.
    pub review_duration: LatencyHistogram,
    /// Time from request headers to response, for every /validate request answered.
    pub placement_review_duration: LatencyHistogram,
    /// Requests refused before admission, by HTTP status.
    pub http_rejects: Family<RejectLabels, Counter>,
    /// Policies in the set currently used for reviews.
    pub policies_loaded: Gauge,
    /// Policy (re)loads by source and result.
    pub policy_reloads: Family<PolicyReloadLabels, Counter>,
    /// Policy objects refused by validation (CRD source; the file source refuses whole files).
    pub policies_refused: Counter,
    /// not-after of the serving certificate, unix seconds (0 before the first good pair).
    pub cert_not_after_seconds: Gauge,
    /// Certificate pair (re)loads by result.
    pub cert_reloads: Family<ReloadLabels, Counter>,
    /// TLS handshakes that failed or timed out.
    pub tls_handshake_failures: Counter,
    /// Connections currently open on the webhook port.
    pub open_connections: Gauge,
    /// Node reviews under a usage policy where a resource fell back, by reason; pre-created,
    /// indexed by `FallbackReason as usize`.
    usage_fallbacks: Vec<Counter>,
    /// Whether each usage cache has been read completely (1) or not yet (0).
    pub usage_synced: Family<UsageCacheLabels, Gauge>,
    /// Polls of metrics.k8s.io by result.
    pub usage_polls: Family<ReloadLabels, Counter>,
    /// Whether each usage cache's feeder runs in this replica (1) or not (0).
    pub usage_feeder_running: Family<UsageCacheLabels, Gauge>,
    /// Nodes with usage samples in the window.
    pub usage_nodes: Gauge,
    /// Pods in the shared lean pod index (usage policies, the request cap).
    pub usage_pods: Gauge,
    /// In-process mode: 1 while this replica leaves the static policies' nodes to the compiled
    /// MutatingAdmissionPolicy (it and its binding are what this replica compiles), else 0.
    pub in_process_in_force: Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let reviews_family = Family::<ReviewLabels, Counter>::default();
        let fallbacks_family = Family::<FallbackLabels, Counter>::default();
        let m = Self::unregistered(&reviews_family, &fallbacks_family);
        let mut root = Registry::with_prefix(PREFIX);
        m.register_reviews(&mut root, reviews_family);
        m.register_placement(&mut root);
        m.register_policies_and_tls(&mut root);
        m.register_usage(&mut root, fallbacks_family);
        root.register(
            "build",
            "Build information",
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            }),
        );
        if let Ok(mut r) = m.registry.lock() {
            *r = root;
        }
        m
    }

    /// The metrics, their counters pre-created where the hot path indexes them, not registered.
    fn unregistered(
        reviews_family: &Family<ReviewLabels, Counter>,
        fallbacks_family: &Family<FallbackLabels, Counter>,
    ) -> Self {
        let mut reviews = Vec::with_capacity(RESOURCES.len() * OPERATIONS.len() * OUTCOMES.len());
        for resource in RESOURCES {
            for operation in OPERATIONS {
                for outcome in OUTCOMES {
                    // Counters share their atomic with the family entry: the hot path is one add.
                    reviews.push(
                        reviews_family
                            .get_or_create(&ReviewLabels {
                                resource,
                                operation,
                                outcome,
                            })
                            .clone(),
                    );
                }
            }
        }
        let usage_fallbacks = FallbackReason::ALL
            .iter()
            .map(|reason| {
                fallbacks_family
                    .get_or_create(&FallbackLabels {
                        reason: reason.as_str(),
                    })
                    .clone()
            })
            .collect();
        Self {
            registry: Mutex::new(Registry::default()),
            reviews,
            heartbeats_kept: Family::default(),
            placement_reviews: Family::default(),
            placement_pod_reads: Family::default(),
            placement_failed_open: Family::default(),
            review_duration: LatencyHistogram::new(),
            placement_review_duration: LatencyHistogram::new(),
            http_rejects: Family::default(),
            policies_loaded: Gauge::default(),
            policy_reloads: Family::default(),
            policies_refused: Counter::default(),
            cert_not_after_seconds: Gauge::default(),
            cert_reloads: Family::default(),
            tls_handshake_failures: Counter::default(),
            open_connections: Gauge::default(),
            usage_fallbacks,
            usage_synced: Family::default(),
            usage_polls: Family::default(),
            usage_feeder_running: Family::default(),
            usage_nodes: Gauge::default(),
            usage_pods: Gauge::default(),
            in_process_in_force: Gauge::default(),
        }
    }

    /// /mutate: reviews, quiet heartbeats, durations, refusals.
    fn register_reviews(&self, root: &mut Registry, reviews_family: Family<ReviewLabels, Counter>) {
        root.register(
            "reviews",
            "AdmissionReviews answered, by resource, operation and outcome",
            reviews_family,
        );
        root.register(
            "heartbeats_kept",
            "Node status reviews whose conditions got their stored heartbeat times back (quiet heartbeats), by review outcome",
            self.heartbeats_kept.clone(),
        );
        root.register(
            "review_duration_seconds",
            "Time from request headers to the response for /mutate",
            self.review_duration.clone(),
        );
        root.register(
            "http_rejects",
            "Requests refused before admission, by HTTP status",
            self.http_rejects.clone(),
        );
    }

    /// /validate (the request cap).
    fn register_placement(&self, root: &mut Registry) {
        root.register(
            "placement_review_duration_seconds",
            "Time from request headers to the response for /validate",
            self.placement_review_duration.clone(),
        );
        root.register(
            "placement_reviews",
            "Placement reviews on /validate (the request cap) by outcome: denied (capMode Enforce), warned (capMode Warn) and exempted (a DaemonSet's or critical pod, allowed) are over the cap",
            self.placement_reviews.clone(),
        );
        root.register(
            "placement_failed_open",
            "Placement reviews on /validate allowed undecided, by reason (pods_not_synced: the pod index has not listed every pod yet; unknown_pod, unknown_node: not in this replica's caches yet; pod_read_failed, unreadable, no_target, panicked)",
            self.placement_failed_open.clone(),
        );
        root.register(
            "placement_pod_reads",
            "Pods a binding named that this replica's pod index did not hold yet, read from the API server (one GET, 500 ms at most) by result: found (decided on it), not_found and failed (allowed)",
            self.placement_pod_reads.clone(),
        );
    }

    /// Policy sources, the serving certificate and connections.
    fn register_policies_and_tls(&self, root: &mut Registry) {
        root.register(
            "policies_loaded",
            "Policies in the set used for reviews",
            self.policies_loaded.clone(),
        );
        root.register(
            "policy_reloads",
            "Policy (re)loads by source and result",
            self.policy_reloads.clone(),
        );
        root.register(
            "policies_refused",
            "Policy objects refused by validation",
            self.policies_refused.clone(),
        );
        root.register(
            "certificate_not_after_seconds",
            "Expiry of the serving certificate, unix seconds",
            self.cert_not_after_seconds.clone(),
        );
        root.register(
            "certificate_reloads",
            "Serving certificate (re)loads by result",
            self.cert_reloads.clone(),
        );
        root.register(
            "tls_handshake_failures",
            "TLS handshakes that failed or timed out",
            self.tls_handshake_failures.clone(),
        );
        root.register(
            "open_connections",
            "Connections currently open on the webhook port",
            self.open_connections.clone(),
        );
    }

    /// Usage policies and in-process mode.
    fn register_usage(
        &self,
        root: &mut Registry,
        fallbacks_family: Family<FallbackLabels, Counter>,
    ) {
        root.register(
            "usage_fallbacks",
            "Node reviews under a usage policy where a resource took the fallback (nodeRatios or raw) instead of following usage, by reason: no_sample, stale (newest sample older than its window plus 3 x --usage-interval, by its own timestamp), metrics_failing, not_synced, future_sample (the last sample was stamped over 30 s ahead of this clock), above_capacity (peak usage above the node's capacity)",
            fallbacks_family,
        );
        root.register(
            "usage_synced",
            "Whether this replica's usage cache has been read completely (1) or not yet (0): pods (the pod index), metrics (metrics.k8s.io); 0 while its feeder is stopped",
            self.usage_synced.clone(),
        );
        root.register(
            "usage_feeder_running",
            "Whether this replica feeds the usage cache (1) or not (0): metrics (the metrics.k8s.io poller), pods (a pod watch, the usage task's own or the request cap's); the usage feeders run only while a usage policy is in force",
            self.usage_feeder_running.clone(),
        );
        root.register(
            "usage_polls",
            "Polls of metrics.k8s.io NodeMetrics by result",
            self.usage_polls.clone(),
        );
        root.register(
            "usage_nodes",
            "Nodes with usage samples in the longest usage window",
            self.usage_nodes.clone(),
        );
        root.register(
            "usage_pods",
            "Pods in the lean pod index usage policies and the request cap read (non-terminal, bound or pending)",
            self.usage_pods.clone(),
        );
        root.register(
            "in_process_in_force",
            "In-process mode: 1 while this replica leaves the static policies' nodes to the compiled MutatingAdmissionPolicy (it and its binding are what this replica compiles from the policies in force), 0 while the webhook serves them",
            self.in_process_in_force.clone(),
        );
    }

    fn review_index(
        resource: ResourceLabel,
        operation: OperationLabel,
        outcome: OutcomeLabel,
    ) -> usize {
        ((resource as usize) * OPERATIONS.len() + operation as usize) * OUTCOMES.len()
            + outcome as usize
    }

    /// Count one review (lock-free).
    pub fn count_review(&self, resource: ReviewResource, operation: &str, outcome: Outcome) {
        let i = Self::review_index(
            resource.into(),
            OperationLabel::from_operation(operation),
            outcome.into(),
        );
        if let Some(c) = self.reviews.get(i) {
            c.inc();
        }
    }

    /// Count a review's usage fallbacks, one per reason (lock-free; nothing for none).
    pub fn count_usage_fallbacks(&self, reasons: UsageFallbacks) {
        if reasons.is_empty() {
            return;
        }
        for (reason, counter) in FallbackReason::ALL.iter().zip(&self.usage_fallbacks) {
            if reasons.contains(*reason) {
                counter.inc();
            }
        }
    }

    /// Current value of one usage fallback counter (tests).
    pub fn usage_fallbacks_count(&self, reason: FallbackReason) -> u64 {
        self.usage_fallbacks
            .get(reason as usize)
            .map_or(0, |c| c.get())
    }

    /// Current value of one review counter (tests, debugging).
    pub fn reviews_count(
        &self,
        resource: ReviewResource,
        operation: &str,
        outcome: Outcome,
    ) -> u64 {
        let i = Self::review_index(
            resource.into(),
            OperationLabel::from_operation(operation),
            outcome.into(),
        );
        self.reviews.get(i).map_or(0, |c| c.get())
    }

    /// Register one more metric under the `kube_overcommit_` prefix. Metric types are cheap
    /// handles (`Arc` inside): keep a clone and update it; the registry exports it.
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        self.with_registry(|r| r.register(name, help, metric));
    }

    /// Run `f` with the registry (already prefixed `kube_overcommit_`), e.g. to create a
    /// sub-registry: `m.with_registry(|r| { let leader = r.sub_registry_with_prefix("leader"); ... })`.
    pub fn with_registry<R>(&self, f: impl FnOnce(&mut Registry) -> R) -> R {
        let mut guard = match self.registry.lock() {
            Ok(g) => g,
            // A panic while registering cannot leave the registry half-written in a way that
            // matters for export; keep serving metrics.
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut guard)
    }

    /// The registry in the Prometheus/OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(8 * 1024);
        self.with_registry(|r| {
            if let Err(e) = prometheus_client::encoding::text::encode(&mut out, r) {
                tracing::warn!(error = %e, "encoding metrics failed");
            }
        });
        out
    }
}

/// Upper bounds of the latency buckets in nanoseconds: 10 µs doubling up to ~1.3 s.
const BUCKET_COUNT: usize = 18;
const FIRST_BUCKET_NANOS: u64 = 10_000;

/// A histogram of durations whose `observe` is a few relaxed atomic adds (no lock), unlike
/// `prometheus_client`'s histogram which takes a write lock per observation.
#[derive(Clone, Debug, Default)]
pub struct LatencyHistogram {
    inner: std::sync::Arc<HistogramInner>,
}

#[derive(Debug, Default)]
struct HistogramInner {
    /// Non-cumulative counts; the last slot is +Inf.
    buckets: [AtomicU64; BUCKET_COUNT + 1],
    sum_nanos: AtomicU64,
    count: AtomicU64,
}

impl LatencyHistogram {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn observe(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let mut bound = FIRST_BUCKET_NANOS;
        let mut i = 0;
        while i < BUCKET_COUNT && nanos > bound {
            bound = bound.saturating_mul(2);
            i += 1;
        }
        let inner = &*self.inner;
        inner.buckets[i].fetch_add(1, Ordering::Relaxed);
        inner.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
        inner.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.inner.count.load(Ordering::Relaxed)
    }
}

impl prometheus_client::metrics::TypedMetric for LatencyHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let inner = &*self.inner;
        let mut buckets = Vec::with_capacity(BUCKET_COUNT + 1);
        let mut bound = FIRST_BUCKET_NANOS;
        for slot in &inner.buckets[..BUCKET_COUNT] {
            buckets.push((bound as f64 / 1e9, slot.load(Ordering::Relaxed)));
            bound = bound.saturating_mul(2);
        }
        buckets.push((
            f64::MAX,
            inner.buckets[BUCKET_COUNT].load(Ordering::Relaxed),
        ));
        // Count is derived from the buckets so that the exported histogram is self-consistent.
        let count = buckets.iter().map(|(_, c)| c).sum();
        let sum = inner.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn review_counters_are_distinct_and_exported() {
        let m = Metrics::new();
        m.count_review(ReviewResource::Node, "UPDATE", Outcome::Patched);
        m.count_review(ReviewResource::Node, "UPDATE", Outcome::Patched);
        m.count_review(ReviewResource::Pod, "CREATE", Outcome::Unchanged);
        m.count_review(ReviewResource::Other, "", Outcome::BadRequest);
        assert_eq!(
            m.reviews_count(ReviewResource::Node, "UPDATE", Outcome::Patched),
            2
        );
        assert_eq!(
            m.reviews_count(ReviewResource::Pod, "CREATE", Outcome::Unchanged),
            1
        );
        assert_eq!(
            m.reviews_count(ReviewResource::Pod, "CREATE", Outcome::Patched),
            0
        );
        let text = m.encode();
        assert!(
            text.contains(
                r#"kube_overcommit_reviews_total{resource="node",operation="UPDATE",outcome="patched"} 2"#
            ),
            "{text}"
        );
        assert!(text.contains(r#"outcome="bad_request"} 1"#), "{text}");
        assert!(
            text.contains("kube_overcommit_build_info{version="),
            "{text}"
        );
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_sub_millisecond() {
        let h = LatencyHistogram::new();
        h.observe(Duration::from_micros(5)); // <= 10µs
        h.observe(Duration::from_micros(15)); // <= 20µs
        h.observe(Duration::from_secs(5)); // +Inf
        let m = Metrics::new();
        m.register("test_latency_seconds", "test", h.clone());
        let text = m.encode();
        assert!(
            text.contains(r#"kube_overcommit_test_latency_seconds_bucket{le="1e-5"} 1"#)
                || text.contains(r#"kube_overcommit_test_latency_seconds_bucket{le="0.00001"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kube_overcommit_test_latency_seconds_bucket{le="+Inf"} 3"#),
            "{text}"
        );
        assert!(
            text.contains("kube_overcommit_test_latency_seconds_count 3"),
            "{text}"
        );
        assert_eq!(h.count(), 3);
    }

    #[test]
    fn other_modules_can_register_later() {
        let m = Metrics::new();
        let leader = Gauge::<i64>::default();
        m.with_registry(|r| {
            r.sub_registry_with_prefix("leader").register(
                "is_leader",
                "1 when this replica holds the Lease",
                leader.clone(),
            )
        });
        leader.set(1);
        assert!(m.encode().contains("kube_overcommit_leader_is_leader 1"));
    }
}
