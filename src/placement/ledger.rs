//! Bindings this replica allowed that its pod watch has not shown yet, so that a burst of
//! bindings to one node is counted before the watch catches up. Pure (the time is passed in).
//!
//! An entry is dropped when the watch shows the pod bound (`seen_bound`) or after `ttl`
//! (30 s in the server): a binding the API server then refused (another webhook, a conflict)
//! stops counting by itself.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// How long an allowed binding counts without the watch showing it.
pub const LEDGER_TTL: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
struct Entry {
    node: String,
    requests: BTreeMap<String, u128>,
    at: Instant,
}

/// Allowed bindings by pod (`namespace/name`).
#[derive(Debug, Default)]
pub struct Ledger {
    ttl: Duration,
    entries: HashMap<String, Entry>,
}

impl Ledger {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: HashMap::new(),
        }
    }

    /// A binding of `pod` to `node` was allowed at `now` (a repeat replaces the earlier one).
    pub fn record(
        &mut self,
        pod: &str,
        node: &str,
        requests: &BTreeMap<String, u128>,
        now: Instant,
    ) {
        self.expire(now);
        self.entries.insert(
            pod.to_string(),
            Entry {
                node: node.to_string(),
                requests: requests.clone(),
                at: now,
            },
        );
    }

    /// The watch shows `pod` on a node (or gone): its own requests count from there.
    pub fn seen_bound(&mut self, pod: &str) {
        self.entries.remove(pod);
    }

    /// Requests of the bindings to `node` still counted at `now`, summed per resource, but for
    /// `except`'s own (a binding retried must not count against itself).
    pub fn pending(&self, node: &str, except: &str, now: Instant) -> BTreeMap<String, u128> {
        let mut sum = BTreeMap::new();
        for (pod, entry) in &self.entries {
            if entry.node == node
                && pod != except
                && now.saturating_duration_since(entry.at) < self.ttl
            {
                for (resource, value) in &entry.requests {
                    let total = sum.entry(resource.clone()).or_insert(0u128);
                    *total = total.saturating_add(*value);
                }
            }
        }
        sum
    }

    /// Drop entries older than the ttl.
    pub fn expire(&mut self, now: Instant) {
        let ttl = self.ttl;
        self.entries
            .retain(|_, e| now.saturating_duration_since(e.at) < ttl);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
