//! The node rule, in one place. Pure.
//!
//! On every `CREATE nodes` and `UPDATE nodes/status`:
//!
//! 1. **Raw value.** The annotation `overcommit.dev/raw-allocatable` (a JSON map) holds the
//!    kubelet's own value of each resource this webhook inflated, and `overcommit.dev/applied`
//!    (JSON `{"policy", "ratios"}`) what it applied. From the two the webhook recomputes what it
//!    last wrote. Per resource: if the incoming allocatable equals (by value) what it last wrote,
//!    the raw value comes from the annotation (a status write by someone else, a retry, a
//!    reinvocation); otherwise the incoming value is the kubelet's new raw value.
//! 2. **Policy.** The highest-priority policy whose selector matches the node's labels gives
//!    the ratios; `overcommit.dev/disabled=true` opts the node out.
//! 3. **New allocatable** = floor(raw x ratio): cpu in whole millicores, everything else in whole
//!    units (bytes, pods, devices), printed the way the API server prints it. A ratio of exactly 1
//!    leaves the resource alone. Capacity is never touched.
//! 4. **No policy, or opted out:** allocatable goes back to the raw value and both annotations
//!    are removed.
//!
//! Running the output back through the rule changes nothing (tests below check every case).
//!
//! Safety nets against compounding:
//! - The API server's incoming object carries the stored annotations. Should a status writer
//!   send an object without them, the stored node's (oldObject's) annotations are used.
//! - A kubelet never reports allocatable above capacity, so a value above capacity that is not
//!   what this webhook last wrote is refused (the review fails open). The kubelet's next status
//!   write carries its raw value and repairs the node.
//! - Unreadable annotations are ignored (and reported); the two nets above then apply.
//!
//! Known ambiguity: if a node's raw value changes to exactly what the webhook wrote before
//! (raw 4 inflated to 8, then the node is resized to 8), the two cannot be told apart and 4 is
//! kept until the next write that differs. Resizes change capacity too; see docs/policy.md.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::patch::{PatchOp, pointer};
use crate::plain_json;
use crate::policy::{CompiledPolicy, NodeChoice, PolicySet};
use crate::quantity::{Format, Quantity, QuantityError, Ratio};

/// Node annotation: the kubelet's allocatable for each inflated resource (JSON map).
pub const RAW_ALLOCATABLE_ANNOTATION: &str = "overcommit.dev/raw-allocatable";
/// Node annotation: what was applied (JSON `{"policy": name, "ratios": {resource: ratio}}`).
pub const APPLIED_ANNOTATION: &str = "overcommit.dev/applied";

/// The largest number of units (millicores, bytes, ...) a written quantity may have.
pub const MAX_UNITS: u128 = i64::MAX as u128;

/// A string map as read from a review: borrowed where the JSON had no escapes.
pub use crate::str_map::StrMap;
use crate::str_map::VecMap;

/// The parts of a Node the rule reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeView<'v> {
    /// False when the object has no `metadata` at all (then annotations go in with it).
    pub has_metadata: bool,
    pub labels: Option<&'v StrMap<'v>>,
    pub annotations: Option<&'v StrMap<'v>>,
    pub allocatable: Option<&'v StrMap<'v>>,
    pub capacity: Option<&'v StrMap<'v>>,
}

/// Why the rule could not decide; the review then fails open (allowed, no patch).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InflateError {
    #[error("allocatable {resource}: {source}")]
    Quantity {
        resource: String,
        source: QuantityError,
    },
    #[error(
        "allocatable {resource} {allocatable} is above capacity {capacity} and is not what this \
         webhook last wrote; refusing to inflate it again"
    )]
    AboveCapacity {
        resource: String,
        allocatable: String,
        capacity: String,
    },
    #[error("cannot write annotation: {0}")]
    Encode(String),
}

/// Which way the node went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeOutcome {
    /// A policy applies (its ratios may still leave every value as it is).
    Policy(String),
    NoPolicy,
    OptedOut,
}

/// Where a raw value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawSource {
    /// The incoming allocatable is the kubelet's (new) value.
    Incoming,
    /// The incoming allocatable is what this webhook last wrote: raw from the annotation.
    Annotation,
}

