//! API aggregation: requests under `/apis/<group>/<version>/…` of a group served by an
//! `APIService` (`apiregistration.k8s.io/v1`, named `<version>.<group>`) with a backend
//! are proxied to that backend, as kube-apiserver's aggregator does.
//!
//! Where the backend is: `spec.service` (`port` 443 when absent), routed to one ready
//! endpoint of the Service per request as kube-apiserver's endpoint routing does
//! ([`crate::routing::resolve_endpoint`]); the backend's certificate is verified for
//! `<name>.<namespace>.svc` against `spec.caBundle` (the cluster CA when empty) unless
//! `spec.insecureSkipTLSVerify`. A Service that cannot be routed answers 503
//! `ServiceUnavailable` with kube's reason in the message. An APIService without
//! `spec.service` is local (served by this server). The APIService annotation
//! [`URL_ANNOTATION`] (a base URL such as `https://127.0.0.1:8443`, verified for its own
//! host) takes precedence over `spec.service`, for a backend that runs outside the pod
//! network (virt-api started by the embedded server's own process).
//!
//! What is forwarded: method, path, query, headers (without `Authorization` and the
//! hop-by-hop ones) and the body, streamed both ways. The server authenticates to the
//! backend with its front-proxy client certificate and names the user in
//! `X-Remote-User` / `X-Remote-Group`, which the backend may trust from that certificate
//! only. `Connection: Upgrade` requests (websockets: `virtctl console`/`vnc`) are
//! upgraded on both sides and their bytes copied until either side closes.
//!
//! Discovery: `/apis/<group>/<version>` is proxied like everything else under it; `/apis`
//! and `/apis/<group>` list the group (aggregated discovery lists its versions without
//! resources).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;
use tracing::{debug, warn};

use crate::auth::User;
use crate::client::{self, TlsOptions};
use crate::state::ApiState;
use crate::status::ApiError;

/// Annotation on an `APIService` with the backend's base URL (instead of `spec.service`).
pub const URL_ANNOTATION: &str = "kubevirt-rs.io/url";

const PREFIX: &str = "/registry/apiregistration.k8s.io/apiservices/";

/// A proxied group version's backend.
#[derive(Clone, Debug)]
pub struct Target {
    /// Base URL (`https://10.245.0.7:8443`), the request path is appended; the reason
    /// the backend cannot be reached otherwise.
    pub base: Result<String, String>,
    /// `server_name` is `<service>.<namespace>.svc` for a routed Service reference.
    pub tls: TlsOptions,
    pub name: String,
}

fn apiservices(state: &ApiState) -> Vec<Value> {
    state
        .store
        .list(PREFIX, None, None)
        .records
        .iter()
        .filter_map(|r| serde_json::from_slice(&r.value).ok())
        .collect()
}

fn is_remote(svc: &Value) -> bool {
    svc["spec"]["service"].is_object() || svc["metadata"]["annotations"][URL_ANNOTATION].is_string()
}

/// Groups and versions served by backends (for discovery), in name order.
pub fn remote_groups(state: &ApiState) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for s in apiservices(state).iter().filter(|s| is_remote(s)) {
        let g = s["spec"]["group"].as_str().unwrap_or("").to_owned();
        let v = s["spec"]["version"].as_str().unwrap_or("").to_owned();
        if g.is_empty() || v.is_empty() || !state.registry.in_group_version(&g, &v).is_empty() {
            continue;
        }
        match out.iter_mut().find(|(x, _)| *x == g) {
            Some((_, vs)) => vs.push(v),
            None => out.push((g, vec![v])),
        }
    }
    out
}

