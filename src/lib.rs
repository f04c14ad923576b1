//! kube-overcommit: a mutating admission webhook that makes chosen nodes look larger
//! to the scheduler. See design.md for the architecture; module map:
//!
//! pure (no tokio, no kube client, no I/O): `policy`, `quantity`, `inflate`, `pods`, `patch`, `admission`,
//! `str_map`, `borrowed` and `plain_json` (string maps read from a review)
//! I/O at the edges: `server`, `probes`, `sources`, `leader`, `cli`
#![forbid(unsafe_code)]

pub mod admission;
pub mod app;
pub mod borrowed;
pub mod cli;
pub mod duration;
pub mod inflate;
pub mod leader;
pub mod metrics;
pub mod patch;
pub mod plain_json;
pub mod pods;
pub mod policy;
pub mod probes;
pub mod quantity;
pub mod review;
pub mod server;
pub mod shutdown;
pub mod sources;
pub mod str_map;
pub mod watch;
pub mod webhook;
