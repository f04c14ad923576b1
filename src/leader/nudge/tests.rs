use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use overcommit_core::node::NodeView;
use overcommit_core::policy::{PolicySet, parse_policy_file};
use serde_json::{Value, json};

use super::*;

const POLICIES: &str = r#"
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: batch}
spec:
  nodeSelector: {matchLabels: {pool: batch}}
  nodeRatios: {cpu: "2"}
---
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: lent}
spec:
  nodeSelector: {matchLabels: {pool: lent}}
  usage:
    targetUtilization: {cpu: "60%"}
    maxRatios: {cpu: "4"}
    window: 15m
  nodeRatios: {cpu: "2"}
"#;

fn set(yaml: &str) -> PolicySet {
    PolicySet::new(parse_policy_file(yaml).unwrap()).unwrap()
}

/// `POLICIES` with every policy at `generation`.
fn at_generation(generation: i64) -> PolicySet {
    let mut policies = parse_policy_file(POLICIES).unwrap();
    for p in &mut policies {
        p.metadata.generation = Some(generation);
    }
    PolicySet::new(policies).unwrap()
}

/// `POLICIES` with batch's cpu ratio changed to 3.
fn changed() -> PolicySet {
    set(&POLICIES.replacen(r#"cpu: "2"}"#, r#"cpu: "3"}"#, 1))
}

/// A node: labels, allocatable cpu (capacity 8) and the two annotations.
fn node(labels: Value, cpu: &str, raw: Option<&str>, applied: Option<&str>) -> Value {
    let mut annotations = serde_json::Map::new();
    if let Some(raw) = raw {
        annotations.insert(RAW_ALLOCATABLE_ANNOTATION.into(), raw.into());
    }
    if let Some(applied) = applied {
        annotations.insert(APPLIED_ANNOTATION.into(), applied.into());
    }
    annotations.insert("other.io/kept".into(), "x".into());
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "n", "labels": labels, "annotations": annotations},
        "status": {
            "capacity": {"cpu": "8", "memory": "32Gi"},
            "allocatable": {"cpu": cpu, "memory": "31Gi"},
        },
    })
}

fn facts(node: &Value) -> NodeFacts {
    NodeFacts::from_node(&serde_json::from_value::<Node>(node.clone()).unwrap())
}

const BATCH: &str = "policy=batch;ratios=cpu=2";

