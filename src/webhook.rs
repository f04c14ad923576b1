//! The webhook's request handler, served by `server`: `POST /mutate` -> `admission`, and with
//! `--request-cap` `POST /validate` -> `placement`, through one skeleton (`route`).
//!
//! The hot path: match the path and method, check the content type and length, collect the
//! body into one buffer sized from `Content-Length` (within the API server's own `timeout`),
//! take a lock-free snapshot of the policies, call `admission` inline, count, log, answer,
//! observe the duration. `/validate` goes the same way to `placement` instead.
//! Every refusal is a short text message. `admission` is the one panic guard: it fails open
//! and never panics, so nothing here catches panics.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;

use overcommit_core::duration::parse_duration;
use overcommit_core::policy::PolicySet;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::admission::metrics::ReviewMetrics;
use crate::admission::{self, Handled, Outcome, Settings};
use crate::placement::metrics::PlacementMetrics;
use crate::placement::{self, CapOutcome, PlacementSource};
use crate::server::Handler;
use crate::server::budget::{BodyBudget, Exhausted, Reservation};

/// The path the mutating webhook configuration points at.
pub const MUTATE_PATH: &str = "/mutate";
/// The path of the placement cap (`--request-cap`), for the validating configuration.
pub const VALIDATE_PATH: &str = "/validate";

/// Bodies above this are reviewed with `block_in_place`, so that one huge review does not
/// stall the other connections sharing this worker thread.
const INLINE_BODY_LIMIT: usize = 1024 * 1024;
/// Buffer to start with when the client did not say how much it sends.
const DEFAULT_BODY_CAPACITY: usize = 64 * 1024;

/// HTTP responses that never reached admission (`status` label), e.g. 404, 405, 413, 415.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectLabels {
    pub status: u16,
}

/// The handler's metrics: each endpoint's, and the refusals both share.
#[derive(Clone, Debug)]
pub struct WebhookMetrics {
    pub reviews: ReviewMetrics,
    pub placement: PlacementMetrics,
    /// Requests refused before admission, by HTTP status.
    pub http_rejects: Family<RejectLabels, Counter>,
}

impl WebhookMetrics {
    /// Create and register them (the endpoints' through their parts).
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self {
            reviews: ReviewMetrics::new(registry),
            placement: PlacementMetrics::new(registry),
            http_rejects: Family::default(),
        };
        registry.register(
            "http_rejects",
            "Requests refused before admission, by HTTP status",
            m.http_rejects.clone(),
        );
        m
    }
}

/// Everything a request needs; shared by all connections.
pub struct Webhook {
    pub policies: Arc<ArcSwap<PolicySet>>,
    pub settings: Settings,
    pub metrics: WebhookMetrics,
    pub max_body_bytes: usize,
    /// Upper bound on reading one body (the API server's `timeout` may shorten it).
    pub body_timeout: Duration,
    /// The node cache and pod index behind `/validate`; None without `--request-cap` (then
    /// `/validate` is not found).
    pub placement: Option<Arc<dyn PlacementSource>>,
}

#[derive(Debug)]
enum BodyError {
    TooLarge,
    Read(Box<dyn std::error::Error + Send + Sync>),
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

/// Which endpoint a request is for.
#[derive(Clone, Copy)]
enum Endpoint<'w> {
    /// `/mutate`: the node and pod rules (`admission`).
    Mutate,
    /// `/validate`: the placement cap (`placement`).
    Validate(&'w dyn PlacementSource),
}

impl Webhook {
    /// One skeleton for both endpoints: the path, the method, the content type and length, the
    /// body read within the size limit, the in-flight budget and the API server's `?timeout=`,
    /// the same refusals for both, then the endpoint's answer and its duration.
    async fn route(&self, req: Request<Incoming>, budget: BodyBudget) -> Response<Full<Bytes>> {
        let start = Instant::now();
        let endpoint = match (req.uri().path(), &self.placement) {
            (MUTATE_PATH, _) => Endpoint::Mutate,
            (VALIDATE_PATH, Some(placement)) => Endpoint::Validate(placement.as_ref()),
            _ => {
                return self.reject(
                    StatusCode::NOT_FOUND,
                    "not found; the webhook paths are /mutate and, with --request-cap, /validate\n",
                );
            }
        };
        // The reservation is held until the review is answered and the body freed.
        let (body, _reserved) = match self.read_request(req, &budget, start).await {
            Ok(read) => read,
            Err(refused) => return refused,
        };
        let (response, duration) = match endpoint {
            Endpoint::Mutate => (self.mutate(&body), &self.metrics.reviews.duration),
            Endpoint::Validate(source) => (
                self.validate(&body, source).await,
                &self.metrics.placement.duration,
            ),
        };
        duration.observe(start.elapsed());
        response
    }

