//! virt-operator's KubeVirt controller (upstream's `pkg/virt-operator/kubevirt.go`), which
//! `kubevirt-rs operator` runs against any API server. It elects a leader on the Lease `virt-operator` in
//! its namespace; the leader watches the KubeVirt CRs there and, for the CR, installs and keeps
//! installs its install strategy ([`crate::strategy`], [`crate::installer`]: CRDs,
//! RBAC, certificates, workloads), reports upstream's status on the CR and uninstalls on deletion.
//!
//! ```text
//!  KubeVirt CR ─┐      Deployments, DaemonSets (namespace) ─┐
//!               ▼                                          ▼  (every change wakes the CR)
//!      work queue "kubevirt" ──► reconcile(key)
//!          deleting? ──yes──► sync_deletion: phase Deleting, installer::uninstall in
//!             │                upstream's order (workloads first), finalizer removed
//!             no ──► sync_installation: target version/registry, finalizer, installer::install
//!                    (first time, on a change of the rendering, on renewal or a missing workload),
//!                    installer::not_ready → phase Deployed, Available, observed*
//!          status written through the status subresource, only when it changed
//! ```
//!
//! Conditions, reasons and messages are upstream's (`pkg/virt-operator/util/client.go`):
//! `DeploymentInProgress` "Deploying version V with registry R" while deploying,
//! `AllComponentsReady` "All components are ready." once every component is ready,
//! `DeploymentFailed`, `DeletionInProgress`, `DeletionFailed`, `ExistingDeployment`.
//!
//! # Guarantees
//! - Only the Lease holder reconciles; losing the Lease stops the reconciles and the process
//!   exits with an error (its Deployment restarts it), as upstream's operator does.
//! - The CR keeps its finalizer ([`FINALIZER`]) until every installed object is gone, so the
//!   CR disappears only after the uninstallation.
//! - `uninstallStrategy: BlockUninstallIfWorkloadsExist`: while VMIs, VMs or VMI replica sets
//!   exist, nothing is deleted, the CR keeps its finalizer and gets `Synchronized=False`
//!   `DeletionFailed` with upstream's message and a Warning event; the uninstallation goes on
//!   once they are gone (or the strategy changes).
//!
//! # Caveats
//! - Upstream refuses the CR's DELETE in its admission webhook while workloads exist; here the
//!   CR is already terminating and waits (the operator runs no webhook yet).
//! - Only the oldest CR of the namespace is installed; any other gets `ExistingDeployment`.
//! - The install strategy is generated in-process, not dumped by a Job ([`crate::strategy`]).
//! - No update path yet: a changed configuration is applied at once in the install order,
//!   not rolled in upstream's update order, and launchers are not marked outdated.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kubevirt_api::v1::{
    ConditionStatus, CustomizeComponentsPatch, KubeVirt, KubeVirtCondition, KubeVirtConditionType,
    KubeVirtPhase, KubeVirtStatus, VirtualMachine, VirtualMachineInstance,
    VirtualMachineInstanceReplicaSet,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use virt_controller::runtime::controller::{Action, Controller, ControllerError};
use virt_controller::runtime::events::{EventRecorder, EventType};
use virt_controller::runtime::informer::{Informer, InformerHandle};
use virt_controller::runtime::leader::{LeaderElectionConfig, LeaderElector};
use virt_controller::runtime::queue::WorkQueue;

use ConditionStatus::{False, True};

/// The CR's finalizer (upstream's `KubeVirtFinalizer`).
pub const FINALIZER: &str = "kubevirt.io/foregroundDeleteKubeVirt";
/// The finalizer of upstream's older releases, removed with [`FINALIZER`].
const DEPRECATED_FINALIZER: &str = "foregroundDeleteKubeVirt";
/// The leader Lease.
pub const LEASE: &str = "virt-operator";
/// This operator's version (`status.operatorVersion`).
pub const OPERATOR_VERSION: &str = env!("CARGO_PKG_VERSION");
/// Upstream's `uninstallStrategy` that keeps KubeVirt while workloads exist.
const BLOCK_UNINSTALL: &str = "BlockUninstallIfWorkloadsExist";

