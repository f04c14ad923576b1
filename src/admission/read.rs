//! Reading a review from the request body: the fields the rules use are deserialised by
//! serde_json from their own slices of the body (plain strings and objects of strings first by
//! `overcommit_json::plain`, which leaves anything else to serde_json and answers as it does);
//! everything else is stepped over by `scan`, without building or visiting it token by token, and what
//! comes after the last field a node status review's decision needs is not read at all (the
//! unread tail, below). `oldObject` is read (its `metadata.annotations` only) when the node
//! rule needs the stored annotations: a node review whose object carries neither overcommit
//! annotation.
//!
//! Walked: the review object, `request`, `object`, `object.metadata`, `object.status`, and in
//! the fallback `oldObject` and `oldObject.metadata`. Read with serde_json: `apiVersion`,
//! `kind`, request `uid kind resource subResource name namespace operation`, object
//! `metadata.{namespace,labels,annotations}`, `spec` (the pod rule's containers),
//! `status.{allocatable,capacity}`, and `oldObject.metadata.annotations`.
//!
//! Answers are those of a full serde_json parse of the same structs (the test oracle in
//! `reference.rs`, compared in `equivalence.rs`), except on bodies the API server never sends:
//!
//! - **Tolerated inside skipped values.** A value that is not read is only scanned for its end
//!   (see `scan`). Where a full parse answers 400 (or, for `oldObject`, fails open), this reader
//!   answers as if the skipped value were well-formed when the fault is one of:
//!   - inside a skipped container, the order of its tokens where no string's end is involved:
//!     a missing or extra `,` or `:` (`[1 2]`, `[1,,2]`, `{"a":}`, `{"a":1,}`), a key that is
//!     not a string (`{1:2}`), a number or literal spelt wrong with the characters numbers and
//!     literals use (`01`, `1.`, `1e`, `ture`, `nul`);
//!   - inside a skipped string: a raw control character (a byte below 0x20);
//!   - anywhere in `oldObject` when the rule does not need it (the object carries an
//!     overcommit annotation, or the review is not a node's): all of the above, and wrong types
//!     or duplicate fields in `oldObject.metadata`, which the full parse failed open on.
//!
//!   Still refused there, as by the full parse: an unterminated string, a bad escape (`\x`, a
//!   `\u` without four hex digits), a string not followed by `:`, `,` or a closing bracket, any
//!   other character outside strings, a bracket that does not match or is missing, and a
//!   skipped scalar member of a walked object that is not JSON. After a data error in the
//!   objects, the object is checked with serde_json's `IgnoredAny` as the full parse's fallback
//!   did, so the choice between failing open and 400 is the same.
//!
//!   Safe because the body comes from the API server, which serialises stored objects with
//!   encoding/json (valid JSON, always), and because nothing skipped reaches the decision or
//!   the patch: the patch is computed only from values serde_json read strictly. Damage moves
//!   where a skipped value ends only through its brackets or quotes: a bracket too many or too
//!   few leaves the body unbalanced at its end (refused); a quote damaged into another byte
//!   flips which bytes are inside strings, and the checks above catch that, in practice at the
//!   next string (without them, the walk could go on and read a review with its metadata
//!   swallowed by a skipped value: a different patch). `equivalence.rs` damages every byte of
//!   the small fixtures and samples the large ones (`ADMISSION_DAMAGE_ROUNDS=100`: 3.3 million
//!   damaged reviews) and finds every answer either serde_json's, or, for damage inside a
//!   skipped value, the undamaged answer, an answer without a patch, or 400.
//! - **The unread tail.** The API server writes the request's fields in Go struct order: `uid
//!   kind resource subResource ... name namespace operation userInfo object oldObject dryRun
//!   options`, the object's as `kind apiVersion metadata spec status`, and the status's as
//!   `capacity allocatable phase conditions addresses ... images ...`. Reading stops early on a
//!   node review whose object carries an overcommit annotation (so the rule does not need the
//!   stored annotations), once the envelope's `apiVersion` and `kind` and the request's `uid
//!   kind resource subResource name operation` have been read:
//!   - inside the object, if its `metadata` came before `status` and both `capacity` and
//!     `allocatable` have been read: at the first byte of the value of the status member after
//!     them, if that member is one the API server writes there (`conditions`, `images`, ...:
//!     `read_status` says why). A Node's status is mostly what follows (images alone are
//!     ~89% of a 55 KB review's object), so a node status review is read for its first 2-5 KB
//!     (the envelope, the request's fields, the object's metadata and the two maps);
//!   - otherwise, when the whole object was read without error, at the first byte of
//!     `oldObject`'s value.
//!
//!   From that byte on, nothing is checked, and the answer is the one of the fields read so
//!   far:
//!   - a second copy of a read field (`uid`, `request`, `object`, `metadata`, `allocatable`,
//!     ...) after that point is not seen (the full parse refused it: 400, or failed open
//!     inside `request`);
//!   - `namespace` given only after that point is not seen (a node has none: the API server
//!     omits it; it would only appear in log reasons), nor a node's `spec` after its status
//!     (the node rule does not read it);
//!   - a body cut, or damaged, after that point is not refused (the full parse answered 400),
//!     nor a value of the wrong type there (the full parse failed open). The same holds for
//!     whitespace right before that value, which the API server never writes: damaged into a
//!     byte that can begin a value (`"conditions": [` into `"conditions":1[`), the body reads as
//!     one without whitespace damaged at that byte. hyper reads exactly
//!     `Content-Length` bytes, so a cut body can only come from a broken client, and the
//!     first byte of the value must have arrived.
//!
//!   Nothing unread reaches the decision or the patch: the answer is byte for byte the one of
//!   the undamaged review (`equivalence.rs` checks it for every damage and cut in the tail).
//!   Damage before that point cannot move it to a place where a read value is incomplete: a
//!   stray bracket inside `request` shifts `oldObject` out of it (the body is then read to its
//!   end and refused), and one inside the last quantity map read is caught by the check on the
//!   next member's name. In any other order (fields the decision needs after them, pod
//!   reviews, node reviews without the annotations, a data error in the object) the whole
//!   body is read.
//! - **Quiet heartbeats.** A status update of a node whose heartbeats may be kept needs both
//!   nodes' conditions. When the object's `conditions` are reached, the stored node's are read
//!   first, ahead of where the reader is (`look_ahead`): `oldObject` is found by its text
//!   (`jump_to_old_object`, looked for first around where the object's size puts it), its
//!   conditions by theirs. Of each stored condition written as the API server writes one, only
//!   the type, status and heartbeat time are read; the rest of it is jumped over to its end,
//!   found by its text (`heartbeats_found`). If the object's array is the same bytes but for
//!   the heartbeat times, its conditions are the stored ones with its own times (a kubelet's
//!   PATCH mostly is just that); otherwise it is read as any other array, and the stored one
//!   strictly. So a fault in the jumped parts (a raw control character, a field given twice)
//!   is tolerated only where both arrays carry it in the same bytes, which the API server never
//!   writes; damage to either array alone makes them differ. Then two spans are jumped over,
//!   not read: the object's status after its conditions and the object's closing brace (up
//!   to `oldObject`: a `}` must come before it, whichever bracket it closes), and the stored
//!   node before its conditions; reading stops at the value of the stored status's member
//!   after them. Both spans are tolerated like the unread tail (damage there does not
//!   change the answer), and a body written any other way than the API server writes it (a
//!   space before `oldObject`, another order) is read whole.
//! - **The metadata after its annotations.** On a node review the reader may stop in (the
//!   unread tail, above), once the object's labels and annotations are read, the first
//!   member the API server writes after them (`ownerReferences`, `finalizers`,
//!   `managedFields`: on a Node, its managedFields, ~0.7 KB on the benchmark's node and several
//!   KB on a real kubelet's, ~6 instructions a byte to step over) is not stepped over: the
//!   reader jumps to the metadata's closing brace, found by its text (`},"spec":`, the
//!   object's next member; `metadata_end`). Nothing in that span is checked, and a second
//!   copy of a read field there is not seen: damage there does not change the answer (as in
//!   the unread tail). A body written another way cannot make the jump read anything else:
//!   a span holding `"oldObject":` is not jumped, and if no status is read after the jump (it
//!   lay inside what was jumped over), the object is read again without it.
//! - **No array form of structs.** serde's derive also accepts a struct written as a JSON array
//!   of its fields in order (`["admission.k8s.io/v1","AdmissionReview",{...}]`); this reader
//!   wants objects at the walked levels (400 for the envelope, fail open for the object).
//!
//! Nesting: serde_json's recursion limit (128) applies only to what it deserialises into
//! structs, a few levels here; skipped values (`IgnoredAny` there, the scan here) have no limit,
//! and the scan does not recurse.
//!
//! Error messages keep serde_json's wording and `at line L column C` of the whole body for what
//! serde_json reads; syntax errors found by the scan use serde_json's words at the scan's index.

