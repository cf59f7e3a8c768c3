//! The VM controller: keeps one VirtualMachineInstance per VirtualMachine according to its run
//! strategy, and mirrors the VMI into the VM status (reference §2).
//!
//! Data flow: informers on VMs, VMIs, ControllerRevisions, claims and DataVolumes fill caches
//! and enqueue the VM key (`namespace/name`; a VMI wakes its controlling VM, an orphan VMI the
//! VM of the same name, a DataVolume its controlling VM and the VMs referring to its name) →
//! `reconcile`: fetch the VM from the cache, record the observed API version, claim (or
//! adopt) the VMI and the DataVolumes of its templates → [`sync::plan`] computes the intended writes purely from the
//! observed state → `execute` performs them → [`status::compute_status`] derives the new
//! status from the same observation and the sync outcome → [`status::status_patch`] writes
//! only what changed → a final VMI's controller finalizer is removed.
//!
//! The label/annotation sync patterns come through a `tokio::sync::watch` channel of
//! [`MetadataSyncPatterns`]: every reconcile reads the current value, and a change re-enqueues all VMs.
//! Whoever owns the flags (or watches the KubeVirt CR) keeps the sender and calls
//! `send_replace` to reconfigure a running controller.
//!
//! DataVolumes are CDI's (`cdi.kubevirt.io/v1beta1`). When CDI is not installed the
//! DataVolume informer keeps retrying its list in the background and the controller does not
//! wait for it: templates then fail to be created with the API server's answer, as upstream's
//! dummy informer makes them fail; once CDI is installed, the informer fills (upstream
//! restarts virt-controller instead).
//!
//! Deviations from upstream: writes are JSON (or merge) patches of just what changed — the
//! api-version annotations, finalizers, the VM spec, the VMI metadata and the VM status —
//! never full updates; an unchanged status is never written.

mod execute;
pub mod live_update;

pub mod backoff;
pub mod data_volumes;
pub mod label_sync;
pub mod network;
pub mod start;
pub mod status;
pub mod sync;
pub mod volume_requests;

use std::sync::Arc;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use kubevirt_api::cdi::DataVolume;
use kubevirt_api::constants::{
    LATEST_OBSERVED_API_VERSION_ANNOTATION, STORAGE_OBSERVED_API_VERSION_ANNOTATION, VERSION,
    VM_CONTROLLER_FINALIZER,
};
use kubevirt_api::v1::{VirtualMachine, VirtualMachineInstance};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::kubevirt_config::ClusterSettings;
use crate::metadata_sync::{MetadataSyncPatterns, SyncPatterns};
use crate::runtime::controller::{Action, Controller, ControllerError, Reconciler};
use crate::runtime::events::EventRecorder;
use crate::runtime::expectations::Expectations;
use crate::runtime::informer::{Informer, InformerHandle};
use crate::runtime::metrics::Metrics;
use crate::runtime::queue::{RateLimiterConfig, WorkQueue};
use crate::runtime::{json_patch, key_of, split_key};
use crate::sync_failure::SyncFailure;

use execute::{Executor, Halt};
use status::{StatusInput, compute_status, status_patch};
use sync::{SyncInput, SyncPlan};

/// Name of the VM controller's queue and metrics.
pub const CONTROLLER_NAME: &str = "virt-controller-vm";

/// The component the VM and VMI controllers' events are reported as (upstream's).
pub const EVENT_COMPONENT: &str = "virtualmachine-controller";

/// Configuration of [`run_vm_controller`].
#[derive(Clone, Debug)]
pub struct VmControllerConfig {
    /// The current sync patterns; a new value re-enqueues every VM.
    pub sync: watch::Receiver<MetadataSyncPatterns>,
    /// Concurrent reconciles (upstream `--vm-controller-threads`, 3).
    pub workers: usize,
    /// The cluster configuration (the rollout strategy).
    pub cluster: watch::Receiver<ClusterSettings>,
}

impl VmControllerConfig {
    /// A configuration whose patterns never change.
    pub fn fixed(
        labels_sync: SyncPatterns,
        annotations_sync: SyncPatterns,
        workers: usize,
    ) -> Self {
        let (_, sync) = watch::channel(MetadataSyncPatterns {
            labels: labels_sync,
            annotations: annotations_sync,
        });
        let (_, cluster) = watch::channel(ClusterSettings::default());
        Self {
            sync,
            workers,
            cluster,
        }
    }
}

