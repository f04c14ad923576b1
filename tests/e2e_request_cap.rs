//! The request cap (`serve --request-cap`, POST /validate) against a REAL kube-apiserver
//! (tests/cluster's `kcp`): a node with raw cpu 4 and a policy capping cpu at 110% (4.4 cores);
//! pods created with spec.nodeName and bindings through pods/binding are allowed until the
//! next would pass 4.4, which is denied with the rule's message; in Warn mode it is allowed and
//! the message comes back as a warning.
//!
//! The replica runs as a whole installation would: it leads, bootstraps the CA and the serving
//! Secret (mirrored into its TLS directory the way the kubelet mounts it), is a backend of the
//! Service kube-overcommit/kube-overcommit, and keeps the ValidatingWebhookConfiguration the API
//! server calls (`--request-cap`): no configuration is made by hand. Needs the local control
//! plane, so it is ignored for `cargo test` and run with `--ignored` (it builds kcp through
//! tests/cluster/kcp.sh if needed).

mod common;

use std::time::Duration;

use common::*;
use kube::CustomResourceExt;
use overcommit_core::policy::OvercommitPolicy;

const NS: &str = "default";

fn policy(mode: &str) -> String {
    format!(
        "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {{name: capped}}\n\
         spec:\n  nodeSelector: {{matchLabels: {{pool: capped}}}}\n  nodeRatios: {{cpu: \"1.1\"}}\n  \
         requestCap: {{cpu: \"110%\"}}\n  capMode: {mode}\n"
    )
}