/// One resource the rule looked at, for `review --explain` and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceLine {
    pub resource: String,
    pub incoming: String,
    pub raw: String,
    pub raw_source: RawSource,
    /// The ratio applied, as written in the policy (None: restored to raw).
    pub ratio: Option<String>,
    pub result: String,
}

/// The rule's answer for one node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeDecision {
    pub outcome: NodeOutcome,
    pub resources: Vec<ResourceLine>,
    /// Things worth a log line that did not stop the decision (unreadable annotations).
    pub notes: Vec<String>,
    pub patch: Vec<PatchOp>,
}

/// JSON of the `overcommit.dev/applied` annotation, as read back (borrowed from the annotation).
#[derive(Debug, Deserialize)]
struct AppliedIn<'a> {
    /// Not used, but required (an annotation without it is unreadable).
    #[serde(rename = "policy", borrow, deserialize_with = "crate::borrowed::str")]
    _policy: Cow<'a, str>,
    #[serde(borrow, deserialize_with = "crate::borrowed::str_map")]
    ratios: StrMap<'a>,
}

/// JSON of the `overcommit.dev/applied` annotation, as written: keys in this order.
#[derive(Serialize)]
struct AppliedOut<'p> {
    policy: &'p str,
    ratios: RatiosOut<'p>,
}

/// A policy's ratios as written in the policy, by resource (a map in resource order).
struct RatiosOut<'p>(&'p BTreeMap<String, (String, Ratio)>);

impl Serialize for RatiosOut<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(resource, (text, _))| (resource, text)))
    }
}

/// The `overcommit.dev/raw-allocatable` map, as read back (borrowed from the annotation).
#[derive(Deserialize)]
#[serde(transparent)]
struct RawIn<'a>(#[serde(borrow, deserialize_with = "crate::borrowed::str_map")] StrMap<'a>);

/// A resource's raw allocatable as recorded: its text and value.
type RawRecord<'a> = (Cow<'a, str>, Quantity);

/// What this webhook wrote last time, read back from the annotations.
struct Previous<'a> {
    raw: VecMap<'a, RawRecord<'a>>,
    ratios: VecMap<'a, Ratio>,
}

impl Previous<'_> {
    /// What this webhook recorded for `resource`, if anything: the raw text and value, and the
    /// allocatable it wrote from them.
    fn recorded(&self, resource: &str) -> Option<(&RawRecord<'_>, Result<Quantity, InflateError>)> {
        let recorded = self.raw.get(resource)?;
        let written = match self.ratios.get(resource) {
            Some(ratio) if !ratio.is_one() => inflate(resource, &recorded.1, ratio),
            _ => Ok(recorded.1),
        };
        Some((recorded, written))
    }
}

/// Whether a node's annotations hold either overcommit annotation; if the incoming node's do
/// not, `decide` reads the stored node's.
pub fn carries_overcommit_annotations(annotations: Option<&StrMap<'_>>) -> bool {
    annotations.is_some_and(|a| {
        a.contains_key(RAW_ALLOCATABLE_ANNOTATION) || a.contains_key(APPLIED_ANNOTATION)
    })
}

/// How much of the decision to keep: the patch is always computed; the per-resource account
/// (`NodeDecision::resources`, for `review --explain` and tests) only when asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Account {
    PatchOnly,
    Full,
}

/// Decide the node's allocatable and annotations. `stored` is the node as stored (the review's
/// oldObject on UPDATE); only its annotations are read, and only if `node` carries none.
pub fn decide(
    node: &NodeView<'_>,
    stored: Option<&NodeView<'_>>,
    policies: &PolicySet,
) -> Result<NodeDecision, InflateError> {
    decide_with(node, stored, policies, Account::Full)
}

