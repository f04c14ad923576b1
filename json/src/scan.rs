//! A JSON navigator for the review hot path: walk an object's members as (key, where the value
//! starts) and step over values by scanning, without building them. Pure, no allocation except
//! for keys written with escapes (and a stack for containers nested more than 128 deep).
//!
//! Walked objects (the levels a caller iterates with [`Members`]) are checked strictly: keys are
//! strings (escapes decoded, UTF-8 and control characters checked), `:` and `,` where JSON puts
//! them, no trailing comma. A skipped value ([`skip_value`]) is checked only as far as finding
//! its end reliably needs: a string ends at its first unescaped quote (found with memchr's
//! two-byte search for `"` and `\`; every escape is checked) and is followed by `:`, `,` or a
//! closing bracket; a container ends at its matching bracket (a mismatched bracket is an error)
//! and holds nothing outside strings but brackets, separators, whitespace and the characters of
//! numbers and `true`/`false`/`null`; a scalar of a walked object is checked against the JSON
//! grammar. Like serde_json's `IgnoredAny`, which skips iteratively, skipping sets no nesting
//! limit and cannot overflow the stack. Inside a skipped container the order of tokens is not
//! checked (where commas and colons go, that keys are strings, the spelling of numbers and
//! literals), nor raw control characters in skipped strings. `admission/read/mod.rs` says why that
//! is safe.

use std::borrow::Cow;
use std::ops::Range;

use crate::swar;

/// A syntax error at a byte index of the body (serde_json's wording). Eight bytes, so that a
/// `Result<usize, ScanError>` comes back in registers on the hot path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{} at byte {index}", code.message())]
pub struct ScanError {
    pub code: Code,
    /// Byte index (bodies are far below 4 GiB: the server limits them).
    pub index: u32,
}

/// What is wrong, in serde_json's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    EofValue,
    EofString,
    EofList,
    EofObject,
    ExpectedValue,
    ExpectedIdent,
    ExpectedColon,
    ExpectedCommaOrBrace,
    ExpectedCommaOrBracket,
    ExpectedCommaOrColon,
    KeyMustBeAString,
    TrailingComma,
    TrailingCharacters,
    InvalidEscape,
    InvalidNumber,
    InvalidUnicode,
    ControlCharacter,
    ExpectedObject,
}

impl Code {
    pub fn message(self) -> &'static str {
        match self {
            Code::EofValue => "EOF while parsing a value",
            Code::EofString => "EOF while parsing a string",
            Code::EofList => "EOF while parsing a list",
            Code::EofObject => "EOF while parsing an object",
            Code::ExpectedValue => "expected value",
            Code::ExpectedIdent => "expected ident",
            Code::ExpectedColon => "expected `:`",
            Code::ExpectedCommaOrBrace => "expected `,` or `}`",
            Code::ExpectedCommaOrBracket => "expected `,` or `]`",
            Code::ExpectedCommaOrColon => "expected `,`, `:` or a closing bracket after a string",
            Code::KeyMustBeAString => "key must be a string",
            Code::TrailingComma => "trailing comma",
            Code::TrailingCharacters => "trailing characters",
            Code::InvalidEscape => "invalid escape",
            Code::InvalidNumber => "invalid number",
            Code::InvalidUnicode => "invalid unicode code point",
            Code::ControlCharacter => {
                "control character (\\u0000-\\u001F) found while parsing a string"
            }
            Code::ExpectedObject => "expected an object",
        }
    }
}

impl ScanError {
    #[cold]
    pub fn at(code: Code, index: usize) -> Self {
        ScanError {
            code,
            index: u32::try_from(index).unwrap_or(u32::MAX),
        }
    }

    /// The message with serde_json's `at line L column C` for the body it was found in (the
    /// column of the offending byte counted from 1, as serde_json reports what it peeked at).
    pub fn describe(&self, body: &[u8]) -> String {
        let index = usize::try_from(self.index).unwrap_or(usize::MAX);
        let (line, column) = position(body, index.saturating_add(1).min(body.len()));
        format!("{} at line {line} column {column}", self.code.message())
    }
}

