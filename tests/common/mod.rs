//! Helpers for tests that run the real `kube-overcommit` binary over real TLS: a test CA,
//! a TLS directory written the way the kubelet writes Secret volumes, spawning the binary,
//! waiting for conditions, and clients.
#![allow(dead_code)]

pub(crate) mod https;
#[path = "../../src/temp_dir.rs"]
mod temp_dir;
pub(crate) use temp_dir::TempDir;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_kube-overcommit");

/// A test certificate authority.
pub(crate) struct Pki {
    ca_key: rcgen::KeyPair,
    ca: rcgen::Certificate,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

/// A serving certificate and its key, PEM.
#[derive(Clone)]
pub(crate) struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_der: Vec<u8>,
}

impl Pki {
    pub(crate) fn new() -> Self {
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-overcommit test CA");
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let ca = params.clone().self_signed(&ca_key).expect("CA cert");
        let issuer_key = rcgen::KeyPair::from_pem(&ca_key.serialize_pem()).expect("CA key copy");
        let issuer = rcgen::Issuer::new(params, issuer_key);
        Self { ca_key, ca, issuer }
    }

    pub(crate) fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    pub(crate) fn ca_der(&self) -> CertificateDer<'static> {
        self.ca.der().clone()
    }

    /// A leaf for `localhost` and 127.0.0.1, with `cn` to tell leaves apart.
    pub(crate) fn leaf(&self, cn: &str) -> Leaf {
        let key = rcgen::KeyPair::generate().expect("leaf key");
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress("127.0.0.1".parse().expect("ip")));
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let cert = params.signed_by(&key, &self.issuer).expect("leaf cert");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().to_vec(),
        }
    }
}

/// Write `files` into `dir` exactly as the kubelet's AtomicWriter updates a Secret volume:
/// a new timestamped directory `..<ts>`, a symlink `..data_tmp` to it renamed over `..data`,
/// user-visible symlinks `name -> ..data/name`, then the old timestamped directory removed.
pub(crate) fn kubelet_write(dir: &Path, files: &[(&str, &[u8])]) {
    use std::os::unix::fs::symlink;
    std::fs::create_dir_all(dir).expect("volume dir");
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("clock")
        .as_nanos();
    let ts_name = format!("..{nanos}");
    let ts_dir = dir.join(&ts_name);
    std::fs::create_dir(&ts_dir).expect("timestamped dir");
    for (name, content) in files {
        std::fs::write(ts_dir.join(name), content).expect("write payload");
    }
    let data = dir.join("..data");
    let old = std::fs::read_link(&data).ok();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    symlink(&ts_name, &tmp).expect("..data_tmp");
    std::fs::rename(&tmp, &data).expect("swap ..data");
    for (name, _) in files {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            symlink(Path::new("..data").join(name), &link).expect("user symlink");
        }
    }
    if let Some(old) = old {
        let old_dir = dir.join(old);
        if old_dir != ts_dir {
            let _ = std::fs::remove_dir_all(old_dir);
        }
    }
}

pub(crate) fn write_leaf(dir: &Path, leaf: &Leaf) {
    kubelet_write(
        dir,
        &[
            ("tls.crt", leaf.cert_pem.as_bytes()),
            ("tls.key", leaf.key_pem.as_bytes()),
        ],
    );
}

/// A policy file doubling cpu on every node.
pub(crate) const POLICY_YAML: &str = r#"apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata:
  name: double-cpu
spec:
  priority: 10
  nodeRatios:
    cpu: "2"
"#;

/// A running `kube-overcommit serve`, killed when dropped.
pub(crate) struct Webhook {
    pub child: Child,
    pub webhook: SocketAddr,
    pub probes: SocketAddr,
    pub logs: Arc<Mutex<Vec<String>>>,
    pub tmp: TempDir,
    pub tls_dir: PathBuf,
    pub policy_file: PathBuf,
}

