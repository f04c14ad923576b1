//! AdmissionReview in, response out: dispatch to the node and pod rules, and the
//! fail-open wrapper (docs/architecture.md rule 3.1). Pure: no I/O.
//!
//! INTERFACE CONTRACT (the webhook handler calls exactly this):
//! `handle(body, &policies, &settings) -> Handled`, never panicking: it is the one panic guard
//! of the review path (a bug anywhere in reading or deciding answers allowed, no patch).
//!
//! - A body that is not an admission.k8s.io/v1 AdmissionReview with a request and a uid:
//!   status 400, a Kubernetes `Status` JSON with the reason, outcome `BadRequest`.
//! - Every valid review: status 200 and `allowed: true`, the request's uid echoed. A review of a
//!   node is never refused. Any error inside (an unreadable object, a quantity that does not
//!   parse, even a bug that panics) answers allowed with no patch: outcome `FailedOpen`;
//!   `Handled::error` says why, for the log.
//! - Nodes: `CREATE nodes` and `UPDATE nodes/status` go through `node`; pods: `CREATE pods`
//!   through `pods`; anything else is allowed unchanged.
//!
//! Speed: a node review carries the whole Node twice (20-200 KB). `read` deserialises only the
//! fields the rules read (labels, annotations, allocatable, capacity, container resources), from
//! their own slices of the body; everything else (images, conditions, managedFields, the stored
//! `oldObject` unless the node rule needs its annotations) is stepped over by `scan` without
//! being built or visited token by token.

use std::borrow::Cow;
use std::panic::{AssertUnwindSafe, catch_unwind};

use serde::Deserialize;

use overcommit_core::Account;
use overcommit_core::in_process;
use overcommit_core::node::heartbeat::Quiet;
use overcommit_core::node::usage::NodeUsage;
use overcommit_core::node::{self, NodeDecision, NodeInput, NodeView};
use overcommit_core::patch::{self, PatchOp};
use overcommit_core::pod::{self, PodDecision};
use overcommit_core::policy::NodeChoice;
use overcommit_core::policy::PolicySet;
use overcommit_core::rollout;
use overcommit_json::borrowed;

/// Where a node's usage comes from, for policies with `spec.usage`: the usage caches in
/// `serve`, a file or flags in `review`. Asked only when a policy has `spec.usage`.
pub trait NodeUsageSource: Send + Sync + std::fmt::Debug {
    /// What is known of this node's usage, with the peak taken over `window` (the node's
    /// policy's `spec.usage.window`); None: nothing, the fallback applies.
    fn node_usage(&self, node: &str, window: std::time::Duration) -> Option<NodeUsage>;
}

/// The usage fallback reasons met in one review (a metric).
pub use overcommit_core::node::usage::FallbackSet as UsageFallbacks;

/// Settings that are not policies (namespace of the webhook itself, ...).
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// The webhook's own namespace: its pods are never touched.
    pub own_namespace: String,
    /// `--heartbeat-refresh`: how long a stored condition heartbeat may stand in for the
    /// kubelet's on a node this webhook inflates (quiet heartbeats); zero turns it off.
    pub heartbeat_refresh: std::time::Duration,
    /// The clock the heartbeats' age is measured with.
    pub clock: Clock,
    /// Node usage for usage policies (None: none known, every usage policy falls back).
    pub usage: Option<std::sync::Arc<dyn NodeUsageSource>>,
    /// True while the compiled MutatingAdmissionPolicy of the static policies is in force
    /// (`serve --mode`, set by `leader::in_process`): the node rule then leaves the nodes it
    /// serves (`in_process::serves`) unchanged. One atomic load per node review when false.
    pub in_process: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// Where the time of a review comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Clock {
    #[default]
    System,
    /// A fixed time, in milliseconds since the Unix epoch (`review --now`, tests).
    Fixed(i64),
}

impl Clock {
    /// Milliseconds since the Unix epoch.
    pub fn now_ms(self) -> i64 {
        match self {
            Clock::Fixed(ms) => ms,
            Clock::System => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        }
    }
}

/// What happened to a review (a metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Patched,
    Unchanged,
    FailedOpen,
    BadRequest,
}

impl Outcome {
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Patched => "patched",
            Outcome::Unchanged => "unchanged",
            Outcome::FailedOpen => "failed-open",
            Outcome::BadRequest => "bad-request",
        }
    }
}

