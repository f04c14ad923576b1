//! Leadership through the Lease (`lease_lock`: writes with the version read, so a race has one
//! winner): one task renews or tries to acquire the Lease every
//! `renew` period and publishes whether this replica leads. A claim is good only until
//! `renew deadline = start of the last successful renewal + ttl - renew` on this replica's
//! monotonic clock: past it, leadership is dropped locally even if the API server never answered,
//! `renew` before another replica may take the Lease (after it has seen that renewal unchanged for
//! `ttl` on its own monotonic clock: `lease_lock::step`; wall clocks are never compared). Leader
//! tasks watch the claim and stop before any further write; every write also calls
//! `Claim::check` right before it goes out.
//!
//! The timing is checked at start ([`check_timing`]): whole seconds (the Lease records its
//! duration in whole seconds: a sub-second TTL would be written as 0), and `ttl - renew > 1.2 x
//! renew`, client-go's `LeaseDuration > RenewDeadline > JitterFactor (1.2) x RetryPeriod` with
//! RenewDeadline = ttl - renew and RetryPeriod = renew: the next renewal starts `renew` after the
//! last one and must have time to land before the deadline.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Api;
use tokio::sync::watch;
use tokio::time::Instant;

use super::lease_lock::{LeaseLock, Outcome};
use crate::shutdown::Signal;

/// `--lease-ttl` and `--lease-renew` that cannot work together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    #[error(
        "--{flag} must be whole seconds, at least 1s (got {value:?}): the Lease records its duration in whole seconds"
    )]
    NotWholeSeconds { flag: &'static str, value: Duration },
    #[error(
        "--lease-ttl ({ttl}s) must be more than 2.2 x --lease-renew ({renew}s): the leader stops \
         leading at ttl - renew after its last renewal began, and the next renewal (renew later) \
         needs time to land before that (client-go: LeaseDuration > RenewDeadline > 1.2 x RetryPeriod)"
    )]
    TooShort { ttl: u64, renew: u64 },
}

/// Check the Lease timing (see the module doc): both whole seconds, at least 1 s, and
/// `ttl > 2.2 x renew`, so at least 1 s between the next renewal and the renew deadline.
pub fn check_timing(ttl: Duration, renew: Duration) -> Result<(), TimingError> {
    for (flag, value) in [("lease-ttl", ttl), ("lease-renew", renew)] {
        if value.subsec_nanos() != 0 || value.is_zero() {
            return Err(TimingError::NotWholeSeconds { flag, value });
        }
    }
    let (ttl, renew) = (ttl.as_secs(), renew.as_secs());
    // ttl - renew > 1.2 x renew, in integers.
    if u128::from(ttl) * 5 <= u128::from(renew) * 11 {
        return Err(TimingError::TooShort { ttl, renew });
    }
    Ok(())
}

/// The claim was lost, or could not be renewed in time.
#[derive(Debug, thiserror::Error)]
#[error("not the leader (lease lost or not renewed before its deadline)")]
pub struct NotLeader;

#[derive(Debug)]
struct ClaimState {
    valid_until: Option<Instant>,
}

/// This replica's view of its leadership, shared by the leader tasks.
#[derive(Debug, Clone)]
pub struct Claim {
    state: Arc<Mutex<ClaimState>>,
    leading: watch::Receiver<bool>,
}

impl Claim {
    /// Ok only while the Lease is held and the renew deadline has not passed.
    pub fn check(&self) -> Result<(), NotLeader> {
        let valid_until = self.state.lock().map_err(|_| NotLeader)?.valid_until;
        match valid_until {
            Some(t) if Instant::now() < t => Ok(()),
            _ => Err(NotLeader),
        }
    }

    /// Changes of leadership (true: leading).
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    /// A claim that never leads (leader election off).
    pub fn never() -> Self {
        let (_tx, rx) = watch::channel(false);
        Self {
            state: Arc::new(Mutex::new(ClaimState { valid_until: None })),
            leading: rx,
        }
    }
}

/// Parameters of the election.
#[derive(Debug, Clone)]
pub struct ElectionSettings {
    pub namespace: String,
    pub lease_name: String,
    pub identity: String,
    pub ttl: Duration,
    pub renew: Duration,
}

/// Start the election task; returns the claim. The task ends (stepping down if leading) when
/// `shutdown` says stop.
pub fn spawn(
    client: kube::Client,
    s: ElectionSettings,
    shutdown: Signal,
    on_change: impl Fn(bool) + Send + 'static,
) -> (Claim, tokio::task::JoinHandle<()>) {
    let state = Arc::new(Mutex::new(ClaimState { valid_until: None }));
    let (tx, rx) = watch::channel(false);
    let claim = Claim {
        state: state.clone(),
        leading: rx,
    };
    let lock = LeaseLock::new(
        Api::namespaced(client, &s.namespace),
        s.lease_name.clone(),
        s.identity.clone(),
        s.ttl,
    );
    let holder = Holder {
        state,
        tx,
        on_change: Box::new(on_change),
    };
    let task = tokio::spawn(campaign(lock, s, holder, shutdown));
    (claim, task)
}

/// Publishes this replica's claim to every [`Claim`].
struct Holder {
    state: Arc<Mutex<ClaimState>>,
    tx: watch::Sender<bool>,
    on_change: Box<dyn Fn(bool) + Send>,
}

