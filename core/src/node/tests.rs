//! Table tests of the node rule. Every case also checks idempotence: the patched node, fed
//! back through the rule (as the next review, with itself as the stored node), yields no patch.

use std::borrow::Cow;

use serde_json::{Value, json};

use super::usage::{NodeUsage, UsageView};
use super::*;
use crate::policy::{PolicySet, parse_policy_file};

const BATCH_POLICIES: &str = r#"
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: batch}
spec:
  nodeSelector: {matchLabels: {pool: batch}}
  priority: 10
  nodeRatios: {cpu: "2", memory: "1.5", example.com/gpu: "2", pods: "1"}
---
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: everything}
spec:
  priority: 0
  nodeRatios: {cpu: "1.25"}
"#;

const BATCH_RATIO_3: &str = r#"
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: batch}
spec:
  nodeSelector: {matchLabels: {pool: batch}}
  priority: 10
  nodeRatios: {cpu: "3", memory: "1.5", example.com/gpu: "2", pods: "1"}
"#;

const BATCH_CPU_ONLY: &str = r#"
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: batch}
spec:
  nodeSelector: {matchLabels: {pool: batch}}
  priority: 10
  nodeRatios: {cpu: "2"}
"#;

const APPLIED_BATCH: &str = "policy=batch;ratios=cpu=2,example.com/gpu=2,memory=1.5,pods=1";

fn policies(yaml: &str) -> PolicySet {
    match parse_policy_file(yaml).and_then(PolicySet::new) {
        Ok(set) => set,
        Err(e) => panic!("test policies: {e}"),
    }
}

fn capacity() -> Value {
    json!({"cpu": "4", "memory": "16393180Ki", "pods": "110", "example.com/gpu": "4", "ephemeral-storage": "100Gi"})
}

/// A node with the kubelet's raw allocatable.
fn raw_allocatable() -> Value {
    json!({"cpu": "3920m", "memory": "15242204Ki", "pods": "110", "example.com/gpu": "4", "ephemeral-storage": "96Gi"})
}

/// What the rule writes for `raw_allocatable()` under the batch policy.
fn batch_allocatable() -> Value {
    json!({"cpu": "7840m", "memory": "22863306Ki", "pods": "110", "example.com/gpu": "8", "ephemeral-storage": "96Gi"})
}

fn batch_annotations() -> Value {
    json!({
        RAW_ALLOCATABLE_ANNOTATION: "cpu=3920m,example.com/gpu=4,memory=15242204Ki",
        APPLIED_ANNOTATION: APPLIED_BATCH,
    })
}

/// `batch_annotations()` as the webhook wrote them before the listed format (JSON): read
/// still, and rewritten listed at the node's next write.
fn batch_annotations_json() -> Value {
    json!({
        RAW_ALLOCATABLE_ANNOTATION: r#"{"cpu":"3920m","example.com/gpu":"4","memory":"15242204Ki"}"#,
        APPLIED_ANNOTATION: r#"{"policy":"batch","ratios":{"cpu":"2","example.com/gpu":"2","memory":"1.5","pods":"1"}}"#,
    })
}

fn node(labels: Value, annotations: Option<Value>, allocatable: Value) -> Value {
    let mut metadata = json!({"name": "node-1", "labels": labels});
    if let Some(a) = annotations {
        metadata["annotations"] = a;
    }
    json!({"apiVersion": "v1", "kind": "Node", "metadata": metadata,
           "status": {"capacity": capacity(), "allocatable": allocatable}})
}

fn with(mut base: Value, pointer: &str, value: Value) -> Value {
    if let Some(slot) = base.pointer_mut(pointer) {
        *slot = value;
    }
    base
}

/// Owned copies of the maps a NodeView borrows.
struct Owned {
    has_metadata: bool,
    labels: Option<StrMap<'static>>,
    annotations: Option<StrMap<'static>>,
    allocatable: Option<StrMap<'static>>,
    capacity: Option<StrMap<'static>>,
    conditions: Option<Vec<Condition<'static>>>,
}

impl Owned {
    fn from_json(node: &Value) -> Owned {
        let map = |pointer: &str| {
            node.pointer(pointer).and_then(Value::as_object).map(|m| {
                m.iter()
                    .map(|(k, v)| {
                        (
                            Cow::Owned(k.clone()),
                            Cow::Owned(v.as_str().unwrap_or_default().to_string()),
                        )
                    })
                    .collect()
            })
        };
        Owned {
            has_metadata: node.get("metadata").is_some(),
            labels: map("/metadata/labels"),
            annotations: map("/metadata/annotations"),
            allocatable: map("/status/allocatable"),
            capacity: map("/status/capacity"),
            conditions: node
                .pointer("/status/conditions")
                .map(|c| owned_conditions(&c.to_string())),
        }
    }
    fn view(&self) -> NodeView<'_> {
        NodeView {
            has_metadata: self.has_metadata,
            labels: self.labels.as_ref(),
            annotations: self.annotations.as_ref(),
            allocatable: self.allocatable.as_ref(),
            capacity: self.capacity.as_ref(),
            conditions: self.conditions.as_deref(),
        }
    }
}

