//! Leader only: `kube_overcommit_node_raw_allocatable{node, resource, unit}`, the kubelet's own
//! allocatable of every inflated node, for the alert on requests above the real allocatable.
//!
//! Fed by a metadata-only watch of nodes (`PartialObjectMeta<Node>`: a node's metadata is about
//! 2 KB, the whole object 20-60 KB), and nothing is kept of a node but the label sets it
//! exports. What memory the watch costs is mostly the peak of decoding one list page
//! (`LIST_PAGE_SIZE`), not the number of nodes. A node's series go away when it is
//! deleted, when it loses the annotation (policy deleted or ratio gone: it is no longer
//! inflated) and when a relist no longer lists it. The leader supervision starts `run` with the
//! leadership and, when leadership is lost, aborts it and calls `clear`, so exactly one replica
//! exports the family.

use std::collections::{BTreeMap, HashMap, HashSet};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};

use super::metrics::{LeaderMetrics, NodeResourceLabels};
use super::raw_allocatable::raw_allocatable;

/// Nodes per page of the initial list and of every relist. A page is decoded whole, managedFields
/// included, so it sets the peak memory of the watch; kube-runtime's default is 500.
const LIST_PAGE_SIZE: u32 = 100;

/// The exported series and what is needed to remove them again.
struct Exporter {
    metrics: LeaderMetrics,
    /// node -> the label sets exported for it.
    exported: HashMap<String, Vec<NodeResourceLabels>>,
    /// Nodes whose annotation could not be read (logged once when they became unreadable).
    unreadable: HashSet<String>,
    /// Nodes listed since the last `Init`, while a relist is under way.
    relisted: Option<HashSet<String>>,
}

impl Exporter {
    fn new(metrics: LeaderMetrics) -> Self {
        Self {
            metrics,
            exported: HashMap::new(),
            unreadable: HashSet::new(),
            relisted: None,
        }
    }

    fn event(&mut self, event: watcher::Event<PartialObjectMeta<Node>>) {
        match event {
            watcher::Event::Init => self.relisted = Some(HashSet::new()),
            watcher::Event::InitApply(node) => {
                let name = node.metadata.name.unwrap_or_default();
                self.apply(&name, node.metadata.annotations.as_ref());
                if let Some(seen) = self.relisted.as_mut() {
                    seen.insert(name);
                }
            }
            watcher::Event::InitDone => {
                if let Some(seen) = self.relisted.take() {
                    let gone: Vec<String> = self
                        .exported
                        .keys()
                        .chain(self.unreadable.iter())
                        .filter(|n| !seen.contains(*n))
                        .cloned()
                        .collect();
                    for name in gone {
                        self.delete(&name);
                    }
                }
            }
            watcher::Event::Apply(node) => {
                let name = node.metadata.name.unwrap_or_default();
                self.apply(&name, node.metadata.annotations.as_ref());
            }
            watcher::Event::Delete(node) => self.delete(&node.metadata.name.unwrap_or_default()),
        }
    }

    /// Make the node's series what its annotations say.
    fn apply(&mut self, name: &str, annotations: Option<&BTreeMap<String, String>>) {
        let samples = match raw_allocatable(annotations) {
            Ok(samples) => {
                self.unreadable.remove(name);
                samples
            }
            Err(e) => {
                if self.unreadable.insert(name.to_string()) {
                    tracing::warn!(node = name, error = %e, "node raw allocatable not exported");
                }
                // A value that cannot be read is not exported, rather than a stale one.
                Vec::new()
            }
        };
        let family = &self.metrics.node_raw_allocatable;
        let keys: Vec<NodeResourceLabels> = samples
            .into_iter()
            .map(|s| {
                let key = NodeResourceLabels {
                    node: name.to_string(),
                    resource: s.resource,
                    unit: s.unit.to_string(),
                };
                family.get_or_create(&key).set(s.value);
                key
            })
            .collect();
        let before = if keys.is_empty() {
            self.exported.remove(name)
        } else {
            self.exported.insert(name.to_string(), keys.clone())
        };
        for old in before.unwrap_or_default() {
            if !keys.contains(&old) {
                family.remove(&old);
            }
        }
        self.count_unreadable();
    }

    fn delete(&mut self, name: &str) {
        for key in self.exported.remove(name).unwrap_or_default() {
            self.metrics.node_raw_allocatable.remove(&key);
        }
        self.unreadable.remove(name);
        self.count_unreadable();
    }

    fn count_unreadable(&self) {
        let n = i64::try_from(self.unreadable.len()).unwrap_or(i64::MAX);
        self.metrics.node_raw_allocatable_unreadable.set(n);
    }
}

