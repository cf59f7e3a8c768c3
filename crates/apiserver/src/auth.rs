//! Authentication: a client certificate signed by our CA (verified during the TLS
//! handshake) or a bearer token from the tokens file. Anonymous requests get 401, except
//! the health and version endpoints, which kube-apiserver also serves to everyone.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::state::ApiState;
use crate::status::ApiError;

/// The authenticated user, inserted into request extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User(pub String);

/// Paths open to anonymous clients.
pub fn is_public(path: &str) -> bool {
    matches!(path, "/healthz" | "/livez" | "/readyz" | "/version")
}

/// The user a request authenticates as, if any.
pub fn authenticate(state: &ApiState, req: &Request) -> Option<User> {
    if req
        .extensions()
        .get::<kubevirt_tls::PeerCertificates>()
        .is_some()
    {
        return Some(User("kubernetes-admin".into()));
    }
    let auth = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let token = auth.strip_prefix("Bearer ")?.trim();
    state.tokens.get(token).map(|u| User(u.clone()))
}

/// Middleware: authenticates or answers 401.
pub async fn require_auth(
    State(state): State<Arc<ApiState>>,
    mut req: Request,
    next: Next,
) -> Response {
    match authenticate(&state, &req) {
        Some(user) => {
            req.extensions_mut().insert(user);
            next.run(req).await
        }
        None if is_public(req.uri().path()) => next.run(req).await,
        None => ApiError::unauthorized().into_response(),
    }
}
