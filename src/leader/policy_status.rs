//! Leader only: the `status` of every OvercommitPolicy (what it did: nodes selected, carrying
//! its generation, shadowed, opted out, on the usage fallback; Ready, Progressing, Degraded).
//! The status is computed by `overcommit_core::policy_report` (pure, table-tested) from two
//! watches: the policies, and node metadata (labels and the `overcommit.dev/applied`
//! annotation, which records the policy's generation). Only what is needed of a node is kept.
//!
//! Writes are batched: a watch event only marks the state changed; once per `TICK` a changed
//! state is recomputed, and a policy whose status differs from what its object carries gets one
//! merge patch of the status subresource, at most every `MIN_WRITE_INTERVAL` per policy (a
//! staged rollout's step at once: steps are at most one per `stepInterval`). The
//! patch carries the resourceVersion it was computed against (a 409 means a newer object is on
//! its way through the watch) and goes out only while the claim holds. An unchanged world
//! writes nothing: conditions keep their transition time while their status stays.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use overcommit_core::node::APPLIED_ANNOTATION;
use overcommit_core::policy::status::OvercommitPolicyStatus;
use overcommit_core::policy::{OvercommitPolicy, PolicySet};
use overcommit_core::policy_report::{InProcessState, NodeFacts, desired_statuses};
use overcommit_core::rollout;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use super::election::Claim;
use super::in_process::InProcessContext;
use super::node_events::NodeEvents;
use crate::events::{Note, Recorder, policy_ref};
use crate::mode::Path;

/// How often a changed state is recomputed.
const TICK: Duration = Duration::from_secs(1);
/// The shortest time between two status writes of one policy.
pub const MIN_WRITE_INTERVAL: Duration = Duration::from_secs(5);
/// Nodes per page of the node list (as `raw_allocatable_gauge`).
const LIST_PAGE_SIZE: u32 = 100;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// `written`, `conflict` or `failed`.
    pub result: String,
}

/// `kube_overcommit_policy_status_writes_total{result}`.
#[derive(Clone, Debug, Default)]
pub struct StatusMetrics {
    pub writes: Family<WriteLabels, Counter>,
}

impl StatusMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "policy_status_writes",
            "Leader only: status writes of OvercommitPolicy objects by result (written, \
             conflict, failed)",
            self.writes.clone(),
        );
    }

    fn count(&self, result: &str) {
        self.writes
            .get_or_create(&WriteLabels {
                result: result.into(),
            })
            .inc();
    }
}

/// A map kept from a watch: `Init` .. `InitDone` replaces it, `Apply` and `Delete` edit it.
/// Whether an event changed it is returned, so that nothing is recomputed for a node write
/// that changed neither labels nor the applied annotation (most of them).
struct Mirror<V> {
    items: HashMap<String, V>,
    relisted: Option<HashSet<String>>,
    /// A first list has completed (before it, an empty map means "not known yet").
    synced: bool,
}

impl<V: PartialEq> Mirror<V> {
    fn new() -> Self {
        Self {
            items: HashMap::new(),
            relisted: None,
            synced: false,
        }
    }

    /// Keep `value` for `name`; whether it differs from what was kept.
    /// Whether the map is complete: listed once, and not in the middle of a relist.
    fn complete(&self) -> bool {
        self.synced && self.relisted.is_none()
    }

    fn put(&mut self, name: String, value: V) -> bool {
        let same = self.items.get(&name) == Some(&value);
        self.items.insert(name, value);
        !same
    }

    fn event<K>(&mut self, event: watcher::Event<K>, read: impl Fn(K) -> (String, V)) -> bool {
        match event {
            watcher::Event::Init => {
                self.relisted = Some(HashSet::new());
                false
            }
            watcher::Event::InitApply(object) => {
                let (name, value) = read(object);
                if let Some(seen) = self.relisted.as_mut() {
                    seen.insert(name.clone());
                }
                self.put(name, value)
            }
            watcher::Event::Apply(object) => {
                let (name, value) = read(object);
                self.put(name, value)
            }
            watcher::Event::InitDone => {
                let first = !self.synced;
                self.synced = true;
                let Some(seen) = self.relisted.take() else {
                    return first;
                };
                let before = self.items.len();
                self.items.retain(|name, _| seen.contains(name));
                first || before != self.items.len()
            }
            watcher::Event::Delete(object) => {
                let (name, _) = read(object);
                self.items.remove(&name).is_some()
            }
        }
    }
}

