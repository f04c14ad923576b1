//! `serve --mode`: which path serves the static policies' node rule. The decision is pure
//! (`effective`, table-tested); the one I/O is `discover`, the API server's discovery of
//! `admissionregistration.k8s.io/v1`, read once at start.
//!
//! - `webhook` (the default): the webhook serves every policy; the leader puts the placeholder
//!   back into the compiled MutatingAdmissionPolicy it kept, if any (`in_process_policy`).
//! - `in-process`: the leader keeps the static policies compiled into a MutatingAdmissionPolicy
//!   and binding (`overcommit_core::in_process`); `serve` refuses to start when the API server
//!   does not serve both resources.
//! - `auto`: in-process when the API server serves both, webhook otherwise.
//!
//! `--in-process-policy` says who writes the compiled objects: the leader (`leader`, the
//! default: it updates the policy the install ships) or the operator (`operator`: the leader
//! writes nothing and only reports what differs).
//!
//! `node_path` (pure, table-tested) says which path one node's status writes take, for
//! `review --explain` and `status`.

use kube::Client;
use overcommit_core::in_process;
use overcommit_core::policy::NodeChoice;

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

/// The `--in-process-policy` flag: who writes the compiled MutatingAdmissionPolicy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum InProcessPolicy {
    /// The leader updates the policy the install ships (it can create neither object).
    #[default]
    Leader,
    /// The operator applies `compile-inprocess`'s output; nothing here writes either object.
    Operator,
}

impl InProcessPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Leader => "leader",
            Self::Operator => "operator",
        }
    }
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

/// What is known of the path the static policies take in a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterPath {
    Webhook,
    /// The compiled MutatingAdmissionPolicy and binding of this name are in the cluster.
    InProcess(String),
    /// `--mode auto` (review, offline): in-process under this name where the API server serves
    /// MutatingAdmissionPolicy, webhook otherwise.
    Auto(String),
    /// Not known (the compiled objects could not be read).
    Unknown,
}

impl ClusterPath {
    /// From `--mode` and the name the leader gives the compiled objects.
    pub fn from_mode(mode: Mode, name: &str) -> Self {
        match mode {
            Mode::Webhook => Self::Webhook,
            Mode::InProcess => Self::InProcess(name.to_string()),
            Mode::Auto => Self::Auto(name.to_string()),
        }
    }
}

/// What reading one compiled object (by name) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    Present,
    /// Not found, or the resource is not served.
    Absent,
    /// Any other error (forbidden, unreachable).
    Unreadable,
}

/// The cluster's path from what reading the compiled policy and binding named `name` found:
/// in-process while both are there (the API server applies them), webhook when one is missing.
pub fn cluster_path(name: &str, policy: Found, binding: Found) -> ClusterPath {
    match (policy, binding) {
        (Found::Absent, _) | (_, Found::Absent) => ClusterPath::Webhook,
        (Found::Present, Found::Present) => ClusterPath::InProcess(name.to_string()),
        _ => ClusterPath::Unknown,
    }
}

/// The path one node's status writes take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePath {
    /// The node webhook rewrites them.
    Webhook,
    /// The compiled MutatingAdmissionPolicy of this name rewrites them in the API server.
    InProcess(String),
    /// `ClusterPath::Auto`: in-process (this name) or webhook, as the API server serves.
    Auto(String),
    /// No policy applies (none selects the node, or it is opted out): nothing inflates it.
    None { opted_out: bool },
    /// A static policy applies, on a path not known.
    Unknown,
}

/// The path of a node whose policy choice is `choice` in a cluster on `cluster`: policies that
/// need outside data (usage, cap) are always the webhook's; static ones follow the cluster.
pub fn node_path(choice: &NodeChoice<'_>, cluster: &ClusterPath) -> NodePath {
    match choice {
        NodeChoice::NoPolicy => NodePath::None { opted_out: false },
        NodeChoice::OptedOut => NodePath::None { opted_out: true },
        NodeChoice::Policy(p) if !in_process::is_static(p) => NodePath::Webhook,
        NodeChoice::Policy(_) => match cluster {
            ClusterPath::Webhook => NodePath::Webhook,
            ClusterPath::InProcess(name) => NodePath::InProcess(name.clone()),
            ClusterPath::Auto(name) => NodePath::Auto(name.clone()),
            ClusterPath::Unknown => NodePath::Unknown,
        },
    }
}

impl NodePath {
    /// One word for a table column (`status`).
    pub fn short(&self) -> String {
        match self {
            Self::Webhook => "webhook".into(),
            Self::InProcess(name) => format!("in-process({name})"),
            Self::Auto(name) => format!("auto({name})"),
            Self::None { .. } => "none".into(),
            Self::Unknown => "unknown".into(),
        }
    }

