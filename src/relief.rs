//! Memory relief's inputs read from API objects (docs/policy.md, "Memory relief"): a node's raw
//! memory allocatable, a pod's facts, a PodMetrics object's memory; and the account of one
//! node's decision that the leader logs and `review --explain-relief` prints. The decisions are
//! `overcommit_core::eviction`; the leader's I/O is `leader::eviction`.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use overcommit_core::eviction::{
    MIRROR_ANNOTATION, Need, PodFacts, Qos, Ranked, Unknown, describe,
};
use overcommit_core::node::{RAW_ALLOCATABLE_ANNOTATION, raw_allocatable_map};
use overcommit_core::quantity::Quantity;

/// A quantity in bytes (rounded up, as the scheduler rounds requests); None if unreadable.
fn bytes(text: &str) -> Option<u128> {
    Quantity::parse(text).and_then(|q| q.to_units_ceil(0)).ok()
}

/// The kubelet's memory allocatable: the `overcommit.dev/raw-allocatable` value where the
/// webhook inflated the node, else `status.allocatable` (the kubelet's own).
pub fn raw_memory(node: &Node) -> Option<u128> {
    let annotated = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RAW_ALLOCATABLE_ANNOTATION))
        .and_then(|text| raw_allocatable_map(text).ok())
        .and_then(|map| map.get("memory").cloned());
    match annotated {
        Some(text) => bytes(&text),
        None => node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get("memory"))
            .and_then(|q| bytes(&q.0)),
    }
}

/// What relief needs of a pod; `usage`: its PodMetrics memory (sum of containers).
pub fn pod_facts(pod: &Pod, usage: Option<u128>) -> PodFacts {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref());
    // A pod whose requests cannot be read counts 0 (the scheduler would have refused it).
    let memory_request = crate::pods::scheduler_requests(pod)
        .ok()
        .and_then(|r| r.get("memory").copied())
        .unwrap_or(0);
    PodFacts {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        priority: spec.and_then(|s| s.priority).unwrap_or(0),
        priority_class: spec.and_then(|s| s.priority_class_name.clone()),
        qos: status
            .and_then(|s| s.qos_class.as_deref())
            .and_then(Qos::parse),
        owner_kinds: meta
            .owner_references
            .iter()
            .flatten()
            .map(|o| o.kind.clone())
            .collect(),
        mirror: meta
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION)),
        terminating: meta.deletion_timestamp.is_some(),
        finished: matches!(phase, Some("Succeeded" | "Failed")),
        memory_request,
        memory_usage: usage,
        created_ms: meta
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_millisecond()),
    }
}

/// The facts of `pods`, each with its usage from `usage` (by namespace and name).
pub fn pods_facts(pods: &[Pod], usage: &HashMap<(String, String), u128>) -> Vec<PodFacts> {
    pods.iter()
        .map(|p| {
            let key = (
                p.metadata.namespace.clone().unwrap_or_default(),
                p.metadata.name.clone().unwrap_or_default(),
            );
            pod_facts(p, usage.get(&key).copied())
        })
        .collect()
}

/// One PodMetrics object (metrics.k8s.io/v1beta1): (namespace, name) and the memory of its
/// containers summed, in bytes; None without a name or with an unreadable quantity.
pub fn pod_memory(metrics: &serde_json::Value) -> Option<((String, String), u128)> {
    let meta = &metrics["metadata"];
    let namespace = meta["namespace"].as_str()?.to_string();
    let name = meta["name"].as_str()?.to_string();
    let mut sum: u128 = 0;
    for container in metrics["containers"].as_array().into_iter().flatten() {
        if let Some(text) = container["usage"]["memory"].as_str() {
            sum = sum.saturating_add(bytes(text)?);
        }
    }
    Some(((namespace, name), sum))
}

/// The account of one node's decision: the need, then each pod in relief's order with why.
pub fn explain(node: &str, need: Need, ranked: &[Ranked<'_>]) -> Vec<String> {
    let mut lines = vec![match need {
        Need::Relieve { usage, critical } => format!(
            "node {node}: needs relief: memory usage {usage} B is above the critical {critical} B"
        ),
        Need::Fine { usage, critical } => format!(
            "node {node}: no relief: memory usage {usage} B is at or below the critical {critical} B"
        ),
        Need::Unknown(why) => format!("node {node}: no relief: {}", unknown_text(why)),
    }];
    for (i, r) in ranked.iter().enumerate() {
        let place = if r.spared.is_some() {
            "-".to_string()
        } else {
            format!("{}", i + 1)
        };
        lines.push(format!(
            "  {place} {}/{}: {}",
            r.pod.namespace,
            r.pod.name,
            describe(r)
        ));
    }
    lines
}

/// Why relief was not judged, in words.
pub fn unknown_text(why: Unknown) -> &'static str {
    match why {
        Unknown::MetricsFailing => "metrics.k8s.io is failing (usage unknown, nothing is evicted)",
        Unknown::NoSample => "metrics.k8s.io has no memory sample for the node",
        Unknown::Stale => "the node's newest sample is stale",
        Unknown::NoRaw => "the node reports no memory allocatable",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(json: serde_json::Value) -> Node {
        serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn raw_memory_prefers_the_annotation() {
        let inflated = node(serde_json::json!({
            "metadata": {"name": "n", "annotations": {RAW_ALLOCATABLE_ANNOTATION: "{\"cpu\":\"4\",\"memory\":\"4Gi\"}"}},
            "status": {"allocatable": {"memory": "8Gi"}}
        }));
        assert_eq!(raw_memory(&inflated), Some(4 << 30));
        let plain = node(serde_json::json!({
            "metadata": {"name": "n"}, "status": {"allocatable": {"memory": "1Gi"}}
        }));
        assert_eq!(raw_memory(&plain), Some(1 << 30));
        let none = node(serde_json::json!({"metadata": {"name": "n"}}));
        assert_eq!(raw_memory(&none), None);
    }

    #[test]
    fn pod_facts_and_pod_memory_are_read() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "namespace": "apps", "name": "p", "uid": "u1",
                "creationTimestamp": "2026-11-24T11:00:00Z",
                "annotations": {MIRROR_ANNOTATION: "x"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "d1"}]
            },
            "spec": {
                "priority": -5, "priorityClassName": "low",
                "containers": [{"name": "c", "resources": {"requests": {"memory": "1Gi"}}}]
            },
            "status": {"phase": "Running", "qosClass": "Burstable"}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let facts = pod_facts(&pod, Some(7));
        assert_eq!(
            (
                facts.priority,
                facts.qos,
                facts.memory_request,
                facts.memory_usage
            ),
            (-5, Some(Qos::Burstable), 1 << 30, Some(7))
        );
        assert!(facts.mirror && !facts.terminating && !facts.finished);
        assert_eq!(facts.owner_kinds, ["DaemonSet"]);
        assert_eq!(facts.created_ms, 1_795_518_000_000);
        let metrics = serde_json::json!({
            "metadata": {"namespace": "apps", "name": "p"},
            "containers": [{"usage": {"memory": "1Mi"}}, {"usage": {"memory": "1Ki", "cpu": "1m"}}]
        });
        assert_eq!(
            pod_memory(&metrics),
            Some((("apps".into(), "p".into()), (1 << 20) + 1024))
        );
        let bad = serde_json::json!({"metadata": {"namespace": "a", "name": "p"}, "containers": [{"usage": {"memory": "lots"}}]});
        assert_eq!(pod_memory(&bad), None);
    }
}
