//! Table tests of the staged rollout (pure).

use std::borrow::Cow;
use std::time::Duration;

use overcommit_json::StrMap;

use super::*;
use crate::node::{self, NodeOutcome};
use crate::policy::{StepSize, parse_policy_file};

const POLICY: &str = r#"
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: batch}
spec:
  nodeRatios: {cpu: "2", memory: "1.5"}
  rollout: {maxNodesPerStep: 2, stepInterval: 10s}
"#;

/// The policy set of `POLICY` at generation 3, its status admitting `admitted`.
fn set(admitted: &[&str]) -> PolicySet {
    set_of(POLICY, admitted)
}

/// The policy set of `yaml` (one policy) at generation 3, its status admitting `admitted`.
fn set_of(yaml: &str, admitted: &[&str]) -> PolicySet {
    let mut policies = parse_policy_file(yaml).unwrap_or_else(|e| panic!("{e}"));
    policies[0].metadata.generation = Some(3);
    policies[0].status = Some(crate::policy::OvercommitPolicyStatus {
        rollout: Some(RolloutStatus {
            generation: Some(3),
            admitted: admitted.iter().map(|s| s.to_string()).collect(),
            ..RolloutStatus::default()
        }),
        ..Default::default()
    });
    PolicySet::new(policies).unwrap_or_else(|e| panic!("{e}"))
}

fn summary(text: &str) -> AppliedSummary {
    applied_summary(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn map(pairs: &[(&str, &str)]) -> StrMap<'static> {
    let mut m = StrMap::new();
    for (k, v) in pairs {
        m.insert(Cow::Owned(k.to_string()), Cow::Owned(v.to_string()));
    }
    m
}

/// Which moves raise a ratio (paced) and which do not (at once).
#[test]
fn raises_only_when_some_ratio_goes_up() {
    let set = set(&[]);
    let policy = set.policies().next().unwrap();
    let cases = [
        (None, true),
        (
            Some("policy=batch;ratios=cpu=2,memory=1.5;generation=2"),
            false,
        ),
        (
            Some("policy=batch;ratios=cpu=3,memory=2;generation=2"),
            false,
        ),
        (
            Some("policy=batch;ratios=cpu=1.5,memory=1.5;generation=2"),
            true,
        ),
        (
            Some("policy=batch;ratios=cpu=3,memory=1;generation=2"),
            true,
        ),
        (Some("policy=other;ratios=cpu=2,memory=2"), false),
        (Some("policy=other;ratios=cpu=2"), true),
    ];
    for (applied, want) in cases {
        let a = applied.map(summary);
        assert_eq!(raises(policy, a.as_ref()), want, "{applied:?}");
    }
}

/// The review path's hook: which nodes the rule keeps on what they carry, and what that gives.
#[test]
fn held_nodes_keep_what_they_carry() {
    let old = "policy=batch;ratios=cpu=1.5,memory=1.5;generation=2";
    let current = "policy=batch;ratios=cpu=2,memory=1.5;generation=3";
    let raw = "cpu=4,memory=1000";
    // (admitted, labels, applied, held?)
    type Case<'c> = (
        &'c [&'c str],
        &'c [(&'c str, &'c str)],
        Option<&'c str>,
        bool,
    );
    let cases: [Case<'_>; 6] = [
        (&[], &[], Some(old), true),
        (&["n1"], &[], Some(old), false),
        (&[], &[], Some(current), false),
        (
            &[],
            &[("overcommit.dev/disabled", "true")],
            Some(old),
            false,
        ),
        (&[], &[], None, true),
        (&["n2"], &[], Some(old), true),
    ];
    for (admitted, labels, applied, want) in cases {
        let set = set(admitted);
        let labels = map(labels);
        let annotations = applied.map(|a| {
            map(&[
                ("overcommit.dev/applied", a),
                ("overcommit.dev/raw-allocatable", raw),
            ])
        });
        // As stored after the old generation: cpu 4 x 1.5 = 6.
        let allocatable = map(&[
            ("cpu", if applied.is_some() { "6" } else { "4" }),
            ("memory", "1500"),
        ]);
        let capacity = map(&[("cpu", "4"), ("memory", "1000")]);
        let view = NodeView {
            has_metadata: true,
            labels: Some(&labels),
            annotations: annotations.as_ref(),
            allocatable: Some(&allocatable),
            capacity: Some(&capacity),
            conditions: None,
        };
        let held = held(&set, &set.for_node(&view.labels), "n1", &view, None);
        assert_eq!(held.is_some(), want, "{admitted:?} {applied:?}");
        let Some(held) = held else { continue };
        let decision = node::decide(&view, Some(&view), &held).unwrap();
        if applied.is_some() {
            // Under the carried policy: nothing changes, generation 2 stays.
            assert_eq!(decision.outcome, NodeOutcome::Policy("batch".into()));
            assert!(decision.patch.is_empty(), "{:?}", decision.patch);
        } else {
            // Nothing carried: raw.
            assert_eq!(decision.outcome, NodeOutcome::NoPolicy);
        }
    }
}

