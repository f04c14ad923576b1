//! The nodes' conditions, read for quiet heartbeats: the object's, and the stored node's read
//! ahead of where the walk is (`look_ahead`), with the jumps that way finds (`read/mod.rs`, "Quiet
//! heartbeats", says what they tolerate and why).

use std::borrow::Cow;
use std::ops::Range;
use std::sync::LazyLock;

use memchr::memmem::Finder;

use overcommit_json::plain;
use overcommit_json::scan::Members;

use super::fields::{Read, value_at};
use overcommit_core::node::heartbeat::Condition;

use crate::admission::request::{OldObjectIn, OldStatusIn};

/// The fields of a Node's status after `capacity` and `allocatable`, in the API server's order
/// (Go's `NodeStatus`).
pub(super) const STATUS_AFTER_QUANTITIES: &[&str] = &[
    "phase",
    "conditions",
    "addresses",
    "daemonEndpoints",
    "nodeInfo",
    "images",
    "volumesInUse",
    "volumesAttached",
    "config",
    "runtimeHandlers",
    "features",
];

/// The fields of a Node's status after `conditions`.
pub(super) const STATUS_AFTER_CONDITIONS: &[&str] = STATUS_AFTER_QUANTITIES.split_at(2).1;

/// What reading the object's conditions found ahead of it, for the rest of the request.
#[derive(Default)]
pub(super) struct Ahead<'a> {
    /// Where the object's value starts.
    pub(super) object_start: usize,
    /// The comma before `oldObject` (`jump_to_old_object`).
    pub(super) old_object_comma: Option<usize>,
    /// The stored node's conditions as read, and the span of their array.
    pub(super) stored: Option<(Range<usize>, Vec<Condition<'a>>)>,
}

/// The object's conditions (quiet heartbeats). A kubelet's status update sends the stored
/// conditions again with new heartbeat times unless a condition changed: so the stored node's
/// conditions are read first (`look_ahead`), and when the object's array is the same bytes
/// but for the heartbeat times, the object's conditions are the stored ones with the object's
/// times; otherwise the array is read as any other.
pub(super) fn object_conditions<'a>(
    body: &'a [u8],
    members: &mut Members<'a>,
    ahead: &mut Ahead<'a>,
) -> Read<Option<Vec<Condition<'a>>>> {
    if let Some((conditions, end)) = look_ahead(body, members.value_start(), ahead) {
        members.value_read(end);
        return Ok(Some(conditions));
    }
    read_conditions(body, members)
}

/// `status.conditions`: an array of plainly written objects of strings without serde_json,
/// field by field; anything else (a `null` time, a field given twice, ...) with serde_json.
pub(super) fn read_conditions<'a>(
    body: &'a [u8],
    members: &mut Members<'a>,
) -> Read<Option<Vec<Condition<'a>>>> {
    let (conditions, end) = conditions_at(body, members.value_start())?;
    members.value_read(end);
    Ok(conditions)
}

/// `read_conditions` of the array starting at `start`, and the index past it.
pub(super) fn conditions_at(
    body: &[u8],
    start: usize,
) -> Read<(Option<Vec<Condition<'_>>>, usize)> {
    let mut conditions = Vec::with_capacity(8);
    let plain = plain::array_in(body, start, |at| {
        let mut condition = Condition::default();
        let end = plain::members_in(body, at, |key, value| condition.set(&key, value))?;
        conditions.push(condition);
        Some(end)
    });
    match plain {
        Some(end) => Ok((Some(conditions), end)),
        None => value_at(body, start),
    }
}

