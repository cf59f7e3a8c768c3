//! Kubernetes strategic merge patch, applied on the server side.
//!
//! The patch is walked together with the stored object. Maps merge recursively and `null`
//! deletes a member, as in a JSON merge patch; lists follow the strategy that
//! [`strategy`](super::strategy) gives for their path: replaced, merged as a set of
//! primitives, or merged element by element by a merge key.
//!
//! Directives, as `kubectl` sends them:
//! - `"$patch": "replace"` in a map replaces the map by the rest of the patch map;
//!   `"$patch": "delete"` empties it. In a merged list, an element `{"$patch": "replace"}`
//!   makes the other elements the whole list, and `{"$patch": "delete", <key>: v}` removes
//!   the element whose merge key is `v`.
//! - `"$retainKeys": [..]` drops the map's members not named (the patch may only set
//!   members it names).
//! - `"$deleteFromPrimitiveList/<field>": [..]` removes those values from the primitive list
//!   `<field>`.
//! - `"$setElementOrder/<field>": [..]` orders the merged list `<field>`: elements the
//!   directive names come in its order, elements only the server knows keep their place
//!   relative to the stored list.
//!
//! Without `$setElementOrder`, merged lists are ordered as upstream: elements named by the
//! patch in the patch's order, interleaved with the stored ones by their stored positions;
//! new elements come first.
//!
//! Values that are new to the object (and whole replaced lists) are taken from the patch
//! with their `null` members dropped and directives applied.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use super::strategy::{ListStrategy, Schema, schema_for};
use super::{PatchError, describe};

const PATCH: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";

/// Applies a strategic merge patch to a built-in kind identified by `api_version` and `kind`
/// (merge keys such as containers by `name`, `$patch`, `$retainKeys`, `$deleteFromPrimitiveList`,
/// `$setElementOrder`).
///
/// Kinds without a table in [`strategy`](super::strategy) merge maps and replace lists
/// (except the `metadata` lists every object shares). Both `doc` and `patch` must be objects.
pub fn strategic_merge_patch(
    doc: &Value,
    patch: &Value,
    api_version: &str,
    kind: &str,
) -> Result<Value, PatchError> {
    let Value::Object(patch) = patch else {
        return Err(PatchError::Invalid(format!(
            "a strategic merge patch must be a JSON object, got {}",
            describe(patch)
        )));
    };
    let original = match doc {
        Value::Object(obj) => obj.clone(),
        other => {
            return Err(PatchError::Invalid(format!(
                "cannot strategically merge into {}",
                describe(other)
            )));
        }
    };
    let mut merger = Merger {
        schema: schema_for(api_version, kind),
        path: Vec::new(),
    };
    merger.merge_map(original, patch).map(Value::Object)
}

/// A `$setElementOrder/<field>` directive with a copy of the stored list as the server's
/// order.
struct Order<'p> {
    field: &'p str,
    order: &'p [Value],
    server: Vec<Value>,
}

/// The walk's state: the kind's rules and the member names from the root to the value
/// being merged.
struct Merger {
    schema: Schema,
    path: Vec<String>,
}

impl Merger {
    fn at(&self) -> String {
        if self.path.is_empty() {
            "the object root".to_owned()
        } else {
            self.path.join(".")
        }
    }

    fn invalid(&self, what: &str) -> PatchError {
        PatchError::Invalid(format!("{what} at {}", self.at()))
    }

    /// The strategy of the list member `field` of the current map.
    fn strategy_of(&mut self, field: &str) -> ListStrategy {
        self.path.push(field.to_owned());
        let strategy = self.schema.list_strategy(&self.path);
        self.path.pop();
        strategy
    }

