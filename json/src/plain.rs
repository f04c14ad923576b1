//! The fast way to read plainly written JSON: a string, an object of strings (labels,
//! annotations, quantities) written `{"key":"value",...}` with any JSON whitespace between
//! tokens, and an object of one named string and one named object of strings. Pure.
//!
//! serde_json reading such a map costs ~150 instructions per string (finding its end, then a
//! UTF-8 check of each string on its own, then the map's plumbing), and a string field read on
//! its own ~400; a node status review has ~80 of them, a third of what answering it costs. Here
//! a string's end is found 8 bytes at a time and an object's text is checked as UTF-8 once.
//!
//! Anything else (`null`, another type, a value that is not a string, a raw control character
//! in a string, a trailing comma, invalid UTF-8, a cut body) gives `None`, and the caller reads
//! the value with serde_json: what is accepted, refused and how it is worded stays
//! serde_json's. A `\u` escape is decoded by serde_json itself. So, where this reader answers,
//! serde_json gives the same value: a key given twice keeps its last value, as in
//! `borrowed::str_map`; the tests beside compare the two, also on damaged input.

use std::borrow::Cow;

use crate::map::StrMap;
use crate::scan::skip_ws;
use crate::swar;

/// The first index at or after `from` holding `"`, `\` or a control character (below 0x20), or
/// `bytes.len()`.
fn string_stop(bytes: &[u8], from: usize) -> usize {
    swar::run_end::<false>(bytes, from)
}

/// A string in the text: its quotes at `start` and `end - 1`; `escaped` if it has a backslash.
#[derive(Clone, Copy)]
struct Span {
    start: usize,
    end: usize,
    escaped: bool,
}

/// The string whose opening quote is at `at`; `None` if there is none there, it holds a raw
/// control character (serde_json refuses it) or it is not terminated.
fn string(bytes: &[u8], at: usize) -> Option<Span> {
    if bytes.get(at) != Some(&b'"') {
        return None;
    }
    let mut i = string_stop(bytes, at + 1);
    let mut escaped = false;
    loop {
        match bytes.get(i)? {
            b'"' => {
                return Some(Span {
                    start: at,
                    end: i + 1,
                    escaped,
                });
            }
            // The escape's own byte is stepped over; serde_json checks what it spells. Strings
            // with escapes are JSON in JSON, escapes a few bytes apart: byte by byte.
            b'\\' => {
                escaped = true;
                bytes.get(i + 1)?;
                i += 2;
                while bytes
                    .get(i)
                    .is_some_and(|&byte| !swar::ends_run::<false>(byte))
                {
                    i += 1;
                }
            }
            _ => return None,
        }
    }
}

/// Walks the object whose `{` is at `start`, calling `member` with each key and value; the
/// index past its `}`, or `None` where it is not plainly written or `member` says so.
fn walk(
    bytes: &[u8],
    start: usize,
    mut member: impl FnMut(Span, Span) -> Option<()>,
) -> Option<usize> {
    if bytes.get(start) != Some(&b'{') {
        return None;
    }
    let mut i = skip_ws(bytes, start + 1);
    if bytes.get(i) == Some(&b'}') {
        return Some(i + 1);
    }
    loop {
        let key = string(bytes, i)?;
        i = skip_ws(bytes, key.end);
        if bytes.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(bytes, i + 1);
        let value = string(bytes, i)?;
        member(key, value)?;
        i = skip_ws(bytes, value.end);
        match bytes.get(i)? {
            b',' => i = skip_ws(bytes, i + 1),
            b'}' => return Some(i + 1),
            _ => return None,
        }
    }
}

