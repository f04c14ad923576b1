//! What each OvercommitPolicy did, for its `status` (types in `policy::status`): computed from the
//! policies and the nodes' labels and `overcommit.dev/applied` annotations. Pure; the leader
//! writes it (`src/leader/policy_status.rs`). Above both `policy` and `node`, which it reads.

use std::collections::BTreeMap;

use crate::node::applied_summary;
use crate::policy::status::{OvercommitPolicyStatus, PolicyCondition, RolloutStatus};
use crate::policy::{CompiledPolicy, DISABLED_LABEL, NodeChoice, OvercommitPolicy, PolicySet};
use crate::rollout::{self, NodeRef};

/// What the leader knows of one node: its name, labels and applied annotation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub applied: Option<String>,
}

/// The in-process path as the leader sees it (`serve --mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InProcessState {
    /// The static policies' node rule runs in the API server.
    pub mode: bool,
    /// The compiled MutatingAdmissionPolicy and binding are in force as compiled.
    pub in_force: bool,
}

/// Counts for one policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    selected: i64,
    at_generation: i64,
    shadowed: i64,
    opted_out: i64,
    usage_fallback: i64,
}

/// The status every policy should have, by name. `previous` gives each policy's current status,
/// whose conditions keep their `lastTransitionTime` while their status stays; `now` (RFC 3339)
/// stamps the ones that change.
pub fn desired_statuses(
    policies: &[OvercommitPolicy],
    nodes: &[NodeFacts],
    in_process: InProcessState,
    now: &str,
) -> BTreeMap<String, OvercommitPolicyStatus> {
    let (set, errors) = PolicySet::from_valid(policies.to_vec());
    let counts = count(&set, nodes);
    let mut out = BTreeMap::new();
    for policy in policies {
        let Some(name) = policy.metadata.name.clone() else {
            continue;
        };
        let generation = policy.metadata.generation;
        let mut rollout = None;
        let (raw, counts) = match set.policies().find(|p| p.name == name) {
            Some(compiled) => {
                let counts = counts.get(&name).copied().unwrap_or_default();
                let mut raw = conditions(compiled, counts, in_process);
                rollout = rollout_status(&set, compiled, policy, nodes, counts, now, &mut raw);
                (raw, counts)
            }
            None => {
                let reason = errors
                    .iter()
                    .map(ToString::to_string)
                    .find(|e| e.contains(&format!("policy {name}:")))
                    .unwrap_or_else(|| "refused".into());
                (invalid(&reason), Counts::default())
            }
        };
        let previous = policy.status.as_ref().map_or(&[][..], |s| &s.conditions);
        let conditions = raw
            .into_iter()
            .map(|c| stamp(c, previous, generation, now))
            .collect();
        out.insert(
            name,
            OvercommitPolicyStatus {
                observed_generation: generation,
                nodes_selected: counts.selected,
                nodes_at_generation: counts.at_generation,
                nodes_shadowed: counts.shadowed,
                nodes_opted_out: counts.opted_out,
                nodes_usage_fallback: counts.usage_fallback,
                conditions,
                rollout,
            },
        );
    }
    out
}

/// With `spec.rollout`: the rollout's next status (`crate::rollout::advance`), and the
/// Progressing condition it gives while nodes wait or move.
fn rollout_status(
    set: &PolicySet,
    compiled: &CompiledPolicy,
    policy: &OvercommitPolicy,
    nodes: &[NodeFacts],
    counts: Counts,
    now: &str,
    raw: &mut [Raw],
) -> Option<RolloutStatus> {
    let spec = set.rollout(&compiled.name)?;
    let previous = policy.status.as_ref().and_then(|s| s.rollout.as_ref());
    let Ok(now) = now.parse::<jiff::Timestamp>() else {
        return previous.cloned();
    };
    let refs = nodes.iter().map(|n| NodeRef {
        name: n.name.as_str(),
        labels: &n.labels,
        applied: n.applied.as_deref(),
    });
    let movers = rollout::movers(set, compiled, refs);
    let governed = usize::try_from(counts.selected - counts.shadowed).unwrap_or(0);
    let status = rollout::advance(spec, compiled.generation, previous, &movers, governed, now);
    if let Some((on, reason, message)) = rollout::progressing(spec, &status, governed)
        && let Some(c) = raw.iter_mut().find(|c| c.0 == "Progressing")
    {
        *c = ("Progressing", on, reason, message);
    }
    Some(status)
}

