//! The codec of the node annotations the rule keeps its memory in. Pure.
//!
//! - `overcommit.dev/raw-allocatable`: a JSON map, resource -> the kubelet's allocatable, for
//!   each resource this webhook inflated (`{"cpu":"4","memory":"16Gi"}`).
//! - `overcommit.dev/applied`: JSON `{"policy": name, "ratios": {resource: ratio}}`, the
//!   policy and ratios it applied, written in that member order. Under a usage policy
//!   (`spec.usage`), a third member `"usage": {resource: allocatable}` holds the value written
//!   for each resource the usage rule set (not a fallback): a fixed ratio cannot recompute it.
//!   Static policies never write it, so their annotations are as before.
//!
//! Read back with `overcommit_json::plain` where they are written as this webhook writes them,
//! with serde_json otherwise (same values, same errors). Written by serde_json, and compared
//! with what a node carries as they are written, so that the usual review builds no string.

use std::borrow::Cow;
use std::collections::BTreeMap;

use overcommit_json::{StrMap, VecMap, borrowed, plain};
use serde::{Deserialize, Serialize};

use crate::policy::CompiledPolicy;
use crate::quantity::{Quantity, Ratio};

/// Node annotation: the kubelet's allocatable for each inflated resource (JSON map).
pub const RAW_ALLOCATABLE_ANNOTATION: &str = "overcommit.dev/raw-allocatable";
/// Node annotation: what was applied (JSON `{"policy": name, "ratios": {resource: ratio}}`).
pub const APPLIED_ANNOTATION: &str = "overcommit.dev/applied";
/// Both, in the order they are written.
pub(super) const KEYS: [&str; 2] = [RAW_ALLOCATABLE_ANNOTATION, APPLIED_ANNOTATION];

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
    #[error("{annotation} {resource}: {reason}")]
    Value {
        annotation: &'static str,
        resource: String,
        reason: String,
    },
}

/// Whether a node's annotations hold either overcommit annotation.
pub fn carries_overcommit_annotations(annotations: Option<&StrMap<'_>>) -> bool {
    annotations.is_some_and(|a| KEYS.iter().any(|key| a.contains_key(key)))
}

/// A resource's raw allocatable as recorded: its text and value.
pub(super) type RawRecord<'a> = (Cow<'a, str>, Quantity);

/// What this webhook wrote last time, read back from the annotations.
pub(super) struct Recorded<'a> {
    raw: VecMap<'a, RawRecord<'a>>,
    ratios: VecMap<'a, Ratio>,
    /// Values the usage rule wrote (empty under a static policy).
    usage: VecMap<'a, Quantity>,
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
    /// Not used, but required (an annotation without it is unreadable).
    #[serde(rename = "policy", borrow, deserialize_with = "borrowed::str")]
    _policy: Cow<'a, str>,
    #[serde(borrow, deserialize_with = "borrowed::str_map")]
    ratios: StrMap<'a>,
    #[serde(default, borrow, deserialize_with = "borrowed::str_map")]
    usage: StrMap<'a>,
}

/// The `overcommit.dev/raw-allocatable` map, as read back (borrowed from the annotation).
#[derive(Deserialize)]
#[serde(transparent)]
struct RawIn<'a>(#[serde(borrow, deserialize_with = "borrowed::str_map")] StrMap<'a>);

