//! `kube-overcommit review` and `kube-overcommit crd`: try policies on a review offline, and
//! print the CustomResourceDefinition. Reads files and writes to stdout/stderr; the decision is
//! `admission::handle`, exactly what `serve` answers.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{Context, bail};

use std::time::Duration;

use std::sync::Arc;

use crate::admission::{self, Clock, NodeUsageSource, Outcome, Settings};
use crate::duration::duration_arg;
use crate::leader::DEFAULT_CONFIG_NAME;
use crate::mode::{ClusterPath, Mode, node_path};
use crate::review_usage::{FixedUsage, usage_input};
use overcommit_core::policy::{self, PolicySet};

/// Print the AdmissionReview response `serve` would give for a review.
#[derive(Debug, Clone, clap::Args)]
pub struct ReviewArgs {
    /// Policies to apply: a YAML file of one or more OvercommitPolicy documents.
    #[arg(long, env = "KUBE_OVERCOMMIT_POLICY_FILE")]
    pub policy_file: PathBuf,
    /// An AdmissionReview (JSON) to answer, or `-` for stdin. A bare Node (as from
    /// `kubectl get node NAME -o json`) is reviewed as its kubelet's next status update; a bare
    /// Pod as its creation.
    #[arg(default_value = "-")]
    pub input: String,
    /// Also print a short account (which policy, raw -> new per resource) to stderr.
    #[arg(long)]
    pub explain: bool,
    /// The webhook's own namespace: its pods are never touched.
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_NAMESPACE",
        default_value = "kube-overcommit"
    )]
    pub own_namespace: String,
    /// Quiet heartbeats' refresh period, as `serve --heartbeat-refresh` (0: off).
    #[arg(long, env = "KUBE_OVERCOMMIT_HEARTBEAT_REFRESH", default_value = "5m", value_parser = duration_arg)]
    pub heartbeat_refresh: Duration,
    /// The time of the review (RFC 3339, e.g. 2026-11-24T02:00:00Z), to replay a decision
    /// whose heartbeat ages matter; default: now.
    #[arg(long, value_parser = parse_now)]
    pub now: Option<i64>,
    /// For usage policies: the node's usage as JSON (synced, metricsFailing, sampleAge,
    /// sampleWindow, usageInterval, cpu/memory: {requested, peakUsage}); see docs/policy.md. Without it or the flags below,
    /// usage is unknown and usage policies fall back to nodeRatios.
    #[arg(long, env = "KUBE_OVERCOMMIT_USAGE_FILE")]
    pub usage_file: Option<PathBuf>,
    /// For usage policies: the node's requested sum, RESOURCE=QUANTITY (cpu, memory);
    /// repeatable, overrides the usage file.
    #[arg(long, env = "KUBE_OVERCOMMIT_REQUESTED", value_delimiter = ',')]
    pub requested: Vec<String>,
    /// For usage policies: the node's peak usage in the window, RESOURCE=QUANTITY (cpu,
    /// memory); repeatable, overrides the usage file.
    #[arg(long, env = "KUBE_OVERCOMMIT_PEAK_USAGE", value_delimiter = ',')]
    pub peak_usage: Vec<String>,
    /// `serve --mode` of the cluster, for the path `--explain` names (the response is the
    /// webhook rule's either way: both paths give the same result).
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_MODE",
        value_enum,
        default_value = "webhook"
    )]
    pub mode: Mode,
    /// `serve --webhook-config-name`: the name of the compiled admission policy in in-process
    /// mode.
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_WEBHOOK_CONFIG_NAME",
        default_value = DEFAULT_CONFIG_NAME
    )]
    pub webhook_config_name: String,
    /// Instead of the review: memory relief's decision for the node in INPUT (a bare Node),
    /// from `--pods`, `--pod-metrics` and the usage input (memory's peakUsage is the node's
    /// newest sample); see docs/policy.md, "Memory relief".
    #[arg(long, requires = "pods")]
    pub explain_relief: bool,
    /// With `--explain-relief`: the node's pods, a PodList (JSON).
    #[arg(long)]
    pub pods: Option<PathBuf>,
    /// With `--explain-relief`: a PodMetricsList (JSON) of metrics.k8s.io; without it, pods'
    /// usage is unmeasured.
    #[arg(long)]
    pub pod_metrics: Option<PathBuf>,
}

