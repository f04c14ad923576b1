//! Reading a review from the request body: the fields the rules use are deserialised by
//! serde_json from their own slices of the body (plain strings and objects of strings first by
//! `overcommit_json::plain`, which leaves anything else to serde_json and answers as it does);
//! everything else is stepped over by `scan`, without building or visiting it token by token, and what
//! comes after the last field a node status review's decision needs is not read at all (the
//! unread tail, below). `oldObject` is read (its `metadata.annotations` only) when the node
//! rule needs the stored annotations: a node review whose object carries neither overcommit
//! annotation.
//!
//! One way: the reader asks nothing of the rules or the policies while it reads. What it must
//! know in advance is plain data handed to it (`ReadPlan`: which annotations make the stored
//! node's unneeded, whether quiet heartbeats are on); the policy is chosen after reading, once.
//! Split by what it reads: the review and its request here, the objects in `object`, the
//! nodes' conditions (quiet heartbeats) in `conditions`, single values in `fields`.
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
//! - **Quiet heartbeats.** With quiet heartbeats on (`ReadPlan`), a node status update needs
//!   both nodes' conditions (read whatever the node's policy: the policy is chosen after
//!   reading; the rule keeps heartbeats only on nodes a policy selects). When the object's `conditions` are reached, the stored node's are read
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

mod conditions;
mod fields;
mod object;

use std::borrow::Cow;
use std::ops::Range;

use overcommit_json::StrMap;
use overcommit_json::scan::{self, Member, Members};

use self::conditions::{Ahead, jump_to_old_object, stored_node_ahead};
use self::fields::{
    Ended, Read, keep, keep_value, kind_in, not_a_struct, once, resource_in, scan_error, text,
};
use self::object::{OldReads, read_object, read_old_object};
use super::request::{
    ObjectIn, Parsed, RequestIn, ReviewResource, check_envelope, classify, describe_object,
};

/// What the reader must know before it reads, as plain data from the rules' side: where it
/// may stop reading depends on it, never on a question asked while reading.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReadPlan {
    /// The annotations the node rule writes: a node review whose object carries one of them
    /// needs nothing of the stored node's annotations (`node::OVERCOMMIT_ANNOTATIONS`).
    pub(super) overcommit_annotations: &'static [&'static str],
    /// Quiet heartbeats on: a node status update's conditions, and the stored node's, are read.
    pub(super) quiet_heartbeats: bool,
}

impl ReadPlan {
    /// Whether a node review whose object carries these annotations needs the stored object's
    /// (`oldObject`'s) annotations too.
    fn stored_annotations_needed(&self, annotations: Option<&StrMap<'_>>) -> bool {
        !annotations.is_some_and(|a| {
            self.overcommit_annotations
                .iter()
                .any(|key| a.contains_key(key))
        })
    }
}

/// What the top level of the body says.
struct Review<'a> {
    api_version: Option<Cow<'a, str>>,
    kind: Option<Cow<'a, str>>,
    request: Option<Box<RequestIn<'a>>>,
    progress: Progress,
}

/// How far the objects were read: the first error in them, where reading stopped, what was
/// jumped over.
#[derive(Default)]
struct Progress {
    /// The first error in the objects (they are then not read): the review fails open.
    object_error: Option<String>,
    /// Where reading stopped because the decision needed nothing more (the value of the status
    /// member after the maps and conditions it reads, or of `oldObject`); the bytes from here on
    /// were not read.
    unread_from: Option<usize>,
    /// What was jumped over (quiet heartbeats, the metadata's tail); not read.
    jumped: Jumped,
}

/// Spans of the body jumped over, not read.
#[derive(Default)]
struct Jumped {
    /// The object's status after its conditions, up to `oldObject` (`jump_to_old_object`).
    object_rest: Option<Range<usize>>,
    /// The stored node before its conditions (`stored_node_ahead`).
    stored_head: Option<Range<usize>>,
    /// The object's metadata after its annotations, to its closing brace (`metadata_end`).
    metadata_tail: Option<Range<usize>>,
}

/// How far `parse` reads `body`, for the tests of the tolerated spans.
#[cfg(test)]
fn progress(body: &[u8], plan: &ReadPlan) -> Option<Progress> {
    read_review(body, *plan).ok().map(|review| review.progress)
}

/// Where `parse` stops reading `body` (the tolerance of the unread tail), if it stops early.
#[cfg(test)]
pub(super) fn unread_from(body: &[u8], plan: &ReadPlan) -> Option<usize> {
    progress(body, plan)?.unread_from
}

/// What `parse` jumps over in `body` on its way to `oldObject` (quiet heartbeats), if anything.
#[cfg(test)]
pub(super) fn unread_middle(body: &[u8], plan: &ReadPlan) -> Option<Range<usize>> {
    progress(body, plan)?.jumped.object_rest
}

