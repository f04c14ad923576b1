//! Policies from a YAML file. The file's directory is watched (a mounted ConfigMap is
//! swapped through a `..data` symlink like a Secret) and re-read on a timer. A file that does
//! not parse or validate is refused as a whole and the last good set stays in use.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::PolicyStore;
use super::metrics::PolicySourceLabel;
use crate::metrics::ReloadResult;
use crate::shutdown::Signal;
use overcommit_core::policy::{PolicySet, parse_policy_file};
use sha2::{Digest, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not UTF-8")]
    NotUtf8 { path: PathBuf },
    #[error("{path}: {source}")]
    Policy {
        path: PathBuf,
        source: overcommit_core::policy::PolicyError,
    },
}

/// Load and validate a policy file into a set.
pub fn load(path: &Path, text: &[u8]) -> Result<PolicySet, FileError> {
    let text = std::str::from_utf8(text).map_err(|_| FileError::NotUtf8 {
        path: path.to_owned(),
    })?;
    let policy = |source| FileError::Policy {
        path: path.to_owned(),
        source,
    };
    let policies = parse_policy_file(text).map_err(policy)?;
    PolicySet::new(policies).map_err(policy)
}

pub struct FileSource {
    path: PathBuf,
    store: PolicyStore,
    /// Digest of the last content looked at, so an unchanged file is not re-applied or re-logged.
    last_seen: Option<[u8; 32]>,
}

impl FileSource {
    pub fn new(path: PathBuf, store: PolicyStore) -> Self {
        Self {
            path,
            store,
            last_seen: None,
        }
    }

    /// Read the file once; publish it if it changed and is valid. Returns whether it published.
    pub fn reload(&mut self) -> bool {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(source) => {
                if self.last_seen != Some([0; 32]) {
                    self.last_seen = Some([0; 32]);
                    let e = FileError::Read {
                        path: self.path.clone(),
                        source,
                    };
                    tracing::warn!(error = %e, "policy file not readable; keeping the current policies");
                    self.store
                        .count(PolicySourceLabel::file, ReloadResult::error);
                }
                return false;
            }
        };
        let digest: [u8; 32] = Sha256::digest(&bytes).into();
        if self.last_seen == Some(digest) {
            return false;
        }
        self.last_seen = Some(digest);
        match load(&self.path, &bytes) {
            Ok(set) => {
                tracing::info!(path = %self.path.display(), policies = set.len(), "policy file loaded");
                self.store.publish(set, PolicySourceLabel::file);
                true
            }
            Err(e) => {
                self.store
                    .count(PolicySourceLabel::file, ReloadResult::error);
                tracing::error!(error = %e, "policy file refused; keeping the last good policies");
                false
            }
        }
    }

    pub async fn run(mut self, interval: Duration, watch_files: bool, shutdown: Signal) {
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => PathBuf::from("."),
        };
        crate::watch::reload_on_change(&dir, interval, watch_files, shutdown, || {
            self.reload();
        })
        .await;
    }
}
