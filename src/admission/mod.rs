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
use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};

use serde::{Deserialize, Serialize};

use overcommit_core::Account;
use overcommit_core::inprocess;
use overcommit_core::node::heartbeat::{Condition, Quiet};
use overcommit_core::node::usage::NodeUsage;
use overcommit_core::node::{self, NodeDecision, NodeView};
use overcommit_core::patch::{self, PatchOp};
use overcommit_core::pod::{self, PodDecision, PodSpecIn};
use overcommit_core::policy::NodeChoice;
use overcommit_core::policy::PolicySet;
use overcommit_json::StrMap;
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
    /// serves (`inprocess::serves`) unchanged. One atomic load per node review when false.
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

/// Which kind of object a review was about (a metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReviewResource {
    Node,
    Pod,
    Other,
}

impl ReviewResource {
    pub fn as_str(&self) -> &'static str {
        match self {
            ReviewResource::Node => "node",
            ReviewResource::Pod => "pod",
            ReviewResource::Other => "other",
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

fn object_prefix(object: &str) -> String {
    if object.is_empty() {
        String::new()
    } else {
        format!("{object}: ")
    }
}

// ---- what is read from a review -------------------------------------------------------------

/// The request of a review (a `Deserialize` for the test oracle; `read` builds it field by field).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RequestIn<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    uid: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    kind: Option<KindIn<'a>>,
    #[serde(borrow, default)]
    resource: Option<ResourceIn<'a>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    sub_resource: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    namespace: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    operation: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    object: Option<ObjectIn<'a>>,
    #[serde(borrow, default)]
    old_object: Option<OldObjectIn<'a>>,
}

#[derive(Deserialize, Default)]
struct KindIn<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    group: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    kind: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Default)]
struct ResourceIn<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    group: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    resource: Option<Cow<'a, str>>,
}

/// A Node or a Pod: the fields of both rules (a node has no containers, a pod no allocatable).
#[derive(Deserialize, Default)]
struct ObjectIn<'a> {
    #[serde(borrow, default)]
    metadata: Option<MetaIn<'a>>,
    #[serde(borrow, default)]
    spec: Option<PodSpecIn<'a>>,
    #[serde(borrow, default)]
    status: Option<NodeStatusIn<'a>>,
}

#[derive(Deserialize, Default)]
struct OldObjectIn<'a> {
    #[serde(borrow, default)]
    metadata: Option<OldMetaIn<'a>>,
    #[serde(borrow, default)]
    status: Option<OldStatusIn<'a>>,
}

/// The stored node's conditions (quiet heartbeats).
#[derive(Deserialize, Default)]
struct OldStatusIn<'a> {
    #[serde(borrow, default)]
    conditions: Option<Vec<Condition<'a>>>,
}

#[derive(Deserialize, Default)]
struct MetaIn<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    namespace: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str_map")]
    labels: Option<StrMap<'a>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str_map")]
    annotations: Option<StrMap<'a>>,
}

#[derive(Deserialize, Default)]
struct OldMetaIn<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed::option_str_map")]
    annotations: Option<StrMap<'a>>,
}

#[derive(Deserialize, Default)]
struct NodeStatusIn<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed::option_str_map")]
    allocatable: Option<StrMap<'a>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str_map")]
    capacity: Option<StrMap<'a>>,
    #[serde(borrow, default)]
    conditions: Option<Vec<Condition<'a>>>,
}

// ---- what is written back ---------------------------------------------------------------------

/// The answer, as `review_body` writes it (the serde form, for its tests).
#[cfg(test)]
#[derive(Serialize)]
struct ReviewOut<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    response: ResponseOut<'a>,
}

#[cfg(test)]
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseOut<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusOut<'a> {
    api_version: &'static str,
    kind: &'static str,
    status: &'static str,
    message: &'a str,
    reason: &'static str,
    code: u16,
}

const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";

/// What the rules read beyond the fields every decision reads, for the reader's early stop
/// (`read::Needs`). One per review: the reader asks about the object's labels only, so the
/// answer is kept.
struct RuleNeeds<'p> {
    policies: &'p PolicySet,
    quiet_heartbeats: bool,
    /// `conditions`' answer, once asked (the policy match is the costly part).
    conditions_needed: Cell<Option<bool>>,
}

