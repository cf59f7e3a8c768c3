//! Dynamic decoding: protobuf message bytes + a [`Schema`] message → JSON, the way Go's
//! `encoding/json` would write the Kubernetes object.
//!
//! Go decides which fields appear from the struct tags, and `schema.txt` carries them:
//! scalars with `omitempty` are written only when not zero; pointers whenever present; fields
//! without `omitempty` always, zero included; non-pointer structs always (an absent one is
//! decoded from zero bytes, so its own defaults appear); `omitzero` fields are left out when
//! zero. Repeated non-message fields may be packed. Unknown fields are skipped.

use base64::Engine as _;
use serde_json::{Map, Value as Json};

use super::schema::{Cardinality, Field, Scalar, Schema, Type, WellKnown};
use super::wire::{Reader, Value, WireError};

/// Deeper nesting than this is refused, so that hostile input cannot exhaust the stack.
const MAX_DEPTH: usize = 64;

/// Why the bytes of a message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The bytes are not valid protobuf.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// A known field arrived with the wrong wire type.
    #[error("field {message}.{field}: unexpected wire type {wire_type}")]
    WireTypeMismatch {
        message: &'static str,
        field: &'static str,
        wire_type: u8,
    },
    /// A string field is not UTF-8.
    #[error("field {0}: string is not valid UTF-8")]
    Utf8(&'static str),
    /// A timestamp is outside the range RFC 3339 can express.
    #[error("timestamp {seconds}s {nanos}ns is out of range")]
    Timestamp { seconds: i64, nanos: i64 },
    /// Embedded JSON (`RawExtension`, `FieldsV1`) does not parse.
    #[error("embedded JSON: {0}")]
    EmbeddedJson(String),
    /// Messages nest deeper than [`MAX_DEPTH`].
    #[error("messages nested deeper than {MAX_DEPTH}")]
    TooDeep,
}

/// What has been read for one field so far.
enum Slot<'a> {
    Empty,
    Scalar(Json),
    /// The payloads of a singular message field; several are merged as protobuf does.
    Message(Vec<&'a [u8]>),
    List(Vec<Json>),
    Map(Map<String, Json>),
}

/// Decodes the message `index` of `schema` into a JSON object.
pub fn message(
    schema: &Schema,
    index: usize,
    bytes: &[u8],
    depth: usize,
) -> Result<Map<String, Json>, DecodeError> {
    if depth > MAX_DEPTH {
        return Err(DecodeError::TooDeep);
    }
    let Some(desc) = schema.messages.get(index) else {
        return Ok(Map::new());
    };
    let mut slots: Vec<Slot> = desc.fields.iter().map(|_| Slot::Empty).collect();
    let mut reader = Reader::new(bytes);
    while let Some((number, value)) = reader.next_field()? {
        let Some(pos) = desc.position(number) else {
            continue; // unknown field: skipped
        };
        let field = &desc.fields[pos];
        let at = At {
            message: desc.name,
            field: field.json,
        };
        let mismatch = || at.mismatch(value);
        let slot = &mut slots[pos];
        match (field.cardinality, field.ty) {
            (Cardinality::Single, Type::Scalar(s)) => {
                *slot = Slot::Scalar(scalar(s, value, at)?);
            }
            (Cardinality::Single, _) => {
                let Value::Len(payload) = value else {
                    return Err(mismatch());
                };
                match slot {
                    Slot::Message(parts) => parts.push(payload),
                    _ => *slot = Slot::Message(vec![payload]),
                }
            }
            (Cardinality::Repeated, ty) => {
                if !matches!(slot, Slot::List(_)) {
                    *slot = Slot::List(Vec::new());
                }
                if let Slot::List(items) = slot {
                    repeated(schema, at, ty, value, items, depth)?;
                }
            }
            (Cardinality::Map, ty) => {
                let Value::Len(entry) = value else {
                    return Err(mismatch());
                };
                let (key, val) = map_entry(schema, at, ty, entry, depth)?;
                if !matches!(slot, Slot::Map(_)) {
                    *slot = Slot::Map(Map::new());
                }
                if let Slot::Map(map) = slot {
                    map.insert(key, val);
                }
            }
        }
    }
    let mut out = Map::new();
    for (field, slot) in desc.fields.iter().zip(slots) {
        emit(schema, field, slot, depth, &mut out)?;
    }
    Ok(out)
}

