//! Sync: the pod-level actions of one VMI reconcile (upstream's `sync()` for launcher pods).
//!
//! Data flow: [`plan`] decides from the cached VMI and its pods what to do ([`SyncPlan`]);
//! [`execute`] does it through the API, raising expectations before each call and lowering
//! them again when a call fails (the watch event that would lower them never comes).
//!
//! Rules, in order:
//! 1. VMI being deleted → delete every pod it controls (pods already being deleted are skipped
//!    unless they are finished);
//! 2. VMI final → nothing;
//! 3. a claim of a (non-hotpluggable) `persistentVolumeClaim` or `dataVolume` volume is not in
//!    the claim cache → [`FAILED_PVC_NOT_FOUND`] ("PVC ns/claim does not exist, waiting for it
//!    to appear"), whether or not a pod exists; no pod is created, and the claim's appearance
//!    re-queues the VMI (upstream's informal error: no rate-limited retry);
//!    A claim that exists but whose DataVolume (the claim's controlling owner) is not yet
//!    `Succeeded` or `PendingPopulation` keeps the pod from being created; one waiting for its
//!    first consumer (`WaitForFirstConsumer`) does not: the launcher pod is that consumer
//!    (upstream starts a "doppelganger" pod first; see below). A claim no DataVolume controls
//!    is ready as it is;
//! 4. receiver VMI (`kubevirt.io/create-migration-target=true`) without
//!    `kubevirt.io/migrationTargetNodeName` → wait;
//! 5. no pod and phase `""`/`Pending` → create the launcher pod;
//! 6. otherwise nothing.
//!
//! Not implemented (yet): WFFC doppelganger pods (the launcher pod itself binds a claim
//! waiting for its first consumer), backend storage, hotplug attachment pods, the eviction-in-progress pod annotation.
//!
//! Events on the VMI, as upstream: `SuccessfulCreate` / `FailedCreate` for the launcher pod,
//! `SuccessfulDelete` / `FailedDelete` for each pod deleted.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use kubevirt_api::constants as c;
use kubevirt_api::v1::{VirtualMachineInstance, VirtualMachineInstancePhase as Phase};

use super::template::{LauncherPodConfig, render_launcher_pod};
use crate::runtime::events::{EventRecorder, EventType};
use crate::runtime::expectations::Expectations;
use crate::runtime::key_of;
use crate::sync_failure::SyncFailure;

/// Event and sync-error reasons of launcher pod writes (upstream's).
const SUCCESSFUL_CREATE: &str = "SuccessfulCreate";
const FAILED_CREATE: &str = "FailedCreate";
const SUCCESSFUL_DELETE: &str = "SuccessfulDelete";
const FAILED_DELETE: &str = "FailedDelete";
/// The reason of a VMI whose claim does not exist (event and `Synchronized=False`).
pub const FAILED_PVC_NOT_FOUND: &str = "FailedPvcNotFound";

/// The claims (`namespace/name`) the VMI's volumes need before its pod can be created: those
/// of `persistentVolumeClaim` and `dataVolume` volumes (a DataVolume's claim has its name) and
/// of `ephemeral` ones (the pod mounts the claim the overlay reads), except hotpluggable
/// ones, in volume order.
pub fn required_claims(vmi: &VirtualMachineInstance) -> Vec<String> {
    let ns = vmi.metadata.namespace.as_deref().unwrap_or_default();
    vmi.spec
        .volumes
        .iter()
        .map(|v| &v.volume_source)
        .filter(|s| !s.is_hotpluggable())
        .filter_map(kubevirt_api::v1::VolumeSource::pod_claim_name)
        .map(|claim| format!("{ns}/{claim}"))
        .collect()
}

/// Whether a volume's claim lets the launcher pod be created (upstream's
/// `VolumeReadyToAttachToNode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeReadiness {
    /// Populated (or a plain claim).
    Ready,
    /// Its DataVolume waits for the first consumer before being populated.
    WaitForFirstConsumer,
    /// Its DataVolume is still being populated.
    NotReady,
}

