//! Admission webhooks: calls the webhooks of `MutatingWebhookConfiguration` and
//! `ValidatingWebhookConfiguration` objects as kube-apiserver does (AdmissionReview v1
//! over HTTPS).
//!
//! Flow per write (an [`Admission`] hook): in the mutating phase every mutating
//! configuration (in name order) and each of its webhooks (in list order) whose `rules`,
//! `namespaceSelector` and `objectSelector` match is called in turn, and its JSON Patch is
//! applied before the next one; in the validating phase the validating webhooks are
//! called the same way and may only refuse. Configurations are read from the store on
//! every write (they are few, and reads are served from memory).
//!
//! Matching follows kube: `resources` entries `*`, `plural`, `plural/sub`, `*/sub`,
//! `plural/*`, `*/*` (a plain `*` or `plural` never matches a subresource, so status
//! updates reach only webhooks whose rules name `…/status`); `operations` `*` or
//! `CREATE`/`UPDATE`/`DELETE`; `scope` `*`/`Cluster`/`Namespaced`; of `matchConditions` only
//! the name-prefix form (`object.metadata.name.startsWith("…")`). The configurations
//! themselves are never sent to webhooks.
//!
//! Where to call: `clientConfig.url`, or `clientConfig.service` (`port` 443 and `path`
//! `/` when absent), routed to one ready endpoint of the Service on every call as
//! kube-apiserver's endpoint routing does ([`crate::routing`]): the connection goes to the
//! endpoint's address and port, the request names `https://<name>.<namespace>.svc:<port>`,
//! and the server certificate is verified for `<name>.<namespace>.svc` against `caBundle`,
//! or the cluster CA when it is empty. A Service that cannot be routed fails the call with
//! kube's words (`service "virt-api" not found`, `no endpoints available for service
//! "virt-api"`).
//!
//! Failures: a call that fails or exceeds `timeoutSeconds` (default 10) refuses the write
//! with 500 under `failurePolicy: Fail` (the default) and is skipped under `Ignore`. A
//! webhook answering `allowed: false` refuses with its `status` (code, reason, message,
//! causes; at least 400) and the message prefixed `admission webhook "<name>" denied the
//! request: `. `warnings` become `Warning` headers.

use std::time::Duration;

use axum::body::Bytes;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use kubevirt_store::Store;
use serde_json::{Value, json};
use tracing::{debug, warn};

use crate::admission::{Admission, AdmissionRequest, Operation, Phase};
use crate::cause::Cause;
use crate::client;
use crate::status::ApiError;

/// Default `timeoutSeconds`.
const DEFAULT_TIMEOUT_SECONDS: u64 = 10;

/// The webhook admission hook.
pub struct WebhookAdmission {
    store: Store,
    /// PEM CA used when a webhook has no `caBundle` (the cluster CA).
    cluster_ca: Vec<u8>,
    /// Keep-alive connections to the webhooks' endpoints.
    pool: client::ConnectionPool,
}

impl WebhookAdmission {
    /// A hook reading configurations from `store`; `cluster_ca` (PEM) verifies webhooks
    /// without a `caBundle`.
    pub fn new(store: Store, cluster_ca: Vec<u8>) -> WebhookAdmission {
        WebhookAdmission {
            store,
            cluster_ca,
            pool: client::ConnectionPool::default(),
        }
    }

    fn configurations(&self, phase: Phase) -> Vec<Value> {
        let plural = match phase {
            Phase::Mutating => "mutatingwebhookconfigurations",
            Phase::Validating => "validatingwebhookconfigurations",
        };
        let prefix = format!("/registry/admissionregistration.k8s.io/{plural}/");
        self.store
            .list(&prefix, None, None)
            .records
            .iter()
            .filter_map(|r| serde_json::from_slice(&r.value).ok())
            .collect()
    }

    fn namespace_labels(&self, ns: &str) -> Value {
        self.store
            .get(&format!("/registry/core/namespaces/{ns}"))
            .and_then(|r| serde_json::from_slice::<Value>(&r.value).ok())
            .map(|n| n["metadata"]["labels"].clone())
            .unwrap_or(Value::Null)
    }
}