/// `decide`, keeping the per-resource account only if `account` is `Full` (the answer to a
/// review needs only the outcome and the patch).
pub fn decide_with(
    node: &NodeView<'_>,
    stored: Option<&NodeView<'_>>,
    policies: &PolicySet,
    account: Account,
) -> Result<NodeDecision, InflateError> {
    let mut notes = Vec::new();
    let carries_annotations =
        |view: &NodeView<'_>| carries_overcommit_annotations(view.annotations);
    let previous_source = if carries_annotations(node) {
        node.annotations
    } else {
        stored
            .filter(|s| carries_annotations(s))
            .and_then(|s| s.annotations)
    };
    let previous = match previous_source.map(read_previous) {
        None => None,
        Some(Ok(previous)) => Some(previous),
        Some(Err(reason)) => {
            notes.push(format!(
                "ignoring unreadable overcommit annotations: {reason}"
            ));
            None
        }
    };

    let labels = node.labels;
    let (outcome, policy) = match policies.for_node(&labels) {
        NodeChoice::Policy(p) => (NodeOutcome::Policy(p.name.clone()), Some(p)),
        NodeChoice::NoPolicy => (NodeOutcome::NoPolicy, None),
        NodeChoice::OptedOut => (NodeOutcome::OptedOut, None),
    };

    let mut patch = Vec::new();
    let mut resources = Vec::new();
    // resource -> raw text, in the allocatable map's order (sorted, unique).
    let mut raw_record: Vec<(&str, &str)> = Vec::new();
    for (name, incoming_text) in node.allocatable.into_iter().flatten() {
        let resource: &str = name;
        let ratio = policy
            .and_then(|p| p.ratios.get(resource))
            .filter(|(_, ratio)| !ratio.is_one());
        let previous_raw = match previous.as_ref().and_then(|p| p.recorded(resource)) {
            Some((raw, written)) => Some((raw, written?)),
            None => None,
        };
        if ratio.is_none() && previous_raw.is_none() {
            continue; // neither inflated before nor now: not ours
        }
        let incoming = parse(resource, incoming_text)?;
        let (raw_text, raw, raw_source) = match previous_raw {
            Some(((text, raw), written)) if written == incoming => {
                (text.as_ref(), *raw, RawSource::Annotation)
            }
            _ => (incoming_text.as_ref(), incoming, RawSource::Incoming),
        };
        let desired = match ratio {
            Some((_, ratio)) => {
                if raw_source == RawSource::Incoming {
                    check_capacity(resource, &incoming, incoming_text, node.capacity)?;
                }
                raw_record.push((resource, raw_text));
                inflate(resource, &raw, ratio)?
            }
            None => raw,
        };
        let result = || {
            if desired == raw {
                raw_text.to_string()
            } else {
                desired.to_string()
            }
        };
        if desired != incoming {
            patch.push(PatchOp::Replace {
                path: pointer(["status", "allocatable", resource]),
                value: Value::String(result()),
            });
        }
        if account == Account::Full {
            resources.push(ResourceLine {
                resource: resource.to_string(),
                incoming: incoming_text.to_string(),
                raw: raw_text.to_string(),
                raw_source,
                ratio: ratio.map(|(text, _)| text.clone()),
                result: result(),
            });
        }
    }

    let desired_annotations = policy.map(|policy| (policy, raw_record.as_slice()));
    annotation_patch(node, desired_annotations, &mut patch)?;

    Ok(NodeDecision {
        outcome,
        resources,
        notes,
        patch,
    })
}

/// floor(raw x ratio) in the resource's unit, printed like the raw value (cpu: millicores).
fn inflate(resource: &str, raw: &Quantity, ratio: &Ratio) -> Result<Quantity, InflateError> {
    let (scale, format) = if resource == "cpu" {
        (3, Format::DecimalSi)
    } else {
        (0, raw.format())
    };
    let units = ratio
        .apply_floor(raw, scale)
        .map_err(|source| InflateError::Quantity {
            resource: resource.to_string(),
            source,
        })?;
    // Beyond what the API server holds as an int64 of units: refuse rather than write a value
    // that could fail the node's status write.
    if units > MAX_UNITS {
        return Err(InflateError::Quantity {
            resource: resource.to_string(),
            source: QuantityError::Overflow(raw.to_string()),
        });
    }
    Ok(Quantity::from_units(units, scale, format))
}

