//! Service references routed to endpoints, as kube-apiserver's endpoint routing
//! (`--enable-aggregator-routing`, the only mode of the embedded server: it has no service
//! network of its own) resolves a webhook's `clientConfig.service` and an APIService's
//! `spec.service`.
//!
//! [`resolve_endpoint`] reads the `Service`, finds the entry of `spec.ports` whose `port`
//! is the asked one, and picks one ready address at random from the EndpointSlices
//! labelled `kubernetes.io/service-name=<name>` in the namespace (an endpoint whose
//! `conditions.ready` is `false` is skipped); the port is the slice's port named like the
//! service port (the resolved `targetPort`, number or name), or a numeric `targetPort`
//! when the slice gives none. When the namespace holds no slice of the Service, the legacy
//! `Endpoints` object of the same name is read (`subsets[].addresses`, not
//! `notReadyAddresses`). The caller connects to that address but verifies the server
//! certificate for [`service_server_name`] (`<name>.<namespace>.svc`), as kube sets the
//! TLS server name of the connection.
//!
//! Failures say what kube says ([`RouteError`]).

use std::net::IpAddr;

use kubevirt_store::Store;
use rand::seq::IndexedRandom;
use serde_json::Value;

/// The label tying an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Why a Service reference could not be routed (kube-apiserver's messages).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// The Service does not exist.
    #[error("service \"{0}\" not found")]
    ServiceNotFound(String),
    /// No `spec.ports` entry has the asked `port`.
    #[error("no service port {port} found for service \"{service}\"")]
    NoServicePort { port: i64, service: String },
    /// `ExternalName` (or an unknown type) is not routed to endpoints.
    #[error("unsupported service type \"{0}\"")]
    UnsupportedType(String),
    /// No ready endpoint serves the port.
    #[error("no endpoints available for service \"{0}\"")]
    NoEndpoints(String),
}

/// Where to connect for a Service reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The endpoint's address (an IP, as EndpointSlices give them).
    pub address: String,
    /// The endpoint's port (the resolved `targetPort`).
    pub port: u16,
    /// The name the server certificate is verified for: `<name>.<namespace>.svc`.
    pub server_name: String,
}

impl Endpoint {
    /// `https://<address>:<port>` (IPv6 addresses in brackets), without a trailing slash.
    pub fn base_url(&self) -> String {
        match self.address.parse::<IpAddr>() {
            Ok(IpAddr::V6(ip)) => format!("https://[{ip}]:{}", self.port),
            _ => format!("https://{}:{}", self.address, self.port),
        }
    }
}

/// The DNS name of Service `namespace/name` that its serving certificate is checked for.
pub fn service_server_name(namespace: &str, name: &str) -> String {
    format!("{name}.{namespace}.svc")
}

fn get(store: &Store, key: &str) -> Option<Value> {
    store
        .get(key)
        .and_then(|r| serde_json::from_slice(&r.value).ok())
}

/// Routes `port` (443 when a reference gives none) of Service `namespace/name` to one ready
/// endpoint, chosen at random among all of them.
///
/// # Errors
/// A [`RouteError`] with kube-apiserver's wording.
pub fn resolve_endpoint(
    store: &Store,
    namespace: &str,
    name: &str,
    port: i64,
) -> Result<Endpoint, RouteError> {
    let candidates = resolve_endpoints(store, namespace, name, port)?;
    let (address, port) = candidates
        .choose(&mut rand::rng())
        .cloned()
        .ok_or_else(|| RouteError::NoEndpoints(name.to_owned()))?;
    Ok(Endpoint {
        address,
        port,
        server_name: service_server_name(namespace, name),
    })
}

