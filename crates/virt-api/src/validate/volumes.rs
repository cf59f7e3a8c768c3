//! Volume rules: unique names, exactly one source, cloud-init data, host disks, singleton
//! volumes, utility volumes, volume ↔ disk mapping (VMIs only) and access credentials.

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine;
use k8s_openapi::api::core::v1::LocalObjectReference;
use kubevirt_api::v1::{VirtualMachineInstanceSpec, Volume};

use super::{Cause, FieldPath, reason};
use crate::config::{ClusterConfig, gates};

const CLOUD_INIT_MAX_LEN: usize = 2048;

struct CloudInitData<'a> {
    kind: &'static str,
    user_ref: Option<&'a LocalObjectReference>,
    user_b64: Option<&'a str>,
    user: Option<&'a str>,
    net_ref: Option<&'a LocalObjectReference>,
    net_b64: Option<&'a str>,
    net: Option<&'a str>,
}

fn cloud_init(v: &Volume) -> Option<CloudInitData<'_>> {
    let s = &v.volume_source;
    if let Some(n) = &s.cloud_init_no_cloud {
        return Some(CloudInitData {
            kind: "cloudInitNoCloud",
            user_ref: n.secret_ref.as_ref(),
            user_b64: n.user_data_base64.as_deref(),
            user: n.user_data.as_deref(),
            net_ref: n.network_data_secret_ref.as_ref(),
            net_b64: n.network_data_base64.as_deref(),
            net: n.network_data.as_deref(),
        });
    }
    s.cloud_init_config_drive.as_ref().map(|n| CloudInitData {
        kind: "cloudInitConfigDrive",
        user_ref: n.secret_ref.as_ref(),
        user_b64: n.user_data_base64.as_deref(),
        user: n.user_data.as_deref(),
        net_ref: n.network_data_secret_ref.as_ref(),
        net_b64: n.network_data_base64.as_deref(),
        net: n.network_data.as_deref(),
    })
}

/// Counts the set sources of one kind of cloud-init data and returns `(count, inline length)`;
/// a bad base64 value adds a cause.
fn data_sources(
    at: &FieldPath,
    kind: &str,
    what: &str,
    secret: Option<&LocalObjectReference>,
    b64: Option<&str>,
    plain: Option<&str>,
    c: &mut Vec<Cause>,
) -> (usize, usize) {
    let mut count = 0;
    let mut len = 0;
    if secret.is_some_and(|r| !r.name.is_empty()) {
        count += 1;
    }
    if let Some(b) = b64.filter(|b| !b.is_empty()) {
        count += 1;
        match base64::engine::general_purpose::STANDARD.decode(b) {
            Ok(bytes) => len = bytes.len(),
            Err(_) => {
                let f = at.children(&[kind, &format!("{what}Base64")]);
                c.push(Cause::invalid(
                    format!("{f}.{kind}.{what}Base64 is not a valid base64 value."),
                    f,
                ));
            }
        }
    }
    if let Some(p) = plain.filter(|p| !p.is_empty()) {
        count += 1;
        len = p.len();
    }
    (count, len)
}

fn validate_cloud_init(at: &FieldPath, d: &CloudInitData<'_>, c: &mut Vec<Cause>) {
    let f = at.child(d.kind);
    let (users, user_len) = data_sources(at, d.kind, "userData", d.user_ref, d.user_b64, d.user, c);
    let (nets, net_len) = data_sources(at, d.kind, "networkData", d.net_ref, d.net_b64, d.net, c);
    if users > 1 {
        c.push(Cause::invalid(
            format!("{f} must have only one userdatasource set."),
            &f,
        ));
    }
    if user_len > CLOUD_INIT_MAX_LEN {
        c.push(Cause::invalid(
            format!("{f} userdata exceeds {CLOUD_INIT_MAX_LEN} byte limit. Should use UserDataSecretRef for larger data."),
            &f,
        ));
    }
    if nets > 1 {
        c.push(Cause::invalid(
            format!("{f} must have only one networkdata source set."),
            &f,
        ));
    }
    if net_len > CLOUD_INIT_MAX_LEN {
        c.push(Cause::invalid(
            format!("{f} networkdata exceeds {CLOUD_INIT_MAX_LEN} byte limit. Should use NetworkDataSecretRef for larger data."),
            &f,
        ));
    }
    if users == 0 && nets == 0 {
        c.push(Cause::invalid(
            format!("{f} must have at least one userdatasource or one networkdatasource set."),
            &f,
        ));
    }
}