fn parse(resource: &str, text: &str) -> Result<Quantity, InflateError> {
    Quantity::parse(text).map_err(|source| InflateError::Quantity {
        resource: resource.to_string(),
        source,
    })
}

/// A kubelet never reports allocatable above capacity: such a value was inflated by someone.
fn check_capacity(
    resource: &str,
    incoming: &Quantity,
    incoming_text: &str,
    capacity: Option<&StrMap<'_>>,
) -> Result<(), InflateError> {
    let Some(capacity_text) = capacity.and_then(|c| c.get(resource)) else {
        return Ok(());
    };
    // An unreadable capacity is no evidence either way.
    match Quantity::parse(capacity_text) {
        Ok(capacity) if *incoming > capacity => Err(InflateError::AboveCapacity {
            resource: resource.to_string(),
            allocatable: incoming_text.to_string(),
            capacity: capacity_text.to_string(),
        }),
        _ => Ok(()),
    }
}

fn read_previous<'a>(annotations: &'a StrMap<'_>) -> Result<Previous<'a>, String> {
    let raw_text = annotations
        .get(RAW_ALLOCATABLE_ANNOTATION)
        .ok_or_else(|| format!("{APPLIED_ANNOTATION} without {RAW_ALLOCATABLE_ANNOTATION}"))?;
    let applied_text = annotations
        .get(APPLIED_ANNOTATION)
        .ok_or_else(|| format!("{RAW_ALLOCATABLE_ANNOTATION} without {APPLIED_ANNOTATION}"))?;
    // Read without serde_json where they are as this webhook writes them (`plain_json`).
    let raw_map = match plain_json::whole_map(raw_text) {
        Some(map) => map,
        None => {
            serde_json::from_str::<RawIn<'_>>(raw_text)
                .map_err(|e| format!("{RAW_ALLOCATABLE_ANNOTATION}: {e}"))?
                .0
        }
    };
    let applied_ratios = match plain_json::applied(applied_text) {
        Some((_policy, ratios)) => ratios,
        None => {
            serde_json::from_str::<AppliedIn<'_>>(applied_text)
                .map_err(|e| format!("{APPLIED_ANNOTATION}: {e}"))?
                .ratios
        }
    };
    // Both maps come sorted: each insert is a push.
    let mut raw = VecMap::with_capacity(raw_map.len());
    for (resource, text) in raw_map {
        let quantity = Quantity::parse(&text)
            .map_err(|e| format!("{RAW_ALLOCATABLE_ANNOTATION} {resource}: {e}"))?;
        raw.insert(resource, (text, quantity));
    }
    let mut ratios = VecMap::with_capacity(applied_ratios.len());
    for (resource, text) in applied_ratios {
        let ratio =
            Ratio::parse(&text).map_err(|e| format!("{APPLIED_ANNOTATION} {resource}: {e}"))?;
        ratios.insert(resource, ratio);
    }
    Ok(Previous { raw, ratios })
}

/// The JSON of the annotation `key` (one of the two) for a node under `policy`.
fn write_annotation<W: std::io::Write>(
    key: &str,
    policy: &CompiledPolicy,
    raw_record: &[(&str, &str)],
    out: W,
) -> Result<(), serde_json::Error> {
    if key == RAW_ALLOCATABLE_ANNOTATION {
        serde_json::to_writer(out, &RawOut(raw_record))
    } else {
        let applied = AppliedOut {
            policy: &policy.name,
            ratios: RatiosOut(&policy.ratios),
        };
        serde_json::to_writer(out, &applied)
    }
}

/// The raw values recorded, by resource: in the allocatable map's order, so sorted and unique
/// (the JSON map a `BTreeMap` gives).
struct RawOut<'r>(&'r [(&'r str, &'r str)]);

impl Serialize for RawOut<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(resource, text)| (resource, text)))
    }
}

/// Whether writing produces exactly `expected` (compared as it is written: nothing is built).
fn writes_exactly(
    expected: &str,
    write: impl FnOnce(&mut SameBytes<'_>) -> Result<(), serde_json::Error>,
) -> bool {
    let mut same = SameBytes {
        rest: expected.as_bytes(),
        same: true,
    };
    write(&mut same).is_ok() && same.same && same.rest.is_empty()
}

/// An `io::Write` that compares what is written with the bytes it expects.
struct SameBytes<'e> {
    rest: &'e [u8],
    same: bool,
}

