//! The CRD policy source against a REAL kube-apiserver (tests/cluster's `kcp`): the binary
//! without --policy-file watches OvercommitPolicy objects, is not ready until the first
//! complete list, follows creates, edits and deletes, and refuses invalid objects.
//!
//! Needs the local control plane, so it is marked ignored for `cargo test` and run by
//! `make test-e2e` with `--ignored` (it builds kcp through tests/cluster/kcp.sh if needed).

mod common;

use std::time::Duration;

use common::*;
use kube::CustomResourceExt;
use overcommit_core::policy::OvercommitPolicy;

fn policy(name: &str, priority: i32, cpu: &str) -> String {
    format!(
        "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata:\n  name: {name}\nspec:\n  priority: {priority}\n  nodeRatios:\n    cpu: \"{cpu}\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e: needs the local control plane; run by `make test-e2e`"]
async fn crd_source_follows_the_api_server() {
    let cp = ControlPlane::up();
    let pki = Pki::new();
    let leaf = pki.leaf("crd");
    let kubeconfig = cp.kubeconfig();
    // This test is about the policy source: no leader election, so readiness does not wait
    // for a caBundle (the leader and its readiness are tested in tests/cluster/e2e).
    let w = Webhook::start_opts(
        Some(&leaf),
        false,
        &["--leader-election", "false"],
        &[("KUBECONFIG", kubeconfig.as_str())],
    );

    // The CRD is not installed yet: the watch fails and the replica is not ready.
    let not_synced = wait_until(Duration::from_secs(10), || async {
        let (code, body) = w.probe("/readyz").await;
        code == 503 && body.contains("policies")
    })
    .await;
    assert!(not_synced, "must not be ready before the first list");

    let crd = serde_json::to_string(&OvercommitPolicy::crd()).expect("crd json");
    let (ok, out) = cp.apply(&crd);
    assert!(ok, "{out}");
    let (ok, out) = cp.kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "crd/overcommitpolicies.overcommit.dev",
            "--timeout=60s",
        ],
        None,
    );
    assert!(ok, "{out}");
    let (ok, out) = cp.apply(&policy("double-cpu", 10, "2"));
    assert!(ok, "{out}");

    // The watcher's backoff after the failed list is at most tens of seconds.
    let ready = wait_until(Duration::from_secs(90), || async {
        w.probe("/readyz").await.0 == 200
    })
    .await;
    assert!(
        ready,
        "not ready after the CRD appeared: {:?}\n{}",
        w.probe("/readyz").await,
        w.logs()
    );
    let loaded = |m: &str| metric_value(m, "kube_overcommit_policies_loaded");
    assert_eq!(loaded(&w.metrics().await), 1.0);

    let c = client_for(&w, pki.ca_der(), false);
    let v = mutate_json(&c, &w, &node_review("crd-1", "4")).await;
    assert_eq!(v["response"]["patchType"], "JSONPatch", "{v}");

    // A second policy, then deleting the first.
    let (ok, out) = cp.apply(&policy("triple-cpu", 20, "3"));
    assert!(ok, "{out}");
    assert!(
        wait_until(Duration::from_secs(10), || async {
            loaded(&w.metrics().await) == 2.0
        })
        .await
    );
    let (ok, out) = cp.kubectl(&["delete", "overcommitpolicy", "double-cpu"], None);
    assert!(ok, "{out}");
    assert!(
        wait_until(Duration::from_secs(10), || async {
            loaded(&w.metrics().await) == 1.0
        })
        .await
    );

    // An edit that breaks a policy is refused by the API server's schema...
    let (accepted, out) = cp.apply(&policy("triple-cpu", 20, "50"));
    assert!(!accepted, "the CRD schema must refuse ratio 50: {out}");
    // ...and, where the schema does not (an older CRD left installed), by the webhook itself:
    // the valid version of the object stays in use.
    let mut permissive = serde_json::to_value(OvercommitPolicy::crd()).expect("crd value");
    permissive["spec"]["versions"][0]["schema"]["openAPIV3Schema"] =
        serde_json::json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    let (ok, out) = cp.apply(&permissive.to_string());
    assert!(ok, "{out}");
    let (ok, out) = cp.apply(&policy("triple-cpu", 20, "50"));
    assert!(ok, "the permissive CRD accepts anything: {out}");
    let refused = wait_until(Duration::from_secs(10), || async {
        metric_value(&w.metrics().await, "kube_overcommit_policies_refused_total") >= 1.0
    })
    .await;
    assert!(refused, "invalid policy not refused:\n{}", w.logs());
    assert!(w.logs().contains("OvercommitPolicy refused"));
    // A new object that was never valid is not applied either.
    let (ok, out) = cp.apply(&policy("never-valid", 30, "0.5"));
    assert!(ok, "{out}");
    assert!(
        wait_until(Duration::from_secs(10), || async {
            metric_value(&w.metrics().await, "kube_overcommit_policies_refused_total") >= 2.0
        })
        .await
    );
    assert_eq!(loaded(&w.metrics().await), 1.0);
    let v = mutate_json(&c, &w, &node_review("crd-2", "4")).await;
    assert_eq!(
        v["response"]["patchType"], "JSONPatch",
        "the valid version stays: {v}"
    );

    // Deleting every policy: nothing applies any more.
    let (ok, out) = cp.kubectl(&["delete", "overcommitpolicy", "--all"], None);
    assert!(ok, "{out}");
    assert!(
        wait_until(Duration::from_secs(10), || async {
            loaded(&w.metrics().await) == 0.0
        })
        .await
    );
    assert_eq!(w.probe("/readyz").await.0, 200);
}
