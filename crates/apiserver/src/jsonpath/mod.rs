//! The JSONPath dialect of `additionalPrinterColumns` (`.status.conditions[?(@.type=='Ready')].status`).
//! (Skeleton: the signatures are the contract.)

use serde_json::Value;

/// A parsed printer-column JSONPath.
#[derive(Clone, Debug)]
pub struct JsonPath {}

/// A JSONPath that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("invalid JSONPath {expr:?}: {message}")]
pub struct JsonPathError {
    pub expr: String,
    pub message: String,
}

impl JsonPath {
    /// Parses `expr` (with or without `{}` braces).
    pub fn parse(expr: &str) -> Result<JsonPath, JsonPathError> {
        let _ = expr;
        Ok(JsonPath {})
    }

    /// All values the path selects in `object`.
    pub fn select<'a>(&self, _object: &'a Value) -> Vec<&'a Value> {
        Vec::new()
    }
}

/// Formats a column cell as kube-apiserver's Table printer does for a column `type`
/// (`string`, `integer`, `number`, `boolean`, `date`): the first selected value; `date`
/// becomes the relative age (`5m`, `3h2m`, `10d`) against `now`; nothing selected → `Value::Null`.
pub fn format_cell(_column_type: &str, _selected: &[&Value], _now: jiff::Timestamp) -> Value {
    Value::Null
}
