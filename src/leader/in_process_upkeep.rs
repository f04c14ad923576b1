//! The leader's upkeep of the compiled MutatingAdmissionPolicy and binding (`serve --mode`,
//! `--in-process-policy`): the I/O around `in_process_policy`'s pure decisions.
//!
//! - `leader`: the policy the install ships is rebuilt on every policy change and repaired on
//!   drift (an update with the resourceVersion read; the ServiceAccount has no other write on
//!   it); on the webhook path, or with no static policy left, ours is put back to the
//!   placeholder. A missing policy is reported, never created.
//! - `operator`: nothing is written; what differs from what the policies in force compile to
//!   is reported (an operator-applied policy compiled from older policies, a missing object).
//!
//! The binding is only ever read. Every replica's `in_process::keep_flag` makes the webhook
//! serve every node while either object is not the compiled one, whoever is to blame.
//!
//! With `leader`, the node webhook is narrowed to the nodes the compiled policy leaves to it
//! while the policy is in force, and the policy is rewritten only when that is safe
//! (`hand_over`): `narrowing` before the configuration is written, `seen_config` after.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use kube::api::{DynamicObject, PostParams};
use kube::{Api, Client};
use serde_json::Value;

use super::election::{Claim, NotLeader};
use super::hand_over;
use super::in_process::InProcessContext;
use super::in_process_policy::{self, Desired, ObjectState, Upkeep};
use super::metrics::LeaderMetrics;
use crate::mode::{InProcessPolicy, Path};

/// Why a step failed (logged, retried at the next tick).
#[derive(Debug, thiserror::Error)]
pub enum UpkeepError {
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("compiled admission policy object: {0}")]
    Json(#[from] serde_json::Error),
}

const POLICY: &str = "MutatingAdmissionPolicy";
const BINDING: &str = "MutatingAdmissionPolicyBinding";

/// The compiled MutatingAdmissionPolicy and binding (`serve --mode`).
pub struct Compiled {
    pub context: InProcessContext,
    pub policies: Api<DynamicObject>,
    pub bindings: Api<DynamicObject>,
    /// On the webhook path: one of ours left compiled by an earlier run was looked for
    /// (once per term as leader).
    stale_checked: AtomicBool,
    /// Each object's state as last logged (policy, binding): a change is logged once.
    logged: Mutex<[Option<ObjectState>; 2]>,
    /// The node webhook as the leader last wrote or read it.
    config: Mutex<ConfigSeen>,
}

/// The node webhook's narrowing as last written or read, and since when it has been wide.
#[derive(Debug, Default)]
struct ConfigSeen {
    narrowing: Option<String>,
    wide_since: Option<Instant>,
}

impl Compiled {
    pub fn new(client: &Client, context: InProcessContext) -> Self {
        Self {
            context,
            policies: Api::all_with(client.clone(), &in_process_policy::policy_resource()),
            bindings: Api::all_with(client.clone(), &in_process_policy::binding_resource()),
            stale_checked: AtomicBool::new(false),
            logged: Mutex::new([None, None]),
            config: Mutex::new(ConfigSeen::default()),
        }
    }

    /// The compiled objects wanted now (None: none, or none the leader writes).
    fn want(&self, name: &str) -> Option<Desired> {
        let c = &self.context;
        if c.path == Path::Webhook || !c.policies.is_synced() {
            return None;
        }
        in_process_policy::desired(
            &c.policies.current(),
            c.path,
            name,
            c.heartbeat_refresh,
            &c.nudger,
        )
    }

    /// The node webhook's narrowing to write (`hand_over::narrowing`), given the live one.
    /// Only with `--in-process-policy leader`: an operator's writes are not ordered with the
    /// leader's. A failed read widens.
    pub async fn narrowing(&self, name: &str, live: Option<&str>) -> Option<String> {
        if self.context.writer != InProcessPolicy::Leader {
            return None;
        }
        let want = self.want(name)?;
        let in_force = self.context.flag.load(Ordering::Relaxed);
        let repairable = match (
            read(&self.policies, name).await,
            read(&self.bindings, name).await,
        ) {
            (Ok(Some(_)), Ok(binding)) => {
                in_process_policy::object_state(Some(&want.binding), binding.as_ref(), false)
                    == ObjectState::Ready
            }
            _ => false,
        };
        hand_over::narrowing(Some(&want.webhook_condition), live, in_force, repairable)
            .map(String::from)
    }

