//! The codec of the node annotations the rule keeps its memory in. Pure.
//!
//! Written in the listed format, which CEL (the in-process MutatingAdmissionPolicy) reads
//! with `split`:
//! - `overcommit.dev/raw-allocatable`: `resource=quantity` pairs joined by `,`, for each
//!   resource this webhook inflated, in resource order (`cpu=4,memory=16Gi`; empty: none).
//! - `overcommit.dev/applied`: `policy=NAME;ratios=PAIRS;generation=N`, the policy, the ratios
//!   it applied and the policy's `metadata.generation` (`policy=batch;ratios=cpu=2;generation=3`;
//!   no generation section for a policy from a file, and none in what earlier versions wrote:
//!   both still read). Under a usage policy (`spec.usage`), a last section `;usage=PAIRS`
//!   holds the value written for each resource the usage rule set (not a fallback): a fixed
//!   ratio cannot recompute it. Static policies never write it. The generation tells the
//!   leader's policy status which nodes carry the policy's current spec; the rule itself never
//!   reads it (what is written is always computed from the raw value).
//!
//! `,`, `=` and `;` never appear in what the API server and the policy validation accept as
//! policy names, resource names, quantities and ratios; a name or value holding one (or
//! nothing, or a space) is written in the JSON format instead.
//!
//! The JSON format is what earlier versions wrote (`{"cpu":"4","memory":"16Gi"}` and
//! `{"policy":"batch","ratios":{"cpu":"2"},"usage":{...}}`): a text starting with `{` is read
//! as JSON, so a node written by an earlier version is read as it was meant, and rewritten in
//! the listed format at its next write (its allocatable unchanged: the rule's tables check it).
//! JSON is read with `overcommit_json::plain` where written as earlier versions wrote it, with
//! serde_json otherwise. Both formats are compared with what a node carries as they would be
//! written, so that the usual review builds no string.

use std::borrow::Cow;
use std::collections::BTreeMap;

use overcommit_json::{StrMap, VecMap, borrowed, plain};
use serde::{Deserialize, Serialize};

use crate::policy::CompiledPolicy;
use crate::quantity::{Quantity, Ratio};

/// Node annotation: the kubelet's allocatable for each inflated resource (`cpu=4,memory=16Gi`).
pub const RAW_ALLOCATABLE_ANNOTATION: &str = "overcommit.dev/raw-allocatable";
/// Node annotation: what was applied (`policy=batch;ratios=cpu=2,memory=1.5`).
pub const APPLIED_ANNOTATION: &str = "overcommit.dev/applied";
/// Both, in the order they are written. A node review whose object carries either needs not
/// the stored node's (the review's reader is handed this list).
pub const OVERCOMMIT_ANNOTATIONS: [&str; 2] = [RAW_ALLOCATABLE_ANNOTATION, APPLIED_ANNOTATION];

/// Why the annotations could not be read back (the rule then ignores them and notes why).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationError {
    #[error("{present} without {missing}")]
    Missing {
        present: &'static str,
        missing: &'static str,
    },
    #[error("{annotation}: {reason}")]
    Json {
        annotation: &'static str,
        reason: String,
    },
    #[error("{annotation}: {reason}")]
    Listed {
        annotation: &'static str,
        reason: String,
    },
    #[error("{annotation} {resource}: {reason}")]
    Value {
        annotation: &'static str,
        resource: String,
        reason: String,
    },
}

/// Whether a node's annotations hold either overcommit annotation.
pub fn carries_overcommit_annotations(annotations: Option<&StrMap<'_>>) -> bool {
    annotations.is_some_and(|a| OVERCOMMIT_ANNOTATIONS.iter().any(|key| a.contains_key(key)))
}

/// A resource's raw allocatable as recorded: its text and value.
pub(super) type RawRecord<'a> = (Cow<'a, str>, Quantity);

/// What this webhook wrote last time, read back from the annotations.
pub(super) struct Recorded<'a> {
    raw: VecMap<'a, RawRecord<'a>>,
    ratios: RecordedRatios<'a>,
    /// Values the usage rule wrote (empty under a static policy).
    usage: VecMap<'a, Quantity>,
}

/// The ratios the applied annotation records.
enum RecordedRatios<'a> {
    /// The annotation says exactly what the node's policy writes (the usual review): its
    /// ratios, with nothing to parse.
    Policy(&'a BTreeMap<String, (String, Ratio)>),
    /// Read from the annotation.
    Read(VecMap<'a, Ratio>),
}

impl RecordedRatios<'_> {
    fn get(&self, resource: &str) -> Option<&Ratio> {
        match self {
            RecordedRatios::Policy(ratios) => ratios.get(resource).map(|(_, ratio)| ratio),
            RecordedRatios::Read(ratios) => ratios.get(resource),
        }
    }
}

/// What was written for one resource: by a ratio (none: by 1), or a value the usage rule set.
pub(super) enum Written<'r> {
    Ratio(Option<&'r Ratio>),
    Usage(&'r Quantity),
}

impl Recorded<'_> {
    /// The raw value recorded for `resource`, and how its allocatable was written.
    pub(super) fn get(&self, resource: &str) -> Option<(&RawRecord<'_>, Written<'_>)> {
        let raw = self.raw.get(resource)?;
        if !self.usage.is_empty()
            && let Some(written) = self.usage.get(resource)
        {
            return Some((raw, Written::Usage(written)));
        }
        Some((raw, Written::Ratio(self.ratios.get(resource))))
    }
}