/// How soon a CR whose components are not ready yet is looked at again (virt-api's endpoint
/// readiness is not watched).
const NOT_READY_REQUEUE: Duration = Duration::from_secs(1);
/// How soon a blocked uninstallation is looked at again (workloads are not watched).
const BLOCKED_REQUEUE: Duration = Duration::from_secs(5);

/// Runs the operator in `namespace` until `cancel` fires; an error when leadership is lost.
///
/// # Errors
/// When the leader election fails or the Lease is lost.
pub async fn run(
    client: kube::Client,
    namespace: &str,
    metrics: &crate::serving::OperatorMetrics,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    metrics.set_ready(true);
    let leader = LeaderElectionConfig {
        lease_name: LEASE.to_owned(),
        namespace: namespace.to_owned(),
        ..LeaderElectionConfig::default()
    };
    let (elector, status) = LeaderElector::new(client.clone(), leader);
    let election_cancel = cancel.child_token();
    let election = tokio::spawn(elector.run(election_cancel.clone()));
    let lost = tokio::select! {
        () = cancel.cancelled() => false,
        acquired = status.acquired() => match acquired {
            Err(_) => true,
            Ok(()) => {
                info!(namespace, "acquired the virt-operator lease; starting the KubeVirt controller");
                metrics.set_leading(true);
                let controllers = cancel.child_token();
                tokio::select! {
                    () = run_controller(client, namespace, controllers.clone()) => false,
                    () = status.lost() => {
                        warn!("lost the virt-operator lease; stopping");
                        controllers.cancel();
                        true
                    }
                }
            }
        },
    };
    metrics.set_leading(false);
    election_cancel.cancel();
    let election = election.await;
    if lost && !cancel.is_cancelled() {
        match election {
            Ok(Err(e)) => return Err(e).context("leader election"),
            _ => anyhow::bail!("lost the virt-operator lease"),
        }
    }
    Ok(())
}

/// The KubeVirt controller: informers on the CRs and the namespace's workloads, one worker.
async fn run_controller(client: kube::Client, namespace: &str, cancel: CancellationToken) {
    let queue = WorkQueue::new("kubevirt");
    let mut kubevirts = Informer::<KubeVirt>::new();
    kubevirts.enqueue(queue.clone(), |kv| key_of(kv).into_iter());
    let kv_handle = kubevirts.handle();
    let mut deployments = Informer::<Deployment>::new();
    let mut daemonsets = Informer::<DaemonSet>::new();
    let all_keys = {
        let kv_handle = kv_handle.clone();
        move || -> Vec<String> {
            kv_handle
                .store()
                .state()
                .iter()
                .filter_map(|kv| key_of(kv))
                .collect()
        }
    };
    {
        let all_keys = all_keys.clone();
        deployments.enqueue(queue.clone(), move |_| all_keys());
    }
    daemonsets.enqueue(queue.clone(), move |_| all_keys());
    let context = Arc::new(Context {
        client: client.clone(),
        namespace: namespace.to_owned(),
        base: kubevirt_install::InstallConfig {
            namespace: namespace.to_owned(),
            ..kubevirt_install::InstallConfig::default()
        },
        kubevirts: kv_handle.clone(),
        deployments: deployments.handle(),
        daemonsets: daemonsets.handle(),
        applied: Mutex::new(None),
        strategies: crate::strategy::StrategyCache::default(),
        recorder: EventRecorder::new(client.clone(), "virt-operator"),
    });
    let (deployment_handle, daemonset_handle) = (deployments.handle(), daemonsets.handle());
    let informers = async {
        tokio::join!(
            kubevirts.run(
                Api::namespaced(client.clone(), namespace),
                watcher::Config::default()
            ),
            deployments.run(
                Api::namespaced(client.clone(), namespace),
                watcher::Config::default()
            ),
            daemonsets.run(
                Api::namespaced(client.clone(), namespace),
                watcher::Config::default()
            ),
        );
    };
    let controller = async {
        let synced = async {
            kv_handle.wait_for_sync().await?;
            deployment_handle.wait_for_sync().await?;
            daemonset_handle.wait_for_sync().await
        };
        tokio::select! {
            () = cancel.cancelled() => return,
            result = synced => if result.is_err() { return },
        }
        let reconciler = move |key: String| {
            let context = Arc::clone(&context);
            async move { context.reconcile(&key).await }
        };
        Controller::new("kubevirt", queue, reconciler)
            .run(cancel.clone())
            .await;
    };
    tokio::select! {
        () = informers => {}
        () = controller => {}
    }
}