/// The backend for `path`, when it lies under a remote APIService's group version.
pub fn target(state: &ApiState, path: &str) -> Option<Target> {
    let rest = path.strip_prefix("/apis/")?;
    let mut parts = rest.splitn(3, '/');
    let (group, version) = (parts.next()?, parts.next()?);
    if group.is_empty() || version.is_empty() {
        return None;
    }
    let record = state.store.get(&format!("{PREFIX}{version}.{group}"))?;
    let svc: Value = serde_json::from_slice(&record.value).ok()?;
    if !is_remote(&svc) {
        return None;
    }
    let spec = &svc["spec"];
    let mut server_name = None;
    let base = match svc["metadata"]["annotations"][URL_ANNOTATION].as_str() {
        Some(u) => Ok(u.trim_end_matches('/').to_owned()),
        None => crate::routing::resolve_endpoint(
            &state.store,
            spec["service"]["namespace"].as_str().unwrap_or(""),
            spec["service"]["name"].as_str().unwrap_or(""),
            spec["service"]["port"].as_i64().unwrap_or(443),
        )
        .map(|ep| {
            let base = ep.base_url();
            server_name = Some(ep.server_name);
            base
        })
        .map_err(|e| e.to_string()),
    };
    let ca_pem = match spec["caBundle"].as_str() {
        Some(b) if !b.is_empty() => STANDARD.decode(b).unwrap_or_default(),
        _ => state.outgoing.ca_pem.clone().into_bytes(),
    };
    Some(Target {
        base,
        tls: TlsOptions {
            ca_pem,
            insecure: spec["insecureSkipTLSVerify"] == true,
            identity: state.outgoing.proxy_client.clone(),
            server_name,
        },
        name: format!("{version}.{group}"),
    })
}

const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "authorization",
    "x-remote-user",
    "x-remote-group",
];

fn unavailable(name: &str, why: &dyn std::fmt::Display) -> Response {
    warn!(apiservice = name, error = %why, "aggregated API backend unavailable");
    ApiError::new(
        503,
        "ServiceUnavailable",
        format!("service unavailable: {why}"),
    )
    .into_response()
}

/// Proxies `req` to `target`, upgrading the connection when asked.
pub async fn proxy(target: Target, mut req: Request) -> Response {
    let base = match &target.base {
        Ok(b) => b.clone(),
        Err(why) => return unavailable(&target.name, why),
    };
    let path_q = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let user = req.extensions().get::<User>().cloned().unwrap_or_default();
    let upgrade = req.headers().contains_key(header::UPGRADE);
    let mut b = http::Request::builder()
        .method(req.method().clone())
        .uri(format!("{base}{path_q}"));
    for (k, v) in req.headers() {
        if !HOP_BY_HOP.contains(&k.as_str()) {
            b = b.header(k, v);
        }
    }
    if upgrade && let Some(v) = req.headers().get(header::UPGRADE) {
        b = b
            .header(header::UPGRADE, v)
            .header(header::CONNECTION, "Upgrade");
    }
    b = b.header(HeaderName::from_static("x-remote-user"), user.name.as_str());
    for group in &user.groups {
        b = b.header(HeaderName::from_static("x-remote-group"), group.as_str());
    }
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let body = if upgrade {
        Body::empty()
    } else {
        req.into_body()
    };
    let out = match b.body(body) {
        Ok(r) => r,
        Err(e) => return unavailable(&target.name, &e),
    };
    let tls = match client::tls_config(&target.tls) {
        Ok(t) => Arc::new(t),
        Err(e) => return unavailable(&target.name, &e),
    };
    let mut resp = match client::send_as(tls, target.tls.server_name.as_deref(), out).await {
        Ok(r) => r,
        Err(e) => return unavailable(&target.name, &e),
    };
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_upgrade) = client_upgrade
    {
        let backend_upgrade = hyper::upgrade::on(&mut resp);
        let name = target.name.clone();
        tokio::spawn(async move {
            let (Ok(c), Ok(b)) = (client_upgrade.await, backend_upgrade.await) else {
                debug!(apiservice = name, "upgrade failed on one side");
                return;
            };
            let mut c = hyper_util::rt::TokioIo::new(c);
            let mut b = hyper_util::rt::TokioIo::new(b);
            let _ = tokio::io::copy_bidirectional(&mut c, &mut b).await;
        });
        let (parts, _) = resp.into_parts();
        let mut out = Response::new(Body::empty());
        *out.status_mut() = parts.status;
        *out.headers_mut() = parts.headers;
        out.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        return out;
    }
    let (parts, body) = resp.into_parts();
    let mut out = Response::new(Body::new(body));
    *out.status_mut() = parts.status;
    for (k, v) in &parts.headers {
        if !HOP_BY_HOP.contains(&k.as_str()) {
            out.headers_mut().append(k, v.clone());
        }
    }
    out
}
