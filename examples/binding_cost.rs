//! The cost of the placement cap's binding check (`placement::handle` on `/validate`) alone, for
//! instruction counts under callgrind, with the caches as `serve --request-cap` has them: the
//! node cache, the shared pod index and the ledger, fed as the watches feed them. The setting is
//! the `make bench` binding-cap row's (bench/bench.py): node bench-capped (raw cpu 64, requestCap
//! 110%) with 40 pods of 1 cpu bound and the pending pod capped-0 (500m) the payload binds;
//! every review is allowed and recorded in the ledger.
//!
//!   cargo build --release --example binding_cost
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!       target/release/examples/binding_cost bench/payloads/binding-cap.json 201
//!
//! Run it with 1 and with N+1 iterations: the difference of the two totals over N is the cost of
//! one binding check, without process start-up. Also prints wall time per check.

use std::time::Instant;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube_overcommit::placement::{self, CapOutcome};
use kube_overcommit::sources::placement::WatchedPlacement;
use kube_overcommit::sources::pod_cache::PodCache;
use kube_overcommit::sources::pods::{apply_event, relist_event};
use overcommit_core::pod_index::PodIndex;
use overcommit_core::policy::{PolicySet, parse_policy_file};

const POLICY: &str = r#"apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata:
  name: bench-cap
spec:
  nodeSelector:
    matchLabels:
      overcommit.dev/bench-cap: "true"
  priority: 10
  nodeRatios:
    cpu: "1.1"
  requestCap:
    cpu: "110%"
"#;

fn pod(name: &str, cpu: &str, node: Option<&str>) -> anyhow::Result<Pod> {
    let mut spec = serde_json::json!({"containers": [
        {"name": "app", "image": "registry.invalid/app", "resources": {"requests": {"cpu": cpu}}}
    ]});
    if let Some(node) = node {
        spec["nodeName"] = node.into();
    }
    let object = serde_json::json!({
        "metadata": {"name": name, "namespace": "bench-cap"},
        "spec": spec,
        "status": {"phase": if node.is_some() { "Running" } else { "Pending" }},
    });
    Ok(serde_json::from_value(object)?)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, payload_file, iterations] = args.as_slice() else {
        bail!("usage: binding_cost PAYLOAD_FILE ITERATIONS");
    };
    let body = std::fs::read(payload_file).with_context(|| format!("reading {payload_file}"))?;
    let iterations: u32 = iterations.parse().context("ITERATIONS")?;
    let policies = parse_policy_file(POLICY)
        .and_then(PolicySet::new)
        .context("policy")?;
    let pods = PodCache::new(kube_overcommit::sources::metrics::UsageMetrics::default());
    let source = WatchedPlacement::new(pods.clone(), None);
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "bench-capped", "labels": {"overcommit.dev/bench-cap": "true"}},
        "status": {"capacity": {"cpu": "64", "pods": "110"},
                   "allocatable": {"cpu": "64", "pods": "110"}},
    }))?;
    source.apply_node(&node)?;
    // The pod watch's first list (empty here), then its events: the cap decides only once the
    // index has listed every pod.
    relist_event(&pods, Some(&source), PodIndex::default());
    for i in 0..40 {
        apply_event(
            &pods,
            Some(&source),
            &pod(&format!("bound-{i}"), "1", Some("bench-capped"))?,
        )?;
    }
    apply_event(&pods, Some(&source), &pod("capped-0", "500m", None)?)?;
    let start = Instant::now();
    for _ in 0..iterations {
        let decided = placement::handle(&body, &policies, &source);
        if decided.outcome != CapOutcome::Allowed {
            bail!("the binding was not allowed: {:?}", decided.message);
        }
        std::hint::black_box(&decided);
    }
    let elapsed = start.elapsed();
    eprintln!(
        "{payload_file}: {iterations} binding checks, {:.2} us each",
        elapsed.as_secs_f64() * 1e6 / f64::from(iterations.max(1))
    );
    Ok(())
}
