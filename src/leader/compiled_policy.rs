//! The compiled MutatingAdmissionPolicy and binding the leader keeps in place in in-process
//! mode (`serve --mode`): the desired objects (a pure function of the policy set, the path and
//! the configuration name) and the drift check (the spec only, with the API server's defaults
//! filled in so that a defaulted field is not drift). Kept like the webhook configurations
//! (`webhook_config`): created when missing, repaired on drift, rebuilt on every policy change,
//! deleted when the path is the webhook or no static policy remains; only objects labelled
//! `app.kubernetes.io/managed-by: kube-overcommit` are deleted, one of our name without it is
//! taken over when wanted.
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

use overcommit_core::inprocess;
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

/// The two objects as they must be (None: none wanted, the leader deletes ours).
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    pub policy: Value,
    pub binding: Value,
    /// The static policies the compiled policy serves.
    pub in_process: Vec<String>,
}

/// The objects for `policies` on `path`, named `name`, with quiet heartbeats refreshed every
/// `heartbeat_refresh` (`serve --heartbeat-refresh`; zero: none).
pub fn desired(
    policies: &PolicySet,
    path: Path,
    name: &str,
    heartbeat_refresh: Duration,
) -> Option<Desired> {
    if path == Path::Webhook {
        return None;
    }
    let compiled = inprocess::compile(policies, heartbeat_refresh);
    if compiled.in_process.is_empty() {
        return None;
    }
    let (policy, binding) = named(compiled.policy, compiled.binding, name);
    Some(Desired {
        policy,
        binding,
        in_process: compiled.in_process,
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

/// What the leader does with one of the two objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upkeep {
    Keep,
    Create,
    /// Replace the live one; the drifted fields, for the log.
    Repair(Vec<String>),
    /// Not wanted and the live one is ours: delete it.
    Delete,
}

/// The pure decision for one object. One of our name without our label is left alone when
/// none is wanted (someone else's), taken over (repaired with our label) when one is.
pub fn upkeep(want: Option<&Value>, actual: Option<&Value>, is_policy: bool) -> Upkeep {
    match (want, actual) {
        (Some(_), None) => Upkeep::Create,
        (Some(want), Some(actual)) => {
            let mut drifted = drift(actual, want, is_policy);
            if !is_managed(actual) {
                drifted.push("metadata.labels".into());
            }
            if drifted.is_empty() {
                Upkeep::Keep
            } else {
                Upkeep::Repair(drifted)
            }
        }
        (None, Some(actual)) if is_managed(actual) => Upkeep::Delete,
        (None, _) => Upkeep::Keep,
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

/// The binding as the leader finds it. The leader never writes it: the install ships it
/// (deploy/components/in-process, Helm inProcess.enabled) and the ServiceAccount may only read
/// it, so that its matchResources bound what the policy the leader writes can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindingState {
    /// No compiled policy is wanted: the binding does not matter.
    NotWanted,
    Ready,
    Missing,
    /// It exists with another spec; the fields that differ.
    Differs(Vec<String>),
}

pub fn binding_state(want: Option<&Value>, actual: Option<&Value>) -> BindingState {
    match (want, actual) {
        (None, _) => BindingState::NotWanted,
        (Some(_), None) => BindingState::Missing,
        (Some(want), Some(actual)) => {
            let drifted = drift(actual, want, false);
            if drifted.is_empty() {
                BindingState::Ready
            } else {
                BindingState::Differs(drifted)
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
                desired(&set(yaml), path, "ko", REFRESH).is_some(),
                some,
                "{what}"
            );
        }
        let d = desired(&set(STATIC), Path::InProcess, "ko", REFRESH).unwrap();
        assert_eq!(d.policy["metadata"]["name"], "ko");
        assert_eq!(d.binding["metadata"]["name"], "ko");
        assert_eq!(d.binding["spec"]["policyName"], "ko");
        assert_eq!(d.policy["spec"]["failurePolicy"], "Ignore");
        assert!(is_managed(&d.policy) && is_managed(&d.binding));
        assert_eq!(d.in_process, vec!["s".to_string()]);
    }

    #[test]
    fn drift_table() {
        let want = desired(&set(STATIC), Path::InProcess, "ko", REFRESH).unwrap();
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
                "matchConditions removed",
                |p| {
                    p["spec"].as_object_mut().unwrap().remove("matchConditions");
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
        let want = desired(&set(STATIC), Path::InProcess, "ko", REFRESH)
            .unwrap()
            .policy;
        let mut unlabelled = want.clone();
        unlabelled["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("labels");
        let mut edited = want.clone();
        edited["spec"]["failurePolicy"] = json!("Fail");
        let cases = [
            ("wanted, missing", Some(&want), None, Upkeep::Create),
            ("wanted, in place", Some(&want), Some(&want), Upkeep::Keep),
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
            ("not wanted, ours", None, Some(&want), Upkeep::Delete),
            (
                "not wanted, someone else's",
                None,
                Some(&unlabelled),
                Upkeep::Keep,
            ),
            ("not wanted, none", None, None, Upkeep::Keep),
        ];
        for (what, w, a, expected) in cases {
            assert_eq!(upkeep(w, a, true), expected, "{what}");
        }
        assert!(is_managed(&repaired(&unlabelled, &want)));
    }

    #[test]
    fn binding_state_table() {
        let want = desired(&set(STATIC), Path::InProcess, "ko", REFRESH)
            .unwrap()
            .binding;
        let mut widened = want.clone();
        widened["spec"]
            .as_object_mut()
            .unwrap()
            .remove("matchResources");
        let mut other_policy = want.clone();
        other_policy["spec"]["policyName"] = json!("someone-else");
        let cases = [
            ("not wanted, none", None, None, BindingState::NotWanted),
            (
                "not wanted, there",
                None,
                Some(&want),
                BindingState::NotWanted,
            ),
            ("wanted, missing", Some(&want), None, BindingState::Missing),
            (
                "wanted, as compiled",
                Some(&want),
                Some(&want),
                BindingState::Ready,
            ),
            (
                "without matchResources (the policy alone would bound it)",
                Some(&want),
                Some(&widened),
                BindingState::Differs(vec!["spec.matchResources".into()]),
            ),
            (
                "binding another policy",
                Some(&want),
                Some(&other_policy),
                BindingState::Differs(vec!["spec.policyName".into()]),
            ),
        ];
        for (what, w, a, expected) in cases {
            assert_eq!(binding_state(w, a), expected, "{what}");
        }
    }

    /// The binding the install ships (deploy/components/in-process; the chart renders the same,
    /// tests/deploy compares them) is the one the leader expects with the default name.
    #[test]
    fn the_shipped_binding_is_the_compiled_one() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/deploy/components/in-process/binding.yaml"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let shipped: Value = serde_yaml::from_str(&text).unwrap();
        let want = desired(&set(STATIC), Path::InProcess, "kube-overcommit", REFRESH).unwrap();
        assert_eq!(
            shipped["metadata"]["name"],
            want.binding["metadata"]["name"]
        );
        assert_eq!(
            binding_state(Some(&want.binding), Some(&shipped)),
            BindingState::Ready
        );
    }

    #[test]
    fn in_force_table() {
        let want = desired(&set(STATIC), Path::InProcess, "ko", REFRESH).unwrap();
        let other = desired(
            &set(&STATIC.replace("\"2\"", "\"3\"")),
            Path::InProcess,
            "ko",
            REFRESH,
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
