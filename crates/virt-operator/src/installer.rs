//! KubeVirt installed onto a cluster from its install strategy ([`crate::strategy`]), as
//! upstream's virt-operator does (`pkg/virt-operator/resource/apply`):
//!
//! ```text
//!  KubeVirt CR ──(imageTag, imageRegistry, customizeComponents.flags)──► InstallConfig
//!        │                                           │ strategy::StrategyCache::ensure
//!        ▼                                           ▼
//!  customizeComponents.patches ─────────► the strategy's objects, patched (customize.rs)
//!                                                    │ create or replace, upstream's order:
//!                                                    ▼
//!   CRDs, ServiceAccounts, RBAC, Services ─► KubeVirt CA (Secret kubevirt-ca) and the
//!   component Secrets, ConfigMap kubevirt-ca ─► the workloads in [`Rollout`]'s order
//!   (an update: DaemonSet virt-handler by its canary, Deployments virt-controller, virt-api,
//!   each rolled out before the next) ─► webhooks and APIServices (caBundle) ─► PDBs
//!                                                    │ prune
//!                                                    ▼
//!            objects labelled managed-by virt-operator that left the strategy are deleted
//! ```
//!
//! Every installed object carries upstream's operator metadata: the label
//! `app.kubernetes.io/managed-by: virt-operator` and the annotations
//! `kubevirt.io/install-strategy-{version,registry,identifier}`, a workload's pod template
//! too (so a pod tells its strategy, [`crate::rollout`]).
//!
//! Certificates: the Secrets `kubevirt-virt-api-certs` (virt-api's serving certificate for
//! its Service names), `kubevirt-virt-handler-server-certs` (virt-handler's, for
//! [`virt_api::subresources::HANDLER_SERVER_NAME`]), `kubevirt-virt-handler-certs` (virt-api's
//! client certificate towards the handler), `kubevirt-controller-certs` and
//! `kubevirt-operator-certs` (the operator's own webhooks, for `kubevirt-operator-webhook`), each a
//! `kubernetes.io/tls` Secret with `tls.crt`, `tls.key` and the CA bundle as `ca.crt` (upstream
//! keeps the bundle in the ConfigMap `kubevirt-ca` only, which is also written). Their
//! lifetimes and renewal times are [`certificates`]'s; each pass is scheduled at the
//! certificates' own next renewal time ([`Issued::next_renewal`]), and the pods follow the
//! mounted files per handshake.
//!
//! [`crate::kubevirt`] calls [`target_config`], [`install`], [`prune`], [`not_ready`] and
//! [`uninstall`] from its reconcile; `kubevirt-rs server` applies `deploy/` and waits with
//! [`wait_ready`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Context;
use base64::Engine;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use kubevirt_api::v1::{CustomizeComponentsPatch, KubeVirt};
use serde_json::{Value, json};
use tracing::info;

use kubevirt_api::events::EventRecorder;

use crate::apply::create_or_replace_dynamic;
use crate::certificates::{self, KubeVirtCa};
pub use crate::rollout::Rollout;
use crate::rollout::{ROLLOUT_TIMEOUT, WORKLOAD_KINDS};
use crate::strategy::{self, Strategy};

/// The components' certificate Secrets (upstream's names).
const CERTIFICATE_SECRETS: [&str; 5] = [
    "kubevirt-virt-api-certs",
    "kubevirt-virt-handler-server-certs",
    "kubevirt-virt-handler-certs",
    "kubevirt-controller-certs",
    kubevirt_install::virt_operator::CERT_SECRET,
];
/// The ConfigMap with the CA bundle.
const CA_BUNDLE: &str = "kubevirt-ca";

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

