//! The generated CRD on the real kube-apiserver of tests/cluster: it is accepted (structural
//! schema, CEL cost within budget), the example policies are stored, invalid policies are refused
//! with the messages the code gives too, and what the API server stores reads back through
//! `parse_policy_file` + `PolicySet::new`.
//!
//! Needs the local control plane (built on first use by tests/cluster/kcp.sh, see its README),
//! so it is `#[ignore]`d in `cargo test` and run by `make test-e2e`:
//! `cargo test --test e2e_crd_validation -- --ignored`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use overcommit_core::policy::{PolicySet, parse_policy_file};

#[path = "../src/temp_dir.rs"]
mod temp_dir;
use temp_dir::TempDir;

const DIR: &str = env!("CARGO_MANIFEST_DIR");

/// A control plane in its own run directory, stopped on drop (and by itself after 10 minutes or
/// when this process is gone).
struct ControlPlane {
    run_dir: TempDir,
}

impl ControlPlane {
    fn up() -> ControlPlane {
        let run_dir = TempDir::with_prefix("kube-overcommit-crd-e2e-")
            .unwrap_or_else(|e| panic!("temp dir: {e}"));
        let pid = std::process::id().to_string();
        let out = kcp(
            run_dir.path(),
            &[
                "up",
                "--nodes",
                "1",
                "--max-lifetime",
                "10m",
                "--exit-with-pid",
                &pid,
                "--timeout",
                "5m",
            ],
            None,
        );
        assert!(
            out.status.success(),
            "kcp up failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        ControlPlane { run_dir }
    }

    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let kubeconfig = self.run_dir.path().join("kubeconfig");
        let kubeconfig = kubeconfig.to_string_lossy();
        let mut all = vec!["kubectl", "--kubeconfig", &kubeconfig];
        all.extend_from_slice(args);
        kcp(self.run_dir.path(), &all, stdin)
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = kcp(self.run_dir.path(), &["down"], None);
    }
}

