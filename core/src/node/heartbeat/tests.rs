use super::*;

const NOW: &str = "2026-11-24T02:00:00Z";

fn now_ms() -> i64 {
    timestamp_ms(NOW).expect("NOW parses")
}

fn quiet(refresh_s: u64) -> Quiet {
    Quiet {
        now_ms: now_ms(),
        refresh: Duration::from_secs(refresh_s),
    }
}

fn condition<'a>(kind: &'a str, status: &'a str, heartbeat: &'a str) -> Condition<'a> {
    Condition {
        kind: Some(kind.into()),
        status: Some(status.into()),
        reason: Some("KubeletReady".into()),
        message: Some("kubelet is posting ready status".into()),
        last_transition_time: Some("2026-11-20T00:00:00Z".into()),
        last_heartbeat_time: Some(heartbeat.into()),
    }
}

/// `keep_stored` for one incoming and one stored condition: the verdict and the patch.
fn one(
    incoming: Condition<'_>,
    stored: &[Condition<'_>],
    refresh_s: u64,
) -> (Verdict, Vec<PatchOp>) {
    let mut patch = Vec::new();
    let (kept, lines) = keep_stored(
        &[incoming],
        stored,
        quiet(refresh_s),
        Account::Full,
        &mut patch,
    );
    assert_eq!(kept, !patch.is_empty());
    (lines[0].verdict.clone(), patch)
}

#[test]
fn heartbeats_are_kept_only_when_nothing_but_the_heartbeat_changed_and_the_stored_one_is_young() {
    let stored_40s = "2026-11-24T01:59:20Z";
    let sent = "2026-11-24T02:00:00Z";
    let cases: Vec<(&str, Condition<'_>, Vec<Condition<'_>>, u64, Verdict)> = vec![
        (
            "only the heartbeat moved, stored 40 s old",
            condition("Ready", "True", sent),
            vec![condition("Ready", "True", stored_40s)],
            300,
            Verdict::Kept {
                stored_age_ms: 40_000,
            },
        ),
        (
            "stored exactly the refresh period old: sent",
            condition("Ready", "True", sent),
            vec![condition("Ready", "True", "2026-11-24T01:55:00Z")],
            300,
            Verdict::StoredTooOld {
                stored_age_ms: 300_000,
            },
        ),
        (
            "stored older than the refresh period: sent",
            condition("Ready", "True", sent),
            vec![condition("Ready", "True", "2026-11-24T01:50:00Z")],
            300,
            Verdict::StoredTooOld {
                stored_age_ms: 600_000,
            },
        ),
        (
            "stored in the future within the refresh period (clock skew): kept",
            condition("Ready", "True", sent),
            vec![condition("Ready", "True", "2026-11-24T02:01:00Z")],
            300,
            Verdict::Kept {
                stored_age_ms: -60_000,
            },
        ),
        (
            "stored in the future beyond the refresh period: sent",
            condition("Ready", "True", sent),
            vec![condition("Ready", "True", "2026-11-24T02:10:00Z")],
            300,
            Verdict::StoredTooOld {
                stored_age_ms: -600_000,
            },
        ),
        (
            "status flipped: sent",
            condition("MemoryPressure", "True", sent),
            vec![condition("MemoryPressure", "False", stored_40s)],
            300,
            Verdict::Changed("status"),
        ),
        (
            "reason changed: sent",
            Condition {
                reason: Some("Other".into()),
                ..condition("Ready", "True", sent)
            },
            vec![condition("Ready", "True", stored_40s)],
            300,
            Verdict::Changed("reason"),
        ),
        (
            "message changed: sent",
            Condition {
                message: Some("other".into()),
                ..condition("Ready", "True", sent)
            },
            vec![condition("Ready", "True", stored_40s)],
            300,
            Verdict::Changed("message"),
        ),
        (
            "transition time changed: sent",
            Condition {
                last_transition_time: Some("2026-11-24T02:00:00Z".into()),
                ..condition("Ready", "True", sent)
            },
            vec![condition("Ready", "True", stored_40s)],
            300,
            Verdict::Changed("lastTransitionTime"),
        ),
        (
            "a new condition type: sent",
            condition("NetworkUnavailable", "False", sent),
            vec![condition("Ready", "True", stored_40s)],
            300,
            Verdict::NotStored,
        ),
        (
            "already the stored time (another status writer): nothing to do",
            condition("Ready", "True", stored_40s),
            vec![condition("Ready", "True", stored_40s)],
            300,
            Verdict::AsStored,
        ),
        (
            "stored heartbeat null (a zero time): sent",
            condition("Ready", "True", sent),
            vec![Condition {
                last_heartbeat_time: None,
                ..condition("Ready", "True", "")
            }],
            300,
            Verdict::Unreadable,
        ),
        (
            "stored heartbeat not a time: sent",
            condition("Ready", "True", sent),
            vec![condition("Ready", "True", "yesterday")],
            300,
            Verdict::Unreadable,
        ),
        (
            "refresh 0 (off): every heartbeat sent",
            condition("Ready", "True", sent),
            vec![condition("Ready", "True", stored_40s)],
            0,
            Verdict::StoredTooOld {
                stored_age_ms: 40_000,
            },
        ),
    ];
    for (name, incoming, stored, refresh, expected) in cases {
        let kept_time = stored
            .first()
            .and_then(|s| s.last_heartbeat_time.as_deref())
            .unwrap_or_default()
            .to_string();
        let (verdict, patch) = one(incoming, &stored, refresh);
        assert_eq!(verdict, expected, "{name}");
        match verdict {
            Verdict::Kept { .. } => assert_eq!(
                patch,
                vec![PatchOp::Add {
                    path: "/status/conditions/0/lastHeartbeatTime".into(),
                    value: Value::String(kept_time),
                }],
                "{name}"
            ),
            _ => assert!(patch.is_empty(), "{name}: {patch:?}"),
        }
    }
}

#[test]
fn each_condition_is_judged_on_its_own_and_patched_at_its_index() {
    let stored = [
        condition("MemoryPressure", "False", "2026-11-24T01:59:00Z"),
        condition("Ready", "True", "2026-11-24T01:59:30Z"),
    ];
    // The kubelet's order differs from the stored one; MemoryPressure flipped.
    let incoming = [
        condition("Ready", "True", "2026-11-24T02:00:00Z"),
        condition("MemoryPressure", "True", "2026-11-24T02:00:00Z"),
    ];
    let mut patch = Vec::new();
    let (kept, lines) = keep_stored(
        &incoming,
        &stored,
        quiet(300),
        Account::PatchOnly,
        &mut patch,
    );
    assert!(kept);
    assert!(lines.is_empty(), "no account asked for");
    assert_eq!(
        patch,
        vec![PatchOp::Add {
            path: "/status/conditions/0/lastHeartbeatTime".into(),
            value: Value::String("2026-11-24T01:59:30Z".into()),
        }]
    );
}

#[test]
fn explain_says_what_happened_and_why() {
    let line = |verdict| HeartbeatLine {
        condition: "Ready".into(),
        verdict,
    };
    let refresh = Duration::from_secs(300);
    assert_eq!(
        line(Verdict::Kept {
            stored_age_ms: 40_000
        })
        .explain(refresh),
        "Ready: heartbeat kept: stored 40s old, refresh 5m"
    );
    assert_eq!(
        line(Verdict::StoredTooOld {
            stored_age_ms: 310_000
        })
        .explain(refresh),
        "Ready: heartbeat sent: stored 5m10s old, refresh 5m"
    );
    assert_eq!(
        line(Verdict::Kept {
            stored_age_ms: -2_000
        })
        .explain(refresh),
        "Ready: heartbeat kept: stored 2s in the future, refresh 5m"
    );
    assert_eq!(
        line(Verdict::Changed("status")).explain(refresh),
        "Ready: heartbeat sent: status changed"
    );
}

#[test]
fn a_condition_read_member_by_member_is_the_condition_serde_reads() {
    let json = r#"{"type":"Ready","status":"True","lastHeartbeatTime":"2026-11-24T02:00:00Z","lastTransitionTime":"2026-11-20T00:00:00Z","reason":"KubeletReady","message":"kubelet is posting ready status","extra":"x"}"#;
    let mut fast = Condition::default();
    let end =
        overcommit_json::plain::members_in(json.as_bytes(), 0, |key, value| fast.set(&key, value));
    assert_eq!(end, Some(json.len()));
    let serde: Condition<'_> = serde_json::from_str(json).expect("serde");
    assert_eq!(fast, serde);
    assert_eq!(serde, condition("Ready", "True", "2026-11-24T02:00:00Z"));
    // A field given twice: serde refuses it, and so does `set` (the reader then asks serde).
    let twice = r#"{"type":"Ready","type":"Other"}"#;
    assert!(serde_json::from_str::<Condition<'_>>(twice).is_err());
    let mut fast = Condition::default();
    assert_eq!(
        overcommit_json::plain::members_in(twice.as_bytes(), 0, |k, v| fast.set(&k, v)),
        None
    );
}

#[test]
fn the_api_servers_time_form_is_read_as_jiff_reads_it() {
    let jiff_ms = |t: &str| {
        t.parse::<jiff::Timestamp>()
            .ok()
            .map(|t| t.as_millisecond())
    };
    let fixed = [
        "1970-01-01T00:00:00Z",
        "1969-12-31T23:59:59Z",
        "2000-02-29T12:00:00Z",
        "2100-02-28T23:59:59Z",
        "2024-02-29T00:00:01Z",
        "2026-11-24T01:41:17Z",
        "0001-01-01T00:00:00Z",
        "9999-12-30T21:59:59Z",
    ];
    for t in fixed {
        assert_eq!(utc_seconds_ms(t), jiff_ms(t), "{t}");
        assert!(utc_seconds_ms(t).is_some(), "{t}");
    }
    // Every day from 1900 to 2200 at a varying time of day.
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let start = jiff::civil::date(1900, 1, 1);
    for offset in 0..(300 * 366) {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let Ok(day) = start.checked_add(jiff::Span::new().days(offset)) else {
            break;
        };
        let secs = (seed >> 33) % 86_400;
        let t = format!(
            "{day}T{:02}:{:02}:{:02}Z",
            secs / 3600,
            secs / 60 % 60,
            secs % 60
        );
        assert_eq!(utc_seconds_ms(&t), jiff_ms(&t), "{t}");
    }
    // Other forms and impossible dates are left to jiff (which reads or refuses them).
    let others = [
        "2026-11-24T01:41:17.5Z",
        "2026-11-24T01:41:17+01:00",
        "2026-11-24 01:41:17Z",
        "2026-02-29T00:00:00Z",
        "2026-13-01T00:00:00Z",
        "2026-11-31T00:00:00Z",
        "2026-11-24T24:00:00Z",
        "2026-11-24T23:60:00Z",
        "2026-11-24T23:59:60Z",
        "+2026-11-24T01:41:1Z",
        "2026-11-2xT01:41:17Z",
        "2026-11-2/T01:41:17Z",
        "2026-11-24T01:41: 7Z",
        "",
    ];
    for t in others {
        assert_eq!(utc_seconds_ms(t), None, "{t}");
        assert_eq!(timestamp_ms(t), jiff_ms(t), "{t}");
    }
}

#[test]
fn heartbeat_path_is_the_pointer_of_its_segments() {
    for index in (0..=11).chain([99, 100, 12_345, usize::MAX]) {
        let index_text = index.to_string();
        let segments = ["status", "conditions", &index_text, "lastHeartbeatTime"];
        assert_eq!(heartbeat_path(index), crate::patch::pointer(segments));
    }
}
