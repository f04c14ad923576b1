use super::*;

fn list(items: &[(&'static str, &str)]) -> Vec<(&'static str, Quantity)> {
    items
        .iter()
        .map(|&(name, text)| match Quantity::parse(text) {
            Ok(q) => (name, q),
            Err(e) => panic!("{text}: {e}"),
        })
        .collect()
}

fn expect(items: &[(&str, u128)]) -> BTreeMap<String, u128> {
    items.iter().map(|&(n, v)| (n.to_string(), v)).collect()
}

/// A container; `sidecar` for an init container with restartPolicy Always.
fn c<'a>(requests: &'a [(&'a str, Quantity)], sidecar: bool) -> ContainerResources<'a> {
    ContainerResources {
        requests,
        restartable: sidecar,
        resize: None,
    }
}

#[test]
fn requests_are_counted_as_the_scheduler_counts_them() {
    let cpu = |text| list(&[("cpu", text)]);
    let (one, two, three, four) = (cpu("1"), cpu("2"), cpu("3"), cpu("4"));
    let both = list(&[("cpu", "1"), ("memory", "1G")]);
    let more = list(&[("cpu", "2"), ("memory", "1G")]);
    let gpu = list(&[("example.com/gpu", "1")]);
    let overhead = list(&[("cpu", "250m"), ("memory", "120Mi")]);
    let pod_cpu = cpu("2");
    let pod_storage = list(&[("ephemeral-storage", "1Gi")]);
    let tiny = list(&[("cpu", "100u"), ("memory", "1.5")]);
    let half_milli = cpu("0.5m");
    let zero = cpu("0");
    let none: &[(&str, Quantity)] = &[];
    let cases: Vec<(&str, PodResources<'_>, BTreeMap<String, u128>)> = vec![
        (
            "containers are summed",
            PodResources {
                containers: vec![c(&both, false), c(&more, false)],
                ..Default::default()
            },
            expect(&[("cpu", 3000), ("memory", 2_000_000_000)]),
        ),
        (
            "an init container larger than the containers sets the request",
            PodResources {
                containers: vec![c(&both, false), c(&more, false)],
                init_containers: vec![c(&four, false), c(&one, false)],
                ..Default::default()
            },
            expect(&[("cpu", 4000), ("memory", 2_000_000_000)]),
        ),
        (
            // KEP-753: a sidecar runs beside the containers and beside the init containers
            // after it: containers 1 + sidecar 1 = 2; the init container after the sidecar
            // needs 2 + 1 = 3.
            "a sidecar is added to the containers and to the init containers after it",
            PodResources {
                containers: vec![c(&one, false)],
                init_containers: vec![c(&one, true), c(&two, false)],
                ..Default::default()
            },
            expect(&[("cpu", 3000)]),
        ),
        (
            "an init container before a sidecar does not run beside it",
            PodResources {
                containers: vec![c(&one, false)],
                init_containers: vec![c(&two, false), c(&three, true)],
                ..Default::default()
            },
            expect(&[("cpu", 4000)]),
        ),
        (
            "overhead is added",
            PodResources {
                containers: vec![c(&both, false)],
                overhead: &overhead,
                ..Default::default()
            },
            expect(&[("cpu", 1250), ("memory", 1_125_829_120)]),
        ),
        (
            "a pod-level request replaces the containers' for that resource only, before overhead",
            PodResources {
                containers: vec![c(&both, false), c(&more, false)],
                pod_level: &pod_cpu,
                overhead: &overhead,
                ..Default::default()
            },
            expect(&[("cpu", 2250), ("memory", 2_125_829_120)]),
        ),
        (
            "a pod-level request for a resource pods cannot set is ignored",
            PodResources {
                containers: vec![c(&one, false)],
                pod_level: &pod_storage,
                ..Default::default()
            },
            expect(&[("cpu", 1000)]),
        ),
        (
            "extended resources are summed in whole units",
            PodResources {
                containers: vec![c(&gpu, false), c(&gpu, false)],
                ..Default::default()
            },
            expect(&[("example.com/gpu", 2)]),
        ),
        (
            "sums are exact and rounded up once, as MilliValue and Value round",
            PodResources {
                containers: vec![
                    c(&half_milli, false),
                    c(&half_milli, false),
                    c(&tiny, false),
                ],
                ..Default::default()
            },
            expect(&[("cpu", 2), ("memory", 2)]),
        ),
        (
            "a zero request is kept",
            PodResources {
                containers: vec![c(&zero, false), c(none, false)],
                ..Default::default()
            },
            expect(&[("cpu", 0)]),
        ),
        (
            "no containers, no requests",
            PodResources::default(),
            expect(&[]),
        ),
    ];
    for (name, pod, expected) in cases {
        assert_eq!(pod_requests(&pod), Ok(expected), "{name}");
    }
}

#[test]
fn a_container_resized_in_place_counts_for_the_most_it_may_use() {
    let (one, two, three) = (
        list(&[("cpu", "1")]),
        list(&[("cpu", "2")]),
        list(&[("cpu", "3")]),
    );
    let resized = |spec, allocated, actuated| ContainerResources {
        requests: spec,
        restartable: false,
        resize: Some(Resize {
            allocated,
            actuated,
        }),
    };
    let cases = [
        (
            "growing: the spec",
            resized(&three, &one, &one),
            false,
            3000,
        ),
        (
            "shrinking: what was allocated",
            resized(&one, &three, &two),
            false,
            3000,
        ),
        (
            "actuated above both",
            resized(&one, &two, &three),
            false,
            3000,
        ),
        (
            "infeasible: not the spec",
            resized(&three, &one, &two),
            true,
            2000,
        ),
    ];
    for (name, container, infeasible, cpu) in cases {
        let pod = PodResources {
            containers: vec![container],
            resize_infeasible: infeasible,
            ..Default::default()
        };
        assert_eq!(pod_requests(&pod), Ok(expect(&[("cpu", cpu)])), "{name}");
    }
}

#[test]
fn the_largest_quantities_sum_exactly() {
    // The API server holds a quantity in an int64 of units; nano-units of many such fit a u128.
    let largest = list(&[("memory", "9223372036854775807")]);
    let pod = PodResources {
        containers: vec![c(&largest, false); 3],
        ..Default::default()
    };
    let three = 3 * u128::from(i64::MAX.unsigned_abs());
    assert_eq!(pod_requests(&pod), Ok(expect(&[("memory", three)])));
}
