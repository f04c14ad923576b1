//! The test oracle: the full serde_json parse this crate used before `read` (every value of the
//! body visited, skipped values by `IgnoredAny`), kept verbatim so that `equivalence.rs` can
//! compare the two on real and damaged reviews.

use std::borrow::Cow;

use serde::Deserialize;

use super::request::{
    KindIn, Parsed, RequestIn, ResourceIn, check_envelope, classify, describe_object,
};
use super::{Handled, PolicySet, Settings, respond};

#[derive(Deserialize)]
struct ReviewIn<'a> {
    #[serde(rename = "apiVersion", borrow, default)]
    api_version: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    request: Option<RequestIn<'a>>,
}

/// The same envelope with the objects skipped: to answer (fail open) a review whose object
/// could not be read.
#[derive(Deserialize)]
struct EnvelopeIn<'a> {
    #[serde(rename = "apiVersion", borrow, default)]
    api_version: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    request: Option<RequestEnvelopeIn<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestEnvelopeIn<'a> {
    #[serde(borrow, default)]
    uid: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    kind: Option<KindIn<'a>>,
    #[serde(borrow, default)]
    resource: Option<ResourceIn<'a>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    namespace: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    operation: Option<Cow<'a, str>>,
}

pub(super) fn parse(body: &[u8]) -> Parsed<'_> {
    match serde_json::from_slice::<ReviewIn<'_>>(body) {
        Ok(review) => {
            let uid = review.request.as_ref().and_then(|r| r.uid.as_deref());
            if let Err(message) =
                check_envelope(review.api_version.as_deref(), review.kind.as_deref(), uid)
            {
                return Parsed::Bad(message);
            }
            match review.request {
                Some(request) => Parsed::Review(Box::new(request)),
                None => Parsed::Bad("AdmissionReview has no request".to_string()),
            }
        }
        Err(object_error) => match serde_json::from_slice::<EnvelopeIn<'_>>(body) {
            Ok(envelope) => {
                let request = envelope.request;
                let uid = request.as_ref().and_then(|r| r.uid.as_deref());
                if let Err(message) = check_envelope(
                    envelope.api_version.as_deref(),
                    envelope.kind.as_deref(),
                    uid,
                ) {
                    return Parsed::Bad(message);
                }
                let Some(request) = request else {
                    return Parsed::Bad("AdmissionReview has no request".to_string());
                };
                Parsed::Unreadable {
                    uid: request.uid.as_deref().unwrap_or_default().to_string(),
                    resource: classify(request.kind.as_ref(), request.resource.as_ref()),
                    operation: request.operation.as_deref().unwrap_or_default().to_string(),
                    reason: describe_object(
                        request.name.as_deref(),
                        request.namespace.as_deref(),
                        &format!("object unreadable: {object_error}"),
                    ),
                }
            }
            Err(e) => Parsed::Bad(format!("body is not an AdmissionReview: {e}")),
        },
    }
}

/// `handle` with the reference parse.
pub(super) fn handle(body: &[u8], policies: &PolicySet, settings: &Settings) -> Handled {
    respond(parse(body), policies, settings)
}
