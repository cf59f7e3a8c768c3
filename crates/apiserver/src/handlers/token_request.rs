//! `POST serviceaccounts/{name}/token`: a TokenRequest (`authentication.k8s.io/v1`) for a
//! service account, answered with a signed token bound to the account and, optionally, to
//! a pod or secret of its namespace.
//!
//! [`parse_spec`] checks and defaults the spec (pure); [`create`] resolves the bound object
//! against the store, signs the token and answers 201 with the TokenRequest and its
//! `status`. Nothing is stored: a token lives by its signature and the objects it names.

use serde_json::{Value, json};

use super::common::{Reply, get_object};
use crate::cause::Cause;
use crate::serviceaccount::{Claims, ObjectClaim};
use crate::state::ApiState;
use crate::status::ApiError;

/// Token lifetime when the spec names none.
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;

/// The shortest lifetime a client may ask for.
pub const MIN_EXPIRATION_SECONDS: i64 = 600;

/// The longest lifetime a client may ask for (2³² seconds).
pub const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;

const GROUP: &str = "authentication.k8s.io";

/// The kind of object a token is bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoundKind {
    Pod,
    Secret,
}

impl BoundKind {
    fn plural(self) -> &'static str {
        match self {
            BoundKind::Pod => "pods",
            BoundKind::Secret => "secrets",
        }
    }
}

/// The object named by `spec.boundObjectRef`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundRef {
    pub kind: BoundKind,
    pub name: String,
    /// Empty: any uid (the current object's is taken).
    pub uid: String,
}

/// A checked and defaulted TokenRequest spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenSpec {
    /// Empty: the API server's audiences.
    pub audiences: Vec<String>,
    pub expiration_seconds: i64,
    pub bound: Option<BoundRef>,
}

/// Checks and defaults a TokenRequest's `spec`; field-path causes on failure.
pub fn parse_spec(spec: &Value) -> Result<TokenSpec, Vec<Cause>> {
    let mut causes = Vec::new();
    let audiences = match &spec["audiences"] {
        Value::Null => Vec::new(),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .filter_map(|(i, v)| match v.as_str() {
                Some(s) => Some(s.to_owned()),
                None => {
                    causes.push(Cause::new(
                        "FieldValueInvalid",
                        format!("spec.audiences[{i}]"),
                        "must be a string",
                    ));
                    None
                }
            })
            .collect(),
        _ => {
            causes.push(Cause::new(
                "FieldValueInvalid",
                "spec.audiences",
                "must be a list of strings",
            ));
            Vec::new()
        }
    };
    let expiration_seconds = match &spec["expirationSeconds"] {
        Value::Null => DEFAULT_EXPIRATION_SECONDS,
        v => match v.as_i64() {
            Some(n) if n < MIN_EXPIRATION_SECONDS => {
                causes.push(Cause::new(
                    "FieldValueInvalid",
                    "spec.expirationSeconds",
                    "may not specify a duration less than 10 minutes",
                ));
                n
            }
            Some(n) if n > MAX_EXPIRATION_SECONDS => {
                causes.push(Cause::new(
                    "FieldValueInvalid",
                    "spec.expirationSeconds",
                    "may not specify a duration larger than 2^32 seconds",
                ));
                n
            }
            Some(n) => n,
            None => {
                causes.push(Cause::new(
                    "FieldValueInvalid",
                    "spec.expirationSeconds",
                    "must be an integer",
                ));
                0
            }
        },
    };
    let bound = parse_bound(&spec["boundObjectRef"], &mut causes);
    if causes.is_empty() {
        Ok(TokenSpec {
            audiences,
            expiration_seconds,
            bound,
        })
    } else {
        Err(causes)
    }
}

fn parse_bound(r: &Value, causes: &mut Vec<Cause>) -> Option<BoundRef> {
    if r.is_null() {
        return None;
    }
    let field = "spec.boundObjectRef";
    let kind = match r["kind"].as_str().unwrap_or("") {
        "Pod" => Some(BoundKind::Pod),
        "Secret" => Some(BoundKind::Secret),
        other => {
            causes.push(Cause::new(
                "FieldValueNotSupported",
                format!("{field}.kind"),
                format!("Unsupported value: {other:?}: supported values: \"Pod\", \"Secret\""),
            ));
            None
        }
    };
    if !matches!(r["apiVersion"].as_str(), None | Some("" | "v1")) {
        causes.push(Cause::new(
            "FieldValueNotSupported",
            format!("{field}.apiVersion"),
            "Unsupported value: supported values: \"v1\"",
        ));
    }
    let name = r["name"].as_str().unwrap_or("").to_owned();
    if name.is_empty() {
        causes.push(Cause::new(
            "FieldValueRequired",
            format!("{field}.name"),
            "Required value",
        ));
    }
    Some(BoundRef {
        kind: kind?,
        name,
        uid: r["uid"].as_str().unwrap_or("").to_owned(),
    })
}

