//! Kubernetes resource quantities (`100m`, `1.5Gi`, `2e3`), held exactly.
//!
//! The API types keep quantities as k8s-openapi's string newtype, so a manifest round-trips
//! verbatim. Code that needs the value converts that string into a [`Quantity`]: admission
//! (virt-api), the launcher pod template (virt-controller) and the launcher spec and scheduler
//! (virt-handler) all parse through here, so they agree on every value.
//!
//! Data flow: text → [`parse`] → an `i128` count of nano-units plus the [`Format`] of the suffix
//! → arithmetic and comparisons on the integer → [`format`] → the canonical string.
//!
//! The rules follow Kubernetes' `resource.Quantity`:
//!
//! - Suffixes are decimal SI (`n u m "" k M G T P E`), binary SI (`Ki Mi Gi Ti Pi Ei`) or a
//!   decimal exponent (`e3`, `E-12`); the number may carry a sign and a fraction.
//! - Values are rounded away from zero to whole nano-units (`0.1n` is `1n`), and binary-SI
//!   values are capped at 2^63−1, as Kubernetes does.
//! - Equality and order are by value: `1Gi == 1073741824`.
//! - The canonical string keeps the input's format and picks the largest suffix that
//!   represents the value exactly: `1.5Gi` → `1536Mi`, `1.5` → `1500m`, `1000` → `1k`.
//!
//! Two deliberate differences from Kubernetes: values beyond ±1.7×10^29 (the range of nano-units
//! in an `i128`) are refused rather than kept as arbitrary-precision decimals; and the canonical
//! string is always computed, where Kubernetes echoes input it considers canonical already (so it
//! prints `+1` and `1E3` verbatim, and we print `1` and `1e3`).

mod format;
mod parse;
#[cfg(test)]
mod proptests;

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

#[cfg(feature = "k8s-openapi")]
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

/// Nano-units in one unit.
const NANOS_PER_UNIT: i128 = 1_000_000_000;
const NANOS_PER_MILLI: i128 = 1_000_000;

/// The message Kubernetes gives for text that is not a quantity.
pub const FORMAT_ERROR_MESSAGE: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

/// Why a text is not a quantity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The text is not `<signed number><suffix>` (empty, no digits, stray characters).
    #[error("{FORMAT_ERROR_MESSAGE}")]
    Format,
    /// The suffix has the right characters but is none of the known suffixes (`1ki`, `1e`).
    #[error("unable to parse quantity's suffix")]
    Suffix,
    /// The value is beyond the range this type holds.
    #[error("quantity is out of range")]
    OutOfRange,
}

/// How a quantity was written; its canonical string keeps this form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Powers of 1024: `Ki`, `Mi`, … `Ei`.
    BinarySi,
    /// Powers of 1000: `n`, `u`, `m`, none, `k`, … `E`.
    DecimalSi,
    /// `e` and a power of ten: `1e3`, `12e-3`.
    DecimalExponent,
}

/// An exact Kubernetes quantity: a count of nano-units and the format to print it in.
///
/// Equality, order and hashing look at the value only: `1Gi`, `1024Mi` and `1073741824` are
/// equal. [`Display`](fmt::Display) and serde write the canonical string; deserializing accepts a
/// string (trimmed, as Kubernetes' JSON decoding does) or a JSON number.
#[derive(Debug, Clone, Copy)]
pub struct Quantity {
    nanos: i128,
    format: Format,
}

impl Quantity {
    /// The zero quantity (`0`).
    pub const ZERO: Quantity = Quantity::from_nano_value(0, Format::DecimalSi);