/// serde_json's (line, column) of a byte index: 1-based line, bytes since the line's start.
pub fn position(body: &[u8], index: usize) -> (usize, usize) {
    let before = body.get(..index).unwrap_or(body);
    let start_of_line = memchr::memrchr(b'\n', before).map_or(0, |i| i + 1);
    let line =
        1 + memchr::memchr_iter(b'\n', before.get(..start_of_line).unwrap_or_default()).count();
    (line, index.min(body.len()).saturating_sub(start_of_line))
}

/// The first byte at or after `i` that is not JSON whitespace.
pub fn skip_ws(body: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = body.get(i) {
        i += 1;
    }
    i
}

/// The body is one value and only whitespace after `end`.
pub fn expect_end(body: &[u8], end: usize) -> Result<(), ScanError> {
    let i = skip_ws(body, end);
    if i < body.len() {
        return Err(ScanError::at(Code::TrailingCharacters, i));
    }
    Ok(())
}

/// Step over the value starting at `start` (no leading whitespace). Returns the index just past
/// the value.
pub fn skip_value(body: &[u8], start: usize) -> Result<usize, ScanError> {
    match body.get(start) {
        None => Err(ScanError::at(Code::EofValue, start)),
        Some(b'"') => skip_string(body, start),
        Some(b'{' | b'[') => skip_container(body, start),
        Some(b't') => skip_literal(body, start, b"true"),
        Some(b'f') => skip_literal(body, start, b"false"),
        Some(b'n') => skip_literal(body, start, b"null"),
        Some(b'-' | b'0'..=b'9') => skip_number(body, start),
        Some(_) => Err(ScanError::at(Code::ExpectedValue, start)),
    }
}

/// Step over a string whose opening quote is at `start`; returns the index past its closing
/// quote. Jumps between quotes and backslashes; each escape is checked the way serde_json
/// checks the strings it ignores (a `\u` needs four hex digits, surrogates are not paired).
#[inline(always)]
pub fn skip_string(body: &[u8], start: usize) -> Result<usize, ScanError> {
    let mut i = start + 1;
    loop {
        i = find_quote_or_backslash(body, i);
        match body.get(i) {
            Some(b'"') => return Ok(i + 1),
            Some(_) => i = skip_escape(body, i)?,
            None => return Err(ScanError::at(Code::EofString, body.len())),
        }
    }
}

/// The first quote or backslash at or after `from` (`body.len()` if none). A Node has more
/// than a thousand strings, half of them 9 bytes or less: the per-call set-up of `memchr2`
/// (choosing an implementation through a function pointer, then AVX2 set-up) costs more than
/// the search. On x86_64 the SSE2 searcher (SSE2 is always there) is called directly.
#[inline(always)]
fn find_quote_or_backslash(body: &[u8], from: usize) -> usize {
    let rest = body.get(from..).unwrap_or_default();
    #[cfg(target_arch = "x86_64")]
    let found = match memchr::arch::x86_64::sse2::memchr::Two::new(b'"', b'\\') {
        Some(searcher) => searcher.find(rest),
        None => memchr::memchr2(b'"', b'\\', rest),
    };
    #[cfg(not(target_arch = "x86_64"))]
    let found = memchr::memchr2(b'"', b'\\', rest);
    from + found.unwrap_or(rest.len())
}

/// `at` is a backslash inside a string: the index past its escape.
fn skip_escape(body: &[u8], at: usize) -> Result<usize, ScanError> {
    match body.get(at + 1) {
        None => Err(ScanError::at(Code::EofString, body.len())),
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(at + 2),
        Some(b'u') => {
            for i in at + 2..at + 6 {
                match body.get(i) {
                    None => return Err(ScanError::at(Code::EofString, body.len())),
                    Some(b) if b.is_ascii_hexdigit() => {}
                    Some(_) => return Err(ScanError::at(Code::InvalidEscape, i)),
                }
            }
            Ok(at + 6)
        }
        Some(_) => Err(ScanError::at(Code::InvalidEscape, at + 1)),
    }
}