    fn merge_map(
        &mut self,
        mut out: Map<String, Value>,
        patch: &Map<String, Value>,
    ) -> Result<Map<String, Value>, PatchError> {
        if let Some(directive) = patch.get(PATCH) {
            return match directive.as_str() {
                Some("replace") => {
                    let rest: Map<String, Value> = patch
                        .iter()
                        .filter(|(k, _)| k.as_str() != PATCH)
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    self.merge_map(Map::new(), &rest)
                }
                Some("delete") => Ok(Map::new()),
                _ => Err(self.invalid(&format!(
                    "unknown $patch directive {} in a map",
                    describe(directive)
                ))),
            };
        }
        if let Some(keys) = patch.get(RETAIN_KEYS) {
            self.retain_keys(&mut out, patch, keys)?;
        }
        let orders = self.take_orders(&out, patch)?;
        for (key, value) in patch {
            if let Some(field) = key.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) {
                self.delete_from_primitive_list(&mut out, field, value)?;
            }
        }
        for (key, value) in patch {
            if key == PATCH
                || key == RETAIN_KEYS
                || key.starts_with(DELETE_FROM_PRIMITIVE_LIST)
                || key.starts_with(SET_ELEMENT_ORDER)
            {
                continue;
            }
            if value.is_null() {
                out.shift_remove(key);
                continue;
            }
            self.path.push(key.clone());
            let merged = match out.get_mut(key) {
                Some(slot) => {
                    let old = std::mem::take(slot);
                    self.merge_value(old, value).map(|v| *slot = v)
                }
                None => self.fresh(value).map(|v| {
                    out.insert(key.clone(), v);
                }),
            };
            self.path.pop();
            merged?;
        }
        for Order {
            field,
            order,
            server,
        } in orders
        {
            let key = match self.strategy_of(field) {
                ListStrategy::MergeByKey(key) => Some(key),
                ListStrategy::Replace | ListStrategy::MergeSet => None,
            };
            if let Some(Value::Array(list)) = out.get_mut(field) {
                let merged = std::mem::take(list);
                *list = normalize_order(merged, &ids(order, key), &ids(&server, key), key);
            }
        }
        Ok(out)
    }

    /// Applies `$retainKeys` to `out` after checking that the patch only sets named members.
    fn retain_keys(
        &self,
        out: &mut Map<String, Value>,
        patch: &Map<String, Value>,
        keys: &Value,
    ) -> Result<(), PatchError> {
        let Value::Array(keys) = keys else {
            return Err(self.invalid("$retainKeys must be a list of member names"));
        };
        let keep: HashSet<&str> = keys
            .iter()
            .map(|k| {
                k.as_str()
                    .ok_or_else(|| self.invalid("$retainKeys must be a list of member names"))
            })
            .collect::<Result<_, _>>()?;
        for (key, value) in patch {
            let directive = key == RETAIN_KEYS
                || key.starts_with(DELETE_FROM_PRIMITIVE_LIST)
                || key.starts_with(SET_ELEMENT_ORDER);
            if !directive && !value.is_null() && !keep.contains(key.as_str()) {
                return Err(self.invalid(&format!(
                    "the patch sets {key:?}, which $retainKeys does not list"
                )));
            }
        }
        out.retain(|k, _| keep.contains(k.as_str()));
        Ok(())
    }

    /// The `$setElementOrder/<field>` directives of `patch`, each with a copy of the stored
    /// list `<field>` as the server's order.
    fn take_orders<'p>(
        &self,
        out: &Map<String, Value>,
        patch: &'p Map<String, Value>,
    ) -> Result<Vec<Order<'p>>, PatchError> {
        let mut orders = Vec::new();
        for (key, value) in patch {
            let Some(field) = key.strip_prefix(SET_ELEMENT_ORDER) else {
                continue;
            };
            let Value::Array(order) = value else {
                return Err(self.invalid(&format!("{key} must be a list")));
            };
            let server = match out.get(field) {
                Some(Value::Array(list)) => list.clone(),
                _ => Vec::new(),
            };
            self.check_order(field, order)?;
            orders.push(Order {
                field,
                order,
                server,
            });
        }
        Ok(orders)
    }

    /// Every element of a `$setElementOrder` list of a keyed list must carry the merge key.
    fn check_order(&self, field: &str, order: &[Value]) -> Result<(), PatchError> {
        let mut path = self.path.clone();
        path.push(field.to_owned());
        if let ListStrategy::MergeByKey(key) = self.schema.list_strategy(&path)
            && let Some(bad) = order.iter().find(|v| v.get(key).is_none())
        {
            return Err(self.invalid(&format!(
                "$setElementOrder/{field} element {} has no merge key {key:?}",
                describe(bad)
            )));
        }
        Ok(())
    }

    fn delete_from_primitive_list(
        &self,
        out: &mut Map<String, Value>,
        field: &str,
        values: &Value,
    ) -> Result<(), PatchError> {
        let Value::Array(values) = values else {
            return Err(self.invalid(&format!(
                "{DELETE_FROM_PRIMITIVE_LIST}{field} must be a list"
            )));
        };
        if values.iter().any(|v| v.is_object() || v.is_array()) {
            return Err(self.invalid(&format!(
                "{DELETE_FROM_PRIMITIVE_LIST}{field} may only hold primitive values"
            )));
        }
        let doomed: HashSet<String> = values.iter().map(canonical).collect();
        if let Some(Value::Array(list)) = out.get_mut(field) {
            list.retain(|v| !doomed.contains(&canonical(v)));
        }
        Ok(())
    }

    /// Merges `patch` into the stored value `old` found at the current path.
    fn merge_value(&mut self, old: Value, patch: &Value) -> Result<Value, PatchError> {
        match (old, patch) {
            (Value::Object(old), Value::Object(patch)) => {
                self.merge_map(old, patch).map(Value::Object)
            }
            (Value::Array(old), Value::Array(patch)) => {
                self.merge_list(old, patch).map(Value::Array)
            }
            (_, patch) => self.fresh(patch),
        }
    }

    /// A patch value for a place the object does not have (yet): nulls dropped, directives
    /// applied.
    fn fresh(&mut self, patch: &Value) -> Result<Value, PatchError> {
        match patch {
            Value::Object(patch) => self.merge_map(Map::new(), patch).map(Value::Object),
            Value::Array(patch) => self.merge_list(Vec::new(), patch).map(Value::Array),
            other => Ok(other.clone()),
        }
    }

    fn merge_list(&mut self, old: Vec<Value>, patch: &[Value]) -> Result<Vec<Value>, PatchError> {
        let key = match self.schema.list_strategy(&self.path) {
            ListStrategy::Replace => return patch.iter().map(|v| self.fresh(v)).collect(),
            ListStrategy::MergeSet => None,
            ListStrategy::MergeByKey(key) => Some(key),
        };
        match element_kind(&old, patch) {
            Err(why) => Err(self.invalid(why)),
            Ok(ElementKind::Empty) => Ok(old),
            Ok(ElementKind::Scalars) => Ok(merge_scalars(&old, patch)),
            Ok(ElementKind::Objects) => match key {
                Some(key) => self.merge_keyed(old, patch, key),
                None => Err(self.invalid("cannot merge a list of objects without a merge key")),
            },
        }
    }

    /// Merges lists of objects element by element, matching elements by `key`.
    fn merge_keyed(
        &mut self,
        mut old: Vec<Value>,
        patch: &[Value],
        key: &str,
    ) -> Result<Vec<Value>, PatchError> {
        let mut items = Vec::with_capacity(patch.len());
        let mut replace = false;
        for element in patch {
            let Value::Object(element) = element else {
                return Err(self.invalid("a merged list mixes objects and other values"));
            };
            let Some(directive) = element.get(PATCH) else {
                items.push(element);
                continue;
            };
            match directive.as_str() {
                Some("delete") => {
                    let Some(doomed) = element.get(key) else {
                        return Err(self.invalid(&format!(
                            "$patch: delete element {} has no merge key {key:?}",
                            describe(&Value::Object(element.clone()))
                        )));
                    };
                    let doomed = canonical(doomed);
                    old.retain(|v| v.get(key).map(canonical).as_ref() != Some(&doomed));
                }
                Some("replace") => replace = true,
                Some("merge") => {
                    return Err(self.invalid("merging lists cannot yet be specified in the patch"));
                }
                _ => {
                    return Err(self.invalid(&format!(
                        "unknown $patch directive {} in a list",
                        describe(directive)
                    )));
                }
            }
        }
        if replace {
            return items
                .into_iter()
                .map(|m| self.merge_map(Map::new(), m).map(Value::Object))
                .collect();
        }
        let server = old.clone();
        let mut index: HashMap<String, usize> = HashMap::new();
        for (i, v) in old.iter().enumerate() {
            if let Some(id) = v.get(key) {
                index.entry(canonical(id)).or_insert(i);
            }
        }
        let mut patch_ids = Vec::with_capacity(items.len());
        for item in &items {
            let Some(id) = item.get(key) else {
                return Err(self.invalid(&format!(
                    "list element {} has no merge key {key:?}",
                    describe(&Value::Object((*item).clone()))
                )));
            };
            patch_ids.push(id);
            match index.get(&canonical(id)) {
                Some(&i) => {
                    let stored = match std::mem::take(&mut old[i]) {
                        Value::Object(stored) => stored,
                        _ => Map::new(),
                    };
                    old[i] = Value::Object(self.merge_map(stored, item)?);
                }
                None => {
                    index.insert(canonical(id), old.len());
                    old.push(Value::Object(self.merge_map(Map::new(), item)?));
                }
            }
        }
        Ok(normalize_order(
            old,
            &patch_ids,
            &ids(&server, Some(key)),
            Some(key),
        ))
    }
}

