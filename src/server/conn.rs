//! One webhook connection: TLS handshake (bounded), HTTP/2 when ALPN chose `h2` (offered only
//! with `--http2`) and HTTP/1.1 otherwise, a header-read timeout (HTTP/1.1: from the first byte
//! of each request; HTTP/2: from the handshake to the first request), an idle timeout, the
//! connection's share of the body budget, and graceful close on drain.

use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;

use super::Handler;
use super::budget::{BodyBudget, Budget};
use super::metrics::ServerMetrics;
use crate::shutdown::Signal;

pub(super) struct Connection<H> {
    pub(super) acceptor: TlsAcceptor,
    pub(super) handler: Arc<H>,
    pub(super) http1: Arc<auto::Builder<TokioExecutor>>,
    pub(super) http2: Arc<auto::Builder<TokioExecutor>>,
    pub(super) metrics: ServerMetrics,
    pub(super) budget: Arc<Budget>,
    pub(super) connection_body_cap: u64,
    pub(super) handshake_timeout: Duration,
    pub(super) header_read_timeout: Duration,
    pub(super) idle_timeout: Duration,
    pub(super) shutdown: Signal,
}

/// What the connection is doing, shared by the I/O wrapper, the service and the watchdogs.
/// Times are milliseconds since the connection opened; 0 means "none".
struct Activity {
    opened: Instant,
    in_flight: AtomicUsize,
    /// When the last request started or ended.
    last_ms: AtomicU64,
    /// When the first byte of a request whose headers are not complete arrived (+1).
    headers_since_ms: AtomicU64,
}

impl Activity {
    fn new(is_h2: bool) -> Self {
        Activity {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
            // HTTP/2: the connection's first request must be complete within the header
            // timeout (from now: after the handshake); its frames are not tracked per request.
            headers_since_ms: AtomicU64::new(u64::from(is_h2)),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }
    fn touch(&self) {
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
    }
}

struct InFlight<'a>(&'a Activity);
impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

struct OpenGauge(ServerMetrics);
impl Drop for OpenGauge {
    fn drop(&mut self) {
        self.0.open_connections.dec();
    }
}