/// `validateVolumes`; `field` is `<spec>.volumes`.
pub fn validate_volumes(
    field: &FieldPath,
    volumes: &[Volume],
    cfg: &ClusterConfig,
    c: &mut Vec<Cause>,
) {
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    let (mut service_accounts, mut downward_metrics, mut memory_dumps) = (0, 0, 0);
    for (idx, volume) in volumes.iter().enumerate() {
        let at = field.index(idx);
        if let Some(other) = names.get(volume.name.as_str()) {
            c.push(Cause::invalid(
                format!(
                    "{at} and {} must not have the same Name.",
                    field.index(*other)
                ),
                at.child("name"),
            ));
        } else {
            names.insert(&volume.name, idx);
        }
        let s = &volume.volume_source;
        if s.data_volume.as_ref().is_some_and(|d| d.name.is_empty()) {
            c.push(Cause::required(
                "DataVolume 'name' must be set",
                at.child("name"),
            ));
        }
        service_accounts += usize::from(s.service_account.is_some());
        downward_metrics += usize::from(s.downward_metrics.is_some());
        memory_dumps += usize::from(s.memory_dump.is_some());
        if s.set_sources().len() != 1 {
            c.push(Cause::invalid(
                format!("{at} must have exactly one source type set"),
                &at,
            ));
        }
        if let Some(d) = cloud_init(volume) {
            validate_cloud_init(&at, &d, c);
        }
        validate_volume_source(&at, volume, cfg, c);
    }
    for (count, what) in [
        (service_accounts, "serviceAccount volume"),
        (downward_metrics, "downwardMetric volume"),
        (memory_dumps, "memory dump volume"),
    ] {
        if count > 1 {
            c.push(Cause::invalid(
                format!("{field} must have max one {what} set"),
                field,
            ));
        }
    }
}

fn validate_volume_source(
    at: &FieldPath,
    volume: &Volume,
    cfg: &ClusterConfig,
    c: &mut Vec<Cause>,
) {
    let s = &volume.volume_source;
    if s.downward_metrics.is_some() && !cfg.gate(gates::DOWNWARD_METRICS) {
        c.push(Cause::invalid(
            "downwardMetrics disks are not allowed: DownwardMetrics feature gate is not enabled.",
            at,
        ));
    }
    if let Some(hd) = &s.host_disk {
        if !cfg.gate(gates::HOST_DISK) {
            c.push(Cause::invalid("HostDisk feature gate is not enabled", at));
        }
        if hd.path.is_empty() {
            let f = at.children(&["hostDisk", "path"]);
            c.push(Cause::new(
                reason::NOT_FOUND,
                format!("{f} is required for hostDisk volume"),
                f,
            ));
        } else if !hd.path.starts_with('/') {
            // Not checked upstream; a relative path has no meaning on the node.
            let f = at.children(&["hostDisk", "path"]);
            c.push(Cause::invalid(
                format!("{f} must be an absolute path, got '{}'", hd.path),
                f,
            ));
        }
        let type_f = at.children(&["hostDisk", "type"]);
        if hd.type_ != "Disk" && hd.type_ != "DiskOrCreate" {
            c.push(Cause::invalid(
                format!(
                    "{type_f} has invalid value '{}', allowed are 'Disk' or 'DiskOrCreate'",
                    hd.type_
                ),
                &type_f,
            ));
        }
        if hd.type_ == "Disk" && hd.capacity.is_some() {
            let f = at.children(&["hostDisk", "capacity"]);
            c.push(Cause::invalid(
                format!("{f} is allowed to pass only with {type_f} equal to 'DiskOrCreate'"),
                f,
            ));
        }
    }
    let required = |path: &[&str], missing: bool, c: &mut Vec<Cause>| {
        if missing {
            let f = at.children(path);
            c.push(Cause::invalid(format!("{f} is a required field"), f));
        }
    };
    if let Some(cm) = &s.config_map {
        required(
            &["configMap", "name"],
            cm.name.as_deref().unwrap_or("").is_empty(),
            c,
        );
    }
    if let Some(sec) = &s.secret {
        required(
            &["secret", "secretName"],
            sec.secret_name.as_deref().unwrap_or("").is_empty(),
            c,
        );
    }
    if let Some(sa) = &s.service_account {
        required(
            &["serviceAccount", "serviceAccountName"],
            sa.service_account_name.as_deref().unwrap_or("").is_empty(),
            c,
        );
    }
}