/// JSON of the `overcommit.dev/applied` annotation, as read back (borrowed from the annotation).
#[derive(Debug, Deserialize)]
struct AppliedIn<'a> {
    /// Required (an annotation without it is unreadable); the rule itself does not use it.
    #[serde(borrow, deserialize_with = "borrowed::str")]
    policy: Cow<'a, str>,
    #[serde(borrow, deserialize_with = "borrowed::str_map")]
    ratios: StrMap<'a>,
    #[serde(default, borrow, deserialize_with = "borrowed::str_map")]
    usage: StrMap<'a>,
    /// A usage policy's ceilings (absent: a static policy, or written before they were recorded).
    #[serde(
        default,
        borrow,
        rename = "maxRatios",
        deserialize_with = "borrowed::str_map"
    )]
    max_ratios: StrMap<'a>,
    /// The policy's generation (absent: written before it was recorded, or by a file policy).
    #[serde(default)]
    generation: Option<i64>,
}

/// The `overcommit.dev/raw-allocatable` map, as read back (borrowed from the annotation).
#[derive(Deserialize)]
#[serde(transparent)]
struct RawIn<'a>(#[serde(borrow, deserialize_with = "borrowed::str_map")] StrMap<'a>);

/// The `overcommit.dev/raw-allocatable` annotation as a map, resource -> the kubelet's
/// quantity as written, in either format (for readers outside the rule: metrics, `status`,
/// the placement cap). The quantities are not parsed here.
pub fn raw_allocatable_map(text: &str) -> Result<BTreeMap<String, String>, AnnotationError> {
    let map = if is_json(text) {
        serde_json::from_str::<RawIn<'_>>(text)
            .map_err(|e| AnnotationError::Json {
                annotation: RAW_ALLOCATABLE_ANNOTATION,
                reason: e.to_string(),
            })?
            .0
    } else {
        listed_map(text).map_err(|reason| AnnotationError::Listed {
            annotation: RAW_ALLOCATABLE_ANNOTATION,
            reason,
        })?
    };
    Ok(map
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

/// Read both annotations back. Both must be there and readable, or neither counts. `policy`
/// is the node's policy now: an applied annotation that says exactly what it writes is taken
/// as its ratios without parsing (the same values: the text is made from the policy's).
pub(super) fn read<'a>(
    annotations: &'a StrMap<'_>,
    policy: Option<&'a CompiledPolicy>,
) -> Result<Recorded<'a>, AnnotationError> {
    let missing = |present, missing| AnnotationError::Missing { present, missing };
    let json = |annotation| {
        move |e: serde_json::Error| AnnotationError::Json {
            annotation,
            reason: e.to_string(),
        }
    };
    let raw_text = annotations
        .get(RAW_ALLOCATABLE_ANNOTATION)
        .ok_or_else(|| missing(APPLIED_ANNOTATION, RAW_ALLOCATABLE_ANNOTATION))?;
    let applied_text = annotations
        .get(APPLIED_ANNOTATION)
        .ok_or_else(|| missing(RAW_ALLOCATABLE_ANNOTATION, APPLIED_ANNOTATION))?;
    let listed = |annotation| move |reason: String| AnnotationError::Listed { annotation, reason };
    let raw_map = if is_json(raw_text) {
        match plain::whole_map(raw_text) {
            Some(map) => map,
            None => {
                serde_json::from_str::<RawIn<'_>>(raw_text)
                    .map_err(json(RAW_ALLOCATABLE_ANNOTATION))?
                    .0
            }
        }
    } else {
        listed_map(raw_text).map_err(listed(RAW_ALLOCATABLE_ANNOTATION))?
    };
    if let Some(policy) = policy
        && static_applied(policy) == Some(applied_text.as_ref())
    {
        let raw = raw_records(raw_map)?;
        return Ok(Recorded {
            raw,
            ratios: RecordedRatios::Policy(&policy.ratios),
            usage: VecMap::default(),
        });
    }
    let (applied_ratios, applied_usage) = if !is_json(applied_text) {
        let applied = listed_applied(applied_text).map_err(listed(APPLIED_ANNOTATION))?;
        (applied.ratios, applied.usage)
    } else {
        match plain::string_then_map(applied_text, "policy", "ratios") {
            Some((_policy, ratios)) => (ratios, StrMap::default()),
            None => {
                let applied = serde_json::from_str::<AppliedIn<'_>>(applied_text)
                    .map_err(json(APPLIED_ANNOTATION))?;
                (applied.ratios, applied.usage)
            }
        }
    };
    let raw = raw_records(raw_map)?;
    // Sorted: each insert is a push.
    let mut ratios = VecMap::with_capacity(applied_ratios.len());
    for (resource, text) in applied_ratios {
        let ratio = Ratio::parse(&text)
            .map_err(|e| value_error(APPLIED_ANNOTATION, &resource, e.to_string()))?;
        ratios.insert(resource, ratio);
    }
    let mut usage = VecMap::with_capacity(applied_usage.len());
    for (resource, text) in applied_usage {
        let written = Quantity::parse(&text)
            .map_err(|e| value_error(APPLIED_ANNOTATION, &resource, e.to_string()))?;
        usage.insert(resource, written);
    }
    Ok(Recorded {
        raw,
        ratios: RecordedRatios::Read(ratios),
        usage,
    })
}

