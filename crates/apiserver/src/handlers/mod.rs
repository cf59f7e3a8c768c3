//! HTTP entry point for resource requests: parse, authorize the shape, decode the body,
//! dispatch to the verb handler, and render the reply (plain JSON or a Table).
//!
//! One file per verb: [`create`], [`get`], [`list`], [`update`], [`patch`], [`delete`],
//! [`watch`], plus [`binding`] for `pods/binding`, [`eviction`] for `pods/eviction`, [`scale`], [`token_request`] for
//! `serviceaccounts/token` and [`reviews`] for the `authentication.k8s.io` reviews.

pub mod binding;
pub mod common;
pub mod create;
pub mod delete;
pub mod eviction;
pub mod get;
pub mod list;
pub mod patch;
pub mod reviews;
pub mod scale;
pub mod token_request;
pub mod update;
pub mod watch;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Value, json};
use tracing::Instrument;

use crate::auth::User;
use crate::registry::ResourceInfo;
use crate::request::{ApiPath, Query, ResourcePath, Verb, parse_path, verb_for};
use crate::selectors::Selectors;
use crate::state::ApiState;
use crate::status::{ApiError, json_response};
use crate::table;
use common::{Reply, WriteOptions};

/// Largest request body accepted (kube-apiserver's limit).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// What the metrics layer records about a resource request.
#[derive(Clone, Debug)]
pub struct RequestInfo {
    pub verb: &'static str,
    pub group: String,
    pub resource: String,
    pub subresource: String,
}

/// Decodes a request body by its `Content-Type`: JSON (also the patch types), YAML, or
/// Kubernetes protobuf.
pub fn decode_body(content_type: &str, body: &[u8]) -> Result<Value, ApiError> {
    let base = content_type.split(';').next().unwrap_or("").trim();
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    let value = match base {
        "application/vnd.kubernetes.protobuf" => crate::protobuf::decode_to_json(body)
            .map_err(|e| ApiError::unsupported_media_type(e.to_string()))?,
        "application/yaml"
        | "application/x-yaml"
        | "text/yaml"
        | "application/apply-patch+yaml" => match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(_) => serde_saphyr::from_slice::<Value>(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?,
        },
        _ => serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("error decoding the request body as JSON: {e}"))
        })?,
    };
    Ok(value)
}

/// Checks that a decoded object is a JSON object with an object (or absent) `metadata`.
pub fn require_object(v: &Value) -> Result<(), ApiError> {
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    if !(v["metadata"].is_null() || v["metadata"].is_object()) {
        return Err(ApiError::bad_request("metadata must be an object"));
    }
    Ok(())
}

