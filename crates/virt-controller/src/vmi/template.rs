//! The virt-launcher pod of a VMI, rendered as a pure function of the VMI and a
//! [`LauncherPodConfig`].
//!
//! Metadata follows upstream's launcher template (labels, annotations in upstream's write
//! order, `generateName`, controller owner reference), so selectors and tools written for
//! KubeVirt find the pod. The containers are ours:
//!
//! | container | command | role |
//! |---|---|---|
//! | `compute` (always first) | `virt-launcher --namespace NS --name NAME --uid UID --grace-period-seconds G --pod-dir /var/run/kubevirt` | the launcher; `G` = VMI grace period + 15 s, the time it gives the guest to shut down |
//! | `guest-console-log` | `virt-tail --namespace NS --name NAME --uid UID --pod-dir /var/run/kubevirt` | present unless `spec.domain.devices.logSerialConsole` is false: streams the guest's serial log to its output, so `kubectl logs POD -c guest-console-log` shows it (upstream's program of that name) |
//!
//! Both use [`LauncherPodConfig::launcher_image`] and mount the pod's `public` emptyDir at
//! `/var/run/kubevirt` (upstream's path): the launcher's sockets, disks and logs live there,
//! and virt-handler reaches them through the kubelet's pod directory. Any kubelet runs the
//! pod as written; nothing here is specific to the embedded node.
//!
//! # CPU request
//! As upstream: a VMI without a CPU request gets (vCPUs + supplemental IO threads) /
//! [`LauncherPodConfig::cpu_allocation_ratio`] (`400m` for 4 vCPUs at the default ratio 10); with
//! `dedicatedCpuPlacement` the `compute` container requests and is limited to that many whole
//! CPUs (upstream also aligns the memory limit and counts an isolated emulator thread; not
//! done here). The VMI's own CPU requests and limits always win.
//!
//! # Device resources
//! As upstream, the `compute` container asks for `devices.kubevirt.io/kvm` unless guests are
//! emulated, for `devices.kubevirt.io/tun` whenever the VMI has interfaces or the pod
//! interface is attached automatically, for `devices.kubevirt.io/vhost-net` when an interface
//! is virtio and guests are not emulated (virt-handler advertises all three), and for the VMI's
//! `ephemeral-storage` plus [`EPHEMERAL_STORAGE_OVERHEAD`] (50M; the embedded node reports its
//! root filesystem as `ephemeral-storage` capacity, as kubelet does).
//!
//! # Network annotations
//! Upstream's Multus annotations: `k8s.v1.cni.cncf.io/networks` for secondary Multus networks,
//! `v1.multus-cni.io/default-network` for a default one; none for the pod network alone.
//!
//! # Probes and ports
//! `readinessProbe` and `livenessProbe` become the `compute` container's probes (`exec` and
//! `guestAgentPing` through `virt-probe`) and the interfaces' `ports` its ports,
//! as upstream ([`probes`]).
//!
//! # Memory request
//! The `compute` container requests the guest memory (`spec.domain.resources.requests.memory`,
//! else `spec.domain.memory.guest`) plus an overhead for everything outside guest RAM.
//!
//! - Upstream estimates a fixed part of roughly 200 MiB or more (its launcher, monitor, log
//!   daemon, libvirt daemon and QEMU), plus page tables (guest memory / 512), about 8 MiB per
//!   vCPU, and per-device parts (graphics, IO threads, and so on).
//! - Ours runs QEMU directly under a small Rust launcher, with no libvirt and no log daemon;
//!   measured resident sizes are a few MiB for the launcher and tens of MiB for QEMU, so:
//!   [`OVERHEAD_FIXED`] (40 MiB) + [`OVERHEAD_PER_VCPU`] (2 MiB) × vCPUs +
//!   guest memory / [`OVERHEAD_GUEST_DIVISOR`] (1 %, rounded up, for page tables and device
//!   buffers) + [`OVERHEAD_TCG`] (32 MiB) when the guest is emulated (TCG translation cache),
//!   the sum rounded up to a whole MiB.

mod probes;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMapProjection, ConfigMapVolumeSource, Container, DownwardAPIProjection,
    DownwardAPIVolumeFile, DownwardAPIVolumeSource, EmptyDirVolumeSource, KeyToPath,
    ObjectFieldSelector, Pod, PodReadinessGate, PodSpec, ProjectedVolumeSource,
    ResourceRequirements, SecretVolumeSource, ServiceAccountTokenProjection, Volume, VolumeDevice,
    VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use kubevirt_api::constants as c;
use kubevirt_api::quantity::{Format, Quantity as ExactQuantity};
use kubevirt_api::v1::{DEFAULT_GRACE_PERIOD_SECONDS, VirtualMachineInstance};

/// Name of the serial console log container.
pub const GUEST_CONSOLE_LOG_CONTAINER_NAME: &str = "guest-console-log";
/// Extended resource that grants `/dev/kvm`.
pub const KVM_RESOURCE: &str = "devices.kubevirt.io/kvm";
/// Extended resource that grants `/dev/net/tun` (the pod network's tap devices).
pub const TUN_RESOURCE: &str = "devices.kubevirt.io/tun";
/// Extended resource that grants `/dev/vhost-net` (in-kernel virtio-net).
pub const VHOST_NET_RESOURCE: &str = "devices.kubevirt.io/vhost-net";
/// Upstream's ephemeral-storage overhead of the `compute` container, in bytes (`50M`).
pub const EPHEMERAL_STORAGE_OVERHEAD: u64 = 50_000_000;
/// Seconds added to the VMI grace period for the pod's `terminationGracePeriodSeconds`.
pub const POD_GRACE_EXTRA_SECONDS: i64 = 30;
/// Seconds added to the VMI grace period for the launcher's `--grace-period-seconds`.
pub const LAUNCHER_GRACE_EXTRA_SECONDS: i64 = 15;
/// Fixed memory overhead: launcher plus QEMU's own code, heap and device model.
pub const OVERHEAD_FIXED: u64 = 40 * MIB;
/// Memory overhead per vCPU (thread stacks and per-vCPU state).
pub const OVERHEAD_PER_VCPU: u64 = 2 * MIB;
/// Guest memory is divided by this for the proportional overhead (1 %).
pub const OVERHEAD_GUEST_DIVISOR: u64 = 100;
/// Extra overhead of software emulation (the TCG translation cache).
pub const OVERHEAD_TCG: u64 = 32 * MIB;
/// Extra overhead of the passt binding: Debian's passt measured 21 MiB resident (19 MiB of it
/// its preallocated flow tables) with two forwarded ports. Upstream budgets 250 Mi for passt
/// forwarding every port.
pub const OVERHEAD_PASST: u64 = 24 * MIB;
/// Upstream's default `developerConfiguration.cpuAllocationRatio`.
pub const DEFAULT_CPU_ALLOCATION_RATIO: u32 = 10;
/// Longest value of a label.
const MAX_LABEL_VALUE: usize = 63;
const MIB: u64 = 1024 * 1024;

/// How launcher pods are built; the same for every VMI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LauncherPodConfig {
    /// Image of the launcher containers (upstream flag `--launcher-image`).
    pub launcher_image: String,
    /// vCPUs per physical CPU a VMI without a CPU request is given (upstream
    /// `developerConfiguration.cpuAllocationRatio`, default [`DEFAULT_CPU_ALLOCATION_RATIO`]):
    /// the `compute` container requests vCPUs / ratio.
    pub cpu_allocation_ratio: u32,
    /// Guests run under TCG: no `/dev/kvm` request, and the TCG memory overhead.
    pub use_emulation: bool,
    /// The KubeVirt CR's `kubevirt.io/skip-backup-hooks` annotation, which decides for VMIs
    /// that do not carry their own.
    pub cluster_skip_backup_hooks: Option<String>,
}

impl Default for LauncherPodConfig {
    fn default() -> Self {
        Self {
            launcher_image: default_launcher_image(),
            cpu_allocation_ratio: DEFAULT_CPU_ALLOCATION_RATIO,
            use_emulation: false,
            cluster_skip_backup_hooks: None,
        }
    }
}

/// `kubevirt-rs/virt-launcher:<version of this crate>`.
pub fn default_launcher_image() -> String {
    format!("kubevirt-rs/virt-launcher:{}", env!("CARGO_PKG_VERSION"))
}

/// Why a VMI cannot be rendered into a pod.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    /// The VMI lacks a name, namespace or UID.
    #[error("the VMI has no {0}")]
    MissingMetadata(&'static str),
    /// A memory quantity of the VMI cannot be parsed.
    #[error("invalid memory quantity {0:?}")]
    InvalidMemory(String),
    /// The VMI asks for neither guest memory nor a memory request.
    #[error("the VMI specifies neither spec.domain.memory.guest nor a memory request")]
    NoMemory,
}

impl TemplateError {
    /// The sync-error reason of a render failure (as upstream: `FailedCreate`).
    pub fn reason(&self) -> &'static str {
        "FailedCreate"
    }
}

/// Where upstream mounts a `sysprep` volume's ConfigMap or Secret in the launcher pod
/// (`SysprepSourceDir`): virt-handler builds the guest's `unattendCD` ISO from those files.
pub const SYSPREP_SOURCE_DIR: &str = "/var/run/kubevirt-private/sysprep";

