//! The usage rule: allocatable that follows measured usage, for one resource of one node. Pure.
//!
//! For a resource the policy's `spec.usage` targets (cpu, memory), in the resource's unit
//! (cpu: millicores; memory: bytes):
//!
//! 1. **Computed** = clamp(requested + floor(raw x target) - peakUsage, raw, floor(raw x
//!    maxRatio)), where raw is the kubelet's allocatable, requested the sum of the node's
//!    non-terminal pods' requests as the scheduler counts them (`crate::requests`), peakUsage
//!    the highest node usage in the policy's window. The scheduler's free room (allocatable -
//!    requested) is then the real headroom below the target (target x raw - peakUsage), never
//!    less than the kubelet gives and never above the ceiling.
//! 2. **Small moves are not written.** If the value currently written (`stored`) is within
//!    [raw, ceiling] and differs from the computed one by at most floor(raw x minChange), the
//!    stored value is kept: replicas whose views differ slightly agree, and usage noise does not
//!    turn into status writes.
//! 3. **Usage unknown** (no sample of the node in the window), **stale** ([`is_stale`]: its
//!    newest sample's own timestamp is older than its window plus `STALE_AFTER_POLLS` poll
//!    intervals, so a node whose metrics stop changing goes stale even while metrics-server
//!    keeps listing the old sample) or **the metrics API failing**: the policy's `nodeRatios`
//!    ratio for the resource applies (raw when it has none), and the reason says which.
//!    **Implausible samples** are refused the same way: a sample stamped more than
//!    [`MAX_SAMPLE_LEAD_MS`] ahead of this replica's clock when listed (it would never go stale:
//!    `FutureSample`), or a peak usage above the node's capacity of the resource (no node uses
//!    more than it has: `AboveCapacity`).
//! 4. **Caches not synced** (the replica's pod index or metrics have not been read once yet):
//!    the stored value is kept when it is within [raw, ceiling]; otherwise (first write, or raw
//!    moved) as in 3, with the reason `NotSynced`.
//!
//! `stored` is what this webhook last wrote (recomputed from the node's annotations), passed
//! only when it was written from the same raw value; a new raw value from the kubelet always
//! gets a fresh value.
//! The rule never reads where the numbers come from: `UsageView` is plain data.

use crate::policy::{Percent, UsageTarget};
use crate::quantity::{Format, MAX_UNITS, Quantity, QuantityError, Ratio};

/// A sample older than its window plus this many poll intervals is stale (the fallback applies).
pub const STALE_AFTER_POLLS: u64 = 3;

/// The default poll interval (`--usage-interval`).
pub const DEFAULT_POLL_INTERVAL_MS: u64 = 30_000;

/// A sample stamped further than this ahead of this replica's clock (when listed) is refused.
/// Clocks kept by NTP differ by milliseconds; 30 s tolerates a badly kept node clock, yet a
/// sample within it stays fresh at most one default poll interval longer than it should.
pub const MAX_SAMPLE_LEAD_MS: u64 = 30_000;

/// Whether a sample is stale: `age_ms` is now minus its timestamp (the end of the interval it
/// was measured over), `window_ms` that interval (metrics-server's scrape period: a newer
/// sample is not due before it has passed), `interval_ms` how often the metrics API is polled.
/// Stale when older than window + `STALE_AFTER_POLLS` x interval; exactly that old is fresh.
pub fn is_stale(age_ms: u64, window_ms: u64, interval_ms: u64) -> bool {
    age_ms > window_ms.saturating_add(interval_ms.saturating_mul(STALE_AFTER_POLLS))
}

/// What the caller knows about one node's usage, for one resource, in the resource's unit
/// (cpu: millicores, others: whole units).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UsageView {
    /// The replica's caches (pod index, metrics) have been read completely at least once.
    pub synced: bool,
    /// The last poll of the metrics API failed.
    pub metrics_failing: bool,
    /// Age of the node's newest sample in the window: now minus its timestamp, 0 when the
    /// timestamp is ahead of now; None: no sample in the window.
    pub sample_age_ms: Option<u64>,
    /// That sample's window (the interval it was measured over).
    pub sample_window_ms: u64,
    /// How far ahead of this replica's clock the node's last listed sample was stamped when it
    /// was listed, if more than [`MAX_SAMPLE_LEAD_MS`] (that sample was refused; 0 otherwise).
    pub sample_lead_ms: u64,
    /// The node's capacity of the resource (`status.capacity`, filled in by the node rule from
    /// the reviewed Node); None when absent or unreadable.
    pub capacity: Option<u128>,
    /// How often the metrics API is polled (`--usage-interval`).
    pub poll_interval_ms: u64,
    /// Sum of the requests of the node's non-terminal pods.
    pub requested: u128,
    /// Highest usage of the node in the window.
    pub peak_usage: u128,
}