/// Where a webhook is reached: its `url`, or a Service reference routed to one of the
/// Service's ready endpoints when the call is made.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Url(String),
    Service {
        namespace: String,
        name: String,
        port: i64,
        /// `service.path` (`/` when absent).
        path: String,
    },
}

impl Target {
    fn of(client_config: &Value) -> Result<Target, String> {
        if let Some(u) = client_config["url"].as_str() {
            return Ok(Target::Url(u.to_owned()));
        }
        let svc = &client_config["service"];
        let name = svc["name"].as_str().unwrap_or("");
        if name.is_empty() {
            return Err("clientConfig has neither url nor service".into());
        }
        let path = match svc["path"].as_str().unwrap_or("") {
            "" => "/".to_owned(),
            p => p.to_owned(),
        };
        Ok(Target::Service {
            namespace: svc["namespace"].as_str().unwrap_or("").to_owned(),
            name: name.to_owned(),
            port: svc["port"].as_i64().unwrap_or(443),
            path,
        })
    }

    /// The URL the call is made to as kube names it (`https://<svc>.<ns>.svc:<port><path>`
    /// for a Service reference), before the `timeout` query.
    fn url(&self) -> String {
        match self {
            Target::Url(u) => u.clone(),
            Target::Service {
                namespace,
                name,
                port,
                path,
            } => format!(
                "https://{}:{port}{path}",
                crate::routing::service_server_name(namespace, name)
            ),
        }
    }
}

/// Whether a `LabelSelector` (JSON form) matches `labels` (absent selector: everything).
pub fn selector_matches(selector: &Value, labels: &Value) -> bool {
    let label = |k: &str| labels.get(k).and_then(Value::as_str);
    if let Some(ml) = selector["matchLabels"].as_object()
        && !ml.iter().all(|(k, v)| label(k) == v.as_str())
    {
        return false;
    }
    let Some(exprs) = selector["matchExpressions"].as_array() else {
        return true;
    };
    exprs.iter().all(|e| {
        let key = e["key"].as_str().unwrap_or("");
        let values: Vec<&str> = e["values"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        match e["operator"].as_str().unwrap_or("") {
            "In" => label(key).is_some_and(|v| values.contains(&v)),
            "NotIn" => label(key).is_none_or(|v| !values.contains(&v)),
            "Exists" => label(key).is_some(),
            "DoesNotExist" => label(key).is_none(),
            _ => false,
        }
    })
}

/// The one `matchConditions` form evaluated: `object.metadata.name.startsWith("<prefix>")`
/// (what KubeVirt's eviction interceptors use); the prefix, if `expression` is that form.
fn name_prefix_condition(expression: &str) -> Option<&str> {
    let rest = expression
        .trim()
        .strip_prefix("object.metadata.name.startsWith(")?
        .strip_suffix(')')?
        .trim();
    let prefix = rest.strip_prefix('"')?.strip_suffix('"')?;
    (!prefix.contains(['"', '\\'])).then_some(prefix)
}

/// Whether the hook's `matchConditions` all hold for `object`. A condition in any other form
/// than [`name_prefix_condition`]'s is not evaluated and counts as met (the hook is called,
/// as when no conditions are given).
fn match_conditions_hold(hook: &Value, object: &Value) -> bool {
    let name = object["metadata"]["name"].as_str().unwrap_or("");
    hook["matchConditions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|c| {
            let expression = c["expression"].as_str().unwrap_or("");
            name_prefix_condition(expression).is_none_or(|p| name.starts_with(p))
        })
}

fn list_has(list: &Value, want: &str) -> bool {
    list.as_array()
        .is_some_and(|a| a.iter().any(|v| v == "*" || v == want))
}

