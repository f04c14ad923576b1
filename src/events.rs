//! Kubernetes Events (events.k8s.io/v1) from this replica: what the leader saw happen to nodes
//! and policies, and the placement cap's denials (docs/policy.md, "Events").
//!
//! Emitting never blocks and never fails the caller: [`Recorder::emit`] puts the note on a
//! bounded queue, and one publisher task writes it. On the way, as client-go's recorder does:
//! - `SpamFilter`: a token bucket per object (25 at once, then one per 5 min), so that nothing
//!   this replica does can flood etcd with Events about one node or policy;
//! - `Series`: a note identical to one written in the last 10 minutes (same object, type,
//!   reason, action and text) updates that Event's `series` (count, last seen) instead of
//!   creating another.
//!
//! What is dropped (queue full, filtered) or fails is counted:
//! `kube_overcommit_events_total{result}`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource};
use overcommit_core::policy::OvercommitPolicy;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::shutdown::Signal;

/// `reportingController` of every Event.
pub const REPORTING_CONTROLLER: &str = "overcommit.dev/kube-overcommit";
/// Notes waiting for the publisher; more are dropped (and counted).
const QUEUE: usize = 1024;
/// Events one object may get at once, and how often one more is allowed after that
/// (client-go's `EventSourceObjectSpamFilter`: burst 25, one per 5 minutes).
const BURST: u32 = 25;
const REFILL: Duration = Duration::from_secs(300);
/// How long an Event is kept for series updates of identical notes.
const SERIES_TTL: Duration = Duration::from_secs(600);
/// The API server's limit on `note` (1 KB) and on reason/action (128).
const NOTE_MAX: usize = 1024;
/// Longest wait for one write.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// One Event to write.
#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    pub regarding: ObjectReference,
    pub warning: bool,
    pub reason: &'static str,
    pub action: &'static str,
    pub note: String,
}

/// A Node, as Events name it (the kubelet also uses the name as the uid, and `kubectl
/// describe node` looks for both).
pub fn node_ref(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.into()),
        uid: Some(name.into()),
        ..Default::default()
    }
}

/// An OvercommitPolicy, with its uid (which `kubectl describe` matches).
pub fn policy_ref(policy: &OvercommitPolicy) -> ObjectReference {
    policy.object_ref(&())
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// `created`, `series` (an existing Event's count raised), `filtered` (the object's
    /// budget is spent), `dropped` (queue full or no API client), `failed`.
    pub result: String,
}

/// `kube_overcommit_events_total{result}`.
#[derive(Clone, Debug, Default)]
pub struct EventMetrics {
    pub events: Family<EventLabels, Counter>,
}

impl EventMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "events",
            "Kubernetes Events this replica wrote or did not write, by result (created, series, \
             filtered, dropped, failed)",
            self.events.clone(),
        );
    }

    fn count(&self, result: &str) {
        self.events
            .get_or_create(&EventLabels {
                result: result.into(),
            })
            .inc();
    }
}

/// Where notes go; cheap to clone. Without an API client every note is dropped (and counted).
#[derive(Clone, Debug)]
pub struct Recorder {
    tx: Option<mpsc::Sender<Note>>,
    metrics: EventMetrics,
}

impl Recorder {
    /// The publisher task writes as `instance` (`reportingInstance`) until `shutdown` says stop.
    pub fn start(
        client: Option<Client>,
        instance: String,
        metrics: EventMetrics,
        shutdown: Signal,
    ) -> (Self, Option<JoinHandle<()>>) {
        let Some(client) = client else {
            return (Self { tx: None, metrics }, None);
        };
        let (tx, rx) = mpsc::channel(QUEUE);
        let publisher = Publisher {
            client,
            instance: truncate(instance, 128),
            metrics: metrics.clone(),
            filter: SpamFilter::default(),
            series: Series::default(),
        };
        let task = tokio::spawn(async move {
            tokio::select! {
                () = publisher.run(rx) => {}
                _ = shutdown.stopped() => {}
            }
        });
        (
            Self {
                tx: Some(tx),
                metrics,
            },
            Some(task),
        )
    }

