//! The one accept loop of both ports (webhook and probes): at most `limit` connections at once
//! (further clients wait in the kernel's listen backlog), and a growing pause after accept
//! errors (EMFILE, ENFILE, ENOBUFS...) instead of a busy loop that would starve the runtime
//! while file descriptors are exhausted.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What the loop accepts from: a TCP listener, or a fake in tests.
pub trait Listener {
    type Conn: Send + 'static;
    fn accept(&self) -> impl Future<Output = io::Result<(Self::Conn, SocketAddr)>> + Send;
}

impl Listener for TcpListener {
    type Conn = TcpStream;
    fn accept(&self) -> impl Future<Output = io::Result<(TcpStream, SocketAddr)>> + Send {
        TcpListener::accept(self)
    }
}

/// First pause after an accept error.
const FIRST_BACKOFF: Duration = Duration::from_millis(5);
/// Longest pause between attempts while errors persist.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The pause after an accept error, given the previous one (None: the last accept succeeded).
fn next_backoff(prev: Option<Duration>) -> Duration {
    prev.map_or(FIRST_BACKOFF, |p| (p * 2).clamp(FIRST_BACKOFF, MAX_BACKOFF))
}

/// Accept until `stop` resolves, handing each connection with its slot to `serve` (the slot
/// is freed when the permit is dropped: hold it for the connection's life). `port` names the
/// port in logs.
pub async fn run<L: Listener>(
    listener: &L,
    limit: usize,
    stop: impl Future<Output = ()>,
    port: &'static str,
    mut serve: impl FnMut(L::Conn, SocketAddr, OwnedSemaphorePermit),
) {
    let slots = Arc::new(Semaphore::new(limit.clamp(1, Semaphore::MAX_PERMITS)));
    let mut stop = pin!(stop);
    let mut backoff = None;
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = &mut stop => return,
        };
        let accepted = loop {
            tokio::select! {
                r = listener.accept() => match r {
                    Ok(c) => break c,
                    Err(e) => {
                        let pause = next_backoff(backoff);
                        backoff = Some(pause);
                        tracing::warn!(port, error = %e, pause_ms = pause.as_millis() as u64, "accept failed; pausing");
                        tokio::select! {
                            _ = tokio::time::sleep(pause) => {}
                            _ = &mut stop => return,
                        }
                    }
                },
                _ = &mut stop => return,
            }
        };
        backoff = None;
        serve(accepted.0, accepted.1, permit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::mpsc;

    #[test]
    fn backoff_doubles_to_a_ceiling_and_restarts_after_success() {
        let cases = [
            (None, Duration::from_millis(5)),
            (Some(Duration::from_millis(5)), Duration::from_millis(10)),
            (Some(Duration::from_millis(320)), Duration::from_millis(640)),
            (Some(Duration::from_millis(640)), Duration::from_secs(1)),
            (Some(Duration::from_secs(1)), Duration::from_secs(1)),
            (Some(Duration::ZERO), Duration::from_millis(5)),
        ];
        for (prev, want) in cases {
            assert_eq!(next_backoff(prev), want, "{prev:?}");
        }
    }

    /// Fails every accept (as with EMFILE), counting the attempts; yields so that a loop without
    /// a pause would still let the clock and the test run (and show up as a huge count).
    struct Failing(AtomicUsize);
    impl Listener for Failing {
        type Conn = ();
        async fn accept(&self) -> io::Result<((), SocketAddr)> {
            self.0.fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
            Err(io::Error::from_raw_os_error(24)) // EMFILE
        }
    }

    #[tokio::test]
    async fn accept_errors_back_off_instead_of_spinning() {
        let l = Failing(AtomicUsize::new(0));
        let stop = tokio::time::sleep(Duration::from_millis(1500));
        run(&l, 4, stop, "test", |_, _, _| {}).await;
        // Attempts at 0, 5, 15, 35, 75, 155, 315, 635 and 1275 ms (fewer if the machine is
        // slow). A loop without the pause makes thousands.
        let n = l.0.load(Ordering::SeqCst);
        assert!((4..=10).contains(&n), "{n} accept attempts in 1.5 s");
    }

    /// Hands out the connections sent on a channel.
    struct Queue(tokio::sync::Mutex<mpsc::UnboundedReceiver<u32>>);
    impl Listener for Queue {
        type Conn = u32;
        async fn accept(&self) -> io::Result<(u32, SocketAddr)> {
            match self.0.lock().await.recv().await {
                Some(c) => Ok((c, SocketAddr::from(([127, 0, 0, 1], 1)))),
                None => std::future::pending().await,
            }
        }
    }

    #[tokio::test]
    async fn connections_beyond_the_limit_wait_for_a_slot() {
        let (tx, rx) = mpsc::unbounded_channel();
        let l = Queue(tokio::sync::Mutex::new(rx));
        let served: Arc<Mutex<Vec<(u32, OwnedSemaphorePermit)>>> = Arc::default();
        let s = served.clone();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let stop = async {
                let _ = stop_rx.await;
            };
            run(&l, 2, stop, "test", move |c, _, permit| {
                s.lock().expect("lock").push((c, permit));
            })
            .await;
        });
        for c in 1..=3 {
            tx.send(c).expect("send");
        }
        let ids = |v: &Arc<Mutex<Vec<(u32, OwnedSemaphorePermit)>>>| {
            v.lock()
                .expect("lock")
                .iter()
                .map(|(c, _)| *c)
                .collect::<Vec<_>>()
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while ids(&served).len() < 2 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(ids(&served), vec![1, 2]);
        // The third is not taken while both slots are held...
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(ids(&served), vec![1, 2], "served above the limit");
        // ...and is as soon as one connection ends.
        drop(served.lock().expect("lock").remove(0));
        while ids(&served).len() < 2 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(ids(&served), vec![2, 3]);
        let _ = stop_tx.send(());
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("stops")
            .expect("task");
    }
}