fn node_facts(node: PartialObjectMeta<Node>) -> (String, NodeFacts) {
    let meta = node.metadata;
    let applied = meta
        .annotations
        .and_then(|mut a| a.remove(APPLIED_ANNOTATION));
    let name = meta.name.unwrap_or_default();
    let facts = NodeFacts {
        name: name.clone(),
        labels: meta.labels.unwrap_or_default(),
        applied,
    };
    (name, facts)
}

/// A policy as watched; the same while its resourceVersion is (any change of the object,
/// spec or status, is worth a look).
#[derive(Clone)]
struct Watched(OvercommitPolicy);

impl PartialEq for Watched {
    fn eq(&self, other: &Self) -> bool {
        self.0.metadata.resource_version == other.0.metadata.resource_version
    }
}

fn policy_entry(policy: OvercommitPolicy) -> (String, Watched) {
    (
        policy.metadata.name.clone().unwrap_or_default(),
        Watched(policy),
    )
}

/// What is due: the policies whose desired status differs from the one they carry, and were
/// not written within `MIN_WRITE_INTERVAL`, or whose desired status takes a staged rollout's
/// step (at most one per `stepInterval`, so a step is not up to 5 s late) (pure). Also whether
/// any stays to write later.
fn due<'d>(
    desired: &'d BTreeMap<String, OvercommitPolicyStatus>,
    policies: &HashMap<String, Watched>,
    last_write: &HashMap<String, Instant>,
    now: Instant,
) -> (Vec<(&'d str, &'d OvercommitPolicyStatus)>, bool) {
    let mut writes = Vec::new();
    let mut later = false;
    for (name, status) in desired {
        let current = policies.get(name).and_then(|p| p.0.status.as_ref());
        if current == Some(status) {
            continue;
        }
        let step = status.rollout.as_ref().is_some_and(|next| {
            rollout::takes_step(current.and_then(|c| c.rollout.as_ref()), next)
        });
        match last_write.get(name) {
            Some(at) if now.saturating_duration_since(*at) < MIN_WRITE_INTERVAL && !step => {
                later = true
            }
            _ => writes.push((name.as_str(), status)),
        }
    }
    (writes, later)
}

