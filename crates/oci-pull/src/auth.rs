//! Registry credentials from a `.dockerconfigjson` document (the content of a Secret of type
//! `kubernetes.io/dockerconfigjson`): `{"auths": {"<registry>": {"auth": base64(user:pass)}}}`
//! or `{"username": …, "password": …}` in place of `auth`.
//!
//! Keys are matched as kubelet matches them: the scheme and any path are ignored
//! (`https://127.0.0.1:5000/v2/` is `127.0.0.1:5000`), and Docker Hub's names
//! (`docker.io`, `index.docker.io`, `registry-1.docker.io`, `https://index.docker.io/v1/`)
//! are one registry.

use base64::Engine;
use serde::Deserialize;

/// A user name and password for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub username: String,
    /// The password (or token).
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Why a `.dockerconfigjson` document cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The document is not JSON of the expected shape.
    #[error("the .dockerconfigjson document is not valid")]
    Parse(#[source] serde_json::Error),
    /// The entry of a registry has an `auth` that is not base64 of `user:password`.
    #[error("the auth entry of registry {0:?} is not base64 of user:password")]
    BadAuth(String),
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: std::collections::BTreeMap<String, Entry>,
}

#[derive(Deserialize)]
struct Entry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

const DOCKER_HUB: &[&str] = &["docker.io", "index.docker.io", "registry-1.docker.io"];

fn normalise(key: &str) -> String {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let host = key.split('/').next().unwrap_or(key).to_ascii_lowercase();
    if DOCKER_HUB.contains(&host.as_str()) {
        DOCKER_HUB[0].to_owned()
    } else {
        host
    }
}

/// The credentials for `registry` in the `.dockerconfigjson` document `document`, if any.
///
/// # Errors
/// [`AuthError`] when the document or the matching entry is malformed.
pub fn credentials_for(document: &[u8], registry: &str) -> Result<Option<Credentials>, AuthError> {
    let config: DockerConfig = serde_json::from_slice(document).map_err(AuthError::Parse)?;
    let wanted = normalise(registry);
    let Some((key, entry)) = config.auths.iter().find(|(k, _)| normalise(k) == wanted) else {
        return Ok(None);
    };
    if let Some(auth) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .ok_or_else(|| AuthError::BadAuth(key.clone()))?;
        let (username, password) = decoded
            .split_once(':')
            .ok_or_else(|| AuthError::BadAuth(key.clone()))?;
        return Ok(Some(Credentials {
            username: username.to_owned(),
            password: password.to_owned(),
        }));
    }
    Ok(match (&entry.username, &entry.password) {
        (Some(username), Some(password)) => Some(Credentials {
            username: username.clone(),
            password: password.clone(),
        }),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_auth_entry_decodes_to_user_and_password() {
        let doc = br#"{"auths":{"https://127.0.0.1:5000/v2/":{"auth":"dXNlcjpwYTpzcw=="}}}"#;
        let c = credentials_for(doc, "127.0.0.1:5000").unwrap().unwrap();
        assert_eq!(
            (c.username.as_str(), c.password.as_str()),
            ("user", "pa:ss")
        );
        assert_eq!(credentials_for(doc, "127.0.0.1:5001").unwrap(), None);
    }

    #[test]
    fn username_and_password_fields_work_and_docker_hub_names_are_one_registry() {
        let doc = br#"{"auths":{"https://index.docker.io/v1/":{"username":"u","password":"p"}}}"#;
        let c = credentials_for(doc, "docker.io").unwrap().unwrap();
        assert_eq!(c.username, "u");
        assert!(!format!("{c:?}").contains('p') || !format!("{c:?}").contains("\"p\""));
    }

    #[test]
    fn malformed_documents_are_errors() {
        assert!(matches!(
            credentials_for(b"not json", "x"),
            Err(AuthError::Parse(_))
        ));
        assert!(matches!(
            credentials_for(br#"{"auths":{"x":{"auth":"!!!"}}}"#, "x"),
            Err(AuthError::BadAuth(_))
        ));
    }
}
