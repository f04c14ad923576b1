//! Staged rollout (`spec.rollout`, docs/policy.md "Staged rollout"), pure: which nodes wait,
//! the policies the node rule runs under for a waiting node, and the leader's next step. Above
//! `policy` and `node`, which it reads.
//!
//! A node *waits* when the policy that wins it has `spec.rollout`, its applied annotation does
//! not name that policy at its current generation, moving it would raise a ratio (the safe
//! direction, every ratio the same or lower, is not paced: nor are deletions and opt-outs, which
//! leave no policy to pace), and `status.rollout.admitted` does not name it. A waiting node keeps
//! what it carries: the node rule runs under the policy and ratios its annotation records (none:
//! raw). The leader admits the waiting nodes a step at a time, by name, and publishes its
//! progress in `status.rollout`: all the state there is, so a new leader continues from it.
//!
//! Under a usage policy what is paced is the most a node can be given: its ceilings
//! (`spec.usage.maxRatios`) and fallback ratios (`nodeRatios`). A waiting node keeps the ceilings
//! its annotation records (`;maxRatios=`) while its allocatable follows usage under them with the
//! current target, window and minChange, which move allocatable only within [raw, ceiling], as
//! usage itself does: changing them alone is not a raise.

use crate::node::{
    APPLIED_ANNOTATION, AppliedSummary, NodeView, applied_summary, carries_overcommit_annotations,
};
use std::collections::BTreeMap;

use crate::policy::{
    CompiledPolicy, CompiledRollout, CompiledUsage, LabelLookup, NodeChoice, OvercommitPolicy,
    OvercommitPolicySpec, PolicySet, RolloutStatus, UsageSpec,
};
use crate::quantity::Ratio;

/// Whether a node carrying `applied` carries `policy`'s current generation.
fn carries(policy: &CompiledPolicy, applied: Option<&AppliedSummary>) -> bool {
    applied.is_some_and(|a| a.policy == policy.name && a.generation == policy.generation)
}

/// Whether moving a node that carries `applied` (None: nothing, its raw values) to `policy`
/// raises the most the node can be given of a resource: a ratio (static, or a usage policy's
/// fallback) above the one carried, or a usage ceiling above the ceiling carried. A ratio the
/// annotation does not list, or lists unreadably, counts as 1; a ceiling it does not list (a
/// static policy's node, or written before ceilings were recorded) as the carried ratio, which
/// is what such a node is held on (`carried`). Target, window and minChange are not compared.
pub fn raises(policy: &CompiledPolicy, applied: Option<&AppliedSummary>) -> bool {
    let read = |map: Option<&BTreeMap<String, String>>, resource: &str| {
        map.and_then(|m| m.get(resource))
            .and_then(|text| Ratio::parse(text).ok())
    };
    let ratio = |resource: &str| read(applied.map(|a| &a.ratios), resource);
    let ceiling =
        |resource: &str| read(applied.map(|a| &a.max_ratios), resource).or_else(|| ratio(resource));
    let above = |new: &Ratio, carried: Option<Ratio>| carried.map_or(!new.is_one(), |c| *new > c);
    let ceilings = policy.usage.iter().flat_map(|u| u.targets.iter());
    policy
        .ratios
        .iter()
        .any(|(resource, (_, new))| above(new, ratio(resource)))
        || ceilings
            .into_iter()
            .any(|(resource, target)| above(&target.max_ratio.1, ceiling(resource)))
}

/// Whether the node waits: see the module's comment.
pub fn waits(
    policy: &CompiledPolicy,
    rollout: &CompiledRollout,
    node: &str,
    applied: Option<&AppliedSummary>,
) -> bool {
    !rollout.admitted.contains(node) && moves(policy, applied)
}

/// Where a node stands in its policy's rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Held on what it carries until a step admits it.
    Waiting,
    /// Admitted by a step, not yet carrying the generation (its next status write, or nudge).
    Admitted,
}

/// Where the node stands (None: the rollout has nothing to move on it).
pub fn standing(
    policy: &CompiledPolicy,
    rollout: &CompiledRollout,
    node: &str,
    applied: Option<&AppliedSummary>,
) -> Option<Standing> {
    if !moves(policy, applied) {
        return None;
    }
    Some(if rollout.admitted.contains(node) {
        Standing::Admitted
    } else {
        Standing::Waiting
    })
}

