//! The certificate authority: issue a CA (ECDSA P-256) and serving leaves with rcgen, parse
//! what is stored (x509-parser), and check chains the way the API server does (webpki through
//! rustls). Pure: no I/O, time is an argument. Key material never appears in errors or logs.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SerialNumber,
};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use sha2::{Digest, Sha256};

/// Why a certificate could not be issued or read.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("generating a certificate: {0}")]
    Generate(String),
    #[error("no PEM certificate found")]
    NoCertificate,
    #[error("PEM data does not parse: {0}")]
    Pem(String),
    #[error("certificate does not parse: {0}")]
    Parse(String),
    #[error("private key does not parse")]
    Key,
    #[error("time out of range")]
    Time,
    #[error("certificate does not chain to the bundle: {0}")]
    Untrusted(String),
}

/// SHA-256 of a certificate's DER encoding: how replicas report what they serve.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    pub fn of_der(der: &[u8]) -> Self {
        Self(Sha256::digest(der).into())
    }
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
    pub fn from_hex(text: &str) -> Option<Self> {
        let text = text.trim();
        if text.len() != 64 || !text.is_ascii() {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Self(out))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", &self.to_hex()[..16])
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// What the decisions need to know about one certificate.
#[derive(Clone, PartialEq, Eq)]
pub struct CertInfo {
    pub der: Vec<u8>,
    pub fingerprint: Fingerprint,
    pub not_before: Timestamp,
    pub not_after: Timestamp,
    pub dns_names: Vec<String>,
    pub is_ca: bool,
    /// SubjectPublicKeyInfo DER, to check that a key belongs to the certificate.
    pub spki: Vec<u8>,
}

impl fmt::Debug for CertInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertInfo")
            .field("fingerprint", &self.fingerprint)
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .field("dns_names", &self.dns_names)
            .field("is_ca", &self.is_ca)
            .finish()
    }
}

impl CertInfo {
    pub fn from_der(der: &[u8]) -> Result<Self, CertError> {
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| CertError::Parse(e.to_string()))?;
        let validity = cert.validity();
        let not_before =
            Timestamp::from_second(validity.not_before.timestamp()).map_err(|_| CertError::Time)?;
        let not_after =
            Timestamp::from_second(validity.not_after.timestamp()).map_err(|_| CertError::Time)?;
        let mut dns_names = Vec::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                if let x509_parser::extensions::GeneralName::DNSName(dns) = name {
                    dns_names.push((*dns).to_string());
                }
            }
        }
        Ok(Self {
            der: der.to_vec(),
            fingerprint: Fingerprint::of_der(der),
            not_before,
            not_after,
            dns_names,
            is_ca: cert.is_ca(),
            spki: cert.public_key().raw.to_vec(),
        })
    }

    /// The moment it should be replaced: 2/3 of its lifetime.
    pub fn renew_at(&self) -> Timestamp {
        let life = self.not_after.as_second() - self.not_before.as_second();
        Timestamp::from_second(self.not_before.as_second() + life * 2 / 3)
            .unwrap_or(self.not_before)
    }

    pub fn to_pem(&self) -> String {
        pem_encode("CERTIFICATE", &self.der)
    }
}

/// Parse every CERTIFICATE block of a PEM bundle; an empty bundle or a broken block is an error.
pub fn parse_pem_bundle(pem: &[u8]) -> Result<Vec<CertInfo>, CertError> {
    let mut out = Vec::new();
    for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
        let block = block.map_err(|e| CertError::Pem(e.to_string()))?;
        if block.label == "CERTIFICATE" {
            out.push(CertInfo::from_der(&block.contents)?);
        }
    }
    if out.is_empty() {
        return Err(CertError::NoCertificate);
    }
    Ok(out)
}

/// A bundle of CA certificates as PEM, in order.
pub fn bundle_pem(certs: &[&CertInfo]) -> String {
    certs.iter().map(|c| c.to_pem()).collect()
}

