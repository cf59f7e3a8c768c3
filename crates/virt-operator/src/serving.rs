//! virt-operator's two HTTPS ports, as upstream's: `/metrics` on 8443 and the admission
//! webhooks of `virt-operator-validator` on 8444, both with the certificate of the Secret
//! `kubevirt-operator-certs` (mounted, followed per handshake). The operator issues that Secret
//! itself in its first pass, so the ports open once its files appear.
//!
//! - `/metrics`: `kubevirt_virt_operator_ready_status`, `kubevirt_virt_operator_leading_status`
//!   and the REST client families ([`kubevirt_api::rest_client_metrics`]).
//! - `/kubevirt-validate-create`: a second KubeVirt CR is refused ("Kubevirt is already
//!   created"); the first passes (the webhook is installed by the operator after it).
//! - `/kubevirt-validate-update`: upstream's checks of the CR ([`validate_update`]).
//! - `/kubevirt-validate-delete`: with `uninstallStrategy: BlockUninstallIfWorkloadsExist` on a
//!   `Deployed` CR, the deletion is refused while VMIs, VMs or VMI replica sets exist, with
//!   upstream's message.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kube::api::{Api, ListParams};
use kubevirt_api::rest_client_metrics::RestClientMetrics;
use kubevirt_api::v1::{KubeVirt, KubeVirtPhase};
use kubevirt_install::virt_operator::{METRICS_PORT, WEBHOOK_PORT, paths};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use virt_api::validate::Cause;
use virt_api::webhook::review::{Outcome, respond, review_request};

/// How often the ports look for the certificate before the operator has issued it.
const CERTIFICATE_POLL: Duration = Duration::from_millis(500);

/// The operator's component gauges.
#[derive(Clone, Debug, Default)]
pub struct OperatorMetrics {
    ready: Gauge,
    leading: Gauge,
}

impl OperatorMetrics {
    /// `kubevirt_virt_operator_ready_status`.
    pub fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// `kubevirt_virt_operator_leading_status`.
    pub fn set_leading(&self, leading: bool) {
        self.leading.set(i64::from(leading));
    }

    fn registry(&self) -> Registry {
        let mut registry = Registry::default();
        registry.register(
            "kubevirt_virt_operator_ready_status",
            "Indication for a virt-operator that is ready to take the lead.",
            self.ready.clone(),
        );
        registry.register(
            "kubevirt_virt_operator_leading_status",
            "Indication for an operating virt-operator.",
            self.leading.clone(),
        );
        RestClientMetrics::shared().register(&mut registry);
        registry
    }
}

/// The metrics port's routes.
pub fn metrics_router(metrics: &OperatorMetrics) -> Router {
    let registry = Arc::new(metrics.registry());
    Router::new().route(
        "/metrics",
        get(move || {
            let registry = Arc::clone(&registry);
            async move { kubevirt_api::exposition::openmetrics_response(&registry).into_response() }
        }),
    )
}

#[derive(Clone)]
struct Webhooks {
    client: kube::Client,
}

/// The webhook port's routes.
pub fn webhook_router(client: kube::Client) -> Router {
    Router::new()
        .route(paths::CREATE, post(review))
        .route(paths::UPDATE, post(review))
        .route(paths::DELETE, post(review))
        .with_state(Webhooks { client })
}

