//! The process-wide budget of request-body bytes in flight, so that hostile clients cannot grow
//! the process past its memory limit by uploading many large bodies at once.
//!
//! Two disjoint pools of permits (one permit = one byte), half of the budget each:
//! - *declared*: a body whose `Content-Length` is at most [`DECLARED_MAX`] (every legal
//!   review: the API server always sends the length) reserves that length at once, in one
//!   acquire, before its first byte is read. A slow sender holds at most [`DECLARED_MAX`] more
//!   than it sent.
//! - *streamed*: larger bodies and bodies without a length reserve [`GRAIN`] bytes at a time
//!   as they arrive, so a slow sender holds at most what it sent plus one grain.
//!
//! Large uploads therefore never take the room that reviews need. When a pool is exhausted a
//! reservation waits up to [`WAIT`] and then fails: the handler answers 503, which the API
//! server treats as a webhook failure (`failurePolicy: Ignore`: allowed without a patch).
//! An HTTP/2 connection also has its own cap (one `--max-body-bytes` over all its streams),
//! so one connection cannot take a pool; an HTTP/1.1 connection carries one body at a time.
//!
//! Cost on the hot path: one `try_acquire_many` (an atomic compare-and-swap) per review body
//! and the release when the request ends.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bodies declaring at most this many bytes reserve them at once (the largest legal review,
/// two 1.5 MiB objects, is about 3.2 MiB).
pub const DECLARED_MAX: u64 = 4 * 1024 * 1024;
/// Step of reservations for bodies without a small declared length.
pub const GRAIN: u64 = 1024 * 1024;
/// How long a body waits for room in the budget before it gets 503.
pub const WAIT: Duration = Duration::from_secs(1);
/// Smallest budget accepted: each pool must hold one declared body.
pub const MIN_BUDGET: u64 = 2 * DECLARED_MAX;

/// No room in the budget within [`WAIT`].
#[derive(Debug, thiserror::Error)]
#[error("the budget of request-body bytes in flight is exhausted")]
pub struct Exhausted;

/// The process-wide pools; shared by every connection.
#[derive(Debug)]
pub struct Budget {
    declared: Arc<Semaphore>,
    streamed: Arc<Semaphore>,
    wait: Duration,
}

impl Budget {
    /// A budget of `bytes` in flight (at least [`MIN_BUDGET`]; smaller values are raised).
    pub fn new(bytes: u64) -> Self {
        Self::with_wait(bytes, WAIT)
    }

    pub(crate) fn with_wait(bytes: u64, wait: Duration) -> Self {
        let half = (bytes.max(MIN_BUDGET) / 2).min(Semaphore::MAX_PERMITS as u64) as usize;
        Self {
            declared: Arc::new(Semaphore::new(half)),
            streamed: Arc::new(Semaphore::new(half)),
            wait,
        }
    }

    /// Bytes one pool holds: the largest body that can ever be received completely.
    pub fn pool_bytes(&self) -> u64 {
        self.declared.available_permits() as u64
    }
}

/// What one connection passes to its requests: the pools, and for HTTP/2 the connection's cap.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    budget: Arc<Budget>,
    conn: Option<Arc<Semaphore>>,
}

impl BodyBudget {
    /// For an HTTP/1.1 connection (one request at a time: no connection cap needed).
    pub fn new(budget: Arc<Budget>) -> Self {
        Self { budget, conn: None }
    }

    /// For an HTTP/2 connection: all its streams together hold at most `cap` bytes.
    pub fn with_connection_cap(budget: Arc<Budget>, cap: u64) -> Self {
        let cap = cap.min(Semaphore::MAX_PERMITS as u64) as usize;
        Self {
            budget,
            conn: Some(Arc::new(Semaphore::new(cap))),
        }
    }

    /// Start reserving for one body that declares `declared` bytes (None: no Content-Length).
    /// A small declared body is reserved whole here; others reserve as they arrive.
    pub async fn start(&self, declared: Option<u64>) -> Result<Reservation, Exhausted> {
        let mut r = Reservation {
            budget: self.clone(),
            declared: declared.filter(|&n| n <= DECLARED_MAX),
            held: 0,
            pool: None,
            conn: None,
        };
        if let Some(n) = r.declared {
            r.take(n).await?;
        }
        Ok(r)
    }
}

/// Budget held by one body; released when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: BodyBudget,
    /// The whole length, for a small declared body.
    declared: Option<u64>,
    held: u64,
    /// Permits of the pool and of the connection cap, merged as they grow (no allocation).
    pool: Option<OwnedSemaphorePermit>,
    conn: Option<OwnedSemaphorePermit>,
}

impl Reservation {
    /// Make sure `total` bytes of this body are covered, reserving more if needed.
    pub async fn cover(&mut self, total: u64) -> Result<(), Exhausted> {
        if total <= self.held {
            return Ok(());
        }
        let step = match self.declared {
            // A body larger than it declared is refused by hyper; cover the rest exactly.
            Some(_) => total - self.held,
            None => (total - self.held).div_ceil(GRAIN) * GRAIN,
        };
        self.take(step).await
    }