/// `--now`: an RFC 3339 time, in milliseconds since the Unix epoch.
fn parse_now(text: &str) -> Result<i64, String> {
    text.parse::<jiff::Timestamp>()
        .map(|t| t.as_millisecond())
        .map_err(|e| format!("{text:?} is not an RFC 3339 time (2026-11-24T02:00:00Z): {e}"))
}

/// A policy file (YAML, one or more OvercommitPolicy documents), validated as a whole.
pub fn read_policy_file(path: &std::path::Path) -> anyhow::Result<PolicySet> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading policy file {}", path.display()))?;
    policy::parse_policy_file(&text)
        .and_then(PolicySet::new)
        .with_context(|| format!("policy file {}", path.display()))
}

/// Run `review`: the response JSON on stdout; with `--explain`, the account on stderr.
pub fn run(args: &ReviewArgs) -> anyhow::Result<()> {
    let policies = read_policy_file(&args.policy_file)?;
    let input = read_input(&args.input)?;
    let usage_text = match &args.usage_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("reading usage file {}", path.display()))?,
        ),
        None => None,
    };
    let usage = usage_input(usage_text.as_deref(), &args.requested, &args.peak_usage)?;
    if args.explain_relief {
        return run_relief(args, &policies, &input, usage);
    }
    let body = as_review(&input)?;
    let settings = Settings {
        own_namespace: args.own_namespace.clone(),
        heartbeat_refresh: args.heartbeat_refresh,
        clock: args.now.map_or(Clock::System, Clock::Fixed),
        usage: usage.map(|u| Arc::new(FixedUsage(u)) as Arc<dyn NodeUsageSource>),
        ..Settings::default()
    };
    let handled = admission::handle(&body, &policies, &settings);
    let reason = handled.error.as_ref().map(|e| e.to_string());
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&handled.body)?;
    stdout.write_all(b"\n")?;
    stdout.flush()?;
    if args.explain {
        let account = match admission::explain(&body, &policies, &settings) {
            Ok(decision) => decision.explain(),
            Err(reason) => format!("failed open (allowed, unchanged): {reason}\n"),
        };
        eprint!("{account}");
        if let Some(labels) = node_labels(&body) {
            let cluster = ClusterPath::from_mode(args.mode, &args.webhook_config_name);
            eprintln!(
                "{}",
                node_path(&policies.for_node(&labels), &cluster).explain()
            );
        }
    }
    match handled.outcome {
        Outcome::BadRequest => bail!("not an AdmissionReview: {}", reason.unwrap_or_default()),
        Outcome::FailedOpen => {
            eprintln!(
                "warning: the review fails open (allowed, unchanged): {}",
                reason.unwrap_or_default()
            );
            Ok(())
        }
        Outcome::Patched | Outcome::Unchanged => Ok(()),
    }
}

/// `review --explain-relief`: the account on stdout.
fn run_relief(
    args: &ReviewArgs,
    policies: &PolicySet,
    node: &[u8],
    usage: Option<overcommit_core::node::usage::NodeUsage>,
) -> anyhow::Result<()> {
    let read =
        |path: &PathBuf| std::fs::read(path).with_context(|| format!("reading {}", path.display()));
    let pods = match &args.pods {
        Some(path) => read(path)?,
        None => bail!("--explain-relief needs --pods"),
    };
    let pod_metrics = args.pod_metrics.as_ref().map(read).transpose()?;
    let lines = crate::review_relief::replay(
        policies,
        &crate::review_relief::ReliefInput {
            node,
            pods: &pods,
            pod_metrics: pod_metrics.as_deref(),
            usage,
            own_namespace: &args.own_namespace,
        },
    )?;
    let mut stdout = std::io::stdout().lock();
    for line in lines {
        writeln!(stdout, "{line}")?;
    }
    Ok(())
}

/// Run `crd`: the CustomResourceDefinition YAML on stdout.
pub fn run_crd() -> anyhow::Result<()> {
    let yaml = policy::crd_yaml().context("generating the CRD")?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(yaml.as_bytes())?;
    stdout.flush()?;
    Ok(())
}

/// The labels of the node a node review is about (None: not a node review, or unreadable).
fn node_labels(body: &[u8]) -> Option<BTreeMap<String, String>> {
    let review: serde_json::Value = serde_json::from_slice(body).ok()?;
    let request = review.get("request")?;
    if request.pointer("/resource/resource")?.as_str()? != "nodes" {
        return None;
    }
    let labels = match request.pointer("/object/metadata/labels") {
        Some(serde_json::Value::Object(map)) => map
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect(),
        _ => BTreeMap::new(),
    };
    Some(labels)
}

