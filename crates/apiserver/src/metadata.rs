//! Object metadata validation: names, labels and annotations, as kube-apiserver checks them.
//!
//! Every function returns [`Cause`]s with a field path, so callers can answer one 422 that
//! lists every problem.

use serde_json::Value;

use crate::cause::Cause;

/// How names of a kind are validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameRule {
    /// RFC 1123 subdomain: lower-case alphanumerics, `-` and `.`, ≤ 253 (most kinds).
    Subdomain,
    /// RFC 1123 label: lower-case alphanumerics and `-`, ≤ 63 (namespaces, services).
    Label,
    /// Any name without `/` or `%` and not `.`/`..` (RBAC, events …).
    Path,
}

const ANNOTATIONS_MAX: usize = 256 * 1024;

fn is_label_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'
}

/// The longest RFC 1123 label.
pub const DNS_LABEL_MAX: usize = 63;

/// The longest RFC 1123 subdomain.
pub const DNS_SUBDOMAIN_MAX: usize = 253;

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, whatever the length.
fn matches_label_pattern(s: &str) -> bool {
    !s.is_empty() && s.chars().all(is_label_char) && !s.starts_with('-') && !s.ends_with('-')
}

/// Labels joined by `.`, whatever the length.
fn matches_subdomain_pattern(s: &str) -> bool {
    s.split('.').all(matches_label_pattern)
}

/// RFC 1123 DNS label.
pub fn is_dns_label(s: &str) -> bool {
    s.len() <= DNS_LABEL_MAX && matches_label_pattern(s)
}

/// RFC 1123 DNS subdomain.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= DNS_SUBDOMAIN_MAX && matches_subdomain_pattern(s)
}

/// kube's message for a string that is not an RFC 1123 label.
pub const DNS_LABEL_MESSAGE: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

/// kube's message for a string that is not an RFC 1123 subdomain.
pub const DNS_SUBDOMAIN_MESSAGE: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// What is wrong with `s` as an RFC 1123 label or subdomain: kube's messages, the length
/// first (both may apply).
fn dns_problems(s: &str, max: usize, pattern_ok: bool, pattern_message: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if s.len() > max {
        problems.push(format!("must be no more than {max} characters"));
    }
    if !pattern_ok {
        problems.push(pattern_message.to_owned());
    }
    problems
}

/// One `FieldValueInvalid` cause per problem of `value` as an RFC 1123 label at `field`
/// (kube's `ValidateDNS1123Label`).
pub fn validate_dns_label(value: &str, field: &str) -> Vec<Cause> {
    dns_problems(
        value,
        DNS_LABEL_MAX,
        matches_label_pattern(value),
        DNS_LABEL_MESSAGE,
    )
    .into_iter()
    .map(|why| {
        Cause::new(
            "FieldValueInvalid",
            field,
            format!("Invalid value: {value:?}: {why}"),
        )
    })
    .collect()
}

/// Validates a name under `rule`; `field` is usually `metadata.name`. One cause per
/// problem, as kube (a too long name that also breaks the pattern gets two).
pub fn validate_name(rule: NameRule, name: &str, field: &str) -> Vec<Cause> {
    let problems = match rule {
        NameRule::Subdomain => dns_problems(
            name,
            DNS_SUBDOMAIN_MAX,
            matches_subdomain_pattern(name),
            DNS_SUBDOMAIN_MESSAGE,
        ),
        NameRule::Label => return validate_dns_label(name, field),
        NameRule::Path => {
            let ok = !name.is_empty()
                && name != "."
                && name != ".."
                && !name.contains('/')
                && !name.contains('%');
            if ok {
                Vec::new()
            } else {
                vec!["may not be '.' or '..' and may not contain '/' or '%'".to_owned()]
            }
        }
    };
    problems
        .into_iter()
        .map(|why| {
            Cause::new(
                "FieldValueInvalid",
                field,
                format!("Invalid value: {name:?}: {why}"),
            )
        })
        .collect()
}

fn is_qualified_name_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && s.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
}

/// What is wrong with a label or annotation key (`[prefix/]name`), if anything.
pub fn key_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && !is_dns_subdomain(p)
    {
        return Some("prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character".into());
    }
    if !is_qualified_name_part(name) {
        return Some("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') and be at most 63 characters".into());
    }
    None
}

/// Whether `s` is a valid label value (empty, or a qualified name part).
pub fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_qualified_name_part(s)
}

/// Validates `labels` (a JSON object of strings) at `field` (`metadata.labels`).
pub fn validate_labels(labels: &Value, field: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    let Some(map) = labels.as_object() else {
        if !labels.is_null() {
            causes.push(Cause::new(
                "FieldValueInvalid",
                field,
                "must be a map of strings",
            ));
        }
        return causes;
    };
    for (k, v) in map {
        if let Some(why) = key_problem(k) {
            causes.push(Cause::new(
                "FieldValueInvalid",
                field,
                format!("Invalid value: {k:?}: {why}"),
            ));
        }
        match v.as_str() {
            Some(s) if is_label_value(s) => {}
            Some(s) => causes.push(Cause::new(
                "FieldValueInvalid",
                field,
                format!("Invalid value: {s:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?') and be at most 63 characters"),
            )),
            None => causes.push(Cause::new(
                "FieldValueInvalid",
                format!("{field}.{k}"),
                "must be a string",
            )),
        }
    }
    causes
}

