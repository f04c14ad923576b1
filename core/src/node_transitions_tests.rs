//! Table tests of node transitions (pure).

use super::*;
use crate::policy::parse_policy_file;

const POLICIES: &str = r#"
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: batch}
spec:
  nodeSelector: {matchLabels: {pool: batch}}
  nodeRatios: {cpu: "2", memory: "1.2"}
---
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: usage}
spec:
  nodeSelector: {matchLabels: {pool: usage}}
  nodeRatios: {cpu: "1.5"}
  usage: {targetUtilization: {cpu: "70%"}, maxRatios: {cpu: "3"}}
"#;

fn set() -> PolicySet {
    let policies = parse_policy_file(POLICIES).unwrap_or_else(|e| panic!("{e}"));
    let (set, errors) = PolicySet::from_valid(policies);
    assert!(errors.is_empty(), "{errors:?}");
    set
}

fn at(applied: Option<&str>) -> Standing {
    standing(
        &NodeFacts {
            labels: BTreeMap::new(),
            applied: applied.map(str::to_string),
            ..NodeFacts::default()
        },
        &set(),
    )
}

const BATCH: &str = "policy=batch;ratios=cpu=2,memory=1.2;generation=3";
const BATCH_NEXT: &str = "policy=batch;ratios=cpu=2.5,memory=1.2;generation=4";
const USAGE: &str = "policy=usage;ratios=cpu=1.5;generation=2;usage=cpu=5";
const USAGE_FALLBACK: &str = "policy=usage;ratios=cpu=1.5;generation=2";

#[test]
fn standing_reads_the_applied_annotation() {
    assert_eq!(at(None), Standing::Raw);
    assert_eq!(at(Some("policy=batch;garbage")), Standing::Raw);
    assert_eq!(
        at(Some(BATCH)),
        Standing::Overcommitted {
            policy: "batch".into(),
            generation: Some(3),
            applied: "cpu x2, memory x1.2".into(),
            fallback: false,
        }
    );
    assert_eq!(
        at(Some(USAGE)),
        Standing::Overcommitted {
            policy: "usage".into(),
            generation: Some(2),
            applied: "from usage: cpu 5".into(),
            fallback: false,
        }
    );
    let Standing::Overcommitted { fallback, .. } = at(Some(USAGE_FALLBACK)) else {
        panic!("not overcommitted");
    };
    assert!(fallback);
}

/// (applied before, applied after, the changes, the first change's note if not "").
type Case<'a> = (Option<&'a str>, Option<&'a str>, &'a [Change], &'a str);

#[test]
fn transitions_between_standings() {
    use Change::*;
    let cases: &[Case<'_>] = &[
        (None, None, &[], ""),
        (
            None,
            Some(BATCH),
            &[Overcommitted],
            "allocatable overcommitted by policy batch (generation 3): cpu x2, memory x1.2",
        ),
        (Some(BATCH), Some(BATCH), &[], ""),
        // A generation (or ratio) change of the same policy is not an Event.
        (Some(BATCH), Some(BATCH_NEXT), &[], ""),
        (
            Some(BATCH),
            None,
            &[Restored],
            "allocatable back to the kubelet's values (was policy batch)",
        ),
        (
            Some(BATCH),
            Some(USAGE),
            &[Overcommitted],
            "allocatable overcommitted by policy usage (generation 2): from usage: cpu 5; was policy batch",
        ),
        (
            None,
            Some(USAGE_FALLBACK),
            &[Overcommitted, UsageFallback],
            "",
        ),
        (
            Some(USAGE),
            Some(USAGE_FALLBACK),
            &[UsageFallback],
            "policy usage: usage unknown or stale; allocatable written from nodeRatios: cpu x1.5",
        ),
        (
            Some(USAGE_FALLBACK),
            Some(USAGE),
            &[UsageRecovered],
            "policy usage: allocatable follows usage again (from usage: cpu 5)",
        ),
        (Some(USAGE_FALLBACK), Some(USAGE_FALLBACK), &[], ""),
        (Some(USAGE_FALLBACK), Some(BATCH), &[Overcommitted], ""),
        (Some(USAGE_FALLBACK), None, &[Restored], ""),
    ];
    for (before, after, want, first_note) in cases {
        let got = transitions(&at(*before), &at(*after));
        let changes: Vec<Change> = got.iter().map(|t| t.change).collect();
        assert_eq!(&changes, want, "{before:?} -> {after:?}");
        if !first_note.is_empty() {
            assert_eq!(got[0].note, *first_note, "{before:?} -> {after:?}");
        }
    }
}

#[test]
fn summaries_name_five_nodes_and_count_the_rest() {
    let t = |change, policy: &str| Transition {
        change,
        policy: policy.into(),
        note: String::new(),
    };
    let mut batch: Vec<(String, Transition)> = (1..=7)
        .map(|i| (format!("n{i}"), t(Change::Overcommitted, "batch")))
        .collect();
    batch.push(("m1".into(), t(Change::Restored, "batch")));
    batch.push(("u1".into(), t(Change::UsageFallback, "usage")));
    let got = summaries(&batch);
    assert_eq!(got.len(), 3);
    assert_eq!(
        got[&("batch".to_string(), Change::Overcommitted)],
        "7 nodes overcommitted: n1, n2, n3, n4, n5 and 2 more"
    );
    assert_eq!(
        got[&("batch".to_string(), Change::Restored)],
        "1 node restored to the kubelet's values: m1"
    );
    assert_eq!(
        got[&("usage".to_string(), Change::UsageFallback)],
        "1 node on the usage fallback (usage unknown or stale): u1"
    );
}
