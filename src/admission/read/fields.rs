//! The readers of single values the review's walk is made of: strings, maps of strings and
//! structs of the objects read with serde_json (or in place when plainly written), the errors
//! they give (in serde_json's words, at the whole body's line and column), and the walk of one
//! struct's members (`read_struct`).

use std::borrow::Cow;
use std::ops::Range;

use serde::Deserialize;
use serde::de::{DeserializeSeed, Visitor};

use overcommit_json::StrMap;
use overcommit_json::borrowed;
use overcommit_json::plain;
use overcommit_json::scan::{self, Code, Members, ScanError};

use crate::admission::request::{KindIn, ResourceIn};

/// Why a body could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ReadError {
    /// Not JSON at all (400 wherever it is); otherwise JSON with a field of the wrong type, a
    /// field twice, or a string that is not valid text (400 in the envelope, fail open in the
    /// objects).
    pub(super) syntax: bool,
    pub(super) message: String,
}

pub(super) type Read<T> = Result<T, ReadError>;

pub(super) fn scan_error(body: &[u8]) -> impl Fn(ScanError) -> ReadError + '_ {
    move |e| ReadError {
        syntax: e.code != Code::InvalidUnicode,
        message: e.describe(body),
    }
}

/// What a string spells (UTF-8, paired surrogates) is checked only where serde_json reads the
/// string, not where it skips it: such an error inside the objects fails the review open (the
/// envelope is still JSON to a reader that skips the objects), as a data error does.
pub(super) fn is_content_error(message: &str) -> bool {
    [
        "invalid unicode code point",
        "lone leading surrogate in hex escape",
        "unexpected end of hex escape",
    ]
    .iter()
    .any(|m| message.starts_with(m))
}

/// A serde_json error on `body[offset..]`, with its position moved to the whole body.
pub(super) fn serde_error(e: &serde_json::Error, body: &[u8], offset: usize) -> ReadError {
    let text = e.to_string();
    let syntax =
        !matches!(e.classify(), serde_json::error::Category::Data) && !is_content_error(&text);
    if e.line() == 0 {
        return ReadError {
            syntax,
            message: text,
        };
    }
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    let message = text.strip_suffix(&suffix).unwrap_or(&text);
    let slice = body.get(offset..).unwrap_or_default();
    let mut line_start = 0;
    for _ in 1..e.line() {
        match memchr::memchr(b'\n', slice.get(line_start..).unwrap_or_default()) {
            Some(k) => line_start += k + 1,
            None => break,
        }
    }
    let (line, column) = scan::position(body, offset + line_start + e.column());
    ReadError {
        syntax,
        message: format!("{message} at line {line} column {column}"),
    }
}

/// The current member's value, read with serde_json straight from the body (one pass: serde
/// finds its end).
pub(super) fn field<'a, T: Deserialize<'a>>(body: &'a [u8], members: &mut Members<'a>) -> Read<T> {
    let (value, end) = value_at(body, members.value_start())?;
    members.value_read(end);
    Ok(value)
}

/// The value starting at `start`, read with serde_json, and the index past it.
pub(super) fn value_at<'a, T: Deserialize<'a>>(body: &'a [u8], start: usize) -> Read<(T, usize)> {
    let mut values =
        serde_json::Deserializer::from_slice(body.get(start..).unwrap_or_default()).into_iter();
    match values.next() {
        Some(Ok(value)) => Ok((value, start + values.byte_offset())),
        Some(Err(e)) => Err(serde_error(&e, body, start)),
        None => Err(scan_error(body)(ScanError::at(Code::EofValue, body.len()))),
    }
}

/// Members `names` of an object of plain strings (each at most once; others skipped), read in
/// place; `None` where serde_json must read it (a repeated member, null, a value that is not a
/// string, an escape), and then nothing is marked read.
pub(super) fn plain_members<'a, const N: usize>(
    body: &'a [u8],
    members: &mut Members<'a>,
    names: [&str; N],
) -> Option<[Option<Cow<'a, str>>; N]> {
    let mut found = [const { None }; N];
    let end = plain::members_in(body, members.value_start(), |key, value| {
        match names.iter().position(|name| *name == key.as_ref()) {
            Some(at) => found.get_mut(at)?.replace(value).is_none().then_some(()),
            None => Some(()),
        }
    })?;
    members.value_read(end);
    Some(found)
}

/// `request.kind` (`{"group", "version", "kind"}`).
pub(super) fn kind_in<'a>(body: &'a [u8], members: &mut Members<'a>) -> Read<Option<KindIn<'a>>> {
    match plain_members(body, members, ["group", "kind"]) {
        Some([group, kind]) => Ok(Some(KindIn { group, kind })),
        None => field::<Option<KindIn<'a>>>(body, members),
    }
}