impl UsageView {
    /// Synced, with a sample measured just now, the metrics API answering (polled every 30s).
    pub const fn fresh(requested: u128, peak_usage: u128) -> UsageView {
        UsageView {
            synced: true,
            metrics_failing: false,
            sample_age_ms: Some(0),
            sample_window_ms: 0,
            sample_lead_ms: 0,
            capacity: None,
            poll_interval_ms: DEFAULT_POLL_INTERVAL_MS,
            requested,
            peak_usage,
        }
    }
}

/// What the caller knows about one node, per resource usage can be measured for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeUsage {
    pub cpu: Option<UsageView>,
    pub memory: Option<UsageView>,
}

impl NodeUsage {
    /// The view of `resource` (cpu, memory), if any.
    pub fn get(&self, resource: &str) -> Option<UsageView> {
        match resource {
            "cpu" => self.cpu,
            "memory" => self.memory,
            _ => None,
        }
    }
}

/// Why the usage rule did not compute from usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FallbackReason {
    /// No sample of the node in the window.
    NoSample,
    /// The newest sample is older than its window plus `STALE_AFTER_POLLS` poll intervals.
    Stale,
    /// The metrics API's last poll failed.
    MetricsFailing,
    /// This replica's caches have not synced, and no stored value could be kept.
    NotSynced,
    /// The node's last listed sample was stamped more than `MAX_SAMPLE_LEAD_MS` ahead.
    FutureSample,
    /// The peak usage in the window is above the node's capacity.
    AboveCapacity,
}

impl FallbackReason {
    /// Every reason, for metrics that list each one.
    pub const ALL: [FallbackReason; 6] = [
        FallbackReason::NoSample,
        FallbackReason::Stale,
        FallbackReason::MetricsFailing,
        FallbackReason::NotSynced,
        FallbackReason::FutureSample,
        FallbackReason::AboveCapacity,
    ];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            FallbackReason::NoSample => "no_sample",
            FallbackReason::Stale => "stale",
            FallbackReason::MetricsFailing => "metrics_failing",
            FallbackReason::NotSynced => "not_synced",
            FallbackReason::FutureSample => "future_sample",
            FallbackReason::AboveCapacity => "above_capacity",
        }
    }
}

/// The fallback reasons met in one decision: a bit per reason (no allocation; a metric).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FallbackSet(u8);

impl FallbackSet {
    fn bit(reason: FallbackReason) -> u8 {
        1 << (reason as u8)
    }

    pub fn insert(&mut self, reason: FallbackReason) {
        self.0 |= Self::bit(reason);
    }

    pub fn contains(self, reason: FallbackReason) -> bool {
        self.0 & Self::bit(reason) != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// Where the value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageSource {
    /// Computed from usage and written.
    Usage,
    /// Computed from usage (`computed`), within minChange of the stored value: stored kept.
    Kept { computed: Quantity },
    /// Caches not synced: the stored value kept.
    NotSyncedKept,
    /// The policy's nodeRatios (or raw), for this reason.
    Fallback(FallbackReason),
}

/// The usage rule's answer for one resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageDecision {
    pub allocatable: Quantity,
    pub source: UsageSource,
}

