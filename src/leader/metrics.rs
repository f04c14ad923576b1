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
    /// `webhook-configuration`, `ca-secret` or `serving-secret`.
    pub object: String,
    /// `created` or `repaired`.
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
