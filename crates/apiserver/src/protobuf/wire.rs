//! A minimal protobuf wire-format reader.
//!
//! [`Reader`] walks one message's bytes as a sequence of `(field number, value)` pairs. It
//! knows the four wire types Kubernetes uses (varint, 64-bit, length-delimited, 32-bit) and
//! never reads past the end of its input: every malformed input is a [`WireError`].

/// Why a byte sequence is not valid protobuf.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The input ended inside a tag or a value.
    #[error("unexpected end of input")]
    Truncated,
    /// A varint ran over ten bytes.
    #[error("varint longer than ten bytes")]
    VarintTooLong,
    /// A tag named field number zero or one beyond 2^29 - 1.
    #[error("invalid field number {0}")]
    FieldNumber(u64),
    /// A tag named a wire type this reader does not know (groups included).
    #[error("unsupported wire type {0}")]
    WireType(u8),
}

/// One field value as it appears on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1, little-endian.
    Fixed64(u64),
    /// Wire type 2: strings, bytes, embedded messages and packed repeated scalars.
    Len(&'a [u8]),
    /// Wire type 5, little-endian.
    Fixed32(u32),
}

impl Value<'_> {
    /// The wire type number of this value, for error messages.
    pub fn wire_type(&self) -> u8 {
        match self {
            Value::Varint(_) => 0,
            Value::Fixed64(_) => 1,
            Value::Len(_) => 2,
            Value::Fixed32(_) => 5,
        }
    }
}

/// Iterates over the fields of one encoded message.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over one message's encoding.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    /// Whether all input has been consumed.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Reads one varint from the front of the remaining input.
    pub fn varint(&mut self) -> Result<u64, WireError> {
        let mut value = 0u64;
        for (i, byte) in self.buf.iter().copied().enumerate().take(10) {
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.buf = &self.buf[i + 1..];
                return Ok(value);
            }
        }
        if self.buf.len() >= 10 {
            Err(WireError::VarintTooLong)
        } else {
            Err(WireError::Truncated)
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if n > self.buf.len() {
            return Err(WireError::Truncated);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    /// Reads `N` raw bytes (a fixed-width value).
    pub fn fixed<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// Reads the next field, or `None` at the end of the input.
    pub fn next_field(&mut self) -> Result<Option<(u32, Value<'a>)>, WireError> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let tag = self.varint()?;
        let number = tag >> 3;
        let number = match u32::try_from(number) {
            Ok(n) if n != 0 && n < (1 << 29) => n,
            _ => return Err(WireError::FieldNumber(number)),
        };
        let value = match tag & 7 {
            0 => Value::Varint(self.varint()?),
            1 => Value::Fixed64(u64::from_le_bytes(self.fixed()?)),
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| WireError::Truncated)?;
                Value::Len(self.take(len)?)
            }
            5 => Value::Fixed32(u32::from_le_bytes(self.fixed()?)),
            // The mask keeps the value below 8.
            other => return Err(WireError::WireType(u8::try_from(other).unwrap_or(u8::MAX))),
        };
        Ok(Some((number, value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_wire_type_in_order() {
        let bytes = [
            0x08, 0x96, 0x01, // 1: varint 150
            0x11, 1, 0, 0, 0, 0, 0, 0, 0, // 2: fixed64 1
            0x1a, 0x02, b'h', b'i', // 3: "hi"
            0x25, 2, 0, 0, 0, // 4: fixed32 2
        ];
        let mut r = Reader::new(&bytes);
        assert_eq!(r.next_field(), Ok(Some((1, Value::Varint(150)))));
        assert_eq!(r.next_field(), Ok(Some((2, Value::Fixed64(1)))));
        assert_eq!(r.next_field(), Ok(Some((3, Value::Len(b"hi")))));
        assert_eq!(r.next_field(), Ok(Some((4, Value::Fixed32(2)))));
        assert_eq!(r.next_field(), Ok(None));
    }

    #[test]
    fn negative_int64_varint_uses_ten_bytes() {
        let bytes = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(Reader::new(&bytes).varint(), Ok(u64::MAX));
    }

    #[test]
    fn malformed_inputs_are_errors() {
        let cases: [(&[u8], WireError); 6] = [
            (&[0x08], WireError::Truncated),
            (&[0x0a, 0x05, b'a'], WireError::Truncated),
            (
                &[
                    0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                ],
                WireError::VarintTooLong,
            ),
            (&[0x00, 0x00], WireError::FieldNumber(0)),
            (&[0x0b], WireError::WireType(3)),
            (
                &[0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
                WireError::Truncated,
            ),
        ];
        for (bytes, want) in cases {
            assert_eq!(Reader::new(bytes).next_field(), Err(want), "{bytes:?}");
        }
    }
}
