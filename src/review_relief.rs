//! `review --explain-relief`: memory relief's decision for one node, replayed offline from files
//! (docs/policy.md, "Memory relief"): the node (INPUT, a bare Node), its pods (`--pods`, a
//! PodList as `kubectl get pods -A --field-selector spec.nodeName=NODE -o json` prints), their
//! usage (`--pod-metrics`, optional: `kubectl get --raw /apis/metrics.k8s.io/v1beta1/pods`), and
//! the node's memory usage from `review`'s usage input (`--usage-file`'s `memory.peakUsage` is
//! the newest sample, with `metricsFailing`, `sampleAge`, `sampleWindow`, `usageInterval`; or
//! `--peak-usage memory=QTY`). Prints whether the node needs relief and why, then every pod in
//! relief's order with the reason, and what would be evicted (PodDisruptionBudgets permitting:
//! the API server answers that, not the replay).

use std::collections::HashMap;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use overcommit_core::eviction::{self, Measured, Ranked};
use overcommit_core::node::usage::NodeUsage;
use overcommit_core::policy::{NodeChoice, PolicySet};

use crate::leader::webhook_config::exempt_namespaces;
use crate::relief::{explain, pod_memory, pods_facts, raw_memory};

/// A sample older than its window plus this many polls is stale (as the leader judges).
const STALE_POLLS: u64 = 3;

/// The files' contents, read.
pub struct ReliefInput<'a> {
    pub node: &'a [u8],
    pub pods: &'a [u8],
    pub pod_metrics: Option<&'a [u8]>,
    pub usage: Option<NodeUsage>,
    pub own_namespace: &'a str,
}

/// The account, one line each.
pub fn replay(policies: &PolicySet, input: &ReliefInput<'_>) -> anyhow::Result<Vec<String>> {
    let node: Node = serde_json::from_slice(input.node).context("INPUT must be a bare Node")?;
    let name = node.metadata.name.clone().unwrap_or_default();
    let eviction = match policies.for_node(&node.metadata.labels) {
        NodeChoice::Policy(p) => match &p.eviction {
            Some(e) => (p.name.clone(), e.clone()),
            None => {
                return Ok(vec![format!(
                    "node {name}: no relief: its policy {} has no spec.eviction",
                    p.name
                )]);
            }
        },
        NodeChoice::NoPolicy => return Ok(vec![format!("node {name}: no relief: no policy")]),
        NodeChoice::OptedOut => return Ok(vec![format!("node {name}: no relief: opted out")]),
    };
    let (policy, eviction) = eviction;
    let pods = items::<Pod>(input.pods).context("--pods")?;
    let usage: HashMap<(String, String), u128> = match input.pod_metrics {
        Some(text) => items::<serde_json::Value>(text)
            .context("--pod-metrics")?
            .iter()
            .filter_map(pod_memory)
            .collect(),
        None => HashMap::new(),
    };
    let (measured, max_age_ms) = match input.usage.and_then(|u| u.memory) {
        None => (Measured::Missing, 0),
        Some(view) if view.metrics_failing => (Measured::Failing, 0),
        Some(view) => (
            Measured::Sample {
                bytes: view.peak_usage,
                at_ms: -(i64::try_from(view.sample_age_ms.unwrap_or(0)).unwrap_or(i64::MAX)),
            },
            view.sample_window_ms + STALE_POLLS * view.poll_interval_ms,
        ),
    };
    let raw = raw_memory(&node);
    let need = eviction::need(
        raw,
        measured,
        eviction.memory_critical.value,
        0,
        i64::try_from(max_age_ms).unwrap_or(i64::MAX),
    );
    // Only the node's own pods (a list of every pod of the cluster may be given).
    let pods: Vec<Pod> = pods
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str()))
        .collect();
    let facts = pods_facts(&pods, &usage);
    let ranked = eviction::rank(
        &facts,
        raw.unwrap_or(0),
        &exempt_namespaces(input.own_namespace),
    );
    let mut lines = vec![format!(
        "policy {policy}: memoryCritical {}, maxPodsPerNode {}, interval {:?}{}",
        eviction.memory_critical.text,
        eviction.max_pods_per_node,
        eviction.interval,
        if eviction.dry_run { ", dry run" } else { "" }
    )];
    lines.extend(explain(&name, need, &ranked));
    if matches!(need, eviction::Need::Relieve { .. }) {
        lines.push(would_evict(&ranked, eviction.max_pods_per_node));
    }
    Ok(lines)
}

/// The first `max` candidates, which the leader would try first.
fn would_evict(ranked: &[Ranked<'_>], max: u32) -> String {
    let chosen: Vec<String> = ranked
        .iter()
        .filter(|r| r.spared.is_none())
        .take(max as usize)
        .map(|r| format!("{}/{}", r.pod.namespace, r.pod.name))
        .collect();
    if chosen.is_empty() {
        "would evict: nothing (no candidate)".to_string()
    } else {
        format!(
            "would evict: {} (a PodDisruptionBudget refusal moves on to the next)",
            chosen.join(", ")
        )
    }
}

/// The `items` of a List (or a bare JSON array).
fn items<T: serde::de::DeserializeOwned>(text: &[u8]) -> anyhow::Result<Vec<T>> {
    let value: serde_json::Value = serde_json::from_slice(text)?;
    let list = match value {
        serde_json::Value::Array(a) => a,
        serde_json::Value::Object(mut o) => match o.remove("items") {
            Some(serde_json::Value::Array(a)) => a,
            _ => bail!("expected a List with items, or a JSON array"),
        },
        _ => bail!("expected a List with items, or a JSON array"),
    };
    list.into_iter()
        .map(|v| serde_json::from_value(v).map_err(anyhow::Error::from))
        .collect()
}
