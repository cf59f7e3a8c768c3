//! `50-virt-handler.yaml`: virt-handler's DaemonSet.
//!
//! As upstream: privileged (SELinux level `s0`), the host's PID namespace, 330 s grace
//! period, `NODE_NAME`/`MY_POD_IP` from the downward API, ports `metrics` 8443 and `vmstats`
//! 8187, and the hostPath volumes it shares with launcher pods: `/var/run/kubevirt`
//! (bidirectional propagation), `/var/run/kubevirt-private`, and the kubelet's pod directory
//! `/var/lib/kubelet/pods` at `/pods` (host-to-container propagation, so launcher pods'
//! volumes mounted after the handler started are seen).
//!
//! kubevirt-rs differences: the container runs `kubevirt-rs handler --node-name $(NODE_NAME)
//! --kubelet-pods-dir /pods --data-dir /var/lib/kubevirt-rs --listen 0.0.0.0:8186`; the
//! handler's local state (disk images, host disks) is the hostPath `/var/lib/kubevirt-rs`.
//! There is no libvirt, so no `/var/run/kubevirt-libvirt-runtimes`, no node-labeller init
//! container, no pr-helper; no probes until the handler serves `/healthz` on 8443.

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy};
use k8s_openapi::api::core::v1::{
    EnvVar, EnvVarSource, HostPathVolumeSource, ObjectFieldSelector, SELinuxOptions,
    SecurityContext, Volume, VolumeMount,
};
use serde_json::Value;

use crate::meta::{APP_LABEL, namespaced_meta, strings};
use crate::namespace::HANDLER_SERVICE_ACCOUNT;
use crate::pod::{self, attach_certificate};
use crate::virt_api::{requests, tcp_port};
use crate::{BINARY, InstallConfig, InstallError, to_value};

/// virt-handler's name (DaemonSet, container, `kubevirt.io` label).
pub const NAME: &str = "virt-handler";
/// Grace period of the handler's pods (upstream's 330 s).
pub const GRACE_PERIOD_SECONDS: i64 = 330;

/// A hostPath volume of the handler: name, host path, mount path, propagation.
pub const HOST_VOLUMES: &[(&str, &str, &str, Option<&str>)] = &[
    (
        "virt-share-dir",
        "/var/run/kubevirt",
        "/var/run/kubevirt",
        Some("Bidirectional"),
    ),
    (
        "virt-private-dir",
        "/var/run/kubevirt-private",
        "/var/run/kubevirt-private",
        None,
    ),
    (
        "kubelet-pods",
        "/var/lib/kubelet/pods",
        "/pods",
        Some("HostToContainer"),
    ),
    (
        "virt-handler-data",
        "/var/lib/kubevirt-rs",
        "/var/lib/kubevirt-rs",
        None,
    ),
];

/// The container's arguments, then the configured extra ones (which override).
#[must_use]
pub fn args(config: &InstallConfig) -> Vec<String> {
    let pair = |flag, value: &str| (flag, value.to_owned());
    crate::merge_args(
        &[
            pair("--node-name", "$(NODE_NAME)"),
            pair("--kubelet-pods-dir", "/pods"),
            pair("--data-dir", "/var/lib/kubevirt-rs"),
            pair("--listen", "0.0.0.0:8186"),
            pair("--pod-ip-address", "$(MY_POD_IP)"),
        ],
        &config.extra_args.handler,
    )
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.to_owned(),
                api_version: None,
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// virt-handler's DaemonSet.
#[must_use]
pub fn daemon_set(config: &InstallConfig) -> DaemonSet {
    let mut template = pod::template(
        config,
        NAME,
        HANDLER_SERVICE_ACCOUNT,
        strings(&[BINARY, "handler"]),
        args(config),
    );
    if let Some(spec) = template.spec.as_mut() {
        spec.host_pid = Some(true);
        spec.termination_grace_period_seconds = Some(GRACE_PERIOD_SECONDS);
        attach_certificate(
            spec,
            "kubevirt-virt-handler-server-certs",
            "/etc/virt-handler/servercertificates",
        );
        attach_certificate(
            spec,
            "kubevirt-virt-handler-certs",
            "/etc/virt-handler/clientcertificates",
        );
        let volumes = spec.volumes.get_or_insert_with(Vec::new);
        for (name, path, _, _) in HOST_VOLUMES {
            volumes.push(Volume {
                name: (*name).to_owned(),
                host_path: Some(HostPathVolumeSource {
                    path: (*path).to_owned(),
                    type_: None,
                }),
                ..Volume::default()
            });
        }
        if let Some(c) = spec.containers.first_mut() {
            c.ports = Some(vec![tcp_port("metrics", 8443), tcp_port("vmstats", 8187)]);
            c.security_context = Some(SecurityContext {
                privileged: Some(true),
                se_linux_options: Some(SELinuxOptions {
                    level: Some("s0".into()),
                    ..SELinuxOptions::default()
                }),
                ..SecurityContext::default()
            });
            c.env = Some(vec![
                field_env("NODE_NAME", "spec.nodeName"),
                field_env("MY_POD_IP", "status.podIP"),
            ]);
            let mounts = c.volume_mounts.get_or_insert_with(Vec::new);
            for (name, _, mount_path, propagation) in HOST_VOLUMES {
                mounts.push(VolumeMount {
                    name: (*name).to_owned(),
                    mount_path: (*mount_path).to_owned(),
                    mount_propagation: propagation.map(str::to_owned),
                    ..VolumeMount::default()
                });
            }
            c.resources = Some(requests("10m", "325Mi"));
        }
    }
    DaemonSet {
        metadata: namespaced_meta(&config.namespace, NAME, &[(APP_LABEL, NAME)]),
        spec: Some(DaemonSetSpec {
            selector: pod::selector(NAME),
            template,
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: None,
            }),
            ..DaemonSetSpec::default()
        }),
        status: None,
    }
}

/// The group's objects.
///
/// # Errors
///
/// [`InstallError::Encode`] (a bug in the types).
pub fn objects(config: &InstallConfig) -> Result<Vec<Value>, InstallError> {
    Ok(vec![to_value(
        "DaemonSet virt-handler",
        &daemon_set(config),
    )?])
}
