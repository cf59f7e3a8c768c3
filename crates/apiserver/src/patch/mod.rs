//! JSON Patch (RFC 6902), JSON merge patch (RFC 7386) and Kubernetes strategic merge patch.
//!
//! The HTTP layer reads the request's `Content-Type` with [`patch_type_from_content_type`],
//! loads the stored object as a [`Value`], and calls one of:
//! - [`json_patch`]: a list of operations applied all-or-nothing to a copy of the object,
//! - [`merge_patch`]: the patch is merged recursively, `null` deletes,
//! - [`strategic_merge_patch`]: like a merge patch, but lists of built-in kinds are merged
//!   by a key (containers by `name`, …) chosen from the table in [`strategy`], and the
//!   `$patch`, `$retainKeys`, `$deleteFromPrimitiveList/…` and `$setElementOrder/…`
//!   directives that `kubectl apply`, `kubectl patch` and `kubectl edit` send are honoured.
//!
//! Each function returns the patched object; the caller then validates and stores it (and
//! must still check that the result is an object with the same name, kind, …).
//!
//! # Errors and HTTP status codes
//! kube-apiserver answers `400 BadRequest` when the patch document itself is malformed
//! ([`PatchError::Invalid`]) and `422 Unprocessable Entity` (reason `Invalid`, message "the
//! server rejected our request due to an error in our request") when a well-formed patch
//! cannot be applied to this object ([`PatchError::TestFailed`], [`PatchError::PathNotFound`]);
//! [`PatchError::status_code`] gives that mapping.

mod json;
mod merge;
mod strategic;
pub mod strategy;

use serde_json::Value;

pub use json::json_patch;
pub use merge::merge_patch;
pub use strategic::strategic_merge_patch;

/// Why a patch could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The patch document is malformed: not the expected JSON shape, an unknown operation or
    /// directive, a bad JSON Pointer, a list element without its merge key (HTTP 400).
    #[error("invalid patch: {0}")]
    Invalid(String),
    /// A JSON Patch `test` operation did not match the object (HTTP 422 `Invalid` from
    /// kube-apiserver). Kept apart from the other failures because clients use `test` as a
    /// precondition: KubeVirt's virt-api guards `status.stateChangeRequests` with it and
    /// reports a failed test as 409 Conflict to its own callers.
    #[error("test operation failed: {0}")]
    TestFailed(String),
    /// An operation referenced a path that does not exist in the object, or an array index
    /// out of range (HTTP 422).
    #[error("path not found: {0}")]
    PathNotFound(String),
}

impl PatchError {
    /// The HTTP status kube-apiserver answers with for this error: 400 for a malformed patch,
    /// 422 for a patch that does not apply to the stored object.
    pub fn status_code(&self) -> u16 {
        match self {
            PatchError::Invalid(_) => 400,
            PatchError::TestFailed(_) | PatchError::PathNotFound(_) => 422,
        }
    }
}

/// The four patch flavours a Kubernetes API server accepts, named by the request's
/// `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PatchType {
    /// `application/json-patch+json` (RFC 6902).
    Json,
    /// `application/merge-patch+json` (RFC 7386).
    Merge,
    /// `application/strategic-merge-patch+json` (built-in kinds only upstream).
    StrategicMerge,
    /// `application/apply-patch+yaml` (server-side apply).
    Apply,
}

impl PatchType {
    /// The media type of this patch flavour.
    pub fn content_type(self) -> &'static str {
        match self {
            PatchType::Json => "application/json-patch+json",
            PatchType::Merge => "application/merge-patch+json",
            PatchType::StrategicMerge => "application/strategic-merge-patch+json",
            PatchType::Apply => "application/apply-patch+yaml",
        }
    }
}

/// The patch type named by a `Content-Type` header value; parameters after `;` (such as
/// `charset=utf-8`) are ignored and the media type is compared case-insensitively.
/// `None` for any other media type (kube-apiserver answers 415 Unsupported Media Type).
pub fn patch_type_from_content_type(ct: &str) -> Option<PatchType> {
    let media = ct.split(';').next().unwrap_or_default().trim();
    [
        PatchType::Json,
        PatchType::Merge,
        PatchType::StrategicMerge,
        PatchType::Apply,
    ]
    .into_iter()
    .find(|t| t.content_type().eq_ignore_ascii_case(media))
}

