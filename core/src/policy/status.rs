//! The status of an OvercommitPolicy: the types of its `status` subresource. What goes in it is
//! computed by the core module `policy_report` (above both `policy` and `node`); the leader writes it
//! (`src/leader/policy_status.rs`).
//!
//! Counts, per policy with a node rule (`nodeRatios` or `usage`):
//! - `nodesSelected`: nodes its `nodeSelector` matches, not opted out;
//! - `nodesOptedOut`: nodes it matches that are labelled `overcommit.dev/disabled=true`;
//! - `nodesShadowed`: selected nodes that a higher-priority policy (or a tie won by name) takes;
//! - `nodesAtGeneration`: nodes it governs whose applied annotation names it at its current
//!   `metadata.generation` (the node's last status write took this spec);
//! - `nodesUsageFallback`: under a usage policy, governed nodes whose annotation records no
//!   usage value: written from `nodeRatios`, because usage was unknown or stale.
//!
//! With `spec.rollout`, `rollout` holds the staged rollout's progress (the core module `rollout`).
//!
//! Conditions, each with a reason an operator can act on: `Ready` (every governed node carries
//! this generation), `Progressing` (some do not yet: they take it at their next status write),
//! `Degraded` (usage unavailable, the compiled in-process policy not in force).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the policy did, written by the leader only (status subresource).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct OvercommitPolicyStatus {
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Nodes the nodeSelector matches, not opted out (shadowed ones included).
    #[serde(default)]
    pub nodes_selected: i64,
    /// Nodes this policy governs whose overcommit.dev/applied annotation carries its current
    /// generation.
    #[serde(default)]
    pub nodes_at_generation: i64,
    /// Selected nodes taken by a higher-priority policy.
    #[serde(default)]
    pub nodes_shadowed: i64,
    /// Nodes the nodeSelector matches that are labelled overcommit.dev/disabled=true.
    #[serde(default)]
    pub nodes_opted_out: i64,
    /// Usage policies: governed nodes written from nodeRatios (usage unknown or stale).
    #[serde(default)]
    pub nodes_usage_fallback: i64,
    /// Ready, Progressing, Degraded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<PolicyCondition>,
    /// With spec.rollout: how far the current generation has reached (the leader admits nodes
    /// to it a step at a time; the replicas keep the others on what they carry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
}

/// The progress of a staged rollout (`spec.rollout`), written by the leader; all its state, so
/// that a new leader continues where the last one stopped.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// The metadata.generation nodes are moving to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Steps taken since the rollout began (a rollout begins when nodes start waiting).
    #[serde(default)]
    pub step: i64,
    /// RFC 3339: when the last step admitted nodes; the next is due stepInterval later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_step_time: Option<String>,
    /// spec.rollout.paused as the leader last saw it.
    #[serde(default)]
    pub paused: bool,
    /// Nodes held on what they carry until a step admits them.
    #[serde(default)]
    pub nodes_waiting: i64,
    /// Nodes admitted to the current spec that do not carry it yet (at most a step's worth);
    /// a node leaves the list once it carries the generation. Always written, empty too: the
    /// leader's merge patch must be able to empty it.
    #[serde(default)]
    pub admitted: Vec<String>,
}

/// One condition, as metav1.Condition.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct PolicyCondition {
    #[serde(rename = "type")]
    pub type_: String,
    /// True, False or Unknown.
    pub status: String,
    pub reason: String,
    #[serde(default)]
    pub message: String,
    /// RFC 3339: when status last changed.
    #[serde(default)]
    pub last_transition_time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
