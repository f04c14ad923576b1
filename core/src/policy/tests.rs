//! Table tests for policy validation and choosing.

use std::collections::BTreeMap;

use super::*;
use crate::quantity::Ratio;

fn policy_yaml(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata:\n  name: {name}\nspec:\n{spec}\n"
    )
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn set(yaml: &str) -> PolicySet {
    match parse_policy_file(yaml).and_then(PolicySet::new) {
        Ok(set) => set,
        Err(e) => panic!("{e}"),
    }
}

fn chosen(set: &PolicySet, node: &BTreeMap<String, String>) -> String {
    match set.for_node(node) {
        NodeChoice::Policy(p) => p.name.clone(),
        NodeChoice::NoPolicy => "<none>".into(),
        NodeChoice::OptedOut => "<opted out>".into(),
    }
}

#[test]
fn accepts_valid_policies() {
    let specs = [
        "  nodeRatios: {cpu: \"2\"}",
        "  nodeRatios: {cpu: \"1\", memory: \"10\", ephemeral-storage: \"1.5\", pods: \"2\", example.com/gpu: \"1.000001\"}",
        "  priority: 1000000",
        "  nodeSelector: {}",
        "  nodeSelector:\n    matchLabels: {pool: batch, example.com/tier: \"\"}\n    matchExpressions:\n    - {key: zone, operator: In, values: [a, b]}\n    - {key: gpu, operator: DoesNotExist}\n    - {key: x, operator: Exists}\n    - {key: y, operator: NotIn, values: [\"1\"]}",
        "  podDefaults: {requests: {cpu: 100m, memory: 128Mi}, requestToLimitPercent: {cpu: 25, memory: 100}}",
        "  podDefaults: {}",
        "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"4\"}}",
        "  usage: {targetUtilization: {cpu: \"1%\", memory: \"100%\"}, maxRatios: {cpu: \"10\", memory: \"1\"}, window: 1h30m, minChange: \"0%\"}",
        "  usage: {targetUtilization: {memory: \"75%\"}, maxRatios: {memory: \"1.5\"}, window: 24h, minChange: \"50%\"}",
        "  usage: {targetUtilization: {memory: \"75%\"}, maxRatios: {memory: \"2\"}}",
        "  usage: {targetUtilization: {memory: \"75%\"}, maxRatios: {memory: \"2.5\"}, allowHighMemoryRatio: true}",
        "  usage: {targetUtilization: {memory: \"75%\"}, maxRatios: {memory: \"10\"}, allowHighMemoryRatio: true}",
        "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"10\"}, allowHighMemoryRatio: false}",
        "  nodeRatios: {cpu: \"4\", pods: \"3\"}\n  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"4\"}, window: 1m}",
    ];
    for spec in specs {
        let yaml = policy_yaml("ok", spec);
        if let Err(e) = parse_policy_file(&yaml) {
            panic!("should accept:\n{yaml}\n{e}");
        }
    }
}