/// A pod asking `cpu`, on `node` or (None) left for a binding: its scheduler does not exist,
/// so only the test binds it.
fn pod(name: &str, node: Option<&str>, cpu: &str) -> String {
    let placement = match node {
        Some(node) => format!("nodeName: {node}"),
        None => "schedulerName: nobody".to_string(),
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n  {placement}\n  \
         automountServiceAccountToken: false\n  containers:\n  - name: app\n    image: registry.invalid/app\n    \
         resources: {{requests: {{cpu: \"{cpu}\"}}}}\n"
    )
}

/// POST a Binding to pods/NAME/binding, or (`old`) to the namespace's bindings.
fn bind_via(cp: &ControlPlane, name: &str, node: &str, old: bool) -> (bool, String) {
    let binding = format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"Binding\",\"metadata\":{{\"name\":\"{name}\"}},\
         \"target\":{{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"name\":\"{node}\"}}}}"
    );
    let dir = common::TempDir::new().expect("tmp");
    let file = dir.path().join("binding.json");
    std::fs::write(&file, binding).expect("binding file");
    let path = if old {
        format!("/api/v1/namespaces/{NS}/bindings")
    } else {
        format!("/api/v1/namespaces/{NS}/pods/{name}/binding")
    };
    cp.kubectl(
        &["create", "--raw", &path, "-f", &file.display().to_string()],
        None,
    )
}

fn bind(cp: &ControlPlane, name: &str, node: &str) -> (bool, String) {
    bind_via(cp, name, node, false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e: needs the local control plane; run with --ignored"]
async fn request_cap_on_the_real_api_server() {
    let cp = ControlPlane::up();
    let kubeconfig = cp.kubeconfig();
    let crd = serde_json::to_string(&OvercommitPolicy::crd()).expect("crd json");
    let (ok, out) = cp.apply(&crd);
    assert!(ok, "CRD: {out}");
    let (ok, out) = cp.kubectl(
        &[
            "wait",
            "--for=condition=established",
            "crd/overcommitpolicies.overcommit.dev",
            "--timeout=60s",
        ],
        None,
    );
    assert!(ok, "CRD not established: {out}");
    let (ok, out) = cp.apply(&policy("Enforce"));
    assert!(ok, "policy: {out}");
    // A node as a kubelet registers it: raw cpu 4 (status is kept on create for nodes).
    let node = "{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{\"name\":\"capped-1\",\
                \"labels\":{\"pool\":\"capped\"}},\"status\":{\"capacity\":{\"cpu\":\"4\",\"pods\":\"110\"},\
                \"allocatable\":{\"cpu\":\"4\",\"pods\":\"110\"}}}";
    let (ok, out) = cp.kubectl(&["create", "-f", "-"], Some(node));
    assert!(ok, "node: {out}");

    // The installation: its namespace, one replica that leads (a short Lease, so a leftover
    // of nothing is waited for briefly), the serving Secret mirrored into its TLS directory,
    // and the replica behind the Service while its /readyz says so.
    let (ok, out) = cp.kubectl(&["create", "namespace", "kube-overcommit"], None);
    assert!(ok, "namespace: {out}");
    let w = Webhook::start_opts(
        None,
        false,
        &[
            "--leader-election",
            "true",
            "--request-cap",
            "--identity",
            "cap-0",
            "--lease-ttl",
            "4s",
            "--lease-renew",
            "1s",
            "--check-interval",
            "1s",
            "--cert-reload-interval",
            "1s",
        ],
        &[("KUBECONFIG", kubeconfig.as_str())],
    );
    let _volume = cp.secret_volume("kube-overcommit", "kube-overcommit-tls", &w.tls_dir);
    cp.backend_add(
        "kube-overcommit",
        "kube-overcommit",
        w.webhook,
        &format!("http://{}/readyz", w.probes),
    );
    let ready = wait_until(Duration::from_secs(90), || async {
        w.probe("/readyz").await.0 == 200
    })
    .await;
    assert!(ready, "the replica never got ready\nlogs:\n{}", w.logs());
    // The leader created the validating configuration, Ignore, calling /validate on the Service.
    let (ok, out) = cp.kubectl(
        &[
            "get",
            "validatingwebhookconfiguration",
            "kube-overcommit",
            "-o",
            "jsonpath={range .webhooks[*]}{.name} {.failurePolicy} {.clientConfig.service.path}{\"\\n\"}{end}",
        ],
        None,
    );
    assert!(ok, "validating configuration: {out}");
    assert_eq!(
        out.trim(),
        "bindings.cap.overcommit.dev Ignore /validate\nplaced-pods.cap.overcommit.dev Ignore /validate"
    );

    // The default service account, the API server's view of the configuration and the
    // webhook's caches come up asynchronously: wait until a pod larger than the cap on its own
    // is refused by the webhook.
    let refused = wait_until(Duration::from_secs(90), || async {
        let (ok, out) = cp.kubectl(
            &["create", "-f", "-"],
            Some(&pod("probe", Some("capped-1"), "5")),
        );
        if ok {
            // Admitted before the webhook was called: removed at once (no kubelet would
            // confirm a graceful deletion, and a terminating pod still counts on its node).
            let _ = cp.kubectl(
                &["delete", "pod", "probe", "--grace-period=0", "--force"],
                None,
            );
        }
        !ok && out.contains("cpu requests would exceed the node's placement cap; pod probe asks 5")
    })
    .await;
    assert!(
        refused,
        "the cap never refused the probe pod\nlogs:\n{}",
        w.logs()
    );

    // Pods for bindings, created first so that the pod index has them when they are bound.
    for name in ["bound-1", "bound-2"] {
        let (ok, out) = cp.kubectl(
            &["create", "-f", "-"],
            Some(&pod(
                name,
                None,
                if name == "bound-1" { "1" } else { "500m" },
            )),
        );
        assert!(ok, "{name}: {out}");
    }
    // Direct placement: 1 + 1 + 1 fits (3 of 4.4).
    for name in ["direct-1", "direct-2", "direct-3"] {
        let (ok, out) = cp.kubectl(
            &["create", "-f", "-"],
            Some(&pod(name, Some("capped-1"), "1")),
        );
        assert!(ok, "{name}: {out}");
    }
    // Through bindings: 1 more fits (4), then 0.5 would reach 4.5.
    let (ok, out) = bind(&cp, "bound-1", "capped-1");
    assert!(ok, "bound-1 fits: {out}");
    let (ok, out) = bind(&cp, "bound-2", "capped-1");
    assert!(!ok, "bound-2 must be refused");
    assert!(
        out.contains("node capped-1: cpu requests would exceed the node's placement cap; pod bound-2 asks 0.5")
            && !out.contains("of a cap of"),
        "the refusal names node, resource and pod, never the node's figures: {out}"
    );
    // The same through the namespace's bindings endpoint.
    let (ok, out) = bind_via(&cp, "bound-2", "capped-1", true);
    assert!(!ok, "bound-2 must be refused through /bindings too");
    assert!(
        out.contains("node capped-1: cpu requests would exceed the node's placement cap; pod bound-2 asks 0.5"),
        "{out}"
    );
    // 0.4 still fits exactly (4.4), created with spec.nodeName.
    let (ok, out) = cp.kubectl(
        &["create", "-f", "-"],
        Some(&pod("direct-4", Some("capped-1"), "400m")),
    );
    assert!(ok, "direct-4 reaches the cap exactly: {out}");
    let (ok, out) = cp.kubectl(
        &["create", "-f", "-"],
        Some(&pod("direct-5", Some("capped-1"), "1m")),
    );
    assert!(!ok, "direct-5 must be refused");
    assert!(
        out.contains("cpu requests would exceed the node's placement cap; pod direct-5 asks 0.001"),
        "{out}"
    );

    // Warn mode: allowed, with the message as a warning.
    let (ok, out) = cp.apply(&policy("Warn"));
    assert!(ok, "policy: {out}");
    let warned = wait_until(Duration::from_secs(30), || async {
        let (ok, out) = bind(&cp, "bound-2", "capped-1");
        ok && out.contains("Warning: node capped-1: cpu requests would exceed the node's placement cap; pod bound-2 asks 0.5")
    })
    .await;
    assert!(
        warned,
        "Warn mode did not allow with a warning\nlogs:\n{}",
        w.logs()
    );

    let metrics = w.metrics().await;
    for outcome in ["denied", "warned", "allowed"] {
        let line = format!("kube_overcommit_placement_reviews_total{{outcome=\"{outcome}\"}}");
        assert!(metrics.contains(&line), "no {line} in\n{metrics}");
    }
}
