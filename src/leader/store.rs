//! How rotation state is kept in the API server, so that a new leader finishes what the old one
//! started: reading the CA Secret and the serving Secret into the rotation inputs, and building
//! the Secrets to write. Pure: objects in, objects out.
//!
//! CA Secret (never mounted): `ca.crt`/`ca.key` (current CA; during recovery `ca.key` may be
//! absent), `next-ca.crt`/`next-ca.key` (during a CA rotation), annotations
//! `overcommit.dev/ca-rotation-phase` (`published` | `switched`) and
//! `overcommit.dev/ca-rotation-since` (RFC 3339).
//! Serving Secret (mounted, type kubernetes.io/tls): `tls.crt`, `tls.key`, `ca.crt` (the trusted
//! bundle); an operator's request `overcommit.dev/rotate` (`leaf` | `ca`) with
//! `overcommit.dev/rotate-requested-at`, cleared by the leader once acted on.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::ca::{CertInfo, key_matches, parse_pem_bundle};
use super::rotation::{CaState, Forced, LeafState, Phase};
use super::webhook_config::MANAGED_BY;

pub const CA_CRT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const NEXT_CA_CRT: &str = "next-ca.crt";
pub const NEXT_CA_KEY: &str = "next-ca.key";
pub const TLS_CRT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
pub const PHASE_ANNOTATION: &str = "overcommit.dev/ca-rotation-phase";
pub const SINCE_ANNOTATION: &str = "overcommit.dev/ca-rotation-since";
pub const ROTATE_ANNOTATION: &str = "overcommit.dev/rotate";
pub const ROTATE_AT_ANNOTATION: &str = "overcommit.dev/rotate-requested-at";

/// The CA Secret, read: the decision's view and the key material to sign with.
#[derive(Clone)]
pub struct CaMaterial {
    pub state: CaState,
    pub current_key: Option<String>,
    pub next_key: Option<String>,
}

impl std::fmt::Debug for CaMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaMaterial")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

fn data_str<'a>(secret: &'a Secret, key: &str) -> Option<&'a str> {
    secret
        .data
        .as_ref()?
        .get(key)
        .and_then(|b| std::str::from_utf8(&b.0).ok())
        .filter(|s| !s.trim().is_empty())
}

fn annotation<'a>(secret: &'a Secret, key: &str) -> Option<&'a str> {
    secret
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn first_cert(pem: &str) -> Option<CertInfo> {
    parse_pem_bundle(pem.as_bytes()).ok()?.into_iter().next()
}

/// Read the CA Secret (None: it does not exist).
pub fn read_ca(secret: Option<&Secret>) -> CaMaterial {
    let broken = CaMaterial {
        state: CaState::Broken,
        current_key: None,
        next_key: None,
    };
    let Some(secret) = secret else {
        return CaMaterial {
            state: CaState::Missing,
            ..broken
        };
    };
    let Some(current) = data_str(secret, CA_CRT).and_then(first_cert) else {
        return broken;
    };
    let current_key = data_str(secret, CA_KEY)
        .filter(|k| key_matches(&current, k))
        .map(str::to_string);
    let next_pair = data_str(secret, NEXT_CA_CRT)
        .and_then(first_cert)
        .and_then(|c| {
            let key = data_str(secret, NEXT_CA_KEY).filter(|k| key_matches(&c, k))?;
            Some((c, key.to_string()))
        });
    let since = annotation(secret, SINCE_ANNOTATION)
        .and_then(|s| s.parse::<Timestamp>().ok())
        .unwrap_or(Timestamp::UNIX_EPOCH);
    let phase = match annotation(secret, PHASE_ANNOTATION) {
        Some("published") => Phase::Published { since },
        Some("switched") => Phase::Switched { since },
        _ => Phase::Idle,
    };
    // A CA without its key is only usable while a next CA (with key) takes over.
    if current_key.is_none() && next_pair.is_none() {
        return broken;
    }
    let (next, next_key) = match next_pair {
        Some((c, k)) => (Some(c), Some(k)),
        None => (None, None),
    };
    CaMaterial {
        state: CaState::Present {
            current_has_key: current_key.is_some(),
            current,
            next,
            phase,
        },
        current_key,
        next_key,
    }
}

/// Read the serving Secret: the leaf, and an operator's rotation request.
pub fn read_serving(secret: Option<&Secret>) -> (LeafState, Option<Forced>) {
    let Some(secret) = secret else {
        return (LeafState::Missing, None);
    };
    let forced = match annotation(secret, ROTATE_ANNOTATION).map(str::trim) {
        Some("ca") => Some(Forced::Ca),
        Some(_) => Some(Forced::Leaf),
        None => None,
    };
    let leaf = data_str(secret, TLS_CRT).and_then(first_cert);
    let key = data_str(secret, TLS_KEY);
    let state = match (leaf, key) {
        (Some(leaf), Some(key)) if key_matches(&leaf, key) => LeafState::Present {
            bundle: data_str(secret, CA_CRT)
                .and_then(|pem| parse_pem_bundle(pem.as_bytes()).ok())
                .unwrap_or_default(),
            leaf,
        },
        _ => LeafState::Broken,
    };
    (state, forced)
}