#[test]
fn refuses_invalid_policies_with_a_clear_message() {
    let cases: &[(&str, &str, &str)] = &[
        ("ok", "  nodeRatios: {cpu: \"0.5\"}", "between 1 and 10"),
        ("ok", "  nodeRatios: {cpu: \"11\"}", "between 1 and 10"),
        (
            "ok",
            "  nodeRatios: {cpu: \"1.0000001\"}",
            "at most 6 decimals",
        ),
        ("ok", "  nodeRatios: {cpu: \"2x\"}", "ratio"),
        (
            "ok",
            "  nodeRatios: {hugepages-2Mi: \"2\"}",
            "not one of cpu",
        ),
        ("ok", "  nodeRatios: {Cpu: \"2\"}", "not one of cpu"),
        (
            "ok",
            "  nodeRatios: {kubernetes.io/batch-cpu: \"2\"}",
            "kubernetes.io",
        ),
        (
            "ok",
            "  nodeRatios: {Example.com/gpu: \"2\"}",
            "DNS subdomain",
        ),
        ("ok", "  nodeRatios: {example.com/-gpu: \"2\"}", "name"),
        ("ok", "  priority: -1", "spec.priority"),
        ("ok", "  priority: 1000001", "spec.priority"),
        (
            "ok",
            "  nodeSelector:\n    matchExpressions:\n    - {key: zone, operator: Like, values: [a]}",
            "not one of In",
        ),
        (
            "ok",
            "  nodeSelector:\n    matchExpressions:\n    - {key: zone, operator: In}",
            "needs at least one value",
        ),
        (
            "ok",
            "  nodeSelector:\n    matchExpressions:\n    - {key: zone, operator: Exists, values: [a]}",
            "takes no values",
        ),
        (
            "ok",
            "  nodeSelector:\n    matchLabels: {\"bad key!\": x}",
            "label key",
        ),
        (
            "ok",
            "  nodeSelector:\n    matchLabels: {pool: \"-bad\"}",
            "label value",
        ),
        (
            "ok",
            "  podDefaults: {requests: {ephemeral-storage: 1Gi}}",
            "cpu or memory",
        ),
        (
            "ok",
            "  podDefaults: {requests: {cpu: lots}}",
            "not a quantity",
        ),
        (
            "ok",
            "  podDefaults: {requests: {cpu: \"0\"}}",
            "greater than zero",
        ),
        (
            "ok",
            "  podDefaults: {requests: {memory: \"1e30\"}}",
            "out of range",
        ),
        (
            "ok",
            "  podDefaults: {requestToLimitPercent: {cpu: 0}}",
            "1 to 100",
        ),
        (
            "ok",
            "  podDefaults: {requestToLimitPercent: {memory: 101}}",
            "1 to 100",
        ),
        ("Bad_Name", "  priority: 1", "DNS subdomain"),
        (
            "ok",
            "  nodeRatio: {cpu: \"2\"}",
            "unknown field spec.nodeRatio",
        ),
        (
            "ok",
            "  podDefaults: {request: {cpu: 1m}}",
            "unknown field spec.podDefaults.request",
        ),
        (
            "ok",
            "  nodeSelector: {matchExpressions: [{key: a, operator: Exists, value: [x]}]}",
            "matchExpressions[0].value",
        ),
        // spec.usage
        (
            "ok",
            "  usage: {}",
            "targetUtilization must name cpu and/or memory",
        ),
        (
            "ok",
            "  usage: {maxRatios: {cpu: \"2\"}}",
            "targetUtilization must name",
        ),
        (
            "ok",
            "  usage: {targetUtilization: {cpu: \"60%\"}}",
            "maxRatios must give a ceiling for cpu",
        ),
        (
            "ok",
            "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {memory: \"2\"}}",
            "maxRatios must give a ceiling for cpu",
        ),
        (
            "ok",
            "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"2\", memory: \"2\"}}",
            "memory has no targetUtilization",
        ),
        (
            "ok",
            "  usage: {targetUtilization: {pods: \"60%\"}, maxRatios: {pods: \"2\"}}",
            "must be cpu or memory",
        ),
        (
            "ok",
            "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"2\", example.com/gpu: \"2\"}}",
            "must be cpu or memory",
        ),
        (
            "ok",
            "  usage: {targetUtilization: {cpu: \"0%\"}, maxRatios: {cpu: \"2\"}}",
            "whole percent from 1% to 100%",
        ),
        (
            "ok",
            "  usage: {targetUtilization: {cpu: \"101%\"}, maxRatios: {cpu: \"2\"}}",
            "whole percent from 1% to 100%",
        ),
        (
            "ok",
            "  usage: {targetUtilization: {cpu: \"60\"}, maxRatios: {cpu: \"2\"}}",
            "targetUtilization[cpu]",
        ),
        (
            "ok",
            "  usage: {targetUtilization: {cpu: \"60.5%\"}, maxRatios: {cpu: \"2\"}}",
            "whole percent",
        ),
        (
            "ok",
            "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"11\"}}",
            "maxRatios[cpu]",
        ),
        // Memory: at most 2 unless allowHighMemoryRatio says otherwise; never above 10.
        (
            "ok",
            "  usage: {targetUtilization: {memory: \"75%\"}, maxRatios: {memory: \"2.000001\"}}",
            "spec.usage.maxRatios[memory] 2.000001 is above 2: memory lent beyond what the node has is taken back only by OOM kills and evictions; set spec.usage.allowHighMemoryRatio: true to allow up to 10",
        ),
        (
            "ok",
            "  usage: {targetUtilization: {memory: \"75%\"}, maxRatios: {memory: \"4\"}, allowHighMemoryRatio: false}",
            "spec.usage.maxRatios[memory] 4 is above 2",
        ),
        (
            "ok",
            "  usage: {targetUtilization: {memory: \"75%\"}, maxRatios: {memory: \"11\"}, allowHighMemoryRatio: true}",
            "maxRatios[memory]",
        ),
        (
            "ok",
            "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"0.5\"}}",
            "between 1 and 10",
        ),
        (
            "ok",
            "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"2\"}, window: 59s}",
            "from 1m to 24h",
        ),
        (
            "ok",
            "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"2\"}, window: 25h}",
            "from 1m to 24h",
        ),
        (
            "ok",
            "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"2\"}, window: 1d}",
            "units ms, s, m, h",
        ),
        (
            "ok",
            "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"2\"}, window: \"900\"}",
            "spec.usage.window",
        ),
        (
            "ok",
            "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"2\"}, minChange: \"51%\"}",
            "whole percent from 0% to 50%",
        ),
        (
            "ok",
            "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"2\"}, minChange: \"5\"}",
            "spec.usage.minChange",
        ),
        (
            "ok",
            "  nodeRatios: {cpu: \"3\"}\n  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"2.5\"}}",
            "spec.nodeRatios[cpu] 3 is above spec.usage.maxRatios[cpu] 2.5",
        ),
        (
            "ok",
            "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"2\"}, minchange: \"5%\"}",
            "unknown field spec.usage.minchange",
        ),
    ];
    for &(name, spec, message) in cases {
        assert_refused(name, spec, message);
    }
}

