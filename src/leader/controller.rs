//! The leader's I/O loop: read the Secrets, the webhook configuration and the replica reports,
//! keep the configuration as desired, ask `rotation::decide` for the next action and execute it.
//! Every write re-checks the claim right before it goes out and carries a precondition
//! (replace with the resourceVersion read, or create when absent), so two replicas that both
//! believe they lead can never both win a write.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::Notify;

use super::ca::{self, CertError, CertInfo, Fingerprint};
use super::cert_source::{self, CertSource};
use super::election::{Claim, NotLeader};
use super::in_process::InProcessContext;
use super::in_process_upkeep::Compiled;
use super::metrics::LeaderMetrics;
use super::replicas;
use super::rotation::{self, Action, CaState, Forced, LeafState, Observed, Phase};
use super::store::{self, CaContents, CaMaterial};
use super::webhook_config::{self, ValidatingUpkeep, WebhookSettings};
use crate::mode::Path;

/// Why a step of the loop failed (it is retried at the next tick).
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("certificate: {0}")]
    Cert(#[from] CertError),
    #[error("{0}")]
    State(String),
}

impl ControllerError {
    fn is_conflict(&self) -> bool {
        matches!(self, Self::Kube(kube::Error::Api(s)) if s.code == 409)
    }
}

/// What the leader works with.
#[derive(Debug, Clone)]
pub struct ControllerSettings {
    pub namespace: String,
    pub service_name: String,
    pub ca_secret: String,
    pub serving_secret: String,
    pub lease_name: String,
    pub ca_validity: Duration,
    pub leaf_validity: Duration,
    pub check_interval: Duration,
    pub propagation_delay: Duration,
    pub cert_source: CertSource,
    pub webhook: WebhookSettings,
    /// Keep every OvercommitPolicy's status (`policy_status`): off with `serve --policy-file`.
    pub policy_status: bool,
}

/// The longest the loop sleeps: drift is repaired within this even if a watch event is missed.
pub const RESYNC: Duration = Duration::from_secs(5);

pub struct Controller {
    s: ControllerSettings,
    claim: Claim,
    metrics: LeaderMetrics,
    secrets: Api<Secret>,
    configs: Api<MutatingWebhookConfiguration>,
    validating: Api<ValidatingWebhookConfiguration>,
    leases: Api<Lease>,
    dns_names: Vec<String>,
    /// With `--request-cap` off: a validating configuration left by an earlier run with it on
    /// was looked for (once per term as leader).
    stale_validating_checked: AtomicBool,
    compiled: Compiled,
}

fn now() -> Timestamp {
    Timestamp::now()
}

impl Controller {
    pub fn new(
        client: Client,
        s: ControllerSettings,
        claim: Claim,
        metrics: LeaderMetrics,
        in_process: InProcessContext,
    ) -> Self {
        let compiled = Compiled::new(&client, in_process);
        Self {
            compiled,
            secrets: Api::namespaced(client.clone(), &s.namespace),
            leases: Api::namespaced(client.clone(), &s.namespace),
            validating: Api::all(client.clone()),
            configs: Api::all(client),
            dns_names: ca::service_dns_names(&s.service_name, &s.namespace),
            stale_validating_checked: AtomicBool::new(false),
            s,
            claim,
            metrics,
        }
    }

