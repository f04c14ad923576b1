//! Leader only: memory relief (`spec.eviction`; docs/policy.md "Memory relief"). Every
//! `--usage-interval`, while a policy with `spec.eviction` is in force: the nodes are listed,
//! each node whose winning policy has `spec.eviction` is judged against its latest NodeMetrics
//! sample from the usage caches' poller (`sources::usage`, which runs while such a policy is
//! in force) (`overcommit_core::eviction::need`); for a node above its critical watermark, its
//! pods (`fieldSelector=spec.nodeName`) and the cluster's PodMetrics are read, ranked
//! (`eviction::rank`), and evicted through the Eviction API (policy/v1, so
//! PodDisruptionBudgets hold: a 429 moves on to the next candidate) until the node's allowance
//! (`eviction::allowance`: maxPodsPerNode per interval) is spent. With `dryRun`, the same
//! requests go with `dryRun=All`: the API server answers as it would (a PDB refusal included)
//! and evicts nothing. Every decision is an Event on the pod and on the node, a log line and a metric.
//!
//! The allowance is kept by this leader only: a new leader starts with a fresh window, so
//! across a leader change a node loses at most 2 x maxPodsPerNode pods in one interval.
//!
//! Its client does not retry (kube's default retries 429 and 503 with a growing backoff: a
//! refused eviction must move on at once): a variant of `serve`'s one configuration.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, EvictParams, ListParams, PostParams, Preconditions,
};
use kube::{Api, Client};
use overcommit_core::eviction::{self, Measured, Need, PodFacts, Ranked};
use overcommit_core::policy::{CompiledEviction, NodeChoice, PolicySet};
use overcommit_core::pressure::Polled;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::election::Claim;
use crate::events::{Note, Recorder, node_ref};
use crate::relief::{explain, pod_memory, pods_facts, raw_memory};
use crate::sources::usage::UsageCaches;
use crate::sources::{PolicyStore, list_pages};

/// A sample older than its window plus this many polls is stale (as the usage rule's).
const STALE_POLLS: u32 = 3;

/// What the relief loop needs besides the client.
#[derive(Clone, Debug)]
pub struct ReliefSettings {
    /// How often nodes are judged (`serve --usage-interval`).
    pub interval: Duration,
    /// Namespaces whose pods are never evicted: those the webhooks exempt.
    pub exempt_namespaces: Vec<String>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `evicted`, `refused_pdb`, `failed`, `dry_run`.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// `metrics_failing`, `no_sample`, `stale`, `no_raw`, `no_candidate`, `rate_limited`.
    pub reason: String,
}

/// `kube_overcommit_relief_evictions_total{result}`, `kube_overcommit_relief_skipped_total
/// {reason}`, `kube_overcommit_relief_nodes_above_critical`.
#[derive(Clone, Debug)]
pub struct EvictionMetrics {
    pub evictions: Family<ResultLabels, Counter>,
    pub skipped: Family<ReasonLabels, Counter>,
    pub above_critical: Gauge,
}

impl EvictionMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self {
            evictions: Family::default(),
            skipped: Family::default(),
            above_critical: Gauge::default(),
        };
        registry.register(
            "relief_evictions",
            "Leader: memory relief evictions by result (evicted, refused_pdb, failed, dry_run)",
            m.evictions.clone(),
        );
        registry.register(
            "relief_skipped",
            "Leader: nodes of spec.eviction policies not relieved in a round, by reason (usage \
             unknown: metrics_failing, no_sample, stale, no_raw; no_candidate; rate_limited)",
            m.skipped.clone(),
        );
        registry.register(
            "relief_nodes_above_critical",
            "Leader: nodes whose memory usage is above their policy's spec.eviction.memoryCritical",
            m.above_critical.clone(),
        );
        m
    }

    fn evicted(&self, result: &str) {
        self.evictions
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    fn skipped(&self, reason: &str) {
        self.skipped
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc();
    }

    /// Leadership lost: another replica judges the nodes now.
    pub fn clear(&self) {
        self.above_critical.set(0);
    }
}

/// What the relief loop reads and reports through, besides its settings.
#[derive(Clone)]
pub struct ReliefContext {
    pub metrics: EvictionMetrics,
    /// `serve`'s client without retries, or why there is none.
    pub client: Result<Client, String>,
    /// The usage caches: the nodes' latest samples.
    pub usage: Arc<UsageCaches>,
}

