//! Reviews, answered and never stored. `authentication.k8s.io/v1`:
//! `POST selfsubjectreviews` (who the caller is: `kubectl auth whoami`) and
//! `POST tokenreviews` (whether a token authenticates, and as whom, for the audiences
//! asked). `authorization.k8s.io/v1` (see [`crate::rbac`]): `subjectaccessreviews` and
//! `localsubjectaccessreviews` (may a given user do this), `selfsubjectaccessreviews`
//! (may I: `kubectl auth can-i`) and `selfsubjectrulesreviews` (what may I do in a
//! namespace: `kubectl auth can-i --list`).

use serde_json::{Value, json};

use super::common::{Reply, now_rfc3339};
use crate::auth::{User, authenticate_token};
use crate::cause::Cause;
use crate::rbac::Attributes;
use crate::state::ApiState;
use crate::status::ApiError;

const API_VERSION: &str = "authentication.k8s.io/v1";
const AUTHZ_GROUP: &str = "authorization.k8s.io";
const AUTHZ_VERSION: &str = "authorization.k8s.io/v1";

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

/// Answers a create of `plural` (a review resource, in `namespace` for the local one) by
/// `caller`.
pub fn create(
    state: &ApiState,
    plural: &str,
    namespace: Option<&str>,
    caller: &User,
    body: &Value,
) -> Result<Reply, ApiError> {
    let body = match plural {
        "selfsubjectreviews" => self_subject_review(caller),
        "tokenreviews" => token_review(state, body)?,
        "subjectaccessreviews" => access_review(state, "SubjectAccessReview", None, body, None)?,
        "localsubjectaccessreviews" => access_review(
            state,
            "LocalSubjectAccessReview",
            None,
            body,
            Some(namespace.unwrap_or("")),
        )?,
        "selfsubjectaccessreviews" => {
            access_review(state, "SelfSubjectAccessReview", Some(caller), body, None)?
        }
        "selfsubjectrulesreviews" => rules_review(state, caller, body)?,
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

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

fn invalid(kind: &str, field: &str, value: &Value, why: &str) -> ApiError {
    let shown = if value.is_null() {
        "null".to_owned()
    } else {
        value.to_string()
    };
    ApiError::invalid(
        AUTHZ_GROUP,
        kind,
        "",
        vec![Cause::new(
            "FieldValueInvalid",
            field,
            format!("Invalid value: {shown}: {why}"),
        )],
    )
}

/// The request attributes a review's `spec` describes (exactly one of
/// `resourceAttributes` and `nonResourceAttributes`).
fn review_attributes(kind: &str, spec: &Value) -> Result<Attributes, ApiError> {
    let (res, non) = (&spec["resourceAttributes"], &spec["nonResourceAttributes"]);
    let s = |v: &Value, k: &str| v[k].as_str().unwrap_or("").to_owned();
    match (res.is_object(), non.is_object()) {
        (true, true) => Err(invalid(
            kind,
            "spec.nonResourceAttributes",
            non,
            "cannot be specified in combination with resourceAttributes",
        )),
        (false, false) => Err(invalid(
            kind,
            "spec.resourceAttributes",
            res,
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )),
        (true, false) => Ok(Attributes {
            verb: s(res, "verb"),
            resource_request: true,
            namespace: s(res, "namespace"),
            api_group: s(res, "group"),
            api_version: s(res, "version"),
            resource: s(res, "resource"),
            subresource: s(res, "subresource"),
            name: s(res, "name"),
            path: String::new(),
        }),
        (false, true) => Ok(Attributes::non_resource(&s(non, "verb"), &s(non, "path"))),
    }
}

/// The user a (Local)SubjectAccessReview's `spec` names.
fn spec_user(kind: &str, spec: &Value) -> Result<User, ApiError> {
    let name = spec["user"].as_str().unwrap_or("").to_owned();
    let groups = strings(&spec["groups"]);
    if name.is_empty() && groups.is_empty() {
        return Err(invalid(
            kind,
            "spec.user",
            &json!(""),
            "at least one of user or group must be specified",
        ));
    }
    let extra = spec["extra"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), strings(v))).collect())
        .unwrap_or_default();
    Ok(User {
        name,
        uid: spec["uid"].as_str().unwrap_or("").to_owned(),
        groups,
        extra,
    })
}

