//! Service-account tokens of projected volumes, as kubelet's token manager keeps them.
//!
//! A token is requested through the TokenRequest API
//! (`POST serviceaccounts/{name}/token`) for the pod's service account, with the source's
//! `audience` and `expirationSeconds` (default 3600), bound to the pod (`boundObjectRef`), so
//! it stops being valid when the pod is deleted. It is kept in memory and requested again
//! once 80% of its lifetime has passed (or after 24 hours, whichever comes first), as kubelet
//! does; the volume's next resync then writes the new token atomically.
//!
//! # Caveats
//! The cache is in memory: after a restart of the node agent every pod gets a fresh token on
//! its first pass, which is harmless (the old one stays valid until it expires).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount, ServiceAccountTokenProjection};
use kube::api::{Api, PostParams};

/// kubelet's default lifetime of a projected token.
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;

/// A token older than this is renewed whatever its lifetime.
const MAX_TOKEN_AGE: Duration = Duration::from_secs(24 * 3600);

/// Why a token could not be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The TokenRequest failed.
    #[error("requesting a token for service account {namespace}/{name}")]
    Request {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// The TokenRequest answered without a token.
    #[error("the TokenRequest for service account {namespace}/{name} returned no token")]
    Empty { namespace: String, name: String },
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    pod_uid: String,
    service_account: String,
    audience: String,
    expiration_seconds: i64,
}

#[derive(Clone, Debug)]
struct Cached {
    token: String,
    refresh_at: Instant,
}

/// Tokens by pod, account, audience and lifetime.
#[derive(Debug, Default)]
pub struct TokenCache {
    tokens: BTreeMap<Key, Cached>,
}

/// The pod's service account (`default` when the spec names none).
pub fn service_account_name(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| {
            s.service_account_name
                .clone()
                .or_else(|| s.service_account.clone())
        })
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".to_owned())
}

/// When a token of `lifetime` issued now is due for renewal: after 80% of it, at most
/// [`MAX_TOKEN_AGE`].
pub fn refresh_after(lifetime: Duration) -> Duration {
    (lifetime * 4 / 5).min(MAX_TOKEN_AGE)
}

impl TokenCache {
    /// A valid token for `source` of `pod`: the cached one until it is due, else a new one.
    ///
    /// # Errors
    /// [`TokenError`] when the API refuses the TokenRequest (the account does not exist yet,
    /// say); the caller retries on its next pass.
    pub async fn token(
        &mut self,
        client: &kube::Client,
        pod: &Pod,
        source: &ServiceAccountTokenProjection,
    ) -> Result<String, TokenError> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = service_account_name(pod);
        let expiration_seconds = source
            .expiration_seconds
            .unwrap_or(DEFAULT_EXPIRATION_SECONDS);
        let key = Key {
            pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
            service_account: name.clone(),
            audience: source.audience.clone().unwrap_or_default(),
            expiration_seconds,
        };
        if let Some(cached) = self.tokens.get(&key)
            && Instant::now() < cached.refresh_at
        {
            return Ok(cached.token.clone());
        }
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: if key.audience.is_empty() {
                    vec![]
                } else {
                    vec![key.audience.clone()]
                },
                expiration_seconds: Some(expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
            },
            ..TokenRequest::default()
        };
        let issued = Instant::now();
        let answer: TokenRequest = Api::<ServiceAccount>::namespaced(client.clone(), &namespace)
            .create_subresource("token", &name, &PostParams::default(), &request)
            .await
            .map_err(|source| TokenError::Request {
                namespace: namespace.clone(),
                name: name.clone(),
                source,
            })?;
        let status = answer
            .status
            .filter(|s| !s.token.is_empty())
            .ok_or_else(|| TokenError::Empty {
                namespace: namespace.clone(),
                name: name.clone(),
            })?;
        // The lifetime the server granted, when it says; else the one asked for.
        let requested = Duration::from_secs(u64::try_from(expiration_seconds).unwrap_or(0));
        let left = status
            .expiration_timestamp
            .0
            .duration_since(jiff::Timestamp::now());
        let granted = Duration::try_from(left).unwrap_or(requested);
        self.tokens.insert(
            key,
            Cached {
                token: status.token.clone(),
                refresh_at: issued + refresh_after(granted),
            },
        );
        Ok(status.token)
    }

    /// Drops the tokens of pods no longer known (by uid).
    pub fn forget(&mut self, known: &BTreeSet<String>) {
        self.tokens.retain(|k, _| known.contains(&k.pod_uid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_renewed_after_eighty_percent_of_their_lifetime() {
        assert_eq!(
            refresh_after(Duration::from_secs(3600)),
            Duration::from_secs(2880)
        );
        assert_eq!(
            refresh_after(Duration::from_secs(365 * 24 * 3600)),
            MAX_TOKEN_AGE
        );
    }

    #[test]
    fn the_default_account_is_used_when_the_spec_names_none() {
        let pod: Pod =
            serde_json::from_value(serde_json::json!({"spec": {"containers": []}})).expect("pod");
        assert_eq!(service_account_name(&pod), "default");
        let named: Pod = serde_json::from_value(
            serde_json::json!({"spec": {"containers": [], "serviceAccountName": "robot"}}),
        )
        .expect("pod");
        assert_eq!(service_account_name(&named), "robot");
    }
}
