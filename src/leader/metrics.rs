//! Leader metrics: leadership, rotations by kind and outcome, seconds until the serving leaf and
//! the CA expire, configuration repairs, and (leader only, `raw_allocatable_gauge`) the raw allocatable
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
    /// Leader only: status writes of policies (`policy_status`, which registers them).
    pub policy_status: super::policy_status::StatusMetrics,
}

impl LeaderMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        m.policy_status.register(registry);
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
    use crate::admission::metrics::{HeartbeatsKeptLabels, OutcomeLabel};
    use crate::metrics::{Metrics, ReloadLabels, ReloadResult};
    use crate::placement::metrics::{FailedOpenLabels, PlacementLabels, PodReadLabels};
    use crate::placement::{CapOutcome, PlacementError, PodLookup};
    use crate::server::metrics::ServerMetrics;
    use crate::sources::metrics::{
        PolicyMetrics, PolicyReloadLabels, PolicySourceLabel, UsageCache, UsageCacheLabels,
        UsageMetrics,
    };
    use crate::webhook::{RejectLabels, WebhookMetrics};

    /// Series name -> label name -> the values seen, from the text format.
    type Series = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

    /// The label pairs of one sample (`a="x",b="y"`), values unquoted.
    fn pairs(mut labels: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        while let Some((key, rest)) = labels.split_once("=\"") {
            let mut value = String::new();
            let mut chars = rest.char_indices();
            let mut end = rest.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, e)) = chars.next() {
                            value.push(e);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => value.push(c),
                }
            }
            out.push((key.trim_start_matches(',').to_string(), value));
            labels = &rest[end..];
        }
        out
    }

    /// Every family registered (`# TYPE` lines, with or without samples) and the samples.
    fn exposition(text: &str) -> (BTreeSet<String>, Series) {
        let mut families = BTreeSet::new();
        let mut series = Series::new();
        for line in text.lines().filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                families.insert(rest.split(' ').next().unwrap_or(rest).to_string());
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let (name, labels) = match line.split_once('{') {
                Some((name, rest)) => (name, rest.rsplit_once('}').map_or("", |(l, _)| l)),
                None => (line.split_once(' ').map_or(line, |(n, _)| n), ""),
            };
            let entry = series.entry(name.to_string()).or_default();
            for (key, value) in pairs(labels) {
                entry.entry(key).or_default().insert(value);
            }
        }
        (families, series)
    }

    /// SECURITY.md's table of labelled series ("What `/metrics` exposes"): series (without the
    /// prefix) -> label -> the values listed after it in parentheses (empty: none listed).
    fn documented() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
        let text = include_str!("../../SECURITY.md");
        let table = text
            .split_once("**What `/metrics` exposes**")
            .map(|(_, t)| t)
            .unwrap_or_default();
        let mut out = BTreeMap::new();
        let rows = table
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2);
        for row in rows {
            let cells: Vec<&str> = row.split('|').collect();
            let (Some(series), Some(labels)) = (cells.get(1), cells.get(2)) else {
                continue;
            };
            let Some(name) = series.split('`').nth(1) else {
                continue;
            };
            let mut map = BTreeMap::new();
            // `label` (v1, v2), `other`: odd parts are the names, what follows holds the values.
            let parts: Vec<&str> = labels.split('`').collect();
            for (i, label) in parts.iter().enumerate().skip(1).step_by(2) {
                let after = parts.get(i + 1).map_or("", |a| a.trim_start());
                let values = after
                    .strip_prefix('(')
                    .and_then(|a| a.split_once(')'))
                    .map(|(v, _)| v.split(',').map(|v| v.trim().to_string()).collect())
                    .unwrap_or_default();
                map.insert(label.to_string(), values);
            }
            out.insert(name.to_string(), map);
        }
        out
    }

    /// Every outcome of the placement cap. A new one does not compile here until it is listed.
    fn every_cap_outcome() -> Vec<CapOutcome> {
        use CapOutcome::*;
        let all = vec![Allowed, Denied, Warned, Exempted, FailedOpen, BadRequest];
        for o in &all {
            match o {
                Allowed | Denied | Warned | Exempted | FailedOpen | BadRequest => {}
            }
        }
        all
    }

    /// Every reason a placement review fails open. A new one does not compile here until it is
    /// listed.
    fn every_failed_open_reason() -> Vec<&'static str> {
        use PlacementError::*;
        let text = || String::new();
        let (namespace, name, reason) = (text(), text(), text());
        let all = vec![
            NotAReview(text()),
            NoTarget(text()),
            NotSynced,
            UnknownPod {
                namespace: text(),
                name: text(),
            },
            PodRead {
                namespace,
                name,
                reason,
            },
            UnknownNode(text()),
            Unreadable {
                pod: text(),
                reason: text(),
            },
            Panicked,
        ];
        for e in &all {
            match e {
                NotAReview(_)
                | NoTarget(_)
                | NotSynced
                | UnknownPod { .. }
                | PodRead { .. }
                | UnknownNode(_)
                | Unreadable { .. }
                | Panicked => {}
            }
        }
        all.iter().map(PlacementError::reason).collect()
    }

    fn every_pod_lookup() -> Vec<PodLookup> {
        use PodLookup::*;
        let all = vec![Found, NotFound, Failed];
        for o in &all {
            match o {
                Found | NotFound | Failed => {}
            }
        }
        all
    }

    /// What SECURITY.md ("What is exposed") says /metrics discloses: every family registered
    /// (the replicas' and the leader's, populated or not) is checked; the labelled series and
    /// their label names are exactly the table's, the values it lists for a label are every
    /// value exported (the placement outcomes: all of them), and only `node_raw_allocatable`
    /// names a node. A new family, label or listed value fails here until it is documented.
    #[test]
    fn metrics_disclose_only_the_documented_labels() {
        let m = Metrics::new();
        // Every part `serve` registers (app.rs), and the leader's.
        let webhook = m.with_registry(WebhookMetrics::new);
        let server = m.with_registry(ServerMetrics::new);
        let policies = m.with_registry(PolicyMetrics::new);
        let usage = m.with_registry(UsageMetrics::new);
        m.with_registry(crate::leader::in_process::in_force_gauge);
        let leader = m.with_registry(LeaderMetrics::new);
        // One series in every family that starts empty, so that each label set is encoded.
        webhook
            .reviews
            .heartbeats_kept
            .get_or_create(&HeartbeatsKeptLabels {
                outcome: OutcomeLabel::patched,
            })
            .inc();
        for outcome in every_cap_outcome() {
            webhook
                .placement
                .reviews
                .get_or_create(&PlacementLabels {
                    outcome: outcome.into(),
                })
                .inc();
        }
        for reason in every_failed_open_reason() {
            webhook
                .placement
                .failed_open
                .get_or_create(&FailedOpenLabels { reason })
                .inc();
        }
        for lookup in every_pod_lookup() {
            webhook
                .placement
                .pod_reads
                .get_or_create(&PodReadLabels {
                    result: lookup.into(),
                })
                .inc();
        }
        webhook
            .http_rejects
            .get_or_create(&RejectLabels { status: 413 })
            .inc();
        for source in [PolicySourceLabel::crd, PolicySourceLabel::file] {
            for result in [ReloadResult::success, ReloadResult::error] {
                policies
                    .reloads
                    .get_or_create(&PolicyReloadLabels { source, result })
                    .inc();
            }
        }
        for result in [ReloadResult::success, ReloadResult::error] {
            server.cert_reload(result);
            usage.polls.get_or_create(&ReloadLabels { result }).inc();
        }
        for cache in [UsageCache::pods, UsageCache::metrics] {
            let labels = UsageCacheLabels { cache };
            usage.synced.get_or_create(&labels).set(1);
            usage.feeder_running.get_or_create(&labels).set(1);
        }
        leader.rotation("leaf", "issued");
        leader.rotation("ca", "started");
        leader.repair("webhook-configuration", "repaired");
        for result in ["written", "conflict", "failed"] {
            leader
                .policy_status
                .writes
                .get_or_create(&crate::leader::policy_status::WriteLabels {
                    result: result.into(),
                })
                .inc();
        }
        leader
            .node_raw_allocatable
            .get_or_create(&NodeResourceLabels {
                node: "n".into(),
                resource: "cpu".into(),
                unit: "core".into(),
            })
            .set(4.0);
        let nudge = m.with_registry(super::super::nudger::NudgeMetrics::new);
        for result in ["sent", "failed"] {
            nudge
                .nudges
                .get_or_create(&super::super::nudger::NudgeLabels {
                    result: result.into(),
                })
                .inc();
        }
        nudge.lag.observe(1.5);
        {
            use super::super::pressure::{PressureMetrics, SkipLabels, WriteLabels};
            let pressure = m.with_registry(PressureMetrics::new);
            for (action, result) in [("add", "done"), ("set", "conflict"), ("remove", "failed")] {
                let (action, result) = (action.into(), result.into());
                pressure
                    .writes
                    .get_or_create(&WriteLabels { action, result })
                    .inc();
            }
            for skip in [
                "not_synced",
                "metrics_failing",
                "no_sample",
                "stale",
                "no_raw",
            ] {
                let reason = skip.into();
                pressure.skipped.get_or_create(&SkipLabels { reason }).inc();
            }
        }
        let relief = m.with_registry(super::super::eviction::EvictionMetrics::new);
        for result in ["evicted", "refused_pdb", "failed", "dry_run"] {
            relief
                .evictions
                .get_or_create(&super::super::eviction::ResultLabels {
                    result: result.into(),
                })
                .inc();
        }
        for reason in [
            "metrics_failing",
            "no_sample",
            "stale",
            "no_raw",
            "no_candidate",
            "rate_limited",
        ] {
            relief
                .skipped
                .get_or_create(&super::super::eviction::ReasonLabels {
                    reason: reason.into(),
                })
                .inc();
        }
        relief.above_critical.set(1);
        let (families, series) = exposition(&m.encode());
        assert!(families.len() > 20, "{families:?}");
        // Every family has a sample: one registered but left empty here would hide its labels.
        for family in &families {
            assert!(
                series.keys().any(|s| s == family
                    || s.strip_prefix(family.as_str()).is_some_and(|r| {
                        ["_total", "_bucket", "_sum", "_count", "_info"].contains(&r)
                    })),
                "{family} is registered but has no series here: populate it above so that its \
                 labels are checked against SECURITY.md"
            );
        }
        let labelled: BTreeMap<&str, &BTreeMap<String, BTreeSet<String>>> = series
            .iter()
            .filter(|(_, l)| !l.is_empty())
            .map(|(n, l)| (n.as_str(), l))
            .collect();
        let docs = documented();
        let names = |m: &BTreeMap<String, BTreeSet<String>>| -> BTreeSet<String> {
            m.keys().cloned().collect()
        };
        let exported: BTreeMap<String, BTreeSet<String>> = labelled
            .iter()
            .map(|(n, l)| {
                let short = n.strip_prefix("kube_overcommit_").unwrap_or(n).to_string();
                (short, names(l))
            })
            .collect();
        let listed: BTreeMap<String, BTreeSet<String>> =
            docs.iter().map(|(n, l)| (n.clone(), names(l))).collect();
        assert_eq!(
            exported, listed,
            "labelled series of /metrics (left) vs SECURITY.md's table (right)"
        );
        for (name, labels) in labelled {
            let short = name.strip_prefix("kube_overcommit_").unwrap_or(name);
            for (label, values) in labels {
                let Some(allowed) = docs.get(short).and_then(|d| d.get(label)) else {
                    continue;
                };
                if allowed.is_empty() {
                    continue;
                }
                let missing: Vec<&String> = values.difference(allowed).collect();
                assert!(
                    missing.is_empty(),
                    "{short}: SECURITY.md lists {label} ({allowed:?}), /metrics also has {missing:?}"
                );
            }
            if short != "node_raw_allocatable" {
                assert!(!labels.contains_key("node"), "{short} names a node");
            }
        }
        assert!(
            series.contains_key("kube_overcommit_node_raw_allocatable_unreadable_nodes"),
            "{series:?}"
        );
    }
}