impl<H: Handler> Connection<H> {
    pub(super) async fn serve(self, tcp: TcpStream, peer: SocketAddr) {
        let _ = tcp.set_nodelay(true);
        self.metrics.open_connections.inc();
        let _open = OpenGauge(self.metrics.clone());

        let Some(tls) = self.handshake(tcp, peer).await else {
            return;
        };
        let is_h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");

        let activity = Arc::new(Activity::new(is_h2));
        let budget = self.body_budget(is_h2);
        let handler = self.handler.clone();
        let act = activity.clone();
        let shutdown = self.shutdown.clone();
        let service = hyper::service::service_fn(move |req| {
            let handler = handler.clone();
            let act = act.clone();
            let budget = budget.clone();
            let shutdown = shutdown.clone();
            async move {
                act.in_flight.fetch_add(1, Ordering::Relaxed);
                act.headers_since_ms.store(0, Ordering::Relaxed);
                let _guard = InFlight(&act);
                let mut response = handler.handle(req, budget).await;
                // Shutting down: the client retires this connection after this response
                // (HTTP/1.1; hyper closes it once sent) rather than racing the drain.
                if !is_h2 && shutdown.is_retiring() {
                    response.headers_mut().insert(
                        hyper::header::CONNECTION,
                        hyper::header::HeaderValue::from_static("close"),
                    );
                }
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        let io = TokioIo::new(Watched {
            inner: tls,
            activity: activity.clone(),
            // HTTP/2 sends frames (pings, settings) between requests; its streams are not timed here.
            track_headers: !is_h2,
        });
        let http = self.builder(is_h2);
        let mut conn = pin!(http.serve_connection(io, service));
        // The timeouts and the drain are watched by a task of their own, which wakes this one
        // only when one fires: polled here, they cost ~1k instructions a request (a select
        // polls every branch on every wake, and a 55 KB body wakes the connection several times).
        let alarm = Arc::new(Alarm::default());
        let watchdog = tokio::spawn(watch(
            activity,
            self.shutdown.clone(),
            self.idle_timeout,
            self.header_read_timeout,
            alarm.clone(),
            peer,
        ));
        let _stop_watchdog = AbortOnDrop(watchdog.abort_handle());
        let mut seen = 0;
        loop {
            tokio::select! {
                biased;
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                    return;
                }
                raised = std::future::poll_fn(|cx| alarm.poll_raised(cx, seen)) => {
                    seen |= raised;
                    if raised & Alarm::CLOSE != 0 {
                        return;
                    }
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }

    /// The connection's share of the body budget: HTTP/2 multiplexes, so its bodies in flight
    /// are also capped per connection.
    fn body_budget(&self, is_h2: bool) -> BodyBudget {
        if is_h2 {
            BodyBudget::with_connection_cap(self.budget.clone(), self.connection_body_cap)
        } else {
            BodyBudget::new(self.budget.clone())
        }
    }

    fn builder(&self, is_h2: bool) -> Arc<auto::Builder<TokioExecutor>> {
        if is_h2 {
            self.http2.clone()
        } else {
            self.http1.clone()
        }
    }

    /// The TLS handshake, within its timeout; None (counted, logged) when it fails.
    async fn handshake(
        &self,
        tcp: TcpStream,
        peer: SocketAddr,
    ) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
        match tokio::time::timeout(self.handshake_timeout, self.acceptor.accept(tcp)).await {
            Ok(Ok(s)) => Some(s),
            Ok(Err(e)) => {
                self.metrics.tls_handshake_failures.inc();
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                None
            }
            Err(_) => {
                self.metrics.tls_handshake_failures.inc();
                tracing::debug!(%peer, "TLS handshake timed out");
                None
            }
        }
    }
}

/// What the watchdog asks of the connection: close gracefully (drain, idle), or at once
/// (headers too slow). Bits, so that a close after a graceful close is not lost.
#[derive(Default)]
struct Alarm {
    raised: AtomicU8,
    waker: AtomicWaker,
}

impl Alarm {
    const GRACEFUL: u8 = 1;
    const CLOSE: u8 = 2;

    fn raise(&self, what: u8) {
        self.raised.fetch_or(what, Ordering::AcqRel);
        self.waker.wake();
    }

    /// Ready with the alarms raised that `seen` does not hold.
    fn poll_raised(&self, cx: &mut Context<'_>, seen: u8) -> Poll<u8> {
        let fresh = || self.raised.load(Ordering::Acquire) & !seen;
        if let raised @ 1.. = fresh() {
            return Poll::Ready(raised);
        }
        self.waker.register(cx.waker());
        // Raised between the first look and the registration: its wake went to the old waker.
        match fresh() {
            0 => Poll::Pending,
            raised => Poll::Ready(raised),
        }
    }
}

/// Stops the watchdog when the connection ends.
struct AbortOnDrop(tokio::task::AbortHandle);
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The connection's watchdog: a graceful close on drain or after the idle timeout, a close
/// when a request's headers take longer than the header timeout.
async fn watch(
    activity: Arc<Activity>,
    shutdown: Signal,
    idle_timeout: Duration,
    header_read_timeout: Duration,
    alarm: Arc<Alarm>,
    peer: SocketAddr,
) {
    let mut closing = false;
    loop {
        tokio::select! {
            _ = shutdown.drained(), if !closing => {
                closing = true;
                alarm.raise(Alarm::GRACEFUL);
            }
            _ = idle(&activity, idle_timeout), if !closing => {
                closing = true;
                tracing::debug!(%peer, "closing idle connection");
                alarm.raise(Alarm::GRACEFUL);
            }
            _ = slow_headers(&activity, header_read_timeout) => {
                tracing::debug!(%peer, "request headers not received in time; closing");
                alarm.raise(Alarm::CLOSE);
                return;
            }
        }
    }
}

/// Resolves once the connection had no request in flight for `timeout`.
async fn idle(activity: &Activity, timeout: Duration) {
    loop {
        let since = Duration::from_millis(
            activity
                .now_ms()
                .saturating_sub(activity.last_ms.load(Ordering::Relaxed)),
        );
        if activity.in_flight.load(Ordering::Relaxed) == 0 && since >= timeout {
            return;
        }
        let wait = timeout
            .saturating_sub(since)
            .max(Duration::from_millis(100));
        tokio::time::sleep(wait).await;
    }
}

/// Resolves once a request's headers have been arriving for longer than `timeout`.
async fn slow_headers(activity: &Activity, timeout: Duration) {
    let check = (timeout / 4).max(Duration::from_millis(50));
    loop {
        let since = activity.headers_since_ms.load(Ordering::Relaxed);
        if since == 0 {
            tokio::time::sleep(check).await;
            continue;
        }
        let waited = Duration::from_millis(activity.now_ms().saturating_sub(since - 1));
        if waited >= timeout {
            return;
        }
        tokio::time::sleep(timeout - waited).await;
    }
}

/// The TLS stream, noting when a new request's first bytes arrive (for the header timeout).
struct Watched<T> {
    inner: T,
    activity: Arc<Activity>,
    track_headers: bool,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if this.track_headers
            && buf.filled().len() > before
            && this.activity.in_flight.load(Ordering::Relaxed) == 0
            && this.activity.headers_since_ms.load(Ordering::Relaxed) == 0
        {
            let now = this.activity.now_ms();
            this.activity
                .headers_since_ms
                .store(now + 1, Ordering::Relaxed);
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
