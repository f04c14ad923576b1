//! The one watch of pods in `serve`, feeding the lean pod index (`sources::pod_cache`, shared
//! by the usage rule and the request cap): every pod not yet terminal (field selector
//! `status.phase!=Succeeded,status.phase!=Failed`, so a pod that finishes arrives as a delete).
//! One watch and one index, whatever needs pods: the API server sends each pod event to a
//! replica once, and each pod is held once.
//!
//! Who runs the watch: `--request-cap` runs it for as long as the replica serves
//! (`app::start_placement`); without it, the usage task runs it while a usage policy is in force
//! (`sources::usage::run`). Either way every replica runs it, leader or not: both features
//! answer reviews, which any replica serves.
//!
//! With the request cap, each pod event is applied under the cap's ledger lock
//! ([`crate::sources::placement::WatchedPlacement::observe`]): a pod the watch shows bound
//! leaves the ledger in the same step as it enters its node's sum, so a binding check never
//! counts it twice or not at all.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use overcommit_core::pod_index::{Phase, PodIndex};
use overcommit_core::quantity::QuantityError;

use super::placement::WatchedPlacement;
use super::pod_cache::{PodCache, index_pod, key, lean};

/// A pod added or changed, as the watch applies it: read (its requests counted) before any
/// lock is taken, then applied; with `placement` (`--request-cap`) under its ledger's lock,
/// dropping the pod from the ledger when it shows bound or terminal. An unreadable pod leaves
/// the index (not counted, as if it had no requests) and is returned as the error; a binding of
/// it this replica allowed keeps counting until the ledger's TTL.
pub fn apply_event(
    pods: &PodCache,
    placement: Option<&WatchedPlacement>,
    pod: &Pod,
) -> Result<(), QuantityError> {
    let key = key(pod);
    let read = lean(pod);
    let seen = read.as_ref().is_ok_and(|observed| {
        observed.node.is_some_and(|n| !n.is_empty()) || observed.phase == Phase::Terminal
    });
    let mut change = || match &read {
        Ok(observed) => pods.apply(&key, *observed),
        Err(_) => pods.delete(&key),
    };
    match placement {
        Some(placement) => placement.observe(seen.then_some(&*key), &mut change),
        None => change(),
    }
    read.map(|_| ())
}

/// A pod deleted, as the watch applies it (with `placement`: it leaves the ledger too).
pub fn delete_event(pods: &PodCache, placement: Option<&WatchedPlacement>, key: &str) {
    let mut change = || pods.delete(key);
    match placement {
        Some(placement) => placement.observe(Some(key), &mut change),
        None => change(),
    }
}

/// A full list, as the watch applies it (with `placement`: the pods it shows bound leave the
/// ledger).
pub fn relist_event(pods: &PodCache, placement: Option<&WatchedPlacement>, index: PodIndex) {
    match placement {
        Some(placement) => placement.relisted(|| pods.replace(index)),
        None => pods.replace(index),
    }
}

fn unreadable(e: &dyn std::error::Error) {
    tracing::warn!(error = %e, "pod left out of the pod index (its placements are allowed; its requests are not counted)");
}

/// Watch pods into `pods` until the stream ends (it does not: the watcher retries with a
/// backoff); the caller stops it (the shutdown signal, or aborting the task). With `placement`
/// (`--request-cap`), the cap's ledger follows ([`apply_event`], [`delete_event`],
/// [`relist_event`]).
pub async fn watch(api: Api<Pod>, pods: Arc<PodCache>, placement: Option<WatchedPlacement>) {
    let config = watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed");
    let mut events = std::pin::pin!(watcher::watcher(api, config).default_backoff());
    let mut listing: Option<PodIndex> = None;
    let placement = placement.as_ref();
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "watching pods failed; retrying");
                continue;
            }
        };
        match event {
            Event::Init => listing = Some(PodIndex::default()),
            Event::InitApply(pod) => {
                if let Some(index) = listing.as_mut()
                    && let Err(e) = index_pod(index, &pod)
                {
                    unreadable(&e);
                }
            }
            Event::InitDone => {
                if let Some(index) = listing.take() {
                    tracing::info!(pods = index.len(), "pod index listed");
                    relist_event(&pods, placement, index);
                }
            }
            Event::Apply(pod) => {
                if let Err(e) = apply_event(&pods, placement, &pod) {
                    unreadable(&e);
                }
            }
            Event::Delete(pod) => {
                let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
                delete_event(&pods, placement, &key);
            }
        }
    }
}
