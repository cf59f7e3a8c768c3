//! KubeVirt installed onto a cluster from `deploy/`'s manifests ([`kubevirt_install`]), the
//! part of upstream's virt-operator the embedded server needs until the operator exists:
//!
//! ```text
//!  KubeVirt CR ──(customizeComponents.flags)──► InstallConfig.extra_args
//!        │                                           │ kubevirt_install::manifests
//!        ▼                                           ▼
//!  KubeVirt CA (Secret kubevirt-ca) ──► component Secrets, ConfigMap kubevirt-ca,
//!                                        caBundle of the webhooks and the APIService
//!                                                    │ create or replace, in deploy/'s order
//!                                                    ▼
//!              Deployments virt-api, virt-controller; DaemonSet virt-handler (pods)
//! ```
//!
//! Certificates: the Secrets `kubevirt-virt-api-certs` (virt-api's serving certificate for
//! its Service names), `kubevirt-virt-handler-server-certs` (virt-handler's, for
//! [`virt_api::subresources::HANDLER_SERVER_NAME`]), `kubevirt-virt-handler-certs` (virt-api's
//! client certificate towards the handler) and `kubevirt-controller-certs`, each a
//! `kubernetes.io/tls` Secret with `tls.crt`, `tls.key` and the CA as `ca.crt` (upstream keeps
//! the CA in the ConfigMap `kubevirt-ca` only, which is also written). They are issued again at
//! 80% of their life; the pods follow the mounted files.
//!
//! A change of the CR's `customizeComponents.flags` re-renders the workloads, so the flags
//! reach the components' arguments as upstream's operator puts them there (and
//! `kubectl -n kubevirt get deploy virt-controller -o jsonpath=…args` shows them).
//!
//! # Caveats
//! `customizeComponents.patches`, install strategies, versions and the CR's status belong to
//! the operator and are not done here; the CRDs and the CR itself are the API server's initial
//! objects.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use base64::Engine;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use kubevirt_api::v1::KubeVirt;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::kubevirt_ca::{self, KubeVirtCa};

/// The files of `deploy/` that are the API server's initial objects instead.
const INITIAL_OBJECT_FILES: [&str; 2] = ["10-crds.yaml", "60-kubevirt-cr.yaml"];
/// The files with KubeVirt's namespace, accounts and roles.
const RBAC_FILES: [&str; 2] = ["00-namespace.yaml", "20-rbac.yaml"];

/// The CR's `spec.customizeComponents.flags`, as arguments per component.
fn extra_args(cr: Option<&KubeVirt>) -> kubevirt_install::ComponentArgs {
    let flags = cr
        .and_then(|cr| cr.spec.customize_components.as_ref())
        .and_then(|c| c.flags.clone())
        .unwrap_or_default();
    kubevirt_install::ComponentArgs {
        api: kubevirt_install::flags_to_args(&flags.api),
        controller: kubevirt_install::flags_to_args(&flags.controller),
        handler: kubevirt_install::flags_to_args(&flags.handler),
    }
}

/// Applies every object of `groups` whose file `select` accepts, in order.
async fn apply_groups(
    admin: &kube::Client,
    groups: Vec<kubevirt_install::Group>,
    select: impl Fn(&str) -> bool,
    ca_pem: Option<&str>,
) -> anyhow::Result<()> {
    for group in groups.into_iter().filter(|g| select(g.file)) {
        for mut object in group.objects {
            if let Some(ca) = ca_pem {
                trust_ca(&mut object, ca);
            }
            let what = format!(
                "{} {}",
                object["kind"].as_str().unwrap_or("object"),
                object["metadata"]["name"].as_str().unwrap_or_default()
            );
            crate::cmd_api::create_or_replace_dynamic(admin.clone(), object)
                .await
                .with_context(|| format!("installing {what}"))?;
        }
    }
    Ok(())
}

/// Sets the `caBundle` of webhook configurations and APIServices to `ca_pem`.
fn trust_ca(object: &mut Value, ca_pem: &str) {
    let bundle = Value::String(base64::engine::general_purpose::STANDARD.encode(ca_pem));
    match object["kind"].as_str() {
        Some("MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration") => {
            if let Some(webhooks) = object["webhooks"].as_array_mut() {
                for webhook in webhooks {
                    webhook["clientConfig"]["caBundle"] = bundle.clone();
                }
            }
        }
        Some("APIService") => object["spec"]["caBundle"] = bundle,
        _ => {}
    }
}

