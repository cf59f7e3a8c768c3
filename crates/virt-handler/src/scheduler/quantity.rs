//! Kubernetes resource quantities (`100m`, `128Mi`, `1G`, `2e3`) as integers in thousandths,
//! enough for scheduling arithmetic.

/// Parses a quantity into thousandths of its unit (`"1"` → 1000, `"100m"` → 100,
/// `"1Ki"` → 1_024_000). `None` for malformed input.
pub fn parse_milli(quantity: &str) -> Option<i128> {
    let s = quantity.trim();
    if s.is_empty() {
        return None;
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let (mantissa_milli, exponent10): (i128, i32) = match suffix {
        "" => (1000, 0),
        "m" => (1, 0),
        "k" => (1000, 3),
        "M" => (1000, 6),
        "G" => (1000, 9),
        "T" => (1000, 12),
        "P" => (1000, 15),
        "E" => (1000, 18),
        "Ki" => (1000 << 10, 0),
        "Mi" => (1000 << 20, 0),
        "Gi" => (1000 << 30, 0),
        "Ti" => (1000 << 40, 0),
        "Pi" => (1000 << 50, 0),
        "Ei" => (1000 << 60, 0),
        s if s.starts_with(['e', 'E']) => (1000, s[1..].parse().ok()?),
        _ => return None,
    };
    let value = scaled_decimal(number, exponent10)?;
    // value is the number × 10^exponent10 in units of 10^-9; convert to thousandths.
    value
        .checked_mul(mantissa_milli)?
        .checked_div(1_000_000_000)
}

/// `number × 10^exp` in units of 10^-9, exactly for up to 9 fractional digits.
fn scaled_decimal(number: &str, exp: i32) -> Option<i128> {
    let (negative, digits) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number.strip_prefix('+').unwrap_or(number)),
    };
    let (int_part, frac_part) = digits.split_once('.').unwrap_or((digits, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    if !int_part
        .chars()
        .chain(frac_part.chars())
        .all(|c| c.is_ascii_digit())
    {
        return None;
    }
    let mut value: i128 = 0;
    for c in int_part.chars() {
        value = value
            .checked_mul(10)?
            .checked_add(i128::from(c.to_digit(10)?))?;
    }
    let mut scale_left = 9;
    for c in frac_part.chars().take(9) {
        value = value
            .checked_mul(10)?
            .checked_add(i128::from(c.to_digit(10)?))?;
        scale_left -= 1;
    }
    value = value.checked_mul(10i128.checked_pow(scale_left)?)?;
    value = if exp >= 0 {
        value.checked_mul(10i128.checked_pow(u32::try_from(exp).ok()?)?)?
    } else {
        value / 10i128.checked_pow(exp.unsigned_abs())?
    };
    Some(if negative { -value } else { value })
}

#[cfg(test)]
mod tests {
    use super::parse_milli;

    #[test]
    fn quantities_parse_to_thousandths() {
        let cases = [
            ("1", Some(1000)),
            ("100m", Some(100)),
            ("0.5", Some(500)),
            ("2k", Some(2_000_000)),
            ("1Ki", Some(1_024_000)),
            ("128Mi", Some(128 * 1024 * 1024 * 1000)),
            ("1G", Some(1_000_000_000_000)),
            ("2e3", Some(2_000_000)),
            ("1.5Gi", Some(1536 * 1024 * 1024 * 1000)),
            ("", None),
            ("abc", None),
            ("1Xi", None),
            (".", None),
        ];
        for (input, want) in cases {
            assert_eq!(parse_milli(input), want, "{input}");
        }
    }
}
