//! The thin executor: performs the [`VmAction`]s of a [`super::sync::SyncPlan`] in order
//! through the API, raising and lowering expectations around creates and deletes, and maps a
//! failure to upstream's sync error reason and message. VMI creates and deletes are recorded
//! as events on the VM, with upstream's reasons and messages, and so are DataVolume creates.

use k8s_openapi::api::apps::v1::ControllerRevision;
use kube::api::{ApiResource, DeleteParams, DynamicObject, PatchParams, PostParams};
use kube::{Api, Client};
use kubevirt_api::cdi::DataVolume;
use kubevirt_api::v1::{VirtualMachine, VirtualMachineInstance};
use serde_json::Value;

use super::data_volumes::{
    FAILED_DATA_VOLUME_CREATE, FAILED_DATA_VOLUME_IMPORT, SUCCESSFUL_DATA_VOLUME_CREATE,
};
use super::sync::{
    ANNOTATIONS_LABELS_CHANGE_ERROR, FAILED_CREATE, FAILED_DELETE, FAILED_UPDATE,
    FIRMWARE_UUID_ERROR, HOTPLUG_VOLUME_ERROR, SUCCESSFUL_CREATE, SUCCESSFUL_DELETE, VmAction,
};
use super::{SyncFailure, VmError};
use crate::runtime::events::{EventRecorder, EventType};
use crate::runtime::expectations::Expectations;
use crate::runtime::json_patch;

/// A patch of the VM or its VMI failed; the message goes into the `Failure` condition as is.
#[derive(Debug, thiserror::Error)]
enum PatchError {
    /// The operations did not form a JSON Patch.
    #[error(transparent)]
    Encode(#[from] serde_json::Error),
    /// The API server refused or failed the patch.
    #[error(transparent)]
    Api(#[from] kube::Error),
}

/// Why the executor stopped.
#[derive(Debug)]
pub(super) enum Halt {
    /// A sync error; it becomes the VM's `Failure` condition.
    Sync(SyncFailure),
    /// An error upstream returns before writing the status (a failed finalizer patch).
    Error(VmError),
}

/// What the executor needs to act for one VM.
pub(super) struct Executor<'a> {
    pub client: &'a Client,
    pub expectations: &'a Expectations,
    /// The VM key (`namespace/name`).
    pub key: &'a str,
    pub namespace: &'a str,
    pub vm_name: &'a str,
    /// The VM, which events are about.
    pub vm: &'a VirtualMachine,
    pub recorder: &'a EventRecorder,
    /// Creations of DataVolumes from the VM's templates (upstream's
    /// `dataVolumeExpectations`).
    pub dv_expectations: &'a Expectations,
}

impl Executor<'_> {
    /// Performs `actions` in order; stops at, and reports, the first failure.
    pub async fn run(&self, actions: Vec<VmAction>) -> Result<(), Halt> {
        for action in actions {
            if let VmAction::PatchVmFinalizers(ops) = action {
                self.patch_finalizers(ops).await.map_err(Halt::Error)?;
            } else {
                self.perform(action).await.map_err(Halt::Sync)?;
            }
        }
        Ok(())
    }

    async fn patch_finalizers(&self, ops: Vec<Value>) -> Result<(), VmError> {
        let api: Api<VirtualMachine> = Api::namespaced(self.client.clone(), self.namespace);
        let patch =
            json_patch(ops).map_err(|e| VmError::FinalizerPatch(kube::Error::SerdeError(e)))?;
        api.patch(self.vm_name, &PatchParams::default(), &patch)
            .await
            .map(|_| ())
            .map_err(VmError::FinalizerPatch)
    }

    async fn patch_vm(&self, ops: Vec<Value>, status: bool) -> Result<(), PatchError> {
        let api: Api<VirtualMachine> = Api::namespaced(self.client.clone(), self.namespace);
        let patch = json_patch(ops)?;
        let params = PatchParams::default();
        let result = if status {
            api.patch_status(self.vm_name, &params, &patch).await
        } else {
            api.patch(self.vm_name, &params, &patch).await
        };
        result.map(|_| ())?;
        Ok(())
    }

    /// JSON-patches the VM's VMI (of the same name).
    async fn patch_vmi(&self, ops: Vec<Value>) -> Result<(), PatchError> {
        let api: Api<VirtualMachineInstance> = Api::namespaced(self.client.clone(), self.namespace);
        api.patch(self.vm_name, &PatchParams::default(), &json_patch(ops)?)
            .await
            .map(drop)
            .map_err(PatchError::from)
    }

