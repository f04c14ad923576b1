//! The per-replica view the cap reads: a node cache (labels and raw allocatable), a lean pod
//! index (namespace/name -> node and requests as the scheduler counts them; terminal pods
//! dropped), requested sums per node kept as pods come and go, and the ledger. Pure: the watch
//! (`sources::placement`) feeds it.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, Pod};
use overcommit_core::node::{AnnotationError, RAW_ALLOCATABLE_ANNOTATION, raw_allocatable_map};
use overcommit_core::quantity::{Quantity, QuantityError};

use super::NodeFacts;
use super::ledger::{LEDGER_TTL, Ledger};
use super::pod::{self, PodFacts};

/// A pod in the index.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Indexed {
    node: Option<String>,
    facts: PodFacts,
}

/// Nodes, pods, sums and ledger.
#[derive(Debug)]
pub struct PlacementState {
    nodes: HashMap<String, NodeFacts>,
    pods: HashMap<String, Indexed>,
    sums: HashMap<String, BTreeMap<String, u128>>,
    ledger: Ledger,
}

impl Default for PlacementState {
    fn default() -> Self {
        Self {
            nodes: HashMap::new(),
            pods: HashMap::new(),
            sums: HashMap::new(),
            ledger: Ledger::new(LEDGER_TTL),
        }
    }
}

/// Why a node could not be read into the cache (it is then left out, and its placements fail
/// open).
#[derive(Debug, thiserror::Error)]
pub enum NodeReadError {
    #[error("node {node}: {source}")]
    Annotation {
        node: String,
        source: AnnotationError,
    },
    #[error("node {node} {resource}: {source}")]
    Quantity {
        node: String,
        resource: String,
        source: QuantityError,
    },
}

/// A node's labels and raw allocatable: the raw annotation for the resources this webhook
/// inflated, `status.allocatable` for the rest, in the scheduler's units (cpu in millicores,
/// rounded up as `MilliValue`; everything else in whole units, rounded up as `Value`).
pub fn node_facts(node: &Node) -> Result<NodeFacts, NodeReadError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut texts: BTreeMap<String, String> = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .into_iter()
        .flatten()
        .map(|(r, q)| (r.clone(), q.0.clone()))
        .collect();
    if let Some(text) = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RAW_ALLOCATABLE_ANNOTATION))
    {
        let raw = raw_allocatable_map(text).map_err(|source| NodeReadError::Annotation {
            node: name.clone(),
            source,
        })?;
        texts.extend(raw);
    }
    let mut raw = BTreeMap::new();
    for (resource, text) in texts {
        let scale = if resource == "cpu" { 3 } else { 0 };
        let units = Quantity::parse(&text)
            .and_then(|q| q.to_units_ceil(scale))
            .map_err(|source| NodeReadError::Quantity {
                node: name.clone(),
                resource: resource.clone(),
                source,
            })?;
        raw.insert(resource, units);
    }
    Ok(NodeFacts {
        labels: node.metadata.labels.clone().unwrap_or_default(),
        raw,
    })
}

fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

fn terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

impl PlacementState {
    pub fn node(&self, name: &str) -> Option<NodeFacts> {
        self.nodes.get(name).cloned()
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<PodFacts> {
        self.pods
            .get(&format!("{namespace}/{name}"))
            .map(|p| p.facts.clone())
    }

    /// Bound pods' requests on `node` plus the ledger's, but for `namespace/name`'s own.
    pub fn requested(
        &self,
        node: &str,
        namespace: &str,
        name: &str,
        now: Instant,
    ) -> BTreeMap<String, u128> {
        let mut sum = self.sums.get(node).cloned().unwrap_or_default();
        let key = format!("{namespace}/{name}");
        // The pod's own bound requests, should the index already show it on this node.
        if let Some(own) = self
            .pods
            .get(&key)
            .filter(|p| p.node.as_deref() == Some(node))
        {
            subtract(&mut sum, &own.facts.requests);
        }
        for (resource, value) in self.ledger.pending(node, &key, now) {
            let total = sum.entry(resource).or_insert(0);
            *total = total.saturating_add(value);
        }
        sum
    }

    pub fn allowed(
        &mut self,
        namespace: &str,
        name: &str,
        node: &str,
        requests: &BTreeMap<String, u128>,
        now: Instant,
    ) {
        self.ledger
            .record(&format!("{namespace}/{name}"), node, requests, now);
    }

    pub fn apply_node(&mut self, node: &Node) -> Result<(), NodeReadError> {
        let name = node.metadata.name.clone().unwrap_or_default();
        match node_facts(node) {
            Ok(facts) => {
                self.nodes.insert(name, facts);
                Ok(())
            }
            Err(e) => {
                self.nodes.remove(&name);
                Err(e)
            }
        }
    }

    pub fn delete_node(&mut self, name: &str) {
        self.nodes.remove(name);
    }

    /// Replace every node (a watch restart's full list).
    pub fn replace_nodes(&mut self, nodes: HashMap<String, NodeFacts>) {
        self.nodes = nodes;
    }

    /// A pod added or changed; a terminal pod leaves the index. An unreadable pod leaves it
    /// too (its placements then fail open).
    pub fn apply_pod(&mut self, pod: &Pod) -> Result<(), QuantityError> {
        let key = pod_key(pod);
        self.remove(&key);
        if terminal(pod) {
            self.ledger.seen_bound(&key);
            return Ok(());
        }
        let facts = pod::facts(pod)?;
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty());
        if let Some(node) = &node {
            self.ledger.seen_bound(&key);
            add(self.sums.entry(node.clone()).or_default(), &facts.requests);
        }
        self.pods.insert(key, Indexed { node, facts });
        Ok(())
    }

    pub fn delete_pod(&mut self, namespace: &str, name: &str) {
        let key = format!("{namespace}/{name}");
        self.remove(&key);
        self.ledger.seen_bound(&key);
    }

    /// Replace every pod (a watch restart's full list); the ledger stays.
    pub fn replace_pods(&mut self, pods: &[Pod]) -> Vec<QuantityError> {
        self.pods.clear();
        self.sums.clear();
        pods.iter()
            .filter_map(|p| self.apply_pod(p).err())
            .collect()
    }

    pub fn pods_len(&self) -> usize {
        self.pods.len()
    }

    fn remove(&mut self, key: &str) {
        let Some(old) = self.pods.remove(key) else {
            return;
        };
        if let Some(node) = &old.node
            && let Some(sum) = self.sums.get_mut(node)
        {
            subtract(sum, &old.facts.requests);
            if sum.values().all(|v| *v == 0) {
                self.sums.remove(node);
            }
        }
    }
}

fn add(into: &mut BTreeMap<String, u128>, requests: &BTreeMap<String, u128>) {
    for (resource, value) in requests {
        let total = into.entry(resource.clone()).or_insert(0);
        *total = total.saturating_add(*value);
    }
}

fn subtract(from: &mut BTreeMap<String, u128>, requests: &BTreeMap<String, u128>) {
    for (resource, value) in requests {
        if let Some(total) = from.get_mut(resource) {
            *total = total.saturating_sub(*value);
        }
    }
}
