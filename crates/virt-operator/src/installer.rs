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
//! `kubernetes.io/tls` Secret with `tls.crt`, `tls.key` and the CA bundle as `ca.crt` (upstream
//! keeps the bundle in the ConfigMap `kubevirt-ca` only, which is also written). Their
//! lifetimes and renewal times are [`certificates`]'s; each pass is scheduled at the
//! certificates' own next renewal time ([`Issued::next_renewal`]), and the pods follow the
//! mounted files per handshake.
//!
//! A change of the CR's `customizeComponents.flags` re-renders the workloads, so the flags
//! reach the components' arguments as upstream's operator puts them there (and
//! `kubectl -n kubevirt get deploy virt-controller -o jsonpath=…args` shows them).
//!
//! The same functions serve `kubevirt-rs server` (which calls [`start`] and [`wait_ready`])
//! and `kubevirt-rs operator` ([`crate::kubevirt`], which calls [`target_config`],
//! [`install`], [`issue_certificates`], [`not_ready`] and [`uninstall`] from its reconcile):
//! the CR's `spec.imageRegistry`, `imageTag`, `imagePullPolicy` and `customizeComponents.flags`
//! shape the rendering in both.
//!
//! # Caveats
//! `customizeComponents.patches` and install strategies are not done; the CRDs are the API
//! server's initial objects (or applied from `deploy/`), never installed or deleted here.

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

use crate::certificates::{self, KubeVirtCa};

/// The files of `deploy/` that are the API server's initial objects instead.
const INITIAL_OBJECT_FILES: [&str; 2] = ["10-crds.yaml", "60-kubevirt-cr.yaml"];
/// The files with KubeVirt's namespace, accounts and roles.
const RBAC_FILES: [&str; 2] = ["00-namespace.yaml", "20-rbac.yaml"];
/// The components' certificate Secrets (upstream's names).
const CERTIFICATE_SECRETS: [&str; 4] = [
    "kubevirt-virt-api-certs",
    "kubevirt-virt-handler-server-certs",
    "kubevirt-virt-handler-certs",
    "kubevirt-controller-certs",
];
/// The ConfigMap with the CA bundle.
const CA_BUNDLE: &str = "kubevirt-ca";
/// How soon a failed certificate pass is tried again.
const CERTIFICATE_RETRY: Duration = Duration::from_secs(5);

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

/// What `base` becomes for the CR `cr`, as upstream's operator derives its target deployment
/// configuration: `spec.imageRegistry`, `spec.imageTag` and `spec.imagePullPolicy` replace
/// the defaults and `customizeComponents.flags` become the components' extra arguments.
#[must_use]
pub fn target_config(
    base: &kubevirt_install::InstallConfig,
    cr: Option<&KubeVirt>,
) -> kubevirt_install::InstallConfig {
    let mut config = base.clone();
    if let Some(spec) = cr.map(|cr| &cr.spec) {
        let set = |value: &Option<String>| value.clone().filter(|v| !v.is_empty());
        if let Some(registry) = set(&spec.image_registry) {
            config.image_registry = registry;
        }
        if let Some(tag) = set(&spec.image_tag) {
            config.image_tag = tag;
        }
        if let Some(policy) = set(&spec.image_pull_policy) {
            config.image_pull_policy = policy;
        }
    }
    config.extra_args = extra_args(cr);
    config
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
            crate::apply::create_or_replace_dynamic(admin.clone(), object)
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

/// A `kubernetes.io/tls` Secret with the CA bundle beside the pair.
fn tls_secret(namespace: &str, name: &str, (cert, key): (&str, &str), ca: &str) -> Value {
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
        "data": {"tls.crt": b64(cert), "tls.key": b64(key), "ca.crt": b64(ca)},
    })
}

