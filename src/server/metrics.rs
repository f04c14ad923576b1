//! The webhook port's metrics (registered by this part, `ServerMetrics::new`): the serving
//! certificate's expiry and reloads, failed TLS handshakes, open connections.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::metrics::{ReloadLabels, ReloadResult};

/// The serving certificate's and the connections' metrics.
#[derive(Clone, Debug, Default)]
pub struct ServerMetrics {
    /// not-after of the serving certificate, unix seconds (0 before the first good pair).
    pub cert_not_after_seconds: Gauge,
    /// Certificate pair (re)loads by result.
    pub cert_reloads: Family<ReloadLabels, Counter>,
    /// TLS handshakes that failed or timed out.
    pub tls_handshake_failures: Counter,
    /// Connections currently open on the webhook port.
    pub open_connections: Gauge,
}

impl ServerMetrics {
    /// Create and register them.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "certificate_not_after_seconds",
            "Expiry of the serving certificate, unix seconds",
            m.cert_not_after_seconds.clone(),
        );
        registry.register(
            "certificate_reloads",
            "Serving certificate (re)loads by result",
            m.cert_reloads.clone(),
        );
        registry.register(
            "tls_handshake_failures",
            "TLS handshakes that failed or timed out",
            m.tls_handshake_failures.clone(),
        );
        registry.register(
            "open_connections",
            "Connections currently open on the webhook port",
            m.open_connections.clone(),
        );
        m
    }

    /// Count one certificate (re)load.
    pub fn cert_reload(&self, result: ReloadResult) {
        self.cert_reloads
            .get_or_create(&ReloadLabels { result })
            .inc();
    }
}