fn header_str(req: &Request, name: header::HeaderName) -> String {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

fn render(reply: Reply, info: RequestInfo) -> Response {
    let mut resp = json_response(reply.code, &reply.body);
    for w in reply.warnings {
        let text = format!("299 - {}", serde_json::Value::String(w));
        if let Ok(v) = HeaderValue::from_str(&text) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
    resp.extensions_mut().insert(info);
    resp
}

fn render_error(e: ApiError, info: Option<RequestInfo>) -> Response {
    let mut resp = e.into_response();
    if let Some(i) = info {
        resp.extensions_mut().insert(i);
    }
    resp
}

/// The axum handler for every `/api/…` and `/apis/…` path.
pub async fn api_request(State(state): State<Arc<ApiState>>, req: Request) -> Response {
    let path = req.uri().path().to_owned();
    if let Some(target) = crate::aggregation::target(&state, &path) {
        return crate::aggregation::proxy(target, req).await;
    }
    match parse_path(&path) {
        Ok(ApiPath::Resource(rp)) => {
            let span = tracing::info_span!(
                "request",
                method = %req.method(),
                resource = %rp.plural,
                namespace = rp.namespace.as_deref().unwrap_or(""),
                name = rp.name.as_deref().unwrap_or(""),
            );
            resource_request(state, rp, req).instrument(span).await
        }
        Ok(other) => {
            let accept = header_str(&req, header::ACCEPT);
            crate::discovery::serve(&state, &other, &accept)
        }
        Err(e) => render_error(e, None),
    }
}

async fn resource_request(state: Arc<ApiState>, rp: ResourcePath, req: Request) -> Response {
    let query = match Query::parse(req.uri().query().unwrap_or("")) {
        Ok(q) => q,
        Err(e) => return render_error(e, None),
    };
    let Some(info) = state.registry.find(&rp.group, &rp.version, &rp.plural) else {
        return render_error(ApiError::no_route(), None);
    };
    let verb = match verb_for(req.method().as_str(), &rp, &query) {
        Ok(v) => v,
        Err(e) => return render_error(e, None),
    };
    let ri = RequestInfo {
        verb: verb.as_str(),
        group: info.group.clone(),
        resource: info.plural.clone(),
        subresource: rp.subresource.clone().unwrap_or_default(),
    };
    match execute(state, info, rp, query, verb, req).await {
        Ok(resp) => {
            let mut resp = resp;
            resp.extensions_mut().insert(ri);
            resp
        }
        Err(e) => render_error(e, Some(ri)),
    }
}

async fn read_body(req: Request) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(req.into_body(), MAX_BODY_BYTES)
        .await
        .map_err(|_| {
            ApiError::too_large(format!(
                "the request body is larger than {MAX_BODY_BYTES} bytes"
            ))
        })
}

async fn execute(
    state: Arc<ApiState>,
    info: Arc<ResourceInfo>,
    rp: ResourcePath,
    query: Query,
    verb: Verb,
    req: Request,
) -> Result<Response, ApiError> {
    if rp.namespace.is_some() && !info.namespaced {
        return Err(ApiError::no_route());
    }
    if let Some(sub) = &rp.subresource {
        let served = info.subresources.iter().any(|s| s == sub);
        if !served {
            return Err(ApiError::no_route());
        }
    }
    let ns = rp.namespace.as_deref();
    let name = rp.name.as_deref().unwrap_or("");
    let sub = rp.subresource.as_deref();
    if sub == Some("log") {
        return match verb {
            Verb::Get => {
                let q = req.uri().query().unwrap_or("").to_owned();
                crate::logs::serve(&state, ns.unwrap_or(""), name, &q).await
            }
            _ => Err(ApiError::method_not_allowed(
                "the server does not allow this method on the requested resource",
            )),
        };
    }
    let accept = header_str(&req, header::ACCEPT);
    let content_type = header_str(&req, header::CONTENT_TYPE);
    let caller = req.extensions().get::<User>().cloned().unwrap_or_default();
    let opts = WriteOptions {
        dry_run: query.dry_run,
        field_validation: query.field_validation,
        user: caller.name.clone(),
        groups: Some(caller.groups.clone()),
    };
    let ri = RequestInfo {
        verb: verb.as_str(),
        group: info.group.clone(),
        resource: info.plural.clone(),
        subresource: sub.unwrap_or("").to_owned(),
    };
    if info.create_only {
        if verb != Verb::Create {
            return Err(ApiError::method_not_allowed(
                "the server does not allow this method on the requested resource",
            ));
        }
        let body = read_body(req).await?;
        let obj = decode_body(&content_type, &body)?;
        require_object(&obj)?;
        let reply = reviews::create(&state, &info.plural, ns, &caller, &obj)?;
        return Ok(render(reply, ri));
    }
    if sub == Some("scale") {
        let reply = scale_request(&state, &info, ns, name, verb, &content_type, req, &opts).await?;
        return Ok(render(reply, ri));
    }
    let table_include = table::wants_table(&accept).then_some(query.include_object);
    let reply = match verb {
        Verb::Get | Verb::List => {
            return read_request(&state, &info, &rp, &query, verb, table_include, ri);
        }
        Verb::Watch => return watch_response(state, info, &rp, &query, table_include),
        Verb::Create => {
            let body = read_body(req).await?;
            let obj = decode_body(&content_type, &body)?;
            require_object(&obj)?;
            if sub == Some("binding") {
                binding::bind(&state, &info, ns, name, &obj, &opts).await?
            } else if sub == Some("eviction") {
                eviction::evict(&state, &info, ns, name, &obj, &opts).await?
            } else if sub == Some("token") {
                token_request::create(&state, ns.unwrap_or(""), name, &obj)?
            } else if sub.is_some() {
                return Err(ApiError::method_not_allowed(
                    "the server does not allow this method on the requested resource",
                ));
            } else {
                create::create(&state, &info, ns, obj, &opts).await?
            }
        }
        Verb::Update => {
            let body = read_body(req).await?;
            let obj = decode_body(&content_type, &body)?;
            require_object(&obj)?;
            update::update(&state, &info, ns, name, sub, obj, &opts).await?
        }
        Verb::Patch => {
            let pt = patch::PatchType::from_content_type(&content_type)?;
            let body = read_body(req).await?;
            let p = decode_body(&content_type, &body)?;
            patch::patch(&state, &info, ns, name, sub, pt, &p, &opts).await?
        }
        Verb::Delete | Verb::DeleteCollection => {
            let body = read_body(req).await?;
            delete_request(&state, &info, &rp, &query, verb, &content_type, &body, opts).await?
        }
    };
    Ok(render(reply, ri))
}

/// GET, PUT and PATCH of the `scale` subresource.
#[allow(clippy::too_many_arguments)]
async fn scale_request(
    state: &ApiState,
    info: &ResourceInfo,
    ns: Option<&str>,
    name: &str,
    verb: Verb,
    content_type: &str,
    req: Request,
    opts: &WriteOptions,
) -> Result<Reply, ApiError> {
    match verb {
        Verb::Get => scale::get(state, info, ns, name),
        Verb::Update => {
            let body = read_body(req).await?;
            let obj = decode_body(content_type, &body)?;
            require_object(&obj)?;
            scale::update(state, info, ns, name, &obj, opts).await
        }
        Verb::Patch => {
            let pt = patch::PatchType::from_content_type(content_type)?;
            let body = read_body(req).await?;
            let p = decode_body(content_type, &body)?;
            scale::patch(state, info, ns, name, pt, &p, opts).await
        }
        _ => Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        )),
    }
}