/// `vmi` with the `persistentVolumeClaimInfo` of `claim_volumes` (read from the claim cache)
/// in its volume status, as the VMI controller writes it before hand-off: the template
/// renders a `Block`-mode claim from it, so a pod created before that status write is
/// rendered as one created after it.
pub fn with_claim_info(
    vmi: &VirtualMachineInstance,
    claim_volumes: &[kubevirt_api::v1::VolumeStatus],
) -> VirtualMachineInstance {
    let mut vmi = vmi.clone();
    let statuses = &mut vmi.status.get_or_insert_default().volume_status;
    for wanted in claim_volumes {
        match statuses.iter_mut().find(|v| v.name == wanted.name) {
            Some(existing) => existing
                .persistent_volume_claim_info
                .clone_from(&wanted.persistent_volume_claim_info),
            None => statuses.push(wanted.clone()),
        }
    }
    vmi
}

/// Renders the launcher pod of `vmi`; a claim's volume mode comes from the VMI's volume
/// status ([`with_claim_info`]).
pub fn render_launcher_pod(
    vmi: &VirtualMachineInstance,
    config: &LauncherPodConfig,
) -> Result<Pod, TemplateError> {
    let meta = &vmi.metadata;
    let name = meta
        .name
        .as_deref()
        .ok_or(TemplateError::MissingMetadata("name"))?;
    let namespace = meta
        .namespace
        .as_deref()
        .ok_or(TemplateError::MissingMetadata("namespace"))?;
    let uid = meta
        .uid
        .as_deref()
        .ok_or(TemplateError::MissingMetadata("uid"))?;
    let spec = &vmi.spec;
    let grace = spec
        .termination_grace_period_seconds
        .unwrap_or(DEFAULT_GRACE_PERIOD_SECONDS);
    let hostname = pod_hostname(vmi, name);
    let service_account = spec
        .volumes
        .iter()
        .find_map(|v| v.volume_source.service_account.as_ref())
        .and_then(|sa| sa.service_account_name.clone());

    let mut containers = vec![compute_container(vmi, config, namespace, name, uid, grace)?];
    if spec.domain.devices.log_serial_console != Some(false) {
        containers.push(console_log_container(config, namespace, name, uid));
    }
    let mut node_selector =
        BTreeMap::from([(c::NODE_SCHEDULABLE_LABEL.to_owned(), "true".to_owned())]);
    node_selector.extend(spec.node_selector.clone());
    node_selector.extend(cpu_node_selector(vmi));

    Ok(Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("virt-launcher-{name}-")),
            namespace: Some(namespace.to_owned()),
            labels: Some(pod_labels(vmi, name, uid, &hostname)),
            annotations: Some(pod_annotations(vmi, name, namespace, config)),
            owner_references: Some(vec![controller_ref(name, uid)]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            hostname: Some(hostname),
            subdomain: spec.subdomain.clone(),
            restart_policy: Some("Never".to_owned()),
            termination_grace_period_seconds: Some(grace + POD_GRACE_EXTRA_SECONDS),
            readiness_gates: Some(vec![PodReadinessGate {
                condition_type: c::VIRTUAL_MACHINE_UNPAUSED_READINESS_GATE.to_owned(),
            }]),
            enable_service_links: Some(false),
            node_selector: Some(node_selector),
            affinity: spec.affinity.clone(),
            tolerations: (!spec.tolerations.is_empty()).then(|| spec.tolerations.clone()),
            topology_spread_constraints: (!spec.topology_spread_constraints.is_empty())
                .then(|| spec.topology_spread_constraints.clone()),
            scheduler_name: spec.scheduler_name.clone(),
            priority_class_name: spec.priority_class_name.clone(),
            service_account_name: service_account
                .clone()
                .or_else(|| spec.service_account_name.clone()),
            // As upstream: the token only for a serviceAccount volume or an Istio sidecar.
            automount_service_account_token: Some(service_account.is_some() || istio_injected(vmi)),
            dns_policy: spec.dns_policy.clone(),
            dns_config: spec.dns_config.clone(),
            containers,
            volumes: Some(
                std::iter::once(Volume {
                    name: c::LAUNCHER_VOLUME.to_owned(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Volume::default()
                })
                .chain(claim_volumes(vmi).into_iter().map(|(volume, _)| volume))
                .chain(config_volumes(vmi).into_iter().map(|(volume, _)| volume))
                .chain(
                    cloud_init_secret_volumes(vmi)
                        .into_iter()
                        .map(|(volume, _)| volume),
                )
                .collect(),
            ),
            ..PodSpec::default()
        }),
        status: None,
    })
}

/// `spec.hostname`, else the VMI name up to the first `.`; at most 63 characters.
fn pod_hostname(vmi: &VirtualMachineInstance, name: &str) -> String {
    let base = match vmi.spec.hostname.as_deref() {
        Some(h) if !h.is_empty() => h,
        _ => name.split('.').next().unwrap_or(name),
    };
    base.chars().take(MAX_LABEL_VALUE).collect()
}

/// The launcher pod's `vmi.kubevirt.io/id` value (shared with `virtctl expose`).
pub use kubevirt_api::constants::vmi_id_label;

fn pod_labels(
    vmi: &VirtualMachineInstance,
    name: &str,
    uid: &str,
    hostname: &str,
) -> BTreeMap<String, String> {
    let mut labels = vmi.metadata.labels.clone().unwrap_or_default();
    labels.insert(c::APP_LABEL.to_owned(), c::VIRT_LAUNCHER_VALUE.to_owned());
    labels.insert(c::CREATED_BY_LABEL.to_owned(), uid.to_owned());
    labels.insert(c::DEPRECATED_VM_NAME_LABEL.to_owned(), hostname.to_owned());
    labels.insert(c::VMI_ID_LABEL.to_owned(), vmi_id_label(name));
    if let Some(inject) = annotation(vmi, c::ISTIO_INJECT_ANNOTATION) {
        labels.insert(c::ISTIO_INJECT_ANNOTATION.to_owned(), inject.to_owned());
    }
    labels
}

/// Upstream's `istio.ProxyInjectionEnabled`: `sidecar.istio.io/inject` is `true` in any case.
fn istio_injected(vmi: &VirtualMachineInstance) -> bool {
    annotation(vmi, c::ISTIO_INJECT_ANNOTATION).is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

fn annotation<'a>(vmi: &'a VirtualMachineInstance, key: &str) -> Option<&'a str> {
    vmi.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// Whether `kubevirt.io/skip-backup-hooks` parses as boolean true, as upstream's storage
/// annotation generator reads it: the VMI's annotation when it has one (whatever its value),
/// else the KubeVirt CR's (`cluster`).
pub fn skip_backup_hooks(
    annotations: Option<&BTreeMap<String, String>>,
    cluster: Option<&str>,
) -> bool {
    annotations
        .and_then(|a| a.get(c::SKIP_BACKUP_HOOKS_ANNOTATION))
        .map(String::as_str)
        .or(cluster)
        .is_some_and(|v| parse_go_bool(v) == Some(true))
}

/// Go's `strconv.ParseBool`.
fn parse_go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// The five velero hook annotations that freeze and thaw the guest around a backup.
pub fn backup_hook_annotations(name: &str, namespace: &str) -> BTreeMap<String, String> {
    let command = |verb: &str| {
        format!(
            r#"["/usr/bin/virt-freezer", "--{verb}", "--name", "{name}", "--namespace", "{namespace}"]"#
        )
    };
    BTreeMap::from([
        (
            c::VELERO_PRE_BACKUP_HOOK_CONTAINER_ANNOTATION.to_owned(),
            c::COMPUTE_CONTAINER_NAME.to_owned(),
        ),
        (
            c::VELERO_PRE_BACKUP_HOOK_COMMAND_ANNOTATION.to_owned(),
            command("freeze"),
        ),
        (
            c::VELERO_PRE_BACKUP_HOOK_TIMEOUT_ANNOTATION.to_owned(),
            "60s".to_owned(),
        ),
        (
            c::VELERO_POST_BACKUP_HOOK_CONTAINER_ANNOTATION.to_owned(),
            c::COMPUTE_CONTAINER_NAME.to_owned(),
        ),
        (
            c::VELERO_POST_BACKUP_HOOK_COMMAND_ANNOTATION.to_owned(),
            command("unfreeze"),
        ),
    ])
}

/// Annotations in upstream's write order; a later write of the same key wins.
fn pod_annotations(
    vmi: &VirtualMachineInstance,
    name: &str,
    namespace: &str,
    config: &LauncherPodConfig,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::from([(c::DOMAIN_ANNOTATION.to_owned(), name.to_owned())]);
    let vmi_annotations = vmi.metadata.annotations.as_ref();
    for (k, v) in vmi_annotations.into_iter().flatten() {
        let excluded = k.starts_with(c::KUBECTL_ANNOTATION_PREFIX)
            || k == c::STORAGE_OBSERVED_API_VERSION_ANNOTATION
            || k == c::LATEST_OBSERVED_API_VERSION_ANNOTATION;
        if !excluded {
            out.insert(k.clone(), v.clone());
        }
    }
    out.insert(
        c::DEFAULT_CONTAINER_ANNOTATION.to_owned(),
        c::COMPUTE_CONTAINER_NAME.to_owned(),
    );
    out.insert(
        c::MIGRATION_TRANSPORT_UNIX_ANNOTATION.to_owned(),
        "true".to_owned(),
    );
    out.insert(
        c::DESCHEDULER_REQUEST_EVICT_ONLY_ANNOTATION.to_owned(),
        String::new(),
    );
    out.extend(multus_annotations(vmi, namespace));
    let masquerade = vmi
        .spec
        .domain
        .devices
        .interfaces
        .iter()
        .any(|i| i.binding_method.masquerade.is_some());
    if masquerade {
        for key in [
            c::ISTIO_KUBEVIRT_INTERFACES_ANNOTATION,
            c::ISTIO_REROUTE_VIRTUAL_INTERFACES_ANNOTATION,
        ] {
            out.insert(key.to_owned(), "k6t-eth0".to_owned());
        }
    }
    if !skip_backup_hooks(vmi_annotations, config.cluster_skip_backup_hooks.as_deref()) {
        out.extend(backup_hook_annotations(name, namespace));
    }
    out
}

