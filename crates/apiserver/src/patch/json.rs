//! RFC 6902 JSON Patch over `serde_json::Value`, with RFC 6901 JSON Pointers.
//!
//! The whole patch is parsed and checked first (a malformed document is
//! [`PatchError::Invalid`] before anything is applied), then the operations run in order
//! on a copy of the object, so a failure leaves the caller's object untouched.
//!
//! Where the RFC leaves room, this follows kube-apiserver:
//! - removing or replacing a member that does not exist is an error ([`PatchError::PathNotFound`]),
//! - a failed `test` is [`PatchError::TestFailed`]; `test` with value `null` passes when the
//!   member is absent from an existing object (KubeVirt tests `status.stateChangeRequests`
//!   against `null` before adding the first request),
//! - numbers compare by value in `test` (`1` equals `1.0`),
//! - array indices are read as signed integers and a negative one counts from the end
//!   (`/list/-1` is the last element; for `add`, the place after it),
//! - a patch may hold at most [`MAX_OPERATIONS`] operations.
//!
//! Guards against resource exhaustion: values copied by `copy` may add up to at most
//! [`MAX_COPIED_BYTES`], and no operation may nest the object deeper than [`MAX_DEPTH`].

use serde_json::{Map, Value};

use super::{PatchError, describe};

/// The largest number of operations one patch may hold (as kube-apiserver).
pub const MAX_OPERATIONS: usize = 10_000;
/// An upper bound on the approximate JSON size of all values duplicated by `copy`.
pub const MAX_COPIED_BYTES: usize = 16 * 1024 * 1024;
/// The deepest nesting of arrays and objects a patched object may reach.
pub const MAX_DEPTH: usize = 100;

/// One parsed operation; pointers are already split into unescaped reference tokens.
#[derive(Debug)]
enum Op {
    Add(Vec<String>, Value),
    Remove(Vec<String>),
    Replace(Vec<String>, Value),
    Move {
        from: Vec<String>,
        path: Vec<String>,
    },
    Copy {
        from: Vec<String>,
        path: Vec<String>,
    },
    Test(Vec<String>, Value),
}

/// Applies an RFC 6902 JSON Patch to `doc`, all-or-nothing.
///
/// `patch` must be an array of operation objects. Returns the patched copy of `doc`.
pub fn json_patch(doc: &Value, patch: &Value) -> Result<Value, PatchError> {
    let ops = parse_patch(patch)?;
    let mut out = doc.clone();
    let mut copied = 0usize;
    for op in ops {
        apply(&mut out, op, &mut copied)?;
    }
    Ok(out)
}

fn parse_patch(patch: &Value) -> Result<Vec<Op>, PatchError> {
    let Value::Array(items) = patch else {
        return Err(PatchError::Invalid(
            "a JSON patch must be a JSON array of operations".into(),
        ));
    };
    if items.len() > MAX_OPERATIONS {
        return Err(PatchError::Invalid(format!(
            "the allowed maximum operations in a JSON patch is {MAX_OPERATIONS}, got {}",
            items.len()
        )));
    }
    items.iter().map(parse_op).collect()
}

fn parse_op(item: &Value) -> Result<Op, PatchError> {
    let Value::Object(obj) = item else {
        return Err(PatchError::Invalid(format!(
            "a JSON patch operation must be an object, got {}",
            describe(item)
        )));
    };
    let op = match obj.get("op") {
        Some(Value::String(s)) => s.as_str(),
        _ => {
            return Err(PatchError::Invalid(format!(
                "operation has no \"op\" string: {}",
                describe(item)
            )));
        }
    };
    let path = pointer_field(obj, "path", op)?;
    let value = || {
        obj.get("value").cloned().ok_or_else(|| {
            PatchError::Invalid(format!(
                "{op} operation at {} has no \"value\"",
                show(&path)
            ))
        })
    };
    let from = || pointer_field(obj, "from", op);
    Ok(match op {
        "add" => Op::Add(path.clone(), value()?),
        "remove" => Op::Remove(path),
        "replace" => Op::Replace(path.clone(), value()?),
        "move" => Op::Move {
            from: from()?,
            path,
        },
        "copy" => Op::Copy {
            from: from()?,
            path,
        },
        "test" => Op::Test(path.clone(), value()?),
        other => {
            return Err(PatchError::Invalid(format!(
                "unknown JSON patch operation {other:?}"
            )));
        }
    })
}

