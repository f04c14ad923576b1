//! The webhook's request handler, served by `server`: `POST /mutate` -> `admission`.
//!
//! The hot path: match the path and method, check the content type and length, collect the
//! body into one buffer sized from `Content-Length` (within the API server's own `timeout`),
//! take a lock-free snapshot of the policies, call `admission` inline, count, log, answer.
//! Every refusal is a short text message. `admission` is the one panic guard: it fails open
//! and never panics, so nothing here catches panics.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use overcommit_core::policy::PolicySet;

use crate::admission::{self, Handled, Outcome, ReviewResource, Settings};
use crate::metrics::{HeartbeatsKeptLabels, Metrics, RejectLabels};
use crate::server::Handler;
use crate::server::budget::{BodyBudget, Exhausted, Reservation};

/// What the handler needs from `admission::Handled`, plus why it failed open or was refused.
struct Answer {
    status: u16,
    body: Vec<u8>,
    resource: ReviewResource,
    operation: String,
    outcome: Outcome,
    /// Why a review failed open or was refused (for the log).
    reason: Option<String>,
    heartbeats_kept: bool,
}

impl From<Handled> for Answer {
    fn from(h: Handled) -> Self {
        let Handled {
            status,
            body,
            resource,
            operation,
            outcome,
            error,
            heartbeats_kept,
        } = h;
        Self {
            status,
            body,
            resource,
            operation,
            outcome,
            reason: error.map(|e| e.to_string()),
            heartbeats_kept,
        }
    }
}

/// The one path the webhook configuration points at.
pub const MUTATE_PATH: &str = "/mutate";

/// Bodies above this are reviewed with `block_in_place`, so that one huge review does not
/// stall the other connections sharing this worker thread.
const INLINE_BODY_LIMIT: usize = 1024 * 1024;
/// Buffer to start with when the client did not say how much it sends.
const DEFAULT_BODY_CAPACITY: usize = 64 * 1024;

/// Everything a request needs; shared by all connections.
pub struct Webhook {
    pub policies: Arc<ArcSwap<PolicySet>>,
    pub settings: Settings,
    pub metrics: Arc<Metrics>,
    pub max_body_bytes: usize,
    /// Upper bound on reading one body (the API server's `timeout` may shorten it).
    pub body_timeout: Duration,
}

#[derive(Debug)]
enum BodyError {
    TooLarge,
    Read(hyper::Error),
    TimedOut,
    Busy,
}

impl From<Exhausted> for BodyError {
    fn from(_: Exhausted) -> Self {
        BodyError::Busy
    }
}

impl Handler for Webhook {
    async fn handle(&self, req: Request<Incoming>, budget: BodyBudget) -> Response<Full<Bytes>> {
        self.route(req, budget).await
    }
}

impl Webhook {
    async fn route(&self, req: Request<Incoming>, budget: BodyBudget) -> Response<Full<Bytes>> {
        let start = Instant::now();
        if req.uri().path() != MUTATE_PATH {
            return self.reject(
                StatusCode::NOT_FOUND,
                "not found; the webhook path is /mutate\n",
            );
        }
        if req.method() != Method::POST {
            let mut r = self.reject(StatusCode::METHOD_NOT_ALLOWED, "only POST is allowed\n");
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("POST"));
            return r;
        }
        if !is_json(req.headers().get(header::CONTENT_TYPE)) {
            return self.reject(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Content-Type must be application/json\n",
            );
        }
        let declared = match content_length(req.headers().get(header::CONTENT_LENGTH)) {
            Ok(n) => n,
            Err(()) => return self.reject(StatusCode::BAD_REQUEST, "invalid Content-Length\n"),
        };
        let version = req.version();
        if declared.is_some_and(|n| n > self.max_body_bytes as u64) {
            return self.too_large(version);
        }
        let timeout = req
            .uri()
            .query()
            .and_then(query_timeout)
            .map_or(self.body_timeout, |t| t.min(self.body_timeout));
        // The reservation is held until the review is answered and the body freed.
        let (body, _reserved) = match read_body(
            req.into_body(),
            &budget,
            declared,
            self.max_body_bytes,
            timeout,
        )
        .await
        {
            Ok(read) => read,
            Err(BodyError::TooLarge) => return self.too_large(version),
            // The API server fails open on 503 (failurePolicy: Ignore).
            Err(BodyError::Busy) => {
                return self.body_unread(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "too many request bodies in flight (--max-inflight-body-bytes); retry later\n",
                    version,
                );
            }
            Err(BodyError::TimedOut) => {
                return self.reject(
                    StatusCode::REQUEST_TIMEOUT,
                    "request body not received in time\n",
                );
            }
            Err(BodyError::Read(e)) => {
                tracing::debug!(error = %e, "reading request body failed");
                return self.reject(StatusCode::BAD_REQUEST, "request body could not be read\n");
            }
        };
        let handled = self.review(&body);
        if let Some(reason) = &handled.reason {
            match handled.outcome {
                Outcome::FailedOpen => tracing::warn!(
                    %reason,
                    operation = %handled.operation,
                    "review failed open: allowed without a patch"
                ),
                _ => tracing::debug!(%reason, status = handled.status, "review refused"),
            }
        }
        self.metrics
            .count_review(handled.resource, &handled.operation, handled.outcome);
        if handled.heartbeats_kept {
            let outcome = handled.outcome.into();
            let labels = HeartbeatsKeptLabels { outcome };
            self.metrics.heartbeats_kept.get_or_create(&labels).inc();
        }
        let mut resp = Response::new(Full::new(Bytes::from(handled.body)));
        *resp.status_mut() = StatusCode::from_u16(handled.status).unwrap_or(StatusCode::OK);
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        self.metrics.review_duration.observe(start.elapsed());
        resp
    }

    fn review(&self, body: &[u8]) -> Answer {
        let policies = self.policies.load();
        // The one call into admission, which is the panic guard: it never panics.
        let run = || Answer::from(admission::handle(body, &policies, &self.settings));
        if body.len() > INLINE_BODY_LIMIT {
            tokio::task::block_in_place(run)
        } else {
            run()
        }
    }

    fn reject(&self, status: StatusCode, msg: &'static str) -> Response<Full<Bytes>> {
        self.metrics
            .http_rejects
            .get_or_create(&RejectLabels {
                status: status.as_u16(),
            })
            .inc();
        let mut r = Response::new(Full::new(Bytes::from_static(msg.as_bytes())));
        *r.status_mut() = status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r
    }

    fn too_large(&self, version: http::Version) -> Response<Full<Bytes>> {
        self.body_unread(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body exceeds the size limit (--max-body-bytes)\n",
            version,
        )
    }

    /// A refusal before the whole body was read.
    fn body_unread(
        &self,
        status: StatusCode,
        msg: &'static str,
        version: http::Version,
    ) -> Response<Full<Bytes>> {
        let mut r = self.reject(status, msg);
        // HTTP/1.1: the rest of the body is not read, so the connection cannot be reused.
        // (HTTP/2 resets just the stream; connection headers are not allowed there.)
        if version <= http::Version::HTTP_11 {
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        r
    }
}

