//! OvercommitPolicy (the CRD type), validation, and choosing the policy for a node. Pure.
//!
//! INTERFACE CONTRACT (used by sources/ and admission):
//! - `OvercommitPolicy` is the kube `CustomResource` (cluster-scoped, overcommit.dev/v1alpha1).
//! - `parse_policy_file(text)` parses a YAML stream of one or more documents and validates each;
//!   one bad document refuses the whole file.
//! - `PolicySet::new(policies)` validates and indexes; a set is immutable and cheap to share.
//!   `PolicySet::from_valid(policies)` keeps the valid ones and reports the rest (for the CRD
//!   watch, where one bad object must not block every other policy).
//!
//! Choosing for a node: among the policies that have `nodeRatios` or `usage`, the highest `priority` whose
//! `nodeSelector` matches the node's labels, ties broken by name (alphabetically first wins); a
//! node labelled `overcommit.dev/disabled=true` gets no policy. A policy with only
//! `podDefaults` never applies to nodes.
//!
//! Choosing for a pod: pods are not on a node when they are created, so node selectors do not
//! apply. The pod defaults in force are those of the highest-priority policy (ties by name)
//! that has `podDefaults`. Which namespaces get them is decided by the API server: the webhook
//! configuration's namespaceSelector matches namespaces labelled
//! `overcommit.dev/pod-defaults=enabled` (an AdmissionReview does not carry namespace labels,
//! so the webhook itself cannot check them). kube-system and the webhook's own namespace are
//! excluded in code as well.

mod eviction;
mod pressure;
mod rollout;
mod schema;
mod selector;
pub mod status;
mod usage;
mod validate;

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::quantity::{Quantity, Ratio};
pub use eviction::{CompiledEviction, EvictionSpec};
pub use pressure::{CompiledPressure, PressureSpec, Watermarks, WatermarksSpec};
pub use rollout::{CompiledRollout, DEFAULT_STEP_INTERVAL, RolloutSpec, StepSize};
pub use selector::{LabelLookup, NoLabels, Requirement, Selector};
pub use status::{OvercommitPolicyStatus, PolicyCondition, RolloutStatus};
pub use usage::{CompiledUsage, Percent, UsageSpec, UsageTarget};

/// Label that opts a node out of every policy.
pub const DISABLED_LABEL: &str = "overcommit.dev/disabled";
/// Namespace label the webhook configuration selects for pod defaults.
pub const POD_DEFAULTS_NAMESPACE_LABEL: &str = "overcommit.dev/pod-defaults";
/// Lowest and highest allowed `spec.priority`.
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i32> = 0..=1_000_000;
/// Resources a pod default or request-to-limit percentage may name.
pub const POD_DEFAULT_RESOURCES: [&str; 2] = ["cpu", "memory"];
/// Resources a request cap may name, and its lowest and highest percent.
pub const CAP_RESOURCES: [&str; 2] = ["cpu", "memory"];
pub const CAP_PERCENT_RANGE: std::ops::RangeInclusive<u32> = 50..=1000;

/// Spec of a cluster-scoped OvercommitPolicy.
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema, Default)]
#[kube(
    group = "overcommit.dev",
    version = "v1alpha1",
    kind = "OvercommitPolicy",
    plural = "overcommitpolicies",
    shortname = "ocp",
    doc = "Overcommits node allocatable by ratio on selected nodes, and gives pods default requests.",
    status = "OvercommitPolicyStatus",
    printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.priority"}"#,
    printcolumn = r#"{"name":"Ratios","type":"string","jsonPath":".spec.nodeRatios"}"#,
    printcolumn = r#"{"name":"Selected","type":"integer","description":"Nodes the nodeSelector matches, not opted out","jsonPath":".status.nodesSelected"}"#,
    printcolumn = r#"{"name":"At-Gen","type":"integer","description":"Nodes it governs that carry its current generation","jsonPath":".status.nodesAtGeneration"}"#,
    printcolumn = r#"{"name":"Shadowed","type":"integer","description":"Selected nodes taken by a higher-priority policy","jsonPath":".status.nodesShadowed"}"#,
    printcolumn = r#"{"name":"Fallback","type":"integer","priority":1,"description":"Usage policies: nodes on nodeRatios (no fresh usage)","jsonPath":".status.nodesUsageFallback"}"#,
    printcolumn = r#"{"name":"Opted-Out","type":"integer","priority":1,"description":"Matching nodes labelled overcommit.dev/disabled=true","jsonPath":".status.nodesOptedOut"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = schema::spec_rules()))]