    /// Queue a note; never waits.
    pub fn emit(&self, note: Note) {
        let sent = self.tx.as_ref().is_some_and(|tx| tx.try_send(note).is_ok());
        if !sent {
            self.metrics.count("dropped");
        }
    }
}

struct Publisher {
    client: Client,
    instance: String,
    metrics: EventMetrics,
    filter: SpamFilter,
    series: Series,
}

impl Publisher {
    async fn run(mut self, mut rx: mpsc::Receiver<Note>) {
        while let Some(note) = rx.recv().await {
            let now = Instant::now();
            let object = object_key(&note.regarding);
            if !self.filter.allow(&object, now) {
                self.metrics.count("filtered");
                continue;
            }
            let step = self.series.record(SeriesKey::of(&note), now);
            let result = tokio::time::timeout(WRITE_TIMEOUT, self.write(&note, &step)).await;
            match result {
                Ok(Ok(())) => self
                    .metrics
                    .count(if step.count > 1 { "series" } else { "created" }),
                Ok(Err(e)) => {
                    self.metrics.count("failed");
                    self.series.forget(&SeriesKey::of(&note));
                    tracing::debug!(reason = note.reason, error = %e, "could not write an Event");
                }
                Err(_) => {
                    self.metrics.count("failed");
                    self.series.forget(&SeriesKey::of(&note));
                }
            }
        }
    }

    async fn write(&self, note: &Note, step: &Step) -> Result<(), kube::Error> {
        // Cluster-scoped objects' Events live in `default`, as the kubelet's and client-go's.
        let namespace = note.regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let now = MicroTime(jiff::Timestamp::now());
        if step.count > 1 {
            let patch = serde_json::json!({"series": EventSeries {
                count: step.count,
                last_observed_time: now,
            }});
            api.patch(&step.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            return Ok(());
        }
        let event = Event {
            metadata: ObjectMeta {
                name: Some(step.name.clone()),
                namespace: Some(namespace.into()),
                ..Default::default()
            },
            event_time: Some(now),
            action: Some(note.action.into()),
            reason: Some(note.reason.into()),
            note: Some(truncate(note.note.clone(), NOTE_MAX)),
            regarding: Some(note.regarding.clone()),
            reporting_controller: Some(REPORTING_CONTROLLER.into()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(if note.warning { "Warning" } else { "Normal" }.into()),
            ..Default::default()
        };
        api.create(&PostParams::default(), &event).await?;
        Ok(())
    }
}

/// At most `max` bytes, cut at a character boundary.
fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

fn object_key(reference: &ObjectReference) -> String {
    format!(
        "{}/{}/{}/{}",
        reference.kind.as_deref().unwrap_or_default(),
        reference.namespace.as_deref().unwrap_or_default(),
        reference.name.as_deref().unwrap_or_default(),
        reference.uid.as_deref().unwrap_or_default(),
    )
}

/// A token bucket per object (pure; the clock is passed in).
#[derive(Debug, Default)]
struct SpamFilter {
    buckets: HashMap<String, (u32, Instant)>,
}

impl SpamFilter {
    /// Whether one more Event about `object` may be written at `now`.
    fn allow(&mut self, object: &str, now: Instant) -> bool {
        // Forget buckets that are full again, so that the map holds only busy objects.
        if self.buckets.len() > 4096 {
            let full = REFILL * BURST;
            self.buckets
                .retain(|_, (_, at)| now.saturating_duration_since(*at) < full);
        }
        let (tokens, at) = self
            .buckets
            .entry(object.to_string())
            .or_insert((BURST, now));
        let refilled = now.saturating_duration_since(*at).as_secs() / REFILL.as_secs();
        if refilled > 0 {
            let refilled = u32::try_from(refilled).unwrap_or(u32::MAX);
            *tokens = tokens.saturating_add(refilled).min(BURST);
            *at = now;
        }
        if *tokens == 0 {
            return false;
        }
        *tokens -= 1;
        true
    }
}

/// What makes two notes the same Event.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SeriesKey {
    object: String,
    warning: bool,
    reason: &'static str,
    action: &'static str,
    note: String,
}

impl SeriesKey {
    fn of(note: &Note) -> Self {
        Self {
            object: object_key(&note.regarding),
            warning: note.warning,
            reason: note.reason,
            action: note.action,
            note: note.note.clone(),
        }
    }
}

/// The Event a note goes to: its name, and its count (1: a new Event).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Step {
    name: String,
    count: i32,
}