/// The readiness of `pvc`, given the DataVolume that controls it (`None` when no DataVolume
/// does, or when the controlling one is not cached).
pub fn claim_readiness(
    pvc: &k8s_openapi::api::core::v1::PersistentVolumeClaim,
    dv: Option<&kubevirt_api::cdi::DataVolume>,
) -> VolumeReadiness {
    use kubevirt_api::cdi::DataVolumePhase as P;
    if controlling_data_volume(pvc).is_none() {
        return VolumeReadiness::Ready;
    }
    match dv.map(kubevirt_api::cdi::DataVolume::phase) {
        Some(P::Succeeded | P::PendingPopulation) => VolumeReadiness::Ready,
        Some(P::WaitForFirstConsumer) => VolumeReadiness::WaitForFirstConsumer,
        _ => VolumeReadiness::NotReady,
    }
}

/// The name of the DataVolume controlling `pvc`, if one does.
pub fn controlling_data_volume(
    pvc: &k8s_openapi::api::core::v1::PersistentVolumeClaim,
) -> Option<&str> {
    pvc.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|r| r.controller == Some(true) && r.kind == "DataVolume")
        .map(|r| r.name.as_str())
}

/// Upstream's `DataVolumesReady` condition over the VMI's DataVolumes as (status, reason,
/// message), `None` when it has none: True only when every DataVolume's `Ready` is True,
/// False when one is False, Unknown otherwise.
pub fn data_volumes_ready(
    dvs: &[kubevirt_api::cdi::DataVolume],
) -> Option<(&'static str, &'static str, &'static str)> {
    if dvs.is_empty() {
        return None;
    }
    let mut status = "True";
    for dv in dvs {
        match dv.condition("Ready").map(|c| c.status.as_str()) {
            Some("True") => {}
            Some("False") => status = "False",
            _ if status == "True" => status = "Unknown",
            _ => {}
        }
    }
    Some(if status == "True" {
        (
            "True",
            "AllDVsReady",
            "All of the VMI's DVs are bound and ready",
        )
    } else {
        (
            status,
            "NotAllDVsReady",
            "Not all of the VMI's DVs are ready",
        )
    })
}

/// What sync should do for a VMI.
#[derive(Debug, PartialEq)]
pub enum SyncPlan {
    /// Delete these pods (`namespace/name` keys).
    DeletePods(Vec<String>),
    /// Create the launcher pod.
    CreatePod,
    /// Wait for this claim (`namespace/name`) to appear.
    ClaimMissing(String),
    /// Nothing to do.
    Nothing,
}

fn phase(vmi: &VirtualMachineInstance) -> Phase {
    vmi.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

fn pod_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Decides what sync does; `pods` are the pods the VMI controls, `current` its launcher pod,
/// `claim_state` tells whether a claim (`namespace/name`) is in the cache (`None` if not) and
/// how ready it is.
pub fn plan(
    vmi: &VirtualMachineInstance,
    pods: &[&Pod],
    current: Option<&Pod>,
    claim_state: impl Fn(&str) -> Option<VolumeReadiness>,
) -> SyncPlan {
    if vmi.metadata.deletion_timestamp.is_some() {
        let doomed: Vec<String> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() || pod_finished(p))
            .map(|p| key_of(*p))
            .collect();
        return if doomed.is_empty() {
            SyncPlan::Nothing
        } else {
            SyncPlan::DeletePods(doomed)
        };
    }
    let phase = phase(vmi);
    if phase.is_final() {
        return SyncPlan::Nothing;
    }
    let mut volumes_ready = true;
    for claim in required_claims(vmi) {
        match claim_state(&claim) {
            None => return SyncPlan::ClaimMissing(claim),
            Some(VolumeReadiness::NotReady) => volumes_ready = false,
            Some(_) => {}
        }
    }
    let annotations = vmi.metadata.annotations.as_ref();
    let receiver = annotations
        .and_then(|a| a.get(c::CREATE_MIGRATION_TARGET_ANNOTATION))
        .is_some_and(|v| v == "true");
    let target_known = vmi
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(c::MIGRATION_TARGET_NODE_NAME_LABEL));
    if receiver && !target_known {
        return SyncPlan::Nothing;
    }
    // A guest that needs a TSC frequency waits for its hints (written by the status pass).
    if current.is_none()
        && phase.is_unprocessed()
        && volumes_ready
        && !crate::topology::awaits_hints(vmi)
    {
        return SyncPlan::CreatePod;
    }
    SyncPlan::Nothing
}

