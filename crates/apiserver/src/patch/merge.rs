//! RFC 7386 JSON merge patch: objects merge recursively, `null` deletes a member, anything
//! else (arrays included) replaces the target.
//!
//! One deviation, as kube-apiserver: a patch that is `null` as a whole is refused instead of
//! turning the object into `null`.

use serde_json::{Map, Value};

use super::PatchError;

/// Applies an RFC 7386 merge patch.
///
/// A non-object patch replaces the document (RFC 7386); callers storing Kubernetes objects
/// must check that the result is still an object.
pub fn merge_patch(doc: &Value, patch: &Value) -> Result<Value, PatchError> {
    if patch.is_null() {
        return Err(PatchError::Invalid("a merge patch must not be null".into()));
    }
    let mut out = doc.clone();
    merge_into(&mut out, patch);
    Ok(out)
}

fn merge_into(target: &mut Value, patch: &Value) {
    let Value::Object(members) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(obj) = target else {
        return;
    };
    for (key, value) in members {
        if value.is_null() {
            obj.shift_remove(key);
        } else {
            merge_into(obj.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rfc_7386_style_cases_give_expected_documents() {
        let cases = [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (
                json!({"a": "b"}),
                json!({"b": "c"}),
                json!({"a": "b", "b": "c"}),
            ),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (
                json!({"a": "b", "b": "c"}),
                json!({"a": null}),
                json!({"b": "c"}),
            ),
            (json!({"a": ["b"]}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "c"}), json!({"a": ["b"]}), json!({"a": ["b"]})),
            (
                json!({"a": {"b": "c"}}),
                json!({"a": {"b": "d", "c": null}}),
                json!({"a": {"b": "d"}}),
            ),
            (
                json!({"a": [{"b": "c"}]}),
                json!({"a": [1]}),
                json!({"a": [1]}),
            ),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a": "b"}), json!(["c"]), json!(["c"])),
            (
                json!({"e": null}),
                json!({"a": 1}),
                json!({"e": null, "a": 1}),
            ),
            (
                json!([1, 2]),
                json!({"a": "b", "c": null}),
                json!({"a": "b"}),
            ),
            (
                json!({}),
                json!({"a": {"bb": {"ccc": null}}}),
                json!({"a": {"bb": {}}}),
            ),
            (json!({"a": "b"}), json!("x"), json!("x")),
        ];
        for (doc, patch, want) in cases {
            assert_eq!(merge_patch(&doc, &patch).unwrap(), want, "{doc} + {patch}");
        }
    }

    #[test]
    fn label_set_to_null_is_removed_and_others_kept() {
        let doc = json!({"metadata": {"labels": {"a": "1", "b": "2"}, "name": "x"}});
        let patch = json!({"metadata": {"labels": {"a": null, "c": "3"}}});
        assert_eq!(
            merge_patch(&doc, &patch).unwrap(),
            json!({"metadata": {"labels": {"b": "2", "c": "3"}, "name": "x"}})
        );
    }

    #[test]
    fn a_null_patch_is_refused() {
        assert!(matches!(
            merge_patch(&json!({}), &Value::Null),
            Err(PatchError::Invalid(_))
        ));
    }
}
