//! Table cells of printer columns, as kube-apiserver's CRD table convertor makes them.
//!
//! The first selected value becomes the cell; by column `type`:
//!
//! | type | value | cell |
//! |---|---|---|
//! | `string` | string | the string |
//! | `string` | number, boolean | its text (`3`, `1.5`, `true`) |
//! | `string` | object, array | its JSON text, keys sorted |
//! | `integer` | number | the number, truncated toward zero |
//! | `number` | number | the number |
//! | `boolean` | boolean | the boolean |
//! | `date` | RFC 3339 string | the age against `now` ([`human_duration_signed`]) |
//! | `date` | `""` or the zero time | `<unknown>` |
//! | `date` | any other string | `<invalid>` |
//!
//! Anything else (nothing selected, `null`, a value of the wrong kind, an unknown column type)
//! is a `null` cell, which kubectl prints as empty.

use std::fmt::Write as _;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use serde_json::Value;

use crate::schema::go_float;

/// Formats a column cell as kube-apiserver's Table printer does for a column `type`
/// (`string`, `integer`, `number`, `boolean`, `date`): the first selected value; `date`
/// becomes the relative age (`5m`, `3h2m`, `10d`) against `now`; nothing selected → `Value::Null`.
pub fn format_cell(column_type: &str, selected: &[&Value], now: Timestamp) -> Value {
    let Some(value) = selected.first().copied() else {
        return Value::Null;
    };
    match (column_type, value) {
        (_, Value::Null) => Value::Null,
        ("string", Value::String(s)) => Value::String(s.clone()),
        ("string", other) => Value::String(text(other)),
        ("integer", Value::Number(n)) => match n.as_i64() {
            Some(i) => Value::from(i),
            None => n
                .as_f64()
                .filter(|f| f.is_finite())
                // `as` saturates, like Go's conversion on the platforms kube runs on.
                .map_or(Value::Null, |f| Value::from(f.trunc() as i64)),
        },
        ("number", Value::Number(n)) => Value::Number(n.clone()),
        ("boolean", Value::Bool(b)) => Value::Bool(*b),
        ("date", Value::String(s)) => Value::String(age(s, now)),
        _ => Value::Null,
    }
}

/// The age of an RFC 3339 timestamp at `now`.
fn age(timestamp: &str, now: Timestamp) -> String {
    if timestamp.is_empty() || timestamp == "null" {
        return "<unknown>".to_owned();
    }
    let Ok(t) = timestamp.parse::<Timestamp>() else {
        return "<invalid>".to_owned();
    };
    if t.as_second() == GO_ZERO_TIME_UNIX && t.subsec_nanosecond() == 0 {
        return "<unknown>".to_owned();
    }
    human_duration_signed(now.duration_since(t))
}

/// `0001-01-01T00:00:00Z`, Go's zero `time.Time`, in Unix seconds.
const GO_ZERO_TIME_UNIX: i64 = -62_135_596_800;

/// A value as kubectl's JSONPath printer writes it: scalars plain, objects and arrays as
/// compact JSON with sorted keys (Go's `json.Marshal` of a map).
fn text(value: &Value) -> String {
    let mut out = String::new();
    write_text(value, true, &mut out);
    out
}

fn write_text(value: &Value, top: bool, out: &mut String) {
    match value {
        Value::String(s) if top => out.push_str(s),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => {
                let _ = write!(out, "{i}");
            }
            (_, Some(u), _) => {
                let _ = write!(out, "{u}");
            }
            (_, _, Some(f)) => out.push_str(&go_float(f)),
            _ => out.push_str(&n.to_string()),
        },
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_text(item, false, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_text(item, false, out);
            }
            out.push('}');
        }
        Value::Null | Value::Bool(_) | Value::String(_) => out.push_str(&value.to_string()),
    }
}

/// Kubernetes' `duration.HumanDuration` of a non-negative duration: `45s`, `3m5s`, `125m`,
/// `5h7m`, `2d2h`, `30d`, `2y45d`, `9y`. See [`human_duration_signed`] for the rules.
pub fn human_duration(d: Duration) -> String {
    human_duration_signed(SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX))
}