/// Carries out `plan` for the VMI with queue key `key`; returns a pod it created.
pub async fn execute(
    pods_api: &Api<Pod>,
    expectations: &Arc<Expectations>,
    key: &str,
    vmi: &VirtualMachineInstance,
    plan: SyncPlan,
    config: &LauncherPodConfig,
    recorder: &EventRecorder,
) -> Result<Option<Pod>, SyncFailure> {
    match plan {
        SyncPlan::Nothing => Ok(None),
        SyncPlan::ClaimMissing(claim) => {
            let message = format!("PVC {claim} does not exist, waiting for it to appear");
            recorder
                .record(vmi, EventType::Normal, FAILED_PVC_NOT_FOUND, &message)
                .await;
            Err(SyncFailure::new(FAILED_PVC_NOT_FOUND, message))
        }
        SyncPlan::CreatePod => {
            let pod = render_launcher_pod(vmi, config).map_err(|e| {
                SyncFailure::new(e.reason(), format!("failed to render launch manifest: {e}"))
            })?;
            expectations.expect_creations(key, 1);
            match pods_api.create(&PostParams::default(), &pod).await {
                Ok(created) => {
                    let name = created.metadata.name.as_deref().unwrap_or_default();
                    tracing::info!(pod = %name, "created virtual machine pod");
                    let message = format!("Created virtual machine pod {name}");
                    recorder
                        .record(vmi, EventType::Normal, SUCCESSFUL_CREATE, &message)
                        .await;
                    Ok(Some(created))
                }
                Err(err) => {
                    expectations.creation_observed(key);
                    let failure = create_failure(vmi, &err);
                    let message = if failure.message.contains("violates PodSecurity") {
                        format!("failed to render launch manifest: {}", failure.message)
                    } else {
                        format!("Error creating pod: {err}")
                    };
                    recorder
                        .record(vmi, EventType::Warning, FAILED_CREATE, &message)
                        .await;
                    Err(failure)
                }
            }
        }
        SyncPlan::DeletePods(keys) => {
            expectations.expect_deletions(key, &keys);
            let mut failure = None;
            for pod_key in &keys {
                let name = pod_key.rsplit('/').next().unwrap_or(pod_key);
                match pods_api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => {
                        tracing::info!(pod = %name, "deleted virtual machine pod");
                        let message = format!("Deleted virtual machine pod {name}");
                        recorder
                            .record(vmi, EventType::Normal, SUCCESSFUL_DELETE, &message)
                            .await;
                    }
                    Err(kube::Error::Api(status)) if status.code == 404 => {
                        expectations.deletion_observed(key, pod_key);
                    }
                    Err(err) => {
                        expectations.deletion_observed(key, pod_key);
                        let message = format!("Failed to delete virtual machine pod {name}");
                        recorder
                            .record(vmi, EventType::Warning, FAILED_DELETE, &message)
                            .await;
                        failure = Some(SyncFailure::new(
                            FAILED_DELETE,
                            format!("failed to delete pod: {err}"),
                        ));
                    }
                }
            }
            failure.map_or(Ok(None), Err)
        }
    }
}

