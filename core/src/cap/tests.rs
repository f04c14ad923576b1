//! Table tests for the placement cap.

use std::collections::BTreeMap;

use super::*;
use crate::policy::{PolicySet, parse_policy_file};

const GI: u128 = 1 << 30;
const MI: u128 = 1 << 20;

fn units(items: &[(&str, u128)]) -> BTreeMap<String, u128> {
    items.iter().map(|&(n, v)| (n.to_string(), v)).collect()
}

fn cap(percent: &[(&str, u32)], mode: CapMode) -> CompiledCap {
    CompiledCap {
        percent: percent.iter().map(|&(r, p)| (r.to_string(), p)).collect(),
        mode,
    }
}

struct Case {
    name: &'static str,
    cap: Option<CompiledCap>,
    raw: &'static [(&'static str, u128)],
    requested: &'static [(&'static str, u128)],
    pod: &'static [(&'static str, u128)],
    mirror: bool,
    expect: CapDecision,
}

#[test]
fn placements_are_decided_by_the_cap() {
    let cpu110 = || Some(cap(&[("cpu", 110)], CapMode::Enforce));
    let worker7 = "node worker-7: cpu requests would reach 70.6 of a cap of 70.4 (110% of 64); \
                   pod web-5 asks 0.5";
    let cases = vec![
        Case {
            name: "the issue's example is denied with its message",
            cap: cpu110(),
            raw: &[("cpu", 64_000)],
            requested: &[("cpu", 70_100)],
            pod: &[("cpu", 500)],
            mirror: false,
            expect: CapDecision::Deny(worker7.into()),
        },
        Case {
            name: "Warn mode allows with the same text",
            cap: Some(cap(&[("cpu", 110)], CapMode::Warn)),
            raw: &[("cpu", 64_000)],
            requested: &[("cpu", 70_100)],
            pod: &[("cpu", 500)],
            mirror: false,
            expect: CapDecision::Warn(worker7.into()),
        },
        Case {
            name: "reaching the cap exactly is allowed",
            cap: cpu110(),
            raw: &[("cpu", 4000)],
            requested: &[("cpu", 3900)],
            pod: &[("cpu", 500)],
            mirror: false,
            expect: CapDecision::Allow,
        },
        Case {
            name: "one millicore over the cap is denied",
            cap: cpu110(),
            raw: &[("cpu", 4000)],
            requested: &[("cpu", 3901)],
            pod: &[("cpu", 500)],
            mirror: false,
            expect: CapDecision::Deny(
                "node worker-7: cpu requests would reach 4.401 of a cap of 4.4 (110% of 4); \
                 pod web-5 asks 0.5"
                    .into(),
            ),
        },
        Case {
            name: "an empty node and a pod larger than the cap",
            cap: cpu110(),
            raw: &[("cpu", 4000)],
            requested: &[],
            pod: &[("cpu", 5000)],
            mirror: false,
            expect: CapDecision::Deny(
                "node worker-7: cpu requests would reach 5 of a cap of 4.4 (110% of 4); \
                 pod web-5 asks 5"
                    .into(),
            ),
        },
        Case {
            name: "the cap is floored to whole millicores",
            cap: Some(cap(&[("cpu", 150)], CapMode::Enforce)),
            raw: &[("cpu", 3)],
            requested: &[("cpu", 4)],
            pod: &[("cpu", 1)],
            mirror: false,
            expect: CapDecision::Deny(
                "node worker-7: cpu requests would reach 0.005 of a cap of 0.004 (150% of 0.003); \
                 pod web-5 asks 0.001"
                    .into(),
            ),
        },
        Case {
            name: "memory in Gi and Mi, both resources over: one sentence each",
            cap: Some(cap(&[("cpu", 100), ("memory", 100)], CapMode::Enforce)),
            raw: &[("cpu", 2000), ("memory", 8 * GI)],
            requested: &[("cpu", 2000), ("memory", 8 * GI - 256 * MI)],
            pod: &[("cpu", 250), ("memory", 512 * MI)],
            mirror: false,
            expect: CapDecision::Deny(
                "node worker-7: cpu requests would reach 2.25 of a cap of 2 (100% of 2); \
                 pod web-5 asks 0.25; node worker-7: memory requests would reach 8.25Gi of a \
                 cap of 8Gi (100% of 8Gi); pod web-5 asks 512Mi"
                    .into(),
            ),
        },
        Case {
            name: "amounts shown over the cap are over it (reach rounded up, cap down)",
            cap: Some(cap(&[("memory", 100)], CapMode::Enforce)),
            raw: &[("memory", 2 * GI)],
            requested: &[("memory", 2 * GI)],
            pod: &[("memory", 1)],
            mirror: false,
            expect: CapDecision::Deny(
                "node worker-7: memory requests would reach 2.001Gi of a cap of 2Gi (100% of \
                 2Gi); pod web-5 asks 1"
                    .into(),
            ),
        },
        Case {
            name: "only the resource over its cap is named",
            cap: Some(cap(&[("cpu", 110), ("memory", 100)], CapMode::Enforce)),
            raw: &[("cpu", 4000), ("memory", 4 * GI)],
            requested: &[("cpu", 1000), ("memory", 4 * GI)],
            pod: &[("cpu", 100), ("memory", 1536 * MI / 1024)],
            mirror: false,
            expect: CapDecision::Deny(
                "node worker-7: memory requests would reach 4.002Gi of a cap of 4Gi (100% of \
                 4Gi); pod web-5 asks 1.5Mi"
                    .into(),
            ),
        },
        Case {
            name: "a pod without a request for the capped resource is allowed on a full node",
            cap: cpu110(),
            raw: &[("cpu", 4000), ("memory", GI)],
            requested: &[("cpu", 9000)],
            pod: &[("memory", GI)],
            mirror: false,
            expect: CapDecision::Allow,
        },
        Case {
            name: "a request of zero is not checked",
            cap: cpu110(),
            raw: &[("cpu", 4000)],
            requested: &[("cpu", 9000)],
            pod: &[("cpu", 0)],
            mirror: false,
            expect: CapDecision::Allow,
        },
        Case {
            name: "a mirror pod is allowed",
            cap: cpu110(),
            raw: &[("cpu", 4000)],
            requested: &[("cpu", 9000)],
            pod: &[("cpu", 500)],
            mirror: true,
            expect: CapDecision::Allow,
        },
        Case {
            name: "no cap (no policy, opted out, or no requestCap) allows",
            cap: None,
            raw: &[("cpu", 4000)],
            requested: &[("cpu", 9000)],
            pod: &[("cpu", 500)],
            mirror: false,
            expect: CapDecision::Allow,
        },
        Case {
            name: "a resource without raw allocatable is not checked",
            cap: Some(cap(&[("memory", 100)], CapMode::Enforce)),
            raw: &[("cpu", 4000)],
            requested: &[("memory", 9 * GI)],
            pod: &[("memory", GI)],
            mirror: false,
            expect: CapDecision::Allow,
        },
        Case {
            name: "sums too large saturate and are over the cap",
            cap: cpu110(),
            raw: &[("cpu", 4000)],
            requested: &[("cpu", u128::MAX)],
            pod: &[("cpu", 1)],
            mirror: false,
            expect: CapDecision::Deny(format!(
                "node worker-7: cpu requests would reach {}.455 of a cap of 4.4 (110% of 4); pod \
                 web-5 asks 0.001",
                u128::MAX / 1000
            )),
        },
    ];
    for case in cases {
        let (raw, requested, pod) = (units(case.raw), units(case.requested), units(case.pod));
        let placement = Placement {
            node: "worker-7",
            pod: "web-5",
            cap: case.cap.as_ref(),
            raw: &raw,
            requested: &requested,
            pod_requests: &pod,
            mirror: case.mirror,
        };
        assert_eq!(check(&placement), case.expect, "{}", case.name);
    }
}

