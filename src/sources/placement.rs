//! The node cache and pod index behind `/validate` (`--request-cap`), fed by two kube-runtime
//! watchers: every Node, and the one pod watch of `serve` (`sources::pods`, which feeds the
//! usage pod index from the same events). The state and the ledger are `placement::state`;
//! this file is the I/O.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use crate::placement::state::{PlacementState, node_facts};
use crate::placement::{NodeFacts, PlacementSource, PodFacts};
use crate::shutdown::Signal;
use overcommit_core::quantity::QuantityError;

/// How long /validate waits for a pod its index does not hold yet (one GET), within the
/// webhook's `timeoutSeconds` (1 s at least): then the binding is allowed (fail open).
pub const POD_GET_TIMEOUT: Duration = Duration::from_millis(500);

/// The watched state, shared by the watchers and the handler, and the client that reads a pod
/// the watch has not shown yet.
#[derive(Clone, Default)]
pub struct WatchedPlacement {
    state: Arc<Mutex<PlacementState>>,
    client: Option<kube::Client>,
}

impl std::fmt::Debug for WatchedPlacement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchedPlacement")
            .field("state", &self.state)
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl WatchedPlacement {
    /// Empty state; pods missing from the index are read with `client`.
    pub fn with_client(client: kube::Client) -> Self {
        Self {
            state: Arc::default(),
            client: Some(client),
        }
    }

    fn lock(&self) -> MutexGuard<'_, PlacementState> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // matters more than failing open; keep serving.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A pod added or changed (the pod watch).
    pub fn apply_pod(&self, pod: &Pod) -> Result<(), QuantityError> {
        self.lock().apply_pod(pod)
    }

    pub fn delete_pod(&self, namespace: &str, name: &str) {
        self.lock().delete_pod(namespace, name);
    }

    /// Every pod (a watch restart's full list); the unreadable ones are returned.
    pub fn replace_pods(&self, pods: &[Pod]) -> Vec<QuantityError> {
        self.lock().replace_pods(pods)
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
    fn fetch_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<PodFacts>, String>> {
        Box::pin(async move {
            let Some(client) = self.client.clone() else {
                return Err("no API client to read the pod".to_string());
            };
            let api: Api<Pod> = Api::namespaced(client, namespace);
            let pod = tokio::time::timeout(POD_GET_TIMEOUT, api.get_opt(name))
                .await
                .map_err(|_| format!("no answer within {POD_GET_TIMEOUT:?}"))?
                .map_err(|e| e.to_string())?;
            pod.map(|p| crate::placement::pod::facts(&p).map_err(|e| e.to_string()))
                .transpose()
        })
    }
}

/// Watch nodes until `shutdown` says stop (pods come from `sources::pods`, which the app
/// starts beside it with this state as one of its sinks).
pub async fn run(client: kube::Client, placement: WatchedPlacement, shutdown: Signal) {
    tokio::select! {
        () = watch_nodes(Api::all(client), placement) => {}
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