/// A `kubernetes.io/tls` Secret with the CA beside the pair.
fn tls_secret(namespace: &str, name: &str, (cert, key): (String, String), ca: &str) -> Value {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "virt-operator"},
        },
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": b64(&cert), "tls.key": b64(&key), "ca.crt": b64(ca)},
    })
}

/// Issues the components' certificates into their Secrets and publishes the CA; returns the
/// CA (PEM).
async fn issue_certificates(admin: &kube::Client, namespace: &str) -> anyhow::Result<String> {
    let ca = KubeVirtCa::load_or_create(admin.clone(), namespace).await?;
    let handler_names = vec![virt_api::subresources::HANDLER_SERVER_NAME.to_owned()];
    let secrets = [
        (
            "kubevirt-virt-api-certs",
            ca.issue_serving(kubevirt_ca::service_names("virt-api", namespace))?,
        ),
        (
            "kubevirt-virt-handler-server-certs",
            ca.issue_serving_as("kubevirt.io:system:node:virt-handler", handler_names)?,
        ),
        (
            "kubevirt-virt-handler-certs",
            ca.issue_client("kubevirt.io:system:client:virt-handler")?,
        ),
        (
            "kubevirt-controller-certs",
            ca.issue_serving(kubevirt_ca::service_names("virt-controller", namespace))?,
        ),
    ];
    for (name, pair) in secrets {
        crate::cmd_api::create_or_replace_dynamic(
            admin.clone(),
            tls_secret(namespace, name, pair, &ca.cert_pem),
        )
        .await
        .with_context(|| format!("writing Secret {namespace}/{name}"))?;
    }
    let bundle = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kubevirt-ca", "namespace": namespace},
        "data": {"ca-bundle": ca.cert_pem},
    });
    crate::cmd_api::create_or_replace_dynamic(admin.clone(), bundle)
        .await
        .context("writing ConfigMap kubevirt-ca")?;
    Ok(ca.cert_pem)
}

/// Applies the components' objects (everything but the namespace, the RBAC, the CRDs and the
/// CR) rendered with `args`, trusting `ca_pem`.
async fn apply_components(
    admin: &kube::Client,
    base: &kubevirt_install::InstallConfig,
    args: kubevirt_install::ComponentArgs,
    ca_pem: &str,
) -> anyhow::Result<()> {
    let mut config = base.clone();
    config.extra_args = args;
    let groups = kubevirt_install::manifests(&config).context("rendering deploy/")?;
    apply_groups(
        admin,
        groups,
        |file| !INITIAL_OBJECT_FILES.contains(&file) && !RBAC_FILES.contains(&file),
        Some(ca_pem),
    )
    .await
}

/// Installs `deploy/`'s namespace, ServiceAccounts and RBAC.
///
/// # Errors
/// When the API server refuses an object.
pub async fn install_rbac(
    admin: &kube::Client,
    config: &kubevirt_install::InstallConfig,
) -> anyhow::Result<()> {
    let groups = kubevirt_install::manifests(config).context("rendering deploy/")?;
    apply_groups(admin, groups, |file| RBAC_FILES.contains(&file), None).await
}

/// Installs KubeVirt (see the module documentation) and keeps it installed until `cancel`:
/// the CR's flags re-render the workloads, certificates are renewed. Returns once the first
/// installation is applied.
///
/// # Errors
/// When the first installation fails.
pub async fn start(
    admin: kube::Client,
    base: kubevirt_install::InstallConfig,
    cancel: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let namespace = base.namespace.clone();
    install_rbac(&admin, &base).await?;
    let crs = Api::<KubeVirt>::namespaced(admin.clone(), &namespace);
    // The first rendering from the CR as it is now; later ones follow its changes.
    let mut current = crs
        .list(&ListParams::default())
        .await
        .context("reading the KubeVirt CR")?
        .items;
    current.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut applied_args = extra_args(current.first());
    let mut flags = kubevirt_api::cluster_config::subscribe(crs, extra_args).receiver();
    let mut ca = issue_certificates(&admin, &namespace).await?;
    apply_components(&admin, &base, applied_args.clone(), &ca).await?;
    let mut applied_ca = ca.clone();
    info!(namespace, "KubeVirt installed");
    let renew_every = Duration::from_secs(
        u64::try_from(kubevirt_ca::LEAF_LIFETIME.whole_seconds() * 4 / 5).unwrap_or(3600),
    );
    Ok(tokio::spawn(async move {
        let mut renewal =
            tokio::time::interval_at(tokio::time::Instant::now() + renew_every, renew_every);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                changed = flags.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                _ = renewal.tick() => {
                    match issue_certificates(&admin, &namespace).await {
                        Ok(renewed) => ca = renewed,
                        Err(e) => warn!(error = format!("{e:#}"), "renewing KubeVirt's certificates"),
                    }
                }
            }
            let wanted = flags.borrow_and_update().clone();
            if wanted != applied_args || ca != applied_ca {
                match apply_components(&admin, &base, wanted.clone(), &ca).await {
                    Ok(()) => {
                        info!(flags = ?wanted, "KubeVirt's components re-rendered");
                        applied_args = wanted;
                        applied_ca.clone_from(&ca);
                    }
                    Err(e) => warn!(
                        error = format!("{e:#}"),
                        "re-rendering KubeVirt's components"
                    ),
                }
            }
        }
    }))
}

