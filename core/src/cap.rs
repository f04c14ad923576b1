//! The placement cap, in one place. Pure.
//!
//! A policy's `spec.requestCap` bounds what the requests of the pods on a node may add up to:
//! per capped resource (cpu, memory), `cap = floor(raw allocatable x percent / 100)`, in the
//! scheduler's units (millicores for cpu, bytes for memory). Inflated allocatable only steers
//! the default scheduler; the cap is checked where the node is known, when a pod is bound to it
//! (`pods/binding`) or created with `spec.nodeName`.
//!
//! For a pod placed on a node:
//! 1. **Not checked:** a node with no policy, an opted-out node, a policy without `requestCap`,
//!    and a mirror pod (annotation `kubernetes.io/config.mirror`: the kubelet reporting a static
//!    pod that already runs) are allowed.
//! 2. **Per capped resource** the pod requests (as the scheduler counts them,
//!    [`crate::requests::pod_requests`]; a request of zero or none is not checked, so a pod
//!    without requests always fits): `requested on the node + the pod's request <= cap`. A
//!    resource the node does not report raw allocatable for is not checked (nothing to cap).
//! 3. **Over:** `capMode: Enforce` denies, `Warn` allows with a warning. A pod owned by a
//!    DaemonSet, or with a priority at or above system-cluster-critical's, is never refused
//!    (node agents: CNI, CSI, logs, security): it is allowed with a warning, and counted.
//!
//! Two texts per resource over its cap ([`Over`]). The requester sees only the node, the
//! resource, its own pod and what that pod asks ("node worker-7: cpu requests would exceed the
//! node's placement cap; pod web-5 asks 0.5"): a node's sum, cap and raw value are other tenants'
//! figures and would show the headroom to aim at. The log gets those too ("node worker-7: cpu
//! requests would reach 70.6 of a cap of 70.4 (110% of 64); pod web-5 asks 0.5"). Amounts read as
//! a person reads them: cpu in cores with up to 3 decimals, memory in Gi or Mi with up to 3
//! decimals (bytes below 1Mi); what requests would reach is rounded up and the cap rounded down,
//! so an amount shown over the cap is over it.
//!
//! Arithmetic saturates: a sum too large for u128 is over any cap.

use std::collections::BTreeMap;

use crate::policy::{CapMode, CompiledCap, NodeChoice};

/// Annotation the kubelet puts on the mirror pod of a static pod.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The value of the built-in `system-cluster-critical` PriorityClass. User-defined classes stop
/// at 1,000,000,000, so only the system classes reach it.
pub const CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// Why the cap never refuses a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Exempt {
    /// A mirror pod: the kubelet reporting a static pod that already runs (not even checked).
    Mirror,
    /// Owned by a DaemonSet (its controller): one per node, the node's agents.
    DaemonSet,
    /// Priority at or above [`CRITICAL_PRIORITY`].
    Critical,
}

impl Exempt {
    /// From what a pod carries: the mirror annotation, whether its controller is a DaemonSet,
    /// and `spec.priority`.
    pub fn of(mirror: bool, daemonset_owned: bool, priority: Option<i32>) -> Option<Exempt> {
        if mirror {
            Some(Exempt::Mirror)
        } else if daemonset_owned {
            Some(Exempt::DaemonSet)
        } else if priority.is_some_and(|p| p >= CRITICAL_PRIORITY) {
            Some(Exempt::Critical)
        } else {
            None
        }
    }

    /// A label value and the words of the warning.
    pub fn as_str(self) -> &'static str {
        match self {
            Exempt::Mirror => "mirror",
            Exempt::DaemonSet => "daemonset",
            Exempt::Critical => "critical",
        }
    }
}

/// What the rule reads, as plain data. Amounts are in the scheduler's units: millicores for cpu,
/// whole units (bytes) for everything else.
#[derive(Debug, Clone, Copy)]
pub struct Placement<'a> {
    /// The node the pod goes to.
    pub node: &'a str,
    /// The pod's name as a person knows it (in messages).
    pub pod: &'a str,
    /// The node's policy cap ([`node_cap`]): None for no policy, opted out, or no requestCap.
    pub cap: Option<&'a CompiledCap>,
    /// The kubelet's raw allocatable of the node, per resource.
    pub raw: &'a BTreeMap<String, u128>,
    /// The requests of the pods already on the node, summed per resource.
    pub requested: &'a BTreeMap<String, u128>,
    /// The pod's requests as the scheduler counts them.
    pub pod_requests: &'a BTreeMap<String, u128>,
    /// Why the cap never refuses this pod, if it does not.
    pub exempt: Option<Exempt>,
}

