//! `POST /validate`: the placement cap at admission. AdmissionReview in, response out; the
//! node and pod facts come from a [`PlacementSource`] the app supplies. No I/O here.
//!
//! INTERFACE CONTRACT (the webhook handler calls exactly this):
//! `handle(body, &policies, &source) -> Validated`, never panicking.
//!
//! - `CREATE pods/binding` (and `CREATE bindings`, the older endpoint): the pod is read from the
//!   source by namespace/name (its index, no GET per binding), the node from the binding's
//!   `target.name`.
//! - `CREATE pods` with `spec.nodeName`: the pod is the review's object; without `spec.nodeName`
//!   it is allowed (the scheduler binds it later, through pods/binding).
//! - The node's policy ([`PolicySet::for_node`] on the node's labels) gives the cap; the
//!   decision is `overcommit_core::cap::check`: allowed, denied (403 with the message), or
//!   allowed with the message in `response.warnings` (capMode Warn, or a DaemonSet's or
//!   critical pod over the cap: outcome `Exempted`). The requester's message names no node
//!   figures; `Validated::message` (the log) has them.
//! - An allowed placement that will be stored if nothing after this webhook refuses it is
//!   reported back to the source (`allowed`, with whom it counts against: `ledger::Hold`) so
//!   that it counts before the watch shows it. Not reported: dry runs; a binding of a pod that
//!   is bound already (the API server answers 409); a create whose name the index holds
//!   (AlreadyExists).
//! - Anything unknown (the pod index not listed yet, a pod or node not in the caches yet, an
//!   unreadable object, a quantity that does not parse) is allowed: outcome `FailedOpen` with the
//!   reason ([`PlacementError::reason`], a metrics label), as the webhook's
//!   `failurePolicy: Ignore` would do. A body that is not an AdmissionReview: 400.
//! - [`handle_fetching`] (what the server calls): as `handle`, but a binding whose pod the index
//!   does not hold yet (created an instant ago, this replica's watch behind) is decided on one
//!   read of that pod from the source ([`PlacementSource::fetch_pod`]: a GET with a short
//!   timeout); not found or failed, it fails open as before. The lookup is reported
//!   (`Validated::lookup`) for a metric.

pub mod denials;
pub mod ledger;
pub mod metrics;
pub mod node;
pub mod pod;

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde_json::json;

use overcommit_core::cap::{self, CapDecision, Placement};
use overcommit_core::policy::PolicySet;

pub use self::ledger::Hold;
pub use self::pod::PodFacts;

/// What the cap needs of a node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub labels: BTreeMap<String, String>,
    /// The kubelet's raw allocatable in the scheduler's units (millicores for cpu).
    pub raw: BTreeMap<String, u128>,
}

/// A placement allowed, as the source records it.
#[derive(Debug, Clone, Copy)]
pub struct Allowed<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub node: &'a str,
    pub requests: &'a BTreeMap<String, u128>,
    pub hold: Hold,
}

/// Where the facts come from: the app's node cache, the shared pod index and the ledger
/// (`sources::placement`).
pub trait PlacementSource: Send + Sync {
    /// A node's facts, shared with the cache (no copy of its labels per review).
    fn node(&self, name: &str) -> Option<Arc<NodeFacts>>;
    /// A pod by namespace and name (pending pods too).
    fn pod(&self, namespace: &str, name: &str) -> Option<PodFacts>;
    /// The requests of the pods on `node` (bound, non-terminal), plus the bindings this replica
    /// allowed that the watch has not shown yet, leaving out `namespace/name`'s own.
    fn requested(&self, node: &str, namespace: &str, name: &str) -> BTreeMap<String, u128>;
    /// A placement was allowed: it counts against whom its `hold` says until the watch shows it.
    fn allowed(&self, placement: &Allowed<'_>);
    /// Whether the pod index has listed every pod: before that, a node's sums are not known.
    fn synced(&self) -> bool;
    /// A placement on `node` was refused, over the cap of `resources` (for the node's Event).
    fn denied(&self, node: &str, resources: &[String]) {
        let _ = (node, resources);
    }
    /// One read of a pod the index does not hold (yet), from the API server: `Ok(None)` when
    /// there is no such pod, `Err` with the reason when the read failed or took too long.
    /// Without an API client: an error.
    fn fetch_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<PodFacts>, String>> {
        let _ = (namespace, name);
        Box::pin(async { Err("no API client to read the pod".to_string()) })
    }
}

/// What became of a pod missing from the index (a metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PodLookup {
    /// Read from the API server; the placement was decided on it.
    Found,
    /// No such pod: allowed (the API server refuses the binding itself).
    NotFound,
    /// The read failed or timed out: allowed (fail open).
    Failed,
}

