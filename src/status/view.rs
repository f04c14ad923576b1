//! What `kube-overcommit status` shows, from plain data: one row per node with its policy, the
//! kubelet's (raw) and the written allocatable, the requested sum and the usage with their
//! shares of raw, and the policy's request cap (`floor(raw x percent / 100)`, as the placement
//! check computes it) with the requested share of it; the effective ratio (allocatable / raw)
//! and whether the usage rule set it; the policy generation the node carries (from
//! `overcommit.dev/applied`) against its policy's current one; rendered as a table like
//! `kubectl top nodes` or as JSON. Pure.

use std::collections::BTreeMap;

use overcommit_core::node::{
    APPLIED_ANNOTATION, AppliedSummary, RAW_ALLOCATABLE_ANNOTATION, applied_summary,
    raw_allocatable_map,
};
use overcommit_core::policy::{NodeChoice, PolicySet};
use overcommit_core::quantity::Quantity;
use overcommit_core::rollout::{self, Standing};
use serde::Serialize;

use crate::mode::{ClusterPath, node_path};

/// The resources shown, as `kubectl top nodes` shows them.
pub const RESOURCES: [&str; 2] = ["cpu", "memory"];

/// What is known of one node.
#[derive(Debug, Clone, Default)]
pub struct NodeFacts {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// `status.allocatable`, as written.
    pub allocatable: BTreeMap<String, String>,
    /// The sum of its active pods' requests, in the scheduler's units.
    pub requested: BTreeMap<String, u128>,
    /// From metrics.k8s.io, in the scheduler's units; `None` when not known.
    pub usage: Option<BTreeMap<String, u128>>,
}

/// One node's row.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    pub node: String,
    /// The policy's name, `-` for none, `opted-out` for a node labelled out.
    pub policy: String,
    /// The path its status writes take (`mode::NodePath::short`): `webhook`,
    /// `in-process(NAME)` (the compiled MutatingAdmissionPolicy NAME), `none` (no policy
    /// applies), `unknown`.
    pub path: String,
    /// The generation of the policy the node's last write applied (its applied annotation;
    /// None: not inflated, or written before generations were recorded).
    pub generation: Option<i64>,
    /// The current generation of the node's policy (None: no policy, or one from a file).
    pub policy_generation: Option<i64>,
    /// Staged rollout: `waiting` (held on what it carries until a step admits it) or
    /// `admitted` (admitted, not yet carrying the generation); None: nothing to move.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<&'static str>,
    pub resources: BTreeMap<String, Cell>,
    /// Why a value could not be read (an unparsable quantity or annotation).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// One resource of a node, in the scheduler's units (cpu in millicores, memory in bytes).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cell {
    pub unit: &'static str,
    /// The kubelet's own allocatable (the raw annotation where the webhook inflated it).
    pub raw: Option<u128>,
    /// What the scheduler sees.
    pub allocatable: Option<u128>,
    pub requested: u128,
    pub usage: Option<u128>,
    pub requested_percent_of_raw: Option<f64>,
    pub usage_percent_of_raw: Option<f64>,
    /// The policy's request cap for this resource, if it sets one.
    pub cap: Option<u128>,
    pub requested_percent_of_cap: Option<f64>,
    /// allocatable / raw, to two decimals: what was applied, whatever set it.
    pub ratio: Option<f64>,
    /// Whether the usage rule set this allocatable (not a ratio of `nodeRatios`).
    pub usage_driven: bool,
}

/// The rows, in node name order, for a cluster whose static policies take `cluster`.
pub fn rows(nodes: &[NodeFacts], policies: &PolicySet, cluster: &ClusterPath) -> Vec<Row> {
    let mut rows: Vec<Row> = nodes.iter().map(|n| row(n, policies, cluster)).collect();
    rows.sort_by(|a, b| a.node.cmp(&b.node));
    rows
}