/// The relief loop, until aborted (leadership lost).
pub async fn run(
    policies: PolicyStore,
    claim: Claim,
    settings: ReliefSettings,
    context: ReliefContext,
    events: Recorder,
) {
    let mut tick = tokio::time::interval(settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut client_error_logged = false;
    let mut relief = Relief {
        claim,
        settings,
        metrics: context.metrics,
        usage: context.usage,
        events,
        done: HashMap::new(),
    };
    loop {
        tick.tick().await;
        let set = policies.current();
        if !set.has_eviction() {
            relief.metrics.above_critical.set(0);
            relief.done.clear();
            continue;
        }
        let client = match &context.client {
            Ok(c) => c,
            Err(e) => {
                if !client_error_logged {
                    tracing::error!(error = %e, "memory relief: no API client");
                    client_error_logged = true;
                }
                continue;
            }
        };
        if let Err(e) = relief.round(client, &set).await {
            tracing::warn!(error = %e, "memory relief: listing nodes failed; nothing evicted this round");
        }
    }
}

/// The loop's state: evictions done per node (ms since the epoch), for the allowance.
struct Relief {
    claim: Claim,
    settings: ReliefSettings,
    metrics: EvictionMetrics,
    usage: Arc<UsageCaches>,
    events: Recorder,
    done: HashMap<String, Vec<i64>>,
}

/// A node above its critical watermark.
struct Hot<'a> {
    node: &'a Node,
    name: String,
    eviction: &'a CompiledEviction,
    need: Need,
}

fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

impl Relief {
    /// One round over every node.
    async fn round(&mut self, client: &Client, set: &PolicySet) -> Result<(), kube::Error> {
        let nodes: Vec<Node> = list_pages(Api::all(client.clone())).await?;
        let governed: Vec<(&Node, &CompiledEviction)> = nodes
            .iter()
            .filter_map(|n| match set.for_node(&n.metadata.labels) {
                NodeChoice::Policy(p) => p.eviction.as_ref().map(|e| (n, e)),
                _ => None,
            })
            .collect();
        if governed.is_empty() {
            self.metrics.above_critical.set(0);
            return Ok(());
        }
        let now = now_ms();
        let mut hot = Vec::new();
        let mut failing_logged = false;
        for (node, eviction) in governed {
            let name = node.metadata.name.clone().unwrap_or_default();
            let (measured, window_ms) = measured(&self.usage.polled(&name));
            if measured == Measured::Failing && !failing_logged {
                tracing::warn!(
                    "memory relief: metrics.k8s.io failing or not polled yet: nothing evicted"
                );
                failing_logged = true;
            }
            let max_age = self.settings.interval.as_millis() as i64 * i64::from(STALE_POLLS)
                + window_ms as i64;
            let need = eviction::need(
                raw_memory(node),
                measured,
                eviction.memory_critical.value,
                now,
                max_age,
            );
            match need {
                Need::Unknown(why) => self.metrics.skipped(why.as_str()),
                Need::Fine { .. } => {}
                Need::Relieve { .. } => hot.push(Hot {
                    node,
                    name,
                    eviction,
                    need,
                }),
            }
        }
        self.metrics
            .above_critical
            .set(i64::try_from(hot.len()).unwrap_or(i64::MAX));
        if hot.is_empty() {
            return Ok(());
        }
        let usage = pod_usage(client).await;
        for h in hot {
            if let Err(e) = self.relieve(client, &h, &usage).await {
                tracing::warn!(node = %h.name, error = %e, "memory relief: listing the node's pods failed");
            }
        }
        Ok(())
    }

    /// Evict from one hot node, up to its allowance.
    async fn relieve(
        &mut self,
        client: &Client,
        hot: &Hot<'_>,
        usage: &HashMap<(String, String), u128>,
    ) -> Result<(), kube::Error> {
        let now = now_ms();
        let interval_ms = hot.eviction.interval.as_millis() as i64;
        let done = self.done.entry(hot.name.clone()).or_default();
        done.retain(|at| now.saturating_sub(*at) < interval_ms);
        let mut allowance =
            eviction::allowance(done, now, interval_ms, hot.eviction.max_pods_per_node);
        if allowance == 0 {
            self.metrics.skipped("rate_limited");
            return Ok(());
        }
        let params = ListParams::default().fields(&format!("spec.nodeName={}", hot.name));
        let pods = Api::<Pod>::all(client.clone()).list(&params).await?.items;
        let facts = pods_facts(&pods, usage);
        let raw = raw_memory(hot.node).unwrap_or(0);
        let ranked = eviction::rank(&facts, raw, &self.settings.exempt_namespaces);
        tracing::info!(node = %hot.name, account = %explain(&hot.name, hot.need, &ranked).join("\n"), "memory relief: node above its critical watermark");
        let mut chosen = 0;
        for candidate in ranked.iter().filter(|r| r.spared.is_none()) {
            if allowance == 0 {
                break;
            }
            if self.evict(client, hot, candidate).await {
                allowance -= 1;
                chosen += 1;
                self.done
                    .entry(hot.name.clone())
                    .or_default()
                    .push(now_ms());
            }
        }
        if chosen == 0 {
            self.metrics.skipped("no_candidate");
            self.note(
                &hot.name,
                None,
                "ReliefNoCandidate",
                format!(
                    "memory above {} of raw: no pod could be evicted",
                    hot.eviction.memory_critical.text
                ),
            );
        }
        Ok(())
    }

