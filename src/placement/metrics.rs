//! The metrics of `/validate`, the request cap (registered by this part,
//! `PlacementMetrics::new`): reviews by outcome, those that failed open by reason, the reads
//! of pods the index did not hold, the duration.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::{CapOutcome, PodLookup, Validated};
use crate::metrics::LatencyHistogram;

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

impl From<CapOutcome> for PlacementOutcomeLabel {
    fn from(o: CapOutcome) -> Self {
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

impl From<PodLookup> for PodReadLabel {
    fn from(l: PodLookup) -> Self {
        match l {
            PodLookup::Found => Self::found,
            PodLookup::NotFound => Self::not_found,
            PodLookup::Failed => Self::failed,
        }
    }
}

/// The metrics of `/validate`'s reviews.
#[derive(Clone, Debug, Default)]
pub struct PlacementMetrics {
    /// /validate reviews (the request cap) by outcome.
    pub reviews: Family<PlacementLabels, Counter>,
    /// Reads (GET) of pods a binding named that /validate's pod index did not hold yet, by result.
    pub pod_reads: Family<PodReadLabels, Counter>,
    /// /validate reviews that failed open (allowed undecided), by reason.
    pub failed_open: Family<FailedOpenLabels, Counter>,
    /// Time from request headers to response, for every /validate request answered.
    pub duration: LatencyHistogram,
}

impl PlacementMetrics {
    /// Create and register them.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "placement_review_duration_seconds",
            "Time from request headers to the response for /validate",
            m.duration.clone(),
        );
        registry.register(
            "placement_reviews",
            "Placement reviews on /validate (the request cap) by outcome: denied (capMode Enforce), warned (capMode Warn) and exempted (a DaemonSet's or critical pod, allowed) are over the cap",
            m.reviews.clone(),
        );
        registry.register(
            "placement_failed_open",
            "Placement reviews on /validate allowed undecided, by reason (pods_not_synced: the pod index has not listed every pod yet; unknown_pod, unknown_node: not in this replica's caches yet; pod_read_failed, unreadable, no_target, panicked)",
            m.failed_open.clone(),
        );
        registry.register(
            "placement_pod_reads",
            "Pods a binding named that this replica's pod index did not hold yet, read from the API server (one GET, 500 ms at most) by result: found (decided on it), not_found and failed (allowed)",
            m.pod_reads.clone(),
        );
        m
    }

    /// Count one answered placement review.
    pub fn record(&self, validated: &Validated) {
        if let Some(lookup) = validated.lookup {
            let labels = PodReadLabels {
                result: lookup.into(),
            };
            self.pod_reads.get_or_create(&labels).inc();
        }
        if let Some(reason) = validated.failed_open {
            self.failed_open
                .get_or_create(&FailedOpenLabels { reason })
                .inc();
        }
        let labels = PlacementLabels {
            outcome: validated.outcome.into(),
        };
        self.reviews.get_or_create(&labels).inc();
    }
}