fn assert_refused(name: &str, spec: &str, message: &str) {
    let yaml = policy_yaml(name, spec);
    match parse_policy_file(&yaml) {
        Ok(_) => panic!("should refuse:\n{yaml}"),
        Err(e) => assert!(
            e.to_string().contains(message),
            "{spec}: message {e:?} should mention {message:?}"
        ),
    }
}

#[test]
fn one_bad_document_refuses_the_whole_file() {
    let good = policy_yaml("good", "  nodeRatios: {cpu: \"2\"}");
    let bad = policy_yaml("bad", "  nodeRatios: {cpu: \"20\"}");
    match parse_policy_file(&format!("{good}---\n{bad}")) {
        Err(PolicyError::Invalid { name, .. }) => assert_eq!(name, "bad"),
        other => panic!("expected the file refused for policy bad, got {other:?}"),
    }
}

#[test]
fn file_errors_say_which_document() {
    let good = policy_yaml("good", "  nodeRatios: {cpu: \"2\"}");
    let cases = [
        (format!("{good}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: x}}\n"), "document 2"),
        (format!("{good}---\n: : :\n"), "document 2"),
        (format!("{good}---\n{good}"), "more than one policy has this name"),
        ("apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nspec: {}\n".to_string(), "missing field `metadata`"),
        ("apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {name: x}\nspec: {priority: high}\n".to_string(), "document 1"),
    ];
    for (text, message) in cases {
        match parse_policy_file(&text) {
            Ok(_) => panic!("should refuse:\n{text}"),
            Err(e) => assert!(
                e.to_string().contains(message),
                "{e} should mention {message}"
            ),
        }
    }
}

#[test]
fn empty_file_and_empty_documents_mean_no_policies() {
    for text in ["", "---\n", "# nothing\n---\n---\n"] {
        match parse_policy_file(text) {
            Ok(policies) => assert!(policies.is_empty(), "{text:?}"),
            Err(e) => panic!("{text:?}: {e}"),
        }
    }
}

