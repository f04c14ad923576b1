//! Table tests of the policy status (pure).

use super::*;
use crate::policy::parse_policy_file;

/// Policies from YAML, each with `metadata.generation` as given (the API server sets it).
fn policies(yaml: &str, generations: &[(&str, i64)]) -> Vec<OvercommitPolicy> {
    let mut policies = parse_policy_file(yaml).unwrap_or_else(|e| panic!("{e}"));
    for policy in &mut policies {
        let name = policy.metadata.name.clone().unwrap_or_default();
        policy.metadata.generation = generations
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, g)| *g);
    }
    policies
}

fn node(labels: &[(&str, &str)], applied: Option<&str>) -> NodeFacts {
    NodeFacts {
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        applied: applied.map(str::to_string),
        ..NodeFacts::default()
    }
}

const POLICIES: &str = r#"
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: batch}
spec:
  nodeSelector: {matchLabels: {pool: batch}}
  priority: 10
  nodeRatios: {cpu: "2"}
---
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: low}
spec:
  nodeSelector: {matchLabels: {pool: batch}}
  priority: 1
  nodeRatios: {cpu: "1.5"}
---
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: none}
spec:
  nodeSelector: {matchLabels: {pool: nowhere}}
  nodeRatios: {cpu: "2"}
---
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: usage}
spec:
  nodeSelector: {matchLabels: {pool: usage}}
  nodeRatios: {cpu: "1.5"}
  usage: {targetUtilization: {cpu: "70%"}, maxRatios: {cpu: "3"}}
---
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: pods-only}
spec:
  podDefaults: {requests: {cpu: 100m}}
"#;

const GENERATIONS: &[(&str, i64)] = &[
    ("batch", 3),
    ("low", 1),
    ("none", 1),
    ("usage", 2),
    ("pods-only", 1),
];

/// (selected, at generation, shadowed, opted out, usage fallback, Ready, its reason,
/// Progressing, Degraded's reason).
type Want = (
    i64,
    i64,
    i64,
    i64,
    i64,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
);

fn summary(status: &OvercommitPolicyStatus) -> Want {
    let condition = |t: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == t)
            .unwrap_or_else(|| panic!("no {t}"))
    };
    let leak = |s: &str| -> &'static str { Box::leak(s.to_string().into_boxed_str()) };
    (
        status.nodes_selected,
        status.nodes_at_generation,
        status.nodes_shadowed,
        status.nodes_opted_out,
        status.nodes_usage_fallback,
        leak(&condition("Ready").status),
        leak(&condition("Ready").reason),
        leak(&condition("Progressing").status),
        leak(&condition("Degraded").reason),
    )
}

#[test]
fn counts_and_conditions_from_nodes() {
    let batch_now = "policy=batch;ratios=cpu=2;generation=3";
    let batch_old = "policy=batch;ratios=cpu=2;generation=2";
    let batch_before_generations = "policy=batch;ratios=cpu=2";
    let usage_set = "policy=usage;ratios=cpu=1.5;generation=2;usage=cpu=5";
    let usage_fallback = "policy=usage;ratios=cpu=1.5;generation=2";
    type Case = (
        &'static str,
        Vec<NodeFacts>,
        &'static [(&'static str, Want)],
    );
    let cases: Vec<Case> = vec![
        (
            "every batch node at the current generation; low shadowed",
            vec![
                node(&[("pool", "batch")], Some(batch_now)),
                node(&[("pool", "batch")], Some(batch_now)),
            ],
            &[
                (
                    "batch",
                    (2, 2, 0, 0, 0, "True", "Applied", "False", "AsExpected"),
                ),
                (
                    "low",
                    (
                        2,
                        0,
                        2,
                        0,
                        0,
                        "False",
                        "AllNodesShadowed",
                        "False",
                        "AsExpected",
                    ),
                ),
                (
                    "none",
                    (
                        0,
                        0,
                        0,
                        0,
                        0,
                        "False",
                        "NoNodeSelected",
                        "False",
                        "AsExpected",
                    ),
                ),
                (
                    "pods-only",
                    (
                        0,
                        0,
                        0,
                        0,
                        0,
                        "True",
                        "PodDefaultsOnly",
                        "False",
                        "PodDefaultsOnly",
                    ),
                ),
            ],
        ),
        (
            "one node on an older generation, one written before generations, one unwritten",
            vec![
                node(&[("pool", "batch")], Some(batch_now)),
                node(&[("pool", "batch")], Some(batch_old)),
                node(&[("pool", "batch")], Some(batch_before_generations)),
                node(&[("pool", "batch")], None),
            ],
            &[(
                "batch",
                (4, 1, 0, 0, 0, "False", "NodesPending", "True", "AsExpected"),
            )],
        ),
        (
            "opted-out nodes are not selected",
            vec![
                node(&[("pool", "batch"), (DISABLED_LABEL, "true")], None),
                node(&[("pool", "batch")], Some(batch_now)),
            ],
            &[
                (
                    "batch",
                    (1, 1, 0, 1, 0, "True", "Applied", "False", "AsExpected"),
                ),
                (
                    "low",
                    (
                        1,
                        0,
                        1,
                        1,
                        0,
                        "False",
                        "AllNodesShadowed",
                        "False",
                        "AsExpected",
                    ),
                ),
            ],
        ),
        (
            "every matching node opted out",
            vec![node(&[("pool", "batch"), (DISABLED_LABEL, "true")], None)],
            &[(
                "batch",
                (
                    0,
                    0,
                    0,
                    1,
                    0,
                    "False",
                    "AllNodesOptedOut",
                    "False",
                    "AsExpected",
                ),
            )],
        ),
        (
            "a usage policy with one node on the fallback",
            vec![
                node(&[("pool", "usage")], Some(usage_set)),
                node(&[("pool", "usage")], Some(usage_fallback)),
            ],
            &[(
                "usage",
                (
                    2,
                    2,
                    0,
                    0,
                    1,
                    "True",
                    "Applied",
                    "False",
                    "UsageUnavailable",
                ),
            )],
        ),
        (
            "an unreadable annotation counts as not carrying the generation",
            vec![node(&[("pool", "batch")], Some("policy=batch;garbage"))],
            &[(
                "batch",
                (1, 0, 0, 0, 0, "False", "NodesPending", "True", "AsExpected"),
            )],
        ),
        (
            "another policy's annotation on a node batch now governs",
            vec![node(
                &[("pool", "batch")],
                Some("policy=low;ratios=cpu=1.5;generation=3"),
            )],
            &[(
                "batch",
                (1, 0, 0, 0, 0, "False", "NodesPending", "True", "AsExpected"),
            )],
        ),
    ];
    for (what, nodes, wants) in cases {
        let statuses = desired_statuses(
            &policies(POLICIES, GENERATIONS),
            &nodes,
            InProcessState::default(),
            "2026-01-01T00:00:00Z",
        );
        for (name, want) in wants {
            let status = statuses
                .get(*name)
                .unwrap_or_else(|| panic!("{what}: {name}"));
            assert_eq!(summary(status), *want, "{what}: {name}");
            let generation = GENERATIONS.iter().find(|(n, _)| n == name).map(|(_, g)| *g);
            assert_eq!(status.observed_generation, generation, "{what}: {name}");
        }
    }
}