/// What `parse` jumps over in the stored node on its way to its conditions, if anything.
#[cfg(test)]
pub(super) fn unread_stored_head(body: &[u8], plan: &ReadPlan) -> Option<Range<usize>> {
    progress(body, plan)?.jumped.stored_head
}

/// What `parse` jumps over in the object's metadata after its annotations, if anything.
#[cfg(test)]
pub(super) fn unread_metadata_tail(body: &[u8], plan: &ReadPlan) -> Option<Range<usize>> {
    progress(body, plan)?.jumped.metadata_tail
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
    let (conditions, _) = conditions::look_ahead(body, start, &mut ahead)?;
    let times = conditions
        .iter()
        .map(|c| c.last_heartbeat_time.as_deref().map(str::to_string));
    Some(times.collect())
}

/// Read a review body: the decision's input, a review to fail open, or a 400.
pub(super) fn parse<'a>(body: &'a [u8], plan: &ReadPlan) -> Parsed<'a> {
    let review = match read_review(body, *plan) {
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
    match review.progress.object_error {
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

/// Which members of the review object were given.
#[derive(Default)]
struct EnvelopeSeen {
    api_version: bool,
    kind: bool,
    request: bool,
}

fn read_review(body: &[u8], plan: ReadPlan) -> Read<Review<'_>> {
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
        progress: Progress::default(),
    };
    let mut seen = EnvelopeSeen::default();
    while let Some(member) = members.next_member().map_err(scan_error(body))? {
        let key_end = member.key_end;
        match member.key.as_ref() {
            b"apiVersion" => {
                once(&mut seen.api_version, body, "apiVersion", key_end)?;
                review.api_version = text(body, &mut members)?;
            }
            b"kind" => {
                once(&mut seen.kind, body, "kind", key_end)?;
                review.kind = text(body, &mut members)?;
            }
            b"request" => {
                // Reading may stop early only once the envelope's own fields are read.
                let may_stop = seen.api_version && seen.kind;
                once(&mut seen.request, body, "request", key_end)?;
                let reader = RequestRead::new(body, plan, may_stop);
                let progress = &mut review.progress;
                review.request = reader.read(&mut members, &member, progress)?.map(Box::new);
                if review.progress.unread_from.is_some() {
                    return Ok(review);
                }
            }
            _ => {}
        }
    }
    scan::expect_end(body, members.end()).map_err(scan_error(body))?;
    Ok(review)
}

/// Which members of the request were given, by name.
#[derive(Default)]
struct RequestSeen {
    uid: bool,
    kind: bool,
    resource: bool,
    sub_resource: bool,
    name: bool,
    namespace: bool,
    operation: bool,
    object: bool,
    old_object: bool,
}

impl RequestSeen {
    /// Everything a node review's decision and answer use but the object (a node has no
    /// namespace: the API server omits it).
    fn node_fields_but_object(&self) -> bool {
        self.uid && self.kind && self.resource && self.sub_resource && self.name && self.operation
    }

    /// Everything a node review's decision and answer use, and no oldObject yet (a second one
    /// is refused as before).
    fn node_fields(&self) -> bool {
        self.node_fields_but_object() && self.object && !self.old_object
    }
}

/// Reading stops (the rest of the body is not needed) or goes on.
enum Flow {
    Next,
    Stop,
}

/// The request being read: its fields so far, and what reading them found ahead.
struct RequestRead<'a> {
    body: &'a [u8],
    plan: ReadPlan,
    /// Reading may stop inside the object's status or at `oldObject` if the decision needs
    /// nothing after it (the envelope's fields have been read).
    may_stop: bool,
    request: RequestIn<'a>,
    seen: RequestSeen,
    /// `oldObject`'s span, when it came before the fields that tell whether it is needed.
    old_object_span: Option<Range<usize>>,
    ahead: Ahead<'a>,
}

impl<'a> RequestRead<'a> {
    fn new(body: &'a [u8], plan: ReadPlan, may_stop: bool) -> Self {
        RequestRead {
            body,
            plan,
            may_stop,
            request: RequestIn::default(),
            seen: RequestSeen::default(),
            old_object_span: None,
            ahead: Ahead::default(),
        }
    }

