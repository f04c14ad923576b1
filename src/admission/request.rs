//! A review as read from its body: what the rules need, with field names (`read` builds it in
//! one pass; `reference` with serde, for the test oracle), and what is told from it alone (the
//! envelope's check, which kind of object it is about, how it is named in log reasons).

use std::borrow::Cow;

use serde::Deserialize;

use overcommit_core::node::heartbeat::Condition;
use overcommit_core::pod::PodSpecIn;
use overcommit_json::StrMap;
use overcommit_json::borrowed;

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

/// The request of a review (a `Deserialize` for the test oracle; `read` builds it field by field).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct RequestIn<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    pub(super) uid: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) kind: Option<KindIn<'a>>,
    #[serde(borrow, default)]
    pub(super) resource: Option<ResourceIn<'a>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    pub(super) sub_resource: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    pub(super) name: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    pub(super) namespace: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    pub(super) operation: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) object: Option<ObjectIn<'a>>,
    #[serde(borrow, default)]
    pub(super) old_object: Option<OldObjectIn<'a>>,
}

#[derive(Deserialize, Default)]
pub(super) struct KindIn<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    pub(super) group: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    pub(super) kind: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Default)]
pub(super) struct ResourceIn<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    pub(super) group: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    pub(super) resource: Option<Cow<'a, str>>,
}

/// A Node or a Pod: the fields of both rules (a node has no containers, a pod no allocatable).
#[derive(Deserialize, Default)]
pub(super) struct ObjectIn<'a> {
    #[serde(borrow, default)]
    pub(super) metadata: Option<MetaIn<'a>>,
    #[serde(borrow, default)]
    pub(super) spec: Option<PodSpecIn<'a>>,
    #[serde(borrow, default)]
    pub(super) status: Option<NodeStatusIn<'a>>,
}

#[derive(Deserialize, Default)]
pub(super) struct OldObjectIn<'a> {
    #[serde(borrow, default)]
    pub(super) metadata: Option<OldMetaIn<'a>>,
    #[serde(borrow, default)]
    pub(super) status: Option<OldStatusIn<'a>>,
}

/// The stored node's conditions (quiet heartbeats).
#[derive(Deserialize, Default)]
pub(super) struct OldStatusIn<'a> {
    #[serde(borrow, default)]
    pub(super) conditions: Option<Vec<Condition<'a>>>,
}

#[derive(Deserialize, Default)]
pub(super) struct MetaIn<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    pub(super) namespace: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str_map")]
    pub(super) labels: Option<StrMap<'a>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str_map")]
    pub(super) annotations: Option<StrMap<'a>>,
}

#[derive(Deserialize, Default)]
pub(super) struct OldMetaIn<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed::option_str_map")]
    pub(super) annotations: Option<StrMap<'a>>,
}

#[derive(Deserialize, Default)]
pub(super) struct NodeStatusIn<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed::option_str_map")]
    pub(super) allocatable: Option<StrMap<'a>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str_map")]
    pub(super) capacity: Option<StrMap<'a>>,
    #[serde(borrow, default)]
    pub(super) conditions: Option<Vec<Condition<'a>>>,
}

pub(super) const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";

/// What reading a body gave.
pub(super) enum Parsed<'a> {
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
pub(super) fn check_envelope(
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

/// Which kind of object the review is about, from the request's `resource` (or its `kind`).
pub(super) fn classify(
    kind: Option<&KindIn<'_>>,
    resource: Option<&ResourceIn<'_>>,
) -> ReviewResource {
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

pub(super) fn object_prefix(object: &str) -> String {
    if object.is_empty() {
        String::new()
    } else {
        format!("{object}: ")
    }
}

/// `namespace/name`, `name`, or empty.
pub(super) fn object_name(name: Option<&str>, namespace: Option<&str>) -> String {
    let name = name.unwrap_or_default();
    match namespace.filter(|n| !n.is_empty()) {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_string(),
    }
}

/// The reason, with which object it was about.
pub(super) fn describe_object(name: Option<&str>, namespace: Option<&str>, reason: &str) -> String {
    format!("{}{reason}", object_prefix(&object_name(name, namespace)))
}