#[test]
fn need_table() {
    let batch = || json!({"pool": "batch"});
    let inflated = || node(batch(), "16", Some("cpu=8"), Some(BATCH));
    let out = |mut n: Value, labels: Value| {
        n["metadata"]["labels"] = labels;
        n
    };
    // (case, node, policies, need)
    let cases: Vec<(&str, Value, PolicySet, Need)> = vec![
        (
            "new policy: raw node selected",
            node(batch(), "8", None, None),
            set(POLICIES),
            Need::Apply,
        ),
        ("at its policy", inflated(), set(POLICIES), Need::UpToDate),
        ("ratio changed", inflated(), changed(), Need::Apply),
        (
            "policy deleted",
            inflated(),
            PolicySet::default(),
            Need::Restore,
        ),
        (
            "relabelled out",
            out(inflated(), json!({"pool": "web"})),
            set(POLICIES),
            Need::Restore,
        ),
        (
            "opted out",
            out(
                inflated(),
                json!({"pool": "batch", "overcommit.dev/disabled": "true"}),
            ),
            set(POLICIES),
            Need::Restore,
        ),
        (
            "not selected, never inflated",
            node(json!({"pool": "web"}), "8", None, None),
            set(POLICIES),
            Need::UpToDate,
        ),
        (
            "opted out, never inflated",
            node(
                json!({"pool": "batch", "overcommit.dev/disabled": "true"}),
                "8",
                None,
                None,
            ),
            set(POLICIES),
            Need::UpToDate,
        ),
        (
            "no policy at all, no annotations",
            node(batch(), "8", None, None),
            PolicySet::default(),
            Need::UpToDate,
        ),
        (
            "relabelled into another policy's pool",
            out(inflated(), json!({"pool": "lent"})),
            set(POLICIES),
            Need::Apply,
        ),
        (
            "usage policy: applied names it (its values are the webhook's)",
            node(
                json!({"pool": "lent"}),
                "11",
                Some("cpu=8"),
                Some("policy=lent;ratios=cpu=2;usage=cpu=11"),
            ),
            set(POLICIES),
            Need::UpToDate,
        ),
        (
            "usage policy: applied in JSON names it, with usage values",
            node(
                json!({"pool": "lent"}),
                "16",
                Some("cpu=8"),
                Some(r#"{"policy":"lent","ratios":{"cpu":"2"},"usage":{"cpu":"16"}}"#),
            ),
            set(POLICIES),
            Need::UpToDate,
        ),
        (
            "usage policy: on its fallback (no usage values): nudged until usage is known",
            node(
                json!({"pool": "lent"}),
                "16",
                Some("cpu=8"),
                Some("policy=lent;ratios=cpu=2;generation=1"),
            ),
            set(POLICIES),
            Need::Apply,
        ),
        (
            "usage policy: applied names it at an earlier generation (a new ceiling)",
            node(
                json!({"pool": "lent"}),
                "11",
                Some("cpu=8"),
                Some("policy=lent;ratios=cpu=2;generation=1;maxRatios=cpu=4;usage=cpu=11"),
            ),
            at_generation(2),
            Need::Apply,
        ),
        (
            "usage policy: applied names it at its generation",
            node(
                json!({"pool": "lent"}),
                "11",
                Some("cpu=8"),
                Some("policy=lent;ratios=cpu=2;generation=2;maxRatios=cpu=4;usage=cpu=11"),
            ),
            at_generation(2),
            Need::UpToDate,
        ),
        (
            "usage policy: raw node",
            node(json!({"pool": "lent"}), "8", None, None),
            set(POLICIES),
            Need::Apply,
        ),
        (
            "the kubelet's new raw value stored un-inflated (a write the webhook missed)",
            node(batch(), "7", Some("cpu=8"), Some(BATCH)),
            set(POLICIES),
            Need::Apply,
        ),
        (
            "earlier versions' JSON annotations (rewritten in the listed format)",
            node(
                batch(),
                "16",
                Some(r#"{"cpu":"8"}"#),
                Some(r#"{"policy":"batch","ratios":{"cpu":"2"}}"#),
            ),
            set(POLICIES),
            Need::Apply,
        ),
        (
            "above capacity and not ours: the webhook would fail open",
            node(batch(), "20", None, None),
            set(POLICIES),
            Need::Undecided,
        ),
    ];
    for (case, node, policies, want) in cases {
        assert_eq!(need("n1", &facts(&node), &policies), want, "{case}");
    }
}

/// What the webhook does to the nudged node: the node rule on the stored node as object and
/// oldObject, its patch applied.
fn nudge(node: &Value, policies: &PolicySet) -> Value {
    let f = facts(node);
    let view = NodeView {
        has_metadata: true,
        labels: Some(&f.labels),
        annotations: Some(&f.annotations),
        allocatable: Some(&f.allocatable),
        capacity: Some(&f.capacity),
        conditions: None,
    };
    let decision = overcommit_core::node::decide(&view, Some(&view), policies).unwrap();
    let patch: json_patch::Patch =
        serde_json::from_value(serde_json::to_value(&decision.patch).unwrap()).unwrap();
    let mut out = node.clone();
    json_patch::patch(&mut out, &patch).unwrap();
    out
}

#[test]
fn one_nudge_brings_every_out_of_date_node_to_its_policy_and_a_second_changes_nothing() {
    let batch = || json!({"pool": "batch"});
    let cases: Vec<(&str, Value, PolicySet, &str)> = vec![
        (
            "new policy",
            node(batch(), "8", None, None),
            set(POLICIES),
            "16",
        ),
        (
            "ratio changed",
            node(batch(), "16", Some("cpu=8"), Some(BATCH)),
            changed(),
            "24",
        ),
        (
            "deleted",
            node(batch(), "16", Some("cpu=8"), Some(BATCH)),
            PolicySet::default(),
            "8",
        ),
        (
            "missed write",
            node(batch(), "7", Some("cpu=8"), Some(BATCH)),
            set(POLICIES),
            "14",
        ),
    ];
    for (case, stored, policies, cpu) in cases {
        assert!(
            need("n1", &facts(&stored), &policies).is_out_of_date(),
            "{case}"
        );
        let once = nudge(&stored, &policies);
        assert_eq!(once["status"]["allocatable"]["cpu"], cpu, "{case}");
        assert_eq!(
            once["metadata"]["annotations"]["other.io/kept"], "x",
            "{case}"
        );
        assert_eq!(
            need("n1", &facts(&once), &policies),
            Need::UpToDate,
            "{case}: after the nudge"
        );
        // Never compounds: a second nudge leaves the node as it is.
        assert_eq!(nudge(&once, &policies), once, "{case}: a second nudge");
    }
}

#[test]
fn backlog_nudges_at_once_then_backs_off_and_reports_the_lag() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut backlog = Backlog::default();
    assert_eq!(backlog.observe("b", Need::Apply, t0), None);
    assert_eq!(backlog.observe("a", Need::Restore, t0 + s(1)), None);
    assert_eq!(
        backlog.observe("c", Need::UpToDate, t0),
        None,
        "never out of date: no lag"
    );
    assert_eq!(
        backlog.observe("d", Need::Undecided, t0),
        None,
        "undecided: not nudged"
    );
    assert_eq!(backlog.len(), 2);
    assert_eq!(backlog.due(t0), Some("b"), "the first out of date first");
    backlog.nudged("b", t0);
    assert_eq!(backlog.due(t0), None, "a is not due before it was seen");
    assert_eq!(backlog.due(t0 + s(1)), Some("a"));
    backlog.nudged("a", t0 + s(1));
    assert_eq!(
        backlog.next_due(),
        Some(t0 + s(2)),
        "b again after FIRST_RETRY"
    );
    // Seen again out of date (a watch event): the first sight and the attempts are kept.
    backlog.observe("b", Need::Apply, t0 + s(1));
    assert_eq!(backlog.due(t0 + s(2)), Some("b"));
    backlog.nudged("b", t0 + s(2));
    assert_eq!(backlog.next_due(), Some(t0 + s(3)), "a after 2 s");
    backlog.nudged("a", t0 + s(3));
    assert_eq!(backlog.next_due(), Some(t0 + s(6)), "b after 4 s");
    assert_eq!(
        backlog.observe("b", Need::UpToDate, t0 + s(7)),
        Some(s(7)),
        "lag from the first sight"
    );
    backlog.forget("a");
    assert!(backlog.is_empty());
    // Relist: nodes no longer listed leave.
    backlog.observe("x", Need::Apply, t0);
    backlog.observe("y", Need::Apply, t0);
    backlog.retain(|n| n == "y");
    assert_eq!(backlog.due(t0), Some("y"));
    assert_eq!(backlog.len(), 1);
}

#[test]
fn retries_double_up_to_five_minutes() {
    let got: Vec<u64> = (1..=9).map(|n| retry_after(n).as_secs()).collect();
    assert_eq!(got, [2, 4, 8, 16, 32, 64, 128, 256, 300]);
    assert_eq!(retry_after(u32::MAX), MAX_RETRY);
}

#[test]
fn bucket_paces_to_the_rate_after_the_burst() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut bucket = Bucket::new(50.0, 10, t0);
    for n in 0..10 {
        assert_eq!(bucket.take(t0), Ok(()), "burst token {n}");
    }
    assert_eq!(bucket.take(t0), Err(Some(ms(20))), "then one every 1/50 s");
    assert_eq!(bucket.take(t0 + ms(20)), Ok(()));
    assert!(bucket.take(t0 + ms(30)).is_err());
    // 1,000 nodes: 10 at once, the rest at 50 a second, within 30 s.
    let mut bucket = Bucket::new(50.0, 10, t0);
    let mut now = t0;
    for _ in 0..1000 {
        loop {
            match bucket.take(now) {
                Ok(()) => break,
                Err(Some(wait)) => now += wait,
                Err(None) => unreachable!(),
            }
        }
    }
    let took = now - t0;
    assert!(took <= Duration::from_secs(20), "{took:?}");
    assert!(took >= Duration::from_millis(19_700), "{took:?}");
    assert_eq!(Bucket::new(0.0, 10, t0).take(t0), Err(None), "rate 0: off");
}
