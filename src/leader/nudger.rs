//! Leader only: nudge the nodes a policy change has not reached (the decisions: `nudge`;
//! docs/architecture.md §5). One watch of nodes, of which only `nudge::NodeFacts` is kept; at
//! every change of a node and of the policy set, `nudge::need` says which nodes the node rule
//! would change, and each gets an empty merge patch of its status (`{"status":{}}`) as the
//! ServiceAccount, paced by `--nudge-rate`. The API server runs mutating admission on it like on
//! any status write: the node webhook (or the compiled policy) applies the rule, and the store
//! writes nothing when the result equals the stored node. Everything is rebuilt from the watch's
//! list when a replica starts leading, so a new leader nudges what is out of date, nothing more.
//!
//! A nudge only helps when the match conditions take it: the leader asks the API server who it
//! is (a SelfSubjectReview) and sends nothing when that is not `nudger`, the user the match
//! conditions name (`serve --service-account` in `serve --namespace`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use overcommit_core::policy::PolicySet;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;

use super::election::Claim;
use super::nudge::{Backlog, Bucket, NodeFacts, need};
use crate::sources::PolicyStore;

/// Nodes per page of the watch's lists (a page is decoded whole: the memory peak).
const LIST_PAGE_SIZE: u32 = 100;
/// Nudges sent at once before the rate applies.
pub const BURST: u32 = 10;
/// Nudges in flight at once.
const IN_FLIGHT: usize = 8;
/// Longest wait for one nudge.
const NUDGE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the policy set is looked at besides its publish signal.
const TICK: Duration = Duration::from_secs(1);
/// The field manager of the nudges.
const FIELD_MANAGER: &str = "kube-overcommit-nudge";

/// What the nudges need besides the client.
#[derive(Clone, Debug)]
pub struct NudgeSettings {
    /// Nudges per second (`--nudge-rate`; 0: none).
    pub rate: f64,
    /// The user the node webhook's match condition and the compiled policy's `takes` take.
    pub nudger: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NudgeLabels {
    /// `sent` or `failed`.
    pub result: String,
}

/// `kube_overcommit_nudges_total{result}`, `kube_overcommit_nudge_lag_seconds`,
/// `kube_overcommit_nodes_out_of_date`.
#[derive(Clone, Debug)]
pub struct NudgeMetrics {
    pub nudges: Family<NudgeLabels, Counter>,
    /// From the leader first seeing a node out of date to seeing it at its policy.
    pub lag: Histogram,
    pub out_of_date: Gauge,
}

impl NudgeMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self {
            nudges: Family::default(),
            lag: Histogram::new(exponential_buckets(0.25, 2.0, 12)),
            out_of_date: Gauge::default(),
        };
        registry.register(
            "nudges",
            "Leader: empty node status PATCHes sent to bring a policy change to a node, by result",
            m.nudges.clone(),
        );
        registry.register(
            "nudge_lag_seconds",
            "Leader: time from seeing a node out of date with the policies to seeing it at them",
            m.lag.clone(),
        );
        registry.register(
            "nodes_out_of_date",
            "Leader: nodes whose allocatable or annotations the policies would change now",
            m.out_of_date.clone(),
        );
        m
    }

    fn count(&self, result: &str) {
        self.nudges
            .get_or_create(&NudgeLabels {
                result: result.into(),
            })
            .inc();
    }

    /// Leadership lost: another replica counts the backlog now.
    pub fn clear(&self) {
        self.out_of_date.set(0);
    }
}

/// The nodes as last seen and the backlog, under the policy set they were judged by.
struct State {
    nodes: BTreeMap<String, NodeFacts>,
    /// Names listed since the last `Init`, while a relist is under way.
    relisted: Option<BTreeSet<String>>,
    backlog: Backlog,
    /// None until the policies are synced.
    judged_by: Option<Arc<PolicySet>>,
    metrics: NudgeMetrics,
}

impl State {
    fn judge(&mut self, name: &str, now: Instant) {
        let (Some(set), Some(facts)) = (self.judged_by.as_ref(), self.nodes.get(name)) else {
            return;
        };
        if let Some(lag) = self.backlog.observe(name, need(name, facts, set), now) {
            self.metrics.lag.observe(lag.as_secs_f64());
        }
    }

    /// Judge every node again when the policy set changed.
    fn policies(&mut self, store: &PolicyStore, now: Instant) {
        if !store.is_synced() {
            return;
        }
        let current = store.current();
        if self
            .judged_by
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, &current))
        {
            return;
        }
        self.judged_by = Some(current);
        let names: Vec<String> = self.nodes.keys().cloned().collect();
        for name in names {
            self.judge(&name, now);
        }
    }

    fn event(&mut self, event: watcher::Event<Node>, now: Instant) {
        match event {
            watcher::Event::Init => self.relisted = Some(BTreeSet::new()),
            watcher::Event::InitApply(node) | watcher::Event::Apply(node) => {
                let name = node.metadata.name.clone().unwrap_or_default();
                self.nodes.insert(name.clone(), NodeFacts::from_node(&node));
                self.judge(&name, now);
                if let Some(seen) = self.relisted.as_mut() {
                    seen.insert(name);
                }
            }
            watcher::Event::InitDone => {
                if let Some(seen) = self.relisted.take() {
                    self.nodes.retain(|name, _| seen.contains(name));
                    self.backlog.retain(|name| seen.contains(name));
                }
            }
            watcher::Event::Delete(node) => {
                let name = node.metadata.name.unwrap_or_default();
                self.nodes.remove(&name);
                self.backlog.forget(&name);
            }
        }
    }
}

