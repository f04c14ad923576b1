//! Table tests of the pod rule; every case also checks that the patched pod is left alone
//! when reviewed again.

use serde_json::{Value, json};

use super::*;
use crate::policy::parse_policy_file;

fn policies(pod_defaults: &str) -> PolicySet {
    let yaml = format!(
        "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {{name: pods}}\nspec:\n  podDefaults: {pod_defaults}\n"
    );
    match parse_policy_file(&yaml).and_then(PolicySet::new) {
        Ok(set) => set,
        Err(e) => panic!("{e}"),
    }
}

const DEFAULTS: &str = r#"{requests: {cpu: 100m, memory: 128Mi}}"#;
const PERCENT: &str =
    r#"{requests: {cpu: 100m, memory: 128Mi}, requestToLimitPercent: {cpu: 25, memory: 50}}"#;

fn decide_json(namespace: &str, pod: &Value, set: &PolicySet) -> Result<PodDecision, PodError> {
    let text = pod
        .get("spec")
        .map(Value::to_string)
        .unwrap_or_else(|| "null".into());
    let spec: Option<PodSpecIn<'_>> = match serde_json::from_str(&text) {
        Ok(spec) => spec,
        Err(e) => panic!("test pod does not parse: {e}"),
    };
    decide(namespace, "kube-overcommit", spec.as_ref(), set)
}

fn apply(pod: &Value, ops: &[PatchOp]) -> Value {
    let mut patched = pod.clone();
    let patch: json_patch::Patch = match serde_json::to_value(ops).and_then(serde_json::from_value)
    {
        Ok(p) => p,
        Err(e) => panic!("not a JSON patch: {e}"),
    };
    if let Err(e) = json_patch::patch(&mut patched, &patch) {
        panic!("patch does not apply: {e}");
    }
    patched
}

fn pod(containers: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team"},
           "spec": {"containers": containers, "restartPolicy": "Always"}})
}