/// The answer for one request body.
#[derive(Debug, Clone)]
pub struct Handled {
    /// HTTP status: 200 for every valid review, 400 for a body that is not one.
    pub status: u16,
    /// The JSON body to send (an AdmissionReview, or an error message for 400).
    pub body: Vec<u8>,
    pub resource: ReviewResource,
    pub operation: String,
    pub outcome: Outcome,
    /// For `FailedOpen` and `BadRequest`: what went wrong (which object, why), for the log.
    /// It holds no secret material: names, resource names and quantities.
    pub error: Option<ReviewError>,
    /// Whether stored heartbeat times were put back (quiet heartbeats; a metric).
    pub heartbeats_kept: bool,
    /// Usage policies: why a resource's value fell back instead of following usage (a metric).
    pub usage_fallbacks: UsageFallbacks,
}

/// Why a review was answered without the rules' patch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    /// Not an admission.k8s.io/v1 AdmissionReview with a request and a uid: answered 400.
    #[error("{0}")]
    NotAReview(String),
    /// A valid review whose object could not be read (the message names the object): allowed,
    /// unchanged.
    #[error("{0}")]
    Unreadable(String),
    /// A valid review a rule could not decide: allowed, unchanged. `object` is `namespace/name`,
    /// `name`, or empty when the review names none.
    #[error("{}{reason}", object_prefix(.object))]
    Undecided { object: String, reason: RuleError },
}

/// Why a rule could not decide.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error(transparent)]
    Node(#[from] node::InflateError),
    #[error(transparent)]
    Pod(#[from] pod::PodError),
    #[error("node review without an object")]
    NodeWithoutObject,
    #[error("patch: {0}")]
    Patch(String),
    /// A bug: caught by `handle`'s guard.
    #[error("internal error (panic)")]
    Panic,
}

/// What the reader must know before it reads (plain data: it asks nothing while reading).
fn read_plan(settings: &Settings) -> ReadPlan {
    ReadPlan {
        overcommit_annotations: &node::OVERCOMMIT_ANNOTATIONS,
        quiet_heartbeats: !settings.heartbeat_refresh.is_zero(),
    }
}

// ---- the decision -----------------------------------------------------------------------------

/// What a rule decided for one review.
#[derive(Debug)]
pub enum Decision {
    Node(NodeDecision),
    Pod(PodDecision),
    /// Not a review this webhook changes (a Lease sent by mistake, a DELETE, ...).
    NotMutated(String),
}

impl Decision {
    fn heartbeats_kept(&self) -> bool {
        matches!(self, Decision::Node(d) if d.heartbeats_kept)
    }

    /// The usage fallback reasons of the node's resources (none under static policies).
    fn usage_fallbacks(&self) -> UsageFallbacks {
        match self {
            Decision::Node(d) => d.usage_fallbacks,
            _ => UsageFallbacks::default(),
        }
    }

    fn patch(&self) -> &[PatchOp] {
        match self {
            Decision::Node(d) => &d.patch,
            Decision::Pod(d) => &d.patch,
            Decision::NotMutated(_) => &[],
        }
    }

    /// A short human account of the decision, ending with the patch.
    pub fn explain(&self) -> String {
        let mut out = match self {
            Decision::Node(d) => d.explain(),
            Decision::Pod(d) => d.explain(),
            Decision::NotMutated(why) => return format!("{why}: allowed unchanged\n"),
        };
        if self.patch().is_empty() {
            out.push_str("patch: none (already as it should be)\n");
        } else {
            out.push_str("patch:\n");
        }
        for op in self.patch() {
            let line = match op {
                PatchOp::Add { path, value } => format!("  add {path} = {value}\n"),
                PatchOp::Replace { path, value } => format!("  replace {path} = {value}\n"),
                PatchOp::Remove { path } => format!("  remove {path}\n"),
            };
            out.push_str(&line);
        }
        out
    }
}

/// Handle one request body. Never panics on any input: the one panic guard of the review path
/// (docs/architecture.md rule 3.1: a bug must not block heartbeats) answers a panic allowed,
/// no patch.
pub fn handle(body: &[u8], policies: &PolicySet, settings: &Settings) -> Handled {
    catch_unwind(AssertUnwindSafe(|| {
        respond(read::parse(body, &read_plan(settings)), policies, settings)
    }))
    .unwrap_or_else(|_| panicked(body))
}

/// The answer after a panic: allowed, no patch, the uid recovered from the body if it can be.
fn panicked(body: &[u8]) -> Handled {
    #[derive(Deserialize)]
    struct Review<'a> {
        #[serde(borrow)]
        request: Option<Request<'a>>,
    }
    #[derive(Deserialize)]
    struct Request<'a> {
        #[serde(borrow, deserialize_with = "borrowed::str")]
        uid: Cow<'a, str>,
        #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
        operation: Option<Cow<'a, str>>,
    }
    let request = serde_json::from_slice::<Review<'_>>(body)
        .ok()
        .and_then(|r| r.request);
    let (uid, operation) = request.map_or((Cow::Borrowed(""), None), |r| (r.uid, r.operation));
    let error = ReviewError::Undecided {
        object: String::new(),
        reason: RuleError::Panic,
    };
    let operation = operation.unwrap_or_default().into_owned();
    fail_open(&uid, ReviewResource::Other, operation, error)
}

