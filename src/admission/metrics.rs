//! The review metrics of `/mutate` (registered by this part, `ReviewMetrics::new`): reviews by
//! resource, operation and outcome, quiet heartbeats kept, usage fallbacks, the duration.
//! Every counter a review touches is created here at start, so recording a review is a few
//! atomic adds: no registry lock, no label-map lookup.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use overcommit_core::node::usage::FallbackReason;

use super::{Handled, Outcome, ReviewResource, UsageFallbacks};
use crate::metrics::LatencyHistogram;

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

/// `outcome` label of the heartbeats-kept counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HeartbeatsKeptLabels {
    pub outcome: OutcomeLabel,
}

/// `reason` label of the usage fallbacks counter (`FallbackReason::as_str`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FallbackLabels {
    pub reason: &'static str,
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

/// The metrics of `/mutate`'s reviews.
#[derive(Clone, Debug)]
pub struct ReviewMetrics {
    /// Reviews by resource, operation and outcome; pre-created, indexed by [`review_index`].
    reviews: Vec<Counter>,
    /// Node status reviews whose stored heartbeats were put back (quiet heartbeats), by
    /// outcome (patched: something else changed too; unchanged never happens: keeping a
    /// heartbeat is a patch).
    pub heartbeats_kept: Family<HeartbeatsKeptLabels, Counter>,
    /// Node reviews under a usage policy where a resource fell back, by reason; pre-created,
    /// indexed by `FallbackReason as usize`.
    usage_fallbacks: Vec<Counter>,
    /// Time from request headers to response, for every /mutate request answered.
    pub duration: LatencyHistogram,
}

impl ReviewMetrics {
    /// Create and register them.
    pub fn new(registry: &mut Registry) -> Self {
        let reviews_family = Family::<ReviewLabels, Counter>::default();
        let mut reviews = Vec::with_capacity(RESOURCES.len() * OPERATIONS.len() * OUTCOMES.len());
        for resource in RESOURCES {
            for operation in OPERATIONS {
                for outcome in OUTCOMES {
                    // Counters share their atomic with the family entry: the hot path is one add.
                    let labels = ReviewLabels {
                        resource,
                        operation,
                        outcome,
                    };
                    reviews.push(reviews_family.get_or_create(&labels).clone());
                }
            }
        }
        let fallbacks_family = Family::<FallbackLabels, Counter>::default();
        let usage_fallbacks = FallbackReason::ALL
            .iter()
            .map(|reason| {
                let labels = FallbackLabels {
                    reason: reason.as_str(),
                };
                fallbacks_family.get_or_create(&labels).clone()
            })
            .collect();
        let m = Self {
            reviews,
            heartbeats_kept: Family::default(),
            usage_fallbacks,
            duration: LatencyHistogram::new(),
        };
        registry.register(
            "reviews",
            "AdmissionReviews answered, by resource, operation and outcome",
            reviews_family,
        );
        registry.register(
            "heartbeats_kept",
            "Node status reviews whose conditions got their stored heartbeat times back (quiet heartbeats), by review outcome",
            m.heartbeats_kept.clone(),
        );
        registry.register(
            "review_duration_seconds",
            "Time from request headers to the response for /mutate",
            m.duration.clone(),
        );
        registry.register(
            "usage_fallbacks",
            "Node reviews under a usage policy where a resource took the fallback (nodeRatios or raw) instead of following usage, by reason: no_sample, stale (newest sample older than its window plus 3 x --usage-interval, by its own timestamp), metrics_failing, not_synced, future_sample (the last sample was stamped over 30 s ahead of this clock), above_capacity (peak usage above the node's capacity)",
            fallbacks_family,
        );
        m
    }

    /// Count one answered review: its outcome, usage fallbacks and kept heartbeats (lock-free
    /// but for the heartbeats' family, which only quiet heartbeats touch).
    pub fn record(&self, handled: &Handled) {
        self.count_review(handled.resource, &handled.operation, handled.outcome);
        self.count_usage_fallbacks(handled.usage_fallbacks);
        if handled.heartbeats_kept {
            let outcome = handled.outcome.into();
            let labels = HeartbeatsKeptLabels { outcome };
            self.heartbeats_kept.get_or_create(&labels).inc();
        }
    }

    /// Count one review (lock-free).
    pub fn count_review(&self, resource: ReviewResource, operation: &str, outcome: Outcome) {
        let i = review_index(
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
        let i = review_index(
            resource.into(),
            OperationLabel::from_operation(operation),
            outcome.into(),
        );
        self.reviews.get(i).map_or(0, |c| c.get())
    }
}

fn review_index(
    resource: ResourceLabel,
    operation: OperationLabel,
    outcome: OutcomeLabel,
) -> usize {
    ((resource as usize) * OPERATIONS.len() + operation as usize) * OUTCOMES.len()
        + outcome as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    #[test]
    fn review_counters_are_distinct_and_exported() {
        let metrics = Metrics::new();
        let m = metrics.with_registry(ReviewMetrics::new);
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
        let text = metrics.encode();
        assert!(
            text.contains(
                r#"kube_overcommit_reviews_total{resource="node",operation="UPDATE",outcome="patched"} 2"#
            ),
            "{text}"
        );
        assert!(text.contains(r#"outcome="bad_request"} 1"#), "{text}");
    }
}