fn owned_conditions(json: &str) -> Vec<Condition<'static>> {
    let owned = |c: &Option<Cow<'_, str>>| c.as_deref().map(|s| Cow::Owned(s.to_string()));
    let read: Vec<Condition<'_>> = serde_json::from_str(json).unwrap_or_default();
    read.iter()
        .map(|c| Condition {
            kind: owned(&c.kind),
            status: owned(&c.status),
            reason: owned(&c.reason),
            message: owned(&c.message),
            last_transition_time: owned(&c.last_transition_time),
            last_heartbeat_time: owned(&c.last_heartbeat_time),
        })
        .collect()
}

fn decide_json(
    node: &Value,
    stored: Option<&Value>,
    set: &PolicySet,
) -> Result<NodeDecision, InflateError> {
    decide_usage_json(node, stored, set, None)
}

fn apply(node: &Value, ops: &[PatchOp]) -> Value {
    let mut patched = node.clone();
    let patch_json = match serde_json::to_value(ops) {
        Ok(v) => v,
        Err(e) => panic!("patch does not serialise: {e}"),
    };
    let patch: json_patch::Patch = match serde_json::from_value(patch_json.clone()) {
        Ok(p) => p,
        Err(e) => panic!("not a JSON patch: {e}: {patch_json}"),
    };
    if let Err(e) = json_patch::patch(&mut patched, &patch) {
        panic!("patch does not apply: {e}: {patch_json} to {node}");
    }
    patched
}

/// Allocatable maps are equal by value ("8" == "8000m").
fn assert_same_quantities(case: &str, actual: &Value, expected: &Value) {
    let (Some(actual), Some(expected)) = (actual.as_object(), expected.as_object()) else {
        panic!("{case}: allocatable is not a map: {actual} vs {expected}");
    };
    let keys = |m: &serde_json::Map<String, Value>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(actual), keys(expected), "{case}: resources");
    for (resource, want) in expected {
        let got = actual
            .get(resource)
            .and_then(Value::as_str)
            .unwrap_or_default();
        let want = want.as_str().unwrap_or_default();
        assert_eq!(
            Quantity::parse(got),
            Quantity::parse(want),
            "{case}: {resource} is {got}, expected {want}"
        );
    }
}

struct Case {
    name: &'static str,
    policies: &'static str,
    node: Value,
    /// Annotations of the stored node (oldObject), when different from the incoming ones.
    stored: Option<Value>,
    outcome: NodeOutcome,
    allocatable: Value,
    /// Expected annotations after the patch (None: both absent).
    annotations: Option<Value>,
}

fn batch() -> Value {
    json!({"pool": "batch"})
}