impl std::io::Write for SameBytes<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.rest.strip_prefix(buf) {
            Some(rest) if self.same => self.rest = rest,
            _ => self.same = false,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The annotation's JSON as a string.
fn annotation_value(
    key: &str,
    policy: &CompiledPolicy,
    raw_record: &[(&str, &str)],
) -> Result<String, InflateError> {
    let mut out = Vec::with_capacity(128);
    write_annotation(key, policy, raw_record, &mut out)
        .map_err(|e| InflateError::Encode(e.to_string()))?;
    String::from_utf8(out).map_err(|e| InflateError::Encode(e.to_string()))
}

/// What the annotations should say: under this policy, with these raw values recorded.
type DesiredAnnotations<'d> = Option<(&'d CompiledPolicy, &'d [(&'d str, &'d str)])>;

/// Operations that make the node's annotations what they should be.
fn annotation_patch(
    node: &NodeView<'_>,
    desired: DesiredAnnotations<'_>,
    patch: &mut Vec<PatchOp>,
) -> Result<(), InflateError> {
    const KEYS: [&str; 2] = [RAW_ALLOCATABLE_ANNOTATION, APPLIED_ANNOTATION];
    match (desired, node.annotations) {
        (Some((policy, raw_record)), None) => {
            let mut annotations = serde_json::Map::new();
            for key in KEYS {
                let value = annotation_value(key, policy, raw_record)?;
                annotations.insert(key.to_string(), Value::String(value));
            }
            patch.push(if node.has_metadata {
                PatchOp::Add {
                    path: pointer(["metadata", "annotations"]),
                    value: Value::Object(annotations),
                }
            } else {
                let mut metadata = serde_json::Map::new();
                metadata.insert("annotations".to_string(), Value::Object(annotations));
                PatchOp::Add {
                    path: pointer(["metadata"]),
                    value: Value::Object(metadata),
                }
            });
        }
        (Some((policy, raw_record)), Some(current)) => {
            for key in KEYS {
                // Usually already what it should be: compared as it is written, not built.
                let unchanged = current.get(key).is_some_and(|value| {
                    writes_exactly(value, |out| write_annotation(key, policy, raw_record, out))
                });
                if !unchanged {
                    patch.push(PatchOp::Add {
                        path: pointer(["metadata", "annotations", key]),
                        value: Value::String(annotation_value(key, policy, raw_record)?),
                    });
                }
            }
        }
        (None, Some(current)) => {
            for key in KEYS {
                if current.contains_key(key) {
                    patch.push(PatchOp::Remove {
                        path: pointer(["metadata", "annotations", key]),
                    });
                }
            }
        }
        (None, None) => {}
    }
    Ok(())
}

impl NodeDecision {
    /// A short human account: which policy, raw -> new per resource.
    pub fn explain(&self) -> String {
        let mut out = match &self.outcome {
            NodeOutcome::Policy(name) => format!("policy {name} applies\n"),
            NodeOutcome::NoPolicy => {
                "no policy selects this node: allocatable back to raw\n".to_string()
            }
            NodeOutcome::OptedOut => {
                format!(
                    "node is labelled {}=true: allocatable back to raw\n",
                    crate::policy::DISABLED_LABEL
                )
            }
        };
        for line in &self.resources {
            let source = match line.raw_source {
                RawSource::Incoming => "reported by the kubelet",
                RawSource::Annotation => "from the raw-allocatable annotation",
            };
            let how = match &line.ratio {
                Some(ratio) => format!("x {ratio}"),
                None => "restored".to_string(),
            };
            out.push_str(&format!(
                "  {}: raw {} ({source}) {how} -> {} (incoming {})\n",
                line.resource, line.raw, line.result, line.incoming
            ));
        }
        if self.resources.is_empty() {
            out.push_str("  no resource to change\n");
        }
        for note in &self.notes {
            out.push_str(&format!("  note: {note}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests;