fn value_error(annotation: &'static str, resource: &str, reason: String) -> AnnotationError {
    AnnotationError::Value {
        annotation,
        resource: resource.to_string(),
        reason,
    }
}

/// The raw values recorded, parsed (the map comes sorted: each insert is a push).
fn raw_records<'a>(raw_map: StrMap<'a>) -> Result<VecMap<'a, RawRecord<'a>>, AnnotationError> {
    let mut raw = VecMap::with_capacity(raw_map.len());
    for (resource, text) in raw_map {
        let quantity = Quantity::parse(&text)
            .map_err(|e| value_error(RAW_ALLOCATABLE_ANNOTATION, &resource, e.to_string()))?;
        raw.insert(resource, (text, quantity));
    }
    Ok(raw)
}

/// Whether an annotation's text is the JSON this webhook wrote before the listed format (an
/// object: the listed format never starts with `{`).
fn is_json(text: &str) -> bool {
    text.trim_start().starts_with('{')
}

/// The bytes the listed format gives a meaning: a name or value holding one (or a control
/// character, or empty) is written as JSON instead. Names (policies, resources) and values
/// (quantities, ratios) as the API server and the policy validation accept them never do.
fn is_listable(text: &str) -> bool {
    !text.is_empty() && !text.starts_with('{') && text.bytes().all(is_listed_byte)
}

/// A byte a listed name or value may hold: not a separator, a space or a control character.
fn is_listed_byte(byte: u8) -> bool {
    byte > b' ' && !matches!(byte, b',' | b'=' | b';')
}

/// `name=value,name=value,...` (empty: none), borrowed; a name given twice is refused. One
/// pass over the bytes (this runs on every node review: `str::split` cost ~500 instructions
/// per entry).
fn listed_map(text: &str) -> Result<StrMap<'_>, String> {
    let mut map = StrMap::with_capacity(4);
    let bytes = text.as_bytes();
    let mut start = 0;
    while start < bytes.len() {
        let (name, value, end) = listed_entry(text, start).ok_or_else(|| {
            let rest = bytes.get(start..).unwrap_or_default();
            let end = rest
                .iter()
                .position(|&b| b == b',')
                .map_or(text.len(), |n| start + n);
            format!(
                "{:?} is not name=value",
                text.get(start..end).unwrap_or(text)
            )
        })?;
        if !map.insert_new(Cow::Borrowed(name), Cow::Borrowed(value)) {
            return Err(format!("{name} given twice"));
        }
        start = match bytes.get(end) {
            // A trailing comma leaves an empty entry.
            Some(_) if end + 1 == bytes.len() => return Err("\"\" is not name=value".into()),
            Some(_) => end + 1,
            None => end,
        };
    }
    Ok(map)
}

/// The entry `name=value` from `start` of `text`: name, value and the index of the `,` after
/// it (or the end). `None` where it is not one.
fn listed_entry(text: &str, start: usize) -> Option<(&str, &str, usize)> {
    let bytes = text.as_bytes();
    let name_len = bytes
        .get(start..)?
        .iter()
        .position(|&b| !is_listed_byte(b))?;
    let equals = start + name_len;
    if name_len == 0 || bytes.get(equals) != Some(&b'=') {
        return None;
    }
    let value_start = equals + 1;
    let rest = bytes.get(value_start..)?;
    let value_len = rest
        .iter()
        .position(|&b| !is_listed_byte(b))
        .unwrap_or(rest.len());
    let end = value_start + value_len;
    if value_len == 0 || !matches!(bytes.get(end), None | Some(b',')) {
        return None;
    }
    let (name, value) = (text.get(start..equals)?, text.get(value_start..end)?);
    (!name.starts_with('{') && !value.starts_with('{')).then_some((name, value, end))
}

/// `policy=NAME;ratios=LIST[;generation=N][;maxRatios=LIST][;usage=LIST]`: the ratios, a usage
/// policy's ceilings and the usage values (each empty when absent) and the policy's generation
/// (None when absent: written before it was recorded, or by a policy from a file).
fn listed_applied(text: &str) -> Result<ListedApplied<'_>, String> {
    let mut sections = text.split(';').peekable();
    let mut section = |name: &str, optional: bool| -> Result<Option<&str>, String> {
        let Some(current) = sections.peek().copied() else {
            return Ok(None);
        };
        match current.strip_prefix(name).and_then(|s| s.strip_prefix('=')) {
            Some(value) => {
                sections.next();
                Ok(Some(value))
            }
            None if optional => Ok(None),
            None => Err(format!("{current:?} where {name}= belongs")),
        }
    };
    let policy = section("policy", false)?.ok_or("no policy=")?;
    if !is_listable(policy) {
        return Err(format!("policy {policy:?} is not a name"));
    }
    let ratios = listed_map(section("ratios", false)?.ok_or("no ratios=")?)?;
    let generation = match section("generation", true)? {
        Some(text) => Some(parse_generation(text)?),
        None => None,
    };
    let max_ratios = match section("maxRatios", true)? {
        Some(max) => listed_map(max)?,
        None => StrMap::default(),
    };
    let usage = match section("usage", false)? {
        Some(usage) => listed_map(usage)?,
        None => StrMap::default(),
    };
    if let Some(extra) = sections.next() {
        return Err(format!("{extra:?} after the last section"));
    }
    Ok(ListedApplied {
        policy,
        ratios,
        generation,
        max_ratios,
        usage,
    })
}

