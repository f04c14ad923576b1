//! Kubernetes resource quantities and overcommit ratios, exactly. Pure.
//!
//! A quantity is held as `mantissa × 10^exponent` with a `u128` mantissa, so "0.1", "100m",
//! "1Ki" and "1e3" are all exact and compare by value. Results of arithmetic are floored to
//! whole units of the resource: millicores for cpu, whole units (bytes, pods, devices) for
//! everything else. Anything that does not parse, is negative, or overflows is an error; the
//! caller fails open.

use std::cmp::Ordering;
use std::fmt;

/// The largest number of units (millicores, bytes, ...) a written quantity may have: what the
/// API server holds as an int64.
pub const MAX_UNITS: u128 = i64::MAX as u128;

/// Why a quantity or ratio was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("{0:?} is not a quantity")]
    Syntax(String),
    #[error("{0:?} is negative")]
    Negative(String),
    #[error("{0:?} is out of range")]
    Overflow(String),
    #[error("ratio {0:?} must be a decimal between 1 and 10 with at most 6 decimals")]
    Ratio(String),
}

/// How Kubernetes prints a quantity: with binary suffixes (Ki, Mi...) or decimal ones (m, k, M...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    BinarySi,
    DecimalSi,
}

/// An exact non-negative quantity. Equality and ordering are by value: `1Ki == 1024`.
#[derive(Debug, Clone, Copy)]
pub struct Quantity {
    /// Normalised: no trailing decimal zeros; zero has exponent 0.
    mantissa: u128,
    exponent: i32,
    format: Format,
}

/// The largest power of ten a u128 holds.
const MAX_POW10: u32 = 38;

fn pow10(n: u32) -> Option<u128> {
    10u128.checked_pow(n)
}

/// `floor(x / 10^n)` for any n (large n gives 0).
fn div_pow10(x: u128, n: u32) -> u128 {
    if n > MAX_POW10 {
        return 0;
    }
    // n <= 38 so 10^n fits.
    x / 10u128.pow(n)
}

/// What a quantity's suffix says: its format, the power of ten and the power of two it
/// multiplies by (`Ki`: binary, 2^10; `m`: decimal, 10^-3; `e3`: decimal, 10^3); None when it
/// is none of the API server's suffixes.
fn suffix_scale(suffix: &str) -> Option<(Format, i32, u32)> {
    Some(match suffix {
        "" => (Format::DecimalSi, 0, 0),
        "n" => (Format::DecimalSi, -9, 0),
        "u" => (Format::DecimalSi, -6, 0),
        "m" => (Format::DecimalSi, -3, 0),
        "k" => (Format::DecimalSi, 3, 0),
        "M" => (Format::DecimalSi, 6, 0),
        "G" => (Format::DecimalSi, 9, 0),
        "T" => (Format::DecimalSi, 12, 0),
        "P" => (Format::DecimalSi, 15, 0),
        "E" => (Format::DecimalSi, 18, 0),
        "Ki" => (Format::BinarySi, 0, 10),
        "Mi" => (Format::BinarySi, 0, 20),
        "Gi" => (Format::BinarySi, 0, 30),
        "Ti" => (Format::BinarySi, 0, 40),
        "Pi" => (Format::BinarySi, 0, 50),
        "Ei" => (Format::BinarySi, 0, 60),
        other => (Format::DecimalSi, parse_exponent(other)?, 0),
    })
}

