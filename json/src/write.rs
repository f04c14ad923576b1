//! Writing JSON strings without serde_json's escaping writer where nothing needs escaping:
//! shared by the JSON Patch (`overcommit_core::patch`) and the review's answer.

/// A JSON string as serde_json writes it: copied as it is when serde_json would escape
/// nothing in it (no `"`, `\\` or control character; it escapes nothing else), else by
/// serde_json. Paths, quantities and review uids never need an escape, and serde_json's writer
/// costs a few hundred instructions per string.
pub fn write_str(out: &mut Vec<u8>, text: &str) -> Result<(), serde_json::Error> {
    if text.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        return serde_json::to_writer(out, text);
    }
    out.reserve(text.len() + 2);
    out.push(b'"');
    out.extend_from_slice(text.as_bytes());
    out.push(b'"');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_as_serde_json_writes_it() {
        for text in [
            "",
            "plain",
            "a\"quote",
            "back\\slash",
            "tab\t",
            "\u{1}",
            "é日本",
        ] {
            let mut out = Vec::new();
            write_str(&mut out, text).unwrap();
            assert_eq!(out, serde_json::to_vec(text).unwrap(), "{text:?}");
        }
    }
}
