//! Table tests of the pressure taint (pure).

use std::time::Duration;

use super::*;

const SEC: i64 = 1000;

fn pressure(
    hold_secs: u64,
    cpu: Option<(u32, u32)>,
    memory: Option<(u32, u32)>,
) -> CompiledPressure {
    let marks = |(high, low)| Watermarks { high, low };
    CompiledPressure {
        hold: Duration::from_secs(hold_secs),
        cpu: cpu.map(marks),
        memory: memory.map(marks),
    }
}

/// Usage as a percent of a 4-core (4000m) node.
fn cpu(percent: u128) -> Reading {
    Reading::Known {
        used: percent * 40,
        raw: 4000,
    }
}

#[test]
fn one_resource_step_by_step() {
    let marks = Some(Watermarks { high: 90, low: 75 });
    let hold = 10_000;
    let up = ResourceState {
        under_pressure: true,
        below_since_ms: None,
    };
    let holding = |since| ResourceState {
        under_pressure: true,
        below_since_ms: Some(since),
    };
    let down = ResourceState::default();
    // (name, reading, was, now, want state, want why)
    let cases: Vec<(&str, Reading, ResourceState, i64, ResourceState, Why)> = vec![
        (
            "above high taints at once",
            cpu(91),
            down,
            0,
            up,
            Why::Above,
        ),
        (
            "exactly high is not above",
            cpu(90),
            down,
            0,
            down,
            Why::Between,
        ),
        ("above high stays tainted", cpu(99), up, 0, up, Why::Above),
        (
            "above high ends a hold",
            cpu(95),
            holding(0),
            5 * SEC,
            up,
            Why::Above,
        ),
        (
            "between keeps untainted",
            cpu(80),
            down,
            0,
            down,
            Why::Between,
        ),
        ("between keeps tainted", cpu(80), up, 0, up, Why::Between),
        ("exactly low is between", cpu(75), up, 0, up, Why::Between),
        (
            "between restarts the hold",
            cpu(80),
            holding(0),
            5 * SEC,
            up,
            Why::Between,
        ),
        (
            "below low starts the hold",
            cpu(50),
            up,
            7 * SEC,
            holding(7 * SEC),
            Why::Holding,
        ),
        (
            "below low, hold not over",
            cpu(50),
            holding(0),
            9 * SEC,
            holding(0),
            Why::Holding,
        ),
        (
            "below low for the hold: relieved",
            cpu(50),
            holding(0),
            10 * SEC,
            down,
            Why::Below,
        ),
        ("below low, untainted", cpu(10), down, 0, down, Why::Below),
        (
            "unknown keeps tainted",
            Reading::Unknown(Skip::MetricsFailing),
            up,
            0,
            up,
            Why::Unknown(Skip::MetricsFailing),
        ),
        (
            "unknown keeps untainted",
            Reading::Unknown(Skip::Stale),
            down,
            0,
            down,
            Why::Unknown(Skip::Stale),
        ),
        (
            "unknown restarts the hold",
            Reading::Unknown(Skip::NoSample),
            holding(0),
            20 * SEC,
            up,
            Why::Unknown(Skip::NoSample),
        ),
        (
            "huge numbers do not overflow",
            Reading::Known {
                used: u128::MAX,
                raw: u128::MAX,
            },
            down,
            0,
            down,
            Why::Between,
        ),
    ];
    for (name, reading, was, now, want, why) in cases {
        assert_eq!(
            judge_resource(marks, hold, reading, was, now),
            (want, why),
            "{name}"
        );
    }
    assert_eq!(
        judge_resource(None, hold, cpu(99), up, 0),
        (down, Why::NotWatched),
        "not watched: relieved"
    );
}