/// Step over an object or array by bracket matching. Strings are skipped whole (a bracket
/// inside one is text); the open containers are a bit stack (1 = object), so `]` cannot close
/// `{`. Nothing is allocated unless containers nest more than 128 deep.
fn skip_container(body: &[u8], start: usize) -> Result<usize, ScanError> {
    let mut objects: u128 = 0;
    let mut deeper: Vec<bool> = Vec::new();
    let mut open = 0usize;
    let mut i = start;
    loop {
        // Between strings there are only a few bytes (`":"`, `,`, numbers, brackets).
        let Some(&byte) = body.get(i) else {
            let innermost_object = match open.checked_sub(1) {
                Some(level) if level < 128 => objects >> level & 1 == 1,
                Some(_) => deeper.last().copied().unwrap_or(false),
                None => false,
            };
            let code = if innermost_object {
                Code::EofObject
            } else {
                Code::EofList
            };
            return Err(ScanError::at(code, body.len()));
        };
        match byte {
            b'"' => {
                i = skip_string(body, i)?;
                // A string is followed by `:`, `,` or a closing bracket. A quote damaged into
                // another byte flips which bytes are inside strings from there on; this finds
                // it at the next string instead of skipping past the value's real end.
                let next = skip_ws(body, i);
                match body.get(next) {
                    Some(b':' | b',' | b']' | b'}') | None => i = next,
                    Some(_) => return Err(ScanError::at(Code::ExpectedCommaOrColon, next)),
                }
                continue;
            }
            b'{' | b'[' => {
                let is_object = byte == b'{';
                if open < 128 {
                    if is_object {
                        objects |= 1 << open;
                    } else {
                        objects &= !(1 << open);
                    }
                } else {
                    deeper.push(is_object);
                }
                open += 1;
            }
            b'}' | b']' => {
                let Some(innermost) = open.checked_sub(1) else {
                    return Err(ScanError::at(Code::ExpectedValue, i));
                };
                let is_object = if innermost < 128 {
                    objects >> innermost & 1 == 1
                } else {
                    deeper.pop().unwrap_or(false)
                };
                match (byte, is_object) {
                    (b'}', true) | (b']', false) => {}
                    (_, true) => return Err(ScanError::at(Code::ExpectedCommaOrBrace, i)),
                    (_, false) => return Err(ScanError::at(Code::ExpectedCommaOrBracket, i)),
                }
                open = innermost;
                if open == 0 {
                    return Ok(i + 1);
                }
            }
            // Outside strings JSON has only these: separators, numbers, `true false null`.
            b' ' | b'\t' | b'\n' | b'\r' | b',' | b':' | b'0'..=b'9' | b'-' | b'+' | b'.' => {}
            b'e' | b'E' | b't' | b'r' | b'u' | b'f' | b'a' | b'l' | b's' | b'n' => {}
            _ => return Err(ScanError::at(Code::ExpectedValue, i)),
        }
        i += 1;
    }
}

fn skip_literal(body: &[u8], start: usize, literal: &[u8]) -> Result<usize, ScanError> {
    for (k, expected) in literal.iter().enumerate() {
        match body.get(start + k) {
            None => return Err(ScanError::at(Code::EofValue, body.len())),
            Some(b) if b == expected => {}
            Some(_) => return Err(ScanError::at(Code::ExpectedIdent, start + k)),
        }
    }
    Ok(start + literal.len())
}