/// `application/json`, any case, with or without parameters (`; charset=utf-8`).
fn is_json(v: Option<&HeaderValue>) -> bool {
    let Some(v) = v.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let mime = v.split(';').next().unwrap_or("").trim();
    mime.eq_ignore_ascii_case("application/json")
}

fn content_length(v: Option<&HeaderValue>) -> Result<Option<u64>, ()> {
    match v {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(Some)
            .ok_or(()),
    }
}

/// Collect the body into one buffer, reserving its bytes in the budget as they arrive
/// (a small declared length at once) and before they are copied.
async fn read_body(
    mut body: Incoming,
    budget: &BodyBudget,
    declared: Option<u64>,
    limit: usize,
    timeout: Duration,
) -> Result<(Vec<u8>, Reservation), BodyError> {
    let collect = async {
        let mut reserved = budget.start(declared).await?;
        let capacity = declared.map_or(DEFAULT_BODY_CAPACITY, |n| n as usize);
        let mut buf = Vec::with_capacity(capacity.min(limit));
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(BodyError::Read)?;
            if let Ok(data) = frame.into_data() {
                let len = buf.len() + data.len();
                if len > limit {
                    return Err(BodyError::TooLarge);
                }
                reserved.cover(len as u64).await?;
                buf.extend_from_slice(&data);
            }
        }
        // The bytes stay reserved until the review is answered and the buffer freed.
        Ok((buf, reserved))
    };
    tokio::time::timeout(timeout, collect)
        .await
        .unwrap_or(Err(BodyError::TimedOut))
}

/// The API server's `timeout` query parameter, a Go duration such as `10s` or `1m30s`.
fn query_timeout(query: &str) -> Option<Duration> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("timeout="))
        .and_then(parse_go_duration)
}

fn parse_go_duration(s: &str) -> Option<Duration> {
    let mut rest = s;
    let mut total = Duration::ZERO;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let secs = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total += Duration::try_from_secs_f64(value * secs).ok()?;
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types() {
        let ok = [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON;charset=UTF-8",
        ];
        for v in ok {
            assert!(is_json(Some(&HeaderValue::from_static(v))), "{v}");
        }
        let bad = ["text/plain", "application/jsonx", "application/yaml", ""];
        for v in bad {
            assert!(!is_json(Some(&HeaderValue::from_static(v))), "{v}");
        }
        assert!(!is_json(None));
    }

    #[test]
    fn go_durations() {
        let cases = [
            ("10s", Some(Duration::from_secs(10))),
            ("2s", Some(Duration::from_secs(2))),
            ("500ms", Some(Duration::from_millis(500))),
            ("1m30s", Some(Duration::from_secs(90))),
            ("1.5s", Some(Duration::from_millis(1500))),
            ("", None),
            ("10", None),
            ("s", None),
            ("-1s", None),
        ];
        for (s, want) in cases {
            assert_eq!(parse_go_duration(s), want, "{s}");
        }
        assert_eq!(
            query_timeout("a=b&timeout=5s"),
            Some(Duration::from_secs(5))
        );
        assert_eq!(query_timeout("a=b"), None);
    }
}
