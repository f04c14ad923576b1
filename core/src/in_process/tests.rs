//! Table tests of the compiler (pure). What the compiled CEL does on a real API server is
//! tested in tests/cluster/e2e/in_process_test.go, against `review` (the webhook's rule).

use std::borrow::Cow;
use std::time::Duration;

use overcommit_json::StrMap;

use super::*;
use crate::node::{NodeView, decide};
use crate::policy::parse_policy_file;

/// `serve --heartbeat-refresh`'s default.
const REFRESH: Duration = Duration::from_secs(300);
/// The ServiceAccount of the default install, whose status writes are the nudges.
const NUDGER: &str = "system:serviceaccount:kube-overcommit:kube-overcommit";

fn policies(yaml: &str) -> PolicySet {
    match parse_policy_file(yaml).and_then(PolicySet::new) {
        Ok(set) => set,
        Err(e) => panic!("test policies: {e}"),
    }
}

fn map(pairs: &[(&str, &str)]) -> StrMap<'static> {
    pairs
        .iter()
        .map(|(k, v)| (Cow::Owned(k.to_string()), Cow::Owned(v.to_string())))
        .collect()
}

const SET: &str = r#"
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: gpu}
spec:
  nodeSelector: {matchLabels: {pool: gpu}}
  priority: 10
  nodeRatios: {cpu: "2", memory: "1.5", example.com/gpu: "3", pods: "1"}
---
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: usage}
spec:
  nodeSelector: {matchExpressions: [{key: pool, operator: In, values: [usage]}]}
  priority: 20
  nodeRatios: {cpu: "1.5"}
  usage: {targetUtilization: {cpu: "60%"}, maxRatios: {cpu: "4"}}
---
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: empty}
spec:
  priority: 30
---
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: everything}
spec:
  priority: 0
  nodeRatios: {cpu: "1.25"}
"#;

#[test]
fn static_policies_go_in_process_the_others_stay_on_the_webhook_in_priority_order() {
    let compiled = compile(&policies(SET), REFRESH, NUDGER);
    assert_eq!(compiled.in_process, ["gpu", "everything"]);
    assert_eq!(compiled.webhook, ["usage"]);
    let choice = compiled.policy["spec"]["variables"][1]["expression"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // The chain tries the policies in `for_node`'s order; `empty` (no ratios) is skipped; the
    // usage policy's nodes get '!' (left alone).
    let at = |needle: &str| choice.find(needle);
    let (usage, batch, everything) = (at("? '!'"), at("? 'gpu'"), at("? 'everything'"));
    assert!(
        usage.is_some() && batch.is_some() && everything.is_some(),
        "{choice}"
    );
    assert!(usage < batch && batch < everything, "{choice}");
    assert!(!choice.contains("empty"), "{choice}");
    assert!(choice.starts_with("'overcommit.dev/disabled' in variables.labels"));
}

#[test]
fn the_compiled_objects_match_what_the_node_webhook_matches_and_fail_open() {
    let compiled = compile(&policies(SET), REFRESH, NUDGER);
    let spec = &compiled.policy["spec"];
    assert_eq!(spec["failurePolicy"], "Ignore");
    assert_eq!(spec["reinvocationPolicy"], "Never");
    let rules = &spec["matchConstraints"]["resourceRules"];
    assert_eq!(rules[0]["operations"][0], "UPDATE");
    assert_eq!(rules[0]["resources"][0], "nodes/status");
    assert_eq!(rules[1]["operations"][0], "CREATE");
    assert_eq!(rules[1]["resources"][0], "nodes");
    // The writers are a variable the patch reads first, not a match condition: each CEL
    // evaluation converts the node and the old node anew.
    assert!(spec.get("matchConditions").is_none(), "{spec}");
    let takes = spec["variables"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "takes"));
    assert_eq!(
        takes.map(|v| &v["expression"]),
        Some(&Value::from(
            "request.operation == 'CREATE' || (has(request.userInfo.groups) && 'system:nodes' in \
             request.userInfo.groups) || request.userInfo.username == \
             'system:serviceaccount:kube-overcommit:kube-overcommit'"
        ))
    );
    let patch = spec["mutations"][0]["jsonPatch"]["expression"]
        .as_str()
        .unwrap_or_default();
    assert!(patch.starts_with("!variables.takes || "), "{patch}");
    assert_eq!(spec["mutations"][0]["patchType"], "JSONPatch");
    assert_eq!(compiled.binding["spec"]["policyName"], POLICY_NAME);
    assert_eq!(compiled.policy["metadata"]["name"], POLICY_NAME);
    // The binding bounds the policy to the same node writes.
    assert_eq!(
        compiled.binding["spec"]["matchResources"],
        spec["matchConstraints"]
    );
}

