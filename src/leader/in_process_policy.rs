//! The compiled MutatingAdmissionPolicy and binding of in-process mode (`serve --mode`): the
//! desired objects (a pure function of the policy set, the path and the configuration name),
//! the fail-safe placeholder the install ships, and the drift check (the spec only, with the API
//! server's defaults filled in so that a defaulted field is not drift).
//!
//! The ServiceAccount cannot create either object (RBAC cannot limit create by name, and no
//! admission policy can guard admission policies): the install ships both
//! (deploy/components/in-process, Helm inProcess.enabled), the policy as the placeholder, and
//! the leader may only update the policy of its own name (`--in-process-policy leader`), or
//! write nothing at all (`operator`: the operator applies `compile-inprocess`'s output). With
//! `leader`, the policy is rebuilt on every policy change and repaired on drift; on the webhook
//! path, or with no static policy left, ours (label `app.kubernetes.io/managed-by:
//! kube-overcommit`) is put back to the placeholder, which matches nothing; one of our name
//! without the label is left alone then, and taken over when wanted. A missing object is
//! reported, never created: the webhook then serves every node.
//!
//! Both objects are named after `--webhook-config-name` (one installation, one name), so that
//! two installations never share them.
//!
//! Defaults the API server fills in (admissionregistration/v1 defaulting): `failurePolicy`
//! Fail, `reinvocationPolicy` Never (the policy's), `matchPolicy` Equivalent and empty
//! `namespaceSelector`/`objectSelector` in `matchConstraints` (and in a binding's
//! `matchResources` when it has one), `scope` `*` in resource rules.

use std::time::Duration;

use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Map, Value};

use overcommit_core::in_process;
use overcommit_core::policy::PolicySet;

use super::webhook_config::MANAGED_BY;
use crate::mode::Path;

/// The API resource of the compiled policy.
pub fn policy_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            "MutatingAdmissionPolicy",
        ),
        "mutatingadmissionpolicies",
    )
}

/// The API resource of its binding.
pub fn binding_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            "MutatingAdmissionPolicyBinding",
        ),
        "mutatingadmissionpolicybindings",
    )
}

/// The two objects as they must be (None: none wanted, ours holds the placeholder).
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    pub policy: Value,
    pub binding: Value,
    /// The static policies the compiled policy serves.
    pub in_process: Vec<String>,
    /// The node webhook's match condition while the policy is in force: the complement of
    /// what it serves (`hand_over`).
    pub webhook_condition: String,
}

/// The objects for `policies` on `path`, named `name`, with quiet heartbeats refreshed every
/// `heartbeat_refresh` (`serve --heartbeat-refresh`; zero: none), taking the status writes of
/// `nudger` (the leader's nudges) besides the kubelets'.
pub fn desired(
    policies: &PolicySet,
    path: Path,
    name: &str,
    heartbeat_refresh: Duration,
    nudger: &str,
) -> Option<Desired> {
    if path == Path::Webhook {
        return None;
    }
    let compiled = in_process::compile(policies, heartbeat_refresh, nudger);
    if compiled.in_process.is_empty() {
        return None;
    }
    let (policy, binding) = named(compiled.policy, compiled.binding, name);
    Some(Desired {
        policy,
        binding,
        in_process: compiled.in_process,
        webhook_condition: compiled.webhook_condition,
    })
}

/// The compiled policy and binding named `name` (the binding naming the policy): how the
/// leader names them, and `compile-inprocess` too.
pub fn named(mut policy: Value, mut binding: Value, name: &str) -> (Value, Value) {
    policy["metadata"]["name"] = Value::from(name);
    binding["metadata"]["name"] = Value::from(name);
    binding["spec"]["policyName"] = Value::from(name);
    (policy, binding)
}

/// Remove nulls, empty objects and empty arrays, recursively.
fn prune(value: &Value) -> Option<Value> {
    match value {
        Value::Null => None,
        Value::Object(map) => {
            let out: Map<String, Value> = map
                .iter()
                .filter_map(|(k, v)| prune(v).map(|v| (k.clone(), v)))
                .collect();
            (!out.is_empty()).then_some(Value::Object(out))
        }
        Value::Array(items) => {
            let out: Vec<Value> = items.iter().filter_map(prune).collect();
            (!out.is_empty()).then_some(Value::Array(out))
        }
        other => Some(other.clone()),
    }
}

fn set_default(map: &mut Map<String, Value>, key: &str, value: &str) {
    map.entry(key.to_string())
        .or_insert_with(|| Value::from(value));
}