    /// The request's checks and its body, or the refusal to answer instead.
    async fn read_request(
        &self,
        req: Request<Incoming>,
        budget: &BodyBudget,
        start: Instant,
    ) -> Result<(Bytes, Reservation), Response<Full<Bytes>>> {
        if req.method() != Method::POST {
            let mut r = self.reject(StatusCode::METHOD_NOT_ALLOWED, "only POST is allowed\n");
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("POST"));
            return Err(r);
        }
        if !is_json(req.headers().get(header::CONTENT_TYPE)) {
            return Err(self.reject(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Content-Type must be application/json\n",
            ));
        }
        let Ok(declared) = content_length(req.headers().get(header::CONTENT_LENGTH)) else {
            return Err(self.reject(StatusCode::BAD_REQUEST, "invalid Content-Length\n"));
        };
        let version = req.version();
        if declared.is_some_and(|n| n > self.max_body_bytes as u64) {
            return Err(self.too_large(version));
        }
        let timeout = req
            .uri()
            .query()
            .and_then(query_timeout)
            .map_or(self.body_timeout, |t| t.min(self.body_timeout));
        let body = req.into_body();
        let limit = self.max_body_bytes;
        match read_body(body, budget, declared, limit, start, timeout).await {
            Ok(read) => Ok(read),
            Err(BodyError::TooLarge) => Err(self.too_large(version)),
            // The API server fails open on 503 (failurePolicy: Ignore).
            Err(BodyError::Busy) => Err(self.body_unread(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many request bodies in flight (--max-inflight-body-bytes); retry later\n",
                version,
            )),
            Err(BodyError::TimedOut) => Err(self.reject(
                StatusCode::REQUEST_TIMEOUT,
                "request body not received in time\n",
            )),
            Err(BodyError::Read(e)) => {
                tracing::debug!(error = %e, "reading request body failed");
                Err(self.reject(StatusCode::BAD_REQUEST, "request body could not be read\n"))
            }
        }
    }

    /// `POST /mutate`: the review (`admission::handle`), counted and logged.
    fn mutate(&self, body: &[u8]) -> Response<Full<Bytes>> {
        let handled = self.review(body);
        if let Some(reason) = &handled.error {
            match handled.outcome {
                Outcome::FailedOpen => tracing::warn!(
                    %reason,
                    operation = %handled.operation,
                    "review failed open: allowed without a patch"
                ),
                _ => tracing::debug!(%reason, status = handled.status, "review refused"),
            }
        }
        self.metrics.reviews.record(&handled);
        json_response(handled.status, handled.body)
    }

    /// `POST /validate`: the placement cap (`placement::handle_fetching`), counted and logged.
    async fn validate(&self, body: &[u8], source: &dyn PlacementSource) -> Response<Full<Bytes>> {
        let policies = self.policies.load_full();
        let validated = placement::handle_fetching(body, &policies, source).await;
        self.metrics.placement.record(&validated);
        match (validated.outcome, &validated.message) {
            (CapOutcome::Denied | CapOutcome::Warned | CapOutcome::Exempted, Some(message)) => {
                tracing::info!(
                    outcome = validated.outcome.as_str(),
                    %message,
                    "request cap"
                )
            }
            (CapOutcome::FailedOpen, Some(reason)) => {
                tracing::warn!(%reason, "placement check failed open: allowed")
            }
            _ => {}
        }
        json_response(validated.status, validated.body)
    }

