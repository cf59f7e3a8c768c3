//! `GET` a collection: selectors, `limit` + `continue` paging, cluster-wide lists.
//!
//! Records that do not decode are skipped with a warning (see [`decode_listed`]).
//!
//! Caveat: pages after the first are read from the current state, not from the snapshot of
//! the first page (the store keeps no old values); `metadata.resourceVersion` of every page
//! is the first page's.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use super::common::{Reply, decode_listed};
use crate::registry::ResourceInfo;
use crate::selectors::Selectors;
use crate::state::ApiState;
use crate::status::ApiError;

/// The decoded `continue` token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContinueToken {
    /// The last key returned.
    pub key: String,
    /// The revision of the first page.
    pub revision: u64,
}

impl ContinueToken {
    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(json!({"k": self.key, "rv": self.revision}).to_string())
    }

    pub fn decode(token: &str) -> Result<ContinueToken, ApiError> {
        let bad = || ApiError::bad_request("continue key is not valid: ".to_owned() + token);
        let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| bad())?;
        let v: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
        Ok(ContinueToken {
            key: v["k"].as_str().ok_or_else(bad)?.to_owned(),
            revision: v["rv"].as_u64().ok_or_else(bad)?,
        })
    }
}

/// Matching objects, the list revision and the next page's token.
pub fn list_objects(
    state: &ApiState,
    info: &ResourceInfo,
    ns: Option<&str>,
    selectors: &Selectors,
    limit: Option<usize>,
    continue_token: Option<&str>,
) -> Result<(Vec<Value>, u64, Option<String>), ApiError> {
    let prefix = info.list_prefix(ns);
    let token = continue_token.map(ContinueToken::decode).transpose()?;
    if let Some(t) = &token
        && !t.key.starts_with(&prefix)
    {
        return Err(ApiError::bad_request(
            "continue key does not match this list",
        ));
    }
    // Fast path: `metadata.name=x` in one namespace (kubectl wait, get -w NAME).
    if token.is_none()
        && let Some(name) = selectors.fields.pinned_name()
        && (ns.is_some() || !info.namespaced)
    {
        let rev = state.store.current_revision();
        let mut items = Vec::new();
        if let Some(obj) = state
            .store
            .get(&info.key(ns, name))
            .and_then(|r| decode_listed(&r))
            && selectors.matches(&obj)
        {
            items.push(obj);
        }
        return Ok((items, rev, None));
    }
    let mut start_after = token.as_ref().map(|t| t.key.clone());
    let mut revision = token.as_ref().map(|t| t.revision);
    let mut items = Vec::new();
    let batch = limit.map(|l| l.max(64));
    loop {
        let res = state.store.list(&prefix, start_after.as_deref(), batch);
        let revision = *revision.get_or_insert(res.revision);
        let n = res.records.len();
        for (i, r) in res.records.iter().enumerate() {
            let Some(obj) = decode_listed(r) else {
                continue;
            };
            if selectors.matches(&obj) {
                items.push(obj);
                if limit.is_some_and(|l| items.len() >= l) {
                    let more = i + 1 < n || res.more;
                    let next = more.then(|| {
                        ContinueToken {
                            key: r.key.clone(),
                            revision,
                        }
                        .encode()
                    });
                    return Ok((items, revision, next));
                }
            }
        }
        if !res.more || n == 0 {
            return Ok((items, revision, None));
        }
        start_after = res.records.last().map(|r| r.key.clone());
    }
}

/// The `XList` object of a list request.
pub fn list(
    state: &ApiState,
    info: &ResourceInfo,
    ns: Option<&str>,
    selectors: &Selectors,
    limit: Option<usize>,
    continue_token: Option<&str>,
) -> Result<Reply, ApiError> {
    let (items, rev, next) = list_objects(state, info, ns, selectors, limit, continue_token)?;
    let mut meta = json!({"resourceVersion": rev.to_string()});
    if let Some(c) = next {
        meta["continue"] = json!(c);
    }
    Ok(Reply::ok(json!({
        "kind": format!("{}List", info.kind),
        "apiVersion": info.api_version(),
        "metadata": meta,
        "items": items,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip_and_reject_garbage() {
        let t = ContinueToken {
            key: "/registry/core/pods/ns/p".into(),
            revision: 42,
        };
        assert_eq!(ContinueToken::decode(&t.encode()).unwrap(), t);
        assert_eq!(ContinueToken::decode("!!!").unwrap_err().code, 400);
    }
}
