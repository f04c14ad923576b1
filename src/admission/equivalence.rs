//! `read` (the scanning reader) against `reference` (the full serde_json parse it replaced), on
//! every fixture and benchmark payload, rewritten many ways and damaged many ways:
//!
//! - the reference reads the review (200, not failed open): the answer is byte-identical, with
//!   the same outcome, resource, operation and log reason;
//! - the reference fails open or answers 400: the reader does the same (same body), unless the
//!   damage lies inside a value the reader skips (`read/mod.rs` lists what that tolerates); then the
//!   reader's answer is the undamaged review's answer, or an answer without a patch, or 400:
//!   never another patch;
//! - damage in the unread tail (from the status member after allocatable and capacity, or from
//!   `oldObject`, when a node review's decision needs nothing there: `read/mod.rs`), or in the
//!   object's status after its conditions where the reader jumps to `oldObject` (quiet
//!   heartbeats), or in the object's metadata after its annotations where the reader jumps
//!   to the metadata's end: the reader's answer is the undamaged review's, byte for byte.
//!
//! Every policy set is tried with quiet heartbeats off and on (a fixed clock near the
//! fixtures' heartbeats, so that stored ones are kept).

use std::ops::Range;

use base64::Engine as _;
use serde_json::{Value, json};

use super::*;
use overcommit_core::policy::parse_policy_file;
use overcommit_json::scan::{self, Members};
use overcommit_json::testing::Rng;

const FIXTURES: &[(&str, &[u8])] = &[
    (
        "node-status-update",
        include_bytes!("../../tests/fixtures/node-status-update.json"),
    ),
    (
        "node-status-update-large",
        include_bytes!("../../tests/fixtures/node-status-update-large.json"),
    ),
    (
        "node-create",
        include_bytes!("../../tests/fixtures/node-create.json"),
    ),
    (
        "pod-create",
        include_bytes!("../../tests/fixtures/pod-create.json"),
    ),
    (
        "bench node-10k",
        include_bytes!("../../bench/payloads/node-10k.json"),
    ),
    (
        "bench node-55k",
        include_bytes!("../../bench/payloads/node-55k.json"),
    ),
    (
        "bench pod-4k",
        include_bytes!("../../bench/payloads/pod-4k.json"),
    ),
];

/// Policies and settings: what an answer depends on besides the body.
struct Rules {
    policies: PolicySet,
    settings: Settings,
}

impl Rules {
    fn plan(&self) -> ReadPlan {
        read_plan(&self.settings)
    }
}

/// The first is the fixture policies with quiet heartbeats off (the single-set tests use it).
fn policy_sets() -> Vec<(&'static str, Rules)> {
    let parse = |text: &str| match parse_policy_file(text).and_then(PolicySet::new) {
        Ok(set) => set,
        Err(e) => panic!("policies: {e}"),
    };
    let fixture = || parse(include_str!("../../tests/fixtures/policies.yaml"));
    let bench = || parse(include_str!("../../bench/policy.yaml"));
    let rules = |policies, settings| Rules { policies, settings };
    vec![
        ("fixture policies", rules(fixture(), settings())),
        ("bench policy", rules(bench(), settings())),
        ("no policy", rules(PolicySet::default(), settings())),
        (
            "fixture policies, quiet heartbeats",
            rules(fixture(), quiet()),
        ),
        ("bench policy, quiet heartbeats", rules(bench(), quiet())),
    ]
}

fn settings() -> Settings {
    Settings {
        own_namespace: "kube-overcommit".into(),
        ..Settings::default()
    }
}

/// Quiet heartbeats on, at 2026-11-21T21:00:00Z with a refresh of an hour: the stored
/// heartbeats of every fixture (20:58:10) and payload (21:32:14) count as young.
fn quiet() -> Settings {
    Settings {
        heartbeat_refresh: std::time::Duration::from_secs(3600),
        clock: Clock::Fixed(1_795_294_800_000),
        ..settings()
    }
}

/// Everything an answer shows: HTTP status, body, metrics labels, log reason.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    status: u16,
    body: String,
    outcome: Outcome,
    resource: ReviewResource,
    operation: String,
    reason: Option<String>,
}

fn answer_of(handled: Handled) -> Answer {
    Answer {
        status: handled.status,
        body: String::from_utf8_lossy(&handled.body).into_owned(),
        outcome: handled.outcome,
        resource: handled.resource,
        operation: handled.operation,
        reason: handled.error.map(|e| e.to_string()),
    }
}

fn new_answer(body: &[u8], set: &Rules) -> Answer {
    answer_of(handle(body, &set.policies, &set.settings))
}

fn reference_answer(body: &[u8], set: &Rules) -> Answer {
    answer_of(reference::handle(body, &set.policies, &set.settings))
}

/// Both paths, required identical.
fn assert_identical(what: &str, body: &[u8], set: &Rules) -> Answer {
    let reference = reference_answer(body, set);
    let new = new_answer(body, set);
    assert_eq!(
        new,
        reference,
        "{what}\nbody: {}",
        String::from_utf8_lossy(&body[..body.len().min(2000)])
    );
    new
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("not JSON: {e}"))
}

/// Members in or at which the reader may stop reading a node review, or jump from (`read/mod.rs`).
const MAY_STOP_AT: &[&str] = &[
    "request",
    "object",
    "status",
    "allocatable",
    "capacity",
    "conditions",
    "oldObject",
    // The object's metadata after its annotations, jumped over to its end.
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// Whether the reader may stop before the end of this review in some order of its members: a
/// node review whose object carries an overcommit annotation (`read/mod.rs`, the unread tail).
fn reader_may_stop(review: &Value) -> bool {
    let request = &review["request"];
    let node = request["resource"]["resource"] == "nodes" || request["kind"]["kind"] == "Node";
    let annotations = &request["object"]["metadata"]["annotations"];
    node && [node::RAW_ALLOCATABLE_ANNOTATION, node::APPLIED_ANNOTATION]
        .iter()
        .any(|key| annotations.get(key).is_some())
}

/// Writes a JSON value the way no serializer would but JSON allows: members in random order,
/// random whitespace, keys and strings with random `\u` and `\/` escapes, and (outside
/// `oldObject`, which the reader skips) now and then a member written twice.
struct Writer<'r> {
    rng: &'r mut Rng,
    whitespace: bool,
    escapes: bool,
    shuffle: bool,
    duplicates: bool,
    /// The reader may stop before the end of this review (`reader_may_stop`).
    may_stop: bool,
}

