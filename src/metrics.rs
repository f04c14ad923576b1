//! Prometheus metrics: the process's one registry (prefix `kube_overcommit_`), shared as
//! `Arc<Metrics>`, and what the parts' metrics share (the reload result label, the lock-free
//! latency histogram). Each part registers its own metrics next to its code, in the pattern of
//! linkerd's `register(sub_registry)`: `XMetrics::new(registry: &mut Registry)`, built through
//! [`Metrics::with_registry`] (`admission::metrics`, `placement::metrics`, `webhook`,
//! `server::metrics`, `sources::metrics`, the leader's, the events'); `/metrics` on the probe
//! port exports the registry. This module knows none of them.
//!
//! The review hot path only touches counters its part pre-created (one atomic add) and the
//! lock-free histogram, never a registry lock or a label-map lookup.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{
    EncodeLabelSet, EncodeLabelValue, EncodeMetric, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// Prefix of every metric name this binary exports.
pub const PREFIX: &str = "kube_overcommit";

/// `result` label of reload counters (the serving certificate, policies, metrics.k8s.io polls).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ReloadResult {
    success,
    error,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    pub result: ReloadResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

/// The process's registry.
pub struct Metrics {
    registry: Mutex<Registry>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// The registry with the build information; the parts add theirs.
    pub fn new() -> Self {
        let mut root = Registry::with_prefix(PREFIX);
        root.register(
            "build",
            "Build information",
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            }),
        );
        Self {
            registry: Mutex::new(root),
        }
    }

    /// Run `f` with the registry (already prefixed `kube_overcommit_`): a part registers its
    /// metrics, `m.with_registry(ReviewMetrics::new)`, or creates a sub-registry:
    /// `m.with_registry(|r| { let leader = r.sub_registry_with_prefix("leader"); ... })`.
    pub fn with_registry<R>(&self, f: impl FnOnce(&mut Registry) -> R) -> R {
        let mut guard = match self.registry.lock() {
            Ok(g) => g,
            // A panic while registering cannot leave the registry half-written in a way that
            // matters for export; keep serving metrics.
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut guard)
    }

    /// The registry in the Prometheus/OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(8 * 1024);
        self.with_registry(|r| {
            if let Err(e) = prometheus_client::encoding::text::encode(&mut out, r) {
                tracing::warn!(error = %e, "encoding metrics failed");
            }
        });
        out
    }
}

/// Upper bounds of the latency buckets in nanoseconds: 10 µs doubling up to ~1.3 s.
const BUCKET_COUNT: usize = 18;
const FIRST_BUCKET_NANOS: u64 = 10_000;

/// A histogram of durations whose `observe` is a few relaxed atomic adds (no lock), unlike
/// `prometheus_client`'s histogram which takes a write lock per observation.
#[derive(Clone, Debug, Default)]
pub struct LatencyHistogram {
    inner: std::sync::Arc<HistogramInner>,
}

#[derive(Debug, Default)]
struct HistogramInner {
    /// Non-cumulative counts; the last slot is +Inf.
    buckets: [AtomicU64; BUCKET_COUNT + 1],
    sum_nanos: AtomicU64,
    count: AtomicU64,
}

impl LatencyHistogram {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn observe(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let mut bound = FIRST_BUCKET_NANOS;
        let mut i = 0;
        while i < BUCKET_COUNT && nanos > bound {
            bound = bound.saturating_mul(2);
            i += 1;
        }
        let inner = &*self.inner;
        inner.buckets[i].fetch_add(1, Ordering::Relaxed);
        inner.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
        inner.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.inner.count.load(Ordering::Relaxed)
    }
}

impl prometheus_client::metrics::TypedMetric for LatencyHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let inner = &*self.inner;
        let mut buckets = Vec::with_capacity(BUCKET_COUNT + 1);
        let mut bound = FIRST_BUCKET_NANOS;
        for slot in &inner.buckets[..BUCKET_COUNT] {
            buckets.push((bound as f64 / 1e9, slot.load(Ordering::Relaxed)));
            bound = bound.saturating_mul(2);
        }
        buckets.push((
            f64::MAX,
            inner.buckets[BUCKET_COUNT].load(Ordering::Relaxed),
        ));
        // Count is derived from the buckets so that the exported histogram is self-consistent.
        let count = buckets.iter().map(|(_, c)| c).sum();
        let sum = inner.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::gauge::Gauge;

    use super::*;

    #[test]
    fn build_info_is_exported() {
        let text = Metrics::new().encode();
        assert!(
            text.contains("kube_overcommit_build_info{version="),
            "{text}"
        );
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_sub_millisecond() {
        let h = LatencyHistogram::new();
        h.observe(Duration::from_micros(5)); // <= 10µs
        h.observe(Duration::from_micros(15)); // <= 20µs
        h.observe(Duration::from_secs(5)); // +Inf
        let m = Metrics::new();
        m.with_registry(|r| r.register("test_latency_seconds", "test", h.clone()));
        let text = m.encode();
        assert!(
            text.contains(r#"kube_overcommit_test_latency_seconds_bucket{le="1e-5"} 1"#)
                || text.contains(r#"kube_overcommit_test_latency_seconds_bucket{le="0.00001"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kube_overcommit_test_latency_seconds_bucket{le="+Inf"} 3"#),
            "{text}"
        );
        assert!(
            text.contains("kube_overcommit_test_latency_seconds_count 3"),
            "{text}"
        );
        assert_eq!(h.count(), 3);
    }

    #[test]
    fn other_modules_can_register_later() {
        let m = Metrics::new();
        let leader = Gauge::<i64>::default();
        m.with_registry(|r| {
            r.sub_registry_with_prefix("leader").register(
                "is_leader",
                "1 when this replica holds the Lease",
                leader.clone(),
            )
        });
        leader.set(1);
        assert!(m.encode().contains("kube_overcommit_leader_is_leader 1"));
    }
}