impl Webhook {
    /// Start with a TLS dir holding `leaf` and the default policy file, plus `extra` flags.
    pub(crate) fn start(leaf: &Leaf, extra: &[&str]) -> Self {
        Self::start_with(Some(leaf), extra)
    }

    /// Start with an empty TLS directory when `leaf` is None (a Secret not written yet).
    pub(crate) fn start_with(leaf: Option<&Leaf>, extra: &[&str]) -> Self {
        Self::start_opts(leaf, true, extra, &[])
    }

    /// Full control: without `policy_file` the binary watches the CRD (set KUBECONFIG in `env`).
    pub(crate) fn start_opts(
        leaf: Option<&Leaf>,
        policy_file: bool,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let tmp = TempDir::new().expect("tempdir");
        let tls_dir = tmp.path().join("tls");
        match leaf {
            Some(leaf) => write_leaf(&tls_dir, leaf),
            None => std::fs::create_dir_all(&tls_dir).expect("tls dir"),
        }
        let policy_path = tmp.path().join("policies.yaml");
        let mut cmd = Command::new(BIN);
        cmd.arg("serve")
            .arg("--listen=127.0.0.1:0")
            .arg("--probe-listen=127.0.0.1:0")
            .arg(format!("--tls-dir={}", tls_dir.display()))
            .arg("--namespace=kube-overcommit");
        if !extra.iter().any(|a| a.starts_with("--exit-with-pid")) {
            // Exits by itself if the test process dies without dropping this.
            cmd.arg(format!("--exit-with-pid={}", std::process::id()));
        }
        if policy_file {
            std::fs::write(&policy_path, POLICY_YAML).expect("policy file");
            cmd.arg(format!("--policy-file={}", policy_path.display()));
        }
        cmd.envs(env.iter().copied())
            .arg("--log-format=json")
            .args(extra)
            .env("RUST_LOG", "info,kube_overcommit=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn kube-overcommit");
        let stderr = child.stderr.take().expect("stderr");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let logs2 = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                    && v["message"] == "listening"
                {
                    let w = v["webhook"].as_str().and_then(|s| s.parse().ok());
                    let p = v["probes"].as_str().and_then(|s| s.parse().ok());
                    if let (Some(w), Some(p)) = (w, p) {
                        let _ = tx.send((w, p));
                    }
                }
                logs2.lock().expect("logs").push(line);
            }
        });
        let (webhook, probes) = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "binary did not report its addresses; logs:\n{}",
                    logs.lock().expect("logs").join("\n")
                );
            }
        };
        Self {
            child,
            webhook,
            probes,
            logs,
            tmp,
            tls_dir,
            policy_file: policy_path,
        }
    }

    pub(crate) fn logs(&self) -> String {
        self.logs.lock().expect("logs").join("\n")
    }

    pub(crate) async fn probe(&self, path: &str) -> (u16, String) {
        http_get(self.probes, path).await
    }

    pub(crate) async fn wait_ready(&self) {
        let ok = wait_until(Duration::from_secs(20), || async {
            self.probe("/readyz").await.0 == 200
        })
        .await;
        assert!(
            ok,
            "not ready in time: {:?}\nlogs:\n{}",
            self.probe("/readyz").await,
            self.logs()
        );
    }

    pub(crate) async fn metrics(&self) -> String {
        self.probe("/metrics").await.1
    }

    pub(crate) fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(st.success());
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Poll `cond` every 20 ms until it holds or `timeout` passes.
/// POST a review to /mutate and return the JSON answer (panics: this is a test helper).
pub(crate) async fn mutate_json(
    c: &https::Client,
    w: &Webhook,
    review: &serde_json::Value,
) -> serde_json::Value {
    c.post(url(w, "/mutate"))
        .json(review)
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json")
}