/// The applied annotation the node rule writes on a 4-cpu node with these labels.
fn written_applied(set: &PolicySet, labels: &[(&str, &str)]) -> Option<Value> {
    let labels = map(labels);
    let allocatable = map(&[("cpu", "4"), ("memory", "16Gi"), ("pods", "110")]);
    let node = NodeView {
        has_metadata: true,
        labels: Some(&labels),
        allocatable: Some(&allocatable),
        ..NodeView::default()
    };
    let decision = match decide(&node, None, set) {
        Ok(d) => d,
        Err(e) => panic!("{e}"),
    };
    decision
        .patch
        .iter()
        .map(|op| serde_json::to_value(op).unwrap_or_default())
        .find(|op| op["path"] == "/metadata/annotations")
        .map(|op| op["value"][APPLIED_KEY].clone())
}

/// A policy from the CRD has a generation: the compiled text carries it as the node rule
/// writes it.
#[test]
fn applied_text_carries_the_generation_as_the_node_rule_writes_it() {
    let mut policies = match parse_policy_file(SET) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    };
    for (n, policy) in policies.iter_mut().enumerate() {
        policy.metadata.generation = Some(n as i64 + 3);
    }
    let set = match PolicySet::new(policies) {
        Ok(set) => set,
        Err(e) => panic!("{e}"),
    };
    let policy = set.policies().find(|p| p.name == "gpu");
    let text = policy.map(applied_text).unwrap_or_default();
    assert!(text.ends_with(";generation=3"), "{text}");
    assert_eq!(
        written_applied(&set, &[("pool", "gpu")]),
        Some(Value::String(text))
    );
}

#[test]
fn applied_text_is_what_the_node_rule_writes() {
    let set = policies(SET);
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("pool", "gpu")],
            "policy=gpu;ratios=cpu=2,example.com/gpu=3,memory=1.5,pods=1",
        ),
        (&[], "policy=everything;ratios=cpu=1.25"),
    ];
    for (labels, want) in cases {
        let written = written_applied(&set, labels);
        assert_eq!(written, Some(Value::String(want.to_string())));
        let name = want
            .strip_prefix("policy=")
            .and_then(|s| s.split(';').next())
            .unwrap_or_default();
        let policy = set.policies().find(|p| p.name == name);
        assert_eq!(policy.map(applied_text).as_deref(), Some(*want));
        let table = compile(&set, REFRESH, NUDGER).policy["spec"]["variables"][3]["expression"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(table.contains(&format!("'{name}': '{want}'")), "{table}");
    }
}

#[test]
fn selectors_compile_to_kubernetes_semantics() {
    let set = |s: &[&str]| s.iter().map(|v| v.to_string()).collect();
    let cases = [
        (
            Requirement::In("pool".into(), set(&["a", "b"])),
            "(('pool' in variables.labels && variables.labels['pool'] in ['a', 'b']))",
        ),
        (
            Requirement::NotIn("pool".into(), set(&["a"])),
            "(!('pool' in variables.labels && variables.labels['pool'] in ['a']))",
        ),
        (
            Requirement::Exists("gpu".into()),
            "(('gpu' in variables.labels))",
        ),
        (
            Requirement::DoesNotExist("gpu".into()),
            "(!('gpu' in variables.labels))",
        ),
    ];
    for (requirement, want) in cases {
        assert_eq!(
            selector(std::slice::from_ref(&requirement), "variables.labels"),
            want
        );
    }
    assert_eq!(selector(&[], "labels"), "true");
}

#[test]
fn literals_are_escaped() {
    assert_eq!(lit("a'b\\c"), r"'a\'b\\c'");
}

#[test]
fn ratios_are_compiled_to_exact_millionths_without_ones() {
    let compiled = compile(&policies(SET), REFRESH, NUDGER);
    let ratios = compiled.policy["spec"]["variables"][2]["expression"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        ratios.contains("'gpu': {'cpu': 2000000, 'example.com/gpu': 3000000, 'memory': 1500000}"),
        "{ratios}"
    );
    assert!(
        ratios.contains("'everything': {'cpu': 1250000}"),
        "{ratios}"
    );
}