#[test]
fn readings() {
    let sample = Sample {
        at_ms: 100 * SEC,
        window_ms: 10_000,
        cpu_millis: 3500,
        memory_bytes: 1 << 30,
    };
    let polled = Polled {
        synced: true,
        metrics_failing: false,
        sample: Some(sample),
        poll_interval_ms: 10_000,
    };
    let now = 110 * SEC;
    // (name, polled, resource, raw, now, want)
    type Case<'a> = (&'a str, Polled, &'a str, Option<u128>, i64, Reading);
    let cases: Vec<Case<'_>> = vec![
        (
            "cpu",
            polled,
            "cpu",
            Some(4000),
            now,
            Reading::Known {
                used: 3500,
                raw: 4000,
            },
        ),
        (
            "memory",
            polled,
            "memory",
            Some(2 << 30),
            now,
            Reading::Known {
                used: 1 << 30,
                raw: 2 << 30,
            },
        ),
        (
            "not synced",
            Polled {
                synced: false,
                ..polled
            },
            "cpu",
            Some(4000),
            now,
            Reading::Unknown(Skip::NotSynced),
        ),
        (
            "failing",
            Polled {
                metrics_failing: true,
                ..polled
            },
            "cpu",
            Some(4000),
            now,
            Reading::Unknown(Skip::MetricsFailing),
        ),
        (
            "no sample",
            Polled {
                sample: None,
                ..polled
            },
            "cpu",
            Some(4000),
            now,
            Reading::Unknown(Skip::NoSample),
        ),
        // window 10 s + 3 polls of 10 s: fresh at 40 s old, stale after.
        (
            "fresh at the limit",
            polled,
            "cpu",
            Some(4000),
            140 * SEC,
            Reading::Known {
                used: 3500,
                raw: 4000,
            },
        ),
        (
            "stale",
            polled,
            "cpu",
            Some(4000),
            140 * SEC + 1,
            Reading::Unknown(Skip::Stale),
        ),
        (
            "no raw",
            polled,
            "cpu",
            None,
            now,
            Reading::Unknown(Skip::NoRaw),
        ),
        (
            "zero raw",
            polled,
            "cpu",
            Some(0),
            now,
            Reading::Unknown(Skip::NoRaw),
        ),
    ];
    for (name, polled, resource, raw, now, want) in cases {
        assert_eq!(reading(&polled, resource, raw, now), want, "{name}");
    }
}

#[test]
fn raw_allocatable() {
    // (name, annotation, allocatable, resource, want)
    type Case<'a> = (
        &'a str,
        Option<&'a str>,
        Option<&'a str>,
        &'a str,
        Option<u128>,
    );
    let cases: Vec<Case<'_>> = vec![
        (
            "not inflated: allocatable",
            None,
            Some("3920m"),
            "cpu",
            Some(3920),
        ),
        (
            "inflated: the annotation",
            Some("cpu=4,memory=8Gi"),
            Some("8"),
            "cpu",
            Some(4000),
        ),
        (
            "inflated, memory",
            Some(r#"{"memory":"8Gi"}"#),
            Some("16Gi"),
            "memory",
            Some(8 << 30),
        ),
        (
            "annotation without the resource",
            Some("memory=8Gi"),
            Some("2"),
            "cpu",
            Some(2000),
        ),
        ("unreadable annotation", Some("cpu"), Some("2"), "cpu", None),
        ("unreadable allocatable", None, Some("two"), "cpu", None),
        ("nothing", None, None, "memory", None),
    ];
    for (name, annotation, allocatable, resource, want) in cases {
        assert_eq!(raw_units(annotation, allocatable, resource), want, "{name}");
    }
}

#[test]
fn taint_values() {
    let set = |r: &[&'static str]| r.iter().copied().collect::<BTreeSet<_>>();
    assert_eq!(taint_value(&set(&[])), None);
    assert_eq!(taint_value(&set(&["cpu"])).as_deref(), Some("cpu"));
    assert_eq!(
        taint_value(&set(&["memory", "cpu"])).as_deref(),
        Some("cpu-memory")
    );
    assert_eq!(taint_resources(Some("cpu-memory")), set(&["cpu", "memory"]));
    assert_eq!(taint_resources(Some("memory")), set(&["memory"]));
    assert_eq!(taint_resources(Some("gpu")), set(&[]));
    assert_eq!(taint_resources(None), set(&[]));
}

#[test]
fn nodes() {
    let both = pressure(10, Some((90, 75)), Some((85, 70)));
    let cpu_only = pressure(10, Some((90, 75)), None);
    let none = BTreeMap::new();
    let hot = |r: &str| {
        if r == "cpu" {
            cpu(95)
        } else {
            Reading::Known { used: 90, raw: 100 }
        }
    };
    let calm = |_: &str| cpu(10);
    let unknown = |_: &str| Reading::Unknown(Skip::MetricsFailing);
    // (name, pressure, taint, reading, want change)
    type Read = fn(&str) -> Reading;
    type Case<'a> = (
        &'a str,
        Option<&'a CompiledPressure>,
        Option<&'a str>,
        Read,
        Change,
    );
    let cases: Vec<Case<'_>> = vec![
        (
            "both hot: one taint, both named",
            Some(&both),
            None,
            hot,
            Change::Add("cpu-memory".into()),
        ),
        (
            "cpu only watched",
            Some(&cpu_only),
            None,
            hot,
            Change::Add("cpu".into()),
        ),
        (
            "memory no longer watched: value narrows",
            Some(&cpu_only),
            Some("cpu-memory"),
            hot,
            Change::Set("cpu".into()),
        ),
        ("kept", Some(&both), Some("cpu-memory"), hot, Change::Keep),
        ("calm, untainted", Some(&both), None, calm, Change::Keep),
        (
            "calm, tainted: the hold starts",
            Some(&both),
            Some("cpu"),
            calm,
            Change::Keep,
        ),
        (
            "unknown: no change",
            Some(&both),
            Some("cpu"),
            unknown,
            Change::Keep,
        ),
        (
            "unknown: no taint added",
            Some(&both),
            None,
            unknown,
            Change::Keep,
        ),
        (
            "no policy with pressure: removed",
            None,
            Some("cpu-memory"),
            hot,
            Change::Remove,
        ),
        ("no policy, untainted", None, None, hot, Change::Keep),
        (
            "a value not ours is rewritten",
            Some(&both),
            Some("gpu"),
            hot,
            Change::Set("cpu-memory".into()),
        ),
        (
            "a value not ours goes",
            Some(&both),
            Some("gpu"),
            calm,
            Change::Remove,
        ),
    ];
    for (name, pressure, taint, read, want) in cases {
        assert_eq!(
            judge_node(pressure, taint, &none, read, 0).change,
            want,
            "{name}"
        );
    }
    // The hold across polls: starts, is kept, and relieves after 10 s.
    let first = judge_node(Some(&both), Some("cpu"), &none, calm, 0);
    assert_eq!(first.holds, BTreeMap::from([("cpu", 0)]));
    let second = judge_node(Some(&both), Some("cpu"), &first.holds, calm, 9 * SEC);
    assert_eq!(
        (second.change, second.holds.clone()),
        (Change::Keep, first.holds.clone())
    );
    let third = judge_node(Some(&both), Some("cpu"), &second.holds, calm, 10 * SEC);
    assert_eq!(
        (third.change, third.holds),
        (Change::Remove, BTreeMap::new())
    );
    // Unknown usage while holding restarts the hold (the safe direction: tainted longer).
    let lost = judge_node(Some(&both), Some("cpu"), &first.holds, unknown, 9 * SEC);
    assert_eq!((lost.change, lost.holds), (Change::Keep, BTreeMap::new()));
}

