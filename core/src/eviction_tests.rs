use super::*;

const GI: u128 = 1 << 30;

#[test]
fn need_table() {
    let now = 1_000_000;
    let sample = |gi: u128, age_ms: i64| Measured::Sample {
        bytes: gi * GI,
        at_ms: now - age_ms,
    };
    let cases: &[(&str, Option<u128>, Measured, Need)] = &[
        (
            "above 95% of 16Gi",
            Some(16 * GI),
            sample(16, 1000),
            Need::Relieve {
                usage: 16 * GI,
                critical: 16 * GI * 95 / 100,
            },
        ),
        (
            "at 95% exactly: fine",
            Some(100),
            Measured::Sample {
                bytes: 95,
                at_ms: now,
            },
            Need::Fine {
                usage: 95,
                critical: 95,
            },
        ),
        (
            "one byte above",
            Some(100),
            Measured::Sample {
                bytes: 96,
                at_ms: now,
            },
            Need::Relieve {
                usage: 96,
                critical: 95,
            },
        ),
        (
            "well below",
            Some(16 * GI),
            sample(8, 0),
            Need::Fine {
                usage: 8 * GI,
                critical: 16 * GI * 95 / 100,
            },
        ),
        (
            "metrics failing",
            Some(16 * GI),
            Measured::Failing,
            Need::Unknown(Unknown::MetricsFailing),
        ),
        (
            "node not listed",
            Some(16 * GI),
            Measured::Missing,
            Need::Unknown(Unknown::NoSample),
        ),
        (
            "stale sample",
            Some(16 * GI),
            sample(16, 60_001),
            Need::Unknown(Unknown::Stale),
        ),
        (
            "sample exactly max age: fresh",
            Some(100),
            Measured::Sample {
                bytes: 99,
                at_ms: now - 60_000,
            },
            Need::Relieve {
                usage: 99,
                critical: 95,
            },
        ),
        ("no raw", None, sample(16, 0), Need::Unknown(Unknown::NoRaw)),
        (
            "raw 0",
            Some(0),
            sample(16, 0),
            Need::Unknown(Unknown::NoRaw),
        ),
    ];
    for (what, raw, measured, want) in cases {
        assert_eq!(need(*raw, *measured, 95, now, 60_000), *want, "{what}");
    }
}

fn pod(name: &str, created_ms: i64, request_gi: u128) -> PodFacts {
    PodFacts {
        namespace: "apps".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        memory_request: request_gi * GI,
        created_ms,
        qos: Some(Qos::Burstable),
        ..Default::default()
    }
}

