//! The pure boundary, held by the build: the core crate's normal dependencies (what it is
//! compiled with, transitively) include no async runtime, HTTP stack, Kubernetes client or TLS.
//! A change that adds one fails here, not in review.

use std::process::Command;

/// Crates that would mean I/O in the core: tokio, hyper, kube's client and runtime, rustls.
const FORBIDDEN: &[&str] = &[
    "tokio",
    "tokio-util",
    "tokio-rustls",
    "hyper",
    "hyper-util",
    "hyper-rustls",
    "h2",
    "mio",
    "kube-client",
    "kube-runtime",
    "rustls",
    "reqwest",
];

#[test]
fn core_depends_on_no_runtime_http_client_or_tls() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let output = Command::new(cargo)
        .args([
            "tree",
            "--locked",
            "-p",
            env!("CARGO_PKG_NAME"),
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "cargo tree failed: {stderr}");
    let tree = String::from_utf8_lossy(&output.stdout);
    let crates: Vec<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert!(
        crates.contains(&"kube-overcommit-json") && crates.contains(&"serde_json"),
        "cargo tree listed what it should (the crate's own dependencies):\n{tree}"
    );
    let found: Vec<&&str> = FORBIDDEN.iter().filter(|f| crates.contains(f)).collect();
    assert!(
        found.is_empty(),
        "the pure core must not depend on {found:?}; `cargo tree -p {} -e normal -i <crate>` shows the path",
        env!("CARGO_PKG_NAME")
    );
}