impl Writer<'_> {
    fn ws(&mut self, out: &mut Vec<u8>) {
        if self.whitespace {
            for _ in 0..self.rng.below(3) {
                out.push(b" \t\n\r"[self.rng.below(4)]);
            }
        }
    }

    fn string(&mut self, text: &str, out: &mut Vec<u8>) {
        out.push(b'"');
        for c in text.chars() {
            if self.escapes && self.rng.one_in(6) {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.extend_from_slice(format!("\\u{unit:04x}").as_bytes());
                }
            } else if c == '/' && self.escapes && self.rng.one_in(2) {
                out.extend_from_slice(b"\\/");
            } else {
                let escaped = serde_json::to_string(&c.to_string()).unwrap_or_default();
                out.extend_from_slice(&escaped.as_bytes()[1..escaped.len() - 1]);
            }
        }
        out.push(b'"');
    }

    fn value(&mut self, value: &Value, in_old_object: bool, out: &mut Vec<u8>) {
        match value {
            Value::String(s) => self.string(s, out),
            Value::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    self.ws(out);
                    self.value(item, in_old_object, out);
                    self.ws(out);
                }
                out.push(b']');
            }
            Value::Object(map) => {
                let mut members: Vec<(&String, &Value)> = map.iter().collect();
                if self.shuffle {
                    for i in (1..members.len()).rev() {
                        members.swap(i, self.rng.below(i + 1));
                    }
                }
                // Where the reader may stop (the unread tail, `read/mod.rs`), both copies before
                // the members it may stop reading in or at, so that it sees the second copy.
                let stop = members
                    .iter()
                    .position(|(key, _)| self.may_stop && MAY_STOP_AT.contains(&key.as_str()))
                    .unwrap_or(members.len());
                if self.duplicates && !in_old_object && stop > 0 && self.rng.one_in(8) {
                    let again = members[self.rng.below(stop)];
                    members.insert(self.rng.below(stop + 1), again);
                }
                out.push(b'{');
                self.ws(out);
                for (i, (key, item)) in members.into_iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                        self.ws(out);
                    }
                    self.string(key, out);
                    self.ws(out);
                    out.push(b':');
                    self.ws(out);
                    // No duplicates in oldObject, nor in conditions: the reader skips them
                    // where the rules do not need them, without the full parse's field checks
                    // (the documented tolerance).
                    let no_duplicates = in_old_object || key == "oldObject" || key == "conditions";
                    self.value(item, no_duplicates, out);
                    self.ws(out);
                }
                out.push(b'}');
            }
            scalar => out.extend_from_slice(scalar.to_string().as_bytes()),
        }
    }
}

/// The reviews the rules see in practice, from one fixture: as is, and with the decision's
/// inputs varied (no annotations on the object: the oldObject fallback; no oldObject; objects
/// null; an opted-out node; wrong types that fail open).
fn semantic_variants(review: &Value) -> Vec<(String, Value)> {
    let mut out = vec![("as is".to_string(), review.clone())];
    let mut with = |name: &str, edit: &dyn Fn(&mut Value)| {
        let mut v = review.clone();
        edit(&mut v);
        out.push((name.to_string(), v));
    };
    let meta = "/request/object/metadata";
    with("object without annotations", &|v| {
        if let Some(m) = v.pointer_mut(meta).and_then(Value::as_object_mut) {
            m.remove("annotations");
        }
    });
    with(
        "object without annotations, allocatable as stored (the fallback decides)",
        &|v| {
            if let Some(m) = v.pointer_mut(meta).and_then(Value::as_object_mut) {
                m.remove("annotations");
            }
            let stored = v.pointer("/request/oldObject/status/allocatable").cloned();
            if let (Some(stored), Some(status)) = (
                stored,
                v.pointer_mut("/request/object/status")
                    .and_then(Value::as_object_mut),
            ) {
                status.insert("allocatable".into(), stored);
            }
        },
    );
    with("object without metadata", &|v| {
        if let Some(o) = v
            .pointer_mut("/request/object")
            .and_then(Value::as_object_mut)
        {
            o.remove("metadata");
        }
    });
    with("no oldObject", &|v| {
        if let Some(r) = v.pointer_mut("/request").and_then(Value::as_object_mut) {
            r.remove("oldObject");
        }
    });
    with("object and oldObject null", &|v| {
        v["request"]["object"] = Value::Null;
        v["request"]["oldObject"] = Value::Null;
    });
    with(
        "oldObject metadata null, object without annotations",
        &|v| {
            if let Some(m) = v.pointer_mut(meta).and_then(Value::as_object_mut) {
                m.remove("annotations");
            }
            if v["request"].get("oldObject").is_some_and(Value::is_object) {
                v["request"]["oldObject"]["metadata"] = Value::Null;
            }
        },
    );
    with("opted out", &|v| {
        if let Some(m) = v.pointer_mut(meta).and_then(Value::as_object_mut) {
            m.insert(
                "labels".into(),
                json!({"overcommit.dev/disabled": "true", "pool": "batch"}),
            );
        }
    });
    with("label not a string", &|v| {
        if let Some(m) = v.pointer_mut(meta).and_then(Value::as_object_mut) {
            m.insert("labels".into(), json!({"pool": 7}));
        }
    });
    with("allocatable a list", &|v| {
        if let Some(s) = v
            .pointer_mut("/request/object/status")
            .and_then(Value::as_object_mut)
        {
            s.insert("allocatable".into(), json!(["cpu", 8]));
        }
    });
    with("metadata a number", &|v| {
        if let Some(o) = v
            .pointer_mut("/request/object")
            .and_then(Value::as_object_mut)
        {
            o.insert("metadata".into(), json!(5));
        }
    });
    with("subResource a number", &|v| {
        v["request"]["subResource"] = json!(5);
    });
    with("uid a number", &|v| {
        v["request"]["uid"] = json!(5);
    });
    with("request kind a string", &|v| {
        v["request"]["kind"] = json!("Node");
    });
    with("unknown request fields", &|v| {
        v["request"]["options"] = json!({"kind": "UpdateOptions", "fieldManager": "kubelet"});
        v["request"]["dryRun"] = json!(false);
        v["request"]["userInfo"] = json!({"username": "system:node:x", "extra": {"a": ["b"]}});
    });
    with("escapes in read values", &|v| {
        if let Some(m) = v.pointer_mut(meta).and_then(Value::as_object_mut) {
            m.insert(
                "labels".into(),
                json!({"pool": "batch", "tab\there": "quote\"d", "unicode": "é😀"}),
            );
        }
    });
    with("deleted node", &|v| {
        v["request"]["operation"] = json!("DELETE");
        v["request"]["object"] = Value::Null;
    });
    out
}

