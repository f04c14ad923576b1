//! `spec.usage` of an OvercommitPolicy: allocatable that follows measured usage (the rule is
//! `node::usage`). The type, its checks in code, and the grammar of its fields; the CRD schema
//! states the same checks (`schema::usage`, and the spec-level rule `schema::USAGE_FALLBACK_RULE`).
//!
//! - `targetUtilization`: cpu and/or memory -> whole percent, `1%` to `100%`; at least one.
//! - `maxRatios`: exactly the targeted resources -> ceiling of allocatable as a multiple of the
//!   kubelet's value, a ratio from 1 to 10 (the grammar of `nodeRatios`); memory at most
//!   [`MEMORY_MAX_RATIO`] unless `allowHighMemoryRatio: true`: memory lent beyond what the node
//!   has is taken back only by OOM kills and evictions, so going further is said explicitly.
//! - `allowHighMemoryRatio`: lets `maxRatios.memory` go up to 10 (default false).
//! - `window`: how far back the peak usage is taken, `<integer><unit>` groups with units ms, s,
//!   m, h (the project's duration grammar without bare seconds and days, so that the API
//!   server's CEL `duration()` reads it the same way), 1m to 24h; default 15m.
//! - `minChange`: whole percent of the kubelet's value, `0%` to `50%`; smaller moves of
//!   allocatable are not written. Default 5%.
//!
//! With usage, `nodeRatios` is the fallback while usage is unknown or stale; a fallback ratio
//! above the resource's `maxRatios` is refused.

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::parse_duration;
use crate::quantity::Ratio;

/// Resources usage can be measured for (what metrics.k8s.io reports).
pub(crate) const USAGE_RESOURCES: [&str; 2] = ["cpu", "memory"];
/// Shortest and longest `spec.usage.window`.
pub(crate) const WINDOW_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_secs(60)..=Duration::from_secs(24 * 3600);
/// `spec.usage.window` when absent.
pub(crate) const DEFAULT_WINDOW: &str = "15m";
/// `spec.usage.minChange` when absent.
pub(crate) const DEFAULT_MIN_CHANGE: &str = "5%";
/// Allowed `targetUtilization` percents.
pub(crate) const TARGET_RANGE: std::ops::RangeInclusive<u32> = 1..=100;
/// The highest `maxRatios.memory` without `allowHighMemoryRatio: true`, as written and in
/// millionths.
pub(crate) const MEMORY_MAX_RATIO: (&str, u128) = ("2", 2_000_000);
/// The CRD's rule for the same (both sides decimal strings the patterns have checked).
pub(super) const MEMORY_CEILING_RULE: &str = "!('memory' in self.maxRatios) || double(self.maxRatios['memory']) <= 2.0 || (has(self.allowHighMemoryRatio) && self.allowHighMemoryRatio)";
/// Allowed `minChange` percents.
pub(crate) const MIN_CHANGE_RANGE: std::ops::RangeInclusive<u32> = 0..=50;

/// The CRD's pattern for a window (the grammar `window` accepts; CEL checks the range).
pub(super) const WINDOW_PATTERN: &str = r"^([0-9]{1,9}(ms|s|m|h))+$";
/// The CRD's pattern for a target (1% to 100%).
pub(super) const TARGET_PATTERN: &str = r"^(100|[1-9][0-9]?)%$";
/// The CRD's pattern for minChange (0% to 50%).
pub(super) const MIN_CHANGE_PATTERN: &str = r"^(50|[1-4]?[0-9])%$";

/// `spec.usage`, as written.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct UsageSpec {
    /// cpu and/or memory -> the share of the kubelet's allocatable that usage should reach, a
    /// whole percent from 1% to 100%.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub target_utilization: BTreeMap<String, String>,
    /// Every targeted resource -> ceiling of allocatable as a multiple of the kubelet's value,
    /// a decimal string from 1 to 10 with at most 6 decimals; memory at most 2 unless
    /// `allow_high_memory_ratio`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub max_ratios: BTreeMap<String, String>,
    /// Usage is the peak of the samples in this window: 1m to 24h, e.g. 15m, 1h30m (default
    /// 15m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    /// Moves of allocatable smaller than this share of the kubelet's value are not written, a
    /// whole percent from 0% to 50% (default 5%).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_change: Option<String>,
    /// Lets `maxRatios.memory` go above 2, up to 10 (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_high_memory_ratio: Option<bool>,
}