pub struct OvercommitPolicySpec {
    /// Nodes this policy applies to (matchLabels and matchExpressions with In, NotIn, Exists,
    /// DoesNotExist); empty or absent selects every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::node_selector")]
    pub node_selector: Option<LabelSelector>,
    /// Among the policies whose selector matches a node, the highest priority wins; ties are
    /// broken by name (alphabetically first). 0 to 1000000.
    #[serde(default)]
    #[schemars(range(min = 0, max = 1_000_000))]
    pub priority: i32,
    /// Resource name (cpu, memory, ephemeral-storage, pods, or an extended resource such as
    /// example.com/gpu) -> multiplier of the kubelet's allocatable, a decimal string from 1 to
    /// 10 with at most 6 decimals. Memory is enforced by the kernel, not the scheduler: a memory
    /// ratio above 1 turns into OOM kills and evictions under load.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "schema::node_ratios")]
    pub node_ratios: BTreeMap<String, String>,
    /// Requests for pods created in namespaces labelled overcommit.dev/pod-defaults=enabled.
    /// The highest-priority policy that has podDefaults supplies them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_defaults: Option<PodDefaults>,
    /// Allocatable that follows measured usage (cpu, memory); nodeRatios is then the fallback
    /// while usage is unknown or stale. See docs/policy.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::usage")]
    pub usage: Option<UsageSpec>,
    /// cpu and/or memory -> the most the requests of the pods on a node may add up to, as a
    /// percent of the kubelet's raw allocatable ("110%"; 50% to 1000%, at least the policy's
    /// ratio for that resource). Checked when a pod is bound to a node. Needs nodeRatios.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "schema::request_cap")]
    pub request_cap: BTreeMap<String, String>,
    /// What a binding over requestCap gets: Enforce (denied, the default) or Warn (allowed,
    /// with an admission warning).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::cap_mode")]
    pub cap_mode: Option<CapMode>,
    /// Staged rollout: a change of this policy reaches its nodes a few at a time
    /// (maxNodesPerStep every stepInterval, none while paused); raising no ratio (nor, with
    /// usage, a ceiling) is not paced. See docs/policy.md, "Staged rollout".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutSpec>,
    /// The pressure taint: per resource, a node whose usage rises above `high` (a share of the
    /// kubelet's raw allocatable) is tainted `overcommit.dev/pressure:NoSchedule` until usage
    /// has stayed below `low` for `holdTime`. Needs nodeRatios or usage. See docs/policy.md,
    /// "Pressure".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "pressure::schema")]
    pub pressure: Option<PressureSpec>,
    /// Memory relief, opt-in: above memoryCritical of the kubelet's raw memory allocatable the
    /// leader evicts pods through the Eviction API (PodDisruptionBudgets hold), at most
    /// maxPodsPerNode per node per interval. Needs nodeRatios or usage. See docs/policy.md,
    /// "Memory relief".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::eviction")]
    pub eviction: Option<EvictionSpec>,
}

/// What a binding over the request cap gets.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CapMode {
    /// Denied.
    #[default]
    Enforce,
    /// Allowed, with an admission warning.
    Warn,
}

/// A validated request cap: resource -> percent of raw allocatable, and the mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledCap {
    pub percent: BTreeMap<String, u32>,
    pub mode: CapMode,
}

/// Default requests for pods, the way OpenShift's ClusterResourceOverride does it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct PodDefaults {
    /// cpu and/or memory request given to every container and init container that sets no
    /// request and no limit for it (with a limit, Kubernetes makes the request equal the limit).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "schema::pod_default_requests")]
    pub requests: BTreeMap<String, String>,
    /// cpu and/or memory: every container with a limit gets request = limit x percent / 100
    /// (1 to 100), replacing its request.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "schema::request_to_limit_percent")]
    pub request_to_limit_percent: BTreeMap<String, u32>,
}

/// Why a policy or a policy file was refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("policy {name}: {reason}")]
    Invalid { name: String, reason: String },
    #[error("policy file: {0}")]
    Parse(String),
}