    /// Bytes held.
    pub fn held(&self) -> u64 {
        self.held
    }

    async fn take(&mut self, n: u64) -> Result<(), Exhausted> {
        if n == 0 {
            return Ok(());
        }
        let n32 = u32::try_from(n).map_err(|_| Exhausted)?;
        let pool = if self.declared.is_some() {
            &self.budget.budget.declared
        } else {
            &self.budget.budget.streamed
        };
        let wait = self.budget.budget.wait;
        if let Some(conn) = &self.budget.conn {
            keep(&mut self.conn, acquire(conn, n32, wait).await?);
        }
        keep(&mut self.pool, acquire(pool, n32, wait).await?);
        self.held += n;
        Ok(())
    }
}

fn keep(held: &mut Option<OwnedSemaphorePermit>, more: OwnedSemaphorePermit) {
    match held {
        Some(p) => p.merge(more),
        None => *held = Some(more),
    }
}

/// Take `n` permits at once if they are free (the hot path), else wait up to `wait`.
async fn acquire(
    sem: &Arc<Semaphore>,
    n: u32,
    wait: Duration,
) -> Result<OwnedSemaphorePermit, Exhausted> {
    if let Ok(p) = sem.clone().try_acquire_many_owned(n) {
        return Ok(p);
    }
    match tokio::time::timeout(wait, sem.clone().acquire_many_owned(n)).await {
        Ok(Ok(p)) => Ok(p),
        _ => Err(Exhausted),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    fn budget(bytes: u64) -> Arc<Budget> {
        Arc::new(Budget::with_wait(bytes, Duration::from_millis(50)))
    }

    #[tokio::test]
    async fn declared_bodies_reserve_their_length_at_once() {
        let b = budget(16 * MIB);
        let bb = BodyBudget::new(b.clone());
        let r = bb.start(Some(3 * MIB + MIB / 4)).await.expect("room");
        assert_eq!(r.held(), 3 * MIB + MIB / 4);
        assert_eq!(b.declared.available_permits() as u64, 8 * MIB - r.held());
        // The streamed pool is untouched.
        assert_eq!(b.streamed.available_permits() as u64, 8 * MIB);
        drop(r);
        assert_eq!(b.declared.available_permits() as u64, 8 * MIB);
    }

    #[tokio::test]
    async fn streamed_bodies_reserve_grains_as_they_arrive() {
        let b = budget(16 * MIB);
        let bb = BodyBudget::new(b.clone());
        for declared in [None, Some(8 * MIB)] {
            let mut r = bb.start(declared).await.expect("room");
            assert_eq!(r.held(), 0, "{declared:?}");
            r.cover(10).await.expect("room");
            assert_eq!(r.held(), GRAIN);
            r.cover(GRAIN).await.expect("room");
            assert_eq!(r.held(), GRAIN);
            r.cover(GRAIN + 1).await.expect("room");
            assert_eq!(r.held(), 2 * GRAIN);
            assert_eq!(b.streamed.available_permits() as u64, 6 * MIB);
        }
        assert_eq!(b.streamed.available_permits() as u64, 8 * MIB);
    }

    #[tokio::test]
    async fn an_exhausted_pool_fails_after_the_wait_and_frees_on_drop() {
        let b = budget(16 * MIB);
        let bb = BodyBudget::new(b.clone());
        let mut big = bb.start(None).await.expect("room");
        big.cover(8 * MIB).await.expect("room");
        let mut other = bb.start(None).await.expect("no reservation yet");
        assert!(other.cover(1).await.is_err(), "streamed pool is full");
        // Declared bodies still get through: the pools are disjoint.
        let small = bb.start(Some(55_000)).await.expect("declared pool free");
        drop(small);
        // A waiter gets room as soon as it is released.
        let waiter = tokio::spawn(async move {
            let mut r = BodyBudget::new(b).start(None).await.expect("start");
            r.cover(MIB).await.map(|_| r.held())
        });
        drop(big);
        assert_eq!(waiter.await.expect("task").expect("room"), GRAIN);
    }

    #[tokio::test]
    async fn a_connection_cap_bounds_its_streams_together() {
        let b = budget(64 * MIB);
        let conn = BodyBudget::with_connection_cap(b.clone(), 4 * MIB);
        let r1 = conn.start(Some(3 * MIB)).await.expect("room");
        assert!(conn.start(Some(2 * MIB)).await.is_err(), "over the cap");
        // Another connection is not affected.
        let other = BodyBudget::with_connection_cap(b, 4 * MIB);
        assert!(other.start(Some(2 * MIB)).await.is_ok());
        drop(r1);
        assert!(conn.start(Some(2 * MIB)).await.is_ok());
    }

    #[test]
    fn small_budgets_are_raised_to_hold_one_declared_body_per_pool() {
        assert_eq!(Budget::new(0).pool_bytes(), DECLARED_MAX);
        assert_eq!(Budget::new(64 * MIB).pool_bytes(), 32 * MIB);
    }
}
