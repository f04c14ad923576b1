//! What the cap needs of a Node object: its labels and raw allocatable. Pure; the node watch
//! (`sources::placement`) keeps the results in its cache.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use overcommit_core::node::{AnnotationError, RAW_ALLOCATABLE_ANNOTATION, raw_allocatable_map};
use overcommit_core::quantity::{Quantity, QuantityError};

use super::NodeFacts;

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
