//! A directory for one test, removed when dropped: for the unit tests here and, included by
//! path, the integration tests under tests/.
//!
//! std only, on purpose. A dev-dependency (tempfile, reqwest) that turns on features of crates
//! the binary also uses makes `cargo test` build the graph with other features than `cargo
//! build`, and `make test` then builds the release graph twice (~4 minutes on an empty cache).

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A new directory under the system's temporary directory (mode 0700), removed with all it
/// holds on drop.
#[derive(Debug)]
pub(crate) struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub(crate) fn new() -> io::Result<Self> {
        Self::with_prefix("kube-overcommit-test-")
    }

    /// Named `<prefix><pid>-<n>-<nanos>`: unique within the process by the counter, across
    /// processes by the pid, and a name left over by a process that had this pid is skipped.
    pub(crate) fn with_prefix(prefix: &str) -> io::Result<Self> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let base = std::env::temp_dir();
        loop {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = base.join(format!("{prefix}{}-{n}-{nanos:08x}", std::process::id()));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(Self { path }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::TempDir;

    #[test]
    fn each_dir_is_new_private_and_removed_on_drop() {
        use std::os::unix::fs::PermissionsExt;
        let (a, b) = (TempDir::new().expect("a"), TempDir::new().expect("b"));
        assert_ne!(a.path(), b.path());
        let mode = std::fs::metadata(a.path())
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::create_dir(a.path().join("sub")).expect("sub");
        std::fs::write(a.path().join("sub/file"), "x").expect("file");
        let path = a.path().to_owned();
        drop(a);
        assert!(!path.exists(), "{} left behind", path.display());
        assert!(b.path().is_dir());
    }
}
