//! Authentication: a client certificate signed by our CA (verified during the TLS
//! handshake; the user is its subject's CN, the groups its O values, as kube's x509
//! authenticator maps them), a service-account token (a JWT of our issuer, see
//! [`crate::serviceaccount`]) or a bearer token from the tokens file. Every authenticated
//! user is also in `system:authenticated`. Anonymous requests get 401, except the health
//! and version endpoints, which kube-apiserver also serves to everyone (as
//! `system:anonymous` in `system:unauthenticated`, then authorized like any request, see
//! [`crate::rbac`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::debug;

use crate::state::ApiState;
use crate::status::ApiError;

/// The group of every authenticated user.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";

/// The user of the admin kubeconfig's client certificate (CN; its O is `system:masters`).
pub const ADMIN_USER: &str = "kubernetes-admin";

/// The user of unauthenticated requests.
pub const ANONYMOUS_USER: &str = "system:anonymous";

/// The group of unauthenticated requests.
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";

/// The authenticated user, inserted into request extensions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct User {
    pub name: String,
    /// Empty for certificates and tokens-file users.
    pub uid: String,
    pub groups: Vec<String>,
    /// Extra attributes (a pod-bound token's pod name and uid, its credential id).
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    /// The user of an unauthenticated request.
    pub fn anonymous() -> User {
        User {
            name: ANONYMOUS_USER.to_owned(),
            groups: vec![UNAUTHENTICATED_GROUP.to_owned()],
            ..User::default()
        }
    }

    /// The user a verified client certificate (DER) names: CN → name, O values →
    /// groups, plus `system:authenticated`; `None` without a CN (kube refuses those too).
    pub fn from_certificate(der: &[u8]) -> Option<User> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = cert.subject();
        let name = subject.iter_common_name().next()?.as_str().ok()?.to_owned();
        if name.is_empty() {
            return None;
        }
        let mut groups: Vec<String> = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok())
            .map(str::to_owned)
            .collect();
        groups.push(AUTHENTICATED_GROUP.to_owned());
        Some(User {
            name,
            groups,
            ..User::default()
        })
    }

    /// The admin kubeconfig's user: `kubernetes-admin` in `system:masters`.
    pub fn admin() -> User {
        User {
            name: ADMIN_USER.to_owned(),
            groups: vec!["system:masters".to_owned(), AUTHENTICATED_GROUP.to_owned()],
            ..User::default()
        }
    }

    /// A user of the tokens file.
    pub fn static_token(name: &str) -> User {
        User {
            name: name.to_owned(),
            groups: vec![AUTHENTICATED_GROUP.to_owned()],
            ..User::default()
        }
    }
}

/// Paths open to anonymous clients.
pub fn is_public(path: &str) -> bool {
    matches!(path, "/healthz" | "/livez" | "/readyz" | "/version")
}

/// The audiences the API server accepts tokens for.
pub fn api_audiences(state: &ApiState) -> Vec<String> {
    match &state.token_issuer {
        Some(i) => i.api_audiences().to_vec(),
        None => vec![crate::serviceaccount::DEFAULT_ISSUER.to_owned()],
    }
}

/// The user a bearer token stands for, and the audiences (of `audiences`) it is valid
/// for: a service-account JWT whose audience meets `audiences`, or a tokens-file token
/// (valid for the API server's own audiences only).
pub fn authenticate_token(
    state: &ApiState,
    token: &str,
    audiences: &[String],
) -> Option<(User, Vec<String>)> {
    let api = api_audiences(state);
    if let Some(name) = state.tokens.get(token) {
        let accepted: Vec<String> = audiences
            .iter()
            .filter(|a| api.contains(a))
            .cloned()
            .collect();
        return (!accepted.is_empty()).then(|| (User::static_token(name), accepted));
    }
    let now = jiff::Timestamp::now().as_second();
    match crate::serviceaccount::authenticator::authenticate(state, token, audiences, now) {
        Ok(found) => Some(found),
        Err(why) => {
            debug!(%why, "bearer token refused");
            None
        }
    }
}

/// The bearer token of a request, if it has one.
pub fn bearer_token(req: &Request) -> Option<&str> {
    let auth = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let token = auth.strip_prefix("Bearer ")?.trim();
    (!token.is_empty()).then_some(token)
}

/// The user a request authenticates as, if any.
pub fn authenticate(state: &ApiState, req: &Request) -> Option<User> {
    if let Some(peer) = req.extensions().get::<kubevirt_tls::PeerCertificates>()
        && let Some(user) = peer.0.first().and_then(|leaf| User::from_certificate(leaf))
    {
        return Some(user);
    }
    let token = bearer_token(req)?;
    authenticate_token(state, token, &api_audiences(state)).map(|(user, _)| user)
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
        None if is_public(req.uri().path()) => {
            req.extensions_mut().insert(User::anonymous());
            next.run(req).await
        }
        None => ApiError::unauthorized().into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(dn: &[(rcgen::DnType, &str)]) -> Vec<u8> {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        for (t, v) in dn {
            p.distinguished_name.push(t.clone(), *v);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        p.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn a_certificate_is_its_common_name_in_its_organizations() {
        use rcgen::DnType::{CommonName, OrganizationName};
        let u = User::from_certificate(&cert(&[
            (CommonName, "system:node:n1"),
            (OrganizationName, "system:nodes"),
        ]))
        .unwrap();
        assert_eq!(u.name, "system:node:n1");
        // (rcgen writes one O per certificate; several O values each become a group.)
        assert_eq!(u.groups, ["system:nodes", "system:authenticated"]);
        assert!(User::from_certificate(&cert(&[(OrganizationName, "x")])).is_none());
        assert!(User::from_certificate(b"not der").is_none());
    }
}