/// The sections of a listed applied annotation.
struct ListedApplied<'a> {
    policy: &'a str,
    ratios: StrMap<'a>,
    generation: Option<i64>,
    max_ratios: StrMap<'a>,
    usage: StrMap<'a>,
}

/// A generation as written: decimal digits, at least 1 (what the API server sets).
fn parse_generation(text: &str) -> Result<i64, String> {
    text.parse::<i64>()
        .ok()
        .filter(|g| *g >= 1 && text.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| format!("generation {text:?} is not a positive integer"))
}

/// What a node's `overcommit.dev/applied` annotation says, for readers outside the rule (the
/// leader's policy status, `status`): which policy, at which generation, and whether the usage
/// rule set a value (else the node is on its policy's ratios: a static policy, or a usage
/// policy's fallback).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedSummary {
    pub policy: String,
    /// None: written before generations were recorded, or by a policy without one (a file).
    pub generation: Option<i64>,
    /// The ratios as written, by resource (a usage policy's: its fallback `nodeRatios`).
    pub ratios: BTreeMap<String, String>,
    /// A usage policy's ceilings (`spec.usage.maxRatios`) as written, by resource (empty: a
    /// static policy, or written before ceilings were recorded).
    pub max_ratios: BTreeMap<String, String>,
    /// The values the usage rule wrote, by resource (empty: none).
    pub usage: BTreeMap<String, String>,
}

/// Read an `overcommit.dev/applied` annotation, in either format.
pub fn applied_summary(text: &str) -> Result<AppliedSummary, AnnotationError> {
    let owned = |map: &StrMap<'_>| -> BTreeMap<String, String> {
        map.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    if is_json(text) {
        let applied =
            serde_json::from_str::<AppliedIn<'_>>(text).map_err(|e| AnnotationError::Json {
                annotation: APPLIED_ANNOTATION,
                reason: e.to_string(),
            })?;
        return Ok(AppliedSummary {
            policy: applied.policy.to_string(),
            generation: applied.generation,
            ratios: owned(&applied.ratios),
            max_ratios: owned(&applied.max_ratios),
            usage: owned(&applied.usage),
        });
    }
    let listed = listed_applied(text).map_err(|reason| AnnotationError::Listed {
        annotation: APPLIED_ANNOTATION,
        reason,
    })?;
    Ok(AppliedSummary {
        policy: listed.policy.to_string(),
        generation: listed.generation,
        ratios: owned(&listed.ratios),
        max_ratios: owned(&listed.max_ratios),
        usage: owned(&listed.usage),
    })
}

/// What the annotations should say: under this policy, with these raw values recorded
/// (resource -> raw text, in the allocatable map's order: sorted and unique).
#[derive(Clone, Copy)]
pub(super) struct Desired<'d> {
    pub(super) policy: &'d CompiledPolicy,
    pub(super) raw_record: &'d [(&'d str, &'d str)],
    /// resource -> allocatable the usage rule wrote, sorted and unique (empty: static).
    pub(super) usage_written: &'d [(&'d str, Quantity)],
}

impl Desired<'_> {
    /// Whether annotation `key` (one of `OVERCOMMIT_ANNOTATIONS`) already says exactly this (compared as it is
    /// written: nothing is built but the usage rule's values).
    pub(super) fn is_written(&self, key: &str, current: &str) -> bool {
        if !self.is_listable(key) {
            return writes_exactly(current, |out| self.write_json(key, out));
        }
        let mut expect = Expected(current.as_bytes());
        self.listed(key, |piece| expect.literal(piece)) && expect.0.is_empty()
    }

    /// The text of annotation `key` (one of `OVERCOMMIT_ANNOTATIONS`).
    pub(super) fn value(&self, key: &str) -> Result<String, serde_json::Error> {
        if self.is_listable(key) {
            let mut out = String::with_capacity(96);
            self.listed(key, |piece| {
                out.push_str(piece);
                true
            });
            return Ok(out);
        }
        let mut out = Vec::with_capacity(128);
        self.write_json(key, &mut out)?;
        // serde_json writes UTF-8.
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Whether every name and value annotation `key` holds can be written in the listed format
    /// (always, for what the API server and the policy validation accept).
    fn is_listable(&self, key: &str) -> bool {
        let pair = |(name, value): (&str, &str)| is_listable(name) && is_listable(value);
        if key == RAW_ALLOCATABLE_ANNOTATION {
            return self.raw_record.iter().copied().all(pair);
        }
        static_applied(self.policy).is_some()
            && self
                .usage_written
                .iter()
                .all(|(resource, value)| is_listable(resource) && is_listable(&value.to_string()))
    }

    /// Annotation `key` in the listed format, piece by piece to `piece` (which says whether to
    /// go on): `cpu=4,memory=16Gi` and `policy=batch;ratios=cpu=2,memory=1.5`, with
    /// `;usage=cpu=6` where the usage rule wrote a value. Whether every piece was taken.
    fn listed(&self, key: &str, mut piece: impl FnMut(&str) -> bool) -> bool {
        if key == RAW_ALLOCATABLE_ANNOTATION {
            return list(self.raw_record.iter().copied(), &mut piece);
        }
        let static_part = static_applied(self.policy).is_some_and(&mut piece);
        if !static_part || self.usage_written.is_empty() {
            return static_part;
        }
        let texts: Vec<(&str, String)> = self
            .usage_written
            .iter()
            .map(|(resource, value)| (*resource, value.to_string()))
            .collect();
        piece(";usage=") && list(texts.iter().map(|(r, t)| (*r, t.as_str())), &mut piece)
    }

    /// The JSON this webhook wrote before the listed format, for names or values the listed
    /// format cannot hold.
    fn write_json<W: std::io::Write>(&self, key: &str, out: W) -> Result<(), serde_json::Error> {
        if key == RAW_ALLOCATABLE_ANNOTATION {
            serde_json::to_writer(out, &RawOut(self.raw_record))
        } else {
            let applied = AppliedOut {
                policy: &self.policy.name,
                ratios: RatiosOut(&self.policy.ratios),
                generation: self.policy.generation,
                max_ratios: MaxRatiosOut(self.policy),
                usage: UsageOut(self.usage_written),
            };
            serde_json::to_writer(out, &applied)
        }
    }
}

