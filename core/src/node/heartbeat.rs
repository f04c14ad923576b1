//! Quiet heartbeats: an overcommitted node costs etcd no more writes than a plain one. Pure.
//!
//! Once allocatable is inflated, the kubelet's own status always differs from the stored one,
//! so it PATCHes its status every `nodeStatusUpdateFrequency` (10 s) instead of every
//! `nodeStatusReportFrequency` (5 min) when nothing changed. Those PATCHes differ from the
//! stored node only in allocatable (which the rule writes back as stored) and the conditions'
//! `lastHeartbeatTime`. Mutating admission runs inside the storage's GuaranteedUpdate, and the
//! storage skips a write whose bytes equal the stored object (no new resourceVersion, no watch
//! event): so putting the stored heartbeat times back turns such a PATCH into a no-op.
//!
//! The rule, for a status update of a node a policy selects: each condition whose stored
//! counterpart (same `type`) has the same status, reason, message and lastTransitionTime, and
//! whose stored `lastHeartbeatTime` is younger than the refresh period at the time of the
//! review, gets the stored `lastHeartbeatTime` back. A stored time in the future (clock skew)
//! counts as young only up to the refresh period. Any other condition, and every other field,
//! goes through as sent: a real change is stored at once, and a heartbeat at least every refresh
//! period (plus one kubelet period), as on a node without the webhook. Node health comes from
//! the node's Lease, which this never touches.

use std::borrow::Cow;
use std::time::Duration;

use overcommit_json::borrowed;
use serde::Deserialize;
use serde_json::Value;

use crate::Account;
use crate::patch::PatchOp;

/// A node condition as read from a review: every field optional (the API server writes a zero
/// time as `null`), borrowed from the body where it can be.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition<'a> {
    #[serde(
        rename = "type",
        borrow,
        default,
        deserialize_with = "borrowed::option_str"
    )]
    pub kind: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    pub status: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    pub reason: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    pub message: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    pub last_transition_time: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed::option_str")]
    pub last_heartbeat_time: Option<Cow<'a, str>>,
}

impl<'a> Condition<'a> {
    /// Sets the field named `key` (JSON name) from a condition read member by member (the
    /// reader's fast path); other members are ignored, as serde ignores them. `None` for a
    /// field given twice, which serde refuses: the caller then leaves the value to serde.
    pub fn set(&mut self, key: &str, value: Cow<'a, str>) -> Option<()> {
        let slot = match key {
            "type" => &mut self.kind,
            "status" => &mut self.status,
            "reason" => &mut self.reason,
            "message" => &mut self.message,
            "lastTransitionTime" => &mut self.last_transition_time,
            "lastHeartbeatTime" => &mut self.last_heartbeat_time,
            _ => return Some(()),
        };
        if slot.is_some() {
            return None;
        }
        *slot = Some(value);
        Some(())
    }
}

/// When the review happens and how long a stored heartbeat may stand in for the kubelet's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quiet {
    /// The time of the review, in milliseconds since the Unix epoch.
    pub now_ms: i64,
    /// `--heartbeat-refresh`: the kubelet's nodeStatusReportFrequency (default 5 min). Zero
    /// turns quiet heartbeats off.
    pub refresh: Duration,
}

/// What happened to one condition's heartbeat, for `review --explain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatLine {
    /// The condition's type.
    pub condition: String,
    pub verdict: Verdict,
}

/// Why a condition's heartbeat was kept as stored or went through as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Set back to the stored time, this old at the review.
    Kept { stored_age_ms: i64 },
    /// Already the stored time: nothing to do.
    AsStored,
    /// The stored node has no condition of this type.
    NotStored,
    /// This field differs from the stored condition's: a real change.
    Changed(&'static str),
    /// The stored heartbeat is at least the refresh period old (or this far in the future).
    StoredTooOld { stored_age_ms: i64 },
    /// The stored heartbeat time is missing (a zero time) or not a timestamp.
    Unreadable,
}