fn compiled(step: StepSize, paused: bool) -> CompiledRollout {
    CompiledRollout {
        step,
        interval: Duration::from_secs(10),
        paused,
        admitted: Default::default(),
    }
}

fn at(seconds: i64) -> jiff::Timestamp {
    jiff::Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn stamp(seconds: i64) -> Option<String> {
    Some(at(seconds).strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
}

fn status(step: i64, last: i64, waiting: i64, admitted: &[&str]) -> RolloutStatus {
    RolloutStatus {
        generation: Some(3),
        step,
        last_step_time: stamp(last),
        paused: false,
        nodes_waiting: waiting,
        admitted: admitted.iter().map(|s| s.to_string()).collect(),
    }
}

/// The leader's step: its size, its pace, pause, nodes that do not move, a second edit, a
/// new leader (the same function of the same status).
#[test]
fn steps() {
    let ten: Vec<String> = (0..10).map(|i| format!("n{i}")).collect();
    let ten: Vec<&str> = ten.iter().map(String::as_str).collect();
    let two = compiled(StepSize::Nodes(2), false);
    struct Case<'c> {
        what: &'c str,
        rollout: CompiledRollout,
        generation: i64,
        previous: Option<RolloutStatus>,
        movers: &'c [&'c str],
        now: i64,
        want: RolloutStatus,
    }
    let cases = [
        Case {
            what: "the first step is at once, by name",
            rollout: two.clone(),
            generation: 3,
            previous: None,
            movers: &ten,
            now: 0,
            want: status(1, 0, 8, &["n0", "n1"]),
        },
        Case {
            what: "within the interval: nothing, though the step moved",
            rollout: two.clone(),
            generation: 3,
            previous: Some(status(1, 0, 8, &["n0", "n1"])),
            movers: &ten[2..],
            now: 9,
            want: status(1, 0, 8, &[]),
        },
        Case {
            what: "after the interval: the next two",
            rollout: two.clone(),
            generation: 3,
            previous: Some(status(1, 0, 8, &[])),
            movers: &ten[2..],
            now: 10,
            want: status(2, 10, 6, &["n2", "n3"]),
        },
        Case {
            what: "an admitted node that has not moved keeps its place: one more",
            rollout: two.clone(),
            generation: 3,
            previous: Some(status(2, 10, 6, &["n2", "n3"])),
            movers: &ten[3..],
            now: 20,
            want: status(3, 20, 5, &["n3", "n4"]),
        },
        Case {
            what: "neither admitted node moved: no room, no step",
            rollout: two.clone(),
            generation: 3,
            previous: Some(status(2, 10, 6, &["n2", "n3"])),
            movers: &ten[2..],
            now: 40,
            want: status(2, 10, 6, &["n2", "n3"]),
        },
        Case {
            what: "paused: no step",
            rollout: compiled(StepSize::Nodes(2), true),
            generation: 4,
            previous: Some(status(2, 10, 6, &[])),
            movers: &ten[4..],
            now: 100,
            want: RolloutStatus {
                paused: true,
                generation: Some(4),
                ..status(2, 10, 6, &[])
            },
        },
        Case {
            what: "a second edit mid-rollout keeps the pace; the admitted nodes wait again",
            rollout: two.clone(),
            generation: 4,
            previous: Some(status(2, 10, 6, &["n4"])),
            movers: &ten,
            now: 15,
            want: RolloutStatus {
                generation: Some(4),
                ..status(2, 10, 10, &[])
            },
        },
        Case {
            what: "a second edit: the next step at the old pace, admitting the first by name",
            rollout: two.clone(),
            generation: 4,
            previous: Some(status(2, 10, 6, &["n4"])),
            movers: &ten,
            now: 20,
            want: RolloutStatus {
                generation: Some(4),
                ..status(3, 20, 8, &["n0", "n1"])
            },
        },
        Case {
            what: "settled, then a new generation: the step count starts again",
            rollout: two.clone(),
            generation: 5,
            previous: Some(status(5, 50, 0, &[])),
            movers: &ten[..3],
            now: 55,
            want: RolloutStatus {
                generation: Some(5),
                ..status(0, 50, 3, &[])
            },
        },
        Case {
            what: "a percentage of the governed nodes, rounded up",
            rollout: compiled(StepSize::Percent(25), false),
            generation: 3,
            previous: None,
            movers: &ten,
            now: 0,
            want: status(1, 0, 7, &["n0", "n1", "n2"]),
        },
        Case {
            what: "nothing to move: nothing",
            rollout: two.clone(),
            generation: 3,
            previous: Some(status(5, 50, 0, &["n9"])),
            movers: &[],
            now: 100,
            want: status(5, 50, 0, &[]),
        },
    ];
    for c in cases {
        let got = advance(
            &c.rollout,
            Some(c.generation),
            c.previous.as_ref(),
            c.movers,
            10,
            at(c.now),
        );
        assert_eq!(got, c.want, "{}", c.what);
        // A new leader (or a second computation before the write is seen) reads the written
        // status: at the same time it takes no second step.
        let again = advance(
            &c.rollout,
            Some(c.generation),
            Some(&got),
            c.movers,
            10,
            at(c.now),
        );
        let moved: Vec<&str> = c.movers.to_vec();
        assert_eq!(again.step, got.step, "{}: a second step", c.what);
        assert!(again.admitted.iter().all(|a| moved.contains(&a.as_str())));
    }
}

