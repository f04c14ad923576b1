//! The caches behind `/validate` (`--request-cap`): a node cache fed by a kube-runtime watch of
//! every Node, the shared lean pod index (`sources::pod_cache::PodCache`, fed by the one pod watch
//! of `serve`, which the usage rule reads too) and this replica's ledger
//! (`placement::ledger`). This file is the I/O and the locking.
//!
//! Locks: the ledger's mutex is taken first, then the pod index's read (check) or write (watch)
//! lock, so a pod the watch shows bound leaves the ledger in the same step as it enters its
//! node's sum. A binding check holds them for a few lookups and a pass over the ledger's entries
//! (bindings allowed in the last 30 s the watch has not shown yet); nothing is parsed or listed
//! under them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use super::pod_cache::PodCache;
use crate::placement::denials::Denials;
use crate::placement::ledger::{LEDGER_TTL, Ledger, requested_on};
use crate::placement::node::node_facts;
use crate::placement::{Allowed, NodeFacts, PlacementSource, PodFacts};
use crate::shutdown::Signal;

/// How long /validate waits for a pod its index does not hold yet (one GET), within the
/// webhook's `timeoutSeconds` (1 s at least): then the binding is allowed (fail open).
pub const POD_GET_TIMEOUT: Duration = Duration::from_millis(500);

type Nodes = HashMap<String, Arc<NodeFacts>>;

/// The node cache, the shared pod index and the ledger, and the client that reads a pod the
/// watch has not shown yet.
#[derive(Clone)]
pub struct WatchedPlacement {
    nodes: Arc<RwLock<Nodes>>,
    pods: Arc<PodCache>,
    ledger: Arc<Mutex<Ledger>>,
    client: Option<kube::Client>,
    denials: Arc<Mutex<Denials>>,
}

impl std::fmt::Debug for WatchedPlacement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchedPlacement")
            .field("pods", &self.pods)
            .field("client", &self.client.is_some())
            .finish_non_exhaustive()
    }
}

impl WatchedPlacement {
    /// No nodes and an empty ledger, over the shared pod index; pods missing from the index
    /// are read with `client` when there is one.
    pub fn new(pods: Arc<PodCache>, client: Option<kube::Client>) -> Self {
        Self {
            nodes: Arc::default(),
            pods,
            ledger: Arc::new(Mutex::new(Ledger::new(LEDGER_TTL))),
            client,
            denials: Arc::default(),
        }
    }

    /// The denials since the last report (`placement::denials::report` tells them).
    pub fn denials(&self) -> Arc<Mutex<Denials>> {
        self.denials.clone()
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // A panic while holding the lock cannot leave the ledger half-updated in a way that
        // matters more than failing open; keep serving.
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Make a change to the pod index (the pod watch) holding the ledger's lock, then drop
    /// `seen` (a pod the change shows bound, or gone) from the ledger: its requests count
    /// from its node's sum from now on.
    pub fn observe(&self, seen: Option<&str>, change: &mut dyn FnMut()) {
        let mut ledger = self.ledger();
        change();
        if let Some(key) = seen {
            ledger.seen_bound(key);
        }
    }

    /// `replace` the pod index with a full list (the pod watch's (re)list) holding the
    /// ledger's lock, then drop the ledger's pods the list shows bound.
    pub fn relisted(&self, replace: impl FnOnce()) {
        let mut ledger = self.ledger();
        replace();
        let index = self.pods.read();
        ledger.retain(|key| index.get(key).is_none_or(|p| p.node.is_none()));
    }

    fn set_nodes(&self, change: impl FnOnce(&mut Nodes)) {
        change(&mut self.nodes.write().unwrap_or_else(PoisonError::into_inner));
    }

    /// A node added or changed; an unreadable one leaves the cache (its placements fail open).
    pub fn apply_node(&self, node: &Node) -> Result<(), crate::placement::node::NodeReadError> {
        let name = node.name_any();
        let read = node_facts(node);
        self.set_nodes(|nodes| match &read {
            Ok(facts) => {
                nodes.insert(name, Arc::new(facts.clone()));
            }
            Err(_) => {
                nodes.remove(&name);
            }
        });
        read.map(|_| ())
    }
}

fn key(namespace: &str, name: &str) -> String {
    let mut key = String::with_capacity(namespace.len() + name.len() + 1);
    key.push_str(namespace);
    key.push('/');
    key.push_str(name);
    key
}

impl PlacementSource for WatchedPlacement {
    fn denied(&self, node: &str, resources: &[String]) {
        self.denials
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(node, resources);
    }

    fn node(&self, name: &str) -> Option<Arc<NodeFacts>> {
        self.nodes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }
    fn pod(&self, namespace: &str, name: &str) -> Option<PodFacts> {
        self.pods
            .read()
            .get(&key(namespace, name))
            .map(|p| PodFacts::lean(p.requested, p.exempt, p.node.is_some()))
    }
    fn requested(&self, node: &str, namespace: &str, name: &str) -> BTreeMap<String, u128> {
        let ledger = self.ledger();
        let index = self.pods.read();
        requested_on(&index, &ledger, node, &key(namespace, name), Instant::now())
    }
    fn allowed(&self, placement: &Allowed<'_>) {
        let pod = key(placement.namespace, placement.name);
        self.ledger().record(
            &pod,
            placement.node,
            placement.requests,
            placement.hold,
            Instant::now(),
        );
    }
    fn synced(&self) -> bool {
        self.pods.synced()
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
/// starts beside it over the same pod index and ledger).
pub async fn run(client: kube::Client, placement: WatchedPlacement, shutdown: Signal) {
    tokio::select! {
        () = watch_nodes(Api::all(client), placement) => {}
        _ = shutdown.stopped() => {}
    }
}

async fn watch_nodes(api: Api<Node>, placement: WatchedPlacement) {
    let mut events =
        std::pin::pin!(watcher::watcher(api, watcher::Config::default()).default_backoff());
    let mut listing: Option<Nodes> = None;
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
                    listing.insert(node.name_any(), Arc::new(facts));
                }
                (Err(e), _) => unreadable(&e),
                (Ok(_), None) => {}
            },
            Event::InitDone => {
                if let Some(listing) = listing.take() {
                    placement.set_nodes(|nodes| *nodes = listing);
                }
            }
            Event::Apply(node) => {
                if let Err(e) = placement.apply_node(&node) {
                    unreadable(&e);
                }
            }
            Event::Delete(node) => placement.set_nodes(|nodes| {
                nodes.remove(&node.name_any());
            }),
        }
    }
}