/// Count, for every policy with a node rule, what it does on these nodes.
fn count(set: &PolicySet, nodes: &[NodeFacts]) -> BTreeMap<String, Counts> {
    let mut counts: BTreeMap<String, Counts> = BTreeMap::new();
    for node in nodes {
        let opted_out = node.labels.get(DISABLED_LABEL).map(String::as_str) == Some("true");
        let winner = match set.for_node(&node.labels) {
            NodeChoice::Policy(p) => Some(p.name.as_str()),
            NodeChoice::NoPolicy | NodeChoice::OptedOut => None,
        };
        let applied = node
            .applied
            .as_deref()
            .and_then(|t| applied_summary(t).ok());
        for policy in set.policies().filter(|p| has_node_rule(p)) {
            if !policy.selector.matches(&node.labels) {
                continue;
            }
            let c = counts.entry(policy.name.clone()).or_default();
            if opted_out {
                c.opted_out += 1;
                continue;
            }
            c.selected += 1;
            if winner != Some(policy.name.as_str()) {
                c.shadowed += 1;
                continue;
            }
            let Some(applied) = applied.as_ref().filter(|a| a.policy == policy.name) else {
                continue;
            };
            if applied.generation == policy.generation {
                c.at_generation += 1;
            }
            if policy.usage.is_some() && applied.usage.is_empty() {
                c.usage_fallback += 1;
            }
        }
    }
    counts
}

fn has_node_rule(policy: &CompiledPolicy) -> bool {
    !policy.ratios.is_empty() || policy.usage.is_some()
}

/// A condition before stamping: type, status, reason, message.
type Raw = (&'static str, bool, &'static str, String);

fn invalid(error: &str) -> Vec<Raw> {
    vec![
        ("Ready", false, "Invalid", error.to_string()),
        (
            "Progressing",
            false,
            "Invalid",
            "the policy is not applied".into(),
        ),
        (
            "Degraded",
            false,
            "Invalid",
            "the policy is not applied".into(),
        ),
    ]
}

/// The conditions of a valid policy from its counts.
fn conditions(policy: &CompiledPolicy, c: Counts, in_process: InProcessState) -> Vec<Raw> {
    if !has_node_rule(policy) {
        let msg = "no nodeRatios or usage: the policy applies to no node".to_string();
        return vec![
            ("Ready", true, "PodDefaultsOnly", msg.clone()),
            ("Progressing", false, "PodDefaultsOnly", msg.clone()),
            ("Degraded", false, "PodDefaultsOnly", msg),
        ];
    }
    let governed = c.selected - c.shadowed;
    let generation = policy
        .generation
        .map_or_else(|| "this spec".to_string(), |g| format!("generation {g}"));
    let pending = governed - c.at_generation;
    let ready = if c.selected == 0 && c.opted_out == 0 {
        (
            false,
            "NoNodeSelected",
            "the nodeSelector matches no node".to_string(),
        )
    } else if c.selected == 0 {
        let msg = format!(
            "all {} matching nodes are labelled {DISABLED_LABEL}=true",
            c.opted_out
        );
        (false, "AllNodesOptedOut", msg)
    } else if governed == 0 {
        let msg = format!(
            "all {} selected nodes are taken by a higher-priority policy",
            c.selected
        );
        (false, "AllNodesShadowed", msg)
    } else if pending > 0 {
        let msg = format!(
            "{} of {governed} nodes carry {generation}; the others take it at their next status write",
            c.at_generation
        );
        (false, "NodesPending", msg)
    } else {
        (
            true,
            "Applied",
            format!("{governed} nodes carry {generation}"),
        )
    };
    let progressing = if governed > 0 && pending > 0 {
        let msg = format!("{pending} nodes have not yet taken {generation}");
        (true, "NodesPending", msg)
    } else {
        (
            false,
            "Settled",
            "nothing is waiting for a node".to_string(),
        )
    };
    let degraded = if in_process.mode && policy.usage.is_none() && !in_process.in_force {
        let msg = "the compiled MutatingAdmissionPolicy is not in force (refused by the API \
                   server, or not yet written): the webhook serves its nodes meanwhile";
        (true, "InProcessNotInForce", msg.to_string())
    } else if c.usage_fallback > 0 {
        let msg = format!(
            "{} nodes are written from nodeRatios: no fresh usage from metrics.k8s.io",
            c.usage_fallback
        );
        (true, "UsageUnavailable", msg)
    } else {
        (false, "AsExpected", "nothing is degraded".to_string())
    };
    vec![
        ("Ready", ready.0, ready.1, ready.2),
        ("Progressing", progressing.0, progressing.1, progressing.2),
        ("Degraded", degraded.0, degraded.1, degraded.2),
    ]
}

/// A condition with its generation and transition time: kept from `previous` while its
/// status stays.
fn stamp(
    (type_, status, reason, message): Raw,
    previous: &[PolicyCondition],
    generation: Option<i64>,
    now: &str,
) -> PolicyCondition {
    let status = if status { "True" } else { "False" }.to_string();
    let last_transition_time = previous
        .iter()
        .find(|p| p.type_ == type_ && p.status == status)
        .map_or_else(|| now.to_string(), |p| p.last_transition_time.clone());
    PolicyCondition {
        type_: type_.to_string(),
        status,
        reason: reason.to_string(),
        message,
        last_transition_time,
        observed_generation: generation,
    }
}

#[cfg(test)]
#[path = "policy_report_tests.rs"]
mod tests;