fn cases() -> Vec<Case> {
    let policy = || NodeOutcome::Policy("batch".into());
    vec![
        Case {
            name: "first status write inflates and records raw",
            policies: BATCH_POLICIES,
            node: node(batch(), None, raw_allocatable()),
            stored: None,
            outcome: policy(),
            allocatable: batch_allocatable(),
            annotations: Some(batch_annotations()),
        },
        Case {
            name: "registration without labels gets the catch-all policy",
            policies: BATCH_POLICIES,
            node: node(json!({}), None, raw_allocatable()),
            stored: None,
            outcome: NodeOutcome::Policy("everything".into()),
            allocatable: with(raw_allocatable(), "/cpu", json!("4900m")),
            annotations: Some(json!({
                RAW_ALLOCATABLE_ANNOTATION: "cpu=3920m",
                APPLIED_ANNOTATION: "policy=everything;ratios=cpu=1.25",
            })),
        },
        Case {
            name: "kubelet heartbeat with raw values is inflated again, annotations kept",
            policies: BATCH_POLICIES,
            node: node(batch(), Some(batch_annotations()), raw_allocatable()),
            stored: None,
            outcome: policy(),
            allocatable: batch_allocatable(),
            annotations: Some(batch_annotations()),
        },
        Case {
            name: "someone else's status write keeps the inflated value: no change",
            policies: BATCH_POLICIES,
            node: node(batch(), Some(batch_annotations()), batch_allocatable()),
            stored: None,
            outcome: policy(),
            allocatable: batch_allocatable(),
            annotations: Some(batch_annotations()),
        },
        Case {
            name: "inflated value in another canonical spelling is still recognised",
            policies: BATCH_POLICIES,
            node: node(
                batch(),
                Some(batch_annotations()),
                with(
                    with(batch_allocatable(), "/cpu", json!("7.84")),
                    "/memory",
                    json!("23412025344"),
                ),
            ),
            stored: None,
            outcome: policy(),
            allocatable: batch_allocatable(),
            annotations: Some(batch_annotations()),
        },
        Case {
            name: "kubelet reports a new raw value: it becomes the raw",
            policies: BATCH_POLICIES,
            node: node(
                batch(),
                Some(batch_annotations()),
                with(raw_allocatable(), "/cpu", json!("3")),
            ),
            stored: None,
            outcome: policy(),
            allocatable: with(batch_allocatable(), "/cpu", json!("6")),
            annotations: Some(json!({
                RAW_ALLOCATABLE_ANNOTATION: "cpu=3,example.com/gpu=4,memory=15242204Ki",
                APPLIED_ANNOTATION: APPLIED_BATCH,
            })),
        },
        Case {
            name: "partial write: cpu from the kubelet, memory left inflated",
            policies: BATCH_POLICIES,
            node: node(
                batch(),
                Some(batch_annotations()),
                with(batch_allocatable(), "/cpu", json!("3920m")),
            ),
            stored: None,
            outcome: policy(),
            allocatable: batch_allocatable(),
            annotations: Some(batch_annotations()),
        },
        Case {
            name: "policy removed: allocatable back to raw, annotations removed",
            policies: "",
            node: node(batch(), Some(batch_annotations()), batch_allocatable()),
            stored: None,
            outcome: NodeOutcome::NoPolicy,
            allocatable: raw_allocatable(),
            annotations: None,
        },
        Case {
            name: "policy removed while the kubelet writes its raw value",
            policies: "",
            node: node(batch(), Some(batch_annotations()), raw_allocatable()),
            stored: None,
            outcome: NodeOutcome::NoPolicy,
            allocatable: raw_allocatable(),
            annotations: None,
        },
        Case {
            name: "opt-out label restores raw even though a policy matches",
            policies: BATCH_POLICIES,
            node: node(
                json!({"pool": "batch", "overcommit.dev/disabled": "true"}),
                Some(batch_annotations()),
                batch_allocatable(),
            ),
            stored: None,
            outcome: NodeOutcome::OptedOut,
            allocatable: raw_allocatable(),
            annotations: None,
        },
        Case {
            name: "JSON annotations: the kubelet's write is inflated and recorded listed",
            policies: BATCH_POLICIES,
            node: node(batch(), Some(batch_annotations_json()), raw_allocatable()),
            stored: None,
            outcome: policy(),
            allocatable: batch_allocatable(),
            annotations: Some(batch_annotations()),
        },
        Case {
            name: "JSON annotations: another writer's write is not compounded, recorded listed",
            policies: BATCH_POLICIES,
            node: node(batch(), Some(batch_annotations_json()), batch_allocatable()),
            stored: None,
            outcome: policy(),
            allocatable: batch_allocatable(),
            annotations: Some(batch_annotations()),
        },
        Case {
            name: "JSON annotations: a writer without annotations, the stored JSON ones count",
            policies: BATCH_POLICIES,
            node: node(batch(), None, batch_allocatable()),
            stored: Some(node(
                batch(),
                Some(batch_annotations_json()),
                batch_allocatable(),
            )),
            outcome: policy(),
            allocatable: batch_allocatable(),
            annotations: Some(batch_annotations()),
        },
        Case {
            name: "JSON annotations: opt-out restores raw",
            policies: BATCH_POLICIES,
            node: node(
                json!({"pool": "batch", "overcommit.dev/disabled": "true"}),
                Some(batch_annotations_json()),
                batch_allocatable(),
            ),
            stored: None,
            outcome: NodeOutcome::OptedOut,
            allocatable: raw_allocatable(),
            annotations: None,
        },
        Case {
            name: "JSON annotations: a ratio change is applied from raw, recorded listed",
            policies: BATCH_RATIO_3,
            node: node(batch(), Some(batch_annotations_json()), batch_allocatable()),
            stored: None,
            outcome: policy(),
            allocatable: with(batch_allocatable(), "/cpu", json!("11760m")),
            annotations: Some(json!({
                RAW_ALLOCATABLE_ANNOTATION: "cpu=3920m,example.com/gpu=4,memory=15242204Ki",
                APPLIED_ANNOTATION: "policy=batch;ratios=cpu=3,example.com/gpu=2,memory=1.5,pods=1",
            })),
        },
        Case {
            name: "opt-out label with a value other than true does not opt out",
            policies: BATCH_POLICIES,
            node: node(
                json!({"pool": "batch", "overcommit.dev/disabled": "false"}),
                None,
                raw_allocatable(),
            ),
            stored: None,
            outcome: policy(),
            allocatable: batch_allocatable(),
            annotations: Some(batch_annotations()),
        },
        Case {
            name: "ratio raised: inflated from the recorded raw, not compounded",
            policies: BATCH_RATIO_3,
            node: node(batch(), Some(batch_annotations()), batch_allocatable()),
            stored: None,
            outcome: policy(),
            allocatable: with(batch_allocatable(), "/cpu", json!("11760m")),
            annotations: Some(json!({
                RAW_ALLOCATABLE_ANNOTATION: "cpu=3920m,example.com/gpu=4,memory=15242204Ki",
                APPLIED_ANNOTATION: "policy=batch;ratios=cpu=3,example.com/gpu=2,memory=1.5,pods=1",
            })),
        },
        Case {
            name: "resource dropped from the policy goes back to raw",
            policies: BATCH_CPU_ONLY,
            node: node(batch(), Some(batch_annotations()), batch_allocatable()),
            stored: None,
            outcome: policy(),
            allocatable: with(raw_allocatable(), "/cpu", json!("7840m")),
            annotations: Some(json!({
                RAW_ALLOCATABLE_ANNOTATION: "cpu=3920m",
                APPLIED_ANNOTATION: "policy=batch;ratios=cpu=2",
            })),
        },
        Case {
            name: "node moved to another policy: inflated from the raw, not from the old result",
            policies: BATCH_POLICIES,
            node: node(
                json!({"pool": "web"}),
                Some(batch_annotations()),
                batch_allocatable(),
            ),
            stored: None,
            outcome: NodeOutcome::Policy("everything".into()),
            allocatable: with(raw_allocatable(), "/cpu", json!("4900m")),
            annotations: Some(json!({
                RAW_ALLOCATABLE_ANNOTATION: "cpu=3920m",
                APPLIED_ANNOTATION: "policy=everything;ratios=cpu=1.25",
            })),
        },
        Case {
            name: "status write without annotations: the stored node's annotations are used",
            policies: BATCH_POLICIES,
            node: node(batch(), Some(json!({"other": "x"})), batch_allocatable()),
            stored: Some(node(
                batch(),
                Some(batch_annotations()),
                batch_allocatable(),
            )),
            outcome: policy(),
            allocatable: batch_allocatable(),
            annotations: Some({
                let mut a = batch_annotations();
                a["other"] = json!("x");
                a
            }),
        },
        Case {
            name: "unreadable annotations are ignored and rewritten from the kubelet's value",
            policies: BATCH_POLICIES,
            node: node(
                batch(),
                Some(
                    json!({RAW_ALLOCATABLE_ANNOTATION: "{not json", APPLIED_ANNOTATION: APPLIED_BATCH}),
                ),
                raw_allocatable(),
            ),
            stored: None,
            outcome: policy(),
            allocatable: batch_allocatable(),
            annotations: Some(batch_annotations()),
        },
        Case {
            name: "node without labels, annotations or matching policy is left alone",
            policies: BATCH_CPU_ONLY,
            node: json!({"metadata": {"name": "n"}, "status": {"allocatable": raw_allocatable()}}),
            stored: None,
            outcome: NodeOutcome::NoPolicy,
            allocatable: raw_allocatable(),
            annotations: None,
        },
        Case {
            name: "node without metadata gets metadata with annotations",
            policies: BATCH_POLICIES,
            node: json!({"status": {"allocatable": {"cpu": "2"}}}),
            stored: None,
            outcome: NodeOutcome::Policy("everything".into()),
            allocatable: json!({"cpu": "2500m"}),
            annotations: Some(json!({
                RAW_ALLOCATABLE_ANNOTATION: "cpu=2",
                APPLIED_ANNOTATION: "policy=everything;ratios=cpu=1.25",
            })),
        },
        Case {
            name: "garbage in a resource no policy touches is ignored",
            policies: BATCH_CPU_ONLY,
            node: node(
                batch(),
                None,
                with(raw_allocatable(), "/pods", json!("lots")),
            ),
            stored: None,
            outcome: policy(),
            allocatable: with(
                with(raw_allocatable(), "/pods", json!("lots")),
                "/cpu",
                json!("7840m"),
            ),
            annotations: Some(json!({
                RAW_ALLOCATABLE_ANNOTATION: "cpu=3920m",
                APPLIED_ANNOTATION: "policy=batch;ratios=cpu=2",
            })),
        },
    ]
}