    /// The request, the current member of `parent` (null: `None`); `parent` continues past
    /// it unless reading stopped inside it (`progress.unread_from`).
    fn read(
        mut self,
        parent: &mut Members<'a>,
        member: &Member<'a>,
        progress: &mut Progress,
    ) -> Read<Option<RequestIn<'a>>> {
        let body = self.body;
        let Some(mut members) = fields::struct_members(body, member.value_start, "RequestIn")?
        else {
            return Ok(None);
        };
        while let Some(member) = members.next_member().map_err(scan_error(body))? {
            if let Flow::Stop = self.member(&mut members, &member, progress)? {
                return Ok(Some(self.request));
            }
        }
        parent.value_read(members.end());
        self.old_object_after_all(progress)?;
        Ok(Some(self.request))
    }

    fn member(
        &mut self,
        members: &mut Members<'a>,
        member: &Member<'a>,
        progress: &mut Progress,
    ) -> Read<Flow> {
        let body = self.body;
        let (seen, request) = (&mut self.seen, &mut self.request);
        let key_end = member.key_end;
        let text_field = match member.key.as_ref() {
            b"uid" => Some(("uid", &mut seen.uid, &mut request.uid)),
            b"name" => Some(("name", &mut seen.name, &mut request.name)),
            b"namespace" => Some(("namespace", &mut seen.namespace, &mut request.namespace)),
            b"operation" => Some(("operation", &mut seen.operation, &mut request.operation)),
            _ => None,
        };
        if let Some((name, seen, value)) = text_field {
            once(seen, body, name, key_end)?;
            *value = text(body, members)?;
            return Ok(Flow::Next);
        }
        match member.key.as_ref() {
            b"kind" => {
                once(&mut seen.kind, body, "kind", key_end)?;
                request.kind = kind_in(body, members)?;
            }
            b"resource" => {
                once(&mut seen.resource, body, "resource", key_end)?;
                request.resource = resource_in(body, members)?;
            }
            // Not part of the envelope: a bad value fails the review open.
            b"subResource" => {
                let errors = &mut progress.object_error;
                keep(
                    errors,
                    once(&mut seen.sub_resource, body, "subResource", key_end),
                )?;
                let read = text(body, members);
                let value = keep_value(body, Some(members), member.value_start, errors, read)?;
                request.sub_resource = value.flatten();
            }
            b"object" => return self.object(members, member, progress),
            b"oldObject" => return self.old_object(members, member, progress),
            _ => {}
        }
        Ok(Flow::Next)
    }

    fn is_node(&self) -> bool {
        classify(self.request.kind.as_ref(), self.request.resource.as_ref()) == ReviewResource::Node
    }

    /// `object`. On a node review (the API server writes every other field the rule and the
    /// answer use before it), reading may stop inside the object's status; with quiet
    /// heartbeats, it jumps from there to `oldObject`.
    fn object(
        &mut self,
        members: &mut Members<'a>,
        member: &Member<'a>,
        progress: &mut Progress,
    ) -> Read<Flow> {
        let may_stop = self.seen.node_fields_but_object()
            && !self.seen.object
            && progress.object_error.is_none()
            && self.may_stop
            && self.is_node();
        let seen = once(&mut self.seen.object, self.body, "object", member.key_end);
        keep(&mut progress.object_error, seen)?;
        let start = member.value_start;
        self.ahead.object_start = start;
        let Some((object, after)) = self.object_value(members, start, may_stop, progress)? else {
            return Ok(Flow::Next);
        };
        self.request.object = object;
        let (fields::After::Stopped(at), true) = (after, self.may_stop) else {
            return Ok(Flow::Next);
        };
        if !self.stored_conditions_needed() {
            progress.unread_from = Some(at);
            return Ok(Flow::Stop);
        }
        let comma = self.ahead.old_object_comma.filter(|&comma| comma >= at);
        match comma.or_else(|| jump_to_old_object(self.body, start, at)) {
            Some(comma) => {
                members.value_read(comma);
                // The object's closing brace is not checked either: a `}` comes before
                // `,"oldObject":{`, whichever bracket it closes.
                progress.jumped.object_rest = Some(at..comma);
            }
            // Not as the API server writes it: the object is read whole.
            None => {
                let whole = self.object_value(members, start, false, progress)?;
                self.request.object = whole.and_then(|(object, _)| object);
            }
        }
        Ok(Flow::Next)
    }

    /// The object's value (at `start`, the current member of `members`), as far as it is read.
    fn object_value(
        &mut self,
        members: &mut Members<'a>,
        start: usize,
        may_stop: bool,
        progress: &mut Progress,
    ) -> Read<Option<(Option<ObjectIn<'a>>, fields::After)>> {
        let conditions = self.plan.quiet_heartbeats && may_need_conditions(&self.request);
        let ahead = conditions.then_some(&mut self.ahead);
        let tail = &mut progress.jumped.metadata_tail;
        let read = read_object(self.body, self.plan, members, may_stop, ahead, tail);
        keep_value(
            self.body,
            Some(members),
            start,
            &mut progress.object_error,
            read,
        )
    }

    /// `oldObject`. The API server writes it after every field the rules read: when the stored
    /// annotations and conditions are not needed, the rest of the body is not read at all.
    /// Otherwise only what is needed of it is read (`read_old_object`).
    fn old_object(
        &mut self,
        members: &mut Members<'a>,
        member: &Member<'a>,
        progress: &mut Progress,
    ) -> Read<Flow> {
        let body = self.body;
        let stored_conditions = self.stored_conditions_needed();
        let stored_annotations = self.stored_annotations_needed();
        let node_fields = self.seen.node_fields();
        if node_fields
            && progress.object_error.is_none()
            && !stored_annotations
            && !stored_conditions
            && self.is_node()
            && self.may_stop
        {
            progress.unread_from = Some(member.value_start);
            return Ok(Flow::Stop);
        }
        let kind_resource_object_known = self.seen.kind && self.seen.resource && self.seen.object;
        let seen = once(&mut self.seen.old_object, body, "oldObject", member.key_end);
        keep(&mut progress.object_error, seen)?;
        // Skipped (only its end is found) unless the rule will need it, which the kind, the
        // resource and the object tell. The API server writes them first; in any other order
        // the decision waits for the end of the request.
        if !kind_resource_object_known {
            let span = members.skip_value().map_err(scan_error(body))?;
            self.old_object_span = Some(span);
            return Ok(Flow::Next);
        }
        if progress.object_error.is_some() || !(stored_conditions || stored_annotations) {
            return Ok(Flow::Next);
        }
        // With the stored conditions read, nothing after them is needed.
        let reads = OldReads {
            annotations: stored_annotations,
            conditions: stored_conditions,
            may_stop: stored_conditions && node_fields && self.may_stop,
        };
        if reads.may_stop
            && !reads.annotations
            && let Some((old, head, stop)) =
                stored_node_ahead(body, member.value_start, &mut self.ahead)
        {
            self.request.old_object = Some(old);
            progress.jumped.stored_head = Some(head);
            progress.unread_from = Some(stop);
            return Ok(Flow::Stop);
        }
        let start = member.value_start;
        let read = read_old_object(body, start, reads, &mut self.ahead);
        let errors = &mut progress.object_error;
        let value = keep_value(body, Some(members), start, errors, read)?;
        if let Some((old, ended)) = value.flatten() {
            self.request.old_object = Some(old);
            match ended {
                Ended::Stopped(at) if self.may_stop => {
                    progress.unread_from = Some(at);
                    return Ok(Flow::Stop);
                }
                Ended::Closed(end) | Ended::Stopped(end) => members.value_read(end),
            }
        }
        Ok(Flow::Next)
    }

    /// An `oldObject` given before the fields that tell whether it is needed: read now, if it is.
    fn old_object_after_all(&mut self, progress: &mut Progress) -> Read<()> {
        let Some(span) = self.old_object_span.take() else {
            return Ok(());
        };
        let reads = OldReads {
            annotations: self.stored_annotations_needed(),
            conditions: self.stored_conditions_needed(),
            may_stop: false,
        };
        if progress.object_error.is_some() || !(reads.conditions || reads.annotations) {
            return Ok(());
        }
        let read = read_old_object(self.body, span.start, reads, &mut self.ahead);
        let value = keep_value(
            self.body,
            None,
            span.start,
            &mut progress.object_error,
            read,
        )?;
        self.request.old_object = value.flatten().map(|(old, _)| old);
        Ok(())
    }

    /// Whether the stored node's conditions must be read: quiet heartbeats on, a node status
    /// update (or a node review whose operation is not known yet) whose object's conditions
    /// were read.
    fn stored_conditions_needed(&self) -> bool {
        let request = &self.request;
        let update = request.operation.as_deref().is_none_or(|op| op == "UPDATE");
        let conditions_read = request
            .object
            .as_ref()
            .and_then(|o| o.status.as_ref())
            .is_some_and(|s| s.conditions.is_some());
        self.plan.quiet_heartbeats && self.is_node() && update && conditions_read
    }

    /// Whether the stored object's annotations must be read: a node review whose object
    /// carries none of the node rule's annotations.
    fn stored_annotations_needed(&self) -> bool {
        let Some(object) = self.request.object.as_ref() else {
            return false;
        };
        let annotations = object
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.as_ref());
        self.is_node() && self.plan.stored_annotations_needed(annotations)
    }
}

/// Whether the conditions may be needed, as far as the request's fields read so far tell: a
/// node review (or one whose kind is not known yet) that is not known to be other than an
/// UPDATE.
fn may_need_conditions(request: &RequestIn<'_>) -> bool {
    let kind_known = request.kind.is_some() || request.resource.is_some();
    let node = classify(request.kind.as_ref(), request.resource.as_ref()) == ReviewResource::Node;
    let update = request.operation.as_deref().is_none_or(|op| op == "UPDATE");
    (node || !kind_known) && update
}