/// Kubernetes' `duration.HumanDuration`, used for every age in `kubectl get`:
///
/// - less than -1s (clock skew beyond tolerance) → `<invalid>`; -1s..0 → `0s`;
/// - under 2 minutes → seconds (`119s`);
/// - under 10 minutes → minutes and seconds, seconds left out when zero (`3m5s`, `4m`);
/// - under 3 hours → minutes (`125m`);
/// - under 8 hours → hours and minutes, minutes left out when zero (`5h7m`, `6h`);
/// - under 2 days → hours (`47h`);
/// - under 8 days → days and hours, hours left out when zero (`2d2h`, `3d`);
/// - under 2 years (of 365 days) → days (`400d`);
/// - under 8 years → years and days, days left out when zero (`2y45d`, `3y`);
/// - otherwise years (`9y`).
pub fn human_duration_signed(d: SignedDuration) -> String {
    let seconds = d.as_secs();
    if seconds < -1 {
        return "<invalid>".to_owned();
    }
    if seconds < 0 {
        return "0s".to_owned();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        return with_rest(minutes, "m", seconds % 60, "s");
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        return with_rest(hours, "h", minutes % 60, "m");
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if hours < 24 * 8 {
        return with_rest(days, "d", hours % 24, "h");
    }
    if hours < 24 * 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if hours < 24 * 365 * 8 {
        return with_rest(years, "y", days % 365, "d");
    }
    format!("{years}y")
}

fn with_rest(major: i64, major_unit: &str, minor: i64, minor_unit: &str) -> String {
    if minor == 0 {
        format!("{major}{major_unit}")
    } else {
        format!("{major}{major_unit}{minor}{minor_unit}")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn now() -> Timestamp {
        match "2024-05-10T12:00:00Z".parse() {
            Ok(t) => t,
            Err(e) => panic!("fixed clock must parse: {e}"),
        }
    }

    #[test]
    fn human_durations_follow_kubernetes_rules() {
        let table: &[(i64, &str)] = &[
            (-5, "<invalid>"),
            (-2, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (45, "45s"),
            (119, "119s"),
            (120, "2m"),
            (185, "3m5s"),
            (599, "9m59s"),
            (600, "10m"),
            (125 * 60, "125m"),
            (3 * 3600 - 1, "179m"),
            (3 * 3600, "3h"),
            (5 * 3600 + 7 * 60 + 59, "5h7m"),
            (8 * 3600, "8h"),
            (47 * 3600 + 3599, "47h"),
            (48 * 3600, "2d"),
            (50 * 3600, "2d2h"),
            (8 * 86400 - 1, "7d23h"),
            (8 * 86400, "8d"),
            (729 * 86400, "729d"),
            (730 * 86400, "2y"),
            (775 * 86400, "2y45d"),
            (8 * 365 * 86400 - 1, "7y364d"),
            (9 * 365 * 86400 + 100 * 86400, "9y"),
        ];
        for (seconds, expected) in table {
            assert_eq!(
                human_duration_signed(SignedDuration::from_secs(*seconds)),
                *expected,
                "{seconds}s"
            );
        }
    }

    #[test]
    fn fractions_of_a_second_are_truncated() {
        assert_eq!(
            human_duration_signed(SignedDuration::from_millis(-1999)),
            "0s"
        );
        assert_eq!(
            human_duration_signed(SignedDuration::from_millis(-2000)),
            "<invalid>"
        );
        assert_eq!(human_duration(Duration::from_millis(119_999)), "119s");
    }

    #[test]
    fn cells_are_made_as_kube_apiserver_makes_them() {
        let object = json!({"a": 1, "b": [true]});
        let table: Vec<(&str, Value, Value)> = vec![
            ("string", json!("Running"), json!("Running")),
            ("string", json!(3), json!("3")),
            ("string", json!(1.5), json!("1.5")),
            ("string", json!(true), json!("true")),
            (
                "string",
                json!({"z": "x", "a": [1, "s"]}),
                json!("{\"a\":[1,\"s\"],\"z\":\"x\"}"),
            ),
            ("string", object.clone(), json!("{\"a\":1,\"b\":[true]}")),
            ("string", Value::Null, Value::Null),
            ("integer", json!(7), json!(7)),
            ("integer", json!(7.9), json!(7)),
            ("integer", json!(-7.9), json!(-7)),
            ("integer", json!("7"), Value::Null),
            ("number", json!(2.5), json!(2.5)),
            ("number", json!(2), json!(2)),
            ("number", json!("2.5"), Value::Null),
            ("boolean", json!(false), json!(false)),
            ("boolean", json!("true"), Value::Null),
            ("date", json!("2024-05-10T11:55:00Z"), json!("5m")),
            ("date", json!("2024-05-10T09:58:00Z"), json!("122m")),
            ("date", json!("2024-05-08T10:00:00.123Z"), json!("2d1h")),
            ("date", json!("2024-05-10T12:00:30Z"), json!("<invalid>")),
            ("date", json!("yesterday"), json!("<invalid>")),
            ("date", json!(""), json!("<unknown>")),
            ("date", json!("0001-01-01T00:00:00Z"), json!("<unknown>")),
            ("date", json!(12), Value::Null),
            ("color", json!("red"), Value::Null),
        ];
        for (column_type, value, expected) in table {
            assert_eq!(
                format_cell(column_type, &[&value], now()),
                expected,
                "{column_type} {value}"
            );
        }
    }

    #[test]
    fn only_the_first_selected_value_counts() {
        let (a, b) = (json!("first"), json!("second"));
        assert_eq!(format_cell("string", &[&a, &b], now()), json!("first"));
    }

    #[test]
    fn nothing_selected_is_a_null_cell() {
        assert_eq!(format_cell("string", &[], now()), Value::Null);
    }
}
