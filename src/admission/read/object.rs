//! The objects of a review: the object's metadata and status, and what the rules need of
//! `oldObject` (its annotations, its conditions).

use std::cell::Cell;
use std::ops::Range;
use std::sync::LazyLock;

use memchr::memmem::Finder;

use overcommit_json::scan::Members;

use super::ReadPlan;
use super::conditions::{
    Ahead, STATUS_AFTER_CONDITIONS, STATUS_AFTER_QUANTITIES, object_conditions, read_conditions,
};
use super::fields::{
    After, Ended, Read, continue_past_member, field, no_jump, read_member, read_struct, scan_error,
    str_map, text,
};
use crate::admission::request::{
    MetaIn, NodeStatusIn, ObjectIn, OldMetaIn, OldObjectIn, OldStatusIn,
};

/// `object`: metadata and status walked, spec read whole (the pod rule needs its containers).
/// After a data error the value is left to `parent`, which steps over it. With `may_stop`
/// (`RequestRead::object`: a node review whose other fields are known), reading stops inside
/// `status` once the metadata's annotations are all the rules need (`ReadPlan`) and both
/// quantity maps are read: `After::Stopped`; and the metadata's members after its annotations
/// are jumped over (`metadata_end`). A jump is kept only if the status is read after it (a
/// Node always has one): otherwise, or if reading after it fails, the object is read again
/// without jumping, so that a jump can only save work, never change what is read. `tail` is
/// what was jumped over, if a jump was kept. With `conditions` (quiet heartbeats, a node
/// update), the status's conditions are read, and what reading them finds ahead is kept there.
pub(super) fn read_object<'a>(
    body: &'a [u8],
    plan: ReadPlan,
    parent: &mut Members<'a>,
    may_stop: bool,
    mut conditions: Option<&mut Ahead<'a>>,
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
                    let may_stop = may_stop && !plan.stored_annotations_needed(annotations);
                    let ahead = conditions.as_deref_mut();
                    let (status, after) = read_status(body, members, may_stop, ahead)?;
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
    continue_past_member(parent, object?)
}

/// `metadata`: managedFields, ownerReferences, ... skipped. With `jumped` (`read_object`), once
/// the labels and annotations are read, a member the API server writes after them is not
/// stepped over but jumped over to the metadata's end (`metadata_end`), and `jumped` holds
/// the span jumped over.
pub(super) fn read_metadata<'a>(
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
    let (metadata, _) = continue_past_member(parent, read)?;
    Ok(metadata)
}

/// The members of `ObjectMeta` the API server writes after `annotations` (Go's field order).
/// A Node's are mostly `managedFields`: ~0.7 KB on the benchmark's node, several KB on a real
/// kubelet's (every status field it sets), ~6 instructions a byte to step over.
pub(super) const METADATA_AFTER_ANNOTATIONS: &[&str] =
    &["ownerReferences", "finalizers", "managedFields"];

/// The closing brace of an object's metadata, searched for from `from` (the value of one of
/// `METADATA_AFTER_ANNOTATIONS`): `},"spec":`, the object's next member as the API server
/// writes it. Nothing in between can hold that text: what it writes there has no member named
/// `spec` (managedFields' field sets name fields `f:spec`), and no string can hold an
/// unescaped quote. In a body written another way the first such text may lie further on,
/// past members that are needed: past the object's status (`read_object` then finds no status
/// read after the jump and reads the object again without it), or into `oldObject`, whose
/// status would then be read as the object's: a span holding `"oldObject":` is not jumped
/// (`None`: the members are stepped over as usual).
pub(super) fn metadata_end(body: &[u8], from: usize) -> Option<usize> {
    static END: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"},\"spec\":"));
    static OLD_OBJECT: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"oldObject\":"));
    let brace = from + END.find(body.get(from..)?)?;
    let span = body.get(from..brace)?;
    OLD_OBJECT.find(span).is_none().then_some(brace)
}

/// `status`: images, volumesAttached, ... skipped; `conditions` read if `conditions` (quiet
/// heartbeats), skipped otherwise. With `may_stop`, reading stops once allocatable, capacity
/// (and the conditions, when they are read) are read, at the value of the next member (in the
/// API server's order they come first: a Node's status is mostly the images after them), but
/// only if that member is one of `STATUS_AFTER_QUANTITIES` (`STATUS_AFTER_CONDITIONS`). That check is what
/// keeps a damaged map from being read as a shorter one: a `}` inserted in the last map read
/// (`{"cpu":"4"},"memory":"8Gi",...}`) ends it early and turns its remaining quantities into
/// members of the status, named as resources (`memory`, `pods`, `example.com/gpu`): names the
/// kubelet reports and the API server's validation accepts for quantities are never these.
pub(super) fn read_status<'a>(
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

/// What of `oldObject` the rules need.
#[derive(Clone, Copy)]
pub(super) struct OldReads {
    pub(super) annotations: bool,
    pub(super) conditions: bool,
    /// Reading may stop inside the status once the conditions are read, as in `read_status`.
    pub(super) may_stop: bool,
}

/// `oldObject.metadata.annotations` and `oldObject.status.conditions`, as `reads` asks, from
/// the oldObject whose first byte is at `start`, and how far it was read.
pub(super) fn read_old_object<'a>(
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
