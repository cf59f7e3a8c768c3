//! Bounded property runs over the parsers a request reaches before any handler logic: the
//! path and query parser, label and field selectors, the three patch kinds and the
//! protobuf decoder. Every input must give an answer (a value or a 4xx error), never a
//! panic. Case counts are fixed so the run is bounded; a failure prints its shrunk input.

use kubevirt_apiserver::patch::{json_patch, merge_patch, strategic_merge_patch};
use kubevirt_apiserver::request::{Query, parse_path};
use kubevirt_apiserver::selectors::{FieldSelector, LabelSelector, Selectors};
use proptest::prelude::*;
use serde_json::{Map, Value};

/// Strings over the characters the grammars care about, plus anything else.
fn grammar_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9=!,()/.%&?+ _-]{0,40}",
        "(in|notin|=|==|!=|,|\\(|\\)|!|[a-z]{1,3}|/|\\.|%[0-9A-F]{2}| ){0,16}",
        any::<String>(),
    ]
}

/// Arbitrary JSON, a few levels deep, with keys patches treat specially.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop_oneof![
            Just("add".to_owned()),
            Just("remove".to_owned()),
            Just("replace".to_owned()),
            Just("/".to_owned()),
            Just("/a/0".to_owned()),
            Just("/-".to_owned()),
            Just("~1".to_owned()),
            Just("delete".to_owned()),
            Just("merge".to_owned()),
            ".{0,8}".prop_map(|s| s),
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        let key = prop_oneof![
            Just("op".to_owned()),
            Just("path".to_owned()),
            Just("from".to_owned()),
            Just("value".to_owned()),
            Just("$patch".to_owned()),
            Just("$retainKeys".to_owned()),
            Just("$deleteFromPrimitiveList/finalizers".to_owned()),
            Just("$setElementOrder/containers".to_owned()),
            Just("metadata".to_owned()),
            Just("spec".to_owned()),
            Just("containers".to_owned()),
            Just("name".to_owned()),
            "[a-z]{1,4}".prop_map(|s| s),
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((key, inner), 0..5)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn client_error(code: u16) -> bool {
    (400..500).contains(&code)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn paths_and_queries_parse_or_are_refused_with_a_4xx(path in grammar_text(), query in grammar_text()) {
        if let Err(e) = parse_path(&format!("/{path}")) {
            prop_assert!(client_error(e.code), "{} for {path:?}", e.code);
        }
        if let Err(e) = parse_path(&path) {
            prop_assert!(client_error(e.code), "{} for {path:?}", e.code);
        }
        if let Err(e) = Query::parse(&query) {
            prop_assert!(client_error(e.code), "{} for {query:?}", e.code);
        }
    }

    #[test]
    fn selectors_parse_or_are_refused_with_a_4xx(labels in grammar_text(), fields in grammar_text()) {
        if let Err(e) = LabelSelector::parse(&labels) {
            prop_assert!(client_error(e.code), "{} for {labels:?}", e.code);
        }
        if let Err(e) = FieldSelector::parse(&fields) {
            prop_assert!(client_error(e.code), "{} for {fields:?}", e.code);
        }
        if let Err(e) = Selectors::parse(Some(&labels), Some(&fields)) {
            prop_assert!(client_error(e.code), "{}", e.code);
        }
    }

    #[test]
    fn the_three_patch_kinds_apply_or_fail_without_panicking(doc in json(), patch in json()) {
        let _ = json_patch(&doc, &patch);
        let _ = merge_patch(&doc, &patch);
        for (api_version, kind) in [("v1", "Pod"), ("apps/v1", "Deployment"), ("kubevirt.io/v1", "VirtualMachine")] {
            let _ = strategic_merge_patch(&doc, &patch, api_version, kind);
        }
    }

    #[test]
    fn the_protobuf_decoder_decodes_or_fails_without_panicking(
        body in prop::collection::vec(any::<u8>(), 0..256),
        kind in prop_oneof![Just("Pod"), Just("SelfSubjectAccessReview"), Just("DeleteOptions"), Just("Nope")],
    ) {
        let _ = kubevirt_apiserver::protobuf::decode_to_json(&body);
        // The same bytes behind kube's envelope: magic, then an Unknown naming a type.
        let mut framed = b"k8s\0".to_vec();
        let type_meta = [&[0x0a, 2][..], b"v1", &[0x12, kind.len() as u8], kind.as_bytes()].concat();
        framed.push(0x0a);
        framed.push(type_meta.len() as u8);
        framed.extend_from_slice(&type_meta);
        framed.push(0x12);
        framed.extend(prost_len(body.len()));
        framed.extend_from_slice(&body);
        let _ = kubevirt_apiserver::protobuf::decode_to_json(&framed);
    }
}

/// A protobuf varint length.
fn prost_len(mut n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}
