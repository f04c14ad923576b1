//! The kubelet's own allocatable of an inflated node, read back from the
//! `overcommit.dev/raw-allocatable` annotation and turned into metric samples in the units of
//! kube-state-metrics' `kube_node_status_allocatable` (cpu in cores, memory and storage in
//! bytes, everything else as a count), so that both can be compared and joined by
//! `(node, resource)`. Pure: no I/O; the watch that feeds it is `node_metrics`.

use std::collections::BTreeMap;

use crate::inflate::RAW_ALLOCATABLE_ANNOTATION;
use crate::quantity::{Quantity, QuantityError};

/// One sample: a resource of one node.
#[derive(Debug, Clone, PartialEq)]
pub struct RawSample {
    /// The resource name as kube-state-metrics labels it (`ephemeral-storage` ->
    /// `ephemeral_storage`, `example.com/gpu` -> `example_com_gpu`).
    pub resource: String,
    /// `core`, `byte` or `integer`, as kube-state-metrics' `unit` label.
    pub unit: &'static str,
    pub value: f64,
}

/// Why the annotation of a node could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RawAllocatableError {
    #[error("{RAW_ALLOCATABLE_ANNOTATION} is not a JSON map of resource to quantity: {0}")]
    Json(String),
    #[error("{RAW_ALLOCATABLE_ANNOTATION} {resource}: {source}")]
    Quantity {
        resource: String,
        source: QuantityError,
    },
}

/// The samples of a node from its annotations: none when the node carries no
/// `overcommit.dev/raw-allocatable` (it is not inflated), one per resource otherwise, sorted by
/// resource.
pub fn raw_allocatable(
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<Vec<RawSample>, RawAllocatableError> {
    let Some(text) = annotations.and_then(|a| a.get(RAW_ALLOCATABLE_ANNOTATION)) else {
        return Ok(Vec::new());
    };
    let map: BTreeMap<String, String> =
        serde_json::from_str(text).map_err(|e| RawAllocatableError::Json(e.to_string()))?;
    map.into_iter()
        .map(|(resource, quantity)| {
            let parsed =
                Quantity::parse(&quantity).map_err(|source| RawAllocatableError::Quantity {
                    resource: resource.clone(),
                    source,
                })?;
            // Millis, then divided: exact for every cpu value the API server stores (it keeps
            // millicores) and for byte counts up to 2^53 / 1000 (9 TB) — beyond that the error is
            // below a byte.
            let millis =
                parsed
                    .to_units_floor(3)
                    .map_err(|source| RawAllocatableError::Quantity {
                        resource: resource.clone(),
                        source,
                    })?;
            Ok(RawSample {
                unit: unit_of(&resource),
                resource: label_name(&resource),
                value: millis as f64 / 1000.0,
            })
        })
        .collect()
}

/// kube-state-metrics' unit for a node resource.
fn unit_of(resource: &str) -> &'static str {
    match resource {
        "cpu" => "core",
        "memory" | "ephemeral-storage" | "storage" => "byte",
        r if r.starts_with("hugepages-") || r.starts_with("attachable-volumes-") => "byte",
        _ => "integer",
    }
}

/// A resource name as a Prometheus label value the way kube-state-metrics writes it: every
/// character outside `[a-zA-Z0-9_]` becomes `_`.
fn label_name(resource: &str) -> String {
    resource
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(raw: Option<&str>) -> BTreeMap<String, String> {
        let mut a = BTreeMap::from([(
            "overcommit.dev/applied".to_string(),
            r#"{"policy":"p","ratios":{"cpu":"2"}}"#.to_string(),
        )]);
        if let Some(raw) = raw {
            a.insert(RAW_ALLOCATABLE_ANNOTATION.to_string(), raw.to_string());
        }
        a
    }

    fn sample(resource: &str, unit: &'static str, value: f64) -> RawSample {
        RawSample {
            resource: resource.into(),
            unit,
            value,
        }
    }

    #[test]
    fn samples_from_the_annotation() {
        let cases: Vec<(&str, Option<&str>, Vec<RawSample>)> = vec![
            ("not inflated: no annotation", None, vec![]),
            ("empty map", Some("{}"), vec![]),
            (
                "whole cores",
                Some(r#"{"cpu":"4"}"#),
                vec![sample("cpu", "core", 4.0)],
            ),
            (
                "millicores",
                Some(r#"{"cpu":"3920m"}"#),
                vec![sample("cpu", "core", 3.92)],
            ),
            (
                "binary memory in bytes",
                Some(r#"{"memory":"16Gi"}"#),
                vec![sample("memory", "byte", 17179869184.0)],
            ),
            (
                "kibibytes as the kubelet writes them",
                Some(r#"{"memory":"32657788Ki"}"#),
                vec![sample("memory", "byte", 33441574912.0)],
            ),
            (
                "decimal memory",
                Some(r#"{"memory":"1.5G"}"#),
                vec![sample("memory", "byte", 1.5e9)],
            ),
            (
                "several resources, sorted, names as kube-state-metrics writes them",
                Some(
                    r#"{"pods":"110","ephemeral-storage":"100Gi","cpu":"8","hugepages-2Mi":"1Gi","example.com/gpu":"2"}"#,
                ),
                vec![
                    sample("cpu", "core", 8.0),
                    sample("ephemeral_storage", "byte", 107374182400.0),
                    sample("example_com_gpu", "integer", 2.0),
                    sample("hugepages_2Mi", "byte", 1073741824.0),
                    sample("pods", "integer", 110.0),
                ],
            ),
            (
                "zero",
                Some(r#"{"cpu":"0"}"#),
                vec![sample("cpu", "core", 0.0)],
            ),
        ];
        for (name, raw, want) in cases {
            let a = annotations(raw);
            assert_eq!(raw_allocatable(Some(&a)), Ok(want), "{name}");
        }
        assert_eq!(raw_allocatable(None), Ok(vec![]), "no annotations at all");
    }

    #[test]
    fn unreadable_annotations_are_errors() {
        let cases: Vec<(&str, &str, &str)> = vec![
            ("not JSON", "cpu=4", "not a JSON map"),
            ("a list", r#"["4"]"#, "not a JSON map"),
            (
                "a number instead of a quantity",
                r#"{"cpu":4}"#,
                "not a JSON map",
            ),
            (
                "not a quantity",
                r#"{"cpu":"four"}"#,
                "overcommit.dev/raw-allocatable cpu:",
            ),
            (
                "negative",
                r#"{"memory":"-1Gi"}"#,
                "memory: \"-1Gi\" is negative",
            ),
            ("empty", "", "not a JSON map"),
        ];
        for (name, raw, want) in cases {
            let a = annotations(Some(raw));
            match raw_allocatable(Some(&a)) {
                Err(e) => assert!(e.to_string().contains(want), "{name}: {e}"),
                Ok(s) => panic!("{name}: read as {s:?}"),
            }
        }
    }
}
