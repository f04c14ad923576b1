//! Leader only: the pressure taint (`spec.pressure`; the decisions are
//! `overcommit_core::pressure`, pure). Every `--usage-interval` while a policy with pressure is
//! in force, the nodes are listed and each is judged with this replica's newest usage sample
//! (`sources::usage::UsageCaches`, whose poller runs while such a policy is in force); a change
//! of the taint `overcommit.dev/pressure:NoSchedule` is written with a JSON patch that tests the
//! node's resourceVersion first (a node changed since the list: refused, judged again next
//! round) and rewrites `spec.taints` with every other taint as it was. At most
//! [`WRITES_PER_ROUND`] writes a round.
//!
//! After leadership changes hands, the first round lists the nodes whatever the policies say,
//! and removes the taint from nodes no policy with pressure governs; once the feature is gone
//! (no policy has pressure) one more round does the same, then the loop only watches the
//! policy set. The hold (since when usage is below `low`) is in memory: a new leader starts it
//! again (the taint stays up to one `holdTime` longer, never shorter).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use overcommit_core::node::RAW_ALLOCATABLE_ANNOTATION;
use overcommit_core::policy::{NodeChoice, PolicySet};
use overcommit_core::pressure::{
    Change, NodeDecision, RESOURCES, Reading, TAINT_EFFECT, TAINT_KEY, Why, judge_node, raw_units,
    reading, taint_resources,
};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::election::Claim;
use crate::admission::Clock;
use crate::events::{Note, Recorder, node_ref};
use crate::sources::PolicyStore;
use crate::sources::usage::UsageCaches;

/// Taint writes a round at most (the rest wait for the next round).
pub const WRITES_PER_ROUND: usize = 20;
/// Nodes per page of the list.
const LIST_PAGE_SIZE: u32 = 100;
/// Longest wait for one write.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// The field manager of the taint writes.
const FIELD_MANAGER: &str = "kube-overcommit-pressure";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// `add`, `set` or `remove`.
    pub action: String,
    /// `done`, `conflict` (the node changed since it was read) or `failed`.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SkipLabels {
    /// `overcommit_core::pressure::Skip::as_str`.
    pub reason: String,
}

/// `kube_overcommit_nodes_under_pressure{resource}`,
/// `kube_overcommit_pressure_taint_writes_total{action,result}`,
/// `kube_overcommit_pressure_skipped_total{reason}`.
#[derive(Clone, Debug)]
pub struct PressureMetrics {
    pub under_pressure: Family<ResourceLabels, Gauge>,
    pub writes: Family<WriteLabels, Counter>,
    pub skipped: Family<SkipLabels, Counter>,
}

impl PressureMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self {
            under_pressure: Family::default(),
            writes: Family::default(),
            skipped: Family::default(),
        };
        registry.register(
            "nodes_under_pressure",
            "Leader: nodes whose pressure taint names the resource (usage above the high watermark, not yet held below low)",
            m.under_pressure.clone(),
        );
        registry.register(
            "pressure_taint_writes",
            "Leader: writes of the overcommit.dev/pressure taint, by action (add, set, remove) and result (done, conflict, failed)",
            m.writes.clone(),
        );
        registry.register(
            "pressure_skipped",
            "Leader: per node and resource, pressure decisions not taken because usage was unknown, by reason",
            m.skipped.clone(),
        );
        for resource in RESOURCES {
            m.set_under(resource, 0);
        }
        m
    }

    fn set_under(&self, resource: &str, nodes: i64) {
        self.under_pressure
            .get_or_create(&ResourceLabels {
                resource: resource.into(),
            })
            .set(nodes);
    }

    fn count_write(&self, action: &str, result: &str) {
        self.writes
            .get_or_create(&WriteLabels {
                action: action.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Leadership lost: another replica counts the nodes now.
    pub fn clear(&self) {
        for resource in RESOURCES {
            self.set_under(resource, 0);
        }
    }
}

/// What the pressure loop takes from `serve`.
#[derive(Clone)]
pub struct PressureContext {
    pub usage: Arc<UsageCaches>,
    /// `--usage-interval`: one round each.
    pub interval: Duration,
    pub metrics: PressureMetrics,
}

/// Our taint's value on a node (None: no taint of our key).
fn our_taint(node: &Node) -> Option<&str> {
    let taints = node.spec.as_ref()?.taints.as_ref()?;
    let ours = taints.iter().find(|t| t.key == TAINT_KEY)?;
    Some(ours.value.as_deref().unwrap_or(""))
}

/// The reading of `resource` on `node` from the caches.
fn node_reading(usage: &UsageCaches, node: &Node, resource: &str, now_ms: i64) -> Reading {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let annotation = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RAW_ALLOCATABLE_ANNOTATION))
        .map(String::as_str);
    let allocatable = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(resource))
        .map(|q| q.0.as_str());
    let raw = raw_units(annotation, allocatable, resource);
    reading(&usage.polled(name), resource, raw, now_ms)
}

