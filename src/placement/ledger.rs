//! Placements this replica allowed that its pod watch has not shown yet, so that a burst to one
//! node is counted before the watch catches up. Pure (the time is passed in).
//!
//! An entry is dropped when the watch shows the pod bound (`seen_bound`) or after `ttl`
//! (30 s in the server): a placement the API server then refused stops counting by itself.
//!
//! Admission does not guarantee that a placement is stored: a pod create can still fail after
//! the validating webhooks (its name taken: AlreadyExists; its namespace's ResourceQuota full),
//! and a tenant may send such creates on purpose. So who an entry counts against is its
//! [`Hold`]: the binding of a pending pod (the scheduler's) counts for every placement on its
//! node; a pod created with `spec.nodeName`, which a tenant controls from end to end, counts only
//! against further placements in its own namespace. A tenant's own burst is held exactly; creates
//! that never persist hold back no one but the tenant who sent them; creates from different
//! namespaces at the same instant can pass on the same sum, by at most what is in flight during
//! the watch's lag (as two replicas can).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use overcommit_core::pod_index::PodIndex;

/// How long an allowed binding counts without the watch showing it.
pub const LEDGER_TTL: Duration = Duration::from_secs(30);

/// Whom an allowed placement counts against until the watch shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Every placement on the node (the binding of a pending pod).
    Everyone,
    /// Placements of pods in the same namespace only (a pod created with `spec.nodeName`).
    OwnNamespace,
}

#[derive(Debug, Clone)]
struct Entry {
    node: String,
    requests: BTreeMap<String, u128>,
    hold: Hold,
    at: Instant,
}

/// The namespace of a `namespace/name` key.
fn namespace_of(key: &str) -> &str {
    key.split_once('/').map_or("", |(namespace, _)| namespace)
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

    /// A placement of `pod` (`namespace/name`) on `node` was allowed at `now`, counting
    /// against whom `hold` says (a repeat replaces the earlier one).
    pub fn record(
        &mut self,
        pod: &str,
        node: &str,
        requests: &BTreeMap<String, u128>,
        hold: Hold,
        now: Instant,
    ) {
        self.expire(now);
        self.entries.insert(
            pod.to_string(),
            Entry {
                node: node.to_string(),
                requests: requests.clone(),
                hold,
                at: now,
            },
        );
    }

    /// The watch shows `pod` on a node (or gone): its own requests count from there.
    pub fn seen_bound(&mut self, pod: &str) {
        self.entries.remove(pod);
    }

    /// Requests of the placements on `node` still counted at `now` against a placement of `for_pod`
    /// (`namespace/name`), summed per resource, but for `for_pod`'s own (a placement retried
    /// must not count against itself).
    pub fn pending(&self, node: &str, for_pod: &str, now: Instant) -> BTreeMap<String, u128> {
        let namespace = namespace_of(for_pod);
        let mut sum = BTreeMap::new();
        for (pod, entry) in &self.entries {
            if entry.node == node
                && pod != for_pod
                && (entry.hold == Hold::Everyone || namespace_of(pod) == namespace)
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

    /// Keep only the pods `keep` says (a relist drops those it shows bound).
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.entries.retain(|pod, _| keep(pod));
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

/// What the pods on `node` request, as a binding check counts it: the node's sums in the pod
/// index (bound, non-terminal pods), plus the bindings to it in the ledger, less `key`'s own
/// (a pod bound already, or a binding retried, must not count against itself). Cpu and memory
/// (the cap's resources), in millicores and bytes; a few lookups and a pass over the ledger,
/// whatever the number of pods on the node.
pub fn requested_on(
    index: &PodIndex,
    ledger: &Ledger,
    node: &str,
    key: &str,
    now: Instant,
) -> BTreeMap<String, u128> {
    let (mut cpu, mut memory) = index.requested(node);
    if let Some(own) = index.get(key).filter(|p| p.node == Some(node)) {
        cpu = cpu.saturating_sub(u128::from(own.requested.cpu_millis));
        memory = memory.saturating_sub(u128::from(own.requested.memory_bytes));
    }
    let mut sum: BTreeMap<String, u128> = [("cpu", cpu), ("memory", memory)]
        .into_iter()
        .filter(|(_, v)| *v > 0)
        .map(|(r, v)| (r.to_string(), v))
        .collect();
    for (resource, value) in ledger.pending(node, key, now) {
        let total = sum.entry(resource).or_insert(0);
        *total = total.saturating_add(value);
    }
    sum
}