fn read_input(input: &str) -> anyhow::Result<Vec<u8>> {
    if input == "-" {
        let mut body = Vec::new();
        std::io::stdin()
            .read_to_end(&mut body)
            .context("reading the review from stdin")?;
        Ok(body)
    } else {
        std::fs::read(input).with_context(|| format!("reading {input}"))
    }
}

/// An AdmissionReview as is; a bare Node or Pod wrapped in the review the API server would send.
fn as_review(input: &[u8]) -> anyhow::Result<Vec<u8>> {
    let value: serde_json::Value = match serde_json::from_slice(input) {
        Ok(value) => value,
        // Not JSON: let `handle` give its 400 answer and message.
        Err(_) => return Ok(input.to_vec()),
    };
    let kind = value
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or_default();
    let (resource, sub_resource, operation, old) = match kind {
        "Node" => ("nodes", Some("status"), "UPDATE", true),
        "Pod" => ("pods", None, "CREATE", false),
        _ => return Ok(input.to_vec()),
    };
    let metadata = value.get("metadata");
    let field = |name: &str| {
        metadata
            .and_then(|m| m.get(name))
            .cloned()
            .unwrap_or(serde_json::Value::Null)
    };
    let mut request = serde_json::json!({
        "uid": "kube-overcommit-review",
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": resource},
        "name": field("name"),
        "operation": operation,
        "object": value,
    });
    if let Some(sub) = sub_resource {
        request["subResource"] = sub.into();
    }
    if kind == "Pod" {
        request["namespace"] = field("namespace");
    }
    if old {
        request["oldObject"] = request["object"].clone();
    }
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": request,
    });
    Ok(serde_json::to_vec(&review)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_node_is_reviewed_as_a_status_update() {
        let node = br#"{"kind":"Node","apiVersion":"v1","metadata":{"name":"n1"},"status":{"allocatable":{"cpu":"2"}}}"#;
        let review: serde_json::Value = match as_review(node).map(|b| serde_json::from_slice(&b)) {
            Ok(Ok(v)) => v,
            other => panic!("{other:?}"),
        };
        assert_eq!(review["request"]["operation"], "UPDATE");
        assert_eq!(review["request"]["subResource"], "status");
        assert_eq!(review["request"]["name"], "n1");
        assert_eq!(review["request"]["oldObject"], review["request"]["object"]);
    }

    #[test]
    fn bare_pod_is_reviewed_as_its_creation() {
        let pod = br#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"team"},"spec":{"containers":[]}}"#;
        let review: serde_json::Value = match as_review(pod).map(|b| serde_json::from_slice(&b)) {
            Ok(Ok(v)) => v,
            other => panic!("{other:?}"),
        };
        assert_eq!(review["request"]["operation"], "CREATE");
        assert_eq!(review["request"]["namespace"], "team");
        assert!(review["request"].get("oldObject").is_none());
    }

    #[test]
    fn node_labels_table() {
        let node = |labels: &str| {
            as_review(format!(r#"{{"kind":"Node","metadata":{{"name":"n"{labels}}}}}"#).as_bytes())
                .unwrap_or_default()
        };
        let pod = as_review(br#"{"kind":"Pod","metadata":{"name":"p","labels":{"a":"b"}}}"#)
            .unwrap_or_default();
        let one: BTreeMap<String, String> = [("a".to_string(), "b".to_string())].into();
        type Labels = Option<BTreeMap<String, String>>;
        let cases: [(&str, Vec<u8>, Labels); 5] = [
            (
                "node with labels",
                node(r#","labels":{"a":"b"}"#),
                Some(one),
            ),
            ("node without labels", node(""), Some(BTreeMap::new())),
            ("pod", pod, None),
            ("garbage", b"not json".to_vec(), None),
            (
                "review without request",
                br#"{"kind":"AdmissionReview"}"#.to_vec(),
                None,
            ),
        ];
        for (what, body, want) in cases {
            assert_eq!(node_labels(&body), want, "{what}");
        }
    }

    #[test]
    fn reviews_and_garbage_pass_through_unchanged() {
        for input in [
            &br#"{"kind":"AdmissionReview"}"#[..],
            b"not json",
            b"{\"kind\":\"Lease\"}",
        ] {
            assert_eq!(as_review(input).ok().as_deref(), Some(input));
        }
    }
}