fn row(node: &NodeFacts, policies: &PolicySet, cluster: &ClusterPath) -> Row {
    let choice = policies.for_node(&node.labels);
    let path = node_path(&choice, cluster).short();
    let (policy, cap, policy_generation) = match &choice {
        NodeChoice::Policy(p) => (p.name.clone(), p.cap.as_ref(), p.generation),
        NodeChoice::NoPolicy => ("-".to_string(), None, None),
        NodeChoice::OptedOut => ("opted-out".to_string(), None, None),
    };
    let (applied, raw_record, mut problems) = read_annotations(node);
    let rollout = match &choice {
        NodeChoice::Policy(p) => policies
            .rollout(&p.name)
            .and_then(|r| rollout::standing(p, r, &node.name, applied.as_ref()))
            .map(|s| match s {
                Standing::Waiting => "waiting",
                Standing::Admitted => "admitted",
            }),
        _ => None,
    };
    let mut units = |what: &str, text: Option<&String>, resource: &str| {
        let text = text?;
        match Quantity::parse(text).and_then(|q| q.to_units_ceil(scale(resource))) {
            Ok(units) => Some(units),
            Err(e) => {
                problems.push(format!("{resource} {what} {text:?}: {e}"));
                None
            }
        }
    };
    let mut resources = BTreeMap::new();
    for resource in RESOURCES {
        let allocatable = units("allocatable", node.allocatable.get(resource), resource);
        let raw = match raw_record.get(resource) {
            Some(text) => units("raw allocatable", Some(text), resource),
            None => allocatable,
        };
        let requested = node.requested.get(resource).copied().unwrap_or(0);
        let usage = node.usage.as_ref().and_then(|u| u.get(resource).copied());
        let capped = cap
            .and_then(|c| c.percent.get(resource))
            .zip(raw)
            .map(|(percent, raw)| raw.saturating_mul(u128::from(*percent)) / 100);
        resources.insert(
            resource.to_string(),
            Cell {
                unit: if resource == "cpu" {
                    "millicores"
                } else {
                    "bytes"
                },
                raw,
                allocatable,
                requested,
                usage,
                requested_percent_of_raw: percent(Some(requested), raw),
                usage_percent_of_raw: percent(usage, raw),
                cap: capped,
                requested_percent_of_cap: percent(Some(requested), capped),
                ratio: ratio(allocatable, raw),
                usage_driven: applied
                    .as_ref()
                    .is_some_and(|a| a.usage.contains_key(resource)),
            },
        );
    }
    Row {
        node: node.name.clone(),
        policy,
        path,
        generation: applied.as_ref().and_then(|a| a.generation),
        policy_generation,
        rollout,
        resources,
        problems,
    }
}

/// The node's two overcommit annotations as read, with what could not be read.
fn read_annotations(
    node: &NodeFacts,
) -> (
    Option<AppliedSummary>,
    BTreeMap<String, String>,
    Vec<String>,
) {
    let mut problems = Vec::new();
    let applied: Option<AppliedSummary> =
        node.annotations
            .get(APPLIED_ANNOTATION)
            .and_then(|text| match applied_summary(text) {
                Ok(applied) => Some(applied),
                Err(e) => {
                    problems.push(format!("not readable: {e}"));
                    None
                }
            });
    let raw_record: BTreeMap<String, String> =
        match node.annotations.get(RAW_ALLOCATABLE_ANNOTATION) {
            None => BTreeMap::new(),
            Some(text) => raw_allocatable_map(text).unwrap_or_else(|e| {
                problems.push(format!("not readable: {e}"));
                BTreeMap::new()
            }),
        };
    (applied, raw_record, problems)
}

/// The scheduler's units: millicores for cpu, whole units otherwise.
pub fn scale(resource: &str) -> u32 {
    if resource == "cpu" { 3 } else { 0 }
}

/// allocatable / raw, to two decimals.
fn ratio(allocatable: Option<u128>, raw: Option<u128>) -> Option<f64> {
    let (allocatable, raw) = (allocatable?, raw?);
    (raw > 0).then(|| (allocatable as f64 * 100.0 / raw as f64).round() / 100.0)
}