/// Writes one field into `out` following Go's JSON rules (see the module docs).
fn emit(
    schema: &Schema,
    field: &Field,
    slot: Slot,
    depth: usize,
    out: &mut Map<String, Json>,
) -> Result<(), DecodeError> {
    let value = match slot {
        Slot::Scalar(v) if field.pointer || field.required || !is_zero(&v) => v,
        Slot::Scalar(_) => return Ok(()),
        Slot::Message(parts) => single(schema, field.ty, &parts.concat(), depth)?,
        Slot::List(items) => Json::Array(items),
        Slot::Map(map) => Json::Object(map),
        Slot::Empty => match (field.cardinality, field.ty) {
            _ if field.pointer => return Ok(()),
            (Cardinality::Single, Type::Scalar(s)) if field.required => zero(s),
            (Cardinality::Single, Type::Scalar(_)) => return Ok(()),
            (Cardinality::Single, ty) => single(schema, ty, &[], depth)?,
            _ if field.required => Json::Null,
            _ => return Ok(()),
        },
    };
    if field.omit_zero && (value.is_null() || value.as_object().is_some_and(Map::is_empty)) {
        return Ok(());
    }
    match value {
        Json::Object(inner) if field.inline => out.extend(inner),
        value => {
            out.insert(field.json.to_owned(), value);
        }
    }
    Ok(())
}

/// Decodes one message-typed value (plain or well-known).
fn single(schema: &Schema, ty: Type, bytes: &[u8], depth: usize) -> Result<Json, DecodeError> {
    match ty {
        Type::Message(index) => Ok(Json::Object(message(schema, index, bytes, depth + 1)?)),
        Type::WellKnown(w) => well_known(w, bytes),
        // Scalars never reach here; a zero value keeps this total.
        Type::Scalar(s) => Ok(zero(s)),
    }
}

/// Where a value sits, for error messages.
#[derive(Debug, Clone, Copy)]
struct At {
    message: &'static str,
    field: &'static str,
}

impl At {
    fn mismatch(self, value: Value) -> DecodeError {
        DecodeError::WireTypeMismatch {
            message: self.message,
            field: self.field,
            wire_type: value.wire_type(),
        }
    }
}

/// Appends the value(s) of one occurrence of a repeated field.
fn repeated(
    schema: &Schema,
    at: At,
    ty: Type,
    value: Value,
    items: &mut Vec<Json>,
    depth: usize,
) -> Result<(), DecodeError> {
    match (ty, value) {
        (Type::Scalar(s), Value::Len(packed)) if !matches!(s, Scalar::String | Scalar::Bytes) => {
            let mut reader = Reader::new(packed);
            while !reader.is_empty() {
                let v = match s {
                    Scalar::Double => reader
                        .fixed()
                        .map(|b| Value::Fixed64(u64::from_le_bytes(b))),
                    Scalar::Float => reader
                        .fixed()
                        .map(|b| Value::Fixed32(u32::from_le_bytes(b))),
                    _ => reader.varint().map(Value::Varint),
                }?;
                items.push(scalar(s, v, at)?);
            }
        }
        (Type::Scalar(s), v) => items.push(scalar(s, v, at)?),
        (ty, Value::Len(bytes)) => items.push(single(schema, ty, bytes, depth)?),
        (_, v) => return Err(at.mismatch(v)),
    }
    Ok(())
}

/// Decodes a map entry message `{key = 1, value = 2}`; missing parts take their zero value.
fn map_entry(
    schema: &Schema,
    at: At,
    ty: Type,
    entry: &[u8],
    depth: usize,
) -> Result<(String, Json), DecodeError> {
    let mut key = String::new();
    let mut value: Option<Json> = None;
    let mut reader = Reader::new(entry);
    while let Some((number, v)) = reader.next_field()? {
        match (number, ty, v) {
            (1, _, Value::Len(k)) => {
                key = std::str::from_utf8(k)
                    .map_err(|_| DecodeError::Utf8(at.field))?
                    .to_owned();
            }
            (2, Type::Scalar(s), v) => value = Some(scalar(s, v, at)?),
            (2, ty, Value::Len(bytes)) => value = Some(single(schema, ty, bytes, depth)?),
            (1 | 2, _, v) => return Err(at.mismatch(v)),
            _ => {}
        }
    }
    let value = match (value, ty) {
        (Some(v), _) => v,
        (None, Type::Scalar(s)) => zero(s),
        (None, ty) => single(schema, ty, &[], depth)?,
    };
    Ok((key, value))
}