/// A percent as written (`60%`) and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Percent {
    pub text: String,
    pub value: u32,
}

/// One targeted resource of a usage policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageTarget {
    pub target: Percent,
    /// The ceiling, as written and parsed.
    pub max_ratio: (String, Ratio),
}

/// `spec.usage`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledUsage {
    /// resource (cpu, memory) -> its target and ceiling.
    pub targets: BTreeMap<String, UsageTarget>,
    pub window: Duration,
    pub min_change: Percent,
}

/// Check `spec.usage` against the policy's fallback `nodeRatios`; the error is the reason.
pub(super) fn compile(
    usage: &UsageSpec,
    fallback: &BTreeMap<String, (String, Ratio)>,
) -> Result<CompiledUsage, String> {
    if usage.target_utilization.is_empty() {
        return Err("spec.usage.targetUtilization must name cpu and/or memory".to_string());
    }
    for resource in usage
        .target_utilization
        .keys()
        .chain(usage.max_ratios.keys())
    {
        if !USAGE_RESOURCES.contains(&resource.as_str()) {
            return Err(format!(
                "spec.usage: resource {resource:?} must be cpu or memory (the metrics API \
                 measures no other)"
            ));
        }
    }
    let mut targets = BTreeMap::new();
    for (resource, text) in &usage.target_utilization {
        let at = format!("spec.usage.targetUtilization[{resource}]");
        let target = percent(text, TARGET_RANGE).map_err(|r| format!("{at}: {r}"))?;
        let Some(max_text) = usage.max_ratios.get(resource) else {
            return Err(format!(
                "spec.usage.maxRatios must give a ceiling for {resource}, which is targeted"
            ));
        };
        let max_ratio =
            Ratio::parse(max_text).map_err(|e| format!("spec.usage.maxRatios[{resource}]: {e}"))?;
        if resource == "memory"
            && max_ratio.millionths() > MEMORY_MAX_RATIO.1
            && usage.allow_high_memory_ratio != Some(true)
        {
            return Err(format!(
                "spec.usage.maxRatios[memory] {max_text} is above {}: memory lent beyond what the \
                 node has is taken back only by OOM kills and evictions; set \
                 spec.usage.allowHighMemoryRatio: true to allow up to 10",
                MEMORY_MAX_RATIO.0
            ));
        }
        if let Some((fallback_text, fallback_ratio)) = fallback.get(resource)
            && *fallback_ratio > max_ratio
        {
            return Err(format!(
                "spec.nodeRatios[{resource}] {fallback_text} is above spec.usage.maxRatios[{resource}] \
                 {max_text}: the fallback must stay under the ceiling"
            ));
        }
        let max_ratio = (max_text.clone(), max_ratio);
        targets.insert(resource.clone(), UsageTarget { target, max_ratio });
    }
    if let Some(resource) = usage
        .max_ratios
        .keys()
        .find(|r| !usage.target_utilization.contains_key(*r))
    {
        return Err(format!(
            "spec.usage.maxRatios[{resource}]: {resource} has no targetUtilization, so a ceiling \
             does nothing"
        ));
    }
    let window_text = usage.window.as_deref().unwrap_or(DEFAULT_WINDOW);
    let window = window(window_text).map_err(|r| format!("spec.usage.window: {r}"))?;
    let min_change_text = usage.min_change.as_deref().unwrap_or(DEFAULT_MIN_CHANGE);
    let min_change = percent(min_change_text, MIN_CHANGE_RANGE)
        .map_err(|r| format!("spec.usage.minChange: {r}"))?;
    Ok(CompiledUsage {
        targets,
        window,
        min_change,
    })
}