use std::borrow::Cow;
use std::cell::Cell;
use std::ops::Range;
use std::sync::LazyLock;

use memchr::memmem::Finder;

use serde::Deserialize;
use serde::de::{DeserializeSeed, Visitor};

use overcommit_json::StrMap;
use overcommit_json::borrowed;
use overcommit_json::plain;
use overcommit_json::scan::{self, Code, Members, ScanError};

use super::{
    Condition, KindIn, MetaIn, NodeStatusIn, ObjectIn, OldMetaIn, OldObjectIn, OldStatusIn, Parsed,
    RequestIn, ResourceIn, ReviewResource, check_envelope, classify, describe_object,
};

/// What the rules need from a review beyond the fields every decision reads: the reader asks
/// where it could stop reading, the rules' side answers (`admission::RuleNeeds`), so the
/// reader knows no rule.
pub(super) trait Needs {
    /// Whether a node review whose object carries these annotations needs the stored object's
    /// (`oldObject`'s) annotations too.
    fn stored_annotations(&self, annotations: Option<&StrMap<'_>>) -> bool;
    /// Whether a node status update of a node with these labels needs its conditions and the
    /// stored node's. Always asked with the object's labels, so the same within one review.
    fn conditions(&self, labels: Option<&StrMap<'_>>) -> bool;
}

/// Why a body could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ReadError {
    /// Not JSON at all (400 wherever it is); otherwise JSON with a field of the wrong type, a
    /// field twice, or a string that is not valid text (400 in the envelope, fail open in the
    /// objects).
    syntax: bool,
    message: String,
}

type Read<T> = Result<T, ReadError>;

fn scan_error(body: &[u8]) -> impl Fn(ScanError) -> ReadError + '_ {
    move |e| ReadError {
        syntax: e.code != Code::InvalidUnicode,
        message: e.describe(body),
    }
}

/// What a string spells (UTF-8, paired surrogates) is checked only where serde_json reads the
/// string, not where it skips it: such an error inside the objects fails the review open (the
/// envelope is still JSON to a reader that skips the objects), as a data error does.
fn is_content_error(message: &str) -> bool {
    [
        "invalid unicode code point",
        "lone leading surrogate in hex escape",
        "unexpected end of hex escape",
    ]
    .iter()
    .any(|m| message.starts_with(m))
}

