//! `40-virt-controller.yaml`: virt-controller's Deployment and the PodDisruptionBudget
//! `virt-controller-pdb`.
//!
//! The container runs `kubevirt-rs controller --launcher-image <image> --namespace <ns>`;
//! leader election is on the Lease `virt-controller` in that namespace (the controller's
//! Role grants `leases`). It serves `/healthz` (the liveness probe, upstream's), `/leader` (the
//! readiness probe) and `/metrics` over HTTPS on 8443 with the certificate of the Secret
//! `kubevirt-controller-certs`. Upstream's `--exporter-image` and `-v` have no counterpart in
//! `kubevirt-rs controller` and are left out.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Probe;
use serde_json::Value;

use crate::meta::{labels, strings};
use crate::namespace::CONTROLLER_SERVICE_ACCOUNT;
use crate::pod::{self, attach_certificate, attach_profile_volume, restrict};
use crate::virt_api::{requests, tcp_port};
use crate::{BINARY, InstallConfig, InstallError, to_value};

/// virt-controller's name (Deployment, container, `kubevirt.io` label, leader Lease).
pub const NAME: &str = "virt-controller";

/// Its HTTPS port (`/healthz`, `/leader`, `/metrics`).
pub const PORT: i32 = 8443;

/// The container's arguments, then the configured extra ones (which override).
#[must_use]
pub fn args(config: &InstallConfig) -> Vec<String> {
    crate::merge_args(
        &[
            ("--launcher-image", config.launcher_image()),
            ("--namespace", config.namespace.clone()),
            ("--port", PORT.to_string()),
        ],
        &config.extra_args.controller,
    )
}

/// virt-controller's Deployment.
#[must_use]
pub fn deployment(config: &InstallConfig) -> Deployment {
    let mut template = pod::template(
        config,
        NAME,
        CONTROLLER_SERVICE_ACCOUNT,
        strings(&[BINARY, "controller"]),
        args(config),
    );
    template.metadata.get_or_insert_default().annotations =
        Some(labels(&[("openshift.io/required-scc", "restricted-v2")]));
    if let Some(spec) = template.spec.as_mut() {
        restrict(spec);
        if let Some(c) = spec.containers.first_mut() {
            c.ports = Some(vec![tcp_port("metrics", PORT)]);
            c.liveness_probe = Some(Probe {
                failure_threshold: Some(8),
                initial_delay_seconds: Some(15),
                timeout_seconds: Some(10),
                ..pod::https_probe(PORT, "/healthz")
            });
            // Deviation: upstream waits 15 s before the first readiness probe, so a new
            // replica (and an upgrade, which waits for it) takes at least 15 s; probing every
            // second from the start makes it Ready about a second after it listens.
            c.readiness_probe = Some(Probe {
                period_seconds: Some(1),
                timeout_seconds: Some(10),
                ..pod::https_probe(PORT, "/leader")
            });
            c.resources = Some(requests("10m", "275Mi"));
        }
        attach_certificate(
            spec,
            "kubevirt-controller-certs",
            "/etc/virt-controller/certificates",
        );
        attach_certificate(spec, "kubevirt-export-ca", "/etc/virt-controller/exportca");
        attach_certificate(spec, "kubevirt-backup-ca", "/etc/virt-controller/backupca");
        attach_profile_volume(spec);
    }
    pod::deployment(config, NAME, config.controller_replicas, template)
}

/// The group's objects.
///
/// # Errors
///
/// [`InstallError::Encode`] (a bug in the types).
pub fn objects(config: &InstallConfig) -> Result<Vec<Value>, InstallError> {
    Ok(vec![
        to_value("Deployment virt-controller", &deployment(config))?,
        to_value(
            "PodDisruptionBudget virt-controller-pdb",
            &pod::disruption_budget(config, NAME, config.controller_replicas),
        )?,
    ])
}