/// A (Local/Self)SubjectAccessReview: the spec as sent, the decision as `status`. A
/// self review asks for `caller` (and gets `user`/`groups` left out of its spec); a
/// local one (`local_ns`) must name its own namespace and a resource.
fn access_review(
    state: &ApiState,
    kind: &str,
    caller: Option<&User>,
    body: &Value,
    local_ns: Option<&str>,
) -> Result<Value, ApiError> {
    let spec = if body["spec"].is_object() {
        body["spec"].clone()
    } else {
        json!({})
    };
    let attrs = review_attributes(kind, &spec)?;
    if let Some(ns) = local_ns {
        if !attrs.resource_request {
            return Err(invalid(
                kind,
                "spec.nonResourceAttributes",
                &spec["nonResourceAttributes"],
                "disallowed on this kind of request",
            ));
        }
        if attrs.namespace != ns {
            return Err(invalid(
                kind,
                "spec.resourceAttributes.namespace",
                &json!(attrs.namespace),
                "must match metadata.namespace",
            ));
        }
    }
    let user = match caller {
        Some(c) => c.clone(),
        None => spec_user(kind, &spec)?,
    };
    let decision = state.authorizer.authorize(&user, &attrs);
    let mut status = json!({"allowed": decision.allowed});
    if !decision.reason.is_empty() {
        status["reason"] = json!(decision.reason);
    }
    let mut metadata = json!({"creationTimestamp": null});
    if let Some(ns) = local_ns {
        metadata["namespace"] = json!(ns);
    }
    Ok(json!({
        "kind": kind,
        "apiVersion": AUTHZ_VERSION,
        "metadata": metadata,
        "spec": spec,
        "status": status,
    }))
}

/// A SelfSubjectRulesReview: the caller's rules in `spec.namespace`, as kube lists them.
fn rules_review(state: &ApiState, caller: &User, body: &Value) -> Result<Value, ApiError> {
    let spec = if body["spec"].is_object() {
        body["spec"].clone()
    } else {
        json!({})
    };
    let namespace = spec["namespace"].as_str().unwrap_or("");
    let rules = state.authorizer.rules_for(caller, namespace);
    let (mut resource_rules, mut non_resource_rules) = (Vec::new(), Vec::new());
    for r in rules {
        if !r.non_resource_urls.is_empty() {
            non_resource_rules
                .push(json!({"verbs": r.verbs, "nonResourceURLs": r.non_resource_urls}));
        }
        if !r.resources.is_empty() || !r.api_groups.is_empty() {
            let mut v =
                json!({"verbs": r.verbs, "apiGroups": r.api_groups, "resources": r.resources});
            if !r.resource_names.is_empty() {
                v["resourceNames"] = json!(r.resource_names);
            }
            resource_rules.push(v);
        }
    }
    Ok(json!({
        "kind": "SelfSubjectRulesReview",
        "apiVersion": AUTHZ_VERSION,
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": {
            "resourceRules": resource_rules,
            "nonResourceRules": non_resource_rules,
            "incomplete": false,
        },
    }))
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
            None,
            &User::admin(),
            &json!({"spec": {"token": "x.y.z"}}),
        )
        .unwrap();
        assert_eq!(r.code, 201);
        assert!(r.body["status"].get("authenticated").is_none());
        assert_eq!(r.body["status"]["error"], "invalid bearer token");
        let e = create(
            &state,
            "tokenreviews",
            None,
            &User::admin(),
            &json!({"spec": {}}),
        )
        .unwrap_err();
        assert_eq!(e.code, 400);
    }
}