fn key_of(kv: &KubeVirt) -> Option<String> {
    Some(format!(
        "{}/{}",
        kv.metadata.namespace.as_deref()?,
        kv.metadata.name.as_deref()?
    ))
}

/// What was last installed, for which CR.
struct Applied {
    uid: String,
    config: kubevirt_install::InstallConfig,
    patches: Vec<CustomizeComponentsPatch>,
    /// The CR's certificate lifetimes it was installed with (a change renews at once).
    lifetimes: crate::certificates::Lifetimes,
    deployment_id: String,
    /// When the certificates want their next pass.
    renew_at: tokio::time::Instant,
    /// The CA bundle the registration objects were last given.
    ca_bundle: String,
}

struct Context {
    client: kube::Client,
    namespace: String,
    base: kubevirt_install::InstallConfig,
    kubevirts: InformerHandle<KubeVirt>,
    deployments: InformerHandle<Deployment>,
    daemonsets: InformerHandle<DaemonSet>,
    applied: Mutex<Option<Applied>>,
    strategies: crate::strategy::StrategyCache,
    recorder: EventRecorder,
}

/// A failed reconcile.
#[derive(Debug)]
enum OperatorError {
    /// Installing (or reconciling) failed.
    Install(anyhow::Error),
    /// Uninstalling failed.
    Delete(anyhow::Error),
    /// Writing the CR's status or finalizers failed.
    Write(kube::Error),
}

impl std::fmt::Display for OperatorError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Install(e) => write!(f, "installing KubeVirt: {e:#}"),
            Self::Delete(e) => write!(f, "uninstalling KubeVirt: {e:#}"),
            Self::Write(e) => write!(f, "writing the KubeVirt CR: {e}"),
        }
    }
}

impl std::error::Error for OperatorError {}

impl ControllerError for OperatorError {
    fn reason(&self) -> &str {
        match self {
            Self::Install(_) => "DeploymentFailed",
            Self::Delete(_) => "DeletionFailed",
            Self::Write(_) => "FailedUpdate",
        }
    }
}