#[test]
fn node_rule_table() {
    for case in cases() {
        let set = policies(case.policies);
        let decision = match decide_json(&case.node, case.stored.as_ref(), &set) {
            Ok(d) => d,
            Err(e) => panic!("{}: {e}", case.name),
        };
        assert_eq!(decision.outcome, case.outcome, "{}: outcome", case.name);
        let patched = apply(&case.node, &decision.patch);
        assert_same_quantities(
            case.name,
            patched
                .pointer("/status/allocatable")
                .unwrap_or(&Value::Null),
            &case.allocatable,
        );
        assert_eq!(
            patched.pointer("/status/capacity"),
            case.node.pointer("/status/capacity"),
            "{}: capacity",
            case.name
        );
        assert_eq!(
            patched.pointer("/metadata/labels"),
            case.node.pointer("/metadata/labels"),
            "{}: labels",
            case.name
        );
        let ours = |node: &Value| {
            let get = |key: &str| {
                node.pointer("/metadata/annotations")
                    .and_then(|a| a.get(key))
                    .cloned()
            };
            (get(RAW_ALLOCATABLE_ANNOTATION), get(APPLIED_ANNOTATION))
        };
        let expected = match &case.annotations {
            Some(a) => (
                a.get(RAW_ALLOCATABLE_ANNOTATION).cloned(),
                a.get(APPLIED_ANNOTATION).cloned(),
            ),
            None => (None, None),
        };
        assert_eq!(ours(&patched), expected, "{}: annotations", case.name);
        if let Some(expected) = &case.annotations {
            assert_eq!(
                patched.pointer("/metadata/annotations"),
                Some(expected),
                "{}: other annotations",
                case.name
            );
        }

        // Idempotence: the output, reviewed again (retry, reinvocation, next write), is final.
        let again = match decide_json(&patched, Some(&patched), &set) {
            Ok(d) => d,
            Err(e) => panic!("{} (second review): {e}", case.name),
        };
        assert_eq!(
            again.patch,
            vec![],
            "{}: second review must not patch",
            case.name
        );
        // ...and so is the same output seen with the old node as stored.
        let third = match decide_json(&patched, Some(&case.node), &set) {
            Ok(d) => d,
            Err(e) => panic!("{} (third review): {e}", case.name),
        };
        assert_eq!(
            third.patch,
            vec![],
            "{}: review with old stored node must not patch",
            case.name
        );
    }
}