/// The answer for a parsed body.
fn respond(parsed: Parsed<'_>, policies: &PolicySet, settings: &Settings) -> Handled {
    let request = match parsed {
        Parsed::Review(request) => request,
        Parsed::Unreadable {
            uid,
            resource,
            operation,
            reason,
        } => {
            return fail_open(&uid, resource, operation, ReviewError::Unreadable(reason));
        }
        Parsed::Bad(message) => return bad_request(message),
    };
    let uid = request.uid.as_deref().unwrap_or_default();
    let resource = classify(request.kind.as_ref(), request.resource.as_ref());
    let operation = request.operation.as_deref().unwrap_or_default().to_string();
    let decision = match decide_request(&request, resource, policies, settings, Account::PatchOnly)
    {
        Ok(decision) => decision,
        Err(reason) => return fail_open(uid, resource, operation, undecided(&request, reason)),
    };
    let usage_fallbacks = decision.usage_fallbacks();
    let ops = decision.patch();
    if ops.is_empty() {
        return Handled {
            usage_fallbacks,
            ..answer(uid, resource, operation, None, Outcome::Unchanged)
        };
    }
    match patch::to_json(ops) {
        Ok(json) => Handled {
            heartbeats_kept: decision.heartbeats_kept(),
            usage_fallbacks,
            ..answer(uid, resource, operation, Some(&json), Outcome::Patched)
        },
        Err(e) => {
            let error = undecided(&request, RuleError::Patch(e.to_string()));
            fail_open(uid, resource, operation, error)
        }
    }
}

/// The decision for a review (for `review --explain`), or why there is none.
pub fn explain(
    body: &[u8],
    policies: &PolicySet,
    settings: &Settings,
) -> Result<Decision, ReviewError> {
    match read::parse(body, &read_plan(settings)) {
        Parsed::Review(request) => {
            let resource = classify(request.kind.as_ref(), request.resource.as_ref());
            decide_request(&request, resource, policies, settings, Account::Full)
                .map_err(|reason| undecided(&request, reason))
        }
        Parsed::Unreadable { reason, .. } => Err(ReviewError::Unreadable(reason)),
        Parsed::Bad(message) => Err(ReviewError::NotAReview(message)),
    }
}

/// `account`: whether to keep the rules' per-resource account (for `explain`), beyond the patch.
fn decide_request(
    request: &RequestIn<'_>,
    resource: ReviewResource,
    policies: &PolicySet,
    settings: &Settings,
    account: Account,
) -> Result<Decision, RuleError> {
    let operation = request.operation.as_deref().unwrap_or_default();
    let sub_resource = request.sub_resource.as_deref().unwrap_or_default();
    match (resource, operation, sub_resource) {
        (ReviewResource::Node, "CREATE", "") | (ReviewResource::Node, "UPDATE", "status") => {
            decide_node_review(request, policies, settings, account)
        }
        (ReviewResource::Pod, "CREATE", "") => {
            let object = request.object.as_ref();
            let namespace = request
                .namespace
                .as_deref()
                .filter(|n| !n.is_empty())
                .or_else(|| object.and_then(|o| o.metadata.as_ref()?.namespace.as_deref()))
                .unwrap_or_default();
            let spec = object.and_then(|o| o.spec.as_ref());
            pod::decide_with(namespace, &settings.own_namespace, spec, policies, account)
                .map(Decision::Pod)
                .map_err(RuleError::from)
        }
        (resource, operation, sub_resource) => {
            let what = match sub_resource {
                "" => format!("{operation} {}", resource.as_str()),
                sub => format!("{operation} {}/{sub}", resource.as_str()),
            };
            Ok(Decision::NotMutated(format!("{what} is not mutated")))
        }
    }
}

