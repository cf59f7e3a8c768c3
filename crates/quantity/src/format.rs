//! Nano-units → the canonical string.
//!
//! Kubernetes' rules: zero is `0`; otherwise the suffix keeps the format the quantity was written
//! in and is the largest that leaves a whole mantissa. A binary-SI value below 1024 in magnitude,
//! or not a whole number of units, is written in decimal SI instead, so no precision is lost.
//! Decimal exponents are multiples of three. Decimal SI stops at `E` (larger values get a longer
//! mantissa) and binary SI at `Ei`.

use super::{Format, NANOS_PER_UNIT};

const BINARY_SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
/// Decimal SI suffixes by exponent, from 10^-9 in steps of 10^3.
const DECIMAL_SUFFIXES: [&str; 10] = ["n", "u", "m", "", "k", "M", "G", "T", "P", "E"];
const MAX_DECIMAL_SI_EXPONENT: i32 = 18;

/// The canonical string of `nanos` written in `format`.
pub(super) fn canonical(nanos: i128, format: Format) -> String {
    if nanos == 0 {
        return "0".to_owned();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let magnitude = nanos.unsigned_abs();
    let unit = NANOS_PER_UNIT.unsigned_abs();
    let (mantissa, suffix) = match format {
        Format::BinarySi if magnitude.is_multiple_of(unit) && magnitude >= 1024 * unit => {
            binary(magnitude / unit)
        }
        Format::BinarySi | Format::DecimalSi => {
            let (mantissa, exponent) = decimal(magnitude, MAX_DECIMAL_SI_EXPONENT);
            (mantissa, decimal_si_suffix(exponent).to_owned())
        }
        Format::DecimalExponent => match decimal(magnitude, i32::MAX) {
            (mantissa, 0) => (mantissa, String::new()),
            (mantissa, exponent) => (mantissa, format!("e{exponent}")),
        },
    };
    format!("{sign}{mantissa}{suffix}")
}

/// Whole `units` as a mantissa and the largest binary suffix that divides them.
fn binary(units: u128) -> (u128, String) {
    let mut mantissa = units;
    let mut power = 0;
    while power + 1 < BINARY_SUFFIXES.len() && mantissa.is_multiple_of(1024) {
        mantissa /= 1024;
        power += 1;
    }
    (mantissa, BINARY_SUFFIXES[power].to_owned())
}

/// `nanos` as `mantissa × 10^exponent`, the exponent the largest multiple of three that is at
/// most `max_exponent` and leaves a whole mantissa.
fn decimal(nanos: u128, max_exponent: i32) -> (u128, i32) {
    let mut mantissa = nanos;
    let mut exponent: i32 = -9;
    while mantissa.is_multiple_of(10) {
        mantissa /= 10;
        exponent += 1;
    }
    // Each step multiplies back at most what was divided out, so nothing overflows.
    while exponent.rem_euclid(3) != 0 {
        mantissa *= 10;
        exponent -= 1;
    }
    while exponent > max_exponent {
        mantissa *= 1000;
        exponent -= 3;
    }
    (mantissa, exponent)
}

/// The decimal SI suffix of an exponent that is a multiple of three in `-9..=18`.
fn decimal_si_suffix(exponent: i32) -> &'static str {
    usize::try_from((exponent + 9) / 3)
        .ok()
        .and_then(|i| DECIMAL_SUFFIXES.get(i))
        .copied()
        .unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_exponents_are_multiples_of_three_with_a_whole_mantissa() {
        assert_eq!(decimal(1_500_000_000, 18), (1500, -3));
        assert_eq!(decimal(1, 18), (1, -9));
        assert_eq!(decimal(10u128.pow(30), 18), (1000, 18));
        assert_eq!(decimal(10u128.pow(30), i32::MAX), (1, 21));
    }

    #[test]
    fn binary_suffixes_stop_at_exbi() {
        assert_eq!(binary(1 << 70), (1024, "Ei".to_owned()));
        assert_eq!(binary(1025), (1025, String::new()));
    }
}