/// A serde_json error on `body[offset..]`, with its position moved to the whole body.
fn serde_error(e: &serde_json::Error, body: &[u8], offset: usize) -> ReadError {
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
fn field<'a, T: Deserialize<'a>>(body: &'a [u8], members: &mut Members<'a>) -> Read<T> {
    let (value, end) = value_at(body, members.value_start())?;
    members.value_read(end);
    Ok(value)
}

/// The value starting at `start`, read with serde_json, and the index past it.
fn value_at<'a, T: Deserialize<'a>>(body: &'a [u8], start: usize) -> Read<(T, usize)> {
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
fn plain_members<'a, const N: usize>(
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
fn kind_in<'a>(body: &'a [u8], members: &mut Members<'a>) -> Read<Option<KindIn<'a>>> {
    match plain_members(body, members, ["group", "kind"]) {
        Some([group, kind]) => Ok(Some(KindIn { group, kind })),
        None => field::<Option<KindIn<'a>>>(body, members),
    }
}

/// `request.resource` (`{"group", "version", "resource"}`).
fn resource_in<'a>(body: &'a [u8], members: &mut Members<'a>) -> Read<Option<ResourceIn<'a>>> {
    match plain_members(body, members, ["group", "resource"]) {
        Some([group, resource]) => Ok(Some(ResourceIn { group, resource })),
        None => field::<Option<ResourceIn<'a>>>(body, members),
    }
}

/// A string field, borrowed from the body when it has no escapes.
#[derive(Deserialize)]
#[serde(transparent)]
struct Text<'a>(#[serde(borrow, deserialize_with = "borrowed::option_str")] Option<Cow<'a, str>>);

fn text<'a>(body: &'a [u8], members: &mut Members<'a>) -> Read<Option<Cow<'a, str>>> {
    if let Some((text, end)) = plain::string_in(body, members.value_start()) {
        members.value_read(end);
        return Ok(Some(Cow::Borrowed(text)));
    }
    field::<Text<'a>>(body, members).map(|t| t.0)
}

/// A map of strings (labels, annotations, quantities), borrowed from the body where it can be.
#[derive(Deserialize)]
#[serde(transparent)]
struct Map<'a>(#[serde(borrow, deserialize_with = "borrowed::option_str_map")] Option<StrMap<'a>>);

fn str_map<'a>(body: &'a [u8], members: &mut Members<'a>) -> Read<Option<StrMap<'a>>> {
    if let Some((map, end)) = plain::map_in(body, members.value_start()) {
        members.value_read(end);
        return Ok(Some(map));
    }
    field::<Map<'a>>(body, members).map(|m| m.0)
}

/// serde_json's own error for a value that is neither an object nor null where a struct is
/// read ("invalid type: integer `5`, expected struct MetaIn").
struct ExpectStruct(&'static str);

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

fn not_a_struct(body: &[u8], span: Range<usize>, name: &'static str) -> ReadError {
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
fn struct_members<'a>(
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

/// Which fields of a struct were seen (serde's derive refuses a field given twice).
#[derive(Default)]
struct Seen(u32);

impl Seen {
    fn all(&self, bits: &[u32]) -> bool {
        bits.iter().all(|bit| self.0 & 1 << bit != 0)
    }

    fn once(&mut self, body: &[u8], bit: u32, name: &str, key_end: usize) -> Read<()> {
        if self.0 & 1 << bit != 0 {
            let (line, column) = scan::position(body, key_end);
            return Err(ReadError {
                syntax: false,
                message: format!("duplicate field `{name}` at line {line} column {column}"),
            });
        }
        self.0 |= 1 << bit;
        Ok(())
    }
}

/// What the top level of the body says.
struct Review<'a> {
    api_version: Option<Cow<'a, str>>,
    kind: Option<Cow<'a, str>>,
    request: Option<Box<RequestIn<'a>>>,
    /// The first error in the objects (they are then not read): the review fails open.
    object_error: Option<String>,
    /// Where reading stopped because the decision needed nothing more (the value of the status
    /// member after the maps and conditions it reads, or of `oldObject`); the bytes from here on
    /// were not read.
    unread_from: Option<usize>,
    /// What was jumped over on the way to the stored conditions (quiet heartbeats); not read.
    jumped: Jumped,
}

/// Spans of the body jumped over on the way to the stored conditions (quiet heartbeats).
#[derive(Default)]
struct Jumped {
    /// The object's status after its conditions, up to `oldObject` (`jump_to_old_object`).
    object_rest: Option<Range<usize>>,
    /// The stored node before its conditions (`stored_node_ahead`).
    stored_head: Option<Range<usize>>,
    /// The object's metadata after its annotations, to its closing brace (`metadata_end`).
    metadata_tail: Option<Range<usize>>,
}

/// Where `parse` stops reading `body` (the tolerance of the unread tail), if it stops early.
#[cfg(test)]
pub(super) fn unread_from(body: &[u8], needs: &dyn Needs) -> Option<usize> {
    read_review(body, needs)
        .ok()
        .and_then(|review| review.unread_from)
}

/// What `parse` jumps over in `body` on its way to `oldObject` (quiet heartbeats), if anything.
#[cfg(test)]
pub(super) fn unread_middle(body: &[u8], needs: &dyn Needs) -> Option<Range<usize>> {
    read_review(body, needs)
        .ok()
        .and_then(|review| review.jumped.object_rest)
}

/// What `parse` jumps over in the stored node on its way to its conditions, if anything.
#[cfg(test)]
pub(super) fn unread_stored_head(body: &[u8], needs: &dyn Needs) -> Option<Range<usize>> {
    read_review(body, needs)
        .ok()
        .and_then(|review| review.jumped.stored_head)
}

/// What `parse` jumps over in the object's metadata after its annotations, if anything.
#[cfg(test)]
pub(super) fn unread_metadata_tail(body: &[u8], needs: &dyn Needs) -> Option<Range<usize>> {
    read_review(body, needs)
        .ok()
        .and_then(|review| review.jumped.metadata_tail)
}

/// Whether the object's conditions (the array at `start`, in the object whose value starts at
/// `object_start`) are taken from the stored node's by comparison (`look_ahead`), and their
/// heartbeat times if so.
#[cfg(test)]
pub(super) fn conditions_compared(
    body: &[u8],
    object_start: usize,
    start: usize,
) -> Option<Vec<Option<String>>> {
    let mut ahead = Ahead {
        object_start,
        ..Ahead::default()
    };
    let (conditions, _) = look_ahead(body, start, &mut ahead)?;
    let times = conditions
        .iter()
        .map(|c| c.last_heartbeat_time.as_deref().map(str::to_string));
    Some(times.collect())
}

/// Read a review body: the decision's input, a review to fail open, or a 400.
pub(super) fn parse<'a>(body: &'a [u8], needs: &dyn Needs) -> Parsed<'a> {
    let review = match read_review(body, needs) {
        Ok(review) => review,
        Err(e) => return Parsed::Bad(format!("body is not an AdmissionReview: {}", e.message)),
    };
    let uid = review.request.as_ref().and_then(|r| r.uid.as_deref());
    if let Err(message) = check_envelope(review.api_version.as_deref(), review.kind.as_deref(), uid)
    {
        return Parsed::Bad(message);
    }
    let Some(request) = review.request else {
        return Parsed::Bad("AdmissionReview has no request".to_string());
    };
    match review.object_error {
        None => Parsed::Review(request),
        Some(error) => Parsed::Unreadable {
            uid: request.uid.as_deref().unwrap_or_default().to_string(),
            resource: classify(request.kind.as_ref(), request.resource.as_ref()),
            operation: request.operation.as_deref().unwrap_or_default().to_string(),
            reason: describe_object(
                request.name.as_deref(),
                request.namespace.as_deref(),
                &format!("object unreadable: {error}"),
            ),
        },
    }
}