/// Judge one node under `set`.
fn judge(
    set: &PolicySet,
    usage: &UsageCaches,
    node: &Node,
    holds: &BTreeMap<&'static str, i64>,
    now_ms: i64,
) -> NodeDecision {
    let pressure = match set.for_node(&node.metadata.labels) {
        NodeChoice::Policy(policy) => policy.pressure.as_ref(),
        NodeChoice::NoPolicy | NodeChoice::OptedOut => None,
    };
    let read = |resource: &str| node_reading(usage, node, resource, now_ms);
    judge_node(pressure, our_taint(node), holds, read, now_ms)
}

/// `spec.taints` with our taint set to `value` (None: removed), every other taint as it was.
fn taints_with(node: &Node, value: Option<&str>) -> Vec<Taint> {
    let mut taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != TAINT_KEY)
        .collect();
    if let Some(value) = value {
        taints.push(Taint {
            key: TAINT_KEY.into(),
            value: Some(value.into()),
            effect: TAINT_EFFECT.into(),
            time_added: None,
        });
    }
    taints
}

/// The JSON patch of a change: the node's resourceVersion tested, then `spec.taints` written.
fn patch_of(node: &Node, value: Option<&str>) -> Result<json_patch::Patch, serde_json::Error> {
    serde_json::from_value(serde_json::json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": node.metadata.resource_version},
        {"op": "add", "path": "/spec/taints", "value": taints_with(node, value)},
    ]))
}

/// The write's outcome label: a refused test (the node changed) is a conflict.
fn result_of(result: &Result<(), kube::Error>) -> &'static str {
    match result {
        Ok(()) => "done",
        Err(kube::Error::Api(status)) if [409, 422].contains(&status.code) => "conflict",
        Err(_) => "failed",
    }
}

/// Write one node's change (the claim checked right before).
async fn write(
    api: &Api<Node>,
    node: &Node,
    change: &Change,
    claim: &Claim,
) -> Result<(), kube::Error> {
    let value = match change {
        Change::Keep => return Ok(()),
        Change::Add(v) | Change::Set(v) => Some(v.as_str()),
        Change::Remove => None,
    };
    let patch = patch_of(node, value).map_err(kube::Error::SerdeError)?;
    if claim.check().is_err() {
        return Err(kube::Error::Service("not leading".into()));
    }
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let patch = Patch::<()>::Json(patch);
    let sent = api.patch(name, &params, &patch);
    match tokio::time::timeout(WRITE_TIMEOUT, sent).await {
        Ok(result) => result.map(|_| ()),
        Err(_) => Err(kube::Error::Service("taint write timed out".into())),
    }
}

/// The Event of a done change.
fn note(name: &str, decision: &NodeDecision) -> Option<Note> {
    let why: Vec<String> = decision
        .why
        .iter()
        .map(|(resource, why)| format!("{resource}: {why:?}"))
        .collect();
    let (warning, reason, action, text) = match &decision.change {
        Change::Keep => return None,
        Change::Add(v) | Change::Set(v) => (
            true,
            "PressureTainted",
            "Taint",
            format!(
                "usage above the high watermark: taint {TAINT_KEY}={v}:{TAINT_EFFECT} ({})",
                why.join(", ")
            ),
        ),
        Change::Remove => (
            false,
            "PressureRelieved",
            "Untaint",
            format!(
                "usage below the low watermark for the hold time, or no pressure policy: taint {TAINT_KEY} removed ({})",
                why.join(", ")
            ),
        ),
    };
    Some(Note {
        regarding: node_ref(name),
        warning,
        reason,
        action,
        note: text,
    })
}

/// What one round keeps for the next.
#[derive(Default)]
struct Rounds {
    /// node -> resource -> hold start.
    holds: BTreeMap<String, BTreeMap<&'static str, i64>>,
    /// A round must list the nodes even without a pressure policy (first round, feature just
    /// gone, or a write that failed).
    sweep: bool,
}