/// A `matchConstraints`/`matchResources` with its defaults; None when nothing but defaults.
fn match_view(value: Option<Value>) -> Option<Value> {
    let Some(Value::Object(mut m)) = value else {
        return value;
    };
    set_default(&mut m, "matchPolicy", "Equivalent");
    for rules in ["resourceRules", "excludeResourceRules"] {
        if let Some(Value::Array(rules)) = m.get_mut(rules) {
            for rule in rules.iter_mut() {
                if let Value::Object(rule) = rule {
                    set_default(rule, "scope", "*");
                }
            }
        }
    }
    if m.len() == 1 && m.get("matchPolicy") == Some(&Value::from("Equivalent")) {
        return None;
    }
    Some(Value::Object(m))
}

/// A spec (policy or binding) with the API server's defaults filled in and empty fields gone.
pub fn spec_view(spec: Option<&Value>, is_policy: bool) -> Value {
    let mut m = match spec.and_then(prune) {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    if is_policy {
        set_default(&mut m, "failurePolicy", "Fail");
        set_default(&mut m, "reinvocationPolicy", "Never");
    }
    for key in ["matchConstraints", "matchResources"] {
        if let Some(v) = match_view(m.remove(key)) {
            m.insert(key.into(), v);
        }
    }
    Value::Object(m)
}

/// The spec fields that differ (empty: no drift). Names only, for logs and metrics.
pub fn drift(actual: &Value, want: &Value, is_policy: bool) -> Vec<String> {
    let a = spec_view(actual.get("spec"), is_policy);
    let w = spec_view(want.get("spec"), is_policy);
    let (Value::Object(a), Value::Object(w)) = (a, w) else {
        return vec!["spec".into()];
    };
    let mut keys: Vec<&String> = a.keys().chain(w.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| a.get(*k) != w.get(*k))
        .map(|k| format!("spec.{k}"))
        .collect()
}

/// Whether an object carries our managed-by label.
pub fn is_managed(object: &Value) -> bool {
    object
        .pointer("/metadata/labels")
        .and_then(|l| l.get(MANAGED_BY.0))
        .and_then(Value::as_str)
        == Some(MANAGED_BY.1)
}

/// The placeholder's mutation: a JSON Patch test, which changes nothing.
const NO_OP_PATCH: &str = "[JSONPatch{op: 'test', path: '/kind', value: 'Node'}]";

/// The policy the install ships (deploy/components/in-process/policy.yaml, the chart's
/// inProcess.enabled), and the one the leader puts back when no compiled policy is wanted: it
/// fails open (`Ignore`) and matches nothing (a match condition that is always false), so that
/// as shipped, and whatever happens to the leader, it changes no write.
pub fn placeholder(name: &str) -> Value {
    serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name, "labels": {MANAGED_BY.0: MANAGED_BY.1}},
        "spec": {
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "Never",
            "matchConstraints": {
                "matchPolicy": "Equivalent",
                "resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                    "resources": ["nodes/status"], "scope": "Cluster",
                }],
            },
            "matchConditions": [{"name": "placeholder-matches-nothing", "expression": "false"}],
            // A patch that changes nothing even if it ran: a test that the object is a Node (the
            // API server refuses an untyped `[]`).
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": NO_OP_PATCH}}],
        },
    })
}

/// Whether a live policy is the placeholder (it applies nothing).
pub fn is_placeholder(actual: &Value, name: &str) -> bool {
    drift(actual, &placeholder(name), true).is_empty()
}

/// What the leader does with the policy (`--in-process-policy leader`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upkeep {
    Keep,
    /// Wanted and missing: the ServiceAccount cannot create it (the install ships it).
    Missing,
    /// Replace the live one with `want` or the placeholder; the drifted fields, for the log.
    Repair(Vec<String>),
}

/// The pure decision for the policy: `want` the compiled one, None for the placeholder. One of
/// our name without our label is left alone when none is wanted (someone else's), taken over
/// (repaired with our label) when one is.
pub fn upkeep(want: Option<&Value>, placeholder: &Value, actual: Option<&Value>) -> Upkeep {
    let Some(actual) = actual else {
        return if want.is_some() {
            Upkeep::Missing
        } else {
            Upkeep::Keep
        };
    };
    let target = match want {
        Some(want) => want,
        None if is_managed(actual) => placeholder,
        None => return Upkeep::Keep,
    };
    let mut drifted = drift(actual, target, true);
    if !is_managed(actual) {
        drifted.push("metadata.labels".into());
    }
    if drifted.is_empty() {
        Upkeep::Keep
    } else {
        Upkeep::Repair(drifted)
    }
}

