//! The cost of `admission::handle` alone, for instruction counts under callgrind (repeatable on a
//! loaded machine, unlike wall time):
//!
//!   cargo build --release --example review_cost
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!       target/release/examples/review_cost bench/policy.yaml bench/payloads/node-55k.json 101
//!
//! Run it with 1 and with N+1 iterations: the difference of the two totals over N is the cost of
//! one review, without process start-up and policy parsing. Also prints wall time per review.
//! `HEARTBEAT_REFRESH_SECS=300` measures with quiet heartbeats on, as `serve` runs by default.

use std::time::Instant;

use anyhow::{Context, bail};
use kube_overcommit::admission::{self, Settings};
use overcommit_core::policy::{PolicySet, parse_policy_file};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, policy_file, payload_file, iterations] = args.as_slice() else {
        bail!("usage: review_cost POLICY_FILE PAYLOAD_FILE ITERATIONS");
    };
    let policies = parse_policy_file(&std::fs::read_to_string(policy_file)?)
        .and_then(PolicySet::new)
        .context("policy file")?;
    let body = std::fs::read(payload_file).with_context(|| format!("reading {payload_file}"))?;
    let iterations: u32 = iterations.parse().context("ITERATIONS")?;
    // Quiet heartbeats off unless HEARTBEAT_REFRESH_SECS is set: `serve`'s default is 5m, so
    // HEARTBEAT_REFRESH_SECS=300 measures what `make bench` serves (the payloads' heartbeats are
    // old: read and compared, not kept).
    let refresh_secs: u64 = match std::env::var("HEARTBEAT_REFRESH_SECS") {
        Ok(text) => text.parse().context("HEARTBEAT_REFRESH_SECS")?,
        Err(_) => 0,
    };
    let settings = Settings {
        own_namespace: "kube-overcommit".into(),
        heartbeat_refresh: std::time::Duration::from_secs(refresh_secs),
        ..Settings::default()
    };
    let start = Instant::now();
    let mut answered = 0usize;
    for _ in 0..iterations {
        let handled = admission::handle(&body, &policies, &settings);
        answered += handled.body.len();
        std::hint::black_box(&handled);
    }
    let elapsed = start.elapsed();
    eprintln!(
        "{payload_file}: {iterations} reviews, {:.2} us each, {answered} answer bytes",
        elapsed.as_secs_f64() * 1e6 / f64::from(iterations.max(1))
    );
    Ok(())
}