/// A whole percent `N%` within `range`.
pub(super) fn percent(text: &str, range: std::ops::RangeInclusive<u32>) -> Result<Percent, String> {
    let refuse = || {
        format!(
            "{text:?} must be a whole percent from {}% to {}%",
            range.start(),
            range.end()
        )
    };
    let digits = text.strip_suffix('%').ok_or_else(refuse)?;
    if digits.is_empty()
        || digits.len() > 3
        || !digits.bytes().all(|b| b.is_ascii_digit())
        || (digits.len() > 1 && digits.starts_with('0'))
    {
        return Err(refuse());
    }
    let value: u32 = digits.parse().map_err(|_| refuse())?;
    if !range.contains(&value) {
        return Err(refuse());
    }
    Ok(Percent {
        text: text.to_string(),
        value,
    })
}

/// A window: `<integer><unit>` groups, units ms, s, m, h, within `WINDOW_RANGE`.
fn window(text: &str) -> Result<Duration, String> {
    let duration = cel_duration(text)?;
    if !WINDOW_RANGE.contains(&duration) {
        return Err(format!("{text} must be from 1m to 24h"));
    }
    Ok(duration)
}

/// A duration the API server's CEL `duration()` reads the same way: `<integer><unit>` groups,
/// units ms, s, m, h (no bare seconds, no days). The caller checks the range.
pub(super) fn cel_duration(text: &str) -> Result<Duration, String> {
    let grammar = || {
        format!("{text:?} must be <integer><unit> groups with units ms, s, m, h (e.g. 15m, 1h30m)")
    };
    let mut rest = text;
    if rest.is_empty() {
        return Err(grammar());
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 9 {
            return Err(grammar());
        }
        rest = &rest[digits..];
        rest = ["ms", "s", "m", "h"]
            .iter()
            .find_map(|unit| rest.strip_prefix(unit))
            .ok_or_else(grammar)?;
    }
    parse_duration(text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percents_and_windows() {
        let ok: &[(&str, u32)] = &[("1%", 1), ("60%", 60), ("100%", 100)];
        for &(text, value) in ok {
            assert_eq!(
                percent(text, TARGET_RANGE).map(|p| p.value),
                Ok(value),
                "{text}"
            );
        }
        for text in [
            "0%", "101%", "60", "6O%", "%", "060%", "1.5%", " 60%", "-1%",
        ] {
            assert!(percent(text, TARGET_RANGE).is_err(), "{text}");
        }
        assert_eq!(percent("0%", MIN_CHANGE_RANGE).map(|p| p.value), Ok(0));
        assert!(percent("51%", MIN_CHANGE_RANGE).is_err());
        let ok: &[(&str, u64)] = &[
            ("1m", 60),
            ("15m", 900),
            ("1h30m", 5400),
            ("24h", 86400),
            ("90s", 90),
        ];
        for &(text, secs) in ok {
            assert_eq!(window(text), Ok(Duration::from_secs(secs)), "{text}");
        }
        for text in [
            "",
            "59s",
            "24h1s",
            "1d",
            "900",
            "15 m",
            "15min",
            "m",
            "1.5h",
            "9999999999h",
        ] {
            assert!(window(text).is_err(), "{text}");
        }
    }

    /// The CRD's patterns accept what the code accepts (checked on samples both ways).
    #[test]
    fn patterns_agree_with_the_code() {
        let matches = |pattern: &str, text: &str| {
            regex::Regex::new(pattern).is_ok_and(|re| re.is_match(text))
        };
        for text in [
            "0%", "1%", "9%", "10%", "50%", "51%", "99%", "100%", "101%", "01%", "1", "x%",
        ] {
            assert_eq!(
                matches(TARGET_PATTERN, text),
                percent(text, TARGET_RANGE).is_ok(),
                "target {text}"
            );
            assert_eq!(
                matches(MIN_CHANGE_PATTERN, text),
                percent(text, MIN_CHANGE_RANGE).is_ok(),
                "minChange {text}"
            );
        }
        // The pattern checks the grammar; the range is checked by CEL (and the code).
        for text in [
            "15m", "1h30m", "500ms", "2s500ms", "1d", "15", "15 m", "m", "15min",
        ] {
            let grammar_ok =
                window(text).is_ok() || window(text).is_err_and(|e| e.contains("from 1m"));
            assert_eq!(matches(WINDOW_PATTERN, text), grammar_ok, "window {text}");
        }
    }
}
