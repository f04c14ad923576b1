//! Every replica on the in-process path (`serve --mode`): whether the compiled
//! MutatingAdmissionPolicy and binding are in force, as this replica's policy set compiles
//! them (`in_process_policy::in_force`), seen through one watch per object (field-selected by
//! name). While they have been for `SETTLE` (time for the API server to load a new policy),
//! `admission::Settings::in_process` is true and the webhook's node rule leaves the nodes the
//! compiled policy serves unchanged; any difference (a policy edit not yet compiled, a hand
//! edit not yet repaired, an object deleted, a watch error) turns it false at once and the
//! webhook serves every node again. Both paths apply the same rule, which reads the record
//! from the object first, so the moments when both apply to one write give the same result as
//! one of them.
//!
//! The decision is pure: `Seen::fold` (what a watch event says about one object) and `decide`
//! (the flag from what is seen, what is wanted and since when), table-tested below. The one
//! I/O is `keep_flag`'s two watches; a local tick (no API request) re-checks the policy set
//! and the settle time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::DynamicObject;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use overcommit_core::policy::PolicySet;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::Value;

use super::in_process_policy::{self, Desired, binding_resource, policy_resource};
use crate::mode::{InProcessPolicy, Path};
use crate::shutdown::Signal;
use crate::sources::PolicyStore;

/// How long the objects must have been in force before the webhook steps back.
pub const SETTLE: Duration = Duration::from_secs(3);
/// How often the local state (policy set, settle time) is re-checked between watch events.
pub const TICK: Duration = Duration::from_secs(1);

/// What the leader and every replica need for the in-process path.
#[derive(Clone)]
pub struct InProcessContext {
    pub path: Path,
    /// `serve --in-process-policy`: who writes the compiled objects.
    pub writer: InProcessPolicy,
    pub policies: PolicyStore,
    /// `serve --heartbeat-refresh`: the compiled policy's quiet heartbeats, as the webhook's.
    pub heartbeat_refresh: Duration,
    /// The user whose node status writes are the leader's nudges (`serve --service-account`):
    /// the compiled policy's `takes` variable takes them.
    pub nudger: String,
    /// `admission::Settings::in_process`.
    pub flag: Arc<AtomicBool>,
    /// `kube_overcommit_in_process_in_force`: the flag, exported ([`in_force_gauge`]).
    pub in_force: Gauge,
}

/// `kube_overcommit_in_process_in_force`, registered by this part.
pub fn in_force_gauge(registry: &mut Registry) -> Gauge {
    let gauge = Gauge::default();
    registry.register(
        "in_process_in_force",
        "In-process mode: 1 while this replica leaves the static policies' nodes to the compiled MutatingAdmissionPolicy (it and its binding are what this replica compiles from the policies in force), 0 while the webhook serves them",
        gauge.clone(),
    );
    gauge
}

/// The flag from how long the objects have been in force (None: they are not).
pub fn flag(in_force_since: Option<Instant>, now: Instant) -> bool {
    in_force_since.is_some_and(|since| now.saturating_duration_since(since) >= SETTLE)
}

/// One watch event, as far as the decision goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A (re-)list starts.
    Init,
    /// The object in a (re-)list.
    InitApply(Value),
    /// The (re-)list is complete.
    InitDone,
    /// The object was created or changed.
    Apply(Value),
    /// The object was deleted.
    Delete,
    /// The watch failed (it retries with backoff and lists again).
    Error,
}

/// What one watch has shown of one object.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Seen {
    /// The object as last seen; None: absent, or not known (not listed yet, or after an error).
    pub object: Option<Value>,
    /// The object of a list in progress.
    listing: Option<Value>,
}

impl Seen {
    /// The state after `event`. A list in progress keeps what was seen until it is complete
    /// (a list after an error starts from nothing known).
    pub fn fold(self, event: Event) -> Self {
        match event {
            Event::Init => Self {
                object: self.object,
                listing: None,
            },
            Event::InitApply(object) => Self {
                object: self.object,
                listing: Some(object),
            },
            Event::InitDone => Self {
                object: self.listing,
                listing: None,
            },
            Event::Apply(object) => Self {
                object: Some(object),
                listing: self.listing,
            },
            Event::Delete | Event::Error => Self::default(),
        }
    }
}