fn read_review<'a>(body: &'a [u8], needs: &dyn Needs) -> Read<Review<'a>> {
    let start = scan::skip_ws(body, 0);
    if body.get(start) != Some(&b'{') {
        // Not an object: serde_json says what it is (or why it is not JSON).
        return Err(not_a_struct(body, start..body.len(), "ReviewIn"));
    }
    let mut members = Members::new(body, start).map_err(scan_error(body))?;
    let mut review = Review {
        api_version: None,
        kind: None,
        request: None,
        object_error: None,
        unread_from: None,
        jumped: Jumped::default(),
    };
    let mut seen = Seen::default();
    while let Some(member) = members.next_member().map_err(scan_error(body))? {
        let envelope_known = seen.all(&[0, 1]);
        let mut once = |bit, name| seen.once(body, bit, name, member.key_end);
        match member.key.as_ref() {
            b"apiVersion" => {
                once(0, "apiVersion")?;
                review.api_version = text(body, &mut members)?;
            }
            b"kind" => {
                once(1, "kind")?;
                review.kind = text(body, &mut members)?;
            }
            b"request" => {
                once(2, "request")?;
                review.request = read_request(
                    body,
                    needs,
                    &mut members,
                    member.value_start,
                    envelope_known.then_some(&mut review.unread_from),
                    &mut review.jumped,
                    &mut review.object_error,
                )?
                .map(Box::new);
                if review.unread_from.is_some() {
                    return Ok(review);
                }
            }
            _ => {}
        }
    }
    scan::expect_end(body, members.end()).map_err(scan_error(body))?;
    Ok(review)
}