    /// Record the node webhook's narrowing as it now stands (None: wide, or no configuration).
    pub fn seen_config(&self, narrowing: Option<String>) {
        let mut seen = self.config.lock().unwrap_or_else(|e| e.into_inner());
        seen.wide_since = match narrowing {
            Some(_) => None,
            None => seen.wide_since.or(Some(Instant::now())),
        };
        seen.narrowing = narrowing;
    }

    /// Whether the policy may be rewritten now (`hand_over::may_write_policy`); also whether
    /// the leader should look again soon (a rewrite waits).
    pub fn may_write(&self, name: &str) -> bool {
        let want = self.want(name);
        let seen = self.config.lock().unwrap_or_else(|e| e.into_inner());
        hand_over::may_write_policy(
            want.as_ref().map(|w| w.webhook_condition.as_str()),
            seen.narrowing.as_deref(),
            seen.wide_since,
            Instant::now(),
        )
    }

    /// One step of the upkeep. A failure is logged and retried at the next tick without
    /// holding up the rest of the loop. On the webhook path, a compiled policy of ours left by
    /// an earlier run is looked for once per term (a cluster without the API, 404, has none).
    pub async fn upkeep(
        &self,
        claim: &Claim,
        metrics: &LeaderMetrics,
        name: &str,
    ) -> Result<(), NotLeader> {
        let c = &self.context;
        let webhook_path = c.path == Path::Webhook;
        let operator = c.writer == InProcessPolicy::Operator;
        if webhook_path && (operator || self.stale_checked.load(Ordering::Relaxed)) {
            return Ok(());
        }
        // Not while the API server may still skip the webhook for nodes a rewrite would take
        // from the compiled policy (`hand_over`): the configuration is widened first.
        if !operator && !self.may_write(name) {
            tracing::debug!(
                "the compiled admission policy waits for the node webhook to be widened"
            );
            return Ok(());
        }
        // Never from an empty set before the first one is read: that would reset the policy.
        if !webhook_path && !c.policies.is_synced() {
            return Ok(());
        }
        let want = self.want(name);
        match self.keep(claim, metrics, name, want.as_ref()).await {
            Ok(()) => {
                self.stale_checked.store(webhook_path, Ordering::Relaxed);
                Ok(())
            }
            Err(UpkeepError::NotLeader(e)) => Err(e),
            Err(UpkeepError::Kube(kube::Error::Api(s))) if webhook_path && s.code == 404 => {
                tracing::debug!("no compiled admission policy to reset: the API is not served");
                self.stale_checked.store(true, Ordering::Relaxed);
                Ok(())
            }
            // The base can read it, so this is the update: a compiled policy of ours is left in
            // force without the component's grant.
            Err(UpkeepError::Kube(kube::Error::Api(s))) if webhook_path && s.code == 403 => {
                tracing::warn!(error = %s.message, "a compiled admission policy {name} of ours is still in force and the ServiceAccount may not put the placeholder back (no update grant): delete it (kubectl delete mutatingadmissionpolicy {name}) or apply deploy/components/in-process again");
                self.stale_checked.store(true, Ordering::Relaxed);
                Ok(())
            }
            Err(UpkeepError::Kube(kube::Error::Api(s))) if s.code == 403 => {
                tracing::warn!(error = %s.message, "could not keep the compiled admission policy: forbidden; --in-process-policy leader needs the grant of deploy/components/in-process (Helm inProcess.enabled): update of the MutatingAdmissionPolicy {name}; retrying");
                Ok(())
            }
            Err(e) => {
                tracing::warn!(error = %e, path = c.path.as_str(), "could not keep the compiled admission policy; retrying");
                Ok(())
            }
        }
    }