    /// One line (`review --explain`).
    pub fn explain(&self) -> String {
        match self {
            Self::Webhook => "path: webhook (the node webhook rewrites its status writes)".into(),
            Self::InProcess(name) => format!(
                "path: in-process (the API server applies MutatingAdmissionPolicy {name}; the webhook leaves the node unchanged)"
            ),
            Self::Auto(name) => format!(
                "path: in-process (MutatingAdmissionPolicy {name}) where the API server serves admissionregistration.k8s.io/v1 MutatingAdmissionPolicy, else webhook (--mode auto)"
            ),
            Self::None { opted_out: false } => {
                "path: none (no policy selects the node; its kubelet's value stands)".into()
            }
            Self::None { opted_out: true } => {
                "path: none (opted out; its kubelet's value stands)".into()
            }
            Self::Unknown => "path: unknown (a static policy applies; the compiled admission policy could not be read)".into(),
        }
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

/// The effective path at start: discovery when the mode needs it, with `serve`'s client
/// (`None`: no Kubernetes client configuration).
pub async fn resolve(mode: Mode, client: Option<&Client>) -> Result<Path, ModeError> {
    if !mode.needs_discovery() {
        return effective(mode, Discovery::NotAsked);
    }
    let client = client.ok_or(ModeError::NoCluster(mode.as_str()))?;
    effective(mode, discover(client, mode).await?)
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
    fn node_path_table() {
        let yaml = "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {name: s}\nspec:\n  nodeSelector: {matchLabels: {p: s}}\n  nodeRatios: {cpu: \"2\"}\n---\napiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {name: u}\nspec:\n  nodeSelector: {matchLabels: {p: u}}\n  nodeRatios: {cpu: \"2\"}\n  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"4\"}}\n";
        let set = overcommit_core::policy::PolicySet::new(
            overcommit_core::policy::parse_policy_file(yaml).unwrap(),
        )
        .unwrap();
        let labels = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let stat = labels(&[("p", "s")]);
        let usage = labels(&[("p", "u")]);
        let none = labels(&[]);
        let out = labels(&[("p", "s"), ("overcommit.dev/disabled", "true")]);
        let ip = ClusterPath::InProcess("c".into());
        let auto = ClusterPath::Auto("c".into());
        let cases = [
            (&stat, ClusterPath::Webhook, NodePath::Webhook),
            (&stat, ip.clone(), NodePath::InProcess("c".into())),
            (&stat, auto.clone(), NodePath::Auto("c".into())),
            (&stat, ClusterPath::Unknown, NodePath::Unknown),
            (&usage, ip.clone(), NodePath::Webhook),
            (&usage, ClusterPath::Unknown, NodePath::Webhook),
            (&usage, ClusterPath::Webhook, NodePath::Webhook),
            (&none, ip.clone(), NodePath::None { opted_out: false }),
            (
                &none,
                ClusterPath::Webhook,
                NodePath::None { opted_out: false },
            ),
            (&out, ip.clone(), NodePath::None { opted_out: true }),
        ];
        for (labels, cluster, want) in cases {
            let got = node_path(&set.for_node(labels), &cluster);
            assert_eq!(got, want, "{labels:?} {cluster:?}");
        }
        let shorts = [
            (NodePath::Webhook, "webhook"),
            (NodePath::InProcess("c".into()), "in-process(c)"),
            (NodePath::Auto("c".into()), "auto(c)"),
            (NodePath::None { opted_out: true }, "none"),
            (NodePath::Unknown, "unknown"),
        ];
        for (path, want) in shorts {
            assert_eq!(path.short(), want);
            assert!(path.explain().starts_with("path: "), "{path:?}");
            assert!(!path.explain().contains('\n'), "{path:?}: one line");
        }
        assert!(
            NodePath::InProcess("c".into())
                .explain()
                .contains("MutatingAdmissionPolicy c")
        );
        assert_eq!(
            ClusterPath::from_mode(Mode::Webhook, "c"),
            ClusterPath::Webhook
        );
        assert_eq!(ClusterPath::from_mode(Mode::InProcess, "c"), ip);
        assert_eq!(ClusterPath::from_mode(Mode::Auto, "c"), auto);
    }

    #[test]
    fn cluster_path_table() {
        use Found::*;
        let ip = ClusterPath::InProcess("c".into());
        let cases = [
            (Present, Present, ip),
            (Present, Absent, ClusterPath::Webhook),
            (Absent, Present, ClusterPath::Webhook),
            (Absent, Unreadable, ClusterPath::Webhook),
            (Absent, Absent, ClusterPath::Webhook),
            (Present, Unreadable, ClusterPath::Unknown),
            (Unreadable, Present, ClusterPath::Unknown),
            (Unreadable, Unreadable, ClusterPath::Unknown),
        ];
        for (policy, binding, want) in cases {
            assert_eq!(
                cluster_path("c", policy, binding),
                want,
                "{policy:?} {binding:?}"
            );
        }
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
