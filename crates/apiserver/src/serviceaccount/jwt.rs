//! The service-account token issuer: ES256 (ECDSA P-256, SHA-256) JSON Web Tokens signed
//! with a key the server keeps in its data directory, and their verification.
//!
//! Data flow: the TokenRequest handler builds [`Claims`] and calls [`TokenIssuer::sign`];
//! the authenticator calls [`TokenIssuer::verify`] (signature, issuer, `nbf`, `exp`) and
//! then checks the audience and the bound objects against the store (see
//! [`super::authenticator`]). The public key is published as a JWK set
//! ([`TokenIssuer::jwks`]) under `/openid/v1/jwks`, with the discovery document of
//! [`TokenIssuer::openid_configuration`].
//!
//! Key files under the data directory: [`KEY_FILE`] (PKCS#8 PEM, mode 0600) and
//! [`PUBLIC_KEY_FILE`] (SubjectPublicKeyInfo PEM, 0644), created on first start and
//! reused after that; a key that does not parse is replaced (which invalidates every token
//! issued with it, as rotating kube's `sa.key` does).

use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair as _, UnparsedPublicKey};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::pki::{PkiError, write_atomic};

/// The issuer (`iss`) of our tokens, and the API server's default audience.
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// The signing key, relative to the data directory.
pub const KEY_FILE: &str = "pki/sa.key";

/// The public half of [`KEY_FILE`], relative to the data directory.
pub const PUBLIC_KEY_FILE: &str = "pki/sa.pub";

/// Tolerated clock difference for `nbf` (a token minted by a clock slightly ahead).
const NBF_LEEWAY_SECONDS: i64 = 60;

/// Why a token was not accepted, or could not be made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    /// Not three base64url parts with JSON header and claims.
    #[error("malformed token")]
    Malformed,
    /// The header names an algorithm or key we did not sign with.
    #[error("unexpected signing algorithm or key id")]
    UnexpectedKey,
    /// The signature does not verify with our key.
    #[error("invalid signature")]
    BadSignature,
    /// Another issuer's token.
    #[error("token issued by {0:?}")]
    WrongIssuer(String),
    /// `exp` has passed.
    #[error("token has expired")]
    Expired,
    /// `nbf` is in the future.
    #[error("token is not valid yet")]
    NotYetValid,
    /// Signing failed (should not happen with a valid key).
    #[error("signing the token")]
    Sign,
}

/// A `{name, uid}` reference inside the `kubernetes.io` claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectClaim {
    pub name: String,
    pub uid: String,
}

/// The `kubernetes.io` private claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubernetesClaim {
    pub namespace: String,
    pub serviceaccount: ObjectClaim,
    /// Present when the token is bound to a pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<ObjectClaim>,
    /// Present when the token is bound to a secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<ObjectClaim>,
}

/// The claims of a service-account token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub aud: Vec<String>,
    pub exp: i64,
    pub iat: i64,
    pub iss: String,
    pub jti: String,
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: KubernetesClaim,
    pub nbf: i64,
    pub sub: String,
}

impl Claims {
    /// Claims for service account `namespace/name` (uid `uid`) valid from `now` for
    /// `seconds`, for `audiences`; bound to nothing.
    pub fn new(
        issuer: &str,
        namespace: &str,
        sa: ObjectClaim,
        audiences: Vec<String>,
        now: i64,
        seconds: i64,
    ) -> Claims {
        Claims {
            aud: audiences,
            exp: now + seconds,
            iat: now,
            iss: issuer.to_owned(),
            jti: uuid::Uuid::new_v4().to_string(),
            sub: subject(namespace, &sa.name),
            kubernetes: KubernetesClaim {
                namespace: namespace.to_owned(),
                serviceaccount: sa,
                pod: None,
                secret: None,
            },
            nbf: now,
        }
    }
}

