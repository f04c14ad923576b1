//! JSON Patch (RFC 6902) operations, built by hand: the node and pod rules emit a few
//! operations, so a small typed list serialised once is all that is needed. Pure.

use std::borrow::Cow;

use serde::Serialize;
use serde_json::Value;

use overcommit_json::write_str;

/// One JSON Patch operation. Paths are JSON Pointers (RFC 6901): build them with [`pointer`]
/// (or write a constant one: the usual paths of a node review are, with no allocation).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum PatchOp {
    /// Adds a member, or replaces it if it exists.
    Add {
        path: Cow<'static, str>,
        value: Value,
    },
    /// Replaces a member that must exist.
    Replace {
        path: Cow<'static, str>,
        value: Value,
    },
    Remove {
        path: Cow<'static, str>,
    },
}

impl PatchOp {
    pub fn path(&self) -> &str {
        match self {
            PatchOp::Add { path, .. }
            | PatchOp::Replace { path, .. }
            | PatchOp::Remove { path } => path,
        }
    }
}

/// A JSON Pointer from unescaped segments: `~` becomes `~0` and `/` becomes `~1`, so
/// `["metadata", "annotations", "overcommit.dev/applied"]` is
/// `/metadata/annotations/overcommit.dev~1applied`.
pub fn pointer<'a, S>(segments: S) -> String
where
    S: IntoIterator<Item = &'a str>,
    S::IntoIter: Clone,
{
    let segments = segments.into_iter();
    // One allocation: the length without escapes (each escape adds a byte).
    let mut out = String::with_capacity(segments.clone().fold(0, |n, s| n + s.len() + 1));
    for segment in segments {
        push_segment(&mut out, segment);
    }
    out
}

/// `prefix` (a pointer, its segments already escaped) then `segment`, escaped: `pointer` with
/// its constant segments written once (a path per changed resource in every node review).
pub fn pointer_under(prefix: &str, segment: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 1 + segment.len());
    out.push_str(prefix);
    push_segment(&mut out, segment);
    out
}

/// `/` and `segment` escaped (`~` as `~0`, `/` as `~1`) onto `out`.
pub fn push_segment(out: &mut String, segment: &str) {
    out.push('/');
    // Usually nothing to escape: one copy.
    if !segment.bytes().any(|b| b == b'~' || b == b'/') {
        out.push_str(segment);
        return;
    }
    // Copied in runs between the characters that need escaping.
    let mut rest = segment;
    while let Some(at) = rest.bytes().position(|b| b == b'~' || b == b'/') {
        let (run, escaped) = rest.split_at(at);
        out.push_str(run);
        out.push_str(if escaped.starts_with('~') { "~0" } else { "~1" });
        rest = escaped.get(1..).unwrap_or_default();
    }
    out.push_str(rest);
}

/// The patch as JSON bytes: what serde_json writes for `ops` (the derived `Serialize`), written
/// directly (the derive goes through serde's tagged-enum machinery for every operation).
pub fn to_json(ops: &[PatchOp]) -> Result<Vec<u8>, serde_json::Error> {
    // Room for the usual operation (a path and a short value) in one allocation.
    let mut out = Vec::with_capacity(16 + ops.len() * 96);
    out.push(b'[');
    for (index, op) in ops.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        let (name, value) = match op {
            PatchOp::Add { value, .. } => ("add", Some(value)),
            PatchOp::Replace { value, .. } => ("replace", Some(value)),
            PatchOp::Remove { .. } => ("remove", None),
        };
        out.extend_from_slice(br#"{"op":""#);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(br#"","path":"#);
        write_str(&mut out, op.path())?;
        if let Some(value) = value {
            out.extend_from_slice(br#","value":"#);
            match value {
                Value::String(text) => write_str(&mut out, text)?,
                value => serde_json::to_writer(&mut out, value)?,
            }
        }
        out.push(b'}');
    }
    out.push(b']');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointer_escapes_tilde_and_slash() {
        let cases: &[(&[&str], &str)] = &[
            (&["status", "allocatable", "cpu"], "/status/allocatable/cpu"),
            (
                &["status", "allocatable", "nvidia.com/gpu"],
                "/status/allocatable/nvidia.com~1gpu",
            ),
            (
                &["metadata", "annotations", "a~b/c"],
                "/metadata/annotations/a~0b~1c",
            ),
            (&["x", "~1"], "/x/~01"),
            (&["~", "/", "//~~", "a/"], "/~0/~1/~1~1~0~0/a~1"),
            (&["é/日本~"], "/é~1日本~0"),
            (&[""], "/"),
            (&[], ""),
        ];
        for &(segments, expected) in cases {
            assert_eq!(pointer(segments.iter().copied()), expected);
            // The last segment under the others as a written prefix: the same pointer.
            if let Some((last, head)) = segments.split_last() {
                let prefix = pointer(head.iter().copied());
                assert_eq!(pointer_under(&prefix, last), expected, "{segments:?}");
            }
        }
    }

    #[test]
    fn written_as_serde_json_writes_the_operations() {
        let object = serde_json::json!({"a/b": "1", "c": {"d": ["e", 2, null]}, "é\"": "\n"});
        let cases: Vec<Vec<PatchOp>> = vec![
            vec![],
            vec![PatchOp::Remove { path: "".into() }],
            vec![
                PatchOp::Replace {
                    path: pointer(["status", "allocatable", "nvidia.com/gpu"]).into(),
                    value: Value::from("8"),
                },
                PatchOp::Add {
                    path: "/quote\"back\\slash\u{1}é".into(),
                    value: object.clone(),
                },
                PatchOp::Remove {
                    path: pointer(["metadata", "annotations", "overcommit.dev/applied"]).into(),
                },
                PatchOp::Add {
                    path: "/n".into(),
                    value: Value::Null,
                },
                PatchOp::Add {
                    path: "/plain/\u{7f}é日本".into(),
                    value: Value::from("23835m \u{7f}é日本/~"),
                },
                PatchOp::Replace {
                    path: "/\u{1f}".into(),
                    value: Value::from("tab\there \u{0} \"quoted\" back\\slash"),
                },
                PatchOp::Replace {
                    path: "/x".into(),
                    value: serde_json::json!([1.5, true, "\u{2028}"]),
                },
            ],
        ];
        for ops in cases {
            let expected = serde_json::to_vec(&ops).unwrap_or_default();
            let written = to_json(&ops).unwrap_or_default();
            assert_eq!(
                String::from_utf8_lossy(&written),
                String::from_utf8_lossy(&expected)
            );
        }
    }

    #[test]
    fn serialises_as_rfc6902() {
        let ops = vec![
            PatchOp::Replace {
                path: "/a".into(),
                value: Value::from("1"),
            },
            PatchOp::Add {
                path: "/b".into(),
                value: Value::from("2"),
            },
            PatchOp::Remove { path: "/c".into() },
        ];
        let json = String::from_utf8(to_json(&ops).unwrap_or_default()).unwrap_or_default();
        assert_eq!(
            json,
            r#"[{"op":"replace","path":"/a","value":"1"},{"op":"add","path":"/b","value":"2"},{"op":"remove","path":"/c"}]"#
        );
    }
}