/// A policy with a staged rollout stays with the webhook, which paces its changes; the compiled
/// policy cannot.
#[test]
fn is_static_table() {
    let set = |spec: &str| {
        policies(&format!(
            "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {{name: p}}\nspec:\n  nodeRatios: {{cpu: \"2\"}}\n{spec}"
        ))
    };
    let cases = [
        ("ratios only", "", true),
        (
            "staged rollout",
            "  rollout: {maxNodesPerStep: 2, stepInterval: 10s}\n",
            false,
        ),
        (
            "paused rollout",
            "  rollout: {maxNodesPerStep: 1, paused: true}\n",
            false,
        ),
        (
            "usage",
            "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"4\"}}\n",
            false,
        ),
        ("cap", "  requestCap: {cpu: \"300%\"}\n", false),
    ];
    for (what, spec, want) in cases {
        let set = set(spec);
        let Some(policy) = set.policies().next() else {
            panic!("{what}: no policy")
        };
        assert_eq!(is_static(policy), want, "{what}");
        let compiled = compile(&set, REFRESH, NUDGER);
        let p = vec!["p".to_string()];
        let (served, left) = if want { (p, vec![]) } else { (vec![], p) };
        assert_eq!(
            (compiled.in_process, compiled.webhook),
            (served, left),
            "{what}"
        );
    }
}

/// Per resource some static policy inflates, straight-line variables; the resources in no
/// policy's ratios are restored from the record by `restored` alone.
#[test]
fn each_inflated_resource_gets_its_own_variables() {
    let compiled = compile(&policies(SET), REFRESH, NUDGER);
    let names: Vec<&str> = compiled.policy["spec"]["variables"]
        .as_array()
        .map(|vs| vs.iter().filter_map(|v| v["name"].as_str()).collect())
        .unwrap_or_default();
    // cpu, example.com/gpu, memory (sorted): `gpu` and `everything` inflate them; pods is 1.
    for i in 0..3 {
        for var in ["pr", "fa", "raw", "want"] {
            assert!(
                names.contains(&format!("{var}{i}").as_str()),
                "{var}{i}: {names:?}"
            );
        }
    }
    assert!(!names.contains(&"pr3"), "{names:?}");
    let patch = compiled.policy["spec"]["mutations"][0]["jsonPatch"]["expression"]
        .as_str()
        .unwrap_or_default();
    assert!(
        patch.contains("path: '/status/allocatable/example.com~1gpu', value: variables.want1}"),
        "{patch}"
    );
    let variable = |name: &str| {
        compiled.policy["spec"]["variables"]
            .as_array()
            .and_then(|vs| vs.iter().find(|v| v["name"] == name))
            .and_then(|v| v["expression"].as_str())
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        variable("restored").starts_with(
            "variables.prevRaw.exists(p, !(p.split('=')[0] in ['cpu', 'example.com/gpu', 'memory'])) ?"
        ),
        "{}",
        variable("restored")
    );
    // The record lists the winner's resources in its order, each where the node has it.
    assert!(
        variable("rawRecord").starts_with(
            "(variables.choice == 'gpu' ? [('cpu' in variables.alloc ? 'cpu=' + variables.raw0 : ''), \
             ('example.com/gpu' in variables.alloc ? 'example.com/gpu=' + variables.raw1 : ''), \
             ('memory' in variables.alloc ? 'memory=' + variables.raw2 : '')].filter(t, t != '').join(',') : \
             (variables.choice == 'everything' ? [('cpu' in variables.alloc ? 'cpu=' + variables.raw0 : '')]"
        ),
        "{}",
        variable("rawRecord")
    );
}

#[test]
fn serves_table() {
    let set = policies(SET);
    let usage = policies(
        "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {name: u}\nspec:\n  nodeRatios: {cpu: \"2\"}\n  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"4\"}}\n",
    );
    let static_winner = set
        .policies()
        .find(|p| is_static(p))
        .map(NodeChoice::Policy);
    let usage_winner = usage.policies().next().map(NodeChoice::Policy);
    let cases = [
        ("static winner", static_winner, true),
        ("usage winner", usage_winner, false),
        ("no policy", Some(NodeChoice::NoPolicy), true),
        ("opted out", Some(NodeChoice::OptedOut), true),
    ];
    for (what, choice, want) in cases {
        let Some(choice) = choice else {
            panic!("{what}: no such policy in the test set")
        };
        assert_eq!(serves(&choice), want, "{what}");
    }
}