    /// Run until cancelled (the supervisor aborts this task when leadership is lost).
    pub async fn run(self) {
        let wake = Arc::new(Notify::new());
        let watchers = self.spawn_watchers(wake.clone());
        loop {
            if self.claim.check().is_err() {
                break;
            }
            let until = match self.tick().await {
                Ok(until) => until,
                Err(ControllerError::NotLeader(_)) => break,
                Err(e) if e.is_conflict() => {
                    tracing::info!(error = %e, "write lost a resourceVersion race; re-reading");
                    now()
                }
                Err(e) => {
                    tracing::warn!(error = %e, "leader step failed; retrying");
                    now() + jiff::SignedDuration::from_secs(1)
                }
            };
            let cap = self.s.check_interval.min(RESYNC);
            let wait = Duration::try_from(until.duration_since(now()))
                .unwrap_or(Duration::ZERO)
                .clamp(Duration::from_millis(200), cap);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = wake.notified() => {}
            }
        }
        for w in watchers {
            w.abort();
        }
    }

    fn spawn_watchers(&self, wake: Arc<Notify>) -> Vec<tokio::task::JoinHandle<()>> {
        let mut out = Vec::new();
        let cfg = watcher::Config::default()
            .fields(&format!("metadata.name={}", self.s.webhook.config_name));
        let stream = watcher(self.configs.clone(), cfg.clone()).default_backoff();
        out.push(tokio::spawn(notify_on(stream, wake.clone())));
        if self.s.webhook.request_cap {
            let stream = watcher(self.validating.clone(), cfg).default_backoff();
            out.push(tokio::spawn(notify_on(stream, wake.clone())));
        }
        if self.compiled.context.path == Path::InProcess {
            // The in-process flag turning on or off narrows or widens the node webhook.
            let flag = self.compiled.context.flag.clone();
            let woken = wake.clone();
            out.push(tokio::spawn(async move {
                let mut last = flag.load(Ordering::Relaxed);
                let mut tick = tokio::time::interval(super::in_process::TICK);
                loop {
                    tick.tick().await;
                    let now = flag.load(Ordering::Relaxed);
                    if now != last {
                        last = now;
                        woken.notify_one();
                    }
                }
            }));
            // A policy change rebuilds the compiled policy at once; its objects are watched.
            let store = self.compiled.context.policies.clone();
            let woken = wake.clone();
            out.push(tokio::spawn(async move {
                loop {
                    store.published().await;
                    woken.notify_one();
                }
            }));
            let cfg = watcher::Config::default()
                .fields(&format!("metadata.name={}", self.s.webhook.config_name));
            for api in [&self.compiled.policies, &self.compiled.bindings] {
                let stream = watcher(api.clone(), cfg.clone()).default_backoff();
                out.push(tokio::spawn(notify_on(stream, wake.clone())));
            }
        }
        let own_secrets = match self.s.cert_source {
            CertSource::Leader => vec![&self.s.ca_secret, &self.s.serving_secret],
            CertSource::CertManager => Vec::new(), // cert-manager keeps the Secret
        };
        for name in own_secrets {
            let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
            let stream = watcher(self.secrets.clone(), cfg).default_backoff();
            out.push(tokio::spawn(notify_on(stream, wake.clone())));
        }
        out
    }

    /// Steps until the decision is to wait; returns when to look again.
    async fn tick(&self) -> Result<Timestamp, ControllerError> {
        if self.s.cert_source == CertSource::CertManager {
            return self.tick_cert_manager().await;
        }
        for _ in 0..16 {
            self.claim.check()?;
            let ca_secret = self.secrets.get_opt(&self.s.ca_secret).await?;
            let serving = self.secrets.get_opt(&self.s.serving_secret).await?;
            let ca = store::read_ca(ca_secret.as_ref());
            let (leaf, forced) = store::read_serving(serving.as_ref());
            let live_bundle = self.upkeep_config(&ca).await?;
            let live_bundle = self.upkeep_validating(&ca, live_bundle).await?;
            self.compiled
                .upkeep(&self.claim, &self.metrics, &self.s.webhook.config_name)
                .await?;
            let at = now();
            let reports =
                replicas::fresh_reports(&self.leases, &self.s.lease_name, at, true).await?;
            let observed = Observed {
                now: at,
                ca: ca.state.clone(),
                serving: leaf,
                dns_names: self.dns_names.clone(),
                forced,
                live_bundle,
                replicas: reports,
                propagation_delay: self.s.propagation_delay,
            };
            let action = rotation::decide(&observed);
            if let Action::Wait { until } = action {
                return Ok(self.hand_over_soon(until));
            }
            tracing::info!(?action, "leader action");
            let step = Step {
                observed: &observed,
                ca: &ca,
                ca_base: ca_secret.as_ref(),
                serving_base: serving.as_ref(),
            };
            self.execute(&action, &step).await?;
        }
        Ok(now())
    }

    /// cert-manager keeps the Secret and cainjector the caBundle: only the configurations (with
    /// the live caBundle copied) and the compiled policy are kept; no CA, no rotation.
    async fn tick_cert_manager(&self) -> Result<Timestamp, ControllerError> {
        self.claim.check()?;
        let none = store::read_ca(None);
        let live = self.upkeep_config(&none).await?;
        self.upkeep_validating(&none, live).await?;
        self.compiled
            .upkeep(&self.claim, &self.metrics, &self.s.webhook.config_name)
            .await?;
        Ok(self.hand_over_soon(now() + jiff::SignedDuration::try_from(RESYNC).unwrap_or_default()))
    }

    /// `until`, or within a second while a rewrite of the compiled policy waits for the node
    /// webhook to be widened (`hand_over`).
    fn hand_over_soon(&self, until: Timestamp) -> Timestamp {
        if self.compiled.may_write(&self.s.webhook.config_name) {
            until
        } else {
            until.min(now() + jiff::SignedDuration::from_secs(1))
        }
    }

    /// Create or repair the webhook configuration from the trusted CAs; returns the fingerprints
    /// in its caBundle as it now stands (None: it does not exist).
    async fn upkeep_config(
        &self,
        ca: &CaMaterial,
    ) -> Result<Option<Vec<Fingerprint>>, ControllerError> {
        let name = &self.s.webhook.config_name;
        let actual = self.configs.get_opt(name).await?;
        let live = actual.as_ref().and_then(webhook_config::live_ca_bundle);
        let live_narrowing = actual.as_ref().and_then(webhook_config::live_narrowing);
        let Some(bundle) = cert_source::bundle_to_write(self.s.cert_source, ca, live) else {
            self.compiled.seen_config(live_narrowing);
            return Ok(actual.as_ref().map(webhook_config::bundle_fingerprints));
        };
        let narrowing = self
            .compiled
            .narrowing(name, live_narrowing.as_deref())
            .await;
        let want = webhook_config::desired(&self.s.webhook, &bundle, narrowing.as_deref());
        let written = match actual {
            None => {
                self.claim.check()?;
                let created = self.configs.create(&PostParams::default(), &want).await?;
                tracing::info!(name = %self.s.webhook.config_name, "created the webhook configuration");
                self.metrics.repair("webhook-configuration", "created");
                created
            }
            Some(actual) => {
                let drifted = webhook_config::drift(&actual, &want);
                if drifted.is_empty() {
                    actual
                } else {
                    self.claim.check()?;
                    let repaired = webhook_config::repaired(&actual, &want);
                    let name = self.s.webhook.config_name.clone();
                    let out = self
                        .configs
                        .replace(&name, &PostParams::default(), &repaired)
                        .await?;
                    let action = webhook_config::repair_action(&actual, &want, &drifted);
                    tracing::info!(%name, fields = ?drifted, action, "repaired the webhook configuration");
                    self.metrics.repair("webhook-configuration", action);
                    out
                }
            }
        };
        self.compiled
            .seen_config(webhook_config::live_narrowing(&written));
        Ok(Some(webhook_config::bundle_fingerprints(&written)))
    }

    /// The validating configuration of the placement cap, kept after the mutating one from the
    /// same trusted CAs (so a rotation publishes a new CA in both, and drops the old one from
    /// both, in that order). Returns the live bundle the rotation may rely on: with the cap on,
    /// the CAs in both caBundles, so that the next CA is only used once both trust it
    /// (docs/architecture.md rule 3.3). A failure here is logged and retried at the next tick
    /// without holding up the rest of the loop (leaf renewals go on; only a CA switch waits for
    /// it).
    async fn upkeep_validating(
        &self,
        ca: &CaMaterial,
        mutating: Option<Vec<Fingerprint>>,
    ) -> Result<Option<Vec<Fingerprint>>, NotLeader> {
        let cap = self.s.webhook.request_cap;
        if !cap && self.stale_validating_checked.load(Ordering::Relaxed) {
            return Ok(mutating);
        }
        match self.keep_validating(ca).await {
            Ok(validating) if cap => Ok(webhook_config::trusted_by_both(mutating, validating)),
            Ok(_) => {
                self.stale_validating_checked.store(true, Ordering::Relaxed);
                Ok(mutating)
            }
            Err(ControllerError::NotLeader(e)) => Err(e),
            Err(e) => {
                tracing::warn!(error = %e, request_cap = cap, "could not keep the validating webhook configuration; retrying");
                Ok(if cap { None } else { mutating })
            }
        }
    }

    /// Create, repair or (cap off, ours) delete the validating configuration; returns the
    /// fingerprints in its caBundle as it now stands (None: it does not exist).
    async fn keep_validating(
        &self,
        ca: &CaMaterial,
    ) -> Result<Option<Vec<Fingerprint>>, ControllerError> {
        let name = self.s.webhook.config_name.clone();
        let actual = self.validating.get_opt(&name).await?;
        let live = actual.as_ref().and_then(webhook_config::live_ca_bundle);
        let want = match cert_source::bundle_to_write(self.s.cert_source, ca, live) {
            Some(bundle) => webhook_config::desired_validating(&self.s.webhook, &bundle),
            // No usable CA yet: nothing to build it from; the CA comes first.
            None if self.s.webhook.request_cap => {
                return Ok(actual.as_ref().map(webhook_config::bundle_fingerprints));
            }
            None => None,
        };
        let object = "validating-webhook-configuration";
        let written = match webhook_config::validating_upkeep(want.as_ref(), actual.as_ref()) {
            ValidatingUpkeep::Keep => actual,
            ValidatingUpkeep::Create => {
                let Some(want) = want else { return Ok(None) };
                self.claim.check()?;
                let created = self
                    .validating
                    .create(&PostParams::default(), &want)
                    .await?;
                tracing::info!(%name, "created the validating webhook configuration (--request-cap)");
                self.metrics.repair(object, "created");
                Some(created)
            }
            ValidatingUpkeep::Repair(drifted) => {
                let (Some(want), Some(actual)) = (want, actual) else {
                    return Ok(None);
                };
                self.claim.check()?;
                let repaired = webhook_config::repaired(&actual, &want);
                let out = self
                    .validating
                    .replace(&name, &PostParams::default(), &repaired)
                    .await?;
                tracing::info!(%name, fields = ?drifted, "repaired the validating webhook configuration");
                self.metrics.repair(object, "repaired");
                Some(out)
            }
            ValidatingUpkeep::Delete => {
                let Some(actual) = actual else {
                    return Ok(None);
                };
                self.claim.check()?;
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        resource_version: actual.metadata.resource_version.clone(),
                        uid: actual.metadata.uid.clone(),
                    }),
                    ..DeleteParams::default()
                };
                self.validating.delete(&name, &params).await?;
                tracing::info!(%name, "deleted the validating webhook configuration (--request-cap is off)");
                self.metrics.repair(object, "deleted");
                None
            }
        };
        Ok(written.as_ref().map(webhook_config::bundle_fingerprints))
    }

    async fn write_secret(
        &self,
        base: Option<&Secret>,
        secret: &Secret,
        object: &str,
    ) -> Result<(), ControllerError> {
        let name = secret.metadata.name.clone().unwrap_or_default();
        self.claim.check()?;
        match base {
            // The resourceVersion read is in `secret.metadata`: a replace with a precondition.
            Some(_) => {
                self.secrets
                    .replace(&name, &PostParams::default(), secret)
                    .await?;
            }
            None => {
                self.secrets.create(&PostParams::default(), secret).await?;
                self.metrics.repair(object, "created");
            }
        }
        Ok(())
    }

    async fn execute(&self, action: &Action, step: &Step<'_>) -> Result<(), ControllerError> {
        match action {
            Action::Wait { .. } => Ok(()),
            Action::CreateCa { carry_over } => self.create_ca(*carry_over, step).await,
            Action::StartCaRotation { forced } => self.start_ca_rotation(*forced, step).await,
            Action::SwitchToNextCa => self.switch_to_next_ca(step).await,
            Action::FinishCaRotation => self.finish_ca_rotation(step).await,
            Action::IssueLeaf { reason } => self.issue_leaf(reason.as_str(), step).await,
            Action::SyncServingBundle => self.rewrite_serving(false, step).await,
            Action::ClearForced => self.rewrite_serving(true, step).await,
        }
    }

    /// Write the CA Secret with `contents` (a replace of the version read, or a create).
    async fn write_ca(
        &self,
        step: &Step<'_>,
        contents: CaContents<'_>,
    ) -> Result<(), ControllerError> {
        let secret = store::ca_secret(
            &self.s.ca_secret,
            &self.s.namespace,
            step.ca_base,
            &contents,
        );
        self.write_secret(step.ca_base, &secret, "ca-secret").await
    }

    async fn create_ca(
        &self,
        carry_over: Option<Fingerprint>,
        step: &Step<'_>,
    ) -> Result<(), ControllerError> {
        let o = step.observed;
        let fresh = ca::issue_ca(o.now, self.s.ca_validity, &self.s.service_name)?;
        let carried = carry_over.and_then(|fp| match &o.serving {
            LeafState::Present { bundle, .. } => {
                bundle.iter().find(|c| c.fingerprint == fp).cloned()
            }
            _ => None,
        });
        let outcome = if carried.is_some() {
            "recovered"
        } else {
            "bootstrap"
        };
        tracing::info!(outcome, "creating a new CA");
        let contents = match &carried {
            Some(old) => CaContents {
                current_pem: &old.to_pem(),
                current_key: None,
                next: Some((&fresh.cert_pem, &fresh.key_pem)),
                phase: Phase::Published { since: o.now },
            },
            None => CaContents {
                current_pem: &fresh.cert_pem,
                current_key: Some(&fresh.key_pem),
                next: None,
                phase: Phase::Idle,
            },
        };
        self.write_ca(step, contents).await?;
        if step.ca_base.is_some() {
            self.metrics.repair("ca-secret", "repaired");
        }
        self.metrics.rotation("ca", outcome);
        Ok(())
    }

    async fn start_ca_rotation(
        &self,
        forced: bool,
        step: &Step<'_>,
    ) -> Result<(), ControllerError> {
        let (current, _, _) = step.present()?;
        let o = step.observed;
        let next = ca::issue_ca(o.now, self.s.ca_validity, &self.s.service_name)?;
        let contents = CaContents {
            current_pem: &current.to_pem(),
            current_key: step.ca.current_key.as_deref(),
            next: Some((&next.cert_pem, &next.key_pem)),
            phase: Phase::Published { since: o.now },
        };
        self.write_ca(step, contents).await?;
        tracing::info!(
            forced,
            "CA rotation: new CA published beside the current one"
        );
        self.metrics
            .rotation("ca", if forced { "forced" } else { "started" });
        Ok(())
    }

    async fn switch_to_next_ca(&self, step: &Step<'_>) -> Result<(), ControllerError> {
        let (current, _, _) = step.present()?;
        let (next, next_key) = step.next_with_key("no next CA to switch to")?;
        let phase = Phase::Switched {
            since: step.observed.now,
        };
        let contents = CaContents {
            current_pem: &current.to_pem(),
            current_key: step.ca.current_key.as_deref(),
            next: Some((&next.to_pem(), next_key)),
            phase,
        };
        self.write_ca(step, contents).await?;
        tracing::info!("CA rotation: leaves now come from the new CA");
        self.metrics.rotation("ca", "switched");
        Ok(())
    }

    async fn finish_ca_rotation(&self, step: &Step<'_>) -> Result<(), ControllerError> {
        let (next, next_key) = step.next_with_key("no next CA to finish with")?;
        let contents = CaContents {
            current_pem: &next.to_pem(),
            current_key: Some(next_key),
            next: None,
            phase: Phase::Idle,
        };
        self.write_ca(step, contents).await?;
        tracing::info!(
            "CA rotation finished: every ready replica serves a leaf from the new CA; old CA dropped"
        );
        self.metrics.rotation("ca", "finished");
        Ok(())
    }

    async fn issue_leaf(&self, reason: &str, step: &Step<'_>) -> Result<(), ControllerError> {
        let (current, next, phase) = step.present()?;
        let (signer, key) = match (phase, next) {
            (Phase::Switched { .. }, Some(next)) => (next, step.ca.next_key.as_deref()),
            _ => (current, step.ca.current_key.as_deref()),
        };
        let key = key.ok_or_else(|| ControllerError::State("the signing CA has no key".into()))?;
        let o = step.observed;
        let leaf = ca::issue_leaf(
            &signer.to_pem(),
            key,
            &self.dns_names,
            o.now,
            self.s.leaf_validity,
        )?;
        let secret = store::serving_secret(
            &self.s.serving_secret,
            &self.s.namespace,
            step.serving_base,
            &leaf.cert_pem,
            &leaf.key_pem,
            &ca::bundle_pem(&o.trusted()),
            o.forced == Some(Forced::Leaf),
        );
        let result = self
            .write_secret(step.serving_base, &secret, "serving-secret")
            .await;
        let outcome = match &result {
            Ok(()) => reason,
            Err(e) if e.is_conflict() => "conflict",
            Err(_) => "failed",
        };
        self.metrics.rotation("leaf", outcome);
        result?;
        tracing::info!(reason, issuer = ?signer.fingerprint, "issued a serving leaf");
        Ok(())
    }

    /// Same leaf, ca.crt set to the trusted bundle; with `clear`, the rotation request cleared.
    async fn rewrite_serving(&self, clear: bool, step: &Step<'_>) -> Result<(), ControllerError> {
        let base = step
            .serving_base
            .ok_or_else(|| ControllerError::State("serving Secret vanished".into()))?;
        let (crt, key) = store::serving_pair(base)
            .ok_or_else(|| ControllerError::State("serving Secret has no pair".into()))?;
        let secret = store::serving_secret(
            &self.s.serving_secret,
            &self.s.namespace,
            Some(base),
            &crt,
            &key,
            &ca::bundle_pem(&step.observed.trusted()),
            clear,
        );
        self.write_secret(Some(base), &secret, "serving-secret")
            .await?;
        if clear {
            tracing::info!("cleared the rotation request");
        } else {
            self.metrics.repair("serving-secret", "repaired");
            tracing::info!("serving Secret ca.crt set to the trusted bundle");
        }
        Ok(())
    }
}

