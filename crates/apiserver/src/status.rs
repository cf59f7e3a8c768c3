//! Kubernetes `Status` errors: every failed request is answered with one of these.
//!
//! [`ApiError`] carries the HTTP code, the machine-readable `reason`, the human message and
//! the `details` (name, group, kind, causes) that kubectl uses to print
//! `Error from server (<reason>): <message>` or `The <Kind> "<name>" is invalid: …`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::cause::Cause;

/// A request failure, rendered as a `metav1.Status`. Boxed so `Result<_, ApiError>` stays
/// small; fields are reached through `Deref` to [`StatusDetails`].
#[derive(Clone, Debug, thiserror::Error)]
#[error("{} ({}): {}", .0.reason, .0.code, .0.message)]
pub struct ApiError(Box<StatusDetails>);

impl std::ops::Deref for ApiError {
    type Target = StatusDetails;
    fn deref(&self) -> &StatusDetails {
        &self.0
    }
}

impl std::ops::DerefMut for ApiError {
    fn deref_mut(&mut self) -> &mut StatusDetails {
        &mut self.0
    }
}

/// The content of an [`ApiError`].
#[derive(Clone, Debug)]
pub struct StatusDetails {
    /// HTTP status code.
    pub code: u16,
    /// `StatusReason` (`NotFound`, `Conflict`, `Invalid` …).
    pub reason: String,
    /// Human-readable message.
    pub message: String,
    /// `details.name`.
    pub name: Option<String>,
    /// `details.group`.
    pub group: Option<String>,
    /// `details.kind` (resource plural for NotFound/AlreadyExists/Conflict, Kind for Invalid).
    pub kind: Option<String>,
    /// `details.causes`.
    pub causes: Vec<Cause>,
}

/// `plural.group`, or `plural` for the core group (`virtualmachines.kubevirt.io`, `pods`).
pub fn qualified(plural: &str, group: &str) -> String {
    if group.is_empty() {
        plural.to_owned()
    } else {
        format!("{plural}.{group}")
    }
}

impl ApiError {
    /// A bare error with no details.
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> ApiError {
        ApiError(Box::new(StatusDetails {
            code,
            reason: reason.to_owned(),
            message: message.into(),
            name: None,
            group: None,
            kind: None,
            causes: Vec::new(),
        }))
    }

    fn with_details(mut self, group: &str, kind: &str, name: &str) -> ApiError {
        self.group = Some(group.to_owned());
        self.kind = Some(kind.to_owned());
        self.name = Some(name.to_owned());
        self
    }

    /// 404 `virtualmachines.kubevirt.io "x" not found`.
    pub fn not_found(group: &str, plural: &str, name: &str) -> ApiError {
        let msg = format!("{} \"{name}\" not found", qualified(plural, group));
        ApiError::new(404, "NotFound", msg).with_details(group, plural, name)
    }