/// The CR's `spec.customizeComponents.patches`.
#[must_use]
pub fn target_patches(cr: &KubeVirt) -> Vec<CustomizeComponentsPatch> {
    cr.spec
        .customize_components
        .as_ref()
        .map(|c| c.patches.clone())
        .unwrap_or_default()
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
/// due ([`certificates::leaf_renewal`]: near its end; signed by a previous CA, once the current
/// one has had time to reach every pod; or signed by no CA of the bundle), an
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
    let bundle =
        certificates::merge_bundle(&ca.cert_pem, ca.successor_pem.as_deref(), &previous, now);
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
                certificates::leaf_renewal(cert.as_bytes(), bundle.as_bytes(), &lifetimes, now)?;
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
                    certificates::leaf_renewal(cert.as_bytes(), bundle.as_bytes(), &lifetimes, now)
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
    let [api, handler_server, handler_client, _controller, operator] = CERTIFICATE_SECRETS;
    if name == operator {
        ca.issue_serving(certificates::service_names(
            kubevirt_install::virt_operator::WEBHOOK_SERVICE,
            namespace,
        ))
    } else if name == api {
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

/// The kinds installed before the certificates (upstream: CRDs, RBAC, then Services, then the
/// components with their certificates).
const BEFORE_CERTIFICATES: [&str; 7] = [
    "CustomResourceDefinition",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "Service",
];

/// Upstream's operator metadata (see the module documentation).
/// Upstream's `injectOperatorMetadata`: on the object and, for a workload, on its pod
/// template, so that a pod tells which strategy it was created for.
fn inject_metadata(object: &mut Value, strategy: &Strategy) {
    let workload = WORKLOAD_KINDS.contains(&object["kind"].as_str().unwrap_or_default());
    let inject = |metadata: &mut Value| {
        metadata["labels"][strategy::MANAGED_BY_LABEL] = json!(strategy::MANAGED_BY);
        for (key, value) in [
            (strategy::VERSION_ANNOTATION, &strategy.version),
            (strategy::REGISTRY_ANNOTATION, &strategy.registry),
            (strategy::IDENTIFIER_ANNOTATION, &strategy.id),
        ] {
            metadata["annotations"][key] = json!(value);
        }
    };
    inject(&mut object["metadata"]);
    if workload {
        inject(&mut object["spec"]["template"]["metadata"]);
    }
}

fn describe(object: &Value) -> String {
    format!(
        "{} {}",
        object["kind"].as_str().unwrap_or("object"),
        object["metadata"]["name"].as_str().unwrap_or_default()
    )
}

/// Installs `strategy` (the install strategy of `config`, a [`target_config`]) with
/// `patches` applied, in upstream's order (see the module documentation), the workloads in
/// `rollout`'s order and, on the update path, each rolled out before the next. Returns the CA
/// (PEM) the registration objects trust.
///
/// # Errors
/// When a patch does not apply (nothing is written then) or the API server refuses an object.
pub async fn install(
    admin: &kube::Client,
    config: &kubevirt_install::InstallConfig,
    strategy: &Strategy,
    patches: &[CustomizeComponentsPatch],
    rollout: Rollout,
    recorder: &EventRecorder,
) -> anyhow::Result<Issued> {
    let mut objects: Vec<Value> = strategy.objects.as_ref().clone();
    crate::customize::apply(&mut objects, patches)?;
    for object in &mut objects {
        inject_metadata(object, strategy);
    }
    let split = objects
        .iter()
        .position(|o| !BEFORE_CERTIFICATES.contains(&o["kind"].as_str().unwrap_or_default()))
        .unwrap_or(objects.len());
    let (first, rest) = objects.split_at_mut(split);
    for object in first {
        let what = describe(object);
        create_or_replace_dynamic(admin.clone(), object.clone())
            .await
            .with_context(|| format!("installing {what}"))?;
    }
    let issued = issue_certificates(admin, &config.namespace).await?;
    let (mut workloads, others): (Vec<&mut Value>, Vec<&mut Value>) = rest
        .iter_mut()
        .partition(|o| WORKLOAD_KINDS.contains(&o["kind"].as_str().unwrap_or_default()));
    workloads.sort_by_key(|o| rollout.rank(o["metadata"]["name"].as_str().unwrap_or_default()));
    for object in workloads.into_iter().chain(others) {
        trust_ca(object, &issued.ca_bundle);
        rollout.prepare(object);
        let what = describe(object);
        create_or_replace_dynamic(admin.clone(), object.clone())
            .await
            .with_context(|| format!("installing {what}"))?;
        if rollout == Rollout::Update
            && WORKLOAD_KINDS.contains(&object["kind"].as_str().unwrap_or_default())
        {
            crate::rollout::wait_rolled_out(admin, object, strategy, recorder, ROLLOUT_TIMEOUT)
                .await
                .with_context(|| format!("updating {what}"))?;
        }
    }
    Ok(issued)
}

/// Writes `bundle` into the objects of `strategy` that carry the CA bundle (webhook
/// configurations, APIServices), with `patches` applied as in [`install`]; nothing else of the
/// strategy is touched. A certificate pass between installs calls it when
/// [`issue_certificates`] changed the bundle.
///
/// # Errors
/// When a patch does not apply or the API server refuses an object.
pub async fn publish_ca_bundle(
    admin: &kube::Client,
    strategy: &Strategy,
    patches: &[CustomizeComponentsPatch],
    bundle: &str,
) -> anyhow::Result<()> {
    let mut objects: Vec<Value> = strategy.objects.as_ref().clone();
    crate::customize::apply(&mut objects, patches)?;
    for object in objects.iter_mut().filter(|o| carries_ca_bundle(o)) {
        inject_metadata(object, strategy);
        trust_ca(object, bundle);
        let what = describe(object);
        create_or_replace_dynamic(admin.clone(), object.clone())
            .await
            .with_context(|| format!("publishing the CA bundle in {what}"))?;
    }
    Ok(())
}

/// Whether [`trust_ca`] sets a `caBundle` in `object`.
fn carries_ca_bundle(object: &Value) -> bool {
    matches!(
        object["kind"].as_str(),
        Some("MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration" | "APIService")
    )
}

/// `(kind, namespace, name)` of an object.
fn identity(object: &Value) -> (String, String, String) {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (
        text(&object["kind"]),
        text(&object["metadata"]["namespace"]),
        text(&object["metadata"]["name"]),
    )
}

/// Deletes the objects labelled as the operator's that `strategy` no longer has (upstream's
/// `deleteObjectsNotInInstallStrategy`), for every kind of the strategy; never the operator's
/// own manifest. Returns how many were deleted.
///
/// # Errors
/// When listing or deleting fails.
pub async fn prune(
    admin: &kube::Client,
    config: &kubevirt_install::InstallConfig,
    strategy: &Strategy,
) -> anyhow::Result<usize> {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let wanted: BTreeSet<_> = strategy.objects.iter().map(identity).collect();
    let mut kinds: Vec<(String, String)> = Vec::new();
    for object in strategy.objects.iter() {
        let kind = (
            object["apiVersion"].as_str().unwrap_or_default().to_owned(),
            object["kind"].as_str().unwrap_or_default().to_owned(),
        );
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    let selector = format!("{}={}", strategy::MANAGED_BY_LABEL, strategy::MANAGED_BY);
    let mut deleted = 0;
    for (api_version, kind) in kinds {
        let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &kind));
        let api: Api<DynamicObject> = Api::all_with(admin.clone(), &ar);
        let listed = api
            .list(&ListParams::default().labels(&selector))
            .await
            .with_context(|| format!("listing {kind}s"))?;
        for item in listed.items {
            let mut object = serde_json::to_value(&item).context("encoding an object")?;
            object["apiVersion"] = json!(api_version);
            object["kind"] = json!(kind);
            let (_, namespace, name) = identity(&object);
            let ours = namespace.is_empty() || namespace == config.namespace;
            if !ours
                || wanted.contains(&identity(&object))
                || kubevirt_install::virt_operator::is_operator_object(&object)
            {
                continue;
            }
            if delete_dynamic(admin.clone(), object).await? {
                info!(
                    kind,
                    namespace, name, "pruned: no longer in the install strategy"
                );
                deleted += 1;
            }
        }
    }
    Ok(deleted)
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
/// Services, RBAC, accounts, Secrets and ConfigMaps, and the CRDs last; a kind not named goes
/// before the CRDs.
const DELETION_ORDER: [&str; 15] = [
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
    "CustomResourceDefinition",
];

/// The objects [`install`] creates that an uninstallation deletes, in [`DELETION_ORDER`]:
/// the install strategy's (never the operator's own manifest: the namespace, the `KubeVirt`
/// CRD, the operator's account, RBAC and Deployment), the certificate Secrets, the CA Secret,
/// the CA bundle and the install strategy ConfigMaps (`strategies`, by name).
///
/// # Errors
/// When the manifests do not render (a bug).
pub fn installed_objects(
    config: &kubevirt_install::InstallConfig,
    strategies: &[String],
) -> anyhow::Result<Vec<Value>> {
    let namespace = &config.namespace;
    let mut objects =
        kubevirt_install::install_strategy(config).context("rendering the install strategy")?;
    for name in CERTIFICATE_SECRETS
        .into_iter()
        .chain([certificates::CA_SECRET])
    {
        objects.push(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace}}));
    }
    for name in std::iter::once(CA_BUNDLE).chain(strategies.iter().map(String::as_str)) {
        objects.push(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace}}));
    }
    let rank = |o: &Value| {
        let kind = o["kind"].as_str().unwrap_or_default();
        match DELETION_ORDER.iter().position(|k| *k == kind) {
            Some(p) if kind == "CustomResourceDefinition" => p + 1,
            Some(p) => p,
            None => DELETION_ORDER.len() - 1,
        }
    };
    // A stable sort: within a kind, the strategy's order.
    objects.sort_by_key(rank);
    Ok(objects)
}