#[test]
fn written_differently_the_answer_is_identical() {
    let sets = policy_sets();
    let mut rng = Rng(0x0dd5_eed5_1234_5678);
    let mut checked = 0;
    for (fixture, bytes) in FIXTURES {
        for (variant, review) in semantic_variants(&json(bytes)) {
            let forms: Vec<(String, Vec<u8>)> = vec![
                (
                    "compact".into(),
                    serde_json::to_vec(&review).unwrap_or_default(),
                ),
                (
                    "pretty".into(),
                    serde_json::to_vec_pretty(&review).unwrap_or_default(),
                ),
            ];
            let rounds = if bytes.len() > 100_000 { 2 } else { 8 };
            let mut forms = forms;
            for round in 0..rounds {
                let mut out = Vec::new();
                let mut writer = Writer {
                    rng: &mut rng,
                    whitespace: round % 2 == 0,
                    escapes: true,
                    shuffle: true,
                    duplicates: round % 4 == 3,
                    may_stop: reader_may_stop(&review),
                };
                writer.value(&review, false, &mut out);
                forms.push((format!("random {round}"), out));
            }
            for (form, body) in &forms {
                for (policies, set) in &sets {
                    assert_identical(
                        &format!("{fixture} / {variant} / {form} / {policies}"),
                        body,
                        set,
                    );
                    checked += 1;
                }
            }
        }
        // The original bytes too.
        for (_, set) in &sets {
            assert_identical(fixture, bytes, set);
        }
    }
    assert!(checked > 1000, "{checked}");
}

#[test]
fn every_answer_kind_is_covered() {
    // The variants above reach every outcome of both paths, so identity is not vacuous.
    let sets = policy_sets();
    let mut outcomes = std::collections::BTreeSet::new();
    for (_, bytes) in FIXTURES {
        for (_, review) in semantic_variants(&json(bytes)) {
            let body = serde_json::to_vec(&review).unwrap_or_default();
            for (_, set) in &sets {
                outcomes.insert(new_answer(&body, set).outcome.as_str());
            }
        }
    }
    assert_eq!(
        outcomes.into_iter().collect::<Vec<_>>(),
        ["bad-request", "failed-open", "patched", "unchanged"]
    );
}

#[test]
fn escaped_keys_are_the_keys_they_spell() {
    let set = &policy_sets()[0].1;
    let body = FIXTURES[0].1;
    let text = String::from_utf8_lossy(body)
        .replacen("\"object\":", "\"obj\\u0065ct\":", 1)
        .replacen("\"allocatable\":", "\"\\u0061llocatable\":", 1)
        .replacen("\"request\":", "\"r\\u0065quest\":", 1);
    let original = assert_identical("original", body, set);
    let escaped = assert_identical("escaped keys", text.as_bytes(), set);
    assert_eq!(escaped, original);
    assert_eq!(original.outcome, Outcome::Patched);
}

#[test]
fn duplicate_read_fields_answer_as_serde_json_does() {
    let set = &policy_sets()[0].1;
    let body = String::from_utf8_lossy(FIXTURES[2].1).into_owned();
    let cases = [
        ("request", "\"request\":", "\"request\":null,\"request\":"),
        ("uid", "\"uid\":", "\"uid\":\"x\",\"uid\":"),
        ("object", "\"object\":", "\"object\":null,\"object\":"),
        ("labels", "\"labels\":", "\"labels\":{},\"labels\":"),
        (
            "allocatable",
            "\"allocatable\":",
            "\"allocatable\":{},\"allocatable\":",
        ),
    ];
    for (name, from, to) in cases {
        let duplicated = body.replacen(from, to, 1);
        let answer = assert_identical(name, duplicated.as_bytes(), set);
        assert_ne!(answer.outcome, Outcome::Patched, "{name}");
        assert!(
            answer
                .reason
                .is_some_and(|r| r.contains(&format!("duplicate field `{name}`"))),
            "{name}"
        );
    }
}

/// `request.kind` and `request.resource` are read in place when they are plain strings: a
/// repeated member, a member that is not a string, an escape or null answer as serde_json does.
#[test]
fn kind_and_resource_read_in_place_answer_as_serde_json_does() {
    let set = &policy_sets()[0].1;
    let body = String::from_utf8_lossy(FIXTURES[2].1).into_owned();
    let cases = [
        ("\"kind\":{", "\"kind\":{\"kind\":\"Pod\",", true),
        ("\"kind\":{", "\"kind\":{\"group\":\"x\",", true),
        (
            "\"resource\":{",
            "\"resource\":{\"resource\":\"pods\",",
            true,
        ),
        ("\"resource\":{", "\"resource\":{\"group\":null,", true),
        (
            "\"kind\":{",
            "\"kind\":{\"version\":1,\"extra\":[1,{}],",
            false,
        ),
        (
            "\"resource\":{",
            "\"resource\":{\"version\":\"v\\u0031\",\"version\":\"v1\",",
            false,
        ),
        ("\"kind\":{", "\"kind\":null,\"x\":{", false),
    ];
    for (from, to, refused) in cases {
        assert!(body.contains(from), "{from}");
        let changed = body.replacen(from, to, 1);
        let answer = assert_identical(to, changed.as_bytes(), set);
        if refused {
            assert!(
                answer
                    .reason
                    .as_deref()
                    .is_some_and(|r| r.contains("duplicate field")),
                "{to}: {:?}",
                answer.reason
            );
        }
    }
}