fn pem_encode(label: &str, der: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = String::with_capacity(der.len() * 4 / 3 + 4);
    for chunk in der.chunks(3) {
        let n = chunk.len();
        let v = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= n {
                b64.push(ALPHABET[((v >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                b64.push('=');
            }
        }
    }
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// True when the PEM private key parses and belongs to the certificate.
pub fn key_matches(cert: &CertInfo, key_pem: &str) -> bool {
    use rcgen::PublicKeyData;
    match KeyPair::from_pem(key_pem) {
        Ok(key) => key.subject_public_key_info() == cert.spki,
        Err(_) => false,
    }
}

/// A certificate with its private key, both PEM. Debug never shows the key.
#[derive(Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl fmt::Debug for Issued {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Issued { .. }")
    }
}

fn offset_time(ts: Timestamp) -> Result<time::OffsetDateTime, CertError> {
    time::OffsetDateTime::from_unix_timestamp(ts.as_second()).map_err(|_| CertError::Time)
}

fn serial(now: Timestamp) -> SerialNumber {
    let mut bytes = Sha256::digest(now.as_nanosecond().to_be_bytes()).to_vec();
    bytes.truncate(16);
    bytes[0] &= 0x7f; // positive
    let _ = bytes.get_mut(0).map(|b| *b |= 0x01);
    SerialNumber::from_slice(&bytes)
}

/// A new self-signed CA, valid from shortly before `now` (clock skew) for `validity`.
pub fn issue_ca(now: Timestamp, validity: Duration, name: &str) -> Result<Issued, CertError> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
        .map_err(|e| CertError::Generate(e.to_string()))?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    // A unique subject per CA, so old and new CAs are told apart by any client.
    dn.push(DnType::CommonName, format!("{name}-ca@{}", now.as_second()));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = offset_time(now - backdate(validity))?;
    params.not_after = offset_time(add(now, validity)?)?;
    params.serial_number = Some(serial(now));
    let cert = params
        .self_signed(&key)
        .map_err(|e| CertError::Generate(e.to_string()))?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// How far `not_before` is set back for clock skew: a minute, but never so much that the
/// 2/3-of-lifetime point of a short-lived certificate lies in the past at issue.
fn backdate(validity: Duration) -> jiff::SignedDuration {
    let d = std::cmp::min(Duration::from_secs(60), validity / 10);
    jiff::SignedDuration::try_from(d).unwrap_or(jiff::SignedDuration::ZERO)
}

fn add(ts: Timestamp, d: Duration) -> Result<Timestamp, CertError> {
    let d = jiff::SignedDuration::try_from(d).map_err(|_| CertError::Time)?;
    ts.checked_add(d).map_err(|_| CertError::Time)
}

/// The DNS names the API server may use for the Service.
pub fn service_dns_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
        format!("{service}.{namespace}"),
        service.to_string(),
    ]
}

/// A serving leaf for the Service, signed by the CA. It never outlives the CA.
pub fn issue_leaf(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    dns_names: &[String],
    now: Timestamp,
    validity: Duration,
) -> Result<Issued, CertError> {
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(|_| CertError::Key)?;
    let ca = parse_pem_bundle(ca_cert_pem.as_bytes())?
        .into_iter()
        .next()
        .ok_or(CertError::NoCertificate)?;
    let issuer = Issuer::from_ca_cert_pem(ca_cert_pem, ca_key)
        .map_err(|e| CertError::Generate(e.to_string()))?;
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
        .map_err(|e| CertError::Generate(e.to_string()))?;
    let mut params = CertificateParams::new(dns_names.to_vec())
        .map_err(|e| CertError::Generate(e.to_string()))?;
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        dns_names.first().cloned().unwrap_or_default(),
    );
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let not_before = std::cmp::max(now - backdate(validity), ca.not_before);
    let not_after = std::cmp::min(add(now, validity)?, ca.not_after);
    params.not_before = offset_time(not_before)?;
    params.not_after = offset_time(not_after)?;
    params.serial_number = Some(serial(now));
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| CertError::Generate(e.to_string()))?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Check the leaf the way a TLS client that trusts `bundle` and dials `server_name` would, at
/// `now`. Returns the fingerprint of the CA in the bundle it chains to.
pub fn verify_leaf(
    leaf: &CertInfo,
    bundle: &[CertInfo],
    server_name: &str,
    now: Timestamp,
) -> Result<Fingerprint, CertError> {
    let name = ServerName::try_from(server_name.to_string())
        .map_err(|e| CertError::Untrusted(e.to_string()))?;
    let secs = u64::try_from(now.as_second()).map_err(|_| CertError::Time)?;
    let at = UnixTime::since_unix_epoch(Duration::from_secs(secs));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut last = CertError::Untrusted("empty CA bundle".into());
    for ca in bundle {
        let mut roots = rustls::RootCertStore::empty();
        if let Err(e) = roots.add(CertificateDer::from(ca.der.clone())) {
            last = CertError::Untrusted(e.to_string());
            continue;
        }
        let verifier =
            match WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
            {
                Ok(v) => v,
                Err(e) => {
                    last = CertError::Untrusted(e.to_string());
                    continue;
                }
            };
        match verifier.verify_server_cert(
            &CertificateDer::from(leaf.der.clone()),
            &[],
            &name,
            &[],
            at,
        ) {
            Ok(_) => return Ok(ca.fingerprint),
            Err(e) => last = CertError::Untrusted(e.to_string()),
        }
    }
    Err(last)
}