/// What a merged list holds, judged over the stored and the patch elements together.
enum ElementKind {
    Empty,
    Scalars,
    Objects,
}

fn element_kind(old: &[Value], patch: &[Value]) -> Result<ElementKind, &'static str> {
    let mut kind = ElementKind::Empty;
    for v in old.iter().chain(patch) {
        let this = match v {
            Value::Array(_) => return Err("lists of lists cannot be merged"),
            Value::Object(_) => ElementKind::Objects,
            _ => ElementKind::Scalars,
        };
        kind = match (kind, this) {
            (ElementKind::Empty, this) => this,
            (ElementKind::Objects, ElementKind::Objects) => ElementKind::Objects,
            (ElementKind::Scalars, ElementKind::Scalars) => ElementKind::Scalars,
            _ => return Err("a merged list mixes objects and other values"),
        };
    }
    Ok(kind)
}

/// Union of two primitive lists without duplicates, then ordered like upstream.
fn merge_scalars(old: &[Value], patch: &[Value]) -> Vec<Value> {
    let mut seen = HashSet::new();
    let merged: Vec<Value> = old
        .iter()
        .chain(patch)
        .filter(|v| seen.insert(canonical(v)))
        .cloned()
        .collect();
    let patch_ids: Vec<&Value> = patch.iter().collect();
    let server_ids: Vec<&Value> = old.iter().collect();
    normalize_order(merged, &patch_ids, &server_ids, None)
}