    /// Parses `text` as Kubernetes' `ParseQuantity` does: no surrounding whitespace.
    ///
    /// # Errors
    /// [`QuantityError`] when `text` is not a quantity or is out of range.
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let (nanos, format) = parse::parse(text)?;
        Ok(Self { nanos, format })
    }

    /// A quantity of `nanos` nano-units.
    #[must_use]
    pub const fn from_nano_value(nanos: i128, format: Format) -> Self {
        Self { nanos, format }
    }

    /// A quantity of `milli` thousandths of a unit.
    ///
    /// # Errors
    /// [`QuantityError::OutOfRange`] when the value does not fit.
    pub fn from_milli_value(milli: i128, format: Format) -> Result<Self, QuantityError> {
        Self::scaled(milli, NANOS_PER_MILLI, format)
    }

    /// A quantity of `value` whole units (bytes, cores).
    ///
    /// # Errors
    /// [`QuantityError::OutOfRange`] when the value does not fit.
    pub fn from_value(value: i128, format: Format) -> Result<Self, QuantityError> {
        Self::scaled(value, NANOS_PER_UNIT, format)
    }

    fn scaled(value: i128, nanos_per: i128, format: Format) -> Result<Self, QuantityError> {
        value
            .checked_mul(nanos_per)
            .map(|nanos| Self { nanos, format })
            .ok_or(QuantityError::OutOfRange)
    }

    /// The exact value in nano-units.
    #[must_use]
    pub const fn nano_value(&self) -> i128 {
        self.nanos
    }

    /// The value in thousandths, rounded away from zero (Kubernetes' `MilliValue`).
    #[must_use]
    pub const fn milli_value(&self) -> i128 {
        div_away_from_zero(self.nanos, NANOS_PER_MILLI)
    }

    /// The value in whole units, rounded away from zero (Kubernetes' `Value`): bytes of a
    /// memory quantity, cores of a CPU quantity.
    #[must_use]
    pub const fn value(&self) -> i128 {
        div_away_from_zero(self.nanos, NANOS_PER_UNIT)
    }

    /// The format the canonical string is written in.
    #[must_use]
    pub const fn format(&self) -> Format {
        self.format
    }

    /// Whether the value is zero.
    #[must_use]
    pub const fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    /// Whether the value is below zero.
    #[must_use]
    pub const fn is_negative(&self) -> bool {
        self.nanos < 0
    }

    /// The sum, in this quantity's format (the other's when this one is zero, as Kubernetes'
    /// `Add` does); `None` on overflow.
    #[must_use]
    pub fn checked_add(self, other: Self) -> Option<Self> {
        let format = if self.is_zero() {
            other.format
        } else {
            self.format
        };
        let nanos = self.nanos.checked_add(other.nanos)?;
        Some(Self { nanos, format })
    }

    /// The difference, in this quantity's format; `None` on overflow.
    #[must_use]
    pub fn checked_sub(self, other: Self) -> Option<Self> {
        let nanos = self.nanos.checked_sub(other.nanos)?;
        Some(Self { nanos, ..self })
    }

    /// The quantity times `factor`, in this quantity's format; `None` on overflow.
    #[must_use]
    pub fn checked_mul(self, factor: i128) -> Option<Self> {
        let nanos = self.nanos.checked_mul(factor)?;
        Some(Self { nanos, ..self })
    }

    /// The same value printed in `format`.
    #[must_use]
    pub const fn with_format(self, format: Format) -> Self {
        Self { format, ..self }
    }
}

/// `n / d` rounded away from zero; `d` is positive.
const fn div_away_from_zero(n: i128, d: i128) -> i128 {
    let q = n / d;
    if n % d == 0 {
        q
    } else if n > 0 {
        q + 1
    } else {
        q - 1
    }
}

impl Default for Quantity {
    fn default() -> Self {
        Self::ZERO
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

impl Hash for Quantity {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.nanos.hash(state);
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format::canonical(self.nanos, self.format))
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

/// The value of an API quantity; surrounding whitespace is ignored, as Kubernetes' JSON decoding
/// ignores it.
#[cfg(feature = "k8s-openapi")]
impl TryFrom<&K8sQuantity> for Quantity {
    type Error = QuantityError;

    fn try_from(q: &K8sQuantity) -> Result<Self, Self::Error> {
        Self::parse(q.0.trim())
    }
}

#[cfg(feature = "k8s-openapi")]
impl From<Quantity> for K8sQuantity {
    fn from(q: Quantity) -> Self {
        K8sQuantity(q.to_string())
    }
}

#[cfg(feature = "k8s-openapi")]
impl From<&Quantity> for K8sQuantity {
    fn from(q: &Quantity) -> Self {
        K8sQuantity(q.to_string())
    }
}

impl serde::Serialize for Quantity {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(QuantityVisitor)
    }
}

/// Accepts a string or a number, as Kubernetes' `UnmarshalJSON` does.
struct QuantityVisitor;

impl QuantityVisitor {
    fn parse<E: serde::de::Error>(text: &str) -> Result<Quantity, E> {
        Quantity::parse(text.trim()).map_err(|e| E::custom(format_args!("{text:?}: {e}")))
    }
}

impl serde::de::Visitor<'_> for QuantityVisitor {
    type Value = Quantity;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes quantity (string or number)")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Quantity, E> {
        Self::parse(v)
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Quantity, E> {
        Self::parse(&v.to_string())
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Quantity, E> {
        Self::parse(&v.to_string())
    }

    fn visit_i128<E: serde::de::Error>(self, v: i128) -> Result<Quantity, E> {
        Self::parse(&v.to_string())
    }

    fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<Quantity, E> {
        Self::parse(&v.to_string())
    }

    /// The shortest decimal that reads back as `v`, as k8s-openapi's `Quantity` does.
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Quantity, E> {
        Self::parse(&v.to_string())
    }
}

#[cfg(test)]
mod tests;