fn pointer_field(
    obj: &Map<String, Value>,
    field: &str,
    op: &str,
) -> Result<Vec<String>, PatchError> {
    match obj.get(field) {
        Some(Value::String(s)) => parse_pointer(s),
        _ => Err(PatchError::Invalid(format!(
            "{op} operation has no {field:?} string"
        ))),
    }
}

/// Splits an RFC 6901 JSON Pointer into unescaped reference tokens (`""` is the root).
pub fn parse_pointer(pointer: &str) -> Result<Vec<String>, PatchError> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(PatchError::Invalid(format!(
            "JSON pointer {pointer:?} does not start with '/'"
        )));
    };
    rest.split('/')
        .map(|raw| {
            let mut token = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                if c != '~' {
                    token.push(c);
                    continue;
                }
                match chars.next() {
                    Some('0') => token.push('~'),
                    Some('1') => token.push('/'),
                    _ => {
                        return Err(PatchError::Invalid(format!(
                            "JSON pointer {pointer:?} has a '~' not followed by '0' or '1'"
                        )));
                    }
                }
            }
            Ok(token)
        })
        .collect()
}

/// Renders reference tokens back as a JSON Pointer, for messages.
fn show(tokens: &[String]) -> String {
    tokens
        .iter()
        .map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1")))
        .collect()
}

fn apply(doc: &mut Value, op: Op, copied: &mut usize) -> Result<(), PatchError> {
    match op {
        Op::Add(path, value) => add(doc, &path, value),
        Op::Remove(path) => remove(doc, &path).map(drop),
        Op::Replace(path, value) => {
            check_depth(&path, &value)?;
            let target = get_mut(doc, &path)?;
            *target = value;
            Ok(())
        }
        Op::Move { from, path } => {
            if from == path {
                return get_mut(doc, &from).map(drop);
            }
            if path.starts_with(&from) {
                return Err(PatchError::Invalid(format!(
                    "cannot move {} into its own child {}",
                    show(&from),
                    show(&path)
                )));
            }
            let value = remove(doc, &from)?;
            add(doc, &path, value)
        }
        Op::Copy { from, path } => {
            let value = get_mut(doc, &from)?.clone();
            *copied = copied.saturating_add(approx_size(&value));
            if *copied > MAX_COPIED_BYTES {
                return Err(PatchError::Invalid(format!(
                    "values copied by the patch exceed {MAX_COPIED_BYTES} bytes"
                )));
            }
            add(doc, &path, value)
        }
        Op::Test(path, value) => test(doc, &path, &value),
    }
}

fn check_depth(path: &[String], value: &Value) -> Result<(), PatchError> {
    if path.len() + depth(value, MAX_DEPTH + 1) > MAX_DEPTH {
        return Err(PatchError::Invalid(format!(
            "the patched object would nest deeper than {MAX_DEPTH} levels at {}",
            show(path)
        )));
    }
    Ok(())
}

/// Nesting depth of arrays/objects in `v` (a scalar is 0), counted up to `limit`.
fn depth(v: &Value, limit: usize) -> usize {
    if limit == 0 {
        return 0;
    }
    match v {
        Value::Array(a) => 1 + a.iter().map(|x| depth(x, limit - 1)).max().unwrap_or(0),
        Value::Object(o) => 1 + o.values().map(|x| depth(x, limit - 1)).max().unwrap_or(0),
        _ => 0,
    }
}

/// Roughly the serialized size of `v` in bytes.
fn approx_size(v: &Value) -> usize {
    match v {
        Value::Null | Value::Bool(_) | Value::Number(_) => 8,
        Value::String(s) => s.len() + 2,
        Value::Array(a) => a.iter().map(approx_size).fold(2, usize::saturating_add),
        Value::Object(o) => o
            .iter()
            .map(|(k, x)| k.len() + 3 + approx_size(x))
            .fold(2, usize::saturating_add),
    }
}