#[test]
fn deep_nesting_in_skipped_values_is_skipped_as_serde_json_skips_it() {
    // serde_json's IgnoredAny skips without a nesting limit (its recursion limit applies to
    // what it deserialises); so does the scan, without recursion. A mismatched bracket deep
    // inside is refused by both.
    let set = &policy_sets()[0].1;
    let mut review = json(FIXTURES[0].1);
    review["request"]["object"]["status"]["images"] = json!("PLACEHOLDER");
    review["request"]["options"] = json!("PLACEHOLDER");
    let template = serde_json::to_string(&review).unwrap_or_default();
    for depth in [1, 127, 128, 129, 200, 10_000] {
        let nested = format!("{}1{}", "[{\"a\":".repeat(depth), "}]".repeat(depth));
        let body = template.replace("\"PLACEHOLDER\"", &nested);
        let answer = assert_identical(&format!("nested {depth}"), body.as_bytes(), set);
        assert_eq!(answer.outcome, Outcome::Patched, "{depth}");
        let mismatched = format!("{}1{}]]", "[{\"a\":".repeat(depth), "}]".repeat(depth - 1));
        let body = template.replacen("\"PLACEHOLDER\"", &mismatched, 1);
        let answer = assert_identical(&format!("mismatched {depth}"), body.as_bytes(), set);
        assert_eq!(answer.status, 400, "{depth}");
    }
}

#[test]
fn the_array_form_of_a_review_is_refused() {
    // serde's derive reads a struct from an array of its fields; the API server never sends
    // one, and the reader does not accept it (the documented difference).
    let set = &policy_sets()[0].1;
    let review = json(FIXTURES[2].1);
    let array = json!(["admission.k8s.io/v1", "AdmissionReview", review["request"]]);
    let body = serde_json::to_vec(&array).unwrap_or_default();
    assert_eq!(reference_answer(&body, set).status, 200);
    assert_eq!(new_answer(&body, set).status, 400);
}

/// What `read` reads of a well-formed review beyond the fields it always reads.
#[derive(Clone, Copy, Default)]
struct Reads {
    /// `oldObject` (its annotations, or its conditions).
    old_object: bool,
    /// The object's conditions (quiet heartbeats).
    conditions: bool,
    /// The stored conditions (quiet heartbeats).
    old_conditions: bool,
    /// The stored annotations.
    old_annotations: bool,
}

/// The spans of the values `read` does not look into, in a well-formed review: members of the
/// walked objects it does not read, and `oldObject` unless it reads it.
fn skipped_spans(body: &[u8], set: &Rules) -> Vec<Range<usize>> {
    let reads = match read::parse(body, &set.plan()) {
        Parsed::Review(request) => Reads {
            old_object: request.old_object.is_some(),
            conditions: request
                .object
                .as_ref()
                .and_then(|o| o.status.as_ref())
                .is_some_and(|s| s.conditions.is_some()),
            old_conditions: request
                .old_object
                .as_ref()
                .and_then(|o| o.status.as_ref())
                .is_some_and(|s| s.conditions.is_some()),
            old_annotations: request
                .old_object
                .as_ref()
                .is_some_and(|o| o.metadata.is_some()),
        },
        _ => Reads::default(),
    };
    let mut spans = Vec::new();
    walk(body, 0, &[], reads, &mut spans);
    spans
}

fn walk(
    body: &[u8],
    start: usize,
    path: &[&str],
    reads: Reads,
    spans: &mut Vec<Range<usize>>,
) -> usize {
    let start = scan::skip_ws(body, start);
    let Ok(mut members) = Members::new(body, start) else {
        panic!("not an object at {path:?}")
    };
    while let Ok(Some(member)) = members.next_member() {
        let key = std::str::from_utf8(&member.key).unwrap_or_else(|e| panic!("{e}"));
        let walked: &[&str] = match path {
            [] => &["request"],
            ["request"] if reads.old_object => &["object", "oldObject"],
            ["request"] => &["object"],
            ["request", "object"] => &["metadata", "status"],
            ["request", "oldObject"] => match (reads.old_annotations, reads.old_conditions) {
                (true, true) => &["metadata", "status"],
                (false, true) => &["status"],
                _ => &["metadata"],
            },
            _ => &[],
        };
        let read: &[&str] = match path {
            [] => &["apiVersion", "kind"],
            ["request"] => &[
                "uid",
                "kind",
                "resource",
                "subResource",
                "name",
                "namespace",
                "operation",
            ],
            ["request", "object"] => &["spec"],
            ["request", "object", "metadata"] => &["namespace", "labels", "annotations"],
            ["request", "object", "status"] if reads.conditions => {
                &["allocatable", "capacity", "conditions"]
            }
            ["request", "object", "status"] => &["allocatable", "capacity"],
            ["request", "oldObject", "metadata"] => &["annotations"],
            ["request", "oldObject", "status"] => &["conditions"],
            _ => &[],
        };
        let value_is_object = body.get(member.value_start) == Some(&b'{');
        if walked.contains(&key) && value_is_object {
            let mut inner = path.to_vec();
            inner.push(key);
            let end = walk(body, member.value_start, &inner, reads, spans);
            members.value_read(end);
        } else {
            let Ok(span) = members.skip_value() else {
                panic!("bad value at {path:?}/{key}")
            };
            if !read.contains(&key) && !walked.contains(&key) {
                spans.push(span);
            }
        }
    }
    members.end()
}

/// What `read` does not read at all (the documented tolerance of `read/mod.rs`).
#[derive(Clone, Default)]
struct Unread {
    /// From here to the end.
    from: Option<usize>,
    /// The object's status after its conditions, jumped over (quiet heartbeats); the object's
    /// closing brace and what follows are checked by the jump, so they are not in it.
    middle: Option<Range<usize>>,
    /// The stored node before its conditions, jumped over (quiet heartbeats).
    stored_head: Option<Range<usize>>,
    /// The object's metadata after its annotations, jumped over to its closing brace.
    metadata_tail: Option<Range<usize>>,
}

fn unread(body: &[u8], set: &Rules) -> Unread {
    Unread {
        from: read::unread_from(body, &set.plan()),
        middle: read::unread_middle(body, &set.plan()),
        stored_head: read::unread_stored_head(body, &set.plan()),
        metadata_tail: read::unread_metadata_tail(body, &set.plan()),
    }
}

/// How the damaged bodies came out (printed with --nocapture).
#[derive(Debug, Default)]
struct Tally {
    identical_200: usize,
    both_400: usize,
    tolerated: usize,
    unread_tail: usize,
}

