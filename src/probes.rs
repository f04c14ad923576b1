//! Plain-HTTP probe port: `/healthz` (the process answers), `/readyz` (every readiness
//! condition holds), `/metrics` (Prometheus text format).
//!
//! Readiness is a set of named conditions. The server registers `certificate`, the policy
//! source registers `policies`, shutdown registers `not-shutting-down`; any other module
//! (the leader) adds its own with [`Readiness::condition`] or [`Readiness::add_check`].
//! Details ([`Readiness::add_detail`]) are lines `/readyz` shows without failing: a state an
//! operator should see that must not take the replica out of the Service (the usage caches not
//! synced yet: the stored allocatable is kept, which is safe).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::metrics::Metrics;
use crate::shutdown::Signal;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

/// Flags of the probe port.
#[derive(Debug, Clone, clap::Args)]
pub struct ProbeArgs {
    /// Address of the plain-HTTP probe and metrics port (/healthz, /readyz, /metrics).
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_PROBE_LISTEN",
        default_value = "0.0.0.0:8080"
    )]
    pub probe_listen: SocketAddr,

    /// Most connections open at once on the probe port; further clients wait in the listen
    /// backlog. The kubelet and a Prometheus scraper need a few.
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_PROBE_MAX_CONNECTIONS",
        default_value_t = 64
    )]
    pub probe_max_connections: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("binding the probe port {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// One readiness condition that its owner flips (cheap to clone, lock-free to set and read).
#[derive(Clone, Debug)]
pub struct ReadyFlag(Arc<AtomicBool>);

impl ReadyFlag {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

type Check = Arc<dyn Fn() -> bool + Send + Sync>;
type Detail = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// Named readiness conditions; ready when all hold. Details are shown, never fail.
#[derive(Clone, Default)]
pub struct Readiness {
    checks: Arc<RwLock<Vec<(String, Check)>>>,
    details: Arc<RwLock<Vec<(String, Detail)>>>,
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readiness")
            .field("failing", &self.failing())
            .finish()
    }
}

impl Readiness {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a condition `name`, initially `initial`, and return the flag that controls it.
    pub fn condition(&self, name: &str, initial: bool) -> ReadyFlag {
        let flag = ReadyFlag(Arc::new(AtomicBool::new(initial)));
        let f = flag.clone();
        self.add_check(name, move || f.get());
        flag
    }

    /// Add a condition evaluated at each `/readyz` request (keep it cheap and non-blocking).
    pub fn add_check(&self, name: &str, check: impl Fn() -> bool + Send + Sync + 'static) {
        let mut checks = match self.checks.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        checks.push((name.to_owned(), Arc::new(check)));
    }

    /// Add a detail line `name: text`, shown by `/readyz` while `detail` returns text (keep it
    /// cheap and non-blocking). It never makes the replica unready.
    pub fn add_detail(
        &self,
        name: &str,
        detail: impl Fn() -> Option<String> + Send + Sync + 'static,
    ) {
        let mut details = match self.details.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        details.push((name.to_owned(), Arc::new(detail)));
    }

    /// The detail lines that have something to say, `name: text`.
    pub fn details(&self) -> Vec<String> {
        let details = match self.details.read() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        details
            .iter()
            .filter_map(|(name, d)| d().map(|text| format!("{name}: {text}")))
            .collect()
    }

    /// Names of the conditions that do not hold.
    pub fn failing(&self) -> Vec<String> {
        let checks = match self.checks.read() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        checks
            .iter()
            .filter(|(_, c)| !c())
            .map(|(n, _)| n.clone())
            .collect()
    }

    pub fn is_ready(&self) -> bool {
        self.failing().is_empty()
    }
}

/// Bind the probe port now (so bind errors surface at start-up) and return the serving future.
pub async fn bind(
    args: &ProbeArgs,
    readiness: Readiness,
    metrics: Arc<Metrics>,
    shutdown: Signal,
) -> Result<(SocketAddr, impl Future<Output = ()> + use<>), ProbeError> {
    let listener = TcpListener::bind(args.probe_listen)
        .await
        .map_err(|source| ProbeError::Bind {
            addr: args.probe_listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| ProbeError::Bind {
        addr: args.probe_listen,
        source,
    })?;
    let max_connections = args.probe_max_connections;
    let serve = async move {
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs(10))
            .keep_alive(true);
        let stop = shutdown.clone();
        crate::accept::run(
            &listener,
            max_connections,
            async move { stop.stopped().await },
            "probes",
            |stream, _, permit| {
                let readiness = readiness.clone();
                let metrics = metrics.clone();
                let conn = http.serve_connection(
                    TokioIo::new(stream),
                    hyper::service::service_fn(move |req| {
                        let resp = respond(&req, &readiness, &metrics);
                        async move { Ok::<_, Infallible>(resp) }
                    }),
                );
                let shutdown = shutdown.clone();
                tokio::spawn(async move {
                    let mut conn = std::pin::pin!(conn);
                    tokio::select! {
                        _ = conn.as_mut() => {}
                        _ = shutdown.stopped() => {
                            conn.as_mut().graceful_shutdown();
                            let _ = tokio::time::timeout(Duration::from_secs(1), conn).await;
                        }
                    }
                    drop(permit);
                });
            },
        )
        .await;
    };
    Ok((addr, serve))
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

fn respond(
    req: &Request<Incoming>,
    readiness: &Readiness,
    metrics: &Metrics,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match req.uri().path() {
        "/healthz" | "/livez" => text(StatusCode::OK, "ok\n"),
        "/readyz" => {
            let failing = readiness.failing();
            let mut body = if failing.is_empty() {
                "ok\n".to_string()
            } else {
                format!("not ready: {}\n", failing.join(", "))
            };
            for line in readiness.details() {
                body.push_str(&line);
                body.push('\n');
            }
            let status = if failing.is_empty() {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            text(status, body)
        }
        "/metrics" => {
            let mut r = text(StatusCode::OK, metrics.encode());
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            r
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_lists_failing_conditions() {
        let r = Readiness::new();
        let cert = r.condition("certificate", false);
        let _ok = r.condition("policies", true);
        let extra = Arc::new(AtomicBool::new(true));
        let e = extra.clone();
        r.add_check("leader-ca-published", move || e.load(Ordering::SeqCst));
        assert_eq!(r.failing(), vec!["certificate".to_string()]);
        cert.set(true);
        assert!(r.is_ready());
        extra.store(false, Ordering::SeqCst);
        assert_eq!(r.failing(), vec!["leader-ca-published".to_string()]);
    }

    #[test]
    fn details_are_shown_and_never_fail_readiness() {
        let r = Readiness::new();
        let said = Arc::new(AtomicBool::new(true));
        let s = said.clone();
        r.add_detail("usage", move || {
            s.load(Ordering::SeqCst)
                .then(|| "caches not synced".to_string())
        });
        assert!(r.is_ready());
        assert_eq!(r.details(), vec!["usage: caches not synced".to_string()]);
        said.store(false, Ordering::SeqCst);
        assert!(r.details().is_empty());
    }
}
