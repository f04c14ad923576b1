//! Eight bytes at a time: where a run of plain string bytes ends. Pure. Most strings in a review
//! are shorter than a vector search's set-up, so a word at a time is what serde_json does too.

const ONES: u64 = u64::MAX / 255;
const HIGH_BITS: u64 = ONES << 7;

/// Bytes of eight `byte`s: where a byte of `word` equals `byte` its high bit is set (and maybe
/// those of higher bytes, which the lowest match makes irrelevant).
fn equal_bytes(word: u64, byte: u8) -> u64 {
    let x = word ^ (ONES * u64::from(byte));
    x.wrapping_sub(ONES) & !x
}

/// Whether `byte` ends a run: `"`, `\`, a control character (below 0x20), and with
/// `NON_ASCII` a byte of 0x80 or above.
pub(crate) fn ends_run<const NON_ASCII: bool>(byte: u8) -> bool {
    byte == b'"' || byte == b'\\' || byte < 0x20 || (NON_ASCII && byte >= 0x80)
}

/// The first index at or after `from` whose byte ends a run (`ends_run`), or `bytes.len()`.
#[inline(always)]
pub(crate) fn run_end<const NON_ASCII: bool>(bytes: &[u8], from: usize) -> usize {
    let rest = bytes.get(from..).unwrap_or_default();
    let mut chunks = rest.chunks_exact(8);
    for (n, chunk) in chunks.by_ref().enumerate() {
        let mut word = [0; 8];
        word.copy_from_slice(chunk);
        let word = u64::from_le_bytes(word);
        let control = word.wrapping_sub(ONES * 0x20) & !word;
        let mut found = control | equal_bytes(word, b'"') | equal_bytes(word, b'\\');
        if NON_ASCII {
            found |= word;
        }
        let found = found & HIGH_BITS;
        if found != 0 {
            return from + n * 8 + (found.trailing_zeros() / 8) as usize;
        }
    }
    let tail = chunks.remainder();
    let at = tail
        .iter()
        .position(|&byte| ends_run::<NON_ASCII>(byte))
        .unwrap_or(tail.len());
    bytes.len() - tail.len() + at
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every position and every byte value, against the byte-by-byte definition.
    #[test]
    fn the_run_ends_where_the_first_such_byte_is() {
        for len in 0..20 {
            for at in 0..=len {
                for byte in 0..=255u8 {
                    let mut bytes = vec![b'a'; len];
                    if at < len {
                        bytes[at] = byte;
                    }
                    // A later stop byte must not move the answer.
                    bytes.push(b'"');
                    for from in [0, 1, 3] {
                        let slow = |non_ascii: bool| {
                            (from..bytes.len())
                                .find(|&i| {
                                    let b = bytes[i];
                                    b == b'"' || b == b'\\' || b < 0x20 || (non_ascii && b >= 0x80)
                                })
                                .unwrap_or(bytes.len())
                        };
                        assert_eq!(
                            run_end::<false>(&bytes, from),
                            slow(false),
                            "{bytes:?} {from}"
                        );
                        assert_eq!(
                            run_end::<true>(&bytes, from),
                            slow(true),
                            "{bytes:?} {from}"
                        );
                    }
                }
            }
        }
    }
}