/// A JSON number: `-`? (`0` | [1-9][0-9]*) (`.`[0-9]+)? ([eE][+-]?[0-9]+)?
fn skip_number(body: &[u8], start: usize) -> Result<usize, ScanError> {
    let digits = |mut i: usize| {
        while body.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        i
    };
    let mut i = start;
    if body.get(i) == Some(&b'-') {
        i += 1;
    }
    match body.get(i) {
        Some(b'0') => {
            i += 1;
            if body.get(i).is_some_and(u8::is_ascii_digit) {
                return Err(ScanError::at(Code::InvalidNumber, i));
            }
        }
        Some(b'1'..=b'9') => i = digits(i + 1),
        None => return Err(ScanError::at(Code::EofValue, body.len())),
        Some(_) => return Err(ScanError::at(Code::InvalidNumber, i)),
    }
    if body.get(i) == Some(&b'.') {
        let after = digits(i + 1);
        if after == i + 1 {
            return Err(number_end_error(body, after));
        }
        i = after;
    }
    if let Some(b'e' | b'E') = body.get(i) {
        i += 1;
        if let Some(b'+' | b'-') = body.get(i) {
            i += 1;
        }
        let after = digits(i);
        if after == i {
            return Err(number_end_error(body, after));
        }
        i = after;
    }
    Ok(i)
}

fn number_end_error(body: &[u8], i: usize) -> ScanError {
    if i >= body.len() {
        ScanError::at(Code::EofValue, body.len())
    } else {
        ScanError::at(Code::InvalidNumber, i)
    }
}

/// One member of a walked object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member<'a> {
    /// The key, decoded (borrowed from the body unless it had escapes) and checked to be
    /// text; bytes, because it is only compared with field names.
    pub key: Cow<'a, [u8]>,
    /// Index just past the key's closing quote (where serde_json reports a duplicate field).
    pub key_end: usize,
    /// Index of the first byte of the value.
    pub value_start: usize,
}

/// The members of one object, in order. The caller reads each value itself (and reports where
/// it ended with [`Members::value_read`]) or lets the next call skip it.
#[derive(Debug)]
pub struct Members<'a> {
    body: &'a [u8],
    /// Next index to look at.
    pos: usize,
    /// A member's value has been handed out and not yet stepped over.
    pending: Option<usize>,
    first: bool,
    done: bool,
}

impl<'a> Members<'a> {
    /// The object whose `{` is at `start`.
    pub fn new(body: &'a [u8], start: usize) -> Result<Self, ScanError> {
        match body.get(start) {
            Some(b'{') => Ok(Members {
                body,
                pos: start + 1,
                pending: None,
                first: true,
                done: false,
            }),
            None => Err(ScanError::at(Code::EofValue, start)),
            Some(_) => Err(ScanError::at(Code::ExpectedObject, start)),
        }
    }

    /// The members of an object that follow a member whose value ends just before `pos`.
    pub fn after_value(body: &'a [u8], pos: usize) -> Self {
        Members {
            body,
            pos,
            pending: None,
            first: false,
            done: false,
        }
    }

    /// The index just past the closing `}` (once `next_member` has returned `None`).
    pub fn end(&self) -> usize {
        self.pos
    }

    /// Where the current member's value starts.
    pub fn value_start(&self) -> usize {
        self.pending.unwrap_or(self.pos)
    }

    /// The current member's value ended at `end` (read by the caller).
    pub fn value_read(&mut self, end: usize) {
        self.pending = None;
        self.pos = end;
    }

    /// Step over the current member's value; its span in the body.
    pub fn skip_value(&mut self) -> Result<Range<usize>, ScanError> {
        let Some(start) = self.pending.take() else {
            return Ok(self.pos..self.pos);
        };
        let end = skip_value(self.body, start)?;
        self.pos = end;
        Ok(start..end)
    }