/// A validated policy, its ratios and selector parsed once.
#[derive(Debug)]
pub struct CompiledPolicy {
    pub name: String,
    pub priority: i32,
    pub selector: Selector,
    /// Every ratio of the policy, including those equal to 1, with the text as written.
    pub ratios: BTreeMap<String, (String, Ratio)>,
    pub pod_defaults: Option<CompiledPodDefaults>,
    /// `spec.usage`, validated (None: a static policy).
    pub usage: Option<CompiledUsage>,
    /// `spec.requestCap` and `spec.capMode`; None when the policy sets no cap.
    pub cap: Option<CompiledCap>,
    /// `spec.pressure`, validated (None: no pressure taint).
    pub pressure: Option<CompiledPressure>,
    /// `spec.eviction`, validated (None: no memory relief).
    pub eviction: Option<CompiledEviction>,
    /// `metadata.generation` (None: a policy from a file, which has none): recorded in the
    /// `overcommit.dev/applied` annotation, so that the policy's status can count the nodes
    /// carrying its current spec.
    pub generation: Option<i64>,
    /// Whether the policy sets `spec.rollout` (its changes are paced: the webhook's, never the
    /// compiled policy's; `in_process::is_static`).
    pub staged: bool,
    /// The `overcommit.dev/applied` annotation's policy and ratios as the node rule writes
    /// them (`policy=NAME;ratios=...;generation=N`; None where they cannot be listed), made by the node
    /// rule on first use: the same for every node the policy inflates, so not rebuilt for each
    /// review.
    pub applied_listed: OnceLock<Option<String>>,
}

/// Pod defaults with their quantities parsed.
#[derive(Debug, Clone)]
pub struct CompiledPodDefaults {
    /// resource -> default request (cpu, memory).
    pub requests: BTreeMap<String, Quantity>,
    /// resource -> percent of the limit (cpu, memory).
    pub request_to_limit_percent: BTreeMap<String, u32>,
}

/// All policies currently loaded, validated, ready to choose from.
#[derive(Debug, Clone, Default)]
pub struct PolicySet {
    /// Highest priority first, then by name.
    compiled: Arc<Vec<CompiledPolicy>>,
    /// Index into `compiled` of the policy whose podDefaults are in force.
    pod_defaults: Option<usize>,
    /// Whether any policy has `spec.usage` (else nobody needs to look usage up).
    usage: bool,
    /// Whether any policy has `spec.pressure` (else the leader judges no node's pressure).
    pressure: bool,
    /// `spec.rollout` of the policies that have one, by name.
    rollouts: Arc<BTreeMap<String, CompiledRollout>>,
}

impl PolicySet {
    /// Validate every policy; any invalid one or a duplicate name refuses the whole set.
    pub fn new(policies: Vec<OvercommitPolicy>) -> Result<Self, PolicyError> {
        let mut compiled = Vec::with_capacity(policies.len());
        for policy in &policies {
            compiled.push(compile(policy)?);
        }
        Self::index(compiled)
    }

    /// Keep the valid policies and report the invalid ones (and duplicates after the first).
    pub fn from_valid(policies: Vec<OvercommitPolicy>) -> (Self, Vec<PolicyError>) {
        let mut compiled: Vec<Compiled> = Vec::with_capacity(policies.len());
        let mut errors = Vec::new();
        for policy in &policies {
            match compile(policy) {
                Ok(c) if compiled.iter().any(|p| p.0.name == c.0.name) => {
                    errors.push(duplicate(&c.0.name))
                }
                Ok(c) => compiled.push(c),
                Err(e) => errors.push(e),
            }
        }
        match Self::index(compiled) {
            Ok(set) => (set, errors),
            // Unreachable (duplicates were filtered), but never panic: report and load nothing.
            Err(e) => {
                errors.push(e);
                (PolicySet::default(), errors)
            }
        }
    }