fn create_failure(vmi: &VirtualMachineInstance, err: &kube::Error) -> SyncFailure {
    let text = err.to_string();
    if matches!(err, kube::Error::Api(s) if s.code == 403) && text.contains("violates PodSecurity")
    {
        let ns = vmi.metadata.namespace.as_deref().unwrap_or_default();
        let name = vmi.metadata.name.as_deref().unwrap_or_default();
        return SyncFailure::new(
            FAILED_CREATE,
            format!(
                "failed to create pod for vmi {ns}/{name}, it needs a privileged namespace to run: {text}"
            ),
        );
    }
    SyncFailure::new(
        FAILED_CREATE,
        format!("failed to create virtual machine pod: {text}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const READY: Option<VolumeReadiness> = Some(VolumeReadiness::Ready);

    #[test]
    fn a_claim_of_a_data_volume_is_ready_once_succeeded_and_waits_otherwise() {
        let pvc: k8s_openapi::api::core::v1::PersistentVolumeClaim =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "root", "namespace": "ns", "ownerReferences": [
                    {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
                     "name": "root", "uid": "u", "controller": true}]}
            }))
            .unwrap();
        let dv = |phase: &str| -> kubevirt_api::cdi::DataVolume {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "root"}, "spec": {}, "status": {"phase": phase}
            }))
            .unwrap()
        };
        let r = |phase: &str| claim_readiness(&pvc, Some(&dv(phase)));
        assert_eq!(r("Succeeded"), VolumeReadiness::Ready);
        assert_eq!(r("PendingPopulation"), VolumeReadiness::Ready);
        assert_eq!(
            r("WaitForFirstConsumer"),
            VolumeReadiness::WaitForFirstConsumer
        );
        assert_eq!(r("ImportInProgress"), VolumeReadiness::NotReady);
        assert_eq!(claim_readiness(&pvc, None), VolumeReadiness::NotReady);
        let plain = k8s_openapi::api::core::v1::PersistentVolumeClaim::default();
        assert_eq!(claim_readiness(&plain, None), VolumeReadiness::Ready);

        let mut v = vmi(Phase::Pending, false);
        v.spec.volumes = serde_json::from_value(serde_json::json!([
            {"name": "root", "dataVolume": {"name": "root"}}
        ]))
        .unwrap();
        let not_ready = plan(&v, &[], None, |_| Some(VolumeReadiness::NotReady));
        assert_eq!(not_ready, SyncPlan::Nothing);
        let wffc = plan(&v, &[], None, |_| {
            Some(VolumeReadiness::WaitForFirstConsumer)
        });
        assert_eq!(wffc, SyncPlan::CreatePod);
    }

    #[test]
    fn data_volumes_ready_aggregates_the_ready_conditions() {
        let dv = |ready: Option<&str>| -> kubevirt_api::cdi::DataVolume {
            let conditions: Vec<serde_json::Value> = ready
                .map(|s| serde_json::json!({"type": "Ready", "status": s}))
                .into_iter()
                .collect();
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "root"}, "spec": {}, "status": {"conditions": conditions}
            }))
            .unwrap()
        };
        assert_eq!(data_volumes_ready(&[]), None);
        let all = data_volumes_ready(&[dv(Some("True")), dv(Some("True"))]).unwrap();
        assert_eq!(
            (all.0, all.1, all.2),
            (
                "True",
                "AllDVsReady",
                "All of the VMI's DVs are bound and ready"
            )
        );
        let unknown = data_volumes_ready(&[dv(Some("True")), dv(None)]).unwrap();
        assert_eq!((unknown.0, unknown.1), ("Unknown", "NotAllDVsReady"));
        let not = data_volumes_ready(&[dv(None), dv(Some("False"))]).unwrap();
        assert_eq!(
            (not.0, not.1, not.2),
            (
                "False",
                "NotAllDVsReady",
                "Not all of the VMI's DVs are ready"
            )
        );
    }

    fn vmi(phase: Phase, deleting: bool) -> VirtualMachineInstance {
        let mut vmi = VirtualMachineInstance::new("vmi", Default::default());
        vmi.metadata.namespace = Some("ns".into());
        vmi.status = Some(Default::default());
        if let Some(s) = vmi.status.as_mut() {
            s.phase = Some(phase);
        }
        if deleting {
            vmi.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        }
        vmi
    }

    fn pod(name: &str, deleting: bool, phase: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.namespace = Some("ns".into());
        if deleting {
            pod.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        }
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        pod
    }

    /// (case, vmi, pods, current pod, expected plan)
    type Case<'a> = (
        &'a str,
        VirtualMachineInstance,
        Vec<&'a Pod>,
        Option<&'a Pod>,
        SyncPlan,
    );

    #[test]
    fn sync_plans_follow_upstream_rules() {
        let running = pod("p1", false, "Running");
        let terminating = pod("p2", true, "Running");
        let finished_terminating = pod("p3", true, "Failed");
        // (case, vmi, pods, current, expected)
        let cases: Vec<Case<'_>> = vec![
            (
                "a pending VMI without a pod gets one",
                vmi(Phase::Pending, false),
                vec![],
                None,
                SyncPlan::CreatePod,
            ),
            (
                "a new VMI without a phase gets one",
                vmi(Phase::Unset, false),
                vec![],
                None,
                SyncPlan::CreatePod,
            ),
            (
                "an existing pod is left alone",
                vmi(Phase::Pending, false),
                vec![&running],
                Some(&running),
                SyncPlan::Nothing,
            ),
            (
                "a scheduling VMI whose pod vanished gets no new pod",
                vmi(Phase::Scheduling, false),
                vec![],
                None,
                SyncPlan::Nothing,
            ),
            (
                "a failed VMI gets no pod",
                vmi(Phase::Failed, false),
                vec![],
                None,
                SyncPlan::Nothing,
            ),
            (
                "a deleted VMI deletes its pods but not those already terminating",
                vmi(Phase::Running, true),
                vec![&running, &terminating, &finished_terminating],
                Some(&running),
                SyncPlan::DeletePods(vec!["ns/p1".into(), "ns/p3".into()]),
            ),
            (
                "a deleted VMI without pods does nothing",
                vmi(Phase::Pending, true),
                vec![],
                None,
                SyncPlan::Nothing,
            ),
        ];
        for (case, vmi, pods, current, expected) in cases {
            assert_eq!(plan(&vmi, &pods, current, |_| READY), expected, "{case}");
        }
    }

    #[test]
    fn a_missing_claim_is_waited_for_and_hotpluggable_ones_are_not_required() {
        let mut v = vmi(Phase::Pending, false);
        v.spec.volumes = serde_json::from_value(serde_json::json!([
            {"name": "root", "containerDisk": {"image": "x"}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "data-claim"}},
            {"name": "dv", "dataVolume": {"name": "imported"}},
            {"name": "hot", "persistentVolumeClaim": {"claimName": "later", "hotpluggable": true}}
        ]))
        .unwrap();
        assert_eq!(
            required_claims(&v),
            vec!["ns/data-claim".to_owned(), "ns/imported".to_owned()]
        );
        assert_eq!(
            plan(&v, &[], None, |c| (c != "ns/imported")
                .then_some(VolumeReadiness::Ready)),
            SyncPlan::ClaimMissing("ns/imported".into())
        );
        assert_eq!(plan(&v, &[], None, |_| READY), SyncPlan::CreatePod);
        // Evaluated whether or not a pod exists; a final VMI waits for nothing.
        let running = pod("p1", false, "Running");
        assert_eq!(
            plan(&v, &[&running], Some(&running), |_| None),
            SyncPlan::ClaimMissing("ns/data-claim".into())
        );
        let mut done = v.clone();
        done.status.get_or_insert_default().phase = Some(Phase::Failed);
        assert_eq!(plan(&done, &[], None, |_| None), SyncPlan::Nothing);
    }

    #[test]
    fn a_receiver_without_a_target_node_waits() {
        let mut receiver = vmi(Phase::Pending, false);
        receiver.metadata.annotations = Some(
            [(
                c::CREATE_MIGRATION_TARGET_ANNOTATION.to_owned(),
                "true".to_owned(),
            )]
            .into(),
        );
        assert_eq!(plan(&receiver, &[], None, |_| READY), SyncPlan::Nothing);
        receiver.metadata.labels = Some(
            [(
                c::MIGRATION_TARGET_NODE_NAME_LABEL.to_owned(),
                "node1".to_owned(),
            )]
            .into(),
        );
        assert_eq!(plan(&receiver, &[], None, |_| READY), SyncPlan::CreatePod);
    }
}
