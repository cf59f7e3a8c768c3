//! Impersonation (`kubectl --as`, `--as-group`, `--as-uid`): the `Impersonate-User`,
//! `Impersonate-Group`, `Impersonate-Uid` and `Impersonate-Extra-<key>` headers, each
//! authorized for the acting user with the `impersonate` verb on `users`, `groups`,
//! `serviceaccounts` (in the account's namespace, for a `system:serviceaccount:ns:name`
//! user), `uids` or `userextras/<key>` (both in `authentication.k8s.io`), as kube's
//! impersonation filter does. The first refusal answers 403 in kube's words.
//!
//! The impersonated user gets the groups asked for (a service account without
//! `Impersonate-Group` gets its fixed ones) and `system:authenticated`.

use std::collections::BTreeMap;

use axum::http::HeaderMap;

use super::attributes::Attributes;
use super::authorizer::Authorizer;
use crate::auth::{ANONYMOUS_USER, AUTHENTICATED_GROUP, UNAUTHENTICATED_GROUP, User};
use crate::status::ApiError;

const USER: &str = "impersonate-user";
const GROUP: &str = "impersonate-group";
const UID: &str = "impersonate-uid";
const EXTRA_PREFIX: &str = "impersonate-extra-";

fn values<'a>(headers: &'a HeaderMap, name: &str) -> Vec<&'a str> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect()
}

fn impersonate_attrs(group: &str, resource: &str, namespace: &str, name: &str) -> Attributes {
    Attributes {
        verb: "impersonate".into(),
        resource_request: true,
        api_group: group.into(),
        resource: resource.into(),
        namespace: namespace.into(),
        name: name.into(),
        ..Attributes::default()
    }
}

fn check(authorizer: &Authorizer, actor: &User, attrs: &Attributes) -> Result<(), ApiError> {
    if authorizer.authorize(actor, attrs).allowed {
        Ok(())
    } else {
        Err(super::forbidden(&actor.name, attrs))
    }
}

/// The user `actor` acts as, if the headers ask for impersonation and every part is
/// allowed; `Ok(None)` without impersonation headers.
pub fn impersonate(
    authorizer: &Authorizer,
    actor: &User,
    headers: &HeaderMap,
) -> Result<Option<User>, ApiError> {
    let user = headers.get(USER).and_then(|v| v.to_str().ok());
    let groups = values(headers, GROUP);
    let uid = headers.get(UID).and_then(|v| v.to_str().ok());
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in headers {
        if let Some(key) = name.as_str().strip_prefix(EXTRA_PREFIX)
            && let Ok(v) = value.to_str()
        {
            extra.entry(key.to_owned()).or_default().push(v.to_owned());
        }
    }
    let Some(user) = user.filter(|u| !u.is_empty()) else {
        if !groups.is_empty() || uid.is_some() || !extra.is_empty() {
            return Err(ApiError::bad_request(
                "requested impersonation of groups, uid or extra without impersonating a user",
            ));
        }
        return Ok(None);
    };
    let service_account = user
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'));
    match service_account {
        Some((ns, name)) => check(
            authorizer,
            actor,
            &impersonate_attrs("", "serviceaccounts", ns, name),
        )?,
        None => check(authorizer, actor, &impersonate_attrs("", "users", "", user))?,
    }
    for g in &groups {
        check(authorizer, actor, &impersonate_attrs("", "groups", "", g))?;
    }
    if let Some(uid) = uid {
        check(
            authorizer,
            actor,
            &impersonate_attrs("authentication.k8s.io", "uids", "", uid),
        )?;
    }
    for (key, vals) in &extra {
        for v in vals {
            let mut a = impersonate_attrs("authentication.k8s.io", "userextras", "", v);
            a.subresource = key.clone();
            check(authorizer, actor, &a)?;
        }
    }
    let mut as_groups: Vec<String> = groups.iter().map(|g| (*g).to_owned()).collect();
    if let (Some((ns, _)), true) = (service_account, groups.is_empty()) {
        as_groups = vec![
            "system:serviceaccounts".to_owned(),
            format!("system:serviceaccounts:{ns}"),
        ];
    }
    let implied = if user == ANONYMOUS_USER {
        UNAUTHENTICATED_GROUP
    } else {
        AUTHENTICATED_GROUP
    };
    if !as_groups.iter().any(|g| g == implied) {
        as_groups.push(implied.to_owned());
    }
    Ok(Some(User {
        name: user.to_owned(),
        uid: uid.unwrap_or("").to_owned(),
        groups: as_groups,
        extra,
    }))
}

/// Removes the impersonation headers (so they do not reach an aggregated API).
pub fn strip_headers(headers: &mut HeaderMap) {
    let names: Vec<_> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("impersonate-"))
        .cloned()
        .collect();
    for n in names {
        headers.remove(n);
    }
}

#[cfg(test)]
mod tests {
    use kubevirt_store::Store;

    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn masters_may_impersonate_and_the_user_gets_the_groups_asked_for() {
        let authz = Authorizer::new(Store::in_memory());
        let h = headers(&[("Impersonate-User", "alice"), ("Impersonate-Group", "devs")]);
        let u = impersonate(&authz, &User::admin(), &h).unwrap().unwrap();
        assert_eq!(u.name, "alice");
        assert_eq!(u.groups, ["devs", "system:authenticated"]);
        let h = headers(&[("Impersonate-User", "system:serviceaccount:team:bot")]);
        let u = impersonate(&authz, &User::admin(), &h).unwrap().unwrap();
        assert_eq!(
            u.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:team",
                "system:authenticated"
            ]
        );
        assert!(
            impersonate(&authz, &User::admin(), &HeaderMap::new())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn impersonation_without_the_verb_is_forbidden_and_groups_alone_are_bad_requests() {
        let authz = Authorizer::new(Store::in_memory());
        let bob = User::static_token("bob");
        let e = impersonate(&authz, &bob, &headers(&[("Impersonate-User", "alice")])).unwrap_err();
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "users \"alice\" is forbidden: User \"bob\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"
        );
        let e = impersonate(
            &authz,
            &User::admin(),
            &headers(&[("Impersonate-Group", "x")]),
        )
        .unwrap_err();
        assert_eq!(e.code, 400);
    }
}