impl Context {
    /// Upstream's `execute`: sync (installation or deletion) on a copy of the CR, then write
    /// the status and the finalizers where they changed.
    async fn reconcile(&self, key: &str) -> Result<Action, OperatorError> {
        let Some(kv) = self.kubevirts.get_by_key(key) else {
            return Ok(Action::Done);
        };
        let mut status = kv.status.clone().unwrap_or_default();
        let mut finalizers = kv.metadata.finalizers.clone().unwrap_or_default();
        let outcome = if !self.is_active(&kv) {
            conditions_failed_exists(&mut status.conditions);
            Ok(Action::Done)
        } else if kv.metadata.deletion_timestamp.is_some() {
            self.sync_deletion(&kv, &mut status, &mut finalizers).await
        } else {
            self.sync_installation(&kv, &mut status, &mut finalizers)
                .await
        };
        let old = kv.status.clone().unwrap_or_default();
        stamp_conditions(&old.conditions, &mut status.conditions, &now());
        let api: Api<KubeVirt> = Api::namespaced(self.client.clone(), &self.namespace);
        let name = kv.metadata.name.clone().unwrap_or_default();
        if status != old {
            let patch = json!({
                "metadata": {"resourceVersion": kv.metadata.resource_version},
                "status": status,
            });
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(OperatorError::Write)?;
        }
        if Some(&finalizers) != kv.metadata.finalizers.as_ref()
            && !(finalizers.is_empty() && kv.metadata.finalizers.is_none())
        {
            let patch = json!({"metadata": {"finalizers": finalizers}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(OperatorError::Write)?;
        }
        outcome
    }

    /// Whether `kv` is the installation of this namespace: the oldest CR (by creation, then
    /// name).
    fn is_active(&self, kv: &KubeVirt) -> bool {
        let oldest = self.kubevirts.store().state().into_iter().min_by(|a, b| {
            let at = |k: &KubeVirt| k.metadata.creation_timestamp.clone().map(|t| t.0);
            at(a)
                .cmp(&at(b))
                .then_with(|| a.metadata.name.cmp(&b.metadata.name))
        });
        oldest.is_none_or(|o| o.metadata.uid == kv.metadata.uid)
    }

    /// Upstream's `syncInstallation` (see the module documentation).
    async fn sync_installation(
        &self,
        kv: &KubeVirt,
        status: &mut KubeVirtStatus,
        finalizers: &mut Vec<String>,
    ) -> Result<Action, OperatorError> {
        let config = crate::installer::target_config(&self.base, Some(kv));
        status.operator_version = Some(OPERATOR_VERSION.to_owned());
        status.target_kube_virt_version = Some(config.image_tag.clone());
        status.target_kube_virt_registry = Some(config.image_registry.clone());
        if status.phase.is_none() || status.phase == Some(KubeVirtPhase::Unset) {
            status.phase = Some(KubeVirtPhase::Deploying);
        }
        if is_updating(status) {
            conditions_updating(status);
        } else {
            conditions_deploying(status);
        }
        set_finalizer(finalizers);
        let uid = kv.metadata.uid.clone().unwrap_or_default();
        let patches = crate::installer::target_patches(kv);
        let lifetimes = crate::certificates::Lifetimes::from_cr(Some(kv));
        let rollout = crate::installer::Rollout::for_versions(
            status.observed_kube_virt_version.as_deref(),
            &config.image_tag,
        );
        let deployment_id = match self
            .apply_if_needed(&uid, &config, &patches, lifetimes, rollout)
            .await
        {
            Ok(id) => id,
            Err(e) => {
                conditions_failed_error(&mut status.conditions, &format!("{e:#}"));
                return Err(OperatorError::Install(e));
            }
        };
        // The strategy now installed; `observedDeploymentID` follows once it is ready, so the
        // two differ while a rollout is under way (the workload updater waits for them).
        status.target_deployment_id = Some(deployment_id.clone());
        set_condition(
            &mut status.conditions,
            KubeVirtConditionType::Created,
            ConditionStatus::True,
            "AllResourcesCreated",
            "All resources were created.",
        );
        let missing = crate::installer::not_ready(&self.client, &self.namespace, 1).await;
        if !missing.is_empty() {
            tracing::debug!(?missing, "KubeVirt's components are not ready yet");
            return Ok(Action::RequeueAfter(NOT_READY_REQUEUE));
        }
        status.observed_kube_virt_version = status.target_kube_virt_version.clone();
        status.observed_kube_virt_registry = status.target_kube_virt_registry.clone();
        status.observed_deployment_id = Some(deployment_id);
        status.phase = Some(KubeVirtPhase::Deployed);
        conditions_available(&mut status.conditions);
        status.observed_generation = kv.metadata.generation;
        let renew_at = self
            .applied
            .lock()
            .map_err(|_| OperatorError::Install(anyhow::anyhow!("poisoned state")))?
            .as_ref()
            .map(|a| a.renew_at);
        let renew_in = renew_at.map_or(NOT_READY_REQUEUE, |at| {
            at.saturating_duration_since(tokio::time::Instant::now())
        });
        Ok(Action::RequeueAfter(renew_in))
    }

    /// Installs `config`'s install strategy with `patches` for the CR `uid` unless it is
    /// installed already (the first time, on a change of the configuration, the patches or
    /// the certificate lifetimes, or when a workload is missing), then prunes what left the
    /// strategy; when only the certificates are due, renews them alone (and publishes a
    /// changed bundle with [`crate::installer::publish_ca_bundle`]). Returns the strategy's
    /// deployment ID.
    async fn apply_if_needed(
        &self,
        uid: &str,
        config: &kubevirt_install::InstallConfig,
        patches: &[CustomizeComponentsPatch],
        lifetimes: crate::certificates::Lifetimes,
        rollout: crate::installer::Rollout,
    ) -> anyhow::Result<String> {
        // What was installed for this very configuration: `(deployment id, CA bundle, whether
        // the certificates are due)`.
        let current = self
            .applied
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned state"))?
            .as_ref()
            .filter(|a| {
                a.uid == uid
                    && a.config == *config
                    && a.patches == patches
                    && a.lifetimes == lifetimes
            })
            .map(|a| {
                let due = tokio::time::Instant::now() >= a.renew_at;
                (a.deployment_id.clone(), a.ca_bundle.clone(), due)
            });
        let workloads_present = ["virt-api", "virt-controller"]
            .iter()
            .all(|name| self.deployments.get(Some(&self.namespace), name).is_some())
            && self
                .daemonsets
                .get(Some(&self.namespace), "virt-handler")
                .is_some();
        match current.filter(|_| workloads_present) {
            Some((id, _, false)) => return Ok(id),
            // Only the certificates are due: renew them without rendering or walking the
            // strategy (rendering it alone took 3 s of a debug build per renewal); only a
            // changed bundle is written to the objects that carry it.
            Some((id, published, true)) => {
                let issued =
                    crate::installer::issue_certificates(&self.client, &self.namespace).await?;
                if issued.ca_bundle != published {
                    let strategy = self.strategies.ensure(&self.client, config).await?;
                    crate::installer::publish_ca_bundle(
                        &self.client,
                        &strategy,
                        patches,
                        &issued.ca_bundle,
                    )
                    .await?;
                }
                tracing::debug!(next_certificate_pass_in = ?issued.renew_in(), "certificates renewed");
                if let Some(applied) = self
                    .applied
                    .lock()
                    .map_err(|_| anyhow::anyhow!("poisoned state"))?
                    .as_mut()
                {
                    applied.renew_at = tokio::time::Instant::now() + issued.renew_in();
                    applied.ca_bundle = issued.ca_bundle;
                }
                return Ok(id);
            }
            None => {}
        }
        let first_pass = self
            .applied
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned state"))?
            .is_none();
        if first_pass && workloads_present {
            // A new leader (a restarted or failed-over operator) renews what is due before it
            // walks the whole strategy: a leaf about to expire must not wait for that walk.
            crate::installer::issue_certificates(&self.client, &self.namespace).await?;
        }
        let strategy = self.strategies.ensure(&self.client, config).await?;
        let issued = crate::installer::install(
            &self.client,
            config,
            &strategy,
            patches,
            rollout,
            &self.recorder,
        )
        .await?;
        let pruned = crate::installer::prune(&self.client, config, &strategy).await?;
        info!(
            namespace = %self.namespace,
            version = %config.image_tag,
            strategy = %strategy.config_map,
            id = %strategy.id,
            pruned,
            ?rollout,
            next_certificate_pass_in = ?issued.renew_in(),
            "KubeVirt installed"
        );
        *self
            .applied
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned state"))? = Some(Applied {
            uid: uid.to_owned(),
            config: config.clone(),
            patches: patches.to_vec(),
            lifetimes,
            deployment_id: strategy.id.clone(),
            renew_at: tokio::time::Instant::now() + issued.renew_in(),
            ca_bundle: issued.ca_bundle,
        });
        Ok(strategy.id)
    }