/// A short rendering of a JSON value for error messages.
fn describe(v: &Value) -> String {
    let mut s = v.to_string();
    if s.len() > 120 {
        let mut cut = 117;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_map_to_patch_types_ignoring_parameters_and_case() {
        let cases = [
            ("application/json-patch+json", Some(PatchType::Json)),
            ("application/merge-patch+json", Some(PatchType::Merge)),
            (
                "application/strategic-merge-patch+json",
                Some(PatchType::StrategicMerge),
            ),
            ("application/apply-patch+yaml", Some(PatchType::Apply)),
            (
                "application/merge-patch+json; charset=utf-8",
                Some(PatchType::Merge),
            ),
            (
                " Application/JSON-Patch+JSON ;charset=UTF-8",
                Some(PatchType::Json),
            ),
            ("application/json", None),
            ("application/apply-patch+json", None),
            ("", None),
            (";", None),
        ];
        for (ct, want) in cases {
            assert_eq!(patch_type_from_content_type(ct), want, "{ct:?}");
        }
    }

    #[test]
    fn malformed_patches_are_bad_requests_and_failed_applications_unprocessable() {
        assert_eq!(PatchError::Invalid("x".into()).status_code(), 400);
        assert_eq!(PatchError::TestFailed("x".into()).status_code(), 422);
        assert_eq!(PatchError::PathNotFound("x".into()).status_code(), 422);
    }

    /// A small deterministic PRNG (xorshift64*), enough to shake out panics.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            let x = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
            usize::try_from(x >> 33).unwrap_or(0) % n.max(1)
        }

        fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
            from[self.below(from.len())]
        }
    }

    const KEYS: &[&str] = &[
        "metadata",
        "spec",
        "status",
        "template",
        "containers",
        "name",
        "env",
        "ports",
        "port",
        "finalizers",
        "conditions",
        "type",
        "a",
        "$patch",
        "$retainKeys",
        "$setElementOrder/containers",
        "$setElementOrder/finalizers",
        "$deleteFromPrimitiveList/finalizers",
        "$setElementOrder/ports",
    ];

    const STRINGS: &[&str] = &[
        "a",
        "b",
        "name",
        "replace",
        "delete",
        "merge",
        "",
        "/a",
        "/spec/containers/0",
        "/-",
        "~1",
        "~",
        "/metadata/finalizers/-",
    ];

    fn random_value(rng: &mut Rng, depth: usize) -> Value {
        let choice = if depth == 0 {
            rng.below(4)
        } else {
            rng.below(7)
        };
        match choice {
            0 => Value::Null,
            1 => Value::Bool(rng.below(2) == 0),
            2 => Value::from(rng.below(5)),
            3 => Value::from(rng.pick(STRINGS)),
            4 => Value::Array(
                (0..rng.below(4))
                    .map(|_| random_value(rng, depth - 1))
                    .collect(),
            ),
            _ => {
                let mut obj = serde_json::Map::new();
                for _ in 0..rng.below(5) {
                    let key = rng.pick(KEYS).to_owned();
                    obj.insert(key, random_value(rng, depth - 1));
                }
                Value::Object(obj)
            }
        }
    }

    fn random_json_patch(rng: &mut Rng) -> Value {
        let ops = ["add", "remove", "replace", "move", "copy", "test", "bogus"];
        let pointers = [
            "",
            "/",
            "/a",
            "/spec",
            "/spec/containers",
            "/spec/containers/0",
            "/spec/containers/-",
            "/metadata/finalizers/1",
            "/a/b/c",
            "/a~1b",
            "/spec/01",
            "x",
        ];
        let ops = (0..rng.below(6))
            .map(|_| {
                let mut op = serde_json::Map::new();
                op.insert("op".into(), Value::from(rng.pick(&ops)));
                op.insert("path".into(), Value::from(rng.pick(&pointers)));
                if rng.below(4) != 0 {
                    op.insert("from".into(), Value::from(rng.pick(&pointers)));
                }
                if rng.below(4) != 0 {
                    op.insert("value".into(), random_value(rng, 3));
                }
                Value::Object(op)
            })
            .collect();
        Value::Array(ops)
    }

    #[test]
    fn random_patches_never_panic() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let kinds = [
            ("v1", "Pod"),
            ("apps/v1", "Deployment"),
            ("v1", "Service"),
            ("x/v1", "Y"),
        ];
        let mut applied = 0;
        for _ in 0..10_000 {
            let doc = random_value(&mut rng, 4);
            let patch = random_value(&mut rng, 4);
            let (api_version, kind) = kinds[rng.below(kinds.len())];
            applied += usize::from(strategic_merge_patch(&doc, &patch, api_version, kind).is_ok());
            applied += usize::from(merge_patch(&doc, &patch).is_ok());
            applied += usize::from(json_patch(&doc, &random_json_patch(&mut rng)).is_ok());
        }
        // The generator must also produce patches that apply, not only errors.
        assert!(applied > 3000, "only {applied} patches applied");
    }

    #[test]
    fn long_values_are_shortened_in_messages() {
        let v = Value::String("é".repeat(200));
        let d = describe(&v);
        assert!(d.len() <= 120);
        assert!(d.ends_with("..."));
    }
}