impl read::Needs for RuleNeeds<'_> {
    /// The node rule reads the stored node's annotations only when the object carries neither
    /// overcommit annotation (`node::decide`).
    fn stored_annotations(&self, annotations: Option<&StrMap<'_>>) -> bool {
        !node::carries_overcommit_annotations(annotations)
    }

    /// Quiet heartbeats read both nodes' conditions, on nodes a policy selects.
    fn conditions(&self, labels: Option<&StrMap<'_>>) -> bool {
        if !self.quiet_heartbeats {
            return false;
        }
        if let Some(needed) = self.conditions_needed.get() {
            return needed;
        }
        let needed = matches!(self.policies.for_node(&labels), NodeChoice::Policy(_));
        self.conditions_needed.set(Some(needed));
        needed
    }
}

fn needs<'p>(policies: &'p PolicySet, settings: &Settings) -> RuleNeeds<'p> {
    RuleNeeds {
        policies,
        quiet_heartbeats: !settings.heartbeat_refresh.is_zero(),
        conditions_needed: Cell::new(None),
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
        respond(
            read::parse(body, &needs(policies, settings)),
            policies,
            settings,
        )
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
    match read::parse(body, &needs(policies, settings)) {
        Parsed::Review(request) => {
            let resource = classify(request.kind.as_ref(), request.resource.as_ref());
            decide_request(&request, resource, policies, settings, Account::Full)
                .map_err(|reason| undecided(&request, reason))
        }
        Parsed::Unreadable { reason, .. } => Err(ReviewError::Unreadable(reason)),
        Parsed::Bad(message) => Err(ReviewError::NotAReview(message)),
    }
}

enum Parsed<'a> {
    Review(Box<RequestIn<'a>>),
    /// A valid review whose objects could not be read: answered allowed, unchanged.
    Unreadable {
        uid: String,
        resource: ReviewResource,
        operation: String,
        reason: String,
    },
    Bad(String),
}

/// The envelope every review must have: admission.k8s.io/v1 AdmissionReview with a uid.
fn check_envelope(
    api_version: Option<&str>,
    kind: Option<&str>,
    uid: Option<&str>,
) -> Result<(), String> {
    if api_version != Some(REVIEW_API_VERSION) || kind != Some("AdmissionReview") {
        return Err(format!(
            "expected apiVersion {REVIEW_API_VERSION} and kind AdmissionReview, found {:?} {:?}",
            api_version.unwrap_or_default(),
            kind.unwrap_or_default()
        ));
    }
    match uid {
        Some(uid) if !uid.is_empty() => Ok(()),
        Some(_) => Err("request.uid is empty".to_string()),
        None => Err("AdmissionReview has no request.uid".to_string()),
    }
}