    /// Upstream's `syncDeletion` (see the module documentation).
    async fn sync_deletion(
        &self,
        kv: &KubeVirt,
        status: &mut KubeVirtStatus,
        finalizers: &mut Vec<String>,
    ) -> Result<Action, OperatorError> {
        if !finalizers.iter().any(|f| is_ours(f)) {
            return Ok(Action::Done);
        }
        if kv.spec.uninstall_strategy.as_deref() == Some(BLOCK_UNINSTALL)
            && status.phase != Some(KubeVirtPhase::Deleting)
        {
            let present = workloads_present(&self.client)
                .await
                .map_err(OperatorError::Delete)?;
            if let Some(what) = present {
                let message = uninstall_blocked_message(what);
                set_condition(
                    &mut status.conditions,
                    KubeVirtConditionType::Synchronized,
                    ConditionStatus::False,
                    "DeletionFailed",
                    &format!("An error occurred during deletion: {message}"),
                );
                self.recorder
                    .record(kv, EventType::Warning, "DeletionFailed", &message)
                    .await;
                return Ok(Action::RequeueAfter(BLOCKED_REQUEUE));
            }
        }
        status.phase = Some(KubeVirtPhase::Deleting);
        conditions_deleting(status);
        let config = crate::installer::target_config(&self.base, Some(kv));
        let existed = match crate::installer::uninstall(&self.client, &config).await {
            Ok(existed) => existed,
            Err(e) => {
                set_condition(
                    &mut status.conditions,
                    KubeVirtConditionType::Synchronized,
                    ConditionStatus::False,
                    "DeletionFailed",
                    &format!("An error occurred during deletion: {e:#}"),
                );
                return Err(OperatorError::Delete(e));
            }
        };
        if existed > 0 {
            // Another round confirms that nothing is left.
            return Ok(Action::RequeueAfter(Duration::from_millis(200)));
        }
        if let Ok(mut applied) = self.applied.lock() {
            *applied = None;
        }
        status.phase = Some(KubeVirtPhase::Deleted);
        finalizers.retain(|f| !is_ours(f));
        info!(namespace = %self.namespace, "KubeVirt deleted");
        Ok(Action::Done)
    }
}