/// Whether one rule matches the request.
fn rule_matches(rule: &Value, req: &AdmissionRequest<'_>) -> bool {
    let info = req.resource;
    if !list_has(&rule["apiGroups"], &info.group)
        || !list_has(&rule["apiVersions"], &info.version)
        || !list_has(&rule["operations"], req.operation.as_str())
    {
        return false;
    }
    let scope_ok = match rule["scope"].as_str().unwrap_or("*") {
        "Cluster" => !info.namespaced,
        "Namespaced" => info.namespaced,
        _ => true,
    };
    let plural = info.plural.as_str();
    let resource_ok = rule["resources"].as_array().is_some_and(|rs| {
        rs.iter().filter_map(Value::as_str).any(|r| {
            let (res, sub) = r.split_once('/').unwrap_or((r, ""));
            let res_ok = res == "*" || res == plural;
            match req.subresource {
                None => res_ok && sub.is_empty(),
                Some(s) => res_ok && (sub == "*" || sub == s),
            }
        })
    });
    scope_ok && resource_ok
}

/// The AdmissionReview sent for `req`.
fn review(uid: &str, req: &AdmissionRequest<'_>, object: &Value) -> Value {
    let info = req.resource;
    // The request's kind is the body's: an Eviction for `pods/eviction`, as kube sends it.
    let kind = match req.subresource {
        Some("eviction") => json!({"group": "policy", "version": "v1", "kind": "Eviction"}),
        _ => json!({"group": info.group, "version": info.version, "kind": info.kind}),
    };
    let resource = json!({"group": info.group, "version": info.version, "resource": info.plural});
    let (obj, options_kind) = match req.operation {
        Operation::Create => (object.clone(), "CreateOptions"),
        Operation::Update => (object.clone(), "UpdateOptions"),
        Operation::Delete => (Value::Null, "DeleteOptions"),
    };
    // The caller's groups; the server's own writes (no groups) are `system:authenticated`.
    let groups: Vec<&str> = match req.groups {
        Some(g) => g.iter().map(String::as_str).collect(),
        None => vec!["system:authenticated"],
    };
    let mut r = json!({
        "uid": uid,
        "kind": kind,
        "resource": resource,
        "requestKind": kind,
        "requestResource": resource,
        "name": req.name,
        "operation": req.operation.as_str(),
        "userInfo": {"username": req.user, "groups": groups},
        "object": obj,
        "oldObject": req.old_object.cloned().unwrap_or(Value::Null),
        "dryRun": req.dry_run,
        "options": {"kind": options_kind, "apiVersion": "meta.k8s.io/v1"},
    });
    if let Some(s) = req.subresource {
        r["subResource"] = json!(s);
    }
    if let Some(ns) = req.namespace {
        r["namespace"] = json!(ns);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": r})
}

/// The error for a webhook that said no.
fn denied(name: &str, status: &Value) -> ApiError {
    let code = status["code"]
        .as_u64()
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| *c >= 400)
        .unwrap_or(400);
    let reason = status["reason"].as_str().unwrap_or("");
    let message = status["message"].as_str().unwrap_or("");
    let by = format!("admission webhook \"{name}\" denied the request");
    let text = if !message.is_empty() {
        format!("{by}: {message}")
    } else if !reason.is_empty() {
        format!("{by}: {reason}")
    } else {
        format!("{by} without explanation")
    };
    let mut e = ApiError::new(code, reason, text);
    let d = &status["details"];
    e.name = d["name"].as_str().map(str::to_owned);
    e.group = d["group"].as_str().map(str::to_owned);
    e.kind = d["kind"].as_str().map(str::to_owned);
    e.causes = d["causes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| {
                    Cause::new(
                        c["reason"].as_str().unwrap_or(""),
                        c["field"].as_str().unwrap_or(""),
                        c["message"].as_str().unwrap_or(""),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    e
}

/// Further attempts of a webhook call whose connection failed (kube-apiserver's backoff has
/// five steps from 500 ms, factor 1.5).
const CONNECTION_RETRIES: u32 = 4;

impl WebhookAdmission {
    /// Posts the review to one webhook; returns the AdmissionReview `response`.
    async fn call(&self, hook: &Value, body: &Value) -> Result<Value, String> {
        let timeout = hook["timeoutSeconds"]
            .as_u64()
            .unwrap_or(DEFAULT_TIMEOUT_SECONDS)
            .clamp(1, 30);
        let target = Target::of(&hook["clientConfig"])?;
        let base = target.url();
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}timeout={timeout}s");
        let ca = match hook["clientConfig"]["caBundle"].as_str() {
            Some(b) if !b.is_empty() => STANDARD
                .decode(b)
                .map_err(|e| format!("caBundle is not base64: {e}"))?,
            _ => self.cluster_ca.clone(),
        };
        // Checked once per bundle; the pool keeps the configuration for its connections.
        self.pool.tls_for(&ca).map_err(|e| e.to_string())?;
        let fail =
            |e: &dyn std::fmt::Display| format!("failed to call webhook: Post \"{url}\": {e}");
        // Like kube-apiserver's webhook client, a call whose connection failed (the endpoint's
        // pod went away between being picked and answering — a drain evicting virt-api) is
        // tried again with backoff, against a freshly picked endpoint, within the timeout.
        let attempt = || async {
            // A Service reference is routed to one ready endpoint per call (kube resolves
            // it when dialling); the certificate is checked for the Service's DNS name and
            // the request names that host.
            let mut req = http::Request::post(&url);
            let server_name = match &target {
                Target::Url(_) => None,
                Target::Service {
                    namespace,
                    name,
                    port,
                    ..
                } => {
                    let ep = crate::routing::resolve_endpoint(&self.store, namespace, name, *port)
                        .map_err(|e| (fail(&e), false))?;
                    let origin = url
                        .find("://")
                        .and_then(|i| url[i + 3..].find('/').map(|j| i + 3 + j))
                        .map_or("/", |start| &url[start..]);
                    req = http::Request::post(format!("{}{origin}", ep.base_url()))
                        .header(http::header::HOST, format!("{}:{port}", ep.server_name));
                    Some(ep.server_name)
                }
            };
            let req = req
                .header(http::header::CONTENT_TYPE, "application/json")
                .header(http::header::ACCEPT, "application/json")
                .body(Bytes::from(serde_json::to_vec(body).unwrap_or_default()))
                .map_err(|e| (fail(&e), false))?;
            let (status, bytes) = self
                .pool
                .send_collect(&ca, server_name.as_deref(), req)
                .await
                .map_err(|e| {
                    let mut msg = e.to_string();
                    let mut src = std::error::Error::source(&e);
                    while let Some(s) = src {
                        msg = format!("{msg}: {s}");
                        src = s.source();
                    }
                    (fail(&msg), true)
                })?;
            if !status.is_success() {
                return Err((fail(&format!("the server answered {status}")), false));
            }
            serde_json::from_slice::<Value>(&bytes)
                .map_err(|e| (format!("received invalid webhook response: {e}"), false))
        };
        let exchange = async {
            let mut delay = Duration::from_millis(500);
            let mut left = CONNECTION_RETRIES;
            loop {
                match attempt().await {
                    Ok(review) => return Ok(review),
                    Err((message, true)) if left > 0 => {
                        tracing::debug!(%message, "webhook call failed to connect; trying again");
                        left -= 1;
                        tokio::time::sleep(delay).await;
                        delay = delay.mul_f32(1.5);
                    }
                    Err((message, _)) => return Err(message),
                }
            }
        };
        let review = tokio::time::timeout(Duration::from_secs(timeout), exchange)
            .await
            .map_err(|_| fail(&"context deadline exceeded"))??;
        let response = review["response"].clone();
        if response["uid"] != body["request"]["uid"] {
            return Err(
                "received invalid webhook response: expected response.uid to match the request"
                    .into(),
            );
        }
        Ok(response)
    }
}

#[async_trait::async_trait]
impl Admission for WebhookAdmission {
    async fn admit(
        &self,
        phase: Phase,
        request: &AdmissionRequest<'_>,
        object: &mut Value,
    ) -> Result<Vec<String>, ApiError> {
        let info = request.resource;
        if info.group == "admissionregistration.k8s.io" {
            return Ok(Vec::new());
        }
        let configs = self.configurations(phase);
        if configs.is_empty() {
            return Ok(Vec::new());
        }
        let ns_labels = match (info.namespaced, request.namespace) {
            (true, Some(ns)) => Some(self.namespace_labels(ns)),
            _ if info.group.is_empty() && info.kind == "Namespace" => {
                Some(object["metadata"]["labels"].clone())
            }
            _ => None,
        };
        let mut warnings = Vec::new();
        for config in &configs {
            let Some(hooks) = config["webhooks"].as_array() else {
                continue;
            };
            for hook in hooks {
                let name = hook["name"].as_str().unwrap_or("");
                let rules_ok = hook["rules"]
                    .as_array()
                    .is_some_and(|rs| rs.iter().any(|r| rule_matches(r, request)));
                let ns_ok = ns_labels
                    .as_ref()
                    .is_none_or(|l| selector_matches(&hook["namespaceSelector"], l));
                let obj_sel = &hook["objectSelector"];
                let obj_ok = selector_matches(obj_sel, &object["metadata"]["labels"])
                    || request
                        .old_object
                        .is_some_and(|o| selector_matches(obj_sel, &o["metadata"]["labels"]));
                if !(rules_ok && ns_ok && obj_ok && match_conditions_hold(hook, object)) {
                    continue;
                }
                let uid = uuid::Uuid::new_v4().to_string();
                let body = review(&uid, request, object);
                debug!(webhook = name, "calling admission webhook");
                let response = match self.call(hook, &body).await {
                    Ok(r) => r,
                    Err(msg) => {
                        if hook["failurePolicy"] == "Ignore" {
                            warn!(webhook = name, error = %msg, "admission webhook failed; ignored");
                            continue;
                        }
                        return Err(ApiError::internal(format!(
                            "Internal error occurred: failed calling webhook \"{name}\": {msg}"
                        )));
                    }
                };
                if let Some(ws) = response["warnings"].as_array() {
                    warnings.extend(ws.iter().filter_map(Value::as_str).map(str::to_owned));
                }
                if response["allowed"] != true {
                    return Err(denied(name, &response["status"]));
                }
                if phase == Phase::Mutating
                    && request.operation != Operation::Delete
                    && let Some(p) = response["patch"].as_str()
                {
                    *object = apply_patch(name, p, object)?;
                }
            }
        }
        Ok(warnings)
    }
}

fn apply_patch(name: &str, patch_b64: &str, object: &Value) -> Result<Value, ApiError> {
    let bad = |why: String| {
        ApiError::internal(format!(
            "Internal error occurred: failed calling webhook \"{name}\": {why}"
        ))
    };
    let bytes = STANDARD
        .decode(patch_b64)
        .map_err(|e| bad(format!("the patch is not base64: {e}")))?;
    let patch: Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("the patch is not JSON: {e}")))?;
    let patched = crate::patch::json_patch(object, &patch)
        .map_err(|e| bad(format!("applying the patch: {e}")))?;
    if !patched.is_object() {
        return Err(bad("the patched object is not a JSON object".into()));
    }
    if !(patched["metadata"].is_null() || patched["metadata"].is_object()) {
        return Err(bad(
            "the patched object's metadata is not a JSON object".into()
        ));
    }
    Ok(patched)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    #[test]
    fn name_prefix_match_conditions_are_evaluated_and_others_count_as_met() {
        let hook = json!({"matchConditions": [
            {"name": "only-vms", "expression": "object.metadata.name.startsWith(\"virt-launcher\")"}]});
        let named = |n: &str| json!({"metadata": {"name": n}});
        assert!(match_conditions_hold(
            &hook,
            &named("virt-launcher-vm-abcde")
        ));
        assert!(!match_conditions_hold(&hook, &named("virt-api-5d8f")));
        let other = json!({"matchConditions": [{"name": "x", "expression": "request.userInfo.username == 'a'"}]});
        assert!(match_conditions_hold(&other, &named("anything")));
        assert!(match_conditions_hold(&json!({}), &named("anything")));
        assert_eq!(
            name_prefix_condition("object.metadata.name.startsWith(\"hp-volume-\")"),
            Some("hp-volume-")
        );
        assert_eq!(
            name_prefix_condition("object.metadata.name.startsWith(x)"),
            None
        );
    }

    #[test]
    fn resource_rules_match_subresources_only_when_named() {
        let reg = Registry::new();
        let pods = reg.find("", "v1", "pods").unwrap();
        let req = |sub| AdmissionRequest {
            operation: Operation::Update,
            resource: &pods,
            subresource: sub,
            namespace: Some("default"),
            name: "p",
            old_object: None,
            dry_run: false,
            user: "u",
            groups: None,
        };
        let rule = |res: &str| json!({"apiGroups": [""], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": [res]});
        assert!(rule_matches(&rule("pods"), &req(None)));
        assert!(rule_matches(&rule("*"), &req(None)));
        assert!(!rule_matches(&rule("*"), &req(Some("status"))));
        assert!(!rule_matches(&rule("pods"), &req(Some("status"))));
        assert!(rule_matches(&rule("pods/status"), &req(Some("status"))));
        assert!(rule_matches(&rule("*/status"), &req(Some("status"))));
        assert!(rule_matches(&rule("*/*"), &req(Some("status"))));
        assert!(!rule_matches(&rule("configmaps"), &req(None)));
        let mut create_only = rule("pods");
        create_only["operations"] = json!(["CREATE"]);
        assert!(!rule_matches(&create_only, &req(None)));
    }

    #[test]
    fn label_selectors_in_json_form_match_as_kube() {
        let labels = json!({"a": "1", "b": "2"});
        assert!(selector_matches(&Value::Null, &labels));
        assert!(selector_matches(&json!({}), &Value::Null));
        assert!(selector_matches(
            &json!({"matchLabels": {"a": "1"}}),
            &labels
        ));
        assert!(!selector_matches(
            &json!({"matchLabels": {"a": "2"}}),
            &labels
        ));
        let expr = |op: &str, values: Value| json!({"matchExpressions": [{"key": "a", "operator": op, "values": values}]});
        assert!(selector_matches(&expr("In", json!(["1", "3"])), &labels));
        assert!(!selector_matches(&expr("NotIn", json!(["1"])), &labels));
        assert!(selector_matches(&expr("Exists", Value::Null), &labels));
        assert!(!selector_matches(
            &expr("DoesNotExist", Value::Null),
            &labels
        ));
    }

    fn patch_b64(patch: &Value) -> String {
        STANDARD.encode(patch.to_string())
    }

    #[test]
    fn a_patch_replacing_the_root_with_a_non_object_is_an_internal_error() {
        let object = json!({"metadata": {"name": "x"}});
        for value in [json!("x"), json!([1]), json!(null), json!(3)] {
            let patch = json!([{"op": "replace", "path": "", "value": value}]);
            let e = apply_patch("m.example.com", &patch_b64(&patch), &object).unwrap_err();
            assert_eq!(e.code, 500, "{value}");
            assert_eq!(
                e.message,
                "Internal error occurred: failed calling webhook \"m.example.com\": the patched object is not a JSON object"
            );
        }
        let patch = json!([{"op": "replace", "path": "/metadata", "value": "x"}]);
        let e = apply_patch("m", &patch_b64(&patch), &object).unwrap_err();
        assert_eq!(e.code, 500);
        let patch = json!([{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}]);
        let ok = apply_patch("m", &patch_b64(&patch), &object).unwrap();
        assert_eq!(ok["metadata"]["labels"]["a"], "b");
    }

    #[test]
    fn a_denial_keeps_the_webhooks_status_and_prefixes_the_message() {
        let e = denied(
            "v.example.com",
            &json!({"code": 422, "reason": "Invalid", "message": "spec.x: Invalid value", "details": {"name": "vm", "kind": "VirtualMachine", "group": "kubevirt.io", "causes": [{"reason": "FieldValueInvalid", "field": "spec.x", "message": "bad"}]}}),
        );
        assert_eq!(e.code, 422);
        assert_eq!(e.reason, "Invalid");
        assert_eq!(
            e.message,
            "admission webhook \"v.example.com\" denied the request: spec.x: Invalid value"
        );
        assert_eq!(e.causes[0].field, "spec.x");
        assert_eq!(e.kind.as_deref(), Some("VirtualMachine"));
        let bare = denied("w", &Value::Null);
        assert_eq!(bare.code, 400);
        assert_eq!(
            bare.message,
            "admission webhook \"w\" denied the request without explanation"
        );
    }
}