impl Quantity {
    /// Parse a quantity the way the API server does: `[+-]digits[.digits][suffix]` where the
    /// suffix is one of n u m k M G T P E, Ki Mi Gi Ti Pi Ei, or an exponent `e3` / `E-2`.
    pub fn parse(text: &str) -> Result<Quantity, QuantityError> {
        let syntax = || QuantityError::Syntax(text.to_string());
        let overflow = || QuantityError::Overflow(text.to_string());
        let bytes = text.as_bytes();
        let mut pos = 0;
        let mut negative = false;
        match bytes.first() {
            Some(b'+') => pos = 1,
            Some(b'-') => {
                negative = true;
                pos = 1;
            }
            _ => {}
        }
        // The first 19 digits in a u64 (they cannot overflow it; u128 arithmetic costs several
        // times more per digit), any further ones in the u128.
        let mut leading: u64 = 0;
        let mut mantissa: u128 = 0;
        let mut exponent: i32 = 0;
        let mut digits = 0usize;
        let mut seen_point = false;
        while let Some(&b) = bytes.get(pos) {
            match b {
                b'0'..=b'9' => {
                    let d = b - b'0';
                    if digits < 19 {
                        leading = leading * 10 + u64::from(d);
                    } else {
                        if digits == 19 {
                            mantissa = u128::from(leading);
                        }
                        // More than 38 significant digits: far beyond anything a node reports.
                        mantissa = mantissa
                            .checked_mul(10)
                            .and_then(|m| m.checked_add(u128::from(d)))
                            .ok_or_else(overflow)?;
                    }
                    digits += 1;
                    if seen_point {
                        exponent = exponent.checked_sub(1).ok_or_else(overflow)?;
                    }
                }
                b'.' if !seen_point => seen_point = true,
                _ => break,
            }
            pos += 1;
        }
        if digits == 0 {
            return Err(syntax());
        }
        if digits <= 19 {
            mantissa = u128::from(leading);
        }
        let suffix = text.get(pos..).ok_or_else(syntax)?;
        let (format, decimal_shift, binary_power) = suffix_scale(suffix).ok_or_else(syntax)?;
        exponent = exponent.checked_add(decimal_shift).ok_or_else(overflow)?;
        if binary_power > 0 {
            mantissa = mantissa
                .checked_mul(1u128 << binary_power)
                .ok_or_else(overflow)?;
        }
        if negative && mantissa != 0 {
            return Err(QuantityError::Negative(text.to_string()));
        }
        Ok(Quantity::new(mantissa, exponent, format))
    }

    fn new(mut mantissa: u128, mut exponent: i32, format: Format) -> Quantity {
        if mantissa == 0 {
            exponent = 0;
        }
        // Trailing zeros into the exponent: in a u64 where the mantissa fits (u128 division
        // costs several times more).
        if let Ok(mut small) = u64::try_from(mantissa) {
            while small != 0 && small.is_multiple_of(10) {
                small /= 10;
                exponent = exponent.saturating_add(1);
            }
            mantissa = u128::from(small);
        } else {
            while mantissa.is_multiple_of(10) {
                mantissa /= 10;
                exponent = exponent.saturating_add(1);
            }
        }
        Quantity {
            mantissa,
            exponent,
            format,
        }
    }