/// The expectations of one VM key as the decisions need them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpectView {
    /// No creation or deletion pending (or the record expired).
    pub satisfied: bool,
    /// A VMI creation is pending (read without the expiry, as upstream).
    pub creations_pending: bool,
    /// A VMI deletion is pending (read without the expiry, as upstream).
    pub deletions_pending: bool,
}

impl ExpectView {
    /// The view of `key` in `expectations`.
    pub fn of(expectations: &Expectations, key: &str) -> Self {
        let pending = expectations.pending(key);
        Self {
            satisfied: expectations.satisfied(key),
            creations_pending: pending.is_some_and(|p| p.add > 0),
            deletions_pending: pending.is_some_and(|p| p.del > 0),
        }
    }

    /// Nothing pending.
    pub fn idle() -> Self {
        Self {
            satisfied: true,
            ..Self::default()
        }
    }
}

/// A failed VM reconcile.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// The sync failed; the VM got a `Failure` condition.
    #[error(transparent)]
    Sync(SyncFailure),
    /// Recording the observed API version on the VM failed.
    #[error("recording the observed API version failed")]
    ApiVersionPatch(#[source] kube::Error),
    /// Adopting an orphan VMI failed.
    #[error("adopting the orphan VMI failed")]
    Adopt(#[source] kube::Error),
    /// Writing the VM status failed.
    #[error("patching the VM status failed")]
    StatusPatch(#[source] kube::Error),
    /// Removing the controller finalizer from a final VMI failed.
    #[error("removing the VMI finalizer failed")]
    VmiFinalizer(#[source] kube::Error),
    /// Adding or removing the VM's own finalizer failed (upstream: an error, no condition).
    #[error("patching the VM finalizers failed")]
    FinalizerPatch(#[source] kube::Error),
    /// The run strategy cannot be resolved (upstream: an error, no status write).
    #[error("{0}")]
    RunStrategy(String),
    /// The uncached re-check before adopting an orphan VMI refused the adoption.
    #[error("{0}")]
    AdoptRecheck(String),
}

impl ControllerError for VmError {
    fn reason(&self) -> &str {
        match self {
            VmError::Sync(f) => &f.reason,
            VmError::ApiVersionPatch(_) => "FailedUpdate",
            VmError::Adopt(_) => "FailedAdopt",
            VmError::StatusPatch(_) => "FailedUpdateStatus",
            VmError::VmiFinalizer(_) => "FailedVMIFinalizer",
            VmError::FinalizerPatch(_) => "FailedVMFinalizer",
            VmError::RunStrategy(_) => "FailedCreate",
            VmError::AdoptRecheck(_) => "FailedAdopt",
        }
    }
}

/// What the reconciler reads and writes through.
pub struct Context {
    client: Client,
    vms: InformerHandle<VirtualMachine>,
    vmis: InformerHandle<VirtualMachineInstance>,
    revisions: InformerHandle<ControllerRevision>,
    claims: InformerHandle<PersistentVolumeClaim>,
    data_volumes: InformerHandle<DataVolume>,
    expectations: Arc<Expectations>,
    dv_expectations: Arc<Expectations>,
    sync: watch::Receiver<MetadataSyncPatterns>,
    cluster: watch::Receiver<ClusterSettings>,
    recorder: Arc<EventRecorder>,
}

/// The claims (`namespace/name`) of the VM template's `persistentVolumeClaim`, `dataVolume`
/// and `memoryDump` volumes.
fn template_claims(vm: &VirtualMachine) -> Vec<String> {
    let ns = vm.metadata.namespace.as_deref().unwrap_or_default();
    let volumes = vm
        .spec
        .template
        .spec
        .as_ref()
        .map(|t| t.volumes.as_slice())
        .unwrap_or_default();
    volumes
        .iter()
        .filter_map(|v| {
            let s = &v.volume_source;
            // An `ephemeral` volume's claim counts too, as upstream's `PVCNameFromVirtVolume`.
            s.pod_claim_name()
                .or_else(|| s.memory_dump.as_ref().map(|m| m.claim_name.as_str()))
        })
        .map(|claim| format!("{ns}/{claim}"))
        .collect()
}

/// Whether a claim of the VM's template is in the cache and not `Bound`.
fn claim_unbound(vm: &VirtualMachine, claims: &InformerHandle<PersistentVolumeClaim>) -> bool {
    template_claims(vm).iter().any(|key| {
        claims.get_by_key(key).is_some_and(|pvc| {
            pvc.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound")
        })
    })
}

impl Reconciler for Arc<Context> {
    type Error = VmError;

    async fn reconcile(&self, key: &str) -> Result<Action, VmError> {
        reconcile(self, key).await
    }
}

/// The VM key a VMI change wakes: its controlling VM, or the VM of the same name for an orphan.
pub fn vm_key_of_vmi(vmi: &VirtualMachineInstance) -> Option<String> {
    let namespace = vmi.metadata.namespace.as_deref().unwrap_or_default();
    let owner = controller_ref(vmi);
    match owner {
        Some(o) if o.kind == "VirtualMachine" => Some(format!("{namespace}/{}", o.name)),
        Some(_) => None,
        None => Some(key_of(vmi)),
    }
}

fn controller_ref(
    vmi: &VirtualMachineInstance,
) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    vmi.metadata
        .owner_references
        .as_ref()
        .and_then(|refs| refs.iter().find(|r| r.controller == Some(true)))
}

/// Builds the informers, queue and workers of the VM controller and runs them until `cancel`.
pub async fn run_vm_controller(
    client: Client,
    config: VmControllerConfig,
    metrics: &Metrics,
    cancel: CancellationToken,
) {
    let queue = WorkQueue::with_config(
        RateLimiterConfig::default(),
        metrics.controller(CONTROLLER_NAME),
    );
    let expectations = Arc::new(Expectations::new());
    let mut vms = Informer::<VirtualMachine>::new();
    vms.enqueue(queue.clone(), |vm| Some(key_of(vm)));
    let mut vmis = Informer::<VirtualMachineInstance>::new();
    vmis.enqueue(queue.clone(), vm_key_of_vmi);
    let cached_vms = vms.handle();
    vmis.on_change(observe_vmi(Arc::clone(&expectations), move |key, uid| {
        cached_vms
            .get_by_key(key)
            .is_some_and(|vm| vm.metadata.uid.as_deref() == Some(uid))
    }));
    let revisions = Informer::<ControllerRevision>::new();
    let mut claims = Informer::<PersistentVolumeClaim>::new();
    let claim_vms = vms.handle();
    let claim_queue = queue.clone();
    claims.on_change(move |change| {
        let claim = key_of(change.object());
        for vm in claim_vms.store().state() {
            if template_claims(&vm).contains(&claim) {
                claim_queue.add(key_of(vm.as_ref()));
            }
        }
    });
    let dv_expectations = Arc::new(Expectations::new());
    let mut dvs = Informer::<DataVolume>::new();
    dvs.on_change(observe_data_volume(
        Arc::clone(&dv_expectations),
        vms.handle(),
        queue.clone(),
    ));
    // Without CDI the list fails until it is installed; the controller does not wait for it.
    let cdi_served = client
        .list_api_group_resources(kubevirt_api::cdi::API_VERSION)
        .await
        .is_ok();
    if !cdi_served {
        tracing::info!("CDI is not installed: DataVolume templates cannot be created until it is");
    }
    let ctx = Arc::new(Context {
        client: client.clone(),
        vms: vms.handle(),
        vmis: vmis.handle(),
        revisions: revisions.handle(),
        claims: claims.handle(),
        data_volumes: dvs.handle(),
        expectations,
        dv_expectations,
        sync: config.sync.clone(),
        cluster: config.cluster.clone(),
        recorder: Arc::new(EventRecorder::new(client.clone(), EVENT_COMPONENT)),
    });
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(vms.run(Api::all(client.clone()), watcher::Config::default()));
    tasks.spawn(vmis.run(Api::all(client.clone()), watcher::Config::default()));
    tasks.spawn(claims.run(Api::all(client.clone()), watcher::Config::default()));
    tasks.spawn(dvs.run(Api::all(client.clone()), watcher::Config::default()));
    tasks.spawn(revisions.run(Api::all(client), watcher::Config::default()));
    tasks.spawn(requeue_on_config_change(
        config.sync,
        ctx.vms.clone(),
        queue.clone(),
    ));
    let synced = async {
        ctx.vms.wait_for_sync().await?;
        ctx.vmis.wait_for_sync().await?;
        ctx.claims.wait_for_sync().await?;
        if cdi_served {
            ctx.data_volumes.wait_for_sync().await?;
        }
        ctx.revisions.wait_for_sync().await
    };
    tokio::select! {
        () = cancel.cancelled() => return,
        res = synced => if res.is_err() { return; },
    }
    Controller::new(CONTROLLER_NAME, queue, ctx)
        .workers(config.workers)
        .run(cancel)
        .await;
    tasks.abort_all();
}

/// Lowers the VM expectations when VMI creations and deletions are observed — only for a
/// VMI whose controller reference resolves to a cached VM (`vm_cached(key, uid)`), as
/// upstream: no controller waits for an orphan, so orphans lower nothing.
fn observe_vmi(
    expectations: Arc<Expectations>,
    vm_cached: impl Fn(&str, &str) -> bool + Send + Sync + 'static,
) -> impl Fn(&crate::runtime::informer::Change<'_, VirtualMachineInstance>) + Send + Sync + 'static
{
    use crate::runtime::informer::Change;
    move |change| {
        let vmi = change.object();
        let Some(owner) = controller_ref(vmi).filter(|o| o.kind == "VirtualMachine") else {
            return;
        };
        let namespace = vmi.metadata.namespace.as_deref().unwrap_or_default();
        let vm_key = format!("{namespace}/{}", owner.name);
        if !vm_cached(&vm_key, &owner.uid) {
            return;
        }
        let deleting = |v: &VirtualMachineInstance| v.metadata.deletion_timestamp.is_some();
        match change {
            Change::Added(v) if deleting(v) => expectations.deletion_observed(&vm_key, &key_of(*v)),
            Change::Added(_) => expectations.creation_observed(&vm_key),
            Change::Updated { old, new } if !deleting(old) && deleting(new) => {
                expectations.deletion_observed(&vm_key, &key_of(*new));
            }
            Change::Updated { .. } => {}
            Change::Deleted(v) => expectations.deletion_observed(&vm_key, &key_of(*v)),
        }
    }
}

/// Lowers the DataVolume expectations of the controlling VM when a DataVolume appears, and
/// wakes the VMs a DataVolume change concerns: its controlling VM and the VMs of its
/// namespace that refer to its name.
fn observe_data_volume(
    expectations: Arc<Expectations>,
    vms: InformerHandle<VirtualMachine>,
    queue: WorkQueue<String>,
) -> impl Fn(&crate::runtime::informer::Change<'_, DataVolume>) + Send + Sync + 'static {
    use crate::runtime::informer::Change;
    move |change| {
        let dv = change.object();
        let namespace = dv.metadata.namespace.as_deref().unwrap_or_default();
        let name = dv.metadata.name.as_deref().unwrap_or_default();
        let owner = dv
            .metadata
            .owner_references
            .as_ref()
            .and_then(|refs| refs.iter().find(|r| r.controller == Some(true)))
            .filter(|o| o.kind == "VirtualMachine");
        if let Some(owner) = owner {
            let key = format!("{namespace}/{}", owner.name);
            if matches!(change, Change::Added(_)) {
                expectations.creation_observed(&key);
            }
            queue.add(key);
        }
        for vm in vms.store().state() {
            if vm.metadata.namespace.as_deref() == Some(namespace)
                && data_volumes::referenced(&vm).iter().any(|n| n == name)
            {
                queue.add(key_of(vm.as_ref()));
            }
        }
    }
}

/// The cached DataVolumes `vm` refers to, adopting orphans of its templates' names (merge
/// patch guarded by the DataVolume's UID, as upstream's ref manager).
async fn claim_data_volumes(
    ctx: &Context,
    vm: &VirtualMachine,
) -> Result<Vec<Arc<DataVolume>>, VmError> {
    let namespace = vm.metadata.namespace.as_deref().unwrap_or_default();
    let mut found = Vec::new();
    for name in data_volumes::referenced(vm) {
        let Some(dv) = ctx.data_volumes.get(Some(namespace), &name) else {
            continue;
        };
        if let Some(patch) = data_volumes::adoption(vm, &dv) {
            let api: Api<DataVolume> = Api::namespaced(ctx.client.clone(), namespace);
            let adopted = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(VmError::Adopt)?;
            tracing::info!(dv = %name, "adopted orphan DataVolume");
            found.push(Arc::new(adopted));
        } else {
            found.push(dv);
        }
    }
    Ok(found)
}

/// Re-enqueues every cached VM whenever the sync patterns change.
async fn requeue_on_config_change(
    mut sync: watch::Receiver<MetadataSyncPatterns>,
    vms: InformerHandle<VirtualMachine>,
    queue: WorkQueue<String>,
) {
    while sync.changed().await.is_ok() {
        for vm in vms.store().state() {
            queue.add(key_of(vm.as_ref()));
        }
    }
}

/// One reconcile of the VM `key`.
/// Whether the status write after `actions` succeeded is moot:
/// - a VMI created just now is not in the cache yet, so the status would say `Stopped`; its
///   arrival reconciles the VM again, and that status (`Starting`) is the one written;
/// - removing the last finalizer of a deleted VM removes the VM.
fn status_moot_after(
    vm: &VirtualMachine,
    vmi: Option<&VirtualMachineInstance>,
    actions: &[sync::VmAction],
) -> bool {
    let creates_vmi = vmi.is_none()
        && actions
            .iter()
            .any(|a| matches!(a, sync::VmAction::CreateVmi { .. }));
    let removes_vm = vm.metadata.deletion_timestamp.is_some()
        && vm
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.len() == 1 && f[0] == VM_CONTROLLER_FINALIZER)
        && actions
            .iter()
            .any(|a| matches!(a, sync::VmAction::PatchVmFinalizers(_)));
    creates_vmi || removes_vm
}

async fn reconcile(ctx: &Context, key: &str) -> Result<Action, VmError> {
    let Some(vm) = ctx.vms.get_by_key(key) else {
        ctx.expectations.delete_expectations(key);
        ctx.dv_expectations.delete_expectations(key);
        return Ok(Action::Done);
    };
    let (namespace, name) = split_key(key);
    let namespace = namespace.unwrap_or_default();
    let vms: Api<VirtualMachine> = Api::namespaced(ctx.client.clone(), namespace);
    if needs_api_version_annotations(&vm) {
        let patch = json!({"metadata": {"annotations": {
            LATEST_OBSERVED_API_VERSION_ANNOTATION: VERSION,
            STORAGE_OBSERVED_API_VERSION_ANNOTATION: VERSION,
        }}});
        vms.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(VmError::ApiVersionPatch)?;
        return Ok(Action::Done);
    }
    let vmi = claim_vmi(ctx, &vm, key).await?;
    let data_volumes = claim_data_volumes(ctx, &vm).await?;
    let revisions = start_revisions(ctx, &vm);
    let config = ctx.sync.borrow().clone();
    let now = Timestamp::now();
    let mut expectations = ExpectView::of(&ctx.expectations, key);
    expectations.satisfied &= ctx.dv_expectations.satisfied(key);
    let plan: SyncPlan = sync::plan(&SyncInput {
        vm: &vm,
        vmi: vmi.as_deref(),
        expectations,
        revisions: &revisions,
        config: &config,
        live_update: ctx.cluster.borrow().live_update(),
        now,
        data_volumes: &data_volumes,
    });
    let executor = Executor {
        client: &ctx.client,
        expectations: &ctx.expectations,
        key,
        namespace,
        vm_name: name,
        vm: &vm,
        recorder: &ctx.recorder,
        dv_expectations: &ctx.dv_expectations,
    };
    let status_moot = status_moot_after(&vm, vmi.as_deref(), &plan.actions);
    let outcome = match plan.error.clone() {
        Some(failure) => Err(failure),
        None => match executor.run(plan.actions).await {
            Ok(()) => Ok(()),
            Err(Halt::Sync(failure)) => Err(failure),
            // Upstream returns these before updating the status.
            Err(Halt::Error(err)) => return Err(err),
        },
    };
    if let Some(message) = plan.requeue_error {
        return Err(VmError::RunStrategy(message));
    }
    let status = compute_status(
        &StatusInput {
            vm: &vm,
            vmi: vmi.as_deref(),
            expectations: ExpectView::of(&ctx.expectations, key),
            sync_error: outcome
                .as_ref()
                .err()
                .map(|f| (f.reason.as_str(), f.message.clone())),
            vmi_generation: plan.vmi_generation,
            restart_required: plan.restart_required,
            now,
            claim_unbound: claim_unbound(&vm, &ctx.claims),
            data_volumes: &data_volumes,
        },
        &mut rand::rng(),
    );
    if !(status_moot && outcome.is_ok())
        && let Some(ops) = status_patch(vm.status.as_ref(), &status)
    {
        tracing::debug!(vm = key, ops = %serde_json::Value::Array(ops.clone()), "patching the VM status");
        let patch = json_patch(ops)
            .map_err(|e| VmError::Sync(SyncFailure::new("FailedUpdateStatus", e.to_string())))?;
        match vms
            .patch_status(name, &PatchParams::default(), &patch)
            .await
        {
            Ok(_) => {}
            // A request appended meanwhile (its `test` failed): the newer VM is on its way
            // through the watch, and its reconcile writes the status from it.
            Err(kube::Error::Api(e)) if crate::runtime::lost_race(&e) => {
                tracing::debug!(vm = key, reason = %e.message, "VM status patch lost a race; waiting for the newer VM");
            }
            Err(e) => return Err(VmError::StatusPatch(e)),
        }
    }
    if let Some(vmi) = vmi.as_deref() {
        remove_vmi_finalizer(ctx, namespace, vmi).await?;
    }
    outcome.map_err(VmError::Sync)?;
    Ok(plan
        .requeue_after
        .map_or(Action::Done, Action::RequeueAfter))
}

fn needs_api_version_annotations(vm: &VirtualMachine) -> bool {
    let annotations = vm.metadata.annotations.as_ref();
    let get = |k: &str| annotations.and_then(|a| a.get(k)).map(String::as_str);
    get(LATEST_OBSERVED_API_VERSION_ANNOTATION) != Some(VERSION)
}

/// The cached start revisions of `vm` (by name prefix, in its namespace).
fn start_revisions(ctx: &Context, vm: &VirtualMachine) -> Vec<Arc<ControllerRevision>> {
    let uid = vm.metadata.uid.as_deref().unwrap_or_default();
    let prefix = format!("{}{uid}-", start::START_REVISION_PREFIX);
    ctx.revisions
        .store()
        .state()
        .into_iter()
        .filter(|r| {
            r.metadata.namespace == vm.metadata.namespace
                && r.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(&prefix))
        })
        .collect()
}

/// What to do with the cached VMI of the VM's name.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// Ours.
    Owned,
    /// An orphan to adopt.
    Adopt,
    /// Not ours (another controller, or adoption not allowed now).
    Ignore,
}

/// Decides whether `vm` keeps, adopts or ignores `vmi`.
pub fn claim(vm: &VirtualMachine, vmi: &VirtualMachineInstance) -> Claim {
    match controller_ref(vmi) {
        Some(owner) if Some(&owner.uid) == vm.metadata.uid.as_ref() => Claim::Owned,
        Some(_) => Claim::Ignore,
        None if vm.metadata.deletion_timestamp.is_some()
            || vmi.metadata.deletion_timestamp.is_some() =>
        {
            Claim::Ignore
        }
        None => Claim::Adopt,
    }
}

/// Upstream's `RecheckDeletionTimestamp` before an adoption: the freshly read VM must have the
/// cached VM's UID and no deletion timestamp; otherwise the reconcile fails (and is retried)
/// rather than going on as if there were no VMI.
pub fn adoption_recheck(cached: &VirtualMachine, fresh: &VirtualMachine) -> Result<(), VmError> {
    let namespace = cached.metadata.namespace.as_deref().unwrap_or_default();
    let name = cached.metadata.name.as_deref().unwrap_or_default();
    let uid = |vm: &VirtualMachine| vm.metadata.uid.clone().unwrap_or_default();
    if fresh.metadata.uid != cached.metadata.uid {
        return Err(VmError::AdoptRecheck(format!(
            "original VirtualMachine {namespace}/{name} is gone: got uid {}, wanted {}",
            uid(fresh),
            uid(cached)
        )));
    }
    if let Some(deleted) = &fresh.metadata.deletion_timestamp {
        return Err(VmError::AdoptRecheck(format!(
            "{namespace}/{name} has just been deleted at {}",
            deleted.0
        )));
    }
    Ok(())
}

/// The VMI this VM controls, adopting an orphan of the same name after an uncached check
/// that the VM still exists unchanged and is not being deleted.
async fn claim_vmi(
    ctx: &Context,
    vm: &VirtualMachine,
    key: &str,
) -> Result<Option<Arc<VirtualMachineInstance>>, VmError> {
    let Some(vmi) = ctx.vmis.get_by_key(key) else {
        return Ok(None);
    };
    match claim(vm, &vmi) {
        Claim::Owned => Ok(Some(vmi)),
        Claim::Ignore => Ok(None),
        Claim::Adopt => {
            let (namespace, name) = split_key(key);
            let namespace = namespace.unwrap_or_default();
            let vms: Api<VirtualMachine> = Api::namespaced(ctx.client.clone(), namespace);
            let fresh = vms.get(name).await.map_err(VmError::Adopt)?;
            adoption_recheck(vm, &fresh)?;
            let patch = json!({"metadata": {
                "ownerReferences": [start::owner_reference(vm)],
                "uid": vmi.metadata.uid,
            }});
            let vmis: Api<VirtualMachineInstance> = Api::namespaced(ctx.client.clone(), namespace);
            let adopted = vmis
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(VmError::Adopt)?;
            tracing::info!(vmi = %name, "adopted orphan virtual machine instance");
            Ok(Some(Arc::new(adopted)))
        }
    }
}

/// The JSON Patch removing the VM controller finalizer from a final VMI, or from a
/// `WaitingForSync` VMI being deleted (as upstream), if it has it.
pub fn vmi_finalizer_ops(vmi: &VirtualMachineInstance) -> Option<Vec<serde_json::Value>> {
    use kubevirt_api::v1::VirtualMachineInstancePhase as Phase;
    let phase = vmi.status.as_ref().and_then(|s| s.phase.as_ref());
    let finalizers = vmi.metadata.finalizers.as_ref()?;
    let sync_vmi_deleted =
        phase == Some(&Phase::WaitingForSync) && vmi.metadata.deletion_timestamp.is_some();
    let done = phase.is_some_and(Phase::is_final) || sync_vmi_deleted;
    if !done || !finalizers.iter().any(|f| f == VM_CONTROLLER_FINALIZER) {
        return None;
    }
    // By position, so that the other finalizers (the VMI controller's own) may change
    // meanwhile without this patch failing: upstream tests and replaces the whole list.
    let index = finalizers
        .iter()
        .position(|f| f == VM_CONTROLLER_FINALIZER)?;
    let path = format!("/metadata/finalizers/{index}");
    Some(vec![
        json!({"op": "test", "path": path, "value": VM_CONTROLLER_FINALIZER}),
        json!({"op": "remove", "path": path}),
    ])
}

async fn remove_vmi_finalizer(
    ctx: &Context,
    namespace: &str,
    vmi: &VirtualMachineInstance,
) -> Result<(), VmError> {
    let Some(ops) = vmi_finalizer_ops(vmi) else {
        return Ok(());
    };
    let name = vmi.metadata.name.as_deref().unwrap_or_default();
    let patch = json_patch(ops)
        .map_err(|e| VmError::Sync(SyncFailure::new("FailedVMIFinalizer", e.to_string())))?;
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(ctx.client.clone(), namespace);
    match vmis.patch(name, &PatchParams::default(), &patch).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        // The list moved under us (the cache is behind): the newer VMI's arrival reconciles
        // the VM again.
        Err(kube::Error::Api(s)) if crate::runtime::lost_race(&s) => {
            tracing::debug!(
                vmi = name,
                "VMI finalizer patch lost a race; waiting for the newer VMI"
            );
            Ok(())
        }
        Err(e) => Err(VmError::VmiFinalizer(e)),
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod reconcile_tests;
