//! Errors of the subresource endpoints and their `metav1.Status` form.
//!
//! Every refusal carries the HTTP code and the message upstream answers with: 409s read
//! `Operation cannot be fulfilled on <resource>.kubevirt.io "<name>": <inner>`, 403s
//! `<resource>.kubevirt.io "<name>" is forbidden: <inner>`, 404s
//! `<resource>.kubevirt.io "<name>" not found`, 500s `Internal error occurred: <inner>`, and
//! 400 messages are used verbatim. A few guest-agent endpoints answer in plain text.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// The resource an error names (singular, as upstream's `v1.Resource(...)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Res {
    /// `virtualmachine`.
    Vm,
    /// `virtualmachineinstance`.
    Vmi,
}

impl Res {
    /// The singular resource name.
    pub fn as_str(self) -> &'static str {
        match self {
            Res::Vm => "virtualmachine",
            Res::Vmi => "virtualmachineinstance",
        }
    }
}

/// A refused or failed subresource request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct SubError {
    /// HTTP status code.
    pub code: u16,
    /// `Status.reason`.
    pub reason: &'static str,
    /// `Status.message`.
    pub message: String,
    /// `(resource, name)` for `Status.details`.
    pub details: Option<(Res, String)>,
    /// Answer in plain text instead of a `Status` object.
    pub plain: bool,
}

impl SubError {
    /// 409 Conflict.
    pub fn conflict(res: Res, name: &str, inner: impl std::fmt::Display) -> Self {
        Self {
            code: 409,
            reason: "Conflict",
            message: format!(
                "Operation cannot be fulfilled on {}.kubevirt.io \"{name}\": {inner}",
                res.as_str()
            ),
            details: Some((res, name.to_owned())),
            plain: false,
        }
    }

    /// 403 Forbidden.
    pub fn forbidden(res: Res, name: &str, inner: impl std::fmt::Display) -> Self {
        Self {
            code: 403,
            reason: "Forbidden",
            message: format!(
                "{}.kubevirt.io \"{name}\" is forbidden: {inner}",
                res.as_str()
            ),
            details: Some((res, name.to_owned())),
            plain: false,
        }
    }

    /// 404 Not Found.
    pub fn not_found(res: Res, name: &str) -> Self {
        Self {
            code: 404,
            reason: "NotFound",
            message: format!("{}.kubevirt.io \"{name}\" not found", res.as_str()),
            details: Some((res, name.to_owned())),
            plain: false,
        }
    }

    /// 500 Internal Server Error.
    pub fn internal(inner: impl std::fmt::Display) -> Self {
        Self {
            code: 500,
            reason: "InternalError",
            message: format!("Internal error occurred: {inner}"),
            details: None,
            plain: false,
        }
    }

    /// 400 Bad Request with a verbatim message.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            code: 400,
            reason: "BadRequest",
            message: message.into(),
            details: None,
            plain: false,
        }
    }

    /// A plain-text answer with `code` (the guest-agent endpoints answer so).
    pub fn plain(code: u16, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: "InternalError",
            message: message.into(),
            details: None,
            plain: true,
        }
    }

    /// A body that does not decode into the options struct.
    pub fn undecodable(err: impl std::fmt::Display) -> Self {
        Self::bad_request(format!(
            "Can not unmarshal Request body to struct, error: {err}"
        ))
    }

    /// Maps a failed API call: NotFound → 404 of `res`/`name`, an API server's own error
    /// status is passed through, anything else → 500.
    pub fn from_kube(res: Res, name: &str, err: &kube::Error) -> Self {
        match err {
            kube::Error::Api(status) if status.code == 404 => Self::not_found(res, name),
            kube::Error::Api(status) if status.code == 422 || status.code == 409 => Self {
                code: status.code,
                reason: if status.code == 409 {
                    "Conflict"
                } else {
                    "Invalid"
                },
                message: status.message.clone(),
                details: Some((res, name.to_owned())),
                plain: false,
            },
            other => Self::internal(other),
        }
    }

    /// Maps a failed patch of a start/stop/restart request: a failed `test` operation
    /// (somebody changed the VM meanwhile) is a 409, anything else a 500.
    pub fn from_patch(res: Res, name: &str, err: &kube::Error) -> Self {
        match err {
            kube::Error::Api(status)
                if status.code == 422
                    && (status.message.contains("testing value")
                        || status.message.contains("test operation")) =>
            {
                Self::conflict(res, name, &status.message)
            }
            kube::Error::Api(status) if status.code == 404 => Self::not_found(res, name),
            other => Self::internal(other),
        }
    }

    /// The `metav1.Status` object of this error.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some((res, name)) = &self.details {
            status["details"] = json!({"name": name, "group": "kubevirt.io", "kind": res.as_str()});
        }
        status
    }
}

impl IntoResponse for SubError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if self.plain {
            return (code, [("content-type", "text/plain")], self.message).into_response();
        }
        (code, axum::Json(self.status())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflict_message_wraps_the_inner_error_with_the_resource() {
        let e = SubError::conflict(Res::Vm, "testvm", "VM is already running");
        assert_eq!(
            e.message,
            "Operation cannot be fulfilled on virtualmachine.kubevirt.io \"testvm\": VM is already running"
        );
        let s = e.status();
        assert_eq!(s["code"], 409);
        assert_eq!(s["reason"], "Conflict");
        assert_eq!(s["details"]["kind"], "virtualmachine");
    }

    #[test]
    fn forbidden_and_not_found_read_like_upstream() {
        assert_eq!(
            SubError::forbidden(Res::Vmi, "a", "x").message,
            "virtualmachineinstance.kubevirt.io \"a\" is forbidden: x"
        );
        assert_eq!(
            SubError::not_found(Res::Vmi, "a").message,
            "virtualmachineinstance.kubevirt.io \"a\" not found"
        );
        assert_eq!(
            SubError::internal("boom").message,
            "Internal error occurred: boom"
        );
    }
}