/// The new "in force since" and the flag: in force when both objects are seen and equal the
/// desired ones; since is kept while they stay in force, cleared at once otherwise.
pub fn decide(
    want: Option<&Desired>,
    policy: &Seen,
    binding: &Seen,
    since: Option<Instant>,
    now: Instant,
) -> (Option<Instant>, bool) {
    let in_force =
        in_process_policy::in_force(want, policy.object.as_ref(), binding.object.as_ref());
    let since = if in_force { since.or(Some(now)) } else { None };
    (since, flag(since, now))
}

fn event(e: Result<watcher::Event<DynamicObject>, watcher::Error>, name: &str) -> Event {
    let value = |o: DynamicObject| serde_json::to_value(o).ok();
    match e {
        Ok(watcher::Event::Init) => Event::Init,
        Ok(watcher::Event::InitDone) => Event::InitDone,
        Ok(watcher::Event::InitApply(o)) => value(o).map_or(Event::Error, Event::InitApply),
        Ok(watcher::Event::Apply(o)) => value(o).map_or(Event::Error, Event::Apply),
        Ok(watcher::Event::Delete(_)) => Event::Delete,
        Err(err) => {
            tracing::debug!(error = %err, %name, "watching the compiled admission policy");
            Event::Error
        }
    }
}

/// The desired objects for the current policy set, compiled again only when it changes.
struct Want {
    set: Option<Arc<PolicySet>>,
    desired: Option<Desired>,
}

impl Want {
    fn update(&mut self, context: &InProcessContext, name: &str) {
        // Nothing is in force for a replica that has not read its policies yet.
        if !context.policies.is_synced() {
            self.set = None;
            self.desired = None;
            return;
        }
        let current = context.policies.current();
        if self.set.as_ref().is_some_and(|s| Arc::ptr_eq(s, &current)) {
            return;
        }
        self.desired = in_process_policy::desired(
            &current,
            context.path,
            name,
            context.heartbeat_refresh,
            &context.nudger,
        );
        self.set = Some(current);
    }
}

