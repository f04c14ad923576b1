//! OvercommitPolicy (the CRD type), validation, and choosing the policy for a node. Pure.

/// All policies currently loaded, validated, ready to choose from.
#[derive(Debug, Clone, Default)]
pub struct PolicySet {}