/// The leader's view: which nodes the rollout still moves.
#[test]
fn movers_are_the_policys_nodes_that_raise() {
    let set = set(&[]);
    let policy = set.policies().next().unwrap();
    let empty = std::collections::BTreeMap::<String, String>::new();
    let out = std::collections::BTreeMap::from([(
        "overcommit.dev/disabled".to_string(),
        "true".to_string(),
    )]);
    let nodes = [
        (
            "c",
            &empty,
            Some("policy=batch;ratios=cpu=1.5;generation=2"),
        ),
        ("a", &empty, None),
        (
            "b",
            &empty,
            Some("policy=batch;ratios=cpu=2,memory=1.5;generation=3"),
        ),
        ("d", &out, None),
        (
            "e",
            &empty,
            Some("policy=batch;ratios=cpu=2,memory=1.5;generation=2"),
        ),
    ];
    let refs = nodes.iter().map(|(name, labels, applied)| NodeRef {
        name,
        labels: *labels,
        applied: *applied,
    });
    assert_eq!(movers(&set, policy, refs), ["a", "c"]);
}

/// Where a node stands, for `kubectl overcommit status`.
#[test]
fn standings() {
    let set = set(&["a"]);
    let policy = set.policies().next().unwrap();
    let rollout = set.rollout("batch").unwrap();
    let old = summary("policy=batch;ratios=cpu=1.5;generation=2");
    let now = summary("policy=batch;ratios=cpu=2,memory=1.5;generation=3");
    assert_eq!(
        standing(policy, rollout, "a", Some(&old)),
        Some(Standing::Admitted)
    );
    assert_eq!(
        standing(policy, rollout, "b", Some(&old)),
        Some(Standing::Waiting)
    );
    assert_eq!(
        standing(policy, rollout, "b", None),
        Some(Standing::Waiting)
    );
    assert_eq!(standing(policy, rollout, "b", Some(&now)), None);
}

/// The Event text of a step: only when a step was taken, naming the newly admitted nodes.
#[test]
fn step_notes() {
    let before = status(1, 0, 8, &["n0"]);
    let after = status(2, 10, 6, &["n0", "n2", "n3"]);
    assert_eq!(
        step_note(Some(&before), Some(&after)).as_deref(),
        Some("step 2: admitted n2, n3 to generation 3; 6 nodes wait")
    );
    assert_eq!(step_note(Some(&after), Some(&after)), None);
    assert_eq!(step_note(Some(&after), None), None);
    assert_eq!(
        step_note(None, Some(&status(1, 0, 8, &["n0", "n1"]))).as_deref(),
        Some("step 1: admitted n0, n1 to generation 3; 8 nodes wait")
    );
}

const USAGE_POLICY: &str = r#"
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: lent}
spec:
  nodeRatios: {cpu: "1.25"}
  usage:
    targetUtilization: {cpu: "100%"}
    maxRatios: {cpu: "1.5"}
    window: 1m
  rollout: {maxNodesPerStep: 1, stepInterval: 5s}
"#;

/// `USAGE_POLICY` at generation 3, its status admitting `admitted`.
fn usage_set(admitted: &[&str]) -> PolicySet {
    set_of(USAGE_POLICY, admitted)
}