/// Keep every policy's status until aborted (the leader supervision aborts it with the
/// leadership).
pub async fn run(
    client: Client,
    claim: Claim,
    in_process: InProcessContext,
    metrics: StatusMetrics,
    recorder: Recorder,
) {
    let policies_api: Api<OvercommitPolicy> = Api::all(client.clone());
    let nodes_api: Api<PartialObjectMeta<Node>> = Api::all(client);
    let mut policy_events =
        std::pin::pin!(watcher(policies_api.clone(), watcher::Config::default()).default_backoff());
    let node_config = watcher::Config::default().page_size(LIST_PAGE_SIZE);
    let mut node_events = std::pin::pin!(watcher(nodes_api, node_config).default_backoff());
    let mut policies = Mirror::new();
    let mut nodes = Mirror::new();
    let mut last_write: HashMap<String, Instant> = HashMap::new();
    let mut changed = false;
    let mut in_process_seen = None;
    let steps = recorder.clone();
    let mut told = NodeEvents::new(recorder);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tracing::info!("keeping the status of every OvercommitPolicy");
    loop {
        tokio::select! {
            Some(event) = policy_events.next() => match event {
                Ok(event) => changed |= policies.event(event, policy_entry),
                Err(e) => tracing::warn!(error = %e, "policy watch failed; retrying"),
            },
            Some(event) = node_events.next() => match event {
                Ok(event) => changed |= nodes.event(event, node_facts),
                Err(e) => tracing::warn!(error = %e, "node metadata watch failed; retrying"),
            },
            _ = tick.tick() => {
                told.flush(|name| policies.items.get(name).map(|p| policy_ref(&p.0)), Instant::now());
                let state = InProcessState {
                    mode: in_process.path == Path::InProcess,
                    in_force: in_process.flag.load(Ordering::Relaxed),
                };
                changed |= in_process_seen.replace(state) != Some(state);
                // A staged rollout's next step falls due with time alone.
                changed |= policies.items.values().any(|p| p.0.spec.rollout.is_some());
                // Wait for both lists: counts from half a list would be written as facts.
                if !changed || !policies.complete() || !nodes.complete() {
                    continue;
                }
                let facts: Vec<NodeFacts> = nodes.items.values().cloned().collect();
                let objects: Vec<OvercommitPolicy> =
                    policies.items.values().map(|p| p.0.clone()).collect();
                let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
                let (set, _) = PolicySet::from_valid(objects.clone());
                told.observe(&nodes.items, &set, Instant::now());
                let desired = desired_statuses(&objects, &facts, state, &now);
                let (writes, later) = due(&desired, &policies.items, &last_write, Instant::now());
                changed = later;
                for (name, status) in writes {
                    let rv = policies.items.get(name).and_then(|p| p.0.metadata.resource_version.clone());
                    last_write.insert(name.to_string(), Instant::now());
                    if claim.check().is_err() {
                        return;
                    }
                    // A failed write is tried again (after MIN_WRITE_INTERVAL); a conflict too,
                    // though the newer object on its way through the watch usually comes first.
                    let written = write(&policies_api, name, rv, status, &metrics).await;
                    if written && let Some(p) = policies.items.get(name) {
                        tell_step(&steps, &p.0, status);
                    }
                    changed |= !written;
                }
                last_write.retain(|name, _| policies.items.contains_key(name));
            }
        }
    }
}

/// One Event on the policy for a staged rollout's step just written (`rollout::step_note`).
fn tell_step(recorder: &Recorder, policy: &OvercommitPolicy, written: &OvercommitPolicyStatus) {
    let previous = policy.status.as_ref().and_then(|s| s.rollout.as_ref());
    if let Some(note) = rollout::step_note(previous, written.rollout.as_ref()) {
        recorder.emit(Note {
            regarding: policy_ref(policy),
            warning: false,
            reason: "RolloutStep",
            action: "Admit",
            note,
        });
    }
}

