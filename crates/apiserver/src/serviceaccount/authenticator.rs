//! Authentication of service-account tokens: a verified JWT ([`super::jwt`]) whose audience
//! meets the wanted audiences and whose service account (and bound pod or secret) still
//! exists with the uid the token names.
//!
//! # Guarantees
//! - A token stops authenticating as soon as its service account, or the pod or secret it
//!   is bound to, is deleted or replaced by an object of the same name and another uid:
//!   every request reads the current objects from the store (no cache to go stale).
//!
//! # Caveats
//! - An object in graceful deletion (with a `deletionTimestamp`) still counts as existing,
//!   so a terminating pod keeps talking to the API until it is gone.
//! - Legacy Secret-based tokens (`kubernetes.io/service-account-token` Secrets) are not
//!   issued or accepted.

use std::collections::BTreeMap;

use serde_json::Value;

use super::jwt::{Claims, ObjectClaim, TokenError};
use crate::auth::User;
use crate::handlers::common::decode_record;
use crate::state::ApiState;

/// `authentication.kubernetes.io/…` keys of [`User::extra`], as kube sets them.
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
pub const EXTRA_CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";

/// Why a well-formed request's token did not authenticate.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Rejection {
    /// The token itself is not valid (see [`TokenError`]).
    #[error(transparent)]
    Token(#[from] TokenError),
    /// The token names none of the wanted audiences.
    #[error("token audiences {0:?} are invalid for the target audiences")]
    Audience(Vec<String>),
    /// The named object is gone.
    #[error("{kind} {namespace}/{name} has been deleted")]
    Deleted {
        kind: &'static str,
        namespace: String,
        name: String,
    },
    /// The named object exists with another uid (deleted and created again).
    #[error("{kind} {namespace}/{name} has been recreated (uid {found}, token names {wanted})")]
    Replaced {
        kind: &'static str,
        namespace: String,
        name: String,
        found: String,
        wanted: String,
    },
}

/// The user of a valid service-account token and the audiences it was accepted for
/// (the token's audiences that are among `audiences`).
pub fn authenticate(
    state: &ApiState,
    token: &str,
    audiences: &[String],
    now: i64,
) -> Result<(User, Vec<String>), Rejection> {
    let Some(issuer) = state.token_issuer.as_deref() else {
        return Err(Rejection::Token(TokenError::UnexpectedKey));
    };
    let claims = issuer.verify(token, now)?;
    let accepted: Vec<String> = claims
        .aud
        .iter()
        .filter(|a| audiences.contains(a))
        .cloned()
        .collect();
    if accepted.is_empty() {
        return Err(Rejection::Audience(claims.aud));
    }
    let user = validate_bindings(state, &claims)?;
    Ok((user, accepted))
}

/// Checks that the service account and the bound objects of `claims` still exist with
/// their uids; the user the token stands for.
pub fn validate_bindings(state: &ApiState, claims: &Claims) -> Result<User, Rejection> {
    let k = &claims.kubernetes;
    let ns = k.namespace.as_str();
    check(
        state,
        "serviceaccounts",
        "ServiceAccount",
        ns,
        &k.serviceaccount,
    )?;
    if let Some(pod) = &k.pod {
        check(state, "pods", "Pod", ns, pod)?;
    }
    if let Some(secret) = &k.secret {
        check(state, "secrets", "Secret", ns, secret)?;
    }
    let mut extra = BTreeMap::new();
    if let Some(pod) = &k.pod {
        extra.insert(EXTRA_POD_NAME.to_owned(), vec![pod.name.clone()]);
        extra.insert(EXTRA_POD_UID.to_owned(), vec![pod.uid.clone()]);
    }
    extra.insert(
        EXTRA_CREDENTIAL_ID.to_owned(),
        vec![format!("JTI={}", claims.jti)],
    );
    Ok(User {
        name: super::jwt::subject(ns, &k.serviceaccount.name),
        uid: k.serviceaccount.uid.clone(),
        groups: vec![
            "system:serviceaccounts".to_owned(),
            format!("system:serviceaccounts:{ns}"),
            crate::auth::AUTHENTICATED_GROUP.to_owned(),
        ],
        extra,
    })
}

fn check(
    state: &ApiState,
    plural: &str,
    kind: &'static str,
    namespace: &str,
    want: &ObjectClaim,
) -> Result<(), Rejection> {
    let found = current_uid(state, plural, namespace, &want.name);
    match found {
        None => Err(Rejection::Deleted {
            kind,
            namespace: namespace.to_owned(),
            name: want.name.clone(),
        }),
        Some(uid) if uid != want.uid => Err(Rejection::Replaced {
            kind,
            namespace: namespace.to_owned(),
            name: want.name.clone(),
            found: uid,
            wanted: want.uid.clone(),
        }),
        Some(_) => Ok(()),
    }
}