/// What a pass of [`issue_certificates`] leaves behind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    /// The CA bundle (PEM) the registration objects and the components trust: the current CA
    /// first, then each previous CA until it expires.
    pub ca_bundle: String,
    /// When the next pass has work: the earliest renewal time of the CA and of the leaves, or
    /// the expiry of a previous CA still in the bundle.
    pub next_renewal: time::OffsetDateTime,
}

impl Issued {
    /// How long until [`Issued::next_renewal`] (zero when it has come), plus a little so
    /// the pass that wakes then finds the work due.
    #[must_use]
    pub fn renew_in(&self) -> Duration {
        certificates::until(self.next_renewal) + Duration::from_millis(50)
    }
}

/// A `data` entry of a Secret, as text.
fn secret_text(secret: &k8s_openapi::api::core::v1::Secret, key: &str) -> Option<String> {
    let bytes = &secret.data.as_ref()?.get(key)?.0;
    String::from_utf8(bytes.clone()).ok()
}

/// Brings the CA, the CA bundle and the components' certificates up to date, as upstream's
/// operator does in each sync (CA, then bundle, then the leaves), with the lifetimes of the
/// CR's `spec.certificateRotateStrategy.selfSigned`: a leaf is issued again only when it is
/// due ([`certificates::leaf_renewal`]: near its end, or not signed by the current CA), an
/// object is written only when it changes.
///
/// # Errors
/// When the CA cannot be loaded or created, or the API server refuses a read or a write.
pub async fn issue_certificates(admin: &kube::Client, namespace: &str) -> anyhow::Result<Issued> {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let lifetimes = certificates::Lifetimes::of_namespace(admin, namespace).await?;
    let ca = KubeVirtCa::load_or_rotate(admin.clone(), namespace, &lifetimes).await?;
    let now = time::OffsetDateTime::now_utc();
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), namespace);
    let previous = configmaps
        .get_opt(CA_BUNDLE)
        .await
        .context("reading ConfigMap kubevirt-ca")?
        .and_then(|cm| cm.data?.get("ca-bundle").cloned())
        .unwrap_or_default();
    let bundle = certificates::merge_bundle(&ca.cert_pem, &previous, now);
    if bundle != previous {
        let object = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CA_BUNDLE, "namespace": namespace},
            "data": {"ca-bundle": bundle},
        });
        crate::apply::create_or_replace_dynamic(admin.clone(), object)
            .await
            .context("writing ConfigMap kubevirt-ca")?;
        info!(namespace, "KubeVirt CA bundle published");
    }
    let mut next = ca.renewal();
    for block in certificates::pem_blocks(&bundle).iter().skip(1) {
        if let Some((_, not_after)) = certificates::validity_of(block.as_bytes()) {
            next = next.min(not_after);
        }
    }
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), namespace);
    for name in CERTIFICATE_SECRETS {
        let existing = secrets
            .get_opt(name)
            .await
            .with_context(|| format!("reading Secret {namespace}/{name}"))?;
        let pair = existing.as_ref().and_then(|s| {
            let (cert, key) = (secret_text(s, "tls.crt")?, secret_text(s, "tls.key")?);
            let due =
                certificates::leaf_renewal(cert.as_bytes(), ca.cert_pem.as_bytes(), &lifetimes)?;
            (due > now).then_some((cert, key, due))
        });
        let kept = pair.is_some();
        let (cert, key) = match pair {
            Some((cert, key, due)) => {
                next = next.min(due);
                (cert, key)
            }
            None => {
                let (cert, key) = issue_leaf(&ca, name, namespace)?;
                if let Some(due) =
                    certificates::leaf_renewal(cert.as_bytes(), ca.cert_pem.as_bytes(), &lifetimes)
                {
                    next = next.min(due);
                }
                (cert, key)
            }
        };
        let bundle_current = existing
            .as_ref()
            .and_then(|s| secret_text(s, "ca.crt"))
            .is_some_and(|c| c == bundle);
        if kept && bundle_current {
            continue;
        }
        crate::apply::create_or_replace_dynamic(
            admin.clone(),
            tls_secret(namespace, name, (&cert, &key), &bundle),
        )
        .await
        .with_context(|| format!("writing Secret {namespace}/{name}"))?;
        if !kept {
            info!(namespace, secret = name, "certificate issued");
        }
    }
    Ok(Issued {
        ca_bundle: bundle,
        next_renewal: next,
    })
}

