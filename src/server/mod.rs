//! The webhook's TLS listener: rustls (TLS 1.2 and 1.3, ALPN h2 and http/1.1) in front of
//! hyper (HTTP/1.1 keep-alive and HTTP/2), connection limits and timeouts, graceful drain.
//!
//! - `certs`: certificate resolver over an `ArcSwap`, reloaded from the TLS directory.
//! - `routes`: the request handler (`POST /mutate`).
//! - `serve`: the `serve` command, which starts everything and shuts it down in order.

pub mod certs;
pub mod routes;
pub mod serve;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_rustls::TlsAcceptor;

use self::certs::CertResolver;
use self::routes::App;
use crate::metrics::Metrics;

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime_like(s).ok_or_else(|| format!("invalid duration {s:?} (use e.g. 500ms, 10s, 2m)"))
}

/// Durations on the command line: an integer with one unit (ms, s, m, h).
pub fn humantime_like(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n.checked_mul(60)?)),
        "h" => Some(Duration::from_secs(n.checked_mul(3600)?)),
        _ => None,
    }
}

/// Parse a duration flag (`500ms`, `10s`, `2m`, `1h`).
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    parse_duration(s)
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

    /// Time a client has to send complete request headers. On HTTP/1.1 this also bounds how
    /// long an idle keep-alive connection waits for its next request.
    #[arg(long, env = "KUBE_OVERCOMMIT_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = duration_arg)]
    pub header_read_timeout: Duration,

    /// Time a client has to send the request body (the API server's own `timeout` shortens it).
    #[arg(long, env = "KUBE_OVERCOMMIT_BODY_READ_TIMEOUT", default_value = "10s", value_parser = duration_arg)]
    pub body_read_timeout: Duration,

    /// Close connections with no request for this long.
    #[arg(long, env = "KUBE_OVERCOMMIT_IDLE_TIMEOUT", default_value = "90s", value_parser = duration_arg)]
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
pub struct Server {
    listener: TcpListener,
    acceptor: TlsAcceptor,
    app: Arc<App>,
    http: Arc<auto::Builder<TokioExecutor>>,
    args: ServerArgs,
    metrics: Arc<Metrics>,
}

impl Server {
    pub async fn bind(
        args: &ServerArgs,
        tls: rustls::ServerConfig,
        app: Arc<App>,
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
        http.http1()
            .timer(TokioTimer::new())
            .keep_alive(true)
            .header_read_timeout(args.header_read_timeout);
        http.http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(args.max_concurrent_streams)
            .keep_alive_interval(Some(Duration::from_secs(30)))
            .keep_alive_timeout(Duration::from_secs(10));
        Ok(Self {
            listener,
            acceptor: TlsAcceptor::from(Arc::new(tls)),
            app,
            http: Arc::new(http),
            args: args.clone(),
            metrics,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accept until `drain` turns true, then let every connection finish its requests in
    /// flight and close (HTTP/1.1: `Connection: close` after the current response; HTTP/2:
    /// GOAWAY). Returns when the last connection is gone.
    pub async fn run(self, mut drain: watch::Receiver<bool>) {
        let limit = Arc::new(Semaphore::new(self.args.max_connections.max(1)));
        // Each connection task holds a sender; when all are dropped, the drain is complete.
        let (alive_tx, mut alive_rx) = mpsc::channel::<()>(1);
        loop {
            let permit = tokio::select! {
                p = limit.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
                _ = crate::server::turned_true(&mut drain) => break,
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
                _ = crate::server::turned_true(&mut drain) => break,
            };
            let conn = Connection {
                acceptor: self.acceptor.clone(),
                app: self.app.clone(),
                http: self.http.clone(),
                metrics: self.metrics.clone(),
                handshake_timeout: self.args.tls_handshake_timeout,
                idle_timeout: self.args.idle_timeout,
                drain: drain.clone(),
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

struct Connection {
    acceptor: TlsAcceptor,
    app: Arc<App>,
    http: Arc<auto::Builder<TokioExecutor>>,
    metrics: Arc<Metrics>,
    handshake_timeout: Duration,
    idle_timeout: Duration,
    drain: watch::Receiver<bool>,
}

/// Per-connection activity, updated by each request: how many are in flight and when the
/// last one started or ended (milliseconds since the connection opened).
struct Activity {
    opened: Instant,
    in_flight: AtomicUsize,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }
}

struct InFlight<'a>(&'a Activity);
impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

impl Connection {
    async fn serve(mut self, tcp: TcpStream, peer: SocketAddr) {
        let _ = tcp.set_nodelay(true);
        self.metrics.open_connections.inc();
        struct Open(Arc<Metrics>);
        impl Drop for Open {
            fn drop(&mut self) {
                self.0.open_connections.dec();
            }
        }
        let _open = Open(self.metrics.clone());

        let tls =
            match tokio::time::timeout(self.handshake_timeout, self.acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    self.metrics.tls_handshake_failures.inc();
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    self.metrics.tls_handshake_failures.inc();
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };

        let activity = Arc::new(Activity {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
        });
        let app = self.app.clone();
        let act = activity.clone();
        let service = hyper::service::service_fn(move |req| {
            let app = app.clone();
            let act = act.clone();
            async move {
                act.in_flight.fetch_add(1, Ordering::Relaxed);
                let _guard = InFlight(&act);
                Ok::<_, std::convert::Infallible>(app.route(req).await)
            }
        });
        let http = self.http.clone();
        let mut conn = pin!(http.serve_connection(TokioIo::new(tls), service));
        let mut closing = false;
        loop {
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                    return;
                }
                _ = crate::server::turned_true(&mut self.drain), if !closing => {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
                _ = idle(&activity, self.idle_timeout), if !closing => {
                    closing = true;
                    tracing::debug!(%peer, "closing idle connection");
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// Resolves once the connection had no request in flight for `timeout`.
async fn idle(activity: &Activity, timeout: Duration) {
    loop {
        let last = Duration::from_millis(activity.last_ms.load(Ordering::Relaxed));
        let since = activity.opened.elapsed().saturating_sub(last);
        if activity.in_flight.load(Ordering::Relaxed) == 0 && since >= timeout {
            return;
        }
        let wait = timeout
            .saturating_sub(since)
            .max(Duration::from_millis(100));
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(humantime_like("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(humantime_like("10s"), Some(Duration::from_secs(10)));
        assert_eq!(humantime_like("2m"), Some(Duration::from_secs(120)));
        assert_eq!(humantime_like("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(humantime_like("10"), None);
        assert_eq!(humantime_like("s"), None);
        assert_eq!(humantime_like("5d"), None);
    }
}

/// Resolves when a stop/drain signal turns true (or its sender is gone).
pub async fn turned_true(rx: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is not `Send`; drop it here, before any other await.
    let _ = rx.wait_for(|v| *v).await;
}