/// A string that is equal for equal identities (numbers compare by value).
fn canonical(v: &Value) -> String {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => {
                // Integral and exactly representable: spell it as an integer.
                format!("{}", f as i64)
            }
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// The identity of a list element: its merge key's value, or the element itself.
fn ident<'a>(v: &'a Value, key: Option<&str>) -> Option<&'a Value> {
    match key {
        Some(key) => v.get(key),
        None => Some(v),
    }
}

/// The identities of a list's elements, skipping elements without one.
fn ids<'a>(list: &'a [Value], key: Option<&str>) -> Vec<&'a Value> {
    list.iter().filter_map(|v| ident(v, key)).collect()
}

/// Positions of identities in an ordering list (first occurrence wins).
struct Positions(HashMap<String, usize>);

impl Positions {
    fn new(ids: &[&Value]) -> Positions {
        let mut map = HashMap::with_capacity(ids.len());
        for (i, id) in ids.iter().enumerate() {
            map.entry(canonical(id)).or_insert(i);
        }
        Positions(map)
    }

    fn of(&self, v: &Value, key: Option<&str>) -> Option<usize> {
        ident(v, key).and_then(|id| self.0.get(&canonical(id)).copied())
    }
}

/// Orders a merged list: the elements named in `patch_ids` sorted by that order, the
/// others by their stored order, then the two interleaved by stored position (an element
/// of the patch goes first unless both are stored and the other was earlier).
fn normalize_order(
    merged: Vec<Value>,
    patch_ids: &[&Value],
    server_ids: &[&Value],
    key: Option<&str>,
) -> Vec<Value> {
    let in_patch = Positions::new(patch_ids);
    let on_server = Positions::new(server_ids);
    let (patch_items, server_only): (Vec<Value>, Vec<Value>) = merged
        .into_iter()
        .partition(|v| in_patch.of(v, key).is_some());
    let patch_items = sort_by(patch_items, &in_patch, key);
    let server_only = sort_by(server_only, &on_server, key);

    let mut out = Vec::with_capacity(patch_items.len() + server_only.len());
    let mut left = server_only.into_iter().peekable();
    let mut right = patch_items.into_iter().peekable();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => matches!(
                (on_server.of(l, key), on_server.of(r, key)),
                (Some(i), Some(j)) if i < j
            ),
        };
        out.extend(if take_left { left.next() } else { right.next() });
    }
    out
}