impl Holder {
    fn set(&self, valid_until: Option<Instant>) {
        if let Ok(mut st) = self.state.lock() {
            st.valid_until = valid_until;
        }
        let leading = valid_until.is_some();
        if *self.tx.borrow() != leading {
            tracing::info!(leading, "leadership changed");
            (self.on_change)(leading);
        }
        self.tx.send_replace(leading);
    }
}

/// Acquire or renew every `renew`, until stop; then step down if leading.
async fn campaign(lock: LeaseLock, s: ElectionSettings, holder: Holder, shutdown: Signal) {
    let deadline = s.ttl.saturating_sub(s.renew);
    let mut valid_until: Option<Instant> = None;
    loop {
        let started = Instant::now();
        valid_until = try_renew(&lock, started, deadline, valid_until).await;
        if valid_until.is_some_and(|t| Instant::now() >= t) {
            valid_until = None;
        }
        holder.set(valid_until);
        // Sleep until the next attempt, dropping the claim at its deadline if it comes first.
        let next = started + s.renew;
        let wake = match valid_until {
            Some(t) if t < next => t,
            _ => next,
        };
        let mut closing = shutdown.is_stopped();
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = shutdown.stopped() => closing = true,
        }
        if valid_until.is_some_and(|t| Instant::now() >= t) {
            valid_until = None;
            holder.set(None);
        }
        if closing || shutdown.is_stopped() {
            if valid_until.is_some() {
                holder.set(None);
                match lock.step_down().await {
                    Ok(true) => tracing::info!("stepped down"),
                    Ok(false) => tracing::info!("stepped down (the Lease was no longer ours)"),
                    Err(e) => tracing::warn!(error = %e, "could not step down"),
                }
            }
            return;
        }
    }
}

/// One acquire-or-renew attempt started at `started`; returns until when the claim holds
/// (unchanged when the attempt failed or timed out).
async fn try_renew(
    lock: &LeaseLock,
    started: Instant,
    deadline: Duration,
    valid_until: Option<Instant>,
) -> Option<Instant> {
    let attempt = tokio::time::timeout(
        deadline.max(Duration::from_secs(1)),
        lock.try_acquire_or_renew(),
    )
    .await;
    match attempt {
        Ok(Ok(Outcome::Leading)) => Some(started + deadline),
        Ok(Ok(Outcome::NotLeading)) => None,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "lease renewal failed");
            valid_until
        }
        Err(_) => {
            tracing::warn!("lease renewal timed out");
            valid_until
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim_until(valid_until: Option<Instant>) -> Claim {
        let (_tx, rx) = watch::channel(valid_until.is_some());
        Claim {
            state: Arc::new(Mutex::new(ClaimState { valid_until })),
            leading: rx,
        }
    }

    #[tokio::test]
    async fn claim_table() {
        let now = Instant::now();
        let cases = [
            (
                "held, deadline ahead",
                Some(now + Duration::from_secs(10)),
                true,
            ),
            (
                "deadline passed",
                Some(now - Duration::from_millis(1)),
                false,
            ),
            ("not held", None, false),
        ];
        for (what, until, ok) in cases {
            assert_eq!(claim_until(until).check().is_ok(), ok, "{what}");
        }
        assert!(Claim::never().check().is_err());
    }

    #[test]
    fn timing_table() {
        let ms = Duration::from_millis;
        let s = Duration::from_secs;
        let whole = |flag, value| Err(TimingError::NotWholeSeconds { flag, value });
        let short = |ttl, renew| Err(TimingError::TooShort { ttl, renew });
        let cases = [
            ("defaults", s(15), s(5), Ok(())),
            ("e2e", s(4), s(1), Ok(())),
            ("chaos", s(6), s(2), Ok(())),
            ("smallest for 1s", s(3), s(1), Ok(())),
            ("2 x renew leaves no time", s(2), s(1), short(2, 1)),
            ("2.2 x renew exactly", s(11), s(5), short(11, 5)),
            ("just above 2.2 x renew", s(12), s(5), Ok(())),
            ("renew equal to ttl", s(5), s(5), short(5, 5)),
            ("renew above ttl", s(5), s(10), short(5, 10)),
            (
                "sub-second ttl",
                ms(500),
                ms(100),
                whole("lease-ttl", ms(500)),
            ),
            (
                "fractional ttl",
                ms(15_500),
                s(5),
                whole("lease-ttl", ms(15_500)),
            ),
            (
                "fractional renew",
                s(15),
                ms(4_500),
                whole("lease-renew", ms(4_500)),
            ),
            ("zero renew", s(15), s(0), whole("lease-renew", s(0))),
            ("zero ttl", s(0), s(5), whole("lease-ttl", s(0))),
            ("huge", s(u64::MAX), s(u64::MAX / 3), Ok(())),
        ];
        for (what, ttl, renew, want) in cases {
            assert_eq!(check_timing(ttl, renew), want, "{what}");
        }
        let text = check_timing(ms(500), ms(100)).err().map(|e| e.to_string());
        assert_eq!(
            text.as_deref(),
            Some(
                "--lease-ttl must be whole seconds, at least 1s (got 500ms): the Lease records its duration in whole seconds"
            )
        );
    }
}
