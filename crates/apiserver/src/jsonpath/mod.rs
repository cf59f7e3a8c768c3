//! The JSONPath dialect of `additionalPrinterColumns` (`.status.conditions[?(@.type=='Ready')].status`).
//!
//! Data flow: the CRD registry parses each column's `jsonPath` once ([`JsonPath::parse`],
//! whose error refuses a bad CRD); the Table output selects values from each object
//! ([`JsonPath::select`]) and turns the first into a cell ([`format_cell`]). The dialect is
//! kubectl's JSONPath: `.a.b`, `['key.with.dots']`, `.a[0]`, `.a[-1]`, `.a[1:3]`, `.a[*].b`,
//! `.*`, `..name`, filters `[?(@.type=='Ready')]` with `==`, `!=`, `<`, `<=`, `>`, `>=` or bare
//! existence (`[?(@.ip)]`), with or without the surrounding `{}`. Missing keys select nothing
//! (kube-apiserver evaluates printer columns with missing keys allowed).
//!
//! Differences from kubectl, all on inputs kubectl rejects: comparing values of different
//! types (`'1' == 1`) is simply false instead of an error, numbers compare by value (`1 ==
//! 1.0`), and a filter operand that selects several values uses the first.

mod cell;
mod parse;

pub use cell::{format_cell, human_duration, human_duration_signed};

use serde_json::Value;

/// A parsed printer-column JSONPath.
#[derive(Clone, Debug)]
pub struct JsonPath {
    segments: Vec<Segment>,
}

/// A JSONPath that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("invalid JSONPath {expr:?}: {message}")]
pub struct JsonPathError {
    pub expr: String,
    pub message: String,
}

/// One step of a path.
#[derive(Clone, Debug, PartialEq)]
enum Segment {
    /// `.name` or `['name']`: the member of an object.
    Field(String),
    /// `.*`: every member of an object or element of an array.
    Wildcard,
    /// `[*]`: every element of an array.
    All,
    /// `[i]`, negative from the end.
    Index(i64),
    /// `[start:end:step]`, Python-like bounds.
    Slice {
        start: Option<i64>,
        end: Option<i64>,
        step: i64,
    },
    /// `[?(...)]`: the elements of an array for which the filter holds.
    Filter(Box<Filter>),
    /// `..`: the value and all its descendants, in document order.
    Recursive,
}

/// A filter expression: `left` alone tests existence.
#[derive(Clone, Debug, PartialEq)]
struct Filter {
    left: Operand,
    cmp: Option<(Op, Operand)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Clone, Debug, PartialEq)]
enum Operand {
    /// `@...` (relative to the element) or `$...` (relative to the document).
    Path {
        root: bool,
        segments: Vec<Segment>,
    },
    Literal(Value),
}

impl JsonPath {
    /// Parses `expr` (with or without `{}` braces).
    pub fn parse(expr: &str) -> Result<JsonPath, JsonPathError> {
        Ok(JsonPath {
            segments: parse::parse(expr)?,
        })
    }

    /// All values the path selects in `object`, in document order.
    pub fn select<'a>(&self, object: &'a Value) -> Vec<&'a Value> {
        eval(&self.segments, vec![object], object)
    }
}

fn eval<'a>(segments: &[Segment], input: Vec<&'a Value>, root: &'a Value) -> Vec<&'a Value> {
    let mut current = input;
    for segment in segments {
        let mut next = Vec::new();
        for value in current {
            step(segment, value, root, &mut next);
        }
        current = next;
    }
    current
}

/// Resolves a possibly negative index against `len`.
fn resolve(index: i64, len: usize) -> Option<usize> {
    let len = i64::try_from(len).ok()?;
    let index = if index < 0 { len + index } else { index };
    usize::try_from(index)
        .ok()
        .filter(|i| i64::try_from(*i).is_ok_and(|i| i < len))
}