#[test]
fn steady_state_heartbeat_patches_only_allocatable() {
    let set = policies(BATCH_POLICIES);
    let stored = node(batch(), Some(batch_annotations()), batch_allocatable());
    let incoming = node(batch(), Some(batch_annotations()), raw_allocatable());
    let decision = decide_json(&incoming, Some(&stored), &set).unwrap_or_else(|e| panic!("{e}"));
    let paths: Vec<&str> = decision.patch.iter().map(PatchOp::path).collect();
    assert_eq!(
        paths,
        vec![
            "/status/allocatable/cpu",
            "/status/allocatable/example.com~1gpu",
            "/status/allocatable/memory"
        ]
    );
    assert!(
        decision
            .patch
            .iter()
            .all(|op| matches!(op, PatchOp::Replace { .. }))
    );
}

#[test]
fn a_long_run_of_writes_never_compounds() {
    // kubelet heartbeat, someone else's write, a retry, a reinvocation, a ratio change, the
    // policy removed and put back: the stored value always follows the raw one.
    let ratio_2 = policies(BATCH_POLICIES);
    let ratio_3 = policies(BATCH_RATIO_3);
    let none = policies("");
    let mut stored = node(batch(), None, raw_allocatable());
    let steps: [(&PolicySet, bool, &str); 8] = [
        (&ratio_2, true, "7840m"),
        (&ratio_2, false, "7840m"),
        (&ratio_2, false, "7840m"),
        (&ratio_2, true, "7840m"),
        (&ratio_3, false, "11760m"),
        (&ratio_3, true, "11760m"),
        (&none, false, "3920m"),
        (&ratio_2, true, "7840m"),
    ];
    for (step, (set, kubelet_writes, expected_cpu)) in steps.into_iter().enumerate() {
        // The kubelet's PATCH carries its raw value; any other writer leaves allocatable as stored.
        let incoming = if kubelet_writes {
            with(stored.clone(), "/status/allocatable", raw_allocatable())
        } else {
            stored.clone()
        };
        let decision = decide_json(&incoming, Some(&stored), set)
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        stored = apply(&incoming, &decision.patch);
        let cpu = stored
            .pointer("/status/allocatable/cpu")
            .and_then(Value::as_str)
            .unwrap_or_default();
        assert_eq!(
            Quantity::parse(cpu),
            Quantity::parse(expected_cpu),
            "step {step}"
        );
    }
}

#[test]
fn value_above_capacity_that_we_did_not_write_fails_open() {
    // Annotations lost everywhere and allocatable still inflated: inflating again would compound.
    let set = policies(BATCH_POLICIES);
    let incoming = node(batch(), None, batch_allocatable());
    match decide_json(&incoming, Some(&incoming), &set) {
        Err(InflateError::AboveCapacity { resource, .. }) => assert_eq!(resource, "cpu"),
        other => panic!("expected AboveCapacity, got {other:?}"),
    }
}

#[test]
fn unparseable_allocatable_of_an_inflated_resource_is_an_error() {
    let set = policies(BATCH_POLICIES);
    let incoming = node(
        batch(),
        None,
        with(raw_allocatable(), "/cpu", json!("four")),
    );
    match decide_json(&incoming, None, &set) {
        Err(InflateError::Quantity { resource, .. }) => assert_eq!(resource, "cpu"),
        other => panic!("expected a quantity error, got {other:?}"),
    }
}

#[test]
fn ratio_of_one_leaves_the_resource_alone_and_unrecorded() {
    let set = policies(BATCH_POLICIES);
    let incoming = node(
        batch(),
        None,
        with(raw_allocatable(), "/pods", json!("110")),
    );
    let decision = decide_json(&incoming, None, &set).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        decision
            .patch
            .iter()
            .all(|op| op.path() != "/status/allocatable/pods")
    );
    assert!(
        decision
            .resources
            .iter()
            .all(|line| line.resource != "pods")
    );
}

#[test]
fn flooring_to_millicores_and_bytes() {
    let yaml = r#"
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: odd}
spec:
  nodeRatios: {cpu: "1.333333", memory: "1.1", ephemeral-storage: "1.000001"}
"#;
    let set = policies(yaml);
    let incoming = node(
        json!({}),
        None,
        json!({"cpu": "1", "memory": "1025", "ephemeral-storage": "1Gi"}),
    );
    let decision = decide_json(&incoming, None, &set).unwrap_or_else(|e| panic!("{e}"));
    let result: Vec<(&str, &str)> = decision
        .resources
        .iter()
        .map(|l| (l.resource.as_str(), l.result.as_str()))
        .collect();
    // 1 x 1.333333 = 1.333333 -> 1333m; 1025 x 1.1 = 1127.5 -> 1127; 1073741824 x 1.000001 -> 1073742897
    assert_eq!(
        result,
        vec![
            ("cpu", "1333m"),
            ("ephemeral-storage", "1073742897"),
            ("memory", "1127")
        ]
    );
}

