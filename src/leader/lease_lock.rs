//! The leader Lease, written with optimistic concurrency: every acquire, renewal and release
//! is a replace carrying the `resourceVersion` just read (a create when there is none), so of
//! two replicas that both find the Lease free only one write succeeds; the other gets 409 and
//! does not lead. (kube-leader-election 0.44 acquires with a merge patch, which both such
//! writes pass: the chaos run saw two replicas "acquire" the same expired Lease 5 ms apart and
//! both act as leader until the next renewal.)

use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio::time::Instant;

/// What to do with the Lease as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// There is none: create it, holding it.
    Create,
    /// Ours: renew it.
    Renew,
    /// Free (released, or not renewed for its duration): take it.
    Acquire,
    /// Someone else holds it.
    Wait,
}

/// How long a challenger must see a held Lease unchanged before it may take it: the record's
/// `leaseDurationSeconds`, but never longer than this replica's own TTL (a holder, or a stolen
/// token, writing a huge value cannot keep the Lease forever); missing, zero or negative: the
/// own TTL.
pub fn patience(spec: &LeaseSpec, own_ttl: Duration) -> Duration {
    match spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
    {
        Some(secs) if secs > 0 => Duration::from_secs(secs).min(own_ttl),
        _ => own_ttl,
    }
}

/// The pure decision, on locally observed time only (as client-go's leader election):
/// `unchanged_for` is how long this replica has seen the Lease's current version unchanged, on
/// its own monotonic clock. The record's `renewTime` is another replica's wall clock and is never
/// compared with ours, so clock skew between replicas cannot make two leaders. The holder's own
/// side of the bargain is in `election`: it stops leading `ttl - renew` after the start of its
/// last successful renewal, before anyone has seen that renewal unchanged for `ttl`.
pub fn step(
    spec: Option<&LeaseSpec>,
    me: &str,
    own_ttl: Duration,
    unchanged_for: Duration,
) -> Step {
    let Some(spec) = spec else {
        return Step::Create;
    };
    match spec.holder_identity.as_deref() {
        Some(h) if h == me => return Step::Renew,
        None | Some("") => return Step::Acquire,
        Some(_) => {}
    }
    if unchanged_for >= patience(spec, own_ttl) {
        Step::Acquire
    } else {
        Step::Wait
    }
}

/// The Lease spec this replica writes when it takes or renews the Lease.
pub fn held_spec(
    previous: Option<&LeaseSpec>,
    me: &str,
    ttl: Duration,
    now: jiff::Timestamp,
) -> LeaseSpec {
    let ours = previous
        .is_some_and(|p| p.holder_identity.as_deref() == Some(me) && p.acquire_time.is_some());
    let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(i32::try_from(ttl.as_secs()).unwrap_or(i32::MAX)),
        acquire_time: if ours {
            previous.and_then(|p| p.acquire_time.clone())
        } else {
            Some(MicroTime(now))
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if ours || previous.is_none() {
            transitions
        } else {
            transitions.saturating_add(1)
        }),
        ..LeaseSpec::default()
    }
}

/// The result of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Leading,
    /// Held by someone else, or our write lost a race (409).
    NotLeading,
}

pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    me: String,
    ttl: Duration,
    /// The version last read and when this replica first saw it.
    seen: Mutex<Option<(String, Instant)>>,
}

impl LeaseLock {
    pub fn new(api: Api<Lease>, name: String, me: String, ttl: Duration) -> Self {
        Self {
            api,
            name,
            me,
            ttl,
            seen: Mutex::new(None),
        }
    }

    fn unchanged_for(&self, version: &str) -> Duration {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        match &*seen {
            Some((v, at)) if v == version => at.elapsed(),
            _ => {
                *seen = Some((version.to_string(), Instant::now()));
                Duration::ZERO
            }
        }
    }