    /// The next member (skipping the previous value if the caller did not read it), or `None`
    /// after the closing brace.
    pub fn next_member(&mut self) -> Result<Option<Member<'a>>, ScanError> {
        if self.done {
            return Ok(None);
        }
        if self.pending.is_some() {
            self.skip_value()?;
        }
        let body = self.body;
        let mut i = skip_ws(body, self.pos);
        if self.first {
            self.first = false;
            if body.get(i) == Some(&b'}') {
                return Ok(self.close(i));
            }
        } else {
            match body.get(i) {
                Some(b',') => {
                    i = skip_ws(body, i + 1);
                    if body.get(i) == Some(&b'}') {
                        return Err(ScanError::at(Code::TrailingComma, i));
                    }
                }
                Some(b'}') => return Ok(self.close(i)),
                None => return Err(ScanError::at(Code::EofObject, body.len())),
                Some(_) => return Err(ScanError::at(Code::ExpectedCommaOrBrace, i)),
            }
        }
        match body.get(i) {
            Some(b'"') => {}
            None => return Err(ScanError::at(Code::EofObject, body.len())),
            Some(_) => return Err(ScanError::at(Code::KeyMustBeAString, i)),
        }
        let (key, key_end) = read_key(body, i)?;
        let mut v = skip_ws(body, key_end);
        match body.get(v) {
            Some(b':') => v = skip_ws(body, v + 1),
            None => return Err(ScanError::at(Code::EofObject, body.len())),
            Some(_) => return Err(ScanError::at(Code::ExpectedColon, v)),
        }
        // The value must at least begin like one: a reader may stop at this byte without
        // reading further (`read/mod.rs`, the unread tail).
        match body.get(v) {
            Some(b'"' | b'{' | b'[' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n') => {}
            Some(_) => return Err(ScanError::at(Code::ExpectedValue, v)),
            None => return Err(ScanError::at(Code::EofValue, body.len())),
        }
        self.pending = Some(v);
        self.pos = v;
        Ok(Some(Member {
            key,
            key_end,
            value_start: v,
        }))
    }

    /// Close the object at `brace`, which the caller found by other means: the members from
    /// the current one's value up to it are jumped over, not looked at. `brace` must hold the
    /// `}` and lie past the current member's key.
    pub fn close_at(&mut self, brace: usize) -> Result<(), ScanError> {
        if brace < self.pos || self.body.get(brace) != Some(&b'}') {
            return Err(ScanError::at(Code::ExpectedCommaOrBrace, brace));
        }
        self.pending = None;
        self.close(brace);
        Ok(())
    }

    fn close(&mut self, brace: usize) -> Option<Member<'a>> {
        self.done = true;
        self.pos = brace + 1;
        None
    }
}

/// The key whose opening quote is at `start`, and the index past its closing quote. A field
/// name is printable ASCII without escapes: found in one pass a word at a time, with nothing
/// left to check; any other key is read by `skip_string` and `decode_key`.
fn read_key(body: &[u8], start: usize) -> Result<(Cow<'_, [u8]>, usize), ScanError> {
    let stop = swar::run_end::<true>(body, start + 1);
    if body.get(stop) == Some(&b'"') {
        let raw = body.get(start + 1..stop).unwrap_or_default();
        return Ok((Cow::Borrowed(raw), stop + 1));
    }
    let key_end = skip_string(body, start)?;
    Ok((decode_key(body, start, key_end)?, key_end))
}

/// The key whose quotes are at `start` and `end - 1`, checked like serde_json checks a key it
/// reads (UTF-8, no raw control characters); keys with escapes are decoded by serde_json.
fn decode_key(body: &[u8], start: usize, end: usize) -> Result<Cow<'_, [u8]>, ScanError> {
    let raw = body
        .get(start + 1..end.saturating_sub(1))
        .unwrap_or_default();
    // Field names are ASCII: one pass says so for nearly every key of a review.
    if raw.iter().all(|&b| (0x20..0x80).contains(&b) && b != b'\\') {
        return Ok(Cow::Borrowed(raw));
    }
    if memchr::memchr(b'\\', raw).is_some() {
        // The escapes themselves were checked by `skip_string`: what is left to refuse is
        // what they spell (a lone surrogate) or invalid UTF-8 between them.
        let quoted = body.get(start..end).unwrap_or_default();
        return serde_json::from_slice::<String>(quoted)
            .map(|key| Cow::Owned(key.into_bytes()))
            .map_err(|_| ScanError::at(Code::InvalidUnicode, start));
    }
    if let Some(k) = raw.iter().position(|&b| b < 0x20) {
        return Err(ScanError::at(Code::ControlCharacter, start + 1 + k));
    }
    std::str::from_utf8(raw)
        .map(|_| Cow::Borrowed(raw))
        .map_err(|e| ScanError::at(Code::InvalidUnicode, start + 1 + e.valid_up_to()))
}

#[cfg(test)]
mod tests;