pub(crate) async fn wait_until<F, Fut>(timeout: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A minimal HTTP/1.0 GET over plain TCP (the probe port): status and body.
pub(crate) async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let Ok(Ok(mut s)) =
        tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr)).await
    else {
        return (0, String::new());
    };
    let req = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return (0, String::new());
    }
    let mut buf = Vec::new();
    if tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .is_err()
    {
        return (0, String::new());
    }
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A rustls client config trusting `ca`, limited to `versions`, offering `alpn`.
pub(crate) fn client_config(
    ca: CertificateDer<'static>,
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[&[u8]],
) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).expect("add CA");
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    cfg
}

pub(crate) fn all_versions() -> Vec<&'static rustls::SupportedProtocolVersion> {
    vec![&rustls::version::TLS13, &rustls::version::TLS12]
}

/// Open a TLS connection; returns the stream.
pub(crate) async fn tls_connect(
    addr: SocketAddr,
    cfg: rustls::ClientConfig,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let name = ServerName::try_from("localhost").expect("name");
    tokio::time::timeout(Duration::from_secs(5), connector.connect(name, tcp))
        .await
        .map_err(|_| std::io::Error::other("handshake timed out"))?
}

/// The leaf certificate a NEW connection gets (DER), or None if the handshake fails.
pub(crate) async fn peer_leaf(addr: SocketAddr, ca: CertificateDer<'static>) -> Option<Vec<u8>> {
    let s = tls_connect(addr, client_config(ca, &all_versions(), &[b"http/1.1"]))
        .await
        .ok()?;
    let (_, conn) = s.get_ref();
    conn.peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
}

pub(crate) fn url(w: &Webhook, path: &str) -> String {
    format!("https://localhost:{}{}", w.webhook.port(), path)
}

/// A client of the webhook's address (`localhost` in its URLs), trusting `ca`; HTTP/2 with prior
/// knowledge or HTTP/1.1 only. A new client means new connections.
pub(crate) fn client_for(w: &Webhook, ca: CertificateDer<'static>, http2: bool) -> https::Client {
    let alpn: &[&[u8]] = if http2 { &[b"h2"] } else { &[b"http/1.1"] };
    let cfg = client_config(ca, &all_versions(), alpn);
    https::Client::new(w.webhook, cfg, http2, Duration::from_secs(20))
}

/// A node status AdmissionReview (UPDATE nodes/status) with `cpu` allocatable.
pub(crate) fn node_review(uid: &str, cpu: &str) -> serde_json::Value {
    let node = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "node-a", "labels": {"kubernetes.io/hostname": "node-a"}},
        "status": {
            "capacity": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
            "allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"}
        }
    });
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Node"},
            "resource": {"group": "", "version": "v1", "resource": "nodes"},
            "subResource": "status",
            "requestKind": {"group": "", "version": "v1", "kind": "Node"},
            "requestResource": {"group": "", "version": "v1", "resource": "nodes"},
            "requestSubResource": "status",
            "name": "node-a",
            "operation": "UPDATE",
            "userInfo": {"username": "system:node:node-a"},
            "object": node,
            "oldObject": node,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions"}
        }
    })
}

/// Standard base64 decoding (the AdmissionReview patch), without another dependency.
pub(crate) fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=').map(val).collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n: u32 = 0;
        for (i, &b) in chunk.iter().enumerate() {
            n |= u32::from(b) << (18 - 6 * i);
        }
        let take = chunk.len().saturating_sub(1);
        for i in 0..take {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    out
}

/// Value of a metric line `name{labels} value` in Prometheus text (0 if absent).
pub(crate) fn metric_value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

/// A parsed HTTP/1.1 response.
#[derive(Debug)]
pub(crate) struct RawResponse {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

/// Read one HTTP/1.1 response (Content-Length framed) from `s`.
pub(crate) async fn read_response<S: tokio::io::AsyncRead + Unpin>(
    s: &mut S,
) -> std::io::Result<RawResponse> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed before a response",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())
                .flatten()
        })
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Ok(RawResponse { status, head, body })
}

