//! Open-ended string enums.
//!
//! KubeVirt models phases, strategies, buses and condition types as Go string types. A manifest
//! written for a newer upstream may carry a value this crate does not know yet, and decoding must
//! never fail because of that. [`string_enum!`] declares an enum whose known variants map to the
//! upstream strings and whose `Other(String)` variant keeps any other value verbatim, so decode and
//! encode round-trip every string. The JSON schema is a plain `string`.

/// Declares an open-ended string enum; the first variant is the `Default`.
///
/// ```ignore
/// string_enum! {
///     /// Doc.
///     pub enum Bus { Virtio = "virtio", Sata = "sata" }
/// }
/// ```
macro_rules! string_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $value:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A value this crate does not know, kept verbatim.
            Other(String),
        }

        impl $name {
            /// Every known variant, in declaration order.
            pub const KNOWN: &'static [$name] = &[$($name::$variant),+];

            /// The upstream string of this value.
            #[must_use]
            pub fn as_str(&self) -> &str {
                match self {
                    $( $name::$variant => $value, )+
                    $name::Other(other) => other.as_str(),
                }
            }

            /// Whether this value is one of the known variants.
            #[must_use]
            pub fn is_known(&self) -> bool {
                !matches!(self, $name::Other(_))
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::KNOWN[0].clone()
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                match value {
                    $( $value => $name::$variant, )+
                    other => $name::Other(other.to_owned()),
                }
            }
        }

        impl From<String> for $name {
            fn from(value: String) -> Self {
                match $name::from(value.as_str()) {
                    $name::Other(_) => $name::Other(value),
                    known => known,
                }
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = ::std::convert::Infallible;
            fn from_str(value: &str) -> Result<Self, Self::Err> {
                Ok($name::from(value))
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let value = <::std::borrow::Cow<'de, str> as ::serde::Deserialize>::deserialize(deserializer)?;
                Ok($name::from(value.into_owned()))
            }
        }

        impl ::schemars::JsonSchema for $name {
            fn schema_name() -> ::std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn inline_schema() -> bool {
                true
            }

            fn json_schema(_: &mut ::schemars::SchemaGenerator) -> ::schemars::Schema {
                ::schemars::json_schema!({ "type": "string" })
            }
        }
    };
}

pub(crate) use string_enum;

#[cfg(test)]
mod tests {
    string_enum! {
        /// A test enum.
        pub enum Colour { Unset = "", Red = "Red", Blue = "blue" }
    }

    #[test]
    fn known_strings_decode_to_variants_and_encode_back() {
        let c: Colour = serde_json::from_str("\"blue\"").unwrap();
        assert_eq!(c, Colour::Blue);
        assert_eq!(serde_json::to_string(&c).unwrap(), "\"blue\"");
        assert_eq!(Colour::default(), Colour::Unset);
    }

    #[test]
    fn unknown_strings_round_trip_verbatim() {
        let c: Colour = serde_json::from_str("\"Green\"").unwrap();
        assert_eq!(c, Colour::Other("Green".into()));
        assert!(!c.is_known());
        assert_eq!(serde_json::to_string(&c).unwrap(), "\"Green\"");
    }

    #[test]
    fn schema_is_a_plain_string() {
        let schema = schemars::schema_for!(Colour);
        assert_eq!(schema.get("type"), Some(&serde_json::json!("string")));
        assert!(schema.get("enum").is_none());
    }
}