/// The first kind of KubeVirt workload that still exists (upstream's uninstall check order).
///
/// # Errors
/// When a kind cannot be listed.
pub(crate) async fn workloads_present(
    client: &kube::Client,
) -> anyhow::Result<Option<&'static str>> {
    let one = ListParams::default().limit(1);
    let vmis = Api::<VirtualMachineInstance>::all(client.clone())
        .list(&one)
        .await
        .context("listing VMIs")?;
    if !vmis.items.is_empty() {
        return Ok(Some("Virtual Machine Instances"));
    }
    let vms = Api::<VirtualMachine>::all(client.clone())
        .list(&one)
        .await
        .context("listing VMs")?;
    if !vms.items.is_empty() {
        return Ok(Some("Virtual Machines"));
    }
    let sets = Api::<VirtualMachineInstanceReplicaSet>::all(client.clone())
        .list(&one)
        .await
        .context("listing VMI replica sets")?;
    Ok((!sets.items.is_empty()).then_some("Virtual Machine Instance Replica Sets"))
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

fn is_ours(finalizer: &str) -> bool {
    finalizer == FINALIZER || finalizer == DEPRECATED_FINALIZER
}

/// Upstream's `SetFinalizer`: ours last, the deprecated one dropped.
fn set_finalizer(finalizers: &mut Vec<String>) {
    if finalizers.iter().any(|f| f == FINALIZER)
        && !finalizers.iter().any(|f| f == DEPRECATED_FINALIZER)
    {
        return;
    }
    finalizers.retain(|f| !is_ours(f));
    finalizers.push(FINALIZER.to_owned());
}

/// Upstream's `isUpdating`: a version was observed and the target differs from it.
fn is_updating(status: &KubeVirtStatus) -> bool {
    status.observed_kube_virt_version.is_some()
        && (status.observed_kube_virt_version != status.target_kube_virt_version
            || status.observed_kube_virt_registry != status.target_kube_virt_registry)
}

/// The admission message of upstream's deletion admitter.
pub(crate) fn uninstall_blocked_message(what: &str) -> String {
    format!(
        "Rejecting the uninstall request, since there are still {what} present. Either delete \
         all KubeVirt related workloads or change the uninstall strategy before uninstalling \
         KubeVirt."
    )
}

/// Sets (or adds) the condition of `type_`; timestamps come from [`stamp_conditions`].
fn set_condition(
    conditions: &mut Vec<KubeVirtCondition>,
    type_: KubeVirtConditionType,
    status: ConditionStatus,
    reason: &str,
    message: &str,
) {
    let condition = match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => c,
        None => {
            conditions.push(KubeVirtCondition::new(type_, status.clone()));
            conditions.last_mut().expect("just pushed")
        }
    };
    condition.status = status;
    condition.reason = Some(reason.to_owned());
    condition.message = Some(message.to_owned());
}

