//! `GET /api/v1/namespaces/{ns}/pods/{name}/log`: container logs, proxied from the node
//! the pod runs on (kube-apiserver's `pods/log`).
//!
//! Flow: the pod's `spec.nodeName` → the `Node` → its `InternalIP` address and
//! `status.daemonEndpoints.kubeletEndpoint.Port` → `GET https://<ip>:<port>/containerLogs/
//! {namespace}/{pod}/{container}?…` on the node's log server; its body is streamed back
//! as `text/plain` as it arrives (`follow=true` keeps the stream open until the node
//! closes it or the client goes away).
//!
//! # The node log server contract
//! Whoever serves logs on a node (the embedded pod runner, or a kubelet) must:
//! - listen on HTTPS at the port published in the Node's
//!   `status.daemonEndpoints.kubeletEndpoint.Port`, on the Node's `InternalIP` address;
//! - present a serving certificate that chains to the cluster CA (`pki/ca.crt` in the
//!   server's data directory) and names that IP; [`crate::pki::issue_serving_cert`]
//!   issues one;
//! - require a client certificate and accept the API server's: CN
//!   `kube-apiserver-kubelet-client`, no O, signed by the cluster CA, in
//!   `pki/apiserver-kubelet-client.{crt,key}` (re-issued at every start, so verify the
//!   chain and the CN, not the exact certificate);
//! - answer `GET /containerLogs/{namespace}/{pod}/{container}` with the container's log
//!   as `text/plain`, honouring the query parameters `follow` (`true`: keep streaming new
//!   lines until the container stops), `tailLines` (last N lines), `timestamps` (`true`:
//!   prefix each line with its RFC 3339 nanosecond time and a space), `sinceSeconds`,
//!   `sinceTime` (RFC 3339), `limitBytes` and `previous` (`true`: the previous
//!   instance), all passed through unchanged;
//! - answer 404 with a plain-text reason when the pod or container is unknown. Any
//!   non-2xx answer is returned to the client as a `Status` with that code and the body
//!   as message.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use http_body_util::BodyExt;
use serde_json::Value;

use crate::client::{self, TlsOptions};
use crate::handlers::common::decode_record;
use crate::request::query_pairs;
use crate::state::ApiState;
use crate::status::ApiError;

/// Query parameters passed to the node unchanged.
const FORWARDED: &[&str] = &[
    "follow",
    "tailLines",
    "timestamps",
    "sinceSeconds",
    "sinceTime",
    "limitBytes",
    "previous",
];

/// Every container name of a pod (init, regular, ephemeral), in kube's order for the
/// error message: regular containers first.
fn names_of(pod: &Value, field: &str) -> Vec<String> {
    pod["spec"][field]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn container_names(pod: &Value) -> (Vec<String>, Vec<String>) {
    let names = |field: &str| names_of(pod, field);
    let regular = names("containers");
    let mut others = names("initContainers");
    others.extend(names("ephemeralContainers"));
    (regular, others)
}

/// The container whose log is asked for (`container` or the only one).
pub fn choose_container(pod: &Value, asked: Option<&str>) -> Result<String, ApiError> {
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    let (regular, others) = container_names(pod);
    match asked.filter(|c| !c.is_empty()) {
        Some(c) if regular.iter().chain(&others).any(|n| n == c) => Ok(c.to_owned()),
        Some(c) => Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {name}"
        ))),
        None if regular.len() == 1 => Ok(regular[0].clone()),
        None => {
            let init = names_of(pod, "initContainers");
            let mut msg = format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                regular.join(" ")
            );
            if !init.is_empty() {
                msg.push_str(&format!(
                    " or one of the init containers: [{}]",
                    init.join(" ")
                ));
            }
            Err(ApiError::bad_request(msg))
        }
    }
}