/// Whether the peer closes `s` within `within` (EOF or error), reading and discarding data.
pub(crate) async fn closed_within<S: tokio::io::AsyncRead + Unpin>(
    s: &mut S,
    within: Duration,
) -> bool {
    let mut chunk = [0u8; 4096];
    let fut = async {
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, fut).await.is_ok()
}

/// A control plane in a temporary run dir, stopped when dropped.
pub(crate) struct ControlPlane {
    kcp: PathBuf,
    run_dir: TempDir,
}

impl ControlPlane {
    pub(crate) fn up() -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cluster/kcp.sh");
        let st = Command::new(&script)
            .arg("build")
            .status()
            .expect("kcp.sh build");
        assert!(st.success(), "building kcp failed");
        let out = Command::new(&script)
            .arg("path")
            .output()
            .expect("kcp.sh path");
        let kcp = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        let run_dir = TempDir::new().expect("run dir");
        let st = Command::new(&kcp)
            .args([
                "up",
                "--nodes",
                "0",
                "--timeout",
                "120s",
                "--max-lifetime",
                "10m",
            ])
            // Stops by itself if this test process dies without running `down`.
            .arg(format!("--exit-with-pid={}", std::process::id()))
            .arg("--run-dir")
            .arg(run_dir.path())
            .status()
            .expect("kcp up");
        assert!(st.success(), "kcp up failed");
        Self { kcp, run_dir }
    }

    pub(crate) fn kubeconfig(&self) -> String {
        self.run_dir.path().join("kubeconfig").display().to_string()
    }

    /// Run kubectl with `stdin`; returns (success, stdout+stderr).
    pub(crate) fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> (bool, String) {
        use std::io::Write;
        let mut child = Command::new(&self.kcp)
            .arg("kubectl")
            .args(args)
            .env("KUBECONFIG", self.kubeconfig())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl");
        if let (Some(mut input), Some(s)) = (child.stdin.take(), stdin) {
            input.write_all(s.as_bytes()).expect("stdin");
        }
        let out = child.wait_with_output().expect("kubectl output");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    pub(crate) fn apply(&self, yaml: &str) -> (bool, String) {
        self.kubectl(&["apply", "-f", "-"], Some(yaml))
    }

    /// Register `addr` as a backend of Service `namespace/service` port 443 in the API server's
    /// resolver, ready while `ready_url` answers 200 (as endpoints of a Service do).
    pub(crate) fn backend_add(
        &self,
        namespace: &str,
        service: &str,
        addr: SocketAddr,
        ready_url: &str,
    ) {
        let out = Command::new(&self.kcp)
            .args([
                "backend",
                "add",
                "--namespace",
                namespace,
                "--service",
                service,
                "--port",
                "443",
            ])
            .arg(format!("--addr={addr}"))
            .arg(format!("--ready-url={ready_url}"))
            .arg("--run-dir")
            .arg(self.run_dir.path())
            .output()
            .expect("kcp backend add");
        assert!(
            out.status.success(),
            "kcp backend add: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Mirror Secret `namespace/name` into `dir` the way the kubelet updates a Secret volume
    /// (the `..data` swap, 1 s after a change). Stopped when the returned guard is dropped, and
    /// by itself after 10 minutes (`timeout`) if this process dies without dropping it.
    pub(crate) fn secret_volume(&self, namespace: &str, name: &str, dir: &Path) -> ChildGuard {
        let child = Command::new("timeout")
            .arg("600")
            .arg(&self.kcp)
            .args([
                "secret-volume",
                "--namespace",
                namespace,
                "--name",
                name,
                "--delay",
                "1s",
            ])
            .arg("--dir")
            .arg(dir)
            .arg("--run-dir")
            .arg(self.run_dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("kcp secret-volume");
        ChildGuard(child)
    }
}

/// A child process killed when dropped.
pub(crate) struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        // SIGTERM, which `timeout` passes on to its command (a SIGKILL would orphan it).
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = Command::new(&self.kcp)
            .args(["down", "--run-dir"])
            .arg(self.run_dir.path())
            .status();
    }
}
