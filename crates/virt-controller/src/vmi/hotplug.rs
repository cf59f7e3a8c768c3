//! Hotplug attachment pods and the hotplug part of `status.volumeStatus` (upstream
//! `volume-hotplug.go` and `updateVolumeStatus`, reference §3.5).
//!
//! A hotplug volume is a hotpluggable `persistentVolumeClaim`/`dataVolume` volume of the VMI
//! that the launcher pod does not mount. Its claim reaches the node through an **attachment
//! pod** (`hp-volume-…`, label `kubevirt.io=hotplug-disk`, controlled by the launcher pod,
//! required to the launcher's node): it mounts every ready hotplug claim at
//! `/path/<volume>` and runs `kubevirt-rs hotplug-disk`, which listens on `/path/hp.sock` so
//! that virt-handler can find the pod's mounts (see the handler's `hotplug` module).
//!
//! Data flow per reconcile, with a Ready launcher pod that is not being deleted:
//! [`plan`] → at most one current attachment pod whose claims are exactly the ready volumes
//! (created when there is none and no older one is still starting) and the old pods to
//! delete: those whose removed volumes virt-handler no longer uses (`Ready`/`MountedToPod`),
//! except the newest running one while the current pod is not running yet. The status pass
//! then walks each hotplug volume through `Pending`/`Bound` (from the claim) →
//! `AttachedToNode` (an attachment pod has it; `attachPodUID` once its container is ready) →
//! virt-handler's `MountedToPod` → `Ready`, and a removed one through `Detaching` until no
//! attachment pod has it ([`update_volume_status`]).
//!
//! Deviations from upstream: a claim waiting for its first consumer counts as ready, so the
//! attachment pod itself binds it (upstream first runs a separate trigger pod); the
//! attachment-pod creation is not rate limited (upstream's threshold works out negative, so
//! it never limits either).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Affinity, Container, EmptyDirVolumeSource, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, PodSpec,
    ResourceRequirements, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kubevirt_api::constants as c;
use kubevirt_api::v1::{HotplugVolumeStatus, VirtualMachineInstance, VolumePhase, VolumeStatus};

/// The attachment pod's only container.
pub const ATTACHMENT_CONTAINER: &str = "hotplug-disk";
use c::{
    HOTPLUG_ATTACHMENT_DIR as ATTACHMENT_DIR, HOTPLUG_ATTACHMENT_SOCKET as ATTACHMENT_SOCKET,
    HOTPLUG_ATTACHMENT_VOLUME as ATTACHMENT_VOLUME,
};
/// Event and volume reason of a created attachment pod (upstream's).
pub const SUCCESSFUL_CREATE_POD: &str = "SuccessfulCreate";
/// Event and sync-error reason of a failed attachment pod creation (upstream's).
pub const FAILED_CREATE_POD: &str = "FailedCreate";
/// Event and volume reason of a deleted attachment pod (upstream's).
pub const SUCCESSFUL_DELETE_POD: &str = "SuccessfulDelete";
/// Event and sync-error reason of a failed attachment pod deletion (upstream's).
pub const FAILED_DELETE_POD: &str = "FailedDelete";
/// Sync-error reason of a final VMI whose attachment pods could not be deleted (upstream's).
pub const FAILED_HOTPLUG_SYNC: &str = "FailedHotplugSync";
/// Reason of a volume whose claim is not there (upstream's).
const FAILED_PVC_NOT_FOUND: &str = "FailedPvcNotFound";
/// Reason of a volume whose claim is not bound yet (upstream's).
const PVC_NOT_READY: &str = "PVCNotReady";

/// The VMI's hotplug volumes: hotpluggable claim-backed volumes the launcher pod does not
/// mount, in spec order.
pub fn hotplug_volumes<'a>(
    vmi: &'a VirtualMachineInstance,
    launcher: &Pod,
) -> Vec<&'a kubevirt_api::v1::Volume> {
    let mounted: BTreeSet<&str> = launcher
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .map(|v| v.name.as_str())
        .collect();
    vmi.spec
        .volumes
        .iter()
        .filter(|v| v.volume_source.is_hotpluggable() && v.volume_source.claim_name().is_some())
        .filter(|v| !mounted.contains(v.name.as_str()))
        .collect()
}

/// The pods controlled by `launcher` (its attachment pods).
pub fn attachment_pods<'a>(pods: &[&'a Pod], launcher: &Pod) -> Vec<&'a Pod> {
    let Some(uid) = launcher.metadata.uid.as_deref() else {
        return Vec::new();
    };
    pods.iter()
        .copied()
        .filter(|p| {
            p.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.controller == Some(true) && o.kind == "Pod" && o.uid == uid)
        })
        .collect()
}

