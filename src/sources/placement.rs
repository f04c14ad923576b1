//! The node cache and pod index behind `/validate` (`--request-cap`), fed by two kube-runtime
//! watchers: every Node, and every pod not yet terminal (field selector
//! `status.phase!=Succeeded,status.phase!=Failed`, so a pod that finishes arrives as a delete).
//! The state and the ledger are `placement::state`; this file is the I/O.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use crate::placement::state::{PlacementState, node_facts};
use crate::placement::{NodeFacts, PlacementSource, PodFacts};
use crate::shutdown::Signal;

/// The watched state, shared by the watchers and the handler.
#[derive(Debug, Clone, Default)]
pub struct WatchedPlacement {
    state: Arc<Mutex<PlacementState>>,
}

impl WatchedPlacement {
    fn lock(&self) -> MutexGuard<'_, PlacementState> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // matters more than failing open; keep serving.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl PlacementSource for WatchedPlacement {
    fn node(&self, name: &str) -> Option<NodeFacts> {
        self.lock().node(name)
    }
    fn pod(&self, namespace: &str, name: &str) -> Option<PodFacts> {
        self.lock().pod(namespace, name)
    }
    fn requested(
        &self,
        node: &str,
        namespace: &str,
        name: &str,
    ) -> std::collections::BTreeMap<String, u128> {
        self.lock().requested(node, namespace, name, Instant::now())
    }
    fn allowed(
        &self,
        namespace: &str,
        name: &str,
        node: &str,
        requests: &std::collections::BTreeMap<String, u128>,
    ) {
        self.lock()
            .allowed(namespace, name, node, requests, Instant::now());
    }
}

/// Watch nodes and pods until `shutdown` says stop.
pub async fn run(client: kube::Client, placement: WatchedPlacement, shutdown: Signal) {
    let nodes = watch_nodes(Api::all(client.clone()), placement.clone());
    let pods = watch_pods(Api::all(client), placement);
    tokio::select! {
        () = nodes => {}
        () = pods => {}
        _ = shutdown.stopped() => {}
    }
}

async fn watch_nodes(api: Api<Node>, placement: WatchedPlacement) {
    let mut events =
        std::pin::pin!(watcher::watcher(api, watcher::Config::default()).default_backoff());
    let mut listing: Option<HashMap<String, NodeFacts>> = None;
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "watching nodes for the request cap failed; retrying");
                continue;
            }
        };
        let unreadable = |e: &dyn std::error::Error| {
            tracing::warn!(error = %e, "node left out of the request cap's cache (its placements are allowed)");
        };
        match event {
            Event::Init => listing = Some(HashMap::new()),
            Event::InitApply(node) => match (node_facts(&node), listing.as_mut()) {
                (Ok(facts), Some(listing)) => {
                    listing.insert(node.name_any(), facts);
                }
                (Err(e), _) => unreadable(&e),
                (Ok(_), None) => {}
            },
            Event::InitDone => {
                if let Some(listing) = listing.take() {
                    placement.lock().replace_nodes(listing);
                }
            }
            Event::Apply(node) => {
                if let Err(e) = placement.lock().apply_node(&node) {
                    unreadable(&e);
                }
            }
            Event::Delete(node) => placement.lock().delete_node(&node.name_any()),
        }
    }
}

async fn watch_pods(api: Api<Pod>, placement: WatchedPlacement) {
    let config = watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed");
    let mut events = std::pin::pin!(watcher::watcher(api, config).default_backoff());
    let mut listing: Option<Vec<Pod>> = None;
    let unreadable = |e: &dyn std::error::Error| {
        tracing::warn!(error = %e, "pod left out of the request cap's index (its placements are allowed)");
    };
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "watching pods for the request cap failed; retrying");
                continue;
            }
        };
        match event {
            Event::Init => listing = Some(Vec::new()),
            Event::InitApply(pod) => {
                if let Some(listing) = listing.as_mut() {
                    listing.push(pod);
                }
            }
            Event::InitDone => {
                if let Some(listing) = listing.take() {
                    let errors = placement.lock().replace_pods(&listing);
                    for e in &errors {
                        unreadable(e);
                    }
                    tracing::info!(pods = listing.len(), "request cap's pod index listed");
                }
            }
            Event::Apply(pod) => {
                if let Err(e) = placement.lock().apply_pod(&pod) {
                    unreadable(&e);
                }
            }
            Event::Delete(pod) => {
                let namespace = pod.namespace().unwrap_or_default();
                placement.lock().delete_pod(&namespace, &pod.name_any());
            }
        }
    }
}
