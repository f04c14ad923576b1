//! `kube-overcommit status` (also `kubectl overcommit status`, installed as a kubectl plugin by
//! the name `kubectl-overcommit`): one row per node with its policy, the kubelet's and the
//! written allocatable, the requested sum as the scheduler counts it, and the usage from
//! metrics.k8s.io when it answers, like `kubectl top nodes`. The cluster is found as kubectl
//! finds it. What the rows say is decided in `view`, from what is listed here.

pub mod view;

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DynamicObject};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use overcommit_core::policy::{OvercommitPolicy, PolicySet, parse_policy_file};
use serde::de::DeserializeOwned;

use self::view::NodeFacts;
use crate::leader::in_process_policy::{binding_resource, policy_resource};
use crate::mode::{self, ClusterPath, Found};

/// How `status` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// `status` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// Output format: a table like `kubectl top nodes`, or JSON for scripts.
    #[arg(
        short,
        long,
        env = "KUBE_OVERCOMMIT_OUTPUT",
        value_enum,
        default_value = "table"
    )]
    pub output: Output,
    /// Take the policies from this file instead of the cluster's OvercommitPolicy objects.
    #[arg(long, env = "KUBE_OVERCOMMIT_POLICY_FILE")]
    pub policy_file: Option<PathBuf>,
    /// The kubeconfig file (default: as kubectl finds it: $KUBECONFIG, ~/.kube/config, or the
    /// in-cluster service account).
    #[arg(long, env = "KUBE_OVERCOMMIT_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current context).
    #[arg(long, env = "KUBE_OVERCOMMIT_CONTEXT")]
    pub context: Option<String>,
    /// `serve --webhook-config-name`: the name of the compiled MutatingAdmissionPolicy and
    /// binding whose presence puts the static policies' nodes on the in-process path.
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_WEBHOOK_CONFIG_NAME",
        default_value = crate::leader::DEFAULT_CONFIG_NAME
    )]
    pub webhook_config_name: String,
}

/// The `status` subcommand (binary edge: anyhow).
pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let config = config(&args).await?;
    // The client retries 503 and 429 with a backoff growing to minutes (kube's default): fine
    // for listing nodes and pods, but an aggregated metrics API that is down answers 503 at
    // once, and the table is shown without usage rather than after minutes.
    let mut once = config.clone();
    once.default_retry = false;
    let client = Client::try_from(config).context("building the API client")?;
    let metrics_client = Client::try_from(once).context("building the API client")?;
    let policies = policies(&client, args.policy_file.as_ref()).await?;
    let nodes: Vec<Node> = list_all(Api::all(client.clone()), "nodes").await?;
    let pods: Vec<Pod> = list_all(Api::all(client.clone()), "pods").await?;
    let mut requested: BTreeMap<String, BTreeMap<String, u128>> = BTreeMap::new();
    for pod in pods.iter().filter(|p| crate::pods::is_active(p)) {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_ref()) else {
            continue;
        };
        match crate::pods::requests(pod) {
            Ok(requests) => {
                let sums = requested.entry(node.clone()).or_default();
                for (resource, value) in requests {
                    *sums.entry(resource).or_insert(0) += value;
                }
            }
            Err(e) => eprintln!("warning: not counted: {e}"),
        }
    }
    let usage = match node_usage(&metrics_client).await {
        Ok(usage) => Some(usage),
        Err(e) => {
            eprintln!("note: no usage: {e}");
            None
        }
    };
    let facts: Vec<NodeFacts> = nodes
        .into_iter()
        .map(|node| {
            let name = node.metadata.name.clone().unwrap_or_default();
            NodeFacts {
                requested: requested.remove(&name).unwrap_or_default(),
                usage: usage
                    .as_ref()
                    .map(|u| u.get(&name).cloned().unwrap_or_default()),
                labels: node.metadata.labels.unwrap_or_default(),
                annotations: node.metadata.annotations.unwrap_or_default(),
                allocatable: node
                    .status
                    .and_then(|s| s.allocatable)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0))
                    .collect(),
                name,
            }
        })
        .collect();
    let cluster = cluster_path(&client, &args.webhook_config_name).await;
    let rows = view::rows(&facts, &policies, &cluster);
    for row in &rows {
        for problem in &row.problems {
            eprintln!("warning: node {}: {problem}", row.node);
        }
    }
    match args.output {
        Output::Table => print!("{}", view::table(&rows)),
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&rows).context("writing JSON")?
        ),
    }
    Ok(())
}