    fn index(both: Vec<Compiled>) -> Result<Self, PolicyError> {
        let mut rollouts = BTreeMap::new();
        let mut compiled = Vec::with_capacity(both.len());
        for (policy, rollout) in both {
            if let Some(rollout) = rollout {
                rollouts.insert(policy.name.clone(), rollout);
            }
            compiled.push(policy);
        }
        compiled.sort_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then_with(|| a.name.cmp(&b.name))
        });
        let mut names: Vec<&str> = compiled.iter().map(|p| p.name.as_str()).collect();
        names.sort_unstable();
        if let Some(pair) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(duplicate(pair[0]));
        }
        let pod_defaults = compiled.iter().position(|p| p.pod_defaults.is_some());
        let usage = compiled.iter().any(|p| p.usage.is_some());
        let pressure = compiled.iter().any(|p| p.pressure.is_some());
        Ok(Self {
            compiled: Arc::new(compiled),
            pod_defaults,
            usage,
            pressure,
            rollouts: Arc::new(rollouts),
        })
    }

    /// The `spec.rollout` of policy `name` (None: it has none, or comes from a file: no status
    /// records a rollout's progress there, so its changes are not paced).
    pub fn rollout(&self, name: &str) -> Option<&CompiledRollout> {
        self.rollouts.get(name)
    }

    /// Whether any policy has `spec.rollout`.
    pub fn has_rollout(&self) -> bool {
        !self.rollouts.is_empty()
    }

    pub fn len(&self) -> usize {
        self.compiled.len()
    }

    pub fn is_empty(&self) -> bool {
        self.compiled.is_empty()
    }

    /// Whether any policy has `spec.usage`: only then is a node's usage worth looking up.
    pub fn has_usage(&self) -> bool {
        self.usage
    }

    /// Whether any policy has `spec.pressure`: only then are nodes' pressure taints kept.
    pub fn has_pressure(&self) -> bool {
        self.pressure
    }

    /// Whether any policy has `spec.eviction`: only then does the leader's relief loop look at
    /// nodes.
    pub fn has_eviction(&self) -> bool {
        self.compiled.iter().any(|p| p.eviction.is_some())
    }

    /// The longest `spec.usage.window` of any policy (None: no usage policy): how long the
    /// usage history must keep samples.
    pub fn longest_usage_window(&self) -> Option<std::time::Duration> {
        self.compiled
            .iter()
            .filter_map(|p| p.usage.as_ref().map(|u| u.window))
            .max()
    }

    /// The policies, highest priority first (then by name): the order `for_node` tries them in.
    pub fn policies(&self) -> impl Iterator<Item = &CompiledPolicy> {
        self.compiled.iter()
    }

    /// Policy names, highest priority first.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.compiled.iter().map(|p| p.name.as_str())
    }

    /// The policy for a node with these labels, or why there is none.
    pub fn for_node(&self, labels: &impl LabelLookup) -> NodeChoice<'_> {
        if labels.label(DISABLED_LABEL) == Some("true") {
            return NodeChoice::OptedOut;
        }
        match self
            .compiled
            .iter()
            .find(|p| (!p.ratios.is_empty() || p.usage.is_some()) && p.selector.matches(labels))
        {
            Some(policy) => NodeChoice::Policy(policy),
            None => NodeChoice::NoPolicy,
        }
    }

    /// The policy whose pod defaults are in force, if any.
    pub fn pod_defaults(&self) -> Option<(&str, &CompiledPodDefaults)> {
        let policy = self.compiled.get(self.pod_defaults?)?;
        Some((policy.name.as_str(), policy.pod_defaults.as_ref()?))
    }
}

/// A policy validated, with its rollout.
type Compiled = (CompiledPolicy, Option<CompiledRollout>);

fn compile(policy: &OvercommitPolicy) -> Result<Compiled, PolicyError> {
    let compiled = validate::compile(policy)?;
    let rollout = rollout::compile(
        policy.spec.rollout.as_ref(),
        policy.metadata.generation,
        policy.status.as_ref().and_then(|s| s.rollout.as_ref()),
    )
    .map_err(|reason| PolicyError::Invalid {
        name: compiled.name.clone(),
        reason,
    })?;
    // A policy without a generation (from a file) has no status to keep progress in.
    let rollout = rollout.filter(|_| compiled.generation.is_some());
    Ok((compiled, rollout))
}

fn duplicate(name: &str) -> PolicyError {
    PolicyError::Invalid {
        name: name.to_string(),
        reason: "more than one policy has this name".to_string(),
    }
}

/// Which policy a node gets.
#[derive(Debug)]
pub enum NodeChoice<'p> {
    Policy(&'p CompiledPolicy),
    /// No policy's selector matches the node.
    NoPolicy,
    /// The node carries `overcommit.dev/disabled=true`.
    OptedOut,
}

