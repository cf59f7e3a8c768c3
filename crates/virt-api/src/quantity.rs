//! Minimal Kubernetes quantity arithmetic (`100m`, `1Gi`, `1.5G`, `2e3`).
//!
//! Quantities are parsed to exact milli-units (`i128`), enough for the comparisons admission
//! makes: request ≤ limit, multiples of a page size, `Value()` (rounded up to whole units).

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The message Kubernetes gives for a quantity that does not parse.
pub const QUANTITY_FORMAT_ERROR: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

/// Parses a quantity into milli-units; `None` when the text is not a quantity.
#[must_use]
pub fn parse_millis(text: &str) -> Option<i128> {
    let text = text.trim();
    let (negative, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let num_end = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(num_end);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return None;
    }
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.len() + frac_part.len() > 30 {
        return None;
    }
    let digits: i128 = format!("{int_part}{frac_part}").parse().unwrap_or(0);
    let frac_scale = 10i128.checked_pow(u32::try_from(frac_part.len()).ok()?)?;
    // (numerator, denominator) of the suffix multiplier times 1000 (milli-units).
    let (mul, div): (i128, i128) = match suffix {
        "" => (1000, 1),
        "m" => (1, 1),
        "u" => (1, 1000),
        "n" => (1, 1_000_000),
        "k" => (1_000_000, 1),
        "M" => (1_000_000_000, 1),
        "G" => (1_000_000_000_000, 1),
        "T" => (1_000_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000_000, 1),
        "Ki" => (1024 * 1000, 1),
        "Mi" => (1024i128.pow(2) * 1000, 1),
        "Gi" => (1024i128.pow(3) * 1000, 1),
        "Ti" => (1024i128.pow(4) * 1000, 1),
        "Pi" => (1024i128.pow(5) * 1000, 1),
        "Ei" => (1024i128.pow(6) * 1000, 1),
        other => {
            let exp = other
                .strip_prefix('e')
                .or_else(|| other.strip_prefix('E'))?;
            let exp: i32 = exp.parse().ok()?;
            if !(-9..=18).contains(&exp) {
                return None;
            }
            if exp >= 0 {
                (10i128.pow(exp.unsigned_abs()) * 1000, 1)
            } else {
                (1000, 10i128.pow(exp.unsigned_abs()))
            }
        }
    };
    let value = digits.checked_mul(mul)?;
    let denom = frac_scale.checked_mul(div)?;
    // Round away from zero to whole milli-units, as Kubernetes does.
    let millis = (value + denom - 1) / denom;
    Some(if negative { -millis } else { millis })
}

/// `Value()` of a quantity in milli-units: whole units, rounded up.
#[must_use]
pub fn millis_to_value(millis: i128) -> i128 {
    if millis >= 0 {
        (millis + 999) / 1000
    } else {
        millis / 1000
    }
}

/// Whole-unit value (rounded up) of a quantity; `None` when it does not parse.
#[must_use]
pub fn value(q: &Quantity) -> Option<i128> {
    parse_millis(&q.0).map(millis_to_value)
}

/// Milli-unit value of a quantity; `None` when it does not parse.
#[must_use]
pub fn millis(q: &Quantity) -> Option<i128> {
    parse_millis(&q.0)
}

/// Formats a byte count as a binary-suffixed quantity (`2Gi`, `1536Mi`, `1000`).
#[must_use]
pub fn format_bytes(bytes: i128) -> String {
    const UNITS: [&str; 6] = ["Ei", "Pi", "Ti", "Gi", "Mi", "Ki"];
    for (i, unit) in UNITS.iter().enumerate() {
        let size = 1024i128.pow(u32::try_from(6 - i).unwrap_or(1));
        if bytes != 0 && bytes % size == 0 {
            return format!("{}{unit}", bytes / size);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_and_binary_suffixes_parse_to_milli_units() {
        assert_eq!(parse_millis("100m"), Some(100));
        assert_eq!(parse_millis("2"), Some(2000));
        assert_eq!(parse_millis("1.5"), Some(1500));
        assert_eq!(parse_millis("1Mi"), Some(1024 * 1024 * 1000));
        assert_eq!(parse_millis("1M"), Some(1_000_000_000));
        assert_eq!(parse_millis("2e3"), Some(2_000_000));
        assert_eq!(parse_millis("-1"), Some(-1000));
    }

    #[test]
    fn garbage_is_not_a_quantity() {
        for bad in ["", "abc", "1..2", "1Xi", "Gi", "1e99"] {
            assert_eq!(parse_millis(bad), None, "{bad}");
        }
    }

    #[test]
    fn value_rounds_up_to_whole_units() {
        assert_eq!(millis_to_value(100), 1);
        assert_eq!(millis_to_value(2000), 2);
        assert_eq!(millis_to_value(0), 0);
    }

    #[test]
    fn byte_counts_format_with_the_largest_exact_binary_suffix() {
        assert_eq!(format_bytes(2 * 1024 * 1024 * 1024), "2Gi");
        assert_eq!(format_bytes(1536 * 1024 * 1024), "1536Mi");
        assert_eq!(format_bytes(1000), "1000");
    }
}
