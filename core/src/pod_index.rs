//! The lean pod index the usage rule and the placement cap share: per non-terminal pod, its node,
//! what it requests of cpu and memory (as `crate::requests` counts them; the cap's resources are
//! cpu and memory only) and whether the cap exempts it (`crate::cap::Exempt`), and per node the sums, kept as pods come
//! and go. Pure: the one pod watch (`sources::pods`, I/O) applies its events here.
//!
//! Compact: a pod is its `namespace/name` key, a node number, a byte and two `u64`s (24 bytes
//! beside the key); node names are stored once. Pods without a node (pending, unscheduled) are
//! kept, counted in no node's sum: the cap reads a pod being bound from here. Terminal pods
//! (`Succeeded`, `Failed`) are dropped: the scheduler no longer counts them either. A node's
//! sums are one lookup ([`PodIndex::requested`]), whatever the number of its pods.

use std::collections::HashMap;

use crate::cap::Exempt;

/// A pod's phase, as far as the index cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Pending, Running, Unknown, or absent.
    Active,
    /// Succeeded or Failed.
    Terminal,
}

impl Phase {
    /// From `status.phase`.
    pub fn from_status(phase: Option<&str>) -> Phase {
        match phase {
            Some("Succeeded" | "Failed") => Phase::Terminal,
            _ => Phase::Active,
        }
    }
}

/// What a pod takes: cpu millicores and memory bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Requested {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

/// A pod as the watch last saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observed<'a> {
    /// `spec.nodeName`; None or empty while pending.
    pub node: Option<&'a str>,
    pub requested: Requested,
    /// Why the cap never refuses it (a mirror, a DaemonSet's or a critical pod), if so.
    pub exempt: Option<Exempt>,
    pub phase: Phase,
}

/// A pod in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Indexed<'a> {
    /// None while pending.
    pub node: Option<&'a str>,
    pub requested: Requested,
    pub exempt: Option<Exempt>,
}

/// No node.
const UNBOUND: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Entry {
    node: u32,
    exempt: Option<Exempt>,
    requested: Requested,
}

/// Pods by `namespace/name`, and per-node sums.
#[derive(Debug, Default)]
pub struct PodIndex {
    pods: HashMap<Box<str>, Entry>,
    node_names: Vec<Box<str>>,
    node_ids: HashMap<Box<str>, u32>,
    /// By node id: the sums of its pods' requests.
    sums: Vec<(u128, u128)>,
}

impl PodIndex {
    /// Apply a pod as the watch last saw it (added or modified), by `namespace/name`.
    pub fn apply(&mut self, key: &str, pod: Observed<'_>) {
        if pod.phase == Phase::Terminal {
            self.remove(key);
            return;
        }
        let node = match pod.node.filter(|n| !n.is_empty()) {
            Some(name) => self.node_id(name),
            None => UNBOUND,
        };
        let entry = Entry {
            node,
            exempt: pod.exempt,
            requested: pod.requested,
        };
        let previous = match self.pods.get_mut(key) {
            Some(slot) => Some(std::mem::replace(slot, entry)),
            None => {
                self.pods.insert(key.into(), entry);
                None
            }
        };
        if let Some(previous) = previous {
            self.add(previous, false);
        }
        self.add(entry, true);
    }

    /// A pod deleted (or gone terminal).
    pub fn remove(&mut self, key: &str) {
        if let Some(previous) = self.pods.remove(key) {
            self.add(previous, false);
        }
    }

    /// The sums of requests on `node`: cpu millicores, memory bytes.
    pub fn requested(&self, node: &str) -> (u128, u128) {
        self.node_ids
            .get(node)
            .and_then(|id| self.sums.get(*id as usize))
            .copied()
            .unwrap_or((0, 0))
    }