/// Stable sort by position in `order`; elements not in it go last, in their current order.
fn sort_by(items: Vec<Value>, order: &Positions, key: Option<&str>) -> Vec<Value> {
    let mut found = Vec::with_capacity(items.len());
    let mut rest = Vec::new();
    for v in items {
        match order.of(&v, key) {
            Some(i) => found.push((i, v)),
            None => rest.push(v),
        }
    }
    found.sort_by_key(|(i, _)| *i);
    found.into_iter().map(|(_, v)| v).chain(rest).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(doc: &Value, patch: &Value) -> Result<Value, PatchError> {
        strategic_merge_patch(doc, patch, "v1", "Pod")
    }

    fn names(v: &Value, list: &str) -> Vec<String> {
        v["spec"][list]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| c["name"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    #[test]
    fn containers_merge_by_name_and_keep_the_others() {
        let doc = json!({"spec": {"containers": [
            {"name": "a", "image": "nginx:1", "args": ["x"]},
            {"name": "b", "image": "busybox"}
        ]}});
        let patch = json!({"spec": {"containers": [{"name": "a", "image": "nginx:2"}]}});
        let got = pod(&doc, &patch).unwrap();
        assert_eq!(
            got,
            json!({"spec": {"containers": [
                {"name": "a", "image": "nginx:2", "args": ["x"]},
                {"name": "b", "image": "busybox"}
            ]}})
        );
    }

    #[test]
    fn new_containers_come_first_without_an_order_directive() {
        let doc = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let patch = json!({"spec": {"containers": [{"name": "b", "image": "x"}, {"name": "c"}]}});
        assert_eq!(
            names(&pod(&doc, &patch).unwrap(), "containers"),
            ["a", "b", "c"]
        );
        let patch = json!({"spec": {"containers": [{"name": "c"}]}});
        assert_eq!(
            names(&pod(&doc, &patch).unwrap(), "containers"),
            ["c", "a", "b"]
        );
    }

    #[test]
    fn patch_delete_element_removes_the_container_with_that_name() {
        let doc = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}});
        let patch = json!({"spec": {"containers": [{"$patch": "delete", "name": "b"}]}});
        assert_eq!(names(&pod(&doc, &patch).unwrap(), "containers"), ["a", "c"]);
    }

    #[test]
    fn patch_replace_element_makes_the_patch_list_the_whole_list() {
        let doc = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b"}]}});
        let patch =
            json!({"spec": {"containers": [{"$patch": "replace"}, {"name": "c", "tty": null}]}});
        assert_eq!(
            pod(&doc, &patch).unwrap(),
            json!({"spec": {"containers": [{"name": "c"}]}})
        );
    }

    #[test]
    fn kubectl_apply_patch_with_set_element_order_updates_the_image() {
        let doc = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
            "spec": {"template": {"spec": {"containers": [
                {"name": "a", "image": "nginx:1", "imagePullPolicy": "IfNotPresent"}
            ]}}}
        });
        let patch = json!({
            "metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"new\":1}"}},
            "spec": {"template": {"spec": {
                "$setElementOrder/containers": [{"name": "a"}],
                "containers": [{"image": "nginx:2", "name": "a"}]
            }}}
        });
        let got = strategic_merge_patch(&doc, &patch, "apps/v1", "Deployment").unwrap();
        assert_eq!(
            got["spec"]["template"]["spec"]["containers"],
            json!([{"name": "a", "image": "nginx:2", "imagePullPolicy": "IfNotPresent"}])
        );
        assert_eq!(
            got["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"],
            "{\"new\":1}"
        );
        assert_eq!(got["metadata"]["name"], "web");
    }

    #[test]
    fn kubectl_apply_three_way_patch_with_nested_directives() {
        let doc = json!({
            "metadata": {"name": "web", "labels": {"app": "web", "tier": "front"}},
            "spec": {"replicas": 1, "template": {"spec": {
                "containers": [{"name": "web", "image": "nginx:1", "env": [
                    {"name": "A", "value": "1"},
                    {"name": "B", "value": "2"}
                ]}],
                "volumes": [{"name": "data", "emptyDir": {}}]
            }}}
        });
        let patch = json!({
            "metadata": {"labels": {"tier": null}},
            "spec": {"replicas": 3, "template": {"spec": {
                "$setElementOrder/containers": [{"name": "web"}, {"name": "sidecar"}],
                "containers": [
                    {
                        "$setElementOrder/env": [{"name": "A"}, {"name": "C"}],
                        "env": [{"name": "C", "value": "3"}, {"$patch": "delete", "name": "B"}],
                        "name": "web"
                    },
                    {"image": "busybox", "name": "sidecar"}
                ],
                "volumes": [{"$patch": "delete", "name": "data"}]
            }}}
        });
        let got = strategic_merge_patch(&doc, &patch, "apps/v1", "Deployment").unwrap();
        assert_eq!(
            got,
            json!({
                "metadata": {"name": "web", "labels": {"app": "web"}},
                "spec": {"replicas": 3, "template": {"spec": {
                    "containers": [
                        {"name": "web", "image": "nginx:1", "env": [
                            {"name": "A", "value": "1"},
                            {"name": "C", "value": "3"}
                        ]},
                        {"image": "busybox", "name": "sidecar"}
                    ],
                    "volumes": []
                }}}
            })
        );
    }

    #[test]
    fn set_element_order_places_elements_and_keeps_server_only_ones_in_place() {
        let doc = json!({"spec": {"containers": [{"name": "a"}, {"name": "d"}, {"name": "b"}]}});
        let patch = json!({"spec": {
            "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
            "containers": [{"name": "c"}]
        }});
        assert_eq!(
            names(&pod(&doc, &patch).unwrap(), "containers"),
            ["a", "d", "b", "c"]
        );

        let doc = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}});
        let patch = json!({"spec": {"$setElementOrder/containers": [{"name": "c"}, {"name": "a"}, {"name": "b"}]}});
        assert_eq!(
            names(&pod(&doc, &patch).unwrap(), "containers"),
            ["c", "a", "b"]
        );
    }

    #[test]
    fn kubectl_apply_removal_of_a_container_with_order_directive() {
        let doc = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let patch = json!({"spec": {
            "$setElementOrder/containers": [{"name": "a"}],
            "containers": [{"$patch": "delete", "name": "b"}]
        }});
        assert_eq!(names(&pod(&doc, &patch).unwrap(), "containers"), ["a"]);
    }

    #[test]
    fn set_element_order_entries_need_the_merge_key() {
        let doc = json!({"spec": {"containers": [{"name": "a"}]}});
        let patch = json!({"spec": {"$setElementOrder/containers": [{"image": "x"}]}});
        assert!(matches!(pod(&doc, &patch), Err(PatchError::Invalid(_))));
    }

    #[test]
    fn delete_from_primitive_list_removes_finalizers() {
        let doc = json!({"metadata": {"finalizers": ["x", "y", "z"]}});
        let patch = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["y", "absent"]}});
        assert_eq!(
            pod(&doc, &patch).unwrap(),
            json!({"metadata": {"finalizers": ["x", "z"]}})
        );
    }

    #[test]
    fn kubectl_apply_finalizer_change_deletes_adds_and_orders() {
        let doc = json!({"metadata": {"finalizers": ["x", "y"]}});
        let patch = json!({"metadata": {
            "$setElementOrder/finalizers": ["x", "w"],
            "$deleteFromPrimitiveList/finalizers": ["y"],
            "finalizers": ["w"]
        }});
        assert_eq!(
            strategic_merge_patch(&doc, &patch, "v1", "ConfigMap").unwrap(),
            json!({"metadata": {"finalizers": ["x", "w"]}})
        );
    }

    #[test]
    fn finalizers_merge_as_a_set_in_the_patch_order() {
        let doc = json!({"metadata": {"finalizers": ["a", "b"]}});
        let patch = json!({"metadata": {"finalizers": ["b", "a"]}});
        assert_eq!(
            pod(&doc, &patch).unwrap()["metadata"]["finalizers"],
            json!(["b", "a"])
        );
        let patch = json!({"metadata": {"finalizers": ["c", "a"]}});
        assert_eq!(
            pod(&doc, &patch).unwrap()["metadata"]["finalizers"],
            json!(["c", "a", "b"])
        );
    }

    #[test]
    fn retain_keys_drops_unlisted_members() {
        let doc = json!({"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}});
        let patch = json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}});
        assert_eq!(
            strategic_merge_patch(&doc, &patch, "apps/v1", "Deployment").unwrap(),
            json!({"spec": {"strategy": {"type": "Recreate"}}})
        );
    }

    #[test]
    fn retain_keys_switches_a_volume_source() {
        let doc = json!({"spec": {"volumes": [
            {"name": "v", "emptyDir": {}},
            {"name": "w", "emptyDir": {}}
        ]}});
        let patch = json!({"spec": {
            "$setElementOrder/volumes": [{"name": "v"}, {"name": "w"}],
            "volumes": [{"$retainKeys": ["configMap", "name"], "configMap": {"name": "c"}, "name": "v"}]
        }});
        assert_eq!(
            pod(&doc, &patch).unwrap(),
            json!({"spec": {"volumes": [
                {"name": "v", "configMap": {"name": "c"}},
                {"name": "w", "emptyDir": {}}
            ]}})
        );
    }

    #[test]
    fn retain_keys_refuses_a_patch_setting_unlisted_members() {
        let doc = json!({"spec": {"strategy": {}}});
        let patch = json!({"spec": {"strategy": {"$retainKeys": ["type"], "rollingUpdate": {}}}});
        let err = strategic_merge_patch(&doc, &patch, "apps/v1", "Deployment").unwrap_err();
        assert!(matches!(err, PatchError::Invalid(_)), "{err:?}");
    }

    #[test]
    fn env_merges_by_name_inside_a_deployment_template() {
        let doc = json!({"spec": {"template": {"spec": {"containers": [{"name": "a", "env": [
            {"name": "A", "value": "1"},
            {"name": "B", "value": "2"}
        ]}]}}}});
        let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "a", "env": [
            {"name": "B", "value": "3"}
        ]}]}}}});
        let got = strategic_merge_patch(&doc, &patch, "apps/v1", "Deployment").unwrap();
        assert_eq!(
            got["spec"]["template"]["spec"]["containers"][0]["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "3"}])
        );
    }

    #[test]
    fn cron_job_containers_merge_by_name() {
        let doc = json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [
            {"name": "a", "image": "1"}, {"name": "b", "image": "1"}
        ]}}}}}});
        let patch = json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [
            {"name": "b", "image": "2"}
        ]}}}}}});
        let got = strategic_merge_patch(&doc, &patch, "batch/v1", "CronJob").unwrap();
        assert_eq!(
            got["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"],
            json!([{"name": "a", "image": "1"}, {"name": "b", "image": "2"}])
        );
    }

    #[test]
    fn service_ports_merge_by_port() {
        let doc = json!({"spec": {"ports": [
            {"port": 80, "name": "http"},
            {"port": 443, "name": "https"}
        ]}});
        let patch = json!({"spec": {"ports": [{"port": 443, "targetPort": 8443}]}});
        assert_eq!(
            strategic_merge_patch(&doc, &patch, "v1", "Service").unwrap(),
            json!({"spec": {"ports": [
                {"port": 80, "name": "http"},
                {"port": 443, "name": "https", "targetPort": 8443}
            ]}})
        );
    }

    #[test]
    fn lists_without_a_merge_key_are_replaced() {
        let doc = json!({"spec": {
            "tolerations": [{"key": "a"}, {"key": "b"}],
            "containers": [{"name": "a", "args": ["1", "2"]}]
        }});
        let patch = json!({"spec": {
            "tolerations": [{"key": "c"}],
            "containers": [{"name": "a", "args": ["3"]}]
        }});
        assert_eq!(
            pod(&doc, &patch).unwrap(),
            json!({"spec": {
                "tolerations": [{"key": "c"}],
                "containers": [{"name": "a", "args": ["3"]}]
            }})
        );
    }

    #[test]
    fn null_deletes_a_label_and_other_labels_merge() {
        let doc = json!({"metadata": {"labels": {"a": "1", "b": "2"}}});
        let patch = json!({"metadata": {"labels": {"a": null, "c": "3"}}});
        assert_eq!(
            strategic_merge_patch(&doc, &patch, "v1", "Namespace").unwrap(),
            json!({"metadata": {"labels": {"b": "2", "c": "3"}}})
        );
    }

    #[test]
    fn patch_replace_in_a_map_replaces_it_and_patch_delete_empties_it() {
        let doc = json!({"metadata": {"labels": {"a": "1"}, "annotations": {"x": "y"}}});
        let patch = json!({"metadata": {
            "labels": {"$patch": "replace", "b": "2"},
            "annotations": {"$patch": "delete"}
        }});
        assert_eq!(
            pod(&doc, &patch).unwrap(),
            json!({"metadata": {"labels": {"b": "2"}, "annotations": {}}})
        );
    }

    #[test]
    fn new_values_lose_their_null_members() {
        let doc = json!({"spec": {}});
        let patch = json!({"spec": {"nodeSelector": {"a": "1", "b": null}}});
        assert_eq!(
            pod(&doc, &patch).unwrap(),
            json!({"spec": {"nodeSelector": {"a": "1"}}})
        );
    }

    #[test]
    fn owner_references_merge_by_uid_for_any_kind() {
        let doc = json!({"metadata": {"ownerReferences": [{"uid": "1", "name": "a"}]}});
        let patch = json!({"metadata": {"ownerReferences": [{"uid": "1", "controller": true}]}});
        assert_eq!(
            strategic_merge_patch(&doc, &patch, "kubevirt.io/v1", "VirtualMachineInstance")
                .unwrap(),
            json!({"metadata": {"ownerReferences": [{"uid": "1", "name": "a", "controller": true}]}})
        );
    }

    #[test]
    fn unknown_kinds_replace_lists_and_merge_maps() {
        let doc = json!({"spec": {"running": false, "disks": [{"name": "a"}, {"name": "b"}]}});
        let patch = json!({"spec": {"running": true, "disks": [{"name": "c"}]}});
        assert_eq!(
            strategic_merge_patch(&doc, &patch, "kubevirt.io/v1", "VirtualMachine").unwrap(),
            json!({"spec": {"running": true, "disks": [{"name": "c"}]}})
        );
    }

    #[test]
    fn node_conditions_merge_by_type() {
        let doc = json!({"status": {"conditions": [
            {"type": "Ready", "status": "False"},
            {"type": "DiskPressure", "status": "False"}
        ]}});
        let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        assert_eq!(
            strategic_merge_patch(&doc, &patch, "v1", "Node").unwrap()["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}, {"type": "DiskPressure", "status": "False"}])
        );
    }

    #[test]
    fn malformed_strategic_patches_are_invalid() {
        let doc =
            json!({"spec": {"containers": [{"name": "a"}]}, "metadata": {"finalizers": ["f"]}});
        let bad = [
            json!([]),
            json!({"spec": {"containers": [{"image": "x"}]}}),
            json!({"spec": {"containers": [{"$patch": "delete"}]}}),
            json!({"spec": {"containers": [{"$patch": "merge", "name": "a"}]}}),
            json!({"spec": {"containers": [{"$patch": "bogus", "name": "a"}]}}),
            json!({"spec": {"$patch": "bogus"}}),
            json!({"spec": {"containers": ["a"]}}),
            json!({"spec": {"$retainKeys": "containers"}}),
            json!({"spec": {"$setElementOrder/containers": {}}}),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": "f"}}),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [{}]}}),
            json!({"metadata": {"finalizers": [["f"]]}}),
        ];
        for patch in bad {
            let err = pod(&doc, &patch).unwrap_err();
            assert!(matches!(err, PatchError::Invalid(_)), "{patch}: {err:?}");
        }
        assert!(pod(&json!([]), &json!({})).is_err());
    }

    #[test]
    fn the_original_object_is_not_modified() {
        let doc = json!({"spec": {"containers": [{"name": "a"}]}});
        let before = doc.clone();
        let _ = pod(
            &doc,
            &json!({"spec": {"containers": [{"name": "a", "image": "x"}]}}),
        );
        assert_eq!(doc, before);
    }
}