/// Allocatable of `resource` under the usage rule (see the module doc). `raw` is the kubelet's
/// value, `stored` what is written now (only when raw is unchanged), `fallback` the policy's
/// nodeRatios ratio for the resource.
pub fn usage_allocatable(
    resource: &str,
    raw: &Quantity,
    stored: Option<&Quantity>,
    target: &UsageTarget,
    min_change: &Percent,
    fallback: Option<&Ratio>,
    view: &UsageView,
) -> Result<UsageDecision, QuantityError> {
    let (scale, format) = if resource == "cpu" {
        (3, Format::DecimalSi)
    } else {
        (0, raw.format())
    };
    let raw_units = raw.to_units_floor(scale)?;
    let ceiling = target.max_ratio.1.apply_floor(raw, scale)?;
    let quantity = |units: u128| {
        if units == raw_units {
            *raw // printed as the kubelet printed it
        } else {
            Quantity::from_units(units, scale, format)
        }
    };
    let stored_in_range = match stored {
        Some(stored) => {
            let units = stored.to_units_floor(scale)?;
            (raw_units..=ceiling).contains(&units).then_some(units)
        }
        None => None,
    };
    let fallback_value = |reason| -> Result<UsageDecision, QuantityError> {
        let units = match fallback {
            Some(ratio) if !ratio.is_one() => ratio.apply_floor(raw, scale)?,
            _ => raw_units,
        };
        Ok(UsageDecision {
            allocatable: quantity(units),
            source: UsageSource::Fallback(reason),
        })
    };
    if !view.synced {
        return match stored_in_range {
            Some(units) => Ok(UsageDecision {
                allocatable: quantity(units),
                source: UsageSource::NotSyncedKept,
            }),
            None => fallback_value(FallbackReason::NotSynced),
        };
    }
    if let Some(reason) = untrusted(view) {
        return fallback_value(reason);
    }
    let overflow = || QuantityError::Overflow(raw.to_string());
    let room = raw.scaled_floor(scale, u128::from(target.target.value), 100)?;
    let computed = view
        .requested
        .checked_add(room)
        .ok_or_else(overflow)?
        .saturating_sub(view.peak_usage)
        .clamp(raw_units, ceiling.max(raw_units));
    if computed > MAX_UNITS {
        return Err(overflow());
    }
    let threshold = raw.scaled_floor(scale, u128::from(min_change.value), 100)?;
    Ok(match stored_in_range {
        Some(units) if units.abs_diff(computed) <= threshold && units != computed => {
            UsageDecision {
                allocatable: quantity(units),
                source: UsageSource::Kept {
                    computed: quantity(computed),
                },
            }
        }
        _ => UsageDecision {
            allocatable: quantity(computed),
            source: UsageSource::Usage,
        },
    })
}

/// Why the view's usage cannot be followed (metrics failing, no sample, a refused or stale
/// sample, usage above capacity), if it can't.
fn untrusted(view: &UsageView) -> Option<FallbackReason> {
    if view.metrics_failing {
        return Some(FallbackReason::MetricsFailing);
    }
    // Before NoSample: a refused sample may have been the node's only one.
    if view.sample_lead_ms > MAX_SAMPLE_LEAD_MS {
        return Some(FallbackReason::FutureSample);
    }
    let Some(age) = view.sample_age_ms else {
        return Some(FallbackReason::NoSample);
    };
    if is_stale(age, view.sample_window_ms, view.poll_interval_ms) {
        return Some(FallbackReason::Stale);
    }
    if view.capacity.is_some_and(|c| view.peak_usage > c) {
        return Some(FallbackReason::AboveCapacity);
    }
    None
}

/// How a resource's value was reached, for `review --explain` (`by_ratio`: how the fallback
/// applied, "x 2" or "restored").
pub(super) fn explain(
    resource: &str,
    view: &UsageView,
    source: &UsageSource,
    by_ratio: String,
) -> String {
    let (scale, format) = if resource == "cpu" {
        (3, Format::DecimalSi)
    } else {
        (0, Format::BinarySi)
    };
    let amount = |units| Quantity::from_units(units, scale, format);
    let inputs = format!(
        "requested {}, peak usage {}",
        amount(view.requested),
        amount(view.peak_usage)
    );
    match source {
        UsageSource::Usage => format!("from usage ({inputs})"),
        UsageSource::Kept { computed } => format!(
            "from usage ({inputs}): {computed} is within minChange of the value written, kept"
        ),
        UsageSource::NotSyncedKept => "caches not synced: the value written is kept".to_string(),
        UsageSource::Fallback(FallbackReason::Stale) => format!(
            "usage fallback (stale: newest sample {}s old, window {}s, polled every {}s): {by_ratio}",
            seconds(view.sample_age_ms.unwrap_or(0)),
            seconds(view.sample_window_ms),
            seconds(view.poll_interval_ms),
        ),
        UsageSource::Fallback(FallbackReason::FutureSample) => format!(
            "usage fallback (future_sample: last sample stamped {}s ahead of this clock, more than {}s): {by_ratio}",
            seconds(view.sample_lead_ms),
            seconds(MAX_SAMPLE_LEAD_MS),
        ),
        UsageSource::Fallback(FallbackReason::AboveCapacity) => format!(
            "usage fallback (above_capacity: peak usage {} above capacity {}): {by_ratio}",
            amount(view.peak_usage),
            amount(view.capacity.unwrap_or(0)),
        ),
        UsageSource::Fallback(reason) => {
            format!("usage fallback ({}): {by_ratio}", reason.as_str())
        }
    }
}