/// The repaired object: the live one (metadata, resourceVersion, others' labels kept) with our
/// spec and our label.
pub fn repaired(actual: &Value, want: &Value) -> Value {
    let mut out = actual.clone();
    out["spec"] = want.get("spec").cloned().unwrap_or(Value::Null);
    if !out["metadata"]["labels"].is_object() {
        out["metadata"]["labels"] = Value::Object(Map::new());
    }
    out["metadata"]["labels"][MANAGED_BY.0] = Value::from(MANAGED_BY.1);
    out
}

/// One of the two objects as the leader finds it, where it does not write it: the binding (the
/// install ships it and the ServiceAccount may only read it, so that its matchResources bound
/// what the policy the leader writes can act on), and both with `--in-process-policy operator`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectState {
    /// No compiled policy is wanted: the object does not matter.
    NotWanted,
    Ready,
    Missing,
    /// It exists with another spec (an operator-applied policy compiled from other policies);
    /// the fields that differ.
    Differs(Vec<String>),
}

pub fn object_state(want: Option<&Value>, actual: Option<&Value>, is_policy: bool) -> ObjectState {
    match (want, actual) {
        (None, _) => ObjectState::NotWanted,
        (Some(_), None) => ObjectState::Missing,
        (Some(want), Some(actual)) => {
            let drifted = drift(actual, want, is_policy);
            if drifted.is_empty() {
                ObjectState::Ready
            } else {
                ObjectState::Differs(drifted)
            }
        }
    }
}

