//! Policies from the OvercommitPolicy custom resources, through a kube-runtime watcher.
//!
//! Each object is validated on its own. An object that fails validation is refused with a log
//! line and a metric; if an earlier version of the same object was valid, that version stays
//! in use (an edit with a typo does not suddenly return every node to its raw value), and a
//! new object that was never valid is not applied. Deleting an object removes it. The set is
//! rebuilt from the valid versions after every change, never half-applied. The store is
//! marked synced after the first complete list.

use std::collections::BTreeMap;

use super::PolicyStore;
use super::metrics::PolicySourceLabel;
use crate::metrics::ReloadResult;
use crate::shutdown::Signal;
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use overcommit_core::policy::{OvercommitPolicy, PolicySet};

/// The valid version in use for each object name.
#[derive(Default)]
pub struct CrdState {
    in_use: BTreeMap<String, OvercommitPolicy>,
    /// Objects listed since the last `Init`, before `InitDone` makes them current.
    listing: Option<BTreeMap<String, OvercommitPolicy>>,
}

/// What applying an event did (for logs and tests).
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    /// The set of valid policies changed or was (re)listed: rebuild.
    Rebuild,
    /// Nothing to publish (listing in progress, or a refused object with no effect).
    Nothing,
}

impl CrdState {
    /// Apply one watcher event; returns whether the published set must be rebuilt.
    /// `refused` is called with each object that fails validation and its reason.
    pub fn apply(
        &mut self,
        event: Event<OvercommitPolicy>,
        refused: &mut dyn FnMut(&str, &str),
    ) -> Applied {
        match event {
            Event::Init => {
                self.listing = Some(BTreeMap::new());
                Applied::Nothing
            }
            Event::InitApply(p) => {
                let name = p.name_any();
                let keep = match validate(&p) {
                    Ok(()) => Some(p),
                    Err(reason) => {
                        refused(&name, &reason);
                        self.in_use.get(&name).cloned()
                    }
                };
                if let (Some(listing), Some(p)) = (self.listing.as_mut(), keep) {
                    listing.insert(name, p);
                }
                Applied::Nothing
            }
            Event::InitDone => {
                if let Some(listing) = self.listing.take() {
                    self.in_use = listing;
                }
                Applied::Rebuild
            }
            Event::Apply(p) => {
                let name = p.name_any();
                // A status write by the leader (or a label edit) changes neither the spec nor
                // the generation the node rule records: nothing to rebuild.
                if self.in_use.get(&name).is_some_and(|old| same_rule(old, &p)) {
                    return Applied::Nothing;
                }
                match validate(&p) {
                    Ok(()) => {
                        self.in_use.insert(name, p);
                        Applied::Rebuild
                    }
                    Err(reason) => {
                        refused(&name, &reason);
                        Applied::Nothing
                    }
                }
            }
            Event::Delete(p) => {
                if self.in_use.remove(&p.name_any()).is_some() {
                    Applied::Rebuild
                } else {
                    Applied::Nothing
                }
            }
        }
    }

    pub fn build(&self) -> Result<PolicySet, overcommit_core::policy::PolicyError> {
        PolicySet::new(self.in_use.values().cloned().collect())
    }
}

/// Whether two versions of an object give the same compiled policy: the same spec and
/// generation (the generation is recorded in the nodes' applied annotation), and the same
/// staged rollout progress (`status.rollout`: which nodes are admitted).
fn same_rule(a: &OvercommitPolicy, b: &OvercommitPolicy) -> bool {
    let rollout = |p: &OvercommitPolicy| p.status.as_ref().and_then(|s| s.rollout.clone());
    a.spec == b.spec && a.metadata.generation == b.metadata.generation && rollout(a) == rollout(b)
}