async fn review(State(hooks): State<Webhooks>, uri: Uri, Json(body): Json<Value>) -> Response {
    let outcome = match review_request(&body) {
        Ok(request) => match uri.path() {
            paths::CREATE => admit_create(&hooks.client).await,
            paths::UPDATE => match serde_json::from_value::<KubeVirt>(request["object"].clone()) {
                Ok(kv) => Outcome::causes(validate_update(&kv)),
                Err(e) => Outcome::error(format!("the KubeVirt object cannot be decoded: {e}")),
            },
            _ => admit_delete(&hooks.client, request).await,
        },
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    match respond(&body, outcome) {
        Ok(answer) => Json(answer).into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

async fn admit_create(client: &kube::Client) -> Outcome {
    match Api::<KubeVirt>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) if list.items.is_empty() => Outcome::default(),
        Ok(_) => Outcome::error("Kubevirt is already created"),
        Err(e) => Outcome::error(e.to_string()),
    }
}

async fn admit_delete(client: &kube::Client, request: &Value) -> Outcome {
    let namespace = request["namespace"].as_str().unwrap_or_default();
    let name = request["name"].as_str().unwrap_or_default();
    let api: Api<KubeVirt> = Api::namespaced(client.clone(), namespace);
    let kv = if name.is_empty() {
        match api.list(&ListParams::default()).await {
            Ok(list) => list.items.into_iter().next(),
            Err(e) => return Outcome::error(e.to_string()),
        }
    } else {
        match api.get_opt(name).await {
            Ok(kv) => kv,
            Err(e) => return Outcome::error(e.to_string()),
        }
    };
    let Some(kv) = kv else {
        return Outcome::default();
    };
    let blocks = kv.spec.uninstall_strategy.as_deref() == Some("BlockUninstallIfWorkloadsExist");
    let deployed =
        kv.status.as_ref().and_then(|s| s.phase.as_ref()) == Some(&KubeVirtPhase::Deployed);
    if !blocks || !deployed {
        return Outcome::default();
    }
    match crate::kubevirt::workloads_present(client).await {
        Ok(Some(what)) => Outcome::error(crate::kubevirt::uninstall_blocked_message(what)),
        Ok(None) => Outcome::default(),
        Err(e) => Outcome::error(format!("{e:#}")),
    }
}

fn not_supported(message: impl Into<String>, field: &str) -> Cause {
    Cause::new("FieldValueNotSupported", message, field)
}

fn invalid(message: impl Into<String>, field: &str) -> Cause {
    Cause::new("FieldValueInvalid", message, field)
}

/// Upstream's checks of an updated KubeVirt CR that apply here: the `customizeComponents`
/// patches are JSON, and the self-signed rotation's lifetimes are consistent (the deprecated
/// intervals not mixed with `ca`/`server`, `renewBefore` within `duration`, the server's
/// `duration` within the CA's). Beyond upstream, a lifetime that is not a Go duration is
/// refused with its field path (upstream's decoder fails the whole review on it).
pub fn validate_update(kv: &KubeVirt) -> Vec<Cause> {
    let mut causes = Vec::new();
    let patches = kv
        .spec
        .customize_components
        .as_ref()
        .map(|c| c.patches.as_slice())
        .unwrap_or_default();
    for (i, patch) in patches.iter().enumerate() {
        if serde_json::from_str::<Value>(&patch.patch).is_err() {
            causes.push(not_supported(
                format!("patch {:?} is not valid JSON", patch.patch),
                &format!("spec.customizeComponents.patches[{i}].patch"),
            ));
        }
    }
    causes.extend(validate_certificates(kv));
    causes
}

fn validate_certificates(kv: &KubeVirt) -> Vec<Cause> {
    let Some(config) = kv
        .spec
        .certificate_rotate_strategy
        .as_ref()
        .and_then(|s| s.self_signed.as_ref())
    else {
        return Vec::new();
    };
    let base = "spec.certificateRotateStrategy.selfSigned";
    let mut causes = Vec::new();
    let deprecated = config.ca_rotate_interval.is_some()
        || config.cert_rotate_interval.is_some()
        || config.ca_overlap_interval.is_some();
    if deprecated && (config.ca.is_some() || config.server.is_some()) {
        causes.push(not_supported(
            "caRotateInterval, certRotateInterval and caOverlapInterval are deprecated and conflict with CertConfig defined rotation parameters",
            base,
        ));
    }
    let fields = [
        ("caRotateInterval", config.ca_rotate_interval.as_ref()),
        ("certRotateInterval", config.cert_rotate_interval.as_ref()),
        ("caOverlapInterval", config.ca_overlap_interval.as_ref()),
        (
            "ca.duration",
            config.ca.as_ref().and_then(|c| c.duration.as_ref()),
        ),
        (
            "ca.renewBefore",
            config.ca.as_ref().and_then(|c| c.renew_before.as_ref()),
        ),
        (
            "server.duration",
            config.server.as_ref().and_then(|c| c.duration.as_ref()),
        ),
        (
            "server.renewBefore",
            config.server.as_ref().and_then(|c| c.renew_before.as_ref()),
        ),
    ];
    let mut unreadable = false;
    for (field, value) in fields {
        if let Some(value) = value
            && kubevirt_api::duration::parse_go_duration(value).is_none_or(|d| d.is_zero())
        {
            unreadable = true;
            causes.push(invalid(
                format!("{value:?} is not a positive duration (such as \"24h\" or \"90m\")"),
                &format!("{base}.{field}"),
            ));
        }
    }
    if unreadable {
        return causes;
    }
    let lifetimes = crate::certificates::Lifetimes::from_cr(Some(kv));
    if lifetimes.ca < lifetimes.ca_renew_before {
        causes.push(invalid(
            "CA RenewBefore cannot exceed Duration (spec.certificateRotationStrategy.selfSigned.ca.duration < spec.certificateRotationStrategy.selfSigned.ca.renewBefore)",
            &format!("{base}.ca.renewBefore"),
        ));
    }
    if lifetimes.server < lifetimes.server_renew_before {
        causes.push(invalid(
            "Cert RenewBefore cannot exceed Duration (spec.certificateRotationStrategy.selfSigned.server.duration < spec.certificateRotationStrategy.selfSigned.server.renewBefore)",
            &format!("{base}.server.renewBefore"),
        ));
    }
    if lifetimes.server > lifetimes.ca {
        causes.push(invalid(
            "Certificate duration cannot exceed CA (spec.certificateRotationStrategy.selfSigned.server.duration > spec.certificateRotationStrategy.selfSigned.ca.duration)",
            &format!("{base}.server.duration"),
        ));
    }
    causes
}

/// Serves both ports on `address` once the certificate files in `certificates_dir` exist,
/// until `cancel` fires.
pub async fn serve(
    client: kube::Client,
    address: std::net::IpAddr,
    certificates_dir: PathBuf,
    metrics: OperatorMetrics,
    cancel: CancellationToken,
) {
    let (cert, key) = (
        certificates_dir.join("tls.crt"),
        certificates_dir.join("tls.key"),
    );
    let swappable = loop {
        if let Ok(found) = kubevirt_tls::SwappableCert::following_files(&cert, &key) {
            break found;
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(CERTIFICATE_POLL) => {}
        }
    };
    let mut tasks = Vec::new();
    for (port, router) in [
        (METRICS_PORT, metrics_router(&metrics)),
        (WEBHOOK_PORT, webhook_router(client.clone())),
    ] {
        let listen = SocketAddr::new(address, u16::try_from(port).unwrap_or_default());
        match kubevirt_tls::spawn_serving_cert(
            listen,
            Arc::clone(&swappable),
            &kubevirt_tls::ClientAuth::None,
            router,
        )
        .await
        {
            Ok((addr, task)) => {
                info!(%addr, "virt-operator serving");
                tasks.push(task);
            }
            Err(e) => warn!(%listen, error = %e, "virt-operator cannot serve"),
        }
    }
    cancel.cancelled().await;
    for task in tasks {
        task.abort();
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn kv(spec: &Value) -> KubeVirt {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
            "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
            "spec": spec,
        }))
        .expect("KubeVirt")
    }

    fn messages(causes: &[Cause]) -> Vec<(&str, &str)> {
        causes
            .iter()
            .map(|c| (c.field.as_str(), c.message.as_str()))
            .collect()
    }

    #[test]
    fn consistent_lifetimes_and_json_patches_pass() {
        let ok = kv(&json!({
            "certificateRotateStrategy": {"selfSigned": {
                "ca": {"duration": "48h", "renewBefore": "24h"},
                "server": {"duration": "12h", "renewBefore": "2h"}}},
            "customizeComponents": {"patches": [{"resourceName": "virt-api", "resourceType": "Deployment",
                "patch": "{\"spec\":{}}", "type": "strategic"}]},
        }));
        assert!(validate_update(&ok).is_empty());
        assert!(validate_update(&kv(&json!({}))).is_empty());
    }

    #[test]
    fn inconsistent_lifetimes_get_upstreams_messages_with_their_fields() {
        let causes = validate_update(&kv(&json!({
            "certificateRotateStrategy": {"selfSigned": {
                "ca": {"duration": "10h", "renewBefore": "20h"},
                "server": {"duration": "30h", "renewBefore": "40h"}}},
        })));
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.certificateRotateStrategy.selfSigned.ca.renewBefore",
                "spec.certificateRotateStrategy.selfSigned.server.renewBefore",
                "spec.certificateRotateStrategy.selfSigned.server.duration",
            ]
        );
        assert!(
            causes[0]
                .message
                .starts_with("CA RenewBefore cannot exceed Duration")
        );
        assert!(
            causes[2]
                .message
                .starts_with("Certificate duration cannot exceed CA")
        );
    }

    #[test]
    fn an_unreadable_lifetime_names_its_field_and_mixing_apis_is_refused() {
        let causes = validate_update(&kv(&json!({
            "certificateRotateStrategy": {"selfSigned": {
                "caRotateInterval": "48h",
                "server": {"duration": "a day"}}},
        })));
        assert_eq!(
            messages(&causes),
            [
                (
                    "spec.certificateRotateStrategy.selfSigned",
                    "caRotateInterval, certRotateInterval and caOverlapInterval are deprecated and conflict with CertConfig defined rotation parameters"
                ),
                (
                    "spec.certificateRotateStrategy.selfSigned.server.duration",
                    "\"a day\" is not a positive duration (such as \"24h\" or \"90m\")"
                ),
            ]
        );
    }

    #[test]
    fn a_patch_that_is_not_json_is_refused() {
        let causes = validate_update(&kv(&json!({
            "customizeComponents": {"patches": [{"resourceName": "virt-api", "resourceType": "Deployment",
                "patch": "{not json", "type": "json"}]},
        })));
        assert_eq!(
            messages(&causes),
            [(
                "spec.customizeComponents.patches[0].patch",
                "patch \"{not json\" is not valid JSON"
            )]
        );
    }
}