#[test]
fn explain_names_the_policy_and_each_resource() {
    let set = policies(BATCH_POLICIES);
    let incoming = node(batch(), Some(batch_annotations()), batch_allocatable());
    let text = decide_json(&incoming, None, &set)
        .unwrap_or_else(|e| panic!("{e}"))
        .explain();
    assert!(text.contains("policy batch applies"), "{text}");
    assert!(
        text.contains("cpu: raw 3920m (from the raw-allocatable annotation) x 2 -> 7840m"),
        "{text}"
    );
}

#[test]
fn result_beyond_int64_units_is_refused() {
    let set = policies(BATCH_POLICIES);
    let incoming = node(batch(), None, with(raw_allocatable(), "/cpu", json!("5E")));
    let incoming = with(incoming, "/status/capacity/cpu", json!("5E"));
    match decide_json(&incoming, None, &set) {
        Err(InflateError::Quantity { resource, .. }) => assert_eq!(resource, "cpu"),
        other => panic!("expected an overflow error, got {other:?}"),
    }
}

#[test]
fn patch_only_decides_as_the_full_account() {
    for case in cases() {
        let set = policies(case.policies);
        let owned = Owned::from_json(&case.node);
        let stored = case.stored.as_ref().map(Owned::from_json);
        let stored_view = stored.as_ref().map(Owned::view);
        let full = decide_with(
            &owned.view(),
            stored_view.as_ref(),
            &set,
            Account::Full,
            None,
        );
        let patch_only = decide_with(
            &owned.view(),
            stored_view.as_ref(),
            &set,
            Account::PatchOnly,
            None,
        );
        match (full, patch_only) {
            (Ok(full), Ok(patch_only)) => {
                assert_eq!(patch_only.outcome, full.outcome, "{}", case.name);
                assert_eq!(patch_only.patch, full.patch, "{}", case.name);
                assert_eq!(patch_only.notes, full.notes, "{}", case.name);
                assert!(patch_only.resources.is_empty(), "{}", case.name);
            }
            (full, patch_only) => panic!("{}: {full:?} vs {patch_only:?}", case.name),
        }
    }
}

/// Quiet heartbeats in the node rule: only on status updates of nodes a policy selects, and the
/// patched node fed back (as the next review of the same kubelet state) changes nothing.
#[test]
fn stored_heartbeats_are_kept_only_on_nodes_a_policy_selects() {
    let set = policies(BATCH_POLICIES);
    let conditions = |heartbeat: &str, ready: &str| {
        json!([
            {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
             "message": "ok", "lastTransitionTime": "2026-11-20T00:00:00Z", "lastHeartbeatTime": heartbeat},
            {"type": "Ready", "status": ready, "reason": "KubeletReady",
             "message": "ready", "lastTransitionTime": "2026-11-20T00:00:00Z", "lastHeartbeatTime": heartbeat},
        ])
    };
    let stored_time = "2026-11-24T01:59:20Z";
    let sent_time = "2026-11-24T02:00:00Z";
    let quiet = Some(Quiet {
        now_ms: 1_795_485_600_000, // 2026-11-24T02:00:00Z
        refresh: std::time::Duration::from_secs(300),
    });
    let status_update = |labels: Value, ready: &str| {
        let mut stored = node(
            labels.clone(),
            Some(batch_annotations()),
            batch_allocatable(),
        );
        stored["status"]["conditions"] = conditions(stored_time, "True");
        let mut incoming = node(labels, Some(batch_annotations()), raw_allocatable());
        incoming["status"]["conditions"] = conditions(sent_time, ready);
        (incoming, stored)
    };
    let only_batch = policies(BATCH_CPU_ONLY);
    let run_with = |set: &PolicySet, incoming: &Value, stored: &Value, quiet| {
        let owned = Owned::from_json(incoming);
        let stored = Owned::from_json(stored);
        match decide_with(
            &owned.view(),
            Some(&stored.view()),
            set,
            Account::Full,
            quiet,
        ) {
            Ok(decision) => decision,
            Err(e) => panic!("{e}"),
        }
    };
    let run = |incoming: &Value, stored: &Value, quiet| run_with(&set, incoming, stored, quiet);

    // Selected, only heartbeats moved: both kept, and the result is the stored node exactly.
    let (incoming, stored) = status_update(batch(), "True");
    let decision = run(&incoming, &stored, quiet);
    assert!(decision.heartbeats_kept);
    let patched = apply(&incoming, &decision.patch);
    assert_eq!(
        patched, stored,
        "the kubelet's write becomes the stored node: a no-op"
    );
    let again = run(&patched, &stored, quiet);
    assert!(
        again.patch.is_empty() && !again.heartbeats_kept,
        "{:?}",
        again.patch
    );
    let explained = decision.explain();
    assert!(
        explained.contains("Ready: heartbeat kept: stored 40s old, refresh 5m"),
        "{explained}"
    );

    // A real change (Ready flipped) is stored with its new heartbeat; the unchanged condition
    // keeps its stored one.
    let (incoming, stored) = status_update(batch(), "False");
    let decision = run(&incoming, &stored, quiet);
    let patched = apply(&incoming, &decision.patch);
    assert_eq!(
        patched["status"]["conditions"][1]["lastHeartbeatTime"],
        sent_time
    );
    assert_eq!(
        patched["status"]["conditions"][0]["lastHeartbeatTime"],
        stored_time
    );

    // Quiet off (None, or a zero refresh), no policy, opted out: heartbeats go through.
    let (incoming, stored) = status_update(batch(), "True");
    let off = quiet.map(|q| Quiet {
        refresh: std::time::Duration::ZERO,
        ..q
    });
    for (name, set, incoming, quiet) in [
        ("quiet off", &set, incoming.clone(), None),
        ("refresh 0", &set, incoming.clone(), off),
        (
            "no policy",
            &only_batch,
            with(incoming.clone(), "/metadata/labels", json!({"pool": "web"})),
            quiet,
        ),
        (
            "opted out",
            &set,
            with(
                incoming,
                "/metadata/labels",
                json!({"pool": "batch", "overcommit.dev/disabled": "true"}),
            ),
            quiet,
        ),
    ] {
        let decision = run_with(set, &incoming, &stored, quiet);
        assert!(!decision.heartbeats_kept, "{name}");
        let patched = apply(&incoming, &decision.patch);
        assert_eq!(
            patched["status"]["conditions"], incoming["status"]["conditions"],
            "{name}"
        );
    }
}