/// What one step of the loop read, for executing its action.
struct Step<'a> {
    observed: &'a Observed,
    ca: &'a CaMaterial,
    ca_base: Option<&'a Secret>,
    serving_base: Option<&'a Secret>,
}

impl Step<'_> {
    /// The usable CA: current, next, phase.
    fn present(&self) -> Result<(&CertInfo, Option<&CertInfo>, Phase), ControllerError> {
        match &self.ca.state {
            CaState::Present {
                current,
                next,
                phase,
                ..
            } => Ok((current, next.as_ref(), *phase)),
            _ => Err(ControllerError::State("no usable CA".into())),
        }
    }

    /// The next CA of a running rotation and its key; `missing` is the error otherwise.
    fn next_with_key(&self, missing: &str) -> Result<(&CertInfo, &str), ControllerError> {
        let (_, next, _) = self.present()?;
        match (next, self.ca.next_key.as_deref()) {
            (Some(next), Some(key)) => Ok((next, key)),
            _ => Err(ControllerError::State(missing.into())),
        }
    }
}

async fn notify_on<S, T, E>(stream: S, wake: Arc<Notify>)
where
    S: futures::Stream<Item = Result<watcher::Event<T>, E>> + Send,
    E: std::fmt::Display,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(_)) | Ok(watcher::Event::Delete(_)) => wake.notify_one(),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "leader watch"),
        }
    }
}