/// One merge patch of the status subresource, against the resourceVersion it was computed from.
/// Whether it was written.
async fn write(
    api: &Api<OvercommitPolicy>,
    name: &str,
    resource_version: Option<String>,
    status: &OvercommitPolicyStatus,
    metrics: &StatusMetrics,
) -> bool {
    let mut patch = serde_json::json!({
        "metadata": {"resourceVersion": resource_version},
        "status": status,
    });
    // A merge patch keeps what it does not name: a rollout no longer there is removed by null.
    if status.rollout.is_none() {
        patch["status"]["rollout"] = serde_json::Value::Null;
    }
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            metrics.count("written");
            true
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            metrics.count("conflict");
            tracing::debug!(policy = name, "policy changed while its status was written");
            false
        }
        Err(e) => {
            metrics.count("failed");
            tracing::warn!(policy = name, error = %e, "could not write the policy status");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use overcommit_core::policy::RolloutStatus;

    fn policy(name: &str, status: Option<OvercommitPolicyStatus>) -> (String, Watched) {
        let mut p = OvercommitPolicy::new(name, Default::default());
        p.status = status;
        (name.to_string(), Watched(p))
    }

    fn status(selected: i64) -> OvercommitPolicyStatus {
        OvercommitPolicyStatus {
            nodes_selected: selected,
            ..Default::default()
        }
    }

    /// Only a status that differs is written, and a policy at most every
    /// `MIN_WRITE_INTERVAL`; one held back is reported for later.
    #[test]
    fn writes_only_what_differs_and_not_too_often() {
        let now = Instant::now();
        let recently = now - Duration::from_secs(1);
        let long_ago = now - MIN_WRITE_INTERVAL;
        let policies: HashMap<String, Watched> = [
            policy("same", Some(status(2))),
            policy("new", None),
            policy("recent", Some(status(1))),
            policy("old", Some(status(1))),
        ]
        .into();
        let desired: BTreeMap<String, OvercommitPolicyStatus> = [
            ("same".to_string(), status(2)),
            ("new".to_string(), status(1)),
            ("recent".to_string(), status(3)),
            ("old".to_string(), status(3)),
        ]
        .into();
        let last_write: HashMap<String, Instant> = [
            ("same".to_string(), recently),
            ("recent".to_string(), recently),
            ("old".to_string(), long_ago),
        ]
        .into();
        let (writes, later) = due(&desired, &policies, &last_write, now);
        let names: Vec<&str> = writes.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["new", "old"]);
        assert!(later);
        let (_, later) = due(&desired, &policies, &HashMap::new(), now);
        assert!(!later);
    }

    /// A status that takes a rollout's step goes out within `MIN_WRITE_INTERVAL`; one that
    /// only changes the counts of a rollout does not.
    #[test]
    fn a_step_is_written_at_once() {
        let now = Instant::now();
        let rollout = |step: i64, last: &str, waiting: i64| OvercommitPolicyStatus {
            rollout: Some(RolloutStatus {
                step,
                last_step_time: Some(last.to_string()),
                nodes_waiting: waiting,
                ..Default::default()
            }),
            ..Default::default()
        };
        let carried = rollout(1, "2026-01-01T00:00:00Z", 8);
        let policies: HashMap<String, Watched> = [
            policy("stepping", Some(carried.clone())),
            policy("counting", Some(carried.clone())),
        ]
        .into();
        let desired: BTreeMap<String, OvercommitPolicyStatus> = [
            (
                "stepping".to_string(),
                rollout(2, "2026-01-01T00:00:10Z", 6),
            ),
            (
                "counting".to_string(),
                rollout(1, "2026-01-01T00:00:00Z", 7),
            ),
        ]
        .into();
        let recently = now - Duration::from_secs(1);
        let last_write: HashMap<String, Instant> = [
            ("stepping".to_string(), recently),
            ("counting".to_string(), recently),
        ]
        .into();
        let (writes, later) = due(&desired, &policies, &last_write, now);
        let names: Vec<&str> = writes.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["stepping"]);
        assert!(later);
    }

    /// A node event counts as a change only when labels or the applied annotation changed.
    #[test]
    fn only_label_and_annotation_changes_count() {
        use kube::core::{ObjectMeta, PartialObjectMetaExt};
        let node = |labels: &[(&str, &str)], applied: Option<&str>, rv: &str| {
            ObjectMeta {
                name: Some("n1".into()),
                resource_version: Some(rv.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                annotations: applied.map(|a| {
                    BTreeMap::from([
                        (APPLIED_ANNOTATION.to_string(), a.to_string()),
                        ("other".to_string(), rv.to_string()),
                    ])
                }),
                ..Default::default()
            }
            .into_response_partial::<Node>()
        };
        let mut mirror = Mirror::new();
        let apply = |n| watcher::Event::Apply(n);
        assert!(mirror.event(apply(node(&[("a", "1")], None, "1")), node_facts));
        assert!(!mirror.event(apply(node(&[("a", "1")], None, "2")), node_facts));
        assert!(mirror.event(apply(node(&[("a", "2")], None, "3")), node_facts));
        assert!(mirror.event(apply(node(&[("a", "2")], Some("x"), "4")), node_facts));
        assert!(!mirror.event(apply(node(&[("a", "2")], Some("x"), "5")), node_facts));
        // Not complete before a first list: an empty map is not "no nodes".
        assert!(!mirror.complete());
        // A relist that no longer lists it drops it.
        assert!(!mirror.event(watcher::Event::Init, node_facts));
        assert!(!mirror.complete());
        assert!(mirror.event(watcher::Event::InitDone, node_facts));
        assert!(mirror.complete());
        assert!(mirror.items.is_empty());
        assert!(!mirror.event(watcher::Event::Delete(node(&[], None, "6")), node_facts));
    }
}
