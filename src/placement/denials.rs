//! The placement cap's denials, summed per node and told once a minute as a Warning Event on
//! the node (`PlacementCapDenied`): how many placements were refused, by resource. No pod,
//! namespace or figure is named: the Event is for the operator, and a node's Events are not
//! the place for one tenant's requests. Dry runs are not counted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::events::{Note, Recorder, node_ref};
use crate::shutdown::Signal;

/// How often the sums are told (and reset).
pub const PERIOD: Duration = Duration::from_secs(60);

/// Refusals per node since the last report: (placements, per resource).
#[derive(Debug, Default)]
pub struct Denials {
    nodes: BTreeMap<String, (u64, BTreeMap<String, u64>)>,
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

    /// The notes for the period that ended, one per node, and a fresh tally.
    pub fn take(&mut self) -> Vec<(String, String)> {
        std::mem::take(&mut self.nodes)
            .into_iter()
            .map(|(node, (placements, by_resource))| {
                let plural = if placements == 1 { "" } else { "s" };
                let resources = by_resource
                    .iter()
                    .map(|(r, n)| format!("{r}: {n}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let note = format!(
                    "the placement cap refused {placements} pod placement{plural} on this node in the last minute ({resources})"
                );
                (node, note)
            })
            .collect()
    }
}

/// Tell the sums every `PERIOD` until `shutdown` says stop.
pub async fn report(denials: Arc<Mutex<Denials>>, recorder: Recorder, shutdown: Signal) {
    let mut tick = tokio::time::interval(PERIOD);
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
            .take();
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

    #[test]
    fn denials_are_summed_per_node_and_reset() {
        let mut denials = Denials::default();
        let cpu = ["cpu".to_string()];
        let both = ["cpu".to_string(), "memory".to_string()];
        denials.record("n1", &cpu);
        denials.record("n1", &both);
        denials.record("n2", &both);
        assert_eq!(
            denials.take(),
            [
                (
                    "n1".to_string(),
                    "the placement cap refused 2 pod placements on this node in the last minute (cpu: 2, memory: 1)".to_string()
                ),
                (
                    "n2".to_string(),
                    "the placement cap refused 1 pod placement on this node in the last minute (cpu: 1, memory: 1)".to_string()
                ),
            ]
        );
        assert!(denials.take().is_empty());
    }
}