/// One damaged body: identical answers, or a tolerated difference inside a skipped value.
fn check_damaged(
    what: &str,
    body: &[u8],
    damage: Range<usize>,
    (skipped, unread): (&[Range<usize>], Unread),
    undamaged: &Answer,
    set: &Rules,
    tally: &mut Tally,
) {
    let reference = reference_answer(body, set);
    let new = new_answer(body, set);
    if new.status == 200 {
        let review = json(new.body.as_bytes());
        assert_eq!(review["response"]["allowed"], true, "{what}");
    }
    // A 400 names the first fault it found: serde_json and the scan may word or place it
    // differently; what matters is that both refuse.
    let same = new.status == reference.status
        && (reference.status == 400
            || (new.body == reference.body && new.outcome == reference.outcome));
    if same {
        if new.status == 400 {
            tally.both_400 += 1;
        } else {
            tally.identical_200 += 1;
        }
        return;
    }
    let in_middle = [&unread.middle, &unread.stored_head, &unread.metadata_tail]
        .iter()
        .any(|span| span.as_ref().is_some_and(|s| s.contains(&damage.start)));
    if unread.from.is_some_and(|from| damage.start >= from) || in_middle {
        tally.unread_tail += 1;
        assert!(
            new.status == undamaged.status
                && new.body == undamaged.body
                && new.outcome == undamaged.outcome,
            "{what}: damage at {damage:?} in the unread tail changed the answer\nundamaged {undamaged:?}\nnew {new:?}"
        );
        return;
    }
    tally.tolerated += 1;
    let inside_skipped = skipped
        .iter()
        .any(|span| span.start <= damage.start && damage.end <= span.end);
    assert!(
        inside_skipped
            && reference.outcome != Outcome::Patched
            && reference.outcome != Outcome::Unchanged,
        "{what}: damage at {damage:?} outside skipped values\nreference {reference:?}\nnew {new:?}"
    );
    // Tolerated damage never writes anything else: the undamaged answer, or no patch at all.
    // (A quote damaged into another byte flips which bytes are inside strings; the walk that
    // follows is then refused, or, rarely, reads a review without its operation or object.)
    let no_patch = !new.body.contains("\"patch\"");
    assert!(
        new.body == undamaged.body || no_patch || new.status == 400,
        "{what}: damage at {damage:?} changed the patch\nundamaged {undamaged:?}\nnew {new:?}"
    );
}

#[test]
fn a_damaged_quote_in_a_skipped_value_is_refused() {
    // Found by the damage sweep before the scan checked what follows a string: the quote
    // flipped which bytes were inside strings, and the walk went on to read a review with its
    // operation (first case) or its metadata (second case, a different patch) swallowed.
    let cases = [(FIXTURES[0], 270), (FIXTURES[2], 547)];
    for ((name, bytes), at) in cases {
        assert_eq!(bytes[at], b'"', "{name}");
        let mut body = bytes.to_vec();
        body[at] = b'{';
        for (policies, set) in &policy_sets() {
            assert_eq!(
                reference_answer(&body, set).status,
                400,
                "{name} {policies}"
            );
            assert_eq!(new_answer(&body, set).status, 400, "{name} {policies}");
        }
    }
}

#[test]
fn a_bracket_inserted_in_the_last_quantity_map_read_is_refused() {
    // Found by the damage sweep when reading first stopped inside the status: a `}` after the
    // first quantity ends the map early, its other quantities become members of the status, and
    // a reader that stopped at the next member would have patched from the shorter map.
    let set = &policy_sets()[0].1;
    let text = String::from_utf8_lossy(FIXTURES[0].1).into_owned();
    for map in ["\"capacity\":{", "\"allocatable\":{"] {
        let Some(comma) = text
            .find(map)
            .and_then(|at| text[at..].find(',').map(|k| at + k))
        else {
            panic!("fixture without {map}")
        };
        let mut body = text.clone();
        body.insert(comma, '}');
        assert_eq!(reference_answer(body.as_bytes(), set).status, 400, "{map}");
        assert_eq!(new_answer(body.as_bytes(), set).status, 400, "{map}");
    }
}

#[test]
fn truncated_reviews_are_refused_at_every_length_before_the_unread_tail() {
    let set = &policy_sets()[0].1;
    for (name, bytes) in FIXTURES.iter().filter(|(_, b)| b.len() < 10_000) {
        let json_end = bytes.len()
            - bytes
                .iter()
                .rev()
                .take_while(|b| b.is_ascii_whitespace())
                .count();
        // Cut in the unread tail (`read/mod.rs`: past the first byte of the value it starts at), the
        // reader answers as the whole review.
        let unread_from = read::unread_from(bytes, &set.plan()).unwrap_or(json_end);
        let whole = new_answer(bytes, set);
        for end in 0..bytes.len() {
            let new = new_answer(&bytes[..end], set);
            let expected = if end < json_end { 400 } else { 200 };
            assert_eq!(
                reference_answer(&bytes[..end], set).status,
                expected,
                "{name} cut at {end}"
            );
            if end > unread_from {
                assert_eq!(new, whole, "{name} cut at {end}");
            } else {
                assert_eq!(new.status, expected, "{name} cut at {end}");
            }
        }
    }
}