    fn review(&self, body: &[u8]) -> Handled {
        let policies = self.policies.load();
        // The one call into admission, which is the panic guard: it never panics.
        let run = || admission::handle(body, &policies, &self.settings);
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

/// An answer's JSON body with its status (200 unless the endpoint said otherwise).
fn json_response(status: u16, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// `application/json`, any case, with or without parameters (`; charset=utf-8`).
fn is_json(v: Option<&HeaderValue>) -> bool {
    let Some(v) = v else {
        return false;
    };
    // What the API server sends, compared as it is (every review passes here).
    if v.as_bytes() == b"application/json" {
        return true;
    }
    let Ok(v) = v.to_str() else {
        return false;
    };
    let mime = v.split(';').next().unwrap_or("").trim();
    mime.eq_ignore_ascii_case("application/json")
}

/// The declared length: decimal digits (one leading `+` allowed, as `u64::from_str` allows),
/// whitespace around them ignored; anything else, or a value above `u64::MAX`, is invalid.
fn content_length(v: Option<&HeaderValue>) -> Result<Option<u64>, ()> {
    let Some(v) = v else {
        return Ok(None);
    };
    let text = v.as_bytes().trim_ascii();
    let digits = text.strip_prefix(b"+").unwrap_or(text);
    if digits.is_empty() {
        return Err(());
    }
    digits
        .iter()
        .try_fold(0u64, |n, &b| {
            let digit = u64::from(b.checked_sub(b'0').filter(|d| *d < 10)?);
            n.checked_mul(10)?.checked_add(digit)
        })
        .map(Some)
        .ok_or(())
}

/// Collect the body, reserving its bytes in the budget as they arrive (a small declared
/// length at once) and before they are kept, within `timeout` of `started`.
///
/// Zero-copy when the body arrives in one frame (the usual case: hyper has it buffered by
/// the time the handler runs); frames are joined into one buffer otherwise. The timer is
/// armed only once the body has to be waited for, so a body already received costs no timer
/// registration.
async fn read_body<B>(
    body: B,
    budget: &BodyBudget,
    declared: Option<u64>,
    limit: usize,
    started: Instant,
    timeout: Duration,
) -> Result<(Bytes, Reservation), BodyError>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let deadline = tokio::time::Instant::from_std(started) + timeout;
    let mut body = pin!(body);
    let mut timer: Option<Pin<Box<tokio::time::Sleep>>> = None;
    let mut reserved = budget.start(declared).await?;
    let capacity = declared
        .map_or(DEFAULT_BODY_CAPACITY, |n| n as usize)
        .min(limit);
    let mut single: Option<Bytes> = None;
    let mut joined: Vec<u8> = Vec::new();
    let mut total = 0usize;
    loop {
        let next = poll_fn(|cx| match body.as_mut().poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(Ok(frame)),
            Poll::Pending => {
                let timer =
                    timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                timer.as_mut().poll(cx).map(|()| Err(BodyError::TimedOut))
            }
        })
        .await?;
        let Some(frame) = next else { break };
        let Ok(data) = frame.map_err(|e| BodyError::Read(e.into()))?.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        total += data.len();
        if total > limit {
            return Err(BodyError::TooLarge);
        }
        reserved.cover(total as u64).await?;
        if total == data.len() {
            single = Some(data);
        } else {
            if let Some(first) = single.take() {
                joined.reserve_exact(capacity.max(total));
                joined.extend_from_slice(&first);
            }
            joined.extend_from_slice(&data);
        }
    }
    // The bytes stay reserved until the review is answered and the body freed.
    Ok((single.unwrap_or_else(|| Bytes::from(joined)), reserved))
}

/// The API server's `timeout` query parameter, read with the project's one duration grammar.
/// The API server rounds its remaining deadline up to whole seconds and writes it with Go's
/// `Duration.String` (k8s.io/apiserver, webhook dispatchers), so it only sends `10s`, `1m0s`,
/// `1h0m0s`: unit groups the grammar reads, never fractions. Anything it cannot read leaves
/// the body timeout alone (the caller's `map_or`).
fn query_timeout(query: &str) -> Option<Duration> {
    let value = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("timeout="))?;
    parse_duration(value).ok()
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::task::Context;

    use hyper::body::Frame;

    use super::*;
    use crate::server::budget::Budget;

    /// A body that yields these frames, then ends or (stall) never ends.
    struct Frames {
        frames: VecDeque<Bytes>,
        stall: bool,
    }

    impl hyper::body::Body for Frames {
        type Data = Bytes;
        type Error = std::io::Error;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            match self.frames.pop_front() {
                Some(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
                None if self.stall => Poll::Pending,
                None => Poll::Ready(None),
            }
        }
    }