/// Keep `context.flag` until shutdown (on the in-process path only).
pub async fn keep_flag(client: Client, name: String, context: InProcessContext, shutdown: Signal) {
    if context.path != Path::InProcess {
        return;
    }
    let by_name = || watcher::Config::default().fields(&format!("metadata.name={name}"));
    let policies: Api<DynamicObject> = Api::all_with(client.clone(), &policy_resource());
    let bindings: Api<DynamicObject> = Api::all_with(client, &binding_resource());
    let mut policy_events = watcher(policies, by_name()).default_backoff().boxed();
    let mut binding_events = watcher(bindings, by_name()).default_backoff().boxed();
    let (mut policy, mut binding) = (Seen::default(), Seen::default());
    let mut want = Want {
        set: None,
        desired: None,
    };
    let mut since: Option<Instant> = None;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            Some(e) = policy_events.next() => policy = policy.fold(event(e, &name)),
            Some(e) = binding_events.next() => binding = binding.fold(event(e, &name)),
            _ = tick.tick() => {}
            _ = context.policies.published() => {}
            _ = shutdown.stopped() => {
                context.flag.store(false, Ordering::Relaxed);
                context.in_force.set(0);
                return;
            }
        }
        want.update(&context, &name);
        let on;
        (since, on) = decide(
            want.desired.as_ref(),
            &policy,
            &binding,
            since,
            Instant::now(),
        );
        context.in_force.set(i64::from(on));
        if context.flag.swap(on, Ordering::Relaxed) != on {
            tracing::info!(
                in_force = on,
                "compiled admission policy: the webhook {} the static policies' nodes",
                if on { "leaves" } else { "serves" }
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_table() {
        let now = Instant::now();
        let cases = [
            ("not in force", None, false),
            ("just now", Some(now), false),
            (
                "a second ago",
                now.checked_sub(Duration::from_secs(1)),
                false,
            ),
            ("settled", now.checked_sub(SETTLE), true),
            ("long ago", now.checked_sub(Duration::from_secs(60)), true),
        ];
        for (what, since, want) in cases {
            assert_eq!(flag(since, now), want, "{what}");
        }
    }

    #[test]
    fn fold_table() {
        let a = serde_json::json!({"v": "a"});
        let b = serde_json::json!({"v": "b"});
        use Event::*;
        let cases: Vec<(&str, Vec<Event>, Option<Value>)> = vec![
            ("nothing yet", vec![], None),
            (
                "listed",
                vec![Init, InitApply(a.clone()), InitDone],
                Some(a.clone()),
            ),
            ("list in progress", vec![Init, InitApply(a.clone())], None),
            ("listed empty", vec![Init, InitDone], None),
            (
                "changed",
                vec![Init, InitApply(a.clone()), InitDone, Apply(b.clone())],
                Some(b.clone()),
            ),
            (
                "deleted",
                vec![Init, InitApply(a.clone()), InitDone, Delete],
                None,
            ),
            (
                "error forgets at once",
                vec![Init, InitApply(a.clone()), InitDone, Error],
                None,
            ),
            (
                "re-listed after an error",
                vec![
                    Init,
                    InitApply(a.clone()),
                    InitDone,
                    Error,
                    Init,
                    InitApply(b.clone()),
                    InitDone,
                ],
                Some(b.clone()),
            ),
            (
                "a re-list keeps what was seen until done",
                vec![Init, InitApply(a.clone()), InitDone, Init],
                Some(a.clone()),
            ),
            (
                "a re-list that finds nothing",
                vec![Init, InitApply(a.clone()), InitDone, Init, InitDone],
                None,
            ),
            (
                "created after an empty list",
                vec![Init, InitDone, Apply(a.clone())],
                Some(a),
            ),
        ];
        for (what, events, want) in cases {
            let seen = events.into_iter().fold(Seen::default(), Seen::fold);
            assert_eq!(seen.object, want, "{what}");
        }
    }

    #[test]
    fn decide_table() {
        let yaml = "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {name: s}\nspec:\n  nodeRatios: {cpu: \"2\"}\n";
        let docs = overcommit_core::policy::parse_policy_file(yaml).unwrap();
        let set = PolicySet::new(docs).unwrap();
        let want =
            in_process_policy::desired(&set, Path::InProcess, "n", Duration::from_secs(300), "u")
                .unwrap();
        let seen = |v: &Value| Seen {
            object: Some(v.clone()),
            listing: None,
        };
        let mut hand_edited = want.policy.clone();
        hand_edited["spec"]["failurePolicy"] = Value::from("Fail");
        let now = Instant::now();
        let earlier = now.checked_sub(SETTLE);
        let recent = now.checked_sub(Duration::from_secs(1));
        type Case<'a> = (
            &'a str,
            Option<&'a Desired>,
            Seen,
            Seen,
            Option<Instant>,
            (Option<Instant>, bool),
        );
        let cases: Vec<Case<'_>> = vec![
            (
                "equal, first seen",
                Some(&want),
                seen(&want.policy),
                seen(&want.binding),
                None,
                (Some(now), false),
            ),
            (
                "equal, not settled",
                Some(&want),
                seen(&want.policy),
                seen(&want.binding),
                recent,
                (recent, false),
            ),
            (
                "equal, settled",
                Some(&want),
                seen(&want.policy),
                seen(&want.binding),
                earlier,
                (earlier, true),
            ),
            (
                "hand edit",
                Some(&want),
                seen(&hand_edited),
                seen(&want.binding),
                earlier,
                (None, false),
            ),
            (
                "policy gone or unknown",
                Some(&want),
                Seen::default(),
                seen(&want.binding),
                earlier,
                (None, false),
            ),
            (
                "binding gone or unknown",
                Some(&want),
                seen(&want.policy),
                Seen::default(),
                earlier,
                (None, false),
            ),
            (
                "nothing wanted",
                None,
                seen(&want.policy),
                seen(&want.binding),
                earlier,
                (None, false),
            ),
        ];
        for (what, want, policy, binding, since, expected) in cases {
            assert_eq!(
                decide(want, &policy, &binding, since, now),
                expected,
                "{what}"
            );
        }
    }
}
