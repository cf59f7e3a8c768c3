//! API discovery: `/api`, `/apis`, `/apis/{group}`, `/api/v1`, `/apis/{group}/{version}`,
//! legacy and aggregated (`apidiscovery.k8s.io/v2`) forms.
//!
//! Replies carry `Cache-Control: no-cache, private` and no ETag, so kubectl's HTTP cache
//! never revalidates stale discovery (see the wire notes).

use axum::http::{HeaderValue, header};
use axum::response::Response;
use serde_json::{Value, json};

use crate::registry::ResourceInfo;
use crate::request::ApiPath;
use crate::state::ApiState;
use crate::status::{ApiError, json_response};

/// The aggregated discovery media type.
pub const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

fn wants_aggregated(accept: &str) -> bool {
    accept.contains("as=APIGroupDiscoveryList") && accept.contains("v=v2;")
}

fn subresource_entries(r: &ResourceInfo) -> Vec<(String, Value, Vec<&'static str>)> {
    let gvk = |kind: &str, group: &str, version: &str| json!({"group": group, "version": version, "kind": kind});
    r.subresources
        .iter()
        .map(|s| match s.as_str() {
            "binding" => (s.clone(), gvk("Binding", "", "v1"), vec!["create"]),
            "eviction" => (s.clone(), gvk("Eviction", "policy", "v1"), vec!["create"]),
            "log" => (s.clone(), gvk(&r.kind, &r.group, &r.version), vec!["get"]),
            "token" => (
                s.clone(),
                gvk("TokenRequest", "authentication.k8s.io", "v1"),
                vec!["create"],
            ),
            "scale" => (
                s.clone(),
                gvk("Scale", "autoscaling", "v1"),
                vec!["get", "patch", "update"],
            ),
            _ => (
                s.clone(),
                gvk(&r.kind, &r.group, &r.version),
                vec!["get", "patch", "update"],
            ),
        })
        .collect()
}

/// One resource in aggregated form.
pub fn aggregated_resource(r: &ResourceInfo) -> Value {
    let mut v = json!({
        "resource": r.plural,
        "responseKind": {"group": r.group, "version": r.version, "kind": r.kind},
        "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": r.singular,
        "verbs": r.verbs(),
    });
    if !r.short_names.is_empty() {
        v["shortNames"] = json!(r.short_names);
    }
    if !r.categories.is_empty() {
        v["categories"] = json!(r.categories);
    }
    let subs: Vec<Value> = subresource_entries(r)
        .into_iter()
        .map(|(s, kind, verbs)| json!({"subresource": s, "responseKind": kind, "verbs": verbs}))
        .collect();
    if !subs.is_empty() {
        v["subresources"] = json!(subs);
    }
    v
}

fn aggregated_list(state: &ApiState, core: bool) -> Value {
    let items: Vec<Value> = state
        .registry
        .groups()
        .into_iter()
        .filter(|(g, _)| g.is_empty() == core)
        .map(|(g, versions)| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|v| {
                    let resources: Vec<Value> = state
                        .registry
                        .in_group_version(&g, v)
                        .iter()
                        .map(|r| aggregated_resource(r))
                        .collect();
                    json!({"version": v, "resources": resources, "freshness": "Current"})
                })
                .collect();
            json!({"metadata": {"name": g, "creationTimestamp": null}, "versions": versions})
        })
        .collect();
    let mut items = items;
    if !core {
        for (g, versions) in crate::aggregation::remote_groups(state) {
            let versions: Vec<Value> = versions
                .iter()
                .map(|v| json!({"version": v, "resources": [], "freshness": "Current"}))
                .collect();
            items.push(
                json!({"metadata": {"name": g, "creationTimestamp": null}, "versions": versions}),
            );
        }
    }
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

fn group_entry(g: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    json!({"name": g, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

/// A legacy `APIResourceList` for one group version.
pub fn resource_list(state: &ApiState, group: &str, version: &str) -> Option<Value> {
    let infos = state.registry.in_group_version(group, version);
    if infos.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for r in &infos {
        let mut v = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": r.verbs(),
        });
        if !r.short_names.is_empty() {
            v["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            v["categories"] = json!(r.categories);
        }
        resources.push(v);
        for (s, kind, verbs) in subresource_entries(r) {
            let mut entry = json!({
                "name": format!("{}/{s}", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": kind["kind"],
                "verbs": verbs,
            });
            // As kube: a subresource of another group names it (`pods/eviction` is
            // `policy/v1`, which `kubectl drain` looks for).
            if kind["group"] != r.group.as_str() && kind["group"] != "" {
                entry["group"] = kind["group"].clone();
                entry["version"] = kind["version"].clone();
            }
            resources.push(entry);
        }
    }
    let gv = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

fn respond(body: &Value, content_type: &'static str) -> Response {
    let mut resp = json_response(200, body);
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    resp
}

/// Serves a discovery path.
pub fn serve(state: &ApiState, path: &ApiPath, accept: &str) -> Response {
    let aggregated = wants_aggregated(accept);
    let r = match path {
        ApiPath::LegacyRoot if aggregated => Ok(respond(&aggregated_list(state, true), AGGREGATED)),
        ApiPath::GroupsRoot if aggregated => {
            Ok(respond(&aggregated_list(state, false), AGGREGATED))
        }
        ApiPath::LegacyRoot => Ok(respond(
            &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]}),
            "application/json",
        )),
        ApiPath::GroupsRoot => {
            let groups: Vec<Value> = state
                .registry
                .groups()
                .into_iter()
                .filter(|(g, _)| !g.is_empty())
                .chain(crate::aggregation::remote_groups(state))
                .map(|(g, vs)| group_entry(&g, &vs))
                .collect();
            Ok(respond(
                &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
                "application/json",
            ))
        }
        ApiPath::Group { group } => state
            .registry
            .groups()
            .into_iter()
            .chain(crate::aggregation::remote_groups(state))
            .find(|(g, _)| g == group && !g.is_empty())
            .map(|(g, vs)| {
                let mut e = group_entry(&g, &vs);
                e["kind"] = json!("APIGroup");
                e["apiVersion"] = json!("v1");
                respond(&e, "application/json")
            })
            .ok_or_else(ApiError::no_route),
        ApiPath::GroupVersion { group, version } => resource_list(state, group, version)
            .map(|l| respond(&l, "application/json"))
            .ok_or_else(ApiError::no_route),
        ApiPath::Resource(_) => Err(ApiError::no_route()),
    };
    r.unwrap_or_else(axum::response::IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    #[test]
    fn aggregated_pod_entry_has_scope_verbs_shortnames_and_categories() {
        let r = Registry::new();
        let pods = r.find("", "v1", "pods").unwrap();
        let e = aggregated_resource(&pods);
        assert_eq!(e["scope"], "Namespaced");
        assert_eq!(e["shortNames"][0], "po");
        assert_eq!(e["categories"][0], "all");
        assert!(!e["verbs"].as_array().unwrap().is_empty());
        assert_eq!(e["subresources"][0]["subresource"], "status");
        assert_eq!(e["subresources"][1]["responseKind"]["kind"], "Binding");
    }

    #[test]
    fn aggregated_accept_header_is_detected() {
        assert!(wants_aggregated(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
        ));
        assert!(!wants_aggregated("application/json, */*"));
    }
}