/// The heartbeats to put back in `incoming` (the object of a node status update) from `stored`
/// (its oldObject): patch operations appended to `patch`, whether any was kept, and, with
/// `Account::Full`, a line per incoming condition.
pub fn keep_stored(
    incoming: &[Condition<'_>],
    stored: &[Condition<'_>],
    quiet: Quiet,
    account: Account,
    patch: &mut Vec<PatchOp>,
) -> (bool, Vec<HeartbeatLine>) {
    let mut kept = false;
    let mut lines = Vec::new();
    // The kubelet writes one heartbeat time into every condition: read once.
    let mut last_read = None;
    for (index, condition) in incoming.iter().enumerate() {
        let verdict = verdict(condition, stored, quiet, &mut last_read);
        if let Verdict::Kept { .. } = verdict
            && let Some(time) = stored_heartbeat(condition, stored)
        {
            kept = true;
            patch.push(PatchOp::Add {
                path: heartbeat_path(index),
                value: Value::String(time.to_string()),
            });
        }
        if account == Account::Full {
            lines.push(HeartbeatLine {
                condition: condition.kind.as_deref().unwrap_or_default().to_string(),
                verdict,
            });
        }
    }
    (kept, lines)
}

/// `/status/conditions/INDEX/lastHeartbeatTime` (what `pointer` makes of those segments: none
/// needs an escape): a constant for the first ten (a kubelet writes five conditions), else in
/// one allocation.
fn heartbeat_path(index: usize) -> Cow<'static, str> {
    const FIRST: [&str; 10] = [
        "/status/conditions/0/lastHeartbeatTime",
        "/status/conditions/1/lastHeartbeatTime",
        "/status/conditions/2/lastHeartbeatTime",
        "/status/conditions/3/lastHeartbeatTime",
        "/status/conditions/4/lastHeartbeatTime",
        "/status/conditions/5/lastHeartbeatTime",
        "/status/conditions/6/lastHeartbeatTime",
        "/status/conditions/7/lastHeartbeatTime",
        "/status/conditions/8/lastHeartbeatTime",
        "/status/conditions/9/lastHeartbeatTime",
    ];
    if let Some(path) = FIRST.get(index) {
        return Cow::Borrowed(path);
    }
    const HEAD: &str = "/status/conditions/";
    const TAIL: &str = "/lastHeartbeatTime";
    // The index's digits, last first.
    let mut digits = [0u8; 20];
    let (mut rest, mut count) = (index, 0);
    while let Some(slot) = digits.get_mut(count) {
        *slot = b'0' + (rest % 10) as u8;
        count += 1;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    let mut path = String::with_capacity(HEAD.len() + count + TAIL.len());
    path.push_str(HEAD);
    for &digit in digits.iter().take(count).rev() {
        path.push(char::from(digit));
    }
    path.push_str(TAIL);
    Cow::Owned(path)
}

fn counterpart<'s, 'a>(
    condition: &Condition<'_>,
    stored: &'s [Condition<'a>],
) -> Option<&'s Condition<'a>> {
    let kind = condition.kind.as_deref()?;
    stored.iter().find(|s| s.kind.as_deref() == Some(kind))
}

fn stored_heartbeat<'s>(condition: &Condition<'_>, stored: &'s [Condition<'_>]) -> Option<&'s str> {
    counterpart(condition, stored)?
        .last_heartbeat_time
        .as_deref()
}

/// `last_read`: the last stored time read and its value, which the next condition's usually
/// repeats.
fn verdict<'s>(
    condition: &Condition<'_>,
    stored: &'s [Condition<'_>],
    quiet: Quiet,
    last_read: &mut Option<(&'s str, Option<i64>)>,
) -> Verdict {
    let Some(old) = counterpart(condition, stored) else {
        return Verdict::NotStored;
    };
    // The fields a real change shows in, by their JSON names.
    let fields = [
        ("status", &condition.status, &old.status),
        ("reason", &condition.reason, &old.reason),
        ("message", &condition.message, &old.message),
        (
            "lastTransitionTime",
            &condition.last_transition_time,
            &old.last_transition_time,
        ),
    ];
    if let Some((field, _, _)) = fields.iter().find(|(_, new, old)| new != old) {
        return Verdict::Changed(field);
    }
    let Some(kept) = old.last_heartbeat_time.as_deref() else {
        return Verdict::Unreadable;
    };
    if condition.last_heartbeat_time.as_deref() == Some(kept) {
        return Verdict::AsStored;
    }
    // Only the stored time is read: it is what would be written.
    let kept_ms = match *last_read {
        Some((text, ms)) if text == kept => ms,
        _ => {
            let ms = timestamp_ms(kept);
            *last_read = Some((kept, ms));
            ms
        }
    };
    let Some(kept_ms) = kept_ms else {
        return Verdict::Unreadable;
    };
    let stored_age_ms = quiet.now_ms.saturating_sub(kept_ms);
    let refresh_ms = i64::try_from(quiet.refresh.as_millis()).unwrap_or(i64::MAX);
    if stored_age_ms.unsigned_abs() < refresh_ms.unsigned_abs() {
        Verdict::Kept { stored_age_ms }
    } else {
        Verdict::StoredTooOld { stored_age_ms }
    }
}