/// Milliseconds as seconds with up to 3 decimals ("12", "1.5").
fn seconds(ms: u64) -> String {
    let (whole, frac) = (ms / 1000, ms % 1000);
    if frac == 0 {
        whole.to_string()
    } else {
        format!("{whole}.{frac:03}")
            .trim_end_matches('0')
            .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(text: &str) -> Quantity {
        Quantity::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn target(percent: u32, max: &str) -> UsageTarget {
        UsageTarget {
            target: Percent {
                text: format!("{percent}%"),
                value: percent,
            },
            max_ratio: (
                max.to_string(),
                Ratio::parse(max).unwrap_or_else(|e| panic!("{e}")),
            ),
        }
    }

    struct Case {
        name: &'static str,
        resource: &'static str,
        raw: &'static str,
        stored: Option<&'static str>,
        target: (u32, &'static str),
        min_change: u32,
        fallback: Option<&'static str>,
        view: UsageView,
        allocatable: &'static str,
        source: UsageSource,
    }

    const fn case(name: &'static str, raw: &'static str, view: UsageView) -> Case {
        Case {
            name,
            resource: "cpu",
            raw,
            stored: None,
            target: (60, "4"),
            min_change: 5,
            fallback: None,
            view,
            allocatable: "",
            source: UsageSource::Usage,
        }
    }

    const fn view(requested: u128, peak_usage: u128) -> UsageView {
        UsageView::fresh(requested, peak_usage)
    }

    #[test]
    fn usage_table() {
        let fb = UsageSource::Fallback;
        let cases = [
            // docs/policy.md, first example: 10 + 9.6 - 4 = 15.6 < raw 16: raw.
            Case {
                allocatable: "16",
                ..case("below raw: raw", "16", view(10_000, 4_000))
            },
            // docs/policy.md, second example: 12 + 9.6 - 3 = 18.6.
            Case {
                allocatable: "18600m",
                ..case("inflates", "16", view(12_000, 3_000))
            },
            Case {
                allocatable: "64",
                ..case("ceiling", "16", view(100_000, 0))
            },
            Case {
                allocatable: "16",
                ..case("usage above everything: raw", "16", view(0, 1_000_000))
            },
            Case {
                allocatable: "3501m",
                target: (50, "2"),
                ..case("millicores", "3", view(4_000, 1_999))
            },
            Case {
                allocatable: "4499m",
                target: (50, "2"),
                ..case("floor of a fraction", "2999m", view(3_000, 0))
            },
            // Within minChange (5% of 16 = 800m) of the stored value: stored kept.
            Case {
                stored: Some("18"),
                allocatable: "18",
                source: UsageSource::Kept {
                    computed: q("18600m"),
                },
                ..case("small move kept", "16", view(12_000, 3_000))
            },
            Case {
                stored: Some("17800m"),
                allocatable: "17800m",
                source: UsageSource::Kept {
                    computed: q("18600m"),
                },
                ..case("exactly minChange kept", "16", view(12_000, 3_000))
            },
            Case {
                stored: Some("17799m"),
                allocatable: "18600m",
                ..case("just over minChange written", "16", view(12_000, 3_000))
            },
            Case {
                stored: Some("18600m"),
                allocatable: "18600m",
                ..case("unchanged", "16", view(12_000, 3_000))
            },
            // A stored value outside [raw, ceiling] is never kept.
            Case {
                stored: Some("15500m"),
                allocatable: "16",
                ..case("stored below raw replaced", "16", view(10_000, 4_000))
            },
            Case {
                stored: Some("18"),
                min_change: 0,
                allocatable: "18600m",
                ..case("minChange 0 writes every move", "16", view(12_000, 3_000))
            },
            // Fallbacks.
            Case {
                view: UsageView {
                    sample_age_ms: None,
                    ..view(12_000, 3_000)
                },
                fallback: Some("2"),
                allocatable: "32",
                source: fb(FallbackReason::NoSample),
                ..case("no sample: nodeRatios", "16", view(0, 0))
            },
            Case {
                view: UsageView {
                    sample_age_ms: Some(105_001),
                    sample_window_ms: 15_000,
                    ..view(12_000, 3_000)
                },
                allocatable: "16",
                source: fb(FallbackReason::Stale),
                ..case("stale: raw without nodeRatios", "16", view(0, 0))
            },
            Case {
                view: UsageView {
                    sample_age_ms: Some(105_000),
                    sample_window_ms: 15_000,
                    ..view(12_000, 3_000)
                },
                allocatable: "18600m",
                ..case("window + 3 polls old is still fresh", "16", view(0, 0))
            },
            Case {
                view: UsageView {
                    metrics_failing: true,
                    ..view(12_000, 3_000)
                },
                stored: Some("18600m"),
                fallback: Some("1.5"),
                allocatable: "24",
                source: fb(FallbackReason::MetricsFailing),
                ..case("metrics failing: nodeRatios", "16", view(0, 0))
            },
            Case {
                view: UsageView {
                    synced: false,
                    ..view(12_000, 3_000)
                },
                stored: Some("20"),
                allocatable: "20",
                source: UsageSource::NotSyncedKept,
                ..case("not synced: stored kept", "16", view(0, 0))
            },
            Case {
                view: UsageView {
                    synced: false,
                    ..view(12_000, 3_000)
                },
                fallback: Some("2"),
                allocatable: "32",
                source: fb(FallbackReason::NotSynced),
                ..case("not synced, nothing stored", "16", view(0, 0))
            },
            Case {
                view: UsageView {
                    synced: false,
                    ..view(12_000, 3_000)
                },
                stored: Some("65"),
                allocatable: "16",
                source: fb(FallbackReason::NotSynced),
                ..case("not synced, stored above ceiling", "16", view(0, 0))
            },
            // Implausible samples: refused like stale ones.
            Case {
                view: UsageView {
                    sample_lead_ms: 30_001,
                    ..view(12_000, 3_000)
                },
                fallback: Some("1.5"),
                allocatable: "24",
                source: fb(FallbackReason::FutureSample),
                ..case("last sample stamped over 30 s ahead", "16", view(0, 0))
            },
            Case {
                view: UsageView {
                    sample_lead_ms: 60_000,
                    sample_age_ms: None,
                    ..view(12_000, 3_000)
                },
                allocatable: "16",
                source: fb(FallbackReason::FutureSample),
                ..case("the only sample refused, a minute ahead", "16", view(0, 0))
            },
            Case {
                view: UsageView {
                    sample_lead_ms: 30_000,
                    ..view(12_000, 3_000)
                },
                allocatable: "18600m",
                ..case("30 s ahead is within the skew", "16", view(0, 0))
            },
            Case {
                view: UsageView {
                    capacity: Some(16_000),
                    ..view(12_000, 16_001)
                },
                fallback: Some("1.5"),
                allocatable: "24",
                source: fb(FallbackReason::AboveCapacity),
                ..case("usage above capacity", "16", view(0, 0))
            },
            Case {
                view: UsageView {
                    capacity: Some(17_000),
                    ..view(30_000, 17_000)
                },
                allocatable: "22600m",
                ..case(
                    "usage at capacity (above raw) is plausible",
                    "16",
                    view(0, 0),
                )
            },
            Case {
                view: UsageView {
                    capacity: None,
                    ..view(12_000, 1_000_000)
                },
                allocatable: "16",
                ..case("capacity unknown: no evidence", "16", view(0, 0))
            },
            Case {
                resource: "memory",
                target: (75, "1.5"),
                view: UsageView {
                    capacity: Some(17 << 30),
                    ..view(4 << 30, (17 << 30) + 1)
                },
                fallback: Some("1.25"),
                allocatable: "20Gi",
                source: fb(FallbackReason::AboveCapacity),
                ..case("memory above capacity", "16Gi", view(0, 0))
            },
            // Memory: whole bytes, printed in the raw value's format.
            Case {
                resource: "memory",
                target: (75, "1.5"),
                allocatable: "24Gi",
                ..case("memory clamped to ceiling", "16Gi", view(20 << 30, 0))
            },
            Case {
                resource: "memory",
                target: (75, "1.5"),
                allocatable: "16Gi",
                ..case("memory raw keeps its text", "16Gi", view(4 << 30, 8 << 30))
            },
        ];
        for c in cases {
            let decision = usage_allocatable(
                c.resource,
                &q(c.raw),
                c.stored.map(q).as_ref(),
                &target(c.target.0, c.target.1),
                &Percent {
                    text: format!("{}%", c.min_change),
                    value: c.min_change,
                },
                c.fallback
                    .map(|r| Ratio::parse(r).unwrap_or_else(|e| panic!("{e}")))
                    .as_ref(),
                &c.view,
            );
            match decision {
                Ok(d) => {
                    assert_eq!(d.allocatable.to_string(), c.allocatable, "{}", c.name);
                    assert_eq!(d.source, c.source, "{}", c.name);
                }
                Err(e) => panic!("{}: {e}", c.name),
            }
        }
    }

    #[test]
    fn staleness_is_the_samples_own_age() {
        // (age, window, interval, stale)
        let cases = [
            (0, 0, 30_000, false),
            (90_000, 0, 30_000, false),
            (90_001, 0, 30_000, true),
            // A scrape period longer than 3 polls: not stale before the next scrape is due.
            (80_000, 60_000, 10_000, false),
            (90_000, 60_000, 10_000, false),
            (90_001, 60_000, 10_000, true),
            // A frozen sample (metrics-server listing the same old one) ages and goes stale.
            (3_600_000, 15_000, 30_000, true),
            // Never an overflow.
            (u64::MAX, u64::MAX, u64::MAX, false),
            (u64::MAX, 0, u64::MAX / 4, true),
        ];
        for (age, window, interval, stale) in cases {
            assert_eq!(
                is_stale(age, window, interval),
                stale,
                "age {age} window {window} interval {interval}"
            );
        }
        assert_eq!(seconds(105_001), "105.001");
        assert_eq!(seconds(1_500), "1.5");
        assert_eq!(seconds(30_000), "30");
    }

    /// Fed its own output as the stored value, the rule writes the same value again.
    #[test]
    fn output_is_a_fixed_point() {
        let t = target(60, "4");
        let min_change = Percent {
            text: "5%".into(),
            value: 5,
        };
        for (requested, peak) in [(10_000, 4_000), (12_000, 3_000), (100_000, 0), (0, 99_000)] {
            let view = view(requested, peak);
            let first = usage_allocatable("cpu", &q("16"), None, &t, &min_change, None, &view);
            let Ok(first) = first else {
                panic!("{first:?}")
            };
            let again = usage_allocatable(
                "cpu",
                &q("16"),
                Some(&first.allocatable),
                &t,
                &min_change,
                None,
                &view,
            );
            assert_eq!(again, Ok(first), "{requested} {peak}");
        }
    }

    #[test]
    fn huge_values_are_errors_not_panics() {
        let t = target(100, "10");
        let min_change = Percent {
            text: "5%".into(),
            value: 5,
        };
        let result = usage_allocatable(
            "cpu",
            &q("1e30"),
            None,
            &t,
            &min_change,
            None,
            &view(u128::MAX, 0),
        );
        assert!(result.is_err(), "{result:?}");
        let mut set = FallbackSet::default();
        assert!(set.is_empty());
        for reason in FallbackReason::ALL {
            assert!(!reason.as_str().is_empty());
            assert!(!set.contains(reason));
            set.insert(reason);
            assert!(set.contains(reason));
        }
    }
}