/// `policy=NAME;ratios=LIST[;generation=N][;maxRatios=LIST]`, a policy's part of the applied
/// annotation (None: its name or a ratio cannot be listed), made once per policy: every node it
/// inflates carries it.
fn static_applied(policy: &CompiledPolicy) -> Option<&str> {
    policy
        .applied_listed
        .get_or_init(|| {
            let pair = |(name, value): (&str, &str)| is_listable(name) && is_listable(value);
            let ratios = || {
                policy
                    .ratios
                    .iter()
                    .map(|(r, (t, _))| (r.as_str(), t.as_str()))
            };
            if !is_listable(&policy.name)
                || !ratios().all(pair)
                || !max_ratio_texts(policy).all(pair)
            {
                return None;
            }
            let mut out = format!("policy={};ratios=", policy.name);
            list(ratios(), &mut |piece| {
                out.push_str(piece);
                true
            });
            if let Some(generation) = policy.generation {
                out.push_str(&format!(";generation={generation}"));
            }
            if policy.usage.is_some() {
                out.push_str(";maxRatios=");
                list(max_ratio_texts(policy), &mut |piece| {
                    out.push_str(piece);
                    true
                });
            }
            Some(out)
        })
        .as_deref()
}

/// `name=value` pairs joined by `,`, piece by piece to `piece`; whether every piece was taken.
fn list<'p>(
    pairs: impl Iterator<Item = (&'p str, &'p str)>,
    piece: &mut impl FnMut(&str) -> bool,
) -> bool {
    let mut pairs = pairs.enumerate();
    pairs.all(|(n, (name, value))| {
        (n == 0 || piece(",")) && piece(name) && piece("=") && piece(value)
    })
}

/// JSON of the `overcommit.dev/applied` annotation, as written: keys in this order.
#[derive(Serialize)]
struct AppliedOut<'p> {
    policy: &'p str,
    ratios: RatiosOut<'p>,
    #[serde(skip_serializing_if = "Option::is_none")]
    generation: Option<i64>,
    #[serde(rename = "maxRatios", skip_serializing_if = "MaxRatiosOut::is_empty")]
    max_ratios: MaxRatiosOut<'p>,
    #[serde(skip_serializing_if = "UsageOut::is_empty")]
    usage: UsageOut<'p>,
}

/// A usage policy's ceilings, by resource (none: a static policy).
struct MaxRatiosOut<'p>(&'p CompiledPolicy);

impl MaxRatiosOut<'_> {
    fn is_empty(&self) -> bool {
        self.0.usage.is_none()
    }
}

impl Serialize for MaxRatiosOut<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(max_ratio_texts(self.0))
    }
}

/// A usage policy's ceilings as written, by resource in order (none: a static policy).
fn max_ratio_texts(policy: &CompiledPolicy) -> impl Iterator<Item = (&str, &str)> {
    policy
        .usage
        .iter()
        .flat_map(|u| u.targets.iter())
        .map(|(resource, target)| (resource.as_str(), target.max_ratio.0.as_str()))
}

/// Values the usage rule wrote, by resource (sorted and unique).
struct UsageOut<'u>(&'u [(&'u str, Quantity)]);

impl UsageOut<'_> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for UsageOut<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(
            self.0
                .iter()
                .map(|(resource, value)| (resource, value.to_string())),
        )
    }
}

/// A policy's ratios as written in the policy, by resource (a map in resource order).
struct RatiosOut<'p>(&'p BTreeMap<String, (String, Ratio)>);

impl Serialize for RatiosOut<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(resource, (text, _))| (resource, text)))
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

/// What an annotation should say, compared piece by piece as it would be written: `literal`
/// says whether its piece came next (and consumes it).
struct Expected<'e>(&'e [u8]);