/// Replays `percents` (one poll every `interval_ms`) and returns the taint changes made.
fn replay(
    pressure: &CompiledPressure,
    percents: impl Iterator<Item = u128>,
    interval_ms: i64,
) -> Vec<Change> {
    let mut taint: Option<String> = None;
    let mut holds = BTreeMap::new();
    let mut changes = Vec::new();
    for (i, percent) in percents.enumerate() {
        let now = i64::try_from(i).unwrap_or(i64::MAX) * interval_ms;
        let d = judge_node(
            Some(pressure),
            taint.as_deref(),
            &holds,
            |_| cpu(percent),
            now,
        );
        holds = d.holds;
        match &d.change {
            Change::Keep => continue,
            Change::Add(v) | Change::Set(v) => taint = Some(v.clone()),
            Change::Remove => taint = None,
        }
        changes.push(d.change);
    }
    changes
}

/// ±3% around high for 5 minutes, polled every 10 s (and every 1 s): the taint is added once
/// and never removed; then below low for the hold time: removed once.
#[test]
fn flapping_around_high_taints_at_most_once() {
    let p = pressure(300, Some((90, 75)), None);
    for interval in [10 * SEC, SEC] {
        let polls = 300 * SEC / interval;
        let flapping = (0..polls).map(|i| if i % 2 == 0 { 87 } else { 93 });
        assert_eq!(
            replay(&p, flapping, interval),
            vec![Change::Add("cpu".into())],
            "every {interval} ms"
        );
        // A sawtooth 87, 88, ..., 93 and back.
        let saw = (0..polls).map(|i| 87 + u128::from((i % 7) as u8));
        assert_eq!(
            replay(&p, saw, interval),
            vec![Change::Add("cpu".into())],
            "sawtooth every {interval} ms"
        );
    }
    // Then calm: one removal, after the 5 min hold, not before.
    let calm_after = (0..30).map(|_| 95).chain((0..40).map(|_| 50));
    let changes = replay(&p, calm_after, 10 * SEC);
    assert_eq!(changes, vec![Change::Add("cpu".into()), Change::Remove]);
    let too_short = (0..30).map(|_| 95).chain((0..30).map(|_| 50));
    assert_eq!(
        replay(&p, too_short, 10 * SEC),
        vec![Change::Add("cpu".into())],
        "29 polls below low: 290 s < 300 s"
    );
    // ±3% around low with a 10 s hold never relieves: never below low for 10 s straight.
    let q = pressure(10, Some((90, 75)), None);
    let around_low = (0..5)
        .map(|_| 95)
        .chain((0..60).map(|i| if i % 2 == 0 { 72 } else { 78 }));
    assert_eq!(
        replay(&q, around_low, 5 * SEC),
        vec![Change::Add("cpu".into())]
    );
}
