//! What changed on a node, for Events (docs/policy.md, "Events"): first overcommitted by a
//! policy, restored to the kubelet's values, usage fallback entered and left. Read from the
//! `overcommit.dev/applied` annotation, the one record of what a node carries. Pure; the leader
//! emits them (`src/leader/policy_status.rs`), one Event on the node each, and one summary per
//! policy and kind.

use std::collections::BTreeMap;

use crate::node::applied_summary;
use crate::policy::PolicySet;
use crate::policy_report::NodeFacts;

/// Nodes named in a policy's summary note; the rest are counted.
const NAMED: usize = 5;

/// What a node carries.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Standing {
    /// The kubelet's own values (no applied annotation, or one that does not parse).
    #[default]
    Raw,
    Overcommitted {
        policy: String,
        generation: Option<i64>,
        /// What was applied, for the note: "cpu x1.5, memory x1.2" or usage values.
        applied: String,
        /// A usage policy whose node is written from its `nodeRatios` (usage unknown or stale).
        fallback: bool,
    },
}

/// A node's standing from its facts.
pub fn standing(facts: &NodeFacts, set: &PolicySet) -> Standing {
    let Some(applied) = facts
        .applied
        .as_deref()
        .and_then(|t| applied_summary(t).ok())
    else {
        return Standing::Raw;
    };
    let usage_policy = set
        .policies()
        .find(|p| p.name == applied.policy)
        .is_some_and(|p| p.usage.is_some());
    let text = if applied.usage.is_empty() {
        join(&applied.ratios, " x")
    } else {
        format!("from usage: {}", join(&applied.usage, " "))
    };
    Standing::Overcommitted {
        policy: applied.policy,
        generation: applied.generation,
        applied: text,
        fallback: usage_policy && applied.usage.is_empty(),
    }
}

fn join(map: &BTreeMap<String, String>, between: &str) -> String {
    map.iter()
        .map(|(resource, value)| format!("{resource}{between}{value}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The kinds of change; each is an Event `reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Change {
    Overcommitted,
    Restored,
    UsageFallback,
    UsageRecovered,
}

impl Change {
    /// The node Event's reason.
    pub fn reason(self) -> &'static str {
        match self {
            Change::Overcommitted => "Overcommitted",
            Change::Restored => "Restored",
            Change::UsageFallback => "UsageFallback",
            Change::UsageRecovered => "UsageRecovered",
        }
    }

    /// The policy summary's reason.
    pub fn policy_reason(self) -> &'static str {
        match self {
            Change::Overcommitted => "NodesOvercommitted",
            Change::Restored => "NodesRestored",
            Change::UsageFallback => "NodesOnUsageFallback",
            Change::UsageRecovered => "NodesUsageRecovered",
        }
    }

    pub fn action(self) -> &'static str {
        match self {
            Change::Overcommitted => "Overcommit",
            Change::Restored => "Restore",
            Change::UsageFallback | Change::UsageRecovered => "FollowUsage",
        }
    }

    /// Something for the operator to look at.
    pub fn warning(self) -> bool {
        self == Change::UsageFallback
    }

    fn summary(self) -> &'static str {
        match self {
            Change::Overcommitted => "overcommitted",
            Change::Restored => "restored to the kubelet's values",
            Change::UsageFallback => "on the usage fallback (usage unknown or stale)",
            Change::UsageRecovered => "following usage again",
        }
    }
}

/// One change of one node, under `policy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub change: Change,
    pub policy: String,
    /// The node Event's note.
    pub note: String,
}

/// What happened between two standings of a node. A generation change alone is not an Event
/// (the policy's status counts nodes at its generation).
pub fn transitions(before: &Standing, after: &Standing) -> Vec<Transition> {
    use Standing::{Overcommitted as Over, Raw};
    let make = |change, policy: &str, note: String| Transition {
        change,
        policy: policy.to_string(),
        note,
    };
    match (before, after) {
        (Raw, Raw) => Vec::new(),
        (Over { policy, .. }, Raw) => vec![make(
            Change::Restored,
            policy,
            format!("allocatable back to the kubelet's values (was policy {policy})"),
        )],
        (
            before,
            Over {
                policy,
                generation,
                applied,
                fallback,
            },
        ) => {
            let (was, was_fallback) = match before {
                Over {
                    policy, fallback, ..
                } => (Some(policy.as_str()), *fallback),
                Raw => (None, false),
            };
            let mut out = Vec::new();
            let moved = was != Some(policy.as_str());
            if moved {
                let generation = generation.map_or(String::new(), |g| format!(" (generation {g})"));
                let was = was.map_or(String::new(), |w| format!("; was policy {w}"));
                out.push(make(
                    Change::Overcommitted,
                    policy,
                    format!(
                        "allocatable overcommitted by policy {policy}{generation}: {applied}{was}"
                    ),
                ));
            }
            let fallback_before = was_fallback && !moved;
            if *fallback && !fallback_before {
                out.push(make(
                    Change::UsageFallback,
                    policy,
                    format!("policy {policy}: usage unknown or stale; allocatable written from nodeRatios: {applied}"),
                ));
            } else if !fallback && fallback_before {
                out.push(make(
                    Change::UsageRecovered,
                    policy,
                    format!("policy {policy}: allocatable follows usage again ({applied})"),
                ));
            }
            out
        }
    }
}

/// The policy summaries of a batch of node transitions: (policy, change) -> note, naming the
/// first nodes and counting the rest ("3 nodes overcommitted: a, b, c").
pub fn summaries(batch: &[(String, Transition)]) -> BTreeMap<(String, Change), String> {
    let mut nodes: BTreeMap<(String, Change), Vec<&str>> = BTreeMap::new();
    for (node, t) in batch {
        nodes
            .entry((t.policy.clone(), t.change))
            .or_default()
            .push(node);
    }
    nodes
        .into_iter()
        .map(|((policy, change), mut names)| {
            names.sort_unstable();
            let count = names.len();
            let shown = names[..count.min(NAMED)].join(", ");
            let more = if count > NAMED {
                format!(" and {} more", count - NAMED)
            } else {
                String::new()
            };
            let plural = if count == 1 { "node" } else { "nodes" };
            let note = format!("{count} {plural} {}: {shown}{more}", change.summary());
            ((policy, change), note)
        })
        .collect()
}

#[cfg(test)]
#[path = "node_transitions_tests.rs"]
mod tests;