/// What happened (a metrics label and the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CapOutcome {
    Allowed,
    /// Over the cap, `capMode: Enforce`.
    Denied,
    /// Over the cap, `capMode: Warn`.
    Warned,
    /// Over the cap, a DaemonSet's or a critical pod: allowed with a warning.
    Exempted,
    FailedOpen,
    BadRequest,
}

impl CapOutcome {
    pub fn as_str(&self) -> &'static str {
        match self {
            CapOutcome::Allowed => "allowed",
            CapOutcome::Denied => "denied",
            CapOutcome::Warned => "warned",
            CapOutcome::Exempted => "exempted",
            CapOutcome::FailedOpen => "failed-open",
            CapOutcome::BadRequest => "bad-request",
        }
    }
}

/// The answer for one body.
#[derive(Debug, Clone)]
pub struct Validated {
    pub status: u16,
    pub body: Vec<u8>,
    pub outcome: CapOutcome,
    /// For the log: the detail of a denial or warning (with the node's figures, which the
    /// requester is not shown), or why the review failed open or was refused.
    pub message: Option<String>,
    /// Why the review failed open (`FailedOpen`), a metrics label.
    pub failed_open: Option<&'static str>,
    /// The pod a binding names, when the index did not hold it (`FailedOpen`): namespace, name.
    pub missing_pod: Option<(String, String)>,
    /// What a read of that pod gave ([`handle_fetching`]).
    pub lookup: Option<PodLookup>,
}

/// Why a placement could not be decided (it is then allowed).
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    #[error("not an admission.k8s.io/v1 AdmissionReview with a request and a uid: {0}")]
    NotAReview(String),
    #[error("binding {0}: no target node")]
    NoTarget(String),
    #[error("the pod index has not listed every pod yet: no node's sums are known")]
    NotSynced,
    #[error("pod {namespace}/{name}: not in this replica's pod index yet")]
    UnknownPod { namespace: String, name: String },
    #[error(
        "pod {namespace}/{name}: not in this replica's pod index yet, and reading it failed: {reason}"
    )]
    PodRead {
        namespace: String,
        name: String,
        reason: String,
    },
    #[error("node {0}: not in this replica's node cache yet")]
    UnknownNode(String),
    #[error("pod {pod}: {reason}")]
    Unreadable { pod: String, reason: String },
    #[error("the placement check panicked")]
    Panicked,
}

impl PlacementError {
    /// Why a review failed open, as a metrics label (`placement_failed_open{reason}`).
    pub fn reason(&self) -> &'static str {
        match self {
            PlacementError::NotAReview(_) => "not_a_review",
            PlacementError::NoTarget(_) => "no_target",
            PlacementError::NotSynced => "pods_not_synced",
            PlacementError::UnknownPod { .. } => "unknown_pod",
            PlacementError::PodRead { .. } => "pod_read_failed",
            PlacementError::UnknownNode(_) => "unknown_node",
            PlacementError::Unreadable { .. } => "unreadable",
            PlacementError::Panicked => "panicked",
        }
    }
}

