//! A minimal CDI (Containerized Data Importer) for the embedded server: what a user installs on
//! a cluster to fill claims from DataVolumes, here installed by `kubevirt-rs server` itself.
//!
//! Data flow: a DataVolume (`cdi.kubevirt.io/v1beta1`) → [`controller`] creates the claim of the
//! same name ([`claim::claim_for`]: size, class and access modes from `spec.pvc` or
//! `spec.storage`, owned by the DataVolume) and the importer pod `importer-<dv>`
//! ([`claim::importer_pod`]) mounting it → the pod runs `kubevirt-rs cdi-importer`
//! ([`importer`]), which writes `disk.img` into the claim (blank, registry or http source) →
//! the controller maps the claim's and the pod's states to CDI's phases and conditions
//! ([`status::desired_status`]) → the importer pod is deleted once the import succeeded.
//!
//! The importer pod is the claim's first consumer: a `WaitForFirstConsumer` claim binds on the
//! importer's node (CDI with `HonorWaitForFirstConsumer` off, see `docs/adr/`).
//!
//! [`manifests`] renders what the server applies: the CRD, the controller's namespace,
//! service account, RBAC and Deployment.

pub mod claim;
pub mod controller;
pub mod importer;
pub mod manifests;
pub mod status;

/// The label CDI puts on its importer pods (`app: containerized-data-importer`).
pub const APP_LABEL_VALUE: &str = "containerized-data-importer";

/// The importer pod of DataVolume `dv` (CDI's name pattern).
pub fn importer_pod_name(dv: &str) -> String {
    format!("importer-{dv}")
}

/// The image of the CDI controller (this binary, `kubevirt-rs cdi-controller`).
pub fn controller_image() -> String {
    format!("kubevirt-rs/cdi-controller:{}", env!("CARGO_PKG_VERSION"))
}

/// The image of importer pods (this binary, `kubevirt-rs cdi-importer`).
pub fn importer_image() -> String {
    format!("kubevirt-rs/cdi-importer:{}", env!("CARGO_PKG_VERSION"))
}
