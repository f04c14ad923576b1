//! `review`'s usage input: a node's requested sum and peak usage, from `--usage-file` (JSON)
//! and/or `--requested` / `--peak-usage` flags, so that a usage policy's decision can be
//! replayed offline. Pure parsing; `review` reads the file.
//!
//! The file:
//! ```json
//! {"synced": true, "metricsFailing": false,
//!  "sampleAge": "20s", "sampleWindow": "15s", "usageInterval": "30s",
//!  "cpu": {"requested": "10", "peakUsage": "4"},
//!  "memory": {"requested": "8Gi", "peakUsage": "6Gi"}}
//! ```
//! Every member is optional: `synced` defaults to true, `metricsFailing` to false,
//! `sampleAge` (now minus the newest sample's timestamp) to 0s (a fresh sample),
//! `sampleWindow` (the NodeMetrics `window`) to 0s, `usageInterval` (serve's
//! `--usage-interval`) to 30s; durations in the one grammar (`500ms`, `15s`, `2m`; a sample is
//! stale past window + 3 x interval); `requested` and `peakUsage` to 0; a resource left
//! out has no sample (the fallback applies). Flags `--requested cpu=10` and
//! `--peak-usage cpu=4` set (or override) one resource each. Quantities are rounded up to the
//! rule's units (cpu: millicores, memory: bytes), as the scheduler rounds requests.

use overcommit_core::node::usage::{DEFAULT_POLL_INTERVAL_MS, NodeUsage, UsageView};
use overcommit_core::quantity::{Quantity, QuantityError};
use serde::Deserialize;

use crate::admission::NodeUsageSource;

