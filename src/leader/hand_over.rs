//! The hand-over between the node webhook and the compiled policy (in-process mode with
//! `--in-process-policy leader`, docs/architecture.md §7): which node writes the API server
//! sends to the webhook, and when the leader may rewrite the compiled policy. Pure; the leader
//! (`controller`, `in_process_upkeep`) asks it at every step.
//!
//! While the compiled policy has been in force for `in_process::SETTLE` (the leader's own
//! in-process flag), the node webhook carries a second match condition, the complement of what
//! the compiled policy serves (`in_process::Compiled::webhook_condition`, "narrowed"): the API
//! server does not call the webhook for the nodes the compiled policy serves. At every hand-over
//! each node stays served by at least one path, and a write both serve is not compounded (both
//! read the record from the object, rule 3.2):
//! - **narrowing** only once the compiled policy is in force and settled, or kept while it is
//!   the complement of the policy the leader is about to write (a ratio edit moves no node
//!   between the paths) and the live policy and binding are there to be brought to it;
//!   otherwise (a policy edit that moves nodes between the paths, the policy or binding deleted
//!   or edited out of reach, no static policy left, the webhook path) the webhook is widened at
//!   once;
//! - **the policy is rewritten** only while the webhook's narrowing is the complement of the
//!   policy to be written, or while it has been wide for `SETTLE` (time for the API server to
//!   load the configuration): a rewrite never takes a node from the compiled policy while the
//!   API server still skips the webhook for it.

use std::time::Instant;

use super::in_process::SETTLE;

/// The node webhook's narrowing to keep: `want` (the compiled policy's complement; None: no
/// compiled policy wanted, or not one the leader writes) while the compiled policy is in force
/// and settled (`in_force`), or while `live` already is `want` and the live policy and binding
/// can be brought to it by the leader's write (`repairable`). None: wide.
pub fn narrowing<'a>(
    want: Option<&'a str>,
    live: Option<&str>,
    in_force: bool,
    repairable: bool,
) -> Option<&'a str> {
    let want = want?;
    (in_force || (repairable && live == Some(want))).then_some(want)
}

/// Whether the leader may rewrite the compiled policy (`want`: the complement of the one it
/// would write, None for the placeholder) with the webhook's narrowing as it now stands
/// (`live`), wide since `wide_since`.
pub fn may_write_policy(
    want: Option<&str>,
    live: Option<&str>,
    wide_since: Option<Instant>,
    now: Instant,
) -> bool {
    match live {
        Some(live) => want == Some(live),
        None => wide_since.is_some_and(|since| now.saturating_duration_since(since) >= SETTLE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn narrowing_table() {
        let (a, b) = ("A", "B");
        type Case<'a> = (
            &'a str,
            Option<&'a str>,
            Option<&'a str>,
            bool,
            bool,
            Option<&'a str>,
        );
        let cases: [Case<'_>; 9] = [
            ("none wanted, wide", None, None, true, true, None),
            (
                "none wanted, narrowed: widened",
                None,
                Some(a),
                true,
                true,
                None,
            ),
            (
                "wanted, not in force yet: wide",
                Some(a),
                None,
                false,
                true,
                None,
            ),
            (
                "wanted, in force: narrowed",
                Some(a),
                None,
                true,
                true,
                Some(a),
            ),
            (
                "wanted, in force, narrowed",
                Some(a),
                Some(a),
                true,
                true,
                Some(a),
            ),
            (
                "same complement, policy being rewritten: kept",
                Some(a),
                Some(a),
                false,
                true,
                Some(a),
            ),
            (
                "same complement, policy or binding out of reach: widened",
                Some(a),
                Some(a),
                false,
                false,
                None,
            ),
            (
                "another complement, not in force: widened",
                Some(b),
                Some(a),
                false,
                true,
                None,
            ),
            (
                "another complement, in force: narrowed anew",
                Some(b),
                Some(a),
                true,
                true,
                Some(b),
            ),
        ];
        for (what, want, live, in_force, repairable, expected) in cases {
            assert_eq!(
                narrowing(want, live, in_force, repairable),
                expected,
                "{what}"
            );
        }
    }

    #[test]
    fn may_write_policy_table() {
        let now = Instant::now();
        let settled = now.checked_sub(SETTLE);
        let recent = now.checked_sub(Duration::from_secs(1));
        type Case<'a> = (
            &'a str,
            Option<&'a str>,
            Option<&'a str>,
            Option<Instant>,
            bool,
        );
        let cases: [Case<'_>; 8] = [
            ("wide, settled", Some("A"), None, settled, true),
            ("wide, just now", Some("A"), None, recent, false),
            ("wide, not seen yet", Some("A"), None, None, false),
            ("placeholder, wide, settled", None, None, settled, true),
            ("placeholder, narrowed", None, Some("A"), settled, false),
            (
                "narrowed to its complement",
                Some("A"),
                Some("A"),
                None,
                true,
            ),
            ("narrowed to another", Some("B"), Some("A"), settled, false),
            ("placeholder, wide, just now", None, None, recent, false),
        ];
        for (what, want, live, wide_since, expected) in cases {
            assert_eq!(
                may_write_policy(want, live, wide_since, now),
                expected,
                "{what}"
            );
        }
    }
}
