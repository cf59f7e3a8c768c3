//! Text → nano-units.
//!
//! The grammar is Kubernetes': `<sign>? <digits> [. <digits>] <suffix>`, where the number needs
//! at least one digit on either side of the point and the suffix is a decimal SI prefix, a binary
//! one, or `e`/`E` and a signed exponent. The digits are kept as a decimal string until the very
//! end, so the only limit on their count is the range of the result; the value is then rounded
//! away from zero to whole nano-units.

use super::{Format, NANOS_PER_UNIT, QuantityError};

/// Kubernetes caps binary-SI quantities at the largest `int64`.
const BINARY_SI_MAX_NANOS: u128 = 9_223_372_036_854_775_807 * 1_000_000_000;

/// Decimal digits in `u128::MAX`; a longer integer cannot fit.
const U128_DIGITS: usize = 39;

/// What a suffix multiplies the number by: `2^base2 × 10^base10`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Suffix {
    base2: u32,
    base10: i64,
    format: Format,
}

/// Parses `text` into nano-units and the suffix format to keep.
pub(super) fn parse(text: &str) -> Result<(i128, Format), QuantityError> {
    let (negative, unsigned) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let (int, rest) = split_digits(unsigned);
    let (frac, suffix) = match rest.strip_prefix('.') {
        Some(after) => split_digits(after),
        None => ("", rest),
    };
    if int.is_empty() && frac.is_empty() {
        return Err(QuantityError::Format);
    }
    let suffix = interpret_suffix(suffix)?;
    let frac_len = i64::try_from(frac.len()).map_err(|_| QuantityError::OutOfRange)?;
    let shift = suffix
        .base10
        .checked_add(9)
        .and_then(|s| s.checked_sub(frac_len))
        .ok_or(QuantityError::OutOfRange)?;
    let mut magnitude = scaled_magnitude(int, frac, suffix.base2, shift)?;
    let mut format = suffix.format;
    if format == Format::BinarySi {
        magnitude = magnitude.min(BINARY_SI_MAX_NANOS);
        if magnitude < NANOS_PER_UNIT.unsigned_abs() {
            // Below one unit no binary suffix applies; Kubernetes switches to decimal.
            format = Format::DecimalSi;
        }
    }
    let magnitude = i128::try_from(magnitude).map_err(|_| QuantityError::OutOfRange)?;
    Ok((if negative { -magnitude } else { magnitude }, format))
}

/// Splits the leading ASCII digits off `text`.
fn split_digits(text: &str) -> (&str, &str) {
    let n = text.bytes().take_while(u8::is_ascii_digit).count();
    text.split_at(n)
}

/// Checks the shape `[eEinumkKMGTP]*[-+]?[0-9]*` and names the multiplier.
fn interpret_suffix(suffix: &str) -> Result<Suffix, QuantityError> {
    let letters = suffix
        .bytes()
        .take_while(|b| b"eEinumkKMGTP".contains(b))
        .count();
    let tail = &suffix[letters..];
    let tail = tail.strip_prefix(['+', '-']).unwrap_or(tail);
    if !tail.bytes().all(|b| b.is_ascii_digit()) {
        return Err(QuantityError::Format);
    }
    let decimal = |base10| Suffix {
        base2: 0,
        base10,
        format: Format::DecimalSi,
    };
    let binary = |base2| Suffix {
        base2,
        base10: 0,
        format: Format::BinarySi,
    };
    Ok(match suffix {
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "" => decimal(0),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        _ => Suffix {
            base2: 0,
            base10: exponent(suffix)?,
            format: Format::DecimalExponent,
        },
    })
}

/// The exponent of an `e`/`E` suffix (`e3`, `E-12`, `e+6`).
fn exponent(suffix: &str) -> Result<i64, QuantityError> {
    let digits = suffix
        .strip_prefix(['e', 'E'])
        .ok_or(QuantityError::Suffix)?;
    let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
    if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
        return Err(QuantityError::Suffix);
    }
    digits.parse().map_err(|_| QuantityError::OutOfRange)
}