/// The claim-backed volume names of an attachment pod.
fn pod_claim_volumes(pod: &Pod) -> BTreeSet<&str> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter(|v| v.persistent_volume_claim.is_some())
        .map(|v| v.name.as_str())
        .collect()
}

fn created(pod: &Pod) -> Option<k8s_openapi::jiff::Timestamp> {
    pod.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

fn running(pod: &Pod) -> bool {
    phase(pod) == "Running"
}

/// Upstream's `getActiveAndOldAttachmentPods`: the newest pod whose claims are exactly
/// `volumes` is current; every other pod is old, newest first.
pub fn current_and_old<'a>(
    volumes: &[&kubevirt_api::v1::Volume],
    pods: &[&'a Pod],
) -> (Option<&'a Pod>, Vec<&'a Pod>) {
    let wanted: BTreeSet<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
    let mut sorted = pods.to_vec();
    sorted.sort_by_key(|p| created(p));
    let mut current = None;
    let mut old = Vec::new();
    for pod in sorted {
        if pod_claim_volumes(pod) == wanted {
            if let Some(previous) = current.replace(pod) {
                old.push(previous);
            }
        } else {
            old.push(pod);
        }
    }
    old.sort_by_key(|p| std::cmp::Reverse(created(p)));
    (current, old)
}

/// What the attachment pods need now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HotplugPlan {
    /// The volumes a new current attachment pod mounts, when one is needed.
    pub create: Vec<String>,
    /// Old attachment pods to delete (grace 0).
    pub delete: Vec<String>,
}

/// Whether virt-handler may still use a removed volume (its status phase is `Ready` or
/// `MountedToPod`), which keeps the attachment pod that has it.
fn still_in_use(phase: Option<&VolumePhase>) -> bool {
    matches!(phase, Some(VolumePhase::Ready | VolumePhase::MountedToPod))
}

/// The attachment pods to create and delete, given the hotplug volumes whose claims are
/// ready (`ready`) and the launcher pod's attachment pods.
pub fn plan(
    vmi: &VirtualMachineInstance,
    ready: &[&kubevirt_api::v1::Volume],
    pods: &[&Pod],
) -> HotplugPlan {
    let (current, old) = current_and_old(ready, pods);
    let mut plan = HotplugPlan::default();
    let starting = old
        .iter()
        .any(|p| !matches!(phase(p), "Running" | "Succeeded" | "Failed"));
    if current.is_none() && !starting && !ready.is_empty() {
        plan.create = ready.iter().map(|v| v.name.clone()).collect();
    }
    // Removed hotplug volumes (in the status, no longer in the spec) still in use.
    let in_spec: BTreeSet<&str> = vmi.spec.volumes.iter().map(|v| v.name.as_str()).collect();
    let removed_in_use: BTreeSet<&str> = vmi
        .status
        .iter()
        .flat_map(|s| s.volume_status.iter())
        .filter(|s| s.hotplug_volume.is_some() && !in_spec.contains(s.name.as_str()))
        .filter(|s| still_in_use(s.phase.as_ref()))
        .map(|s| s.name.as_str())
        .collect();
    // The current pod is the one about to be created when none exists yet.
    let current_not_running = current.is_none_or(|p| !running(p));
    let mut kept_fallback = false;
    for pod in old {
        if !kept_fallback
            && running(pod)
            && pod.metadata.deletion_timestamp.is_none()
            && !ready.is_empty()
            && current_not_running
        {
            kept_fallback = true;
            continue;
        }
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if pod_claim_volumes(pod)
            .iter()
            .any(|v| removed_in_use.contains(v))
        {
            continue;
        }
        plan.delete
            .push(pod.metadata.name.clone().unwrap_or_default());
    }
    plan
}