    async fn read(
        frames: &[&'static [u8]],
        stall: bool,
        limit: usize,
    ) -> Result<(Bytes, u64), BodyError> {
        let budget = BodyBudget::new(Arc::new(Budget::new(64 << 20)));
        let body = Frames {
            frames: frames.iter().map(|f| Bytes::from_static(f)).collect(),
            stall,
        };
        let timeout = Duration::from_millis(50);
        let (bytes, reserved) =
            read_body(body, &budget, None, limit, Instant::now(), timeout).await?;
        Ok((bytes, reserved.held()))
    }

    #[tokio::test]
    async fn body_in_one_frame_is_not_copied() {
        static ONE: &[u8] = b"{\"kind\":\"AdmissionReview\"}";
        let (bytes, held) = read(&[ONE], false, 1024).await.expect("read");
        assert_eq!(bytes.as_ptr(), ONE.as_ptr(), "the frame itself, not a copy");
        assert!(held >= ONE.len() as u64);
    }

    #[tokio::test]
    async fn frames_are_joined_in_order_and_empty_ones_skipped() {
        let (bytes, _) = read(&[b"{\"a\":", b"", b"1", b"}"], false, 1024)
            .await
            .expect("read");
        assert_eq!(&bytes[..], b"{\"a\":1}");
        let (bytes, _) = read(&[], false, 1024).await.expect("empty body");
        assert!(bytes.is_empty());
    }

    #[tokio::test]
    async fn limit_counts_all_frames() {
        let r = read(&[b"12345", b"678"], false, 7).await;
        assert!(matches!(r, Err(BodyError::TooLarge)), "{r:?}");
        assert!(read(&[b"12345", b"67"], false, 7).await.is_ok());
    }

    #[tokio::test]
    async fn a_body_that_stops_arriving_times_out() {
        let started = Instant::now();
        let r = read(&[b"{\"partial\":"], true, 1024).await;
        assert!(matches!(r, Err(BodyError::TimedOut)), "{r:?}");
        assert!(started.elapsed() >= Duration::from_millis(50));
    }

    #[test]
    fn content_types() {
        let ok = [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON;charset=UTF-8",
            " application/json\t",
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
    fn api_server_timeouts() {
        // What the API server sends (Go's Duration.String of whole seconds) and what else the
        // grammar reads; a value it refuses leaves the body timeout in force.
        let cases = [
            ("timeout=10s", Some(Duration::from_secs(10))),
            ("timeout=2s", Some(Duration::from_secs(2))),
            ("timeout=30s", Some(Duration::from_secs(30))),
            ("timeout=1m0s", Some(Duration::from_secs(60))),
            ("timeout=1m30s", Some(Duration::from_secs(90))),
            ("timeout=1h0m0s", Some(Duration::from_secs(3600))),
            ("timeout=500ms", Some(Duration::from_millis(500))),
            ("a=b&timeout=5s", Some(Duration::from_secs(5))),
            ("timeout=10", Some(Duration::from_secs(10))),
            ("a=b", None),
            ("timeout=", None),
            ("timeout=s", None),
            ("timeout=-1s", None),
            ("timeout=+1s", None),
            ("timeout=1ss", None),
            ("timeout=1.5s", None),
            ("timeout=10us", None),
        ];
        for (query, want) in cases {
            assert_eq!(query_timeout(query), want, "{query}");
        }
    }

    #[test]
    fn content_lengths() {
        let cases = [
            ("53456", Ok(Some(53456))),
            ("0", Ok(Some(0))),
            (" 12 ", Ok(Some(12))),
            ("+7", Ok(Some(7))),
            ("18446744073709551615", Ok(Some(u64::MAX))),
            ("18446744073709551616", Err(())),
            ("", Err(())),
            ("+", Err(())),
            ("-1", Err(())),
            ("1 2", Err(())),
            ("0x10", Err(())),
            ("++1", Err(())),
        ];
        for (text, want) in cases {
            let value = HeaderValue::from_static(text);
            assert_eq!(content_length(Some(&value)), want, "{text:?}");
            // As `u64::from_str` of the trimmed text answers.
            let std = text.trim().parse::<u64>().map(Some).map_err(|_| ());
            assert_eq!(content_length(Some(&value)), std, "{text:?}");
        }
        assert_eq!(content_length(None), Ok(None));
    }
}
