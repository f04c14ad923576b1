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

#[derive(Debug, PartialEq, Eq)]
enum Want {
    Allow,
    Deny(String),
    Warn(String),
    Exempted(Exempt, String),
}

/// The decision's kind and its detail.
fn want(decision: &CapDecision) -> Want {
    match decision {
        CapDecision::Allow => Want::Allow,
        CapDecision::Deny(over) => Want::Deny(over.detail.clone()),
        CapDecision::Warn(over) => Want::Warn(over.detail.clone()),
        CapDecision::Exempted(exempt, over) => Want::Exempted(*exempt, over.detail.clone()),
    }
}

struct Case {
    name: &'static str,
    cap: Option<CompiledCap>,
    raw: &'static [(&'static str, u128)],
    requested: &'static [(&'static str, u128)],
    pod: &'static [(&'static str, u128)],
    exempt: Option<Exempt>,
    /// The decision's kind and its detail (the log's text).
    expect: Want,
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
            exempt: None,
            expect: Want::Deny(worker7.into()),
        },
        Case {
            name: "Warn mode allows with the same text",
            cap: Some(cap(&[("cpu", 110)], CapMode::Warn)),
            raw: &[("cpu", 64_000)],
            requested: &[("cpu", 70_100)],
            pod: &[("cpu", 500)],
            exempt: None,
            expect: Want::Warn(worker7.into()),
        },
        Case {
            name: "reaching the cap exactly is allowed",
            cap: cpu110(),
            raw: &[("cpu", 4000)],
            requested: &[("cpu", 3900)],
            pod: &[("cpu", 500)],
            exempt: None,
            expect: Want::Allow,
        },
        Case {
            name: "one millicore over the cap is denied",
            cap: cpu110(),
            raw: &[("cpu", 4000)],
            requested: &[("cpu", 3901)],
            pod: &[("cpu", 500)],
            exempt: None,
            expect: Want::Deny(
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
            exempt: None,
            expect: Want::Deny(
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
            exempt: None,
            expect: Want::Deny(
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
            exempt: None,
            expect: Want::Deny(
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
            exempt: None,
            expect: Want::Deny(
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
            exempt: None,
            expect: Want::Deny(
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
            exempt: None,
            expect: Want::Allow,
        },
        Case {
            name: "a request of zero is not checked",
            cap: cpu110(),
            raw: &[("cpu", 4000)],
            requested: &[("cpu", 9000)],
            pod: &[("cpu", 0)],
            exempt: None,
            expect: Want::Allow,
        },
        Case {
            name: "a mirror pod is allowed",
            cap: cpu110(),
            raw: &[("cpu", 4000)],
            requested: &[("cpu", 9000)],
            pod: &[("cpu", 500)],
            exempt: Some(Exempt::Mirror),
            expect: Want::Allow,
        },
        Case {
            name: "a DaemonSet's pod over the cap is allowed, with the cap's text",
            cap: cpu110(),
            raw: &[("cpu", 64_000)],
            requested: &[("cpu", 70_100)],
            pod: &[("cpu", 500)],
            exempt: Some(Exempt::DaemonSet),
            expect: Want::Exempted(Exempt::DaemonSet, worker7.into()),
        },
        Case {
            name: "a critical pod over the cap is allowed, also in Warn mode",
            cap: Some(cap(&[("cpu", 110)], CapMode::Warn)),
            raw: &[("cpu", 64_000)],
            requested: &[("cpu", 70_100)],
            pod: &[("cpu", 500)],
            exempt: Some(Exempt::Critical),
            expect: Want::Exempted(Exempt::Critical, worker7.into()),
        },
        Case {
            name: "a DaemonSet's pod under the cap is plainly allowed",
            cap: cpu110(),
            raw: &[("cpu", 4000)],
            requested: &[("cpu", 1000)],
            pod: &[("cpu", 500)],
            exempt: Some(Exempt::DaemonSet),
            expect: Want::Allow,
        },
        Case {
            name: "no cap (no policy, opted out, or no requestCap) allows",
            cap: None,
            raw: &[("cpu", 4000)],
            requested: &[("cpu", 9000)],
            pod: &[("cpu", 500)],
            exempt: None,
            expect: Want::Allow,
        },
        Case {
            name: "a resource without raw allocatable is not checked",
            cap: Some(cap(&[("memory", 100)], CapMode::Enforce)),
            raw: &[("cpu", 4000)],
            requested: &[("memory", 9 * GI)],
            pod: &[("memory", GI)],
            exempt: None,
            expect: Want::Allow,
        },
        Case {
            name: "sums too large saturate and are over the cap",
            cap: cpu110(),
            raw: &[("cpu", 4000)],
            requested: &[("cpu", u128::MAX)],
            pod: &[("cpu", 1)],
            exempt: None,
            expect: Want::Deny(format!(
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
            exempt: case.exempt,
        };
        assert_eq!(want(&check(&placement)), case.expect, "{}", case.name);
    }
}

/// The requester (any tenant, dry runs included) is told its own pod's figures, never the node's
/// sum, cap or raw value; the log's detail keeps them.
#[test]
fn the_requester_sees_no_node_figures() {
    let (raw, requested) = (
        units(&[("cpu", 64_000), ("memory", 8 * GI)]),
        units(&[("cpu", 70_100), ("memory", 8 * GI - 256 * MI)]),
    );
    let pod = units(&[("cpu", 500), ("memory", 512 * MI)]);
    let both = cap(&[("cpu", 110), ("memory", 100)], CapMode::Enforce);
    let placement = |exempt| Placement {
        node: "worker-7",
        pod: "web-5",
        cap: Some(&both),
        raw: &raw,
        requested: &requested,
        pod_requests: &pod,
        exempt,
    };
    let cases: &[(Option<Exempt>, &str)] = &[
        (
            None,
            "node worker-7: cpu requests would exceed the node's placement cap; pod web-5 asks \
             0.5; node worker-7: memory requests would exceed the node's placement cap; pod \
             web-5 asks 512Mi",
        ),
        (
            Some(Exempt::DaemonSet),
            "node worker-7: cpu requests would exceed the node's placement cap; pod web-5 asks \
             0.5; node worker-7: memory requests would exceed the node's placement cap; pod \
             web-5 asks 512Mi; allowed: a DaemonSet's pod is never refused by the cap",
        ),
        (
            Some(Exempt::Critical),
            "node worker-7: cpu requests would exceed the node's placement cap; pod web-5 asks \
             0.5; node worker-7: memory requests would exceed the node's placement cap; pod \
             web-5 asks 512Mi; allowed: a critical pod is never refused by the cap",
        ),
    ];
    for &(exempt, public) in cases {
        let over = match check(&placement(exempt)) {
            CapDecision::Deny(over) | CapDecision::Warn(over) | CapDecision::Exempted(_, over) => {
                over
            }
            CapDecision::Allow => panic!("{exempt:?}: allowed without a word"),
        };
        assert_eq!(over.public, public, "{exempt:?}");
        for figure in ["70.6", "70.4", "64", "8Gi", "8.25Gi", "110%"] {
            assert!(!over.public.contains(figure), "{figure} in {}", over.public);
            assert!(
                over.detail.contains(figure),
                "{figure} not in {}",
                over.detail
            );
        }
    }
}

#[test]
fn exemptions_come_from_what_the_pod_carries() {
    let cases: &[(bool, bool, Option<i32>, Option<Exempt>)] = &[
        (false, false, None, None),
        (false, false, Some(0), None),
        (false, false, Some(1_000_000_000), None),
        (false, false, Some(CRITICAL_PRIORITY - 1), None),
        (
            false,
            false,
            Some(CRITICAL_PRIORITY),
            Some(Exempt::Critical),
        ),
        (false, false, Some(2_000_001_000), Some(Exempt::Critical)),
        (false, true, None, Some(Exempt::DaemonSet)),
        (
            false,
            true,
            Some(CRITICAL_PRIORITY),
            Some(Exempt::DaemonSet),
        ),
        (true, true, Some(CRITICAL_PRIORITY), Some(Exempt::Mirror)),
        (true, false, None, Some(Exempt::Mirror)),
    ];
    for &(mirror, daemonset, priority, expect) in cases {
        assert_eq!(
            Exempt::of(mirror, daemonset, priority),
            expect,
            "{mirror} {daemonset} {priority:?}"
        );
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
