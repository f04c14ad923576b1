//! Leader only, pure: which nodes a policy change has not reached yet, and when to nudge them
//! (docs/architecture.md §5, rule 3.12). I/O: `nudger`.
//!
//! A kubelet whose status is unchanged writes it only every `nodeStatusReportFrequency` (5 min),
//! and the node webhook sees nothing else, so a new, changed or deleted policy, a relabelled node
//! or an opt-out would wait that long on a node whose allocatable is not inflated yet. The leader
//! sends such a node an empty status PATCH (a "nudge", written as the ServiceAccount, which the
//! node webhook's match condition and the compiled policy's `takes` take); the webhook (or the
//! compiled policy) then applies the node rule to the stored node as to any status write.
//!
//! - `need`: whether the node rule would change the stored node, found by running it
//!   (`node::decide`) on the node as stored, as both object and oldObject: exactly when a nudge
//!   changes something, and never when the node is at its policy (the rule does not compound,
//!   rule 3.2: a nudge of such a node writes nothing). A node whose winning policy has
//!   `spec.usage` is nudged only when the applied annotation names another policy or another
//!   generation of it (a new ceiling, say, or a rollout's step), or names it with no usage values (the fallback: nudged with the backoff below until usage is known):
//!   its values come from usage the leader does not hold, and the webhook keeps them at each
//!   kubelet write.
//!   A node waiting for its step of a staged rollout (`overcommit_core::rollout`) is judged
//!   on what it carries, as the webhook treats it: up to date until the leader admits it.
//! - `Backlog`: the nodes out of date, each nudged at once, then again after 2 s, 4 s, 8 s ...
//!   (at most every 5 min) while it stays out of date: the replica that answers the nudge, or the
//!   compiled policy, may not have the change yet (a second or two), or (a ServiceAccount other than the one in the match conditions) a
//!   nudge may change nothing at all.
//! - `Bucket`: the token bucket pacing the nudges (`serve --nudge-rate`).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use overcommit_core::Account;
use overcommit_core::node::{self, APPLIED_ANNOTATION, NodeView, RAW_ALLOCATABLE_ANNOTATION};
use overcommit_core::policy::{NodeChoice, PolicySet};
use overcommit_core::rollout;
use overcommit_json::StrMap;

/// First wait before a node still out of date is nudged again; doubled per nudge.
pub const FIRST_RETRY: Duration = Duration::from_secs(2);
/// Longest wait between two nudges of one node.
pub const MAX_RETRY: Duration = Duration::from_secs(300);

/// What the node rule reads of a node: labels, the two overcommit annotations, allocatable and
/// capacity (about 1 KB a node; the rest of the object is dropped when it is read).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeFacts {
    pub labels: StrMap<'static>,
    pub annotations: StrMap<'static>,
    pub allocatable: StrMap<'static>,
    pub capacity: StrMap<'static>,
}

fn owned<'a>(pairs: impl Iterator<Item = (&'a String, &'a String)>) -> StrMap<'static> {
    let mut map = StrMap::new();
    for (key, value) in pairs {
        map.insert(Cow::Owned(key.clone()), Cow::Owned(value.clone()));
    }
    map
}

impl NodeFacts {
    pub fn from_node(node: &Node) -> Self {
        let meta = &node.metadata;
        let status = node.status.as_ref();
        let quantities = |q: Option<
            &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
        >| {
            let mut map = StrMap::new();
            for (key, value) in q.into_iter().flatten() {
                map.insert(Cow::Owned(key.clone()), Cow::Owned(value.0.clone()));
            }
            map
        };
        Self {
            labels: owned(meta.labels.iter().flatten()),
            annotations: owned(
                meta.annotations
                    .iter()
                    .flatten()
                    .filter(|(k, _)| *k == RAW_ALLOCATABLE_ANNOTATION || *k == APPLIED_ANNOTATION),
            ),
            allocatable: quantities(status.and_then(|s| s.allocatable.as_ref())),
            capacity: quantities(status.and_then(|s| s.capacity.as_ref())),
        }
    }

    fn view(&self) -> NodeView<'_> {
        NodeView {
            has_metadata: true,
            labels: Some(&self.labels),
            annotations: (!self.annotations.is_empty()).then_some(&self.annotations),
            allocatable: Some(&self.allocatable),
            capacity: Some(&self.capacity),
            conditions: None,
        }
    }
}

/// Whether a node needs a nudge, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// The node rule would change nothing.
    UpToDate,
    /// A policy selects the node and its allocatable or annotations are not what it gives.
    Apply,
    /// No policy selects the node, or it is opted out, and it still carries the annotations.
    Restore,
    /// The rule cannot decide (the webhook would fail open): a nudge would change nothing.
    Undecided,
}

