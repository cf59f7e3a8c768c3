//! Authorization with kube's RBAC semantics, and impersonation.
//!
//! Data flow of every request, after [`crate::auth`] has named its user: [`impersonation`]
//! (the `Impersonate-*` headers, each authorized with the `impersonate` verb, replace the
//! user) → [`attributes::from_request`] (what the request asks, from method, path and
//! query only, so aggregated APIs and unknown resources are covered alike) →
//! [`Authorizer::authorize`] (the RBAC objects of the store, held in memory and kept
//! current by a watch; `system:masters` is always allowed) → 403 `Forbidden` in kube's
//! words, or on to the handlers.
//!
//! [`bootstrap`] creates kube's default roles and bindings at start; the
//! `authorization.k8s.io` reviews (`kubectl auth can-i`) are answered in
//! [`crate::handlers::reviews`] by the same authorizer.
//!
//! [`escalation`] keeps a user from granting, through a Role or a binding, permissions it
//! does not hold (unless it has `escalate` or `bind`).
//!
//! [`aggregation`] writes the aggregated rules into the stored ClusterRoles (the
//! authorizer does not wait for it: it evaluates aggregation itself).

pub mod aggregation;
pub mod attributes;
pub mod authorizer;
pub mod bootstrap;
pub mod escalation;
pub mod impersonation;
pub mod rules;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

pub use attributes::Attributes;
pub use authorizer::{Authorizer, Decision, MASTERS_GROUP};

use crate::auth::User;
use crate::state::ApiState;
use crate::status::ApiError;

/// kube's denial message: `User "u" cannot list resource "pods" in API group "" in the
/// namespace "default"` (or `at the cluster scope`, or `cannot get path "/x"`).
pub fn forbidden_message(user: &str, a: &Attributes) -> String {
    if !a.resource_request {
        return format!("User \"{user}\" cannot {} path \"{}\"", a.verb, a.path);
    }
    let resource = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let scope = if a.namespace.is_empty() {
        "at the cluster scope".to_owned()
    } else {
        format!("in the namespace \"{}\"", a.namespace)
    };
    format!(
        "User \"{user}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
        a.verb, a.api_group
    )
}

/// The 403 Status kube answers a denied request with.
pub fn forbidden(user: &str, a: &Attributes) -> ApiError {
    let group = if a.resource_request {
        a.api_group.as_str()
    } else {
        ""
    };
    let resource = if a.resource_request {
        a.resource.as_str()
    } else {
        ""
    };
    ApiError::forbidden_resource(group, resource, &a.name, &forbidden_message(user, a))
}

/// Middleware: impersonation, then RBAC; a denied request never reaches a handler.
pub async fn authorize(
    State(state): State<Arc<ApiState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let user = req
        .extensions()
        .get::<User>()
        .cloned()
        .unwrap_or_else(User::anonymous);
    let user = match impersonation::impersonate(&state.authorizer, &user, req.headers()) {
        Ok(None) => user,
        Ok(Some(as_user)) => {
            impersonation::strip_headers(req.headers_mut());
            req.extensions_mut().insert(as_user.clone());
            as_user
        }
        Err(e) => return e.into_response(),
    };
    let attrs = attributes::from_request(
        req.method().as_str(),
        req.uri().path(),
        req.uri().query().unwrap_or(""),
    );
    let decision = state.authorizer.authorize(&user, &attrs);
    if !decision.allowed {
        tracing::debug!(user = %user.name, verb = %attrs.verb, resource = %attrs.resource, path = %attrs.path, "forbidden");
        return forbidden(&user.name, &attrs).into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rbac::attributes::from_request;

    #[test]
    fn denials_are_worded_as_kube_words_them() {
        let sa = "system:serviceaccount:default:default";
        let e = forbidden(
            sa,
            &from_request("GET", "/api/v1/namespaces/default/pods", ""),
        );
        assert_eq!(e.code, 403);
        assert_eq!(e.reason, "Forbidden");
        assert_eq!(
            e.message,
            "pods is forbidden: User \"system:serviceaccount:default:default\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""
        );
        let e = forbidden(
            "alice",
            &from_request("GET", "/api/v1/namespaces/d/pods/p/log", ""),
        );
        assert_eq!(
            e.message,
            "pods \"p\" is forbidden: User \"alice\" cannot get resource \"pods/log\" in API group \"\" in the namespace \"d\""
        );
        assert_eq!(
            (e.kind.as_deref(), e.name.as_deref()),
            (Some("pods"), Some("p"))
        );
        let e = forbidden(
            "alice",
            &from_request("GET", "/apis/apps/v1/namespaces", ""),
        );
        assert_eq!(
            e.message,
            "namespaces.apps is forbidden: User \"alice\" cannot list resource \"namespaces\" in API group \"apps\" at the cluster scope"
        );
        let e = forbidden("alice", &from_request("GET", "/metrics", ""));
        assert_eq!(
            e.message,
            "forbidden: User \"alice\" cannot get path \"/metrics\""
        );
    }
}
