//! Where the serving certificate comes from (`--cert-source`, issue 38).
//!
//! - `leader` (default): the leader runs its own CA, issues and rotates the leaves, writes the
//!   serving Secret and the caBundle of both webhook configurations.
//! - `cert-manager`: cert-manager keeps the serving Secret (a Certificate); its cainjector fills
//!   the caBundle from the annotation `cert-manager.io/inject-ca-from` that the leader puts on
//!   both configurations (or `cert-manager.io/inject-ca-from-secret` with
//!   `--cert-manager-ca-secret`: the CA's own Secret, so that cainjector, which merges, trusts a
//!   re-keyed CA before any leaf comes from it). The leader issues nothing, writes no Secret, and copies the live caBundle into
//!   the configurations it repairs, so it never fights cainjector; every other field stays
//!   pinned. Replicas are ready only while their leaf chains to the live caBundle, as before.

use super::ca::{self, CertInfo};
use super::rotation::CaState;
use super::store::CaMaterial;

/// cainjector's annotation: the CA comes from `ca.crt` of a Certificate's Secret.
pub const INJECT_CA_FROM: &str = "cert-manager.io/inject-ca-from";
/// cainjector's annotation: the CA comes from `ca.crt` of a Secret (which must carry
/// `cert-manager.io/allow-direct-injection: "true"`).
pub const INJECT_CA_FROM_SECRET: &str = "cert-manager.io/inject-ca-from-secret";
/// Both, so that the one not wanted is removed (the other source would fight over caBundle).
pub const INJECTION_ANNOTATIONS: [&str; 2] = [INJECT_CA_FROM, INJECT_CA_FROM_SECRET];

/// `--cert-source`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CertSource {
    /// The leader's own CA (today's behaviour).
    #[default]
    Leader,
    /// cert-manager's Certificate and cainjector.
    CertManager,
}

/// The annotation the webhook configurations carry: (key, value).
pub type Injection = (&'static str, String);

/// The cainjector annotation for this source (None with the leader's own CA).
pub fn injection(
    source: CertSource,
    namespace: &str,
    certificate: &str,
    ca_secret: Option<&str>,
) -> Option<Injection> {
    match (source, ca_secret.map(str::trim).filter(|s| !s.is_empty())) {
        (CertSource::Leader, _) => None,
        (CertSource::CertManager, Some(secret)) => {
            Some((INJECT_CA_FROM_SECRET, format!("{namespace}/{secret}")))
        }
        (CertSource::CertManager, None) => {
            Some((INJECT_CA_FROM, format!("{namespace}/{certificate}")))
        }
    }
}

/// The caBundle the leader writes into a configuration it creates or repairs (None: nothing to
/// build it from yet). The leader's own CA: the trusted CAs. cert-manager: the live one as it
/// stands (empty when cainjector has not filled it yet), so a repair never changes it.
pub fn bundle_to_write(
    source: CertSource,
    ca: &CaMaterial,
    live: Option<Vec<u8>>,
) -> Option<Vec<u8>> {
    match source {
        CertSource::Leader => trusted_pem(ca).map(String::into_bytes),
        CertSource::CertManager => Some(live.unwrap_or_default()),
    }
}

/// The PEM bundle of the CAs to trust now (None: no usable CA).
fn trusted_pem(ca: &CaMaterial) -> Option<String> {
    match &ca.state {
        CaState::Present { current, next, .. } => {
            let trusted: Vec<&CertInfo> = std::iter::once(current).chain(next.iter()).collect();
            Some(ca::bundle_pem(&trusted))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader::store;

    #[test]
    fn injection_table() {
        let cases: [(CertSource, Option<&str>, Option<Injection>); 5] = [
            (CertSource::Leader, None, None),
            (CertSource::Leader, Some("trust"), None),
            (
                CertSource::CertManager,
                None,
                Some((INJECT_CA_FROM, "ns/serving".into())),
            ),
            (
                CertSource::CertManager,
                Some(" "),
                Some((INJECT_CA_FROM, "ns/serving".into())),
            ),
            (
                CertSource::CertManager,
                Some("trust"),
                Some((INJECT_CA_FROM_SECRET, "ns/trust".into())),
            ),
        ];
        for (source, secret, want) in cases {
            assert_eq!(
                injection(source, "ns", "serving", secret),
                want,
                "{source:?} {secret:?}"
            );
        }
    }

    #[test]
    fn bundle_to_write_table() {
        let missing = store::read_ca(None);
        let live = || Some(b"LIVE".to_vec());
        type Bundle = Option<Vec<u8>>;
        let cases: [(CertSource, Bundle, Bundle); 4] = [
            // No CA of its own yet: the leader writes nothing (it creates the CA first).
            (CertSource::Leader, live(), None),
            (CertSource::Leader, None, None),
            // cert-manager: the live bundle is copied, never replaced.
            (CertSource::CertManager, live(), live()),
            // Not filled yet (or the configuration is missing): created empty for cainjector.
            (CertSource::CertManager, None, Some(Vec::new())),
        ];
        for (source, live, want) in cases {
            assert_eq!(
                bundle_to_write(source, &missing, live.clone()),
                want,
                "{source:?} {live:?}"
            );
        }
    }

    #[test]
    fn leader_writes_its_trusted_cas() {
        let now = jiff::Timestamp::now();
        let ca = ca::issue_ca(now, std::time::Duration::from_secs(3600), "svc").unwrap();
        let secret = store::ca_secret(
            "ca",
            "ns",
            None,
            &store::CaContents {
                current_pem: &ca.cert_pem,
                current_key: Some(&ca.key_pem),
                next: None,
                phase: crate::leader::rotation::Phase::Idle,
            },
        );
        let material = store::read_ca(Some(&secret));
        let written = bundle_to_write(CertSource::Leader, &material, Some(b"LIVE".to_vec()))
            .expect("a bundle from the CA");
        let parsed = ca::parse_pem_bundle(&written).unwrap();
        assert_eq!(parsed.len(), 1);
        assert_eq!(
            parsed[0].der,
            ca::parse_pem_bundle(ca.cert_pem.as_bytes()).unwrap()[0].der
        );
    }
}