impl Need {
    pub fn is_out_of_date(self) -> bool {
        matches!(self, Need::Apply | Need::Restore)
    }
}

/// Whether the node rule would change node `name` as stored under `policies` (a node waiting
/// for its step of a staged rollout is judged as the webhook judges it: on what it carries).
pub fn need(name: &str, node: &NodeFacts, policies: &PolicySet) -> Need {
    let view = node.view();
    let choice = policies.for_node(&view.labels);
    let held = rollout::held(policies, &choice, name, &view, Some(&view));
    let policies = held.as_ref().unwrap_or(policies);
    if let NodeChoice::Policy(policy) = policies.for_node(&view.labels)
        && policy.usage.is_some()
    {
        // On the fallback (no usage values written), a nudge lets the node follow usage once
        // it is known, which a quiet kubelet would bring only at its next report.
        let applied = node
            .annotations
            .get(APPLIED_ANNOTATION)
            .and_then(|text| node::applied_summary(text).ok());
        let current = applied.is_some_and(|a| {
            a.policy == policy.name && a.generation == policy.generation && !a.usage.is_empty()
        });
        return if current { Need::UpToDate } else { Need::Apply };
    }
    match node::decide_with_usage(&view, Some(&view), policies, Account::PatchOnly, None, None) {
        Ok(decision) if decision.patch.is_empty() => Need::UpToDate,
        Ok(decision) => match decision.outcome {
            node::NodeOutcome::Policy(_) => Need::Apply,
            node::NodeOutcome::NoPolicy | node::NodeOutcome::OptedOut => Need::Restore,
        },
        Err(_) => Need::Undecided,
    }
}

/// The wait after the `attempts`-th nudge of a node still out of date.
pub fn retry_after(attempts: u32) -> Duration {
    let doublings = attempts.saturating_sub(1).min(16);
    FIRST_RETRY.saturating_mul(1u32 << doublings).min(MAX_RETRY)
}

#[derive(Debug, Clone, PartialEq)]
struct Entry {
    /// When the leader first saw the node out of date.
    since: Instant,
    attempts: u32,
    /// When it may be nudged (again).
    due: Instant,
}

/// The nodes out of date and when each is due a nudge.
#[derive(Debug, Default)]
pub struct Backlog {
    entries: BTreeMap<String, Entry>,
}

impl Backlog {
    /// Record what `need` says of `name` now. A node that is up to date again leaves the backlog;
    /// the answer is then how long it was out of date (the lag), if it was.
    pub fn observe(&mut self, name: &str, need: Need, now: Instant) -> Option<Duration> {
        if need.is_out_of_date() {
            self.entries.entry(name.to_string()).or_insert(Entry {
                since: now,
                attempts: 0,
                due: now,
            });
            return None;
        }
        let entry = self.entries.remove(name)?;
        Some(now.saturating_duration_since(entry.since))
    }

    /// The node is gone.
    pub fn forget(&mut self, name: &str) {
        self.entries.remove(name);
    }

    /// Keep only the nodes `keep` says are still there (after a relist).
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.entries.retain(|name, _| keep(name));
    }

    /// The node due first, if one is due at `now` (ties: by name).
    pub fn due(&self, now: Instant) -> Option<&str> {
        self.entries
            .iter()
            .filter(|(_, e)| e.due <= now)
            .min_by_key(|(_, e)| e.due)
            .map(|(name, _)| name.as_str())
    }

    /// When the next node falls due (None: the backlog is empty).
    pub fn next_due(&self) -> Option<Instant> {
        self.entries.values().map(|e| e.due).min()
    }

    /// `name` was nudged at `now` (or the nudge failed): due again after `retry_after`.
    pub fn nudged(&mut self, name: &str, now: Instant) {
        if let Some(entry) = self.entries.get_mut(name) {
            entry.attempts = entry.attempts.saturating_add(1);
            entry.due = now + retry_after(entry.attempts);
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A token bucket: `rate` nudges a second on average, at most `burst` at once.
#[derive(Debug, Clone)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// Full at `now`. A rate of zero or less never gives a token.
    pub fn new(rate: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            rate,
            burst,
            tokens: burst,
            at: now,
        }
    }

    /// Take a token at `now`, or say how long until there is one (None: never, rate 0).
    pub fn take(&mut self, now: Instant) -> Result<(), Option<Duration>> {
        if self.rate <= 0.0 {
            return Err(None);
        }
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.at = self.at.max(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        Err(Some(Duration::from_secs_f64(
            (1.0 - self.tokens) / self.rate,
        )))
    }
}

#[cfg(test)]
mod tests;