    /// 404 for a path that names no known resource.
    pub fn no_route() -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// 409 `… "x" already exists`.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> ApiError {
        let msg = format!("{} \"{name}\" already exists", qualified(plural, group));
        ApiError::new(409, "AlreadyExists", msg).with_details(group, plural, name)
    }

    /// 409 Conflict on a stale resourceVersion.
    pub fn conflict(group: &str, plural: &str, name: &str) -> ApiError {
        ApiError::conflict_because(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 409 Conflict with a custom explanation (failed preconditions …).
    pub fn conflict_because(group: &str, plural: &str, name: &str, why: &str) -> ApiError {
        let msg = format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            qualified(plural, group)
        );
        ApiError::new(409, "Conflict", msg).with_details(group, plural, name)
    }

    /// 422 Invalid: `Kind.group "name" is invalid: field: message, …`.
    pub fn invalid(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> ApiError {
        let qualified_kind = if group.is_empty() {
            kind.to_owned()
        } else {
            format!("{kind}.{group}")
        };
        let list = causes
            .iter()
            .map(|c| {
                if c.field.is_empty() {
                    c.message.clone()
                } else {
                    format!("{}: {}", c.field, c.message)
                }
            })
            .collect::<Vec<_>>();
        let joined = if list.len() == 1 {
            list[0].clone()
        } else {
            format!("[{}]", list.join(", "))
        };
        let msg = format!("{qualified_kind} \"{name}\" is invalid: {joined}");
        let mut e = ApiError::new(422, "Invalid", msg).with_details(group, kind, name);
        e.causes = causes;
        e
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(message: impl Into<String>) -> ApiError {
        ApiError::new(405, "MethodNotAllowed", message)
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(message: impl Into<String>) -> ApiError {
        ApiError::new(415, "UnsupportedMediaType", message)
    }

    /// 410 Expired (a compacted resourceVersion).
    pub fn expired(message: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", message)
    }

    /// 403 Forbidden as kube's `NewForbidden` words it: `<resource.group> "<name>" is
    /// forbidden: <why>` (without the name when there is none, and `forbidden: <why>`
    /// for a non-resource request, whose `resource` is empty).
    pub fn forbidden_resource(group: &str, resource: &str, name: &str, why: &str) -> ApiError {
        let message = match (resource, name) {
            ("", _) => format!("forbidden: {why}"),
            (r, "") => format!("{} is forbidden: {why}", qualified(r, group)),
            (r, n) => format!("{} \"{n}\" is forbidden: {why}", qualified(r, group)),
        };
        let e = ApiError::new(403, "Forbidden", message);
        if resource.is_empty() {
            return e;
        }
        let mut e = e.with_details(group, resource, name);
        if name.is_empty() {
            e.name = None;
        }
        if group.is_empty() {
            e.group = None;
        }
        e
    }

    /// 401 Unauthorized.
    pub fn unauthorized() -> ApiError {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }

    /// 413 RequestEntityTooLarge.
    pub fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::new(413, "RequestEntityTooLarge", message)
    }

    /// 403 Forbidden.
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(403, "Forbidden", message)
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(500, "InternalError", message)
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut details = serde_json::Map::new();
        if let Some(n) = &self.name {
            details.insert("name".into(), json!(n));
        }
        if let Some(g) = &self.group {
            details.insert("group".into(), json!(g));
        }
        if let Some(k) = &self.kind {
            details.insert("kind".into(), json!(k));
        }
        if !self.causes.is_empty() {
            details.insert("causes".into(), json!(self.causes));
        }
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if !details.is_empty() {
            status["details"] = Value::Object(details);
        }
        status
    }
}

/// A JSON response with the given code.
pub fn json_response(code: u16, body: &Value) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut resp = (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        bytes,
    )
        .into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_response(self.code, &self.to_status())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_message_names_the_qualified_resource() {
        let e = ApiError::not_found("kubevirt.io", "virtualmachines", "x");
        assert_eq!(e.message, "virtualmachines.kubevirt.io \"x\" not found");
        let s = e.to_status();
        assert_eq!(s["details"]["kind"], "virtualmachines");
        assert_eq!(s["code"], 404);
    }

    #[test]
    fn conflict_message_matches_kube() {
        let e = ApiError::conflict("kubevirt.io", "virtualmachines", "x");
        assert_eq!(
            e.message,
            "Operation cannot be fulfilled on virtualmachines.kubevirt.io \"x\": the object has been modified; please apply your changes to the latest version and try again"
        );
    }

    #[test]
    fn invalid_message_lists_causes() {
        let e = ApiError::invalid(
            "kubevirt.io",
            "VirtualMachine",
            "vmbad",
            vec![Cause::new(
                "FieldValueInvalid",
                "spec.foo",
                "Invalid value: \"bar\": foo is not allowed",
            )],
        );
        assert_eq!(
            e.message,
            "VirtualMachine.kubevirt.io \"vmbad\" is invalid: spec.foo: Invalid value: \"bar\": foo is not allowed"
        );
        assert_eq!(e.to_status()["details"]["causes"][0]["field"], "spec.foo");
    }
}