/// Watch node metadata and export the family until aborted. `Api<PartialObjectMeta<Node>>` asks
/// the API server for `PartialObjectMetadata` only (kube-runtime's `metadata_watcher`, which
/// kube 4 deprecates in favour of this form). Watch errors are logged and retried
/// with backoff; the series already exported stay until the watch is back (a relist then drops
/// what is gone).
pub async fn run(nodes: Api<PartialObjectMeta<Node>>, metrics: LeaderMetrics) {
    let mut exporter = Exporter::new(metrics);
    let config = watcher::Config::default().page_size(LIST_PAGE_SIZE);
    let mut events = std::pin::pin!(watcher(nodes, config).default_backoff());
    tracing::info!("exporting the raw allocatable of inflated nodes");
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => exporter.event(event),
            Err(e) => tracing::warn!(error = %e, "node metadata watch failed; retrying"),
        }
    }
}

/// Drop every series: leadership was lost, another replica exports them now.
pub fn clear(metrics: &LeaderMetrics) {
    metrics.node_raw_allocatable.clear();
    metrics.node_raw_allocatable_unreadable.set(0);
}

#[cfg(test)]
mod tests {
    use kube::core::{ObjectMeta, PartialObjectMetaExt};
    use prometheus_client::registry::Registry;

    use super::*;
    use overcommit_core::node::RAW_ALLOCATABLE_ANNOTATION;

    fn node(name: &str, raw: Option<&str>) -> PartialObjectMeta<Node> {
        ObjectMeta {
            name: Some(name.into()),
            annotations: raw
                .map(|r| BTreeMap::from([(RAW_ALLOCATABLE_ANNOTATION.to_string(), r.to_string())])),
            ..Default::default()
        }
        .into_response_partial()
    }

    /// The exported samples, sorted: `node resource value`, and the unreadable count.
    fn exported(registry: &Registry) -> (Vec<String>, String) {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        let mut samples: Vec<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("node_raw_allocatable{"))
            .map(|l| {
                let label = |k: &str| {
                    l.split(&format!("{k}=\""))
                        .nth(1)
                        .and_then(|v| v.split('"').next())
                        .unwrap_or("?")
                        .to_string()
                };
                let value = l.rsplit(' ').next().unwrap_or("?");
                format!("{} {} {}", label("node"), label("resource"), value)
            })
            .collect();
        samples.sort();
        let unreadable = text
            .lines()
            .find_map(|l| l.strip_prefix("node_raw_allocatable_unreadable_nodes "))
            .unwrap_or("?")
            .to_string();
        (samples, unreadable)
    }

    #[test]
    fn series_follow_the_annotation_and_the_node() {
        use watcher::Event::*;
        let mut registry = Registry::default();
        let metrics = LeaderMetrics::new(&mut registry);
        let mut exporter = Exporter::new(metrics.clone());
        // (step, events, samples exported after it, unreadable nodes after it)
        type Step = (
            &'static str,
            Vec<watcher::Event<PartialObjectMeta<Node>>>,
            Vec<&'static str>,
            &'static str,
        );
        let steps: Vec<Step> = vec![
            (
                "initial list: only inflated nodes export",
                vec![
                    Init,
                    InitApply(node("a", Some(r#"{"cpu":"4","memory":"16Gi"}"#))),
                    InitApply(node("b", None)),
                    InitApply(node("c", Some(r#"{"cpu":"2"}"#))),
                    InitDone,
                ],
                vec!["a cpu 4.0", "a memory 17179869184.0", "c cpu 2.0"],
                "0",
            ),
            (
                "a resource dropped from the annotation",
                vec![Apply(node("a", Some(r#"{"cpu":"3500m"}"#)))],
                vec!["a cpu 3.5", "c cpu 2.0"],
                "0",
            ),
            (
                "the annotation removed (policy deleted)",
                vec![Apply(node("c", None))],
                vec!["a cpu 3.5"],
                "0",
            ),
            (
                "an unreadable annotation: no stale value, counted",
                vec![
                    Apply(node("a", Some("cpu=4,cpu=5"))),
                    Apply(node("b", Some("{"))),
                ],
                vec![],
                "2",
            ),
            (
                "readable again",
                vec![Apply(node("a", Some(r#"{"cpu":"4"}"#)))],
                vec!["a cpu 4.0"],
                "1",
            ),
            (
                "deleted",
                vec![
                    Apply(node("d", Some(r#"{"cpu":"1"}"#))),
                    Delete(node("a", None)),
                ],
                vec!["d cpu 1.0"],
                "1",
            ),
            (
                "relist: what is not listed again is gone",
                vec![Init, InitApply(node("e", Some(r#"{"cpu":"8"}"#))), InitDone],
                vec!["e cpu 8.0"],
                "0",
            ),
        ];
        for (name, events, want, unreadable) in steps {
            for e in events {
                exporter.event(e);
            }
            let (got, got_unreadable) = exported(&registry);
            assert_eq!(got, want, "{name}");
            assert_eq!(got_unreadable, unreadable, "{name}: unreadable nodes");
        }
        clear(&metrics);
        assert_eq!(exported(&registry), (vec![], "0".to_string()), "cleared");
    }
}
