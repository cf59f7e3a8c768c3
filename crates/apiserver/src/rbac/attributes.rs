//! What a request asks to do, in kube's authorization terms: a pure function of the
//! method, the path and the query (kube's `RequestInfoFactory`), computed before any
//! routing so that aggregated APIs and unknown resources are authorized the same way.
//!
//! - Paths outside `/api/…` and `/apis/…`, and the discovery paths `/api`, `/api/v1`,
//!   `/apis`, `/apis/{group}` and `/apis/{group}/{version}`, are non-resource requests
//!   whose verb is the lower-cased method (`get`, `post` …).
//! - Resource requests map GET/HEAD to `get` (`list` without a name, `watch` with
//!   `watch=true` or the legacy `/watch/` prefix), POST to `create`, PUT to `update`,
//!   PATCH to `patch`, DELETE to `delete` (`deletecollection` without a name).
//! - `namespaces/{ns}/…` sets the namespace; `namespaces/{name}` (and its `status` and
//!   `finalize`) is the namespace object with the namespace set to its own name, as in kube.
//! - A list or watch with `fieldSelector=metadata.name=x` is authorized for the name `x`.

use crate::request::query_pairs;

/// The attributes an authorizer decides on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`
    /// (or `impersonate`, `bind`, `escalate` … in reviews); the lower-cased method for
    /// non-resource requests.
    pub verb: String,
    /// Whether this is a resource request (else `path` applies).
    pub resource_request: bool,
    /// The request path (non-resource requests).
    pub path: String,
    pub namespace: String,
    pub api_group: String,
    pub api_version: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
}

impl Attributes {
    /// A non-resource request.
    pub fn non_resource(verb: &str, path: &str) -> Attributes {
        Attributes {
            verb: verb.to_owned(),
            path: path.to_owned(),
            ..Attributes::default()
        }
    }
}

/// kube's `namespaceSubresources`: subresources of a namespace object itself.
const NAMESPACE_SUBRESOURCES: &[&str] = &["status", "finalize"];

/// The attributes of a request with `method`, `path` and raw `query` (without `?`).
pub fn from_request(method: &str, path: &str, query: &str) -> Attributes {
    let non_resource = || Attributes::non_resource(&method.to_ascii_lowercase(), path);
    let trimmed = path.trim_start_matches('/').trim_end_matches('/');
    let mut parts: Vec<&str> = trimmed.split('/').collect();
    let mut attrs = Attributes {
        resource_request: true,
        path: path.to_owned(),
        ..Attributes::default()
    };
    match parts.first() {
        Some(&"api") if parts.len() >= 3 => {
            attrs.api_version = parts[1].to_owned();
            parts.drain(..2);
        }
        Some(&"apis") if parts.len() >= 4 => {
            attrs.api_group = parts[1].to_owned();
            attrs.api_version = parts[2].to_owned();
            parts.drain(..3);
        }
        _ => return non_resource(),
    }
    attrs.verb = match method {
        "POST" => "create",
        "GET" | "HEAD" => "get",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "",
    }
    .to_owned();
    if parts.first() == Some(&"watch") {
        parts.remove(0);
        if attrs.verb == "get" {
            attrs.verb = "watch".into();
        }
    }
    if parts.first() == Some(&"namespaces") && parts.len() > 1 {
        attrs.namespace = parts[1].to_owned();
        if parts.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&parts[2]) {
            parts.drain(..2);
        }
    }
    attrs.resource = parts.first().map(|s| (*s).to_owned()).unwrap_or_default();
    attrs.name = parts.get(1).map(|s| (*s).to_owned()).unwrap_or_default();
    attrs.subresource = parts.get(2).map(|s| (*s).to_owned()).unwrap_or_default();
    let pairs = query_pairs(query);
    if attrs.name.is_empty() && attrs.verb == "get" {
        let watch = pairs
            .get("watch")
            .is_some_and(|v| matches!(v.as_str(), "1" | "true"));
        attrs.verb = if watch { "watch" } else { "list" }.into();
    }
    if attrs.name.is_empty() && attrs.verb == "delete" {
        attrs.verb = "deletecollection".into();
    }
    if matches!(attrs.verb.as_str(), "list" | "watch")
        && let Some(selector) = pairs.get("fieldSelector")
    {
        for term in selector.split(',') {
            let term = term.trim();
            let value = term
                .strip_prefix("metadata.name==")
                .or_else(|| term.strip_prefix("metadata.name="));
            if let Some(v) = value {
                attrs.name = v.to_owned();
            }
        }
    }
    attrs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(method: &str, path: &str, query: &str) -> Attributes {
        from_request(method, path, query)
    }

    #[test]
    fn discovery_and_other_paths_are_non_resource_requests() {
        for p in [
            "/api",
            "/api/v1",
            "/apis",
            "/apis/apps",
            "/apis/apps/v1",
            "/version",
            "/healthz",
        ] {
            let x = a("GET", p, "");
            assert!(!x.resource_request, "{p}");
            assert_eq!(x.verb, "get");
            assert_eq!(x.path, p);
        }
        assert_eq!(a("POST", "/logs", "").verb, "post");
    }

    #[test]
    fn collection_gets_are_lists_or_watches_and_deletes_deletecollections() {
        let x = a("GET", "/api/v1/namespaces/default/pods", "");
        assert_eq!(
            (x.verb.as_str(), x.namespace.as_str(), x.resource.as_str()),
            ("list", "default", "pods")
        );
        assert_eq!(
            a("GET", "/api/v1/namespaces/default/pods", "watch=true").verb,
            "watch"
        );
        assert_eq!(
            a("GET", "/api/v1/watch/namespaces/default/pods", "").verb,
            "watch"
        );
        assert_eq!(
            a("GET", "/api/v1/watch/namespaces/default/pods/p", "").verb,
            "watch"
        );
        assert_eq!(
            a("DELETE", "/api/v1/namespaces/default/pods", "").verb,
            "deletecollection"
        );
        assert_eq!(
            a("DELETE", "/api/v1/namespaces/default/pods/p", "").verb,
            "delete"
        );
        assert_eq!(
            a(
                "PATCH",
                "/apis/apps/v1/namespaces/x/deployments/d/scale",
                ""
            )
            .subresource,
            "scale"
        );
    }

    #[test]
    fn a_namespace_object_is_authorized_in_its_own_namespace() {
        let x = a("GET", "/api/v1/namespaces/team", "");
        assert_eq!(
            (x.resource.as_str(), x.name.as_str(), x.namespace.as_str()),
            ("namespaces", "team", "team")
        );
        let x = a("PUT", "/api/v1/namespaces/team/finalize", "");
        assert_eq!(
            (x.resource.as_str(), x.subresource.as_str()),
            ("namespaces", "finalize")
        );
        let x = a("GET", "/api/v1/namespaces", "");
        assert_eq!((x.verb.as_str(), x.namespace.as_str()), ("list", ""));
    }

    #[test]
    fn a_name_field_selector_names_the_object_of_a_list_or_watch() {
        let x = a(
            "GET",
            "/apis/kubevirt.io/v1/namespaces/d/virtualmachines",
            "fieldSelector=metadata.name%3Dvm1&watch=1",
        );
        assert_eq!(
            (x.verb.as_str(), x.name.as_str(), x.api_group.as_str()),
            ("watch", "vm1", "kubevirt.io")
        );
    }
}