/// The generation column: the node's, and the policy's where they differ (`2/3`: the node
/// carries generation 2 of a policy now at 3; `?`: written without one), then `waiting` or
/// `admitted` during a staged rollout.
fn generation_cell(row: &Row) -> String {
    let cell = match (row.generation, row.policy_generation) {
        (Some(node), Some(policy)) if node == policy => node.to_string(),
        (Some(node), Some(policy)) => format!("{node}/{policy}"),
        (None, Some(policy)) => format!("?/{policy}"),
        (Some(node), None) => node.to_string(),
        (None, None) => "-".to_string(),
    };
    match row.rollout {
        Some(standing) => format!("{cell} {standing}"),
        None => cell,
    }
}

/// The ratio column: `x2.9 usage` where the usage rule set the value, `x1.5` otherwise.
fn ratio_cell(cell: &Cell) -> String {
    match cell.ratio {
        None => "-".to_string(),
        Some(r) if cell.usage_driven => format!("x{r} usage"),
        Some(r) => format!("x{r}"),
    }
}

fn percent(part: Option<u128>, whole: Option<u128>) -> Option<f64> {
    let (part, whole) = (part?, whole?);
    (whole > 0).then(|| (part as f64 * 1000.0 / whole as f64).round() / 10.0)
}

/// The table: a header and one line per node, columns padded to their widest cell.
pub fn table(rows: &[Row]) -> String {
    let mut lines = vec![vec![
        "NODE".to_string(),
        "POLICY".into(),
        "PATH".into(),
        "GEN".into(),
        "CPU RAW".into(),
        "CPU ALLOC".into(),
        "CPU RATIO".into(),
        "CPU REQ".into(),
        "CPU USE".into(),
        "CPU CAP".into(),
        "MEM RAW".into(),
        "MEM ALLOC".into(),
        "MEM RATIO".into(),
        "MEM REQ".into(),
        "MEM USE".into(),
        "MEM CAP".into(),
    ]];
    for row in rows {
        let mut line = vec![
            row.node.clone(),
            row.policy.clone(),
            row.path.clone(),
            generation_cell(row),
        ];
        for resource in RESOURCES {
            let Some(cell) = row.resources.get(resource) else {
                line.extend(std::iter::repeat_n("-".to_string(), 6));
                continue;
            };
            let show = |v: Option<u128>| v.map_or("-".to_string(), |v| human(resource, v));
            let share = |v: Option<u128>, p: Option<f64>| match (v, p) {
                (Some(v), Some(p)) => format!("{} ({p}%)", human(resource, v)),
                (v, _) => show(v),
            };
            line.push(show(cell.raw));
            line.push(show(cell.allocatable));
            line.push(ratio_cell(cell));
            line.push(share(Some(cell.requested), cell.requested_percent_of_raw));
            line.push(share(cell.usage, cell.usage_percent_of_raw));
            // The cap, and how much of it the requests use.
            line.push(share(cell.cap, cell.requested_percent_of_cap));
        }
        lines.push(line);
    }
    let columns = lines.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            lines
                .iter()
                .filter_map(|l| l.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for line in &lines {
        let cells: Vec<String> = line
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out
}

/// A value as a person reads it: cpu in cores (`4`, `3.5`) or millicores below one core
/// (`250m`); memory in Gi (`19.2Gi`), Mi (`512Mi`) or bytes.
pub fn human(resource: &str, value: u128) -> String {
    if resource == "cpu" {
        return match value {
            v if v < 1000 => format!("{v}m"),
            v if v % 1000 == 0 => format!("{}", v / 1000),
            v => trim(format!("{:.3}", v as f64 / 1000.0)),
        };
    }
    const MI: u128 = 1 << 20;
    const GI: u128 = 1 << 30;
    match value {
        v if v >= GI => format!("{}Gi", trim(format!("{:.1}", v as f64 / GI as f64))),
        v if v >= MI => format!("{}Mi", v / MI),
        v => v.to_string(),
    }
}

fn trim(text: String) -> String {
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use overcommit_core::policy::parse_policy_file;

    use super::*;

    fn policies() -> PolicySet {
        let yaml = r#"
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: workers}
spec:
  nodeSelector: {matchLabels: {role: worker}}
  nodeRatios: {cpu: "1.5"}
  requestCap: {cpu: "150%"}
"#;
        PolicySet::new(parse_policy_file(yaml).expect("policy")).expect("valid")
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn units(pairs: &[(&str, u128)]) -> BTreeMap<String, u128> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn rows_show_raw_written_requested_and_usage_with_shares_of_raw() {
        let inflated = NodeFacts {
            name: "worker-1".into(),
            labels: map(&[("role", "worker")]),
            annotations: map(&[(RAW_ALLOCATABLE_ANNOTATION, r#"{"cpu":"4"}"#)]),
            allocatable: map(&[("cpu", "6"), ("memory", "16Gi")]),
            requested: units(&[("cpu", 3500), ("memory", 8 << 30)]),
            usage: Some(units(&[("cpu", 800), ("memory", 4 << 30)])),
        };
        let plain = NodeFacts {
            name: "control-1".into(),
            labels: map(&[("role", "control"), ("overcommit.dev/disabled", "true")]),
            allocatable: map(&[("cpu", "3900m"), ("memory", "7Gi")]),
            ..NodeFacts::default()
        };
        let other = NodeFacts {
            name: "db-1".into(),
            allocatable: map(&[("cpu", "2"), ("memory", "oops")]),
            ..NodeFacts::default()
        };
        let rows = rows(
            &[inflated, plain, other],
            &policies(),
            &ClusterPath::InProcess("oc".into()),
        );
        let names: Vec<&str> = rows.iter().map(|r| r.node.as_str()).collect();
        assert_eq!(names, ["control-1", "db-1", "worker-1"]);
        let [control, db, worker] = rows.as_slice() else {
            panic!("three rows");
        };
        assert_eq!(
            (&*worker.policy, &*control.policy, &*db.policy),
            ("workers", "opted-out", "-")
        );
        // The cap keeps the workers' policy on the webhook even in in-process mode.
        assert_eq!(
            (&*worker.path, &*control.path, &*db.path),
            ("webhook", "none", "none")
        );
        let cpu = worker.resources["cpu"];
        assert_eq!((cpu.raw, cpu.allocatable), (Some(4000), Some(6000)));
        assert_eq!((cpu.requested, cpu.usage), (3500, Some(800)));
        assert_eq!(cpu.requested_percent_of_raw, Some(87.5));
        assert_eq!(cpu.usage_percent_of_raw, Some(20.0));
        // Cap 150% of 4 cores = 6; 3.5 requested is 58.3% of it. Memory has no cap.
        assert_eq!(cpu.cap, Some(6000));
        assert_eq!(cpu.requested_percent_of_cap, Some(58.3));
        assert_eq!(worker.resources["memory"].cap, None);
        let memory = worker.resources["memory"];
        assert_eq!(
            memory.raw,
            Some(16 << 30),
            "not inflated: raw is allocatable"
        );
        assert_eq!(memory.requested_percent_of_raw, Some(50.0));
        // No metrics: no usage; a bad quantity is reported, not guessed.
        assert_eq!(control.resources["cpu"].usage, None);
        assert_eq!(control.resources["cpu"].raw, Some(3900));
        assert_eq!(db.resources["memory"].raw, None);
        assert_eq!(db.problems.len(), 1, "{:?}", db.problems);
        assert!(
            db.problems[0].contains("memory allocatable \"oops\""),
            "{:?}",
            db.problems
        );

        let text = table(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[0].starts_with("NODE"), "{text}");
        let worker_line = lines[3];
        for want in [
            "worker-1",
            "workers",
            "4",
            "6",
            "3.5 (87.5%)",
            "800m (20%)",
            "6 (58.3%)",
            "16Gi",
            "8Gi (50%)",
            "4Gi (25%)",
        ] {
            assert!(
                worker_line.contains(want),
                "{want:?} missing in {worker_line:?}"
            );
        }
        // Columns line up: every line has the policy column at the same offset.
        let at = lines[0].find("POLICY").expect("header");
        assert!(
            lines
                .iter()
                .skip(1)
                .all(|l| l.get(at..).is_some_and(|rest| !rest.starts_with(' '))),
            "{text}"
        );
    }

    #[test]
    fn rows_name_each_nodes_path() {
        let yaml = "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {name: batch}\nspec:\n  nodeSelector: {matchLabels: {role: batch}}\n  nodeRatios: {cpu: \"2\"}\n";
        let set = PolicySet::new(parse_policy_file(yaml).expect("policy")).expect("valid");
        let node = |name: &str, labels: &[(&str, &str)]| NodeFacts {
            name: name.into(),
            labels: map(labels),
            allocatable: map(&[("cpu", "2")]),
            ..NodeFacts::default()
        };
        let nodes = [
            node("a", &[("role", "batch")]),
            node("b", &[]),
            node(
                "c",
                &[("role", "batch"), ("overcommit.dev/disabled", "true")],
            ),
        ];
        let cases = [
            (ClusterPath::Webhook, ["webhook", "none", "none"]),
            (
                ClusterPath::InProcess("oc".into()),
                ["in-process(oc)", "none", "none"],
            ),
            (ClusterPath::Unknown, ["unknown", "none", "none"]),
        ];
        for (cluster, want) in cases {
            let rows = rows(&nodes, &set, &cluster);
            let got: Vec<&str> = rows.iter().map(|r| r.path.as_str()).collect();
            assert_eq!(got, want, "{cluster:?}");
            let text = table(&rows);
            let header: Vec<&str> = text
                .lines()
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .collect();
            assert_eq!(header.get(2), Some(&"PATH"), "{text}");
            let first: Vec<&str> = text
                .lines()
                .nth(1)
                .unwrap_or_default()
                .split_whitespace()
                .collect();
            assert_eq!(first.get(2), Some(&want[0]), "{text}");
        }
    }

    /// A usage policy's row says what was applied: the effective ratio and that the usage rule
    /// set it; every row says which policy generation the node carries.
    #[test]
    fn rows_show_the_effective_ratio_and_the_generation() {
        let yaml = r#"
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: usage}
spec:
  nodeSelector: {matchLabels: {pool: usage}}
  nodeRatios: {cpu: "1"}
  usage: {targetUtilization: {cpu: "70%"}, maxRatios: {cpu: "3"}}
---
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: batch}
spec:
  nodeSelector: {matchLabels: {pool: batch}}
  nodeRatios: {cpu: "1.5"}
"#;
        let mut listed = parse_policy_file(yaml).expect("policies");
        for p in &mut listed {
            p.metadata.generation = Some(if p.metadata.name.as_deref() == Some("usage") {
                4
            } else {
                2
            });
        }
        let set = PolicySet::new(listed).expect("valid");
        let node = |name: &str, pool: &str, alloc: &str, applied: &str| NodeFacts {
            name: name.into(),
            labels: map(&[("pool", pool)]),
            annotations: map(&[
                (RAW_ALLOCATABLE_ANNOTATION, "cpu=4"),
                (APPLIED_ANNOTATION, applied),
            ]),
            allocatable: map(&[("cpu", alloc), ("memory", "8Gi")]),
            ..NodeFacts::default()
        };
        let nodes = [
            node(
                "u1",
                "usage",
                "11600m",
                "policy=usage;ratios=cpu=1;generation=4;usage=cpu=11600m",
            ),
            node("u2", "usage", "4", "policy=usage;ratios=cpu=1;generation=3"),
            node("b1", "batch", "6", "policy=batch;ratios=cpu=1.5"),
        ];
        let rows = rows(&nodes, &set, &ClusterPath::Webhook);
        let [b1, u1, u2] = rows.as_slice() else {
            panic!("three rows");
        };
        let cpu = |r: &Row| (r.resources["cpu"].ratio, r.resources["cpu"].usage_driven);
        assert_eq!(cpu(u1), (Some(2.9), true));
        assert_eq!(cpu(u2), (Some(1.0), false));
        assert_eq!(cpu(b1), (Some(1.5), false));
        assert_eq!(
            [
                generation_cell(u1),
                generation_cell(u2),
                generation_cell(b1)
            ],
            ["4", "3/4", "?/2"]
        );
        let text = table(&rows);
        let line = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_default()
                .to_string()
        };
        assert!(line("u1").contains("x2.9 usage"), "{text}");
        assert!(line("u2").contains("x1 "), "{text}");
        assert!(line("b1").contains("x1.5"), "{text}");
        assert!(
            text.lines().next().unwrap_or_default().contains("GEN"),
            "{text}"
        );
    }

    #[test]
    fn values_read_as_a_person_reads_them() {
        let cases = [
            ("cpu", 250, "250m"),
            ("cpu", 4000, "4"),
            ("cpu", 3500, "3.5"),
            ("cpu", 70_400, "70.4"),
            ("cpu", 1234, "1.234"),
            ("memory", 512 << 20, "512Mi"),
            ("memory", 16 << 30, "16Gi"),
            ("memory", (192 << 30) / 10, "19.2Gi"),
            ("memory", 1000, "1000"),
        ];
        for (resource, value, want) in cases {
            assert_eq!(human(resource, value), want, "{resource} {value}");
        }
    }

    #[test]
    fn json_rows_carry_units_and_omit_empty_problems() {
        let node = NodeFacts {
            name: "n".into(),
            allocatable: map(&[("cpu", "2"), ("memory", "1Gi")]),
            requested: units(&[("cpu", 500)]),
            ..NodeFacts::default()
        };
        let json =
            serde_json::to_value(rows(&[node], &PolicySet::default(), &ClusterPath::Webhook))
                .expect("json");
        assert_eq!(json[0]["path"], "none");
        assert_eq!(json[0]["node"], "n");
        assert_eq!(json[0]["resources"]["cpu"]["unit"], "millicores");
        assert_eq!(json[0]["resources"]["cpu"]["requestedPercentOfRaw"], 25.0);
        assert_eq!(json[0]["resources"]["memory"]["raw"], 1u64 << 30);
        assert!(json[0].get("problems").is_none());
    }

    /// During a staged rollout the generation column says which nodes wait for a step and which
    /// a step admitted.
    #[test]
    fn rows_show_the_nodes_a_rollout_holds() {
        let yaml = r#"
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata: {name: batch}
spec:
  nodeRatios: {cpu: "2"}
  rollout: {maxNodesPerStep: 1}
status:
  rollout: {generation: 3, admitted: [n2]}
"#;
        let mut listed = parse_policy_file(yaml).expect("policies");
        listed[0].metadata.generation = Some(3);
        let set = PolicySet::new(listed).expect("valid");
        let node = |name: &str, applied: &str| NodeFacts {
            name: name.into(),
            annotations: map(&[
                (RAW_ALLOCATABLE_ANNOTATION, "cpu=4"),
                (APPLIED_ANNOTATION, applied),
            ]),
            allocatable: map(&[("cpu", "6")]),
            ..NodeFacts::default()
        };
        let old = "policy=batch;ratios=cpu=1.5;generation=2";
        let nodes = [
            node("n1", "policy=batch;ratios=cpu=2;generation=3"),
            node("n2", old),
            node("n3", old),
        ];
        let cells: Vec<String> = rows(&nodes, &set, &ClusterPath::Webhook)
            .iter()
            .map(generation_cell)
            .collect();
        assert_eq!(cells, ["3", "2/3 admitted", "2/3 waiting"]);
    }
}