fn managed_meta(name: &str, namespace: &str, base: Option<&Secret>) -> ObjectMeta {
    let mut meta = base.map(|s| s.metadata.clone()).unwrap_or_default();
    meta.name = Some(name.to_string());
    meta.namespace = Some(namespace.to_string());
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .insert(MANAGED_BY.0.into(), MANAGED_BY.1.into());
    meta.managed_fields = None;
    meta
}

/// What the CA Secret should hold.
pub struct CaContents<'a> {
    pub current_pem: &'a str,
    pub current_key: Option<&'a str>,
    pub next: Option<(&'a str, &'a str)>,
    pub phase: Phase,
}

/// The CA Secret to write. With `base` (the object read), its resourceVersion is kept: the
/// write is a replace with a precondition; without, it is a create-if-absent.
pub fn ca_secret(name: &str, namespace: &str, base: Option<&Secret>, c: &CaContents<'_>) -> Secret {
    let mut meta = managed_meta(name, namespace, base);
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    annotations.remove(PHASE_ANNOTATION);
    annotations.remove(SINCE_ANNOTATION);
    let (phase, since) = match c.phase {
        Phase::Idle => (None, None),
        Phase::Published { since } => (Some("published"), Some(since)),
        Phase::Switched { since } => (Some("switched"), Some(since)),
    };
    if let (Some(phase), Some(since)) = (phase, since) {
        annotations.insert(PHASE_ANNOTATION.into(), phase.into());
        annotations.insert(SINCE_ANNOTATION.into(), since.to_string());
    }
    let mut data = BTreeMap::new();
    data.insert(
        CA_CRT.to_string(),
        ByteString(c.current_pem.as_bytes().to_vec()),
    );
    if let Some(key) = c.current_key {
        data.insert(CA_KEY.to_string(), ByteString(key.as_bytes().to_vec()));
    }
    if let Some((crt, key)) = c.next {
        data.insert(NEXT_CA_CRT.to_string(), ByteString(crt.as_bytes().to_vec()));
        data.insert(NEXT_CA_KEY.to_string(), ByteString(key.as_bytes().to_vec()));
    }
    Secret {
        metadata: meta,
        data: Some(data),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// The serving Secret to write (same precondition rule as `ca_secret`). The operator's request
/// annotations are cleared when `clear_request`.
pub fn serving_secret(
    name: &str,
    namespace: &str,
    base: Option<&Secret>,
    tls_crt: &str,
    tls_key: &str,
    ca_bundle_pem: &str,
    clear_request: bool,
) -> Secret {
    let mut meta = managed_meta(name, namespace, base);
    if clear_request && let Some(a) = meta.annotations.as_mut() {
        a.remove(ROTATE_ANNOTATION);
        a.remove(ROTATE_AT_ANNOTATION);
    }
    let data = BTreeMap::from([
        (TLS_CRT.to_string(), ByteString(tls_crt.as_bytes().to_vec())),
        (TLS_KEY.to_string(), ByteString(tls_key.as_bytes().to_vec())),
        (
            CA_CRT.to_string(),
            ByteString(ca_bundle_pem.as_bytes().to_vec()),
        ),
    ]);
    // The type of an existing Secret cannot change; keep what is there.
    let type_ = base
        .and_then(|s| s.type_.clone())
        .or_else(|| Some("kubernetes.io/tls".into()));
    Secret {
        metadata: meta,
        data: Some(data),
        type_,
        ..Default::default()
    }
}

/// The current leaf PEM and key of a serving Secret (to rewrite it with another ca.crt).
pub fn serving_pair(secret: &Secret) -> Option<(String, String)> {
    Some((
        data_str(secret, TLS_CRT)?.to_string(),
        data_str(secret, TLS_KEY)?.to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader::ca::{issue_ca, issue_leaf, service_dns_names};
    use std::time::Duration;

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    #[test]
    fn ca_secret_round_trip_table() {
        let a = issue_ca(now(), Duration::from_secs(3600), "a").unwrap();
        let b = issue_ca(now(), Duration::from_secs(3600), "b").unwrap();
        let phases = [
            Phase::Idle,
            Phase::Published { since: now() },
            Phase::Switched { since: now() },
        ];
        for phase in phases {
            let next = (phase != Phase::Idle).then_some((b.cert_pem.as_str(), b.key_pem.as_str()));
            let s = ca_secret(
                "ca",
                "ns",
                None,
                &CaContents {
                    current_pem: &a.cert_pem,
                    current_key: Some(&a.key_pem),
                    next,
                    phase,
                },
            );
            let m = read_ca(Some(&s));
            match m.state {
                CaState::Present {
                    phase: got,
                    current_has_key,
                    next: n,
                    ..
                } => {
                    assert_eq!(got, phase);
                    assert!(current_has_key);
                    assert_eq!(n.is_some(), next.is_some());
                }
                other => panic!("{phase:?}: {other:?}"),
            }
        }
        // Key of another CA, garbage, nothing: broken or missing.
        let wrong_key = ca_secret(
            "ca",
            "ns",
            None,
            &CaContents {
                current_pem: &a.cert_pem,
                current_key: Some(&b.key_pem),
                next: None,
                phase: Phase::Idle,
            },
        );
        assert_eq!(read_ca(Some(&wrong_key)).state, CaState::Broken);
        let garbage = ca_secret(
            "ca",
            "ns",
            None,
            &CaContents {
                current_pem: "garbage",
                current_key: None,
                next: None,
                phase: Phase::Idle,
            },
        );
        assert_eq!(read_ca(Some(&garbage)).state, CaState::Broken);
        assert_eq!(read_ca(Some(&Secret::default())).state, CaState::Broken);
        assert_eq!(read_ca(None).state, CaState::Missing);
        // Recovery: current without key, next with key.
        let recovery = ca_secret(
            "ca",
            "ns",
            None,
            &CaContents {
                current_pem: &a.cert_pem,
                current_key: None,
                next: Some((&b.cert_pem, &b.key_pem)),
                phase: Phase::Published { since: now() },
            },
        );
        assert!(matches!(
            read_ca(Some(&recovery)).state,
            CaState::Present {
                current_has_key: false,
                ..
            }
        ));
    }

    /// SECURITY.md ("Where the keys live"): every Secret write carries a precondition. Built
    /// from the object read, the Secret keeps its resourceVersion (the API server refuses the
    /// replace with 409 if anyone wrote in between); built from nothing, it has none and is sent
    /// as a create (refused with 409 if the Secret exists).
    #[test]
    fn secret_writes_carry_the_resource_version_read() {
        let ca = issue_ca(now(), Duration::from_secs(3600), "a").unwrap();
        let read = Secret {
            metadata: ObjectMeta {
                resource_version: Some("42".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let contents = CaContents {
            current_pem: &ca.cert_pem,
            current_key: Some(&ca.key_pem),
            next: None,
            phase: Phase::Idle,
        };
        for (base, want) in [(Some(&read), Some("42")), (None, None)] {
            let written = [
                ca_secret("ca", "ns", base, &contents),
                serving_secret("tls", "ns", base, "crt", "key", "bundle", false),
            ];
            for secret in written {
                assert_eq!(secret.metadata.resource_version.as_deref(), want);
            }
        }
    }

    #[test]
    fn serving_secret_table() {
        let a = issue_ca(now(), Duration::from_secs(3600), "a").unwrap();
        let leaf = issue_leaf(
            &a.cert_pem,
            &a.key_pem,
            &service_dns_names("s", "n"),
            now(),
            Duration::from_secs(60),
        )
        .unwrap();
        let good = serving_secret(
            "tls",
            "ns",
            None,
            &leaf.cert_pem,
            &leaf.key_pem,
            &a.cert_pem,
            true,
        );
        assert_eq!(good.type_.as_deref(), Some("kubernetes.io/tls"));
        assert!(
            matches!(read_serving(Some(&good)), (LeafState::Present { ref bundle, .. }, None) if bundle.len() == 1)
        );
        let mismatched = serving_secret(
            "tls",
            "ns",
            None,
            &leaf.cert_pem,
            &a.key_pem,
            &a.cert_pem,
            true,
        );
        assert_eq!(read_serving(Some(&mismatched)).0, LeafState::Broken);
        assert_eq!(read_serving(None).0, LeafState::Missing);
        let mut requested = good.clone();
        for (value, want) in [("ca", Forced::Ca), ("leaf", Forced::Leaf)] {
            requested.metadata.annotations = Some(BTreeMap::from([(
                ROTATE_ANNOTATION.to_string(),
                value.to_string(),
            )]));
            assert_eq!(read_serving(Some(&requested)).1, Some(want));
        }
        let cleared = serving_secret(
            "tls",
            "ns",
            Some(&requested),
            &leaf.cert_pem,
            &leaf.key_pem,
            &a.cert_pem,
            true,
        );
        assert_eq!(read_serving(Some(&cleared)).1, None);
    }
}