#[test]
fn quiet_heartbeats_are_compiled_with_the_refresh_period_and_not_when_it_is_off() {
    let variable = |compiled: &Compiled, name: &str| {
        compiled.policy["spec"]["variables"]
            .as_array()
            .and_then(|vs| vs.iter().find(|v| v["name"] == name))
            .map(|v| v["expression"].as_str().unwrap_or_default().to_string())
    };
    let patch = |compiled: &Compiled| {
        compiled.policy["spec"]["mutations"][0]["jsonPatch"]["expression"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    // (refresh, the bounds compiled; None: no heartbeat rule)
    let cases = [
        (
            REFRESH,
            Some("duration('300000ms') && d > duration('-300000ms')"),
        ),
        (
            Duration::from_millis(1500),
            Some("duration('1500ms') && d > duration('-1500ms')"),
        ),
        // A period beyond what a CEL duration holds is compiled as 100 years.
        (
            Duration::from_secs(u64::MAX),
            Some("duration('3153600000000ms')"),
        ),
        (Duration::ZERO, None),
        // The webhook counts in milliseconds: below one, nothing is ever kept.
        (Duration::from_micros(999), None),
    ];
    for (refresh, bounds) in cases {
        let compiled = compile(&policies(SET), refresh, NUDGER);
        let beats = variable(&compiled, "beats");
        let patch = patch(&compiled);
        match bounds {
            Some(bounds) => {
                let beats = beats.unwrap_or_default();
                assert!(beats.contains(bounds), "{refresh:?}: {beats}");
                // Only for a node a policy inflates, only on an update.
                assert!(
                    beats.starts_with("variables.choice != '' && oldObject != null"),
                    "{beats}"
                );
                assert!(
                    patch.ends_with(
                        " + variables.beats.transformList(i, t, t != '', JSONPatch{op: 'add', \
                         path: '/status/conditions/' + string(i) + '/lastHeartbeatTime', value: t})"
                    ),
                    "{patch}"
                );
                // Another writer's write, a node left to the webhook, or a refused value: no
                // patch at all.
                assert!(patch.starts_with(
                    "!variables.takes || variables.choice == '!' || variables.refuse ? [] :"
                ));
            }
            None => {
                assert_eq!(beats, None, "{refresh:?}");
                assert!(!patch.contains("beats"), "{refresh:?}: {patch}");
            }
        }
        // Everything else is the same with or without the rule.
        let without = compile(&policies(SET), Duration::ZERO, NUDGER);
        assert_eq!(compiled.in_process, without.in_process);
        assert_eq!(
            variable(&compiled, "rawRecord"),
            variable(&without, "rawRecord")
        );
    }
}

#[test]
fn every_condition_field_the_webhook_compares_is_compared() {
    let beats = compile(&policies(SET), REFRESH, NUDGER).policy["spec"]["variables"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == "beats"))
        .map(|v| v["expression"].as_str().unwrap_or_default().to_string())
        .unwrap_or_default();
    // By optional field: an absent field equals only an absent one, as `None` in the webhook.
    for field in ["status", "reason", "message", "lastTransitionTime"] {
        assert!(
            beats.contains(&format!("c.?{field} == o.?{field}")),
            "{field}: {beats}"
        );
    }
    // The heartbeat as stored is tested before anything else is read of the stored condition.
    let (as_stored, fields) = (
        beats.find("m[0].lastHeartbeatTime != c.lastHeartbeatTime"),
        beats.find("c.?status"),
    );
    assert!(as_stored.is_some() && as_stored < fields, "{beats}");
}

/// The node webhook's condition while the compiled policy is in force is the complement of what
/// the compiled policy serves: true only where `choice` is `!` (a usage policy wins), in the
/// chain's order; static policies after the last webhook one are dropped; with no webhook
/// policy it is a constant false (the API server never calls the webhook for nodes).
#[test]
fn the_webhook_condition_is_the_complement_of_the_compiled_policy() {
    let compiled = compile(&policies(SET), REFRESH, NUDGER);
    let condition = &compiled.webhook_condition;
    assert!(
        condition.starts_with("[has(object.metadata.labels) ? object.metadata.labels : {}].exists(labels, !('overcommit.dev/disabled' in labels && labels['overcommit.dev/disabled'] == 'true') && "),
        "{condition}"
    );
    let usage = "(('pool' in labels && labels['pool'] in ['usage'])) ? true : ";
    let gpu = "(('pool' in labels && labels['pool'] in ['gpu'])) ? false : ";
    // `gpu` and `everything` (static, after the last webhook policy) and `empty` (skipped) are
    // not there.
    assert!(
        condition.ends_with(&format!("({usage}false))")),
        "{condition}"
    );
    let statics = SET.replace(
        "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"4\"}}\n",
        "",
    );
    assert_eq!(
        compile(&policies(&statics), REFRESH, NUDGER).webhook_condition,
        "false"
    );
    assert_eq!(
        compile(&policies(""), REFRESH, NUDGER).webhook_condition,
        "false"
    );
    // A static policy ahead of a webhook one in the chain gives false for its nodes.
    let ordered = SET.replace("priority: 10", "priority: 30");
    let condition = compile(&policies(&ordered), REFRESH, NUDGER).webhook_condition;
    let (u, g) = (condition.find(usage), condition.find(gpu));
    assert!(g.is_some() && u.is_some() && g < u, "{condition}");
}