/// `system:serviceaccount:<namespace>:<name>`.
pub fn subject(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// Signs and verifies service-account tokens with one P-256 key.
#[derive(Debug)]
pub struct TokenIssuer {
    key: EcdsaKeyPair,
    /// SubjectPublicKeyInfo DER of the public key.
    public_der: Vec<u8>,
    kid: String,
    issuer: String,
    api_audiences: Vec<String>,
}

fn key_error(what: &'static str) -> impl FnOnce(rcgen::Error) -> PkiError {
    move |source| PkiError::Cert { what, source }
}

impl TokenIssuer {
    /// An issuer with a fresh key that is kept nowhere (unit tests, states without a data
    /// directory).
    pub fn ephemeral() -> Result<TokenIssuer, PkiError> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(key_error("service-account signing key"))?;
        TokenIssuer::from_key(&key)
    }

    /// Loads the key from `data_dir` ([`KEY_FILE`]), creating it (and [`PUBLIC_KEY_FILE`])
    /// when absent or unreadable.
    pub fn load_or_create(data_dir: &Path) -> Result<TokenIssuer, PkiError> {
        let path = data_dir.join(KEY_FILE);
        let stored = std::fs::read_to_string(&path)
            .ok()
            .and_then(|pem| rcgen::KeyPair::from_pem(&pem).ok())
            .and_then(|k| TokenIssuer::from_key(&k).ok().map(|i| (k, i)));
        if let Some((_, issuer)) = stored {
            return Ok(issuer);
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| PkiError::Io {
                path: dir.to_owned(),
                source,
            })?;
        }
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(key_error("service-account signing key"))?;
        let issuer = TokenIssuer::from_key(&key)?;
        write_atomic(&path, key.serialize_pem().as_bytes(), true)?;
        write_atomic(
            &data_dir.join(PUBLIC_KEY_FILE),
            public_pem(&issuer.public_der).as_bytes(),
            false,
        )?;
        Ok(issuer)
    }

    fn from_key(key: &rcgen::KeyPair) -> Result<TokenIssuer, PkiError> {
        let rng = SystemRandom::new();
        let ring_key = EcdsaKeyPair::from_pkcs8(
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &key.serialize_der(),
            &rng,
        )
        .map_err(|_| PkiError::Cert {
            what: "service-account signing key (not a P-256 key)",
            source: rcgen::Error::CouldNotParseKeyPair,
        })?;
        let public_der = rcgen::PublicKeyData::subject_public_key_info(key);
        let kid = URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, &public_der));
        Ok(TokenIssuer {
            key: ring_key,
            public_der,
            kid,
            issuer: DEFAULT_ISSUER.to_owned(),
            api_audiences: vec![DEFAULT_ISSUER.to_owned()],
        })
    }

    /// The `iss` of the tokens this issuer signs.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The audiences the API server itself accepts (a token must name one of them).
    pub fn api_audiences(&self) -> &[String] {
        &self.api_audiences
    }

    /// The key id (`kid`): the base64url SHA-256 of the public key's DER.
    pub fn key_id(&self) -> &str {
        &self.kid
    }

    /// The compact serialization of `claims`, signed.
    pub fn sign(&self, claims: &Claims) -> Result<String, TokenError> {
        let header = json!({"alg": "ES256", "kid": self.kid});
        let payload = serde_json::to_vec(claims).map_err(|_| TokenError::Sign)?;
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(payload)
        );
        let sig = self
            .key
            .sign(&SystemRandom::new(), signing_input.as_bytes())
            .map_err(|_| TokenError::Sign)?;
        Ok(format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(sig.as_ref())
        ))
    }

    /// The claims of `token` if it carries our signature and issuer and is valid at `now`
    /// (Unix seconds). The audience and the bound objects are the caller's to check.
    pub fn verify(&self, token: &str, now: i64) -> Result<Claims, TokenError> {
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        let decode = |part: &str| {
            URL_SAFE_NO_PAD
                .decode(part)
                .map_err(|_| TokenError::Malformed)
        };
        let header: Value =
            serde_json::from_slice(&decode(h)?).map_err(|_| TokenError::Malformed)?;
        if header["alg"] != "ES256" || header["kid"].as_str().is_some_and(|k| k != self.kid) {
            return Err(TokenError::UnexpectedKey);
        }
        let public = UnparsedPublicKey::new(
            &signature::ECDSA_P256_SHA256_FIXED,
            self.key.public_key().as_ref(),
        );
        let signing_input = &token[..h.len() + 1 + p.len()];
        public
            .verify(signing_input.as_bytes(), &decode(s)?)
            .map_err(|_| TokenError::BadSignature)?;
        let claims: Claims =
            serde_json::from_slice(&decode(p)?).map_err(|_| TokenError::Malformed)?;
        if claims.iss != self.issuer {
            return Err(TokenError::WrongIssuer(claims.iss));
        }
        if claims.exp <= now {
            return Err(TokenError::Expired);
        }
        if claims.nbf > now + NBF_LEEWAY_SECONDS {
            return Err(TokenError::NotYetValid);
        }
        Ok(claims)
    }

    /// The public key as a JWK set (`/openid/v1/jwks`).
    pub fn jwks(&self) -> Value {
        // Uncompressed point: 0x04 ‖ x (32 bytes) ‖ y (32 bytes).
        let point = self.key.public_key().as_ref();
        let (x, y) = point[1..].split_at(32);
        json!({"keys": [{
            "use": "sig",
            "kty": "EC",
            "kid": self.kid,
            "crv": "P-256",
            "alg": "ES256",
            "x": URL_SAFE_NO_PAD.encode(x),
            "y": URL_SAFE_NO_PAD.encode(y),
        }]})
    }

    /// The OpenID discovery document (`/.well-known/openid-configuration`).
    pub fn openid_configuration(&self) -> Value {
        json!({
            "issuer": self.issuer,
            "jwks_uri": format!("{}/openid/v1/jwks", self.issuer),
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"],
        })
    }
}