/// Utility volumes are added by hotplug only, never at creation.
pub fn validate_utility_volumes_absent(
    field: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    c: &mut Vec<Cause>,
) {
    if !spec.utility_volumes.is_empty() {
        c.push(Cause::invalid(
            "cannot create VMI with utility volumes in spec, utility volumes can only be added via hotplug",
            field.child("utilityVolumes"),
        ));
    }
}

/// Every volume except a memory dump needs a disk or filesystem of its name (VMIs only).
pub fn validate_volume_disks(
    field: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    c: &mut Vec<Cause>,
) {
    let dev = &spec.domain.devices;
    let disks: BTreeSet<&str> = dev.disks.iter().map(|d| d.name.as_str()).collect();
    let filesystems: BTreeSet<&str> = dev.filesystems.iter().map(|f| f.name.as_str()).collect();
    for (idx, v) in spec.volumes.iter().enumerate() {
        if v.volume_source.memory_dump.is_some() {
            continue;
        }
        let name = v.name.as_str();
        let at = field.children(&["domain", "volumes"]).index(idx);
        if !disks.contains(name) && !filesystems.contains(name) {
            c.push(Cause::invalid(
                format!("{} '{name}' not found.", at.child("name")),
                at.child("name"),
            ));
        } else if v.volume_source.container_path.is_some() && disks.contains(name) {
            c.push(Cause::invalid(
                format!("ContainerPath volume '{name}' must be mapped to a filesystem, not a disk"),
                &at,
            ));
        }
    }
}

/// `accessCredentials`: one type, one source, one propagation method, matching cloud-init volume.
pub fn validate_access_credentials(
    field: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    c: &mut Vec<Cause>,
) {
    let has_no_cloud = spec
        .volumes
        .iter()
        .any(|v| v.volume_source.cloud_init_no_cloud.is_some());
    let has_config_drive = spec
        .volumes
        .iter()
        .any(|v| v.volume_source.cloud_init_config_drive.is_some());
    for (idx, cred) in spec.access_credentials.iter().enumerate() {
        let at = field.index(idx);
        let types =
            usize::from(cred.ssh_public_key.is_some()) + usize::from(cred.user_password.is_some());
        if types != 1 {
            c.push(Cause::invalid(
                format!("{at} must have exactly one access credential type set"),
                &at,
            ));
        }
        if let Some(ssh) = &cred.ssh_public_key {
            let pm = &ssh.propagation_method;
            if ssh.source.secret.is_none() {
                c.push(Cause::invalid(
                    format!("{at} must have exactly one source set"),
                    at.children(&["sshPublicKey", "source"]),
                ));
            }
            let methods = usize::from(pm.no_cloud.is_some())
                + usize::from(pm.config_drive.is_some())
                + usize::from(pm.qemu_guest_agent.is_some());
            let pm_f = at.children(&["sshPublicKey", "propagationMethod"]);
            if methods != 1 {
                c.push(Cause::invalid(
                    format!("{at} must have exactly one propagationMethod set"),
                    &pm_f,
                ));
            }
            if pm.no_cloud.is_some() && !has_no_cloud {
                c.push(Cause::invalid(format!("{at} requires a noCloud volume to exist when the noCloud propagationMethod is in use."), &pm_f));
            }
            if pm.config_drive.is_some() && !has_config_drive {
                c.push(Cause::invalid(
                    format!("{at} requires a configDrive volume to exist when the configDrive propagationMethod is in use."),
                    &pm_f,
                ));
            }
            if pm
                .qemu_guest_agent
                .as_ref()
                .is_some_and(|q| q.users.is_empty())
            {
                c.push(Cause::invalid(
                    format!("{at} requires at least one user to be present in the users list"),
                    pm_f.children(&["qemuGuestAgent", "users"]),
                ));
            }
        }
        if let Some(pw) = &cred.user_password {
            if pw.source.secret.is_none() {
                c.push(Cause::invalid(
                    format!("{at} must have exactly one source set"),
                    at.children(&["userPassword", "source"]),
                ));
            }
            if pw.propagation_method.qemu_guest_agent.is_none() {
                c.push(Cause::invalid(
                    format!("{at} must have exactly one propagationMethod set"),
                    at.children(&["userPassword", "propagationMethod"]),
                ));
            }
        }
    }
}