#[test]
fn chooses_highest_priority_then_name() {
    let yaml = [
        policy_yaml("low", "  priority: 1\n  nodeRatios: {cpu: \"2\"}"),
        policy_yaml(
            "b-high",
            "  priority: 5\n  nodeRatios: {cpu: \"2\"}\n  nodeSelector: {matchLabels: {pool: batch}}",
        ),
        policy_yaml(
            "a-high",
            "  priority: 5\n  nodeRatios: {cpu: \"2\"}\n  nodeSelector: {matchLabels: {pool: batch}}",
        ),
        policy_yaml(
            "gpu",
            "  priority: 9\n  nodeRatios: {cpu: \"2\"}\n  nodeSelector: {matchExpressions: [{key: gpu, operator: Exists}]}",
        ),
    ]
    .join("---\n");
    let set = set(&yaml);
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[], "low"),
        (&[("pool", "web")], "low"),
        (&[("pool", "batch")], "a-high"),
        (&[("pool", "batch"), ("gpu", "")], "gpu"),
        (
            &[("pool", "batch"), ("overcommit.dev/disabled", "true")],
            "<opted out>",
        ),
        (
            &[("pool", "batch"), ("overcommit.dev/disabled", "yes")],
            "a-high",
        ),
    ];
    for &(node, expected) in cases {
        assert_eq!(chosen(&set, &labels(node)), expected, "{node:?}");
    }
    assert_eq!(
        set.names().collect::<Vec<_>>(),
        vec!["gpu", "a-high", "b-high", "low"]
    );
}

#[test]
fn policies_without_node_ratios_never_apply_to_nodes() {
    let yaml = [
        policy_yaml("pods-only", "  priority: 9\n  podDefaults: {requests: {cpu: 100m}}"),
        policy_yaml("nodes", "  priority: 1\n  nodeRatios: {cpu: \"2\"}\n  nodeSelector: {matchLabels: {pool: batch}}"),
    ]
    .join("---\n");
    let set = set(&yaml);
    assert_eq!(chosen(&set, &labels(&[("pool", "batch")])), "nodes");
    assert_eq!(chosen(&set, &labels(&[])), "<none>");
}

#[test]
fn usage_policies_apply_to_nodes_without_node_ratios() {
    let yaml = [
        policy_yaml(
            "usage-only",
            "  priority: 5\n  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"4\"}}\n  nodeSelector: {matchLabels: {pool: batch}}",
        ),
        policy_yaml("static", "  priority: 1\n  nodeRatios: {cpu: \"2\"}"),
    ]
    .join("---\n");
    let set = set(&yaml);
    assert_eq!(chosen(&set, &labels(&[("pool", "batch")])), "usage-only");
    assert_eq!(chosen(&set, &labels(&[])), "static");
    let defaults = set.compiled.iter().find_map(|p| p.usage.as_ref());
    match defaults {
        Some(usage) => {
            assert_eq!(usage.window, std::time::Duration::from_secs(900));
            assert_eq!(usage.min_change.value, 5);
            assert_eq!(usage.targets.get("cpu").map(|t| t.target.value), Some(60));
        }
        None => panic!("usage compiled"),
    }
    // The history keeps the longest window (default 15m here); no usage policy, none.
    assert_eq!(
        set.longest_usage_window(),
        Some(std::time::Duration::from_secs(900))
    );
    let longer = [
        policy_yaml(
            "a",
            "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"4\"}, window: 1h}",
        ),
        policy_yaml(
            "b",
            "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"4\"}, window: 1m}",
        ),
    ]
    .join("---\n");
    assert_eq!(
        self::set(&longer).longest_usage_window(),
        Some(std::time::Duration::from_secs(3600))
    );
    assert_eq!(
        self::set(&policy_yaml("s", "  nodeRatios: {cpu: \"2\"}")).longest_usage_window(),
        None
    );
}

#[test]
fn no_policy_when_nothing_matches() {
    let set = set(&policy_yaml(
        "batch",
        "  nodeSelector: {matchLabels: {pool: batch}}",
    ));
    assert_eq!(chosen(&set, &labels(&[("pool", "web")])), "<none>");
    assert_eq!(chosen(&PolicySet::default(), &labels(&[])), "<none>");
}

#[test]
fn pod_defaults_come_from_the_highest_priority_policy_that_has_them() {
    let yaml = [
        policy_yaml("top", "  priority: 9\n  nodeRatios: {cpu: \"2\"}"),
        policy_yaml(
            "defaults-b",
            "  priority: 3\n  podDefaults: {requests: {cpu: 200m}}",
        ),
        policy_yaml(
            "defaults-a",
            "  priority: 3\n  podDefaults: {requests: {cpu: 100m}}",
        ),
        policy_yaml(
            "defaults-low",
            "  priority: 1\n  podDefaults: {requests: {cpu: \"1\"}}",
        ),
    ]
    .join("---\n");
    let set = set(&yaml);
    match set.pod_defaults() {
        Some((name, defaults)) => {
            assert_eq!(name, "defaults-a");
            assert_eq!(
                defaults.requests.get("cpu").map(|q| q.to_string()),
                Some("100m".to_string())
            );
        }
        None => panic!("expected pod defaults"),
    }
    assert!(set_without_defaults().pod_defaults().is_none());
}

