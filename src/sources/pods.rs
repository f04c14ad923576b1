//! The one watch of pods in `serve`: every pod not yet terminal (field selector
//! `status.phase!=Succeeded,status.phase!=Failed`, so a pod that finishes arrives as a delete),
//! applied to each index that needs it: the request cap's state (`--request-cap`) and the usage
//! rule's lean pod index (`sources::usage`). One watch, whatever needs pods: the API server
//! sends each pod event to a replica once.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use overcommit_core::pod_index::PodIndex;

use super::placement::WatchedPlacement;
use super::usage::UsageCaches;

/// Where pod events go.
#[derive(Debug, Clone, Default)]
pub struct PodSinks {
    /// The request cap's node cache, pod index and ledger.
    pub placement: Option<WatchedPlacement>,
    /// The usage rule's requested sums per node.
    pub usage: Option<Arc<UsageCaches>>,
}

/// What a (re)list is building before it replaces the indexes at once.
#[derive(Default)]
struct Listing {
    placement: Option<Vec<Pod>>,
    usage: Option<PodIndex>,
}

fn unreadable(e: &dyn std::error::Error) {
    tracing::warn!(error = %e, "pod left out of the pod index (its placements are allowed; its requests are not counted)");
}

/// Watch pods until the stream ends (it does not: the watcher retries with a backoff); the
/// caller stops it with the shutdown signal.
pub async fn watch(api: Api<Pod>, sinks: PodSinks) {
    let config = watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed");
    let mut events = std::pin::pin!(watcher::watcher(api, config).default_backoff());
    let mut listing: Option<Listing> = None;
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "watching pods failed; retrying");
                continue;
            }
        };
        match event {
            Event::Init => {
                listing = Some(Listing {
                    placement: sinks.placement.as_ref().map(|_| Vec::new()),
                    usage: sinks.usage.as_ref().map(|_| PodIndex::default()),
                });
            }
            Event::InitApply(pod) => {
                let Some(listing) = listing.as_mut() else {
                    continue;
                };
                if let Some(index) = listing.usage.as_mut()
                    && let Err(e) = super::usage::apply_pod(index, &pod)
                {
                    unreadable(&e);
                }
                if let Some(pods) = listing.placement.as_mut() {
                    pods.push(pod);
                }
            }
            Event::InitDone => {
                let Some(done) = listing.take() else {
                    continue;
                };
                if let (Some(placement), Some(pods)) = (&sinks.placement, done.placement) {
                    for e in &placement.replace_pods(&pods) {
                        unreadable(e);
                    }
                    tracing::info!(pods = pods.len(), "request cap's pod index listed");
                }
                if let (Some(usage), Some(index)) = (&sinks.usage, done.usage) {
                    tracing::info!(pods = index.len(), "usage pod index listed");
                    usage.replace_pods(index);
                }
            }
            Event::Apply(pod) => {
                if let Some(placement) = &sinks.placement
                    && let Err(e) = placement.apply_pod(&pod)
                {
                    unreadable(&e);
                }
                if let Some(usage) = &sinks.usage
                    && let Err(e) = usage.apply_pod(&pod)
                {
                    unreadable(&e);
                }
            }
            Event::Delete(pod) => {
                let namespace = pod.namespace().unwrap_or_default();
                let name = pod.name_any();
                if let Some(placement) = &sinks.placement {
                    placement.delete_pod(&namespace, &name);
                }
                if let Some(usage) = &sinks.usage {
                    usage.delete_pod(&namespace, &name);
                }
            }
        }
    }
}
