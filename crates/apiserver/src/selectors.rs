//! Label and field selectors (`app=web,tier!=db,env in (a,b),!legacy`, `metadata.name=x`).
//!
//! Parsing is pure and happens once per request; matching is run for every object a list or
//! watch considers.

use serde_json::Value;

use crate::status::ApiError;

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector (all requirements must hold).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    pub requirements: Vec<Requirement>,
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn bad(sel: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!(
        "unable to parse requirement: {why} in selector {sel:?}"
    ))
}

fn check_key(sel: &str, key: &str) -> Result<String, ApiError> {
    let key = key.trim();
    if key.is_empty() || key.contains(char::is_whitespace) {
        return Err(bad(sel, "invalid label key"));
    }
    if let Some(why) = crate::metadata::key_problem(key) {
        return Err(bad(sel, &format!("invalid label key {key:?}: {why}")));
    }
    Ok(key.to_owned())
}

fn check_value(sel: &str, value: &str) -> Result<String, ApiError> {
    let value = value.trim();
    if !crate::metadata::is_label_value(value) {
        return Err(bad(
            sel,
            &format!(
                "invalid label value {value:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character, and be at most 63 characters"
            ),
        ));
    }
    Ok(value.to_owned())
}

fn parse_set(sel: &str, rest: &str) -> Result<Vec<String>, ApiError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| bad(sel, "expected a parenthesised set"))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| check_value(sel, v))
        .collect()
}

impl LabelSelector {
    /// Parses the `labelSelector` query parameter.
    pub fn parse(sel: &str) -> Result<LabelSelector, ApiError> {
        let mut requirements = Vec::new();
        for part in split_top_level(sel) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let req = if let Some(k) = part.strip_prefix('!') {
                Requirement::NotExists(check_key(sel, k)?)
            } else if let Some((k, v)) = part.split_once("!=") {
                Requirement::NotEquals(check_key(sel, k)?, check_value(sel, v)?)
            } else if let Some((k, v)) = part.split_once("==") {
                Requirement::Equals(check_key(sel, k)?, check_value(sel, v)?)
            } else if let Some((k, v)) = part.split_once('=') {
                Requirement::Equals(check_key(sel, k)?, check_value(sel, v)?)
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                Requirement::NotIn(check_key(sel, k)?, parse_set(sel, rest)?)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                Requirement::In(check_key(sel, k)?, parse_set(sel, rest)?)
            } else {
                Requirement::Exists(check_key(sel, part)?)
            };
            requirements.push(req);
        }
        Ok(LabelSelector { requirements })
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.requirements.iter().all(|r| match r {
            Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|l| !vs.iter().any(|v| v == l)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed field selector: `field=value` / `field==value` / `field!=value` terms.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector {
    /// `(field path, value, negated)`.
    pub terms: Vec<(String, String, bool)>,
}

impl FieldSelector {
    /// Parses the `fieldSelector` query parameter.
    pub fn parse(sel: &str) -> Result<FieldSelector, ApiError> {
        let mut terms = Vec::new();
        for part in sel.split(',') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (field, value, neg) = if let Some((f, v)) = part.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, v, false)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, v, false)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{sel}'; can't understand '{part}'"
                )));
            };
            terms.push((field.trim().to_owned(), value.trim().to_owned(), neg));
        }
        Ok(FieldSelector { terms })
    }

    /// The exact object name this selector pins (`metadata.name=x`), if any.
    pub fn pinned_name(&self) -> Option<&str> {
        self.terms
            .iter()
            .find(|(f, _, neg)| f == "metadata.name" && !neg)
            .map(|(_, v, _)| v.as_str())
    }

    /// Whether the object's fields satisfy every term. Fields are dotted JSON paths; a
    /// missing field compares as the empty string.
    pub fn matches(&self, object: &Value) -> bool {
        self.terms.iter().all(|(field, value, neg)| {
            let actual = field_value(object, field);
            (actual == *value) != *neg
        })
    }
}

/// The string value of a dotted field path (`spec.nodeName`, `involvedObject.name`).
pub fn field_value(object: &Value, field: &str) -> String {
    let mut cur = object;
    for seg in field.split('.') {
        match cur.get(seg) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Both selectors of a list or watch request.
#[derive(Clone, Debug, Default)]
pub struct Selectors {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selectors {
    /// Parses both optional query parameters.
    pub fn parse(labels: Option<&str>, fields: Option<&str>) -> Result<Selectors, ApiError> {
        Ok(Selectors {
            labels: labels
                .map(LabelSelector::parse)
                .transpose()?
                .unwrap_or_default(),
            fields: fields
                .map(FieldSelector::parse)
                .transpose()?
                .unwrap_or_default(),
        })
    }

    /// Whether the object passes both.
    pub fn matches(&self, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(object)
    }

    /// No requirement at all.
    pub fn is_empty(&self) -> bool {
        self.labels.requirements.is_empty() && self.fields.terms.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: &Value) -> Value {
        json!({"metadata": {"name": "n", "namespace": "ns", "labels": labels}, "spec": {"nodeName": "node1"}, "status": {"phase": "Running"}})
    }

    #[test]
    fn equality_and_set_requirements_match_labels() {
        let o = obj(&json!({"app": "web", "tier": "front"}));
        for (sel, want) in [
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app in (web,db)", true),
            ("app notin (web)", false),
            ("tier", true),
            ("!tier", false),
            ("!missing", true),
            ("missing notin (x)", true),
            ("app=web,tier=back", false),
            ("app in (db, web),tier", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&o),
                want,
                "{sel}"
            );
        }
    }

    #[test]
    fn malformed_label_selector_is_a_bad_request() {
        assert_eq!(LabelSelector::parse("a in x").unwrap_err().code, 400);
        assert_eq!(LabelSelector::parse("a b").unwrap_err().code, 400);
    }

    #[test]
    fn label_selector_keys_and_values_must_be_valid_labels() {
        for bad in ["-a=b", "a/b/c", "a=-b", "a in (x,y z)", "!_x", "a!=b!"] {
            assert_eq!(LabelSelector::parse(bad).unwrap_err().code, 400, "{bad}");
        }
        for good in [
            "kubevirt.io/domain=vm-1",
            "a=",
            "a in (x, y)",
            "!b",
            "c",
            "a==1,b!=2",
        ] {
            assert!(LabelSelector::parse(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn field_selectors_read_dotted_paths() {
        let o = obj(&json!({}));
        for (sel, want) in [
            ("metadata.name=n", true),
            ("metadata.name!=n", false),
            ("metadata.namespace=ns,spec.nodeName=node1", true),
            ("status.phase=Pending", false),
            ("spec.nodeName=", false),
            ("spec.missing=", true),
        ] {
            assert_eq!(
                FieldSelector::parse(sel).unwrap().matches(&o),
                want,
                "{sel}"
            );
        }
        assert_eq!(
            FieldSelector::parse("metadata.name=vm1")
                .unwrap()
                .pinned_name(),
            Some("vm1")
        );
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}