/// Whether the rollout has to move the node: it does not carry the policy's generation and
/// taking it raises a ratio.
fn moves(policy: &CompiledPolicy, applied: Option<&AppliedSummary>) -> bool {
    !carries(policy, applied) && raises(policy, applied)
}

/// The hook of the review path: the policies the node rule should run under for node `name`
/// (None: `set` itself). `node` and `stored` as `node::decide` takes them; the annotation read
/// is the one the rule reads.
/// `choice`: what `set` chose for the node (the caller matched it once; it is not matched again).
pub fn held(
    set: &PolicySet,
    choice: &NodeChoice<'_>,
    name: &str,
    node: &NodeView<'_>,
    stored: Option<&NodeView<'_>>,
) -> Option<PolicySet> {
    if !set.has_rollout() {
        return None;
    }
    let NodeChoice::Policy(policy) = *choice else {
        return None;
    };
    let rollout = set.rollout(&policy.name)?;
    let annotations = if carries_overcommit_annotations(node.annotations) {
        node.annotations
    } else {
        stored.and_then(|s| s.annotations)
    };
    let applied = annotations
        .and_then(|a| a.get(APPLIED_ANNOTATION))
        .and_then(|text| applied_summary(text).ok());
    waits(policy, rollout, name, applied.as_ref()).then(|| carried(policy, applied.as_ref()))
}

/// The policies that keep a node on what its annotation records: that policy's name,
/// generation and ratios (none: raw); when it records ceilings of `policy`, a usage policy, the
/// node follows usage under them (`carried_usage`). Should they not compile, raw, which is
/// never a raise.
pub fn carried(policy: &CompiledPolicy, applied: Option<&AppliedSummary>) -> PolicySet {
    let Some(applied) = applied else {
        return PolicySet::default();
    };
    let usage = policy
        .usage
        .as_ref()
        .filter(|_| applied.policy == policy.name)
        .and_then(|usage| carried_usage(usage, &applied.max_ratios));
    let spec = OvercommitPolicySpec {
        node_ratios: applied.ratios.clone(),
        usage,
        ..OvercommitPolicySpec::default()
    };
    let mut policy = OvercommitPolicy::new(&applied.policy, spec);
    policy.metadata.generation = applied.generation;
    PolicySet::new(vec![policy]).unwrap_or_default()
}

/// `usage` (the current spec's) on the carried `ceilings`: the resources both name, with the
/// current target, window and minChange (None: they name none in common).
fn carried_usage(usage: &CompiledUsage, ceilings: &BTreeMap<String, String>) -> Option<UsageSpec> {
    let both: Vec<(&String, &str, &String)> = usage
        .targets
        .iter()
        .filter_map(|(r, t)| Some((r, t.target.text.as_str(), ceilings.get(r)?)))
        .collect();
    (!both.is_empty()).then(|| UsageSpec {
        target_utilization: both
            .iter()
            .map(|(r, target, _)| (r.to_string(), target.to_string()))
            .collect(),
        max_ratios: both
            .iter()
            .map(|(r, _, ceiling)| (r.to_string(), ceiling.to_string()))
            .collect(),
        window: Some(format!("{}ms", usage.window.as_millis())),
        min_change: Some(usage.min_change.text.clone()),
        // Carried ceilings were valid when written; a memory ceiling above 2 was allowed then.
        allow_high_memory_ratio: Some(true),
    })
}

/// A node as the leader sees it: name, labels, applied annotation.
pub struct NodeRef<'n, L> {
    pub name: &'n str,
    pub labels: &'n L,
    pub applied: Option<&'n str>,
}

/// The nodes `policy` wins that the rollout has to move, admitted or not (sorted by name).
pub fn movers<'n, L: LabelLookup + 'n>(
    set: &PolicySet,
    policy: &CompiledPolicy,
    nodes: impl Iterator<Item = NodeRef<'n, L>>,
) -> Vec<&'n str> {
    let mut out: Vec<&str> = nodes
        .filter(
            |n| matches!(set.for_node(n.labels), NodeChoice::Policy(p) if p.name == policy.name),
        )
        .filter(|n| {
            let applied = n.applied.and_then(|t| applied_summary(t).ok());
            moves(policy, applied.as_ref())
        })
        .map(|n| n.name)
        .collect();
    out.sort_unstable();
    out
}

