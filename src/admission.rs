//! AdmissionReview in, response out: dispatch to the node and pod rules, and the
//! fail-open wrapper (design.md 3.1). Pure: no I/O.
//!
//! INTERFACE CONTRACT (the server calls exactly this):
//! `handle(body, &policies, &settings) -> Handled`.
//!
//! - A body that is not an admission.k8s.io/v1 AdmissionReview with a request and a uid:
//!   status 400, a Kubernetes `Status` JSON with the reason, outcome `BadRequest`.
//! - Every valid review: status 200 and `allowed: true`, the request's uid echoed. A review of a
//!   node is never refused. Any error inside (an unreadable object, a quantity that does not
//!   parse, even a bug that panics) answers allowed with no patch: outcome `FailedOpen`;
//!   `handle_with_reason` also returns the reason, for the log.
//! - Nodes: `CREATE nodes` and `UPDATE nodes/status` go through `inflate`; pods: `CREATE pods`
//!   through `pods`; anything else is allowed unchanged.
//!
//! Speed: a node review carries the whole Node twice (20-200 KB). `read` deserialises only the
//! fields the rules read (labels, annotations, allocatable, capacity, container resources), from
//! their own slices of the body; everything else (images, conditions, managedFields, the stored
//! `oldObject` unless the node rule needs its annotations) is stepped over by `scan` without
//! being built or visited token by token.

use std::borrow::Cow;
use std::panic::{AssertUnwindSafe, catch_unwind};

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::inflate::{self, Account, NodeDecision, NodeView, StrMap};
use crate::patch::{self, PatchOp};
use crate::pods::{self, PodDecision, PodSpecIn};
use crate::policy::PolicySet;

/// Settings that are not policies (namespace of the webhook itself, ...).
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// The webhook's own namespace: its pods are never touched.
    pub own_namespace: String,
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
}

// ---- what is read from a review -------------------------------------------------------------

/// The request of a review (a `Deserialize` for the test oracle; `read` builds it field by field).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RequestIn<'a> {
    #[serde(borrow, default, deserialize_with = "crate::borrowed::option_str")]
    uid: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    kind: Option<KindIn<'a>>,
    #[serde(borrow, default)]
    resource: Option<ResourceIn<'a>>,
    #[serde(borrow, default, deserialize_with = "crate::borrowed::option_str")]
    sub_resource: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "crate::borrowed::option_str")]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "crate::borrowed::option_str")]
    namespace: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "crate::borrowed::option_str")]
    operation: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    object: Option<ObjectIn<'a>>,
    #[serde(borrow, default)]
    old_object: Option<OldObjectIn<'a>>,
}

#[derive(Deserialize, Default)]
struct KindIn<'a> {
    #[serde(borrow, default, deserialize_with = "crate::borrowed::option_str")]
    group: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "crate::borrowed::option_str")]
    kind: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Default)]
struct ResourceIn<'a> {
    #[serde(borrow, default, deserialize_with = "crate::borrowed::option_str")]
    group: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "crate::borrowed::option_str")]
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
}

#[derive(Deserialize, Default)]
struct MetaIn<'a> {
    #[serde(borrow, default, deserialize_with = "crate::borrowed::option_str")]
    namespace: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "crate::borrowed::option_str_map")]
    labels: Option<StrMap<'a>>,
    #[serde(borrow, default, deserialize_with = "crate::borrowed::option_str_map")]
    annotations: Option<StrMap<'a>>,
}

#[derive(Deserialize, Default)]
struct OldMetaIn<'a> {
    #[serde(borrow, default, deserialize_with = "crate::borrowed::option_str_map")]
    annotations: Option<StrMap<'a>>,
}

#[derive(Deserialize, Default)]
struct NodeStatusIn<'a> {
    #[serde(borrow, default, deserialize_with = "crate::borrowed::option_str_map")]
    allocatable: Option<StrMap<'a>>,
    #[serde(borrow, default, deserialize_with = "crate::borrowed::option_str_map")]
    capacity: Option<StrMap<'a>>,
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

/// Handle one request body. Never panics on any input.
pub fn handle(body: &[u8], policies: &PolicySet, settings: &Settings) -> Handled {
    handle_with_reason(body, policies, settings).0
}

/// `handle`, plus for `FailedOpen` and `BadRequest` what went wrong (which object, why), for
/// the log. The reason holds no secret material: names, resource names and quantities.
pub fn handle_with_reason(
    body: &[u8],
    policies: &PolicySet,
    settings: &Settings,
) -> (Handled, Option<String>) {
    respond(read::parse(body), policies, settings)
}

/// The answer for a parsed body.
fn respond(
    parsed: Parsed<'_>,
    policies: &PolicySet,
    settings: &Settings,
) -> (Handled, Option<String>) {
    let request = match parsed {
        Parsed::Review(request) => request,
        Parsed::Unreadable {
            uid,
            resource,
            operation,
            reason,
        } => {
            return fail_open(&uid, resource, operation, reason);
        }
        Parsed::Bad(message) => return bad_request(&message),
    };
    let uid = request.uid.as_deref().unwrap_or_default();
    let resource = classify(request.kind.as_ref(), request.resource.as_ref());
    let operation = request.operation.as_deref().unwrap_or_default().to_string();
    let decided = catch_unwind(AssertUnwindSafe(|| {
        decide_request(&request, resource, policies, settings, Account::PatchOnly)
    }));
    let decision = match decided {
        Ok(Ok(decision)) => decision,
        Ok(Err(reason)) => return fail_open(uid, resource, operation, describe(&request, &reason)),
        Err(_) => {
            return fail_open(
                uid,
                resource,
                operation,
                describe(&request, "internal error (panic)"),
            );
        }
    };
    let ops = decision.patch();
    if ops.is_empty() {
        return (
            answer(uid, resource, operation, None, Outcome::Unchanged),
            None,
        );
    }
    match patch::to_json(ops) {
        Ok(json) => (
            answer(uid, resource, operation, Some(&json), Outcome::Patched),
            None,
        ),
        Err(e) => fail_open(
            uid,
            resource,
            operation,
            describe(&request, &format!("patch: {e}")),
        ),
    }
}