/// Whether the live objects are the desired ones: the compiled policy is in force as this
/// replica's policy set compiles it (the webhook then leaves those nodes to it).
pub fn in_force(want: Option<&Desired>, policy: Option<&Value>, binding: Option<&Value>) -> bool {
    match (want, policy, binding) {
        (Some(want), Some(policy), Some(binding)) => {
            drift(policy, &want.policy, true).is_empty()
                && drift(binding, &want.binding, false).is_empty()
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use overcommit_core::policy::{OvercommitPolicy, PolicySet};
    use serde_json::json;

    fn set(yaml: &str) -> PolicySet {
        let docs: Vec<OvercommitPolicy> = overcommit_core::policy::parse_policy_file(yaml).unwrap();
        PolicySet::new(docs).unwrap()
    }

    const REFRESH: Duration = Duration::from_secs(300);
    const NUDGER: &str = "system:serviceaccount:kube-overcommit:kube-overcommit";
    const STATIC: &str = "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {name: s}\nspec:\n  nodeRatios: {cpu: \"2\"}\n";
    const USAGE: &str = "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {name: u}\nspec:\n  nodeRatios: {cpu: \"2\"}\n  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"4\"}}\n";

    #[test]
    fn desired_table() {
        let cases = [
            ("static, in-process", STATIC, Path::InProcess, true),
            ("static, webhook", STATIC, Path::Webhook, false),
            ("usage only, in-process", USAGE, Path::InProcess, false),
            ("none, in-process", "", Path::InProcess, false),
        ];
        for (what, yaml, path, some) in cases {
            assert_eq!(
                desired(&set(yaml), path, "ko", REFRESH, NUDGER).is_some(),
                some,
                "{what}"
            );
        }
        let d = desired(&set(STATIC), Path::InProcess, "ko", REFRESH, NUDGER).unwrap();
        assert_eq!(d.policy["metadata"]["name"], "ko");
        assert_eq!(d.binding["metadata"]["name"], "ko");
        assert_eq!(d.binding["spec"]["policyName"], "ko");
        assert_eq!(d.policy["spec"]["failurePolicy"], "Ignore");
        assert!(is_managed(&d.policy) && is_managed(&d.binding));
        assert_eq!(d.in_process, vec!["s".to_string()]);
    }

    #[test]
    fn drift_table() {
        let want = desired(&set(STATIC), Path::InProcess, "ko", REFRESH, NUDGER).unwrap();
        type Edit = fn(&mut Value);
        let cases: Vec<(&str, Edit, bool)> = vec![
            ("unchanged", |_| {}, false),
            (
                "API server defaults filled in",
                |p| {
                    let mc = &mut p["spec"]["matchConstraints"];
                    mc["namespaceSelector"] = json!({});
                    mc["objectSelector"] = json!({});
                    mc["excludeResourceRules"] = json!([]);
                    p["spec"]["paramKind"] = Value::Null;
                    p["metadata"]["resourceVersion"] = json!("12");
                },
                false,
            ),
            (
                "matchPolicy unset means Equivalent",
                |p| {
                    p["spec"]["matchConstraints"]
                        .as_object_mut()
                        .unwrap()
                        .remove("matchPolicy");
                },
                false,
            ),
            (
                "failurePolicy",
                |p| p["spec"]["failurePolicy"] = json!("Fail"),
                true,
            ),
            (
                "failurePolicy unset means Fail",
                |p| {
                    p["spec"].as_object_mut().unwrap().remove("failurePolicy");
                },
                true,
            ),
            (
                "reinvocationPolicy",
                |p| p["spec"]["reinvocationPolicy"] = json!("IfNeeded"),
                true,
            ),
            (
                "mutation hand-edited",
                |p| p["spec"]["mutations"][0]["jsonPatch"]["expression"] = json!("[]"),
                true,
            ),
            (
                "a variable changed",
                |p| p["spec"]["variables"][0]["expression"] = json!("{}"),
                true,
            ),
            (
                "matchConditions added",
                |p| {
                    p["spec"]["matchConditions"] =
                        json!([{"name": "never", "expression": "false"}]);
                },
                true,
            ),
            (
                "objectSelector narrowed",
                |p| {
                    p["spec"]["matchConstraints"]["objectSelector"] =
                        json!({"matchLabels": {"a": "b"}})
                },
                true,
            ),
            (
                "a rule's scope",
                |p| p["spec"]["matchConstraints"]["resourceRules"][0]["scope"] = json!("*"),
                true,
            ),
        ];
        for (what, edit, drifted) in cases {
            let mut actual = want.policy.clone();
            edit(&mut actual);
            assert_eq!(
                !drift(&actual, &want.policy, true).is_empty(),
                drifted,
                "{what}: {:?}",
                drift(&actual, &want.policy, true)
            );
            let fixed = repaired(&actual, &want.policy);
            assert!(drift(&fixed, &want.policy, true).is_empty(), "{what}");
            assert_eq!(
                fixed["metadata"].get("resourceVersion"),
                actual["metadata"].get("resourceVersion")
            );
        }
        // The binding: matchResources as the API server defaults it is not drift.
        let mut b = want.binding.clone();
        let mr = &mut b["spec"]["matchResources"];
        mr["namespaceSelector"] = json!({});
        mr["objectSelector"] = json!({});
        mr.as_object_mut().unwrap().remove("matchPolicy");
        assert!(drift(&b, &want.binding, false).is_empty());
        b["spec"]["policyName"] = json!("other");
        assert_eq!(drift(&b, &want.binding, false), vec!["spec.policyName"]);
    }

    #[test]
    fn upkeep_table() {
        let want = desired(&set(STATIC), Path::InProcess, "ko", REFRESH, NUDGER)
            .unwrap()
            .policy;
        let empty = placeholder("ko");
        let mut unlabelled = want.clone();
        unlabelled["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("labels");
        let mut edited = want.clone();
        edited["spec"]["failurePolicy"] = json!("Fail");
        let mut matching = empty.clone();
        matching["spec"]["matchConditions"][0]["expression"] = json!("true");
        // What tells the compiled policy from the placeholder.
        let filled: Vec<String> = [
            "spec.matchConditions",
            "spec.matchConstraints",
            "spec.mutations",
            "spec.variables",
        ]
        .map(String::from)
        .to_vec();
        let cases = [
            (
                "wanted, missing: never created",
                Some(&want),
                None,
                Upkeep::Missing,
            ),
            ("wanted, in place", Some(&want), Some(&want), Upkeep::Keep),
            (
                "wanted, the shipped placeholder",
                Some(&want),
                Some(&empty),
                Upkeep::Repair(filled.clone()),
            ),
            (
                "wanted, hand-edited",
                Some(&want),
                Some(&edited),
                Upkeep::Repair(vec!["spec.failurePolicy".into()]),
            ),
            (
                "wanted, someone else's of our name: taken over",
                Some(&want),
                Some(&unlabelled),
                Upkeep::Repair(vec!["metadata.labels".into()]),
            ),
            (
                "not wanted, ours: back to the placeholder",
                None,
                Some(&want),
                Upkeep::Repair(filled.clone()),
            ),
            (
                "not wanted, the placeholder",
                None,
                Some(&empty),
                Upkeep::Keep,
            ),
            (
                "not wanted, the placeholder made to match",
                None,
                Some(&matching),
                Upkeep::Repair(vec!["spec.matchConditions".into()]),
            ),
            (
                "not wanted, someone else's",
                None,
                Some(&unlabelled),
                Upkeep::Keep,
            ),
            ("not wanted, none", None, None, Upkeep::Keep),
        ];
        for (what, w, a, expected) in cases {
            assert_eq!(upkeep(w, &empty, a), expected, "{what}");
        }
        assert!(is_managed(&repaired(&unlabelled, &want)));
        assert!(is_placeholder(&repaired(&want, &empty), "ko"));
        assert!(!is_placeholder(&want, "ko") && !is_placeholder(&matching, "ko"));
    }

    #[test]
    fn object_state_table() {
        let d = desired(&set(STATIC), Path::InProcess, "ko", REFRESH, NUDGER).unwrap();
        let want = d.binding.clone();
        let mut widened = want.clone();
        widened["spec"]
            .as_object_mut()
            .unwrap()
            .remove("matchResources");
        let mut other_policy = want.clone();
        other_policy["spec"]["policyName"] = json!("someone-else");
        let cases = [
            ("not wanted, none", None, None, ObjectState::NotWanted),
            (
                "not wanted, there",
                None,
                Some(&want),
                ObjectState::NotWanted,
            ),
            ("wanted, missing", Some(&want), None, ObjectState::Missing),
            (
                "wanted, as compiled",
                Some(&want),
                Some(&want),
                ObjectState::Ready,
            ),
            (
                "without matchResources (the policy alone would bound it)",
                Some(&want),
                Some(&widened),
                ObjectState::Differs(vec!["spec.matchResources".into()]),
            ),
            (
                "binding another policy",
                Some(&want),
                Some(&other_policy),
                ObjectState::Differs(vec!["spec.policyName".into()]),
            ),
        ];
        for (what, w, a, expected) in cases {
            assert_eq!(object_state(w, a, false), expected, "{what}");
        }
        // An operator-applied policy compiled from other policies (a ratio since changed).
        let older = desired(
            &set(&STATIC.replace("\"2\"", "\"3\"")),
            Path::InProcess,
            "ko",
            REFRESH,
            NUDGER,
        )
        .unwrap();
        assert_eq!(
            object_state(Some(&d.policy), Some(&older.policy), true),
            ObjectState::Differs(vec!["spec.variables".into()])
        );
        assert_eq!(
            object_state(Some(&d.policy), Some(&d.policy), true),
            ObjectState::Ready
        );
    }

    /// What the install ships (deploy/components/in-process; the chart renders the same, tests/deploy
    /// compares them): the binding the leader expects with the default name, and the placeholder
    /// policy, which fails open and matches nothing.
    #[test]
    fn the_shipped_objects_are_the_compiled_binding_and_the_placeholder() {
        let read = |file: &str| -> Value {
            let path = format!(
                "{}/deploy/components/in-process/{file}",
                env!("CARGO_MANIFEST_DIR")
            );
            serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
        };
        let shipped = read("binding.yaml");
        let want = desired(
            &set(STATIC),
            Path::InProcess,
            "kube-overcommit",
            REFRESH,
            NUDGER,
        )
        .unwrap();
        assert_eq!(
            shipped["metadata"]["name"],
            want.binding["metadata"]["name"]
        );
        assert_eq!(
            object_state(Some(&want.binding), Some(&shipped), false),
            ObjectState::Ready
        );
        let policy = read("policy.yaml");
        assert_eq!(policy["metadata"]["name"], "kube-overcommit");
        assert!(is_managed(&policy), "{policy}");
        assert!(is_placeholder(&policy, "kube-overcommit"), "{policy}");
        assert_eq!(policy["spec"]["failurePolicy"], "Ignore");
        assert_eq!(
            policy["spec"]["matchConditions"][0]["expression"], "false",
            "the placeholder matches nothing"
        );
    }

    #[test]
    fn in_force_table() {
        let want = desired(&set(STATIC), Path::InProcess, "ko", REFRESH, NUDGER).unwrap();
        let other = desired(
            &set(&STATIC.replace("\"2\"", "\"3\"")),
            Path::InProcess,
            "ko",
            REFRESH,
            NUDGER,
        )
        .unwrap();
        let cases = [
            (
                "both in place",
                Some(&want),
                Some(&want.policy),
                Some(&want.binding),
                true,
            ),
            ("no binding", Some(&want), Some(&want.policy), None, false),
            ("no policy", Some(&want), None, Some(&want.binding), false),
            (
                "older policy set",
                Some(&want),
                Some(&other.policy),
                Some(&want.binding),
                false,
            ),
            (
                "none wanted",
                None,
                Some(&want.policy),
                Some(&want.binding),
                false,
            ),
        ];
        for (what, w, p, b, expected) in cases {
            assert_eq!(in_force(w, p, b), expected, "{what}");
        }
    }
}
