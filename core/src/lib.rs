//! kube-overcommit's rules, pure: no I/O, no async runtime, no Kubernetes client, no TLS (the
//! crate's Cargo.toml has none of them, so the compiler holds the boundary). The webhook's
//! transport, caches and leader call into these; nothing here calls out.
//!
//! - [`duration`]: the one duration grammar (flags, policies, the API server's `?timeout=`).
//! - [`eviction`]: memory relief: whether a node needs it, which pods go first, the rate limit.
//! - [`cap`]: the placement cap: requests on a node against a share of its raw allocatable.
//! - [`node`]: the node rule: raw detection, ratios, the annotations it keeps its memory in.
//! - [`pod`]: the pod rule: default requests, request-to-limit.
//! - [`pod_index`]: per-node sums of pod requests, for the usage rule.
//! - [`policy`]: OvercommitPolicy (the CRD type), validation, choosing the policy for a node.
//! - [`pressure`]: the pressure taint: which nodes are tainted for high usage, and when not.
//! - [`quantity`]: Kubernetes quantities and ratios, exact.
//! - [`patch`]: JSON Patch operations.

pub mod cap;
pub mod duration;
pub mod eviction;
pub mod in_process;
pub mod node;
pub mod node_transitions;
pub mod patch;
pub mod pod;
pub mod pod_index;
pub mod policy;
pub mod policy_report;
pub mod pressure;
pub mod quantity;
pub mod requests;
pub mod rollout;

/// How much of a rule's decision to keep: the patch is always computed; the per-resource
/// account (for `review --explain` and tests) only when asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Account {
    PatchOnly,
    Full,
}