/// Every ready `(address, port)` serving `port` of Service `namespace/name`; never empty.
///
/// # Errors
/// As [`resolve_endpoint`].
pub fn resolve_endpoints(
    store: &Store,
    namespace: &str,
    name: &str,
    port: i64,
) -> Result<Vec<(String, u16)>, RouteError> {
    let svc = get(
        store,
        &format!("/registry/core/services/{namespace}/{name}"),
    )
    .ok_or_else(|| RouteError::ServiceNotFound(name.to_owned()))?;
    let spec = &svc["spec"];
    let svc_port = spec["ports"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["port"].as_i64() == Some(port)))
        .ok_or_else(|| RouteError::NoServicePort {
            port,
            service: name.to_owned(),
        })?;
    match spec["type"].as_str().unwrap_or("ClusterIP") {
        "ClusterIP" | "NodePort" | "LoadBalancer" => {}
        other => return Err(RouteError::UnsupportedType(other.to_owned())),
    }
    let port_name = svc_port["name"].as_str().unwrap_or("");
    let numeric_target = match &svc_port["targetPort"] {
        Value::Null => svc_port["port"].as_u64(),
        t => t.as_u64(),
    }
    .and_then(|p| u16::try_from(p).ok())
    .filter(|p| *p != 0);
    // The port an endpoint group serves the service port on.
    let port_of = |ports: &Value| -> Option<u16> {
        let named = ports.as_array().and_then(|ps| {
            ps.iter()
                .find(|p| p["name"].as_str().unwrap_or("") == port_name)
        });
        match named {
            Some(p) => p["port"]
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .or(numeric_target),
            None => None,
        }
    };
    let prefix = format!("/registry/discovery.k8s.io/endpointslices/{namespace}/");
    let slices: Vec<Value> = store
        .list(&prefix, None, None)
        .records
        .iter()
        .filter_map(|r| serde_json::from_slice::<Value>(&r.value).ok())
        .filter(|s| s["metadata"]["labels"][SERVICE_NAME_LABEL] == name)
        .collect();
    let mut out = Vec::new();
    if slices.is_empty() {
        let eps = get(
            store,
            &format!("/registry/core/endpoints/{namespace}/{name}"),
        );
        for subset in eps
            .as_ref()
            .and_then(|e| e["subsets"].as_array())
            .into_iter()
            .flatten()
        {
            let Some(p) = port_of(&subset["ports"]) else {
                continue;
            };
            for a in subset["addresses"].as_array().into_iter().flatten() {
                if let Some(ip) = a["ip"].as_str().filter(|s| !s.is_empty()) {
                    out.push((ip.to_owned(), p));
                }
            }
        }
    }
    for slice in &slices {
        if !matches!(
            slice["addressType"].as_str().unwrap_or("IPv4"),
            "IPv4" | "IPv6"
        ) {
            continue;
        }
        let Some(p) = port_of(&slice["ports"]) else {
            continue;
        };
        for ep in slice["endpoints"].as_array().into_iter().flatten() {
            if ep["conditions"]["ready"] == false {
                continue;
            }
            if let Some(ip) = ep["addresses"][0].as_str().filter(|s| !s.is_empty()) {
                out.push((ip.to_owned(), p));
            }
        }
    }
    if out.is_empty() {
        return Err(RouteError::NoEndpoints(name.to_owned()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn store() -> Store {
        Store::in_memory()
    }

    async fn put(store: &Store, key: &str, v: Value) {
        let bytes = serde_json::to_vec(&v).unwrap();
        store.create(key, Box::new(move |_| bytes)).await.unwrap();
    }

    async fn service(store: &Store, target: Value) {
        put(
            store,
            "/registry/core/services/kubevirt/virt-api",
            json!({"metadata": {"name": "virt-api", "namespace": "kubevirt"},
                   "spec": {"type": "ClusterIP", "ports": [{"name": "https", "port": 443, "targetPort": target}]}}),
        )
        .await;
    }

    async fn slice(store: &Store, name: &str, endpoints: Value, ports: Value) {
        put(
            store,
            &format!("/registry/discovery.k8s.io/endpointslices/kubevirt/{name}"),
            json!({"metadata": {"name": name, "namespace": "kubevirt",
                                "labels": {"kubernetes.io/service-name": "virt-api"}},
                   "addressType": "IPv4", "endpoints": endpoints, "ports": ports}),
        )
        .await;
    }

    #[tokio::test]
    async fn a_missing_service_or_port_fails_in_kubes_words() {
        let s = store();
        let e = resolve_endpoint(&s, "kubevirt", "virt-api", 443).unwrap_err();
        assert_eq!(e.to_string(), "service \"virt-api\" not found");
        service(&s, json!(8443)).await;
        let e = resolve_endpoint(&s, "kubevirt", "virt-api", 444).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no service port 444 found for service \"virt-api\""
        );
        let e = resolve_endpoint(&s, "kubevirt", "virt-api", 443).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no endpoints available for service \"virt-api\""
        );
    }

    #[tokio::test]
    async fn ready_slice_endpoints_are_chosen_with_the_slices_port() {
        let s = store();
        service(&s, json!("https")).await;
        slice(
            &s,
            "virt-api-a",
            json!([{"addresses": ["10.245.0.7"], "conditions": {"ready": false}},
                   {"addresses": ["10.245.0.8"], "conditions": {}}]),
            json!([{"name": "https", "port": 8443, "protocol": "TCP"}]),
        )
        .await;
        let all = resolve_endpoints(&s, "kubevirt", "virt-api", 443).unwrap();
        assert_eq!(all, vec![("10.245.0.8".to_owned(), 8443)]);
        let ep = resolve_endpoint(&s, "kubevirt", "virt-api", 443).unwrap();
        assert_eq!(ep.base_url(), "https://10.245.0.8:8443");
        assert_eq!(ep.server_name, "virt-api.kubevirt.svc");
    }

    #[tokio::test]
    async fn a_slice_port_of_another_name_does_not_serve_the_service_port() {
        let s = store();
        service(&s, json!(8443)).await;
        slice(
            &s,
            "virt-api-a",
            json!([{"addresses": ["10.245.0.8"]}]),
            json!([{"name": "metrics", "port": 8080}]),
        )
        .await;
        assert!(matches!(
            resolve_endpoints(&s, "kubevirt", "virt-api", 443),
            Err(RouteError::NoEndpoints(_))
        ));
    }

    #[tokio::test]
    async fn without_slices_the_legacy_endpoints_are_read() {
        let s = store();
        service(&s, json!(8443)).await;
        put(
            &s,
            "/registry/core/endpoints/kubevirt/virt-api",
            json!({"metadata": {"name": "virt-api", "namespace": "kubevirt"},
                   "subsets": [{"addresses": [{"ip": "10.245.0.9"}],
                                "notReadyAddresses": [{"ip": "10.245.0.10"}],
                                "ports": [{"name": "https", "port": 8443}]}]}),
        )
        .await;
        let all = resolve_endpoints(&s, "kubevirt", "virt-api", 443).unwrap();
        assert_eq!(all, vec![("10.245.0.9".to_owned(), 8443)]);
    }

    #[tokio::test]
    async fn external_name_services_are_not_routed() {
        let s = store();
        put(
            &s,
            "/registry/core/services/kubevirt/virt-api",
            json!({"spec": {"type": "ExternalName", "ports": [{"port": 443}]}}),
        )
        .await;
        assert_eq!(
            resolve_endpoint(&s, "kubevirt", "virt-api", 443)
                .unwrap_err()
                .to_string(),
            "unsupported service type \"ExternalName\""
        );
    }
}