/// The attachment pod mounting `volumes` (names of the VMI's hotplug volumes) for
/// `launcher`, with `image` running `kubevirt-rs hotplug-disk`.
pub fn render_attachment_pod(
    vmi: &VirtualMachineInstance,
    launcher: &Pod,
    volumes: &[String],
    image: &str,
) -> Pod {
    let node = launcher
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let mut pod_volumes = vec![Volume {
        name: ATTACHMENT_VOLUME.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    }];
    let mut mounts = vec![VolumeMount {
        name: ATTACHMENT_VOLUME.to_owned(),
        mount_path: ATTACHMENT_DIR.to_owned(),
        ..VolumeMount::default()
    }];
    for volume in vmi
        .spec
        .volumes
        .iter()
        .filter(|v| volumes.contains(&v.name))
    {
        let source = &volume.volume_source;
        let Some(claim) = source.claim_name() else {
            continue;
        };
        let read_only = source
            .persistent_volume_claim
            .as_ref()
            .and_then(|p| p.read_only)
            .filter(|r| *r);
        pod_volumes.push(Volume {
            name: volume.name.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.to_owned(),
                read_only,
            }),
            ..Volume::default()
        });
        mounts.push(VolumeMount {
            name: volume.name.clone(),
            mount_path: format!("{ATTACHMENT_DIR}/{}", volume.name),
            read_only,
            ..VolumeMount::default()
        });
    }
    let namespace = vmi.metadata.namespace.clone();
    Pod {
        metadata: ObjectMeta {
            generate_name: Some("hp-volume-".to_owned()),
            namespace,
            labels: Some(BTreeMap::from([(
                c::APP_LABEL.to_owned(),
                c::HOTPLUG_DISK_VALUE.to_owned(),
            )])),
            annotations: Some(BTreeMap::from([
                (
                    c::OWNER_VMI_NAME_ANNOTATION.to_owned(),
                    vmi.metadata.name.clone().unwrap_or_default(),
                ),
                (
                    c::OWNER_VMI_UID_ANNOTATION.to_owned(),
                    vmi.metadata.uid.clone().unwrap_or_default(),
                ),
            ])),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".to_owned(),
                kind: "Pod".to_owned(),
                name: launcher.metadata.name.clone().unwrap_or_default(),
                uid: launcher.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![attachment_container(mounts, image)],
            affinity: Some(required_node(node)),
            tolerations: Some(vec![Toleration {
                operator: Some("Exists".to_owned()),
                ..Toleration::default()
            }]),
            volumes: Some(pod_volumes),
            termination_grace_period_seconds: Some(0),
            restart_policy: Some("Never".to_owned()),
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// The attachment pod's container: `kubevirt-rs hotplug-disk` with upstream's resources.
fn attachment_container(mounts: Vec<VolumeMount>, image: &str) -> Container {
    let quantity = |s: &str| Quantity(s.to_owned());
    Container {
        name: ATTACHMENT_CONTAINER.to_owned(),
        image: Some(image.to_owned()),
        command: Some(vec!["kubevirt-rs".to_owned(), "hotplug-disk".to_owned()]),
        args: Some(vec![
            "--socket".to_owned(),
            format!("{ATTACHMENT_DIR}/{ATTACHMENT_SOCKET}"),
        ]),
        resources: Some(ResourceRequirements {
            limits: Some(BTreeMap::from([
                ("cpu".to_owned(), quantity("100m")),
                ("memory".to_owned(), quantity("80M")),
            ])),
            requests: Some(BTreeMap::from([
                ("cpu".to_owned(), quantity("10m")),
                ("memory".to_owned(), quantity("2M")),
            ])),
            ..ResourceRequirements::default()
        }),
        volume_mounts: Some(mounts),
        ..Container::default()
    }
}

/// A required node affinity to the node named `node` (the launcher pod's).
fn required_node(node: String) -> Affinity {
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: "kubernetes.io/hostname".to_owned(),
                        operator: "In".to_owned(),
                        values: Some(vec![node]),
                    }]),
                    ..NodeSelectorTerm::default()
                }],
            }),
            ..NodeAffinity::default()
        }),
        ..Affinity::default()
    }
}

/// Whether a claim can be attached: it exists, is not being deleted, and is bound or waiting
/// (for its first consumer: the attachment pod binds it).
pub fn claim_ready(claim: Option<&PersistentVolumeClaim>) -> bool {
    claim.is_some_and(|c| {
        c.metadata.deletion_timestamp.is_none()
            && matches!(
                c.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Bound" | "Pending") | None
            )
    })
}

/// Phase, reason and message of a hotplug volume without an attachment pod, from its claim
/// (upstream `getVolumePhaseMessageReason`).
fn claim_phase(
    claim_name: &str,
    claim: Option<&PersistentVolumeClaim>,
) -> (VolumePhase, &'static str, String) {
    let Some(claim) = claim else {
        return (
            VolumePhase::Pending,
            FAILED_PVC_NOT_FOUND,
            format!("PVC {claim_name} not found"),
        );
    };
    match claim.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Bound") => (
            VolumePhase::Bound,
            PVC_NOT_READY,
            "PVC is in phase Bound".to_owned(),
        ),
        Some("Lost") => (
            VolumePhase::Pending,
            PVC_NOT_READY,
            "PVC is in phase Lost".to_owned(),
        ),
        _ => (
            VolumePhase::Pending,
            PVC_NOT_READY,
            "PVC is in phase ClaimPending".to_owned(),
        ),
    }
}

fn single_container_ready(pod: &Pod) -> bool {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref());
    matches!(statuses.map(Vec::as_slice), Some([only]) if only.ready)
}

