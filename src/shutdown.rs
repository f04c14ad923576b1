//! The one shutdown signal of `serve`, in ordered stages (in the spirit of kubert's
//! `shutdown` + `drain::Watch`):
//!
//! 0. **retire** (during `--shutdown-delay`): connections are still accepted and served, but
//!    every HTTP/1.1 response says `Connection: close`, so the client retires each keep-alive
//!    connection after its next request instead of having it closed under a request it is
//!    sending when the drain comes (the API server does not retry a webhook POST on EOF);
//! 1. **drain**: listeners stop accepting, open connections finish their requests and close;
//! 2. **stop**: background tasks (reloaders, policy sources, the probe port, the leader) end.
//!
//! `app` holds the [`Trigger`]; every long-running task takes a [`Signal`] (cheap to clone).
//! Stop implies drain. Dropping the trigger counts as stop, so nothing outlives its root.

use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    Running,
    Retiring,
    Draining,
    Stopped,
}

/// Advances the shutdown; held by the composition root.
#[derive(Debug)]
pub struct Trigger {
    tx: watch::Sender<Stage>,
}

/// What every task waits on.
#[derive(Debug, Clone)]
pub struct Signal {
    rx: watch::Receiver<Stage>,
}

/// A new trigger and the signal it drives.
pub fn channel() -> (Trigger, Signal) {
    let (tx, rx) = watch::channel(Stage::Running);
    (Trigger { tx }, Signal { rx })
}

impl Trigger {
    /// Stage 0: keep serving, but ask HTTP/1.1 clients to close after each response.
    pub fn retire(&self) {
        self.advance(Stage::Retiring);
    }

    /// Stage 1: stop accepting, let connections finish.
    pub fn drain(&self) {
        self.advance(Stage::Draining);
    }

    /// Stage 2: background tasks end (implies drain).
    pub fn stop(&self) {
        self.advance(Stage::Stopped);
    }

    fn advance(&self, to: Stage) {
        // Never goes back; works with no receiver left.
        self.tx.send_if_modified(|stage| {
            let moved = *stage < to;
            *stage = (*stage).max(to);
            moved
        });
    }
}

impl Signal {
    /// Resolves once draining has begun (or the trigger is gone).
    pub async fn drained(&self) {
        self.reached(Stage::Draining).await;
    }

    /// Resolves once background tasks must stop (or the trigger is gone).
    pub async fn stopped(&self) {
        self.reached(Stage::Stopped).await;
    }

    /// Whether responses should ask the client to close the connection (retiring or later).
    pub fn is_retiring(&self) -> bool {
        *self.rx.borrow() >= Stage::Retiring
    }

    /// Whether stop has been signalled (or the trigger is gone).
    pub fn is_stopped(&self) -> bool {
        self.rx.has_changed().is_err() || *self.rx.borrow() >= Stage::Stopped
    }

    async fn reached(&self, stage: Stage) {
        let mut rx = self.rx.clone();
        // The guard `wait_for` returns is not `Send`; drop it here. An error means the
        // trigger is gone, which counts as reached.
        let _ = rx.wait_for(|s| *s >= stage).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn resolves(f: impl Future<Output = ()>) -> bool {
        tokio::time::timeout(Duration::from_millis(50), f)
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn stages_in_order() {
        let (trigger, signal) = channel();
        let other = signal.clone();
        assert!(!resolves(signal.drained()).await);
        assert!(!resolves(signal.stopped()).await);
        assert!(!signal.is_retiring());
        trigger.retire();
        assert!(signal.is_retiring());
        assert!(!resolves(other.drained()).await);
        trigger.drain();
        assert!(resolves(other.drained()).await);
        assert!(!resolves(other.stopped()).await);
        assert!(!other.is_stopped());
        trigger.stop();
        trigger.drain(); // never goes back
        assert!(resolves(signal.stopped()).await);
        assert!(signal.is_stopped());
    }

    #[tokio::test]
    async fn stop_implies_drain_and_a_dropped_trigger_stops() {
        let (trigger, signal) = channel();
        trigger.stop();
        assert!(resolves(signal.drained()).await);
        let (trigger, signal) = channel();
        drop(trigger);
        assert!(resolves(signal.drained()).await);
        assert!(resolves(signal.stopped()).await);
        assert!(signal.is_stopped());
    }
}
