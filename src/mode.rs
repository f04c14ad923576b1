//! `serve --mode`: which path serves the static policies' node rule. The decision is pure
//! (`effective`, table-tested); the one I/O is `discover`, the API server's discovery of
//! `admissionregistration.k8s.io/v1`, read once at start.
//!
//! - `webhook` (the default): the webhook serves every policy; the leader deletes the compiled
//!   MutatingAdmissionPolicy and binding it kept, if any.
//! - `in-process`: the leader keeps the static policies compiled into a MutatingAdmissionPolicy
//!   and binding (`overcommit_core::inprocess`); `serve` refuses to start when the API server
//!   does not serve both resources.
//! - `auto`: in-process when the API server serves both, webhook otherwise.

use kube::Client;

/// Group version of MutatingAdmissionPolicy and its binding.
pub const ADMISSION_GROUP_VERSION: &str = "admissionregistration.k8s.io/v1";
/// The two resources in-process mode needs.
pub const POLICY_RESOURCES: [&str; 2] = [
    "mutatingadmissionpolicies",
    "mutatingadmissionpolicybindings",
];

/// The `--mode` flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Mode {
    #[default]
    Webhook,
    Auto,
    InProcess,
}

/// The path the static policies take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    Webhook,
    InProcess,
}

impl Path {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Webhook => "webhook",
            Self::InProcess => "in-process",
        }
    }
}

/// What discovery said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discovery {
    /// Both resources are served.
    Served,
    /// The group version, or one of the resources, is not served.
    NotServed,
    /// Not asked (`--mode webhook` needs no answer).
    NotAsked,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModeError {
    #[error(
        "--mode in-process: the API server does not serve {ADMISSION_GROUP_VERSION} mutatingadmissionpolicies and mutatingadmissionpolicybindings (Kubernetes 1.36 or later; use --mode auto or webhook)"
    )]
    NotServed,
    #[error("--mode {0}: no Kubernetes client configuration to ask the API server with")]
    NoCluster(&'static str),
    #[error("--mode {mode}: discovery of {ADMISSION_GROUP_VERSION} failed: {error}")]
    Discovery { mode: &'static str, error: String },
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Webhook => "webhook",
            Self::Auto => "auto",
            Self::InProcess => "in-process",
        }
    }

    /// Whether the decision needs discovery.
    pub fn needs_discovery(self) -> bool {
        self != Self::Webhook
    }
}

/// The effective path of `mode` given what discovery said.
pub fn effective(mode: Mode, discovery: Discovery) -> Result<Path, ModeError> {
    match (mode, discovery) {
        (Mode::Webhook, _) => Ok(Path::Webhook),
        (Mode::Auto | Mode::InProcess, Discovery::Served) => Ok(Path::InProcess),
        (Mode::Auto, Discovery::NotServed | Discovery::NotAsked) => Ok(Path::Webhook),
        (Mode::InProcess, Discovery::NotServed | Discovery::NotAsked) => Err(ModeError::NotServed),
    }
}

/// Whether an APIResourceList names both resources.
pub fn lists_both(names: &[&str]) -> Discovery {
    if POLICY_RESOURCES.iter().all(|r| names.contains(r)) {
        Discovery::Served
    } else {
        Discovery::NotServed
    }
}

/// Ask the API server (404: the group version is not served).
pub async fn discover(client: &Client, mode: Mode) -> Result<Discovery, ModeError> {
    match client
        .list_api_group_resources(ADMISSION_GROUP_VERSION)
        .await
    {
        Ok(list) => {
            let names: Vec<&str> = list.resources.iter().map(|r| r.name.as_str()).collect();
            Ok(lists_both(&names))
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Discovery::NotServed),
        Err(e) => Err(ModeError::Discovery {
            mode: mode.as_str(),
            error: e.to_string(),
        }),
    }
}

/// The effective path at start: discovery when the mode needs it.
pub async fn resolve(mode: Mode) -> Result<Path, ModeError> {
    if !mode.needs_discovery() {
        return effective(mode, Discovery::NotAsked);
    }
    let client = Client::try_default()
        .await
        .map_err(|_| ModeError::NoCluster(mode.as_str()))?;
    effective(mode, discover(&client, mode).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_table() {
        use Discovery::*;
        let cases = [
            (Mode::Webhook, Served, Ok(Path::Webhook)),
            (Mode::Webhook, NotServed, Ok(Path::Webhook)),
            (Mode::Webhook, NotAsked, Ok(Path::Webhook)),
            (Mode::Auto, Served, Ok(Path::InProcess)),
            (Mode::Auto, NotServed, Ok(Path::Webhook)),
            (Mode::InProcess, Served, Ok(Path::InProcess)),
            (Mode::InProcess, NotServed, Err(ModeError::NotServed)),
        ];
        for (mode, discovery, want) in cases {
            assert_eq!(effective(mode, discovery), want, "{mode:?} {discovery:?}");
        }
        assert!(!Mode::Webhook.needs_discovery());
        assert!(Mode::Auto.needs_discovery() && Mode::InProcess.needs_discovery());
    }

    #[test]
    fn lists_both_table() {
        let cases: [(&[&str], Discovery); 4] = [
            (
                &[
                    "mutatingwebhookconfigurations",
                    "mutatingadmissionpolicies",
                    "mutatingadmissionpolicies/status",
                    "mutatingadmissionpolicybindings",
                ],
                Discovery::Served,
            ),
            (&["mutatingadmissionpolicies"], Discovery::NotServed),
            (&["mutatingadmissionpolicybindings"], Discovery::NotServed),
            (&[], Discovery::NotServed),
        ];
        for (names, want) in cases {
            assert_eq!(lists_both(names), want, "{names:?}");
        }
    }
}
