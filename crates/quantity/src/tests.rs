#[cfg(feature = "k8s-openapi")]
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use serde_json::json;

use super::*;

fn q(text: &str) -> Quantity {
    Quantity::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

const GI: i128 = 1 << 30;
const N: i128 = NANOS_PER_UNIT;

#[test]
fn every_suffix_parses_to_its_exact_value() {
    let cases: [(&str, i128); 24] = [
        ("1n", 1),
        ("1u", 1_000),
        ("100m", 100_000_000),
        ("2", 2 * N),
        ("1k", 1_000 * N),
        ("1M", 1_000_000 * N),
        ("1G", 1_000_000_000 * N),
        ("1T", 10i128.pow(12) * N),
        ("1P", 10i128.pow(15) * N),
        ("1E", 10i128.pow(18) * N),
        ("1Ki", 1024 * N),
        ("1Mi", (1 << 20) * N),
        ("1Gi", GI * N),
        ("1Ti", (1 << 40) * N),
        ("1Pi", (1 << 50) * N),
        ("1Ei", (1 << 60) * N),
        ("1e3", 1_000 * N),
        ("12E-3", 12_000_000),
        ("5e+2", 500 * N),
        ("1.5Gi", 3 * GI / 2 * N),
        ("0.1", N / 10),
        ("-1.5", -3 * N / 2),
        ("+7", 7 * N),
        ("1.1G", 1_100_000_000 * N),
    ];
    for (text, nanos) in cases {
        assert_eq!(q(text).nano_value(), nanos, "{text}");
    }
}

#[test]
fn a_bare_point_on_either_side_is_accepted_as_kubernetes_does() {
    assert_eq!(q("1."), q("1"));
    assert_eq!(q(".5"), q("500m"));
    assert_eq!(q("1.Gi"), q("1Gi"));
}

#[test]
fn zero_is_zero_whatever_its_sign_suffix_or_exponent() {
    for text in ["0", "-0", "+0", "0Gi", "0.000", "0e99999999999", "000m"] {
        assert!(q(text).is_zero(), "{text}");
        assert_eq!(q(text).to_string(), "0", "{text}");
    }
}

#[test]
fn malformed_text_is_refused_with_the_kind_of_mistake() {
    let cases = [
        ("", QuantityError::Format),
        (".", QuantityError::Format),
        ("+", QuantityError::Format),
        ("1.2.3", QuantityError::Format),
        ("Gi", QuantityError::Format),
        ("1Zi", QuantityError::Format),
        ("1Xi", QuantityError::Format),
        ("abc", QuantityError::Format),
        (" 1", QuantityError::Format),
        ("1 ", QuantityError::Format),
        ("1e3e3", QuantityError::Format),
        ("--1", QuantityError::Format),
        ("+-1", QuantityError::Format),
        ("1ki", QuantityError::Suffix),
        ("1i", QuantityError::Suffix),
        ("1e", QuantityError::Suffix),
        ("1e+", QuantityError::Suffix),
        ("1m3", QuantityError::Suffix),
        ("1e40", QuantityError::OutOfRange),
        ("1e99999999999999999999", QuantityError::OutOfRange),
        ("1000000000000000000000000000000", QuantityError::OutOfRange),
    ];
    for (text, want) in cases {
        assert_eq!(Quantity::parse(text), Err(want), "{text:?}");
    }
}

#[test]
fn the_format_error_carries_kubernetes_message() {
    assert_eq!(QuantityError::Format.to_string(), FORMAT_ERROR_MESSAGE);
}

#[test]
fn canonical_strings_keep_the_format_and_take_the_largest_exact_suffix() {
    let cases = [
        ("100m", "100m"),
        ("0.1", "100m"),
        ("1.5", "1500m"),
        ("1000", "1k"),
        ("1000000m", "1k"),
        ("1500000", "1500k"),
        ("1023", "1023"),
        ("+1", "1"),
        ("1.5Gi", "1536Mi"),
        ("0.5Gi", "512Mi"),
        ("1024Mi", "1Gi"),
        ("2048Ki", "2Mi"),
        ("1025Ki", "1025Ki"),
        ("-1Ki", "-1Ki"),
        ("1Ki", "1Ki"),
        // Binary values below 1024, or not whole, are written in decimal SI.
        ("0.1Ki", "102400m"),
        ("0.5Ki", "512"),
        ("1.0001Ki", "1024102400u"),
        ("1e3", "1e3"),
        ("1E3", "1e3"),
        ("12E-3", "12e-3"),
        ("1.5e3", "1500"),
        ("1000e0", "1e3"),
        ("1e-9", "1e-9"),
        ("1e21", "1e21"),
        ("1E", "1E"),
        ("1000E", "1000E"),
        ("1e-7", "100e-9"),
        ("-1000", "-1k"),
    ];
    for (text, canonical) in cases {
        assert_eq!(q(text).to_string(), canonical, "{text}");
    }
}

#[test]
fn values_finer_than_a_nano_unit_round_away_from_zero() {
    assert_eq!(q("0.1n").nano_value(), 1);
    assert_eq!(q("-0.1n").nano_value(), -1);
    assert_eq!(q("1.0000000001").nano_value(), N + 1);
    assert_eq!(q("1e-400").to_string(), "1e-9");
    assert_eq!(q("0.0000000001").to_string(), "1n");
    assert_eq!(q("0.0000000000000000000001Ei").nano_value(), 115_293);
    assert_eq!(q("0.000000000000000000000000000001Ei").nano_value(), 1);
}

#[test]
fn whole_and_milli_values_round_away_from_zero() {
    assert_eq!(q("1.5").value(), 2);
    assert_eq!(q("-1.5").value(), -2);
    assert_eq!(q("100m").value(), 1);
    assert_eq!(q("2").value(), 2);
    assert_eq!(q("1Ki").value(), 1024);
    assert_eq!(q("0.0001").milli_value(), 1);
    assert_eq!(q("1.5m").milli_value(), 2);
    assert_eq!(q("-1.5m").milli_value(), -2);
    assert_eq!(q("1").milli_value(), 1000);
    assert_eq!(q("1.1G").value(), 1_100_000_000);
}

#[test]
fn binary_values_are_capped_at_the_largest_int64() {
    let max = i128::from(i64::MAX);
    assert_eq!(q("8Ei").value(), max);
    assert_eq!(q("16Ei"), q("8Ei"));
    assert_eq!(q("-16Ei").value(), -max);
    assert_eq!(q("16Ei").to_string(), "9223372036854775807");
    // Decimal values are not capped.
    assert_eq!(q("16E").value(), 16 * 10i128.pow(18));
}

#[test]
fn equality_and_order_are_by_value_whatever_the_spelling() {
    assert_eq!(q("1Gi"), q("1073741824"));
    assert_eq!(q("1Gi"), q("1024Mi"));
    assert_eq!(q("1.5Gi"), q("1536Mi"));
    assert_eq!(q("1k"), q("1e3"));
    assert_ne!(q("1k"), q("1Ki"));
    assert!(q("100m") < q("1"));
    assert!(q("1G") < q("1Gi"));
    assert!(q("-1Ki") < q("-1k"));
    let mut sorted = [q("1Gi"), q("1"), q("-5"), q("999M"), q("1e-3")];
    sorted.sort();
    let shown: Vec<String> = sorted.iter().map(ToString::to_string).collect();
    assert_eq!(shown, ["-5", "1e-3", "1", "999M", "1Gi"]);
}

#[test]
fn equal_values_hash_alike() {
    let set: std::collections::HashSet<Quantity> = [q("1Gi"), q("1024Mi"), q("1073741824")]
        .into_iter()
        .collect();
    assert_eq!(set.len(), 1);
}

#[test]
fn sums_keep_the_first_format_unless_it_is_zero() {
    let sum = q("1Gi").checked_add(q("512Mi")).expect("no overflow");
    assert_eq!(sum.to_string(), "1536Mi");
    let sum = q("1k").checked_add(q("24")).expect("no overflow");
    assert_eq!(sum.to_string(), "1024");
    let sum = Quantity::ZERO.checked_add(q("2Ki")).expect("no overflow");
    assert_eq!(sum.to_string(), "2Ki");
    let big = Quantity::from_nano_value(i128::MAX, Format::DecimalSi);
    assert_eq!(big.checked_add(q("1n")), None);
}

#[test]
fn differences_and_products_are_exact() {
    assert_eq!(q("1Gi").checked_sub(q("1Mi")), Some(q("1023Mi")));
    assert_eq!(
        q("512Mi").checked_mul(4).map(|p| p.to_string()),
        Some("2Gi".to_owned())
    );
    assert_eq!(q("1Ei").checked_mul(i128::MAX), None);
}

#[test]
fn constructors_build_the_value_in_the_given_format() {
    let bytes = Quantity::from_value(3 * GI, Format::BinarySi).expect("fits");
    assert_eq!(bytes.to_string(), "3Gi");
    assert_eq!(
        Quantity::from_value(1000, Format::BinarySi).map(|b| b.to_string()),
        Ok("1k".to_owned())
    );
    let cpu = Quantity::from_milli_value(250, Format::DecimalSi).expect("fits");
    assert_eq!(cpu.to_string(), "250m");
    assert_eq!(
        Quantity::from_value(i128::MAX, Format::DecimalSi),
        Err(QuantityError::OutOfRange)
    );
    let huge = Quantity::from_value(1 << 70, Format::BinarySi).expect("fits");
    assert_eq!(huge.to_string(), "1024Ei");
    assert_eq!(
        q("1536Mi").with_format(Format::DecimalSi).to_string(),
        "1610612736"
    );
}

#[cfg(feature = "k8s-openapi")]
#[test]
fn api_quantities_convert_both_ways() {
    let api = K8sQuantity(" 1.5Gi ".to_owned());
    let parsed = Quantity::try_from(&api).expect("a quantity");
    assert_eq!(parsed.value(), 3 * GI / 2);
    assert_eq!(K8sQuantity::from(parsed), K8sQuantity("1536Mi".to_owned()));
    assert_eq!(
        Quantity::try_from(&K8sQuantity("1Zi".to_owned())),
        Err(QuantityError::Format)
    );
}

#[test]
fn serde_writes_the_canonical_string_and_reads_strings_or_numbers() {
    assert_eq!(serde_json::to_value(q("1.5Gi")).ok(), Some(json!("1536Mi")));
    let read = |v: serde_json::Value| serde_json::from_value::<Quantity>(v).ok();
    assert_eq!(read(json!("1536Mi")), Some(q("1.5Gi")));
    assert_eq!(read(json!(" 2 ")), Some(q("2")));
    assert_eq!(read(json!(2)), Some(q("2")));
    assert_eq!(read(json!(-3)), Some(q("-3")));
    assert_eq!(read(json!(1.5)), Some(q("1500m")));
    assert_eq!(read(json!(u64::MAX)), Some(q("18446744073709551615")));
    assert_eq!(read(json!("1Zi")), None);
    assert_eq!(read(json!(true)), None);
    assert_eq!(read(json!(null)), None);
    let optional: Option<Quantity> = serde_json::from_value(json!(null)).expect("null is None");
    assert_eq!(optional, None);
}
