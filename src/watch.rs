//! Re-reading a mounted file when it changes: a notify watch on its DIRECTORY (the kubelet
//! swaps a Secret volume's `..data` symlink, which a watch on the file itself never sees),
//! plus a periodic re-read as the fallback for filesystems or events the watch misses.
//! Used for the serving certificate (server/certs.rs) and the policy file (sources/file.rs).

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

/// Watch `dir` (not recursively) and signal `changed` on every event. Returns the watcher,
/// which stops when dropped; `None` (logged) if watching is impossible: the timer still works.
fn watch_dir(dir: &Path, changed: Arc<Notify>) -> Option<notify::RecommendedWatcher> {
    use notify::Watcher;
    let mut watcher = match notify::recommended_watcher(
        move |res: notify::Result<notify::Event>| {
            if res.is_ok() {
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