fn set_without_defaults() -> PolicySet {
    set(&policy_yaml("top", "  nodeRatios: {cpu: \"2\"}"))
}

#[test]
fn from_valid_keeps_good_policies_and_reports_bad_ones() {
    let mut good = OvercommitPolicy::new("good", OvercommitPolicySpec::default());
    good.spec.node_ratios.insert("cpu".into(), "2".into());
    let mut bad = OvercommitPolicy::new("bad", OvercommitPolicySpec::default());
    bad.spec.node_ratios.insert("cpu".into(), "0".into());
    let (set, errors) = PolicySet::from_valid(vec![good.clone(), bad, good]);
    assert_eq!(set.names().collect::<Vec<_>>(), vec!["good"]);
    assert_eq!(errors.len(), 2, "{errors:?}");
}

#[test]
fn policy_set_new_refuses_duplicates() {
    let p = OvercommitPolicy::new("same", OvercommitPolicySpec::default());
    assert!(PolicySet::new(vec![p.clone(), p]).is_err());
}

#[test]
fn checked_in_crd_is_up_to_date() {
    // `make crd` (or UPDATE_CRD=1 cargo test checked_in_crd) rewrites the file.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/crd/overcommitpolicies.yaml");
    let generated = match crd_yaml() {
        Ok(yaml) => yaml,
        Err(e) => panic!("CRD does not serialise: {e}"),
    };
    if std::env::var_os("UPDATE_CRD").is_some_and(|v| v == "1")
        && let Err(e) = std::fs::write(&path, &generated)
    {
        panic!("cannot write {}: {e}", path.display());
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is out of date with the OvercommitPolicy type; run `make crd`",
        path.display()
    );
}

#[test]
fn crd_is_cluster_scoped_with_the_validations_the_code_applies() {
    let yaml = crd_yaml().unwrap_or_default();
    for needle in [
        "scope: Cluster",
        "group: overcommit.dev",
        "name: v1alpha1",
        Ratio::PATTERN,
        "- DoesNotExist",
        "maximum: 1000000",
        "maximum: 100",
        "self.all(k, k in ['cpu', 'memory'])",
        "duration(self) >= duration('1m') && duration(self) <= duration('24h')",
        "double(self.nodeRatios[k]) <= double(self.usage.maxRatios[k])",
        "self.targetUtilization.all(k, k in self.maxRatios)",
        "<= 2.0 || (has(self.allowHighMemoryRatio) && self.allowHighMemoryRatio)",
    ] {
        assert!(yaml.contains(needle), "CRD lacks {needle:?}");
    }
}

#[test]
fn example_policy_is_valid() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/policy.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    match parse_policy_file(&text).and_then(PolicySet::new) {
        Ok(set) => assert!(set.len() >= 2, "the example shows several policies"),
        Err(e) => panic!("{}: {e}", path.display()),
    }
}

