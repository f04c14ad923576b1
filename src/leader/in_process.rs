//! Every replica on the in-process path (`serve --mode`): whether the compiled
//! MutatingAdmissionPolicy and binding are in force, as this replica's policy set compiles
//! them (`compiled_policy::in_force`), read every second. While they have been for
//! `SETTLE` (time for the API server to load a new policy), `admission::Settings::in_process`
//! is true and the webhook's node rule leaves the nodes the compiled policy serves unchanged;
//! any difference (a policy edit not yet compiled, a hand edit not yet repaired, the objects
//! gone, an API error) turns it false at once and the webhook serves every node again. Both
//! paths apply the same rule, which reads the record from the object first, so the moments
//! when both apply to one write give the same result as one of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kube::api::DynamicObject;
use kube::{Api, Client};
use serde_json::Value;

use super::compiled_policy::{self, binding_resource, policy_resource};
use crate::mode::Path;
use crate::shutdown::Signal;
use crate::sources::PolicyStore;

/// How long the objects must have been in force before the webhook steps back.
pub const SETTLE: Duration = Duration::from_secs(3);
/// How often the objects are read.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// What the leader and every replica need for the in-process path.
#[derive(Clone)]
pub struct InProcessContext {
    pub path: Path,
    pub policies: PolicyStore,
    /// `admission::Settings::in_process`.
    pub flag: Arc<AtomicBool>,
}

/// The flag from how long the objects have been in force (None: they are not).
pub fn flag(in_force_since: Option<Instant>, now: Instant) -> bool {
    in_force_since.is_some_and(|since| now.saturating_duration_since(since) >= SETTLE)
}

async fn get(api: &Api<DynamicObject>, name: &str) -> Option<Value> {
    match api.get_opt(name).await {
        Ok(found) => found.and_then(|o| serde_json::to_value(o).ok()),
        Err(e) => {
            tracing::debug!(error = %e, %name, "reading the compiled admission policy");
            None
        }
    }
}

/// Keep `context.flag` until shutdown (on the in-process path only).
pub async fn keep_flag(client: Client, name: String, context: InProcessContext, shutdown: Signal) {
    if context.path != Path::InProcess {
        return;
    }
    let policies: Api<DynamicObject> = Api::all_with(client.clone(), &policy_resource());
    let bindings: Api<DynamicObject> = Api::all_with(client, &binding_resource());
    let mut since: Option<Instant> = None;
    loop {
        // Nothing is in force for a replica that has not read its policies yet.
        let want = if context.policies.is_synced() {
            compiled_policy::desired(&context.policies.current(), context.path, &name)
        } else {
            None
        };
        let policy = get(&policies, &name).await;
        let binding = get(&bindings, &name).await;
        let now = Instant::now();
        since = if compiled_policy::in_force(want.as_ref(), policy.as_ref(), binding.as_ref()) {
            since.or(Some(now))
        } else {
            None
        };
        let on = flag(since, now);
        if context.flag.swap(on, Ordering::Relaxed) != on {
            tracing::info!(
                in_force = on,
                "compiled admission policy: the webhook {} the static policies' nodes",
                if on { "leaves" } else { "serves" }
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(INTERVAL) => {}
            _ = context.policies.published() => {}
            _ = shutdown.stopped() => {
                context.flag.store(false, Ordering::Relaxed);
                return;
            }
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
}