/// A node registration or status update: the policy is chosen here, once, from the object's
/// labels, and the node rule decides on plain input.
fn decide_node_review(
    request: &RequestIn<'_>,
    policies: &PolicySet,
    settings: &Settings,
    account: Account,
) -> Result<Decision, RuleError> {
    let Some(object) = request.object.as_ref() else {
        return Err(RuleError::NodeWithoutObject);
    };
    let node = node_view(object);
    let choice = policies.for_node(&node.labels);
    if settings
        .in_process
        .load(std::sync::atomic::Ordering::Relaxed)
        && in_process::serves(&choice)
    {
        return Ok(Decision::NotMutated(
            "node served in-process (the compiled MutatingAdmissionPolicy)".into(),
        ));
    }
    let old = request.old_object.as_ref();
    let stored = old.map(|old| NodeView {
        has_metadata: true,
        annotations: old.metadata.as_ref().and_then(|m| m.annotations.as_ref()),
        conditions: old.status.as_ref().and_then(|s| s.conditions.as_deref()),
        ..NodeView::default()
    });
    // Staged rollout: a node waiting for its step keeps what it carries.
    let held = request
        .name
        .as_deref()
        .and_then(|name| rollout::held(policies, &choice, name, &node, stored.as_ref()));
    let held_choice = held.as_ref().map(|set| set.for_node(&node.labels));
    let choice = held_choice.as_ref().unwrap_or(&choice);
    // Quiet heartbeats: status updates only (a registration has no stored node); the clock is
    // read only when they are on (the rule ignores a zero refresh).
    let quiet_on =
        request.operation.as_deref() == Some("UPDATE") && !settings.heartbeat_refresh.is_zero();
    let quiet = quiet_on.then(|| Quiet {
        now_ms: settings.clock.now_ms(),
        refresh: settings.heartbeat_refresh,
    });
    // Looked up only when the node's policy follows usage: static policies pay one branch.
    let usage = match (&settings.usage, choice) {
        (Some(source), NodeChoice::Policy(policy)) => policy.usage.as_ref().and_then(|u| {
            let name = request.name.as_deref()?;
            source.node_usage(name, u.window)
        }),
        _ => None,
    };
    node::decide_node(NodeInput {
        node: &node,
        stored: stored.as_ref(),
        choice,
        account,
        quiet,
        usage: usage.as_ref(),
    })
    .map(Decision::Node)
    .map_err(RuleError::from)
}

fn node_view<'v>(object: &'v ObjectIn<'v>) -> NodeView<'v> {
    let metadata = object.metadata.as_ref();
    let status = object.status.as_ref();
    NodeView {
        has_metadata: metadata.is_some(),
        labels: metadata.and_then(|m| m.labels.as_ref()),
        annotations: metadata.and_then(|m| m.annotations.as_ref()),
        allocatable: status.and_then(|s| s.allocatable.as_ref()),
        capacity: status.and_then(|s| s.capacity.as_ref()),
        conditions: status.and_then(|s| s.conditions.as_deref()),
    }
}

/// Why a rule could not decide, with which object it was about.
fn undecided(request: &RequestIn<'_>, reason: RuleError) -> ReviewError {
    ReviewError::Undecided {
        object: object_name(request.name.as_deref(), request.namespace.as_deref()),
        reason,
    }
}

/// A 200 answer (allowed, with the patch if any).
fn answer(
    uid: &str,
    resource: ReviewResource,
    operation: String,
    patch: Option<&[u8]>,
    outcome: Outcome,
) -> Handled {
    Handled {
        status: 200,
        body: answer::review_body(uid, patch),
        resource,
        operation,
        outcome,
        error: None,
        heartbeats_kept: false,
        usage_fallbacks: UsageFallbacks::default(),
    }
}

fn fail_open(
    uid: &str,
    resource: ReviewResource,
    operation: String,
    error: ReviewError,
) -> Handled {
    Handled {
        error: Some(error),
        ..answer(uid, resource, operation, None, Outcome::FailedOpen)
    }
}

fn bad_request(message: String) -> Handled {
    Handled {
        status: 400,
        body: answer::bad_request_body(&message),
        resource: ReviewResource::Other,
        operation: String::new(),
        outcome: Outcome::BadRequest,
        error: Some(ReviewError::NotAReview(message)),
        heartbeats_kept: false,
        usage_fallbacks: UsageFallbacks::default(),
    }
}

mod answer;
pub mod metrics;
mod read;
mod request;

use self::read::ReadPlan;
pub use self::request::ReviewResource;
use self::request::{ObjectIn, Parsed, RequestIn, classify, object_name, object_prefix};

#[cfg(test)]
mod equivalence;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
