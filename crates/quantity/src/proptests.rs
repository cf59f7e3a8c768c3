//! Properties over generated quantity strings: the canonical string is a fixpoint that reads
//! back as the same value, integer mantissas scale exactly by their suffix, and decoding the
//! same JSON through k8s-openapi's `Quantity` gives the same value.

#[cfg(feature = "k8s-openapi")]
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use proptest::prelude::*;
use serde_json::json;

use super::{NANOS_PER_UNIT, Quantity};

/// Suffixes with their multiplier in nano-units.
const SUFFIXES: [(&str, i128); 16] = [
    ("n", 1),
    ("u", 1_000),
    ("m", 1_000_000),
    ("", NANOS_PER_UNIT),
    ("k", NANOS_PER_UNIT * 1_000),
    ("M", NANOS_PER_UNIT * 1_000_000),
    ("G", NANOS_PER_UNIT * 1_000_000_000),
    ("T", NANOS_PER_UNIT * 1_000_000_000_000),
    ("P", NANOS_PER_UNIT * 1_000_000_000_000_000),
    ("E", NANOS_PER_UNIT * 1_000_000_000_000_000_000),
    ("Ki", NANOS_PER_UNIT << 10),
    ("Mi", NANOS_PER_UNIT << 20),
    ("Gi", NANOS_PER_UNIT << 30),
    ("Ti", NANOS_PER_UNIT << 40),
    ("Pi", NANOS_PER_UNIT << 50),
    ("Ei", NANOS_PER_UNIT << 60),
];

fn suffix() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::sample::select(SUFFIXES.map(|(s, _)| s).to_vec()).prop_map(str::to_owned),
        (
            proptest::sample::select(vec!["e", "E"]),
            proptest::sample::select(vec!["", "+", "-"]),
            0u32..=18,
        )
            .prop_map(|(e, sign, n)| format!("{e}{sign}{n}")),
    ]
}

/// Any text of the grammar whose value fits: sign, up to 10 integer digits, an optional
/// fraction of up to 12 digits, any suffix.
fn quantity_text() -> impl Strategy<Value = String> {
    (
        proptest::sample::select(vec!["", "+", "-"]),
        "[0-9]{0,10}",
        proptest::option::of("[0-9]{0,12}"),
        suffix(),
    )
        .prop_filter_map("a number needs a digit", |(sign, int, frac, suffix)| {
            let frac_digits = frac.as_deref().unwrap_or("");
            if int.is_empty() && frac_digits.is_empty() {
                return None;
            }
            let point = frac.as_ref().map_or(String::new(), |f| format!(".{f}"));
            Some(format!("{sign}{int}{point}{suffix}"))
        })
}

proptest! {
    #[test]
    fn generated_quantities_round_trip_through_their_canonical_string(text in quantity_text()) {
        let q = Quantity::parse(&text)
            .map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
        let canonical = q.to_string();
        let again = Quantity::parse(&canonical)
            .map_err(|e| TestCaseError::fail(format!("{text:?} → {canonical:?}: {e}")))?;
        prop_assert_eq!(again, q, "{} → {}", text, canonical);
        prop_assert_eq!(again.to_string(), canonical);
    }

    #[test]
    fn integer_mantissas_scale_exactly_by_their_suffix(
        mantissa in 0i128..10_000_000_000,
        index in 0..SUFFIXES.len(),
    ) {
        let (suffix, nanos) = SUFFIXES[index];
        let q = Quantity::parse(&format!("{mantissa}{suffix}"));
        let want = mantissa * nanos;
        // Binary values are capped at 2^63 − 1 units, as Kubernetes caps them.
        let want = if suffix.ends_with('i') {
            want.min(i128::from(i64::MAX) * NANOS_PER_UNIT)
        } else {
            want
        };
        prop_assert_eq!(q.map(|q| q.nano_value()), Ok(want));
    }

    #[cfg(feature = "k8s-openapi")]
    #[test]
    fn json_strings_decode_to_the_same_value_as_k8s_openapi_quantities(text in quantity_text()) {
        let ours: Quantity = serde_json::from_value(json!(text)).map_err(|e| {
            TestCaseError::fail(format!("{text:?}: {e}"))
        })?;
        let theirs: K8sQuantity = serde_json::from_value(json!(text))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(Quantity::try_from(&theirs), Ok(ours));
        // Our canonical JSON is a k8s-openapi quantity of the same value.
        let written = serde_json::to_value(ours).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let theirs: K8sQuantity = serde_json::from_value(written)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(Quantity::try_from(&theirs), Ok(ours));
    }

    #[cfg(feature = "k8s-openapi")]
    #[test]
    fn json_numbers_decode_to_the_same_value_as_k8s_openapi_quantities(
        int in any::<i64>(),
        float in -1e15f64..1e15,
    ) {
        for number in [json!(int), json!(float)] {
            let ours: Quantity = serde_json::from_value(number.clone())
                .map_err(|e| TestCaseError::fail(format!("{number}: {e}")))?;
            let theirs: K8sQuantity = serde_json::from_value(number)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(Quantity::try_from(&theirs), Ok(ours));
        }
        prop_assert_eq!(
            serde_json::from_value::<Quantity>(json!(int)).map(|q| q.value()).ok(),
            Some(i128::from(int))
        );
    }
}