/// An RFC 3339 time (`2026-11-24T01:41:17Z`, as the API server writes metav1.Time), in
/// milliseconds since the Unix epoch.
fn timestamp_ms(text: &str) -> Option<i64> {
    utc_seconds_ms(text).or_else(|| {
        text.parse::<jiff::Timestamp>()
            .ok()
            .map(|t| t.as_millisecond())
    })
}

/// `YYYY-MM-DDTHH:MM:SSZ`, the one form the API server writes metav1.Time in, read directly
/// (a general RFC 3339 parser costs several times more, once per condition per review);
/// `None` for anything else, which `timestamp_ms` leaves to jiff.
fn utc_seconds_ms(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    let at = |i: usize| b.get(i).copied();
    let separators = [
        (4, b'-'),
        (7, b'-'),
        (10, b'T'),
        (13, b':'),
        (16, b':'),
        (19, b'Z'),
    ];
    if b.len() != 20 || separators.iter().any(|&(i, c)| at(i) != Some(c)) {
        return None;
    }
    let number = |from: usize, to: usize| {
        b.get(from..to)?.iter().try_fold(0i64, |n, &d| {
            d.is_ascii_digit().then(|| n * 10 + i64::from(d - b'0'))
        })
    };
    let (year, month, day) = (number(0, 4)?, number(5, 7)?, number(8, 10)?);
    let (hour, minute, second) = (number(11, 13)?, number(14, 16)?, number(17, 19)?);
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        1..=12 => 31,
        _ => return None,
    };
    if day < 1 || day > month_days || hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    // Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
    let y = if month <= 2 { year - 1 } else { year };
    let (era, year_of_era) = (y.div_euclid(400), y.rem_euclid(400));
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    Some((days * 86_400 + hour * 3_600 + minute * 60 + second) * 1_000)
}

impl HeartbeatLine {
    /// "Ready: heartbeat kept: stored 40s old, refresh 5m".
    pub fn explain(&self, refresh: Duration) -> String {
        let age = |ms: i64| match ms {
            ms if ms < 0 => format!("{} in the future", seconds((-ms) as u64)),
            ms => format!("{} old", seconds(ms as u64)),
        };
        let refresh = seconds(refresh.as_millis() as u64);
        let what = match &self.verdict {
            Verdict::Kept { stored_age_ms } => format!(
                "heartbeat kept: stored {}, refresh {refresh}",
                age(*stored_age_ms)
            ),
            Verdict::AsStored => "heartbeat as stored".to_string(),
            Verdict::NotStored => "heartbeat sent: no stored condition of this type".to_string(),
            Verdict::Changed(field) => format!("heartbeat sent: {field} changed"),
            Verdict::StoredTooOld { stored_age_ms } => format!(
                "heartbeat sent: stored {}, refresh {refresh}",
                age(*stored_age_ms)
            ),
            Verdict::Unreadable => {
                "heartbeat sent: the stored heartbeat time is missing or unreadable".to_string()
            }
        };
        format!("{}: {what}", self.condition)
    }
}

/// Milliseconds as a short duration: `40s`, `5m`, `4m10s`, `1h2m`, `250ms`.
fn seconds(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, _) => format!("{h}h{m}m"),
    }
}

#[cfg(test)]
mod tests;