#[derive(Deserialize)]
struct ReviewIn {
    #[serde(rename = "apiVersion")]
    api_version: Option<String>,
    request: Option<RequestIn>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestIn {
    uid: String,
    #[serde(default)]
    operation: String,
    resource: Option<ResourceIn>,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    object: Option<serde_json::Value>,
    /// A dry run (`kubectl create --dry-run=server`, or a client checking a binding): answered
    /// like any other, but not counted in the ledger (the configuration says sideEffects None).
    #[serde(default)]
    dry_run: bool,
}

#[derive(Deserialize)]
struct ResourceIn {
    #[serde(default)]
    resource: String,
}

#[derive(Deserialize)]
struct BindingIn {
    #[serde(default)]
    metadata: MetaIn,
    target: Option<TargetIn>,
}

#[derive(Deserialize, Default)]
struct MetaIn {
    name: Option<String>,
    namespace: Option<String>,
}

#[derive(Deserialize)]
struct TargetIn {
    #[serde(default)]
    name: String,
}

/// Decide one review (see the module documentation). Never panics.
pub fn handle(body: &[u8], policies: &PolicySet, source: &dyn PlacementSource) -> Validated {
    match read(body) {
        Ok(review) => settle(&review, policies, source, None),
        Err(answer) => answer,
    }
}

/// `handle`, with one read of a binding's pod the index does not hold yet (see the module
/// documentation). The body is read once; the read of the pod is the only await, and the
/// placement is then decided on the pod it gave.
pub async fn handle_fetching(
    body: &[u8],
    policies: &PolicySet,
    source: &dyn PlacementSource,
) -> Validated {
    let review = match read(body) {
        Ok(review) => review,
        Err(answer) => return answer,
    };
    let first = settle(&review, policies, source, None);
    let Some((namespace, name)) = first.missing_pod.clone() else {
        return first;
    };
    match source.fetch_pod(&namespace, &name).await {
        Ok(Some(facts)) => Validated {
            lookup: Some(PodLookup::Found),
            ..settle(&review, policies, source, Some(&facts))
        },
        Ok(None) => Validated {
            lookup: Some(PodLookup::NotFound),
            ..first
        },
        Err(reason) => {
            let error = PlacementError::PodRead {
                namespace,
                name,
                reason,
            };
            Validated {
                lookup: Some(PodLookup::Failed),
                failed_open: Some(error.reason()),
                message: Some(error.to_string()),
                ..first
            }
        }
    }
}

/// A review, read once: its uid, whether it is a dry run, and what it places.
struct Review {
    uid: String,
    dry_run: bool,
    placing: Placing,
}

/// What a review places.
enum Placing {
    /// Nothing the cap checks (not a CREATE, a pod without `spec.nodeName`, another resource).
    Nothing,
    /// A pod created with `spec.nodeName`: its facts come with the review.
    Pod {
        namespace: String,
        name: String,
        node: String,
        facts: PodFacts,
    },
    /// A binding: the pod is looked up by namespace/name.
    Binding {
        namespace: String,
        name: String,
        node: String,
    },
}

/// Which pod goes to which node, if this review places one.
struct Target<'a> {
    namespace: &'a str,
    name: &'a str,
    node: &'a str,
    facts: &'a PodFacts,
    /// Whom the placement counts against once allowed; None: it will not be stored (a binding
    /// of a bound pod, a create of a name taken), so it is not counted.
    hold: Option<Hold>,
}

/// Read a body into a [`Review`]; what cannot be read is answered here (400, or allowed).
fn read(body: &[u8]) -> Result<Review, Validated> {
    let review: ReviewIn = serde_json::from_slice(body)
        .map_err(|e| bad_request(PlacementError::NotAReview(e.to_string())))?;
    let request = match review.request {
        Some(r) if review.api_version.as_deref() == Some("admission.k8s.io/v1") => r,
        _ => {
            return Err(bad_request(PlacementError::NotAReview(
                "apiVersion admission.k8s.io/v1 and a request are required".into(),
            )));
        }
    };
    let uid = request.uid.clone();
    let dry_run = request.dry_run;
    match catch_unwind(AssertUnwindSafe(|| placing(request))) {
        Ok(Ok(placing)) => Ok(Review {
            uid,
            dry_run,
            placing,
        }),
        Ok(Err(e)) => Err(fail_open(&uid, e)),
        Err(_) => Err(fail_open(&uid, PlacementError::Panicked)),
    }
}

