//! The pressure taint (`spec.pressure`), pure: per node and resource, from the node's raw
//! allocatable, its newest usage sample, the taint it carries and how long usage has been below
//! `low`, whether the leader adds, keeps, changes or removes the taint, and why. The leader
//! (`src/leader/pressure.rs`) reads the inputs and writes the taint.
//!
//! - One taint, key [`TAINT_KEY`], effect `NoSchedule`, value the resources under pressure,
//!   sorted and joined by `-` (`cpu`, `memory`, `cpu-memory`): Kubernetes identifies a taint by
//!   key and effect, so one node cannot carry two taints of one key with different values.
//! - Usage above `high` at a poll: the resource is under pressure at once.
//! - Usage below `low`: the resource is relieved once that has held for `holdTime` (the hold
//!   starts at the first poll below `low`; any poll at or above `low`, or without a known usage,
//!   restarts it). Between `low` and `high`: as it was.
//! - Usage unknown (caches not synced, metrics failing, no sample, a stale sample, no raw
//!   allocatable): as it was, and the reason is said ([`Skip`]).
//! - A node whose policy has no `spec.pressure`, or no watermarks for a resource (the node not
//!   selected, the policy deleted or changed): that resource is not under pressure.
//! - The hold lives in the leader's memory only: a new leader starts it again, so a taint may
//!   stay up to one `holdTime` longer after a leader change, never shorter.

use std::collections::{BTreeMap, BTreeSet};

use crate::node::history::Sample;
use crate::node::raw_allocatable_map;
use crate::node::usage::is_stale;
use crate::policy::{CompiledPressure, Watermarks};
use crate::quantity::Quantity;

/// The key of the pressure taint.
pub const TAINT_KEY: &str = "overcommit.dev/pressure";
/// Its effect: new pods are not placed; pods already running stay.
pub const TAINT_EFFECT: &str = "NoSchedule";
/// The resources a pressure policy may watch, in taint-value order.
pub const RESOURCES: [&str; 2] = ["cpu", "memory"];

/// Why a resource's usage is not known at a poll (nothing changes for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Skip {
    /// No poll of metrics.k8s.io has succeeded yet.
    NotSynced,
    /// The last poll of metrics.k8s.io failed.
    MetricsFailing,
    /// metrics.k8s.io has no sample of the node.
    NoSample,
    /// The node's newest sample is stale (as the usage rule counts it).
    Stale,
    /// The node's raw allocatable of the resource is missing, zero or unreadable.
    NoRaw,
}

impl Skip {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Skip::NotSynced => "not_synced",
            Skip::MetricsFailing => "metrics_failing",
            Skip::NoSample => "no_sample",
            Skip::Stale => "stale",
            Skip::NoRaw => "no_raw",
        }
    }
}

/// One resource's usage on one node at a poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Usage and raw allocatable in one unit (cpu: millicores, memory: bytes).
    Known {
        used: u128,
        raw: u128,
    },
    Unknown(Skip),
}

/// What the metrics API gave this replica, as of its last poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Polled {
    /// One poll has succeeded.
    pub synced: bool,
    /// The last poll failed.
    pub metrics_failing: bool,
    /// The node's newest sample.
    pub sample: Option<Sample>,
    /// `--usage-interval`, ms.
    pub poll_interval_ms: u64,
}

/// The reading of `resource` from what was polled and the node's raw allocatable (None:
/// unknown), at `now_ms`.
pub fn reading(polled: &Polled, resource: &str, raw: Option<u128>, now_ms: i64) -> Reading {
    if !polled.synced {
        return Reading::Unknown(Skip::NotSynced);
    }
    if polled.metrics_failing {
        return Reading::Unknown(Skip::MetricsFailing);
    }
    let Some(sample) = polled.sample else {
        return Reading::Unknown(Skip::NoSample);
    };
    let age = u64::try_from(now_ms.saturating_sub(sample.at_ms)).unwrap_or(0);
    if is_stale(age, sample.window_ms, polled.poll_interval_ms) {
        return Reading::Unknown(Skip::Stale);
    }
    let used = match resource {
        "cpu" => sample.cpu_millis,
        "memory" => sample.memory_bytes,
        _ => return Reading::Unknown(Skip::NoSample),
    };
    match raw {
        Some(raw) if raw > 0 => Reading::Known {
            used: u128::from(used),
            raw,
        },
        _ => Reading::Unknown(Skip::NoRaw),
    }
}

/// The kubelet's own allocatable of `resource` in the reading's unit (cpu: millicores, memory:
/// bytes): from the `overcommit.dev/raw-allocatable` annotation when the node carries it with
/// the resource (the node is inflated), else `status.allocatable` (it is not). None when what
/// should be read is unreadable.
pub fn raw_units(
    annotation: Option<&str>,
    allocatable: Option<&str>,
    resource: &str,
) -> Option<u128> {
    let from_annotation = match annotation {
        Some(text) => raw_allocatable_map(text).ok()?.get(resource).cloned(),
        None => None,
    };
    let text = from_annotation.as_deref().or(allocatable)?;
    let scale = if resource == "cpu" { 3 } else { 0 };
    Quantity::parse(text).ok()?.to_units_floor(scale).ok()
}

