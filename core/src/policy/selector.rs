//! Label selectors, compiled once and matched against node labels. Pure.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};

/// Read access to a set of labels, whatever map holds them.
pub trait LabelLookup {
    fn label(&self, key: &str) -> Option<&str>;
}

impl<K, V> LabelLookup for BTreeMap<K, V>
where
    K: Borrow<str> + Ord,
    V: AsRef<str>,
{
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(AsRef::as_ref)
    }
}

impl LabelLookup for overcommit_json::StrMap<'_> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(AsRef::as_ref)
    }
}

impl<T: LabelLookup> LabelLookup for Option<T> {
    fn label(&self, key: &str) -> Option<&str> {
        self.as_ref()?.label(key)
    }
}

impl<T: LabelLookup + ?Sized> LabelLookup for &T {
    fn label(&self, key: &str) -> Option<&str> {
        (**self).label(key)
    }
}

/// No labels at all.
pub struct NoLabels;
impl LabelLookup for NoLabels {
    fn label(&self, _key: &str) -> Option<&str> {
        None
    }
}

/// One requirement of a selector (matchLabels entries become `In` with one value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &impl LabelLookup) -> bool {
        match self {
            Requirement::In(key, values) => labels.label(key).is_some_and(|v| values.contains(v)),
            // Kubernetes: NotIn also matches when the label is absent.
            Requirement::NotIn(key, values) => {
                !labels.label(key).is_some_and(|v| values.contains(v))
            }
            Requirement::Exists(key) => labels.label(key).is_some(),
            Requirement::DoesNotExist(key) => labels.label(key).is_none(),
        }
    }
}

/// A validated label selector: all requirements must hold; none selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    pub requirements: Vec<Requirement>,
}

impl Selector {
    pub fn matches(&self, labels: &impl LabelLookup) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
    fn set(values: &[&str]) -> BTreeSet<String> {
        values.iter().map(|v| v.to_string()).collect()
    }

    #[test]
    fn each_operator_follows_kubernetes_semantics() {
        let node = labels(&[("pool", "batch"), ("zone", "a")]);
        let cases: Vec<(Requirement, bool)> = vec![
            (Requirement::In("pool".into(), set(&["batch", "web"])), true),
            (Requirement::In("pool".into(), set(&["web"])), false),
            (Requirement::In("missing".into(), set(&["x"])), false),
            (Requirement::NotIn("pool".into(), set(&["web"])), true),
            (Requirement::NotIn("pool".into(), set(&["batch"])), false),
            (Requirement::NotIn("missing".into(), set(&["x"])), true),
            (Requirement::Exists("zone".into()), true),
            (Requirement::Exists("missing".into()), false),
            (Requirement::DoesNotExist("missing".into()), true),
            (Requirement::DoesNotExist("zone".into()), false),
        ];
        for (requirement, expected) in cases {
            let selector = Selector {
                requirements: vec![requirement.clone()],
            };
            assert_eq!(selector.matches(&node), expected, "{requirement:?}");
        }
    }

    #[test]
    fn empty_selector_matches_every_node_even_without_labels() {
        assert!(Selector::default().matches(&NoLabels));
        assert!(Selector::default().matches(&labels(&[("a", "b")])));
    }

    #[test]
    fn all_requirements_must_hold() {
        let selector = Selector {
            requirements: vec![
                Requirement::In("pool".into(), set(&["batch"])),
                Requirement::DoesNotExist("gpu".into()),
            ],
        };
        assert!(selector.matches(&labels(&[("pool", "batch")])));
        assert!(!selector.matches(&labels(&[("pool", "batch"), ("gpu", "yes")])));
    }
}