fn validate(p: &OvercommitPolicy) -> Result<(), String> {
    PolicySet::new(vec![p.clone()])
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Watch every OvercommitPolicy until `shutdown` says stop.
pub async fn run(client: kube::Client, store: PolicyStore, shutdown: Signal) {
    let api: Api<OvercommitPolicy> = Api::all(client);
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    let mut state = CrdState::default();
    loop {
        let event = tokio::select! {
            e = events.next() => e,
            _ = shutdown.stopped() => return,
        };
        let event = match event {
            Some(Ok(e)) => e,
            Some(Err(e)) => {
                // The watcher retries with backoff; the last good set stays in use.
                tracing::warn!(error = %e, "watching OvercommitPolicy failed; retrying");
                store.count(PolicySourceLabel::crd, ReloadResult::error);
                continue;
            }
            None => return,
        };
        let metrics = store.metrics.clone();
        let mut refused = |name: &str, reason: &str| {
            metrics.refused.inc();
            tracing::error!(policy = name, %reason, "OvercommitPolicy refused; not applied (an earlier valid version, if any, stays in use)");
        };
        if state.apply(event, &mut refused) == Applied::Rebuild {
            match state.build() {
                Ok(set) => {
                    tracing::info!(policies = set.len(), "policies updated from the API server");
                    store.publish(set, PolicySourceLabel::crd);
                }
                Err(e) => {
                    store.count(PolicySourceLabel::crd, ReloadResult::error);
                    tracing::error!(error = %e, "policy set refused; keeping the last good policies");
                }
            }
        }
    }
}

fn watcher(
    api: Api<OvercommitPolicy>,
    cfg: watcher::Config,
) -> impl futures::Stream<Item = Result<Event<OvercommitPolicy>, watcher::Error>> {
    watcher::watcher(api, cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use overcommit_core::policy::OvercommitPolicySpec;

    fn policy(name: &str, priority: i32) -> OvercommitPolicy {
        OvercommitPolicy::new(
            name,
            OvercommitPolicySpec {
                priority,
                ..Default::default()
            },
        )
    }

    fn with_ratio(name: &str, cpu: &str) -> OvercommitPolicy {
        let mut p = policy(name, 1);
        p.spec.node_ratios.insert("cpu".into(), cpu.into());
        p
    }

    #[test]
    fn invalid_objects_are_refused_and_the_valid_version_stays() {
        let mut s = CrdState::default();
        let mut refused = Vec::new();
        let mut note = |name: &str, reason: &str| refused.push(format!("{name}: {reason}"));
        s.apply(Event::Init, &mut note);
        s.apply(Event::InitApply(with_ratio("a", "2")), &mut note);
        s.apply(Event::InitApply(with_ratio("bad-new", "50")), &mut note);
        assert_eq!(s.apply(Event::InitDone, &mut note), Applied::Rebuild);
        assert_eq!(s.in_use.keys().collect::<Vec<_>>(), vec!["a"]);
        // A broken edit of "a" keeps its valid version, also across a relist.
        assert_eq!(
            s.apply(Event::Apply(with_ratio("a", "0.5")), &mut note),
            Applied::Nothing
        );
        s.apply(Event::Init, &mut note);
        s.apply(Event::InitApply(with_ratio("a", "0.5")), &mut note);
        s.apply(Event::InitDone, &mut note);
        assert_eq!(s.in_use["a"].spec.node_ratios["cpu"], "2");
        assert_eq!(refused.len(), 3, "{refused:?}");
        assert!(refused[0].starts_with("bad-new: "), "{refused:?}");
        assert_eq!(s.build().map(|p| p.len()).ok(), Some(1));
    }

    /// The leader's status writes change an object but not its rule: no rebuild for them, one
    /// for a new generation.
    #[test]
    fn a_status_write_rebuilds_nothing() {
        let mut s = CrdState::default();
        let mut refused = |_: &str, _: &str| panic!("nothing refused");
        let mut a = with_ratio("a", "2");
        a.metadata.generation = Some(1);
        assert_eq!(
            s.apply(Event::Apply(a.clone()), &mut refused),
            Applied::Rebuild
        );
        let mut with_status = a.clone();
        with_status.status = Some(Default::default());
        with_status.metadata.resource_version = Some("2".into());
        assert_eq!(
            s.apply(Event::Apply(with_status), &mut refused),
            Applied::Nothing
        );
        let mut next = with_ratio("a", "2");
        next.metadata.generation = Some(2);
        assert_eq!(s.apply(Event::Apply(next), &mut refused), Applied::Rebuild);
        assert_eq!(s.in_use["a"].metadata.generation, Some(2));
    }

    #[test]
    fn listing_replaces_state_only_when_done() {
        let mut s = CrdState::default();
        let mut refused = |_: &str, _: &str| panic!("nothing refused");
        assert_eq!(s.apply(Event::Init, &mut refused), Applied::Nothing);
        assert_eq!(
            s.apply(Event::InitApply(policy("a", 1)), &mut refused),
            Applied::Nothing
        );
        assert_eq!(s.in_use.len(), 0);
        assert_eq!(s.apply(Event::InitDone, &mut refused), Applied::Rebuild);
        assert_eq!(s.in_use.len(), 1);
        assert_eq!(
            s.apply(Event::Apply(policy("b", 2)), &mut refused),
            Applied::Rebuild
        );
        assert_eq!(
            s.apply(Event::Delete(policy("a", 1)), &mut refused),
            Applied::Rebuild
        );
        assert_eq!(
            s.apply(Event::Delete(policy("zz", 1)), &mut refused),
            Applied::Nothing
        );
        assert_eq!(s.in_use.keys().collect::<Vec<_>>(), vec!["b"]);
        // A relist drops objects that disappeared meanwhile.
        s.apply(Event::Init, &mut refused);
        s.apply(Event::InitApply(policy("c", 1)), &mut refused);
        s.apply(Event::InitDone, &mut refused);
        assert_eq!(s.in_use.keys().collect::<Vec<_>>(), vec!["c"]);
        assert_eq!(s.build().map(|p| p.len()).ok(), Some(1));
    }
}
