//! A Pod object (k8s-openapi) -> its requests as the scheduler counts them
//! (`overcommit_core::requests`), and whether it is a mirror pod. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use overcommit_core::cap::MIRROR_ANNOTATION;
use overcommit_core::quantity::{Quantity, QuantityError};
use overcommit_core::requests::{ContainerResources, PodResources, Resize, pod_requests};

/// What the cap needs of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodFacts {
    /// Requests as the scheduler counts them (millicores for cpu, units for the rest).
    pub requests: BTreeMap<String, u128>,
    /// Carries `kubernetes.io/config.mirror`.
    pub mirror: bool,
}

type Owned = Vec<(String, Quantity)>;

/// Read a pod; a quantity that does not parse is an error (the review then fails open).
pub fn facts(pod: &Pod) -> Result<PodFacts, QuantityError> {
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION));
    let Some(spec) = &pod.spec else {
        return Ok(PodFacts {
            requests: BTreeMap::new(),
            mirror,
        });
    };
    let status = pod.status.as_ref();
    let statuses = |init: bool| {
        status
            .and_then(|s| {
                if init {
                    s.init_container_statuses.as_ref()
                } else {
                    s.container_statuses.as_ref()
                }
            })
            .map(Vec::as_slice)
            .unwrap_or_default()
    };
    let resize_infeasible = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "PodResizePending" && c.reason.as_deref() == Some("Infeasible"));
    let read = |containers: &[Container], init: bool| -> Result<Vec<Counted>, QuantityError> {
        containers
            .iter()
            .map(|c| {
                let own = list(c.resources.as_ref().and_then(|r| r.requests.as_ref()))?;
                let status = statuses(init).iter().find(|s| s.name == c.name);
                let allocated = status.and_then(|s| s.allocated_resources.as_ref());
                let actuated = status
                    .and_then(|s| s.resources.as_ref())
                    .and_then(|r| r.requests.as_ref());
                let resize = match (allocated, actuated) {
                    (None, None) => None,
                    (a, b) => Some((list(a)?, list(b)?)),
                };
                Ok(Counted {
                    own,
                    resize,
                    restartable: init && c.restart_policy.as_deref() == Some("Always"),
                })
            })
            .collect()
    };
    let containers = read(&spec.containers, false)?;
    let init = read(spec.init_containers.as_deref().unwrap_or_default(), true)?;
    let pod_level = list(spec.resources.as_ref().and_then(|r| r.requests.as_ref()))?;
    let overhead = list(spec.overhead.as_ref())?;
    let (containers, init) = (borrowed(&containers), borrowed(&init));
    let (pod_level, overhead) = (borrow(&pod_level), borrow(&overhead));
    let requests = pod_requests(&PodResources {
        containers: resources(&containers),
        init_containers: resources(&init),
        pod_level: &pod_level,
        overhead: &overhead,
        resize_infeasible,
    })?;
    Ok(PodFacts { requests, mirror })
}

struct Counted {
    own: Owned,
    resize: Option<(Owned, Owned)>,
    restartable: bool,
}

type Borrowed<'a> = Vec<(&'a str, Quantity)>;
/// A container's requests, its resize (allocated, actuated), and whether it is a sidecar.
type BorrowedContainer<'a> = (Borrowed<'a>, Option<(Borrowed<'a>, Borrowed<'a>)>, bool);

fn borrowed(counted: &[Counted]) -> Vec<BorrowedContainer<'_>> {
    counted
        .iter()
        .map(|c| {
            (
                borrow(&c.own),
                c.resize.as_ref().map(|(a, b)| (borrow(a), borrow(b))),
                c.restartable,
            )
        })
        .collect()
}

fn resources<'a>(containers: &'a [BorrowedContainer<'a>]) -> Vec<ContainerResources<'a>> {
    containers
        .iter()
        .map(|(own, resize, restartable)| ContainerResources {
            requests: own,
            restartable: *restartable,
            resize: resize.as_ref().map(|(allocated, actuated)| Resize {
                allocated,
                actuated,
            }),
        })
        .collect()
}

fn borrow(list: &Owned) -> Borrowed<'_> {
    list.iter().map(|(n, q)| (n.as_str(), *q)).collect()
}

fn list(map: Option<&BTreeMap<String, K8sQuantity>>) -> Result<Owned, QuantityError> {
    map.into_iter()
        .flatten()
        .map(|(name, q)| Ok((name.clone(), Quantity::parse(&q.0)?)))
        .collect()
}