/// Under a usage policy a raise is a higher ceiling or a higher fallback ratio; target, window
/// and minChange are not compared; an annotation without ceilings carries its ratios as such.
#[test]
fn usage_raises_only_when_a_ceiling_or_the_fallback_goes_up() {
    let set = usage_set(&[]);
    let policy = set.policies().next().unwrap();
    let cases = [
        ("nothing carried", None, true),
        (
            "same ceiling and fallback (target, window or minChange changed)",
            Some("policy=lent;ratios=cpu=1.25;generation=2;maxRatios=cpu=1.5;usage=cpu=6"),
            false,
        ),
        (
            "ceiling raised",
            Some("policy=lent;ratios=cpu=1.25;generation=2;maxRatios=cpu=1.25;usage=cpu=5"),
            true,
        ),
        (
            "fallback raised, ceiling the same",
            Some("policy=lent;ratios=cpu=1;generation=2;maxRatios=cpu=1.5"),
            true,
        ),
        (
            "both lowered",
            Some("policy=lent;ratios=cpu=1.5;generation=2;maxRatios=cpu=2;usage=cpu=7"),
            false,
        ),
        (
            "no fallback carried: counts as 1",
            Some("policy=lent;ratios=;generation=2;maxRatios=cpu=1.5"),
            true,
        ),
        (
            "written before ceilings were recorded: the ratio is the ceiling",
            Some("policy=lent;ratios=cpu=1.25;generation=2;usage=cpu=5"),
            true,
        ),
        (
            "from a static policy at 1.5",
            Some("policy=batch;ratios=cpu=1.5;generation=7"),
            false,
        ),
        (
            "from a static policy at 1.25",
            Some("policy=batch;ratios=cpu=1.25;generation=7"),
            true,
        ),
    ];
    for (what, applied, want) in cases {
        let a = applied.map(summary);
        assert_eq!(raises(policy, a.as_ref()), want, "{what}");
    }
}

/// A usage node waiting for its step follows usage under the ceiling it carries, and records
/// it with the generation it carries; admitted, it takes the new ceiling. Raw cpu 4, 3 cpu
/// requested, target 100%: 3 + 4 - peak, clamped to [4, 4 x ceiling].
#[test]
fn held_usage_nodes_follow_usage_under_the_carried_ceiling() {
    let old = "policy=lent;ratios=cpu=1.25;generation=2;maxRatios=cpu=1.25;usage=cpu=5";
    let raw = "cpu=4";
    // (admitted, peak usage (millicores), applied (None: raw), allocatable cpu (None: raw, no
    // policy), what the applied annotation becomes (None: unchanged))
    type Case<'c> = (
        &'c [&'c str],
        u128,
        Option<&'c str>,
        Option<&'c str>,
        Option<&'c str>,
    );
    let cases: [Case<'_>; 4] = [
        (&[], 200, Some(old), Some("5"), None),
        (
            &[],
            2500,
            Some(old),
            Some("4500m"),
            Some("policy=lent;ratios=cpu=1.25;generation=2;maxRatios=cpu=1.25;usage=cpu=4500m"),
        ),
        (
            &["n1"],
            200,
            Some(old),
            Some("6"),
            Some("policy=lent;ratios=cpu=1.25;generation=3;maxRatios=cpu=1.5;usage=cpu=6"),
        ),
        (&[], 200, None, None, None),
    ];
    for (admitted, peak, applied, want, written) in cases {
        let set = usage_set(admitted);
        let annotations = applied.map(|a| {
            map(&[
                ("overcommit.dev/applied", a),
                ("overcommit.dev/raw-allocatable", raw),
            ])
        });
        let allocatable = map(&[("cpu", if applied.is_some() { "5" } else { "4" })]);
        let capacity = map(&[("cpu", "4")]);
        let labels = map(&[]);
        let view = NodeView {
            has_metadata: true,
            labels: Some(&labels),
            annotations: annotations.as_ref(),
            allocatable: Some(&allocatable),
            capacity: Some(&capacity),
            conditions: None,
        };
        let held = held(&set, &set.for_node(&view.labels), "n1", &view, None);
        assert_eq!(held.is_none(), !admitted.is_empty(), "{admitted:?}");
        let policies = held.as_ref().unwrap_or(&set);
        let usage = node::usage::NodeUsage {
            cpu: Some(node::usage::UsageView::fresh(3000, peak)),
            memory: None,
        };
        let decision = node::decide_with_usage(
            &view,
            Some(&view),
            policies,
            crate::Account::PatchOnly,
            None,
            Some(&usage),
        )
        .unwrap();
        let patch = format!("{:?}", decision.patch);
        let what = format!("{admitted:?} peak {peak} {applied:?}: {patch}");
        let Some(cpu) = want else {
            assert_eq!(decision.outcome, NodeOutcome::NoPolicy, "{what}");
            continue;
        };
        let Some(text) = written else {
            // Unchanged: the stored value (5) stands.
            assert!(decision.patch.is_empty() && cpu == "5", "{what}");
            continue;
        };
        let allocatable = format!("\"/status/allocatable/cpu\", value: String(\"{cpu}\")");
        assert!(patch.contains(&allocatable), "{what}");
        assert!(patch.contains(text), "{what}");
    }
}
