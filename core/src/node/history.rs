//! Node usage samples kept for the usage rule's window. Pure: the poller of metrics.k8s.io
//! (`sources::usage`, I/O) records each poll here, and the review path reads a node's
//! `NodeUsage` from it.
//!
//! - A node's newest sample is aged by its own timestamp against `now` (the rule's
//!   `is_stale`, with the poll interval given here), not by when it was listed: metrics-server
//!   listing the same old sample again does not make it fresh. A failed last poll is reported
//!   as `metrics_failing`.
//! - Samples older than `keep` (the longest window of any policy) are dropped on each poll;
//!   a node without samples left is forgotten.
//! - Until one poll has succeeded, views are not synced (the rule keeps what is written).
//! - A sample stamped more than `usage::MAX_SAMPLE_LEAD_MS` ahead of `now` when listed is not
//!   kept: it would never age, and as the newest it would hide every later sample. The node's
//!   view says how far ahead it was (the rule falls back, `FutureSample`) until a plausible
//!   sample of the node is listed, or for `keep` if the node is not listed again.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use super::usage::{MAX_SAMPLE_LEAD_MS, NodeUsage, UsageView};

/// One node's usage at one time, in the rule's units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// When metrics-server measured it (`timestamp`, the end of its window), ms since the
    /// Unix epoch.
    pub at_ms: i64,
    /// The interval it was measured over (`window`), ms.
    pub window_ms: u64,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

/// What one poll of the metrics API gave.
#[derive(Debug, Clone, Copy)]
pub enum Poll<'p> {
    /// Node name and its sample, for every node listed.
    Listed(&'p [(&'p str, Sample)]),
    Failed,
}

#[derive(Debug, Default)]
struct NodeSamples {
    /// Oldest first.
    samples: VecDeque<Sample>,
    /// How far ahead the node's last listed sample was stamped, when it was refused for it
    /// (0: the last listed sample was plausible).
    refused_lead_ms: u64,
    /// When the node was last listed.
    listed_ms: i64,
}

/// Samples per node, for the longest window in force.
#[derive(Debug)]
pub struct UsageHistory {
    keep_ms: i64,
    poll_interval_ms: u64,
    last_failed: bool,
    synced: bool,
    nodes: HashMap<String, NodeSamples>,
}

impl UsageHistory {
    /// Keep samples for `keep` (the longest `spec.usage.window`); the metrics API is polled
    /// every `poll_interval`.
    pub fn new(keep: Duration, poll_interval: Duration) -> UsageHistory {
        UsageHistory {
            keep_ms: i64::try_from(keep.as_millis()).unwrap_or(i64::MAX),
            poll_interval_ms: u64::try_from(poll_interval.as_millis()).unwrap_or(u64::MAX),
            last_failed: false,
            synced: false,
            nodes: HashMap::new(),
        }
    }

    /// Keep samples for `keep` from the next poll on (the longest window changed).
    pub fn set_keep(&mut self, keep: Duration) {
        self.keep_ms = i64::try_from(keep.as_millis()).unwrap_or(i64::MAX);
    }

    /// Whether one poll has succeeded.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// Whether the last poll failed.
    pub fn last_failed(&self) -> bool {
        self.last_failed
    }

    /// Forget every sample and say not synced (the poller stopped: nothing keeps them true).
    pub fn clear(&mut self) {
        self.nodes.clear();
        self.synced = false;
        self.last_failed = false;
    }

    /// Record one poll made at `now_ms`.
    pub fn record(&mut self, now_ms: i64, poll: Poll<'_>) {
        match poll {
            Poll::Failed => self.last_failed = true,
            Poll::Listed(listed) => {
                self.last_failed = false;
                self.synced = true;
                for (name, sample) in listed {
                    let node = match self.nodes.get_mut(*name) {
                        Some(node) => node,
                        None => self.nodes.entry((*name).to_string()).or_default(),
                    };
                    node.listed_ms = now_ms;
                    let lead = u64::try_from(sample.at_ms.saturating_sub(now_ms)).unwrap_or(0);
                    if lead > MAX_SAMPLE_LEAD_MS {
                        node.refused_lead_ms = lead;
                        continue;
                    }
                    node.refused_lead_ms = 0;
                    // metrics-server may list the same scrape twice: keep one.
                    if node
                        .samples
                        .back()
                        .is_none_or(|last| last.at_ms < sample.at_ms)
                    {
                        node.samples.push_back(*sample);
                    }
                }
            }
        }
        let oldest = now_ms.saturating_sub(self.keep_ms);
        self.nodes.retain(|_, node| {
            while node.samples.front().is_some_and(|s| s.at_ms < oldest) {
                node.samples.pop_front();
            }
            if node.listed_ms < oldest {
                node.refused_lead_ms = 0;
            }
            !node.samples.is_empty() || node.refused_lead_ms > 0
        });
    }

