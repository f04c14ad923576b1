//! What the cap needs of a Pod object: its requests as the scheduler counts them
//! (`crate::pods`), whether the cap exempts it, and whether it is bound already. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use overcommit_core::cap::{Exempt, MIRROR_ANNOTATION};
use overcommit_core::pod_index::Requested;
use overcommit_core::quantity::QuantityError;

/// What the cap needs of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodFacts {
    /// Requests as the scheduler counts them (millicores for cpu, units for the rest).
    pub requests: BTreeMap<String, u128>,
    /// Why the cap never refuses it, if it does not.
    pub exempt: Option<Exempt>,
    /// Has a node already (`spec.nodeName`): a binding of it fails (409) after admission.
    pub bound: bool,
}

impl PodFacts {
    /// From the pod index's entry: cpu and memory (the cap's resources), those it asks.
    pub fn lean(requested: Requested, exempt: Option<Exempt>, bound: bool) -> Self {
        let requests = [
            ("cpu", requested.cpu_millis),
            ("memory", requested.memory_bytes),
        ]
        .into_iter()
        .filter(|(_, v)| *v > 0)
        .map(|(r, v)| (r.to_string(), u128::from(v)))
        .collect();
        Self {
            requests,
            exempt,
            bound,
        }
    }
}

/// Read a pod; a quantity that does not parse is an error (the review then fails open).
pub fn facts(pod: &Pod) -> Result<PodFacts, QuantityError> {
    Ok(PodFacts {
        requests: crate::pods::scheduler_requests(pod)?,
        exempt: exempt(pod),
        bound: pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty()),
    })
}

/// Why the cap never refuses `pod` ([`Exempt::of`]): the mirror annotation, a DaemonSet as its
/// controller (`ownerReferences` with `controller: true`), or `spec.priority`.
pub fn exempt(pod: &Pod) -> Option<Exempt> {
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION));
    let daemonset_owned = pod
        .metadata
        .owner_references
        .as_ref()
        .is_some_and(|owners| {
            owners.iter().any(|o| {
                o.controller == Some(true)
                    && o.kind == "DaemonSet"
                    && o.api_version.split('/').next() == Some("apps")
            })
        });
    let priority = pod.spec.as_ref().and_then(|s| s.priority);
    Exempt::of(mirror, daemonset_owned, priority)
}