/// The decision for a review (for `review --explain`), or why there is none.
pub fn explain(body: &[u8], policies: &PolicySet, settings: &Settings) -> Result<Decision, String> {
    match read::parse(body) {
        Parsed::Review(request) => {
            let resource = classify(request.kind.as_ref(), request.resource.as_ref());
            decide_request(&request, resource, policies, settings, Account::Full)
                .map_err(|e| describe(&request, &e))
        }
        Parsed::Unreadable { reason, .. } => Err(reason),
        Parsed::Bad(message) => Err(message),
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
) -> Result<Decision, String> {
    let operation = request.operation.as_deref().unwrap_or_default();
    let sub_resource = request.sub_resource.as_deref().unwrap_or_default();
    match (resource, operation, sub_resource) {
        (ReviewResource::Node, "CREATE", "") | (ReviewResource::Node, "UPDATE", "status") => {
            let Some(object) = request.object.as_ref() else {
                return Err("node review without an object".to_string());
            };
            let node = node_view(object);
            let stored_annotations = request
                .old_object
                .as_ref()
                .and_then(|old| old.metadata.as_ref())
                .and_then(|m| m.annotations.as_ref());
            let stored = stored_annotations.map(|annotations| NodeView {
                has_metadata: true,
                annotations: Some(annotations),
                ..NodeView::default()
            });
            inflate::decide_with(&node, stored.as_ref(), policies, account)
                .map(Decision::Node)
                .map_err(|e| e.to_string())
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
            pods::decide_with(namespace, &settings.own_namespace, spec, policies, account)
                .map(Decision::Pod)
                .map_err(|e| e.to_string())
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
    }
}

/// The reason, with which object it was about.
fn describe(request: &RequestIn<'_>, reason: &str) -> String {
    describe_object(
        request.name.as_deref(),
        request.namespace.as_deref(),
        reason,
    )
}

fn describe_object(name: Option<&str>, namespace: Option<&str>, reason: &str) -> String {
    let name = name.unwrap_or_default();
    match namespace.filter(|n| !n.is_empty()) {
        Some(namespace) => format!("{namespace}/{name}: {reason}"),
        None if !name.is_empty() => format!("{name}: {reason}"),
        None => reason.to_string(),
    }
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
    }
}

fn review_body(uid: &str, patch: Option<&[u8]>) -> Vec<u8> {
    const HEAD: &str =
        r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"#;
    const ALLOWED: &str = r#","allowed":true"#;
    const PATCH: &str = r#","patchType":"JSONPatch","patch":""#;
    const TAIL: &str = "}}";
    let engine = &base64::engine::general_purpose::STANDARD;
    let encoded_len = patch.map_or(0, |p| base64::encoded_len(p.len(), true).unwrap_or(0));
    // The uid in quotes, with room for a few escapes.
    let capacity = HEAD.len() + uid.len() + 8 + ALLOWED.len() + PATCH.len() + encoded_len + 1;
    let mut body = Vec::with_capacity(capacity + TAIL.len());
    body.extend_from_slice(HEAD.as_bytes());
    // A string into a Vec cannot fail; should it ever, the answer has an empty uid.
    if serde_json::to_writer(&mut body, uid).is_err() {
        body.truncate(HEAD.len());
        body.extend_from_slice(b"\"\"");
    }
    body.extend_from_slice(ALLOWED.as_bytes());
    if let Some(patch) = patch {
        body.extend_from_slice(PATCH.as_bytes());
        let start = body.len();
        body.resize(start + encoded_len, 0);
        let written = body
            .get_mut(start..)
            .map(|out| engine.encode_slice(patch, out));
        match written {
            Some(Ok(n)) if n == encoded_len => {}
            // Cannot happen (the length is base64's own); should it, encode the slow way, so
            // that the answer still carries the patch its outcome says it carries.
            _ => {
                body.truncate(start);
                body.extend_from_slice(engine.encode(patch).as_bytes());
            }
        }
        body.push(b'"');
    }
    body.extend_from_slice(TAIL.as_bytes());
    body
}

fn fail_open(
    uid: &str,
    resource: ReviewResource,
    operation: String,
    reason: String,
) -> (Handled, Option<String>) {
    (
        answer(uid, resource, operation, None, Outcome::FailedOpen),
        Some(reason),
    )
}

fn bad_request(message: &str) -> (Handled, Option<String>) {
    let status = StatusOut {
        api_version: "v1",
        kind: "Status",
        status: "Failure",
        message,
        reason: "BadRequest",
        code: 400,
    };
    let body =
        serde_json::to_vec(&status).unwrap_or_else(|_| br#"{"kind":"Status","code":400}"#.to_vec());
    let handled = Handled {
        status: 400,
        body,
        resource: ReviewResource::Other,
        operation: String::new(),
        outcome: Outcome::BadRequest,
    };
    (handled, Some(message.to_string()))
}

mod read;
pub(crate) mod scan;

#[cfg(test)]
mod equivalence;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