/// The rollout's next status. `movers`: the nodes still to move (sorted); `governed`: the nodes
/// the policy wins (the base of a percentage); `previous`: the status the policy carries. A
/// step is due when nodes wait, the rollout is not paused and `interval` has passed since the
/// last step; it admits the first waiting nodes by name, so many that at most a step's worth are
/// admitted and not yet moved (a node that never takes its step holds one place, not all).
/// Admission is to a generation: after an edit, nodes admitted to the previous one wait again
/// (one that moved but is still listed would otherwise take the new spec without a step).
pub fn advance(
    rollout: &CompiledRollout,
    generation: Option<i64>,
    previous: Option<&RolloutStatus>,
    movers: &[&str],
    governed: usize,
    now: jiff::Timestamp,
) -> RolloutStatus {
    let previous = previous.cloned().unwrap_or_default();
    let same_generation = previous.generation == generation;
    let mut admitted: Vec<String> = previous
        .admitted
        .iter()
        .filter(|n| same_generation && movers.binary_search(&n.as_str()).is_ok())
        .cloned()
        .collect();
    let waiting: Vec<&str> = movers
        .iter()
        .copied()
        .filter(|n| !admitted.iter().any(|a| a == n))
        .collect();
    let settled = previous.nodes_waiting == 0 && previous.admitted.is_empty();
    let mut step = if settled && previous.generation != generation {
        0
    } else {
        previous.step
    };
    let last = previous
        .last_step_time
        .as_deref()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok());
    let due = last.is_none_or(|last| {
        jiff::SignedDuration::try_from(rollout.interval)
            .ok()
            .and_then(|interval| last.checked_add(interval).ok())
            .is_none_or(|at| now >= at)
    });
    let room = rollout.step.nodes(governed).saturating_sub(admitted.len());
    let mut last_step_time = previous.last_step_time;
    let mut nodes_waiting = waiting.len();
    if !rollout.paused && due && room > 0 && !waiting.is_empty() {
        let take = room.min(waiting.len());
        admitted.extend(waiting[..take].iter().map(|n| n.to_string()));
        admitted.sort_unstable();
        nodes_waiting -= take;
        step += 1;
        last_step_time = Some(now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
    }
    RolloutStatus {
        generation,
        step,
        last_step_time,
        paused: rollout.paused,
        nodes_waiting: i64::try_from(nodes_waiting).unwrap_or(i64::MAX),
        admitted,
    }
}

/// The text of the Event for a step the leader just took (None: `next` took no step over
/// `previous`; `advance` stamps `lastStepTime` exactly when it takes one): which nodes it
/// admitted, to which generation, how many still wait.
pub fn step_note(previous: Option<&RolloutStatus>, next: Option<&RolloutStatus>) -> Option<String> {
    let next = next.filter(|n| takes_step(previous, n))?;
    let admitted_before = previous.map_or(&[][..], |p| p.admitted.as_slice());
    let new: Vec<&str> = next
        .admitted
        .iter()
        .filter(|n| !admitted_before.contains(n))
        .map(String::as_str)
        .collect();
    let generation = next.generation.map_or_else(
        || "the current spec".to_string(),
        |g| format!("generation {g}"),
    );
    Some(format!(
        "step {}: admitted {} to {generation}; {} nodes wait",
        next.step,
        new.join(", "),
        next.nodes_waiting
    ))
}

/// Whether `next` takes a step over `previous` (`advance` stamps `lastStepTime` exactly when it
/// takes one).
pub fn takes_step(previous: Option<&RolloutStatus>, next: &RolloutStatus) -> bool {
    let before = previous.and_then(|p| p.last_step_time.as_ref());
    next.last_step_time.is_some() && next.last_step_time.as_ref() != before
}

/// The Progressing condition's status, reason and message while a rollout is under way (None:
/// nothing waits and nothing admitted is still moving).
pub fn progressing(
    rollout: &CompiledRollout,
    status: &RolloutStatus,
    governed: usize,
) -> Option<(bool, &'static str, String)> {
    if status.nodes_waiting == 0 && status.admitted.is_empty() {
        return None;
    }
    let pace = format!(
        "{} nodes per step every {}s",
        rollout.step.nodes(governed),
        rollout.interval.as_secs()
    );
    let what = format!(
        "step {}: {} nodes admitted and moving, {} waiting ({pace})",
        status.step,
        status.admitted.len(),
        status.nodes_waiting
    );
    Some(if rollout.paused {
        (true, "RolloutPaused", format!("paused at {what}"))
    } else {
        (true, "RollingOut", what)
    })
}

#[cfg(test)]
#[path = "rollout_tests.rs"]
mod tests;