    async fn keep(
        &self,
        claim: &Claim,
        metrics: &LeaderMetrics,
        name: &str,
        want: Option<&Desired>,
    ) -> Result<(), UpkeepError> {
        if self.context.writer == InProcessPolicy::Leader {
            self.keep_policy(claim, metrics, name, want.map(|w| &w.policy))
                .await?;
        } else {
            let actual = read(&self.policies, name).await?;
            let state =
                in_process_policy::object_state(want.map(|w| &w.policy), actual.as_ref(), true);
            self.report(0, name, state);
        }
        if let Some(want) = want {
            let actual = read(&self.bindings, name).await?;
            let state =
                in_process_policy::object_state(Some(&want.binding), actual.as_ref(), false);
            self.report(1, name, state);
        }
        Ok(())
    }

    /// `--in-process-policy leader`: the policy rebuilt, repaired or put back to the
    /// placeholder, by an update of the live object only.
    async fn keep_policy(
        &self,
        claim: &Claim,
        metrics: &LeaderMetrics,
        name: &str,
        want: Option<&Value>,
    ) -> Result<(), UpkeepError> {
        let actual = read(&self.policies, name).await?;
        let placeholder = in_process_policy::placeholder(name);
        match in_process_policy::upkeep(want, &placeholder, actual.as_ref()) {
            Upkeep::Keep if want.is_some() => self.report(0, name, ObjectState::Ready),
            Upkeep::Keep => {}
            Upkeep::Missing => self.report(0, name, ObjectState::Missing),
            Upkeep::Repair(drifted) => {
                let Some(actual) = actual else {
                    return Ok(());
                };
                let target = want.unwrap_or(&placeholder);
                let repaired = serde_json::from_value::<DynamicObject>(
                    in_process_policy::repaired(&actual, target),
                )?;
                claim.check()?;
                self.policies
                    .replace(name, &PostParams::default(), &repaired)
                    .await?;
                let object = "mutating-admission-policy";
                if want.is_some() {
                    tracing::info!(%name, object, fields = ?drifted, "repaired the compiled admission policy");
                } else {
                    tracing::info!(%name, object, fields = ?drifted, "put the placeholder back into the compiled admission policy (webhook path, or no static policy)");
                }
                metrics.repair(object, "repaired");
            }
        }
        Ok(())
    }

    /// Log a change of one object's state (slot 0: the policy, 1: the binding), once.
    fn report(&self, slot: usize, name: &str, state: ObjectState) {
        let mut logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
        if logged[slot].as_ref() == Some(&state) {
            return;
        }
        let kind = if slot == 0 { POLICY } else { BINDING };
        let fix = match (self.context.writer, slot) {
            (InProcessPolicy::Operator, _) => {
                "apply `kube-overcommit compile-inprocess` output for the policies in force (--in-process-policy operator: the leader writes neither object)"
            }
            (InProcessPolicy::Leader, 0) => {
                "install it (deploy/components/in-process ships it as a placeholder, Helm inProcess.enabled): the ServiceAccount cannot create it"
            }
            (InProcessPolicy::Leader, _) => {
                "install it as `kube-overcommit compile-inprocess` prints it (deploy/components/in-process, Helm inProcess.enabled): the ServiceAccount only reads it"
            }
        };
        match &state {
            ObjectState::Missing => {
                tracing::warn!(%name, kind, fix, "the {kind} of the compiled policy is missing; until it is there the webhook serves every node")
            }
            ObjectState::Differs(fields) => {
                tracing::warn!(%name, kind, ?fields, fix, "the {kind} of the compiled policy differs from what the policies in force compile to; until it is the same the webhook serves every node")
            }
            ObjectState::Ready => {
                tracing::info!(%name, kind, "the {kind} of the compiled policy is in place")
            }
            ObjectState::NotWanted => {}
        }
        logged[slot] = Some(state);
    }
}

async fn read(api: &Api<DynamicObject>, name: &str) -> Result<Option<Value>, UpkeepError> {
    match api.get_opt(name).await? {
        Some(o) => Ok(Some(serde_json::to_value(o)?)),
        None => Ok(None),
    }
}