struct Case {
    name: &'static str,
    defaults: &'static str,
    namespace: &'static str,
    pod: Value,
    outcome: PodOutcome,
    /// (JSON pointer, expected value after the patch)
    expect: Vec<(&'static str, Value)>,
}

fn cases() -> Vec<Case> {
    let applies = || PodOutcome::Defaults("pods".into());
    vec![
        Case {
            name: "container without resources gets both defaults",
            defaults: DEFAULTS,
            namespace: "team",
            pod: pod(json!([{"name": "app", "image": "app:1"}])),
            outcome: applies(),
            expect: vec![(
                "/spec/containers/0/resources",
                json!({"requests": {"cpu": "100m", "memory": "128Mi"}}),
            )],
        },
        Case {
            name: "empty resources gets a requests map",
            defaults: DEFAULTS,
            namespace: "team",
            pod: pod(json!([{"name": "app", "resources": {}}])),
            outcome: applies(),
            expect: vec![(
                "/spec/containers/0/resources/requests",
                json!({"cpu": "100m", "memory": "128Mi"}),
            )],
        },
        Case {
            name: "only the missing request is defaulted",
            defaults: DEFAULTS,
            namespace: "team",
            pod: pod(json!([{"name": "app", "resources": {"requests": {"cpu": "2"}}}])),
            outcome: applies(),
            expect: vec![(
                "/spec/containers/0/resources/requests",
                json!({"cpu": "2", "memory": "128Mi"}),
            )],
        },
        Case {
            name: "a limit without request is left to Kubernetes' request = limit",
            defaults: DEFAULTS,
            namespace: "team",
            pod: pod(json!([{"name": "app", "resources": {"limits": {"cpu": "50m"}}}])),
            outcome: applies(),
            expect: vec![
                (
                    "/spec/containers/0/resources/requests",
                    json!({"memory": "128Mi"}),
                ),
                ("/spec/containers/0/resources/limits", json!({"cpu": "50m"})),
            ],
        },
        Case {
            name: "request-to-limit replaces the request with a share of the limit",
            defaults: PERCENT,
            namespace: "team",
            pod: pod(json!([{"name": "app", "resources": {
                "requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}}}])),
            outcome: applies(),
            expect: vec![(
                "/spec/containers/0/resources/requests",
                json!({"cpu": "500m", "memory": "1Gi"}),
            )],
        },
        Case {
            name: "request-to-limit floors to millicores and bytes",
            defaults: PERCENT,
            namespace: "team",
            pod: pod(
                json!([{"name": "app", "resources": {"requests": {"cpu": "1m"}, "limits": {"cpu": "3m", "memory": "1001"}}}]),
            ),
            outcome: applies(),
            // 3m x 25% is below a millicore: the request stays; 1001 x 50% = 500.5 -> 500
            expect: vec![(
                "/spec/containers/0/resources/requests",
                json!({"cpu": "1m", "memory": "500"}),
            )],
        },
        Case {
            name: "request-to-limit for one resource, default for the other",
            defaults: r#"{requests: {memory: 64Mi}, requestToLimitPercent: {cpu: 10}}"#,
            namespace: "team",
            pod: pod(json!([{"name": "app", "resources": {"limits": {"cpu": "1"}}}])),
            outcome: applies(),
            expect: vec![(
                "/spec/containers/0/resources/requests",
                json!({"cpu": "100m", "memory": "64Mi"}),
            )],
        },
        Case {
            name: "init containers and sidecars are handled like containers",
            defaults: DEFAULTS,
            namespace: "team",
            pod: json!({"metadata": {"namespace": "team"}, "spec": {
                "initContainers": [{"name": "init"}, {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}}}],
                "containers": [{"name": "app"}]}}),
            outcome: applies(),
            expect: vec![
                (
                    "/spec/initContainers/0/resources",
                    json!({"requests": {"cpu": "100m", "memory": "128Mi"}}),
                ),
                (
                    "/spec/initContainers/1/resources/requests",
                    json!({"cpu": "1m", "memory": "1Mi"}),
                ),
                (
                    "/spec/containers/0/resources",
                    json!({"requests": {"cpu": "100m", "memory": "128Mi"}}),
                ),
            ],
        },
        Case {
            name: "Guaranteed pod is left alone",
            defaults: PERCENT,
            namespace: "team",
            pod: pod(json!([
                {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1000m", "memory": "1Gi"}}},
                {"name": "b", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}])),
            outcome: PodOutcome::Guaranteed,
            expect: vec![(
                "/spec/containers/0/resources/requests",
                json!({"cpu": "1", "memory": "1Gi"}),
            )],
        },
        Case {
            name: "one Burstable container makes the pod Burstable",
            defaults: PERCENT,
            namespace: "team",
            pod: pod(json!([
                {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}},
                {"name": "b"}])),
            outcome: applies(),
            expect: vec![
                (
                    "/spec/containers/0/resources/requests",
                    json!({"cpu": "250m", "memory": "512Mi"}),
                ),
                (
                    "/spec/containers/1/resources/requests",
                    json!({"cpu": "100m", "memory": "128Mi"}),
                ),
            ],
        },
        Case {
            name: "kube-system is never touched",
            defaults: DEFAULTS,
            namespace: "kube-system",
            pod: pod(json!([{"name": "app"}])),
            outcome: PodOutcome::ExcludedNamespace,
            expect: vec![("/spec/containers/0/resources", Value::Null)],
        },
        Case {
            name: "the webhook's own namespace is never touched",
            defaults: DEFAULTS,
            namespace: "kube-overcommit",
            pod: pod(json!([{"name": "app"}])),
            outcome: PodOutcome::ExcludedNamespace,
            expect: vec![("/spec/containers/0/resources", Value::Null)],
        },
        Case {
            name: "pod-level resources are left alone",
            defaults: DEFAULTS,
            namespace: "team",
            pod: json!({"spec": {"resources": {"requests": {"cpu": "1"}}, "containers": [{"name": "app"}]}}),
            outcome: PodOutcome::PodLevelResources,
            expect: vec![("/spec/containers/0/resources", Value::Null)],
        },
        Case {
            name: "container names with / and ~ do not matter: paths use indexes",
            defaults: DEFAULTS,
            namespace: "team",
            pod: pod(json!([{"name": "a/b~c", "resources": {"requests": {"memory": "1Gi"}}}])),
            outcome: applies(),
            expect: vec![(
                "/spec/containers/0/resources/requests",
                json!({"cpu": "100m", "memory": "1Gi"}),
            )],
        },
    ]
}

#[test]
fn pod_rule_table() {
    for case in cases() {
        let set = policies(case.defaults);
        let decision = decide_json(case.namespace, &case.pod, &set)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert_eq!(decision.outcome, case.outcome, "{}", case.name);
        let patched = apply(&case.pod, &decision.patch);
        for (pointer, expected) in &case.expect {
            assert_eq!(
                patched.pointer(pointer).unwrap_or(&Value::Null),
                expected,
                "{}: {pointer}",
                case.name
            );
        }
        // Only requests change.
        for op in &decision.patch {
            assert!(op.path().contains("/resources"), "{}: {op:?}", case.name);
            assert!(!op.path().contains("limits"), "{}: {op:?}", case.name);
        }
        let again = decide_json(case.namespace, &patched, &set)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert_eq!(
            again.patch,
            vec![],
            "{}: second review must not patch",
            case.name
        );
    }
}

#[test]
fn no_policy_with_pod_defaults_leaves_pods_alone() {
    let decision = decide_json(
        "team",
        &pod(json!([{"name": "app"}])),
        &PolicySet::default(),
    );
    assert_eq!(
        decision.map(|d| (d.outcome, d.patch)),
        Ok((PodOutcome::NoDefaults, vec![]))
    );
}

#[test]
fn unreadable_limit_is_an_error_not_a_guess() {
    let set = policies(PERCENT);
    let result = decide_json(
        "team",
        &pod(json!([{"name": "app", "resources": {"limits": {"cpu": "lots"}}}])),
        &set,
    );
    match result {
        Err(e) => assert_eq!(
            (e.container.as_str(), e.field, e.resource.as_str()),
            ("app", "limit", "cpu")
        ),
        Ok(d) => panic!("expected an error, got {d:?}"),
    }
}

#[test]
fn request_never_exceeds_limit() {
    let set = policies(r#"{requests: {cpu: "4", memory: 8Gi}, requestToLimitPercent: {cpu: 100}}"#);
    let pod =
        pod(json!([{"name": "app", "resources": {"limits": {"cpu": "250m", "memory": "1Gi"}}}]));
    let decision = decide_json("team", &pod, &set).unwrap_or_else(|e| panic!("{e}"));
    let patched = apply(&pod, &decision.patch);
    for resource in ["cpu", "memory"] {
        let get = |field: &str| {
            patched
                .pointer(&format!("/spec/containers/0/resources/{field}/{resource}"))
                .and_then(Value::as_str)
                .and_then(|t| Quantity::parse(t).ok())
        };
        if let (Some(request), Some(limit)) = (get("requests"), get("limits")) {
            assert!(request <= limit, "{resource}: {request} > {limit}");
        }
    }
}

#[test]
fn explain_lists_each_change() {
    let set = policies(PERCENT);
    let pod = pod(json!([{"name": "app", "resources": {"limits": {"cpu": "2"}}}]));
    let text = decide_json("team", &pod, &set)
        .unwrap_or_else(|e| panic!("{e}"))
        .explain();
    assert!(
        text.contains("container app: cpu request none -> 500m (25% of the limit)"),
        "{text}"
    );
    assert!(
        text.contains("container app: memory request none -> 128Mi (default)"),
        "{text}"
    );
}

#[test]
fn patch_only_decides_as_the_full_account() {
    for case in cases() {
        let set = policies(case.defaults);
        let text = case
            .pod
            .get("spec")
            .map(Value::to_string)
            .unwrap_or_else(|| "null".into());
        let spec: Option<PodSpecIn<'_>> = match serde_json::from_str(&text) {
            Ok(spec) => spec,
            Err(e) => panic!("test pod does not parse: {e}"),
        };
        let decide = |account| {
            decide_with(
                case.namespace,
                "kube-overcommit",
                spec.as_ref(),
                &set,
                account,
            )
        };
        match (decide(Account::Full), decide(Account::PatchOnly)) {
            (Ok(full), Ok(patch_only)) => {
                assert_eq!(patch_only.outcome, full.outcome, "{}", case.name);
                assert_eq!(patch_only.patch, full.patch, "{}", case.name);
                assert!(patch_only.changes.is_empty(), "{}", case.name);
            }
            (full, patch_only) => panic!("{}: {full:?} vs {patch_only:?}", case.name),
        }
    }
}