/// Parses an array index token for an array of `len` places. Like kube-apiserver, a
/// negative index counts from the end (`-1` is the last place) and the token is read as a
/// signed decimal integer.
fn array_index(token: &str, len: usize, tokens: &[String]) -> Result<usize, PatchError> {
    let bad = || {
        PatchError::PathNotFound(format!(
            "{}: {token:?} is not an index of an array of {len}",
            show(tokens)
        ))
    };
    let index: i64 = token.parse().map_err(|_| bad())?;
    if index >= 0 {
        return usize::try_from(index).map_err(|_| bad());
    }
    let from_end = usize::try_from(index.unsigned_abs()).map_err(|_| bad())?;
    len.checked_sub(from_end).ok_or_else(bad)
}

fn get_mut<'a>(doc: &'a mut Value, tokens: &[String]) -> Result<&'a mut Value, PatchError> {
    let mut cur = doc;
    for token in tokens {
        cur = match cur {
            Value::Object(obj) => obj.get_mut(token),
            Value::Array(arr) => {
                let i = array_index(token, arr.len(), tokens)?;
                arr.get_mut(i)
            }
            _ => None,
        }
        .ok_or_else(|| PatchError::PathNotFound(show(tokens)))?;
    }
    Ok(cur)
}

/// The container holding the last token of `tokens`, and that token.
fn parent_mut<'a, 't>(
    doc: &'a mut Value,
    tokens: &'t [String],
) -> Result<(&'a mut Value, &'t str), PatchError> {
    match tokens.split_last() {
        Some((last, parent)) => Ok((get_mut(doc, parent)?, last.as_str())),
        None => Err(PatchError::Invalid(
            "this operation cannot target the whole document".into(),
        )),
    }
}

fn add(doc: &mut Value, tokens: &[String], value: Value) -> Result<(), PatchError> {
    check_depth(tokens, &value)?;
    if tokens.is_empty() {
        *doc = value;
        return Ok(());
    }
    let (parent, last) = parent_mut(doc, tokens)?;
    match parent {
        Value::Object(obj) => {
            obj.insert(last.to_owned(), value);
            Ok(())
        }
        Value::Array(arr) => {
            let i = if last == "-" {
                arr.len()
            } else {
                array_index(last, arr.len() + 1, tokens)?
            };
            if i > arr.len() {
                return Err(PatchError::PathNotFound(format!(
                    "{}: index {i} is beyond the end of an array of {}",
                    show(tokens),
                    arr.len()
                )));
            }
            arr.insert(i, value);
            Ok(())
        }
        _ => Err(PatchError::PathNotFound(format!(
            "{}: parent is not an object or array",
            show(tokens)
        ))),
    }
}

fn remove(doc: &mut Value, tokens: &[String]) -> Result<Value, PatchError> {
    let (parent, last) = parent_mut(doc, tokens)?;
    match parent {
        Value::Object(obj) => obj
            .shift_remove(last)
            .ok_or_else(|| PatchError::PathNotFound(show(tokens))),
        Value::Array(arr) => {
            let i = array_index(last, arr.len(), tokens)?;
            if i >= arr.len() {
                return Err(PatchError::PathNotFound(format!(
                    "{}: index {i} is out of range",
                    show(tokens)
                )));
            }
            Ok(arr.remove(i))
        }
        _ => Err(PatchError::PathNotFound(show(tokens))),
    }
}

fn test(doc: &mut Value, tokens: &[String], want: &Value) -> Result<(), PatchError> {
    let failed =
        |why: &str| PatchError::TestFailed(format!("testing value {} failed: {why}", show(tokens)));
    let found = match tokens.split_last() {
        None => Some(&*doc),
        Some((last, parent)) => match get_mut(doc, parent) {
            Ok(Value::Object(obj)) => obj.get(last),
            Ok(Value::Array(arr)) => array_index(last, arr.len(), tokens)
                .ok()
                .and_then(|i| arr.get(i)),
            Ok(_) | Err(_) => return Err(failed("path not found")),
        },
    };
    match found {
        None if want.is_null() => Ok(()),
        None => Err(failed("path not found")),
        Some(have) if json_equal(have, want) => Ok(()),
        Some(have) => Err(failed(&format!("found {}", describe(have)))),
    }
}