/// Waits until virt-api and virt-controller are Available, virt-handler runs Ready on
/// `nodes` nodes and virt-api's Service has a ready endpoint (so admission works), logging
/// what is still missing every few seconds.
pub async fn wait_ready(admin: &kube::Client, namespace: &str, nodes: usize) {
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), namespace);
    let daemonsets: Api<DaemonSet> = Api::namespaced(admin.clone(), namespace);
    let slices: Api<EndpointSlice> = Api::namespaced(admin.clone(), namespace);
    let started = tokio::time::Instant::now();
    let mut reported = started;
    loop {
        let mut missing = BTreeMap::new();
        for name in ["virt-api", "virt-controller"] {
            let available = deployments
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .is_some_and(|d| {
                    let wanted = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                    let status = d.status.unwrap_or_default();
                    status.available_replicas.unwrap_or(0) >= wanted
                        && status.updated_replicas.unwrap_or(0) >= wanted
                });
            if !available {
                missing.insert(name, "not Available");
            }
        }
        let handlers = daemonsets
            .get_opt("virt-handler")
            .await
            .ok()
            .flatten()
            .and_then(|d| d.status)
            .is_some_and(|s| {
                usize::try_from(s.number_ready).unwrap_or(0) >= nodes
                    && s.number_ready == s.desired_number_scheduled
            });
        if !handlers {
            missing.insert("virt-handler", "not Ready on every node");
        }
        let endpoint = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=virt-api"))
            .await
            .is_ok_and(|list| {
                list.items.iter().any(|s| {
                    s.endpoints
                        .iter()
                        .any(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
                })
            });
        if !endpoint {
            missing.insert("virt-api Service", "without a ready endpoint");
        }
        if missing.is_empty() {
            info!(
                seconds = started.elapsed().as_secs_f32(),
                "KubeVirt's components are ready"
            );
            return;
        }
        if reported.elapsed() >= Duration::from_secs(5) {
            info!(?missing, "waiting for KubeVirt's components");
            reported = tokio::time::Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhooks_and_api_services_trust_the_ca_other_objects_are_untouched() {
        let mut hooks = json!({"kind": "MutatingWebhookConfiguration",
            "webhooks": [{"clientConfig": {"service": {"name": "virt-api"}}}, {"clientConfig": {}}]});
        trust_ca(&mut hooks, "PEM");
        let expected = base64::engine::general_purpose::STANDARD.encode("PEM");
        for webhook in hooks["webhooks"].as_array().unwrap() {
            assert_eq!(webhook["clientConfig"]["caBundle"], expected.as_str());
        }
        let mut service =
            json!({"kind": "APIService", "spec": {"group": "subresources.kubevirt.io"}});
        trust_ca(&mut service, "PEM");
        assert_eq!(service["spec"]["caBundle"], expected.as_str());
        let mut deployment = json!({"kind": "Deployment", "spec": {}});
        trust_ca(&mut deployment, "PEM");
        assert_eq!(deployment, json!({"kind": "Deployment", "spec": {}}));
    }

    #[test]
    fn the_crs_controller_flags_become_controller_arguments() {
        let cr: KubeVirt = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
            "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
            "spec": {"customizeComponents": {"flags": {"controller": {
                "additional-launcher-labels-sync": "ops.example.com/*"}}}}
        }))
        .unwrap();
        let args = extra_args(Some(&cr));
        assert_eq!(
            args.controller,
            ["--additional-launcher-labels-sync", "ops.example.com/*"]
        );
        assert!(args.api.is_empty() && args.handler.is_empty());
        assert_eq!(extra_args(None), kubevirt_install::ComponentArgs::default());
    }
}