/// The object's conditions (the array at `start`) from the stored node's, when they are the
/// same but for heartbeat times, and the index past the array. The stored node's array is found
/// as `jump_to_old_object` finds `oldObject` and read as any other (kept in `ahead` for when
/// the reader gets there); where it was found does not matter for what this answers: any array
/// of conditions whose bytes are those at `start` but for the heartbeat times reads as the one
/// at `start` would.
pub(super) fn look_ahead<'a>(
    body: &'a [u8],
    start: usize,
    ahead: &mut Ahead<'a>,
) -> Option<(Vec<Condition<'a>>, usize)> {
    const CONDITIONS: &[u8] = b"\"conditions\":[";
    static FINDER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(CONDITIONS));
    let comma = jump_to_old_object(body, ahead.object_start, start)?;
    ahead.old_object_comma = Some(comma);
    // A Node has one `"conditions":[` (its status's; nothing else of a Node is an array under
    // that key and no string can hold the text), at about the same place as in the object.
    let stored_start = comma + b",\"oldObject\":".len();
    let guess = stored_start + start.checked_sub(ahead.object_start)? - (CONDITIONS.len() - 1);
    let found = find_near(&FINDER, body, guess, comma)?;
    let at = found + CONDITIONS.len() - 1;
    // Usually the object's array is the stored one but for the heartbeat times: then only the
    // types and times are needed. Otherwise the stored array is read whole, for the rules.
    if let Some((light, end)) = heartbeats_at(body, at)
        && let Some(same) = same_but_heartbeats(body, start, at..end, &light)
    {
        ahead.stored = Some((at..end, light));
        return Some(same);
    }
    let (Some(stored), end) = conditions_at(body, at).ok()? else {
        return None;
    };
    let same = same_but_heartbeats(body, start, at..end, &stored);
    ahead.stored = Some((at..end, stored));
    same
}

/// The comma before the request's `oldObject` member, searched for from `from` (a byte in the
/// object's status, from its conditions on): `},"oldObject":{` as the API server writes it.
/// Safe there because nothing in between can hold that text: the rest of a Node's status has
/// only fixed field names (no maps keyed by users), its strings cannot hold an unescaped quote,
/// and the status is a Node's last member; the stored node after it cannot hold it either (its
/// maps keyed by users hold strings, not objects). So the first such text after `from` is the
/// only one, wherever it is looked for first: the stored node is mostly the object again (the
/// same images, the same conditions), so `oldObject` is looked for around the middle of what
/// follows the object's start (`object_start`) before everywhere after `from`, which saves
/// searching the ~25 KB of the object's images. `None` when the body is written any other way
/// (the object is then read whole).
pub(super) fn jump_to_old_object(body: &[u8], object_start: usize, from: usize) -> Option<usize> {
    const KEY: &[u8] = b"\"oldObject\":";
    // Built once: building a searcher costs more than searching the window.
    static FINDER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(KEY));
    let middle = object_start + body.len().saturating_sub(object_start) / 2;
    let at = find_near(&FINDER, body, middle, from)?;
    let comma = at.checked_sub(1)?;
    let before = body.get(comma.checked_sub(1)?..at)?;
    (before == b"}," && body.get(at + KEY.len()) == Some(&b'{')).then_some(comma)
}

/// The first `finder` text in `body` at or after `from`, where it is known to be there at most
/// once: looked for first within a few hundred bytes of `guess` (where the stored node being
/// mostly the object again puts it), then everywhere after `from`.
pub(super) fn find_near(
    finder: &Finder<'_>,
    body: &[u8],
    guess: usize,
    from: usize,
) -> Option<usize> {
    const WINDOW: usize = 512;
    let find = |from: usize, to: usize| {
        let found = finder.find(body.get(from..to.min(body.len()))?)?;
        Some(from + found)
    };
    let near = guess.saturating_sub(WINDOW / 2).max(from);
    let to = near + WINDOW + finder.needle().len();
    find(near, to).or_else(|| find(from, body.len()))
}

/// The conditions of the array at `start` as `look_ahead` reads them first: each condition's
/// type and heartbeat time, borrowed, and no other field (left `None`), and the index past the
/// array. Only for arrays the object's array equals byte for byte but for the heartbeat times
/// (`same_but_heartbeats`): the fields not read are then the same on both sides, and `None`
/// compares equal to `None`. `None` where the array is not plainly written (escapes, nulls,
/// a known field given twice, text that is not UTF-8): then it is read whole, as any other.
pub(super) fn heartbeats_at(body: &[u8], start: usize) -> Option<(Vec<Condition<'_>>, usize)> {
    if let Some(found) = heartbeats_found(body, start) {
        return Some(found);
    }
    let mut conditions = Vec::with_capacity(8);
    let end = plain::array_in(body, start, |at| {
        let (condition, end) = heartbeat_members(body, at)?;
        conditions.push(condition);
        Some(end)
    })?;
    // What serde would refuse in the fields not read: text that is not UTF-8.
    std::str::from_utf8(body.get(start..end)?).ok()?;
    Some((conditions, end))
}

