//! Go durations (`168h`, `1h30m`, `20s`, `1.5h`, `500ms`, `-2m`): what Kubernetes'
//! `metav1.Duration` accepts, as the KubeVirt CR's certificate lifetimes and the `freeze`
//! subresource's `unfreezeTimeout` carry them.

/// The duration `text` spells, in seconds (negative for a leading `-`); `None` for anything
/// Go's `time.ParseDuration` refuses.
#[must_use]
pub fn parse_go_duration_seconds(text: &str) -> Option<f64> {
    let (negative, mut rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    if rest == "0" {
        return Some(0.0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..number_len].parse().ok()?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += number * seconds;
    }
    total
        .is_finite()
        .then_some(if negative { -total } else { total })
}

/// A non-negative Go duration as a [`std::time::Duration`].
#[must_use]
pub fn parse_go_duration(text: &str) -> Option<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(parse_go_duration_seconds(text)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse_as_metav1_duration_does() {
        #[allow(clippy::cast_possible_truncation)]
        let ms = |s| parse_go_duration_seconds(s).map(|s| (s * 1000.0).round() as i64);
        assert_eq!(ms("168h"), Some(168 * 3_600_000));
        assert_eq!(ms("1h30m"), Some(5_400_000));
        assert_eq!(ms("20s"), Some(20_000));
        assert_eq!(ms("1.5h"), Some(5_400_000));
        assert_eq!(ms("500ms"), Some(500));
        assert_eq!(ms("0"), Some(0));
        assert_eq!(ms("-2m"), Some(-120_000));
        assert_eq!(ms(""), None);
        assert_eq!(ms("10"), None);
        assert_eq!(ms("3d"), None);
        assert_eq!(ms("h"), None);
        assert_eq!(
            parse_go_duration("5m0s"),
            Some(std::time::Duration::from_secs(300))
        );
        assert_eq!(parse_go_duration("-1s"), None);
    }
}