/// Decide a review read by [`read`]. A binding's pod is `fetched` (read for this review) or
/// else the source's; without either the review fails open with `missing_pod` set.
fn settle(
    review: &Review,
    policies: &PolicySet,
    source: &dyn PlacementSource,
    fetched: Option<&PodFacts>,
) -> Validated {
    let decided = catch_unwind(AssertUnwindSafe(|| {
        let looked_up;
        let target = match &review.placing {
            Placing::Nothing => return Ok(CapDecision::Allow),
            // Before any lookup: an unsynced index would also send bindings to a GET each.
            _ if !source.synced() => return Err(PlacementError::NotSynced),
            Placing::Pod {
                namespace,
                name,
                node,
                facts,
            } => Target {
                namespace,
                name,
                node,
                facts,
                hold: source
                    .pod(namespace, name)
                    .is_none()
                    .then_some(Hold::OwnNamespace),
            },
            Placing::Binding {
                namespace,
                name,
                node,
            } => {
                let facts = match fetched {
                    Some(facts) => facts,
                    None => {
                        looked_up = source.pod(namespace, name).ok_or_else(|| {
                            PlacementError::UnknownPod {
                                namespace: namespace.clone(),
                                name: name.clone(),
                            }
                        })?;
                        &looked_up
                    }
                };
                Target {
                    namespace,
                    name,
                    node,
                    facts,
                    hold: (!facts.bound).then_some(Hold::Everyone),
                }
            }
        };
        decide(&target, review.dry_run, policies, source)
    }));
    match decided {
        Ok(Ok(decision)) => answer(&review.uid, decision),
        Ok(Err(e)) => fail_open(&review.uid, e),
        Err(_) => fail_open(&review.uid, PlacementError::Panicked),
    }
}

/// One decision per node at a time, from reading the node's sum to recording the binding it
/// allows: two reviews at once for one node (the API server calls over several connections)
/// must not both pass on the same sum, while reviews for different nodes go on side by side.
/// A node's slot lives while a decision holds or waits for it (so the map holds at most the
/// nodes being decided right now).
static DECIDING: Mutex<BTreeMap<String, Arc<Mutex<()>>>> = Mutex::new(BTreeMap::new());

/// Run `decide` holding `node`'s slot in [`DECIDING`].
fn one_at_a_time_on<R>(node: &str, decide: impl FnOnce() -> R) -> R {
    let slot = {
        let mut slots = DECIDING.lock().unwrap_or_else(PoisonError::into_inner);
        match slots.get(node) {
            Some(slot) => Arc::clone(slot),
            None => {
                let slot = Arc::new(Mutex::new(()));
                slots.insert(node.to_string(), Arc::clone(&slot));
                slot
            }
        }
    };
    let decided = {
        let _held = slot.lock().unwrap_or_else(PoisonError::into_inner);
        decide()
    };
    let mut slots = DECIDING.lock().unwrap_or_else(PoisonError::into_inner);
    // The map's and this decision's: nobody else holds or waits (a clone needs the map's lock).
    if Arc::strong_count(&slot) == 2 {
        slots.remove(node);
    }
    decided
}

fn decide(
    target: &Target<'_>,
    dry_run: bool,
    policies: &PolicySet,
    source: &dyn PlacementSource,
) -> Result<CapDecision, PlacementError> {
    let node = source
        .node(target.node)
        .ok_or_else(|| PlacementError::UnknownNode(target.node.to_string()))?;
    let Some(cap) = cap::node_cap(&policies.for_node(&node.labels)) else {
        return Ok(CapDecision::Allow);
    };
    // Held for the sum, the pure check and the ledger entry (microseconds), on /validate only.
    let decision = one_at_a_time_on(target.node, || {
        let requested = source.requested(target.node, target.namespace, target.name);
        let decision = cap::check(&Placement {
            node: target.node,
            pod: target.name,
            cap: Some(cap),
            raw: &node.raw,
            requested: &requested,
            pod_requests: &target.facts.requests,
            exempt: target.facts.exempt,
        });
        if let Some(hold) = target.hold
            && !dry_run
            && !matches!(decision, CapDecision::Deny(_))
        {
            source.allowed(&Allowed {
                namespace: target.namespace,
                name: target.name,
                node: target.node,
                requests: &target.facts.requests,
                hold,
            });
        }
        if let CapDecision::Deny(over) = &decision
            && !dry_run
        {
            source.denied(target.node, &over.resources);
        }
        decision
    });
    Ok(decision)
}