/// The string's value: borrowed when it has no escapes, else decoded (escapes other than
/// `\\u` here, a string with `\\u` by serde_json, which checks what it spells).
fn text_of<'a>(text: &'a str, span: Span) -> Option<Cow<'a, str>> {
    let inside = text.get(span.start + 1..span.end - 1)?;
    if !span.escaped {
        return Some(Cow::Borrowed(inside));
    }
    // Byte by byte: these are JSON in JSON (`{\"cpu\":\"4\"}`), an escape every few bytes,
    // where copying the runs between escapes costs more than the bytes themselves.
    let mut decoded = Vec::with_capacity(inside.len());
    let mut bytes = inside.as_bytes().iter();
    while let Some(&byte) = bytes.next() {
        if byte != b'\\' {
            decoded.push(byte);
            continue;
        }
        decoded.push(match bytes.next()? {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            _ => {
                let quoted = text.get(span.start..span.end)?;
                return serde_json::from_str::<String>(quoted).ok().map(Cow::Owned);
            }
        });
    }
    // UTF-8 still: only ASCII escapes were replaced, by ASCII bytes.
    String::from_utf8(decoded).ok().map(Cow::Owned)
}

/// The map of the object whose `{` is at `start` of `text`, and the index past its `}`.
fn read_text(text: &str, start: usize) -> Option<(StrMap<'_>, usize)> {
    let mut map = StrMap::new();
    let end = walk(text.as_bytes(), start, |key, value| {
        map.insert(text_of(text, key)?, text_of(text, value)?);
        Some(())
    })?;
    Some((map, end))
}

/// The members a map may have for `read` to keep where they are while it checks the text.
const KEPT_MEMBERS: usize = 32;

const NO_SPAN: Span = Span {
    start: 0,
    end: 0,
    escaped: false,
};

/// The object of strings whose `{` is at `body[start]`, borrowed from the body, and the index
/// past its `}`; `None` where serde_json must read it.
pub fn map_in(body: &[u8], start: usize) -> Option<(StrMap<'_>, usize)> {
    let mut map = StrMap::with_capacity(8);
    let end = members_in(body, start, |key, value| {
        map.insert(key, value);
        Some(())
    })?;
    Some((map, end))
}

/// Calls `member` with each key and value, in order, of the object of strings whose `{` is at
/// `body[start]` (borrowed from the body where they have no escapes; a struct's reader takes
/// them field by field, with no map in between), and returns the index past its `}`; `None`
/// where serde_json must read it, or where `member` says so.
pub fn members_in<'b>(
    body: &'b [u8],
    start: usize,
    mut member: impl FnMut(Cow<'b, str>, Cow<'b, str>) -> Option<()>,
) -> Option<usize> {
    // Walked once to find its end (keeping where up to 32 members are), so that its text is
    // checked as UTF-8 in one go; a larger object is walked again in the text.
    let mut kept = [(NO_SPAN, NO_SPAN); KEPT_MEMBERS];
    let mut members = 0;
    let end = walk(body, start, |key, value| {
        if let Some(slot) = kept.get_mut(members) {
            *slot = (key, value);
        }
        members += 1;
        Some(())
    })?;
    let text = std::str::from_utf8(body.get(start..end)?).ok()?;
    if members > KEPT_MEMBERS {
        let read_to = walk(text.as_bytes(), 0, |key, value| {
            member(text_of(text, key)?, text_of(text, value)?)
        })?;
        return (start + read_to == end).then_some(end);
    }
    let shift = |span: Span| Span {
        start: span.start - start,
        end: span.end - start,
        ..span
    };
    for &(key, value) in kept.get(..members)? {
        member(text_of(text, shift(key))?, text_of(text, shift(value))?)?;
    }
    Some(end)
}

/// Calls `member` with each key and value of the object of strings whose `{` is at
/// `body[start]`, as the bytes between their quotes, and returns the index past its `}`.
/// Nothing is decoded or checked as UTF-8 (the caller checks the text it keeps): for a reader
/// that takes a few members as they are and compares the rest as bytes. `None` where a key or
/// value has an escape, where `members_in` would leave the object to serde_json, or where
/// `member` says so.
pub fn unescaped_members_in<'b>(
    body: &'b [u8],
    start: usize,
    mut member: impl FnMut(&'b [u8], &'b [u8]) -> Option<()>,
) -> Option<usize> {
    walk(body, start, |key, value| {
        if key.escaped || value.escaped {
            return None;
        }
        member(
            body.get(key.start + 1..key.end - 1)?,
            body.get(value.start + 1..value.end - 1)?,
        )
    })
}