/// Converts one scalar; an error when the wire type does not fit the declared type.
fn scalar(s: Scalar, value: Value, at: At) -> Result<Json, DecodeError> {
    Ok(match (s, value) {
        (Scalar::String, Value::Len(b)) => match std::str::from_utf8(b) {
            Ok(text) => Json::String(text.to_owned()),
            Err(_) => return Err(DecodeError::Utf8(at.field)),
        },
        (Scalar::Bytes, Value::Len(b)) => {
            Json::String(base64::engine::general_purpose::STANDARD.encode(b))
        }
        (Scalar::Bool, Value::Varint(v)) => Json::Bool(v != 0),
        // Protobuf int32 is the low 32 bits of the varint (negative values are sign-extended).
        #[allow(clippy::cast_possible_truncation)]
        (Scalar::Int32, Value::Varint(v)) => Json::from(v as u32 as i32),
        #[allow(clippy::cast_possible_wrap)]
        (Scalar::Int64, Value::Varint(v)) => Json::from(v as i64),
        (Scalar::Double, Value::Fixed64(v)) => float(f64::from_bits(v)),
        (Scalar::Float, Value::Fixed32(v)) => float(f64::from(f32::from_bits(v))),
        (_, v) => return Err(at.mismatch(v)),
    })
}

/// NaN and infinities have no JSON form; Go's encoder refuses them, we write `null`.
fn float(v: f64) -> Json {
    serde_json::Number::from_f64(v).map_or(Json::Null, Json::Number)
}

fn zero(s: Scalar) -> Json {
    match s {
        Scalar::String | Scalar::Bytes => Json::String(String::new()),
        Scalar::Bool => Json::Bool(false),
        Scalar::Int32 | Scalar::Int64 => Json::from(0),
        Scalar::Double | Scalar::Float => float(0.0),
    }
}

fn is_zero(v: &Json) -> bool {
    match v {
        Json::String(s) => s.is_empty(),
        Json::Bool(b) => !b,
        Json::Number(n) => n.as_f64() == Some(0.0),
        _ => v.is_null(),
    }
}

/// Reads the scalar fields of a small well-known message by number.
fn fields(bytes: &[u8]) -> Result<Vec<(u32, Value<'_>)>, DecodeError> {
    let mut reader = Reader::new(bytes);
    let mut out = Vec::new();
    while let Some(f) = reader.next_field()? {
        out.push(f);
    }
    Ok(out)
}

/// The last varint of field `n` (protobuf: last one wins), or zero.
fn varint(fields: &[(u32, Value)], n: u32) -> u64 {
    fields
        .iter()
        .rev()
        .find_map(|(num, v)| match v {
            Value::Varint(x) if *num == n => Some(*x),
            _ => None,
        })
        .unwrap_or(0)
}

/// The last length-delimited payload of field `n`, or empty.
fn payload<'a>(fields: &[(u32, Value<'a>)], n: u32) -> &'a [u8] {
    fields
        .iter()
        .rev()
        .find_map(|(num, v)| match v {
            Value::Len(x) if *num == n => Some(*x),
            _ => None,
        })
        .unwrap_or_default()
}

fn well_known(w: WellKnown, bytes: &[u8]) -> Result<Json, DecodeError> {
    let f = fields(bytes)?;
    match w {
        WellKnown::Time | WellKnown::MicroTime => {
            // Go decodes zero bytes as the zero time, which JSON writes as null.
            if bytes.is_empty() {
                return Ok(Json::Null);
            }
            #[allow(clippy::cast_possible_wrap, clippy::cast_possible_truncation)]
            let (seconds, nanos) = (varint(&f, 1) as i64, i64::from(varint(&f, 2) as u32 as i32));
            let out_of_range = || DecodeError::Timestamp { seconds, nanos };
            let nanos32 = i32::try_from(nanos).map_err(|_| out_of_range())?;
            let ts = jiff::Timestamp::new(seconds, nanos32).map_err(|_| out_of_range())?;
            let base = ts.strftime("%Y-%m-%dT%H:%M:%S").to_string();
            Ok(Json::String(if w == WellKnown::Time {
                format!("{base}Z")
            } else {
                format!("{base}.{:06}Z", ts.subsec_microsecond())
            }))
        }
        WellKnown::IntOrString => Ok(if varint(&f, 1) == 1 {
            let s = std::str::from_utf8(payload(&f, 3)).map_err(|_| DecodeError::Utf8("strVal"))?;
            Json::String(s.to_owned())
        } else {
            #[allow(clippy::cast_possible_truncation)]
            Json::from(varint(&f, 2) as u32 as i32)
        }),
        WellKnown::Quantity => {
            let s =
                std::str::from_utf8(payload(&f, 1)).map_err(|_| DecodeError::Utf8("quantity"))?;
            // The zero Quantity is written as "0".
            Ok(Json::String(if s.is_empty() {
                "0".to_owned()
            } else {
                s.to_owned()
            }))
        }
        WellKnown::RawExtension | WellKnown::FieldsV1 => {
            let raw = payload(&f, 1);
            if raw.is_empty() {
                return Ok(Json::Null);
            }
            serde_json::from_slice(raw).map_err(|e| DecodeError::EmbeddedJson(e.to_string()))
        }
    }
}
