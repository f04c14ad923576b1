use std::borrow::Cow;

use super::*;

/// serde_json's answer for the same text (the slow way, `borrowed::str_map`).
fn serde_map(text: &str) -> Result<StrMap<'_>, String> {
    #[derive(serde::Deserialize)]
    #[serde(transparent)]
    struct Map<'a>(#[serde(borrow, deserialize_with = "crate::borrowed::str_map")] StrMap<'a>);
    serde_json::from_str::<Map<'_>>(text)
        .map(|m| m.0)
        .map_err(|e| e.to_string())
}

fn pairs(map: &StrMap<'_>) -> Vec<(String, String)> {
    map.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn plainly_written_maps_are_read_as_serde_json_reads_them() {
    let cases: &[(&str, &[(&str, &str)])] = &[
        ("{}", &[]),
        (" { } ", &[]),
        (r#"{"cpu":"4"}"#, &[("cpu", "4")]),
        (
            r#"{"cpu":"15890m","memory":"62Gi","pods":"110"}"#,
            &[("cpu", "15890m"), ("memory", "62Gi"), ("pods", "110")],
        ),
        // Keys come out sorted, whatever their order in the text.
        (r#"{"b":"2","a":"1"}"#, &[("a", "1"), ("b", "2")]),
        // A key given twice keeps its last value.
        (r#"{"a":"1","a":"2"}"#, &[("a", "2")]),
        (
            "{\n  \"a\" :\t\"1\" ,\r\n \"b\":\"\" }\n",
            &[("a", "1"), ("b", "")],
        ),
        // Strings longer than one 8-byte step, with the quote in every position of a step.
        (
            r#"{"kubernetes.io/hostname":"bench-node-55k-0","k1234567":"v12345678"}"#,
            &[
                ("k1234567", "v12345678"),
                ("kubernetes.io/hostname", "bench-node-55k-0"),
            ],
        ),
        // Escapes are decoded (by serde_json), UTF-8 is kept.
        (
            r#"{"raw":"{\"cpu\":\"4\"}","t\u00e9":"ça\n\\/","é":"\ud83d\ude00"}"#,
            &[("raw", r#"{"cpu":"4"}"#), ("té", "ça\n\\/"), ("é", "😀")],
        ),
    ];
    for (text, want) in cases {
        let got = whole_map(text).unwrap_or_else(|| panic!("not read plainly: {text}"));
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(pairs(&got), want, "{text}");
        let serde = serde_map(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(got, serde, "{text}");
    }
}

#[test]
fn strings_without_escapes_are_borrowed() {
    let text = r#"{"cpu":"4","esc":"a\"b"}"#;
    let map = whole_map(text).unwrap_or_default();
    for key in map.keys() {
        assert!(matches!(key, Cow::Borrowed(_)), "{key}");
    }
    assert!(matches!(map.get("cpu"), Some(Cow::Borrowed("4"))));
    assert!(matches!(map.get("esc"), Some(Cow::Owned(s)) if s == "a\"b"));
}

#[test]
fn anything_not_plainly_written_is_left_to_serde_json() {
    for text in [
        "null",
        "[]",
        r#""a""#,
        "{",
        r#"{"a""#,
        r#"{"a":"1""#,
        r#"{"a":"1"#,
        r#"{"a":"1",}"#,
        r#"{,"a":"1"}"#,
        r#"{"a":"1",,"b":"2"}"#,
        r#"{"a" "1"}"#,
        r#"{"a"::"1"}"#,
        r#"{"a":1}"#,
        r#"{"a":null}"#,
        r#"{"a":{"b":"c"}}"#,
        r#"{"a":"1"]"#,
        r#"{"a":"1"} x"#,
        r#"{a:"1"}"#,
        "{\"a\":\"x\u{1}y\"}",
        "{\"a\":\"tab\there\"}",
        r#"{"a":"\x"}"#,
        r#"{"a":"\u12"}"#,
        r#"{"a":"\ud800"}"#,
        r#"{"a":"\"}"#,
        r#"{"a":"1"}{"#,
    ] {
        assert_eq!(whole_map(text), None, "{text}");
    }
    // Invalid UTF-8 inside a string, read from bytes.
    assert!(map_in(b"{\"a\":\"\xff\"}", 0).is_none());
    assert!(map_in(b"{\"a\":\"\xc3\"}", 0).is_none());
}

#[test]
fn read_from_a_body_stops_past_the_closing_brace() {
    let body = br#"{"labels":{"a":"1","b":"2"},"annotations":null}"#;
    let start = 10;
    let (map, end) = map_in(body, start).unwrap_or_default();
    assert_eq!(
        pairs(&map),
        [("a".into(), "1".into()), ("b".into(), "2".into())]
    );
    assert_eq!(&body[end..end + 2], b",\"");
    // Not at a `{`.
    assert!(map_in(body, start + 1).is_none());
    assert!(map_in(body, body.len()).is_none());
}

/// Every byte of a map as the API server writes it, damaged into each of a set of bytes, and
/// every cut of it: wherever this reader answers, serde_json gives the same map.
#[test]
fn damaged_maps_are_read_as_serde_json_reads_them_or_left_to_it() {
    let sample = r#"{"beta.kubernetes.io/arch":"amd64","overcommit.dev/raw-allocatable":"{\"cpu\":\"15890m\",\"memory\":\"62Gi\"}","t\u00e9":"ça"}"#;
    let replacements = b"\"\\{}[],: \t\n\x01\x7f\x80\xc3\xffau0n1";
    let mut read_plainly = 0;
    let mut compare = |body: &[u8]| {
        let fast = map_in(body, 0);
        let slow = std::str::from_utf8(body).ok().map(serde_map);
        if let Some((map, end)) = fast {
            read_plainly += 1;
            // serde_json on the same bytes (anything after the object is not its concern).
            let text = std::str::from_utf8(&body[..end]).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                Ok(map),
                serde_map(text),
                "{}",
                String::from_utf8_lossy(body)
            );
            if end == body.len() {
                assert!(
                    matches!(slow, Some(Ok(_))),
                    "{}",
                    String::from_utf8_lossy(body)
                );
            }
        }
    };
    let bytes = sample.as_bytes();
    for i in 0..bytes.len() {
        for &r in replacements {
            let mut body = bytes.to_vec();
            body[i] = r;
            compare(&body);
        }
        compare(&bytes[..i]);
    }
    // Most damage inside strings leaves the map plainly written: the comparison is exercised.
    assert!(read_plainly > bytes.len(), "{read_plainly}");
}

#[test]
fn plain_strings_are_read_as_serde_json_reads_them_and_others_left_to_it() {
    let read = |text: &str| string_in(text.as_bytes(), 0).map(|(s, end)| (s.to_string(), end));
    for (text, want) in [
        (r#""""#, Some(("", 2))),
        (r#""uid-1""#, Some(("uid-1", 7))),
        (r#""status","x""#, Some(("status", 8))),
        (
            r#""héllo wörld, 8+ bytes""#,
            Some(("héllo wörld, 8+ bytes", 25)),
        ),
        // Escapes, raw control characters, not a string, cut: serde_json's to read.
        (r#""a\"b""#, None),
        (r#""\u0041""#, None),
        ("\"a\u{1}\"", None),
        ("null", None),
        ("5", None),
        (r#""abc"#, None),
    ] {
        let want = want.map(|(s, end)| (s.to_string(), end));
        assert_eq!(read(text), want, "{text}");
        if let Some((s, end)) = want {
            let serde: String =
                serde_json::from_str(&text[..end]).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(s, serde, "{text}");
        }
    }
    assert!(string_in(b"\"\xff\"", 0).is_none());
}

/// A named string then a named map (the node rule's `overcommit.dev/applied` annotation): read
/// as serde_json reads it where it is written plainly in that order, left to serde_json otherwise.
#[test]
fn a_string_then_a_map_is_read_as_serde_json_reads_it_or_left_to_it() {
    #[derive(serde::Deserialize)]
    struct Applied<'a> {
        #[serde(borrow, deserialize_with = "crate::borrowed::str")]
        policy: Cow<'a, str>,
        #[serde(borrow, deserialize_with = "crate::borrowed::str_map")]
        ratios: StrMap<'a>,
    }
    for (text, plain) in [
        (
            r#"{"policy":"bench","ratios":{"cpu":"1.5","memory":"1.2","pods":"2"}}"#,
            true,
        ),
        (r#" { "policy" : "p\"q" , "ratios" : { } } "#, true),
        (r#"{"policy":"a","ratios":{"cpu":"2","cpu":"3"}}"#, true),
        // Another order, other or missing members, duplicates, types: serde_json's to read.
        (r#"{"ratios":{"cpu":"2"},"policy":"a"}"#, false),
        (r#"{"policy":"a","ratios":{"cpu":"2"},"x":1}"#, false),
        (r#"{"policy":"a","ratios":{"cpu":"2"},"policy":"b"}"#, false),
        (r#"{"policy":"a"}"#, false),
        (r#"{"policy":1,"ratios":{}}"#, false),
        (r#"{"policy":"a","ratios":null}"#, false),
        (r#"{"polic\u0079":"a","ratios":{}}"#, false),
        (r#"{"policy":"a","ratios":{}}x"#, false),
        (r#"{"policy":"a","ratios":{}"#, false),
        (r#"["a",{}]"#, false),
    ] {
        let ours = string_then_map(text, "policy", "ratios");
        assert_eq!(ours.is_some(), plain, "{text}");
        if let Some((policy, ratios)) = ours {
            let serde: Applied<'_> =
                serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!((policy, ratios), (serde.policy, serde.ratios), "{text}");
        }
    }
}

/// Arrays of objects of strings (a node's conditions), read member by member: as serde_json
/// reads them, or left to it.
#[test]
fn arrays_of_plain_objects_are_read_or_left_to_serde_json() {
    for (text, plain) in [
        (r#"[]"#, true),
        (r#" [ ] "#, true),
        (
            r#"[{"type":"Ready","status":"True"},{"type":"Disk","status":"False"}]"#,
            true,
        ),
        (r#"[ {"a":"1"} , {} ]"#, true),
        (r#"[{"a":"1","a":"2"}]"#, true),
        (r#"[{"a":null}]"#, false),
        (r#"[{"a":"1"},]"#, false),
        (r#"[{"a":"1"}"#, false),
        (r#"["a"]"#, false),
        (r#"{"a":"1"}"#, false),
    ] {
        let start = text.len() - text.trim_start().len();
        let body = text.as_bytes();
        let mut ours: Vec<Vec<(String, String)>> = Vec::new();
        let end = array_in(body, start, |at| {
            let mut members = Vec::new();
            let end = members_in(body, at, |key, value| {
                members.push((key.into_owned(), value.into_owned()));
                Some(())
            })?;
            ours.push(members);
            Some(end)
        });
        assert_eq!(end.is_some(), plain, "{text}");
        if let Some(end) = end {
            assert_eq!(end, text.trim_end().len(), "{text}");
            let serde: Vec<serde_json::Map<String, serde_json::Value>> =
                serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let serde: Vec<Vec<(String, String)>> = serde
                .iter()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                        .collect()
                })
                .collect();
            // serde_json's map keeps the last of a key given twice; the members come in order.
            let last: Vec<Vec<(String, String)>> = ours
                .iter()
                .map(|members| {
                    let mut kept: Vec<(String, String)> = Vec::new();
                    for (k, v) in members {
                        kept.retain(|(kk, _)| kk != k);
                        kept.push((k.clone(), v.clone()));
                    }
                    kept.sort();
                    kept
                })
                .collect();
            let mut serde = serde;
            serde.iter_mut().for_each(|m| m.sort());
            assert_eq!(last, serde, "{text}");
        }
    }
    // `element` may refuse: the array is then left to serde_json.
    assert_eq!(array_in(br#"[{"a":"1"}]"#, 0, |_| None), None);
}

#[test]
fn unescaped_members_are_the_raw_bytes_between_quotes() {
    let body = br#"  {"type": "Ready" ,"message":"kubelet is posting ready status","n":""}  "#;
    let mut seen = Vec::new();
    let end = unescaped_members_in(body, 2, |key, value| {
        seen.push((key.to_vec(), value.to_vec()));
        Some(())
    });
    assert_eq!(end, Some(body.len() - 2));
    let want: Vec<(Vec<u8>, Vec<u8>)> = [
        ("type", "Ready"),
        ("message", "kubelet is posting ready status"),
        ("n", ""),
    ]
    .iter()
    .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
    .collect();
    assert_eq!(seen, want);
    // Agrees with `members_in` on where the object ends.
    assert_eq!(members_in(body, 2, |_, _| Some(())), end);
}

#[test]
fn unescaped_members_refuse_escapes_and_anything_members_in_refuses() {
    let refused: &[&[u8]] = &[
        br#"{"message":"a \"quoted\" word"}"#,
        br#"{"ty\u0070e":"Ready"}"#,
        br#"{"type":null}"#,
        br#"{"type":"Ready",}"#,
        br#"{"type":"Re"#,
        b"{\"type\":\"Re\x01ady\"}",
        br#"["type"]"#,
    ];
    for body in refused {
        let read = unescaped_members_in(body, 0, |_, _| Some(()));
        assert_eq!(read, None, "{}", String::from_utf8_lossy(body));
    }
    // The member's own refusal stops the walk.
    let body = br#"{"a":"1","b":"2"}"#;
    let mut calls = 0;
    let read = unescaped_members_in(body, 0, |_, _| {
        calls += 1;
        None
    });
    assert_eq!((read, calls), (None, 1));
}

#[test]
fn unescaped_end_finds_the_closing_quote_of_plain_text_only() {
    let cases: &[(&str, usize, Option<usize>)] = &[
        (r#""2026-11-24T01:41:17Z","#, 1, Some(21)),
        (r#""","#, 1, Some(1)),
        (
            r#""a long value that spans more than eight bytes" "#,
            1,
            Some(46),
        ),
        (r#""with \" an escape""#, 1, None),
        ("\"a raw\ncontrol\"", 1, None),
        (r#""not terminated"#, 1, None),
        ("", 0, None),
    ];
    for &(text, from, expected) in cases {
        assert_eq!(unescaped_end(text.as_bytes(), from), expected, "{text}");
    }
}