/// The answer for a placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CapDecision {
    Allow,
    /// Over the cap with `capMode: Enforce`.
    Deny(Over),
    /// Over the cap with `capMode: Warn`: allowed, with a warning.
    Warn(Over),
    /// Over the cap, but the pod is never refused (a DaemonSet's or a critical pod): allowed,
    /// with a warning.
    Exempted(Exempt, Over),
}

/// What is said of a placement over the cap: one sentence per resource over it, joined by "; ".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Over {
    /// For the requester: node, resource, the pod and what it asks; no node figures.
    pub public: String,
    /// For the log and the operator: the node's sum, cap, percent and raw value too.
    pub detail: String,
    /// The resources over the cap, sorted.
    pub resources: Vec<String>,
}

/// The cap in force for the node a policy choice was made for.
pub fn node_cap<'p>(choice: &NodeChoice<'p>) -> Option<&'p CompiledCap> {
    match choice {
        NodeChoice::Policy(policy) => policy.cap.as_ref(),
        NodeChoice::NoPolicy | NodeChoice::OptedOut => None,
    }
}

/// Decide a placement (see the module documentation).
pub fn check(placement: &Placement<'_>) -> CapDecision {
    let Some(cap) = placement.cap else {
        return CapDecision::Allow;
    };
    if placement.exempt == Some(Exempt::Mirror) {
        return CapDecision::Allow;
    }
    let mut public = Vec::new();
    let mut detail = Vec::new();
    let mut resources = Vec::new();
    for (resource, &percent) in &cap.percent {
        if let Some((p, d)) = over_cap(placement, resource, percent) {
            public.push(p);
            detail.push(d);
            resources.push(resource.clone());
        }
    }
    if public.is_empty() {
        return CapDecision::Allow;
    }
    let mut over = Over {
        public: public.join("; "),
        detail: detail.join("; "),
        resources,
    };
    if let Some(exempt) = placement.exempt {
        let why = match exempt {
            Exempt::DaemonSet => "a DaemonSet's pod",
            Exempt::Critical | Exempt::Mirror => "a critical pod",
        };
        over.public = format!(
            "{}; allowed: {why} is never refused by the cap",
            over.public
        );
        return CapDecision::Exempted(exempt, over);
    }
    match cap.mode {
        CapMode::Enforce => CapDecision::Deny(over),
        CapMode::Warn => CapDecision::Warn(over),
    }
}

/// The sentences (public, detail) for one resource when the pod would take it over its cap.
fn over_cap(placement: &Placement<'_>, resource: &str, percent: u32) -> Option<(String, String)> {
    let asks = placement
        .pod_requests
        .get(resource)
        .copied()
        .filter(|&a| a > 0)?;
    let raw = *placement.raw.get(resource)?;
    let limit = raw.saturating_mul(u128::from(percent)) / 100;
    let now = placement.requested.get(resource).copied().unwrap_or(0);
    let reach = now.saturating_add(asks);
    if reach <= limit {
        return None;
    }
    let asks = amount(resource, asks, Round::Up);
    let public = format!(
        "node {}: {resource} requests would exceed the node's placement cap; pod {} asks {asks}",
        placement.node, placement.pod,
    );
    let detail = format!(
        "node {}: {resource} requests would reach {} of a cap of {} ({percent}% of {}); pod {} asks {asks}",
        placement.node,
        amount(resource, reach, Round::Up),
        amount(resource, limit, Round::Down),
        amount(resource, raw, Round::Down),
        placement.pod,
    );
    Some((public, detail))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    Up,
    Down,
}

/// An amount as a person reads it: cpu (millicores) in cores, memory (bytes) in Gi or Mi, both
/// with up to 3 decimals; anything else as the number of units.
fn amount(resource: &str, units: u128, round: Round) -> String {
    const MI: u128 = 1 << 20;
    const GI: u128 = 1 << 30;
    match resource {
        "cpu" => decimal(units, 1000, round, ""),
        "memory" if units >= GI => decimal(units, GI, round, "Gi"),
        "memory" if units >= MI => decimal(units, MI, round, "Mi"),
        _ => units.to_string(),
    }
}

/// `units / per` with up to 3 decimals, trailing zeros dropped, rounded as asked. `per` is
/// 1000 or a power of two up to 2^30, so the remainder times 1000 cannot overflow.
fn decimal(units: u128, per: u128, round: Round, suffix: &str) -> String {
    let (mut whole, rem) = (units / per, units % per);
    let scaled = rem * 1000;
    let mut frac = match round {
        Round::Up => scaled.div_ceil(per),
        Round::Down => scaled / per,
    };
    if frac == 1000 {
        whole += 1;
        frac = 0;
    }
    if frac == 0 {
        return format!("{whole}{suffix}");
    }
    let mut width = 3;
    while frac % 10 == 0 {
        frac /= 10;
        width -= 1;
    }
    format!("{whole}.{frac:0width$}{suffix}")
}

#[cfg(test)]
mod tests;
