//! The scanner against serde_json: where a value ends, what is refused, and never a panic.

use serde::de::IgnoredAny;

use super::*;
use crate::testing::Rng;

/// serde_json's end of the first value of `text` (None if it refuses it).
fn serde_end(text: &[u8]) -> Option<usize> {
    let mut values = serde_json::Deserializer::from_slice(text).into_iter::<IgnoredAny>();
    match values.next() {
        Some(Ok(_)) => Some(values.byte_offset()),
        _ => None,
    }
}

#[test]
fn values_end_where_serde_json_ends_them() {
    let cases: &[&str] = &[
        r#""""#,
        r#""plain""#,
        r#""with \"quotes\" and \\ and \/ \b\f\n\r\t""#,
        r#""\u00e9\uD83D\uDE00 é 😀""#,
        r#""a string longer than sixteen bytes, so that memchr2 finds its end""#,
        r#""sixteen bytes!!""#,
        r#""fifteen bytes!""#,
        r#""escape right at the end of a word\\""#,
        "0",
        "-0",
        "12345678901234567890",
        "-1.5e+10",
        "2E-3",
        "0.25",
        "true",
        "false",
        "null",
        "{}",
        "[]",
        r#"{"a":[1,{"b":"]}"},"}"],"c":null}"#,
        r#"[[[["[[[["]]]]]"#,
        r#"{"k:{\"type\":\"Ready\"}":{}}"#,
        " \t\n{ \"spaced\" : [ 1 , 2 ] } ",
    ];
    for case in cases {
        let text = case.as_bytes();
        let start = skip_ws(text, 0);
        let expected = serde_end(text);
        assert!(expected.is_some(), "serde_json refuses {case}");
        assert_eq!(skip_value(text, start).ok(), expected, "{case}");
        // Followed by more: the end does not move.
        let mut followed = text.to_vec();
        followed.extend_from_slice(b",\"next\"]");
        assert_eq!(skip_value(&followed, start).ok(), expected, "{case},...");
    }
}

#[test]
fn what_a_skip_refuses() {
    let cases: &[(&str, Code)] = &[
        ("", Code::EofValue),
        ("\"open", Code::EofString),
        ("\"bad \\x escape\"", Code::InvalidEscape),
        ("\"short \\u12\"", Code::InvalidEscape),
        ("\"cut \\u12", Code::EofString),
        ("\"cut \\", Code::EofString),
        ("[1,2", Code::EofList),
        ("{\"a\":[1]", Code::EofObject),
        ("[}", Code::ExpectedCommaOrBracket),
        ("{]", Code::ExpectedCommaOrBrace),
        ("[{]}", Code::ExpectedCommaOrBrace),
        ("tru", Code::EofValue),
        ("trux", Code::ExpectedIdent),
        ("nul!", Code::ExpectedIdent),
        ("01", Code::InvalidNumber),
        ("-", Code::EofValue),
        ("-x", Code::InvalidNumber),
        ("1.", Code::EofValue),
        ("1.e5", Code::InvalidNumber),
        ("1e", Code::EofValue),
        ("1e+x", Code::InvalidNumber),
        ("x", Code::ExpectedValue),
        ("}", Code::ExpectedValue),
    ];
    for (case, code) in cases {
        let text = case.as_bytes();
        assert_eq!(
            skip_value(text, 0).map_err(|e| e.code),
            Err(*code),
            "{case:?}"
        );
        assert_eq!(serde_end(text), None, "serde_json accepts {case:?}");
    }
}