/// Why a resource is (not) under pressure after a poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Usage above `high`.
    Above,
    /// Usage between `low` and `high`: as it was.
    Between,
    /// Usage below `low`, for less than `holdTime` since the hold started: still under pressure.
    Holding,
    /// Usage below `low` for `holdTime` (or was not under pressure).
    Below,
    /// The node's policy watches no such resource (or there is no policy with pressure for it).
    NotWatched,
    /// Usage unknown: as it was.
    Unknown(Skip),
}

/// One resource's state across polls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResourceState {
    pub under_pressure: bool,
    /// When usage went below `low` while under pressure (the hold's start), ms.
    pub below_since_ms: Option<i64>,
}

/// The next state of one resource, and why.
pub fn judge_resource(
    marks: Option<Watermarks>,
    hold_ms: u64,
    reading: Reading,
    was: ResourceState,
    now_ms: i64,
) -> (ResourceState, Why) {
    let as_was = ResourceState {
        under_pressure: was.under_pressure,
        below_since_ms: None,
    };
    let Some(marks) = marks else {
        return (ResourceState::default(), Why::NotWatched);
    };
    let (used, raw) = match reading {
        Reading::Known { used, raw } => (used, raw),
        Reading::Unknown(skip) => return (as_was, Why::Unknown(skip)),
    };
    let share = |percent: u32| raw.saturating_mul(u128::from(percent));
    let used = used.saturating_mul(100);
    if used > share(marks.high) {
        return (
            ResourceState {
                under_pressure: true,
                below_since_ms: None,
            },
            Why::Above,
        );
    }
    if used >= share(marks.low) {
        return (as_was, Why::Between);
    }
    if !was.under_pressure {
        return (ResourceState::default(), Why::Below);
    }
    let since = was.below_since_ms.unwrap_or(now_ms);
    let held = u64::try_from(now_ms.saturating_sub(since)).unwrap_or(0);
    if held >= hold_ms {
        return (ResourceState::default(), Why::Below);
    }
    let holding = ResourceState {
        under_pressure: true,
        below_since_ms: Some(since),
    };
    (holding, Why::Holding)
}

/// The resources a taint value names (unknown parts are ignored: the leader rewrites them).
pub fn taint_resources(value: Option<&str>) -> BTreeSet<&'static str> {
    let parts: BTreeSet<&str> = value.into_iter().flat_map(|v| v.split('-')).collect();
    RESOURCES
        .into_iter()
        .filter(|r| parts.contains(r))
        .collect()
}

/// The taint value for resources under pressure (None: no taint).
pub fn taint_value(resources: &BTreeSet<&str>) -> Option<String> {
    let value: Vec<&str> = RESOURCES
        .into_iter()
        .filter(|r| resources.contains(r))
        .collect();
    (!value.is_empty()).then(|| value.join("-"))
}

/// What to do with a node's taint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Keep,
    /// Add the taint with this value (the node has none).
    Add(String),
    /// Change the value of the node's taint.
    Set(String),
    Remove,
}

/// The decision for one node at one poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDecision {
    pub change: Change,
    /// The hold starts to keep (resource -> ms), for the next poll.
    pub holds: BTreeMap<&'static str, i64>,
    /// Per watched or tainted resource, why.
    pub why: Vec<(&'static str, Why)>,
}

/// Judge one node: `pressure` of the policy that governs it (None: none with pressure),
/// `taint`: the value of its taint of [`TAINT_KEY`] (None: no such taint), `holds`: the hold
/// starts kept from the last poll, `reading`: each resource's reading.
pub fn judge_node(
    pressure: Option<&CompiledPressure>,
    taint: Option<&str>,
    holds: &BTreeMap<&'static str, i64>,
    reading: impl Fn(&str) -> Reading,
    now_ms: i64,
) -> NodeDecision {
    let tainted = taint_resources(taint);
    let hold_ms = pressure.map_or(0, |p| u64::try_from(p.hold.as_millis()).unwrap_or(u64::MAX));
    let mut under = BTreeSet::new();
    let mut next_holds = BTreeMap::new();
    let mut why = Vec::new();
    for resource in RESOURCES {
        let marks = pressure.and_then(|p| p.watermarks(resource));
        if marks.is_none() && !tainted.contains(resource) {
            continue;
        }
        let was = ResourceState {
            under_pressure: tainted.contains(resource),
            below_since_ms: holds.get(resource).copied(),
        };
        let read = if marks.is_some() {
            reading(resource)
        } else {
            Reading::Unknown(Skip::NoSample)
        };
        let (next, reason) = judge_resource(marks, hold_ms, read, was, now_ms);
        if next.under_pressure {
            under.insert(resource);
        }
        if let Some(since) = next.below_since_ms {
            next_holds.insert(resource, since);
        }
        why.push((resource, reason));
    }
    let want = taint_value(&under);
    let change = match (taint, want) {
        (None, None) => Change::Keep,
        (None, Some(value)) => Change::Add(value),
        (Some(_), None) => Change::Remove,
        (Some(have), Some(value)) if have == value => Change::Keep,
        (Some(_), Some(value)) => Change::Set(value),
    };
    NodeDecision {
        change,
        holds: next_holds,
        why,
    }
}

#[cfg(test)]
#[path = "pressure_tests.rs"]
mod tests;