#[test]
fn damaged_reviews_answer_as_serde_json_or_within_the_tolerance() {
    // ADMISSION_DAMAGE_ROUNDS=N repeats the sweep N times with other damages (a longer fuzz).
    let rounds: usize = std::env::var("ADMISSION_DAMAGE_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let sets = policy_sets();
    let mut rng = Rng(0xbad_b17e_5eed_0001);
    let replacements = b"\"{}[],:\\ 0x\xff\x01e-7tn";
    let mut tally = Tally::default();
    for (name, bytes) in FIXTURES.iter().cycle().take(FIXTURES.len() * rounds) {
        let skipped: Vec<Vec<Range<usize>>> = sets
            .iter()
            .map(|(_, set)| skipped_spans(bytes, set))
            .collect();
        assert!(skipped.iter().all(|s| !s.is_empty()), "{name}");
        let unread: Vec<Unread> = sets.iter().map(|(_, set)| unread(bytes, set)).collect();
        // Every position of the small reviews, a sample of the large ones.
        let positions: Vec<usize> = if bytes.len() < 10_000 {
            (0..bytes.len()).collect()
        } else {
            (0..3_000).map(|_| rng.below(bytes.len())).collect()
        };
        for (k, &at) in positions.iter().enumerate() {
            let which = k % sets.len();
            let (policies, set) = &sets[which];
            let undamaged = new_answer(bytes, set);
            let mut body = bytes.to_vec();
            let replacement = replacements[rng.below(replacements.len())];
            let what = match rng.below(3) {
                0 => {
                    body[at] = replacement;
                    format!("{name} [{policies}]: byte {at} -> {replacement:#04x}")
                }
                1 => {
                    body.remove(at);
                    format!("{name} [{policies}]: byte {at} removed")
                }
                _ => {
                    body.insert(at, replacement);
                    format!("{name} [{policies}]: {replacement:#04x} inserted at {at}")
                }
            };
            check_damaged(
                &what,
                &body,
                at..at + 1,
                (&skipped[which], unread[which].clone()),
                &undamaged,
                set,
                &mut tally,
            );
        }
    }
    eprintln!("damaged reviews: {tally:?}");
    // Both kinds of damage are exercised: most is refused, some lands in skipped values.
    assert!(
        tally.both_400 > 1000 && tally.identical_200 > 100 && tally.unread_tail > 100,
        "{tally:?}"
    );
}

#[test]
fn the_tail_after_what_the_decision_needs_is_not_read() {
    // A node status review whose object carries the overcommit annotations: reading stops at
    // the first byte of the value after allocatable and capacity (`conditions`, in the API
    // server's order); a duplicate of a read field, damage or truncation after it is not seen
    // (the documented tolerance). Without the annotations (the fallback reads oldObject) and
    // before the stop, the reader answers as serde_json does.
    let set = &policy_sets()[0].1;
    let body = FIXTURES[0].1;
    let text = String::from_utf8_lossy(body).into_owned();
    let undamaged = assert_identical("original", body, set);
    assert_eq!(undamaged.outcome, Outcome::Patched);
    let Some(from) = read::unread_from(body, &set.plan()) else {
        panic!("reading does not stop early")
    };
    let conditions = "\"conditions\":";
    assert_eq!(
        text.find(conditions).map(|at| at + conditions.len()),
        Some(from)
    );
    let dry_run = "\"dryRun\":";
    let object_end = "}}},\"oldObject\":";
    assert!(text.find(object_end).is_some_and(|at| at > from));

    // (name, body, whether serde_json answers it differently)
    let tails = [
        (
            "uid again",
            text.replacen(dry_run, "\"uid\":\"other\",\"dryRun\":", 1),
            true,
        ),
        (
            "request again",
            format!(
                "{},\"request\":null}}",
                text.trim_end().trim_end_matches('}')
            ),
            true,
        ),
        (
            "allocatable again, after the stop",
            text.replacen(
                conditions,
                "\"conditions\":[],\"allocatable\":{\"cpu\":\"1\"},\"more\":",
                1,
            ),
            true,
        ),
        (
            "metadata again, after status",
            text.replacen(object_end, "}},\"metadata\":{}},\"oldObject\":", 1),
            true,
        ),
        (
            "object again",
            text.replacen(dry_run, "\"object\":null,\"dryRun\":", 1),
            true,
        ),
        (
            "namespace after oldObject (a node has none; only logs would show it)",
            text.replacen(dry_run, "\"namespace\":\"ns\",\"dryRun\":", 1),
            false,
        ),
        (
            "cut in the conditions",
            text[..from + 300].to_string(),
            true,
        ),
        ("cut in oldObject", text[..from + 20_000].to_string(), true),
        (
            "cut after the value's first byte",
            text[..from + 1].to_string(),
            true,
        ),
        ("garbage after", format!("{}}}]x", text.trim_end()), true),
    ];
    for (name, tail, differs) in &tails {
        let new = new_answer(tail.as_bytes(), set);
        assert_eq!(new, undamaged, "{name}");
        assert_eq!(
            reference_answer(tail.as_bytes(), set) != undamaged,
            *differs,
            "{name}"
        );
    }
    // The value itself must begin: a body cut right before it, or a byte there that cannot
    // begin a value, is refused.
    assert_eq!(new_answer(&body[..from], set).status, 400);
    let doubled = text.replacen(conditions, "\"conditions\"::", 1);
    assert_eq!(new_answer(doubled.as_bytes(), set).status, 400);
    // Whitespace right before that value (the API server writes none) is read past; damaged
    // into a byte that can begin a value, it is not seen, as damage at the value's first byte
    // is not (the documented tolerance).
    let spaced = text.replacen(conditions, "\"conditions\": ", 1);
    assert_eq!(
        read::unread_from(spaced.as_bytes(), &set.plan()),
        Some(from + 1)
    );
    assert_eq!(
        assert_identical("space before the value", spaced.as_bytes(), set),
        undamaged
    );
    let damaged = text.replacen(conditions, "\"conditions\":1", 1);
    assert_eq!(new_answer(damaged.as_bytes(), set), undamaged);
    assert_eq!(reference_answer(damaged.as_bytes(), set).status, 400);

    // Before the stop, a duplicate is still refused as serde_json refuses it: in the request,
    // and in the status (fails open, no patch).
    let early = text.replacen("\"operation\":", "\"uid\":\"x\",\"operation\":", 1);
    let answer = assert_identical("uid before oldObject", early.as_bytes(), set);
    assert_eq!(answer.status, 400);
    let early = text.replacen("\"allocatable\":", "\"capacity\":{},\"allocatable\":", 1);
    let answer = assert_identical("capacity twice", early.as_bytes(), set);
    assert_eq!(answer.outcome, Outcome::FailedOpen);

    // A status with nothing after allocatable and capacity is read to its end; reading then
    // stops at oldObject.
    // (Edited as text: serde_json's `Value` would write the members in another order.)
    let (Some(cut), Some(end)) = (text.find(",\"conditions\":"), text.find(object_end)) else {
        panic!("fixture without conditions or oldObject")
    };
    let short = format!("{}{}", &text[..cut], &text[end + 1..]);
    let from = read::unread_from(short.as_bytes(), &set.plan());
    let old_object = short
        .find("\"oldObject\":")
        .map(|at| at + "\"oldObject\":".len());
    assert!(
        from.is_some() && from == old_object,
        "{from:?} {old_object:?}"
    );
    assert_identical("short status", short.as_bytes(), set);

    // The fallback (no overcommit annotation on the object) reads oldObject and the tail.
    let mut review = json(body);
    review["request"]["object"]["metadata"]["annotations"] = json!({});
    let fallback = serde_json::to_string(&review).unwrap_or_default();
    assert_eq!(read::unread_from(fallback.as_bytes(), &set.plan()), None);
    let dup = fallback.replacen(dry_run, "\"uid\":\"other\",\"dryRun\":", 1);
    let answer = assert_identical("fallback, uid again", dup.as_bytes(), set);
    assert_eq!(answer.status, 400);
    // A pod review is read to its end.
    assert_eq!(read::unread_from(FIXTURES[3].1, &set.plan()), None);
}

#[test]
fn the_metadata_after_the_annotations_is_jumped_over_only_where_the_status_follows() {
    // A node review of an inflated node as the API server writes it: the object's managedFields
    // are jumped over to the metadata's closing brace, with every policy set.
    let body = FIXTURES[5].1; // bench node-55k
    let text = String::from_utf8_lossy(body).into_owned();
    let managed = text
        .find("\"managedFields\":")
        .map(|at| at + "\"managedFields\":".len());
    let brace = text.find("},\"spec\":").map(|at| at + 1);
    for (policies, set) in &policy_sets() {
        let tail = read::unread_metadata_tail(body, &set.plan());
        assert_eq!(
            tail.map(|t| (t.start, t.end)),
            managed.zip(brace),
            "{policies}: managedFields' value to the metadata's closing brace, included"
        );
        assert_identical(policies, body, set);
    }
    let set = &policy_sets()[0].1;
    // The object's members in another order: the status between the metadata and the spec
    // (so `},"spec":` first follows the status), or no spec at all (so it first follows the
    // stored node's metadata): the object is read again, or stepped through, as before.
    let spec = ",\"spec\":{}";
    assert_eq!(
        text.matches(spec).count(),
        2,
        "the object's spec and the stored node's"
    );
    let no_spec = text.replacen(spec, "", 1);
    let status_then_spec =
        no_spec.replacen("}},\"oldObject\":", "},\"spec\":{}},\"oldObject\":", 1);
    assert_ne!(status_then_spec, no_spec);
    for (name, variant) in [
        ("status before spec", &status_then_spec),
        ("no spec", &no_spec),
    ] {
        let body = variant.as_bytes();
        let answer = assert_identical(name, body, set);
        assert_eq!(answer.outcome, Outcome::Patched, "{name}");
        assert_eq!(
            read::unread_metadata_tail(body, &set.plan()),
            None,
            "{name}: not jumped"
        );
    }
}

#[test]
fn quiet_heartbeats_jump_over_the_object_to_the_stored_conditions() {
    // A node status review of an inflated node, as the API server writes it: with quiet
    // heartbeats the reader reads the object's conditions, jumps from the status member after
    // them to `oldObject`, reads the stored conditions and stops at the status member after
    // those. The answer is the full parse's, with the stored heartbeats put back.
    let sets = policy_sets();
    let (_, quiet_rules) = &sets[3];
    let body = FIXTURES[0].1;
    let text = String::from_utf8_lossy(body).into_owned();
    let answer = assert_identical("quiet heartbeats", body, quiet_rules);
    assert_eq!(answer.outcome, Outcome::Patched);
    let review = json(answer.body.as_bytes());
    let patch = base64::engine::general_purpose::STANDARD
        .decode(review["response"]["patch"].as_str().unwrap_or_default())
        .unwrap_or_default();
    let patch = String::from_utf8_lossy(&patch);
    assert!(
        patch.contains(
            r#""path":"/status/conditions/0/lastHeartbeatTime","value":"2026-11-21T20:58:10Z""#
        ),
        "{patch}"
    );
    let middle = read::unread_middle(body, &quiet_rules.plan());
    let addresses = text
        .find("\"addresses\":")
        .map(|at| at + "\"addresses\":".len());
    let object_end = text.find("}},\"oldObject\":");
    assert_eq!(
        middle.as_ref().map(|m| (m.start, m.end)),
        addresses.zip(object_end.map(|at| at + 2)),
        "from the value after the conditions to the object's closing brace, included"
    );
    let from = read::unread_from(body, &quiet_rules.plan());
    let old_addresses = text
        .rfind("\"addresses\":")
        .map(|at| at + "\"addresses\":".len());
    assert_eq!(from, old_addresses, "stops after the stored conditions");
    let old_object = text
        .find("\"oldObject\":")
        .map(|at| at + "\"oldObject\":".len());
    let old_conditions = text
        .rfind("\"conditions\":[")
        .map(|at| at + "\"conditions\":".len());
    assert_eq!(
        read::unread_stored_head(body, &quiet_rules.plan()).map(|m| (m.start, m.end)),
        old_object.zip(old_conditions),
        "the stored node before its conditions is jumped over"
    );

    // Damage or a duplicate in the jumped-over part is not seen (the documented tolerance).
    let images = text.find("\"images\":").unwrap_or_default();
    for (name, damaged) in [
        (
            "garbage in the images",
            text.replacen("\"images\":", "\"images\":]]", 1),
        ),
        ("allocatable again, after the conditions", {
            let mut t = text.clone();
            t.insert_str(images, "\"allocatable\":{\"cpu\":\"1\"},");
            t
        }),
    ] {
        assert_eq!(
            new_answer(damaged.as_bytes(), quiet_rules),
            answer,
            "{name}"
        );
        assert_ne!(
            reference_answer(damaged.as_bytes(), quiet_rules),
            answer,
            "{name}"
        );
    }
    // Written any other way (a space before oldObject), the object is read whole: same answer.
    let spaced = text.replacen("}},\"oldObject\":", "}}, \"oldObject\":", 1);
    assert_eq!(
        read::unread_middle(spaced.as_bytes(), &quiet_rules.plan()),
        None
    );
    assert_eq!(
        assert_identical("spaced", spaced.as_bytes(), quiet_rules),
        answer
    );
    // The object's closing brace is checked by the jump: damaged, the body is refused.
    let unclosed = text.replacen("}},\"oldObject\":", "} ,\"oldObject\":", 1);
    assert_eq!(new_answer(unclosed.as_bytes(), quiet_rules).status, 400);

    // The 55 KB payload: the same path.
    let body = FIXTURES[5].1;
    let (_, bench_quiet) = &sets[4];
    assert!(read::unread_middle(body, &bench_quiet.plan()).is_some());
    assert_eq!(
        assert_identical("55k", body, bench_quiet).outcome,
        Outcome::Patched
    );
}

#[test]
fn object_conditions_are_compared_with_the_stored_ones_where_only_heartbeats_differ() {
    // The object's conditions are taken from the stored node's (read ahead) when the two arrays
    // are the same bytes but for the heartbeat times; any other difference, or a time written
    // another way, reads them as any other array. Either way the answer is the full parse's.
    let sets = policy_sets();
    let (_, quiet_rules) = &sets[3];
    let text = String::from_utf8_lossy(FIXTURES[0].1).into_owned();
    let positions = |text: &str| {
        let object = text.find("\"object\":{").map(|at| at + "\"object\":".len());
        let conditions = text
            .find("\"conditions\":[")
            .map(|at| at + "\"conditions\":".len());
        object
            .zip(conditions)
            .unwrap_or_else(|| panic!("fixture without object or conditions"))
    };
    let compared = |text: &str| {
        let (object, conditions) = positions(text);
        read::conditions_compared(text.as_bytes(), object, conditions)
    };
    let stored = "\"lastHeartbeatTime\":\"2026-11-21T20:58:10Z\"";
    let (object, conditions) = positions(&text);
    let first_heartbeat = text[conditions..]
        .find("\"lastHeartbeatTime\":\"")
        .map(|at| conditions + at);
    let Some(first_heartbeat) = first_heartbeat else {
        panic!("fixture without heartbeats");
    };
    assert!(object < first_heartbeat);
    // As the kubelet sends it: new times.
    let newer = |text: &str, time: &str| {
        let mut out = text.to_string();
        let at = first_heartbeat + "\"lastHeartbeatTime\":\"".len();
        let end = out[at..].find('"').map(|k| at + k).unwrap_or(at);
        out.replace_range(at..end, time);
        out
    };
    let times = [
        ("a new heartbeat", "2026-11-21T20:59:50Z", true),
        (
            "a longer heartbeat",
            "2026-11-21T20:59:50.123456+01:00",
            true,
        ),
        ("an empty heartbeat", "", true),
        ("an escaped heartbeat", "2026-11-21T20:59:50\\u005a", false),
        // Any string without escapes reads as the same string either way.
        ("a heartbeat with a space", "2026-11-21 20:59:50Z", true),
    ];
    let mut cases: Vec<(&str, String, bool)> = times
        .iter()
        .map(|&(name, time, expected)| (name, newer(&text, time), expected))
        .collect();
    cases.push(("as sent", text.clone(), true));
    let mut changed = text.clone();
    let message = changed[conditions..].find("\"message\":\"");
    changed.insert_str(message.map_or(conditions, |k| conditions + k + 11), "now ");
    cases.push(("a changed message", changed, false));
    // The same change to both arrays: read ahead whichever way the stored one is written.
    let both = |from: &str, to: &str| {
        assert!(text.matches(from).count() >= 2, "{from}");
        text.replace(from, to)
    };
    let message = "\"message\":\"kubelet has sufficient memory available\"";
    cases.push((
        "messages holding what ends a condition",
        both(
            message,
            r#""message":"a}],\"status\":{\"type\":\"}],{\"type\":\"b""#,
        ),
        true,
    ));
    cases.push((
        "messages ending with a bracket",
        both(message, r#""message":"a],""#),
        true,
    ));
    cases.push((
        "a condition written in another order",
        both(
            "\"type\":\"MemoryPressure\",\"status\":\"False\"",
            "\"status\":\"False\",\"type\":\"MemoryPressure\"",
        ),
        true,
    ));
    cases.push((
        "a condition with whitespace",
        both(
            "\"type\":\"MemoryPressure\",",
            "\"type\": \"MemoryPressure\" ,",
        ),
        true,
    ));
    for (name, body, expected) in cases {
        assert_eq!(compared(&body).is_some(), expected, "{name}");
        assert_identical(name, body.as_bytes(), quiet_rules);
    }
    assert!(text.contains(stored));
    let times = compared(&newer(&text, "2026-11-21T20:59:50Z")).unwrap_or_default();
    assert_eq!(
        times.first(),
        Some(&Some("2026-11-21T20:59:50Z".to_string()))
    );
    // The 55 KB payload takes the same path.
    let text = String::from_utf8_lossy(FIXTURES[5].1).into_owned();
    assert!(compared(&text).is_some());
}

#[test]
fn stored_annotations_are_read_whatever_the_stored_node_s_order() {
    // An object without annotations (a status writer that sent none) has the stored node's
    // annotations decide; with quiet heartbeats the stored node is read for its conditions too,
    // and reading may stop after them, but not before the annotations are read, even where
    // the stored node is written with its status first (the API server writes metadata first).
    // Edited as text: the request's members keep their order (a map would sort them).
    let sets = policy_sets();
    let (_, quiet_rules) = &sets[3];
    let text = String::from_utf8_lossy(FIXTURES[0].1).into_owned();
    let value_span = |text: &str, key: &str, nth_from_end: bool| {
        let found = if nth_from_end {
            text.rfind(key)
        } else {
            text.find(key)
        };
        let Some(start) = found.map(|at| at + key.len()) else {
            panic!("fixture without {key}");
        };
        match overcommit_json::scan::skip_value(text.as_bytes(), start) {
            Ok(end) => start..end,
            Err(e) => panic!("{key}: {e:?}"),
        }
    };
    // The object's annotations go (the first ones: the object comes before oldObject) ...
    let annotations = value_span(&text, "\"annotations\":", false);
    let mut edited = text.clone();
    edited.replace_range(
        annotations.start - "\"annotations\":".len()..annotations.end + 1,
        "",
    );
    // ... and its allocatable is the stored (inflated) one: only the stored raw annotation
    // tells it from a kubelet's own value.
    let stored_allocatable = edited[value_span(&edited, "\"allocatable\":", true)].to_string();
    let allocatable = value_span(&edited, "\"allocatable\":", false);
    edited.replace_range(allocatable, &stored_allocatable);
    let old_span = value_span(&edited, "\"oldObject\":", false);
    let Ok(old) = serde_json::from_str::<Value>(&edited[old_span.clone()]) else {
        panic!("oldObject is not JSON");
    };
    let member = |name: &str| format!("{}:{}", Value::from(name), old[name]);
    let status_first = format!(
        "{{{},{},{},{}}}",
        member("status"),
        member("metadata"),
        member("kind"),
        member("apiVersion")
    );
    let mut reordered = edited.clone();
    reordered.replace_range(old_span, &status_first);
    for (name, body) in [("metadata first", &edited), ("status first", &reordered)] {
        let answer = assert_identical(name, body.as_bytes(), quiet_rules);
        assert_eq!(answer.outcome, Outcome::Patched, "{name}");
    }
}