/// The current `{name, uid}` of the bound object; 404 if absent, 409 if its uid is not
/// the one asked for.
fn resolve_bound(state: &ApiState, ns: &str, bound: &BoundRef) -> Result<ObjectClaim, ApiError> {
    let plural = bound.kind.plural();
    let info = state
        .registry
        .find("", "v1", plural)
        .ok_or_else(|| ApiError::internal(format!("{plural} are not served")))?;
    let (obj, _) = get_object(state, &info, Some(ns), &bound.name)?;
    let uid = obj["metadata"]["uid"].as_str().unwrap_or("").to_owned();
    if !bound.uid.is_empty() && bound.uid != uid {
        return Err(ApiError::conflict_because(
            "",
            plural,
            &bound.name,
            &format!(
                "the UID in the bound object reference ({}) does not match the UID in record. The object might have been deleted and then recreated",
                bound.uid
            ),
        ));
    }
    Ok(ObjectClaim {
        name: bound.name.clone(),
        uid,
    })
}

/// Issues a token for service account `ns/name` as `request` (a TokenRequest) asks.
pub fn create(state: &ApiState, ns: &str, name: &str, request: &Value) -> Result<Reply, ApiError> {
    let sa_info = state
        .registry
        .find("", "v1", "serviceaccounts")
        .ok_or_else(|| ApiError::internal("serviceaccounts are not served"))?;
    let (sa, _) = get_object(state, &sa_info, Some(ns), name)?;
    let spec = parse_spec(&request["spec"])
        .map_err(|causes| ApiError::invalid(GROUP, "TokenRequest", name, causes))?;
    let issuer = state
        .token_issuer
        .as_deref()
        .ok_or_else(|| ApiError::internal("the server has no service-account signing key"))?;
    let bound = spec
        .bound
        .as_ref()
        .map(|b| resolve_bound(state, ns, b).map(|claim| (b.kind, claim)))
        .transpose()?;
    let audiences = if spec.audiences.is_empty() {
        issuer.api_audiences().to_vec()
    } else {
        spec.audiences.clone()
    };
    let now = jiff::Timestamp::now().as_second();
    let sa_claim = ObjectClaim {
        name: name.to_owned(),
        uid: sa["metadata"]["uid"].as_str().unwrap_or("").to_owned(),
    };
    let mut claims = Claims::new(
        issuer.issuer(),
        ns,
        sa_claim,
        audiences.clone(),
        now,
        spec.expiration_seconds,
    );
    match &bound {
        Some((BoundKind::Pod, c)) => claims.kubernetes.pod = Some(c.clone()),
        Some((BoundKind::Secret, c)) => claims.kubernetes.secret = Some(c.clone()),
        None => {}
    }
    let token = issuer
        .sign(&claims)
        .map_err(|e| ApiError::internal(format!("signing the token: {e}")))?;
    let expiration = jiff::Timestamp::from_second(claims.exp)
        .map_err(|e| ApiError::internal(format!("token expiry out of range: {e}")))?
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let bound_ref = match &spec.bound {
        Some(b) => json!({
            "kind": match b.kind { BoundKind::Pod => "Pod", BoundKind::Secret => "Secret" },
            "apiVersion": "v1",
            "name": b.name,
            "uid": bound.as_ref().map(|(_, c)| c.uid.clone()).unwrap_or_default(),
        }),
        None => Value::Null,
    };
    Ok(Reply {
        code: 201,
        body: json!({
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {
                "name": name,
                "namespace": ns,
                "creationTimestamp": super::common::now_rfc3339(),
            },
            "spec": {
                "audiences": audiences,
                "expirationSeconds": spec.expiration_seconds,
                "boundObjectRef": bound_ref,
            },
            "status": {"token": token, "expirationTimestamp": expiration},
        }),
        warnings: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_spec_defaults_to_an_hour_for_the_api_server() {
        let s = parse_spec(&Value::Null).unwrap();
        assert_eq!(s.expiration_seconds, 3600);
        assert!(s.audiences.is_empty() && s.bound.is_none());
    }

    #[test]
    fn a_lifetime_under_ten_minutes_is_invalid() {
        let causes = parse_spec(&json!({"expirationSeconds": 599})).unwrap_err();
        assert_eq!(causes[0].field, "spec.expirationSeconds");
        assert!(parse_spec(&json!({"expirationSeconds": 600})).is_ok());
    }

    #[test]
    fn a_bound_object_must_be_a_named_pod_or_secret() {
        let s = parse_spec(&json!({"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p", "uid": "u"}}))
            .unwrap();
        assert_eq!(
            s.bound,
            Some(BoundRef {
                kind: BoundKind::Pod,
                name: "p".into(),
                uid: "u".into()
            })
        );
        let causes =
            parse_spec(&json!({"boundObjectRef": {"kind": "Node", "name": "n"}})).unwrap_err();
        assert_eq!(causes[0].field, "spec.boundObjectRef.kind");
        let causes = parse_spec(&json!({"boundObjectRef": {"kind": "Secret"}})).unwrap_err();
        assert_eq!(causes[0].field, "spec.boundObjectRef.name");
    }
}