fn step<'a>(segment: &Segment, value: &'a Value, root: &'a Value, out: &mut Vec<&'a Value>) {
    match (segment, value) {
        (Segment::Field(name), Value::Object(map)) => out.extend(map.get(name)),
        (Segment::Wildcard, Value::Object(map)) => out.extend(map.values()),
        (Segment::Wildcard | Segment::All, Value::Array(items)) => out.extend(items),
        (Segment::Index(i), Value::Array(items)) => {
            out.extend(resolve(*i, items.len()).and_then(|i| items.get(i)));
        }
        (Segment::Slice { start, end, step }, Value::Array(items)) => {
            let len = i64::try_from(items.len()).unwrap_or(i64::MAX);
            let clamp = |bound: i64| {
                let bound = if bound < 0 { len + bound } else { bound };
                bound.clamp(0, len)
            };
            let from = start.map_or(0, clamp);
            let to = end.map_or(len, clamp);
            let step = usize::try_from(*step).unwrap_or(1).max(1);
            if let (Ok(from), Ok(to)) = (usize::try_from(from), usize::try_from(to))
                && from < to
            {
                out.extend(items[from..to].iter().step_by(step));
            }
        }
        (Segment::Filter(filter), Value::Array(items)) => {
            out.extend(items.iter().filter(|item| holds(filter, item, root)));
        }
        (Segment::Recursive, _) => descend(value, out),
        _ => {}
    }
}

/// `value` and all its descendants, pre-order.
fn descend<'a>(value: &'a Value, out: &mut Vec<&'a Value>) {
    out.push(value);
    match value {
        Value::Object(map) => map.values().for_each(|v| descend(v, out)),
        Value::Array(items) => items.iter().for_each(|v| descend(v, out)),
        _ => {}
    }
}

fn operand_value<'a>(operand: &'a Operand, item: &'a Value, root: &'a Value) -> Option<&'a Value> {
    match operand {
        Operand::Literal(value) => Some(value),
        Operand::Path {
            root: from_root,
            segments,
        } => {
            let start = if *from_root { root } else { item };
            eval(segments, vec![start], root).into_iter().next()
        }
    }
}

