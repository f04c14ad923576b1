//! Memory relief (`spec.eviction`, docs/policy.md "Memory relief"), pure: whether a node needs
//! relief ([`need`]), which of its pods go first ([`rank`]), and how many evictions the per-node
//! rate limit still allows ([`allowance`]). The leader (`src/leader/eviction.rs`) feeds it what
//! it read from the API server and metrics.k8s.io, and does the evicting.
//!
//! Ranking: a node's non-terminal pods are walked in the order they were placed (creation
//! time, then namespace/name), summing memory requests; a pod whose running sum exceeds the
//! kubelet's raw memory allocatable was placed beyond raw, on memory the overcommit lent. Those
//! go first; among them, and then among the others, the lowest priority, then BestEffort before
//! Burstable before Guaranteed, then the largest usage above request, then namespace/name. Never
//! chosen: DaemonSet pods, mirror (static) pods, system-node-critical and
//! system-cluster-critical pods, pods in the namespaces the webhooks exempt, pods already
//! terminating.

use std::cmp::Ordering;

/// Annotation the kubelet puts on the mirror pod of a static pod.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Priority classes whose pods are never chosen.
pub const CRITICAL_PRIORITY_CLASSES: [&str; 2] =
    ["system-node-critical", "system-cluster-critical"];

/// A node's memory usage as last read from metrics.k8s.io.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measured {
    /// The list of NodeMetrics failed (metrics-server down, not served, timed out).
    Failing,
    /// The list answered without this node, or without its memory.
    Missing,
    /// Bytes in use, measured at `at_ms` (ms since the Unix epoch).
    Sample { bytes: u128, at_ms: i64 },
}

/// Why relief was not judged for a node (counted, never acted on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Unknown {
    MetricsFailing,
    NoSample,
    Stale,
    /// The node reports no memory allocatable (and carries no raw value).
    NoRaw,
}

impl Unknown {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Unknown::MetricsFailing => "metrics_failing",
            Unknown::NoSample => "no_sample",
            Unknown::Stale => "stale",
            Unknown::NoRaw => "no_raw",
        }
    }
}

/// Whether a node needs relief.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Usage is above the critical share of raw: evict.
    Relieve { usage: u128, critical: u128 },
    /// Usage is at or below it.
    Fine { usage: u128, critical: u128 },
    /// Usage or raw is unknown: never evict.
    Unknown(Unknown),
}

/// Whether a node whose kubelet reports `raw_memory` bytes of allocatable needs relief at
/// `now_ms`: its latest sample above `critical_percent` of raw. A sample older than
/// `max_age_ms` is stale.
pub fn need(
    raw_memory: Option<u128>,
    measured: Measured,
    critical_percent: u32,
    now_ms: i64,
    max_age_ms: i64,
) -> Need {
    let (bytes, at_ms) = match measured {
        Measured::Failing => return Need::Unknown(Unknown::MetricsFailing),
        Measured::Missing => return Need::Unknown(Unknown::NoSample),
        Measured::Sample { bytes, at_ms } => (bytes, at_ms),
    };
    if now_ms.saturating_sub(at_ms) > max_age_ms {
        return Need::Unknown(Unknown::Stale);
    }
    let Some(raw) = raw_memory.filter(|r| *r > 0) else {
        return Need::Unknown(Unknown::NoRaw);
    };
    let critical = raw.saturating_mul(u128::from(critical_percent)) / 100;
    if bytes > critical {
        Need::Relieve {
            usage: bytes,
            critical,
        }
    } else {
        Need::Fine {
            usage: bytes,
            critical,
        }
    }
}

/// A pod's QoS class, in the order relief takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Qos {
    BestEffort,
    Burstable,
    Guaranteed,
}

impl Qos {
    /// `status.qosClass` as the API server writes it; None for anything else.
    pub fn parse(text: &str) -> Option<Qos> {
        match text {
            "BestEffort" => Some(Qos::BestEffort),
            "Burstable" => Some(Qos::Burstable),
            "Guaranteed" => Some(Qos::Guaranteed),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Qos::BestEffort => "BestEffort",
            Qos::Burstable => "Burstable",
            Qos::Guaranteed => "Guaranteed",
        }
    }
}

/// What relief needs to know of a pod on the node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodFacts {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.priority` (0 when unset, as the API server defaults it without a class).
    pub priority: i32,
    pub priority_class: Option<String>,
    /// None: unreadable; ranked as Burstable.
    pub qos: Option<Qos>,
    /// The kinds of `metadata.ownerReferences`.
    pub owner_kinds: Vec<String>,
    /// Carries [`MIRROR_ANNOTATION`].
    pub mirror: bool,
    /// Has a `deletionTimestamp`.
    pub terminating: bool,
    /// Succeeded or Failed: holds no memory and counts toward no sum.
    pub finished: bool,
    /// Sum of the containers' memory requests as the scheduler counts them, bytes.
    pub memory_request: u128,
    /// Sum of the containers' memory usage (PodMetrics), bytes; None when not measured.
    pub memory_usage: Option<u128>,
    /// `metadata.creationTimestamp`, ms since the Unix epoch.
    pub created_ms: i64,
}