    /// Evict one candidate; with dryRun, the same request with `dryRun=All` (the API server
    /// checks PodDisruptionBudgets and changes nothing). Whether it counts toward the
    /// allowance.
    async fn evict(&self, client: &Client, hot: &Hot<'_>, candidate: &Ranked<'_>) -> bool {
        let pod = candidate.pod;
        let dry_run = hot.eviction.dry_run;
        let why = format!(
            "memory above {} of raw on node {}; {}",
            hot.eviction.memory_critical.text,
            hot.name,
            eviction::describe(candidate)
        );
        if self.claim.check().is_err() {
            return false;
        }
        let params = EvictParams {
            delete_options: Some(DeleteParams {
                dry_run,
                preconditions: Some(Preconditions {
                    uid: Some(pod.uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            }),
            post_options: PostParams {
                dry_run,
                ..PostParams::default()
            },
        };
        let api = Api::<Pod>::namespaced(client.clone(), &pod.namespace);
        let at = format!("{}/{}", pod.namespace, pod.name);
        let (result, reason, text, counts) = match api.evict(&pod.name, &params).await {
            Ok(_) if dry_run => {
                tracing::info!(pod = %at, %why, "memory relief (dry run): would evict");
                (
                    "dry_run",
                    "ReliefWouldEvict",
                    format!("dry run, would evict: {why}"),
                    true,
                )
            }
            Ok(_) => {
                tracing::warn!(pod = %at, %why, "memory relief: evicted");
                ("evicted", "ReliefEvicted", format!("evicted: {why}"), true)
            }
            Err(kube::Error::Api(status)) if status.code == 429 => {
                tracing::info!(pod = %at, message = %status.message, dry_run, "memory relief: eviction refused (PodDisruptionBudget); trying the next candidate");
                let text = format!("eviction refused: {}; {why}", status.message);
                ("refused_pdb", "ReliefEvictionRefused", text, false)
            }
            Err(e) => {
                tracing::warn!(pod = %at, error = %e, dry_run, "memory relief: eviction failed; trying the next candidate");
                let text = format!("eviction failed: {e}; {why}");
                ("failed", "ReliefEvictionFailed", text, false)
            }
        };
        self.metrics.evicted(result);
        self.note(&hot.name, Some(pod), reason, text);
        counts
    }

    /// An Event on the pod (if any) and on the node.
    fn note(&self, node: &str, pod: Option<&PodFacts>, reason: &'static str, text: String) {
        let warning = reason != "ReliefWouldEvict";
        if let Some(pod) = pod {
            self.events.emit(Note {
                regarding: pod_ref(pod),
                warning,
                reason,
                action: "Evict",
                note: text.clone(),
            });
        }
        let on_node = match pod {
            Some(pod) => format!("{}/{}: {text}", pod.namespace, pod.name),
            None => text,
        };
        self.events.emit(Note {
            regarding: node_ref(node),
            warning,
            reason,
            action: "Evict",
            note: on_node,
        });
    }
}

fn pod_ref(pod: &PodFacts) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(pod.namespace.clone()),
        name: Some(pod.name.clone()),
        uid: Some(pod.uid.clone()),
        ..Default::default()
    }
}

/// A node's memory sample from the polls, and its window (ms). Not polled yet counts as
/// failing: nothing is evicted on what was never measured.
fn measured(polled: &Polled) -> (Measured, u64) {
    if !polled.synced || polled.metrics_failing {
        return (Measured::Failing, 0);
    }
    match polled.sample {
        Some(sample) => (
            Measured::Sample {
                bytes: u128::from(sample.memory_bytes),
                at_ms: sample.at_ms,
            },
            sample.window_ms,
        ),
        None => (Measured::Missing, 0),
    }
}

/// Every pod's memory from metrics.k8s.io (one cluster-wide list); empty when it fails, so
/// that the ranking goes on without usage (its last key).
async fn pod_usage(client: &Client) -> HashMap<(String, String), u128> {
    let resource = ApiResource {
        group: "metrics.k8s.io".into(),
        version: "v1beta1".into(),
        api_version: "metrics.k8s.io/v1beta1".into(),
        kind: "PodMetrics".into(),
        plural: "pods".into(),
    };
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    match list_pages(api).await {
        Ok(listed) => listed
            .iter()
            .filter_map(|m| serde_json::to_value(m).ok())
            .filter_map(|v| pod_memory(&v))
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "memory relief: listing pods.metrics.k8s.io failed: ranking without usage");
            HashMap::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use overcommit_core::node::history::Sample;

    #[test]
    fn measured_only_from_a_synced_successful_poll() {
        let sample = Sample {
            at_ms: 1_000,
            window_ms: 10_000,
            cpu_millis: 5,
            memory_bytes: 7,
        };
        let polled = |synced, metrics_failing, sample| Polled {
            synced,
            metrics_failing,
            sample,
            poll_interval_ms: 30_000,
        };
        let cases = [
            (polled(false, false, Some(sample)), (Measured::Failing, 0)),
            (polled(true, true, Some(sample)), (Measured::Failing, 0)),
            (polled(true, false, None), (Measured::Missing, 0)),
            (
                polled(true, false, Some(sample)),
                (
                    Measured::Sample {
                        bytes: 7,
                        at_ms: 1_000,
                    },
                    10_000,
                ),
            ),
        ];
        for (polled, want) in cases {
            assert_eq!(measured(&polled), want, "{polled:?}");
        }
    }
}