    /// The hotplug writes: volumes ([`super::volume_requests`]) and NICs ([`super::network`]),
    /// of the VM template or the VMI. A write that lost a race is no failure.
    async fn patch_hotplug(&self, action: VmAction) -> Result<(), SyncFailure> {
        match action {
            VmAction::PatchVmVolumes(ops) => {
                unless_lost_race(self.patch_vm(ops, false).await).map_err(volume_failure)
            }
            VmAction::PatchVmiVolumes(ops) => {
                unless_lost_race(self.patch_vmi(ops).await).map_err(volume_failure)
            }
            VmAction::PatchVmiInterfaces(ops) => unless_lost_race(self.patch_vmi(ops).await)
                .map_err(|e| {
                    nic_failure(format!("error encountered when trying to patch vmi: {e}"))
                }),
            VmAction::PatchVmInterfaces(ops) => unless_lost_race(self.patch_vm(ops, false).await)
                .map_err(|e| {
                    nic_failure(format!(
                        "error encountered when trying to update the VM template: {e}"
                    ))
                }),
            _ => Ok(()),
        }
    }

    async fn perform(&self, action: VmAction) -> Result<(), SyncFailure> {
        let vmis: Api<VirtualMachineInstance> =
            Api::namespaced(self.client.clone(), self.namespace);
        match action {
            VmAction::PatchVm(ops) | VmAction::PatchVmFinalizers(ops) => {
                self.patch_vm(ops, false).await.map_err(|e| {
                    SyncFailure::new(FAILED_UPDATE, format!("Failure updating the VM: {e}"))
                })
            }
            VmAction::PatchVmFirmware(ops) => self.patch_vm(ops, false).await.map_err(|e| {
                SyncFailure::new(
                    FIRMWARE_UUID_ERROR,
                    format!("error encountered when trying to patch VM firmware: {e}"),
                )
            }),
            VmAction::StartHaltedVm(ops) => {
                // Upstream reports a failure even when the update succeeded ("<nil>").
                let outcome = self.patch_vm(ops, false).await.err();
                let detail = outcome.map_or_else(|| "<nil>".to_owned(), |e| e.to_string());
                Err(SyncFailure::new(
                    FAILED_CREATE,
                    format!("Failure while starting VMI: {detail}"),
                ))
            }
            VmAction::PatchVmStatus(ops) => self.patch_vm(ops, true).await.map_err(|e| {
                SyncFailure::new(
                    FAILED_DELETE,
                    format!("failed to patch VM with start action: {e}"),
                )
            }),
            VmAction::PatchVmi(ops) => self.patch_vmi(ops).await.map_err(|e| {
                SyncFailure::new(
                    ANNOTATIONS_LABELS_CHANGE_ERROR,
                    format!(
                        "Error encountered while handling annotation and labels sync request: {e}"
                    ),
                )
            }),
            VmAction::LiveUpdateVmi(ops) => self.patch_vmi(ops).await.map_err(|e| {
                SyncFailure::new(
                    FAILED_UPDATE,
                    format!("Error encountered while updating the running VMI: {e}"),
                )
            }),
            hotplug @ (VmAction::PatchVmVolumes(_)
            | VmAction::PatchVmiVolumes(_)
            | VmAction::PatchVmiInterfaces(_)
            | VmAction::PatchVmInterfaces(_)) => self.patch_hotplug(hotplug).await,
            VmAction::DeleteVmi(name) => {
                let object_key = format!("{}/{name}", self.namespace);
                self.expectations
                    .expect_deletions(self.key, std::slice::from_ref(&object_key));
                match vmis.delete(&name, &DeleteParams::default()).await {
                    Ok(deleted) => {
                        tracing::info!(vmi = %name, "deleted virtual machine instance");
                        let uid = deleted.either(
                            |vmi| vmi.metadata.uid.unwrap_or_default(),
                            |status| status.details.map(|d| d.uid).unwrap_or_default(),
                        );
                        let message = format!(
                            "Stopped the virtual machine by deleting the virtual machine instance {uid}"
                        );
                        self.event(EventType::Normal, SUCCESSFUL_DELETE, &message)
                            .await;
                        Ok(())
                    }
                    Err(e) => {
                        self.expectations.deletion_observed(self.key, &object_key);
                        let message =
                            format!("Error deleting virtual machine instance {name}: {e}");
                        self.event(EventType::Warning, FAILED_DELETE, &message)
                            .await;
                        Err(SyncFailure::new(
                            FAILED_DELETE,
                            format!("Failure attempting to delete VMI: {e}"),
                        ))
                    }
                }
            }
            VmAction::CreateDataVolume(dv) => self.create_data_volume(*dv).await,
            VmAction::DataVolumeFailed(name) => {
                let message = format!("DataVolume {name} failed to import disk image");
                self.event(EventType::Warning, FAILED_DATA_VOLUME_IMPORT, &message)
                    .await;
                Ok(())
            }
            VmAction::CreateVmi {
                vmi,
                revision,
                stale_revisions,
            } => self
                .create_vmi(*vmi, revision.map(|r| *r), stale_revisions)
                .await
                .map_err(|e| {
                    SyncFailure::new(FAILED_CREATE, format!("Failure while starting VMI: {e}"))
                }),
        }
    }