#[test]
fn amounts_read_as_a_person_reads_them() {
    let cases: &[(&str, u128, Round, &str)] = &[
        ("cpu", 0, Round::Up, "0"),
        ("cpu", 1, Round::Up, "0.001"),
        ("cpu", 500, Round::Down, "0.5"),
        ("cpu", 1250, Round::Down, "1.25"),
        ("cpu", 64_000, Round::Down, "64"),
        ("memory", 1000, Round::Up, "1000"),
        ("memory", MI, Round::Up, "1Mi"),
        ("memory", MI + 1, Round::Up, "1.001Mi"),
        ("memory", MI + 1, Round::Down, "1Mi"),
        ("memory", 1536 * MI, Round::Down, "1.5Gi"),
        ("memory", 3 * GI - 1, Round::Down, "2.999Gi"),
        ("memory", 3 * GI - 1, Round::Up, "3Gi"),
        ("example.com/gpu", 3, Round::Up, "3"),
    ];
    for &(resource, value, round, text) in cases {
        assert_eq!(amount(resource, value, round), text, "{resource} {value}");
    }
}

#[test]
fn the_cap_in_force_comes_from_the_nodes_policy() {
    let yaml = "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {name: \
                capped}\nspec:\n  nodeSelector: {matchLabels: {pool: a}}\n  nodeRatios: {cpu: \
                \"1.1\"}\n  requestCap: {cpu: \"110%\"}\n  capMode: Warn\n---\napiVersion: \
                overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {name: plain}\nspec:\n  \
                nodeSelector: {matchLabels: {pool: b}}\n  nodeRatios: {cpu: \"2\"}\n";
    let set = match parse_policy_file(yaml).and_then(PolicySet::new) {
        Ok(set) => set,
        Err(e) => panic!("{e}"),
    };
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let expected = cap(&[("cpu", 110)], CapMode::Warn);
    type Labels<'a> = &'a [(&'a str, &'a str)];
    let cases: &[(Labels<'_>, Option<&CompiledCap>)] = &[
        (&[("pool", "a")], Some(&expected)),
        (&[("pool", "b")], None),
        (&[("pool", "c")], None),
        (&[("pool", "a"), ("overcommit.dev/disabled", "true")], None),
    ];
    for &(pairs, want) in cases {
        let node = labels(pairs);
        assert_eq!(node_cap(&set.for_node(&node)), want, "{pairs:?}");
    }
}
