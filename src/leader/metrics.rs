//! Leader metrics: leadership, rotations by kind and outcome, seconds until the serving leaf and
//! the CA expire, configuration repairs, and (leader only, `node_metrics`) the raw allocatable
//! of inflated nodes. Registered in the process-wide registry.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RotationLabels {
    /// `leaf` or `ca`.
    pub kind: String,
    /// e.g. `issued`, `started`, `switched`, `finished`, `bootstrap`, `failed`, `conflict`.
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RepairLabels {
    /// `webhook-configuration`, `validating-webhook-configuration` (`--request-cap`),
    /// `ca-secret` or `serving-secret`.
    pub object: String,
    /// `created`, `repaired` or (the validating configuration, once `--request-cap` is off)
    /// `deleted`.
    pub action: String,
}

/// Labels of `node_raw_allocatable`, the same as kube-state-metrics'
/// `kube_node_status_allocatable`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeResourceLabels {
    pub node: String,
    /// The resource name with every character outside `[a-zA-Z0-9_]` replaced by `_`.
    pub resource: String,
    /// `core`, `byte` or `integer`.
    pub unit: String,
}

/// The leader's metrics; cheap to clone (shared handles).
#[derive(Clone, Debug, Default)]
pub struct LeaderMetrics {
    pub leader: Gauge,
    pub rotations: Family<RotationLabels, Counter>,
    pub leaf_expiry_seconds: Gauge<f64, AtomicU64>,
    pub ca_expiry_seconds: Gauge<f64, AtomicU64>,
    pub repairs: Family<RepairLabels, Counter>,
    /// Leader only: the kubelet's allocatable of each inflated node (cores, bytes, counts).
    pub node_raw_allocatable: Family<NodeResourceLabels, Gauge<f64, AtomicU64>>,
    /// Leader only: nodes whose raw-allocatable annotation cannot be read.
    pub node_raw_allocatable_unreadable: Gauge,
}