    /// Read the Lease, then create, take or renew it with the version read.
    pub async fn try_acquire_or_renew(&self) -> Result<Outcome, kube::Error> {
        let current = self.api.get_opt(&self.name).await?;
        let now = jiff::Timestamp::now();
        let version = current
            .as_ref()
            .and_then(|l| l.metadata.resource_version.clone())
            .unwrap_or_default();
        let unchanged_for = self.unchanged_for(&version);
        let spec = current.as_ref().and_then(|l| l.spec.as_ref());
        let wanted = held_spec(spec, &self.me, self.ttl, now);
        let written = match step(spec, &self.me, self.ttl, unchanged_for) {
            Step::Wait => return Ok(Outcome::NotLeading),
            Step::Create => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(wanted),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            Step::Renew | Step::Acquire => {
                let mut lease = current.unwrap_or_default();
                lease.spec = Some(wanted);
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match written {
            Ok(_) => Ok(Outcome::Leading),
            // Another replica wrote first (409 on replace, AlreadyExists on create).
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Outcome::NotLeading),
            Err(e) => Err(e),
        }
    }

    /// Release the Lease if this replica still holds it (with the version read), so that
    /// another replica takes it at once instead of after its duration.
    pub async fn step_down(&self) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(false);
        };
        let ours = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some(self.me.as_str());
        if !ours {
            return Ok(false);
        }
        let now = jiff::Timestamp::now();
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = Some(String::new());
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(MicroTime(now));
        }
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> jiff::Timestamp {
        s.parse().expect("timestamp")
    }

    fn spec(holder: Option<&str>, renewed: Option<&str>, seconds: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            renew_time: renewed.map(|t| MicroTime(at(t))),
            lease_duration_seconds: Some(seconds),
            ..LeaseSpec::default()
        }
    }

    fn spec_for(holder: &str, renewed: Option<&str>, seconds: Option<i32>) -> LeaseSpec {
        LeaseSpec {
            lease_duration_seconds: seconds,
            ..spec(Some(holder), renewed, 0)
        }
    }

    /// The decision reads only this replica's observation (`unchanged_for`) and the record's
    /// duration capped at the own TTL (15 s here), never the record's renewTime.
    #[test]
    fn step_table() {
        let ms = Duration::from_millis;
        let s = Duration::from_secs;
        let ttl = s(15);
        // "now" on this replica's wall clock is 00:01:00; only a skewed holder writes otherwise.
        let (just_now, behind, ahead) = (
            Some("2026-11-25T00:00:59Z"),
            Some("2026-11-24T23:59:59Z"),
            Some("2026-11-25T00:02:00Z"),
        );
        let cases = [
            ("none", None, s(0), Step::Create),
            (
                "ours",
                Some(spec_for("me", just_now, Some(15))),
                s(0),
                Step::Renew,
            ),
            (
                "ours, even long unchanged",
                Some(spec_for("me", behind, Some(15))),
                s(600),
                Step::Renew,
            ),
            (
                "released",
                Some(spec(Some(""), just_now, 1)),
                s(0),
                Step::Acquire,
            ),
            (
                "no holder",
                Some(spec(None, just_now, 15)),
                s(0),
                Step::Acquire,
            ),
            (
                "held, just seen",
                Some(spec_for("other", just_now, Some(15))),
                s(0),
                Step::Wait,
            ),
            // A holder whose clock is a minute behind: its renewTime looks a minute old here.
            (
                "holder's clock 1 min behind, just seen",
                Some(spec_for("other", behind, Some(15))),
                s(0),
                Step::Wait,
            ),
            (
                "holder's clock 1 min behind, seen for less than its duration",
                Some(spec_for("other", behind, Some(15))),
                ms(14_999),
                Step::Wait,
            ),
            (
                "holder's clock 1 min behind, unchanged for its duration",
                Some(spec_for("other", behind, Some(15))),
                s(15),
                Step::Acquire,
            ),
            // A holder whose clock is a minute ahead: renewTime in our future.
            (
                "holder's clock 1 min ahead, seen briefly",
                Some(spec_for("other", ahead, Some(15))),
                s(3),
                Step::Wait,
            ),
            (
                "holder's clock 1 min ahead, unchanged for its duration",
                Some(spec_for("other", ahead, Some(15))),
                s(15),
                Step::Acquire,
            ),
            // The record's duration is capped at the own TTL.
            (
                "huge duration, below the own TTL",
                Some(spec_for("other", ahead, Some(i32::MAX))),
                ms(14_999),
                Step::Wait,
            ),
            (
                "huge duration, capped at the own TTL",
                Some(spec_for("other", ahead, Some(i32::MAX))),
                s(15),
                Step::Acquire,
            ),
            (
                "shorter duration, below it",
                Some(spec_for("other", just_now, Some(5))),
                ms(4_999),
                Step::Wait,
            ),
            (
                "shorter duration, reached",
                Some(spec_for("other", just_now, Some(5))),
                s(5),
                Step::Acquire,
            ),
            // Missing, zero or negative: the own TTL.
            (
                "zero duration, just seen",
                Some(spec_for("other", behind, Some(0))),
                s(0),
                Step::Wait,
            ),
            (
                "zero duration, below the own TTL",
                Some(spec_for("other", behind, Some(0))),
                ms(14_999),
                Step::Wait,
            ),
            (
                "zero duration, own TTL reached",
                Some(spec_for("other", behind, Some(0))),
                s(15),
                Step::Acquire,
            ),
            (
                "negative duration",
                Some(spec_for("other", behind, Some(-5))),
                ms(14_999),
                Step::Wait,
            ),
            (
                "negative duration, own TTL reached",
                Some(spec_for("other", behind, Some(-5))),
                s(15),
                Step::Acquire,
            ),
            (
                "no duration",
                Some(spec_for("other", behind, None)),
                ms(14_999),
                Step::Wait,
            ),
            (
                "no duration, own TTL reached",
                Some(spec_for("other", behind, None)),
                s(15),
                Step::Acquire,
            ),
            (
                "never renewed, just seen",
                Some(spec_for("other", None, Some(15))),
                s(0),
                Step::Wait,
            ),
            (
                "never renewed, unchanged for its duration",
                Some(spec_for("other", None, Some(15))),
                s(15),
                Step::Acquire,
            ),
        ];
        for (what, lease, unchanged, want) in cases {
            assert_eq!(step(lease.as_ref(), "me", ttl, unchanged), want, "{what}");
        }
    }

    #[test]
    fn held_spec_keeps_acquire_time_on_renewal_and_counts_transitions() {
        let now = at("2026-11-25T00:00:20Z");
        let ttl = Duration::from_secs(15);
        let mut mine = spec(Some("me"), Some("2026-11-25T00:00:19Z"), 15);
        mine.acquire_time = Some(MicroTime(at("2026-11-25T00:00:01Z")));
        mine.lease_transitions = Some(3);
        let renewed = held_spec(Some(&mine), "me", ttl, now);
        assert_eq!(renewed.acquire_time, mine.acquire_time);
        assert_eq!(renewed.renew_time, Some(MicroTime(now)));
        assert_eq!(renewed.lease_transitions, Some(3));
        let mut theirs = mine.clone();
        theirs.holder_identity = Some("other".into());
        let taken = held_spec(Some(&theirs), "me", ttl, now);
        assert_eq!(taken.holder_identity.as_deref(), Some("me"));
        assert_eq!(taken.acquire_time, Some(MicroTime(now)));
        assert_eq!(taken.lease_transitions, Some(4));
        assert_eq!(taken.lease_duration_seconds, Some(15));
        let created = held_spec(None, "me", ttl, now);
        assert_eq!(created.lease_transitions, Some(0));
    }
}