#[test]
fn request_cap_is_read_with_its_mode() {
    type Percents<'a> = &'a [(&'a str, u32)];
    let cases: &[(&str, Percents<'_>, CapMode)] = &[
        (
            "  nodeRatios: {cpu: \"1.1\"}\n  requestCap: {cpu: \"110%\", memory: \"100%\"}",
            &[("cpu", 110), ("memory", 100)],
            CapMode::Enforce,
        ),
        (
            "  nodeRatios: {cpu: \"1.5\"}\n  requestCap: {cpu: \"1000%\"}\n  capMode: Warn",
            &[("cpu", 1000)],
            CapMode::Warn,
        ),
        (
            "  nodeRatios: {memory: \"2\"}\n  requestCap: {cpu: \"50%\"}\n  capMode: Enforce",
            &[("cpu", 50)],
            CapMode::Enforce,
        ),
        (
            "  nodeRatios: {cpu: \"1.000001\"}\n  requestCap: {cpu: \"101%\"}",
            &[("cpu", 101)],
            CapMode::Enforce,
        ),
    ];
    for &(spec, percent, mode) in cases {
        let set = set(&policy_yaml("cap", spec));
        let NodeChoice::Policy(policy) = set.for_node(&labels(&[])) else {
            panic!("{spec}: no policy for the node");
        };
        let expected = CompiledCap {
            percent: percent.iter().map(|&(r, p)| (r.to_string(), p)).collect(),
            mode,
        };
        assert_eq!(policy.cap.as_ref(), Some(&expected), "{spec}");
    }
    let set = set(&policy_yaml("nocap", "  nodeRatios: {cpu: \"2\"}"));
    let NodeChoice::Policy(policy) = set.for_node(&labels(&[])) else {
        panic!("no policy for the node");
    };
    assert_eq!(policy.cap, None);
}

#[test]
fn refuses_invalid_request_caps_with_a_clear_message() {
    let cases: &[(&str, &str)] = &[
        (
            "  nodeRatios: {cpu: \"1.5\"}\n  requestCap: {cpu: \"110%\"}",
            "spec.requestCap[cpu] 110% is below spec.nodeRatios[cpu] 1.5",
        ),
        (
            "  nodeRatios: {cpu: \"1.100001\"}\n  requestCap: {cpu: \"110%\"}",
            "is below spec.nodeRatios[cpu] 1.100001",
        ),
        (
            "  nodeRatios: {cpu: \"2\"}\n  requestCap: {cpu: \"49%\"}",
            "must be a whole percent from 50% to 1000%",
        ),
        (
            "  nodeRatios: {cpu: \"2\"}\n  requestCap: {cpu: \"1001%\"}",
            "from 50% to 1000%",
        ),
        (
            "  nodeRatios: {cpu: \"2\"}\n  requestCap: {cpu: \"250\"}",
            "spec.requestCap[cpu] \"250\" must be a whole percent",
        ),
        (
            "  nodeRatios: {cpu: \"2\"}\n  requestCap: {cpu: \"250.5%\"}",
            "whole percent",
        ),
        (
            "  nodeRatios: {cpu: \"2\"}\n  requestCap: {cpu: \"0250%\"}",
            "whole percent",
        ),
        (
            "  nodeRatios: {cpu: \"2\"}\n  requestCap: {cpu: \" 250%\"}",
            "whole percent",
        ),
        (
            "  nodeRatios: {cpu: \"2\"}\n  requestCap: {ephemeral-storage: \"200%\"}",
            "spec.requestCap: resource \"ephemeral-storage\" must be cpu or memory",
        ),
        (
            "  requestCap: {cpu: \"200%\"}",
            "spec.requestCap needs spec.nodeRatios",
        ),
        (
            "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"2\"}}\n  requestCap: {cpu: \"150%\"}",
            "spec.requestCap[cpu] 150% is below spec.usage.maxRatios[cpu] 2",
        ),
        (
            "  nodeRatios: {cpu: \"2\"}\n  capMode: Warn",
            "spec.capMode needs spec.requestCap",
        ),
        (
            "  nodeRatios: {cpu: \"2\"}\n  requestCap: {cpu: \"200%\"}\n  capMode: Soft",
            "unknown variant `Soft`",
        ),
        (
            "  nodeRatios: {cpu: \"2\"}\n  requestCaps: {cpu: \"200%\"}",
            "unknown field spec.requestCaps",
        ),
    ];
    for &(spec, message) in cases {
        assert_refused("cap", spec, message);
    }
}

#[test]
fn a_cap_at_or_above_the_usage_ceiling_is_accepted_without_node_ratios() {
    let yaml = "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {name: u}\nspec:\n  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"2\"}}\n  requestCap: {cpu: \"200%\"}\n";
    let set = parse_policy_file(yaml).and_then(PolicySet::new);
    assert!(set.is_ok(), "{:?}", set.err());
}

#[test]
fn crd_states_the_request_cap_rules() {
    let yaml = crd_yaml().unwrap_or_default();
    for needle in [
        schema::CAP_PERCENT_PATTERN,
        "- Enforce",
        "- Warn",
        "spec.capMode needs spec.requestCap",
        "spec.requestCap needs spec.nodeRatios",
        "spec.requestCap is below spec.nodeRatios",
        "spec.requestCap is below spec.usage.maxRatios",
    ] {
        assert!(yaml.contains(needle), "CRD lacks {needle:?}");
    }
}