/// The uid of core object `plural` `namespace/name`, if it exists.
pub fn current_uid(state: &ApiState, plural: &str, namespace: &str, name: &str) -> Option<String> {
    let info = state.registry.find("", "v1", plural)?;
    let record = state.store.get(&info.key(Some(namespace), name))?;
    let obj: Value = decode_record(&record).ok()?;
    Some(obj["metadata"]["uid"].as_str().unwrap_or("").to_owned())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kubevirt_store::Store;
    use serde_json::json;

    use super::*;
    use crate::handlers::common::encoder;
    use crate::serviceaccount::jwt::{DEFAULT_ISSUER, TokenIssuer};

    const NOW: i64 = 1_700_000_000;

    fn state() -> ApiState {
        let mut s = ApiState::new(Store::in_memory());
        s.token_issuer = Some(Arc::new(TokenIssuer::ephemeral().unwrap()));
        s
    }

    async fn put(state: &ApiState, plural: &str, name: &str, uid: &str) {
        let key = state
            .registry
            .find("", "v1", plural)
            .unwrap()
            .key(Some("ns"), name);
        let obj = json!({"metadata": {"name": name, "namespace": "ns", "uid": uid}});
        match state.store.get(&key) {
            Some(r) => state.store.update(&key, r.revision, encoder(obj)).await,
            None => state.store.create(&key, encoder(obj)).await,
        }
        .unwrap();
    }

    async fn delete(state: &ApiState, plural: &str, name: &str) {
        let key = state
            .registry
            .find("", "v1", plural)
            .unwrap()
            .key(Some("ns"), name);
        let rev = state.store.get(&key).unwrap().revision;
        state.store.delete(&key, Some(rev)).await.unwrap();
    }

    fn token(state: &ApiState, pod: Option<(&str, &str)>, aud: &[&str]) -> String {
        let issuer = state.token_issuer.as_deref().unwrap();
        let mut c = Claims::new(
            issuer.issuer(),
            "ns",
            ObjectClaim {
                name: "default".into(),
                uid: "sa-1".into(),
            },
            aud.iter().map(|a| (*a).to_owned()).collect(),
            NOW,
            3600,
        );
        c.kubernetes.pod = pod.map(|(name, uid)| ObjectClaim {
            name: name.into(),
            uid: uid.into(),
        });
        issuer.sign(&c).unwrap()
    }

    fn api() -> Vec<String> {
        vec![DEFAULT_ISSUER.to_owned()]
    }

    #[tokio::test]
    async fn a_valid_token_authenticates_as_its_service_account() {
        let s = state();
        put(&s, "serviceaccounts", "default", "sa-1").await;
        let (user, aud) =
            authenticate(&s, &token(&s, None, &[DEFAULT_ISSUER]), &api(), NOW + 1).unwrap();
        assert_eq!(user.name, "system:serviceaccount:ns:default");
        assert_eq!(user.uid, "sa-1");
        assert_eq!(
            user.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:ns",
                "system:authenticated"
            ]
        );
        assert_eq!(aud, api());
    }

    #[tokio::test]
    async fn a_token_for_another_audience_is_refused() {
        let s = state();
        put(&s, "serviceaccounts", "default", "sa-1").await;
        let t = token(&s, None, &["vault"]);
        assert_eq!(
            authenticate(&s, &t, &api(), NOW + 1).unwrap_err(),
            Rejection::Audience(vec!["vault".into()])
        );
        let (_, aud) = authenticate(&s, &t, &["vault".into()], NOW + 1).unwrap();
        assert_eq!(aud, ["vault"]);
    }

    #[tokio::test]
    async fn an_expired_token_is_refused() {
        let s = state();
        put(&s, "serviceaccounts", "default", "sa-1").await;
        let t = token(&s, None, &[DEFAULT_ISSUER]);
        assert_eq!(
            authenticate(&s, &t, &api(), NOW + 3600).unwrap_err(),
            Rejection::Token(TokenError::Expired)
        );
    }

    #[tokio::test]
    async fn a_deleted_service_accounts_token_is_refused() {
        let s = state();
        put(&s, "serviceaccounts", "default", "sa-1").await;
        let t = token(&s, None, &[DEFAULT_ISSUER]);
        delete(&s, "serviceaccounts", "default").await;
        assert!(matches!(
            authenticate(&s, &t, &api(), NOW + 1),
            Err(Rejection::Deleted {
                kind: "ServiceAccount",
                ..
            })
        ));
    }

    #[tokio::test]
    async fn a_recreated_service_account_does_not_inherit_old_tokens() {
        let s = state();
        put(&s, "serviceaccounts", "default", "sa-1").await;
        let t = token(&s, None, &[DEFAULT_ISSUER]);
        put(&s, "serviceaccounts", "default", "sa-2").await;
        assert!(matches!(
            authenticate(&s, &t, &api(), NOW + 1),
            Err(Rejection::Replaced {
                kind: "ServiceAccount",
                ..
            })
        ));
    }

    #[tokio::test]
    async fn a_pod_bound_token_lives_as_long_as_its_pod() {
        let s = state();
        put(&s, "serviceaccounts", "default", "sa-1").await;
        put(&s, "pods", "p", "pod-1").await;
        let t = token(&s, Some(("p", "pod-1")), &[DEFAULT_ISSUER]);
        let (user, _) = authenticate(&s, &t, &api(), NOW + 1).unwrap();
        assert_eq!(user.extra[EXTRA_POD_NAME], ["p"]);
        assert_eq!(user.extra[EXTRA_POD_UID], ["pod-1"]);
        put(&s, "pods", "p", "pod-2").await;
        assert!(matches!(
            authenticate(&s, &t, &api(), NOW + 1),
            Err(Rejection::Replaced { kind: "Pod", .. })
        ));
        delete(&s, "pods", "p").await;
        assert!(matches!(
            authenticate(&s, &t, &api(), NOW + 1),
            Err(Rejection::Deleted { kind: "Pod", .. })
        ));
    }
}