/// The hotplug part of the volume status (upstream `updateVolumeStatus`): every hotplug
/// volume gets its attachment pod and phase; a removed one stays `Detaching` while an
/// attachment pod has it, then goes; other entries are kept. Sorted by name, as upstream.
/// A hotplug volume also gets its claim's details from `claim_volumes` (virt-handler sizes a
/// new disk image from them). `claim` looks a claim up by name in the VMI's namespace.
/// Nothing changes for a VMI that has no hotplug volume, now or in its status.
pub fn update_volume_status<'c>(
    vmi: &VirtualMachineInstance,
    statuses: &mut Vec<VolumeStatus>,
    launcher: &Pod,
    pods: &[&Pod],
    claim_volumes: &[VolumeStatus],
    claim: impl Fn(&str) -> Option<&'c PersistentVolumeClaim>,
) {
    let hotplug = hotplug_volumes(vmi, launcher);
    if hotplug.is_empty() && statuses.iter().all(|s| s.hotplug_volume.is_none()) {
        return;
    }
    let (current, _) = current_and_old(&hotplug, pods);
    let mut old: BTreeMap<String, VolumeStatus> =
        statuses.drain(..).map(|s| (s.name.clone(), s)).collect();
    let mut next = Vec::new();
    for volume in &vmi.spec.volumes {
        let mut status = old.remove(&volume.name).unwrap_or_else(|| VolumeStatus {
            name: volume.name.clone(),
            ..VolumeStatus::default()
        });
        if hotplug.iter().any(|h| h.name == volume.name) {
            if let Some(info) = claim_volumes.iter().find(|c| c.name == volume.name) {
                status
                    .persistent_volume_claim_info
                    .clone_from(&info.persistent_volume_claim_info);
            }
            let hp = status
                .hotplug_volume
                .get_or_insert_with(HotplugVolumeStatus::default);
            match current {
                None if status.phase != Some(VolumePhase::Ready) => {
                    hp.attach_pod_uid = None;
                    let name = volume.volume_source.claim_name().unwrap_or_default();
                    let (phase, reason, message) = claim_phase(name, claim(name));
                    status.phase = Some(phase);
                    status.reason = Some(reason.to_owned());
                    status.message = Some(message);
                }
                None => {}
                Some(pod) => {
                    let pod_name = pod.metadata.name.clone().unwrap_or_default();
                    hp.attach_pod_name = Some(pod_name.clone());
                    hp.attach_pod_uid = single_container_ready(pod)
                        .then(|| pod.metadata.uid.clone())
                        .flatten();
                    if matches!(
                        status.phase,
                        None | Some(VolumePhase::Pending | VolumePhase::Bound)
                    ) {
                        status.phase = Some(VolumePhase::AttachedToNode);
                        status.reason = Some(SUCCESSFUL_CREATE_POD.to_owned());
                        status.message = Some(format!(
                            "Created hotplug attachment pod {pod_name}, for volume {}",
                            volume.name
                        ));
                    }
                }
            }
        }
        next.push(status);
    }
    for (name, mut status) in old {
        let holder = pods
            .iter()
            .find(|p| pod_claim_volumes(p).contains(name.as_str()));
        let Some(pod) = holder else { continue };
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let hp = status
            .hotplug_volume
            .get_or_insert_with(HotplugVolumeStatus::default);
        hp.attach_pod_name = Some(pod_name.clone());
        hp.attach_pod_uid.clone_from(&pod.metadata.uid);
        status.phase = Some(VolumePhase::Detaching);
        if pod.metadata.deletion_timestamp.is_some() {
            status.reason = Some(SUCCESSFUL_DELETE_POD.to_owned());
            status.message = Some(format!(
                "Deleted hotplug attachment pod {pod_name}, for volume {name}"
            ));
        }
        next.push(status);
    }
    next.sort_by(|a, b| a.name.cmp(&b.name));
    *statuses = next;
}

/// The events upstream records while it walks the hotplug volume status: `SuccessfulCreate`
/// when a volume reaches `AttachedToNode`, `SuccessfulDelete` when its attachment pod is being
/// deleted; here once per transition (`old` → `new`), not on every pass.
pub fn status_events(old: &[VolumeStatus], new: &[VolumeStatus]) -> Vec<(&'static str, String)> {
    let before = |name: &str| old.iter().find(|s| s.name == name);
    new.iter()
        .filter(|s| s.hotplug_volume.is_some())
        .filter_map(|s| {
            let reason = match s.reason.as_deref()? {
                SUCCESSFUL_CREATE_POD if s.phase == Some(VolumePhase::AttachedToNode) => {
                    SUCCESSFUL_CREATE_POD
                }
                SUCCESSFUL_DELETE_POD => SUCCESSFUL_DELETE_POD,
                _ => return None,
            };
            let seen = before(&s.name).is_some_and(|b| {
                b.phase == s.phase && b.reason == s.reason && b.message == s.message
            });
            (!seen).then(|| (reason, s.message.clone().unwrap_or_default()))
        })
        .collect()
}

#[cfg(test)]
#[path = "hotplug_tests.rs"]
mod tests;