/// `request.resource` (`{"group", "version", "resource"}`).
pub(super) fn resource_in<'a>(
    body: &'a [u8],
    members: &mut Members<'a>,
) -> Read<Option<ResourceIn<'a>>> {
    match plain_members(body, members, ["group", "resource"]) {
        Some([group, resource]) => Ok(Some(ResourceIn { group, resource })),
        None => field::<Option<ResourceIn<'a>>>(body, members),
    }
}

/// A string field, borrowed from the body when it has no escapes.
#[derive(Deserialize)]
#[serde(transparent)]
pub(super) struct Text<'a>(
    #[serde(borrow, deserialize_with = "borrowed::option_str")] Option<Cow<'a, str>>,
);

pub(super) fn text<'a>(body: &'a [u8], members: &mut Members<'a>) -> Read<Option<Cow<'a, str>>> {
    if let Some((text, end)) = plain::string_in(body, members.value_start()) {
        members.value_read(end);
        return Ok(Some(Cow::Borrowed(text)));
    }
    field::<Text<'a>>(body, members).map(|t| t.0)
}

/// A map of strings (labels, annotations, quantities), borrowed from the body where it can be.
#[derive(Deserialize)]
#[serde(transparent)]
pub(super) struct Map<'a>(
    #[serde(borrow, deserialize_with = "borrowed::option_str_map")] Option<StrMap<'a>>,
);

pub(super) fn str_map<'a>(body: &'a [u8], members: &mut Members<'a>) -> Read<Option<StrMap<'a>>> {
    if let Some((map, end)) = plain::map_in(body, members.value_start()) {
        members.value_read(end);
        return Ok(Some(map));
    }
    field::<Map<'a>>(body, members).map(|m| m.0)
}

/// serde_json's own error for a value that is neither an object nor null where a struct is
/// read ("invalid type: integer `5`, expected struct MetaIn").
pub(super) struct ExpectStruct(&'static str);

impl<'de> Visitor<'de> for ExpectStruct {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "struct {}", self.0)
    }
}

impl<'de> DeserializeSeed<'de> for ExpectStruct {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        let name = self.0;
        d.deserialize_struct(name, &[], self)
    }
}

pub(super) fn not_a_struct(body: &[u8], span: Range<usize>, name: &'static str) -> ReadError {
    let start = span.start;
    let mut de = serde_json::Deserializer::from_slice(body.get(span).unwrap_or_default());
    match ExpectStruct(name).deserialize(&mut de) {
        Err(e) => serde_error(&e, body, start),
        Ok(()) => ReadError {
            syntax: false,
            message: format!("expected struct {name}"),
        },
    }
}

/// Where a struct is read (its value starts at `start`):
/// `Ok(None)` for null (the field is then `None`; the caller's `Members` steps over it),
/// `Ok(Some(members))` for an object, serde_json's error for anything else.
pub(super) fn struct_members<'a>(
    body: &'a [u8],
    start: usize,
    name: &'static str,
) -> Read<Option<Members<'a>>> {
    if body.get(start) == Some(&b'{') {
        return Members::new(body, start)
            .map(Some)
            .map_err(scan_error(body));
    }
    let end = scan::skip_value(body, start).map_err(scan_error(body))?;
    if body.get(start..end) == Some(b"null") {
        return Ok(None);
    }
    Err(not_a_struct(body, start..end, name))
}

/// A data error in the objects is kept (the first one) and reading goes on; only the envelope
/// decides between 400 and failing open.
pub(super) fn keep<T>(object_error: &mut Option<String>, read: Read<T>) -> Read<Option<T>> {
    match read {
        Ok(value) => Ok(Some(value)),
        Err(e) if e.syntax => Err(e),
        Err(e) => {
            object_error.get_or_insert(e.message);
            Ok(None)
        }
    }
}

/// `keep` for a value of the objects (starting at `start`) that could not be read: the full
/// parse failed such a review open only if its fallback, which skipped the objects with
/// serde_json's `IgnoredAny`, found the body to be JSON. So the value is checked the same way
/// (error path only) and `members`, if given, continues past it.
pub(super) fn keep_value<'a, T>(
    body: &'a [u8],
    members: Option<&mut Members<'a>>,
    start: usize,
    object_error: &mut Option<String>,
    read: Read<T>,
) -> Read<Option<T>> {
    match read {
        Ok(value) => Ok(Some(value)),
        Err(e) if e.syntax => Err(e),
        Err(e) => {
            let slice = body.get(start..).unwrap_or_default();
            let mut values =
                serde_json::Deserializer::from_slice(slice).into_iter::<serde::de::IgnoredAny>();
            let end = match values.next() {
                Some(Ok(_)) => start + values.byte_offset(),
                Some(Err(json)) => {
                    return Err(ReadError {
                        syntax: true,
                        ..serde_error(&json, body, start)
                    });
                }
                None => return Err(scan_error(body)(ScanError::at(Code::EofValue, body.len()))),
            };
            if let Some(members) = members {
                members.value_read(end);
            }
            object_error.get_or_insert(e.message);
            Ok(None)
        }
    }
}