    /// A quantity of whole units `units × 10^-scale` (scale 3: millis).
    pub fn from_units(units: u128, scale: u32, format: Format) -> Quantity {
        Quantity::new(units, -(scale as i32), format)
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn is_zero(&self) -> bool {
        self.mantissa == 0
    }

    /// `floor(self × 10^scale × num / den)`: the value in units of `10^-scale`, scaled by a
    /// rational factor, rounded down. `den` must not be zero.
    pub fn scaled_floor(&self, scale: u32, num: u128, den: u128) -> Result<u128, QuantityError> {
        let overflow = || QuantityError::Overflow(self.to_string());
        if den == 0 {
            return Err(overflow());
        }
        let x = self.mantissa.checked_mul(num).ok_or_else(overflow)?;
        let e = i64::from(self.exponent) + i64::from(scale);
        // floor(floor(x / a) / b) == floor(x / (a b)) for positive integers, so dividing in
        // steps is exact and cannot overflow.
        let scaled = if e >= 0 {
            let e = u32::try_from(e).map_err(|_| overflow())?;
            if x == 0 {
                0
            } else {
                x.checked_mul(pow10(e).ok_or_else(overflow)?)
                    .ok_or_else(overflow)?
            }
        } else {
            div_pow10(x, u32::try_from(-e).unwrap_or(u32::MAX))
        };
        Ok(scaled / den)
    }

    /// `floor(self × 10^scale)`: whole units of `10^-scale` (scale 3: millicores).
    pub fn to_units_floor(&self, scale: u32) -> Result<u128, QuantityError> {
        self.scaled_floor(scale, 1, 1)
    }

    /// `ceil(self × 10^scale)`: whole units of `10^-scale`, rounded up as the API server's
    /// `MilliValue` and `Value` round (scale 9: the nano precision it keeps).
    pub fn to_units_ceil(&self, scale: u32) -> Result<u128, QuantityError> {
        let floor = self.to_units_floor(scale)?;
        let e = i64::from(self.exponent) + i64::from(scale);
        // Below the unit only when the exponent is negative after scaling: then there is a
        // remainder if the mantissa is not a multiple of 10^-e.
        let exact = e >= 0
            || u32::try_from(-e)
                .ok()
                .and_then(pow10)
                .is_some_and(|p| self.mantissa.is_multiple_of(p));
        if exact {
            return Ok(floor);
        }
        floor
            .checked_add(1)
            .ok_or_else(|| QuantityError::Overflow(self.to_string()))
    }
}

/// `e3`, `E-2`, `e+5` -> the exponent; anything else -> None.
fn parse_exponent(suffix: &str) -> Option<i32> {
    let rest = suffix
        .strip_prefix('e')
        .or_else(|| suffix.strip_prefix('E'))?;
    let digits = rest
        .strip_prefix('-')
        .or_else(|| rest.strip_prefix('+'))
        .unwrap_or(rest);
    if digits.is_empty() || digits.len() > 9 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rest.parse().ok()
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        // Normalised, so equal values have equal parts.
        self.mantissa == other.mantissa && self.exponent == other.exponent
    }
}
impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        if self.mantissa == 0 || other.mantissa == 0 {
            return self.mantissa.cmp(&other.mantissa);
        }
        // Bring the larger exponent down to the smaller one; if that overflows, the
        // scaled side is larger than any u128 and so larger than the other side.
        let (a, b, flip) = if self.exponent >= other.exponent {
            (self, other, false)
        } else {
            (other, self, true)
        };
        let diff = u32::try_from(i64::from(a.exponent) - i64::from(b.exponent)).unwrap_or(u32::MAX);
        let ordering = match pow10(diff).and_then(|p| a.mantissa.checked_mul(p)) {
            Some(scaled) => scaled.cmp(&b.mantissa),
            None => Ordering::Greater,
        };
        if flip { ordering.reverse() } else { ordering }
    }
}

/// How a quantity is printed: a whole number, then zeros and a suffix, or, beyond nano and
/// exa, the mantissa with an exponent.
enum Printed {
    Units {
        units: u128,
        zeros: &'static str,
        suffix: &'static str,
    },
    Exponent {
        mantissa: u128,
        exponent: i32,
    },
}

impl Quantity {
    /// Canonical text, the way the API server prints it: the largest exact suffix.
    fn printed(&self) -> Printed {
        let units = |units, zeros, suffix| Printed::Units {
            units,
            zeros,
            suffix,
        };
        if self.mantissa == 0 {
            return units(0, "", "");
        }
        // Binary only for whole numbers of at least 1Ki, as the API server does.
        if self.format == Format::BinarySi
            && let Ok(exponent) = u32::try_from(self.exponent)
            && let Some(mut whole) = pow10(exponent).and_then(|p| self.mantissa.checked_mul(p))
            && whole >= 1024
        {
            // The largest binary suffix that divides it exactly (plain number otherwise).
            const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
            let mut power = 0;
            while power < 6 && whole.is_multiple_of(1024) {
                whole /= 1024;
                power += 1;
            }
            return units(whole, "", SUFFIXES[power]);
        }
        // A decimal suffix whose exponent is a multiple of three, as large as keeps the number
        // whole (1500m, 2, 4k): the smallest multiple of 3 at or below the exponent.
        let suffix_exp = self.exponent.div_euclid(3) * 3;
        let suffix = match suffix_exp {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            0 => "",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            18 => "E",
            // Beyond nano or exa: an exponent (exact, and short whatever the input said).
            _ => {
                return Printed::Exponent {
                    mantissa: self.mantissa,
                    exponent: self.exponent,
                };
            }
        };
        // 0, 1 or 2 zeros: the exponent is at most 2 above the suffix's.
        let zeros = "00"
            .get(..(self.exponent - suffix_exp) as usize)
            .unwrap_or_default();
        units(self.mantissa, zeros, suffix)
    }

