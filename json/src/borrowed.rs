//! Strings and string maps read from a review without copying them. Pure.
//!
//! serde's own `Cow<str>` (also inside `Option`, or as keys and values of a map) always
//! deserialises to `Cow::Owned`: a heap copy of every label, annotation and quantity of every
//! review. These functions, used with `#[serde(borrow, deserialize_with = ...)]`, borrow from the
//! body where the JSON string has no escapes (serde_json hands those out as `&'de str`) and copy
//! only the others. They accept and refuse exactly what serde's own impls do, with the same
//! error messages (`expected a string`, `expected a map`), so a review reads the same either way.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use crate::map::StrMap;

/// A string, borrowed when the input allows it.
struct CowStr;

impl<'de> Visitor<'de> for CowStr {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string") // serde's `String`
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }

    // serde's `String` also takes UTF-8 bytes (serde_json never gives strings as bytes).
    fn visit_borrowed_bytes<E: de::Error>(self, v: &'de [u8]) -> Result<Self::Value, E> {
        std::str::from_utf8(v)
            .map(Cow::Borrowed)
            .map_err(|_| E::invalid_value(de::Unexpected::Bytes(v), &self))
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Self::Value, E> {
        std::str::from_utf8(v)
            .map(|s| Cow::Owned(s.to_owned()))
            .map_err(|_| E::invalid_value(de::Unexpected::Bytes(v), &self))
    }
}

/// A `Cow<str>` that borrows (as a map key or value).
struct Borrowed<'de>(Cow<'de, str>);

impl<'de> de::Deserialize<'de> for Borrowed<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_string(CowStr).map(Borrowed)
    }
}

/// A map of strings, keys and values borrowed when the input allows it; a key given twice
/// keeps its last value (as serde's `BTreeMap`).
struct StrMapVisitor;

impl<'de> Visitor<'de> for StrMapVisitor {
    type Value = StrMap<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map") // serde's `BTreeMap`
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
        let mut map = StrMap::new();
        while let Some((Borrowed(key), Borrowed(value))) = access.next_entry()? {
            map.insert(key, value);
        }
        Ok(map)
    }
}

/// A `StrMap` that borrows, so that serde's own `Option` impl can wrap it.
struct BorrowedMap<'de>(StrMap<'de>);

impl<'de> de::Deserialize<'de> for BorrowedMap<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(StrMapVisitor).map(BorrowedMap)
    }
}

/// For `Option<Cow<'a, str>>` fields: `#[serde(borrow, default, deserialize_with = "...")]`.
pub fn option_str<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Cow<'de, str>>, D::Error> {
    // serde's `Option` itself (null or unit is `None`), around the borrowing string.
    Option::<Borrowed<'de>>::deserialize(d).map(|s| s.map(|Borrowed(s)| s))
}

/// For `Option<StrMap<'a>>` fields: `#[serde(borrow, default, deserialize_with = "...")]`.
pub fn option_str_map<'de, D: Deserializer<'de>>(d: D) -> Result<Option<StrMap<'de>>, D::Error> {
    Option::<BorrowedMap<'de>>::deserialize(d).map(|m| m.map(|BorrowedMap(m)| m))
}

/// For `StrMap<'a>` fields: `#[serde(borrow, deserialize_with = "...")]`.
pub fn str_map<'de, D: Deserializer<'de>>(d: D) -> Result<StrMap<'de>, D::Error> {
    d.deserialize_map(StrMapVisitor)
}

/// For `Cow<'a, str>` fields: `#[serde(borrow, deserialize_with = "...")]`.
pub fn str<'de, D: Deserializer<'de>>(d: D) -> Result<Cow<'de, str>, D::Error> {
    d.deserialize_string(CowStr)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::*;

    /// serde's own reading (owned), the behaviour to keep.
    #[derive(Deserialize, Debug, PartialEq)]
    struct Owned<'a> {
        #[serde(borrow, default)]
        text: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        map: Option<BTreeMap<Cow<'a, str>, Cow<'a, str>>>,
    }

    #[derive(Deserialize, Debug, PartialEq)]
    struct Borrowing<'a> {
        #[serde(borrow, default, deserialize_with = "option_str")]
        text: Option<Cow<'a, str>>,
        #[serde(borrow, default, deserialize_with = "option_str_map")]
        map: Option<StrMap<'a>>,
    }

    #[test]
    fn reads_and_refuses_as_serde_does() {
        let cases = [
            r#"{}"#,
            r#"{"text":null,"map":null}"#,
            r#"{"text":"plain","map":{"a":"1","b":"2"}}"#,
            r#"{"text":"esc\"aped\u00e9","map":{"k\u0041":"v\n"}}"#,
            r#"{"map":{"a":"1","a":"2"}}"#,
            r#"{"map":{}}"#,
            r#"{"text":5}"#,
            r#"{"text":{"a":1}}"#,
            r#"{"text":["a"]}"#,
            r#"{"text":true}"#,
            r#"{"map":"a"}"#,
            r#"{"map":["a","b"]}"#,
            r#"{"map":{"a":1}}"#,
            r#"{"map":{"a":null}}"#,
            r#"{"map":{"a":"1",}}"#,
            r#"{"map":{"a":"1"}"#,
            r#"{"text":"\ud800"}"#,
            r#"{"text":"\x"}"#,
            "{\"text\":\"\u{1}\"}",
        ];
        for case in cases {
            let owned = serde_json::from_str::<Owned<'_>>(case).map_err(|e| e.to_string());
            let borrowing = serde_json::from_str::<Borrowing<'_>>(case).map_err(|e| e.to_string());
            match (owned, borrowing) {
                (Ok(o), Ok(b)) => {
                    assert_eq!(o.text, b.text, "{case}");
                    let entries = b.map.map(|m| m.into_iter().collect::<BTreeMap<_, _>>());
                    assert_eq!(o.map, entries, "{case}");
                }
                (Err(o), Err(b)) => assert_eq!(o, b, "{case}"),
                (o, b) => panic!("{case}: serde {o:?}, borrowing {b:?}"),
            }
        }
    }

    #[test]
    fn borrows_unless_the_string_has_escapes() {
        let json = r#"{"text":"plain","map":{"a":"1","b\"":"2\n"}}"#;
        let read = match serde_json::from_str::<Borrowing<'_>>(json) {
            Ok(read) => read,
            Err(e) => panic!("{e}"),
        };
        assert!(matches!(read.text, Some(Cow::Borrowed("plain"))));
        let map = read.map.unwrap_or_default();
        let entries: Vec<(bool, bool)> = map
            .iter()
            .map(|(k, v)| (matches!(k, Cow::Borrowed(_)), matches!(v, Cow::Borrowed(_))))
            .collect();
        assert_eq!(entries, [(true, true), (false, false)]);
    }
}
