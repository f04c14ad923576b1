//! Fixture-driven tests of the whole review path: real-sized AdmissionReviews in, the
//! AdmissionReview response out, the patch applied and reviewed again.

use base64::Engine as _;
use serde_json::{Value, json};

use super::answer::{ResponseOut, ReviewOut, review_body};
use super::request::REVIEW_API_VERSION;
use super::*;
use overcommit_core::policy::parse_policy_file;

const NODE_STATUS_UPDATE: &[u8] = include_bytes!("../../tests/fixtures/node-status-update.json");
const NODE_STATUS_UPDATE_LARGE: &[u8] =
    include_bytes!("../../tests/fixtures/node-status-update-large.json");
const NODE_CREATE: &[u8] = include_bytes!("../../tests/fixtures/node-create.json");
const POD_CREATE: &[u8] = include_bytes!("../../tests/fixtures/pod-create.json");
const POLICIES: &str = include_str!("../../tests/fixtures/policies.yaml");

fn policies() -> PolicySet {
    match parse_policy_file(POLICIES).and_then(PolicySet::new) {
        Ok(set) => set,
        Err(e) => panic!("fixture policies: {e}"),
    }
}

fn settings() -> Settings {
    Settings {
        own_namespace: "kube-overcommit".into(),
        ..Settings::default()
    }
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("not JSON: {e}"))
}

fn to_bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

/// The response of a 200 answer, checked for the parts every answer must have.
fn response(handled: &Handled, request: &Value) -> Value {
    assert_eq!(
        handled.status,
        200,
        "{}",
        String::from_utf8_lossy(&handled.body)
    );
    let review = json(&handled.body);
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(review["kind"], "AdmissionReview");
    assert_eq!(
        review["response"]["uid"], request["request"]["uid"],
        "uid echoed"
    );
    assert_eq!(review["response"]["allowed"], true);
    review["response"].clone()
}

/// The decoded JSON Patch of a response (empty if none).
fn patch_of(response: &Value) -> json_patch::Patch {
    let Some(encoded) = response.get("patch").and_then(Value::as_str) else {
        assert!(
            response.get("patchType").is_none(),
            "patchType without patch"
        );
        return json_patch::Patch(vec![]);
    };
    assert_eq!(response["patchType"], "JSONPatch");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap_or_else(|e| panic!("patch is not base64: {e}"));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("patch is not a JSON patch: {e}"))
}

/// Apply the response's patch to request.object; the result replaces object (and oldObject, as
/// the API server would store it before the next write).
fn next_review(request: &Value, response: &Value) -> Value {
    let mut object = request["request"]["object"].clone();
    if let Err(e) = json_patch::patch(&mut object, &patch_of(response)) {
        panic!("patch does not apply: {e}");
    }
    let mut next = request.clone();
    next["request"]["object"] = object.clone();
    if next["request"].get("oldObject").is_some() {
        next["request"]["oldObject"] = object;
    }
    next
}