/// The Events written lately, for series updates (pure; the clock is passed in).
#[derive(Debug, Default)]
struct Series {
    written: HashMap<SeriesKey, (Step, Instant)>,
    made: u64,
}

impl Series {
    fn record(&mut self, key: SeriesKey, now: Instant) -> Step {
        self.written
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < SERIES_TTL);
        if let Some((step, at)) = self.written.get_mut(&key) {
            step.count = step.count.saturating_add(1);
            *at = now;
            return step.clone();
        }
        self.made += 1;
        let stamp = jiff::Timestamp::now().as_nanosecond();
        let base = key.object.rsplit('/').nth(1).unwrap_or("event");
        let step = Step {
            name: format!("{}.{:x}{:x}", base, stamp, self.made),
            count: 1,
        };
        self.written.insert(key, (step.clone(), now));
        step
    }

    /// A write failed: the next identical note starts a new Event.
    fn forget(&mut self, key: &SeriesKey) {
        self.written.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(name: &str, text: &str) -> Note {
        Note {
            regarding: node_ref(name),
            warning: false,
            reason: "Overcommitted",
            action: "Overcommit",
            note: text.into(),
        }
    }

    #[test]
    fn an_object_gets_its_burst_then_one_per_refill() {
        let mut filter = SpamFilter::default();
        let start = Instant::now();
        for _ in 0..BURST {
            assert!(filter.allow("Node//n1/n1", start));
        }
        assert!(!filter.allow("Node//n1/n1", start));
        // Another object has its own budget.
        assert!(filter.allow("Node//n2/n2", start));
        assert!(!filter.allow("Node//n1/n1", start + REFILL - Duration::from_secs(1)));
        assert!(filter.allow("Node//n1/n1", start + REFILL));
        assert!(!filter.allow("Node//n1/n1", start + REFILL));
    }

    #[test]
    fn identical_notes_make_a_series_and_different_ones_new_events() {
        let mut series = Series::default();
        let now = Instant::now();
        let first = series.record(SeriesKey::of(&note("n1", "a")), now);
        assert_eq!(first.count, 1);
        assert!(first.name.starts_with("n1."), "{}", first.name);
        let again = series.record(SeriesKey::of(&note("n1", "a")), now);
        assert_eq!(
            again,
            Step {
                name: first.name.clone(),
                count: 2
            }
        );
        let other = series.record(SeriesKey::of(&note("n1", "b")), now);
        assert_eq!(other.count, 1);
        assert_ne!(other.name, first.name);
        // After the TTL an identical note is a new Event.
        let later = series.record(SeriesKey::of(&note("n1", "a")), now + SERIES_TTL);
        assert_eq!(later.count, 1);
        assert_ne!(later.name, first.name);
        series.forget(&SeriesKey::of(&note("n1", "a")));
        assert_eq!(
            series
                .record(SeriesKey::of(&note("n1", "a")), now + SERIES_TTL)
                .count,
            1
        );
    }

    #[test]
    fn notes_are_cut_at_a_character_boundary() {
        assert_eq!(truncate("abc".into(), 2), "ab");
        assert_eq!(truncate("aé".into(), 2), "a");
        assert_eq!(truncate("abc".into(), 9), "abc");
    }

    #[tokio::test]
    async fn without_a_client_notes_are_dropped_and_counted() {
        let (_trigger, signal) = crate::shutdown::channel();
        let (recorder, task) = Recorder::start(None, "r".into(), EventMetrics::default(), signal);
        assert!(task.is_none());
        recorder.emit(note("n1", "a"));
        let dropped = recorder
            .metrics
            .events
            .get_or_create(&EventLabels {
                result: "dropped".into(),
            })
            .get();
        assert_eq!(dropped, 1);
    }
}