#[test]
fn in_process_not_in_force_degrades_static_policies_only() {
    let nodes = [
        node(
            &[("pool", "batch")],
            Some("policy=batch;ratios=cpu=2;generation=3"),
        ),
        node(
            &[("pool", "usage")],
            Some("policy=usage;ratios=cpu=1.5;generation=2;usage=cpu=5"),
        ),
    ];
    let degraded = |state, name: &str| {
        let statuses = desired_statuses(&policies(POLICIES, GENERATIONS), &nodes, state, "t");
        summary(&statuses[name]).8
    };
    let off = InProcessState {
        mode: true,
        in_force: false,
    };
    let on = InProcessState {
        mode: true,
        in_force: true,
    };
    assert_eq!(degraded(off, "batch"), "InProcessNotInForce");
    assert_eq!(degraded(off, "usage"), "AsExpected");
    assert_eq!(degraded(on, "batch"), "AsExpected");
    assert_eq!(degraded(InProcessState::default(), "batch"), "AsExpected");
}

#[test]
fn an_invalid_policy_says_why() {
    let yaml = r#"
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: bad}
spec:
  nodeRatios: {cpu: "20"}
"#;
    // As the CRD watch sees it: not validated yet.
    let mut bad: OvercommitPolicy = serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("{e}"));
    bad.metadata.generation = Some(4);
    let statuses = desired_statuses(&[bad], &[], InProcessState::default(), "t");
    let ready = &statuses["bad"].conditions[0];
    assert_eq!(
        (
            ready.type_.as_str(),
            ready.status.as_str(),
            ready.reason.as_str()
        ),
        ("Ready", "False", "Invalid")
    );
    assert!(ready.message.contains("cpu"), "{}", ready.message);
    assert_eq!(statuses["bad"].observed_generation, Some(4));
}

/// A condition keeps its transition time while its status stays; a changed status is stamped
/// now. So an unchanged world gives an unchanged status: the leader then writes nothing.
#[test]
fn transition_times_are_kept_while_the_status_stays() {
    let mut policies = policies(POLICIES, GENERATIONS);
    let applied = [node(
        &[("pool", "batch")],
        Some("policy=batch;ratios=cpu=2;generation=3"),
    )];
    let first = desired_statuses(&policies, &applied, InProcessState::default(), "t1");
    for policy in &mut policies {
        let name = policy.metadata.name.clone().unwrap_or_default();
        policy.status = first.get(&name).cloned();
    }
    let again = desired_statuses(&policies, &applied, InProcessState::default(), "t2");
    assert_eq!(first, again);
    let pending = [node(&[("pool", "batch")], None)];
    let changed = desired_statuses(&policies, &pending, InProcessState::default(), "t3");
    let times: Vec<(&str, &str)> = changed["batch"]
        .conditions
        .iter()
        .map(|c| (c.type_.as_str(), c.last_transition_time.as_str()))
        .collect();
    assert_eq!(
        times,
        [("Ready", "t3"), ("Progressing", "t3"), ("Degraded", "t1")]
    );
}
