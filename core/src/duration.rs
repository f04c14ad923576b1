//! The one duration grammar of the project: a bare integer is seconds (`120`), otherwise one or
//! more `<integer><unit>` groups with units `ms`, `s`, `m`, `h`, `d` (`500ms`, `10s`, `2m`,
//! `1h30m`, `7d`). Every command-line duration flag parses with it (the binary's
//! `duration::duration_arg`), and so does a policy's `spec.usage.window`, and the webhook
//! reads the API server's `?timeout=` with it (Go's `Duration.String` of whole seconds:
//! `10s`, `1m0s`, `1h0m0s`).

use std::time::Duration;

/// Why a duration flag was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid duration {input:?}: {reason} (examples: 500ms, 15s, 5m, 1h30m, 365d)")]
pub struct DurationError {
    input: String,
    reason: &'static str,
}

/// Parse a sequence of `<integer><unit>` groups; units ms, s, m, h, d. A bare number is seconds.
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let err = |reason| DurationError {
        input: input.to_string(),
        reason,
    };
    let text = input.trim();
    if text.is_empty() {
        return Err(err("empty"));
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        let secs: u64 = text.parse().map_err(|_| err("number too large"))?;
        return Ok(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        rest = rest.trim_start();
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(err("expected a number"));
        }
        let value: u64 = rest[..digits]
            .parse()
            .map_err(|_| err("number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let millis_per_unit: u64 = match unit {
            "ms" => 1,
            "s" | "sec" | "secs" => 1_000,
            "m" | "min" | "mins" => 60_000,
            "h" | "hr" | "hrs" => 3_600_000,
            "d" | "day" | "days" => 86_400_000,
            "" => return Err(err("missing unit")),
            _ => return Err(err("unknown unit")),
        };
        let millis = value
            .checked_mul(millis_per_unit)
            .ok_or_else(|| err("too large"))?;
        total = total
            .checked_add(Duration::from_millis(millis))
            .ok_or_else(|| err("too large"))?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_table() {
        let ok: &[(&str, u64)] = &[
            ("15s", 15_000),
            ("5m", 300_000),
            ("1h30m", 5_400_000),
            ("1h 30m", 5_400_000),
            ("365d", 31_536_000_000),
            ("500ms", 500),
            ("120", 120_000),
            ("2s500ms", 2_500),
            // Go's Duration.String of whole seconds (the API server's `?timeout=`).
            ("1m0s", 60_000),
            ("1h0m0s", 3_600_000),
            ("2h3m4s", 7_384_000),
        ];
        for (input, millis) in ok {
            assert_eq!(
                parse_duration(input),
                Ok(Duration::from_millis(*millis)),
                "{input}"
            );
        }
    }

    #[test]
    fn refuses_table() {
        for input in [
            "",
            "s",
            "10x",
            "-5s",
            "1.5s",
            "99999999999999999999s",
            "9999999999999999d",
        ] {
            assert!(parse_duration(input).is_err(), "{input}");
        }
    }
}
