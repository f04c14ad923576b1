//! What the cap needs of a Pod object: its requests as the scheduler counts them
//! (`crate::pods`) and whether it is a mirror pod. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use overcommit_core::cap::MIRROR_ANNOTATION;
use overcommit_core::pod_index::Requested;
use overcommit_core::quantity::QuantityError;

/// What the cap needs of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodFacts {
    /// Requests as the scheduler counts them (millicores for cpu, units for the rest).
    pub requests: BTreeMap<String, u128>,
    /// Carries `kubernetes.io/config.mirror`.
    pub mirror: bool,
}

impl PodFacts {
    /// From the pod index's entry: cpu and memory (the cap's resources), those it asks.
    pub fn lean(requested: Requested, mirror: bool) -> Self {
        let requests = [
            ("cpu", requested.cpu_millis),
            ("memory", requested.memory_bytes),
        ]
        .into_iter()
        .filter(|(_, v)| *v > 0)
        .map(|(r, v)| (r.to_string(), u128::from(v)))
        .collect();
        Self { requests, mirror }
    }
}

/// Read a pod; a quantity that does not parse is an error (the review then fails open).
pub fn facts(pod: &Pod) -> Result<PodFacts, QuantityError> {
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION));
    Ok(PodFacts {
        requests: crate::pods::scheduler_requests(pod)?,
        mirror,
    })
}