impl Expected<'_> {
    fn literal(&mut self, piece: &str) -> bool {
        match self.0.strip_prefix(piece.as_bytes()) {
            Some(rest) => {
                self.0 = rest;
                true
            }
            None => false,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(name: &str, ratios: &[(&str, &str)]) -> CompiledPolicy {
        CompiledPolicy {
            name: name.to_string(),
            priority: 0,
            selector: Default::default(),
            ratios: ratios
                .iter()
                // As compiled: the ratio is its text's.
                .map(|(r, t)| (r.to_string(), (t.to_string(), Ratio::parse(t).unwrap())))
                .collect(),
            pod_defaults: None,
            usage: None,
            cap: None,
            pressure: None,
            eviction: None,
            generation: None,
            staged: false,
            applied_listed: Default::default(),
        }
    }

    /// Comparing piece by piece answers as comparing with the text written does, for names,
    /// resources and values the listed format holds and ones it leaves to JSON, and for current
    /// texts that differ anywhere; and what is written reads back as what was meant.
    #[test]
    fn comparison_answers_as_the_written_text_and_reads_back() {
        let policies = [
            policy("batch", &[("cpu", "2"), ("memory", "1.5")]),
            policy("b\"q", &[("cpu", "2")]),
            policy("nl\n", &[]),
            policy("x", &[("a\\b", "2"), ("cpu", "3")]),
            policy("semi;colon", &[("cpu", "2")]),
        ];
        let raws: [&[(&str, &str)]; 5] = [
            &[("cpu", "4"), ("memory", "16Gi")],
            &[],
            &[("cpu", "4\"")],
            &[("example.com/gpu", "2"), ("pods", "110")],
            &[("a=b", "1"), ("c", "2,3")],
        ];
        let usage = [("cpu", Quantity::parse("8").unwrap())];
        for policy in &policies {
            for raw_record in raws {
                for usage_written in [&[][..], &usage[..]] {
                    let desired = Desired {
                        policy,
                        raw_record,
                        usage_written,
                    };
                    let mut annotations = StrMap::new();
                    for key in OVERCOMMIT_ANNOTATIONS {
                        let written = desired.value(key).unwrap();
                        let listed = desired.is_listable(key);
                        assert_eq!(!is_json(&written), listed, "{key}: {written}");
                        let mut currents = vec![written.clone(), String::new(), "{}".into()];
                        // Every shorter, longer and one-byte-different text.
                        for cut in 0..written.len() {
                            currents.push(written[..cut].to_string());
                            let mut changed = written.clone().into_bytes();
                            changed[cut] = if changed[cut] == b'x' { b'y' } else { b'x' };
                            currents.push(String::from_utf8_lossy(&changed).into_owned());
                        }
                        currents.push(format!("{written} "));
                        for current in &currents {
                            assert_eq!(
                                desired.is_written(key, current),
                                *current == written,
                                "{key}: {current:?} vs {written:?}"
                            );
                        }
                        annotations.insert(Cow::Owned(key.to_string()), Cow::Owned(written));
                    }
                    if raw_record.iter().any(|(_, v)| Quantity::parse(v).is_err()) {
                        continue; // written and compared, but not a quantity to read back
                    }
                    // Read alone, and knowing the node's policy (its own text is then taken
                    // as its ratios, unparsed): the same either way.
                    for known in [None, Some(policy)] {
                        let recorded = read(&annotations, known).unwrap_or_else(|e| panic!("{e}"));
                        for (resource, text) in raw_record {
                            let Some(((raw_text, _), _)) = recorded.get(resource) else {
                                panic!("{resource} not recorded");
                            };
                            assert_eq!(raw_text, text);
                        }
                        for (resource, (text, _)) in &policy.ratios {
                            let ratio = recorded.ratios.get(resource.as_str());
                            assert_eq!(ratio, Ratio::parse(text).ok().as_ref(), "{resource}");
                        }
                        assert_eq!(recorded.usage.len(), usage_written.len());
                        let unparsed = matches!(recorded.ratios, RecordedRatios::Policy(_));
                        let own_text = static_applied(policy).is_some() && usage_written.is_empty();
                        assert_eq!(unparsed, known.is_some() && own_text, "{}", policy.name);
                    }
                }
            }
        }
    }

    /// Knowing the node's policy never changes what is read: an applied annotation written
    /// under other ratios, another policy or the usage rule is read from its text.
    #[test]
    fn a_text_other_than_the_policys_own_is_read_from_the_text() {
        let now = policy("batch", &[("cpu", "2"), ("memory", "1.5")]);
        let read_with = |applied: &str| {
            let mut annotations = StrMap::new();
            annotations.insert(
                Cow::Borrowed(RAW_ALLOCATABLE_ANNOTATION),
                Cow::Borrowed("cpu=4,memory=16Gi"),
            );
            annotations.insert(Cow::Borrowed(APPLIED_ANNOTATION), Cow::Borrowed(applied));
            let recorded = read(&annotations, Some(&now)).unwrap_or_else(|e| panic!("{e}"));
            let ratio = |r| recorded.ratios.get(r).map(|r: &Ratio| r.to_string());
            let unparsed = matches!(recorded.ratios, RecordedRatios::Policy(_));
            (
                ratio("cpu"),
                ratio("memory"),
                unparsed,
                recorded.usage.len(),
            )
        };
        let s = |t: &str| Some(t.to_string());
        // Applied text -> cpu and memory ratios read, whether unparsed, usage values read.
        type Read = (Option<String>, Option<String>, bool, usize);
        let cases: &[(&str, Read)] = &[
            (
                "policy=batch;ratios=cpu=2,memory=1.5",
                (s("2"), s("1.5"), true, 0),
            ),
            (
                "policy=batch;ratios=cpu=3,memory=1.5",
                (s("3"), s("1.5"), false, 0),
            ),
            ("policy=batch;ratios=cpu=2", (s("2"), None, false, 0)),
            (
                "policy=other;ratios=cpu=2,memory=1.5",
                (s("2"), s("1.5"), false, 0),
            ),
            (
                "policy=batch;ratios=cpu=2,memory=1.5;usage=cpu=6",
                (s("2"), s("1.5"), false, 1),
            ),
            (
                r#"{"policy":"batch","ratios":{"cpu":"2","memory":"1.5"}}"#,
                (s("2"), s("1.5"), false, 0),
            ),
        ];
        for (applied, want) in cases {
            assert_eq!(&read_with(applied), want, "{applied}");
        }
    }

    /// The listed format as the in-process policy's CEL reads it, and what is refused.
    #[test]
    fn listed_annotations_read_back_or_are_refused() {
        let read_pair = |raw: &str, applied: &str| {
            let mut annotations = StrMap::new();
            annotations.insert(
                Cow::Borrowed(RAW_ALLOCATABLE_ANNOTATION),
                Cow::Borrowed(raw),
            );
            annotations.insert(Cow::Borrowed(APPLIED_ANNOTATION), Cow::Borrowed(applied));
            read(&annotations, None)
                .map(|r| {
                    let raw: Vec<String> =
                        r.raw.iter().map(|(k, (t, _))| format!("{k}={t}")).collect();
                    let usage: Vec<String> =
                        r.usage.iter().map(|(k, q)| format!("{k}={q}")).collect();
                    let ratios = match r.ratios {
                        RecordedRatios::Read(ratios) => ratios.len(),
                        RecordedRatios::Policy(ratios) => ratios.len(),
                    };
                    (raw.join(","), ratios, usage.join(","))
                })
                .map_err(|e| e.to_string())
        };
        let ok = |raw: &str, ratios, usage: &str| Ok((raw.to_string(), ratios, usage.to_string()));
        type Read = Result<(String, usize, String), String>;
        let cases: &[(&str, &str, Read)] = &[
            (
                "cpu=4,memory=16Gi",
                "policy=batch;ratios=cpu=2,memory=1.5",
                ok("cpu=4,memory=16Gi", 2, ""),
            ),
            (
                "example.com/gpu=2",
                "policy=gpu;ratios=example.com/gpu=2",
                ok("example.com/gpu=2", 1, ""),
            ),
            ("", "policy=none;ratios=", ok("", 0, "")),
            // Written by hand out of order: read in resource order.
            (
                "memory=16Gi,cpu=4",
                "policy=b;ratios=memory=1.5,cpu=2",
                ok("cpu=4,memory=16Gi", 2, ""),
            ),
            (
                "cpu=4",
                "policy=u;ratios=cpu=2;usage=cpu=6",
                ok("cpu=4", 1, "cpu=6"),
            ),
            // The policy's generation, before the usage values.
            (
                "cpu=4",
                "policy=b;ratios=cpu=2;generation=7",
                ok("cpu=4", 1, ""),
            ),
            (
                "cpu=4",
                "policy=u;ratios=cpu=2;generation=7;usage=cpu=6",
                ok("cpu=4", 1, "cpu=6"),
            ),
            // The JSON written before the listed format still reads.
            (
                r#"{"cpu":"4"}"#,
                r#"{"policy":"batch","ratios":{"cpu":"2"}}"#,
                ok("cpu=4", 1, ""),
            ),
            (
                "cpu=4",
                r#"{"policy":"batch","ratios":{"cpu":"2"}}"#,
                ok("cpu=4", 1, ""),
            ),
        ];
        for (raw, applied, expected) in cases {
            assert_eq!(&read_pair(raw, applied), expected, "{raw} / {applied}");
        }
        // The usual applied annotation, where the raw one is the case.
        const A: &str = "policy=a;ratios=cpu=2";
        let refused: &[(&str, &str, &str)] = &[
            ("cpu=4,cpu=5", A, "cpu given twice"),
            ("cpu", A, "is not name=value"),
            ("cpu=", A, "is not name=value"),
            ("cpu=4,", A, "is not name=value"),
            ("cpu= 4", A, "is not name=value"),
            (",cpu=4", A, "is not name=value"),
            ("cpu=4,,memory=1", A, "is not name=value"),
            ("cpu=4=5", A, "is not name=value"),
            ("cpu={4}", A, "is not name=value"),
            ("=4", A, "is not name=value"),
            ("memory=1,cpu=4,memory=2", A, "memory given twice"),
            ("cpu=4", "policy=a;ratios=cpu=2,", "is not name=value"),
            ("cpu=4", "policy=a;ratios=cpu=2;", "where usage= belongs"),
            ("cpu=four", A, "overcommit.dev/raw-allocatable cpu"),
            ("cpu=4", "ratios=cpu=2;policy=a", "where policy= belongs"),
            ("cpu=4", "policy=a", "no ratios="),
            ("cpu=4", "policy=;ratios=cpu=2", "is not a name"),
            (
                "cpu=4",
                "policy=a;ratios=cpu=2;usage=cpu=6;x=1",
                "after the last section",
            ),
            (
                "cpu=4",
                "policy=a;ratios=cpu=two",
                "overcommit.dev/applied cpu",
            ),
            (
                "cpu=4",
                "policy=a;ratios=cpu=2;generation=",
                "not a positive",
            ),
            (
                "cpu=4",
                "policy=a;ratios=cpu=2;generation=0",
                "not a positive",
            ),
            (
                "cpu=4",
                "policy=a;ratios=cpu=2;generation=+3",
                "not a positive",
            ),
            (
                "cpu=4",
                "policy=a;ratios=cpu=2;generation=x",
                "not a positive",
            ),
            (
                "cpu=4",
                "policy=a;ratios=cpu=2;usage=cpu=6;generation=3",
                "after the last section",
            ),
        ];
        for (raw, applied, reason) in refused {
            match read_pair(raw, applied) {
                Err(e) => assert!(e.contains(reason), "{raw} / {applied}: {e}"),
                Ok(read) => panic!("{raw} / {applied} read as {read:?}"),
            }
        }
    }

    /// What readers outside the rule see: the policy, its generation (absent in what earlier
    /// versions wrote), the ratios and the usage values; in both formats.
    #[test]
    fn applied_summary_reads_both_formats_with_and_without_generation() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let summary = |policy: &str, generation, ratios, usage| AppliedSummary {
            policy: policy.to_string(),
            generation,
            ratios: map(ratios),
            max_ratios: BTreeMap::new(),
            usage: map(usage),
        };
        let ceilings = |summary: AppliedSummary, max: &[(&str, &str)]| AppliedSummary {
            max_ratios: map(max),
            ..summary
        };
        let cases: &[(&str, AppliedSummary)] = &[
            (
                "policy=u;ratios=cpu=2;generation=3;maxRatios=cpu=4;usage=cpu=6",
                ceilings(
                    summary("u", Some(3), &[("cpu", "2")], &[("cpu", "6")]),
                    &[("cpu", "4")],
                ),
            ),
            (
                "policy=u;ratios=;maxRatios=cpu=4,memory=1.5",
                ceilings(
                    summary("u", None, &[], &[]),
                    &[("cpu", "4"), ("memory", "1.5")],
                ),
            ),
            (
                r#"{"policy":"u q","ratios":{},"generation":2,"maxRatios":{"cpu":"3"}}"#,
                ceilings(summary("u q", Some(2), &[], &[]), &[("cpu", "3")]),
            ),
            (
                "policy=batch;ratios=cpu=2,memory=1.5",
                summary("batch", None, &[("cpu", "2"), ("memory", "1.5")], &[]),
            ),
            (
                "policy=batch;ratios=cpu=2;generation=12",
                summary("batch", Some(12), &[("cpu", "2")], &[]),
            ),
            (
                "policy=u;ratios=cpu=2;generation=3;usage=cpu=6",
                summary("u", Some(3), &[("cpu", "2")], &[("cpu", "6")]),
            ),
            (
                "policy=u;ratios=cpu=2;usage=cpu=6",
                summary("u", None, &[("cpu", "2")], &[("cpu", "6")]),
            ),
            (
                r#"{"policy":"batch","ratios":{"cpu":"2"}}"#,
                summary("batch", None, &[("cpu", "2")], &[]),
            ),
            (
                r#"{"policy":"b q","ratios":{"cpu":"2"},"generation":4,"usage":{"cpu":"5"}}"#,
                summary("b q", Some(4), &[("cpu", "2")], &[("cpu", "5")]),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(applied_summary(text).as_ref(), Ok(want), "{text}");
        }
        for bad in [
            "",
            "policy=a",
            "{",
            "policy=a;ratios=cpu=2;generation=-1",
            "policy=a;ratios=cpu=2;usage=cpu=6;maxRatios=cpu=4",
        ] {
            assert!(applied_summary(bad).is_err(), "{bad}");
        }
    }

    /// A policy with a generation writes it after the ratios, in both formats, and what is
    /// written reads back with it.
    #[test]
    fn the_generation_is_written_and_read_back() {
        let mut with_generation = policy("batch", &[("cpu", "2")]);
        with_generation.generation = Some(5);
        let mut unlisted = policy("b q", &[("cpu", "2")]);
        unlisted.generation = Some(6);
        let usage = [("cpu", Quantity::parse("6").unwrap())];
        type Case<'c> = (&'c CompiledPolicy, &'c [(&'c str, Quantity)], &'c str);
        let cases: [Case<'_>; 3] = [
            (
                &with_generation,
                &[],
                "policy=batch;ratios=cpu=2;generation=5",
            ),
            (
                &with_generation,
                &usage,
                "policy=batch;ratios=cpu=2;generation=5;usage=cpu=6",
            ),
            (
                &unlisted,
                &[],
                r#"{"policy":"b q","ratios":{"cpu":"2"},"generation":6}"#,
            ),
        ];
        for (policy, usage_written, want) in cases {
            let desired = Desired {
                policy,
                raw_record: &[("cpu", "4")],
                usage_written,
            };
            let written = desired.value(APPLIED_ANNOTATION).unwrap();
            assert_eq!(written, want);
            assert!(desired.is_written(APPLIED_ANNOTATION, &written));
            let read = applied_summary(&written).unwrap();
            assert_eq!(read.generation, policy.generation);
        }
    }

    #[test]
    fn annotations_compared_as_written() {
        let cases: &[(&str, &[u8], bool)] = &[
            ("abc", b"abc", true),
            ("abc", b"ab", false),
            ("ab", b"abc", false),
            ("abc", b"abd", false),
            ("", b"", true),
        ];
        for &(expected, written, same) in cases {
            let result = writes_exactly(expected, |out| {
                std::io::Write::write_all(out, written).map_err(serde_json::Error::io)
            });
            assert_eq!(result, same, "{expected:?} vs {written:?}");
        }
        // Written in pieces, as serde_json writes.
        assert!(writes_exactly(r#"{"a":"b"}"#, |out| serde_json::to_writer(
            out,
            &serde_json::json!({"a": "b"})
        )));
    }
}
