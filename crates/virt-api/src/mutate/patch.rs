//! RFC 6902 JSON Patch generation by diffing two JSON values.
//!
//! Objects are diffed key by key (`add`, `remove`, recursive changes); arrays and scalars that
//! differ are replaced whole, which keeps the patch valid whatever happened inside the array.

use serde_json::{Value, json};

/// Escapes one reference token of a JSON pointer (`~` → `~0`, `/` → `~1`).
#[must_use]
pub fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// Operations turning `before` into `after`.
#[must_use]
pub fn diff(before: &Value, after: &Value) -> Vec<Value> {
    let mut ops = Vec::new();
    diff_at("", before, after, &mut ops);
    ops
}

fn diff_at(path: &str, before: &Value, after: &Value, ops: &mut Vec<Value>) {
    if before == after {
        return;
    }
    match (before, after) {
        (Value::Object(a), Value::Object(b)) => {
            for key in a.keys().filter(|k| !b.contains_key(*k)) {
                ops.push(json!({"op": "remove", "path": format!("{path}/{}", escape(key))}));
            }
            for (key, value) in b {
                let child = format!("{path}/{}", escape(key));
                match a.get(key) {
                    None => ops.push(json!({"op": "add", "path": child, "value": value})),
                    Some(old) => diff_at(&child, old, value, ops),
                }
            }
        }
        _ => ops.push(json!({"op": "replace", "path": path, "value": after})),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(before: &Value, ops: &[Value]) -> Value {
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops.to_vec())).unwrap();
        let mut doc = before.clone();
        json_patch::patch(&mut doc, &patch).unwrap();
        doc
    }

    #[test]
    fn diff_of_nested_objects_applies_back_to_the_target() {
        let a = json!({"metadata": {"name": "x", "labels": {"a/b": "1"}}, "spec": {"list": [1, 2], "gone": true}});
        let b = json!({"metadata": {"name": "x", "labels": {"a/b": "2", "c~d": "3"}}, "spec": {"list": [1, 2, 3]}, "status": {"phase": "Pending"}});
        let ops = diff(&a, &b);
        assert_eq!(apply(&a, &ops), b);
        assert!(ops.iter().any(|o| o["path"] == "/metadata/labels/a~1b"));
        assert!(
            ops.iter()
                .any(|o| o["path"] == "/metadata/labels/c~0d" && o["op"] == "add")
        );
    }

    #[test]
    fn equal_values_give_an_empty_patch() {
        let a = json!({"a": [1, {"b": 2}]});
        assert!(diff(&a, &a.clone()).is_empty());
    }

    #[test]
    fn a_changed_root_is_replaced_whole() {
        let ops = diff(&json!(1), &json!({"a": 1}));
        assert_eq!(
            ops,
            vec![json!({"op": "replace", "path": "", "value": {"a": 1}})]
        );
    }
}
