//! The webhook's TLS transport: rustls (TLS 1.2 and 1.3, ALPN h2 and http/1.1) in front of
//! hyper (HTTP/1.1 keep-alive and HTTP/2), connection limits and timeouts, graceful drain.
//! Generic over the request [`Handler`]: the transport knows nothing of what it serves.
//!
//! - `certs`: certificate resolver over an `ArcSwap`, reloaded from the TLS directory.
//! - `conn`: one connection: handshake, protocol by ALPN, header and idle timeouts, drain.

pub mod certs;
mod conn;

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
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;

use self::certs::CertResolver;
use crate::duration::duration_arg;
use crate::metrics::Metrics;
use crate::shutdown::Signal;

/// What the server calls for every request; shared by all connections. It answers every
/// request (refusals included) itself: the transport only carries requests and responses.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, req: Request<Incoming>) -> impl Future<Output = Response<Full<Bytes>>> + Send;
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
    #[arg(long, env = "KUBE_OVERCOMMIT_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,

    /// Most concurrent HTTP/2 streams per connection.
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_MAX_CONCURRENT_STREAMS",
        default_value_t = 256
    )]
    pub max_concurrent_streams: u32,
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
}

/// The rustls configuration: ring, TLS 1.3 and 1.2, ALPN h2 and http/1.1, the given resolver.
pub fn tls_config(
    provider: Arc<rustls::crypto::CryptoProvider>,
    resolver: Arc<CertResolver>,
) -> Result<rustls::ServerConfig, ServerError> {
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// A bound webhook listener, ready to serve.
pub struct Server<H> {
    listener: TcpListener,
    acceptor: TlsAcceptor,
    handler: Arc<H>,
    http1: Arc<auto::Builder<TokioExecutor>>,
    http2: Arc<auto::Builder<TokioExecutor>>,
    args: ServerArgs,
    metrics: Arc<Metrics>,
}

impl<H: Handler> Server<H> {
    pub async fn bind(
        args: &ServerArgs,
        tls: rustls::ServerConfig,
        handler: Arc<H>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, ServerError> {
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
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accept until `shutdown` says drain, then let every connection finish its requests in
    /// flight and close (HTTP/1.1: `Connection: close` after the current response; HTTP/2:
    /// GOAWAY). Returns when the last connection is gone.
    pub async fn run(self, shutdown: Signal) {
        let limit = Arc::new(Semaphore::new(self.args.max_connections.max(1)));
        // Each connection task holds a sender; when all are dropped, the drain is complete.
        let (alive_tx, mut alive_rx) = mpsc::channel::<()>(1);
        loop {
            let permit = tokio::select! {
                p = limit.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
                _ = shutdown.drained() => break,
            };
            let (tcp, peer) = tokio::select! {
                r = self.listener.accept() => match r {
                    Ok(s) => s,
                    Err(e) => {
                        // EMFILE and the like: back off briefly instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = shutdown.drained() => break,
            };
            let conn = conn::Connection {
                acceptor: self.acceptor.clone(),
                handler: self.handler.clone(),
                http1: self.http1.clone(),
                http2: self.http2.clone(),
                metrics: self.metrics.clone(),
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
        }
        drop(self.listener);
        drop(alive_tx);
        let _ = alive_rx.recv().await;
        tracing::info!("all webhook connections closed");
    }
}