fn classify(kind: Option<&KindIn<'_>>, resource: Option<&ResourceIn<'_>>) -> ReviewResource {
    let core =
        |group: Option<&Cow<'_, str>>| group.map(|g| g.as_ref()).unwrap_or_default().is_empty();
    let by_resource = resource
        .filter(|r| core(r.group.as_ref()))
        .and_then(|r| r.resource.as_deref());
    let by_kind = kind
        .filter(|k| core(k.group.as_ref()))
        .and_then(|k| k.kind.as_deref());
    match (by_resource, by_kind) {
        (Some("nodes"), _) | (None, Some("Node")) => ReviewResource::Node,
        (Some("pods"), _) | (None, Some("Pod")) => ReviewResource::Pod,
        _ => ReviewResource::Other,
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
            let Some(object) = request.object.as_ref() else {
                return Err(RuleError::NodeWithoutObject);
            };
            let node = node_view(object);
            if settings
                .in_process
                .load(std::sync::atomic::Ordering::Relaxed)
                && inprocess::serves(&policies.for_node(&node.labels))
            {
                return Ok(Decision::NotMutated(
                    "node served in-process (the compiled MutatingAdmissionPolicy)".into(),
                ));
            }
            let old = request.old_object.as_ref();
            let stored_annotations = old
                .and_then(|old| old.metadata.as_ref())
                .and_then(|m| m.annotations.as_ref());
            let stored_conditions = old
                .and_then(|old| old.status.as_ref())
                .and_then(|s| s.conditions.as_deref());
            let stored = old.map(|_| NodeView {
                has_metadata: true,
                annotations: stored_annotations,
                conditions: stored_conditions,
                ..NodeView::default()
            });
            // Quiet heartbeats: status updates only (a registration has no stored node); the
            // clock is read only when they are on (the rule ignores a zero refresh).
            let quiet_on = operation == "UPDATE" && !settings.heartbeat_refresh.is_zero();
            let quiet = quiet_on.then(|| Quiet {
                now_ms: settings.clock.now_ms(),
                refresh: settings.heartbeat_refresh,
            });
            // Looked up only when a policy needs it: static policies pay one branch.
            let usage = match &settings.usage {
                Some(source) if policies.has_usage() => match policies.for_node(&node.labels) {
                    NodeChoice::Policy(policy) => policy.usage.as_ref().and_then(|u| {
                        let name = request.name.as_deref()?;
                        source.node_usage(name, u.window)
                    }),
                    _ => None,
                },
                _ => None,
            };
            node::decide_with_usage(
                &node,
                stored.as_ref(),
                policies,
                account,
                quiet,
                usage.as_ref(),
            )
            .map(Decision::Node)
            .map_err(RuleError::from)
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

/// `namespace/name`, `name`, or empty.
fn object_name(name: Option<&str>, namespace: Option<&str>) -> String {
    let name = name.unwrap_or_default();
    match namespace.filter(|n| !n.is_empty()) {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_string(),
    }
}

/// The reason, with which object it was about.
fn describe_object(name: Option<&str>, namespace: Option<&str>, reason: &str) -> String {
    format!("{}{reason}", object_prefix(&object_name(name, namespace)))
}

/// The body of an answer: what serde_json writes for `ReviewOut`, written straight into one
/// buffer of the right size (the patch is base64-encoded in place).
fn answer(
    uid: &str,
    resource: ReviewResource,
    operation: String,
    patch: Option<&[u8]>,
    outcome: Outcome,
) -> Handled {
    Handled {
        status: 200,
        body: review_body(uid, patch),
        resource,
        operation,
        outcome,
        error: None,
        heartbeats_kept: false,
        usage_fallbacks: UsageFallbacks::default(),
    }
}

fn review_body(uid: &str, patch: Option<&[u8]>) -> Vec<u8> {
    const HEAD: &str =
        r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"#;
    const ALLOWED: &str = r#","allowed":true"#;
    const PATCH: &str = r#","patchType":"JSONPatch","patch":""#;
    const TAIL: &str = "}}";
    // Padded base64 (RFC 4648): four characters per started three bytes. The patch is at most
    // a few KB, so this cannot overflow.
    let encoded_len = patch.map_or(0, |p| p.len().div_ceil(3).saturating_mul(4));
    // The uid in quotes, with room for a few escapes.
    let capacity = HEAD.len() + uid.len() + 8 + ALLOWED.len() + PATCH.len() + encoded_len + 1;
    let mut body = Vec::with_capacity(capacity + TAIL.len());
    body.extend_from_slice(HEAD.as_bytes());
    // A string into a Vec cannot fail; should it ever, the answer has an empty uid.
    if patch::write_str(&mut body, uid).is_err() {
        body.truncate(HEAD.len());
        body.extend_from_slice(b"\"\"");
    }
    body.extend_from_slice(ALLOWED.as_bytes());
    if let Some(patch) = patch {
        body.extend_from_slice(PATCH.as_bytes());
        // Vectorised (AVX2/SSE4.1/NEON, chosen at run time) straight into the reserved room,
        // standard alphabet with padding: about a quarter of the scalar encoder's instructions
        // (callgrind, 55 KB review: ~1.6k -> ~0.4k).
        base64_simd::STANDARD.encode_append(patch, &mut body);
        body.push(b'"');
    }
    body.extend_from_slice(TAIL.as_bytes());
    body
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
    let status = StatusOut {
        api_version: "v1",
        kind: "Status",
        status: "Failure",
        message: &message,
        reason: "BadRequest",
        code: 400,
    };
    let body =
        serde_json::to_vec(&status).unwrap_or_else(|_| br#"{"kind":"Status","code":400}"#.to_vec());
    Handled {
        status: 400,
        body,
        resource: ReviewResource::Other,
        operation: String::new(),
        outcome: Outcome::BadRequest,
        error: Some(ReviewError::NotAReview(message)),
        heartbeats_kept: false,
        usage_fallbacks: UsageFallbacks::default(),
    }
}

mod read;

#[cfg(test)]
mod equivalence;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
