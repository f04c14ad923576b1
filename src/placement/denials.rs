//! The placement cap's denials, summed per node and told at most once a minute per node as a
//! Warning Event on the node (`PlacementCapDenied`): how many placements were refused, by
//! resource. The first denial after a quiet minute is told within `CHECK`. No pod, namespace or
//! figure is named: the Event is for the operator, and a node's Events are not the place for
//! one tenant's requests. Dry runs are not counted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::events::{Note, Recorder, node_ref};
use crate::shutdown::Signal;

/// At most one Event per node per this.
pub const PERIOD: Duration = Duration::from_secs(60);
/// How often the sums are looked at.
const CHECK: Duration = Duration::from_secs(5);

/// Refusals per node since it was last told: (placements, per resource), and when each node was
/// last told.
#[derive(Debug, Default)]
pub struct Denials {
    nodes: BTreeMap<String, (u64, BTreeMap<String, u64>)>,
    told: BTreeMap<String, Instant>,
}

impl Denials {
    /// One placement on `node` refused, over the cap of `resources`.
    pub fn record(&mut self, node: &str, resources: &[String]) {
        let (placements, by_resource) = self.nodes.entry(node.to_string()).or_default();
        *placements += 1;
        for resource in resources {
            *by_resource.entry(resource.clone()).or_default() += 1;
        }
    }

    /// The notes due at `now`, one per node with refusals not told within `PERIOD`; those
    /// nodes start a fresh tally.
    pub fn take(&mut self, now: Instant) -> Vec<(String, String)> {
        let told = &mut self.told;
        told.retain(|_, at| now.saturating_duration_since(*at) < PERIOD);
        let due: Vec<String> = self
            .nodes
            .keys()
            .filter(|node| !told.contains_key(*node))
            .cloned()
            .collect();
        due.into_iter()
            .filter_map(|node| {
                let (placements, by_resource) = self.nodes.remove(&node)?;
                self.told.insert(node.clone(), now);
                Some((node, placements, by_resource))
            })
            .map(|(node, placements, by_resource)| {
                let plural = if placements == 1 { "" } else { "s" };
                let resources = by_resource
                    .iter()
                    .map(|(r, n)| format!("{r}: {n}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let note = format!(
                    "the placement cap refused {placements} pod placement{plural} on this node ({resources})"
                );
                (node, note)
            })
            .collect()
    }
}

/// Tell the sums that are due every `CHECK` until `shutdown` says stop.
pub async fn report(denials: Arc<Mutex<Denials>>, recorder: Recorder, shutdown: Signal) {
    let mut tick = tokio::time::interval(CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.stopped() => return,
        }
        let notes = denials
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take(Instant::now());
        for (node, note) in notes {
            recorder.emit(Note {
                regarding: node_ref(&node),
                warning: true,
                reason: "PlacementCapDenied",
                action: "Deny",
                note,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(node: &str, text: &str) -> (String, String) {
        (
            node.to_string(),
            format!("the placement cap refused {text}"),
        )
    }

    #[test]
    fn denials_are_summed_per_node_and_told_once_a_minute() {
        let start = Instant::now();
        let mut denials = Denials::default();
        let cpu = ["cpu".to_string()];
        let both = ["cpu".to_string(), "memory".to_string()];
        denials.record("n1", &cpu);
        denials.record("n1", &both);
        denials.record("n2", &both);
        assert_eq!(
            denials.take(start),
            [
                note("n1", "2 pod placements on this node (cpu: 2, memory: 1)"),
                note("n2", "1 pod placement on this node (cpu: 1, memory: 1)"),
            ]
        );
        assert!(denials.take(start).is_empty());
        // Within the minute: summed, not told; a node not told yet is told at once.
        denials.record("n1", &cpu);
        denials.record("n1", &cpu);
        denials.record("n3", &cpu);
        let soon = start + CHECK;
        assert_eq!(
            denials.take(soon),
            [note("n3", "1 pod placement on this node (cpu: 1)")]
        );
        assert_eq!(
            denials.take(start + PERIOD),
            [note("n1", "2 pod placements on this node (cpu: 2)")]
        );
        assert!(denials.take(start + PERIOD * 3).is_empty());
    }
}