/// Validates `annotations` (keys and total size ≤ 256 KiB).
pub fn validate_annotations(annotations: &Value, field: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    let Some(map) = annotations.as_object() else {
        if !annotations.is_null() {
            causes.push(Cause::new(
                "FieldValueInvalid",
                field,
                "must be a map of strings",
            ));
        }
        return causes;
    };
    let mut total = 0;
    for (k, v) in map {
        total += k.len() + v.as_str().map_or(0, str::len);
        if let Some(why) = key_problem(&k.to_ascii_lowercase()) {
            causes.push(Cause::new(
                "FieldValueInvalid",
                field,
                format!("Invalid value: {k:?}: {why}"),
            ));
        }
        if !v.is_string() {
            causes.push(Cause::new(
                "FieldValueInvalid",
                format!("{field}.{k}"),
                "must be a string",
            ));
        }
    }
    if total > ANNOTATIONS_MAX {
        causes.push(Cause::new(
            "FieldValueTooLong",
            field,
            format!("Too long: must have at most {ANNOTATIONS_MAX} bytes"),
        ));
    }
    causes
}

/// Validates the `metadata` of an object about to be stored.
pub fn validate_object_meta(object: &Value, rule: NameRule) -> Vec<Cause> {
    let meta = &object["metadata"];
    let mut causes = Vec::new();
    match meta["name"].as_str() {
        Some(name) if !name.is_empty() => {
            causes.extend(validate_name(rule, name, "metadata.name"));
        }
        _ => causes.push(Cause::new(
            "FieldValueRequired",
            "metadata.name",
            "Required value: name or generateName is required",
        )),
    }
    causes.extend(validate_labels(&meta["labels"], "metadata.labels"));
    causes.extend(validate_annotations(
        &meta["annotations"],
        "metadata.annotations",
    ));
    if let Some(f) = meta.get("finalizers")
        && !f.is_null()
        && !f.as_array().is_some_and(|a| a.iter().all(Value::is_string))
    {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "metadata.finalizers",
            "must be a list of strings",
        ));
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn subdomain_and_label_names_follow_rfc_1123() {
        assert!(is_dns_subdomain("a.b-c.d"));
        assert!(!is_dns_subdomain("A"));
        assert!(!is_dns_subdomain("-a"));
        assert!(!is_dns_subdomain("a..b"));
        assert!(is_dns_label("my-ns"));
        assert!(!is_dns_label("my.ns"));
        assert!(!is_dns_label(&"a".repeat(64)));
    }

    #[test]
    fn too_long_names_say_so_and_also_name_the_pattern_when_it_fails() {
        let long = "a".repeat(254);
        let c = validate_name(NameRule::Subdomain, &long, "metadata.name");
        assert_eq!(c.len(), 1);
        assert!(
            c[0].message
                .ends_with(": must be no more than 253 characters"),
            "{}",
            c[0].message
        );
        let c = validate_dns_label(&format!("{}-", "a".repeat(63)), "spec.containers[0].name");
        assert_eq!(c.len(), 2);
        assert!(c[0].message.ends_with("must be no more than 63 characters"));
        assert!(c[1].message.ends_with(DNS_LABEL_MESSAGE));
        assert!(validate_dns_label("my-name", "f").is_empty());
    }

    #[test]
    fn bad_name_gives_a_cause_on_metadata_name() {
        let c = validate_name(NameRule::Subdomain, "Bad_Name", "metadata.name");
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].field, "metadata.name");
        assert!(c[0].message.starts_with("Invalid value: \"Bad_Name\""));
    }

    #[test]
    fn label_keys_and_values_are_checked() {
        let ok = json!({"app": "web", "kubevirt.io/domain": "vm-1", "empty": ""});
        assert!(validate_labels(&ok, "metadata.labels").is_empty());
        let bad = json!({"-bad": "x", "good": "has space", "a/b/c": "x"});
        assert_eq!(validate_labels(&bad, "metadata.labels").len(), 3);
        let long = json!({"k": "a".repeat(64)});
        assert_eq!(validate_labels(&long, "metadata.labels").len(), 1);
    }

    #[test]
    fn annotations_larger_than_256_kib_are_refused() {
        let big = json!({"k": "x".repeat(256 * 1024)});
        let c = validate_annotations(&big, "metadata.annotations");
        assert_eq!(c[0].reason, "FieldValueTooLong");
    }

    #[test]
    fn missing_name_is_required() {
        let c = validate_object_meta(&json!({"metadata": {}}), NameRule::Subdomain);
        assert_eq!(c[0].reason, "FieldValueRequired");
    }
}
