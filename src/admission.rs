//! AdmissionReview in, response out: dispatch to the node and pod rules, and the
//! fail-open wrapper (design.md 3.1). Pure: no I/O.
//!
//! INTERFACE CONTRACT (the server calls exactly this):
//! `handle(body, &policies, &settings) -> Handled`.

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

/// What happened to a review (a metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Patched,
    Unchanged,
    FailedOpen,
    BadRequest,
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

/// Handle one request body. Never panics on any input.
pub fn handle(_body: &[u8], _policies: &PolicySet, _settings: &Settings) -> Handled {
    unimplemented!("issue 3: core helper")
}
