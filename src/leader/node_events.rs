//! Leader only: Events for what happened to nodes (first overcommitted, restored, usage
//! fallback entered and left; `overcommit_core::node_transitions` decides), one on the node
//! each, and per policy one summary per kind for a burst of them (a policy change reaching 1,000
//! nodes is a few Events on the policy, not 1,000).
//!
//! The first complete node list after winning the election is the baseline and writes nothing:
//! a leader change is not news. A burst is summed up once it has been quiet for `QUIET`, or
//! `LONGEST` after its first change.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use overcommit_core::node_transitions::{Standing, Transition, standing, summaries, transitions};
use overcommit_core::policy::PolicySet;
use overcommit_core::policy_report::NodeFacts;
use tokio::time::Instant;

use crate::events::{Note, Recorder, node_ref};

/// A burst ends after this long without a change...
const QUIET: Duration = Duration::from_secs(3);
/// ...or this long after it began.
const LONGEST: Duration = Duration::from_secs(15);

pub struct NodeEvents {
    recorder: Recorder,
    /// None until the first complete list.
    standings: Option<HashMap<String, Standing>>,
    /// Changes not yet summed up on their policies: (node, change), and when the burst began and
    /// last grew.
    pending: Vec<(String, Transition)>,
    began: Option<Instant>,
    grew: Option<Instant>,
}

impl NodeEvents {
    pub fn new(recorder: Recorder) -> Self {
        Self {
            recorder,
            standings: None,
            pending: Vec::new(),
            began: None,
            grew: None,
        }
    }

    /// Compare every node with what it carried last time; an Event on each node that changed.
    pub fn observe(&mut self, nodes: &HashMap<String, NodeFacts>, set: &PolicySet, now: Instant) {
        let current: HashMap<String, Standing> = nodes
            .iter()
            .map(|(name, facts)| (name.clone(), standing(facts, set)))
            .collect();
        let Some(before) = self.standings.replace(current) else {
            return;
        };
        let Some(after) = self.standings.as_ref() else {
            return;
        };
        let raw = Standing::Raw;
        for (name, now_standing) in after {
            // A node that joined since is compared with the kubelet's values.
            let was = before.get(name).unwrap_or(&raw);
            for transition in transitions(was, now_standing) {
                self.recorder.emit(Note {
                    regarding: node_ref(name),
                    warning: transition.change.warning(),
                    reason: transition.change.reason(),
                    action: transition.change.action(),
                    note: transition.note.clone(),
                });
                self.pending.push((name.clone(), transition));
                self.began.get_or_insert(now);
                self.grew = Some(now);
            }
        }
    }

    /// Sum up a burst that is over on its policies (`policy` finds a policy's reference; a
    /// policy that is gone gets no summary).
    pub fn flush(&mut self, policy: impl Fn(&str) -> Option<ObjectReference>, now: Instant) {
        let (Some(began), Some(grew)) = (self.began, self.grew) else {
            return;
        };
        let over = now.saturating_duration_since(grew) >= QUIET
            || now.saturating_duration_since(began) >= LONGEST;
        if !over {
            return;
        }
        for ((name, change), note) in summaries(&self.pending) {
            let Some(regarding) = policy(&name) else {
                continue;
            };
            self.recorder.emit(Note {
                regarding,
                warning: change.warning(),
                reason: change.policy_reason(),
                action: change.action(),
                note,
            });
        }
        self.pending.clear();
        self.began = None;
        self.grew = None;
    }

    /// Whether a burst waits to be summed up (the caller keeps ticking for it).
    pub fn waiting(&self) -> bool {
        !self.pending.is_empty()
    }
}
