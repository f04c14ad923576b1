//! A Pod object's requests as the scheduler counts them: the API types read into
//! `overcommit_core::requests`, which holds the rule. Used wherever a node's requested sum is
//! needed (`kube-overcommit status`, the placement cap's pod index; the usage-aware allocatable).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use overcommit_core::quantity::{Quantity, QuantityError};
use overcommit_core::requests::{ContainerResources, PodResources, Resize, pod_requests};

/// Why a pod's requests could not be counted.
#[derive(Debug, thiserror::Error)]
#[error("pod {pod}: {source}")]
pub struct RequestsError {
    pub pod: String,
    #[source]
    pub source: QuantityError,
}

/// Whether the pod still holds its node's resources: not Succeeded or Failed (the scheduler
/// drops terminated pods from a node's requested sum).
pub fn is_active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed"))
}

/// The pod's requests in the scheduler's units (cpu in millicores, everything else in whole
/// units), by resource.
pub fn requests(pod: &Pod) -> Result<BTreeMap<String, u128>, RequestsError> {
    let name = || {
        let meta = &pod.metadata;
        format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        )
    };
    scheduler_requests(pod).map_err(|source| RequestsError {
        pod: name(),
        source,
    })
}

/// A resource list, parsed, borrowing names from the pod.
type Parsed<'p> = Vec<(&'p str, Quantity)>;

/// One container's lists.
struct Lists<'p> {
    requests: Parsed<'p>,
    /// `allocatedResources` and `resources.requests` of its status, when it reports them.
    resize: Option<(Parsed<'p>, Parsed<'p>)>,
    restartable: bool,
}

impl<'p> Lists<'p> {
    /// `init`: an init container, which `restartPolicy: Always` makes a sidecar.
    fn read(
        c: &'p Container,
        statuses: Option<&'p Vec<ContainerStatus>>,
        init: bool,
    ) -> Result<Self, QuantityError> {
        let status = statuses.and_then(|l| l.iter().find(|s| s.name == c.name));
        let allocated = status.and_then(|s| s.allocated_resources.as_ref());
        let actuated = status
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref());
        let resize = match (allocated, actuated) {
            (None, None) => None,
            (a, r) => Some((list(a)?, list(r)?)),
        };
        Ok(Self {
            requests: list(c.resources.as_ref().and_then(|r| r.requests.as_ref()))?,
            resize,
            restartable: init && c.restart_policy.as_deref() == Some("Always"),
        })
    }

    fn view(&self) -> ContainerResources<'_> {
        ContainerResources {
            requests: &self.requests,
            restartable: self.restartable,
            resize: self.resize.as_ref().map(|(allocated, actuated)| Resize {
                allocated,
                actuated,
            }),
        }
    }
}

/// `requests` without the pod's name in the error.
pub fn scheduler_requests(pod: &Pod) -> Result<BTreeMap<String, u128>, QuantityError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(BTreeMap::new());
    };
    let status = pod.status.as_ref();
    let containers = spec
        .containers
        .iter()
        .map(|c| Lists::read(c, status.and_then(|s| s.container_statuses.as_ref()), false))
        .collect::<Result<Vec<_>, _>>()?;
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| {
            Lists::read(
                c,
                status.and_then(|s| s.init_container_statuses.as_ref()),
                true,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let pod_level = list(spec.resources.as_ref().and_then(|r| r.requests.as_ref()))?;
    let overhead = list(spec.overhead.as_ref())?;
    let resize_infeasible = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.type_ == "PodResizePending"
                    && c.status == "True"
                    && c.reason.as_deref() == Some("Infeasible")
            })
        });
    pod_requests(&PodResources {
        containers: containers.iter().map(Lists::view).collect(),
        init_containers: init.iter().map(Lists::view).collect(),
        pod_level: &pod_level,
        overhead: &overhead,
        resize_infeasible,
    })
}

fn list(
    map: Option<&BTreeMap<String, ApiQuantity>>,
) -> Result<Vec<(&str, Quantity)>, QuantityError> {
    map.into_iter()
        .flatten()
        .map(|(name, q)| Ok((name.as_str(), Quantity::parse(&q.0)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("test pod")
    }

    #[test]
    fn requests_are_read_from_the_pod_as_the_scheduler_counts_them() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "web", "namespace": "a"},
            "spec": {
                "containers": [
                    {"name": "app", "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}}},
                    {"name": "log", "resources": {"requests": {"cpu": "100m"}}}
                ],
                "initContainers": [
                    {"name": "setup", "resources": {"requests": {"cpu": "2", "memory": "64Mi"}}},
                    {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "50m"}}}
                ],
                "overhead": {"cpu": "10m"}
            }
        }));
        let got = requests(&p).expect("requests");
        // cpu: max(600m + 50m sidecar, 2 init) + 10m overhead; memory: max(256Mi, 64Mi).
        assert_eq!(got.get("cpu"), Some(&2010));
        assert_eq!(got.get("memory"), Some(&(256 << 20)));
    }

    #[test]
    fn a_resize_counts_for_the_largest_of_spec_allocated_and_running() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "r", "namespace": "a"},
            "spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": "1"}}}]},
            "status": {"containerStatuses": [{
                "name": "app", "image": "x", "imageID": "", "ready": true, "restartCount": 0,
                "allocatedResources": {"cpu": "3"},
                "resources": {"requests": {"cpu": "2"}}
            }]}
        }));
        assert_eq!(requests(&p).expect("requests").get("cpu"), Some(&3000));
    }

    #[test]
    fn bad_quantities_name_the_pod_and_terminated_pods_are_inactive() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "bad", "namespace": "a"},
            "spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": "lots"}}}]},
            "status": {"phase": "Succeeded"}
        }));
        let err = requests(&p).expect_err("unparsable cpu");
        assert!(err.to_string().starts_with("pod a/bad: "), "{err}");
        assert!(!is_active(&p));
        assert!(is_active(&pod(
            serde_json::json!({"status": {"phase": "Pending"}})
        )));
    }
}
