//! NodeMetrics from metrics.k8s.io/v1beta1 (metrics-server), listed page by page: each node's
//! usage in the scheduler's units (cpu millicores rounded up, memory bytes) and when it was
//! measured. Used by the usage poller (`sources::usage`) and `kube-overcommit status`.
//!
//! The client passed in should not retry: kube's default client retries 503 and 429 with a
//! backoff growing to minutes, and an aggregated metrics API that is down answers 503 at once.

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use overcommit_core::quantity::{Quantity, QuantityError};

/// One node's usage as metrics-server last measured it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSample {
    pub node: String,
    /// millicores (rounded up); None when not reported.
    pub cpu_millis: Option<u128>,
    /// bytes; None when not reported.
    pub memory_bytes: Option<u128>,
    /// `timestamp` (the end of the interval measured), ms since the Unix epoch; None when
    /// absent or unreadable.
    pub at_ms: Option<i64>,
    /// `window` (the interval measured, a Go duration such as `10.059s`), ms; None when absent
    /// or unreadable.
    pub window_ms: Option<u64>,
}

/// Why NodeMetrics could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("metrics.k8s.io is not served (no metrics-server?)")]
    NotServed,
    #[error("metrics.k8s.io is unavailable (metrics-server down?)")]
    Unavailable,
    #[error("listing nodes.metrics.k8s.io: {0}")]
    Kube(#[source] kube::Error),
    #[error("listing nodes.metrics.k8s.io took longer than --usage-interval")]
    Timeout,
    #[error("node {node}: usage {resource} {text:?}: {source}")]
    Quantity {
        node: String,
        resource: &'static str,
        text: String,
        #[source]
        source: QuantityError,
    },
}

/// Every node's usage, one list call per page.
pub async fn list(client: &Client) -> Result<Vec<NodeSample>, MetricsError> {
    let resource = ApiResource {
        group: "metrics.k8s.io".into(),
        version: "v1beta1".into(),
        api_version: "metrics.k8s.io/v1beta1".into(),
        kind: "NodeMetrics".into(),
        plural: "nodes".into(),
    };
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let listed = super::list_pages(api).await.map_err(|e| match &e {
        kube::Error::Api(status) if status.code == 404 => MetricsError::NotServed,
        kube::Error::Api(status) if status.code == 503 => MetricsError::Unavailable,
        _ => MetricsError::Kube(e),
    })?;
    listed
        .iter()
        .filter_map(|m| sample(m).transpose())
        .collect()
}

/// One NodeMetrics object read (None: it has no name).
fn sample(metrics: &DynamicObject) -> Result<Option<NodeSample>, MetricsError> {
    let Some(node) = metrics.metadata.name.clone() else {
        return Ok(None);
    };
    let usage = |resource: &'static str, scale: u32| match metrics.data["usage"][resource].as_str()
    {
        None => Ok(None),
        Some(text) => Quantity::parse(text)
            .and_then(|q| q.to_units_ceil(scale))
            .map(Some)
            .map_err(|source| MetricsError::Quantity {
                node: node.clone(),
                resource,
                text: text.to_string(),
                source,
            }),
    };
    let at_ms = metrics.data["timestamp"]
        .as_str()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .map(|t| t.as_millisecond());
    let window_ms = metrics.data["window"]
        .as_str()
        .and_then(|w| w.parse::<jiff::SignedDuration>().ok())
        .and_then(|w| u64::try_from(w.as_millis()).ok());
    Ok(Some(NodeSample {
        cpu_millis: usage("cpu", 3)?,
        memory_bytes: usage("memory", 0)?,
        at_ms,
        window_ms,
        node,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(json: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn node_metrics_are_read_in_the_schedulers_units() {
        let m = object(serde_json::json!({
            "apiVersion": "metrics.k8s.io/v1beta1", "kind": "NodeMetrics",
            "metadata": {"name": "n1"},
            "timestamp": "2026-11-24T11:00:00Z", "window": "10s",
            "usage": {"cpu": "812345678n", "memory": "1Gi"}
        }));
        let got = sample(&m).ok().flatten();
        assert_eq!(
            got,
            Some(NodeSample {
                node: "n1".into(),
                cpu_millis: Some(813),
                memory_bytes: Some(1 << 30),
                at_ms: Some(1_795_518_000_000),
                window_ms: Some(10_000),
            })
        );
        // Windows as metrics-server prints them (Go durations); negative or unreadable: None.
        for (window, ms) in [
            ("10.059s", Some(10_059)),
            ("1m0.5s", Some(60_500)),
            ("500ms", Some(500)),
            ("0s", Some(0)),
            ("-5s", None),
            ("soon", None),
        ] {
            let m = object(serde_json::json!({
                "metadata": {"name": "n1"}, "window": window, "usage": {}
            }));
            let got = sample(&m).ok().flatten().and_then(|s| s.window_ms);
            assert_eq!(got, ms, "{window}");
        }
        // Missing values are None; a bad quantity is an error naming the node; no name: skipped.
        let partial = object(serde_json::json!({"metadata": {"name": "n2"}, "usage": {}}));
        let got = sample(&partial).ok().flatten();
        assert_eq!(got.map(|s| (s.cpu_millis, s.at_ms)), Some((None, None)));
        let bad = object(serde_json::json!({"metadata": {"name": "n3"}, "usage": {"cpu": "lots"}}));
        let err = sample(&bad)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.starts_with("node n3: usage cpu \"lots\""), "{err}");
        let nameless = object(serde_json::json!({"metadata": {}, "usage": {"cpu": "1"}}));
        assert!(matches!(sample(&nameless), Ok(None)));
    }
}