/// JSON equality where numbers compare by value (`1 == 1.0`).
pub(crate) fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y || matches!((x.as_f64(), y.as_f64()), (Some(p), Some(q)) if p == q)
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_equal(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, p)| y.get(k).is_some_and(|q| json_equal(p, q)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// (name, document, patch, expected result or `None` for an error)
    type Case = (&'static str, Value, Value, Option<Value>);

    fn add_cases() -> Vec<Case> {
        vec![
            (
                "add sets a new object member",
                json!({"a": 1}),
                json!([{"op": "add", "path": "/b", "value": [1, 2]}]),
                Some(json!({"a": 1, "b": [1, 2]})),
            ),
            (
                "add replaces an existing object member",
                json!({"a": 1}),
                json!([{"op": "add", "path": "/a", "value": 2}]),
                Some(json!({"a": 2})),
            ),
            (
                "add inserts into an array before the index",
                json!({"l": ["a", "c"]}),
                json!([{"op": "add", "path": "/l/1", "value": "b"}]),
                Some(json!({"l": ["a", "b", "c"]})),
            ),
            (
                "add with dash appends to an array",
                json!({"l": [1]}),
                json!([{"op": "add", "path": "/l/-", "value": 2}]),
                Some(json!({"l": [1, 2]})),
            ),
            (
                "add at the array length appends",
                json!({"l": [1]}),
                json!([{"op": "add", "path": "/l/1", "value": 2}]),
                Some(json!({"l": [1, 2]})),
            ),
            (
                "add beyond the array length fails",
                json!({"l": [1]}),
                json!([{"op": "add", "path": "/l/2", "value": 2}]),
                None,
            ),
            (
                "add to a missing parent fails",
                json!({"a": 1}),
                json!([{"op": "add", "path": "/x/y", "value": 2}]),
                None,
            ),
            (
                "add at the root replaces the document",
                json!({"a": 1}),
                json!([{"op": "add", "path": "", "value": {"b": 2}}]),
                Some(json!({"b": 2})),
            ),
            (
                "add with an empty key names the empty member",
                json!({}),
                json!([{"op": "add", "path": "/", "value": 1}]),
                Some(json!({"": 1})),
            ),
            (
                "escaped tokens address slashes and tildes",
                json!({"a/b": 1, "m~n": 2}),
                json!([
                    {"op": "replace", "path": "/a~1b", "value": 10},
                    {"op": "replace", "path": "/m~0n", "value": 20}
                ]),
                Some(json!({"a/b": 10, "m~n": 20})),
            ),
            (
                "annotation keys with slashes are reachable",
                json!({"metadata": {"annotations": {"kubevirt.io/x": "1"}}}),
                json!([{"op": "remove", "path": "/metadata/annotations/kubevirt.io~1x"}]),
                Some(json!({"metadata": {"annotations": {}}})),
            ),
        ]
    }

    fn remove_and_replace_cases() -> Vec<Case> {
        vec![
            (
                "remove deletes an object member",
                json!({"a": 1, "b": 2}),
                json!([{"op": "remove", "path": "/a"}]),
                Some(json!({"b": 2})),
            ),
            (
                "remove deletes an array element and shifts the rest",
                json!({"l": [1, 2, 3]}),
                json!([{"op": "remove", "path": "/l/0"}]),
                Some(json!({"l": [2, 3]})),
            ),
            (
                "remove of a missing member fails",
                json!({"a": 1}),
                json!([{"op": "remove", "path": "/b"}]),
                None,
            ),
            (
                "remove of an index past the end fails",
                json!({"l": [1]}),
                json!([{"op": "remove", "path": "/l/1"}]),
                None,
            ),
            (
                "replace changes an existing member",
                json!({"a": {"b": 1}}),
                json!([{"op": "replace", "path": "/a/b", "value": "x"}]),
                Some(json!({"a": {"b": "x"}})),
            ),
            (
                "replace of a missing member fails",
                json!({"a": 1}),
                json!([{"op": "replace", "path": "/b", "value": 1}]),
                None,
            ),
        ]
    }

    fn move_and_copy_cases() -> Vec<Case> {
        vec![
            (
                "move relocates a value",
                json!({"a": {"b": 1}, "c": {}}),
                json!([{"op": "move", "from": "/a/b", "path": "/c/d"}]),
                Some(json!({"a": {}, "c": {"d": 1}})),
            ),
            (
                "move reorders array elements",
                json!({"l": [1, 2, 3, 4]}),
                json!([{"op": "move", "from": "/l/1", "path": "/l/3"}]),
                Some(json!({"l": [1, 3, 4, 2]})),
            ),
            (
                "move into its own child fails",
                json!({"a": {"b": {}}}),
                json!([{"op": "move", "from": "/a", "path": "/a/b/c"}]),
                None,
            ),
            (
                "move from a missing path fails",
                json!({"a": 1}),
                json!([{"op": "move", "from": "/x", "path": "/y"}]),
                None,
            ),
            (
                "copy duplicates a value",
                json!({"a": {"b": [1]}}),
                json!([{"op": "copy", "from": "/a", "path": "/c"}]),
                Some(json!({"a": {"b": [1]}, "c": {"b": [1]}})),
            ),
        ]
    }

    fn test_and_pointer_cases() -> Vec<Case> {
        vec![
            (
                "test of an equal value passes",
                json!({"a": {"b": [1, "x", {"c": null}]}}),
                json!([{"op": "test", "path": "/a", "value": {"b": [1, "x", {"c": null}]}}]),
                Some(json!({"a": {"b": [1, "x", {"c": null}]}})),
            ),
            (
                "test compares numbers by value",
                json!({"a": 1}),
                json!([{"op": "test", "path": "/a", "value": 1.0}]),
                Some(json!({"a": 1})),
            ),
            (
                "a failed test aborts the whole patch",
                json!({"a": 1}),
                json!([
                    {"op": "add", "path": "/b", "value": 2},
                    {"op": "test", "path": "/a", "value": 2}
                ]),
                None,
            ),
            (
                "test of an absent member against null passes",
                json!({"status": {}}),
                json!([
                    {"op": "test", "path": "/status/stateChangeRequests", "value": null},
                    {"op": "add", "path": "/status/stateChangeRequests", "value": [{"action": "Start"}]}
                ]),
                Some(json!({"status": {"stateChangeRequests": [{"action": "Start"}]}})),
            ),
            (
                "test of an absent member against a value fails",
                json!({"status": {}}),
                json!([{"op": "test", "path": "/status/x", "value": []}]),
                None,
            ),
            (
                "operations see the results of earlier ones",
                json!({}),
                json!([
                    {"op": "add", "path": "/a", "value": []},
                    {"op": "add", "path": "/a/-", "value": 1},
                    {"op": "copy", "from": "/a/0", "path": "/b"},
                    {"op": "test", "path": "/b", "value": 1}
                ]),
                Some(json!({"a": [1], "b": 1})),
            ),
            (
                "negative indices count from the end as in kube-apiserver",
                json!({"l": [1, 2, 3]}),
                json!([
                    {"op": "remove", "path": "/l/-1"},
                    {"op": "add", "path": "/l/-1", "value": 4},
                    {"op": "replace", "path": "/l/-3", "value": 0}
                ]),
                Some(json!({"l": [0, 2, 4]})),
            ),
            (
                "negative indices before the start fail",
                json!({"l": [1]}),
                json!([{"op": "remove", "path": "/l/-2"}]),
                None,
            ),
            (
                "non-numeric indices fail",
                json!({"l": [1]}),
                json!([{"op": "replace", "path": "/l/x", "value": 2}]),
                None,
            ),
            (
                "descending into a scalar fails",
                json!({"a": 1}),
                json!([{"op": "add", "path": "/a/b", "value": 1}]),
                None,
            ),
        ]
    }

    fn check(cases: Vec<Case>) {
        for (name, doc, patch, want) in cases {
            let got = json_patch(&doc, &patch);
            match want {
                Some(want) => assert_eq!(got.ok(), Some(want), "{name}"),
                None => assert!(got.is_err(), "{name}: expected an error, got {got:?}"),
            }
        }
    }

    #[test]
    fn add_operations_give_expected_documents() {
        check(add_cases());
    }

    #[test]
    fn remove_and_replace_operations_give_expected_documents() {
        check(remove_and_replace_cases());
    }

    #[test]
    fn move_and_copy_operations_give_expected_documents() {
        check(move_and_copy_cases());
    }

    #[test]
    fn test_operations_sequences_and_pointers_give_expected_documents() {
        check(test_and_pointer_cases());
    }

    #[test]
    fn a_failed_test_is_reported_as_test_failed() {
        let doc = json!({"status": {"stateChangeRequests": [{"action": "Stop"}]}});
        let patch = json!([{"op": "test", "path": "/status/stateChangeRequests", "value": null}]);
        let err = json_patch(&doc, &patch).unwrap_err();
        assert!(matches!(err, PatchError::TestFailed(_)), "{err:?}");
        assert_eq!(err.status_code(), 422);
    }

    #[test]
    fn removing_a_missing_member_is_path_not_found() {
        let err = json_patch(&json!({}), &json!([{"op": "remove", "path": "/a"}])).unwrap_err();
        assert!(matches!(err, PatchError::PathNotFound(_)), "{err:?}");
    }

    #[test]
    fn malformed_patch_documents_are_invalid() {
        let bad = [
            json!({"op": "add", "path": "/a", "value": 1}),
            json!([1]),
            json!([{"path": "/a"}]),
            json!([{"op": "frobnicate", "path": "/a"}]),
            json!([{"op": "add", "path": "a", "value": 1}]),
            json!([{"op": "add", "path": "/a~2", "value": 1}]),
            json!([{"op": "add", "path": "/a~", "value": 1}]),
            json!([{"op": "add", "path": "/a"}]),
            json!([{"op": "move", "path": "/a"}]),
            json!([{"op": "remove", "path": ""}]),
        ];
        for patch in bad {
            let err = json_patch(&json!({"a": 1}), &patch).unwrap_err();
            assert!(matches!(err, PatchError::Invalid(_)), "{patch}: {err:?}");
        }
    }

    #[test]
    fn the_original_document_is_untouched_when_a_later_operation_fails() {
        let doc = json!({"a": 1});
        let patch = json!([{"op": "remove", "path": "/a"}, {"op": "remove", "path": "/a"}]);
        assert!(json_patch(&doc, &patch).is_err());
        assert_eq!(doc, json!({"a": 1}));
    }

    #[test]
    fn too_many_operations_are_refused() {
        let ops: Vec<Value> = (0..=MAX_OPERATIONS)
            .map(|_| json!({"op": "test", "path": "", "value": {}}))
            .collect();
        assert!(matches!(
            json_patch(&json!({}), &Value::Array(ops)),
            Err(PatchError::Invalid(_))
        ));
    }

    #[test]
    fn repeated_self_copies_hit_the_copy_limit() {
        let ops: Vec<Value> = (0..60)
            .map(|_| json!({"op": "copy", "from": "/a", "path": "/a/-"}))
            .collect();
        let doc = json!({"a": ["x".repeat(1 << 20)]});
        let err = json_patch(&doc, &Value::Array(ops)).unwrap_err();
        assert!(matches!(err, PatchError::Invalid(_)), "{err:?}");
    }

    #[test]
    fn moves_cannot_nest_the_document_without_bound() {
        let mut ops = Vec::new();
        for _ in 0..200 {
            ops.push(json!({"op": "add", "path": "/b", "value": {}}));
            ops.push(json!({"op": "move", "from": "/a", "path": "/b/a"}));
            ops.push(json!({"op": "move", "from": "/b", "path": "/a"}));
        }
        let err = json_patch(&json!({"a": {}}), &Value::Array(ops)).unwrap_err();
        assert!(matches!(err, PatchError::Invalid(_)), "{err:?}");
    }

    #[test]
    fn pointers_render_back_with_escapes() {
        let tokens = parse_pointer("/a~1b/m~0n/~01").unwrap();
        assert_eq!(tokens, ["a/b", "m~n", "~1"]);
        assert_eq!(show(&tokens), "/a~1b/m~0n/~01");
    }
}