/// The index of the closing quote of the string whose text starts at `from` (just past its
/// opening quote), if that text has no escape and no raw control character; `None` otherwise.
pub fn unescaped_end(bytes: &[u8], from: usize) -> Option<usize> {
    let stop = string_stop(bytes, from);
    (bytes.get(stop) == Some(&b'"')).then_some(stop)
}

/// Calls `element` with the index of each element of the array whose `[` is at `body[start]`;
/// `element` reads the element and returns the index past it. Returns the index past the `]`;
/// `None` where serde_json must read it, or where `element` says so.
pub fn array_in(
    body: &[u8],
    start: usize,
    mut element: impl FnMut(usize) -> Option<usize>,
) -> Option<usize> {
    if body.get(start) != Some(&b'[') {
        return None;
    }
    let mut i = skip_ws(body, start + 1);
    if body.get(i) == Some(&b']') {
        return Some(i + 1);
    }
    loop {
        i = skip_ws(body, element(i)?);
        match body.get(i)? {
            b',' => i = skip_ws(body, i + 1),
            b']' => return Some(i + 1),
            _ => return None,
        }
    }
}

/// The string whose opening quote is at `body[start]` if it has no escapes (a string with
/// escapes is left to serde_json), and the index past its closing quote.
pub fn string_in(body: &[u8], start: usize) -> Option<(&str, usize)> {
    let span = string(body, start)?;
    if span.escaped {
        return None;
    }
    let inside = std::str::from_utf8(body.get(span.start + 1..span.end - 1)?).ok()?;
    Some((inside, span.end))
}

/// A whole text that is one object of strings (JSON whitespace around it allowed, as
/// `serde_json::from_str` allows); `None` where serde_json must read it.
pub fn whole_map(text: &str) -> Option<StrMap<'_>> {
    let start = skip_ws(text.as_bytes(), 0);
    let (map, end) = read_text(text, start)?;
    (skip_ws(text.as_bytes(), end) == text.len()).then_some(map)
}

/// A whole text that is `{"<first>": string, "<second>": object of strings}`: exactly those two
/// members, in that order (any JSON whitespace between tokens); `None` where serde_json must
/// read it (other members, another order, escapes in the names, ...).
pub fn string_then_map<'t>(
    text: &'t str,
    first: &str,
    second: &str,
) -> Option<(Cow<'t, str>, StrMap<'t>)> {
    let bytes = text.as_bytes();
    let key_then_colon = |at: usize, name: &str| {
        let key = string(bytes, at)?;
        let plain_name = !key.escaped && text.get(key.start + 1..key.end - 1) == Some(name);
        let colon = skip_ws(bytes, key.end);
        (plain_name && bytes.get(colon) == Some(&b':')).then(|| skip_ws(bytes, colon + 1))
    };
    let open = skip_ws(bytes, 0);
    if bytes.get(open) != Some(&b'{') {
        return None;
    }
    let at = key_then_colon(skip_ws(bytes, open + 1), first)?;
    let string_value = string(bytes, at)?;
    let comma = skip_ws(bytes, string_value.end);
    if bytes.get(comma) != Some(&b',') {
        return None;
    }
    let at = key_then_colon(skip_ws(bytes, comma + 1), second)?;
    let (map, end) = read_text(text, at)?;
    let close = skip_ws(bytes, end);
    if bytes.get(close) != Some(&b'}') {
        return None;
    }
    (skip_ws(bytes, close + 1) == bytes.len()).then_some((text_of(text, string_value)?, map))
}

#[cfg(test)]
mod tests;