/// Parse a YAML stream of OvercommitPolicy documents. Empty documents are skipped; any
/// document that is not a valid OvercommitPolicy refuses the whole file.
pub fn parse_policy_file(text: &str) -> Result<Vec<OvercommitPolicy>, PolicyError> {
    let mut policies = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let number = index + 1;
        let value = serde_yaml::Value::deserialize(document)
            .map_err(|e| PolicyError::Parse(format!("document {number}: {e}")))?;
        if value.is_null() {
            continue;
        }
        let field = |key: &str| {
            value
                .get(key)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string()
        };
        let (api_version, kind) = (field("apiVersion"), field("kind"));
        if api_version != "overcommit.dev/v1alpha1" || kind != "OvercommitPolicy" {
            return Err(PolicyError::Parse(format!(
                "document {number}: expected apiVersion overcommit.dev/v1alpha1 and kind \
                 OvercommitPolicy, found {api_version:?} {kind:?}"
            )));
        }
        if let Some(path) = unknown_field(&value) {
            return Err(PolicyError::Parse(format!(
                "document {number}: unknown field {path} (the API server would drop it)"
            )));
        }
        let policy: OvercommitPolicy = serde_yaml::from_value(value)
            .map_err(|e| PolicyError::Parse(format!("document {number}: {e}")))?;
        validate::compile(&policy)?;
        policies.push(policy);
    }
    // Refuse duplicates here too, so the file as a whole is either good or not.
    PolicySet::new(policies.clone())?;
    Ok(policies)
}

/// The CustomResourceDefinition of OvercommitPolicy as YAML, as checked in under
/// deploy/crd/overcommitpolicies.yaml (`kube-overcommit crd`, `make crd`).
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    use kube::CustomResourceExt;
    let yaml = serde_yaml::to_string(&OvercommitPolicy::crd())?;
    Ok(format!(
        "# Generated from the OvercommitPolicy Rust type by `kube-overcommit crd` (make crd). Do not edit.\n{yaml}"
    ))
}

/// The first field of a policy document that the type does not know (a typo like `nodeRatio`
/// would otherwise be silently ignored and the policy would do nothing).
fn unknown_field(document: &serde_yaml::Value) -> Option<String> {
    fn check(value: Option<&serde_yaml::Value>, path: &str, known: &[&str]) -> Option<String> {
        let map = value?.as_mapping()?;
        map.keys().find_map(|key| match key.as_str() {
            Some(k) if known.contains(&k) => None,
            Some(k) => Some(format!("{path}.{k}")),
            None => Some(format!("{path}.{key:?}")),
        })
    }
    let spec = document.get("spec");
    let selector = spec.and_then(|s| s.get("nodeSelector"));
    let expressions = selector
        .and_then(|s| s.get("matchExpressions"))
        .and_then(|e| e.as_sequence());
    check(
        Some(document),
        "",
        &["apiVersion", "kind", "metadata", "spec", "status"],
    )
    .or_else(|| {
        check(
            spec,
            "spec",
            &[
                "nodeSelector",
                "priority",
                "nodeRatios",
                "podDefaults",
                "usage",
                "requestCap",
                "capMode",
                "rollout",
                "pressure",
                "eviction",
            ],
        )
    })
    .or_else(|| {
        check(
            spec.and_then(|s| s.get("rollout")),
            "spec.rollout",
            &["maxNodesPerStep", "stepInterval", "paused"],
        )
    })
    .or_else(|| {
        let pressure = spec.and_then(|s| s.get("pressure"));
        check(pressure, "spec.pressure", &["holdTime", "cpu", "memory"]).or_else(|| {
            ["cpu", "memory"].iter().find_map(|r| {
                let path = format!("spec.pressure.{r}");
                check(pressure.and_then(|p| p.get(*r)), &path, &["high", "low"])
            })
        })
    })
    .or_else(|| {
        check(
            spec.and_then(|s| s.get("eviction")),
            "spec.eviction",
            &["memoryCritical", "maxPodsPerNode", "interval", "dryRun"],
        )
    })
    .or_else(|| {
        check(
            spec.and_then(|s| s.get("usage")),
            "spec.usage",
            &[
                "targetUtilization",
                "maxRatios",
                "window",
                "minChange",
                "allowHighMemoryRatio",
            ],
        )
    })
    .or_else(|| {
        check(
            selector,
            "spec.nodeSelector",
            &["matchLabels", "matchExpressions"],
        )
    })
    .or_else(|| {
        expressions
            .into_iter()
            .flatten()
            .enumerate()
            .find_map(|(i, e)| {
                check(
                    Some(e),
                    &format!("spec.nodeSelector.matchExpressions[{i}]"),
                    &["key", "operator", "values"],
                )
            })
    })
    .or_else(|| {
        check(
            spec.and_then(|s| s.get("podDefaults")),
            "spec.podDefaults",
            &["requests", "requestToLimitPercent"],
        )
    })
    .map(|path| path.trim_start_matches('.').to_string())
}

#[cfg(test)]
mod tests;
