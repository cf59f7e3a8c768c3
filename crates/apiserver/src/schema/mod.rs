//! Structural-schema enforcement for custom resources, as kube-apiserver does it.
//!
//! A CRD version's `openAPIV3Schema` is compiled once ([`Schema::compile`], which also refuses
//! non-structural schemas, so the CRD registry can reject a bad CRD). Then every write of a
//! custom resource goes through the same steps as in kube-apiserver:
//!
//! 1. [`Schema::prune`] drops fields the schema does not specify and reports their paths (for
//!    `fieldValidation=Strict|Warn`),
//! 2. [`Schema::apply_defaults`] fills in `default`s and drops `null`s of non-nullable fields,
//! 3. [`Schema::validate`] lists every violation as a [`Cause`] with its field path.
//!
//! Field paths use Kubernetes' `field.Path` notation without a leading dot:
//! `spec.replicas`, `spec.items[2].name`. All functions are pure and never panic on any input.
//!
//! Not implemented: `x-kubernetes-validations` (CEL rules are accepted and ignored), and
//! ObjectMeta validation of `metadata` (done by the server for every kind).

mod defaults;
mod node;
mod pattern;
mod prune;
mod validate;

#[cfg(test)]
mod fixtures;

use serde_json::Value;

use crate::cause::Cause;
use node::Node;

/// A compiled `openAPIV3Schema` of one CRD version.
#[derive(Clone, Debug)]
pub struct Schema {
    root: Node,
}

/// A schema that cannot be compiled (not structural, bad pattern …).
///
/// `path` is in kube-apiserver's CRD validation notation, rooted at the schema:
/// `openAPIV3Schema.properties[spec].properties[replicas].type`; the caller prepends
/// `spec.versions[i].schema.` when it reports the error on a CRD.
#[derive(Debug, thiserror::Error)]
#[error("invalid schema at {path}: {message}")]
pub struct SchemaError {
    pub path: String,
    pub message: String,
}

impl Schema {
    /// Compiles the `openAPIV3Schema` JSON.
    ///
    /// Refuses what kube-apiserver refuses in a v1 CRD: a root that is not `type: object`, a
    /// specified field or array item without `type` (unless `x-kubernetes-int-or-string` or
    /// `x-kubernetes-preserve-unknown-fields`), `$ref` and the other unsupported keywords,
    /// `type`/`default`/`nullable`/`additionalProperties`/`description` inside junctors,
    /// properties or items named inside a junctor but not outside it, `properties` together
    /// with an `additionalProperties` schema, arrays without `items`, invalid list types,
    /// restrictions on `metadata` other than `name`/`generateName`, a `pattern` that does not
    /// compile, and a `default` that is not valid for its own schema.
    pub fn compile(schema: &Value) -> Result<Schema, SchemaError> {
        Ok(Schema {
            root: node::compile_root(schema)?,
        })
    }

    /// Removes fields the schema does not know (not under `x-kubernetes-preserve-unknown-fields`);
    /// returns their paths (`spec.foo`, `spec.items[0].bar`), in document order, for
    /// `fieldValidation=Strict|Warn` (kube-apiserver words it `unknown field "spec.foo"`).
    /// `apiVersion`, `kind` and `metadata` at the root and at every
    /// `x-kubernetes-embedded-resource` are never pruned; `metadata` is left untouched.
    pub fn prune(&self, object: &mut Value) -> Vec<String> {
        prune::prune_value(object, &self.root, "", true)
    }

    /// Applies `default`s of the schema to absent fields, at any depth (inside array items and
    /// `additionalProperties` maps too; a default value is itself defaulted further down).
    ///
    /// `null` is handled as kube-apiserver does: a `null` for a non-nullable property that has
    /// a default is replaced by the default; a `null` for a non-nullable property without a
    /// default is removed. `null`s in arrays are kept (validation reports them).
    pub fn apply_defaults(&self, object: &mut Value) {
        defaults::default_value(object, &self.root);
        defaults::drop_non_nullable_nulls(object, &self.root);
    }

    /// Validates the (pruned, defaulted) object; every violation is one cause with its field
    /// path. Reasons and messages follow kube-apiserver, e.g. reason `FieldValueTypeInvalid`,
    /// message `Invalid value: "string": spec.replicas in body must be of type integer: "string"`.
    pub fn validate(&self, object: &Value) -> Vec<Cause> {
        validate::validate_value(object, &self.root, "")
    }
}

/// `parent.key` in `field.Path` notation (`key` alone at the root).
fn child_path(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// `parent[index]` in `field.Path` notation.
fn index_path(parent: &str, index: usize) -> String {
    format!("{parent}[{index}]")
}

/// A float as Go's `%v` prints it: the shortest exact digits, in exponent form when the
/// decimal exponent is below -4 or at least 6 (`10`, `1.5`, `1e+06`, `2.147483647e+09`,
/// `1e-05`).
pub(crate) fn go_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.to_owned();
    }
    if f == 0.0 {
        return "0".to_owned();
    }
    let scientific = format!("{f:e}");
    let Some((mantissa, exp)) = scientific.split_once('e') else {
        return format!("{f}");
    };
    let Ok(exponent) = exp.parse::<i32>() else {
        return format!("{f}");
    };
    if (-4..6).contains(&exponent) {
        return format!("{f}");
    }
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.unsigned_abs())
}

/// A JSON value as `field.Error` prints a bad value: strings quoted, numbers and booleans
/// plain, `null` as `null`, objects and arrays as their JSON text.
fn go_value(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (_, Some(u), _) => u.to_string(),
            (_, _, Some(f)) => go_float(f),
            _ => n.to_string(),
        },
        Value::String(s) => quote(s),
        Value::Array(_) | Value::Object(_) => value.to_string(),
    }
}

/// A string quoted as Go's `%q` does for ordinary text.
fn quote(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn go_values_print_like_field_errors() {
        assert_eq!(go_value(&json!("a\"b")), r#""a\"b""#);
        assert_eq!(go_value(&json!(11)), "11");
        assert_eq!(go_value(&json!(1.0)), "1");
        assert_eq!(go_value(&json!(10.5)), "10.5");
        assert_eq!(go_value(&json!(1e21)), "1e+21");
        assert_eq!(go_value(&json!(0.00001)), "1e-05");
        assert_eq!(go_value(&json!(0.0001)), "0.0001");
        assert_eq!(go_value(&json!(100000.0)), "100000");
        assert_eq!(go_value(&json!(1000000.0)), "1e+06");
        assert_eq!(go_value(&json!(2147483647.0)), "2.147483647e+09");
        assert_eq!(go_value(&json!(-123.25)), "-123.25");
        assert_eq!(go_value(&json!(null)), "null");
        assert_eq!(go_value(&json!({"a": 1})), r#"{"a":1}"#);
    }

    #[test]
    fn paths_use_field_path_notation() {
        assert_eq!(child_path("", "spec"), "spec");
        assert_eq!(index_path(&child_path("spec", "items"), 2), "spec.items[2]");
    }
}
