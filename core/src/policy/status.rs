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