const USAGE_POLICIES: &str = r#"
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: usage}
spec:
  nodeSelector: {matchLabels: {pool: batch}}
  priority: 10
  nodeRatios: {cpu: "2"}
  usage: {targetUtilization: {cpu: "60%"}, maxRatios: {cpu: "4"}, window: 15m, minChange: "5%"}
"#;

fn cpu_usage(requested: u128, peak_usage: u128) -> NodeUsage {
    NodeUsage {
        cpu: Some(UsageView::fresh(requested, peak_usage)),
        memory: None,
    }
}

fn decide_usage_json(
    node: &Value,
    stored: Option<&Value>,
    set: &PolicySet,
    usage: Option<&NodeUsage>,
) -> Result<NodeDecision, InflateError> {
    let owned = Owned::from_json(node);
    let stored = stored.map(Owned::from_json);
    let stored_view = stored.as_ref().map(Owned::view);
    decide_with_usage(
        &owned.view(),
        stored_view.as_ref(),
        set,
        Account::Full,
        None,
        usage,
    )
}

#[test]
fn usage_values_are_recognised_and_never_compound() {
    // raw cpu 3920m, target 60%: room floor(2352m); minChange 5% of raw = 196m; ceiling 15680m.
    let usage = policies(USAGE_POLICIES);
    let static_2 = policies(BATCH_CPU_ONLY);
    let none = policies("");
    let mut stored = node(batch(), None, raw_allocatable());
    #[rustfmt::skip]
    let steps: [(&str, &PolicySet, bool, Option<NodeUsage>, &str); 10] = [
        ("first write", &usage, true, Some(cpu_usage(3000, 1000)), "4352m"),
        ("someone else's write", &usage, false, Some(cpu_usage(3000, 1000)), "4352m"),
        ("kubelet, small move kept", &usage, true, Some(cpu_usage(3000, 1100)), "4352m"),
        ("retry, move over minChange", &usage, false, Some(cpu_usage(3000, 1300)), "4052m"),
        ("kubelet, usage unknown: nodeRatios", &usage, true, None, "7840m"),
        ("someone else's write, still unknown", &usage, false, None, "7840m"),
        ("kubelet, usage back", &usage, true, Some(cpu_usage(3000, 1000)), "4352m"),
        ("static policy", &static_2, true, None, "7840m"),
        ("no policy", &none, false, None, "3920m"),
        ("usage below raw: raw", &usage, true, Some(cpu_usage(0, 0)), "3920m"),
    ];
    for (name, set, kubelet_writes, node_usage, expected_cpu) in steps {
        let incoming = if kubelet_writes {
            with(stored.clone(), "/status/allocatable", raw_allocatable())
        } else {
            stored.clone()
        };
        let decision = decide_usage_json(&incoming, Some(&stored), set, node_usage.as_ref())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        stored = apply(&incoming, &decision.patch);
        let at = |pointer: &str| {
            stored
                .pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        assert_eq!(
            Quantity::parse(&at("/status/allocatable/cpu")),
            Quantity::parse(expected_cpu),
            "{name}"
        );
        if decision.outcome != NodeOutcome::NoPolicy {
            assert_eq!(
                at("/metadata/annotations/overcommit.dev~1raw-allocatable"),
                "cpu=3920m",
                "{name}"
            );
        }
        // The output, fed back as the next review with the same usage, changes nothing.
        let again = decide_usage_json(&stored, Some(&stored), set, node_usage.as_ref())
            .unwrap_or_else(|e| panic!("{name}, again: {e}"));
        assert!(again.patch.is_empty(), "{name}: {:?}", again.patch);
    }
}

#[test]
fn usage_annotation_records_the_value_written() {
    let set = policies(USAGE_POLICIES);
    let incoming = node(batch(), None, raw_allocatable());
    let decision = decide_usage_json(&incoming, None, &set, Some(&cpu_usage(3000, 1000)))
        .unwrap_or_else(|e| panic!("{e}"));
    let stored = apply(&incoming, &decision.patch);
    assert_eq!(
        stored.pointer("/metadata/annotations/overcommit.dev~1applied"),
        Some(&json!(
            "policy=usage;ratios=cpu=2;maxRatios=cpu=4;usage=cpu=4352m"
        ))
    );
    // A fallback is a ratio: no usage member (the ceilings are the policy's, recorded all the same).
    let decision = decide_usage_json(&incoming, None, &set, None).unwrap_or_else(|e| panic!("{e}"));
    let stored = apply(&incoming, &decision.patch);
    assert_eq!(
        stored.pointer("/metadata/annotations/overcommit.dev~1applied"),
        Some(&json!("policy=usage;ratios=cpu=2;maxRatios=cpu=4"))
    );
    let explained = decision.explain();
    assert!(
        explained.contains("usage fallback (no_sample): x 2"),
        "{explained}"
    );
    // Opted out: raw back, annotations gone.
    let labelled = with(
        stored.clone(),
        "/metadata/labels",
        json!({"pool": "batch", "overcommit.dev/disabled": "true"}),
    );
    let decision = decide_usage_json(&labelled, Some(&stored), &set, Some(&cpu_usage(3000, 1000)))
        .unwrap_or_else(|e| panic!("{e}"));
    let restored = apply(&labelled, &decision.patch);
    assert_eq!(
        restored.pointer("/status/allocatable/cpu"),
        Some(&json!("3920m"))
    );
    assert_eq!(
        restored.pointer("/metadata/annotations/overcommit.dev~1applied"),
        None
    );
}

/// The node's own capacity (cpu 4) bounds plausible usage: a peak above it takes the fallback
/// (nodeRatios x 2), at it follows usage; a node without a readable capacity is not checked.
#[test]
fn usage_above_the_nodes_capacity_takes_the_fallback() {
    let set = policies(USAGE_POLICIES);
    let incoming = node(batch(), None, raw_allocatable());
    let unreadable = with(incoming.clone(), "/status/capacity/cpu", json!("lots"));
    // (node, peak usage in millicores, cpu written, explain says)
    let cases = [
        (
            &incoming,
            4001,
            "7840m",
            "usage fallback (above_capacity: peak usage 4001m above capacity 4): x 2",
        ),
        (&incoming, 4000, "3920m", "from usage"),
        (&unreadable, 4001, "3920m", "from usage"),
    ];
    for (node, peak, cpu, says) in cases {
        let decision = decide_usage_json(node, None, &set, Some(&cpu_usage(3000, peak)))
            .unwrap_or_else(|e| panic!("{peak}: {e}"));
        let stored = apply(node, &decision.patch);
        assert_eq!(
            stored.pointer("/status/allocatable/cpu"),
            Some(&json!(cpu)),
            "{peak}"
        );
        let explained = decision.explain();
        assert!(explained.contains(says), "{peak}: {explained}");
    }
}

#[test]
fn explain_says_which_usage_value_applied() {
    let set = policies(USAGE_POLICIES);
    let incoming = node(batch(), None, raw_allocatable());
    let decision = decide_usage_json(&incoming, None, &set, Some(&cpu_usage(3000, 1000)))
        .unwrap_or_else(|e| panic!("{e}"));
    let explained = decision.explain();
    assert!(
        explained.contains("cpu: raw 3920m (reported by the kubelet) from usage (requested 3, peak usage 1) -> 4352m"),
        "{explained}"
    );
}

#[test]
fn resources_a_usage_policy_does_not_target_follow_node_ratios() {
    let set = policies(
        "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {name: usage}\nspec:\n  nodeRatios: {cpu: \"2\", memory: \"1.5\"}\n  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"4\"}}\n",
    );
    let incoming = node(batch(), None, raw_allocatable());
    let decision = decide_usage_json(&incoming, None, &set, Some(&cpu_usage(3000, 1000)))
        .unwrap_or_else(|e| panic!("{e}"));
    let stored = apply(&incoming, &decision.patch);
    assert_same_quantities(
        "usage cpu, memory by ratio",
        &stored["status"]["allocatable"],
        &with(
            with(raw_allocatable(), "/cpu", json!("4352m")),
            "/memory",
            json!("22863306Ki"),
        ),
    );
}

#[test]
fn allocatable_pointer_is_the_pointer_of_its_segments() {
    for resource in [
        "cpu",
        "memory",
        "pods",
        "ephemeral-storage",
        "nvidia.com/gpu",
        "a~b",
        "",
    ] {
        let expected = crate::patch::pointer(["status", "allocatable", resource]);
        assert_eq!(allocatable_pointer(resource), expected, "{resource}");
    }
}
