//! Where policies come from: a watched YAML file (`--policy-file`), or the OvercommitPolicy
//! custom resources through a kube-runtime watcher. Both publish a complete, validated
//! [`PolicySet`] into one `ArcSwap`, which reviews read without a lock.

pub mod crd;
pub mod file;
pub mod metrics;
pub mod node_metrics;
pub mod placement;
pub mod pod_cache;
pub mod pods;
pub mod usage;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use kube::api::{Api, ListParams, ObjectList};
use serde::de::DeserializeOwned;

use self::metrics::{PolicyMetrics, PolicyReloadLabels, PolicySourceLabel};
use crate::metrics::ReloadResult;
use crate::probes::ReadyFlag;
use overcommit_core::policy::PolicySet;

/// Flags choosing the policy source.
#[derive(Debug, Clone, clap::Args)]
pub struct SourceArgs {
    /// YAML file of OvercommitPolicy documents, reloaded when it changes. Without it, the
    /// OvercommitPolicy resources are watched through the API server (in-cluster config or
    /// KUBECONFIG).
    #[arg(long, env = "KUBE_OVERCOMMIT_POLICY_FILE")]
    pub policy_file: Option<PathBuf>,

    /// Re-read the policy file this often even without a change notification.
    #[arg(long, env = "KUBE_OVERCOMMIT_POLICY_RELOAD_INTERVAL", default_value = "10s",
          value_parser = crate::duration::duration_arg)]
    pub policy_reload_interval: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// `serve` has no client: why (the text of the client's own error).
    #[error("connecting to the API server (in-cluster config or KUBECONFIG): {0}")]
    NoCluster(String),
}

/// The current policy set and whether the first complete set has been published.
#[derive(Clone)]
pub struct PolicyStore {
    current: Arc<ArcSwap<PolicySet>>,
    synced: ReadyFlag,
    metrics: PolicyMetrics,
    /// Woken at every publish (the leader rebuilds the compiled policy at once).
    published: Arc<tokio::sync::Notify>,
}

impl PolicyStore {
    /// `synced` is the readiness condition that turns true with the first published set.
    pub fn new(metrics: PolicyMetrics, synced: ReadyFlag) -> Self {
        Self {
            current: Arc::new(ArcSwap::from_pointee(PolicySet::default())),
            synced,
            metrics,
            published: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// Resolves at the next publish (of a set, changed or not).
    pub async fn published(&self) {
        self.published.notified().await;
    }

    /// The shared cell the server reads.
    pub fn cell(&self) -> Arc<ArcSwap<PolicySet>> {
        self.current.clone()
    }

    pub fn current(&self) -> Arc<PolicySet> {
        self.current.load_full()
    }

    pub fn is_synced(&self) -> bool {
        self.synced.get()
    }

    fn publish(&self, set: PolicySet, source: PolicySourceLabel) {
        let n = set.len();
        self.current.store(Arc::new(set));
        self.metrics.loaded.set(n as i64);
        self.count(source, ReloadResult::success);
        self.synced.set(true);
        self.published.notify_waiters();
    }

    fn count(&self, source: PolicySourceLabel, result: ReloadResult) {
        self.metrics
            .reloads
            .get_or_create(&PolicyReloadLabels { source, result })
            .inc();
    }
}

/// Objects listed per page, so that a large cluster is listed in bounded pieces.
pub const PAGE: u32 = 500;

/// Every object of `api`, page by page.
pub async fn list_pages<K>(api: Api<K>) -> Result<Vec<K>, kube::Error>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page: ObjectList<K> = api.list(&params).await?;
        out.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}
