//! Every command-line duration flag uses [`duration_arg`] as its clap value parser, the project's
//! one duration grammar (`overcommit_core::duration`: `120` is seconds, else `<integer><unit>`
//! groups with units ms, s, m, h, d); `cli`'s tests check that for every flag clap knows.

use std::time::Duration;

use overcommit_core::duration::parse_duration;

/// The clap value parser of every duration flag.
pub fn duration_arg(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|e| e.to_string())
}
