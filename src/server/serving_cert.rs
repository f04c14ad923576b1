//! The serving certificate: a `ResolvesServerCert` over an `ArcSwap`, and its reload from a
//! directory holding `tls.crt` and `tls.key` (a mounted Secret).
//!
//! The kubelet updates a Secret volume by writing a new timestamped directory and renaming
//! the `..data` symlink onto it; `tls.crt` is itself a symlink to `..data/tls.crt`. Watching
//! the files would miss that, so the directory is watched, and re-read on a timer as well.
//! A pair that does not parse or whose key does not match is ignored; the last good pair keeps
//! serving (docs/architecture.md rule 3.5).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::metrics::ServerMetrics;
use crate::metrics::ReloadResult;
use crate::probes::ReadyFlag;
use crate::shutdown::Signal;
use arc_swap::ArcSwapOption;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};

pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";

/// Why a certificate pair was refused. Messages never contain key material.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{file}: no PEM certificate found")]
    NoCertificate { file: &'static str },
    #[error("{file}: malformed PEM certificate block")]
    BadCertificatePem { file: &'static str },
    #[error("{file}: the certificate is not valid X.509")]
    BadCertificate { file: &'static str },
    #[error("{file}: no usable PEM private key found (PKCS#8, SEC1 or PKCS#1)")]
    NoKey { file: &'static str },
    #[error("{file}: unsupported or malformed private key")]
    BadKey { file: &'static str },
    #[error("the private key does not match the certificate")]
    KeyMismatch,
}

/// A loaded pair plus what operators want to know about it.
#[derive(Debug)]
pub struct LoadedPair {
    pub key: Arc<CertifiedKey>,
    /// Unix seconds.
    pub not_after: i64,
    /// SHA-256 of the leaf certificate (DER), hex; safe to log.
    pub fingerprint: String,
}

/// Parse and check a PEM certificate chain and private key.
pub fn load_pair(
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> Result<LoadedPair, CertError> {
    let file = CERT_FILE;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|_| CertError::BadCertificatePem { file })?;
    let leaf = chain.first().ok_or(CertError::NoCertificate { file })?;
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|_| CertError::BadCertificate { file })?;
    let not_after = parsed.validity().not_after.timestamp();
    let fingerprint = hex(&Sha256::digest(leaf.as_ref()));

    let key_der =
        PrivateKeyDer::from_pem_slice(key_pem).map_err(|_| CertError::NoKey { file: KEY_FILE })?;
    let signing_key = provider
        .key_provider
        .load_private_key(key_der)
        .map_err(|_| CertError::BadKey { file: KEY_FILE })?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        Ok(()) => {}
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            return Err(CertError::KeyMismatch);
        }
        Err(_) => return Err(CertError::BadCertificate { file }),
    }
    Ok(LoadedPair {
        key: Arc::new(certified),
        not_after,
        fingerprint,
    })
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The certificate every new TLS connection gets: swapped atomically, read without a lock.
#[derive(Debug, Default)]
pub struct CertResolver {
    current: ArcSwapOption<CertifiedKey>,
}

impl CertResolver {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn set(&self, key: Arc<CertifiedKey>) {
        self.current.store(Some(key));
    }
    pub fn has_cert(&self) -> bool {
        self.current.load().is_some()
    }
    /// DER of the leaf served to new connections (the leader's readiness gate reads it).
    pub fn leaf_der(&self) -> Option<Vec<u8>> {
        let current = self.current.load();
        current.as_ref()?.cert.first().map(|c| c.to_vec())
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // No pair yet: the handshake fails, and /readyz says so.
        self.current.load_full()
    }
}

/// Keeps a [`CertResolver`] in step with a TLS directory.
pub struct CertReloader {
    dir: PathBuf,
    resolver: Arc<CertResolver>,
    provider: Arc<CryptoProvider>,
    metrics: ServerMetrics,
    ready: ReadyFlag,
    /// Digest of the last pair looked at (good or bad), so unchanged files are not re-counted.
    last_seen: Option<[u8; 32]>,
}

impl CertReloader {
    pub fn new(
        dir: PathBuf,
        resolver: Arc<CertResolver>,
        provider: Arc<CryptoProvider>,
        metrics: ServerMetrics,
        ready: ReadyFlag,
    ) -> Self {
        Self {
            dir,
            resolver,
            provider,
            metrics,
            ready,
            last_seen: None,
        }
    }

    /// Read the directory once; swap in the pair if it changed and is good.
    /// Returns whether a new pair is now serving.
    pub fn reload(&mut self) -> bool {
        let cert_path = self.dir.join(CERT_FILE);
        let key_path = self.dir.join(KEY_FILE);
        let read = |p: &Path| {
            std::fs::read(p).map_err(|source| CertError::Read {
                path: p.to_owned(),
                source,
            })
        };
        let (cert_pem, key_pem) = match (read(&cert_path), read(&key_path)) {
            (Ok(c), Ok(k)) => (c, k),
            (Err(e), _) | (_, Err(e)) => {
                // Missing files are normal before the Secret exists; log once per state.
                if self.last_seen != Some([0; 32]) {
                    self.last_seen = Some([0; 32]);
                    tracing::warn!(error = %e, "TLS pair not readable; keeping the current certificate");
                    self.count(ReloadResult::error);
                }
                return false;
            }
        };
        let mut h = Sha256::new();
        h.update((cert_pem.len() as u64).to_le_bytes());
        h.update(&cert_pem);
        h.update(&key_pem);
        let digest: [u8; 32] = h.finalize().into();
        if self.last_seen == Some(digest) {
            return false;
        }
        self.last_seen = Some(digest);
        match load_pair(&cert_pem, &key_pem, &self.provider) {
            Ok(pair) => {
                self.resolver.set(pair.key);
                self.metrics.cert_not_after_seconds.set(pair.not_after);
                self.count(ReloadResult::success);
                self.ready.set(true);
                tracing::info!(
                    dir = %self.dir.display(),
                    sha256 = %pair.fingerprint,
                    not_after = pair.not_after,
                    "serving certificate loaded"
                );
                true
            }
            Err(e) => {
                self.count(ReloadResult::error);
                tracing::warn!(
                    dir = %self.dir.display(),
                    error = %e,
                    "TLS pair refused; keeping the last good certificate"
                );
                false
            }
        }
    }

    fn count(&self, result: ReloadResult) {
        self.metrics.cert_reload(result);
    }

    /// Reload on every change in the directory (unless `watch_files` is false) and every
    /// `interval`, until `shutdown` says stop.
    pub async fn run(mut self, interval: Duration, watch_files: bool, shutdown: Signal) {
        let dir = self.dir.clone();
        crate::watch::reload_on_change(&dir, interval, watch_files, shutdown, || {
            self.reload();
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        (cert.pem(), key.serialize_pem())
    }

    fn provider() -> CryptoProvider {
        rustls::crypto::ring::default_provider()
    }

    #[test]
    fn good_pair_loads() {
        let (c, k) = pair("a.example");
        let p = load_pair(c.as_bytes(), k.as_bytes(), &provider()).expect("good pair");
        assert!(p.not_after > 0);
        assert_eq!(p.fingerprint.len(), 64);
    }

    #[test]
    fn bad_pairs_are_refused_with_reasons() {
        let (c1, k1) = pair("a.example");
        let (_c2, k2) = pair("b.example");
        let prov = provider();
        let cases: Vec<(&str, Vec<u8>, Vec<u8>, &str)> = vec![
            (
                "mismatch",
                c1.clone().into(),
                k2.clone().into(),
                "does not match",
            ),
            (
                "empty cert",
                vec![],
                k1.clone().into(),
                "no PEM certificate",
            ),
            (
                "truncated cert",
                c1.as_bytes()[..c1.len() / 2].to_vec(),
                k1.clone().into(),
                "malformed PEM",
            ),
            (
                "empty key",
                c1.clone().into(),
                vec![],
                "no usable PEM private key",
            ),
            (
                "truncated key",
                c1.clone().into(),
                k1.as_bytes()[..k1.len() / 2].to_vec(),
                "no usable PEM private key",
            ),
            (
                "garbage",
                b"\x00\xffgarbage".to_vec(),
                b"junk".to_vec(),
                "no PEM certificate",
            ),
        ];
        for (name, c, k, want) in cases {
            let err = load_pair(&c, &k, &prov).expect_err(name).to_string();
            assert!(err.contains(want), "{name}: {err}");
            assert!(
                !err.contains("PRIVATE KEY"),
                "{name}: key material in error: {err}"
            );
        }
    }

    #[test]
    fn reloader_keeps_last_good_pair() {
        let dir = crate::temp_dir::TempDir::new().expect("tempdir");
        let resolver = Arc::new(CertResolver::new());
        let metrics = crate::metrics::Metrics::new();
        let server_metrics = metrics.with_registry(ServerMetrics::new);
        let readiness = crate::probes::Readiness::new();
        let flag = readiness.condition("certificate", false);
        let mut r = CertReloader::new(
            dir.path().to_owned(),
            resolver.clone(),
            Arc::new(provider()),
            server_metrics,
            flag.clone(),
        );
        assert!(!r.reload());
        assert!(!flag.get());
        let (c1, k1) = pair("a.example");
        std::fs::write(dir.path().join(CERT_FILE), &c1).expect("write");
        std::fs::write(dir.path().join(KEY_FILE), &k1).expect("write");
        assert!(r.reload());
        assert!(flag.get());
        let first = resolver.current.load_full().expect("cert");
        // unchanged: no reload
        assert!(!r.reload());
        let (c2, _k2) = pair("b.example");
        std::fs::write(dir.path().join(CERT_FILE), &c2).expect("write");
        assert!(!r.reload(), "mismatched key must be refused");
        let still = resolver.current.load_full().expect("cert");
        assert!(Arc::ptr_eq(&first, &still));
        assert!(flag.get());
        let text = metrics.encode();
        assert!(
            text.contains(r#"certificate_reloads_total{result="error"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"certificate_reloads_total{result="success"} 1"#),
            "{text}"
        );
    }
}
