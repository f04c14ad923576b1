//! The webhook's TLS transport: rustls (TLS 1.3, or 1.2 and 1.3 by flag; optional client
//! certificates) in front of hyper (HTTP/1.1 keep-alive; HTTP/2 only by flag), connection
//! limits, the budget of body bytes in flight, timeouts, graceful drain.
//! Generic over the request [`Handler`]: the transport knows nothing of what it serves.
//!
//! - `budget`: the process-wide budget of request-body bytes in flight.
//! - `serving_cert`: certificate resolver over an `ArcSwap`, reloaded from the TLS directory.
//! - `conn`: one connection: handshake, protocol by ALPN, header and idle timeouts, drain.
//! - `metrics`: this part's metrics (certificate, handshakes, connections).

pub mod budget;
mod conn;
pub mod metrics;
pub mod serving_cert;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;

use self::budget::{BodyBudget, Budget};
use self::metrics::ServerMetrics;
use self::serving_cert::CertResolver;
use crate::duration::duration_arg;
use crate::shutdown::Signal;

/// What the server calls for every request; shared by all connections. It answers every
/// request (refusals included) itself: the transport only carries requests and responses.
/// `budget` is where the handler reserves the bytes of the body it reads.
pub trait Handler: Send + Sync + 'static {
    fn handle(
        &self,
        req: Request<Incoming>,
        budget: BodyBudget,
    ) -> impl Future<Output = Response<Full<Bytes>>> + Send;
}

/// Lowest TLS version the webhook port accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsVersion {
    #[value(name = "1.2")]
    Tls12,
    #[value(name = "1.3")]
    Tls13,
}

/// Flags of the webhook port.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerArgs {
    /// Address of the HTTPS webhook port.
    #[arg(long, env = "KUBE_OVERCOMMIT_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,

    /// Directory holding tls.crt and tls.key (a mounted Secret); watched for changes.
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_TLS_DIR",
        default_value = "/etc/kube-overcommit/tls"
    )]
    pub tls_dir: PathBuf,

    /// Re-read the TLS directory this often even without a change notification.
    #[arg(long, env = "KUBE_OVERCOMMIT_CERT_RELOAD_INTERVAL", default_value = "10s", value_parser = duration_arg)]
    pub cert_reload_interval: Duration,

    /// Largest request body accepted (bytes); larger bodies get 413.
    #[arg(long, env = "KUBE_OVERCOMMIT_MAX_BODY_BYTES", default_value_t = 16 * 1024 * 1024,
          value_parser = clap::value_parser!(u64).range(8 * 1024 * 1024..))]
    pub max_body_bytes: u64,

    /// Request-body bytes held in memory at once, over all connections: half for bodies that
    /// declare at most 4 MiB (every review), half for larger or undeclared ones. Over budget a
    /// body waits up to 1 s, then gets 503 (the API server fails open). Keep it well below the
    /// container's memory limit; at least twice --max-body-bytes.
    #[arg(long, env = "KUBE_OVERCOMMIT_MAX_INFLIGHT_BODY_BYTES", default_value_t = 64 * 1024 * 1024,
          value_parser = clap::value_parser!(u64).range(16 * 1024 * 1024..))]
    pub max_inflight_body_bytes: u64,

    /// Time a client has to send complete request headers, from the first byte of a request.
    #[arg(long, env = "KUBE_OVERCOMMIT_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = duration_arg)]
    pub header_read_timeout: Duration,

    /// Time a client has to send the request body (the API server's own `timeout` shortens it).
    #[arg(long, env = "KUBE_OVERCOMMIT_BODY_READ_TIMEOUT", default_value = "10s", value_parser = duration_arg)]
    pub body_read_timeout: Duration,

    /// Close connections with no request for this long. Keep it above the client's own idle
    /// timeout (the API server's is 90 s), so that the client, not the server, retires idle
    /// connections: a request racing a server-side close fails, and the review is skipped.
    #[arg(long, env = "KUBE_OVERCOMMIT_IDLE_TIMEOUT", default_value = "120s", value_parser = duration_arg)]
    pub idle_timeout: Duration,

    /// Time a client has to complete the TLS handshake.
    #[arg(long, env = "KUBE_OVERCOMMIT_TLS_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = duration_arg)]
    pub tls_handshake_timeout: Duration,

    /// Most connections open at once; further clients wait in the listen backlog.
    #[arg(long, env = "KUBE_OVERCOMMIT_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,

    /// Offer HTTP/2 (ALPN h2) besides HTTP/1.1. Off by default: the API server calls webhooks
    /// over HTTP/1.1.
    #[arg(long, env = "KUBE_OVERCOMMIT_HTTP2")]
    pub http2: bool,

    /// Most concurrent HTTP/2 streams per connection (with --http2).
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_MAX_CONCURRENT_STREAMS",
        default_value_t = 32
    )]
    pub max_concurrent_streams: u32,

    /// Lowest TLS version accepted: 1.3, or 1.2 for clients without TLS 1.3.
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_TLS_MIN_VERSION",
        value_enum,
        default_value = "1.3"
    )]
    pub tls_min_version: TlsVersion,

    /// PEM file of CA certificates: when set, clients must present a certificate signed by one
    /// of them (the API server's, configured in its AdmissionConfiguration). Read at start-up
    /// only.
    #[arg(long, env = "KUBE_OVERCOMMIT_CLIENT_CA_FILE")]
    pub client_ca_file: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("binding the webhook port {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("reading the client CA file {path}: {source}")]
    ClientCaRead {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the client CA file {path} holds no usable PEM certificate")]
    ClientCaEmpty { path: PathBuf },
    #[error("client certificate verification: {0}")]
    ClientVerifier(#[from] rustls::server::VerifierBuilderError),
    #[error(
        "--max-body-bytes ({max_body}) must be at most half of --max-inflight-body-bytes ({budget}): a larger body could never be received"
    )]
    BudgetTooSmall { max_body: u64, budget: u64 },
}