fn remove_condition(conditions: &mut Vec<KubeVirtCondition>, type_: &KubeVirtConditionType) {
    conditions.retain(|c| c.type_ != *type_);
}

/// Available, Progressing and Degraded at once, with one reason and message.
fn set_triple(
    conditions: &mut Vec<KubeVirtCondition>,
    [available, progressing, degraded]: [ConditionStatus; 3],
    reason: &str,
    message: &str,
) {
    for (type_, status) in [
        (KubeVirtConditionType::Available, available),
        (KubeVirtConditionType::Progressing, progressing),
        (KubeVirtConditionType::Degraded, degraded),
    ] {
        set_condition(conditions, type_, status, reason, message);
    }
}

fn conditions_deploying(status: &mut KubeVirtStatus) {
    remove_condition(&mut status.conditions, &KubeVirtConditionType::Synchronized);
    let message = format!(
        "Deploying version {} with registry {}",
        status
            .target_kube_virt_version
            .as_deref()
            .unwrap_or_default(),
        status
            .target_kube_virt_registry
            .as_deref()
            .unwrap_or_default()
    );
    set_triple(
        &mut status.conditions,
        [False, True, False],
        "DeploymentInProgress",
        &message,
    );
}

fn conditions_updating(status: &mut KubeVirtStatus) {
    remove_condition(&mut status.conditions, &KubeVirtConditionType::Created);
    remove_condition(&mut status.conditions, &KubeVirtConditionType::Synchronized);
    let message = format!(
        "Transitioning from previous version {} with registry {} to target version {} using \
         registry {}",
        status
            .observed_kube_virt_version
            .as_deref()
            .unwrap_or_default(),
        status
            .observed_kube_virt_registry
            .as_deref()
            .unwrap_or_default(),
        status
            .target_kube_virt_version
            .as_deref()
            .unwrap_or_default(),
        status
            .target_kube_virt_registry
            .as_deref()
            .unwrap_or_default()
    );
    set_triple(
        &mut status.conditions,
        [True, True, True],
        "UpdateInProgress",
        &message,
    );
}

fn conditions_available(conditions: &mut Vec<KubeVirtCondition>) {
    set_triple(
        conditions,
        [True, False, False],
        "AllComponentsReady",
        "All components are ready.",
    );
}

fn conditions_failed_error(conditions: &mut Vec<KubeVirtCondition>, error: &str) {
    let message = format!("An error occurred during deployment: {error}");
    set_condition(
        conditions,
        KubeVirtConditionType::Synchronized,
        False,
        "DeploymentFailed",
        &message,
    );
    set_triple(
        conditions,
        [False, False, True],
        "DeploymentFailed",
        &message,
    );
}

fn conditions_failed_exists(conditions: &mut Vec<KubeVirtCondition>) {
    set_condition(
        conditions,
        KubeVirtConditionType::Synchronized,
        False,
        "ExistingDeployment",
        "There is an active KubeVirt deployment",
    );
}

fn conditions_deleting(status: &mut KubeVirtStatus) {
    remove_condition(&mut status.conditions, &KubeVirtConditionType::Created);
    remove_condition(&mut status.conditions, &KubeVirtConditionType::Synchronized);
    set_triple(
        &mut status.conditions,
        [False, False, True],
        "DeletionInProgress",
        "Deletion was triggered",
    );
}