fn names(ranked: &[Ranked<'_>]) -> Vec<String> {
    ranked
        .iter()
        .map(|r| {
            format!(
                "{}{}{}",
                r.pod.name,
                if r.beyond_raw { "+" } else { "" },
                if r.spared.is_some() { "!" } else { "" }
            )
        })
        .collect()
}

/// Raw 4Gi; pods placed a, b, c, d, e with requests 2, 1, 1, 1, 1 Gi: a..c fit (4Gi), d and e
/// were placed beyond raw and go first, whatever the others' priority or QoS.
#[test]
fn beyond_raw_first_then_priority_qos_usage() {
    let mut pods = vec![
        pod("a", 1, 2),
        pod("b", 2, 1),
        pod("c", 3, 1),
        pod("d", 4, 1),
        pod("e", 5, 1),
    ];
    pods[0].qos = Some(Qos::BestEffort);
    pods[0].priority = -10;
    pods[4].priority = -1; // e: lower priority than d
    let ranked = rank(&pods, 4 * GI, &[]);
    assert_eq!(names(&ranked), ["e+", "d+", "a", "b", "c"]);

    // Same priority: BestEffort before Burstable before Guaranteed.
    let mut pods = vec![pod("x", 1, 0), pod("y", 1, 0), pod("z", 1, 0)];
    pods[0].qos = Some(Qos::Guaranteed);
    pods[1].qos = Some(Qos::BestEffort);
    pods[2].qos = None; // unreadable: as Burstable
    assert_eq!(names(&rank(&pods, GI, &[])), ["y", "z", "x"]);

    // Same priority and QoS: the largest usage above request first; unmeasured counts 0.
    let mut pods = vec![pod("p", 1, 1), pod("q", 1, 1), pod("r", 1, 1)];
    pods[0].memory_usage = Some(GI + 10);
    pods[1].memory_usage = Some(3 * GI);
    pods[2].memory_usage = None;
    assert_eq!(names(&rank(&pods, 8 * GI, &[])), ["q", "p", "r"]);
    assert_eq!(pods[1].over_request(), 2 * GI);
}

/// Placement order is creation time, then namespace/name; finished pods count for nothing,
/// terminating ones still hold memory (they count) but are never chosen.
#[test]
fn placement_order_and_what_counts() {
    let mut pods = vec![
        pod("late", 9, 2),
        pod("b-early", 1, 2),
        pod("a-early", 1, 2),
        pod("done", 0, 8),
    ];
    pods[3].finished = true;
    // a-early, b-early fill 4Gi; late is beyond.
    assert_eq!(
        names(&rank(&pods, 4 * GI, &[])),
        ["late+", "a-early", "b-early"]
    );
    pods[1].terminating = true; // b-early
    assert_eq!(
        names(&rank(&pods, 4 * GI, &[])),
        ["late+", "a-early", "b-early!"]
    );
}

/// DaemonSet, mirror, critical, exempt-namespace and terminating pods are never chosen, even
/// where they would rank first; the spared keep their placement order at the end.
#[test]
fn spared_pods_are_never_candidates() {
    let mut pods: Vec<PodFacts> = (0..7).map(|i| pod(&format!("p{i}"), i, 1)).collect();
    for p in &mut pods[..6] {
        p.qos = Some(Qos::BestEffort);
        p.priority = -100;
    }
    pods[0].owner_kinds = vec!["ReplicaSet".into(), "DaemonSet".into()];
    pods[1].mirror = true;
    pods[2].priority_class = Some("system-node-critical".into());
    pods[3].priority_class = Some("system-cluster-critical".into());
    pods[4].namespace = "kube-system".into();
    pods[5].terminating = true;
    let exempt = vec!["kube-system".to_string(), "kube-overcommit".to_string()];
    let ranked = rank(&pods, 0, &exempt);
    assert_eq!(
        names(&ranked),
        ["p6+", "p0+!", "p1+!", "p2+!", "p3+!", "p4+!", "p5+!"]
    );
    let why: Vec<String> = ranked.iter().map(describe).collect();
    assert_eq!(
        why[1..],
        [
            "never chosen: owned by a DaemonSet",
            "never chosen: a mirror (static) pod",
            "never chosen: priority class system-node-critical",
            "never chosen: priority class system-cluster-critical",
            "never chosen: in a namespace the webhooks exempt",
            "never chosen: already terminating",
        ]
    );
    assert!(
        why[0].starts_with("placed beyond raw, priority 0, Burstable"),
        "{}",
        why[0]
    );
    // Another priority class is no reason to spare.
    pods[6].priority_class = Some("batch-low".into());
    assert_eq!(spared(&pods[6], &exempt), None);
}

#[test]
fn allowance_table() {
    let minute = 60_000;
    let cases: &[(&[i64], i64, u32, u32)] = &[
        (&[], 100_000, 1, 1),
        (&[99_000], 100_000, 1, 0),
        // Exactly one interval ago: out of the window.
        (&[40_000], 100_000, 1, 1),
        (&[40_001], 100_000, 1, 0),
        (&[10_000, 50_000, 90_000], 100_000, 3, 1),
        (&[10_000, 50_000, 90_000], 100_000, 1, 0),
    ];
    for (done, now, max, want) in cases {
        assert_eq!(
            allowance(done, *now, minute, *max),
            *want,
            "{done:?} at {now}, max {max}"
        );
    }
}

#[test]
fn labels_and_qos_texts() {
    for q in [Qos::BestEffort, Qos::Burstable, Qos::Guaranteed] {
        assert_eq!(Qos::parse(q.as_str()), Some(q));
    }
    assert_eq!(Qos::parse("guaranteed"), None);
    let labels: Vec<&str> = [
        Unknown::MetricsFailing,
        Unknown::NoSample,
        Unknown::Stale,
        Unknown::NoRaw,
    ]
    .iter()
    .map(|u| u.as_str())
    .collect();
    assert_eq!(labels, ["metrics_failing", "no_sample", "stale", "no_raw"]);
}
