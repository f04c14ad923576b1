//! A pod's requests as the scheduler counts them: what a pod takes of a node's allocatable in
//! the scheduler's NodeResourcesFit (k8s.io/component-helpers/resource `PodRequests`, summed per
//! node by the scheduler's NodeInfo). Pure. The usage-aware allocatable and the placement cap
//! both need a node's requested sum exactly as the scheduler sees it, or the room they compute
//! is not the room the scheduler finds.
//!
//! Per resource:
//! - the sum of the containers' requests, plus those of restartable init containers (sidecars,
//!   `restartPolicy: Always`), which run beside them;
//! - at least, for each other init container, its requests plus those of the sidecars started
//!   before it (init containers run one at a time, sidecars keep running);
//! - replaced by the pod-level request (`spec.resources.requests`) for cpu, memory and
//!   hugepages where one is set;
//! - plus the pod's overhead (`spec.overhead`, from its RuntimeClass).
//!
//! A container being resized in place counts for the largest of what its spec asks, what was
//! allocated and what runs (`status.containerStatuses[].allocatedResources` and `.resources`);
//! when the resize is infeasible, for the larger of the last two. Sums are exact (at the nano
//! precision the API server keeps); the result is rounded up as the scheduler rounds: cpu to
//! millicores (`MilliValue`), everything else to whole units (`Value`).

use std::collections::BTreeMap;

use crate::quantity::{Quantity, QuantityError};

/// Resource names and quantities, as a container's `resources.requests` holds them.
pub type ResourceList<'a> = [(&'a str, Quantity)];

/// What counts of one container.
#[derive(Debug, Clone, Copy, Default)]
pub struct ContainerResources<'a> {
    /// `resources.requests` of its spec.
    pub requests: &'a ResourceList<'a>,
    /// An init container with `restartPolicy: Always` (a sidecar).
    pub restartable: bool,
    /// While resized in place: `allocatedResources` and `resources.requests` of its status.
    pub resize: Option<Resize<'a>>,
}

/// The status side of an in-place resize.
#[derive(Debug, Clone, Copy, Default)]
pub struct Resize<'a> {
    pub allocated: &'a ResourceList<'a>,
    pub actuated: &'a ResourceList<'a>,
}

/// What counts of a pod.
#[derive(Debug, Clone, Default)]
pub struct PodResources<'a> {
    pub containers: Vec<ContainerResources<'a>>,
    /// In their order: a sidecar counts for the init containers after it.
    pub init_containers: Vec<ContainerResources<'a>>,
    /// `spec.resources.requests` (pod-level resources).
    pub pod_level: &'a ResourceList<'a>,
    /// `spec.overhead`.
    pub overhead: &'a ResourceList<'a>,
    /// The pod's resize is infeasible (`PodResizePending` with reason `Infeasible`): resized
    /// containers count for what was allocated and what runs, not for their spec.
    pub resize_infeasible: bool,
}

/// Nano-units per resource: exact sums.
type Nanos = BTreeMap<String, u128>;

const NANO: u32 = 9;

/// The pod's requests in the scheduler's units: millicores for `cpu`, whole units (bytes,
/// devices, ...) for every other resource. Resources requested as zero are kept (the scheduler
/// keeps them too); an unparsable or overflowing sum is an error.
pub fn pod_requests(pod: &PodResources<'_>) -> Result<BTreeMap<String, u128>, QuantityError> {
    let mut requests = Nanos::new();
    let mut sidecars = Nanos::new();
    let mut init = Nanos::new();
    for container in &pod.containers {
        add(&mut requests, &effective(container, pod.resize_infeasible)?)?;
    }
    for container in &pod.init_containers {
        let own = effective(container, pod.resize_infeasible)?;
        if container.restartable {
            add(&mut requests, &own)?;
            add(&mut sidecars, &own)?;
            keep_max(&mut init, &sidecars);
        } else {
            let mut running = own;
            add(&mut running, &sidecars)?;
            keep_max(&mut init, &running);
        }
    }
    keep_max(&mut requests, &init);
    if pod.pod_level.iter().any(|(name, _)| is_pod_level(name)) {
        for (name, quantity) in pod.pod_level.iter().filter(|(name, _)| is_pod_level(name)) {
            requests.insert((*name).to_string(), quantity.to_units_ceil(NANO)?);
        }
    }
    add(&mut requests, &nanos(pod.overhead)?)?;
    requests
        .into_iter()
        .map(|(name, nanos)| {
            let scale = if name == "cpu" { 3 } else { 0 };
            Ok((name, nanos.div_ceil(10u128.pow(NANO - scale))))
        })
        .collect()
}

/// Resources a pod-level request may set (`IsSupportedPodLevelResource`).
fn is_pod_level(name: &str) -> bool {
    matches!(name, "cpu" | "memory") || name.starts_with("hugepages-")
}

/// A container's requests, with an in-place resize counted as the scheduler counts it.
fn effective(container: &ContainerResources<'_>, infeasible: bool) -> Result<Nanos, QuantityError> {
    let Some(resize) = container.resize else {
        return nanos(container.requests);
    };
    let mut counted = nanos(resize.allocated)?;
    keep_max(&mut counted, &nanos(resize.actuated)?);
    if !infeasible {
        keep_max(&mut counted, &nanos(container.requests)?);
    }
    Ok(counted)
}

fn nanos(list: &ResourceList<'_>) -> Result<Nanos, QuantityError> {
    let mut out = Nanos::new();
    for (name, quantity) in list {
        // A name given twice cannot come from a ResourceList (a map); the last one wins.
        out.insert((*name).to_string(), quantity.to_units_ceil(NANO)?);
    }
    Ok(out)
}

fn add(into: &mut Nanos, other: &Nanos) -> Result<(), QuantityError> {
    for (name, value) in other {
        let sum = into.entry(name.clone()).or_insert(0);
        *sum = sum
            .checked_add(*value)
            .ok_or_else(|| QuantityError::Overflow(format!("{name} requests")))?;
    }
    Ok(())
}

fn keep_max(into: &mut Nanos, other: &Nanos) {
    for (name, value) in other {
        let kept = into.entry(name.clone()).or_insert(0);
        *kept = (*kept).max(*value);
    }
}

#[cfg(test)]
mod tests;
