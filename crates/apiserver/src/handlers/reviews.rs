//! `authentication.k8s.io/v1` reviews, answered and never stored:
//! `POST selfsubjectreviews` (who the caller is: `kubectl auth whoami`) and
//! `POST tokenreviews` (whether a token authenticates, and as whom, for the audiences
//! asked).

use serde_json::{Value, json};

use super::common::{Reply, now_rfc3339};
use crate::auth::{User, authenticate_token};
use crate::state::ApiState;
use crate::status::ApiError;

const API_VERSION: &str = "authentication.k8s.io/v1";

/// `UserInfo` as kube renders it (`uid` and `extra` only when set).
pub fn user_info(user: &User) -> Value {
    let mut v = json!({"username": user.name, "groups": user.groups});
    if !user.uid.is_empty() {
        v["uid"] = json!(user.uid);
    }
    if !user.extra.is_empty() {
        v["extra"] = json!(user.extra);
    }
    v
}

/// Answers a create of `plural` (a review resource) by `caller`.
pub fn create(
    state: &ApiState,
    plural: &str,
    caller: &User,
    body: &Value,
) -> Result<Reply, ApiError> {
    let body = match plural {
        "selfsubjectreviews" => self_subject_review(caller),
        "tokenreviews" => token_review(state, body)?,
        _ => return Err(ApiError::no_route()),
    };
    Ok(Reply {
        code: 201,
        body,
        warnings: Vec::new(),
    })
}

fn self_subject_review(caller: &User) -> Value {
    json!({
        "kind": "SelfSubjectReview",
        "apiVersion": API_VERSION,
        "metadata": {"creationTimestamp": now_rfc3339()},
        "status": {"userInfo": user_info(caller)},
    })
}

fn token_review(state: &ApiState, body: &Value) -> Result<Value, ApiError> {
    let spec = &body["spec"];
    let token = spec["token"].as_str().unwrap_or("");
    if token.is_empty() {
        return Err(ApiError::bad_request(
            "token is required for TokenReview in authentication",
        ));
    }
    let asked: Vec<String> = spec["audiences"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let audiences = if asked.is_empty() {
        crate::auth::api_audiences(state)
    } else {
        asked
    };
    let status = match authenticate_token(state, token, &audiences) {
        Some((user, accepted)) => json!({
            "authenticated": true,
            "user": user_info(&user),
            "audiences": accepted,
        }),
        None => json!({"user": {}, "error": "invalid bearer token"}),
    };
    let mut spec = spec.clone();
    if !spec.is_object() {
        spec = json!({});
    }
    Ok(json!({
        "kind": "TokenReview",
        "apiVersion": API_VERSION,
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": status,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_info_leaves_out_an_empty_uid_and_extra() {
        let v = user_info(&User::admin());
        assert_eq!(v["username"], "kubernetes-admin");
        assert_eq!(v["groups"][0], "system:masters");
        assert!(v.get("uid").is_none() && v.get("extra").is_none());
    }

    #[test]
    fn a_token_review_of_garbage_is_unauthenticated_and_of_nothing_a_bad_request() {
        let state = ApiState::new(kubevirt_store::Store::in_memory());
        let r = create(
            &state,
            "tokenreviews",
            &User::admin(),
            &json!({"spec": {"token": "x.y.z"}}),
        )
        .unwrap();
        assert_eq!(r.code, 201);
        assert!(r.body["status"].get("authenticated").is_none());
        assert_eq!(r.body["status"]["error"], "invalid bearer token");
        let e = create(&state, "tokenreviews", &User::admin(), &json!({"spec": {}})).unwrap_err();
        assert_eq!(e.code, 400);
    }
}
