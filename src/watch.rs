//! Re-reading a mounted file when it changes: a notify watch on its DIRECTORY (the kubelet
//! swaps a Secret volume's `..data` symlink, which a watch on the file itself never sees),
//! plus a periodic re-read as the fallback for filesystems or events the watch misses.
//! Used for the serving certificate (server/serving_cert.rs) and the policy file (sources/file.rs).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::shutdown::Signal;

/// Call `reload` after every change in `dir` (unless `watch_files` is false) and every
/// `interval`, until `shutdown` says stop.
pub async fn reload_on_change(
    dir: &Path,
    interval: Duration,
    watch_files: bool,
    shutdown: Signal,
    mut reload: impl FnMut(),
) {
    let changed = Arc::new(Notify::new());
    let _watcher = if watch_files {
        watch_dir(dir, changed.clone())
    } else {
        None
    };
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = changed.notified() => {
                // The kubelet and editors write in several steps: let a burst settle.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            _ = tick.tick() => {}
            _ = shutdown.stopped() => return,
        }
        reload();
    }
}

/// Whether an event in the watched directory may be a change to reload for. Not an access:
/// inotify reports every open of a file there, `reload` itself opens the files, and an open
/// answered by a reload kept the reloads going ~20 times a second for as long as the process
/// ran, once anything (a client reading a CA file beside the certificate) opened one.
fn is_change(kind: &notify::EventKind) -> bool {
    !matches!(kind, notify::EventKind::Access(_))
}

/// Watch `dir` (not recursively) and signal `changed` on every change in it. Returns the
/// watcher, which stops when dropped; `None` (logged) if watching is impossible: the timer
/// still works.
fn watch_dir(dir: &Path, changed: Arc<Notify>) -> Option<notify::RecommendedWatcher> {
    use notify::Watcher;
    let mut watcher = match notify::recommended_watcher(
        move |res: notify::Result<notify::Event>| {
            if res.is_ok_and(|event| is_change(&event.kind)) {
                changed.notify_one();
            }
        },
    ) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "cannot create a file watcher; relying on periodic re-reads");
            return None;
        }
    };
    if let Err(e) = watcher.watch(dir, notify::RecursiveMode::NonRecursive) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot watch directory; relying on periodic re-reads");
        return None;
    }
    Some(watcher)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    use notify::event::{
        AccessKind, AccessMode, CreateKind, DataChange, EventKind, ModifyKind, RemoveKind,
        RenameMode,
    };

    use super::*;

    #[test]
    fn only_changes_count() {
        let cases = [
            (EventKind::Access(AccessKind::Open(AccessMode::Read)), false),
            (
                EventKind::Access(AccessKind::Close(AccessMode::Read)),
                false,
            ),
            (EventKind::Access(AccessKind::Any), false),
            (EventKind::Create(CreateKind::File), true),
            (EventKind::Modify(ModifyKind::Data(DataChange::Any)), true),
            (EventKind::Modify(ModifyKind::Name(RenameMode::To)), true),
            (EventKind::Remove(RemoveKind::File), true),
            (EventKind::Any, true),
            (EventKind::Other, true),
        ];
        for (kind, expected) in cases {
            assert_eq!(is_change(&kind), expected, "{kind:?}");
        }
    }

    /// On a real inotify watch: a reload that reads the file, as the real ones do, is not a
    /// change; reading the file from outside is not one either; writing it is.
    #[tokio::test]
    async fn reading_the_files_does_not_reload_them() {
        let dir = crate::temp_dir::TempDir::new().expect("temp dir");
        let file = dir.path().join("tls.crt");
        std::fs::write(&file, "one").expect("write");
        let reloads = Arc::new(AtomicUsize::new(0));
        let (trigger, signal) = crate::shutdown::channel();
        let task = tokio::spawn({
            let (dir, file, reloads) = (dir.path().to_path_buf(), file.clone(), reloads.clone());
            async move {
                // A first tick at once, then an hour: every other reload is the watch's.
                reload_on_change(&dir, Duration::from_secs(3600), true, signal, || {
                    let _ = std::fs::read(&file);
                    reloads.fetch_add(1, Ordering::SeqCst);
                })
                .await;
            }
        });
        let wait_for = |count: usize| {
            let reloads = reloads.clone();
            async move {
                let deadline = Instant::now() + Duration::from_secs(10);
                while reloads.load(Ordering::SeqCst) < count {
                    assert!(Instant::now() < deadline, "no reload {count} within 10 s");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        };
        wait_for(1).await;
        // Opened and read from outside (as a client reads a CA file kept beside the certificate).
        let _ = std::fs::read(&file).expect("read");
        // Ten times the settle delay: with access events counted, the reloads feed themselves
        // (one every ~50 ms), so this would see ~10.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(reloads.load(Ordering::SeqCst), 1, "reads caused reloads");
        std::fs::write(&file, "two").expect("write");
        wait_for(2).await;
        // A write is several events; one may land during the settle delay and ask once more.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after_write = reloads.load(Ordering::SeqCst);
        assert!(after_write <= 3, "one write, {} reloads", after_write - 1);
        trigger.stop();
        task.await.expect("watch task");
    }
}