/// `heartbeats_at` for an array written as the API server writes a Node's conditions (Go's
/// `NodeCondition`: `type`, `status` and `lastHeartbeatTime` first, in that order, and only
/// strings): each condition's first three strings are read, and the rest of it is jumped over
/// to the next `}` that `,{"type":"` or `],"` and a key the API server writes after the
/// conditions (`STATUS_AFTER_CONDITIONS`) follows. Neither text can be inside a string: each
/// has a quote that is not escaped, followed by text that cannot follow a string's end. So
/// where the layout holds, the first such `}` ends the condition, and nowhere else is one taken
/// for it. Anything else (an escape in those three strings, a `null` time, another order,
/// more than 16 conditions; a Node has 4 or 5) gives `None`: the array is then read member by
/// member.
pub(super) fn heartbeats_found(body: &[u8], start: usize) -> Option<(Vec<Condition<'_>>, usize)> {
    // Where each condition's type and heartbeat time are (start, end of each); taken as text
    // once the whole array is checked as UTF-8, in one go (cheaper than string by string).
    const MOST: usize = 16;
    let mut found = [(0, 0, 0, 0); MOST];
    let mut count = 0;
    let after = |at: usize, text: &[u8]| -> Option<usize> {
        (body.get(at..at + text.len()) == Some(text)).then_some(at + text.len())
    };
    let string =
        |from: usize| -> Option<(usize, usize)> { Some((from, plain::unescaped_end(body, from)?)) };
    let mut at = start + 1;
    let end = loop {
        if count == 0 && body.get(at) == Some(&b']') {
            break at + 1;
        }
        let kind = string(after(at, b"{\"type\":\"")?)?;
        let status = string(after(kind.1 + 1, b",\"status\":\"")?)?;
        let heartbeat = string(after(status.1 + 1, b",\"lastHeartbeatTime\":\"")?)?;
        *found.get_mut(count)? = (kind.0, kind.1, heartbeat.0, heartbeat.1);
        count += 1;
        let mut brace = heartbeat.1 + 1;
        let closed = loop {
            brace += memchr::memchr(b'}', body.get(brace..)?)?;
            if after(brace + 1, b",{\"type\":\"").is_some() {
                break false;
            }
            if after(brace + 1, b"],\"").is_some() && status_key_after_conditions(body, brace + 4) {
                break true;
            }
            brace += 1;
        };
        if closed {
            break brace + 2;
        }
        at = brace + 2;
    };
    let text = std::str::from_utf8(body.get(start..end)?).ok()?;
    let borrowed =
        |from: usize, to: usize| Some(Cow::Borrowed(text.get(from - start..to - start)?));
    let mut conditions = Vec::with_capacity(count);
    for &(kind_start, kind_end, heartbeat_start, heartbeat_end) in found.get(..count)? {
        conditions.push(Condition {
            kind: Some(borrowed(kind_start, kind_end)?),
            last_heartbeat_time: Some(borrowed(heartbeat_start, heartbeat_end)?),
            ..Condition::default()
        });
    }
    Some((conditions, end))
}

/// Whether the member whose key's text starts at `key_start` (just past its quote) is one the
/// API server writes after a Node's conditions.
pub(super) fn status_key_after_conditions(body: &[u8], key_start: usize) -> bool {
    let Some(rest) = body.get(key_start..) else {
        return false;
    };
    let Some(key_end) = memchr::memchr(b'"', rest) else {
        return false;
    };
    let key = rest.get(..key_end);
    rest.get(key_end + 1) == Some(&b':')
        && STATUS_AFTER_CONDITIONS
            .iter()
            .any(|k| Some(k.as_bytes()) == key)
}