fn table_response(t: &Value) -> Response {
    let mut resp = json_response(200, t);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json;as=Table;v=v1;g=meta.k8s.io"),
    );
    resp
}

fn read_request(
    state: &ApiState,
    info: &ResourceInfo,
    rp: &ResourcePath,
    query: &Query,
    verb: Verb,
    table_include: Option<crate::request::IncludeObject>,
    ri: RequestInfo,
) -> Result<Response, ApiError> {
    let ns = rp.namespace.as_deref();
    let name = rp.name.as_deref().unwrap_or("");
    let reply = match verb {
        Verb::Get => {
            let r = get::get(state, info, ns, name)?;
            match table_include {
                Some(inc) => {
                    let meta =
                        json!({"resourceVersion": r.body["metadata"]["resourceVersion"].clone()});
                    return Ok(table_response(&table::table(
                        info,
                        &[r.body],
                        &meta,
                        inc,
                        jiff::Timestamp::now(),
                    )));
                }
                None => r,
            }
        }
        Verb::List => {
            let selectors = Selectors::parse(
                query.label_selector.as_deref(),
                query.field_selector.as_deref(),
            )?;
            let r = list::list(
                state,
                info,
                ns,
                &selectors,
                query.limit,
                query.continue_token.as_deref(),
            )?;
            match table_include {
                Some(inc) => {
                    let items = r.body["items"].as_array().cloned().unwrap_or_default();
                    return Ok(table_response(&table::table(
                        info,
                        &items,
                        &r.body["metadata"],
                        inc,
                        jiff::Timestamp::now(),
                    )));
                }
                None => r,
            }
        }
        _ => return Err(ApiError::method_not_allowed("not a read")),
    };
    Ok(render(reply, ri))
}

fn watch_response(
    state: Arc<ApiState>,
    info: Arc<ResourceInfo>,
    rp: &ResourcePath,
    query: &Query,
    table_include: Option<crate::request::IncludeObject>,
) -> Result<Response, ApiError> {
    let selectors = Selectors::parse(
        query.label_selector.as_deref(),
        query.field_selector.as_deref(),
    )?;
    let params = watch::WatchParams {
        namespace: rp.namespace.clone(),
        resource_version: query.resource_version.clone(),
        selectors,
        bookmarks: query.allow_watch_bookmarks,
        timeout: query.timeout_seconds.map(Duration::from_secs),
        send_initial_events: query.send_initial_events == Some(true),
        table: table_include,
    };
    let rx = watch::start(state, info, params)?;
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, Infallible>);
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

#[allow(clippy::too_many_arguments)]
async fn delete_request(
    state: &ApiState,
    info: &ResourceInfo,
    rp: &ResourcePath,
    query: &Query,
    verb: Verb,
    content_type: &str,
    body: &[u8],
    opts: WriteOptions,
) -> Result<Reply, ApiError> {
    let mut options: delete::DeleteOptions = if body.iter().all(u8::is_ascii_whitespace) {
        delete::DeleteOptions::default()
    } else {
        let v = decode_body(content_type, body)?;
        serde_json::from_value(v)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
    };
    if query.grace_period_seconds.is_some() {
        options.grace_period_seconds = query.grace_period_seconds;
    }
    if query.propagation_policy.is_some() {
        options.propagation_policy = query.propagation_policy.clone();
    }
    let opts = WriteOptions {
        dry_run: opts.dry_run || options.dry_run.iter().any(|d| d == "All"),
        ..opts
    };
    let ns = rp.namespace.as_deref();
    if verb == Verb::Delete {
        let name = rp.name.as_deref().unwrap_or("");
        delete::delete(state, info, ns, name, &options, &opts).await
    } else {
        let selectors = Selectors::parse(
            query.label_selector.as_deref(),
            query.field_selector.as_deref(),
        )?;
        delete::delete_collection(state, info, ns, &selectors, &options, &opts).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_yaml_and_garbage_bodies_decode_as_expected() {
        let j = decode_body("application/json", br#"{"a":1}"#).unwrap();
        assert_eq!(j["a"], 1);
        let y = decode_body("application/yaml", b"a: 1\nb: [x]\n").unwrap();
        assert_eq!(y["b"][0], "x");
        assert_eq!(
            decode_body("application/json", b"{nope").unwrap_err().code,
            400
        );
        assert_eq!(
            decode_body("application/json", b"  ").unwrap_err().code,
            400
        );
        assert!(require_object(&json!([1])).is_err());
        assert!(require_object(&json!({"metadata": 3})).is_err());
    }
}