/// The controller reference to the VMI `name` with `uid`.
pub fn controller_ref(name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: VirtualMachineInstance::api_version(&()).into_owned(),
        kind: VirtualMachineInstance::kind(&()).into_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn identity_args(namespace: &str, name: &str, uid: &str) -> Vec<String> {
    ["--namespace", namespace, "--name", name, "--uid", uid]
        .map(str::to_owned)
        .to_vec()
}

fn pod_dir_args() -> [String; 2] {
    ["--pod-dir".to_owned(), c::LAUNCHER_DIR.to_owned()]
}

/// How the compute container gets a claim-backed volume.
enum ClaimAccess {
    /// A filesystem claim, mounted at `VMI_DISKS_DIR/<name>`.
    Mount(VolumeMount),
    /// A `Block`-mode claim, the device at `/dev/<name>`.
    Device(VolumeDevice),
}

/// The pod volumes of the VMI's claim-backed volumes (`persistentVolumeClaim`, `dataVolume`
/// through the claim of the same name, and the claim of an `ephemeral` volume, always
/// read-only: the guest writes to an overlay), each with how the compute container gets it,
/// as upstream renders claims: a `Block`-mode claim (per the VMI's volume status) as a
/// `volumeDevice` at `/dev/<name>`, any other as a mount at `VMI_DISKS_DIR/<name>`.
/// Hotpluggable ones are attached later and are not part of the launcher pod.
fn claim_volumes(vmi: &VirtualMachineInstance) -> Vec<(Volume, ClaimAccess)> {
    use k8s_openapi::api::core::v1::PersistentVolumeClaimVolumeSource as ClaimSource;
    vmi.spec
        .volumes
        .iter()
        .filter_map(|v| {
            let s = &v.volume_source;
            if s.is_hotpluggable() {
                return None;
            }
            let claim = s.pod_claim_name()?.to_owned();
            let read_only = s.ephemeral.is_some()
                || s.persistent_volume_claim
                    .as_ref()
                    .and_then(|p| p.read_only)
                    .unwrap_or(false);
            let volume = Volume {
                name: v.name.clone(),
                persistent_volume_claim: Some(ClaimSource {
                    claim_name: claim,
                    read_only: read_only.then_some(true),
                }),
                ..Volume::default()
            };
            let access = if vmi
                .status
                .as_ref()
                .is_some_and(|s| s.claim_is_block(&v.name))
            {
                ClaimAccess::Device(VolumeDevice {
                    name: v.name.clone(),
                    device_path: format!("/dev/{}", v.name),
                })
            } else {
                ClaimAccess::Mount(VolumeMount {
                    name: v.name.clone(),
                    mount_path: format!("{}/{}", c::VMI_DISKS_DIR, v.name),
                    read_only: read_only.then_some(true),
                    ..VolumeMount::default()
                })
            };
            Some((volume, access))
        })
        .collect()
}

/// The pod volume and the compute container's read-only mount of each `configMap`, `secret`,
/// `downwardAPI` and `serviceAccount` volume of the VMI, at upstream's
/// `/var/run/kubevirt-private/{config-map,secret,downwardapi}/<name>` (a service account's
/// token, CA and namespace at `…/service-account/<name>`): virt-handler builds the guest's ISO
/// disk from those files.
fn config_volumes(vmi: &VirtualMachineInstance) -> Vec<(Volume, VolumeMount)> {
    vmi.spec
        .volumes
        .iter()
        .filter_map(|v| {
            let s = &v.volume_source;
            let mut volume = Volume {
                name: v.name.clone(),
                ..Volume::default()
            };
            let dir = if let Some(cm) = &s.config_map {
                volume.config_map = Some(ConfigMapVolumeSource {
                    name: cm.name.clone().unwrap_or_default(),
                    optional: cm.optional,
                    ..ConfigMapVolumeSource::default()
                });
                c::CONFIG_MAP_DISKS_SOURCE_DIR
            } else if let Some(secret) = &s.secret {
                volume.secret = Some(SecretVolumeSource {
                    secret_name: secret.secret_name.clone(),
                    optional: secret.optional,
                    ..SecretVolumeSource::default()
                });
                c::SECRET_DISKS_SOURCE_DIR
            } else if let Some(downward) = &s.downward_api {
                volume.downward_api = Some(DownwardAPIVolumeSource {
                    items: Some(downward.fields.clone()),
                    ..DownwardAPIVolumeSource::default()
                });
                c::DOWNWARD_API_DISKS_SOURCE_DIR
            } else if s.service_account.is_some() {
                volume.projected = Some(service_account_projection());
                c::SERVICE_ACCOUNT_DISK_SOURCE_DIR
            } else if let Some(sysprep) = &s.sysprep {
                // As upstream: the ConfigMap, else the Secret, the user named.
                if let Some(cm) = &sysprep.config_map {
                    volume.config_map = Some(ConfigMapVolumeSource {
                        name: cm.name.clone(),
                        ..ConfigMapVolumeSource::default()
                    });
                } else {
                    volume.secret = Some(SecretVolumeSource {
                        secret_name: Some(sysprep.secret.as_ref()?.name.clone()),
                        ..SecretVolumeSource::default()
                    });
                }
                SYSPREP_SOURCE_DIR
            } else {
                return None;
            };
            let mount = VolumeMount {
                name: v.name.clone(),
                mount_path: format!("{dir}/{}", v.name),
                read_only: Some(true),
                ..VolumeMount::default()
            };
            Some((volume, mount))
        })
        .collect()
}

/// What the kubelet's service-account admission mounts (a bound token, the cluster CA, the
/// namespace), for a `serviceAccount` disk: the pod runs as that account.
fn service_account_projection() -> ProjectedVolumeSource {
    ProjectedVolumeSource {
        sources: Some(vec![
            VolumeProjection {
                service_account_token: Some(ServiceAccountTokenProjection {
                    path: "token".to_owned(),
                    expiration_seconds: Some(3607),
                    ..ServiceAccountTokenProjection::default()
                }),
                ..VolumeProjection::default()
            },
            VolumeProjection {
                config_map: Some(ConfigMapProjection {
                    name: "kube-root-ca.crt".to_owned(),
                    items: Some(vec![KeyToPath {
                        key: "ca.crt".to_owned(),
                        path: "ca.crt".to_owned(),
                        mode: None,
                    }]),
                    optional: Some(true),
                }),
                ..VolumeProjection::default()
            },
            VolumeProjection {
                downward_api: Some(DownwardAPIProjection {
                    items: Some(vec![DownwardAPIVolumeFile {
                        path: "namespace".to_owned(),
                        field_ref: Some(ObjectFieldSelector {
                            api_version: Some("v1".to_owned()),
                            field_path: "metadata.namespace".to_owned(),
                        }),
                        ..DownwardAPIVolumeFile::default()
                    }]),
                }),
                ..VolumeProjection::default()
            },
        ]),
        ..ProjectedVolumeSource::default()
    }
}

/// The Secrets a `cloudInitNoCloud` or `cloudInitConfigDrive` volume takes its user and
/// network data from, as pod
/// volumes `<volume>-udata` / `<volume>-ndata` mounted read-only below
/// `/var/run/kubevirt-private/secret/`: virt-handler reads `userdata` (or `userData`) and
/// `networkdata` (or `networkData`) there.
fn cloud_init_secret_volumes(vmi: &VirtualMachineInstance) -> Vec<(Volume, VolumeMount)> {
    let secret = |name: String, secret: &str| {
        let volume = Volume {
            name: name.clone(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.to_owned()),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        };
        let mount = VolumeMount {
            mount_path: format!("{}/{name}", c::SECRET_DISKS_SOURCE_DIR),
            name,
            read_only: Some(true),
            ..VolumeMount::default()
        };
        (volume, mount)
    };
    let mut out = Vec::new();
    for v in &vmi.spec.volumes {
        let s = &v.volume_source;
        let (user, network) = match (&s.cloud_init_no_cloud, &s.cloud_init_config_drive) {
            (Some(ci), _) => (&ci.secret_ref, &ci.network_data_secret_ref),
            (None, Some(cd)) => (&cd.secret_ref, &cd.network_data_secret_ref),
            (None, None) => continue,
        };
        if let Some(user) = user {
            out.push(secret(format!("{}-udata", v.name), &user.name));
        }
        if let Some(network) = network {
            out.push(secret(format!("{}-ndata", v.name), &network.name));
        }
    }
    out
}

fn launcher_volume_mount() -> Vec<VolumeMount> {
    vec![VolumeMount {
        name: c::LAUNCHER_VOLUME.to_owned(),
        mount_path: c::LAUNCHER_DIR.to_owned(),
        ..VolumeMount::default()
    }]
}

fn compute_container(
    vmi: &VirtualMachineInstance,
    config: &LauncherPodConfig,
    namespace: &str,
    name: &str,
    uid: &str,
    grace: i64,
) -> Result<Container, TemplateError> {
    let mut args = identity_args(namespace, name, uid);
    args.push("--grace-period-seconds".to_owned());
    args.push((grace + LAUNCHER_GRACE_EXTRA_SECONDS).to_string());
    args.extend(pod_dir_args());
    args.extend(test_hook_args(vmi));
    Ok(Container {
        name: c::COMPUTE_CONTAINER_NAME.to_owned(),
        image: Some(config.launcher_image.clone()),
        command: Some(vec![c::LAUNCHER_PROGRAM.to_owned()]),
        args: Some(args),
        resources: Some(compute_resources(vmi, config)?),
        ports: probes::container_ports(vmi),
        readiness_probe: probes::compute_probe(vmi.spec.readiness_probe.as_ref(), namespace, name),
        liveness_probe: probes::compute_probe(vmi.spec.liveness_probe.as_ref(), namespace, name),
        volume_mounts: Some(
            launcher_volume_mount()
                .into_iter()
                .chain(
                    claim_volumes(vmi)
                        .into_iter()
                        .filter_map(|(_, access)| match access {
                            ClaimAccess::Mount(mount) => Some(mount),
                            ClaimAccess::Device(_) => None,
                        }),
                )
                .chain(config_volumes(vmi).into_iter().map(|(_, mount)| mount))
                .chain(
                    cloud_init_secret_volumes(vmi)
                        .into_iter()
                        .map(|(_, mount)| mount),
                )
                .collect(),
        ),
        volume_devices: {
            let devices: Vec<VolumeDevice> = claim_volumes(vmi)
                .into_iter()
                .filter_map(|(_, access)| match access {
                    ClaimAccess::Device(device) => Some(device),
                    ClaimAccess::Mount(_) => None,
                })
                .collect();
            (!devices.is_empty()).then_some(devices)
        },
        ..Container::default()
    })
}

/// The launcher flags upstream's test and debugging annotations turn on: `--keep-after-failure`
/// for a `kubevirt.io/keep-launcher-alive-after-failure…` key whose value is empty or starts
/// with `true`, then `--simulate-crash` when `kubevirt.io/func-test-virt-launcher-fail-fast`
/// is present.
fn test_hook_args(vmi: &VirtualMachineInstance) -> Vec<String> {
    let annotations = vmi.metadata.annotations.as_ref();
    let mut args = Vec::new();
    let keep = annotations.into_iter().flatten().any(|(k, v)| {
        k.starts_with(c::KEEP_LAUNCHER_AFTER_FAILURE_ANNOTATION)
            && (v.is_empty() || v.starts_with("true"))
    });
    if keep {
        args.push("--keep-after-failure".to_owned());
    }
    if annotations.is_some_and(|a| a.contains_key(c::FUNC_TEST_LAUNCHER_FAIL_FAST_ANNOTATION)) {
        args.push("--simulate-crash".to_owned());
    }
    args
}

fn console_log_container(
    config: &LauncherPodConfig,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Container {
    Container {
        name: GUEST_CONSOLE_LOG_CONTAINER_NAME.to_owned(),
        image: Some(config.launcher_image.clone()),
        command: Some(vec![c::CONSOLE_TAIL_PROGRAM.to_owned()]),
        args: Some(
            identity_args(namespace, name, uid)
                .into_iter()
                .chain(pod_dir_args())
                .collect(),
        ),
        volume_mounts: Some(launcher_volume_mount()),
        ..Container::default()
    }
}

/// Requests (and limits, where the VMI sets them) of the `compute` container.
fn compute_resources(
    vmi: &VirtualMachineInstance,
    config: &LauncherPodConfig,
) -> Result<ResourceRequirements, TemplateError> {
    let domain = &vmi.spec.domain;
    let (vmi_requests, vmi_limits) = domain
        .resources
        .as_ref()
        .map(|r| (r.requests.clone(), r.limits.clone()))
        .unwrap_or_default();
    let guest = domain.memory.as_ref().and_then(|m| m.guest.as_ref());
    let requested = vmi_requests.get("memory");
    let guest_bytes = parse_bytes(guest.or(requested).ok_or(TemplateError::NoMemory)?)?;
    let base = parse_bytes(requested.or(guest).ok_or(TemplateError::NoMemory)?)?;
    let passt = domain
        .devices
        .interfaces
        .iter()
        .any(|i| i.binding_method.passt_binding.is_some());
    let overhead = memory_overhead(guest_bytes, vcpus(vmi), config.use_emulation)
        + if passt { OVERHEAD_PASST } else { 0 };

    let mut requests = BTreeMap::new();
    let mut limits = BTreeMap::new();
    // Upstream's calculated CPU resources; the VMI's own requests and limits win.
    let cpus = vcpus(vmi) + io_thread_cpus(vmi);
    if dedicated_cpus(vmi) {
        let count = Quantity(cpus.to_string());
        requests.insert("cpu".to_owned(), count.clone());
        limits.insert("cpu".to_owned(), count);
    } else if let Some(cpu) = cpu_request_for(cpus, config.cpu_allocation_ratio) {
        requests.insert("cpu".to_owned(), cpu);
    }
    if let Some(cpu) = vmi_requests.get("cpu") {
        requests.insert("cpu".to_owned(), cpu.clone());
    }
    requests.insert("memory".to_owned(), bytes_quantity(base + overhead));
    if let Some(cpu) = vmi_limits.get("cpu") {
        limits.insert("cpu".to_owned(), cpu.clone());
    }
    if let Some(memory) = vmi_limits.get("memory") {
        limits.insert(
            "memory".to_owned(),
            bytes_quantity(parse_bytes(memory)? + overhead),
        );
    }
    // Upstream's ephemeral-storage overhead, added to the VMI's request (and limit, if any).
    let storage = "ephemeral-storage";
    let requested_storage = vmi_requests.get(storage).map(parse_bytes).transpose()?;
    requests.insert(
        storage.to_owned(),
        decimal_quantity(requested_storage.unwrap_or(0) + EPHEMERAL_STORAGE_OVERHEAD),
    );
    if let Some(limit) = vmi_limits.get(storage) {
        limits.insert(
            storage.to_owned(),
            decimal_quantity(parse_bytes(limit)? + EPHEMERAL_STORAGE_OVERHEAD),
        );
    }
    // Extended resources must appear in limits; requests then default to the same.
    let mut device = |resource: &str| {
        requests.insert(resource.to_owned(), Quantity("1".to_owned()));
        limits.insert(resource.to_owned(), Quantity("1".to_owned()));
    };
    if requires_tun(vmi) {
        device(TUN_RESOURCE);
    }
    if requires_vhost_net(vmi, config.use_emulation) {
        device(VHOST_NET_RESOURCE);
    }
    if !config.use_emulation {
        device(KVM_RESOURCE);
    }
    Ok(ResourceRequirements {
        requests: Some(requests),
        limits: (!limits.is_empty()).then_some(limits),
        ..ResourceRequirements::default()
    })
}

/// Upstream's `RequiresTunDevice`: the VMI has interfaces, or the pod interface is attached
/// automatically (`autoattachPodInterface` unset or true).
fn requires_tun(vmi: &VirtualMachineInstance) -> bool {
    let devices = &vmi.spec.domain.devices;
    !devices.interfaces.is_empty() || devices.autoattach_pod_interface != Some(false)
}

/// Upstream's `RequiresVirtioNetDevice`: a virtio interface (the default model) and guests
/// not emulated (under emulation QEMU's userland virtio-net is used instead).
fn requires_vhost_net(vmi: &VirtualMachineInstance, use_emulation: bool) -> bool {
    !use_emulation
        && vmi.spec.domain.devices.interfaces.iter().any(|i| {
            i.model
                .as_deref()
                .is_none_or(|m| m.is_empty() || m == "virtio")
        })
}

/// One element of the Multus `k8s.v1.cni.cncf.io/networks` list, in the field order (and
/// with the omissions) of Multus' `NetworkSelectionElement`.
#[derive(serde::Serialize)]
struct NetworkSelection<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    namespace: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    mac: Option<&'a str>,
    #[serde(skip_serializing_if = "str::is_empty")]
    interface: String,
}

/// The pod interface upstream gives a secondary Multus network: `pod` + the first 11 hex
/// digits of the SHA-256 of the network name.
pub fn hashed_pod_interface_name(network: &str) -> String {
    kubevirt_api::v1::hashed_pod_interface_name(network)
}

/// Upstream's Multus annotations of a new launcher pod: `k8s.v1.cni.cncf.io/networks` lists the
/// secondary Multus networks of the interfaces not marked `absent` (NAD `namespace/name`, else
/// the VMI's namespace; the interface's MAC; the hashed pod interface name), and
/// `v1.multus-cni.io/default-network` names the NAD of the first default Multus network. A VMI
/// on the pod network alone gets neither. (Upstream also lists the NADs of network binding
/// plugins from the KubeVirt CR, which this controller does not read yet.)
pub(crate) fn multus_annotations(
    vmi: &VirtualMachineInstance,
    namespace: &str,
) -> Vec<(String, String)> {
    use kubevirt_api::v1::InterfaceState;
    let interfaces = &vmi.spec.domain.devices.interfaces;
    let present = |name: &str| {
        interfaces
            .iter()
            .find(|i| i.name == name)
            .filter(|i| i.state != Some(InterfaceState::Absent))
    };
    let mut out = Vec::new();
    let selections: Vec<NetworkSelection<'_>> = vmi
        .spec
        .networks
        .iter()
        .filter_map(|n| {
            let multus = n.network_source.multus.as_ref()?;
            let iface = present(&n.name)?;
            if multus.default == Some(true) {
                return None;
            }
            let (ns, name) = multus
                .network_name
                .split_once('/')
                .unwrap_or((namespace, &multus.network_name));
            Some(NetworkSelection {
                name,
                namespace: ns,
                mac: iface.mac_address.as_deref().filter(|m| !m.is_empty()),
                interface: hashed_pod_interface_name(&n.name),
            })
        })
        .collect();
    if !selections.is_empty()
        && let Ok(list) = serde_json::to_string(&selections)
    {
        out.push((c::MULTUS_NETWORKS_ANNOTATION.to_owned(), list));
    }
    let default = vmi.spec.networks.iter().find_map(|n| {
        n.network_source
            .multus
            .as_ref()
            .filter(|m| m.default == Some(true))
    });
    if let Some(default) = default {
        out.push((
            c::MULTUS_DEFAULT_NETWORK_ANNOTATION.to_owned(),
            default.network_name.clone(),
        ));
    }
    out
}

/// vCPUs of the guest: sockets × cores × threads, each defaulting to 1.
pub fn vcpus(vmi: &VirtualMachineInstance) -> u64 {
    let cpu = vmi.spec.domain.cpu.as_ref();
    let part = |v: Option<u32>| u64::from(v.unwrap_or(1).max(1));
    part(cpu.and_then(|c| c.sockets))
        * part(cpu.and_then(|c| c.cores))
        * part(cpu.and_then(|c| c.threads))
}

/// Threads of the supplemental IO thread pool, which upstream counts as CPUs.
fn io_thread_cpus(vmi: &VirtualMachineInstance) -> u64 {
    let threads = vmi.spec.domain.io_threads.as_ref();
    u64::from(
        threads
            .and_then(|t| t.supplemental_pool_thread_count)
            .unwrap_or(0),
    )
}

/// Upstream's CPU node selectors (`NodeSelectorRenderer`): a named CPU model (not
/// `host-model` or `host-passthrough`) needs a node labelled able to run it, and every
/// feature with policy `require` (the default) a node whose CPU has it; the handlers label
/// their nodes so. A guest at a fixed TSC frequency (its topology hints) needs a node the
/// topology updater labelled able to give it ([`crate::topology`]).
fn cpu_node_selector(vmi: &VirtualMachineInstance) -> BTreeMap<String, String> {
    use kubevirt_api::v1::domain::{CPU_MODEL_HOST_MODEL, CPU_MODEL_HOST_PASSTHROUGH};
    let Some(cpu) = vmi.spec.domain.cpu.as_ref() else {
        return BTreeMap::new();
    };
    let model = cpu
        .model
        .as_deref()
        .filter(|m| !m.is_empty() && *m != CPU_MODEL_HOST_MODEL && *m != CPU_MODEL_HOST_PASSTHROUGH)
        .map(|m| format!("{}{m}", c::CPU_MODEL_LABEL_PREFIX));
    let features = cpu
        .features
        .iter()
        .filter(|f| {
            f.policy
                .as_deref()
                .is_none_or(|p| p.is_empty() || p == "require")
        })
        .map(|f| format!("{}{}", c::CPU_FEATURE_LABEL_PREFIX, f.name));
    // A guest running at a fixed TSC frequency needs a node that gives it that frequency.
    let tsc = crate::topology::manual_tsc_frequency(vmi).map(crate::topology::scheduling_label);
    model
        .into_iter()
        .chain(features)
        .chain(tsc)
        .map(|label| (label, "true".to_owned()))
        .collect()
}

fn dedicated_cpus(vmi: &VirtualMachineInstance) -> bool {
    let cpu = vmi.spec.domain.cpu.as_ref();
    cpu.and_then(|c| c.dedicated_cpu_placement).unwrap_or(false)
}

/// The CPU request of `cpus` CPUs at `ratio` vCPUs per CPU (upstream: `cpus / ratio`, in
/// millicores below one CPU), rounded up to whole nanocores like a parsed quantity and
/// written in its canonical form (`400m`, `1200m`, `2`); `None` for a ratio of 0.
pub fn cpu_request_for(cpus: u64, ratio: u32) -> Option<Quantity> {
    if cpus == 0 || ratio == 0 {
        return None;
    }
    let nanos = (u128::from(cpus) * 1_000_000_000).div_ceil(u128::from(ratio));
    let text = if nanos % 1_000_000_000 == 0 {
        format!("{}", nanos / 1_000_000_000)
    } else if nanos % 1_000_000 == 0 {
        format!("{}m", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!("{}u", nanos / 1_000)
    } else {
        format!("{nanos}n")
    };
    Some(Quantity(text))
}

/// Our memory overhead in bytes (see the module docs).
pub fn memory_overhead(guest_bytes: u64, vcpus: u64, emulated: bool) -> u64 {
    let proportional = guest_bytes.div_ceil(OVERHEAD_GUEST_DIVISOR);
    let tcg = if emulated { OVERHEAD_TCG } else { 0 };
    (OVERHEAD_FIXED + OVERHEAD_PER_VCPU * vcpus + proportional + tcg).div_ceil(MIB) * MIB
}

/// Whole bytes of a memory quantity, rounded up as Kubernetes' `Value()` rounds.
fn parse_bytes(q: &Quantity) -> Result<u64, TemplateError> {
    ExactQuantity::try_from(q)
        .ok()
        .and_then(|q| u64::try_from(q.value()).ok())
        .ok_or_else(|| TemplateError::InvalidMemory(q.0.clone()))
}

/// `bytes` as a canonical binary-SI quantity (`2090Mi`, `3Gi`, `1025`).
fn bytes_quantity(bytes: u64) -> Quantity {
    // Every u64 fits, so the fallback is never taken.
    ExactQuantity::from_value(i128::from(bytes), Format::BinarySi)
        .map_or_else(|_| Quantity(bytes.to_string()), Quantity::from)
}

/// `bytes` as a canonical decimal-SI quantity (`50M`, `1123741824`).
fn decimal_quantity(bytes: u64) -> Quantity {
    ExactQuantity::from_value(i128::from(bytes), Format::DecimalSi)
        .map_or_else(|_| Quantity(bytes.to_string()), Quantity::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vmi(extra: serde_json::Value) -> VirtualMachineInstance {
        let mut base = json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": {
                "name": "testvmi", "namespace": "default", "uid": "1234",
                "labels": {"kubevirt.io/vm": "testvmi", "ops.example.com/owner": "a"},
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": "{}",
                    "kubevirt.io/latest-observed-api-version": "v1",
                    "kubevirt.io/storage-observed-api-version": "v1",
                    "custom/annotation": "x"
                }
            },
            "spec": {"domain": {"devices": {}, "memory": {"guest": "1Gi"}}}
        });
        merge(&mut base, extra);
        serde_json::from_value(base).expect("valid VMI")
    }

    fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
        match (base, extra) {
            (serde_json::Value::Object(b), serde_json::Value::Object(e)) => {
                for (k, v) in e {
                    merge(b.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (b, e) => *b = e,
        }
    }

    #[test]
    fn a_named_cpu_model_and_required_features_select_nodes_that_have_them() {
        let pod = render(
            &vmi(
                json!({"spec": {"domain": {"cpu": {"model": "Westmere", "features": [
                    {"name": "avx512f"}, {"name": "vmx", "policy": "require"},
                    {"name": "svm", "policy": "disable"}, {"name": "pcid", "policy": "optional"}
                ]}}}}),
            ),
            &LauncherPodConfig::default(),
        );
        assert_eq!(
            pod["spec"]["nodeSelector"],
            json!({
                "kubevirt.io/schedulable": "true",
                "cpu-model.node.kubevirt.io/Westmere": "true",
                "cpu-feature.node.kubevirt.io/avx512f": "true",
                "cpu-feature.node.kubevirt.io/vmx": "true",
            })
        );
        let host = render(
            &vmi(json!({"spec": {"domain": {"cpu": {"model": "host-model"}}}})),
            &LauncherPodConfig::default(),
        );
        assert_eq!(
            host["spec"]["nodeSelector"],
            json!({"kubevirt.io/schedulable": "true"})
        );
    }

    #[test]
    fn a_guest_at_a_hinted_tsc_frequency_selects_nodes_that_give_it() {
        let pod = render(
            &vmi(json!({
                "spec": {"domain": {"cpu": {"model": "host-model", "features": [{"name": "invtsc", "policy": "require"}]}}},
                "status": {"topologyHints": {"tscFrequency": 2_500_000_000_i64}},
            })),
            &LauncherPodConfig::default(),
        );
        assert_eq!(
            pod["spec"]["nodeSelector"]["scheduling.node.kubevirt.io/tsc-frequency-2500000000"],
            "true"
        );
    }

    fn render(vmi: &VirtualMachineInstance, config: &LauncherPodConfig) -> serde_json::Value {
        serde_json::to_value(render_launcher_pod(vmi, config).expect("renders")).expect("json")
    }

    #[test]
    fn the_launcher_pod_carries_upstream_metadata() {
        let pod = render(&vmi(json!({})), &LauncherPodConfig::default());
        let meta = &pod["metadata"];
        assert_eq!(meta["generateName"], "virt-launcher-testvmi-");
        assert_eq!(meta["namespace"], "default");
        assert_eq!(
            meta["labels"],
            json!({
                "kubevirt.io": "virt-launcher",
                "kubevirt.io/created-by": "1234",
                "kubevirt.io/vm": "testvmi",
                "ops.example.com/owner": "a",
                "vm.kubevirt.io/name": "testvmi",
                "vmi.kubevirt.io/id": "testvmi"
            })
        );
        assert_eq!(
            meta["annotations"],
            json!({
                "kubevirt.io/domain": "testvmi",
                "custom/annotation": "x",
                "kubectl.kubernetes.io/default-container": "compute",
                "kubevirt.io/migrationTransportUnix": "true",
                "descheduler.alpha.kubernetes.io/request-evict-only": "",
                "pre.hook.backup.velero.io/container": "compute",
                "pre.hook.backup.velero.io/command": "[\"/usr/bin/virt-freezer\", \"--freeze\", \"--name\", \"testvmi\", \"--namespace\", \"default\"]",
                "pre.hook.backup.velero.io/timeout": "60s",
                "post.hook.backup.velero.io/container": "compute",
                "post.hook.backup.velero.io/command": "[\"/usr/bin/virt-freezer\", \"--unfreeze\", \"--name\", \"testvmi\", \"--namespace\", \"default\"]"
            })
        );
        assert_eq!(
            meta["ownerReferences"],
            json!([{
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "name": "testvmi", "uid": "1234", "controller": true, "blockOwnerDeletion": true
            }])
        );
    }

    #[test]
    fn config_map_secret_and_downward_api_volumes_are_mounted_read_only_for_their_disks() {
        let pod = render(
            &vmi(json!({"spec": {"volumes": [
                {"name": "cfg", "configMap": {"name": "app-config", "volumeLabel": "CFG"}},
                {"name": "creds", "secret": {"secretName": "app-secret", "optional": true}},
                {"name": "labels", "downwardAPI": {"fields": [
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
            ]}})),
            &LauncherPodConfig::default(),
        );
        let volumes = &pod["spec"]["volumes"];
        assert_eq!(
            volumes[1],
            json!({"name": "cfg", "configMap": {"name": "app-config"}})
        );
        assert_eq!(
            volumes[2],
            json!({"name": "creds", "secret": {"secretName": "app-secret", "optional": true}})
        );
        assert_eq!(
            volumes[3]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"],
            "metadata.labels"
        );
        let mounts = &pod["spec"]["containers"][0]["volumeMounts"];
        assert_eq!(
            mounts[1],
            json!({"name": "cfg", "mountPath": "/var/run/kubevirt-private/config-map/cfg", "readOnly": true})
        );
        assert_eq!(
            mounts[2]["mountPath"],
            "/var/run/kubevirt-private/secret/creds"
        );
        assert_eq!(
            mounts[3]["mountPath"],
            "/var/run/kubevirt-private/downwardapi/labels"
        );
    }

    #[test]
    fn cloud_init_secrets_are_mounted_for_the_handler_to_read() {
        let pod = render(
            &vmi(
                json!({"spec": {"volumes": [{"name": "ci", "cloudInitNoCloud": {
                "secretRef": {"name": "user"}, "networkDataSecretRef": {"name": "net"}}}]}}),
            ),
            &LauncherPodConfig::default(),
        );
        let volumes = &pod["spec"]["volumes"];
        assert_eq!(
            volumes[1],
            json!({"name": "ci-udata", "secret": {"secretName": "user"}})
        );
        assert_eq!(
            volumes[2],
            json!({"name": "ci-ndata", "secret": {"secretName": "net"}})
        );
        let mounts = &pod["spec"]["containers"][0]["volumeMounts"];
        assert_eq!(
            mounts[1]["mountPath"],
            "/var/run/kubevirt-private/secret/ci-udata"
        );
        assert_eq!(
            mounts[2]["mountPath"],
            "/var/run/kubevirt-private/secret/ci-ndata"
        );
    }

    #[test]
    fn claim_backed_volumes_are_mounted_in_the_compute_container_under_vmi_disks() {
        let pod = render(
            &vmi(json!({"spec": {"volumes": [
                {"name": "root", "containerDisk": {"image": "x"}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "c1", "readOnly": true}},
                {"name": "dv", "dataVolume": {"name": "imported"}},
                {"name": "hot", "persistentVolumeClaim": {"claimName": "h", "hotpluggable": true}}
            ]}})),
            &LauncherPodConfig::default(),
        );
        assert_eq!(
            pod["spec"]["volumes"],
            json!([
                {"name": "public", "emptyDir": {}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "c1", "readOnly": true}},
                {"name": "dv", "persistentVolumeClaim": {"claimName": "imported"}}
            ])
        );
        assert_eq!(
            pod["spec"]["containers"][0]["volumeMounts"],
            json!([
                {"name": "public", "mountPath": "/var/run/kubevirt"},
                {"name": "data", "mountPath": "/var/run/kubevirt-private/vmi-disks/data", "readOnly": true},
                {"name": "dv", "mountPath": "/var/run/kubevirt-private/vmi-disks/dv"}
            ])
        );
        // The console-log container sees only the launcher directory.
        assert_eq!(
            pod["spec"]["containers"][1]["volumeMounts"],
            json!([{"name": "public", "mountPath": "/var/run/kubevirt"}])
        );
        assert!(pod["spec"]["containers"][0].get("volumeDevices").is_none());
    }

    #[test]
    fn block_claims_are_devices_at_dev_and_ephemeral_claims_are_mounted_read_only() {
        let spec = vmi(json!({"spec": {"volumes": [
            {"name": "fs", "persistentVolumeClaim": {"claimName": "c1"}},
            {"name": "raw", "persistentVolumeClaim": {"claimName": "c2"}},
            {"name": "scratch", "ephemeral": {"persistentVolumeClaim": {"claimName": "golden"}}},
            {"name": "rawscratch", "ephemeral": {"persistentVolumeClaim": {"claimName": "golden-raw"}}}
        ]}}));
        // The claims' modes as the controller reads them from the claim cache.
        let info = |name: &str, claim: &str, mode: &str| -> kubevirt_api::v1::VolumeStatus {
            serde_json::from_value(json!({"name": name, "target": "",
                "persistentVolumeClaimInfo": {"claimName": claim, "volumeMode": mode}}))
            .expect("status")
        };
        let claims = [
            info("fs", "c1", "Filesystem"),
            info("raw", "c2", "Block"),
            info("scratch", "golden", "Filesystem"),
            info("rawscratch", "golden-raw", "Block"),
        ];
        let pod = render(
            &with_claim_info(&spec, &claims),
            &LauncherPodConfig::default(),
        );
        assert_eq!(
            pod["spec"]["volumes"],
            json!([
                {"name": "public", "emptyDir": {}},
                {"name": "fs", "persistentVolumeClaim": {"claimName": "c1"}},
                {"name": "raw", "persistentVolumeClaim": {"claimName": "c2"}},
                {"name": "scratch", "persistentVolumeClaim": {"claimName": "golden", "readOnly": true}},
                {"name": "rawscratch", "persistentVolumeClaim": {"claimName": "golden-raw", "readOnly": true}}
            ])
        );
        let compute = &pod["spec"]["containers"][0];
        assert_eq!(
            compute["volumeMounts"],
            json!([
                {"name": "public", "mountPath": "/var/run/kubevirt"},
                {"name": "fs", "mountPath": "/var/run/kubevirt-private/vmi-disks/fs"},
                {"name": "scratch", "mountPath": "/var/run/kubevirt-private/vmi-disks/scratch", "readOnly": true}
            ])
        );
        assert_eq!(
            compute["volumeDevices"],
            json!([
                {"name": "raw", "devicePath": "/dev/raw"},
                {"name": "rawscratch", "devicePath": "/dev/rawscratch"}
            ])
        );
        // Without the claims' details (a VMI whose status has none yet) a claim is mounted.
        let bare = render(&spec, &LauncherPodConfig::default());
        assert!(bare["spec"]["containers"][0].get("volumeDevices").is_none());
        // A migration target is rendered from the running VMI, whose status has them.
        let again = render(
            &with_claim_info(&with_claim_info(&spec, &claims), &claims),
            &LauncherPodConfig::default(),
        );
        assert_eq!(again, pod, "merging the details again changes nothing");
    }

    #[test]
    fn a_sysprep_volume_mounts_its_config_map_or_secret_read_only_under_sysprep() {
        let pod = render(
            &vmi(json!({"spec": {"volumes": [
                {"name": "answers", "sysprep": {"configMap": {"name": "unattend-map"}}},
                {"name": "secret-answers", "sysprep": {"secret": {"name": "unattend-secret"}}}
            ]}})),
            &LauncherPodConfig::default(),
        );
        let volumes = &pod["spec"]["volumes"];
        assert_eq!(
            volumes[1],
            json!({"name": "answers", "configMap": {"name": "unattend-map"}})
        );
        assert_eq!(
            volumes[2],
            json!({"name": "secret-answers", "secret": {"secretName": "unattend-secret"}})
        );
        let mounts = &pod["spec"]["containers"][0]["volumeMounts"];
        assert_eq!(
            mounts[1],
            json!({"name": "answers", "mountPath": "/var/run/kubevirt-private/sysprep/answers", "readOnly": true})
        );
        assert_eq!(
            mounts[2],
            json!({"name": "secret-answers", "mountPath": "/var/run/kubevirt-private/sysprep/secret-answers", "readOnly": true})
        );
    }

    #[test]
    fn the_pod_spec_runs_our_launcher_with_upstream_scheduling_rules() {
        let pod = render(
            &vmi(json!({"spec": {
                "terminationGracePeriodSeconds": 0,
                "nodeSelector": {"disk": "ssd"},
                "tolerations": [{"key": "k", "operator": "Exists"}],
                "schedulerName": "custom", "priorityClassName": "high",
                "subdomain": "sub", "hostname": "guest"
            }})),
            &LauncherPodConfig::default(),
        );
        let spec = &pod["spec"];
        assert_eq!(spec["restartPolicy"], "Never");
        assert_eq!(spec["terminationGracePeriodSeconds"], 30);
        assert_eq!(
            spec["readinessGates"],
            json!([{"conditionType": "kubevirt.io/virtual-machine-unpaused"}])
        );
        assert_eq!(spec["enableServiceLinks"], false);
        assert_eq!(spec["hostname"], "guest");
        assert_eq!(spec["subdomain"], "sub");
        assert_eq!(
            spec["nodeSelector"],
            json!({"kubevirt.io/schedulable": "true", "disk": "ssd"})
        );
        assert_eq!(
            spec["tolerations"],
            json!([{"key": "k", "operator": "Exists"}])
        );
        assert_eq!(spec["schedulerName"], "custom");
        assert_eq!(spec["priorityClassName"], "high");
        let compute = &spec["containers"][0];
        assert_eq!(compute["name"], "compute");
        assert_eq!(compute["image"], default_launcher_image());
        assert_eq!(compute["command"], json!(["virt-launcher"]));
        assert_eq!(
            compute["args"],
            json!([
                "--namespace",
                "default",
                "--name",
                "testvmi",
                "--uid",
                "1234",
                "--grace-period-seconds",
                "15",
                "--pod-dir",
                "/var/run/kubevirt"
            ])
        );
        // The launcher directory is the pod's `public` emptyDir, as upstream's.
        assert_eq!(spec["volumes"], json!([{"name": "public", "emptyDir": {}}]));
        for container in [compute, &spec["containers"][1]] {
            assert_eq!(
                container["volumeMounts"],
                json!([{"name": "public", "mountPath": "/var/run/kubevirt"}])
            );
        }
        assert_eq!(spec["containers"][1]["name"], "guest-console-log");
        assert_eq!(spec["containers"][1]["command"], json!(["virt-tail"]));
        assert_eq!(pod["metadata"]["labels"]["vm.kubevirt.io/name"], "guest");
    }

    #[test]
    fn the_default_grace_period_gives_the_pod_sixty_seconds() {
        let pod = render(&vmi(json!({})), &LauncherPodConfig::default());
        assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 60);
        assert_eq!(pod["spec"]["containers"][0]["args"][7], "45");
    }

    #[test]
    fn the_tun_device_is_requested_unless_the_vmi_has_no_pod_interface_at_all() {
        // (case, vmi patch, tun requested)
        let cases = [
            ("pod interface attached automatically", json!({}), true),
            (
                "an explicit interface",
                json!({"spec": {"domain": {"devices": {"autoattachPodInterface": false,
                    "interfaces": [{"name": "default", "masquerade": {}}]}}}}),
                true,
            ),
            (
                "no interfaces and no automatic one",
                json!({"spec": {"domain": {"devices": {"autoattachPodInterface": false}}}}),
                false,
            ),
        ];
        for (case, patch, tun) in cases {
            let pod = render(&vmi(patch), &LauncherPodConfig::default());
            let res = &pod["spec"]["containers"][0]["resources"];
            let want = if tun { json!("1") } else { json!(null) };
            assert_eq!(res["limits"][TUN_RESOURCE], want, "{case}");
            assert_eq!(res["requests"][TUN_RESOURCE], want, "{case}");
        }
    }

    #[test]
    fn vhost_net_is_requested_for_virtio_interfaces_unless_emulated() {
        // (case, vmi patch, emulated, vhost-net requested)
        let iface = |model: serde_json::Value| {
            json!({"spec": {"domain": {"devices": {"interfaces":
                [{"name": "default", "masquerade": {}, "model": model}]}}}})
        };
        let cases = [
            ("default model", iface(json!(null)), false, true),
            ("virtio", iface(json!("virtio")), false, true),
            ("e1000", iface(json!("e1000")), false, false),
            ("virtio, emulated", iface(json!("virtio")), true, false),
            ("no interfaces", json!({}), false, false),
        ];
        for (case, patch, emulation, vhost) in cases {
            let config = LauncherPodConfig {
                use_emulation: emulation,
                ..LauncherPodConfig::default()
            };
            let pod = render(&vmi(patch), &config);
            let res = &pod["spec"]["containers"][0]["resources"];
            let want = if vhost { json!("1") } else { json!(null) };
            assert_eq!(res["limits"][VHOST_NET_RESOURCE], want, "{case}");
            assert_eq!(res["requests"][VHOST_NET_RESOURCE], want, "{case}");
        }
    }

    #[test]
    fn the_compute_container_requests_upstreams_ephemeral_storage_overhead() {
        let pod = render(&vmi(json!({})), &LauncherPodConfig::default());
        let res = &pod["spec"]["containers"][0]["resources"];
        assert_eq!(res["requests"]["ephemeral-storage"], "50M");
        assert_eq!(res["limits"]["ephemeral-storage"], json!(null));
        let own = vmi(json!({"spec": {"domain": {"resources": {
            "requests": {"ephemeral-storage": "1G"},
            "limits": {"ephemeral-storage": "2G"}}}}}));
        let pod = render(&own, &LauncherPodConfig::default());
        let res = &pod["spec"]["containers"][0]["resources"];
        assert_eq!(res["requests"]["ephemeral-storage"], "1050M");
        assert_eq!(res["limits"]["ephemeral-storage"], "2050M");
    }

    #[test]
    fn multus_networks_become_upstreams_pod_annotations() {
        let pod = render(
            &vmi(json!({"spec": {
                "domain": {"devices": {"interfaces": [
                    {"name": "default", "masquerade": {}},
                    {"name": "blue", "bridge": {}, "macAddress": "02:00:00:00:00:01"},
                    {"name": "red", "bridge": {}},
                    {"name": "gone", "bridge": {}, "state": "absent"},
                ]}},
                "networks": [
                    {"name": "default", "multus": {"networkName": "primary", "default": true}},
                    {"name": "blue", "multus": {"networkName": "test1"}},
                    {"name": "red", "multus": {"networkName": "other-namespace/test1"}},
                    {"name": "gone", "multus": {"networkName": "test2"}},
                ],
            }})),
            &LauncherPodConfig::default(),
        );
        let annotations = &pod["metadata"]["annotations"];
        let networks: serde_json::Value =
            serde_json::from_str(annotations["k8s.v1.cni.cncf.io/networks"].as_str().unwrap())
                .unwrap();
        assert_eq!(
            networks,
            json!([
                {"name": "test1", "namespace": "default", "mac": "02:00:00:00:00:01",
                 "interface": "pod16477688c0e"},
                {"name": "test1", "namespace": "other-namespace", "interface": "podb1f51a511f1"},
            ])
        );
        assert_eq!(annotations["v1.multus-cni.io/default-network"], "primary");

        let plain = render(&vmi(json!({})), &LauncherPodConfig::default());
        let annotations = plain["metadata"]["annotations"].as_object().unwrap();
        assert!(!annotations.contains_key("k8s.v1.cni.cncf.io/networks"));
        assert!(!annotations.contains_key("v1.multus-cni.io/default-network"));
    }

    #[test]
    fn memory_requests_add_our_overhead_and_kvm_is_requested_only_with_kvm() {
        // (case, vmi patch, emulation, memory request, cpu request, kvm requested)
        let cases = [
            // 1 GiB + 40 + 2 + 10.24 MiB, rounded up.
            (
                "1Gi guest, 1 vCPU, KVM",
                json!({}),
                false,
                "1077Mi",
                "100m",
                true,
            ),
            // 1 GiB + 40 + 2×4 + 10.24 + 32 MiB, rounded up.
            (
                "4 vCPUs under TCG",
                json!({"spec": {"domain": {"cpu": {"cores": 2, "sockets": 2}}}}),
                true,
                "1115Mi",
                "400m",
                false,
            ),
            // The 512 MiB request plus the overhead of the 1 GiB guest.
            (
                "explicit requests win",
                json!({"spec": {"domain": {"resources": {"requests": {"memory": "512Mi", "cpu": "2"}}}}}),
                false,
                "565Mi",
                "2",
                true,
            ),
            // 1077 MiB as the first case, plus passt's 24 MiB.
            (
                "a passt interface",
                json!({"spec": {"domain": {"devices": {"interfaces": [{"name": "default", "passtBinding": {}}]}},
                                "networks": [{"name": "default", "pod": {}}]}}),
                false,
                "1101Mi",
                "100m",
                true,
            ),
        ];
        for (case, patch, emulation, memory, cpu, kvm) in cases {
            let config = LauncherPodConfig {
                use_emulation: emulation,
                ..LauncherPodConfig::default()
            };
            let pod = render(&vmi(patch), &config);
            let res = &pod["spec"]["containers"][0]["resources"];
            assert_eq!(res["requests"]["memory"], memory, "{case}");
            assert_eq!(res["requests"]["cpu"], cpu, "{case}");
            assert_eq!(
                res["limits"]["devices.kubevirt.io/kvm"].is_string(),
                kvm,
                "{case}"
            );
        }
    }

    #[test]
    fn the_cpu_request_is_vcpus_over_the_allocation_ratio_unless_the_vmi_sets_one() {
        let resources = |patch: serde_json::Value, ratio: u32| {
            let config = LauncherPodConfig {
                cpu_allocation_ratio: ratio,
                ..LauncherPodConfig::default()
            };
            render(&vmi(patch), &config)["spec"]["containers"][0]["resources"].clone()
        };
        let four = json!({"spec": {"domain": {"cpu": {"cores": 2, "sockets": 2}}}});
        // (case, vmi patch, ratio, cpu request, cpu limit)
        let cases = [
            (
                "4 vCPUs at the default ratio",
                four.clone(),
                10,
                json!("400m"),
                json!(null),
            ),
            (
                "4 vCPUs at ratio 1",
                four.clone(),
                1,
                json!("4"),
                json!(null),
            ),
            (
                "12 vCPUs at ratio 10",
                json!({"spec": {"domain": {"cpu": {"cores": 12}}}}),
                10,
                json!("1200m"),
                json!(null),
            ),
            (
                "1 vCPU at ratio 3, rounded up to nanocores",
                json!({}),
                3,
                json!("333333334n"),
                json!(null),
            ),
            (
                "IO threads count as CPUs",
                json!({"spec": {"domain": {"ioThreads": {"supplementalPoolThreadCount": 2}}}}),
                10,
                json!("300m"),
                json!(null),
            ),
            (
                "the VMI's request wins",
                json!({"spec": {"domain": {"resources": {"requests": {"cpu": "250m"}}}}}),
                10,
                json!("250m"),
                json!(null),
            ),
            (
                "dedicated CPUs are whole and limited",
                json!({"spec": {"domain": {"cpu": {"cores": 2, "dedicatedCpuPlacement": true}}}}),
                10,
                json!("2"),
                json!("2"),
            ),
        ];
        for (case, patch, ratio, request, limit) in cases {
            let res = resources(patch, ratio);
            assert_eq!(res["requests"]["cpu"], request, "{case}");
            assert_eq!(res["limits"]["cpu"], limit, "{case}");
        }
        assert_eq!(cpu_request_for(4, 0), None);
    }

    #[test]
    fn the_service_account_token_is_mounted_only_for_a_service_account_volume_or_istio() {
        let pod = |patch: serde_json::Value| render(&vmi(patch), &LauncherPodConfig::default());
        let plain = pod(json!({}));
        assert_eq!(plain["spec"]["automountServiceAccountToken"], false);
        assert_eq!(plain["spec"]["serviceAccountName"], json!(null));
        let with_sa = pod(json!({"spec": {"volumes": [
            {"name": "sa", "serviceAccount": {"serviceAccountName": "builder"}}
        ]}}));
        assert_eq!(with_sa["spec"]["automountServiceAccountToken"], true);
        assert_eq!(with_sa["spec"]["serviceAccountName"], "builder");
        let istio = pod(json!({"metadata": {"annotations": {"sidecar.istio.io/inject": "True"}}}));
        assert_eq!(istio["spec"]["automountServiceAccountToken"], true);
    }

    #[test]
    fn the_overhead_formula_is_fixed_plus_per_vcpu_plus_one_percent_plus_tcg() {
        assert_eq!(memory_overhead(0, 1, false), 42 * MIB);
        assert_eq!(memory_overhead(100 * MIB, 2, true), (40 + 4 + 1 + 32) * MIB);
        assert_eq!(
            memory_overhead(101, 1, false),
            43 * MIB,
            "rounded up to a whole MiB"
        );
    }

    #[test]
    fn long_names_are_shortened_with_a_hash_in_the_id_label() {
        let long = "a".repeat(70);
        let id = vmi_id_label(&long);
        assert_eq!(id.len(), 63);
        assert!(id.starts_with(&"a".repeat(54)));
        assert_eq!(&id[54..55], "-");
        assert!(id[55..].chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(vmi_id_label(&"b".repeat(63)), "b".repeat(63));
        let pod = render(
            &vmi(json!({"metadata": {"name": "web.example.com"}})),
            &LauncherPodConfig::default(),
        );
        assert_eq!(pod["metadata"]["labels"]["vm.kubevirt.io/name"], "web");
        assert_eq!(pod["spec"]["hostname"], "web");
    }

    #[test]
    fn skip_backup_hooks_masquerade_and_console_log_toggle_their_parts() {
        let pod = render(
            &vmi(json!({
                "metadata": {"annotations": {"kubevirt.io/skip-backup-hooks": "true", "sidecar.istio.io/inject": "true"}},
                "spec": {"domain": {"devices": {"logSerialConsole": false,
                    "interfaces": [{"name": "default", "masquerade": {}}]}}}
            })),
            &LauncherPodConfig::default(),
        );
        let annotations = &pod["metadata"]["annotations"];
        assert!(
            annotations
                .get("pre.hook.backup.velero.io/command")
                .is_none()
        );
        assert_eq!(
            annotations["traffic.sidecar.istio.io/kubevirtInterfaces"],
            "k6t-eth0"
        );
        assert_eq!(
            annotations["istio.io/reroute-virtual-interfaces"],
            "k6t-eth0"
        );
        assert_eq!(pod["metadata"]["labels"]["sidecar.istio.io/inject"], "true");
        assert_eq!(pod["spec"]["containers"].as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn the_kubevirt_crs_skip_backup_hooks_applies_to_new_pods_of_vmis_without_their_own() {
        let cluster_skips = LauncherPodConfig {
            cluster_skip_backup_hooks: Some("true".into()),
            ..LauncherPodConfig::default()
        };
        let hook = "pre.hook.backup.velero.io/command";
        let pod = render(&vmi(json!({})), &cluster_skips);
        assert!(pod["metadata"]["annotations"].get(hook).is_none());
        let own =
            vmi(json!({"metadata": {"annotations": {"kubevirt.io/skip-backup-hooks": "false"}}}));
        let pod = render(&own, &cluster_skips);
        assert!(
            pod["metadata"]["annotations"][hook].is_string(),
            "the VMI's value wins"
        );
        let pod = render(&vmi(json!({})), &LauncherPodConfig::default());
        assert!(pod["metadata"]["annotations"][hook].is_string());
    }

    #[test]
    fn the_test_annotations_turn_on_upstreams_launcher_flags() {
        let args = |annotations: serde_json::Value| {
            let pod = render(
                &vmi(json!({"metadata": {"annotations": annotations}})),
                &LauncherPodConfig::default(),
            );
            let args: Vec<String> =
                serde_json::from_value(pod["spec"]["containers"][0]["args"].clone()).unwrap();
            let flags = ["--keep-after-failure", "--simulate-crash"];
            args.into_iter()
                .filter(|a| flags.contains(&a.as_str()))
                .collect::<Vec<_>>()
        };
        assert!(args(json!({})).is_empty());
        assert_eq!(
            args(json!({"kubevirt.io/func-test-virt-launcher-fail-fast": ""})),
            ["--simulate-crash"]
        );
        assert_eq!(
            args(
                json!({"kubevirt.io/keep-launcher-alive-after-failure": "true",
                        "kubevirt.io/func-test-virt-launcher-fail-fast": "false"})
            ),
            ["--keep-after-failure", "--simulate-crash"]
        );
        // Upstream matches the key by prefix and the value by "" or a "true" prefix.
        assert_eq!(
            args(json!({"kubevirt.io/keep-launcher-alive-after-failure-x": ""})),
            ["--keep-after-failure"]
        );
        assert!(args(json!({"kubevirt.io/keep-launcher-alive-after-failure": "false"})).is_empty());
    }

    #[test]
    fn memory_quantities_parse_to_exact_bytes_rounded_up() {
        let cases = [
            ("1Gi", Some(1 << 30)),
            ("128M", Some(128_000_000)),
            ("1.5Ki", Some(1536)),
            ("1.1G", Some(1_100_000_000)),
            ("2e3", Some(2000)),
            ("100m", Some(1)),
            ("12", Some(12)),
            (" 12 ", Some(12)),
            ("-1", None),
            ("x", None),
            ("1Zi", None),
        ];
        for (text, bytes) in cases {
            let parsed = parse_bytes(&Quantity(text.to_owned())).ok();
            assert_eq!(parsed, bytes, "{text}");
        }
    }

    #[test]
    fn byte_counts_are_written_in_canonical_binary_si() {
        let cases = [
            (2090 * MIB, "2090Mi"),
            (3 << 30, "3Gi"),
            (1025, "1025"),
            (1536, "1536"),
            (2048, "2Ki"),
            (0, "0"),
        ];
        for (bytes, text) in cases {
            assert_eq!(bytes_quantity(bytes).0, text, "{bytes}");
        }
    }

    #[test]
    fn a_vmi_without_memory_or_uid_is_rejected() {
        let mut no_memory = vmi(json!({}));
        no_memory.spec.domain.memory = None;
        assert_eq!(
            render_launcher_pod(&no_memory, &LauncherPodConfig::default()).err(),
            Some(TemplateError::NoMemory)
        );
        let mut no_uid = vmi(json!({}));
        no_uid.metadata.uid = None;
        assert_eq!(
            render_launcher_pod(&no_uid, &LauncherPodConfig::default()).err(),
            Some(TemplateError::MissingMetadata("uid"))
        );
    }
}