    /// Creates a DataVolume of the VM's templates under a creation expectation, with
    /// upstream's events; a failure is upstream's sync error (reason `FailedCreate`).
    async fn create_data_volume(&self, dv: Value) -> Result<(), SyncFailure> {
        let name = dv["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let failure = |e: &dyn std::fmt::Display| {
            SyncFailure::new(
                FAILED_CREATE,
                format!(
                    "Error encountered while creating DataVolumes: failed to create DataVolume: {e}"
                ),
            )
        };
        let object: DynamicObject = serde_json::from_value(dv).map_err(|e| failure(&e))?;
        let resource = ApiResource::erase::<DataVolume>(&());
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), self.namespace, &resource);
        self.dv_expectations.expect_creations(self.key, 1);
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => {
                tracing::info!(dv = %name, "created DataVolume");
                let message = format!("Created DataVolume {name}");
                self.event(EventType::Normal, SUCCESSFUL_DATA_VOLUME_CREATE, &message)
                    .await;
                Ok(())
            }
            Err(e) => {
                self.dv_expectations.creation_observed(self.key);
                let message = format!("Error creating DataVolume {name}: {e}");
                self.event(EventType::Warning, FAILED_DATA_VOLUME_CREATE, &message)
                    .await;
                Err(failure(&e))
            }
        }
    }

    async fn event(&self, kind: EventType, reason: &str, message: &str) {
        self.recorder.record(self.vm, kind, reason, message).await;
    }

    /// As upstream's `createVMRevision`: deletes the revisions of other generations, creates
    /// the start revision when none of this generation was cached (an existing one is kept,
    /// even with other data; a create that still finds one fails the start), then creates
    /// the VMI under a creation expectation.
    async fn create_vmi(
        &self,
        vmi: VirtualMachineInstance,
        revision: Option<ControllerRevision>,
        stale: Vec<String>,
    ) -> Result<(), kube::Error> {
        let revisions: Api<ControllerRevision> =
            Api::namespaced(self.client.clone(), self.namespace);
        for old in stale {
            revisions.delete(&old, &DeleteParams::default()).await?;
        }
        if let Some(revision) = revision {
            revisions.create(&PostParams::default(), &revision).await?;
        }
        let vmis: Api<VirtualMachineInstance> =
            Api::namespaced(self.client.clone(), self.namespace);
        self.expectations.expect_creations(self.key, 1);
        match vmis.create(&PostParams::default(), &vmi).await {
            Ok(created) => {
                let name = created.metadata.name.as_deref().unwrap_or(self.vm_name);
                tracing::info!(vmi = %name, "created virtual machine instance");
                let message = format!(
                    "Started the virtual machine by creating the new virtual machine instance {name}"
                );
                self.event(EventType::Normal, SUCCESSFUL_CREATE, &message)
                    .await;
                Ok(())
            }
            Err(e) => {
                self.expectations.creation_observed(self.key);
                let message = format!("Error creating virtual machine instance: {e}");
                self.event(EventType::Warning, FAILED_CREATE, &message)
                    .await;
                Err(e)
            }
        }
    }
}

/// Upstream's sync error for a volume request that could not be applied.
/// Upstream's reason of a failed NIC hotplug write.
fn nic_failure(message: String) -> SyncFailure {
    SyncFailure::new("HotPlugNetworkInterfaceError", message)
}

fn volume_failure(e: impl std::fmt::Display) -> SyncFailure {
    SyncFailure::new(
        HOTPLUG_VOLUME_ERROR,
        format!("Error encountered while handling volume hotplug requests: {e}"),
    )
}

/// A volume patch that lost a race to another writer is no failure: the newer VM or VMI is on
/// its way through the watch, and the next reconcile applies the requests to it.
fn unless_lost_race(result: Result<(), PatchError>) -> Result<(), PatchError> {
    match result {
        Err(PatchError::Api(kube::Error::Api(status))) if crate::runtime::lost_race(&status) => {
            tracing::debug!(reason = %status.message, "volume patch lost a race; waiting for the newer object");
            Ok(())
        }
        other => other,
    }
}