    /// `to_string()`, without the formatting machinery (~500 instructions a quantity, a few
    /// per node review): the digits are written straight into the string.
    pub fn to_text(&self) -> String {
        let Printed::Units {
            units,
            zeros,
            suffix,
        } = self.printed()
        else {
            return self.to_string();
        };
        // Room for every u64's digits, a suffix and two zeros in the one allocation.
        let mut text = String::with_capacity(24);
        match u64::try_from(units) {
            Ok(small) => push_digits(&mut text, small),
            Err(_) => text.push_str(Digits::default().of(units)),
        }
        text.push_str(zeros);
        text.push_str(suffix);
        text
    }
}

/// The decimal digits of `n` appended to `text`, as `Display` writes them: into a small buffer
/// (zeroed in a few stores where u128's is a `memset` call), then as ASCII characters (no
/// UTF-8 check).
fn push_digits(text: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    while let Some(next) = at.checked_sub(1) {
        at = next;
        if let Some(slot) = digits.get_mut(at) {
            *slot = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 {
            break;
        }
    }
    text.extend(
        digits
            .get(at..)
            .unwrap_or_default()
            .iter()
            .map(|&d| char::from(d)),
    );
}

/// Room for the decimal digits of any u128 (39 of them).
struct Digits([u8; 40]);

impl Default for Digits {
    fn default() -> Self {
        Digits([0; 40])
    }
}

impl Digits {
    /// The decimal digits of `n`, as `Display` writes them.
    fn of(&mut self, mut n: u128) -> &str {
        let mut at = self.0.len();
        // Through u64 where it fits (u128 division is a call per digit).
        let mut small = u64::try_from(n).ok();
        loop {
            let digit = match small.as_mut() {
                Some(s) => {
                    let digit = *s % 10;
                    *s /= 10;
                    digit as u8
                }
                None => {
                    let digit = n % 10;
                    n /= 10;
                    small = u64::try_from(n).ok();
                    digit as u8
                }
            };
            at -= 1;
            if let Some(slot) = self.0.get_mut(at) {
                *slot = b'0' + digit;
            }
            if small == Some(0) || at == 0 {
                break;
            }
        }
        std::str::from_utf8(self.0.get(at..).unwrap_or_default()).unwrap_or_default()
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.printed() {
            Printed::Units {
                units,
                zeros,
                suffix,
            } => {
                // Through u64 when it fits (u128's formatting divides in 128 bits).
                match u64::try_from(units) {
                    Ok(small) => write!(f, "{small}")?,
                    Err(_) => write!(f, "{units}")?,
                }
                f.write_str(zeros)?;
                f.write_str(suffix)
            }
            Printed::Exponent { mantissa, exponent } => write!(f, "{mantissa}e{exponent}"),
        }
    }
}

/// An overcommit multiplier: a decimal between 1 and 10 with at most 6 decimals, exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ratio {
    /// The ratio is `num / 10^6`.
    num: u128,
}

const RATIO_DEN: u128 = 1_000_000;

impl Ratio {
    /// The CRD's pattern for a ratio (the same grammar `parse` accepts).
    pub const PATTERN: &'static str = r"^(10(\.0{1,6})?|[1-9](\.[0-9]{1,6})?)$";

    pub fn parse(text: &str) -> Result<Ratio, QuantityError> {
        let refuse = || QuantityError::Ratio(text.to_string());
        let (whole, fraction) = match text.split_once('.') {
            Some((w, f)) => (w, f),
            None => (text, ""),
        };
        let digits_ok = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if whole.is_empty()
            || whole.len() > 2
            || !digits_ok(whole)
            || whole.starts_with('0')
            || fraction.len() > 6
            || (text.contains('.') && fraction.is_empty())
            || !digits_ok(fraction)
        {
            return Err(refuse());
        }
        let whole: u128 = whole.parse().map_err(|_| refuse())?;
        let mut frac: u128 = 0;
        for b in fraction.bytes() {
            frac = frac * 10 + u128::from(b - b'0');
        }
        for _ in fraction.len()..6 {
            frac *= 10;
        }
        let num = whole * RATIO_DEN + frac;
        if !(RATIO_DEN..=10 * RATIO_DEN).contains(&num) {
            return Err(refuse());
        }
        Ok(Ratio { num })
    }

    pub fn is_one(&self) -> bool {
        self.num == RATIO_DEN
    }