/// One round: list, judge, write.
async fn round(
    api: &Api<Node>,
    set: &PolicySet,
    context: &PressureContext,
    claim: &Claim,
    events: &Recorder,
    rounds: &mut Rounds,
) -> Result<(), kube::Error> {
    let nodes = list(api).await?;
    let now_ms = Clock::System.now_ms();
    let metrics = &context.metrics;
    let mut holds = BTreeMap::new();
    let mut under: BTreeMap<&str, i64> = RESOURCES.iter().map(|r| (*r, 0)).collect();
    let (mut writes, mut unfinished) = (0, false);
    for node in &nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let was = rounds.holds.get(&name).cloned().unwrap_or_default();
        let decision = judge(set, &context.usage, node, &was, now_ms);
        count_skips(metrics, &decision);
        let mut tainted = taint_resources(our_taint(node));
        if decision.change != Change::Keep {
            if writes >= WRITES_PER_ROUND {
                unfinished = true;
            } else {
                writes += 1;
                match apply(api, node, &decision, claim, events, metrics).await {
                    Some(now) => tainted = now,
                    None => unfinished = true,
                }
            }
        }
        for resource in tainted {
            *under.entry(resource).or_default() += 1;
        }
        if !decision.holds.is_empty() {
            holds.insert(name, decision.holds);
        }
    }
    for (resource, count) in under {
        metrics.set_under(resource, count);
    }
    rounds.holds = holds;
    rounds.sweep = unfinished;
    Ok(())
}

fn count_skips(metrics: &PressureMetrics, decision: &NodeDecision) {
    for (_, why) in &decision.why {
        if let Why::Unknown(skip) = why {
            metrics
                .skipped
                .get_or_create(&SkipLabels {
                    reason: skip.as_str().into(),
                })
                .inc();
        }
    }
}

/// Write a node's change, count it and say it; the resources its taint names now (None: the
/// write failed).
async fn apply(
    api: &Api<Node>,
    node: &Node,
    decision: &NodeDecision,
    claim: &Claim,
    events: &Recorder,
    metrics: &PressureMetrics,
) -> Option<BTreeSet<&'static str>> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let result = write(api, node, &decision.change, claim).await;
    let action = match &decision.change {
        Change::Add(_) => "add",
        Change::Set(_) => "set",
        Change::Remove | Change::Keep => "remove",
    };
    metrics.count_write(action, result_of(&result));
    if let Err(e) = result {
        tracing::warn!(node = %name, error = %e, "pressure taint write failed; judged again next round");
        return None;
    }
    tracing::info!(node = %name, change = ?decision.change, why = ?decision.why, "pressure taint written");
    if let Some(note) = note(name, decision) {
        events.emit(note);
    }
    Some(match &decision.change {
        Change::Add(v) | Change::Set(v) => taint_resources(Some(v)),
        Change::Remove | Change::Keep => BTreeSet::new(),
    })
}

/// Every node, a page at a time.
async fn list(api: &Api<Node>) -> Result<Vec<Node>, kube::Error> {
    let mut nodes = Vec::new();
    let mut params = ListParams::default().limit(LIST_PAGE_SIZE);
    loop {
        let page = api.list(&params).await?;
        nodes.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(nodes),
        }
    }
}

/// Keep the pressure taints until aborted (leadership lost).
pub async fn run(
    client: Client,
    policies: PolicyStore,
    claim: Claim,
    context: PressureContext,
    events: Recorder,
) {
    let api: Api<Node> = Api::all(client);
    let mut tick = tokio::time::interval(context.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rounds = Rounds {
        sweep: true,
        ..Rounds::default()
    };
    loop {
        tick.tick().await;
        if !policies.is_synced() {
            continue;
        }
        let set = policies.current();
        if !set.has_pressure() && !rounds.sweep {
            rounds.holds.clear();
            continue;
        }
        match round(&api, &set, &context, &claim, &events, &mut rounds).await {
            // A pressure policy keeps every round listing; without one, the sweep is done.
            Ok(()) => rounds.sweep |= set.has_pressure(),
            Err(e) => {
                rounds.sweep = true;
                tracing::warn!(error = %e, "listing nodes for the pressure taint failed; retrying next round");
            }
        }
    }
}