fn allocatable(review: &Value, which: &str, resource: &str) -> String {
    review["request"][which]["status"]["allocatable"][resource]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn kubelet_status_update_is_inflated_from_its_raw_value() {
    let set = policies();
    for fixture in [NODE_STATUS_UPDATE, NODE_STATUS_UPDATE_LARGE] {
        let request = json(fixture);
        let handled = handle(fixture, &set, &settings());
        assert_eq!(
            (
                handled.resource,
                handled.operation.as_str(),
                handled.outcome
            ),
            (ReviewResource::Node, "UPDATE", Outcome::Patched)
        );
        let response = response(&handled, &request);
        let patch = serde_json::to_value(patch_of(&response)).unwrap_or_default();
        // Only allocatable changes: the annotations already say what the previous review wrote.
        assert_eq!(
            patch,
            json!([
                {"op": "replace", "path": "/status/allocatable/cpu", "value": "15820m"},
                {"op": "replace", "path": "/status/allocatable/memory", "value": "47087574Ki"},
            ])
        );
        // Stored, then reviewed again (the next status write by anyone else): nothing to do.
        let next = next_review(&request, &response);
        assert_eq!(allocatable(&next, "object", "cpu"), "15820m");
        let again = handle(&to_bytes(&next), &set, &settings());
        assert_eq!(again.outcome, Outcome::Unchanged);
        assert!(response_of(&again, &next).get("patch").is_none());
    }
}

fn response_of(handled: &Handled, request: &Value) -> Value {
    response(handled, request)
}

#[test]
fn someone_elses_status_write_leaves_the_node_alone() {
    // A controller updates a condition: allocatable is what this webhook last wrote.
    let mut request = json(NODE_STATUS_UPDATE);
    request["request"]["object"]["status"]["allocatable"] =
        request["request"]["oldObject"]["status"]["allocatable"].clone();
    request["request"]["userInfo"] =
        json!({"username": "system:serviceaccount:kube-system:node-problem-detector"});
    let handled = handle(&to_bytes(&request), &policies(), &settings());
    assert_eq!(handled.outcome, Outcome::Unchanged);
}

#[test]
fn kubelet_new_raw_value_is_taken_as_raw() {
    let mut request = json(NODE_STATUS_UPDATE);
    request["request"]["object"]["status"]["allocatable"]["cpu"] = json!("7");
    let handled = handle(&to_bytes(&request), &policies(), &settings());
    let response = response(&handled, &request);
    let next = next_review(&request, &response);
    assert_eq!(allocatable(&next, "object", "cpu"), "14");
    let raw = next["request"]["object"]["metadata"]["annotations"]
        [overcommit_core::node::RAW_ALLOCATABLE_ANNOTATION]
        .as_str();
    assert_eq!(raw, Some("cpu=7,memory=31391716Ki"));
}

#[test]
fn policy_removed_restores_raw_and_removes_annotations() {
    let request = json(NODE_STATUS_UPDATE);
    // The kubelet's patch carries raw; then a write by someone else carries the stored value.
    for which in ["raw", "stored"] {
        let mut request = request.clone();
        if which == "stored" {
            request["request"]["object"]["status"]["allocatable"] =
                request["request"]["oldObject"]["status"]["allocatable"].clone();
        }
        let handled = handle(&to_bytes(&request), &PolicySet::default(), &settings());
        let response = response(&handled, &request);
        let next = next_review(&request, &response);
        assert_eq!(allocatable(&next, "object", "cpu"), "7910m", "{which}");
        assert_eq!(
            allocatable(&next, "object", "memory"),
            "31391716Ki",
            "{which}"
        );
        let annotations = &next["request"]["object"]["metadata"]["annotations"];
        assert!(
            annotations.get("overcommit.dev/applied").is_none(),
            "{which}"
        );
        assert!(
            annotations.get("overcommit.dev/raw-allocatable").is_none(),
            "{which}"
        );
        assert_eq!(
            annotations["node.alpha.kubernetes.io/ttl"], "0",
            "other annotations stay"
        );
        let again = handle(&to_bytes(&next), &PolicySet::default(), &settings());
        assert_eq!(again.outcome, Outcome::Unchanged, "{which}");
    }
}

#[test]
fn opted_out_node_gets_its_raw_value() {
    let mut request = json(NODE_STATUS_UPDATE);
    request["request"]["object"]["metadata"]["labels"]["overcommit.dev/disabled"] = json!("true");
    request["request"]["object"]["status"]["allocatable"] =
        request["request"]["oldObject"]["status"]["allocatable"].clone();
    let handled = handle(&to_bytes(&request), &policies(), &settings());
    let next = next_review(&request, &response(&handled, &request));
    assert_eq!(allocatable(&next, "object", "cpu"), "7910m");
}

#[test]
fn registration_create_is_inflated_and_annotated() {
    let request = json(NODE_CREATE);
    let handled = handle(NODE_CREATE, &policies(), &settings());
    assert_eq!(
        (
            handled.resource,
            handled.operation.as_str(),
            handled.outcome
        ),
        (ReviewResource::Node, "CREATE", Outcome::Patched)
    );
    let response = response(&handled, &request);
    let next = next_review(&request, &response);
    assert_eq!(allocatable(&next, "object", "cpu"), "15820m");
    assert_eq!(allocatable(&next, "object", "memory"), "47087574Ki");
    assert_eq!(allocatable(&next, "object", "pods"), "110");
    assert_eq!(
        next["request"]["object"]["status"]["capacity"],
        request["request"]["object"]["status"]["capacity"],
        "capacity untouched"
    );
    let annotations = &next["request"]["object"]["metadata"]["annotations"];
    assert_eq!(
        annotations["overcommit.dev/raw-allocatable"],
        "cpu=7910m,memory=31391716Ki"
    );
    assert_eq!(
        annotations["overcommit.dev/applied"],
        "policy=batch;ratios=cpu=2,memory=1.5"
    );
    assert_eq!(
        handle(&to_bytes(&next), &policies(), &settings()).outcome,
        Outcome::Unchanged
    );
}

#[test]
fn pod_create_gets_defaults_and_request_to_limit() {
    let request = json(POD_CREATE);
    let handled = handle(POD_CREATE, &policies(), &settings());
    assert_eq!(
        (
            handled.resource,
            handled.operation.as_str(),
            handled.outcome
        ),
        (ReviewResource::Pod, "CREATE", Outcome::Patched)
    );
    let response = response(&handled, &request);
    let next = next_review(&request, &response);
    let spec = &next["request"]["object"]["spec"];
    assert_eq!(
        spec["initContainers"][0]["resources"],
        json!({"requests": {"cpu": "100m", "memory": "128Mi"}})
    );
    assert_eq!(
        spec["containers"][0]["resources"],
        json!({"limits": {"cpu": "2", "memory": "4Gi"}, "requests": {"cpu": "1", "memory": "4Gi"}})
    );
    assert_eq!(
        spec["containers"][1]["resources"],
        json!({"requests": {"cpu": "100m", "memory": "128Mi"}})
    );
    assert_eq!(
        handle(&to_bytes(&next), &policies(), &settings()).outcome,
        Outcome::Unchanged
    );
}

#[test]
fn pods_in_excluded_namespaces_are_untouched() {
    for namespace in ["kube-system", "kube-overcommit"] {
        let mut request = json(POD_CREATE);
        request["request"]["namespace"] = json!(namespace);
        request["request"]["object"]["metadata"]["namespace"] = json!(namespace);
        let handled = handle(&to_bytes(&request), &policies(), &settings());
        assert_eq!(handled.outcome, Outcome::Unchanged, "{namespace}");
    }
}

#[test]
fn reviews_this_webhook_does_not_mutate_are_allowed_unchanged() {
    let node = json(NODE_STATUS_UPDATE);
    let mut cases = Vec::new();
    let mut main_resource_update = node.clone();
    main_resource_update["request"]["subResource"] = Value::Null;
    cases.push(("UPDATE nodes", main_resource_update));
    let mut delete = node.clone();
    delete["request"]["operation"] = json!("DELETE");
    delete["request"]["object"] = Value::Null;
    cases.push(("DELETE nodes", delete));
    let mut pod_update = json(POD_CREATE);
    pod_update["request"]["operation"] = json!("UPDATE");
    cases.push(("UPDATE pods", pod_update));
    let mut lease = node.clone();
    lease["request"]["kind"] =
        json!({"group": "coordination.k8s.io", "version": "v1", "kind": "Lease"});
    lease["request"]["resource"] =
        json!({"group": "coordination.k8s.io", "version": "v1", "resource": "leases"});
    lease["request"]["subResource"] = Value::Null;
    lease["request"]["object"] = json!({"kind": "Lease", "spec": {"holderIdentity": "x"}});
    cases.push(("Lease", lease));
    for (name, request) in cases {
        let handled = handle(&to_bytes(&request), &policies(), &settings());
        assert_eq!(handled.outcome, Outcome::Unchanged, "{name}");
        let response = response(&handled, &request);
        assert!(response.get("patch").is_none(), "{name}");
    }
}

#[test]
fn node_errors_fail_open_allowed_without_patch() {
    let base = json(NODE_STATUS_UPDATE);
    let mut garbage_quantity = base.clone();
    garbage_quantity["request"]["object"]["status"]["allocatable"]["cpu"] = json!("eight");
    let mut wrong_type = base.clone();
    wrong_type["request"]["object"]["status"]["allocatable"] = json!(["cpu", 8]);
    let mut labels_not_strings = base.clone();
    labels_not_strings["request"]["object"]["metadata"]["labels"]["pool"] = json!(7);
    let mut no_object = base.clone();
    no_object["request"]["object"] = Value::Null;
    for (name, request) in [
        ("garbage quantity", garbage_quantity),
        ("allocatable not a map", wrong_type),
        ("label not a string", labels_not_strings),
        ("no object", no_object),
    ] {
        let handled = handle(&to_bytes(&request), &policies(), &settings());
        let reason = handled.error.as_ref().map(|e| e.to_string());
        assert_eq!(handled.outcome, Outcome::FailedOpen, "{name}");
        assert_eq!(handled.resource, ReviewResource::Node, "{name}");
        assert!(
            reason.is_some_and(|r| r.contains("worker-pool-batch-7f3k2")),
            "{name}: reason names the node"
        );
        let response = response(&handled, &request);
        assert!(response.get("patch").is_none(), "{name}");
    }
}

#[test]
fn bodies_that_are_not_admission_reviews_get_400_with_a_message() {
    let valid = json(NODE_CREATE);
    let mut no_uid = valid.clone();
    no_uid["request"].as_object_mut().map(|r| r.remove("uid"));
    let mut empty_uid = valid.clone();
    empty_uid["request"]["uid"] = json!("");
    let mut v1beta1 = valid.clone();
    v1beta1["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let mut no_request = valid.clone();
    no_request.as_object_mut().map(|r| r.remove("request"));
    let truncated = NODE_CREATE[..NODE_CREATE.len() / 2].to_vec();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty body", vec![]),
        ("not JSON", b"hello".to_vec()),
        ("truncated", truncated),
        ("JSON array", b"[1,2]".to_vec()),
        ("JSON null", b"null".to_vec()),
        (
            "wrong kind",
            br#"{"apiVersion":"v1","kind":"Pod"}"#.to_vec(),
        ),
        ("no uid", to_bytes(&no_uid)),
        ("empty uid", to_bytes(&empty_uid)),
        ("v1beta1", to_bytes(&v1beta1)),
        ("no request", to_bytes(&no_request)),
        ("invalid UTF-8", b"{\"apiVersion\":\"\xff\xfe\"}".to_vec()),
        (
            "deep nesting",
            format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes(),
        ),
    ];
    for (name, body) in cases {
        let handled = handle(&body, &policies(), &settings());
        assert_eq!(
            (handled.status, handled.outcome),
            (400, Outcome::BadRequest),
            "{name}"
        );
        let status = json(&handled.body);
        assert_eq!(status["kind"], "Status", "{name}");
        assert_eq!(status["code"], 400, "{name}");
        assert!(
            status["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{name}"
        );
    }
}

#[test]
fn damaged_bodies_never_panic() {
    // Every truncation and a sweep of single-byte corruptions of a real review: each answer is
    // a 400 or an allowed review, never a panic.
    let set = policies();
    for fixture in [NODE_STATUS_UPDATE, POD_CREATE] {
        for end in (0..fixture.len()).step_by(97) {
            let handled = handle(&fixture[..end], &set, &settings());
            assert!(handled.status == 400 || handled.status == 200);
        }
        for (i, replacement) in (0..fixture.len())
            .step_by(89)
            .zip([b'"', b'}', b'9', b'x', b'\\', 0xff].iter().cycle())
        {
            let mut body = fixture.to_vec();
            body[i] = *replacement;
            let handled = handle(&body, &set, &settings());
            assert!(handled.status == 400 || handled.status == 200);
            if handled.status == 200 {
                assert!(json(&handled.body)["response"]["allowed"] == true);
            }
        }
    }
}

#[test]
fn explain_describes_the_node_decision() {
    let text = match explain(NODE_STATUS_UPDATE, &policies(), &settings()) {
        Ok(decision) => decision.explain(),
        Err(e) => panic!("{e}"),
    };
    assert!(text.contains("policy batch applies"), "{text}");
    assert!(text.contains("cpu: raw 7910m"), "{text}");
    assert!(text.contains("-> 15820m"), "{text}");
}

#[test]
fn answer_body_is_what_serde_json_writes() {
    let uids = [
        "3f9f63c0-5e9e-46ce-834c-55a7c079eb03",
        "",
        "quote\" backslash\\ slash/ tab\t nl\n nul\u{0} del\u{7f}",
        "é ü 日本 \u{2028} 🦀",
        "</script>",
    ];
    let patches: [Option<&[u8]>; 5] = [
        None,
        Some(b""),
        Some(b"["),
        Some(b"[{"),
        Some(br#"[{"op":"replace","path":"/status/allocatable/cpu","value":"23835m"}]"#),
    ];
    for uid in uids {
        for patch in patches {
            let encoded = patch.map(|p| base64::engine::general_purpose::STANDARD.encode(p));
            let review = ReviewOut {
                api_version: REVIEW_API_VERSION,
                kind: "AdmissionReview",
                response: ResponseOut {
                    uid,
                    allowed: true,
                    patch_type: patch.map(|_| "JSONPatch"),
                    patch: encoded,
                },
            };
            let expected = serde_json::to_vec(&review).unwrap_or_default();
            assert_eq!(
                String::from_utf8_lossy(&review_body(uid, patch)),
                String::from_utf8_lossy(&expected),
                "{uid:?} {patch:?}"
            );
        }
    }
}

/// The panic guard's answer: allowed, no patch, the uid kept where the body has one.
#[test]
fn a_panic_answers_allowed_with_the_uid() {
    let handled = panicked(br#"{"request":{"uid":"abc","operation":"UPDATE"}}"#);
    let v: Value = serde_json::from_slice(&handled.body).expect("json");
    assert_eq!(v["response"]["uid"], "abc");
    assert_eq!(v["response"]["allowed"], true);
    assert!(v["response"].get("patch").is_none());
    assert_eq!(handled.status, 200);
    assert_eq!(handled.outcome, Outcome::FailedOpen);
    assert_eq!(handled.operation, "UPDATE");
    assert_eq!(
        handled.error.map(|e| e.to_string()).as_deref(),
        Some("internal error (panic)")
    );
    let handled = panicked(b"not json");
    assert_eq!(handled.status, 200);
    assert_eq!(handled.outcome, Outcome::FailedOpen);
}

/// A usage source that counts how often it is asked.
#[derive(Debug, Default)]
struct CountingUsage {
    asked: std::sync::Mutex<Vec<String>>,
}

impl NodeUsageSource for CountingUsage {
    fn node_usage(&self, node: &str, window: std::time::Duration) -> Option<NodeUsage> {
        assert_eq!(window, std::time::Duration::from_secs(900));
        if let Ok(mut asked) = self.asked.lock() {
            asked.push(node.to_string());
        }
        Some(NodeUsage {
            cpu: Some(overcommit_core::node::usage::UsageView::fresh(6_000, 2_000)),
            memory: None,
        })
    }
}

#[test]
fn usage_is_looked_up_only_for_usage_policies() {
    let source = std::sync::Arc::new(CountingUsage::default());
    let settings = Settings {
        usage: Some(source.clone()),
        ..settings()
    };
    let asked = || source.asked.lock().map(|a| a.clone()).unwrap_or_default();
    // Static policies: the source is never asked, the answer is the one without a source.
    let handled = handle(NODE_STATUS_UPDATE, &policies(), &settings);
    assert_eq!(
        handled.body,
        handle(NODE_STATUS_UPDATE, &policies(), &self::settings()).body
    );
    assert!(asked().is_empty(), "{:?}", asked());
    // A usage policy: asked for the node under review; raw 7910m, 60%: 6000m + 4746m - 2000m.
    let usage_policies = match parse_policy_file(
        "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {name: batch}\nspec:\n  nodeSelector: {matchLabels: {pool: batch}}\n  nodeRatios: {cpu: \"2\"}\n  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"4\"}}\n",
    )
    .and_then(PolicySet::new)
    {
        Ok(set) => set,
        Err(e) => panic!("{e}"),
    };
    let request = json(NODE_STATUS_UPDATE);
    let handled = handle(NODE_STATUS_UPDATE, &usage_policies, &settings);
    let response = response(&handled, &request);
    let next = next_review(&request, &response);
    assert_eq!(
        next["request"]["object"]["status"]["allocatable"]["cpu"],
        "8746m"
    );
    assert_eq!(asked(), vec!["worker-pool-batch-7f3k2".to_string()]);
    assert!(handled.usage_fallbacks.is_empty());
    // The metrics API failing: the fallback (nodeRatios x2), its reason kept for the metric.
    let failing = overcommit_core::node::usage::UsageView {
        metrics_failing: true,
        ..overcommit_core::node::usage::UsageView::fresh(6_000, 2_000)
    };
    let unsynced = Settings {
        usage: Some(std::sync::Arc::new(crate::review_usage::FixedUsage(
            NodeUsage {
                cpu: Some(failing),
                memory: None,
            },
        ))),
        ..self::settings()
    };
    let handled = handle(NODE_STATUS_UPDATE, &usage_policies, &unsynced);
    let next = next_review(&request, &self::response(&handled, &request));
    assert_eq!(
        next["request"]["object"]["status"]["allocatable"]["cpu"],
        "15820m"
    );
    assert!(
        handled
            .usage_fallbacks
            .contains(overcommit_core::node::usage::FallbackReason::MetricsFailing),
        "{:?}",
        handled.usage_fallbacks
    );
}

/// `serve --mode`: while the compiled policy is in force, the node rule leaves the nodes it
/// serves unchanged (a static winner, no policy); a usage policy's node stays the webhook's.
#[test]
fn in_process_leaves_static_nodes_to_the_compiled_policy() {
    let on = Settings {
        in_process: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true)),
        ..settings()
    };
    let usage_policies = match parse_policy_file(
        "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {name: batch}\nspec:\n  nodeSelector: {matchLabels: {pool: batch}}\n  nodeRatios: {cpu: \"2\"}\n  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"4\"}}\n",
    )
    .and_then(PolicySet::new)
    {
        Ok(set) => set,
        Err(e) => panic!("{e}"),
    };
    let none = PolicySet::default();
    let request = json(NODE_STATUS_UPDATE);
    // (policies, in-process in force, patched)
    let cases = [
        (
            "static winner, webhook mode",
            &policies(),
            &settings(),
            true,
        ),
        ("static winner, in force", &policies(), &on, false),
        (
            "no policy (annotations removed), webhook mode",
            &none,
            &settings(),
            true,
        ),
        ("no policy, in force", &none, &on, false),
        ("usage winner, in force", &usage_policies, &on, true),
    ];
    for (what, set, settings, patched) in cases {
        let handled = handle(NODE_STATUS_UPDATE, set, settings);
        let response = response(&handled, &request);
        assert_eq!(response["patch"].is_string(), patched, "{what}: {response}");
        assert_eq!(response["allowed"], true, "{what}");
    }
}