/// Which CA of `cas` signed `leaf`, regardless of time (checked within the leaf's validity).
pub fn issuer_of(leaf: &CertInfo, cas: &[CertInfo]) -> Option<Fingerprint> {
    let name = leaf.dns_names.first()?;
    let at = Timestamp::from_second(leaf.not_before.as_second() + 1).ok()?;
    // Only CAs valid at that instant can verify; pick each CA's own validity too.
    for ca in cas {
        let probe = std::cmp::max(
            at,
            Timestamp::from_second(ca.not_before.as_second() + 1).ok()?,
        );
        if probe >= leaf.not_after || probe >= ca.not_after {
            continue;
        }
        if verify_leaf(leaf, std::slice::from_ref(ca), name, probe).is_ok() {
            return Some(ca.fingerprint);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    fn names() -> Vec<String> {
        service_dns_names("kube-overcommit", "kube-overcommit")
    }

    /// A CA (1 hour) and a leaf (1 minute) for `names`, issued now.
    fn ca_and_leaf(names: &[String]) -> (Issued, Issued) {
        let ca = issue_ca(now(), Duration::from_secs(3600), "kube-overcommit").unwrap();
        let leaf = issue_leaf(
            &ca.cert_pem,
            &ca.key_pem,
            names,
            now(),
            Duration::from_secs(60),
        )
        .unwrap();
        (ca, leaf)
    }

    fn first_der(pem: &str) -> Vec<u8> {
        parse_pem_bundle(pem.as_bytes()).unwrap().remove(0).der
    }

    #[test]
    fn ca_and_leaf_round_trip() {
        let ca = issue_ca(now(), Duration::from_secs(3600), "kube-overcommit").unwrap();
        let ca_info = &parse_pem_bundle(ca.cert_pem.as_bytes()).unwrap()[0];
        assert!(ca_info.is_ca);
        assert!(key_matches(ca_info, &ca.key_pem));
        assert_eq!(
            ca_info.not_after,
            now() + jiff::SignedDuration::from_secs(3600)
        );
        let leaf = issue_leaf(
            &ca.cert_pem,
            &ca.key_pem,
            &names(),
            now(),
            Duration::from_secs(60),
        )
        .unwrap();
        let leaf_info = &parse_pem_bundle(leaf.cert_pem.as_bytes()).unwrap()[0];
        assert!(!leaf_info.is_ca);
        assert!(key_matches(leaf_info, &leaf.key_pem));
        assert!(!key_matches(leaf_info, &ca.key_pem));
        assert_eq!(leaf_info.dns_names, names());
        assert_eq!(
            verify_leaf(
                leaf_info,
                std::slice::from_ref(ca_info),
                "kube-overcommit.kube-overcommit.svc",
                now()
            )
            .unwrap(),
            ca_info.fingerprint
        );
        assert_eq!(
            issuer_of(leaf_info, std::slice::from_ref(ca_info)),
            Some(ca_info.fingerprint)
        );
        // The PEM we re-encode parses back to the same certificate.
        assert_eq!(
            parse_pem_bundle(ca_info.to_pem().as_bytes()).unwrap()[0],
            *ca_info
        );
    }

    /// SECURITY.md ("TLS"): the leaf names the Service four ways and nothing else (no IP
    /// address, no wildcard, no other kind of name); its subject CN is the first; it is a
    /// server certificate only.
    #[test]
    fn leaf_carries_exactly_the_four_service_names() {
        let names = service_dns_names("kube-overcommit", "team-a");
        assert_eq!(
            names,
            [
                "kube-overcommit.team-a.svc",
                "kube-overcommit.team-a.svc.cluster.local",
                "kube-overcommit.team-a",
                "kube-overcommit",
            ]
        );
        let (_, leaf) = ca_and_leaf(&names);
        let der = first_der(&leaf.cert_pem);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap();
        let got: Vec<String> = san
            .value
            .general_names
            .iter()
            .map(|n| match n {
                x509_parser::extensions::GeneralName::DNSName(d) => format!("DNS:{d}"),
                other => format!("other:{other:?}"),
            })
            .collect();
        let want: Vec<String> = names.iter().map(|n| format!("DNS:{n}")).collect();
        assert_eq!(got, want);
        let cn: Vec<&str> = cert
            .subject()
            .iter_common_name()
            .filter_map(|c| c.as_str().ok())
            .collect();
        assert_eq!(cn, ["kube-overcommit.team-a.svc"]);
        // A server certificate and nothing more: signs handshakes, no certificates, no clients.
        let ku = cert.key_usage().unwrap().unwrap().value;
        assert!(ku.digital_signature() && !ku.key_cert_sign() && !ku.crl_sign());
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && !eku.client_auth && !eku.any && eku.other.is_empty());
        assert!(!cert.is_ca());
    }

    /// SECURITY.md ("TLS", "Where the keys live"): the CA and the leaf keys are ECDSA P-256.
    #[test]
    fn ca_and_leaf_keys_are_ecdsa_p256() {
        let (ca, leaf) = ca_and_leaf(&names());
        for (what, pem) in [("CA", &ca.cert_pem), ("leaf", &leaf.cert_pem)] {
            let der = first_der(pem);
            let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
            let spki = cert.public_key();
            assert_eq!(
                spki.algorithm.algorithm,
                x509_parser::oid_registry::OID_KEY_TYPE_EC_PUBLIC_KEY,
                "{what}"
            );
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok());
            assert_eq!(
                curve,
                Some(x509_parser::oid_registry::OID_EC_P256),
                "{what}: curve"
            );
        }
    }

    #[test]
    fn verify_table() {
        let ca = issue_ca(now(), Duration::from_secs(3600), "x").unwrap();
        let other = issue_ca(now(), Duration::from_secs(3600), "y").unwrap();
        let ca_info = parse_pem_bundle(ca.cert_pem.as_bytes()).unwrap().remove(0);
        let other_info = parse_pem_bundle(other.cert_pem.as_bytes())
            .unwrap()
            .remove(0);
        let leaf = issue_leaf(
            &ca.cert_pem,
            &ca.key_pem,
            &names(),
            now(),
            Duration::from_secs(60),
        )
        .unwrap();
        let leaf = parse_pem_bundle(leaf.cert_pem.as_bytes())
            .unwrap()
            .remove(0);
        let svc = "kube-overcommit.kube-overcommit.svc";
        let later = now() + jiff::SignedDuration::from_secs(120);
        let cases: Vec<(&str, Vec<CertInfo>, &str, Timestamp, bool)> = vec![
            ("own CA", vec![ca_info.clone()], svc, now(), true),
            (
                "both CAs",
                vec![other_info.clone(), ca_info.clone()],
                svc,
                now(),
                true,
            ),
            ("other CA only", vec![other_info.clone()], svc, now(), false),
            ("empty bundle", vec![], svc, now(), false),
            ("expired leaf", vec![ca_info.clone()], svc, later, false),
            (
                "wrong name",
                vec![ca_info.clone()],
                "other.kube-overcommit.svc",
                now(),
                false,
            ),
        ];
        for (what, bundle, name, at, ok) in cases {
            assert_eq!(verify_leaf(&leaf, &bundle, name, at).is_ok(), ok, "{what}");
        }
        assert_eq!(issuer_of(&leaf, &[other_info]), None);
    }

    #[test]
    fn leaf_never_outlives_its_ca() {
        let ca = issue_ca(now(), Duration::from_secs(30), "x").unwrap();
        let leaf = issue_leaf(
            &ca.cert_pem,
            &ca.key_pem,
            &names(),
            now(),
            Duration::from_secs(600),
        )
        .unwrap();
        let leaf = parse_pem_bundle(leaf.cert_pem.as_bytes())
            .unwrap()
            .remove(0);
        assert_eq!(leaf.not_after, now() + jiff::SignedDuration::from_secs(30));
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(parse_pem_bundle(b"").is_err());
        assert!(parse_pem_bundle(b"garbage").is_err());
        assert!(
            parse_pem_bundle(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
                .is_err()
        );
        assert!(issue_leaf("nope", "nope", &names(), now(), Duration::from_secs(1)).is_err());
        let fp = Fingerprint::of_der(b"abc");
        assert_eq!(Fingerprint::from_hex(&fp.to_hex()), Some(fp));
        assert_eq!(Fingerprint::from_hex("zz"), None);
    }

    #[test]
    fn renew_at_two_thirds() {
        let ca = issue_ca(now(), Duration::from_secs(300), "x").unwrap();
        let ca = parse_pem_bundle(ca.cert_pem.as_bytes()).unwrap().remove(0);
        // not_before is now - 30 s (a tenth), so the lifetime is 330 s and 2/3 is 220 s after it.
        assert_eq!(ca.renew_at(), now() + jiff::SignedDuration::from_secs(190));
        // Short lifetimes: the renewal point is always ahead at issue.
        for secs in [3, 10, 15, 60, 600] {
            let ca = issue_ca(now(), Duration::from_secs(3600), "x").unwrap();
            let leaf = issue_leaf(
                &ca.cert_pem,
                &ca.key_pem,
                &names(),
                now(),
                Duration::from_secs(secs),
            )
            .unwrap();
            let leaf = parse_pem_bundle(leaf.cert_pem.as_bytes())
                .unwrap()
                .remove(0);
            assert!(leaf.renew_at() > now(), "{secs}s");
        }
    }
}