/// The certificate of the component Secret `name` (upstream's subjects and names).
fn issue_leaf(ca: &KubeVirtCa, name: &str, namespace: &str) -> anyhow::Result<(String, String)> {
    let [api, handler_server, handler_client, _controller] = CERTIFICATE_SECRETS;
    if name == api {
        ca.issue_serving(certificates::service_names("virt-api", namespace))
    } else if name == handler_server {
        let names = vec![virt_api::subresources::HANDLER_SERVER_NAME.to_owned()];
        ca.issue_serving_as("kubevirt.io:system:node:virt-handler", names)
    } else if name == handler_client {
        ca.issue_client("kubevirt.io:system:client:virt-handler")
    } else {
        ca.issue_serving(certificates::service_names("virt-controller", namespace))
    }
}

/// Applies the components' objects (everything but the namespace, the RBAC, the CRDs and the
/// CR) rendered from `config`, trusting `ca_pem`.
async fn apply_components(
    admin: &kube::Client,
    config: &kubevirt_install::InstallConfig,
    ca_pem: &str,
) -> anyhow::Result<()> {
    let groups = kubevirt_install::manifests(config).context("rendering deploy/")?;
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

/// Installs everything once, in upstream's order: the namespace, accounts and RBAC, the
/// certificates (issued now) and the CA bundle, then the components rendered from `config`
/// (a [`target_config`]). Returns the certificates' state: the CA bundle the registration
/// objects trust and when the certificates want the next pass.
///
/// # Errors
/// When the API server refuses an object.
pub async fn install(
    admin: &kube::Client,
    config: &kubevirt_install::InstallConfig,
) -> anyhow::Result<Issued> {
    install_rbac(admin, config).await?;
    let issued = issue_certificates(admin, &config.namespace).await?;
    apply_components(admin, config, &issued.ca_bundle).await?;
    Ok(issued)
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
    let crs = Api::<KubeVirt>::namespaced(admin.clone(), &namespace);
    // The first rendering from the CR as it is now; later ones follow its changes.
    let mut current = crs
        .list(&ListParams::default())
        .await
        .context("reading the KubeVirt CR")?
        .items;
    current.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut applied = target_config(&base, current.first());
    let mut wanted_configs = {
        let base = base.clone();
        kubevirt_api::cluster_config::subscribe(crs, move |cr| target_config(&base, cr)).receiver()
    };
    let issued = install(&admin, &applied).await?;
    let mut renew_in = issued.renew_in();
    let mut ca = issued.ca_bundle;
    let mut applied_ca = ca.clone();
    info!(namespace, "KubeVirt installed");
    Ok(tokio::spawn(async move {
        loop {
            // Woken at the certificates' own next renewal time (or by a change of the CR,
            // which may change their lifetimes).
            tokio::select! {
                () = cancel.cancelled() => return,
                changed = wanted_configs.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                () = tokio::time::sleep(renew_in) => {}
            }
            match issue_certificates(&admin, &namespace).await {
                Ok(issued) => {
                    renew_in = issued.renew_in();
                    ca = issued.ca_bundle;
                }
                Err(e) => {
                    renew_in = CERTIFICATE_RETRY;
                    warn!(error = format!("{e:#}"), "renewing KubeVirt's certificates");
                }
            }
            let wanted = wanted_configs.borrow_and_update().clone();
            if wanted != applied || ca != applied_ca {
                match apply_components(&admin, &wanted, &ca).await {
                    Ok(()) => {
                        info!(flags = ?wanted.extra_args, "KubeVirt's components re-rendered");
                        applied = wanted;
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

/// What of KubeVirt's components is not ready yet, by component (empty when all are):
/// virt-api and virt-controller are Available with every replica updated, virt-handler is
/// Ready on every node it is scheduled to and on at least `nodes` of them, and virt-api's
/// Service has a ready endpoint (so admission works). One look, no waiting.
pub async fn not_ready(
    admin: &kube::Client,
    namespace: &str,
    nodes: usize,
) -> BTreeMap<&'static str, &'static str> {
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), namespace);
    let daemonsets: Api<DaemonSet> = Api::namespaced(admin.clone(), namespace);
    let slices: Api<EndpointSlice> = Api::namespaced(admin.clone(), namespace);
    let mut missing = BTreeMap::new();
    for name in ["virt-api", "virt-controller"] {
        let available = deployments
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .is_some_and(|d| deployment_ready(&d));
        if !available {
            missing.insert(name, "not Available");
        }
    }
    let handlers = daemonsets
        .get_opt("virt-handler")
        .await
        .ok()
        .flatten()
        .is_some_and(|d| daemonset_ready(&d, nodes));
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
    missing
}

/// Whether a Deployment has all its wanted replicas updated and available.
fn deployment_ready(d: &Deployment) -> bool {
    let wanted = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let status = d.status.clone().unwrap_or_default();
    status.available_replicas.unwrap_or(0) >= wanted
        && status.updated_replicas.unwrap_or(0) >= wanted
}

/// Whether a DaemonSet runs Ready on every node it is scheduled to, and on at least
/// `nodes` (at least one; upstream's operator counts a DaemonSet scheduled nowhere as not
/// ready).
fn daemonset_ready(d: &DaemonSet, nodes: usize) -> bool {
    d.status.as_ref().is_some_and(|s| {
        usize::try_from(s.number_ready).unwrap_or(0) >= nodes.max(1)
            && s.number_ready == s.desired_number_scheduled
    })
}

/// Waits until [`not_ready`] finds nothing missing, logging what is still missing every few
/// seconds.
pub async fn wait_ready(admin: &kube::Client, namespace: &str, nodes: usize) {
    let started = tokio::time::Instant::now();
    let mut reported = started;
    loop {
        let missing = not_ready(admin, namespace, nodes).await;
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

/// Upstream's deletion order (`apply.DeleteAll`): workloads, then registration objects,
/// Services, RBAC, accounts, Secrets and ConfigMaps; a kind not named goes last.
const DELETION_ORDER: [&str; 14] = [
    "DaemonSet",
    "PodDisruptionBudget",
    "Deployment",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "APIService",
    "Service",
    "ClusterRoleBinding",
    "ClusterRole",
    "RoleBinding",
    "Role",
    "ServiceAccount",
    "Secret",
    "ConfigMap",
];

/// The objects [`install`] creates that an uninstallation deletes, in [`DELETION_ORDER`]:
/// everything rendered but the namespace, the PriorityClass (upstream ships both with the
/// operator), the CRDs and the CR, and the operator's own account and RBAC
/// (`kubevirt-operator…`); plus the certificate Secrets, the CA Secret and the CA bundle.
///
/// # Errors
/// When the manifests do not render (a bug).
pub fn installed_objects(config: &kubevirt_install::InstallConfig) -> anyhow::Result<Vec<Value>> {
    let namespace = &config.namespace;
    let mut objects: Vec<Value> = kubevirt_install::manifests(config)
        .context("rendering deploy/")?
        .into_iter()
        .filter(|g| !INITIAL_OBJECT_FILES.contains(&g.file))
        .flat_map(|g| g.objects)
        .filter(|o| !matches!(o["kind"].as_str(), Some("Namespace" | "PriorityClass")))
        .filter(|o| {
            !o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .starts_with("kubevirt-operator")
        })
        .collect();
    for name in CERTIFICATE_SECRETS
        .into_iter()
        .chain([certificates::CA_SECRET])
    {
        objects.push(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace}}));
    }
    objects.push(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": CA_BUNDLE, "namespace": namespace}}));
    let rank = |o: &Value| {
        let kind = o["kind"].as_str().unwrap_or_default();
        DELETION_ORDER
            .iter()
            .position(|k| *k == kind)
            .unwrap_or(DELETION_ORDER.len())
    };
    // A stable sort: within a kind, deploy/'s order.
    objects.sort_by_key(rank);
    Ok(objects)
}

/// Deletes what [`install`] created ([`installed_objects`]), in upstream's order; returns how
/// many of them still existed (0: the uninstallation is complete). Workloads are deleted
/// with background propagation: their pods go with the garbage collector.
///
/// # Errors
/// When a deletion fails otherwise than with NotFound.
pub async fn uninstall(
    admin: &kube::Client,
    config: &kubevirt_install::InstallConfig,
) -> anyhow::Result<usize> {
    let mut existed = 0;
    for object in installed_objects(config)? {
        let what = format!(
            "{} {}",
            object["kind"].as_str().unwrap_or("object"),
            object["metadata"]["name"].as_str().unwrap_or_default()
        );
        if delete_dynamic(admin.clone(), object)
            .await
            .with_context(|| format!("deleting {what}"))?
        {
            info!(object = what, "deleted");
            existed += 1;
        }
    }
    Ok(existed)
}

/// Deletes `object` (by kind, namespace and name); whether it existed.
async fn delete_dynamic(client: kube::Client, object: Value) -> anyhow::Result<bool> {
    use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind};
    let obj: DynamicObject = serde_json::from_value(object).context("decoding the object")?;
    let types = obj.types.context("object without apiVersion/kind")?;
    let (group, version) = types
        .api_version
        .split_once('/')
        .unwrap_or(("", &types.api_version));
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &types.kind));
    let api: Api<DynamicObject> = match obj.metadata.namespace.as_deref() {
        Some(ns) => Api::namespaced_with(client, ns, &ar),
        None => Api::all_with(client, &ar),
    };
    let name = obj.metadata.name.unwrap_or_default();
    match api.delete(&name, &DeleteParams::background()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
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

    #[test]
    fn the_crs_images_and_pull_policy_replace_the_defaults() {
        let base = kubevirt_install::InstallConfig::default();
        let cr: KubeVirt = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
            "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
            "spec": {"imageRegistry": "registry.example.com/kv", "imageTag": "v9",
                     "imagePullPolicy": "Always"}
        }))
        .unwrap();
        let config = target_config(&base, Some(&cr));
        assert_eq!(
            config.image("virt-api"),
            "registry.example.com/kv/virt-api:v9"
        );
        assert_eq!(config.image_pull_policy, "Always");
        assert_eq!(target_config(&base, None), base);
    }

    #[test]
    fn an_uninstallation_deletes_workloads_first_and_keeps_the_namespace_and_the_operator() {
        let objects = installed_objects(&kubevirt_install::InstallConfig::default()).unwrap();
        let kinds: Vec<&str> = objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds.first(), Some(&"DaemonSet"));
        let position = |kind: &str| kinds.iter().position(|k| *k == kind).unwrap();
        assert!(position("Deployment") < position("ValidatingWebhookConfiguration"));
        assert!(position("APIService") < position("ClusterRole"));
        assert!(position("ServiceAccount") < position("Secret"));
        assert!(
            !kinds
                .iter()
                .any(|k| matches!(*k, "Namespace" | "PriorityClass" | "KubeVirt"))
        );
        assert!(!kinds.contains(&"CustomResourceDefinition"));
        let names: Vec<&str> = objects
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap())
            .collect();
        assert!(
            !names.iter().any(|n| n.starts_with("kubevirt-operator")),
            "{names:?}"
        );
        for secret in [
            "kubevirt-ca",
            "kubevirt-virt-api-certs",
            "kubevirt-controller-certs",
        ] {
            assert!(names.contains(&secret), "{secret}");
        }
    }
}
