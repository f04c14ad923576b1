//! kube-overcommit: a mutating admission webhook that makes chosen nodes look larger
//! to the scheduler. See docs/architecture.md for the architecture; module map:
//!
//! - the rules, pure: the workspace crate `overcommit_core` (policies, quantities, the node and
//!   pod rules, JSON Patch), with no async runtime, Kubernetes client or TLS in its dependencies;
//! - the fast JSON reader: the workspace crate `overcommit_json` (knows JSON, not Kubernetes);
//! - `admission`: AdmissionReview in, response out (reads reviews with `overcommit_json`,
//!   decides with `overcommit_core`), the fail-open guard;
//! - I/O at the edges: `server`, `probes`, `sources`, `leader`, `cli`.
#![forbid(unsafe_code)]

pub mod accept;
pub mod admission;
pub mod app;
pub mod cli;
pub mod compile_in_process;
pub mod duration;
pub mod events;
pub mod leader;
pub mod metrics;
pub mod mode;
pub mod placement;
pub mod pods;
pub mod probes;
pub mod relief;
pub mod review;
pub mod review_relief;
pub mod review_usage;
pub mod server;
pub mod shutdown;
pub mod sources;
pub mod status;
#[cfg(test)]
pub(crate) mod temp_dir;
pub mod watch;
pub mod webhook;