/// PEM of a SubjectPublicKeyInfo DER.
fn public_pem(der: &[u8]) -> String {
    let b64 = STANDARD.encode(der);
    let mut out = String::from("-----BEGIN PUBLIC KEY-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str("-----END PUBLIC KEY-----\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(issuer: &TokenIssuer, now: i64, seconds: i64) -> Claims {
        Claims::new(
            issuer.issuer(),
            "ns",
            ObjectClaim {
                name: "default".into(),
                uid: "u1".into(),
            },
            vec![DEFAULT_ISSUER.into()],
            now,
            seconds,
        )
    }

    #[test]
    fn a_signed_token_verifies_to_its_claims() {
        let issuer = TokenIssuer::ephemeral().unwrap();
        let c = claims(&issuer, 1_000, 3600);
        let token = issuer.sign(&c).unwrap();
        assert_eq!(token.split('.').count(), 3);
        assert_eq!(issuer.verify(&token, 1_001).unwrap(), c);
        assert_eq!(c.sub, "system:serviceaccount:ns:default");
        let payload: Value = serde_json::from_slice(
            &URL_SAFE_NO_PAD
                .decode(token.split('.').nth(1).unwrap())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(payload["kubernetes.io"]["serviceaccount"]["uid"], "u1");
        assert!(payload["kubernetes.io"].get("pod").is_none());
    }

    #[test]
    fn an_expired_token_is_refused() {
        let issuer = TokenIssuer::ephemeral().unwrap();
        let token = issuer.sign(&claims(&issuer, 1_000, 600)).unwrap();
        assert_eq!(issuer.verify(&token, 1_600), Err(TokenError::Expired));
        assert_eq!(issuer.verify(&token, 5_000), Err(TokenError::Expired));
    }

    #[test]
    fn a_token_from_the_future_is_refused() {
        let issuer = TokenIssuer::ephemeral().unwrap();
        let token = issuer.sign(&claims(&issuer, 10_000, 600)).unwrap();
        assert_eq!(issuer.verify(&token, 1_000), Err(TokenError::NotYetValid));
    }

    #[test]
    fn another_keys_signature_or_a_tampered_payload_is_refused() {
        let ours = TokenIssuer::ephemeral().unwrap();
        let theirs = TokenIssuer::ephemeral().unwrap();
        let token = theirs.sign(&claims(&theirs, 1_000, 3600)).unwrap();
        assert_eq!(ours.verify(&token, 1_001), Err(TokenError::UnexpectedKey));
        // Same kid, other signature.
        let mine = ours.sign(&claims(&ours, 1_000, 3600)).unwrap();
        let forged = format!(
            "{}.{}",
            mine.rsplit_once('.').unwrap().0,
            token.rsplit_once('.').unwrap().1
        );
        assert_eq!(ours.verify(&forged, 1_001), Err(TokenError::BadSignature));
        // Other claims under our signature.
        let mut c = claims(&ours, 1_000, 3600);
        c.sub = "system:serviceaccount:kube-system:admin".into();
        let parts: Vec<&str> = mine.split('.').collect();
        let tampered = format!(
            "{}.{}.{}",
            parts[0],
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&c).unwrap()),
            parts[2]
        );
        assert_eq!(ours.verify(&tampered, 1_001), Err(TokenError::BadSignature));
        assert_eq!(ours.verify("a.b", 1_001), Err(TokenError::Malformed));
        assert_eq!(
            ours.verify("static-token", 1_001),
            Err(TokenError::Malformed)
        );
    }

    #[test]
    fn another_issuers_claims_are_refused() {
        let issuer = TokenIssuer::ephemeral().unwrap();
        let mut c = claims(&issuer, 1_000, 3600);
        c.iss = "https://elsewhere".into();
        let token = issuer.sign(&c).unwrap();
        assert!(matches!(
            issuer.verify(&token, 1_001),
            Err(TokenError::WrongIssuer(_))
        ));
    }

    #[cfg(unix)]
    #[test]
    fn the_key_is_kept_owner_only_and_reused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let first = TokenIssuer::load_or_create(dir.path()).unwrap();
        let mode = |p: &str| {
            std::fs::metadata(dir.path().join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode(KEY_FILE), 0o600);
        assert_eq!(mode(PUBLIC_KEY_FILE), 0o644);
        let token = first.sign(&claims(&first, 1_000, 3600)).unwrap();
        let second = TokenIssuer::load_or_create(dir.path()).unwrap();
        assert_eq!(first.key_id(), second.key_id());
        assert!(second.verify(&token, 1_001).is_ok());
    }

    #[test]
    fn the_jwks_carries_the_p256_public_point() {
        let issuer = TokenIssuer::ephemeral().unwrap();
        let jwks = issuer.jwks();
        let k = &jwks["keys"][0];
        assert_eq!(k["kid"], issuer.key_id());
        assert_eq!(k["crv"], "P-256");
        let x = URL_SAFE_NO_PAD.decode(k["x"].as_str().unwrap()).unwrap();
        assert_eq!(x.len(), 32);
        assert_eq!(
            issuer.openid_configuration()["jwks_uri"],
            format!("{DEFAULT_ISSUER}/openid/v1/jwks")
        );
    }
}
