//! The `review` and `crd` commands of the real binary.

use std::io::Write;
use std::process::{Command, Output, Stdio};

#[path = "../src/temp_dir.rs"]
mod temp_dir;
use temp_dir::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_kube-overcommit");
const DIR: &str = env!("CARGO_MANIFEST_DIR");

fn run(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = match Command::new(BIN)
        .args(args)
        .current_dir(DIR)
        .env_remove("KUBE_OVERCOMMIT_POLICY_FILE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => panic!("cannot run {BIN}: {e}"),
    };
    // Dropping the pipe closes stdin.
    if let (Some(mut pipe), Some(input)) = (child.stdin.take(), stdin) {
        let _ = pipe.write_all(input);
    }
    match child.wait_with_output() {
        Ok(output) => output,
        Err(e) => panic!("{BIN}: {e}"),
    }
}

fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(bytes)))
}

#[test]
fn review_prints_the_response_serve_would_give() {
    let out = run(
        &[
            "review",
            "--policy-file",
            "tests/fixtures/policies.yaml",
            "tests/fixtures/node-status-update.json",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let review = json(&out.stdout);
    assert_eq!(review["kind"], "AdmissionReview");
    assert_eq!(
        review["response"]["uid"],
        "3c5d2a11-4e7f-4b1a-9d2c-8f6e0a1b2c3d"
    );
    assert_eq!(review["response"]["allowed"], true);
    assert_eq!(review["response"]["patchType"], "JSONPatch");
}

#[test]
fn review_explain_names_policy_and_values() {
    let body = std::fs::read(format!("{DIR}/tests/fixtures/node-create.json")).unwrap_or_default();
    let out = run(
        &[
            "review",
            "--policy-file",
            "tests/fixtures/policies.yaml",
            "--explain",
            "-",
        ],
        Some(&body),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let account = String::from_utf8_lossy(&out.stderr);
    assert!(account.contains("policy batch applies"), "{account}");
    assert!(
        account.contains("cpu: raw 7910m (reported by the kubelet) x 2 -> 15820m"),
        "{account}"
    );
    assert!(
        account.contains("add /metadata/annotations/overcommit.dev~1raw-allocatable"),
        "{account}"
    );
}

#[test]
fn review_accepts_a_bare_node() {
    let node =
        br#"{"kind":"Node","apiVersion":"v1","metadata":{"name":"n1","labels":{"pool":"batch"}},
                   "status":{"capacity":{"cpu":"4"},"allocatable":{"cpu":"4"}}}"#;
    let out = run(
        &[
            "review",
            "--policy-file",
            "tests/fixtures/policies.yaml",
            "--explain",
        ],
        Some(node),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("cpu: raw 4 (reported by the kubelet) x 2 -> 8")
    );
}

#[test]
fn review_explain_names_the_path() {
    let node = |labels: &str| {
        format!(
            r#"{{"kind":"Node","apiVersion":"v1","metadata":{{"name":"n1","labels":{labels}}},
                "status":{{"capacity":{{"cpu":"4"}},"allocatable":{{"cpu":"4"}}}}}}"#
        )
    };
    let batch = node(r#"{"pool":"batch"}"#);
    let out_label = node(r#"{"pool":"batch","overcommit.dev/disabled":"true"}"#);
    let cases: [(&[&str], &str, &str); 5] = [
        (&[], &batch, "path: webhook ("),
        (&["--mode", "webhook"], &batch, "path: webhook ("),
        (
            &["--mode", "in-process", "--webhook-config-name", "oc"],
            &batch,
            "path: in-process (the API server applies MutatingAdmissionPolicy oc;",
        ),
        (
            &["--mode", "in-process"],
            &batch,
            "MutatingAdmissionPolicy kube-overcommit;",
        ),
        (
            &["--mode", "in-process"],
            &out_label,
            "path: none (opted out;",
        ),
    ];
    for (extra, input, want) in cases {
        let mut args = vec![
            "review",
            "--policy-file",
            "tests/fixtures/policies.yaml",
            "--explain",
        ];
        args.extend_from_slice(extra);
        let out = run(&args, Some(input.as_bytes()));
        let account = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{extra:?}: {account}");
        assert_eq!(
            account.lines().filter(|l| l.starts_with("path: ")).count(),
            1,
            "{extra:?}: one path line in {account}"
        );
        assert!(
            account.contains(want),
            "{extra:?}: {want:?} not in {account}"
        );
    }
}

#[test]
fn review_refuses_a_bad_policy_file_with_a_clear_message() {
    let dir = match TempDir::new() {
        Ok(d) => d,
        Err(e) => panic!("{e}"),
    };
    let path = dir.path().join("bad.yaml");
    let bad = "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {name: x}\nspec: {nodeRatios: {cpu: \"20\"}}\n";
    if let Err(e) = std::fs::write(&path, bad) {
        panic!("{e}");
    }
    let path = path.to_string_lossy().to_string();
    let out = run(
        &[
            "review",
            "--policy-file",
            &path,
            "tests/fixtures/node-create.json",
        ],
        None,
    );
    assert!(!out.status.success());
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(
        message.contains("policy x") && message.contains("between 1 and 10"),
        "{message}"
    );
}

#[test]
fn review_of_garbage_fails_with_the_400_message() {
    let out = run(
        &["review", "--policy-file", "tests/fixtures/policies.yaml"],
        Some(b"{not json"),
    );
    assert!(!out.status.success());
    assert_eq!(json(&out.stdout)["code"], 400);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an AdmissionReview"));
}

#[test]
fn crd_prints_the_checked_in_definition() {
    let out = run(&["crd"], None);
    assert!(out.status.success());
    let committed =
        std::fs::read(format!("{DIR}/deploy/crd/overcommitpolicies.yaml")).unwrap_or_default();
    assert!(
        out.stdout == committed,
        "deploy/crd/overcommitpolicies.yaml is stale: run `make crd`"
    );
}

/// Quiet heartbeats replayed offline: at the time the review was made, the stored heartbeats
/// are young and kept; a day later they are too old and go through as sent; without the flag
/// (the default) nothing is said of heartbeats.
#[test]
fn review_explains_each_heartbeat() {
    let args = |extra: &[&'static str]| {
        let mut args = vec![
            "review",
            "--explain",
            "--policy-file",
            "tests/fixtures/policies.yaml",
            "tests/fixtures/node-status-update.json",
        ];
        args.extend_from_slice(extra);
        args
    };
    let at_the_time = run(
        &args(&["--heartbeat-refresh", "5m", "--now", "2026-11-21T20:58:30Z"]),
        None,
    );
    assert!(at_the_time.status.success());
    let explained = String::from_utf8_lossy(&at_the_time.stderr);
    assert!(
        explained.contains("Ready: heartbeat kept: stored 20s old, refresh 5m"),
        "{explained}"
    );
    let patch = json(&at_the_time.stdout)["response"]["patch"].clone();
    assert!(patch.is_string(), "a patch keeps the heartbeats");

    let a_day_later = run(
        &args(&["--heartbeat-refresh", "5m", "--now", "2026-11-22T20:58:30Z"]),
        None,
    );
    let explained = String::from_utf8_lossy(&a_day_later.stderr);
    assert!(
        explained.contains("Ready: heartbeat sent: stored 24h0m old, refresh 5m"),
        "{explained}"
    );

    // On by default (5m), as serve; 0 turns it off.
    let by_default = run(&args(&["--now", "2026-11-21T20:58:30Z"]), None);
    let explained = String::from_utf8_lossy(&by_default.stderr);
    assert!(
        explained.contains("Ready: heartbeat kept: stored 20s old, refresh 5m"),
        "{explained}"
    );
    let off = run(&args(&["--heartbeat-refresh", "0"]), None);
    let explained = String::from_utf8_lossy(&off.stderr);
    assert!(!explained.contains("heartbeat"), "{explained}");

    let bad = run(&args(&["--now", "yesterday"]), None);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("RFC 3339"));
}

#[test]
fn review_replays_a_usage_decision_from_flags_or_a_usage_file() {
    let dir = TempDir::new().unwrap_or_else(|e| panic!("temp dir: {e}"));
    let policy = dir.path().join("usage.yaml");
    std::fs::write(
        &policy,
        "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {name: usage}\nspec:\n  nodeRatios: {cpu: \"2\"}\n  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"4\"}}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let usage_file = dir.path().join("usage.json");
    std::fs::write(
        &usage_file,
        r#"{"metricsFailing": true, "cpu": {"requested": "12", "peakUsage": "3"}}"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // A sample 106 s old, measured over 15 s, polled every 30 s: past 15 + 3 x 30 = 105 s.
    let stale_file = dir.path().join("stale.json");
    std::fs::write(
        &stale_file,
        r#"{"sampleAge": "106s", "sampleWindow": "15s", "usageInterval": "30s", "cpu": {"requested": "12", "peakUsage": "3"}}"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let fresh_file = dir.path().join("fresh.json");
    std::fs::write(
        &fresh_file,
        r#"{"sampleAge": "105s", "sampleWindow": "15s", "usageInterval": "30s", "cpu": {"requested": "12", "peakUsage": "3"}}"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let node = br#"{"kind":"Node","apiVersion":"v1","metadata":{"name":"n1"},"status":{"capacity":{"cpu":"16"},"allocatable":{"cpu":"16"}}}"#;
    let policy = policy.to_string_lossy();
    let usage_file = usage_file.to_string_lossy();
    let stale_file = stale_file.to_string_lossy();
    let fresh_file = fresh_file.to_string_lossy();
    let base = ["review", "--explain", "--policy-file", &policy];
    let cases: &[(&[&str], &str)] = &[
        // docs/policy.md's examples: 12 + 9.6 - 3 = 18.6; 10 + 9.6 - 4 = 15.6 < 16: raw.
        (
            &["--requested", "cpu=12", "--peak-usage", "cpu=3"],
            "from usage (requested 12, peak usage 3) -> 18600m",
        ),
        (
            &["--requested", "cpu=10", "--peak-usage", "cpu=4"],
            "from usage (requested 10, peak usage 4) -> 16",
        ),
        (
            &["--usage-file", &usage_file],
            "usage fallback (metrics_failing): x 2 -> 32",
        ),
        (
            &["--usage-file", &stale_file],
            "usage fallback (stale: newest sample 106s old, window 15s, polled every 30s): x 2 -> 32",
        ),
        (
            &["--usage-file", &fresh_file],
            "from usage (requested 12, peak usage 3) -> 18600m",
        ),
        (&[], "usage fallback (no_sample): x 2 -> 32"),
    ];
    for (flags, expected) in cases {
        let mut args = base.to_vec();
        args.extend_from_slice(flags);
        args.push("-");
        let out = run(&args, Some(node));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{flags:?}: {stderr}");
        assert!(stderr.contains(expected), "{flags:?}: {stderr}");
    }
    let out = run(
        &[&base[..], &["--requested", "pods=3", "-"]].concat(),
        Some(node),
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("RESOURCE=QUANTITY"));
}

/// `review --explain-relief`: memory relief's decision replayed from files: the node above
/// 90% of its 4Gi, pods ranked (beyond raw first, lowest priority, BestEffort first, largest
/// usage above request), DaemonSet and critical pods never chosen, what would be evicted; and
/// with metrics failing, no relief and why.
#[test]
fn review_explain_relief_replays_the_decision() {
    let dir = TempDir::new().unwrap_or_else(|e| panic!("{e}"));
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
        path.to_string_lossy().into_owned()
    };
    let policy = write(
        "policy.yaml",
        "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {name: relief}\n\
         spec:\n  nodeRatios: {memory: \"2\"}\n  eviction: {memoryCritical: \"90%\", maxPodsPerNode: 1}\n",
    );
    let node = write(
        "node.json",
        r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1",
            "annotations": {"overcommit.dev/raw-allocatable": "{\"memory\":\"4Gi\"}"}},
            "status": {"allocatable": {"memory": "8Gi"}}}"#,
    );
    let pod = |name: &str, created: &str, extra: &str| {
        format!(
            r#"{{"metadata": {{"namespace": "apps", "name": "{name}", "uid": "u-{name}",
                "creationTimestamp": "{created}"{extra}}},
              "spec": {{"nodeName": "n1", "containers": [{{"name": "c"}}]}},
              "status": {{"phase": "Running", "qosClass": "BestEffort"}}}}"#
        )
    };
    let base = r#"{"metadata": {"namespace": "apps", "name": "base", "uid": "u-base",
            "creationTimestamp": "2026-11-24T10:00:00Z"},
          "spec": {"nodeName": "n1", "containers": [{"name": "c",
            "resources": {"requests": {"memory": "5Gi"}}}]},
          "status": {"phase": "Running", "qosClass": "Burstable"}}"#;
    let ds = r#", "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "d1"}]"#;
    let pods = write(
        "pods.json",
        &format!(
            r#"{{"kind": "PodList", "items": [{base}, {}, {}, {}]}}"#,
            pod("agent", "2026-11-24T10:01:00Z", ds),
            pod("small", "2026-11-24T10:02:00Z", ""),
            pod("big", "2026-11-24T10:03:00Z", ""),
        ),
    );
    let metrics = write(
        "podmetrics.json",
        r#"{"kind": "PodMetricsList", "items": [
            {"metadata": {"namespace": "apps", "name": "small"}, "containers": [{"usage": {"memory": "100Mi"}}]},
            {"metadata": {"namespace": "apps", "name": "big"}, "containers": [{"usage": {"memory": "1Gi"}}]}]}"#,
    );
    let hot = write("usage.json", r#"{"memory": {"peakUsage": "3900Mi"}}"#);
    let args = |usage: &str| {
        run(
            &[
                "review",
                "--policy-file",
                &policy,
                "--explain-relief",
                "--pods",
                &pods,
                "--pod-metrics",
                &metrics,
                "--usage-file",
                usage,
                &node,
            ],
            None,
        )
    };
    let out = args(&hot);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 7, "{text}");
    assert!(
        lines[0].starts_with("policy relief: memoryCritical 90%, maxPodsPerNode 1"),
        "{text}"
    );
    assert!(
        lines[1].starts_with(
            "node n1: needs relief: memory usage 4089446400 B is above the critical 3865470566 B"
        ),
        "{text}"
    );
    // base (5Gi) is beyond raw (4Gi) itself; all after it too. big uses more above request.
    assert!(
        lines[2].starts_with("  1 apps/big: placed beyond raw, priority 0, BestEffort"),
        "{text}"
    );
    assert!(
        lines[3].starts_with("  2 apps/small: placed beyond raw"),
        "{text}"
    );
    assert!(
        lines[4].starts_with("  3 apps/base: placed beyond raw, priority 0, Burstable"),
        "{text}"
    );
    assert_eq!(
        lines[5], "  - apps/agent: never chosen: owned by a DaemonSet",
        "{text}"
    );
    assert_eq!(
        lines[6],
        "would evict: apps/big (a PodDisruptionBudget refusal moves on to the next)"
    );
    let failing = write(
        "failing.json",
        r#"{"metricsFailing": true, "memory": {"peakUsage": "3900Mi"}}"#,
    );
    let out = args(&failing);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("node n1: no relief: metrics.k8s.io is failing")
            && !text.contains("would evict"),
        "{text}"
    );
    // --explain-relief without --pods is refused by the command line.
    let out = run(
        &[
            "review",
            "--policy-file",
            &policy,
            "--explain-relief",
            &node,
        ],
        None,
    );
    assert!(!out.status.success());
}