fn kcp(run_dir: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let script = PathBuf::from(DIR).join("tests/cluster/kcp.sh");
    let mut command = Command::new(script);
    command
        .args(args)
        .env("KCP_RUN_DIR", run_dir)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("tests/cluster/kcp.sh: {e}"));
    if let (Some(mut pipe), Some(text)) = (child.stdin.take(), stdin) {
        use std::io::Write;
        let _ = pipe.write_all(text.as_bytes());
    }
    child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("kcp.sh: {e}"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
#[ignore = "needs the local control plane; run by make test-e2e"]
fn crd_validates_policies_on_the_real_api_server() {
    let cp = ControlPlane::up();
    let crd = format!("{DIR}/deploy/crd/overcommitpolicies.yaml");
    let out = cp.kubectl(&["apply", "-f", &crd], None);
    assert!(out.status.success(), "CRD refused: {}", text(&out));
    let out = cp.kubectl(
        &[
            "wait",
            "--for",
            "condition=established",
            "crd/overcommitpolicies.overcommit.dev",
            "--timeout=60s",
        ],
        None,
    );
    assert!(out.status.success(), "CRD not established: {}", text(&out));

    let examples = format!("{DIR}/deploy/examples/policy.yaml");
    let out = cp.kubectl(&["apply", "-f", &examples], None);
    assert!(
        out.status.success(),
        "example policies refused: {}",
        text(&out)
    );

    // Each invalid spec is refused by the API server, and by the code for a file.
    let invalid = [
        ("nodeRatios: {cpu: \"20\"}", "spec.nodeRatios.cpu"),
        ("nodeRatios: {cpu: 2}", "must be of type string"),
        ("priority: -3", "spec.priority"),
        (
            "nodeSelector: {matchExpressions: [{key: a, operator: In}]}",
            "need at least one value",
        ),
        (
            "nodeSelector: {matchExpressions: [{key: a, operator: Exists, values: [x]}]}",
            "take none",
        ),
        (
            "nodeSelector: {matchExpressions: [{key: a, operator: Like, values: [x]}]}",
            "Unsupported value",
        ),
        (
            "nodeSelector: {matchLabels: {pool: \"-x\"}}",
            "matchLabels.pool",
        ),
        (
            "podDefaults: {requests: {ephemeral-storage: 1Gi}}",
            "cpu and memory only",
        ),
        ("podDefaults: {requests: {cpu: lots}}", "requests.cpu"),
        (
            "podDefaults: {requestToLimitPercent: {cpu: 0}}",
            "requestToLimitPercent.cpu",
        ),
        (
            "usage: {maxRatios: {cpu: \"2\"}}",
            "targetUtilization: Required value",
        ),
        (
            "usage: {targetUtilization: {}, maxRatios: {}}",
            "spec.usage.targetUtilization",
        ),
        (
            "usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {memory: \"2\"}}",
            "maxRatios must give a ceiling for every targeted resource",
        ),
        (
            "usage: {targetUtilization: {cpu: \"60%\", memory: \"50%\"}, maxRatios: {cpu: \"2\"}}",
            "maxRatios must give a ceiling for every targeted resource",
        ),
        (
            "usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"2\", memory: \"2\"}}",
            "maxRatios may name targeted resources only",
        ),
        (
            "usage: {targetUtilization: {pods: \"60%\"}, maxRatios: {pods: \"2\"}}",
            "usage resources must be cpu or memory",
        ),
        (
            "usage: {targetUtilization: {cpu: \"0%\"}, maxRatios: {cpu: \"2\"}}",
            "spec.usage.targetUtilization.cpu",
        ),
        (
            "usage: {targetUtilization: {cpu: \"101%\"}, maxRatios: {cpu: \"2\"}}",
            "spec.usage.targetUtilization.cpu",
        ),
        (
            "usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"11\"}}",
            "spec.usage.maxRatios.cpu",
        ),
        // Memory's ceiling is 2 unless allowHighMemoryRatio says otherwise, and never above 10.
        (
            "usage: {targetUtilization: {memory: \"75%\"}, maxRatios: {memory: \"2.5\"}}",
            "maxRatios.memory above 2 needs allowHighMemoryRatio: true",
        ),
        (
            "usage: {targetUtilization: {memory: \"75%\"}, maxRatios: {memory: \"2.000001\"}, allowHighMemoryRatio: false}",
            "maxRatios.memory above 2 needs allowHighMemoryRatio: true",
        ),
        (
            "usage: {targetUtilization: {memory: \"75%\"}, maxRatios: {memory: \"11\"}, allowHighMemoryRatio: true}",
            "spec.usage.maxRatios.memory",
        ),
        (
            "usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"2\"}, window: 59s}",
            "window must be from 1m to 24h",
        ),
        (
            "usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"2\"}, window: 25h}",
            "window must be from 1m to 24h",
        ),
        (
            "usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"2\"}, window: 1d}",
            "spec.usage.window",
        ),
        (
            "usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"2\"}, minChange: \"51%\"}",
            "spec.usage.minChange",
        ),
        (
            "nodeRatios: {cpu: \"3\"}\n  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"2.5\"}}",
            "fallback may not be above",
        ),
        (
            "{nodeRatios: {cpu: \"1.5\"}, requestCap: {cpu: \"110%\"}}",
            "spec.requestCap is below spec.nodeRatios",
        ),
        (
            "{nodeRatios: {cpu: \"1.100001\"}, requestCap: {cpu: \"110%\"}}",
            "spec.requestCap is below spec.nodeRatios",
        ),
        (
            "{nodeRatios: {cpu: \"2\"}, requestCap: {cpu: \"49%\"}}",
            "requestCap.cpu",
        ),
        (
            "{nodeRatios: {cpu: \"2\"}, requestCap: {cpu: \"1001%\"}}",
            "requestCap.cpu",
        ),
        (
            "{nodeRatios: {cpu: \"2\"}, requestCap: {pods: \"200%\"}}",
            "requestCap may name cpu and memory only",
        ),
        (
            "{requestCap: {cpu: \"200%\"}}",
            "spec.requestCap needs spec.nodeRatios",
        ),
        (
            "{nodeRatios: {cpu: \"2\"}, capMode: Warn}",
            "spec.capMode needs spec.requestCap",
        ),
        (
            "{nodeRatios: {cpu: \"2\"}, requestCap: {cpu: \"200%\"}, capMode: Soft}",
            "Unsupported value",
        ),
        (
            "{usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"2\"}}, requestCap: {cpu: \"150%\"}}",
            "spec.requestCap is below spec.usage.maxRatios",
        ),
    ];
    for (spec, message) in invalid {
        let yaml = format!(
            "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {{name: bad}}\nspec:\n  {spec}\n"
        );
        let out = cp.kubectl(&["apply", "-f", "-"], Some(&yaml));
        assert!(!out.status.success(), "API server accepted {spec}");
        assert!(text(&out).contains(message), "{spec}: {}", text(&out));
        assert!(parse_policy_file(&yaml).is_err(), "code accepted {spec}");
    }

    // A usage policy at the edges of every range is stored (CEL and patterns accept it).
    let usage = "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {name: usage}\nspec:\n  nodeSelector: {matchLabels: {pool: none}}\n  nodeRatios: {cpu: \"4\", memory: \"1.5\", pods: \"2\"}\n  usage: {targetUtilization: {cpu: \"100%\", memory: \"1%\"}, maxRatios: {cpu: \"4\", memory: \"1.5\"}, window: 1h30m, minChange: \"50%\"}\n";
    let out = cp.kubectl(&["apply", "-f", "-"], Some(usage));
    assert!(out.status.success(), "usage policy refused: {}", text(&out));
    // Memory at its default ceiling, and above it when the policy says so.
    stored_and_read_back(
        &cp,
        "memory",
        &[
            "{usage: {targetUtilization: {memory: \"75%\"}, maxRatios: {memory: \"2\"}}}",
            "{usage: {targetUtilization: {memory: \"75%\"}, maxRatios: {memory: \"10\"}, allowHighMemoryRatio: true}}",
        ],
    );
    // A cap at or above the ratio (1.1 and 110% in floats: 110.00000000000001 > 110) is
    // stored by the API server and accepted by the code, at both ends of the percent range.
    stored_and_read_back(
        &cp,
        "capped",
        &[
            "{nodeRatios: {cpu: \"1.1\"}, requestCap: {cpu: \"110%\", memory: \"50%\"}, capMode: Warn}",
            "{nodeRatios: {cpu: \"10\"}, requestCap: {cpu: \"1000%\"}}",
        ],
    );

    // What the API server stores reads back as a valid policy set.
    let mut stored = String::new();
    for name in ["batch-cpu", "dev", "pod-defaults", "usage"] {
        let out = cp.kubectl(&["get", "overcommitpolicy", name, "-o", "yaml"], None);
        assert!(out.status.success(), "{}", text(&out));
        stored.push_str(&String::from_utf8_lossy(&out.stdout));
        stored.push_str("---\n");
    }
    match parse_policy_file(&stored).and_then(PolicySet::new) {
        Ok(set) => assert_eq!(
            set.names().collect::<Vec<_>>(),
            vec!["batch-cpu", "dev", "pod-defaults", "usage"]
        ),
        Err(e) => panic!("stored policies do not read back: {e}\n{stored}"),
    }
}

/// Each spec, in turn as the policy `name`, is stored by the API server and what it stores is
/// accepted by the code; the policy is deleted after.
fn stored_and_read_back(cp: &ControlPlane, name: &str, specs: &[&str]) {
    for spec in specs {
        let yaml = format!(
            "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {{name: {name}}}\nspec:\n  {spec}\n"
        );
        let out = cp.kubectl(&["apply", "-f", "-"], Some(&yaml));
        assert!(
            out.status.success(),
            "API server refused {spec}: {}",
            text(&out)
        );
        let out = cp.kubectl(&["get", "overcommitpolicy", name, "-o", "yaml"], None);
        assert!(out.status.success(), "{}", text(&out));
        let stored = String::from_utf8_lossy(&out.stdout);
        if let Err(e) = parse_policy_file(&stored).and_then(PolicySet::new) {
            panic!("stored policy {name} does not read back: {e}\n{stored}");
        }
    }
    let out = cp.kubectl(&["delete", "overcommitpolicy", name], None);
    assert!(out.status.success(), "{}", text(&out));
}
