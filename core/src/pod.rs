//! The pod rule, on pod CREATE: default requests and request-to-limit. Pure.
//!
//! Which pods: the webhook configuration's namespaceSelector sends pods from namespaces
//! labelled `overcommit.dev/pod-defaults=enabled`; pods in kube-system and in the webhook's own
//! namespace are never touched, whatever the selector says. The defaults are those of the
//! highest-priority policy that has `podDefaults` (see `policy`).
//!
//! For each container and init container, for cpu and memory:
//! - `requestToLimitPercent[r]` set and the container has a limit for r: request =
//!   floor(limit x percent / 100) (cpu in millicores, memory in bytes), never above the limit.
//! - otherwise, `requests[r]` set and the container has neither a request nor a limit for r:
//!   request = the default. With a limit but no request, Kubernetes' own defaulting (request =
//!   limit) stands; a default is never put above a limit.
//!
//! Left alone: Guaranteed pods (every container has cpu and memory limits and requests equal
//! to them), pods with pod-level `spec.resources` (their container requests must fit the pod's,
//! which a default could break), and every field other than requests.

use std::borrow::Cow;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::{Map, Value};

use overcommit_json::StrMap;
use overcommit_json::borrowed;

use crate::Account;
use crate::patch::{PatchOp, pointer};
use crate::policy::{CompiledPodDefaults, POD_DEFAULT_RESOURCES, PolicySet};
use crate::quantity::{Format, Quantity, QuantityError};

/// Namespaces whose pods are never touched, besides the webhook's own.
pub const EXCLUDED_NAMESPACES: [&str; 1] = ["kube-system"];

/// The parts of a pod spec the rule reads; everything else in the review is skipped unread.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpecIn<'a> {
    #[serde(borrow, default)]
    pub containers: Option<Vec<ContainerIn<'a>>>,
    #[serde(borrow, default)]
    pub init_containers: Option<Vec<ContainerIn<'a>>>,
    /// Pod-level resources: only whether they are there.
    #[serde(default)]
    pub resources: Option<IgnoredAny>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ContainerIn<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    pub name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub resources: Option<ResourcesIn<'a>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ResourcesIn<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed::option_str_map")]
    pub requests: Option<StrMap<'a>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str_map")]
    pub limits: Option<StrMap<'a>>,
}

/// Why the rule could not decide; the review then fails open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("container {container} {field} {resource}: {source}")]
pub struct PodError {
    pub container: String,
    pub field: &'static str,
    pub resource: String,
    pub source: QuantityError,
}

/// Which way the pod went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodOutcome {
    /// The defaults of this policy were considered (the patch may still be empty).
    Defaults(String),
    NoDefaults,
    ExcludedNamespace,
    Guaranteed,
    PodLevelResources,
}

/// Why a request was set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestReason {
    Default,
    RequestToLimit(u32),
}

/// One request the rule sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestChange {
    pub container: String,
    pub resource: &'static str,
    pub before: Option<String>,
    pub after: String,
    pub reason: RequestReason,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PodDecision {
    pub outcome: PodOutcome,
    pub changes: Vec<RequestChange>,
    pub patch: Vec<PatchOp>,
}

impl PodDecision {
    fn untouched(outcome: PodOutcome) -> Self {
        PodDecision {
            outcome,
            changes: Vec::new(),
            patch: Vec::new(),
        }
    }

    /// A short human account for `review --explain`.
    pub fn explain(&self) -> String {
        let mut out = match &self.outcome {
            PodOutcome::Defaults(name) => format!("pod defaults of policy {name} apply\n"),
            PodOutcome::NoDefaults => "no policy has podDefaults: pod left alone\n".to_string(),
            PodOutcome::ExcludedNamespace => {
                "namespace is never touched: pod left alone\n".to_string()
            }
            PodOutcome::Guaranteed => "pod is Guaranteed: left alone\n".to_string(),
            PodOutcome::PodLevelResources => {
                "pod sets pod-level resources: left alone\n".to_string()
            }
        };
        for change in &self.changes {
            let how = match change.reason {
                RequestReason::Default => "default".to_string(),
                RequestReason::RequestToLimit(pct) => format!("{pct}% of the limit"),
            };
            out.push_str(&format!(
                "  container {}: {} request {} -> {} ({how})\n",
                change.container,
                change.resource,
                change.before.as_deref().unwrap_or("none"),
                change.after
            ));
        }
        if matches!(self.outcome, PodOutcome::Defaults(_)) && self.changes.is_empty() {
            out.push_str("  every container already has its requests\n");
        }
        out
    }
}