/// Read both annotations back. Both must be there and readable, or neither counts.
pub(super) fn read<'a>(annotations: &'a StrMap<'_>) -> Result<Recorded<'a>, AnnotationError> {
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
    let raw_map = match plain::whole_map(raw_text) {
        Some(map) => map,
        None => {
            serde_json::from_str::<RawIn<'_>>(raw_text)
                .map_err(json(RAW_ALLOCATABLE_ANNOTATION))?
                .0
        }
    };
    let (applied_ratios, applied_usage) =
        match plain::string_then_map(applied_text, "policy", "ratios") {
            Some((_policy, ratios)) => (ratios, StrMap::default()),
            None => {
                let applied = serde_json::from_str::<AppliedIn<'_>>(applied_text)
                    .map_err(json(APPLIED_ANNOTATION))?;
                (applied.ratios, applied.usage)
            }
        };
    let value = |annotation, resource: &str, reason: String| AnnotationError::Value {
        annotation,
        resource: resource.to_string(),
        reason,
    };
    // Both maps come sorted: each insert is a push.
    let mut raw = VecMap::with_capacity(raw_map.len());
    for (resource, text) in raw_map {
        let quantity = Quantity::parse(&text)
            .map_err(|e| value(RAW_ALLOCATABLE_ANNOTATION, &resource, e.to_string()))?;
        raw.insert(resource, (text, quantity));
    }
    let mut ratios = VecMap::with_capacity(applied_ratios.len());
    for (resource, text) in applied_ratios {
        let ratio =
            Ratio::parse(&text).map_err(|e| value(APPLIED_ANNOTATION, &resource, e.to_string()))?;
        ratios.insert(resource, ratio);
    }
    let mut usage = VecMap::with_capacity(applied_usage.len());
    for (resource, text) in applied_usage {
        let written = Quantity::parse(&text)
            .map_err(|e| value(APPLIED_ANNOTATION, &resource, e.to_string()))?;
        usage.insert(resource, written);
    }
    Ok(Recorded { raw, ratios, usage })
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
    /// Whether annotation `key` (one of `KEYS`) already says exactly this (compared as it is
    /// written: nothing is built).
    pub(super) fn is_written(&self, key: &str, current: &str) -> bool {
        match self.is_written_plain(key, current) {
            Some(same) => same,
            None => writes_exactly(current, |out| self.write(key, out)),
        }
    }

    /// `is_written` without serde_json where what would be written needs no escape and holds
    /// no usage member (the usual review: serde_json's writer costs ~1,300 instructions per
    /// annotation here); `None` otherwise.
    fn is_written_plain(&self, key: &str, current: &str) -> Option<bool> {
        let mut expect = Expected(current.as_bytes());
        let same = if key == RAW_ALLOCATABLE_ANNOTATION {
            expect.map(self.raw_record.iter().map(|(k, v)| (*k, *v)))?
        } else {
            if !self.usage_written.is_empty() {
                return None;
            }
            let ratios = self.policy.ratios.iter();
            expect.literal("{\"policy\":")
                && expect.string(&self.policy.name)?
                && expect.literal(",\"ratios\":")
                && expect.map(ratios.map(|(k, (text, _))| (k.as_str(), text.as_str())))?
                && expect.literal("}")
        };
        Some(same && expect.0.is_empty())
    }

    /// The JSON of annotation `key` (one of `KEYS`).
    pub(super) fn value(&self, key: &str) -> Result<String, serde_json::Error> {
        let mut out = Vec::with_capacity(128);
        self.write(key, &mut out)?;
        // serde_json writes UTF-8.
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    fn write<W: std::io::Write>(&self, key: &str, out: W) -> Result<(), serde_json::Error> {
        if key == RAW_ALLOCATABLE_ANNOTATION {
            serde_json::to_writer(out, &RawOut(self.raw_record))
        } else {
            let applied = AppliedOut {
                policy: &self.policy.name,
                ratios: RatiosOut(&self.policy.ratios),
                usage: UsageOut(self.usage_written),
            };
            serde_json::to_writer(out, &applied)
        }
    }
}

/// JSON of the `overcommit.dev/applied` annotation, as written: keys in this order.
#[derive(Serialize)]
struct AppliedOut<'p> {
    policy: &'p str,
    ratios: RatiosOut<'p>,
    #[serde(skip_serializing_if = "UsageOut::is_empty")]
    usage: UsageOut<'p>,
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

/// What an annotation should say, compared piece by piece as serde_json would write it: each
/// method says whether its piece came next (and consumes it); `string` and `map` give `None`
/// for text serde_json would escape (`"`, `\\`, control characters).
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

    fn string(&mut self, text: &str) -> Option<bool> {
        if text.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
            return None;
        }
        Some(self.literal("\"") && self.literal(text) && self.literal("\""))
    }

    fn map<'m>(&mut self, entries: impl Iterator<Item = (&'m str, &'m str)>) -> Option<bool> {
        if !self.literal("{") {
            return Some(false);
        }
        for (n, (key, value)) in entries.enumerate() {
            let same = (n == 0 || self.literal(","))
                && self.string(key)?
                && self.literal(":")
                && self.string(value)?;
            if !same {
                return Some(false);
            }
        }
        Some(self.literal("}"))
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

    /// The comparison without serde_json answers as comparing with serde_json's writing does,
    /// for names, resources and values with and without characters serde_json escapes, and for
    /// current texts that differ anywhere.
    #[test]
    fn plain_comparison_answers_as_serde_json_writing() {
        let policy = |name: &str, ratios: &[(&str, &str)]| CompiledPolicy {
            name: name.to_string(),
            priority: 0,
            selector: Default::default(),
            ratios: ratios
                .iter()
                .map(|(r, t)| (r.to_string(), (t.to_string(), Ratio::parse("1").unwrap())))
                .collect(),
            pod_defaults: None,
            usage: None,
            cap: None,
        };
        let policies = [
            policy("batch", &[("cpu", "2"), ("memory", "1.5")]),
            policy("b\"q", &[("cpu", "2")]),
            policy("nl\n", &[]),
            policy("x", &[("a\\b", "2"), ("cpu", "3")]),
        ];
        let raws: [&[(&str, &str)]; 4] = [
            &[("cpu", "4"), ("memory", "16Gi")],
            &[],
            &[("cpu", "4\"")],
            &[("example.com/gpu", "2"), ("pods", "110")],
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
                    for key in KEYS {
                        let written = desired.value(key).unwrap();
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
                            let by_serde = writes_exactly(current, |out| desired.write(key, out));
                            assert_eq!(
                                desired.is_written(key, current),
                                by_serde,
                                "{key}: {current:?} vs {written:?}"
                            );
                            if let Some(plain) = desired.is_written_plain(key, current) {
                                assert_eq!(plain, by_serde, "{key}: {current:?}");
                            }
                        }
                        assert!(desired.is_written(key, &written), "{key}: {written}");
                        // The usual annotations are compared without serde_json.
                        let plain = policy.name == "batch"
                            && raw_record.first() == Some(&("cpu", "4"))
                            && usage_written.is_empty();
                        if plain {
                            assert_eq!(desired.is_written_plain(key, &written), Some(true));
                        }
                    }
                }
            }
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