    /// A pod by `namespace/name` (pending pods too).
    pub fn get(&self, key: &str) -> Option<Indexed<'_>> {
        self.pods.get(key).map(|entry| Indexed {
            node: self.node_names.get(entry.node as usize).map(|n| &**n),
            requested: entry.requested,
            exempt: entry.exempt,
        })
    }

    /// Pods indexed.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    fn node_id(&mut self, name: &str) -> u32 {
        if let Some(id) = self.node_ids.get(name) {
            return *id;
        }
        let id = u32::try_from(self.node_names.len()).unwrap_or(UNBOUND);
        if id != UNBOUND {
            self.node_names.push(name.into());
            self.node_ids.insert(name.into(), id);
            self.sums.push((0, 0));
        }
        id
    }

    /// Add (or take back) an entry's requests to its node's sums.
    fn add(&mut self, entry: Entry, add: bool) {
        let Some(sum) = self.sums.get_mut(entry.node as usize) else {
            return; // unbound
        };
        let (cpu, memory) = (
            u128::from(entry.requested.cpu_millis),
            u128::from(entry.requested.memory_bytes),
        );
        *sum = if add {
            (sum.0.saturating_add(cpu), sum.1.saturating_add(memory))
        } else {
            (sum.0.saturating_sub(cpu), sum.1.saturating_sub(memory))
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(cpu_millis: u64, memory_bytes: u64) -> Requested {
        Requested {
            cpu_millis,
            memory_bytes,
        }
    }

    fn seen(node: Option<&str>, requested: Requested, phase: Phase) -> Observed<'_> {
        Observed {
            node,
            requested,
            exempt: None,
            phase,
        }
    }

    #[test]
    fn an_entry_is_24_bytes_beside_its_key() {
        assert_eq!(std::mem::size_of::<Entry>(), 24);
    }

    #[test]
    fn sums_follow_pods_as_they_come_move_and_go() {
        let mut index = PodIndex::default();
        let active = Phase::Active;
        index.apply("ns/a", seen(Some("n1"), r(500, 100), active));
        index.apply("ns/b", seen(Some("n1"), r(250, 50), active));
        index.apply("ns/pending", seen(None, r(1000, 1000), active));
        index.apply("ns/c", seen(Some("n2"), r(100, 10), active));
        assert_eq!(index.requested("n1"), (750, 150));
        assert_eq!(index.requested("n2"), (100, 10));
        assert_eq!(index.requested("n3"), (0, 0));
        assert_eq!(index.len(), 4);
        // Modified: resized in place, then bound (a pending pod gets its node).
        assert_eq!(
            index.get("ns/pending").map(|p| (p.node, p.requested)),
            Some((None, r(1000, 1000)))
        );
        index.apply("ns/a", seen(Some("n1"), r(700, 100), active));
        index.apply("ns/pending", seen(Some("n2"), r(1000, 1000), active));
        assert_eq!(
            index.get("ns/pending").map(|p| (p.node, p.exempt)),
            Some((Some("n2"), None))
        );
        assert_eq!(index.requested("n1"), (950, 150));
        assert_eq!(index.requested("n2"), (1100, 1010));
        // Terminal pods and deletions leave the sums; deleting twice is harmless.
        index.apply(
            "ns/b",
            seen(
                Some("n1"),
                r(250, 50),
                Phase::from_status(Some("Succeeded")),
            ),
        );
        index.remove("ns/c");
        index.remove("ns/c");
        assert_eq!(index.requested("n1"), (700, 100));
        assert_eq!(index.requested("n2"), (1000, 1000));
        assert_eq!(index.len(), 2);
        assert_eq!(index.get("ns/b"), None);
        // An empty node name is no node; an exempt pod says so.
        index.apply(
            "kube-system/etcd-n3",
            Observed {
                exempt: Some(Exempt::Mirror),
                ..seen(Some(""), r(100, 0), active)
            },
        );
        assert_eq!(
            index.get("kube-system/etcd-n3").map(|p| (p.node, p.exempt)),
            Some((None, Some(Exempt::Mirror)))
        );
        assert_eq!(Phase::from_status(Some("Running")), Phase::Active);
        assert_eq!(Phase::from_status(None), Phase::Active);
        assert_eq!(Phase::from_status(Some("Failed")), Phase::Terminal);
    }
}