/// What a request places (no lookups: a binding's pod is looked up in [`settle`]).
fn placing(request: RequestIn) -> Result<Placing, PlacementError> {
    let resource = request
        .resource
        .as_ref()
        .map_or("", |r| r.resource.as_str());
    if request.operation != "CREATE" {
        return Ok(Placing::Nothing);
    }
    let object = request.object.unwrap_or_default();
    // A binding is POSTed to pods/NAME/binding (the scheduler) or to the namespace's
    // `bindings` (older clients); both bind the pod the Binding names.
    match (
        resource,
        request.sub_resource.as_deref().unwrap_or_default(),
    ) {
        ("pods", "binding") | ("bindings", "") => {
            let binding: BindingIn =
                serde_json::from_value(object).map_err(|e| PlacementError::Unreadable {
                    pod: request.name.clone().unwrap_or_default(),
                    reason: e.to_string(),
                })?;
            let namespace = request
                .namespace
                .or(binding.metadata.namespace)
                .unwrap_or_default();
            let name = request.name.or(binding.metadata.name).unwrap_or_default();
            let node = binding
                .target
                .map(|t| t.name)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| PlacementError::NoTarget(format!("{namespace}/{name}")))?;
            Ok(Placing::Binding {
                namespace,
                name,
                node,
            })
        }
        ("pods", "") => {
            let pod: Pod =
                serde_json::from_value(object).map_err(|e| PlacementError::Unreadable {
                    pod: request.name.clone().unwrap_or_default(),
                    reason: e.to_string(),
                })?;
            let Some(node) = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .filter(|n| !n.is_empty())
            else {
                return Ok(Placing::Nothing);
            };
            let namespace = request
                .namespace
                .or_else(|| pod.metadata.namespace.clone())
                .unwrap_or_default();
            // The API server generates a generateName pod's name (and uid) before validating
            // admission (tests/cluster: TestRequestCapGenerateName), so the name is there; the
            // prefix is only a fallback for a review that lacks it.
            let name = pod
                .metadata
                .name
                .clone()
                .or_else(|| pod.metadata.generate_name.clone())
                .unwrap_or_default();
            let facts = pod::facts(&pod).map_err(|e| PlacementError::Unreadable {
                pod: format!("{namespace}/{name}"),
                reason: e.to_string(),
            })?;
            Ok(Placing::Pod {
                namespace,
                name,
                node,
                facts,
            })
        }
        _ => Ok(Placing::Nothing),
    }
}

fn answer(uid: &str, decision: CapDecision) -> Validated {
    let (response, outcome, message) = match decision {
        CapDecision::Allow => (
            json!({"uid": uid, "allowed": true}),
            CapOutcome::Allowed,
            None,
        ),
        CapDecision::Deny(over) => (
            json!({"uid": uid, "allowed": false, "status": {
                "code": 403, "reason": "Forbidden", "message": over.public,
            }}),
            CapOutcome::Denied,
            Some(over.detail),
        ),
        CapDecision::Warn(over) => (
            json!({"uid": uid, "allowed": true, "warnings": [over.public]}),
            CapOutcome::Warned,
            Some(over.detail),
        ),
        CapDecision::Exempted(exempt, over) => (
            json!({"uid": uid, "allowed": true, "warnings": [over.public]}),
            CapOutcome::Exempted,
            Some(format!(
                "{} (allowed: {} pod)",
                over.detail,
                exempt.as_str()
            )),
        ),
    };
    Validated {
        status: 200,
        body: review(response),
        outcome,
        message,
        failed_open: None,
        missing_pod: None,
        lookup: None,
    }
}

fn review(response: serde_json::Value) -> Vec<u8> {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    });
    serde_json::to_vec(&review).unwrap_or_default()
}

fn fail_open(uid: &str, error: PlacementError) -> Validated {
    let missing_pod = match &error {
        PlacementError::UnknownPod { namespace, name } => Some((namespace.clone(), name.clone())),
        _ => None,
    };
    Validated {
        status: 200,
        body: review(json!({"uid": uid, "allowed": true})),
        outcome: CapOutcome::FailedOpen,
        message: Some(error.to_string()),
        failed_open: Some(error.reason()),
        missing_pod,
        lookup: None,
    }
}

fn bad_request(error: PlacementError) -> Validated {
    let message = error.to_string();
    let status = json!({
        "apiVersion": "v1", "kind": "Status", "status": "Failure",
        "message": message, "reason": "BadRequest", "code": 400,
    });
    Validated {
        status: 400,
        body: serde_json::to_vec(&status).unwrap_or_default(),
        outcome: CapOutcome::BadRequest,
        message: Some(message),
        failed_open: None,
        missing_pod: None,
        lookup: None,
    }
}

#[cfg(test)]
mod tests;