/// Upstream's `SetConditionTimestamps`: a condition that changed (status, reason or message)
/// gets `now` as probe and transition time; a new one `now` as probe time; an unchanged one
/// keeps its times (so an unchanged status is not written again).
fn stamp_conditions(old: &[KubeVirtCondition], new: &mut [KubeVirtCondition], now: &Time) {
    for condition in new {
        match old.iter().find(|c| c.type_ == condition.type_) {
            Some(before) => {
                if before.status != condition.status
                    || before.reason != condition.reason
                    || before.message != condition.message
                {
                    condition.last_probe_time = Some(now.clone());
                    condition.last_transition_time = Some(now.clone());
                } else {
                    condition
                        .last_probe_time
                        .clone_from(&before.last_probe_time);
                    condition
                        .last_transition_time
                        .clone_from(&before.last_transition_time);
                }
            }
            None => condition.last_probe_time = Some(now.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(conditions: &[KubeVirtCondition], type_: &KubeVirtConditionType) -> KubeVirtCondition {
        conditions
            .iter()
            .find(|c| c.type_ == *type_)
            .unwrap()
            .clone()
    }

    #[test]
    fn a_first_deployment_progresses_then_is_available_with_upstreams_reasons() {
        let mut status = KubeVirtStatus {
            target_kube_virt_version: Some("1.2.3".into()),
            target_kube_virt_registry: Some("kubevirt-rs".into()),
            ..Default::default()
        };
        assert!(!is_updating(&status));
        conditions_deploying(&mut status);
        let available = find(&status.conditions, &KubeVirtConditionType::Available);
        assert_eq!(available.status, False);
        assert_eq!(available.reason.as_deref(), Some("DeploymentInProgress"));
        assert_eq!(
            available.message.as_deref(),
            Some("Deploying version 1.2.3 with registry kubevirt-rs")
        );
        let progressing = find(&status.conditions, &KubeVirtConditionType::Progressing);
        assert_eq!(progressing.status, True);
        conditions_available(&mut status.conditions);
        let available = find(&status.conditions, &KubeVirtConditionType::Available);
        assert_eq!(available.status, True);
        assert_eq!(available.reason.as_deref(), Some("AllComponentsReady"));
        assert_eq!(
            available.message.as_deref(),
            Some("All components are ready.")
        );
        assert_eq!(status.conditions.len(), 3);
    }

    #[test]
    fn another_target_than_the_observed_version_is_an_update() {
        let status = KubeVirtStatus {
            target_kube_virt_version: Some("2".into()),
            observed_kube_virt_version: Some("1".into()),
            ..Default::default()
        };
        assert!(is_updating(&status));
    }

    #[test]
    fn unchanged_conditions_keep_their_times_so_the_status_is_not_rewritten() {
        let t0 = Time(k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap());
        let t1 = Time(k8s_openapi::jiff::Timestamp::from_second(2_000).unwrap());
        let mut old = vec![];
        conditions_available(&mut old);
        stamp_conditions(&[], &mut old, &t0);
        assert_eq!(old[0].last_probe_time, Some(t0.clone()));
        let mut new = old.clone();
        conditions_available(&mut new);
        stamp_conditions(&old, &mut new, &t1);
        assert_eq!(new, old);
        let mut changed = old.clone();
        conditions_failed_error(&mut changed, "boom");
        stamp_conditions(&old, &mut changed, &t1);
        let available = find(&changed, &KubeVirtConditionType::Available);
        assert_eq!(available.last_transition_time, Some(t1));
        assert_eq!(
            available.message.as_deref(),
            Some("An error occurred during deployment: boom")
        );
    }

    #[test]
    fn the_finalizer_is_added_once_and_replaces_the_deprecated_one() {
        let mut finalizers = vec!["other".to_owned(), DEPRECATED_FINALIZER.to_owned()];
        set_finalizer(&mut finalizers);
        assert_eq!(finalizers, ["other", FINALIZER]);
        set_finalizer(&mut finalizers);
        assert_eq!(finalizers, ["other", FINALIZER]);
    }

    #[test]
    fn deleting_drops_created_and_synchronized_and_degrades() {
        let mut status = KubeVirtStatus::default();
        conditions_failed_exists(&mut status.conditions);
        set_condition(
            &mut status.conditions,
            KubeVirtConditionType::Created,
            True,
            "AllResourcesCreated",
            "All resources were created.",
        );
        conditions_deleting(&mut status);
        assert!(status.conditions.iter().all(|c| !matches!(
            c.type_,
            KubeVirtConditionType::Created | KubeVirtConditionType::Synchronized
        )));
        let degraded = find(&status.conditions, &KubeVirtConditionType::Degraded);
        assert_eq!(degraded.status, True);
        assert_eq!(degraded.reason.as_deref(), Some("DeletionInProgress"));
        assert!(uninstall_blocked_message("Virtual Machine Instances")
            .starts_with("Rejecting the uninstall request, since there are still Virtual Machine Instances present."));
    }
}