/// The rustls configuration: ring, TLS 1.3 (and 1.2 with `--tls-min-version=1.2`), ALPN
/// http/1.1 (and h2 with `--http2`), client certificates checked against `--client-ca-file`
/// when set, the given resolver.
pub fn tls_config(
    args: &ServerArgs,
    provider: Arc<rustls::crypto::CryptoProvider>,
    resolver: Arc<CertResolver>,
) -> Result<rustls::ServerConfig, ServerError> {
    let versions: &[&'static rustls::SupportedProtocolVersion] = match args.tls_min_version {
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
        TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)?;
    let builder = match &args.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let roots = client_roots(path)?;
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut cfg = builder.with_cert_resolver(resolver);
    cfg.alpn_protocols = if args.http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Ok(cfg)
}

/// The CA certificates of `--client-ca-file`.
fn client_roots(path: &std::path::Path) -> Result<rustls::RootCertStore, ServerError> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let pem = std::fs::read(path).map_err(|source| ServerError::ClientCaRead {
        path: path.to_owned(),
        source,
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for der in CertificateDer::pem_slice_iter(&pem).flatten() {
        // Certificates rustls cannot use are skipped; none at all is an error below.
        let _ = roots.add(der);
    }
    if roots.is_empty() {
        return Err(ServerError::ClientCaEmpty {
            path: path.to_owned(),
        });
    }
    Ok(roots)
}

/// The body budget of `--max-inflight-body-bytes`, which must let a body of
/// `--max-body-bytes` be received whole.
fn budget_for(args: &ServerArgs) -> Result<Budget, ServerError> {
    let budget = Budget::new(args.max_inflight_body_bytes);
    if args.max_body_bytes > budget.pool_bytes() {
        return Err(ServerError::BudgetTooSmall {
            max_body: args.max_body_bytes,
            budget: args.max_inflight_body_bytes,
        });
    }
    Ok(budget)
}

/// A bound webhook listener, ready to serve.
pub struct Server<H> {
    listener: TcpListener,
    acceptor: TlsAcceptor,
    handler: Arc<H>,
    http1: Arc<auto::Builder<TokioExecutor>>,
    http2: Arc<auto::Builder<TokioExecutor>>,
    args: ServerArgs,
    metrics: ServerMetrics,
    budget: Arc<Budget>,
}

impl<H: Handler> Server<H> {
    pub async fn bind(
        args: &ServerArgs,
        tls: rustls::ServerConfig,
        handler: Arc<H>,
        metrics: ServerMetrics,
    ) -> Result<Self, ServerError> {
        let budget = Arc::new(budget_for(args)?);
        let listener =
            TcpListener::bind(args.listen)
                .await
                .map_err(|source| ServerError::Bind {
                    addr: args.listen,
                    source,
                })?;
        let mut http = auto::Builder::new(TokioExecutor::new());
        // hyper's own header timeout also runs while an idle keep-alive connection waits for
        // its next request, which would close the API server's pooled connections after a few
        // seconds; `conn` times header reads itself, from the first byte of a request.
        http.http1()
            .timer(TokioTimer::new())
            .keep_alive(true)
            .header_read_timeout(None);
        http.http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(args.max_concurrent_streams)
            .keep_alive_interval(Some(Duration::from_secs(30)))
            .keep_alive_timeout(Duration::from_secs(10));
        Ok(Self {
            listener,
            acceptor: TlsAcceptor::from(Arc::new(tls)),
            handler,
            http1: Arc::new(http.clone().http1_only()),
            http2: Arc::new(http.http2_only()),
            args: args.clone(),
            metrics,
            budget,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accept until `shutdown` says drain, then let every connection finish its requests in
    /// flight and close (HTTP/1.1: `Connection: close` after the current response; HTTP/2:
    /// GOAWAY). Returns when the last connection is gone.
    pub async fn run(self, shutdown: Signal) {
        // Each connection task holds a sender; when all are dropped, the drain is complete.
        let (alive_tx, mut alive_rx) = mpsc::channel::<()>(1);
        let stop = shutdown.clone();
        crate::accept::run(
            &self.listener,
            self.args.max_connections,
            async move { stop.drained().await },
            "webhook",
            |tcp, peer, permit| {
                let conn = conn::Connection {
                    acceptor: self.acceptor.clone(),
                    handler: self.handler.clone(),
                    http1: self.http1.clone(),
                    http2: self.http2.clone(),
                    metrics: self.metrics.clone(),
                    budget: self.budget.clone(),
                    // All streams of an HTTP/2 connection together: one largest body.
                    connection_body_cap: self.args.max_body_bytes,
                    handshake_timeout: self.args.tls_handshake_timeout,
                    header_read_timeout: self.args.header_read_timeout,
                    idle_timeout: self.args.idle_timeout,
                    shutdown: shutdown.clone(),
                };
                let alive = alive_tx.clone();
                tokio::spawn(async move {
                    conn.serve(tcp, peer).await;
                    drop(permit);
                    drop(alive);
                });
            },
        )
        .await;
        drop(self.listener);
        drop(alive_tx);
        let _ = alive_rx.recv().await;
        tracing::info!("all webhook connections closed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        server: ServerArgs,
    }

    fn args(argv: &[&str]) -> ServerArgs {
        let argv = std::iter::once("test").chain(argv.iter().copied());
        Flags::try_parse_from(argv).expect("flags").server
    }

    #[test]
    fn the_budget_must_hold_one_largest_body_per_half() {
        let cases = [
            (&[][..], true),
            (&["--max-inflight-body-bytes=33554432"], true),
            (&["--max-inflight-body-bytes=16777216"], false),
            (
                &[
                    "--max-inflight-body-bytes=16777216",
                    "--max-body-bytes=8388608",
                ],
                true,
            ),
        ];
        for (argv, ok) in cases {
            assert_eq!(budget_for(&args(argv)).is_ok(), ok, "{argv:?}");
        }
        assert!(
            Flags::try_parse_from(["test", "--max-inflight-body-bytes=1000"]).is_err(),
            "below 16 MiB"
        );
    }

    #[test]
    fn defaults_are_the_hardened_ones() {
        let a = args(&[]);
        assert_eq!(a.tls_min_version, TlsVersion::Tls13);
        assert!(!a.http2);
        assert_eq!(a.max_connections, 1024);
        assert_eq!(a.max_inflight_body_bytes, 64 * 1024 * 1024);
        assert!(a.client_ca_file.is_none());
    }

    #[test]
    fn a_client_ca_file_without_certificates_is_refused() {
        let dir = crate::temp_dir::TempDir::new().expect("tempdir");
        let empty = dir.path().join("ca.crt");
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let resolver = Arc::new(CertResolver::new());
        for (file, want) in [
            (empty, "no usable PEM"),
            (dir.path().join("missing"), "reading"),
        ] {
            let a = args(&[&format!("--client-ca-file={}", file.display())]);
            let err = tls_config(&a, provider.clone(), resolver.clone()).expect_err("refused");
            assert!(err.to_string().contains(want), "{err}");
        }
    }
}