/// Decide the requests of a pod being created in `namespace`.
pub fn decide(
    namespace: &str,
    own_namespace: &str,
    spec: Option<&PodSpecIn<'_>>,
    policies: &PolicySet,
) -> Result<PodDecision, PodError> {
    decide_with(namespace, own_namespace, spec, policies, Account::Full)
}

/// `decide`, keeping the account of each change (`PodDecision::changes`, for `review
/// --explain` and tests) only if `account` is `Full` (the answer needs only the patch).
pub fn decide_with(
    namespace: &str,
    own_namespace: &str,
    spec: Option<&PodSpecIn<'_>>,
    policies: &PolicySet,
    account: Account,
) -> Result<PodDecision, PodError> {
    if EXCLUDED_NAMESPACES.contains(&namespace)
        || (!own_namespace.is_empty() && namespace == own_namespace)
    {
        return Ok(PodDecision::untouched(PodOutcome::ExcludedNamespace));
    }
    let Some((policy, defaults)) = policies.pod_defaults() else {
        return Ok(PodDecision::untouched(PodOutcome::NoDefaults));
    };
    let Some(spec) = spec else {
        return Ok(PodDecision::untouched(PodOutcome::Defaults(
            policy.to_string(),
        )));
    };
    if spec.resources.is_some() {
        return Ok(PodDecision::untouched(PodOutcome::PodLevelResources));
    }
    let lists: [(&str, &[ContainerIn<'_>]); 2] = [
        (
            "initContainers",
            spec.init_containers.as_deref().unwrap_or_default(),
        ),
        ("containers", spec.containers.as_deref().unwrap_or_default()),
    ];
    let mut all = Vec::with_capacity(lists.iter().map(|(_, c)| c.len()).sum());
    for (list, containers) in lists {
        for (index, container) in containers.iter().enumerate() {
            all.push((list, index, read_container(container)?));
        }
    }
    if !all.is_empty() && all.iter().all(|(_, _, c)| c.is_guaranteed()) {
        return Ok(PodDecision::untouched(PodOutcome::Guaranteed));
    }

    let mut decision = PodDecision::untouched(PodOutcome::Defaults(policy.to_string()));
    for (list, index, container) in &all {
        let mut new_requests: Vec<(&'static str, String)> = Vec::new();
        for (resource, state) in POD_DEFAULT_RESOURCES.iter().zip(&container.resources) {
            let Some((after, reason)) = new_request(resource, state, defaults) else {
                continue;
            };
            if account == Account::Full {
                decision.changes.push(RequestChange {
                    container: container.name.to_string(),
                    resource,
                    before: state.request.map(|(text, _)| text.to_string()),
                    after: after.clone(),
                    reason,
                });
            }
            new_requests.push((resource, after));
        }
        if !new_requests.is_empty() {
            container_patch(list, *index, container, new_requests, &mut decision.patch);
        }
    }
    Ok(decision)
}

/// cpu or memory of one container: the request and limit (as written, and parsed).
struct ResourceState<'a> {
    request: Option<(&'a str, Quantity)>,
    limit: Option<(&'a str, Quantity)>,
}

struct ContainerState<'a> {
    name: &'a str,
    has_resources: bool,
    has_requests: bool,
    /// In the order of `POD_DEFAULT_RESOURCES`.
    resources: [ResourceState<'a>; 2],
}

impl ContainerState<'_> {
    /// Kubernetes' Guaranteed test for one container: cpu and memory limits, and requests
    /// (defaulted to the limits when absent) equal to them.
    fn is_guaranteed(&self) -> bool {
        self.resources
            .iter()
            .all(|state| match (&state.request, &state.limit) {
                (_, None) => false,
                (_, Some((_, limit))) if limit.is_zero() => false,
                (None, Some(_)) => true,
                (Some((_, request)), Some((_, limit))) => request == limit,
            })
    }
}

fn read_container<'a>(container: &'a ContainerIn<'_>) -> Result<ContainerState<'a>, PodError> {
    let name = container.name.as_deref().unwrap_or_default();
    let resources = container.resources.as_ref();
    let requests = resources.and_then(|r| r.requests.as_ref());
    let limits = resources.and_then(|r| r.limits.as_ref());
    let read = |map: Option<&'a StrMap<'_>>,
                field: &'static str,
                resource: &str|
     -> Result<Option<(&'a str, Quantity)>, PodError> {
        let Some(text) = map.and_then(|m| m.get(resource)) else {
            return Ok(None);
        };
        let quantity = Quantity::parse(text).map_err(|source| PodError {
            container: name.to_string(),
            field,
            resource: resource.to_string(),
            source,
        })?;
        Ok(Some((text.as_ref(), quantity)))
    };
    let state = |resource: &str| -> Result<ResourceState<'a>, PodError> {
        Ok(ResourceState {
            request: read(requests, "request", resource)?,
            limit: read(limits, "limit", resource)?,
        })
    };
    let [first, second] = POD_DEFAULT_RESOURCES;
    Ok(ContainerState {
        has_resources: resources.is_some(),
        has_requests: requests.is_some(),
        resources: [state(first)?, state(second)?],
        name,
    })
}

/// The request a container should get for `resource`, if it should change.
fn new_request(
    resource: &str,
    state: &ResourceState<'_>,
    defaults: &CompiledPodDefaults,
) -> Option<(String, RequestReason)> {
    let scale = if resource == "cpu" { 3 } else { 0 };
    if let (Some(&percent), Some((_, limit))) = (
        defaults.request_to_limit_percent.get(resource),
        &state.limit,
    ) {
        let units = limit
            .scaled_floor(scale, u128::from(percent.min(100)), 100)
            .ok()?;
        // A request of zero would say nothing; a limit too small to take a percentage of stays.
        if units == 0 {
            return None;
        }
        let format = if resource == "cpu" {
            Format::DecimalSi
        } else {
            limit.format()
        };
        let request = Quantity::from_units(units, scale, format);
        if state
            .request
            .as_ref()
            .is_some_and(|(_, current)| *current == request)
        {
            return None;
        }
        return Some((request.to_string(), RequestReason::RequestToLimit(percent)));
    }
    match (
        defaults.requests.get(resource),
        &state.request,
        &state.limit,
    ) {
        (Some(default), None, None) => Some((default.to_string(), RequestReason::Default)),
        _ => None,
    }
}

fn container_patch(
    list: &str,
    index: usize,
    container: &ContainerState<'_>,
    requests: Vec<(&'static str, String)>,
    patch: &mut Vec<PatchOp>,
) {
    let index = index.to_string();
    let base = ["spec", list, index.as_str(), "resources"];
    let as_map = |requests: Vec<(&'static str, String)>| -> Map<String, Value> {
        requests
            .into_iter()
            .map(|(resource, value)| (resource.to_string(), Value::String(value)))
            .collect()
    };
    if !container.has_resources {
        let mut resources = Map::new();
        resources.insert("requests".to_string(), Value::Object(as_map(requests)));
        patch.push(PatchOp::Add {
            path: pointer(base).into(),
            value: Value::Object(resources),
        });
    } else if !container.has_requests {
        patch.push(PatchOp::Add {
            path: pointer(base.into_iter().chain(["requests"])).into(),
            value: Value::Object(as_map(requests)),
        });
    } else {
        for (resource, value) in requests {
            patch.push(PatchOp::Add {
                path: pointer(base.into_iter().chain(["requests", resource])).into(),
                value: Value::String(value),
            });
        }
    }
}

#[cfg(test)]
mod tests;