/// One condition as `heartbeats_at` reads it, member by member, and the index past it.
pub(super) fn heartbeat_members(body: &[u8], at: usize) -> Option<(Condition<'_>, usize)> {
    const FIELDS: [&[u8]; 6] = [
        b"type",
        b"status",
        b"reason",
        b"message",
        b"lastTransitionTime",
        b"lastHeartbeatTime",
    ];
    let mut condition = Condition::default();
    // serde refuses a field given twice: so does this, for every field it knows.
    let mut given = 0u8;
    let end = plain::unescaped_members_in(body, at, |key, value| {
        let Some(field) = FIELDS.iter().position(|f| *f == key) else {
            return Some(());
        };
        if given & (1 << field) != 0 {
            return None;
        }
        given |= 1 << field;
        let value = || std::str::from_utf8(value).ok().map(Cow::Borrowed);
        match field {
            0 => condition.kind = Some(value()?),
            5 => condition.last_heartbeat_time = Some(value()?),
            _ => {}
        }
        Some(())
    })?;
    Some((condition, end))
}

/// The stored node (starting at `start`) as the rules need it when only its conditions are
/// needed and `look_ahead` read them there: the first `"conditions":[` after `oldObject` is its
/// status's conditions as the API server writes a Node (nothing before them holds that text:
/// the maps keyed by users hold strings, managedFields' keys begin with `f:`, and the status
/// writes capacity, allocatable and phase first). Also the span jumped over (the node before
/// its conditions, not read) and where reading stops: the value of the next member, which must
/// be one the API server writes after the conditions, as `read_status` checks.
pub(super) fn stored_node_ahead<'a>(
    body: &'a [u8],
    start: usize,
    ahead: &mut Ahead<'a>,
) -> Option<(OldObjectIn<'a>, Range<usize>, usize)> {
    let (span, _) = ahead.stored.as_ref()?;
    let key_start = ahead.old_object_comma? + 1;
    if body.get(key_start..start) != Some(b"\"oldObject\":".as_slice()) {
        return None;
    }
    let next = Members::after_value(body, span.end).next_member().ok()??;
    let next_is_after_conditions = STATUS_AFTER_CONDITIONS
        .iter()
        .any(|k| k.as_bytes() == next.key.as_ref());
    if !next_is_after_conditions {
        return None;
    }
    let stop = next.value_start;
    let (span, conditions) = ahead.stored.take()?;
    let status = OldStatusIn {
        conditions: Some(conditions),
    };
    let old = OldObjectIn {
        metadata: None,
        status: Some(status),
    };
    Some((old, start..span.start, stop))
}

/// `stored` (read from `body[stored_span]`) with the heartbeat times of the array at `start`,
/// and the index past that array, if its bytes are those of `stored_span` but for the text of
/// the heartbeat times (each the whole text of a string without escapes, so the two arrays
/// read alike but for those times).
pub(super) fn same_but_heartbeats<'a>(
    body: &'a [u8],
    start: usize,
    stored_span: Range<usize>,
    stored: &[Condition<'a>],
) -> Option<(Vec<Condition<'a>>, usize)> {
    let same = |stored: Range<usize>, at: usize| {
        let other = body.get(at..at.checked_add(stored.len())?)?;
        (body.get(stored.clone())? == other).then_some(at + stored.len())
    };
    let mut incoming = Vec::with_capacity(stored.len());
    let (mut stored_at, mut at) = (stored_span.start, start);
    for condition in stored {
        let mut copy = condition.clone();
        match &condition.last_heartbeat_time {
            None => {}
            // Borrowed from the body: where its text is tells where the object's is.
            Some(Cow::Borrowed(time)) => {
                let time_start = (time.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
                let time_end = time_start + time.len();
                if time_start < stored_at || time_end > stored_span.end {
                    return None;
                }
                at = same(stored_at..time_start, at)?;
                let length = plain::unescaped_end(body, at)? - at;
                let text = std::str::from_utf8(body.get(at..at + length)?).ok()?;
                copy.last_heartbeat_time = Some(Cow::Borrowed(text));
                (stored_at, at) = (time_end, at + length);
            }
            // Written with escapes: read as any other.
            Some(Cow::Owned(_)) => return None,
        }
        incoming.push(copy);
    }
    let end = same(stored_at..stored_span.end, at)?;
    Some((incoming, end))
}