/// Who this replica is to the API server.
async fn own_user(client: &Client) -> Result<String, kube::Error> {
    let reviews: Api<SelfSubjectReview> = Api::all(client.clone());
    let review = reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    Ok(review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .unwrap_or_default())
}

/// Whether nudges from this replica are taken by the match conditions (an unanswered review:
/// assumed so, the configured user is the ServiceAccount's).
async fn identity_matches(client: &Client, nudger: &str) -> bool {
    match own_user(client).await {
        Ok(user) if user == nudger => true,
        Ok(user) => {
            tracing::warn!(
                %user,
                expected = nudger,
                "not nudging nodes: this replica is not the user the node webhook's match \
                 conditions take (serve --service-account); policy changes reach unchanged \
                 nodes only at their kubelet's next report"
            );
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "SelfSubjectReview failed; nudging as configured");
            true
        }
    }
}

/// Send the nudges that are due, as far as the rate and `IN_FLIGHT` allow; when to look again.
fn send_due(
    state: &mut State,
    bucket: &mut Bucket,
    in_flight: &mut JoinSet<(String, Result<(), kube::Error>)>,
    nodes: &Api<Node>,
    claim: &Claim,
) -> Option<Instant> {
    let now = Instant::now();
    while in_flight.len() < IN_FLIGHT {
        let name = state.backlog.due(now)?.to_string();
        match bucket.take(now) {
            Ok(()) => {}
            Err(Some(wait)) => return Some(now + wait),
            Err(None) => return None,
        }
        if claim.check().is_err() {
            return None;
        }
        state.backlog.nudged(&name, now);
        let api = nodes.clone();
        in_flight.spawn(async move {
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            let patch = Patch::Merge(serde_json::json!({"status": {}}));
            let result =
                tokio::time::timeout(NUDGE_TIMEOUT, api.patch_status(&name, &params, &patch))
                    .await
                    .unwrap_or_else(|_| Err(kube::Error::Service("nudge timed out".into())));
            (name, result.map(|_| ()))
        });
    }
    None
}

/// Nudge until aborted (leadership lost). Watch errors are retried with backoff.
pub async fn run(
    client: Client,
    policies: PolicyStore,
    claim: Claim,
    settings: NudgeSettings,
    metrics: NudgeMetrics,
) {
    if settings.rate <= 0.0 {
        tracing::info!("nudges off (--nudge-rate=0)");
        return;
    }
    if !identity_matches(&client, &settings.nudger).await {
        return;
    }
    let nodes: Api<Node> = Api::all(client);
    let config = watcher::Config::default().page_size(LIST_PAGE_SIZE);
    let mut events = std::pin::pin!(watcher(nodes.clone(), config).default_backoff());
    let mut bucket = Bucket::new(settings.rate, BURST, Instant::now());
    let mut in_flight = JoinSet::new();
    let mut state = State {
        nodes: BTreeMap::new(),
        relisted: None,
        backlog: Backlog::default(),
        judged_by: None,
        metrics: metrics.clone(),
    };
    tracing::info!(rate = settings.rate, nudger = %settings.nudger, "nudging nodes out of date with the policies");
    loop {
        state.policies(&policies, Instant::now());
        let wake = send_due(&mut state, &mut bucket, &mut in_flight, &nodes, &claim)
            .or_else(|| state.backlog.next_due())
            .map_or(Instant::now() + TICK, |t| t.min(Instant::now() + TICK));
        metrics
            .out_of_date
            .set(i64::try_from(state.backlog.len()).unwrap_or(i64::MAX));
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(event)) => state.event(event, Instant::now()),
                Some(Err(e)) => tracing::warn!(error = %e, "node watch failed; retrying"),
                None => return,
            },
            _ = policies.published() => {}
            Some(done) = in_flight.join_next(), if !in_flight.is_empty() => match done {
                Ok((_, Ok(()))) => metrics.count("sent"),
                Ok((node, Err(e))) => {
                    metrics.count("failed");
                    tracing::warn!(%node, error = %e, "nudge failed");
                }
                Err(e) => {
                    metrics.count("failed");
                    tracing::warn!(error = %e, "nudge task failed");
                }
            },
            _ = tokio::time::sleep_until(tokio::time::Instant::from_std(wake)) => {}
        }
    }
}
