//! `spec.eviction` of an OvercommitPolicy: memory relief, opt-in (docs/policy.md, "Memory
//! relief"). Above `memoryCritical` of the kubelet's raw memory allocatable, the leader evicts
//! through the Eviction API (PodDisruptionBudgets hold), at most `maxPodsPerNode` pods per node
//! per `interval`. The type, its checks in code, and the CRD schema's patterns; which pods go
//! is the core module `eviction`.
//!
//! - `memoryCritical`: whole percent, `50%` to `99%` (required).
//! - `maxPodsPerNode`: 1 to 10 (default 1).
//! - `interval`: the project's duration grammar, 10s to 1h (default 1m).
//! - `dryRun`: report what would be evicted, evict nothing (default false).

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::usage::{Percent, percent};
use crate::duration::parse_duration;

/// Allowed `memoryCritical` percents.
pub(crate) const CRITICAL_RANGE: std::ops::RangeInclusive<u32> = 50..=99;
/// The CRD's pattern for the same.
pub(super) const CRITICAL_PATTERN: &str = r"^[5-9][0-9]%$";
/// Allowed `maxPodsPerNode`, and its default.
pub(crate) const MAX_PODS_RANGE: std::ops::RangeInclusive<u32> = 1..=10;
pub(crate) const DEFAULT_MAX_PODS: u32 = 1;
/// Allowed `interval`, and its default.
pub(crate) const INTERVAL_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_secs(10)..=Duration::from_secs(3600);
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);

/// `spec.eviction`, as written.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct EvictionSpec {
    /// Evict when the node's memory usage is above this share of the kubelet's raw memory
    /// allocatable: a whole percent from 50% to 99%.
    pub memory_critical: String,
    /// At most this many evictions per node per interval, 1 to 10 (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pods_per_node: Option<u32>,
    /// The window of maxPodsPerNode (the duration grammar of the flags: "30s", "2m"; 10s to
    /// 1h). Default 1m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    /// Report (Event, metric, log) what would be evicted and evict nothing (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
}

/// `spec.eviction`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledEviction {
    pub memory_critical: Percent,
    pub max_pods_per_node: u32,
    pub interval: Duration,
    pub dry_run: bool,
}

/// Check `spec.eviction`; the error is the reason. `selects_nodes`: the policy has nodeRatios
/// or usage (a policy with neither applies to no node, so relieves none).
pub(super) fn compile(
    spec: &EvictionSpec,
    selects_nodes: bool,
) -> Result<CompiledEviction, String> {
    if !selects_nodes {
        return Err(
            "spec.eviction needs spec.nodeRatios or spec.usage (a policy with neither applies to \
             no node)"
                .into(),
        );
    }
    let memory_critical = percent(&spec.memory_critical, CRITICAL_RANGE)
        .map_err(|r| format!("spec.eviction.memoryCritical: {r}"))?;
    let max_pods_per_node = spec.max_pods_per_node.unwrap_or(DEFAULT_MAX_PODS);
    if !MAX_PODS_RANGE.contains(&max_pods_per_node) {
        return Err(format!(
            "spec.eviction.maxPodsPerNode {max_pods_per_node} must be from {} to {}",
            MAX_PODS_RANGE.start(),
            MAX_PODS_RANGE.end()
        ));
    }
    let interval = match &spec.interval {
        None => DEFAULT_INTERVAL,
        // Units required (no bare seconds): the CRD's CEL `duration()` reads it the same way.
        Some(text) if text.is_empty() || text.ends_with(|c: char| c.is_ascii_digit()) => {
            return Err(format!(
                "spec.eviction.interval {text:?} must be <integer><unit> groups (e.g. 30s, 1m)"
            ));
        }
        Some(text) => parse_duration(text)
            .map_err(|e| format!("spec.eviction.interval: {e}"))
            .and_then(|d| {
                if INTERVAL_RANGE.contains(&d) {
                    Ok(d)
                } else {
                    Err(format!(
                        "spec.eviction.interval {text:?} must be from 10s to 1h"
                    ))
                }
            })?,
    };
    Ok(CompiledEviction {
        memory_critical,
        max_pods_per_node,
        interval,
        dry_run: spec.dry_run.unwrap_or(false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(critical: &str, max: Option<u32>, interval: Option<&str>) -> EvictionSpec {
        EvictionSpec {
            memory_critical: critical.into(),
            max_pods_per_node: max,
            interval: interval.map(str::to_string),
            dry_run: None,
        }
    }

    #[test]
    fn compile_checks_every_field() {
        let ok = compile(&spec("95%", None, None), true);
        assert_eq!(
            ok.map(|c| (
                c.memory_critical.value,
                c.max_pods_per_node,
                c.interval,
                c.dry_run
            )),
            Ok((95, 1, Duration::from_secs(60), false))
        );
        let ok = compile(&spec("50%", Some(10), Some("10s")), true);
        assert_eq!(
            ok.map(|c| (c.memory_critical.value, c.max_pods_per_node, c.interval)),
            Ok((50, 10, Duration::from_secs(10)))
        );
        let refused: &[(EvictionSpec, bool, &str)] = &[
            (spec("95%", None, None), false, "needs spec.nodeRatios"),
            (
                spec("100%", None, None),
                true,
                "memoryCritical: \"100%\" must be",
            ),
            (spec("49%", None, None), true, "from 50% to 99%"),
            (spec("95", None, None), true, "memoryCritical"),
            (
                spec("95%", Some(0), None),
                true,
                "maxPodsPerNode 0 must be from 1 to 10",
            ),
            (spec("95%", Some(11), None), true, "maxPodsPerNode 11"),
            (
                spec("95%", None, Some("9s")),
                true,
                "must be from 10s to 1h",
            ),
            (
                spec("95%", None, Some("2h")),
                true,
                "must be from 10s to 1h",
            ),
            (
                spec("95%", None, Some("soon")),
                true,
                "spec.eviction.interval",
            ),
            (
                spec("95%", None, Some("60")),
                true,
                "<integer><unit> groups",
            ),
        ];
        for (spec, selects, want) in refused {
            let got = compile(spec, *selects).err().unwrap_or_default();
            assert!(got.contains(want), "{spec:?}: {got}");
        }
    }

    #[test]
    fn pattern_agrees_with_the_code() {
        let re = regex::Regex::new(CRITICAL_PATTERN).ok();
        for text in ["49%", "50%", "95%", "99%", "100%", "5%", "050%", "95", "x%"] {
            let matched = re.as_ref().is_some_and(|re| re.is_match(text));
            assert_eq!(
                matched,
                percent(text, CRITICAL_RANGE).is_ok(),
                "memoryCritical {text}"
            );
        }
    }
}