impl LeaderMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease",
            m.leader.clone(),
        );
        registry.register(
            "certificate_rotations",
            "Certificate rotations by kind (leaf, ca) and outcome",
            m.rotations.clone(),
        );
        registry.register(
            "leaf_expiry_seconds",
            "Seconds until the leaf this replica serves expires (0: none)",
            m.leaf_expiry_seconds.clone(),
        );
        registry.register(
            "ca_expiry_seconds",
            "Seconds until the CA that leaf chains to in the live caBundle expires (0: none)",
            m.ca_expiry_seconds.clone(),
        );
        registry.register(
            "config_repairs",
            "Objects created or repaired by the leader",
            m.repairs.clone(),
        );
        registry.register(
            "node_raw_allocatable",
            "Leader only: the kubelet's own allocatable of each inflated node, from the \
             overcommit.dev/raw-allocatable annotation (cpu in cores, memory in bytes)",
            m.node_raw_allocatable.clone(),
        );
        registry.register(
            "node_raw_allocatable_unreadable_nodes",
            "Leader only: nodes whose overcommit.dev/raw-allocatable annotation cannot be read \
             (no node_raw_allocatable for them)",
            m.node_raw_allocatable_unreadable.clone(),
        );
        m
    }

    pub fn rotation(&self, kind: &str, outcome: &str) {
        self.rotations
            .get_or_create(&RotationLabels {
                kind: kind.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    pub fn repair(&self, object: &str, action: &str) {
        self.repairs
            .get_or_create(&RepairLabels {
                object: object.into(),
                action: action.into(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::metrics::{
        HeartbeatsKeptLabels, Metrics, OutcomeLabel, PolicyReloadLabels, PolicySourceLabel,
        RejectLabels, ReloadLabels, ReloadResult,
    };

    /// Metric name -> the label names of its series, from the text format.
    fn label_names(text: &str) -> BTreeMap<String, BTreeSet<String>> {
        let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let (name, labels) = match line.split_once('{') {
                Some((name, rest)) => (name, rest.split_once('}').map_or("", |(l, _)| l)),
                None => (line.split_once(' ').map_or(line, |(n, _)| n), ""),
            };
            let set = out.entry(name.to_string()).or_default();
            // Label values here never contain `,` or `=` (enums, numbers, the node name "n").
            for pair in labels.split(',').filter(|p| !p.is_empty()) {
                if let Some((key, _)) = pair.split_once('=') {
                    set.insert(key.to_string());
                }
            }
        }
        out
    }

    /// What SECURITY.md ("What is exposed") says /metrics discloses: the labelled series and
    /// their label names are exactly these, and only `node_raw_allocatable` names a node.
    /// Every other series is a bare number. A new label fails here until it is documented.
    #[test]
    fn metrics_disclose_only_the_documented_labels() {
        let m = Metrics::new();
        let leader = m.with_registry(LeaderMetrics::new);
        // One series in every family, so that each label set is encoded.
        m.heartbeats_kept
            .get_or_create(&HeartbeatsKeptLabels {
                outcome: OutcomeLabel::patched,
            })
            .inc();
        m.http_rejects
            .get_or_create(&RejectLabels { status: 413 })
            .inc();
        m.policy_reloads
            .get_or_create(&PolicyReloadLabels {
                source: PolicySourceLabel::crd,
                result: ReloadResult::success,
            })
            .inc();
        m.cert_reloads
            .get_or_create(&ReloadLabels {
                result: ReloadResult::error,
            })
            .inc();
        m.usage_synced
            .get_or_create(&crate::metrics::UsageCacheLabels {
                cache: crate::metrics::UsageCache::pods,
            })
            .set(1);
        m.usage_feeder_running
            .get_or_create(&crate::metrics::UsageCacheLabels {
                cache: crate::metrics::UsageCache::metrics,
            })
            .set(1);
        m.usage_polls
            .get_or_create(&ReloadLabels {
                result: ReloadResult::success,
            })
            .inc();
        leader.rotation("leaf", "issued");
        leader.repair("webhook-configuration", "repaired");
        leader
            .node_raw_allocatable
            .get_or_create(&NodeResourceLabels {
                node: "n".into(),
                resource: "cpu".into(),
                unit: "core".into(),
            })
            .set(4.0);
        let names = label_names(&m.encode());
        let labelled: BTreeMap<&str, BTreeSet<&str>> = names
            .iter()
            .filter(|(_, l)| !l.is_empty())
            .map(|(n, l)| (n.as_str(), l.iter().map(String::as_str).collect()))
            .collect();
        let set = |l: &[&'static str]| l.iter().copied().collect::<BTreeSet<&str>>();
        let want = BTreeMap::from([
            (
                "kube_overcommit_reviews_total",
                set(&["resource", "operation", "outcome"]),
            ),
            ("kube_overcommit_heartbeats_kept_total", set(&["outcome"])),
            (
                "kube_overcommit_review_duration_seconds_bucket",
                set(&["le"]),
            ),
            ("kube_overcommit_http_rejects_total", set(&["status"])),
            (
                "kube_overcommit_policy_reloads_total",
                set(&["source", "result"]),
            ),
            (
                "kube_overcommit_certificate_reloads_total",
                set(&["result"]),
            ),
            ("kube_overcommit_build_info", set(&["version"])),
            (
                "kube_overcommit_certificate_rotations_total",
                set(&["kind", "outcome"]),
            ),
            (
                "kube_overcommit_config_repairs_total",
                set(&["object", "action"]),
            ),
            (
                "kube_overcommit_node_raw_allocatable",
                set(&["node", "resource", "unit"]),
            ),
            ("kube_overcommit_usage_fallbacks_total", set(&["reason"])),
            ("kube_overcommit_usage_synced", set(&["cache"])),
            ("kube_overcommit_usage_feeder_running", set(&["cache"])),
            ("kube_overcommit_usage_polls_total", set(&["result"])),
        ]);
        assert_eq!(labelled, want, "labelled series of /metrics");
        assert!(
            names.contains_key("kube_overcommit_node_raw_allocatable_unreadable_nodes"),
            "{names:?}"
        );
    }
}
