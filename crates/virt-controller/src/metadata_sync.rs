//! One-way synchronisation of selected label/annotation keys from a source map to a target
//! map: VM template → VMI (VM controller) and VMI → launcher pod (VMI controller).
//!
//! Patterns come from `--additional-launcher-labels-sync` / `--additional-launcher-annotations-sync`
//! (comma-separated): an exact key, or a prefix ending in `*` (`ops.example.com/*`). An empty
//! pattern and a bare `*` are ignored (a bare `*` would hand the target's every key to the
//! source; upstream refuses it too). For every matching key the target ends up equal to the
//! source: added, updated, or deleted when absent from the source. Keys that match no pattern
//! are never touched.
//!
//! The result is applied as a JSON Patch with a `test` of the target's original map, so a
//! concurrent writer makes the patch fail instead of being overwritten.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// The label and annotation keys synced from the VM template to the VMI and on to the
/// launcher pod (one value serves both controllers).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetadataSyncPatterns {
    /// `--additional-launcher-labels-sync`.
    pub labels: SyncPatterns,
    /// `--additional-launcher-annotations-sync`.
    pub annotations: SyncPatterns,
}

/// A parsed list of sync patterns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncPatterns {
    exact: Vec<String>,
    prefixes: Vec<String>,
}

impl SyncPatterns {
    /// Parses patterns; returns them and a warning for every ignored pattern.
    pub fn parse<S: AsRef<str>>(patterns: &[S]) -> (SyncPatterns, Vec<String>) {
        let mut out = SyncPatterns::default();
        let mut warnings = Vec::new();
        for raw in patterns {
            let p = raw.as_ref().trim();
            if p.is_empty() {
                continue;
            }
            match p.strip_suffix('*') {
                Some("") => warnings.push(format!(
                    "ignoring sync pattern {p:?}: a bare \"*\" would sync every key; use a prefix such as \"example.com/*\""
                )),
                Some(prefix) => out.prefixes.push(prefix.to_owned()),
                None => out.exact.push(p.to_owned()),
            }
        }
        (out, warnings)
    }

    /// Parses a comma-separated flag value.
    pub fn parse_flag(value: &str) -> (SyncPatterns, Vec<String>) {
        let parts: Vec<&str> = value.split(',').collect();
        SyncPatterns::parse(&parts)
    }

    /// These patterns followed by `other`'s.
    pub fn chain(mut self, other: &SyncPatterns) -> SyncPatterns {
        self.exact.extend(other.exact.iter().cloned());
        self.prefixes.extend(other.prefixes.iter().cloned());
        self
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.prefixes.is_empty()
    }

    /// Whether `key` is governed by these patterns.
    pub fn matches(&self, key: &str) -> bool {
        self.exact.iter().any(|e| e == key)
            || self.prefixes.iter().any(|p| key.starts_with(p.as_str()))
    }
}

/// The target map after syncing the matching keys from `source`, or `None` when nothing changes.
pub fn sync_map(
    source: &BTreeMap<String, String>,
    target: &BTreeMap<String, String>,
    patterns: &SyncPatterns,
) -> Option<BTreeMap<String, String>> {
    let mut next = target.clone();
    let mut changed = false;
    for key in source.keys().chain(target.keys()) {
        if !patterns.matches(key) {
            continue;
        }
        match (source.get(key), target.get(key)) {
            (Some(s), Some(t)) if s == t => {}
            (Some(s), _) => {
                next.insert(key.clone(), s.clone());
                changed = true;
            }
            (None, Some(_)) => {
                next.remove(key);
                changed = true;
            }
            (None, None) => {}
        }
    }
    changed.then_some(next)
}

/// JSON Patch operations replacing the map at `path` (`/metadata/labels`): `add` when the
/// target had no map, else `test` of the original + `replace`.
pub fn patch_ops(
    path: &str,
    original: Option<&BTreeMap<String, String>>,
    next: &BTreeMap<String, String>,
) -> Vec<Value> {
    match original {
        None => vec![json!({"op": "add", "path": path, "value": next})],
        Some(old) => vec![
            json!({"op": "test", "path": path, "value": old}),
            json!({"op": "replace", "path": path, "value": next}),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_bare_star_and_empty_patterns_are_ignored_with_a_warning() {
        let (p, warnings) = SyncPatterns::parse_flag("*,,ops.example.com/*,team");
        assert_eq!(warnings.len(), 1);
        assert!(p.matches("ops.example.com/owner"));
        assert!(p.matches("team"));
        assert!(!p.matches("other"));
        assert!(!p.matches("teams"));
    }

    #[test]
    fn matching_keys_are_added_updated_and_deleted_others_untouched() {
        let (p, _) = SyncPatterns::parse(&["ops.example.com/*", "tier"]);
        let source = map(&[
            ("ops.example.com/a", "1"),
            ("ops.example.com/b", "new"),
            ("tier", "web"),
            ("unrelated", "x"),
        ]);
        let target = map(&[
            ("ops.example.com/b", "old"),
            ("ops.example.com/gone", "z"),
            ("kept", "k"),
        ]);
        let next = sync_map(&source, &target, &p).expect("changed");
        assert_eq!(
            next,
            map(&[
                ("kept", "k"),
                ("ops.example.com/a", "1"),
                ("ops.example.com/b", "new"),
                ("tier", "web")
            ])
        );
    }

    #[test]
    fn nothing_changes_when_the_matching_keys_agree() {
        let (p, _) = SyncPatterns::parse(&["ops.example.com/*"]);
        let source = map(&[("ops.example.com/a", "1"), ("x", "1")]);
        let target = map(&[("ops.example.com/a", "1"), ("x", "2")]);
        assert_eq!(sync_map(&source, &target, &p), None);
    }

    #[test]
    fn an_empty_pattern_list_never_changes_anything() {
        let p = SyncPatterns::default();
        assert_eq!(sync_map(&map(&[("a", "1")]), &map(&[]), &p), None);
    }

    #[test]
    fn patches_test_the_original_map_or_add_a_missing_one() {
        let next = map(&[("a", "1")]);
        let ops = patch_ops("/metadata/labels", None, &next);
        assert_eq!(
            ops,
            vec![json!({"op": "add", "path": "/metadata/labels", "value": {"a": "1"}})]
        );
        let old = map(&[("a", "0")]);
        let ops = patch_ops("/metadata/labels", Some(&old), &next);
        assert_eq!(
            ops[0],
            json!({"op": "test", "path": "/metadata/labels", "value": {"a": "0"}})
        );
        assert_eq!(ops[1]["op"], "replace");
    }
}
