//! OvercommitPolicy (the CRD type), validation, and choosing the policy for a node. Pure.
//!
//! INTERFACE CONTRACT (used by sources/ and admission):
//! - `OvercommitPolicy` is the kube `CustomResource` (cluster-scoped, overcommit.dev/v1alpha1).
//! - `parse_policy_file(text)` parses a YAML stream of one or more documents and validates each.
//! - `PolicySet::new(policies)` validates and indexes; a set is immutable and cheap to share.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Spec of a cluster-scoped OvercommitPolicy.
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema, Default)]
#[kube(
    group = "overcommit.dev",
    version = "v1alpha1",
    kind = "OvercommitPolicy",
    plural = "overcommitpolicies",
    shortname = "ocp"
)]
#[serde(rename_all = "camelCase")]
pub struct OvercommitPolicySpec {
    /// Nodes this policy applies to; empty selects every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// Higher wins; ties are broken by name.
    #[serde(default)]
    pub priority: i32,
    /// Resource name -> multiplier as a decimal string, 1 <= r <= 10.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_ratios: BTreeMap<String, String>,
}

/// Why a policy or a policy file was refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("policy {name}: {reason}")]
    Invalid { name: String, reason: String },
    #[error("policy file: {0}")]
    Parse(String),
}

/// All policies currently loaded, validated, ready to choose from.
#[derive(Debug, Clone, Default)]
pub struct PolicySet {
    policies: Vec<OvercommitPolicy>,
}

impl PolicySet {
    pub fn new(policies: Vec<OvercommitPolicy>) -> Result<Self, PolicyError> {
        Ok(Self { policies })
    }
    pub fn len(&self) -> usize {
        self.policies.len()
    }
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }
}

/// Parse a YAML stream of OvercommitPolicy documents.
pub fn parse_policy_file(_text: &str) -> Result<Vec<OvercommitPolicy>, PolicyError> {
    Err(PolicyError::Parse(
        "not yet implemented (issue 3, core)".into(),
    ))
}