impl PodFacts {
    /// Usage above request (0 when not measured or below).
    pub fn over_request(&self) -> u128 {
        self.memory_usage
            .unwrap_or(0)
            .saturating_sub(self.memory_request)
    }

    fn key(&self) -> (&str, &str) {
        (&self.namespace, &self.name)
    }
}

/// Why a pod is never chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spared {
    DaemonSet,
    Mirror,
    Critical(String),
    ExemptNamespace,
    Terminating,
}

impl std::fmt::Display for Spared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Spared::DaemonSet => f.write_str("owned by a DaemonSet"),
            Spared::Mirror => f.write_str("a mirror (static) pod"),
            Spared::Critical(class) => write!(f, "priority class {class}"),
            Spared::ExemptNamespace => f.write_str("in a namespace the webhooks exempt"),
            Spared::Terminating => f.write_str("already terminating"),
        }
    }
}

/// One pod of the node as relief sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranked<'p> {
    pub pod: &'p PodFacts,
    /// Placed beyond the kubelet's raw memory allocatable.
    pub beyond_raw: bool,
    /// Why it is never chosen (None: a candidate).
    pub spared: Option<Spared>,
}

/// Why a pod is never chosen, if it is not.
pub fn spared(pod: &PodFacts, exempt_namespaces: &[String]) -> Option<Spared> {
    if pod.owner_kinds.iter().any(|k| k == "DaemonSet") {
        Some(Spared::DaemonSet)
    } else if pod.mirror {
        Some(Spared::Mirror)
    } else if let Some(class) = pod
        .priority_class
        .as_deref()
        .filter(|c| CRITICAL_PRIORITY_CLASSES.contains(c))
    {
        Some(Spared::Critical(class.to_string()))
    } else if exempt_namespaces.contains(&pod.namespace) {
        Some(Spared::ExemptNamespace)
    } else if pod.terminating {
        Some(Spared::Terminating)
    } else {
        None
    }
}

/// The node's pods (finished ones left out): candidates first, in the order relief evicts
/// them, then the spared ones (in placement order), each with whether it was placed beyond
/// `raw_memory`.
pub fn rank<'p>(
    pods: &'p [PodFacts],
    raw_memory: u128,
    exempt_namespaces: &[String],
) -> Vec<Ranked<'p>> {
    let mut placed: Vec<&PodFacts> = pods.iter().filter(|p| !p.finished).collect();
    placed.sort_by(|a, b| {
        a.created_ms
            .cmp(&b.created_ms)
            .then_with(|| a.key().cmp(&b.key()))
    });
    let mut sum: u128 = 0;
    let mut ranked: Vec<Ranked<'p>> = placed
        .into_iter()
        .map(|pod| {
            sum = sum.saturating_add(pod.memory_request);
            Ranked {
                pod,
                beyond_raw: sum > raw_memory,
                spared: spared(pod, exempt_namespaces),
            }
        })
        .collect();
    // Stable: the spared keep their placement order.
    ranked.sort_by(|a, b| match (&a.spared, &b.spared) {
        (None, None) => order(a, b),
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(_), Some(_)) => Ordering::Equal,
    });
    ranked
}

/// Relief's order among candidates.
fn order(a: &Ranked<'_>, b: &Ranked<'_>) -> Ordering {
    b.beyond_raw
        .cmp(&a.beyond_raw)
        .then_with(|| a.pod.priority.cmp(&b.pod.priority))
        .then_with(|| qos(a.pod).cmp(&qos(b.pod)))
        .then_with(|| b.pod.over_request().cmp(&a.pod.over_request()))
        .then_with(|| a.pod.key().cmp(&b.pod.key()))
}

fn qos(pod: &PodFacts) -> Qos {
    pod.qos.unwrap_or(Qos::Burstable)
}

/// Why a candidate is where it is, for Events and `review --explain-relief`.
pub fn describe(ranked: &Ranked<'_>) -> String {
    if let Some(spared) = &ranked.spared {
        return format!("never chosen: {spared}");
    }
    let pod = ranked.pod;
    let usage = pod
        .memory_usage
        .map_or_else(|| "unmeasured".to_string(), |u| u.to_string());
    format!(
        "{}, priority {}, {}, memory request {} B, usage {} B ({} B above request)",
        if ranked.beyond_raw {
            "placed beyond raw"
        } else {
            "placed within raw"
        },
        pod.priority,
        qos(pod).as_str(),
        pod.memory_request,
        usage,
        pod.over_request()
    )
}

/// How many more evictions a node may have now: `max` per `interval_ms`, less those done
/// (at the times in `done_ms`) in the last `interval_ms`.
pub fn allowance(done_ms: &[i64], now_ms: i64, interval_ms: i64, max: u32) -> u32 {
    let recent = done_ms
        .iter()
        .filter(|at| now_ms.saturating_sub(**at) < interval_ms)
        .count();
    max.saturating_sub(u32::try_from(recent).unwrap_or(u32::MAX))
}

#[cfg(test)]
#[path = "eviction_tests.rs"]
mod tests;
