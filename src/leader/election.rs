//! Leadership through the Lease (`lease_lock`: writes with the version read, so a race has one
//! winner): one task renews or tries to acquire the Lease every
//! `renew` period and publishes whether this replica leads. A claim is good only until
//! `renew deadline = start of the last successful renewal + ttl - renew`: past it, leadership is
//! dropped locally even if the API server never answered, well before another replica may take
//! the Lease (after `ttl`). Leader tasks watch the claim and stop before any further write;
//! every write also calls `Claim::check` right before it goes out.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Api;
use tokio::sync::watch;
use tokio::time::Instant;

use super::lease_lock::{LeaseLock, Outcome};
use crate::shutdown::Signal;

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
}