/// `|int.frac| × 10^frac_len × 2^base2 × 10^shift`, rounded up to an integer.
fn scaled_magnitude(int: &str, frac: &str, base2: u32, shift: i64) -> Result<u128, QuantityError> {
    let significant: Vec<u8> = int
        .bytes()
        .chain(frac.bytes())
        .map(|b| b - b'0')
        .skip_while(|d| *d == 0)
        .collect();
    if significant.is_empty() {
        return Ok(0);
    }
    let digits = multiply_digits(&significant, 1u64 << base2);
    if shift < 0 {
        let down = usize::try_from(shift.unsigned_abs()).unwrap_or(usize::MAX);
        let keep = digits.len().saturating_sub(down);
        let (whole, dropped) = digits.split_at(keep);
        let round_up = u128::from(dropped.iter().any(|d| *d != 0));
        return digits_to_u128(whole)?
            .checked_add(round_up)
            .ok_or(QuantityError::OutOfRange);
    }
    let up = usize::try_from(shift).map_err(|_| QuantityError::OutOfRange)?;
    if digits.len().saturating_add(up) > U128_DIGITS {
        return Err(QuantityError::OutOfRange);
    }
    let up = u32::try_from(up).map_err(|_| QuantityError::OutOfRange)?;
    digits_to_u128(&digits)?
        .checked_mul(10u128.pow(up))
        .ok_or(QuantityError::OutOfRange)
}

/// Decimal digits (most significant first) times `factor`, as decimal digits.
fn multiply_digits(digits: &[u8], factor: u64) -> Vec<u8> {
    if factor == 1 {
        return digits.to_vec();
    }
    let mut out = Vec::with_capacity(digits.len() + 20);
    let mut carry: u128 = 0;
    for d in digits.iter().rev() {
        carry += u128::from(*d) * u128::from(factor);
        out.push(digit(carry));
        carry /= 10;
    }
    while carry > 0 {
        out.push(digit(carry));
        carry /= 10;
    }
    out.reverse();
    out
}

/// The last decimal digit of `n`.
fn digit(n: u128) -> u8 {
    // A remainder of 10 is always below 10, so the conversion cannot fail.
    u8::try_from(n % 10).unwrap_or(0)
}

fn digits_to_u128(digits: &[u8]) -> Result<u128, QuantityError> {
    digits.iter().try_fold(0u128, |acc, d| {
        acc.checked_mul(10)
            .and_then(|v| v.checked_add(u128::from(*d)))
            .ok_or(QuantityError::OutOfRange)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_suffix_outside_the_grammar_is_a_format_error() {
        assert_eq!(interpret_suffix("Zi"), Err(QuantityError::Format));
        assert_eq!(interpret_suffix(".3"), Err(QuantityError::Format));
        assert_eq!(interpret_suffix("e3e3"), Err(QuantityError::Format));
    }

    #[test]
    fn a_suffix_in_the_grammar_but_unknown_is_a_suffix_error() {
        for bad in ["ki", "i", "e", "E+", "ee3", "m3", "-1", "KiB"] {
            let got = interpret_suffix(bad);
            assert!(
                matches!(got, Err(QuantityError::Suffix | QuantityError::Format)),
                "{bad}: {got:?}"
            );
        }
        assert_eq!(interpret_suffix("ki"), Err(QuantityError::Suffix));
        assert_eq!(interpret_suffix("e"), Err(QuantityError::Suffix));
    }

    #[test]
    fn digits_multiply_by_powers_of_two_exactly() {
        assert_eq!(multiply_digits(&[1, 5], 1 << 10), vec![1, 5, 3, 6, 0]);
        assert_eq!(multiply_digits(&[9], 1), vec![9]);
    }

    #[test]
    fn dropped_digits_round_the_magnitude_up() {
        assert_eq!(scaled_magnitude("1", "", 0, -20), Ok(1));
        assert_eq!(scaled_magnitude("1500", "", 0, -3), Ok(2));
        assert_eq!(scaled_magnitude("1000", "", 0, -3), Ok(1));
        assert_eq!(scaled_magnitude("0", "000", 0, -40), Ok(0));
    }
}