    /// The ratio in millionths (1.5 -> 1_500_000), for comparing with percents exactly.
    pub fn millionths(&self) -> u128 {
        self.num
    }

    /// `floor(quantity × ratio)` in units of `10^-scale`.
    pub fn apply_floor(&self, quantity: &Quantity, scale: u32) -> Result<u128, QuantityError> {
        quantity.scaled_floor(scale, self.num, RATIO_DEN)
    }
}

impl fmt::Display for Ratio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.num / RATIO_DEN;
        let mut frac = self.num % RATIO_DEN;
        if frac == 0 {
            return write!(f, "{whole}");
        }
        let mut width = 6;
        while frac.is_multiple_of(10) {
            frac /= 10;
            width -= 1;
        }
        write!(f, "{whole}.{frac:0width$}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(text: &str) -> Quantity {
        match Quantity::parse(text) {
            Ok(q) => q,
            Err(e) => panic!("{text}: {e}"),
        }
    }

    #[test]
    fn parses_every_suffix_to_the_exact_value() {
        // (text, value in nano units)
        let cases: &[(&str, u128)] = &[
            ("0", 0),
            ("1", 1_000_000_000),
            ("+1", 1_000_000_000),
            ("-0", 0),
            ("1n", 1),
            ("1u", 1_000),
            ("1m", 1_000_000),
            ("100m", 100_000_000),
            ("1.5", 1_500_000_000),
            ("1.", 1_000_000_000),
            (".5", 500_000_000),
            ("0.001", 1_000_000),
            ("1k", 1_000_000_000_000),
            ("1M", 1_000_000_000_000_000),
            ("1G", 1_000_000_000_000_000_000),
            ("1T", 1_000_000_000_000_000_000_000),
            ("1P", 1_000_000_000_000_000_000_000_000),
            ("1E", 1_000_000_000_000_000_000_000_000_000),
            ("1Ki", 1024 * 1_000_000_000),
            ("1Mi", (1 << 20) * 1_000_000_000),
            ("1Gi", (1 << 30) * 1_000_000_000),
            ("1Ti", (1 << 40) * 1_000_000_000),
            ("1Pi", (1 << 50) * 1_000_000_000),
            ("1Ei", (1 << 60) * 1_000_000_000),
            ("0.5Ki", 512 * 1_000_000_000),
            ("1e3", 1_000_000_000_000),
            ("1E3", 1_000_000_000_000),
            ("1e+3", 1_000_000_000_000),
            ("15e-1", 1_500_000_000),
            ("32780744Ki", 32_780_744 * 1024 * 1_000_000_000),
        ];
        for &(text, nanos) in cases {
            assert_eq!(q(text).to_units_floor(9), Ok(nanos), "{text}");
        }
    }

    #[test]
    fn refuses_garbage() {
        for text in [
            "",
            "m",
            "Ki",
            "1x",
            "1KI",
            "1ki",
            "1.2.3",
            "1 ",
            " 1",
            "1e",
            "1e+",
            "1ee3",
            "--1",
            "0x10",
            "1mm",
            "1Kib",
            "NaN",
            "1e9999999999",
            "١",
        ] {
            assert!(Quantity::parse(text).is_err(), "{text:?} should be refused");
        }
    }

    #[test]
    fn huge_exponents_print_short() {
        assert_eq!(q("1e999999999").to_string(), "1e999999999");
        assert_eq!(q("12e20").to_string(), "1200E");
        assert_eq!(q("1e21").to_string(), "1e21");
        assert_eq!(q("7e-30").to_string(), "7e-30");
    }

    #[test]
    fn refuses_negative_values() {
        assert_eq!(
            Quantity::parse("-1"),
            Err(QuantityError::Negative("-1".into()))
        );
    }

    /// The digits are read in a u64 up to 19 of them and in a u128 past that: every length
    /// around both limits (19 digits, 38) against the digits read one by one in a u128.
    #[test]
    fn long_mantissas_read_the_same_on_both_sides_of_the_u64() {
        let by_u128 = |digits: &str| {
            digits.bytes().try_fold(0u128, |m, b| {
                m.checked_mul(10)?.checked_add(u128::from(b - b'0'))
            })
        };
        for len in 1..=41 {
            for digits in [
                "9".repeat(len),
                format!("1{}", "0".repeat(len - 1)),
                "1234567890".repeat(5).get(..len).unwrap().to_string(),
            ] {
                let expected = by_u128(&digits).map(|m| Quantity::new(m, 0, Format::DecimalSi));
                assert_eq!(Quantity::parse(&digits).ok(), expected, "{digits}");
                let fraction = format!("0.{digits}");
                let expected = by_u128(&digits)
                    .map(|m| Quantity::new(m, -i32::try_from(len).unwrap(), Format::DecimalSi));
                assert_eq!(Quantity::parse(&fraction).ok(), expected, "{fraction}");
            }
        }
    }

    #[test]
    fn huge_values_error_instead_of_wrapping() {
        assert!(q("99999999999999999999Ei").to_units_floor(3).is_err());
        assert!(Quantity::parse("9999999999999999999999999999999Ei").is_err());
    }

    #[test]
    fn compares_by_value_across_suffixes() {
        assert_eq!(q("1Ki"), q("1024"));
        assert_eq!(q("1"), q("1000m"));
        assert_eq!(q("8"), q("8000m"));
        assert_eq!(q("1e3"), q("1k"));
        assert_eq!(q("0.5"), q("500m"));
        assert!(q("1Gi") > q("1G"));
        assert!(q("999m") < q("1"));
        assert!(q("1E") > q("1n"));
        assert!(q("0") < q("1n"));
    }

    #[test]
    fn floors_to_whole_units() {
        assert_eq!(q("1500u").to_units_floor(3), Ok(1)); // 1.5 millicores -> 1m
        assert_eq!(q("0.5").to_units_floor(0), Ok(0));
        assert_eq!(q("1.9Ki").to_units_floor(0), Ok(1945)); // 1945.6 bytes
        assert_eq!(q("3920m").to_units_floor(3), Ok(3920));
    }

    #[test]
    fn ceils_to_whole_units() {
        assert_eq!(q("1500u").to_units_ceil(3), Ok(2)); // 1.5 millicores -> 2m
        assert_eq!(q("0.5").to_units_ceil(0), Ok(1));
        assert_eq!(q("1.9Ki").to_units_ceil(0), Ok(1946));
        assert_eq!(q("3920m").to_units_ceil(3), Ok(3920));
        assert_eq!(q("1e-40").to_units_ceil(9), Ok(1)); // below what 10^38 divides
        assert_eq!(q("0").to_units_ceil(0), Ok(0));
        assert_eq!(q("2Mi").to_units_ceil(9), Ok(2_097_152_000_000_000));
    }

    #[test]
    fn prints_canonical_text_like_the_api_server() {
        let cases: &[(u128, u32, Format, &str)] = &[
            (0, 3, Format::DecimalSi, "0"),
            (1500, 3, Format::DecimalSi, "1500m"),
            (2000, 3, Format::DecimalSi, "2"),
            (4_000_000, 3, Format::DecimalSi, "4k"),
            (110, 0, Format::DecimalSi, "110"),
            (1000, 0, Format::DecimalSi, "1k"),
            (1500, 0, Format::DecimalSi, "1500"),
            (1023, 0, Format::BinarySi, "1023"),
            (1025, 0, Format::BinarySi, "1025"),
            (1024, 0, Format::BinarySi, "1Ki"),
            (3 << 30, 0, Format::BinarySi, "3Gi"),
            (32_780_744 * 1024, 0, Format::BinarySi, "32780744Ki"),
            (1_000, 0, Format::BinarySi, "1k"),
        ];
        for &(units, scale, format, text) in cases {
            assert_eq!(
                Quantity::from_units(units, scale, format).to_string(),
                text,
                "{units} x 10^-{scale}"
            );
        }
        assert_eq!(q("1n").to_string(), "1n");
        assert_eq!(q("1e-12").to_string(), "1e-12");
        assert_eq!(q("1.5Gi").to_string(), "1536Mi");
        // Beyond u64 (printed through u128), on either side of the boundary.
        let cases = [
            (
                u128::from(u64::MAX),
                Format::DecimalSi,
                "18446744073709551615",
            ),
            (
                u128::from(u64::MAX) + 2,
                Format::DecimalSi,
                "18446744073709551617",
            ),
            (
                u128::from(u64::MAX) + 2,
                Format::BinarySi,
                "18446744073709551617",
            ),
            (
                (u128::from(u64::MAX) + 1) * 1024,
                Format::BinarySi,
                "16384Ei",
            ),
            (
                (u128::from(u64::MAX) + 2) * 1024,
                Format::BinarySi,
                "18446744073709551617Ki",
            ),
        ];
        for (units, format, printed) in cases {
            assert_eq!(Quantity::from_units(units, 0, format).to_string(), printed);
        }
    }

    #[test]
    fn to_text_is_to_string() {
        // Mantissas around every power of ten and of two, the u64 edge and beyond, at every
        // scale a quantity is built with and a few beyond nano and exa, in both formats.
        let mut mantissas = vec![0u128, 1, 7, 999, 1024, 1536, u128::MAX];
        for p in 0..39 {
            mantissas.extend([10u128.pow(p) - 1, 10u128.pow(p), 10u128.pow(p) + 1]);
        }
        for p in 0..127 {
            mantissas.extend([(1u128 << p) - 1, 1u128 << p, (1u128 << p) + 1]);
        }
        mantissas.extend([u128::from(u64::MAX), u128::from(u64::MAX) + 1]);
        for mantissa in mantissas {
            for format in [Format::BinarySi, Format::DecimalSi] {
                for exponent in [-40, -12, -10, -9, -7, -3, -2, -1, 0, 1, 2, 3, 5, 18, 20, 21] {
                    let quantity = Quantity::new(mantissa, exponent, format);
                    assert_eq!(quantity.to_text(), quantity.to_string(), "{quantity:?}");
                }
            }
        }
        for text in [
            "79886391705",
            "23835m",
            "220",
            "62Gi",
            "1.5Gi",
            "32780744Ki",
            "1e21",
        ] {
            assert_eq!(q(text).to_text(), q(text).to_string(), "{text}");
        }
    }

    #[test]
    fn printed_text_parses_back_to_the_same_value() {
        for text in [
            "1500m",
            "2",
            "4k",
            "1Ki",
            "1536Mi",
            "7",
            "123456789",
            "1e-12",
            "5E",
            "12000E",
        ] {
            let value = q(text);
            assert_eq!(q(&value.to_string()), value, "{text}");
        }
    }

    #[test]
    fn ratios_parse_exactly_within_one_to_ten() {
        let ok: &[(&str, &str)] = &[
            ("1", "1"),
            ("1.0", "1"),
            ("1.5", "1.5"),
            ("2.25", "2.25"),
            ("9.999999", "9.999999"),
            ("10", "10"),
            ("10.000000", "10"),
            ("3.10", "3.1"),
        ];
        for &(text, printed) in ok {
            match Ratio::parse(text) {
                Ok(r) => assert_eq!(r.to_string(), printed, "{text}"),
                Err(e) => panic!("{text}: {e}"),
            }
        }
        for text in [
            "",
            "0",
            "0.5",
            "0.999999",
            "10.000001",
            "11",
            "1.",
            ".5",
            "1.0000001",
            "01",
            "1e1",
            "+2",
            "-2",
            "2 ",
            "1,5",
            "100",
        ] {
            assert!(Ratio::parse(text).is_err(), "{text:?} should be refused");
        }
    }

    #[test]
    fn ratio_multiplication_is_exact_not_floating_point() {
        // 0.1-style decimals that f64 cannot represent: floor(3 × 1.1) must be 3.3 exactly.
        let r = |t: &str| Ratio::parse(t).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r("1.1").apply_floor(&q("3"), 3), Ok(3300));
        assert_eq!(r("1.1").apply_floor(&q("1Ki"), 0), Ok(1126)); // 1126.4
        assert_eq!(r("2").apply_floor(&q("3920m"), 3), Ok(7840));
        assert_eq!(
            r("1.5").apply_floor(&q("32780744Ki"), 0),
            Ok(32_780_744 * 1536)
        );
        assert_eq!(r("1.000001").apply_floor(&q("1"), 3), Ok(1000));
        assert_eq!(r("10").apply_floor(&q("110"), 0), Ok(1100));
    }
}