    /// What the usage rule needs of `node`: peak usage over `window` before `now_ms`, the age
    /// and window of its newest sample there, the poll interval, and the given requested sums (cpu millicores, memory bytes);
    /// `pods_synced`: whether the pod index the requests come from has synced.
    pub fn usage(
        &self,
        node: &str,
        window: Duration,
        now_ms: i64,
        requested: (u128, u128),
        pods_synced: bool,
    ) -> NodeUsage {
        let since = now_ms.saturating_sub(i64::try_from(window.as_millis()).unwrap_or(i64::MAX));
        let samples = self.nodes.get(node);
        let mut peak: Option<(u64, u64)> = None;
        let mut newest: Option<&Sample> = None;
        for sample in samples.into_iter().flat_map(|n| n.samples.iter()) {
            if sample.at_ms >= since {
                let (cpu, memory) = peak.unwrap_or((0, 0));
                peak = Some((cpu.max(sample.cpu_millis), memory.max(sample.memory_bytes)));
                newest = Some(sample); // oldest first
            }
        }
        let age = |s: &Sample| u64::try_from(now_ms.saturating_sub(s.at_ms)).unwrap_or(0);
        let (peak_cpu, peak_memory) = peak.unwrap_or((0, 0));
        let view = |requested, peak_usage: u64| UsageView {
            synced: self.synced && pods_synced,
            metrics_failing: self.last_failed,
            sample_age_ms: newest.map(age),
            sample_window_ms: newest.map_or(0, |s| s.window_ms),
            sample_lead_ms: samples.map_or(0, |n| n.refused_lead_ms),
            capacity: None,
            poll_interval_ms: self.poll_interval_ms,
            requested,
            peak_usage: u128::from(peak_usage),
        };
        NodeUsage {
            cpu: Some(view(requested.0, peak_cpu)),
            memory: Some(view(requested.1, peak_memory)),
        }
    }

    /// The newest sample of `node` (for the pressure taint, which judges the latest usage, not
    /// the peak of a window).
    pub fn latest(&self, node: &str) -> Option<Sample> {
        self.nodes.get(node)?.samples.back().copied()
    }

    /// How often the metrics API is polled, ms.
    pub fn poll_interval_ms(&self) -> u64 {
        self.poll_interval_ms
    }

    /// Nodes with samples (for a gauge).
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    fn sample(at_ms: i64, cpu_millis: u64, memory_bytes: u64) -> Sample {
        Sample {
            at_ms,
            window_ms: 10_000,
            cpu_millis,
            memory_bytes,
        }
    }

    fn cpu(history: &UsageHistory, node: &str, window_min: u64, now_ms: i64) -> Option<UsageView> {
        history
            .usage(
                node,
                Duration::from_secs(window_min * 60),
                now_ms,
                (5, 7),
                true,
            )
            .cpu
    }

    #[test]
    fn peak_over_the_window_and_age_of_the_newest_sample() {
        let mut history = UsageHistory::new(Duration::from_secs(30 * 60), Duration::from_secs(30));
        // Not synced before the first successful poll.
        assert_eq!(cpu(&history, "a", 15, 0).map(|v| v.synced), Some(false));
        history.record(0, Poll::Listed(&[("a", sample(0, 900, 10))]));
        history.record(
            MIN,
            Poll::Listed(&[("a", sample(MIN, 300, 40)), ("b", sample(MIN, 1, 1))]),
        );
        history.record(
            2 * MIN,
            Poll::Listed(&[("a", sample(2 * MIN - 5_000, 500, 20))]),
        );
        let a = history.usage("a", Duration::from_secs(15 * 60), 2 * MIN, (5, 7), true);
        assert_eq!(a.cpu.map(|v| (v.peak_usage, v.requested)), Some((900, 5)));
        assert_eq!(a.memory.map(|v| (v.peak_usage, v.requested)), Some((40, 7)));
        // Age from the sample's own timestamp, with its window and the poll interval.
        assert_eq!(
            a.cpu
                .map(|v| (v.sample_age_ms, v.sample_window_ms, v.poll_interval_ms)),
            Some((Some(5_000), 10_000, 30_000))
        );
        assert!(a.cpu.is_some_and(|v| v.synced && !v.metrics_failing));
        // A shorter window leaves the first sample out.
        assert_eq!(
            cpu(&history, "a", 1, 2 * MIN).map(|v| v.peak_usage),
            Some(500)
        );
        // b's newest sample is a minute old; c has none; a timestamp ahead of now is age 0.
        assert_eq!(
            cpu(&history, "b", 15, 2 * MIN).and_then(|v| v.sample_age_ms),
            Some(60_000)
        );
        assert_eq!(
            cpu(&history, "c", 15, 2 * MIN).and_then(|v| v.sample_age_ms),
            None
        );
        assert_eq!(
            cpu(&history, "b", 15, MIN - 1).and_then(|v| v.sample_age_ms),
            Some(0)
        );
        // Pods not synced: not synced.
        let unsynced = history.usage("a", Duration::from_secs(900), 2 * MIN, (0, 0), false);
        assert_eq!(unsynced.cpu.map(|v| v.synced), Some(false));
    }

