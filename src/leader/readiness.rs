//! Readiness (issue 4 item 4): a replica is ready only while the leaf it serves chains to a CA
//! in the live caBundle of the webhook configuration and is not expired, checked the way the
//! API server checks it (webpki, with the Service's DNS name). Every replica watches the
//! configuration; the same evaluation feeds its replica report (see `replicas`).

use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;

use super::ca::{CertInfo, parse_pem_bundle, verify_leaf};
use super::replicas::SelfReport;
use super::webhook_config::live_ca_bundle;
use crate::shutdown::Signal;

/// Where the leaf this replica serves comes from (`app` implements it for the server's
/// certificate resolver).
pub trait ServedCertificate: Send + Sync {
    /// DER of the leaf certificate currently served (None: nothing served yet).
    fn leaf_der(&self) -> Option<Vec<u8>>;
}

/// The leaf in `<tls-dir>/tls.crt`, read at each check. The server keeps the last good pair, so
/// a broken file here means the served one is older; prefer the server's own view when it
/// offers one.
#[derive(Debug, Clone)]
pub struct TlsDirCertificate {
    pub cert_file: PathBuf,
}

impl ServedCertificate for TlsDirCertificate {
    fn leaf_der(&self) -> Option<Vec<u8>> {
        let pem = std::fs::read(&self.cert_file).ok()?;
        parse_pem_bundle(&pem)
            .ok()?
            .into_iter()
            .next()
            .map(|c| c.der)
    }
}

/// The live caBundle as last seen (None: no configuration seen yet).
pub type LiveBundle = watch::Receiver<Option<Arc<Vec<CertInfo>>>>;

/// The readiness gate, cheap to clone.
#[derive(Clone)]
pub struct ReadinessCheck {
    bundle: LiveBundle,
    served: Arc<dyn ServedCertificate>,
    server_name: String,
}

impl std::fmt::Debug for ReadinessCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadinessCheck")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl ReadinessCheck {
    pub fn new(
        bundle: LiveBundle,
        served: Arc<dyn ServedCertificate>,
        server_name: String,
    ) -> Self {
        Self {
            bundle,
            served,
            server_name,
        }
    }

    /// Readiness and what is served, now.
    pub fn report(&self) -> SelfReport {
        let leaf = self
            .served
            .leaf_der()
            .and_then(|der| CertInfo::from_der(&der).ok());
        let bundle = self.bundle.borrow().clone();
        evaluate(
            leaf.as_ref(),
            bundle.as_deref().map(Vec::as_slice),
            &self.server_name,
            Timestamp::now(),
        )
    }

    /// When the served leaf and the CA it chains to (in the live bundle) expire.
    pub fn expiry(&self) -> (Option<Timestamp>, Option<Timestamp>) {
        let leaf = self
            .served
            .leaf_der()
            .and_then(|der| CertInfo::from_der(&der).ok());
        let bundle = self.bundle.borrow().clone();
        let report = evaluate(
            leaf.as_ref(),
            bundle.as_deref().map(Vec::as_slice),
            &self.server_name,
            Timestamp::now(),
        );
        let ca = bundle.as_deref().and_then(|b| {
            b.iter()
                .find(|c| Some(c.fingerprint) == report.issuer)
                .map(|c| c.not_after)
        });
        (leaf.map(|l| l.not_after), ca)
    }

    pub fn is_ready(&self) -> bool {
        self.report().ready
    }
}

/// Pure: is the served leaf trusted by the live bundle at `now`.
pub fn evaluate(
    leaf: Option<&CertInfo>,
    bundle: Option<&[CertInfo]>,
    server_name: &str,
    now: Timestamp,
) -> SelfReport {
    let Some(leaf) = leaf else {
        return SelfReport::default();
    };
    let issuer = bundle.and_then(|b| verify_leaf(leaf, b, server_name, now).ok());
    SelfReport {
        ready: issuer.is_some(),
        leaf: Some(leaf.fingerprint),
        issuer,
    }
}

/// Keep `tx` updated with the caBundle of the named configuration. A deleted configuration
/// keeps the last bundle: nothing calls the webhook without one, and the leader recreates it.
/// Ends when `shutdown` says stop.
pub async fn watch_ca_bundle(
    api: Api<MutatingWebhookConfiguration>,
    name: String,
    tx: watch::Sender<Option<Arc<Vec<CertInfo>>>>,
    shutdown: Signal,
) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(api, config).default_backoff().boxed();
    loop {
        let event = tokio::select! {
            e = events.next() => e,
            _ = shutdown.stopped() => return,
        };
        let Some(event) = event else { return };
        match event {
            Ok(watcher::Event::Apply(cfg)) | Ok(watcher::Event::InitApply(cfg)) => {
                let bundle = live_ca_bundle(&cfg)
                    .and_then(|pem| parse_pem_bundle(&pem).ok())
                    .unwrap_or_default();
                tx.send_replace(Some(Arc::new(bundle)));
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "webhook configuration watch"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader::ca::{issue_ca, issue_leaf, service_dns_names};
    use std::time::Duration;

    #[test]
    fn readiness_table() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let ca = issue_ca(now, Duration::from_secs(3600), "a").unwrap();
        let other = issue_ca(now, Duration::from_secs(3600), "b").unwrap();
        let ca_info = parse_pem_bundle(ca.cert_pem.as_bytes()).unwrap().remove(0);
        let other_info = parse_pem_bundle(other.cert_pem.as_bytes())
            .unwrap()
            .remove(0);
        let leaf = issue_leaf(
            &ca.cert_pem,
            &ca.key_pem,
            &service_dns_names("s", "n"),
            now,
            Duration::from_secs(60),
        )
        .unwrap();
        let leaf = parse_pem_bundle(leaf.cert_pem.as_bytes())
            .unwrap()
            .remove(0);
        let name = "s.n.svc";
        let later = now + jiff::SignedDuration::from_secs(61);
        type Case<'a> = (
            &'a str,
            Option<&'a CertInfo>,
            Option<Vec<CertInfo>>,
            Timestamp,
            bool,
        );
        let cases: Vec<Case<'_>> = vec![
            (
                "chains to the bundle",
                Some(&leaf),
                Some(vec![ca_info.clone()]),
                now,
                true,
            ),
            (
                "old and new CA",
                Some(&leaf),
                Some(vec![other_info.clone(), ca_info.clone()]),
                now,
                true,
            ),
            (
                "CA dropped from the bundle",
                Some(&leaf),
                Some(vec![other_info.clone()]),
                now,
                false,
            ),
            ("no configuration yet", Some(&leaf), None, now, false),
            (
                "nothing served",
                None,
                Some(vec![ca_info.clone()]),
                now,
                false,
            ),
            (
                "expired",
                Some(&leaf),
                Some(vec![ca_info.clone()]),
                later,
                false,
            ),
        ];
        for (what, leaf, bundle, at, ready) in cases {
            let r = evaluate(leaf, bundle.as_deref(), name, at);
            assert_eq!(r.ready, ready, "{what}");
            assert_eq!(r.issuer.is_some(), ready, "{what}");
        }
    }
}