#[test]
fn inside_skipped_containers_tokens_are_checked_but_not_their_order() {
    // Refused: what would let a damaged quote flip strings and text unnoticed.
    let refused: &[(&str, Code)] = &[
        (r#"["a" "b"]"#, Code::ExpectedCommaOrColon),
        (r#"{"a" 1}"#, Code::ExpectedCommaOrColon),
        (r#"{"a":"b"x}"#, Code::ExpectedCommaOrColon),
        (r#"{"a":"b" {}}"#, Code::ExpectedCommaOrColon),
        ("[abc]", Code::ExpectedValue),
        ("[1,/]", Code::ExpectedValue),
        (r"[\]", Code::ExpectedValue),
    ];
    for (case, code) in refused {
        assert_eq!(
            skip_value(case.as_bytes(), 0).map_err(|e| e.code),
            Err(*code),
            "{case}"
        );
    }
    // Tolerated (admission/read/mod.rs lists this): the order of valid tokens, and the spelling of numbers
    // and literals from their own characters. serde_json refuses each.
    let tolerated = [
        "[1 2]",
        "[1,,2]",
        "[,]",
        r#"{"a":}"#,
        "{1:2}",
        r#"{"a":1,}"#,
        "[01, 1., 1e, ture, nul, -]",
        "[\"raw \u{1} control\"]",
    ];
    for case in tolerated {
        assert_eq!(skip_value(case.as_bytes(), 0), Ok(case.len()), "{case}");
        assert_eq!(
            serde_end(case.as_bytes()),
            None,
            "serde_json accepts {case}"
        );
    }
}

#[test]
fn nesting_has_no_limit_and_no_recursion() {
    // Like serde_json's IgnoredAny: skipping is iterative; brackets must still match.
    for depth in [127, 128, 129, 130, 100_000] {
        let text = format!("{}1{}", "[{\"k\":".repeat(depth), "}]".repeat(depth));
        assert_eq!(serde_end(text.as_bytes()), Some(text.len()), "{depth}");
        assert_eq!(skip_value(text.as_bytes(), 0), Ok(text.len()), "{depth}");
        let wrong = format!("{}]]", &text[..text.len() - 2]);
        assert!(skip_value(wrong.as_bytes(), 0).is_err(), "{depth}");
        let open = format!("{{\"a\":{}", "[".repeat(depth));
        assert_eq!(
            skip_value(open.as_bytes(), 0).map_err(|e| e.code),
            Err(Code::EofList)
        );
    }
}

fn while_members(members: &mut Members<'_>) -> Result<Vec<String>, ScanError> {
    let mut keys = Vec::new();
    while let Some(member) = members.next_member()? {
        keys.push(String::from_utf8_lossy(&member.key).into_owned());
    }
    Ok(keys)
}

#[test]
fn members_decode_keys_and_skip_values() {
    let text = br#" { "obj\u0065ct" : {"x": [1, "}"]}, "plain":"v" , "\u00e9t\u00e9": null,"":1} "#;
    let start = skip_ws(text, 0);
    let mut members = match Members::new(text, start) {
        Ok(m) => m,
        Err(e) => panic!("{e}"),
    };
    let mut seen = Vec::new();
    while let Ok(Some(member)) = members.next_member() {
        let value_start = member.value_start;
        let span = match members.skip_value() {
            Ok(span) => span,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(span.start, value_start);
        seen.push((
            String::from_utf8_lossy(&member.key).into_owned(),
            String::from_utf8_lossy(&text[span]).into_owned(),
        ));
    }
    assert_eq!(
        seen,
        [
            ("object", r#"{"x": [1, "}"]}"#),
            ("plain", r#""v""#),
            ("été", "null"),
            ("", "1"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
    );
    assert_eq!(expect_end(text, members.end()), Ok(()));
}

#[test]
fn members_after_a_value_continue_the_object() {
    /// The keys that follow, or the error's code.
    type Keys = Result<&'static [&'static str], Code>;
    // (text, index past the value, what follows)
    let cases: &[(&[u8], usize, Keys)] = &[
        (br#"{"a":[1],"b":2,"c":{}}"#, 8, Ok(&["b", "c"])),
        (br#"{"a":[1] , "b" : 2}"#, 8, Ok(&["b"])),
        (br#"{"a":[1]}"#, 8, Ok(&[])),
        (br#"{"a":[1]"b":2}"#, 8, Err(Code::ExpectedCommaOrBrace)),
        (br#"{"a":[1],"b"::2}"#, 8, Err(Code::ExpectedValue)),
        (br#"{"a":[1],}"#, 8, Err(Code::TrailingComma)),
        (br#"{"a":[1],"b":"#, 8, Err(Code::EofValue)),
    ];
    for &(text, pos, expected) in cases {
        let keys = while_members(&mut Members::after_value(text, pos));
        let shown = String::from_utf8_lossy(text);
        match expected {
            Ok(expected) => assert_eq!(
                keys.as_deref().ok(),
                Some(
                    expected
                        .iter()
                        .map(|k| k.to_string())
                        .collect::<Vec<_>>()
                        .as_slice()
                ),
                "{shown}"
            ),
            Err(code) => assert_eq!(keys.map_err(|e| e.code), Err(code), "{shown}"),
        }
    }
}

#[test]
fn walked_objects_are_checked_strictly() {
    let cases: &[(&str, Code)] = &[
        ("{", Code::EofObject),
        ("{\"a\"", Code::EofObject),
        ("{\"a\":", Code::EofValue),
        ("{\"a\" 1}", Code::ExpectedColon),
        ("{\"a\":1 \"b\":2}", Code::ExpectedCommaOrBrace),
        ("{\"a\":1,}", Code::TrailingComma),
        ("{1:2}", Code::KeyMustBeAString),
        ("{\"a\":1,,}", Code::KeyMustBeAString),
        ("{\"a\u{1}\":1}", Code::ControlCharacter),
        ("{\"\\x\":1}", Code::InvalidEscape),
        ("{\"a\":1", Code::EofObject),
        ("{\"a\":1}x", Code::TrailingCharacters),
    ];
    for (case, code) in cases {
        let text = case.as_bytes();
        let found = Members::new(text, 0)
            .and_then(|mut m| {
                while_members(&mut m)?;
                expect_end(text, m.end())
            })
            .map_err(|e| e.code);
        assert_eq!(found, Err(*code), "{case:?}");
        assert_eq!(
            serde_json::from_slice::<IgnoredAny>(text).ok(),
            None,
            "{case:?}"
        );
    }
    // A byte that cannot begin a value is refused by `next_member` itself, before anything
    // steps over the value: a reader may stop at that byte (`read/mod.rs`, the unread tail).
    for case in ["{\"a\"::1}", "{\"a\":,1}", "{\"a\":}", "{\"a\": ]"] {
        let found = Members::new(case.as_bytes(), 0).and_then(|mut m| m.next_member());
        assert_eq!(
            found.map_err(|e| e.code),
            Err(Code::ExpectedValue),
            "{case}"
        );
    }
    // Valid JSON, but not an object.
    assert_eq!(
        Members::new(b"[]", 0).map(|_| ()).map_err(|e| e.code),
        Err(Code::ExpectedObject)
    );
    // Invalid UTF-8 in a key of a walked object, as serde_json refuses it for a struct field.
    let text = b"{\"\xff\":1}";
    let found = Members::new(text, 0).and_then(|mut m| while_members(&mut m));
    assert_eq!(found.map_err(|e| e.code), Err(Code::InvalidUnicode));
}

#[test]
fn positions_are_serde_json_positions() {
    let text = b"{\n  \"a\": 1,\n  \"b\": x\n}";
    let serde_error = match serde_json::from_slice::<serde_json::Value>(text) {
        Err(e) => e,
        Ok(_) => panic!("accepted"),
    };
    let found = Members::new(text, 0).and_then(|mut m| while_members(&mut m));
    let Err(e) = found else { panic!("accepted") };
    assert_eq!(e.describe(text), serde_error.to_string());
}

#[test]
fn damaged_json_never_panics_and_well_formed_json_is_never_refused() {
    let base = br#"{"a":[1,-2.5e3,true,false,null,{"b":"c\"d\\e\u00e9"}],"k:{\"x\":1}":{"n":[[],{}]},"s":"a string longer than sixteen bytes"}"#;
    let alphabet = b"{}[]\",:\\ u0-9eE.tfnx\xff\x01";
    let mut rng = Rng(0x5eed_cafe_f00d_d00d);
    let walk = |text: &[u8]| -> Result<(), ScanError> {
        let start = skip_ws(text, 0);
        let mut members = Members::new(text, start)?;
        while members.next_member()?.is_some() {}
        expect_end(text, members.end())
    };
    assert_eq!(walk(base), Ok(()));
    for end in 0..base.len() {
        assert!(walk(&base[..end]).is_err(), "prefix {end} accepted");
        let _ = skip_value(&base[..end], 0);
    }
    for _ in 0..20_000 {
        let mut text = base.to_vec();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(text.len());
            match rng.below(3) {
                0 => text[at] = alphabet[rng.below(alphabet.len())],
                1 => {
                    text.remove(at);
                }
                _ => text.insert(at, alphabet[rng.below(alphabet.len())]),
            }
        }
        let scanned = walk(&text);
        // serde_json::Value checks every string (UTF-8, control characters), as a struct does
        // its field names.
        let serde_ok = serde_json::from_slice::<serde_json::Value>(&text).is_ok();
        // Whatever serde_json accepts, the scanner accepts (it checks less, never more).
        if serde_ok {
            assert_eq!(scanned, Ok(()), "{}", String::from_utf8_lossy(&text));
        }
        for start in [0, rng.below(text.len())] {
            let _ = skip_value(&text, start);
        }
    }
}