/// What a field reader of [`read_struct`] says after its field.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum After {
    /// Go on with the struct.
    Next,
    /// The decision needs nothing more from the body: stop at the next member if its key is
    /// one of these (see `read_status`), after checking that it is not a second copy of a
    /// read field; otherwise read on.
    EnoughIfNextIs(&'static [&'static str]),
    /// Reading stopped inside this field's value, at this index.
    Stopped(usize),
}

/// How far a struct was read.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Ended {
    /// To its closing brace; the index past it.
    Closed(usize),
    /// Not to its end: reading stopped at this index (the first byte of a member's value) and
    /// the rest of the body is unread.
    Stopped(usize),
}

/// A struct of the objects, whose value starts at `start`: each member named in `fields` is
/// read by `read_field(struct, name, members)` (the member's value is the current one of
/// `members`), every other member is skipped, and a field given twice is refused as serde's
/// derive refuses it. Null is `None`. `jump(struct, key, value_start)` may name the struct's
/// closing brace at a skipped member (`no_jump`: never). Returns the struct and how far it was
/// read.
pub(super) fn read_struct<'a, T: Default>(
    body: &'a [u8],
    start: usize,
    name: &'static str,
    fields: &[&'static str],
    mut read_field: impl FnMut(&mut T, &str, &mut Members<'a>) -> Read<After>,
    mut jump: impl FnMut(&T, &[u8], usize) -> Option<usize>,
) -> Read<Option<(T, Ended)>> {
    let Some(mut members) = struct_members(body, start, name)? else {
        return Ok(None);
    };
    let mut value = T::default();
    // Which of `fields` were given, by their index there (a struct reads at most a few).
    let mut given = 0u32;
    let mut stop_before: &[&str] = &[];
    while let Some(member) = members.next_member().map_err(scan_error(body))? {
        let index = fields
            .iter()
            .position(|f| f.as_bytes() == member.key.as_ref());
        if let Some(index) = index {
            let bit = 1u32.checked_shl(index as u32).unwrap_or(0);
            if given & bit != 0 {
                return Err(duplicate(body, fields[index], member.key_end));
            }
            given |= bit;
        }
        if stop_before
            .iter()
            .any(|k| k.as_bytes() == member.key.as_ref())
        {
            return Ok(Some((value, Ended::Stopped(member.value_start))));
        }
        stop_before = &[];
        let Some(index) = index else {
            // Skipped; or, where `jump` knows the closing brace, the rest is jumped over.
            if let Some(brace) = jump(&value, member.key.as_ref(), member.value_start) {
                members.close_at(brace).map_err(scan_error(body))?;
                break;
            }
            continue;
        };
        match read_field(&mut value, fields[index], &mut members)? {
            After::Next => {}
            After::EnoughIfNextIs(keys) => stop_before = keys,
            After::Stopped(at) => return Ok(Some((value, Ended::Stopped(at)))),
        }
    }
    Ok(Some((value, Ended::Closed(members.end()))))
}

/// `read_struct` for the current member of `parent`, which then continues past it (unless
/// reading stopped inside it).
pub(super) fn read_member<'a, T: Default>(
    body: &'a [u8],
    parent: &mut Members<'a>,
    name: &'static str,
    fields: &[&'static str],
    read_field: impl FnMut(&mut T, &str, &mut Members<'a>) -> Read<After>,
) -> Read<(Option<T>, After)> {
    let read = read_struct(
        body,
        parent.value_start(),
        name,
        fields,
        read_field,
        no_jump,
    );
    continue_past_member(parent, read?)
}

/// `parent` continues past its current member, read as `read` says (unless reading stopped
/// inside it).
pub(super) fn continue_past_member<T>(
    parent: &mut Members<'_>,
    read: Option<(T, Ended)>,
) -> Read<(Option<T>, After)> {
    match read {
        None => Ok((None, After::Next)),
        Some((value, Ended::Closed(end))) => {
            parent.value_read(end);
            Ok((Some(value), After::Next))
        }
        Some((value, Ended::Stopped(at))) => Ok((Some(value), After::Stopped(at))),
    }
}

/// For `read_struct`: every member not read is stepped over.
pub(super) fn no_jump<T>(_: &T, _: &[u8], _: usize) -> Option<usize> {
    None
}

/// serde's derive refuses a field given twice: `seen` is whether this one was given before.
pub(super) fn once(seen: &mut bool, body: &[u8], name: &str, key_end: usize) -> Read<()> {
    if *seen {
        return Err(duplicate(body, name, key_end));
    }
    *seen = true;
    Ok(())
}

/// serde_json's error for a field given twice (its key ends at `key_end`).
fn duplicate(body: &[u8], name: &str, key_end: usize) -> ReadError {
    let (line, column) = scan::position(body, key_end);
    ReadError {
        syntax: false,
        message: format!("duplicate field `{name}` at line {line} column {column}"),
    }
}