/// The names of the install strategy ConfigMaps of `namespace`.
async fn strategy_config_maps(
    admin: &kube::Client,
    namespace: &str,
) -> anyhow::Result<Vec<String>> {
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(admin.clone(), namespace);
    Ok(api
        .list(&ListParams::default().labels(strategy::STRATEGY_LABEL))
        .await
        .context("listing the install strategies")?
        .items
        .into_iter()
        .filter_map(|cm| cm.metadata.name)
        .collect())
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
    let strategies = strategy_config_maps(admin, &config.namespace).await?;
    for object in installed_objects(config, &strategies)? {
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
    fn an_uninstallation_deletes_workloads_first_the_crds_last_and_keeps_the_operator() {
        let strategies = vec!["kubevirt-install-strategy-abcde".to_owned()];
        let objects =
            installed_objects(&kubevirt_install::InstallConfig::default(), &strategies).unwrap();
        let kinds: Vec<&str> = objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds.first(), Some(&"DaemonSet"));
        assert_eq!(kinds.last(), Some(&"CustomResourceDefinition"));
        let position = |kind: &str| kinds.iter().position(|k| *k == kind).unwrap();
        assert!(position("Deployment") < position("ValidatingWebhookConfiguration"));
        assert!(position("APIService") < position("ClusterRole"));
        assert!(position("ServiceAccount") < position("Secret"));
        assert!(position("ConfigMap") < position("CustomResourceDefinition"));
        assert!(
            !kinds
                .iter()
                .any(|k| matches!(*k, "Namespace" | "PriorityClass" | "KubeVirt"))
        );
        let names: Vec<&str> = objects
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap())
            .collect();
        assert!(
            !names.iter().any(|n| matches!(
                *n,
                "kubevirt-operator" | "kubevirt-operator-rolebinding" | "virt-operator"
            )),
            "{names:?}"
        );
        assert!(!names.contains(&"kubevirts.kubevirt.io"));
        assert!(names.contains(&"virtualmachines.kubevirt.io"));
        for secret in [
            "kubevirt-ca",
            "kubevirt-virt-api-certs",
            "kubevirt-controller-certs",
            "kubevirt-install-strategy-abcde",
        ] {
            assert!(names.contains(&secret), "{secret}");
        }
    }
}
