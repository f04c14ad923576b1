//! Memory of the usage rule's pod index (`overcommit_core::pod_index`): the resident set size
//! (VmRSS, Linux) grown by indexing N pods spread over nodes, with names shaped like a
//! Deployment's pods. Prints MiB per 10,000 pods for the lead's BENCHMARKS.md (issue 16's target:
//! under 3 MiB per 10,000).
//!
//!     cargo run --release -p kube-overcommit-core --example pod_index_rss [PODS] [NODES]

use overcommit_core::pod_index::{Observed, Phase, PodIndex, Requested};

/// VmRSS in KiB, from /proc/self/status.
fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let pods: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let nodes: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000);
    // Names built before the baseline: a watch holds each pod's name anyway while it applies it.
    let names: Vec<(String, String)> = (0..pods)
        .map(|i| {
            (
                format!(
                    "team-{:03}/service-{:04}-7d9f8c6b5d-{:05x}",
                    i % 300,
                    i / 50,
                    i
                ),
                format!(
                    "ip-10-{}-{}-{}.eu-west-1.compute.internal",
                    (i % nodes) / 256,
                    (i % nodes) % 256,
                    nodes
                ),
            )
        })
        .collect();
    let Some(before) = rss_kib() else {
        eprintln!("no /proc/self/status VmRSS (Linux only)");
        std::process::exit(1);
    };
    let mut index = PodIndex::default();
    for (i, (key, node)) in names.iter().enumerate() {
        let requested = Requested {
            cpu_millis: 100 + (i as u64 % 900),
            memory_bytes: (64 + (i as u64 % 960)) << 20,
        };
        let pod = Observed {
            node: Some(node),
            requested,
            exempt: None,
            phase: Phase::Active,
        };
        index.apply(key, pod);
    }
    let Some(after) = rss_kib() else {
        std::process::exit(1);
    };
    let grown_mib = after.saturating_sub(before) as f64 / 1024.0;
    let per_10k = grown_mib * 10_000.0 / pods as f64;
    println!(
        "pod index: {pods} pods on {nodes} nodes: RSS +{grown_mib:.1} MiB ({per_10k:.2} MiB per 10,000 pods; {:.0} bytes per pod); first node's cpu sum {:?}",
        after.saturating_sub(before) as f64 * 1024.0 / pods as f64,
        index.requested(&names[0].1).0,
    );
}