/// Why the usage input was refused.
#[derive(Debug, thiserror::Error)]
pub enum UsageInputError {
    #[error("usage file: {0}")]
    Json(#[from] serde_json::Error),
    #[error("usage file: {what}: {source}")]
    Duration {
        what: &'static str,
        source: overcommit_core::duration::DurationError,
    },
    #[error("{what} {text:?}: expected RESOURCE=QUANTITY with RESOURCE cpu or memory")]
    Flag { what: &'static str, text: String },
    #[error("{what} {resource}: {source}")]
    Quantity {
        what: &'static str,
        resource: String,
        source: QuantityError,
    },
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileIn {
    synced: Option<bool>,
    #[serde(default)]
    metrics_failing: bool,
    sample_age: Option<String>,
    sample_window: Option<String>,
    usage_interval: Option<String>,
    cpu: Option<ResourceIn>,
    memory: Option<ResourceIn>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ResourceIn {
    requested: Option<String>,
    peak_usage: Option<String>,
}

/// The same usage for whatever node is reviewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedUsage(pub NodeUsage);

impl NodeUsageSource for FixedUsage {
    fn node_usage(&self, _node: &str, _window: std::time::Duration) -> Option<NodeUsage> {
        Some(self.0)
    }
}

/// Build the usage from the file's text (if any) and the flags (`RESOURCE=QUANTITY` each).
/// None: neither was given.
pub fn usage_input(
    file: Option<&str>,
    requested: &[String],
    peak_usage: &[String],
) -> Result<Option<NodeUsage>, UsageInputError> {
    if file.is_none() && requested.is_empty() && peak_usage.is_empty() {
        return Ok(None);
    }
    let mut input: FileIn = match file {
        Some(text) => serde_json::from_str(text)?,
        None => FileIn::default(),
    };
    for (what, flags) in [("--requested", requested), ("--peak-usage", peak_usage)] {
        for flag in flags {
            let refuse = || UsageInputError::Flag {
                what,
                text: flag.clone(),
            };
            let (resource, quantity) = flag.split_once('=').ok_or_else(refuse)?;
            let slot = match resource {
                "cpu" => &mut input.cpu,
                "memory" => &mut input.memory,
                _ => return Err(refuse()),
            };
            let resource = slot.get_or_insert_with(ResourceIn::default);
            let field = if what == "--requested" {
                &mut resource.requested
            } else {
                &mut resource.peak_usage
            };
            *field = Some(quantity.to_string());
        }
    }
    let ms = |what: &'static str, text: &Option<String>, default_ms: u64| match text {
        None => Ok(default_ms),
        Some(text) => overcommit_core::duration::parse_duration(text)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .map_err(|source| UsageInputError::Duration { what, source }),
    };
    let sample_age_ms = ms("sampleAge", &input.sample_age, 0)?;
    let sample_window_ms = ms("sampleWindow", &input.sample_window, 0)?;
    let poll_interval_ms = ms(
        "usageInterval",
        &input.usage_interval,
        DEFAULT_POLL_INTERVAL_MS,
    )?;
    let view = |resource: &str, given: &Option<ResourceIn>| -> Result<_, UsageInputError> {
        let Some(given) = given else {
            return Ok(None);
        };
        let scale = if resource == "cpu" { 3 } else { 0 };
        let units = |what: &'static str, text: &Option<String>| match text {
            None => Ok(0),
            Some(text) => Quantity::parse(text)
                .and_then(|q| q.to_units_ceil(scale))
                .map_err(|source| UsageInputError::Quantity {
                    what,
                    resource: resource.to_string(),
                    source,
                }),
        };
        Ok(Some(UsageView {
            synced: input.synced.unwrap_or(true),
            metrics_failing: input.metrics_failing,
            sample_age_ms: Some(sample_age_ms),
            sample_window_ms,
            // The review's node gives the capacity; a sample ahead of the clock cannot be given.
            sample_lead_ms: 0,
            capacity: None,
            poll_interval_ms,
            requested: units("requested", &given.requested)?,
            peak_usage: units("peakUsage", &given.peak_usage)?,
        }))
    };
    Ok(Some(NodeUsage {
        cpu: view("cpu", &input.cpu)?,
        memory: view("memory", &input.memory)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh(requested: u128, peak_usage: u128) -> Option<UsageView> {
        Some(UsageView::fresh(requested, peak_usage))
    }

    /// Usage file, --requested flags, --peak-usage flags, the usage expected.
    type Case<'a> = (
        Option<&'a str>,
        &'a [&'a str],
        &'a [&'a str],
        Option<NodeUsage>,
    );

    #[test]
    fn usage_input_table() {
        let strings = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let cases: &[Case<'_>] = &[
            (None, &[], &[], None),
            (
                None,
                &["cpu=10"],
                &["cpu=4"],
                Some(NodeUsage {
                    cpu: fresh(10_000, 4_000),
                    memory: None,
                }),
            ),
            (
                Some(
                    r#"{"cpu": {"requested": "12", "peakUsage": "3"}, "memory": {"requested": "1Ki"}}"#,
                ),
                &[],
                &["cpu=2500m"],
                Some(NodeUsage {
                    cpu: fresh(12_000, 2_500),
                    memory: fresh(1024, 0),
                }),
            ),
            (
                Some(
                    r#"{"synced": false, "metricsFailing": true, "sampleAge": "2m", "sampleWindow": "15s", "usageInterval": "10s", "cpu": {"requested": "0.0001"}}"#,
                ),
                &[],
                &[],
                Some(NodeUsage {
                    cpu: Some(UsageView {
                        synced: false,
                        metrics_failing: true,
                        sample_age_ms: Some(120_000),
                        sample_window_ms: 15_000,
                        sample_lead_ms: 0,
                        capacity: None,
                        poll_interval_ms: 10_000,
                        requested: 1,
                        peak_usage: 0,
                    }),
                    memory: None,
                }),
            ),
        ];
        for (file, requested, peak, expected) in cases {
            match usage_input(*file, &strings(requested), &strings(peak)) {
                Ok(usage) => assert_eq!(usage, *expected, "{file:?} {requested:?} {peak:?}"),
                Err(e) => panic!("{file:?} {requested:?} {peak:?}: {e}"),
            }
        }
    }

    #[test]
    fn usage_input_refusals() {
        let cases: &[(Option<&str>, &str, &str)] = &[
            (Some("{"), "", "usage file"),
            (Some(r#"{"cpus": {}}"#), "", "unknown field"),
            (
                Some(r#"{"cpu": {"requested": "lots"}}"#),
                "",
                "requested cpu",
            ),
            (None, "pods=3", "RESOURCE=QUANTITY"),
            (None, "cpu", "RESOURCE=QUANTITY"),
            (None, "cpu=-1", "requested cpu"),
            (Some(r#"{"sampleAge": "soon"}"#), "", "sampleAge"),
            (Some(r#"{"pollsSinceSample": 4}"#), "", "unknown field"),
        ];
        for (file, flag, message) in cases {
            let flags: Vec<String> = if flag.is_empty() {
                Vec::new()
            } else {
                vec![flag.to_string()]
            };
            match usage_input(*file, &flags, &[]) {
                Ok(usage) => panic!("{file:?} {flag}: accepted {usage:?}"),
                Err(e) => assert!(e.to_string().contains(message), "{e} lacks {message}"),
            }
        }
    }
}