fn holds(filter: &Filter, item: &Value, root: &Value) -> bool {
    let Some(left) = operand_value(&filter.left, item, root) else {
        return false;
    };
    let Some((op, right)) = &filter.cmp else {
        return true;
    };
    let Some(right) = operand_value(right, item, root) else {
        return false;
    };
    let ordering = match (left, right) {
        (Value::Number(a), Value::Number(b)) => match (a.as_i64(), b.as_i64()) {
            (Some(a), Some(b)) => Some(a.cmp(&b)),
            _ => a
                .as_f64()
                .zip(b.as_f64())
                .and_then(|(a, b)| a.partial_cmp(&b)),
        },
        (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
        (Value::Bool(a), Value::Bool(b)) if matches!(op, Op::Eq | Op::Ne) => Some(a.cmp(b)),
        (Value::Null, Value::Null) if matches!(op, Op::Eq | Op::Ne) => {
            Some(std::cmp::Ordering::Equal)
        }
        _ => None,
    };
    let Some(ordering) = ordering else {
        return false;
    };
    match op {
        Op::Eq => ordering.is_eq(),
        Op::Ne => ordering.is_ne(),
        Op::Lt => ordering.is_lt(),
        Op::Le => ordering.is_le(),
        Op::Gt => ordering.is_gt(),
        Op::Ge => ordering.is_ge(),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;

    /// A VirtualMachineInstance-like object.
    fn vmi() -> Value {
        json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": {
                "name": "testvm",
                "labels": {"kubevirt.io/domain": "testvm", "app.kubernetes.io/name": "demo"},
                "creationTimestamp": "2024-05-01T10:00:00Z",
            },
            "spec": {"domain": {"cpu": {"cores": 2}, "devices": {"interfaces": [
                {"name": "default", "masquerade": {}},
                {"name": "secondary", "bridge": {}},
            ]}}},
            "status": {
                "phase": "Running",
                "nodeName": "node01",
                "ready": true,
                "conditions": [
                    {"type": "Ready", "status": "True", "lastProbeTime": null},
                    {"type": "LiveMigratable", "status": "False", "reason": "NotMigratable"},
                    {"type": "AgentConnected", "status": "True"},
                ],
                "interfaces": [
                    {"name": "default", "ipAddress": "10.0.2.2", "ipAddresses": ["10.0.2.2", "fd10::2"]},
                    {"name": "secondary", "ipAddress": "192.168.1.5", "ipAddresses": ["192.168.1.5"], "queueCount": 4},
                ],
            },
        })
    }

    fn selected(expr: &str) -> Vec<Value> {
        match JsonPath::parse(expr) {
            Ok(path) => path.select(&vmi()).into_iter().cloned().collect(),
            Err(e) => panic!("{expr} must parse: {e}"),
        }
    }

    #[test]
    fn paths_select_the_values_kubectl_selects() {
        let table: Vec<(&str, Vec<Value>)> = vec![
            (".status.phase", vec![json!("Running")]),
            ("{.status.phase}", vec![json!("Running")]),
            ("$.status.phase", vec![json!("Running")]),
            ("{ .status.nodeName }", vec![json!("node01")]),
            (".status.ready", vec![json!(true)]),
            (".spec.domain.cpu.cores", vec![json!(2)]),
            (".status.interfaces[0].ipAddress", vec![json!("10.0.2.2")]),
            (".status.interfaces[-1].name", vec![json!("secondary")]),
            (
                ".status.interfaces[*].ipAddress",
                vec![json!("10.0.2.2"), json!("192.168.1.5")],
            ),
            (
                ".status.interfaces[*].ipAddresses[1]",
                vec![json!("fd10::2")],
            ),
            (".status.interfaces[0:1].name", vec![json!("default")]),
            (
                ".status.conditions[::2].type",
                vec![json!("Ready"), json!("AgentConnected")],
            ),
            (
                ".status.conditions[?(@.type=='Ready')].status",
                vec![json!("True")],
            ),
            (
                ".status.conditions[?(@.type == \"LiveMigratable\")].reason",
                vec![json!("NotMigratable")],
            ),
            (
                ".status.conditions[?(@.status!='True')].type",
                vec![json!("LiveMigratable")],
            ),
            (
                ".status.conditions[?(@.reason)].type",
                vec![json!("LiveMigratable")],
            ),
            (
                ".status.interfaces[?(@.queueCount>=4)].name",
                vec![json!("secondary")],
            ),
            (
                ".status.interfaces[?(@.queueCount==4.0)].name",
                vec![json!("secondary")],
            ),
            (
                ".status.interfaces[?(@.name==$.status.interfaces[1].name)].ipAddress",
                vec![json!("192.168.1.5")],
            ),
            (
                ".metadata.labels['kubevirt.io/domain']",
                vec![json!("testvm")],
            ),
            (
                ".metadata.labels.app\\.kubernetes\\.io/name",
                vec![json!("demo")],
            ),
            ("['metadata'][\"name\"]", vec![json!("testvm")]),
            (".metadata.labels.*", vec![json!("testvm"), json!("demo")]),
            ("..ipAddress", vec![json!("10.0.2.2"), json!("192.168.1.5")]),
            (".spec..name", vec![json!("default"), json!("secondary")]),
            (".status.conditions[0].lastProbeTime", vec![Value::Null]),
            (".status.missing", vec![]),
            (".status.interfaces[5].name", vec![]),
            (".status.phase.deeper", vec![]),
            (".status.conditions[?(@.type=='Paused')].status", vec![]),
            (".status.conditions[?(@.type==1)].status", vec![]),
            (".metadata[*]", vec![]),
        ];
        for (expr, expected) in table {
            assert_eq!(selected(expr), expected, "{expr}");
        }
    }

    #[test]
    fn the_whole_object_is_selected_by_a_lone_dot() {
        assert_eq!(selected("."), vec![vmi()]);
    }

    #[test]
    fn malformed_paths_are_errors() {
        for expr in [
            "",
            "{}",
            "{.a",
            "status.phase",
            ".a[",
            ".a[x]",
            ".a['b'",
            ".a[?(@.b=='c']",
            ".a[?(@.b='c')]",
            ".a[?(@.b==c)]",
            ".a[1,2]",
            ".a[::0]",
            "{.a}{.b}",
            ".a..",
            ".a\\",
        ] {
            assert!(JsonPath::parse(expr).is_err(), "{expr:?} must not parse");
        }
    }

    #[test]
    fn errors_name_the_expression() {
        let Err(e) = JsonPath::parse(".a[x]") else {
            panic!(".a[x] must not parse");
        };
        assert_eq!(
            e.to_string(),
            "invalid JSONPath \".a[x]\": invalid array index \"x\""
        );
    }

    proptest! {
        #[test]
        fn parsing_and_selecting_never_panic(expr in "[.\\[\\]*?@()'=!<>$a-c0-9:, -]{0,24}") {
            if let Ok(path) = JsonPath::parse(&expr) {
                let _ = path.select(&vmi());
            }
        }
    }
}
