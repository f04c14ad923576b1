//! The kubelet's own allocatable of an inflated node, read back from the
//! `overcommit.dev/raw-allocatable` annotation and turned into metric samples in the units of
//! kube-state-metrics' `kube_node_status_allocatable` (cpu in cores, memory and storage in
//! bytes, everything else as a count), so that both can be compared and joined by
//! `(node, resource)`. Pure: no I/O; the watch that feeds it is `raw_allocatable_gauge`.

use std::collections::BTreeMap;

use overcommit_core::node::{AnnotationError, RAW_ALLOCATABLE_ANNOTATION, raw_allocatable_map};
use overcommit_core::quantity::{Quantity, QuantityError};

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
    #[error("{0}")]
    Unreadable(#[from] AnnotationError),
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
    let map = raw_allocatable_map(text)?;
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

    #[test]
    fn samples_from_the_annotation() {
        // One resource each: (annotation, resource label, unit, value).
        let single: &[(&str, &str, &str, f64)] = &[
            (r#"{"cpu":"4"}"#, "cpu", "core", 4.0),
            (r#"{"cpu":"3920m"}"#, "cpu", "core", 3.92),
            (r#"{"cpu":"0"}"#, "cpu", "core", 0.0),
            (r#"{"memory":"16Gi"}"#, "memory", "byte", 17179869184.0),
            (
                r#"{"memory":"32657788Ki"}"#,
                "memory",
                "byte",
                33441574912.0,
            ),
            (r#"{"memory":"1.5G"}"#, "memory", "byte", 1.5e9),
            (
                r#"{"ephemeral-storage":"100Gi"}"#,
                "ephemeral_storage",
                "byte",
                107374182400.0,
            ),
            (
                r#"{"hugepages-2Mi":"1Gi"}"#,
                "hugepages_2Mi",
                "byte",
                1073741824.0,
            ),
            (r#"{"pods":"110"}"#, "pods", "integer", 110.0),
            (
                r#"{"example.com/gpu":"2"}"#,
                "example_com_gpu",
                "integer",
                2.0,
            ),
        ];
        for &(raw, resource, unit, value) in single {
            let a = annotations(Some(raw));
            let want = vec![RawSample {
                resource: resource.into(),
                unit,
                value,
            }];
            assert_eq!(raw_allocatable(Some(&a)), Ok(want), "{raw}");
        }
        let none = annotations(None);
        assert_eq!(raw_allocatable(Some(&none)), Ok(vec![]), "not inflated");
        assert_eq!(raw_allocatable(None), Ok(vec![]), "no annotations at all");
        let empty = annotations(Some("{}"));
        assert_eq!(raw_allocatable(Some(&empty)), Ok(vec![]), "empty map");
        assert_eq!(
            raw_allocatable(Some(&annotations(Some("")))),
            Ok(vec![]),
            "empty list"
        );
        let several = annotations(Some("pods=110,memory=1Ki,cpu=8"));
        let resources: Vec<String> = raw_allocatable(Some(&several))
            .map(|s| s.into_iter().map(|s| s.resource).collect())
            .unwrap_or_default();
        assert_eq!(resources, ["cpu", "memory", "pods"], "several, sorted");
    }

    #[test]
    fn unreadable_annotations_are_errors() {
        let cases: Vec<(&str, &str, &str)> = vec![
            ("not name=value", "cpu", "is not name=value"),
            ("given twice", "cpu=4,cpu=5", "cpu given twice"),
            ("a list", r#"["4"]"#, "is not name=value"),
            (
                "JSON: a number instead of a quantity",
                r#"{"cpu":4}"#,
                "overcommit.dev/raw-allocatable: invalid type",
            ),
            (
                "not a quantity",
                "cpu=four",
                "overcommit.dev/raw-allocatable cpu:",
            ),
            (
                "JSON: not a quantity",
                r#"{"cpu":"four"}"#,
                "overcommit.dev/raw-allocatable cpu:",
            ),
            ("negative", "memory=-1Gi", "memory: \"-1Gi\" is negative"),
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