/// The node's log server base URL (`https://10.0.0.5:10250`).
fn node_endpoint(state: &ApiState, node: &str) -> Result<String, ApiError> {
    let record = state
        .store
        .get(&format!("/registry/core/nodes/{node}"))
        .ok_or_else(|| ApiError::not_found("", "nodes", node))?;
    let n = decode_record(&record)?;
    let port = n["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        .as_u64()
        .filter(|p| *p > 0 && *p < 65536)
        .ok_or_else(|| {
            ApiError::internal(format!("node {node} publishes no kubelet endpoint port"))
        })?;
    let ip = n["status"]["addresses"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["type"] == "InternalIP"))
        .and_then(|x| x["address"].as_str())
        .ok_or_else(|| ApiError::internal(format!("node {node} has no InternalIP address")))?;
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_owned()
    };
    Ok(format!("https://{host}:{port}"))
}

/// Serves `pods/log` for pod `ns/name` with the raw query string `query`.
pub async fn serve(
    state: &ApiState,
    ns: &str,
    name: &str,
    query: &str,
) -> Result<Response, ApiError> {
    let record = state
        .store
        .get(&format!("/registry/core/pods/{ns}/{name}"))
        .ok_or_else(|| ApiError::not_found("", "pods", name))?;
    let pod = decode_record(&record)?;
    let params = query_pairs(query);
    let container = choose_container(&pod, params.get("container").map(String::as_str))?;
    let node = pod["spec"]["nodeName"].as_str().unwrap_or("");
    if node.is_empty() {
        return Err(ApiError::bad_request(format!(
            "pod {name} does not have a host assigned"
        )));
    }
    let base = node_endpoint(state, node)?;
    let forwarded: Vec<String> = FORWARDED
        .iter()
        .filter_map(|k| params.get(*k).map(|v| format!("{k}={}", enc(v))))
        .collect();
    let mut url = format!("{base}/containerLogs/{ns}/{name}/{container}");
    if !forwarded.is_empty() {
        url = format!("{url}?{}", forwarded.join("&"));
    }
    let tls = client::tls_config(&TlsOptions {
        ca_pem: state.outgoing.ca_pem.clone().into_bytes(),
        insecure: false,
        identity: state.outgoing.kubelet_client.clone(),
        server_name: None,
    })
    .map_err(|e| ApiError::internal(e.to_string()))?;
    let req = http::Request::get(&url)
        .body(Body::empty())
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let resp = client::send(Arc::new(tls), req).await.map_err(|e| {
        let mut msg = format!("Get \"{url}\": {e}");
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg = format!("{msg}: {s}");
            src = s.source();
        }
        ApiError::internal(msg)
    })?;
    let status = resp.status();
    if !status.is_success() {
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).trim().to_owned())
            .unwrap_or_default();
        let reason = if status.as_u16() == 404 {
            "NotFound"
        } else {
            "InternalError"
        };
        return Err(ApiError::new(status.as_u16(), reason, body));
    }
    let mut out = Response::new(Body::new(resp.into_body()));
    out.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    Ok(out)
}

/// Percent-encodes a query value (RFC 3986 unreserved characters kept).
fn enc(v: &str) -> String {
    v.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_container_must_be_named_when_there_are_several() {
        let pod = json!({"metadata": {"name": "virt-launcher-vm"}, "spec": {"containers": [{"name": "compute"}, {"name": "guest-console-log"}], "initContainers": [{"name": "init"}]}});
        let e = choose_container(&pod, None).unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "a container name must be specified for pod virt-launcher-vm, choose one of: [compute guest-console-log] or one of the init containers: [init]"
        );
        assert_eq!(choose_container(&pod, Some("init")).unwrap(), "init");
        assert_eq!(
            choose_container(&pod, Some("nope")).unwrap_err().message,
            "container nope is not valid for pod virt-launcher-vm"
        );
        let single = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "only"}]}});
        assert_eq!(choose_container(&single, None).unwrap(), "only");
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(enc("2024-01-02T03:04:05Z"), "2024-01-02T03%3A04%3A05Z");
        assert_eq!(enc("10"), "10");
    }
}