    /// metrics-server listing the same old sample on every poll (a kubelet that stopped
    /// reporting): the sample ages by its timestamp and the rule calls it stale.
    #[test]
    fn a_frozen_sample_goes_stale_though_listed_every_poll() {
        use crate::node::usage::is_stale;
        let mut history = UsageHistory::new(Duration::from_secs(15 * 60), Duration::from_secs(30));
        let frozen = sample(0, 900, 10);
        let mut stale_at = None;
        for poll in 0..10 {
            let now = poll * 30_000;
            history.record(now, Poll::Listed(&[("a", frozen)]));
            let view = cpu(&history, "a", 15, now);
            assert!(view.is_some_and(|v| v.synced && !v.metrics_failing));
            let stale = view.is_some_and(|v| {
                v.sample_age_ms
                    .is_some_and(|age| is_stale(age, v.sample_window_ms, v.poll_interval_ms))
            });
            if stale && stale_at.is_none() {
                stale_at = Some(now);
            }
        }
        // 10 s window + 3 x 30 s: the first poll past 100 s.
        assert_eq!(stale_at, Some(120_000));
        assert_eq!(history.nodes.get("a").map(|n| n.samples.len()), Some(1));
    }

    /// A sample stamped over 30 s ahead is refused (not kept, the view says how far ahead)
    /// until a plausible one is listed; it never hides later samples.
    #[test]
    fn a_sample_from_the_future_is_refused() {
        let mut history = UsageHistory::new(Duration::from_secs(10 * 60), Duration::from_secs(30));
        let lead = |h: &UsageHistory, now| cpu(h, "a", 15, now).map(|v| v.sample_lead_ms);
        // (listed at, sample stamped at, view's lead, samples kept)
        let cases = [
            (0, 30_000, 0, 1),                // exactly 30 s ahead: kept
            (MIN, 2 * MIN + 1, MIN + 1, 1),   // over 30 s ahead: refused, said
            (2 * MIN, 2 * MIN - 1_000, 0, 2), // a plausible one: kept, nothing said
            (
                3 * MIN,
                3 * MIN + 365 * 24 * 60 * MIN,
                365 * 24 * 60 * MIN,
                2,
            ), // a year ahead
            (4 * MIN, 4 * MIN, 0, 3),         // not hidden by the refused one
        ];
        for (now, at, want_lead, kept) in cases {
            history.record(now, Poll::Listed(&[("a", sample(at, 900, 10))]));
            assert_eq!(
                lead(&history, now),
                Some(u64::try_from(want_lead).unwrap_or(0)),
                "at {now}"
            );
            assert_eq!(
                history.nodes.get("a").map(|n| n.samples.len()),
                Some(kept),
                "at {now}"
            );
        }
        // A node only ever listed from the future: no sample, said; forgotten after `keep`
        // without another listing.
        history.record(5 * MIN, Poll::Listed(&[("b", sample(6 * MIN, 1, 1))]));
        let b = cpu(&history, "b", 15, 5 * MIN);
        assert_eq!(
            b.map(|v| (v.sample_age_ms, v.sample_lead_ms)),
            Some((None, 60_000))
        );
        history.record(16 * MIN, Poll::Listed(&[]));
        assert_eq!(lead(&history, 16 * MIN), Some(0));
        assert!(!history.nodes.contains_key("b"));
    }

    #[test]
    fn failed_polls_count_and_old_samples_go() {
        let mut history = UsageHistory::new(Duration::from_secs(10 * 60), Duration::from_secs(60));
        history.record(0, Poll::Listed(&[("a", sample(0, 900, 10))]));
        for poll in 1..=4 {
            history.record(poll * MIN, Poll::Failed);
        }
        let a = cpu(&history, "a", 15, 4 * MIN);
        assert_eq!(a.and_then(|v| v.sample_age_ms), Some(4 * 60_000));
        assert!(a.is_some_and(|v| v.metrics_failing && v.synced));
        // A success clears the failure; a repeated scrape is kept once.
        history.record(5 * MIN, Poll::Listed(&[("a", sample(0, 900, 10))]));
        assert_eq!(history.nodes.get("a").map(|n| n.samples.len()), Some(1));
        assert!(cpu(&history, "a", 15, 5 * MIN).is_some_and(|v| !v.metrics_failing));
        assert!(history.synced() && !history.last_failed());
        // Past `keep`, the node is forgotten; a shorter keep applies from the next poll.
        history.set_keep(Duration::from_secs(60));
        history.record(7 * MIN, Poll::Listed(&[("b", sample(7 * MIN, 1, 1))]));
        assert_eq!(history.nodes(), 1);
        history.record(11 * MIN, Poll::Listed(&[]));
        assert_eq!(history.nodes(), 0);
        assert_eq!(
            cpu(&history, "a", 15, 11 * MIN).and_then(|v| v.sample_age_ms),
            None
        );
        // Cleared (the poller stopped): nothing kept, not synced.
        history.record(12 * MIN, Poll::Listed(&[("b", sample(12 * MIN, 1, 1))]));
        history.clear();
        assert_eq!(history.nodes(), 0);
        assert!(!history.synced());
    }
}