/// A data error in the objects is kept (the first one) and reading goes on; only the envelope
/// decides between 400 and failing open.
fn keep<T>(object_error: &mut Option<String>, read: Read<T>) -> Read<Option<T>> {
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
fn keep_value<'a, T>(
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

/// `unread_from` is given when the envelope's fields have been read: reading may then stop
/// inside the object's status or at `oldObject` (set to where the value stopped at starts) if
/// the decision needs nothing after it.
fn read_request<'a>(
    body: &'a [u8],
    needs: &dyn Needs,
    parent: &mut Members<'a>,
    start: usize,
    mut unread_from: Option<&mut Option<usize>>,
    jumped: &mut Jumped,
    object_error: &mut Option<String>,
) -> Read<Option<RequestIn<'a>>> {
    let Some(mut members) = struct_members(body, start, "RequestIn")? else {
        return Ok(None);
    };
    let mut request = RequestIn::default();
    let mut old_object = None;
    let mut ahead = Ahead::default();
    let mut seen = Seen::default();
    while let Some(member) = members.next_member().map_err(scan_error(body))? {
        let key_end = member.key_end;
        let kind_resource_object_known = seen.all(&[1, 2, 7]);
        // Everything a node review's decision and answer use (a node has no namespace: the
        // API server omits it), and no oldObject yet (a second one is refused as before).
        let node_fields_known = seen.all(&[0, 1, 2, 3, 5, 6, 7]) && !seen.all(&[8]);
        let node_fields_but_object_known = seen.all(&[0, 1, 2, 3, 5, 6]) && !seen.all(&[7]);
        let mut once = |bit, name| seen.once(body, bit, name, key_end);
        match member.key.as_ref() {
            b"uid" => {
                once(0, "uid")?;
                request.uid = text(body, &mut members)?;
            }
            b"kind" => {
                once(1, "kind")?;
                request.kind = kind_in(body, &mut members)?;
            }
            b"resource" => {
                once(2, "resource")?;
                request.resource = resource_in(body, &mut members)?;
            }
            b"name" => {
                once(3, "name")?;
                request.name = text(body, &mut members)?;
            }
            b"namespace" => {
                once(4, "namespace")?;
                request.namespace = text(body, &mut members)?;
            }
            b"operation" => {
                once(5, "operation")?;
                request.operation = text(body, &mut members)?;
            }
            // Not part of the envelope: a bad value fails the review open.
            b"subResource" => {
                keep(object_error, once(6, "subResource"))?;
                let read = text(body, &mut members);
                let value = keep_value(
                    body,
                    Some(&mut members),
                    member.value_start,
                    object_error,
                    read,
                )?;
                request.sub_resource = value.flatten();
            }
            b"object" => {
                keep(object_error, once(7, "object"))?;
                // A node review (the API server writes every other field the rule and the
                // answer use before `object`): reading may stop inside the object's status.
                let may_stop = node_fields_but_object_known
                    && object_error.is_none()
                    && unread_from.is_some()
                    && classify(request.kind.as_ref(), request.resource.as_ref())
                        == ReviewResource::Node;
                let conditions = may_need_conditions(&request);
                ahead.object_start = member.value_start;
                let object = |members: &mut Members<'a>,
                              object_error: &mut _,
                              ahead: &mut Ahead<'a>,
                              tail: &mut _,
                              may_stop| {
                    let ahead = conditions.then_some(ahead);
                    let read = read_object(body, needs, members, may_stop, ahead, tail);
                    keep_value(body, Some(members), member.value_start, object_error, read)
                };
                let tail = &mut jumped.metadata_tail;
                let read = object(&mut members, object_error, &mut ahead, tail, may_stop)?;
                if let Some((object_read, after)) = read {
                    request.object = object_read;
                    if let (After::Stopped(at), Some(unread_from)) = (after, unread_from.as_mut()) {
                        if !needs_stored_conditions(&request, needs) {
                            **unread_from = Some(at);
                            return Ok(Some(request));
                        }
                        let comma = ahead.old_object_comma.filter(|&comma| comma >= at);
                        match comma.or_else(|| jump_to_old_object(body, member.value_start, at)) {
                            Some(comma) => {
                                members.value_read(comma);
                                // The object's closing brace is not checked either: a `}`
                                // comes before `,"oldObject":{`, whichever bracket it closes.
                                jumped.object_rest = Some(at..comma);
                            }
                            // Not as the API server writes it: the object is read whole.
                            None => {
                                let tail = &mut jumped.metadata_tail;
                                let whole =
                                    object(&mut members, object_error, &mut ahead, tail, false)?;
                                request.object = whole.and_then(|(object_read, _)| object_read);
                            }
                        }
                    }
                }
            }
            b"oldObject" => {
                // The API server writes oldObject after every field the rules read: when the
                // stored annotations are not needed, the rest of the body is not read at all.
                let stored_conditions = needs_stored_conditions(&request, needs);
                let stored_annotations = needs_stored_annotations(&request, needs);
                if node_fields_known
                    && object_error.is_none()
                    && !stored_annotations
                    && !stored_conditions
                    && classify(request.kind.as_ref(), request.resource.as_ref())
                        == ReviewResource::Node
                    && let Some(unread_from) = unread_from.as_mut()
                {
                    **unread_from = Some(member.value_start);
                    return Ok(Some(request));
                }
                keep(object_error, once(8, "oldObject"))?;
                // Skipped (only its end is found) unless the rule will need it, which the kind,
                // the resource and the object tell. The API server writes them first; in any
                // other order the decision waits for the end of the request.
                if !kind_resource_object_known {
                    let span = members.skip_value().map_err(scan_error(body))?;
                    old_object = Some(span);
                } else if object_error.is_none() && (stored_conditions || stored_annotations) {
                    // With the stored conditions read, nothing after them is needed.
                    let reads = OldReads {
                        annotations: stored_annotations,
                        conditions: stored_conditions,
                        may_stop: stored_conditions && node_fields_known && unread_from.is_some(),
                    };
                    if reads.may_stop
                        && !reads.annotations
                        && let Some(unread_from) = unread_from.as_mut()
                        && let Some((old, head, stop)) =
                            stored_node_ahead(body, member.value_start, &mut ahead)
                    {
                        request.old_object = Some(old);
                        jumped.stored_head = Some(head);
                        **unread_from = Some(stop);
                        return Ok(Some(request));
                    }
                    let read = read_old_object(body, member.value_start, reads, &mut ahead);
                    let value = keep_value(
                        body,
                        Some(&mut members),
                        member.value_start,
                        object_error,
                        read,
                    )?;
                    if let Some((old, ended)) = value.flatten() {
                        request.old_object = Some(old);
                        match (ended, unread_from.as_mut()) {
                            (Ended::Stopped(at), Some(unread_from)) => {
                                **unread_from = Some(at);
                                return Ok(Some(request));
                            }
                            (Ended::Closed(end) | Ended::Stopped(end), _) => {
                                members.value_read(end)
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    parent.value_read(members.end());
    let stored_conditions = needs_stored_conditions(&request, needs);
    if let Some(span) = old_object
        && object_error.is_none()
        && (stored_conditions || needs_stored_annotations(&request, needs))
    {
        let reads = OldReads {
            annotations: needs_stored_annotations(&request, needs),
            conditions: stored_conditions,
            may_stop: false,
        };
        let read = read_old_object(body, span.start, reads, &mut ahead);
        let value = keep_value(body, None, span.start, object_error, read)?;
        request.old_object = value.flatten().map(|(old, _)| old);
    }
    Ok(Some(request))
}

/// Whether the conditions may be needed, as far as the request's fields read so far tell: a
/// node review (or one whose kind is not known yet) that is not known to be other than an
/// UPDATE. Which nodes need them the labels tell (`Needs::conditions`).
fn may_need_conditions(request: &RequestIn<'_>) -> bool {
    let kind_known = request.kind.is_some() || request.resource.is_some();
    let node = classify(request.kind.as_ref(), request.resource.as_ref()) == ReviewResource::Node;
    let update = request.operation.as_deref().is_none_or(|op| op == "UPDATE");
    (node || !kind_known) && update
}

/// Whether the stored node's conditions must be read: a node status update (or a node review
/// whose operation is not known yet) whose object's conditions were read, of a node the rules
/// say needs them (quiet heartbeats).
fn needs_stored_conditions(request: &RequestIn<'_>, needs: &dyn Needs) -> bool {
    let is_node =
        classify(request.kind.as_ref(), request.resource.as_ref()) == ReviewResource::Node;
    let update = request.operation.as_deref().is_none_or(|op| op == "UPDATE");
    let metadata = request.object.as_ref().and_then(|o| o.metadata.as_ref());
    let conditions_read = request
        .object
        .as_ref()
        .and_then(|o| o.status.as_ref())
        .is_some_and(|s| s.conditions.is_some());
    is_node
        && update
        && conditions_read
        && needs.conditions(metadata.and_then(|m| m.labels.as_ref()))
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
fn jump_to_old_object(body: &[u8], object_start: usize, from: usize) -> Option<usize> {
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
fn find_near(finder: &Finder<'_>, body: &[u8], guess: usize, from: usize) -> Option<usize> {
    const WINDOW: usize = 512;
    let find = |from: usize, to: usize| {
        let found = finder.find(body.get(from..to.min(body.len()))?)?;
        Some(from + found)
    };
    let near = guess.saturating_sub(WINDOW / 2).max(from);
    let to = near + WINDOW + finder.needle().len();
    find(near, to).or_else(|| find(from, body.len()))
}

/// What reading the object's conditions found ahead of it, for the rest of the request.
#[derive(Default)]
struct Ahead<'a> {
    /// Where the object's value starts.
    object_start: usize,
    /// The comma before `oldObject` (`jump_to_old_object`).
    old_object_comma: Option<usize>,
    /// The stored node's conditions as read, and the span of their array.
    stored: Option<(Range<usize>, Vec<Condition<'a>>)>,
}

/// The object's conditions (quiet heartbeats). A kubelet's status update sends the stored
/// conditions again with new heartbeat times unless a condition changed: so the stored node's
/// conditions are read first (`look_ahead`), and when the object's array is the same bytes
/// but for the heartbeat times, the object's conditions are the stored ones with the object's
/// times; otherwise the array is read as any other.
fn object_conditions<'a>(
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

/// The object's conditions (the array at `start`) from the stored node's, when they are the
/// same but for heartbeat times, and the index past the array. The stored node's array is found
/// as `jump_to_old_object` finds `oldObject` and read as any other (kept in `ahead` for when
/// the reader gets there); where it was found does not matter for what this answers: any array
/// of conditions whose bytes are those at `start` but for the heartbeat times reads as the one
/// at `start` would.
fn look_ahead<'a>(
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

/// The conditions of the array at `start` as `look_ahead` reads them first: each condition's
/// type and heartbeat time, borrowed, and no other field (left `None`), and the index past the
/// array. Only for arrays the object's array equals byte for byte but for the heartbeat times
/// (`same_but_heartbeats`): the fields not read are then the same on both sides, and `None`
/// compares equal to `None`. `None` where the array is not plainly written (escapes, nulls,
/// a known field given twice, text that is not UTF-8): then it is read whole, as any other.
fn heartbeats_at(body: &[u8], start: usize) -> Option<(Vec<Condition<'_>>, usize)> {
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
fn heartbeats_found(body: &[u8], start: usize) -> Option<(Vec<Condition<'_>>, usize)> {
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
fn status_key_after_conditions(body: &[u8], key_start: usize) -> bool {
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
fn heartbeat_members(body: &[u8], at: usize) -> Option<(Condition<'_>, usize)> {
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
fn stored_node_ahead<'a>(
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
fn same_but_heartbeats<'a>(
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

/// Whether the stored object's annotations must be read: a node review whose object's
/// annotations the rules say are not enough.
fn needs_stored_annotations(request: &RequestIn<'_>, needs: &dyn Needs) -> bool {
    let is_node =
        classify(request.kind.as_ref(), request.resource.as_ref()) == ReviewResource::Node;
    let annotations = request
        .object
        .as_ref()
        .and_then(|o| o.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref());
    is_node && request.object.is_some() && needs.stored_annotations(annotations)
}

/// What a field reader of [`read_struct`] says after its field.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum After {
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
enum Ended {
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
fn read_struct<'a, T: Default>(
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
    let mut seen = Seen::default();
    let mut stop_before: &[&str] = &[];
    while let Some(member) = members.next_member().map_err(scan_error(body))? {
        let index = fields
            .iter()
            .position(|f| f.as_bytes() == member.key.as_ref());
        if let Some(index) = index {
            seen.once(body, index as u32, fields[index], member.key_end)?;
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
fn read_member<'a, T: Default>(
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
    member_read(parent, read?)
}

/// `parent` continues past its current member, read as `read` says (unless reading stopped
/// inside it).
fn member_read<T>(parent: &mut Members<'_>, read: Option<(T, Ended)>) -> Read<(Option<T>, After)> {
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
fn no_jump<T>(_: &T, _: &[u8], _: usize) -> Option<usize> {
    None
}

/// `object`: metadata and status walked, spec read whole (the pod rule needs its containers).
/// After a data error the value is left to `parent`, which steps over it. With `may_stop`
/// (`read_request`: a node review whose other fields are known), reading stops inside
/// `status` once the metadata's annotations are all the rules need (`Needs`) and both
/// quantity maps are read: `After::Stopped`; and the metadata's members after its annotations
/// are jumped over (`metadata_end`). A jump is kept only if the status is read after it (a
/// Node always has one): otherwise, or if reading after it fails, the object is read again
/// without jumping, so that a jump can only save work, never change what is read. `tail` is
/// what was jumped over, if a jump was kept.
fn read_object<'a>(
    body: &'a [u8],
    needs: &dyn Needs,
    parent: &mut Members<'a>,
    may_stop: bool,
    mut may_need_conditions: Option<&mut Ahead<'a>>,
    tail: &mut Option<Range<usize>>,
) -> Read<(Option<ObjectIn<'a>>, After)> {
    let start = parent.value_start();
    let jumped = Cell::new(None);
    let mut read = |may_jump: bool| {
        read_struct(
            body,
            start,
            "ObjectIn",
            &["metadata", "spec", "status"],
            |object: &mut ObjectIn<'a>, name, members| match name {
                "metadata" => {
                    object.metadata = read_metadata(body, members, may_jump.then_some(&jumped))?;
                    Ok(After::Next)
                }
                "spec" => {
                    object.spec = field(body, members)?;
                    Ok(After::Next)
                }
                _ => {
                    let metadata = object.metadata.as_ref();
                    let annotations = metadata.and_then(|m| m.annotations.as_ref());
                    let may_stop = may_stop && !needs.stored_annotations(annotations);
                    // Labels not read yet (metadata after status): the conditions may be needed.
                    let conditions = may_need_conditions
                        .as_deref_mut()
                        .filter(|_| metadata.is_none_or(|m| needs.conditions(m.labels.as_ref())));
                    let (status, after) = read_status(body, members, may_stop, conditions)?;
                    object.status = status;
                    Ok(after)
                }
            },
            no_jump,
        )
    };
    let mut object = read(may_stop);
    let status_read = matches!(&object, Ok(Some((o, _))) if o.status.is_some());
    *tail = jumped.take();
    if tail.is_some() && !status_read {
        *tail = None;
        object = read(false);
    }
    member_read(parent, object?)
}

/// `metadata`: managedFields, ownerReferences, ... skipped. With `jumped` (`read_object`), once
/// the labels and annotations are read, a member the API server writes after them is not
/// stepped over but jumped over to the metadata's end (`metadata_end`), and `jumped` holds
/// the span jumped over.
fn read_metadata<'a>(
    body: &'a [u8],
    parent: &mut Members<'a>,
    jumped: Option<&Cell<Option<Range<usize>>>>,
) -> Read<Option<MetaIn<'a>>> {
    let fields = &["namespace", "labels", "annotations"];
    let jump = |metadata: &MetaIn<'a>, key: &[u8], value_start: usize| {
        let jumped = jumped?;
        let tail = METADATA_AFTER_ANNOTATIONS
            .iter()
            .any(|k| k.as_bytes() == key);
        if !tail || metadata.labels.is_none() || metadata.annotations.is_none() {
            return None;
        }
        let brace = metadata_end(body, value_start)?;
        // The brace itself too: a byte inserted before it lands in what is jumped over.
        jumped.set(Some(value_start..brace + 1));
        Some(brace)
    };
    let read = read_struct(
        body,
        parent.value_start(),
        "MetaIn",
        fields,
        |metadata: &mut MetaIn<'a>, name, members| {
            match name {
                "namespace" => metadata.namespace = text(body, members)?,
                "labels" => metadata.labels = str_map(body, members)?,
                _ => metadata.annotations = str_map(body, members)?,
            }
            Ok(After::Next)
        },
        jump,
    )?;
    let (metadata, _) = member_read(parent, read)?;
    Ok(metadata)
}

/// The members of `ObjectMeta` the API server writes after `annotations` (Go's field order).
/// A Node's are mostly `managedFields`: ~0.7 KB on the benchmark's node, several KB on a real
/// kubelet's (every status field it sets), ~6 instructions a byte to step over.
const METADATA_AFTER_ANNOTATIONS: &[&str] = &["ownerReferences", "finalizers", "managedFields"];

/// The closing brace of an object's metadata, searched for from `from` (the value of one of
/// `METADATA_AFTER_ANNOTATIONS`): `},"spec":`, the object's next member as the API server
/// writes it. Nothing in between can hold that text: what it writes there has no member named
/// `spec` (managedFields' field sets name fields `f:spec`), and no string can hold an
/// unescaped quote. In a body written another way the first such text may lie further on,
/// past members that are needed: past the object's status (`read_object` then finds no status
/// read after the jump and reads the object again without it), or into `oldObject`, whose
/// status would then be read as the object's: a span holding `"oldObject":` is not jumped
/// (`None`: the members are stepped over as usual).
fn metadata_end(body: &[u8], from: usize) -> Option<usize> {
    static END: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"},\"spec\":"));
    static OLD_OBJECT: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"oldObject\":"));
    let brace = from + END.find(body.get(from..)?)?;
    let span = body.get(from..brace)?;
    OLD_OBJECT.find(span).is_none().then_some(brace)
}

/// The fields of a Node's status after `capacity` and `allocatable`, in the API server's order
/// (Go's `NodeStatus`).
const STATUS_AFTER_QUANTITIES: &[&str] = &[
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
const STATUS_AFTER_CONDITIONS: &[&str] = STATUS_AFTER_QUANTITIES.split_at(2).1;

/// `status`: images, volumesAttached, ... skipped; `conditions` read if `conditions` (quiet
/// heartbeats), skipped otherwise. With `may_stop`, reading stops once allocatable, capacity
/// (and the conditions, when they are read) are read, at the value of the next member (in the
/// API server's order they come first: a Node's status is mostly the images after them), but
/// only if that member is one of `STATUS_AFTER_QUANTITIES` (`STATUS_AFTER_CONDITIONS`). That check is what
/// keeps a damaged map from being read as a shorter one: a `}` inserted in the last map read
/// (`{"cpu":"4"},"memory":"8Gi",...}`) ends it early and turns its remaining quantities into
/// members of the status, named as resources (`memory`, `pods`, `example.com/gpu`): names the
/// kubelet reports and the API server's validation accepts for quantities are never these.
fn read_status<'a>(
    body: &'a [u8],
    parent: &mut Members<'a>,
    may_stop: bool,
    mut conditions: Option<&mut Ahead<'a>>,
) -> Read<(Option<NodeStatusIn<'a>>, After)> {
    // `conditions` is one of the fields either way, so that a second copy is refused as the
    // full parse refuses it.
    let fields = &["allocatable", "capacity", "conditions"];
    read_member(
        body,
        parent,
        "NodeStatusIn",
        fields,
        |status: &mut NodeStatusIn<'a>, name, members| {
            match name {
                "allocatable" => status.allocatable = str_map(body, members)?,
                "capacity" => status.capacity = str_map(body, members)?,
                _ => match conditions.as_deref_mut() {
                    Some(ahead) => status.conditions = object_conditions(body, members, ahead)?,
                    None => {
                        members.skip_value().map_err(scan_error(body))?;
                    }
                },
            }
            let known = status.allocatable.is_some() && status.capacity.is_some();
            Ok(match (may_stop && known, conditions.is_some()) {
                (false, _) => After::Next,
                (true, false) => After::EnoughIfNextIs(STATUS_AFTER_QUANTITIES),
                (true, true) if status.conditions.is_some() => {
                    After::EnoughIfNextIs(STATUS_AFTER_CONDITIONS)
                }
                (true, true) => After::Next,
            })
        },
    )
}

/// `status.conditions`: an array of plainly written objects of strings without serde_json,
/// field by field; anything else (a `null` time, a field given twice, ...) with serde_json.
fn read_conditions<'a>(
    body: &'a [u8],
    members: &mut Members<'a>,
) -> Read<Option<Vec<Condition<'a>>>> {
    let (conditions, end) = conditions_at(body, members.value_start())?;
    members.value_read(end);
    Ok(conditions)
}

/// `read_conditions` of the array starting at `start`, and the index past it.
fn conditions_at(body: &[u8], start: usize) -> Read<(Option<Vec<Condition<'_>>>, usize)> {
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

/// What of `oldObject` the rules need.
#[derive(Clone, Copy)]
struct OldReads {
    annotations: bool,
    conditions: bool,
    /// Reading may stop inside the status once the conditions are read, as in `read_status`.
    may_stop: bool,
}

/// `oldObject.metadata.annotations` and `oldObject.status.conditions`, as `reads` asks, from
/// the oldObject whose first byte is at `start`, and how far it was read.
fn read_old_object<'a>(
    body: &'a [u8],
    start: usize,
    reads: OldReads,
    ahead: &mut Ahead<'a>,
) -> Read<Option<(OldObjectIn<'a>, Ended)>> {
    let fields: &[&'static str] = match (reads.annotations, reads.conditions) {
        (true, true) => &["metadata", "status"],
        (false, true) => &["status"],
        _ => &["metadata"],
    };
    let (conditions, may_stop) = (reads.conditions, reads.may_stop);
    read_struct(
        body,
        start,
        "OldObjectIn",
        fields,
        |old: &mut OldObjectIn<'a>, name, members| {
            if name == "status" {
                // Stopping after the conditions leaves the rest unread: only once the
                // annotations, when needed, are read (the API server writes metadata first).
                let may_stop = may_stop && (!reads.annotations || old.metadata.is_some());
                let (status, after) = read_member(
                    body,
                    members,
                    "OldStatusIn",
                    &["conditions"],
                    |status: &mut OldStatusIn<'a>, _, members| {
                        status.conditions = match ahead.stored.take() {
                            // Already read by `look_ahead`.
                            Some((span, read)) if span.start == members.value_start() => {
                                members.value_read(span.end);
                                Some(read)
                            }
                            _ => read_conditions(body, members)?,
                        };
                        Ok(if may_stop && conditions && status.conditions.is_some() {
                            After::EnoughIfNextIs(STATUS_AFTER_CONDITIONS)
                        } else {
                            After::Next
                        })
                    },
                )?;
                old.status = status;
                return Ok(after);
            }
            let (metadata, _) = read_member(
                body,
                members,
                "OldMetaIn",
                &["annotations"],
                |metadata: &mut OldMetaIn<'a>, _, members| {
                    metadata.annotations = str_map(body, members)?;
                    Ok(After::Next)
                },
            )?;
            old.metadata = metadata;
            Ok(After::Next)
        },
        no_jump,
    )
}