async fn config(args: &StatusArgs) -> anyhow::Result<Config> {
    let config = if args.kubeconfig.is_some() || args.context.is_some() {
        let kubeconfig = match &args.kubeconfig {
            Some(path) => Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?,
            None => Kubeconfig::read().context("reading the kubeconfig")?,
        };
        let options = KubeConfigOptions {
            context: args.context.clone(),
            ..KubeConfigOptions::default()
        };
        Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .context("loading the kubeconfig")?
    } else {
        Config::infer()
            .await
            .context("status needs a cluster (kubeconfig or in-cluster)")?
    };
    Ok(config)
}

async fn policies(client: &Client, file: Option<&PathBuf>) -> anyhow::Result<PolicySet> {
    if let Some(path) = file {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let parsed = parse_policy_file(&text).with_context(|| format!("{}", path.display()))?;
        return PolicySet::new(parsed).with_context(|| format!("{}", path.display()));
    }
    let listed: Vec<OvercommitPolicy> = list_all(Api::all(client.clone()), "overcommitpolicies")
        .await
        .context("is the OvercommitPolicy CRD installed? (or pass --policy-file)")?;
    let (set, refused) = PolicySet::from_valid(listed);
    for e in refused {
        eprintln!("warning: policy not in force: {e}");
    }
    Ok(set)
}

/// The live policy is the placeholder (`in_process_policy::is_placeholder`).
fn is_placeholder(object: &DynamicObject, name: &str) -> bool {
    serde_json::to_value(object)
        .is_ok_and(|v| crate::leader::in_process_policy::is_placeholder(&v, name))
}

/// Whether the compiled MutatingAdmissionPolicy and binding named `name` are in the cluster (the
/// placeholder the install ships applies nothing: absent).
async fn cluster_path(client: &Client, name: &str) -> ClusterPath {
    let mut found = Vec::new();
    for resource in [policy_resource(), binding_resource()] {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        found.push(match api.get_opt(name).await {
            Ok(Some(o))
                if resource.kind == "MutatingAdmissionPolicy" && is_placeholder(&o, name) =>
            {
                Found::Absent
            }
            Ok(Some(_)) => Found::Present,
            Ok(None) => Found::Absent,
            Err(kube::Error::Api(status)) if status.code == 404 => Found::Absent,
            Err(e) => {
                eprintln!(
                    "note: path unknown: reading {} {name}: {e}",
                    resource.plural
                );
                Found::Unreadable
            }
        });
    }
    match found[..] {
        [policy, binding] => mode::cluster_path(name, policy, binding),
        _ => ClusterPath::Unknown,
    }
}

/// Every object of `api`, page by page.
async fn list_all<K>(api: Api<K>, what: &str) -> anyhow::Result<Vec<K>>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    crate::sources::list_pages(api)
        .await
        .with_context(|| format!("listing {what}"))
}

/// Each node's usage from metrics.k8s.io (NodeMetrics), in the scheduler's units.
async fn node_usage(client: &Client) -> anyhow::Result<BTreeMap<String, BTreeMap<String, u128>>> {
    let mut out = BTreeMap::new();
    for sample in crate::sources::node_metrics::list(client).await? {
        let mut usage = BTreeMap::new();
        for (resource, value) in [("cpu", sample.cpu_millis), ("memory", sample.memory_bytes)] {
            if let Some(value) = value {
                usage.insert(resource.to_string(), value);
            }
        }
        out.insert(sample.node, usage);
    }
    Ok(out)
}
