//! VMI defaults on CREATE, in upstream's order (`vmi-mutator.go`, `pkg/defaults`):
//! spec defaults (architecture, machine type, CPU request, guest memory, CPU topology, image pull
//! policies, eviction strategy, default pod network, a disk per volume), API defaults (firmware
//! UUID, features, timers, disks, inputs, probes), architecture defaults (disk bus `sata` and
//! watchdog action on amd64, CPU model), status memory and CPU topology, hotplug limits, then
//! annotations, finalizer and phase `Pending`.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kubevirt_api::constants::{
    LATEST_OBSERVED_API_VERSION_ANNOTATION, PCI_TOPOLOGY_VERSION_ANNOTATION,
    PCI_TOPOLOGY_VERSION_V3, STORAGE_OBSERVED_API_VERSION_ANNOTATION, VMI_FINALIZER,
};
use kubevirt_api::quantity::{Format, Quantity as ExactQuantity};
use kubevirt_api::v1::{
    Bootloader, CpuTopology, DEFAULT_CPU_MODEL, Disk, DiskBus, DiskTarget, Efi, Features, Firmware,
    Interface, InterfaceBindingMethod, InterfaceBridge, InterfaceMasquerade, Memory, MemoryStatus,
    Network, NetworkSource, PodNetwork, Probe, VirtualMachineInstance, VirtualMachineInstancePhase,
    VirtualMachineInstancePhaseTransitionTimestamp, VirtualMachineInstanceSpec,
    VirtualMachineInstanceStatus, WatchdogDetails,
};

use crate::config::{ClusterConfig, gates};

/// A default that cannot be applied; the request is refused with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DefaultsError {
    /// The cluster default binding is bridge, but bridge on the pod network is not permitted.
    #[error("bridge interface is not enabled in kubevirt-config")]
    BridgeNotPermitted,
    /// The cluster default binding is the discontinued slirp.
    #[error("slirp interface is deprecated as of v1.3")]
    SlirpDeprecated,
}

/// User ID of the non-root launcher.
pub const NON_ROOT_USER: u64 = 107;
const MAX_VCPUS: u32 = 512;

/// The value of an API quantity; `None` when it does not parse (validation reports that).
fn value_of(q: &Quantity) -> Option<ExactQuantity> {
    ExactQuantity::try_from(q).ok()
}

fn is_zero(q: Option<&Quantity>) -> bool {
    q.and_then(value_of).is_none_or(|q| q.is_zero())
}

/// Upstream's default CPU request, which is not written into the spec.
const DEFAULT_CPU_REQUEST: ExactQuantity =
    ExactQuantity::from_nano_value(100_000_000, Format::DecimalSi);

/// Spec defaults shared by VMIs and (on a copy) VM templates (`SetDefaultVirtualMachineInstanceSpec`).
///
/// # Errors
/// When the default pod interface cannot be created (see [`DefaultsError`]).
pub fn set_spec_defaults(
    cfg: &ClusterConfig,
    spec: &mut VirtualMachineInstanceSpec,
) -> Result<(), DefaultsError> {
    if spec.architecture.as_deref().unwrap_or("").is_empty() {
        spec.architecture = Some(cfg.default_architecture.clone());
    }
    let arch = spec.architecture.clone().unwrap_or_default();
    let machine = spec.domain.machine.get_or_insert_with(Default::default);
    if machine.type_.as_deref().unwrap_or("").is_empty() {
        machine.type_ = Some(cfg.machine_type_for(&arch));
    }
    set_resource_requests(cfg, spec);
    set_guest_memory(spec);
    set_cpu_topology(spec);
    for v in &mut spec.volumes {
        if let Some(cd) = v.volume_source.container_disk.as_mut()
            && cd.image_pull_policy.as_deref().unwrap_or("").is_empty()
        {
            let always = cd.image.ends_with(":latest") || !cd.image.contains([':', '@']);
            cd.image_pull_policy = Some(if always { "Always" } else { "IfNotPresent" }.into());
        }
    }
    if spec.eviction_strategy.is_none() {
        spec.eviction_strategy.clone_from(&cfg.eviction_strategy);
    }
    set_default_network(cfg, spec)?;
    let named: BTreeSet<String> = spec
        .domain
        .devices
        .disks
        .iter()
        .map(|d| d.name.clone())
        .chain(
            spec.domain
                .devices
                .filesystems
                .iter()
                .map(|f| f.name.clone()),
        )
        .collect();
    for v in &spec.volumes {
        if !named.contains(&v.name) {
            spec.domain.devices.disks.push(Disk {
                name: v.name.clone(),
                ..Disk::default()
            });
        }
    }
    Ok(())
}

fn set_resource_requests(cfg: &ClusterConfig, spec: &mut VirtualMachineInstanceSpec) {
    let dedicated = spec
        .domain
        .cpu
        .as_ref()
        .is_some_and(|c| c.dedicated_cpu_placement == Some(true));
    let was_unset = spec.domain.resources.is_none();
    let res = spec.domain.resources.get_or_insert_with(Default::default);
    if !is_zero(res.limits.get("cpu"))
        && is_zero(res.requests.get("cpu"))
        && let Some(l) = res.limits.get("cpu").cloned()
    {
        res.requests.insert("cpu".into(), l);
    }
    if value_of(&cfg.cpu_request) != Some(DEFAULT_CPU_REQUEST)
        && !res.requests.contains_key("cpu")
        && !dedicated
    {
        res.requests.insert("cpu".into(), cfg.cpu_request.clone());
    }
    if was_unset
        && res.requests.is_empty()
        && res.limits.is_empty()
        && res.overcommit_guest_overhead.is_none()
    {
        spec.domain.resources = None;
    }
}

fn set_guest_memory(spec: &mut VirtualMachineInstanceSpec) {
    let d = &mut spec.domain;
    if d.memory.as_ref().is_some_and(|m| m.guest.is_some()) {
        return;
    }
    let req = d
        .resources
        .as_ref()
        .and_then(|r| r.requests.get("memory"))
        .filter(|q| !is_zero(Some(q)))
        .cloned();
    let lim = d
        .resources
        .as_ref()
        .and_then(|r| r.limits.get("memory"))
        .filter(|q| !is_zero(Some(q)))
        .cloned();
    let mem = d.memory.get_or_insert_with(Memory::default);
    mem.guest = req.or(lim).or_else(|| {
        mem.hugepages
            .as_ref()
            .and_then(|h| h.page_size.clone())
            .filter(|p| ExactQuantity::parse(p).is_ok())
            .map(Quantity)
    });
}

fn set_cpu_topology(spec: &mut VirtualMachineInstanceSpec) {
    let d = &mut spec.domain;
    let unset = d.cpu.as_ref().is_none_or(|c| {
        c.cores.unwrap_or(0) == 0 && c.sockets.unwrap_or(0) == 0 && c.threads.unwrap_or(0) == 0
    });
    if !unset {
        return;
    }
    let value = |limits: bool| {
        d.resources
            .as_ref()
            .and_then(|r| {
                if limits {
                    r.limits.get("cpu")
                } else {
                    r.requests.get("cpu")
                }
            })
            .map(|q| value_of(q).map_or(0, |q| q.value()))
    };
    let sockets = value(true).or_else(|| value(false)).unwrap_or(1);
    let cpu = d.cpu.get_or_insert_with(Default::default);
    cpu.sockets = Some(u32::try_from(sockets.max(0)).unwrap_or(u32::MAX));
    cpu.cores = Some(1);
    cpu.threads = Some(1);
}

fn set_default_network(
    cfg: &ClusterConfig,
    spec: &mut VirtualMachineInstanceSpec,
) -> Result<(), DefaultsError> {
    let dev = &mut spec.domain.devices;
    if dev.autoattach_pod_interface == Some(false)
        || !spec.networks.is_empty()
        || !dev.interfaces.is_empty()
    {
        return Ok(());
    }
    let binding = match cfg.default_network_interface.as_str() {
        "bridge" if !cfg.permit_bridge_interface_on_pod_network => {
            return Err(DefaultsError::BridgeNotPermitted);
        }
        "bridge" => Some(InterfaceBindingMethod {
            bridge: Some(InterfaceBridge {}),
            ..Default::default()
        }),
        "masquerade" => Some(InterfaceBindingMethod {
            masquerade: Some(InterfaceMasquerade {}),
            ..Default::default()
        }),
        "slirp" => return Err(DefaultsError::SlirpDeprecated),
        _ => None,
    };
    if let Some(binding_method) = binding {
        dev.interfaces = vec![Interface {
            name: "default".into(),
            binding_method,
            ..Interface::default()
        }];
    }
    spec.networks = vec![Network {
        name: "default".into(),
        network_source: NetworkSource {
            pod: Some(PodNetwork::default()),
            ..NetworkSource::default()
        },
    }];
    Ok(())
}

fn enable(flag: &mut Option<bool>) {
    if flag.is_none() {
        *flag = Some(true);
    }
}

/// API defaults of `core/v1/defaults.go` (timers, feature states, disks, inputs, probes,
/// firmware UUID).
fn set_api_defaults(spec: &mut VirtualMachineInstanceSpec) {
    let d = &mut spec.domain;
    let fw = d.firmware.get_or_insert_with(Firmware::default);
    if fw.uuid.as_deref().unwrap_or("").is_empty() {
        fw.uuid = Some(uuid::Uuid::new_v4().to_string());
    }
    let features = d.features.get_or_insert_with(Features::default);
    for f in [
        &mut features.acpi,
        &mut features.smm,
        &mut features.pvspinlock,
    ]
    .into_iter()
    .flatten()
    {
        enable(&mut f.enabled);
    }
    if let Some(a) = &mut features.apic {
        enable(&mut a.enabled);
    }
    if let Some(h) = &mut features.hyperv {
        set_hyperv_defaults(h);
    }
    if let Some(t) = d.clock.as_mut().and_then(|c| c.timer.as_mut()) {
        if let Some(x) = &mut t.hpet {
            enable(&mut x.present);
        }
        if let Some(x) = &mut t.pit {
            enable(&mut x.present);
        }
        if let Some(x) = &mut t.rtc {
            enable(&mut x.present);
        }
        if let Some(x) = &mut t.kvm {
            enable(&mut x.present);
        }
        if let Some(x) = &mut t.hyperv {
            enable(&mut x.present);
        }
    }
    for disk in &mut d.devices.disks {
        if disk.disk.is_none() && disk.cdrom.is_none() && disk.lun.is_none() {
            disk.disk = Some(DiskTarget::default());
        }
        if let Some(cd) = &mut disk.cdrom {
            enable(&mut cd.readonly);
            if cd.tray.as_deref().unwrap_or("").is_empty() {
                cd.tray = Some("closed".into());
            }
        }
    }
    for input in &mut d.devices.inputs {
        if input.bus.as_deref().unwrap_or("").is_empty() {
            input.bus = Some("usb".into());
        }
        if input.type_.as_deref().unwrap_or("").is_empty() {
            input.type_ = Some("tablet".into());
        }
    }
    for probe in [&mut spec.readiness_probe, &mut spec.liveness_probe]
        .into_iter()
        .flatten()
    {
        set_probe_defaults(probe);
    }
}

fn set_hyperv_defaults(h: &mut kubevirt_api::v1::FeatureHyperv) {
    for f in [
        &mut h.relaxed,
        &mut h.vapic,
        &mut h.vpindex,
        &mut h.runtime,
        &mut h.synic,
        &mut h.reset,
        &mut h.frequencies,
        &mut h.reenlightenment,
        &mut h.ipi,
        &mut h.evmcs,
    ]
    .into_iter()
    .flatten()
    {
        enable(&mut f.enabled);
    }
    if let Some(s) = &mut h.spinlocks {
        enable(&mut s.enabled);
        if s.enabled == Some(true) && s.spinlocks.is_none() {
            s.spinlocks = Some(4096);
        }
    }
    if let Some(t) = &mut h.synictimer {
        enable(&mut t.enabled);
        if let Some(direct) = &mut t.direct {
            enable(&mut direct.enabled);
        }
    }
    if let Some(v) = &mut h.vendorid {
        enable(&mut v.enabled);
    }
    if let Some(t) = &mut h.tlbflush {
        enable(&mut t.enabled);
        for f in [&mut t.direct, &mut t.extended].into_iter().flatten() {
            enable(&mut f.enabled);
        }
    }
}

fn set_probe_defaults(p: &mut Probe) {
    for (v, default) in [
        (&mut p.timeout_seconds, 1),
        (&mut p.period_seconds, 10),
        (&mut p.success_threshold, 1),
        (&mut p.failure_threshold, 3),
    ] {
        if v.unwrap_or(0) < 1 {
            *v = Some(default);
        }
    }
}

/// HyperV enlightenments that others depend on (`SetHypervFeatureDependencies`).
fn set_hyperv_dependencies(spec: &mut VirtualMachineInstanceSpec) {
    let Some(h) = spec
        .domain
        .features
        .as_mut()
        .and_then(|f| f.hyperv.as_mut())
    else {
        return;
    };
    let on = |f: &Option<kubevirt_api::v1::FeatureState>| {
        f.as_ref().is_some_and(|s| s.enabled != Some(false))
    };
    let needs_vpindex = on(&h.synic)
        || h.synictimer
            .as_ref()
            .is_some_and(|t| t.enabled != Some(false))
        || on(&h.ipi)
        || h.tlbflush
            .as_ref()
            .is_some_and(|t| t.enabled != Some(false));
    let needs_synic = h
        .synictimer
        .as_ref()
        .is_some_and(|t| t.enabled != Some(false));
    if needs_synic && h.synic.is_none() {
        h.synic = Some(kubevirt_api::v1::FeatureState {
            enabled: Some(true),
        });
    }
    if needs_vpindex && h.vpindex.is_none() {
        h.vpindex = Some(kubevirt_api::v1::FeatureState {
            enabled: Some(true),
        });
    }
}

fn set_arch_defaults(cfg: &ClusterConfig, spec: &mut VirtualMachineInstanceSpec) {
    let arch = spec.architecture.clone().unwrap_or_default();
    let d = &mut spec.domain;
    let bus = if arch == "arm64" || arch == "s390x" {
        DiskBus::Virtio
    } else {
        DiskBus::Sata
    };
    for disk in &mut d.devices.disks {
        for b in [
            disk.disk.as_mut().map(|t| &mut t.bus),
            disk.cdrom.as_mut().map(|t| &mut t.bus),
            disk.lun.as_mut().map(|t| &mut t.bus),
        ]
        .into_iter()
        .flatten()
        {
            if b.as_ref().is_none_or(|b| b.as_str().is_empty()) {
                *b = Some(bus.clone());
            }
        }
    }
    let cpu = d.cpu.get_or_insert_with(Default::default);
    if arch == "arm64" {
        let fw = d.firmware.get_or_insert_with(Firmware::default);
        let bl = fw.bootloader.get_or_insert_with(Bootloader::default);
        if bl.bios.is_none() && bl.efi.is_none() {
            bl.efi = Some(Efi {
                secure_boot: Some(false),
                persistent: None,
            });
        }
        if cpu.model.as_deref().unwrap_or("").is_empty() {
            cpu.model = Some(kubevirt_api::v1::CPU_MODEL_HOST_PASSTHROUGH.into());
        }
    } else if arch != "s390x"
        && let Some(w) = &mut d.devices.watchdog
    {
        let i = w.i6300esb.get_or_insert_with(WatchdogDetails::default);
        if i.action.as_deref().unwrap_or("").is_empty() {
            i.action = Some("reset".into());
        }
    }
    if cpu.model.as_deref().unwrap_or("").is_empty() {
        cpu.model = Some(
            cfg.cpu_model
                .clone()
                .unwrap_or_else(|| DEFAULT_CPU_MODEL.into()),
        );
    }
}

fn setup_hotplug(cfg: &ClusterConfig, spec: &mut VirtualMachineInstanceSpec) {
    if !cfg.live_update() || spec.architecture.as_deref() == Some("arm64") {
        return;
    }
    if let Some(cpu) = &mut spec.domain.cpu {
        let (sockets, cores, threads) = (
            cpu.sockets.unwrap_or(0),
            cpu.cores.unwrap_or(0),
            cpu.threads.unwrap_or(0),
        );
        if cpu.max_sockets.unwrap_or(0) == 0 {
            let mut max = cfg.max_cpu_sockets;
            if max != 0 && sockets > max {
                max = sockets;
            }
            if max == 0 {
                max = sockets.saturating_mul(cfg.max_hotplug_ratio);
                let per_socket = cores.max(1).saturating_mul(threads.max(1));
                if max.saturating_mul(per_socket) > MAX_VCPUS {
                    max = (MAX_VCPUS / per_socket).max(sockets);
                }
            }
            cpu.max_sockets = Some(max);
        }
    }
    let Some(mem) = &spec.domain.memory else {
        return;
    };
    if mem.max_guest.is_some() {
        return;
    }
    let max = cfg.max_guest.clone().or_else(|| {
        let guest = mem.guest.as_ref().and_then(value_of)?.value();
        let max = guest.checked_mul(i128::from(cfg.max_hotplug_ratio))?;
        ExactQuantity::from_value(max, Format::BinarySi)
            .ok()
            .map(Quantity::from)
    });
    if kubevirt_api::live_update::memory_hotplug_error(spec, max.as_ref()).is_none()
        && let Some(m) = &mut spec.domain.memory
    {
        m.max_guest = max;
    }
}

/// Applies every CREATE default to `vmi`, in upstream's order.
///
/// # Errors
/// When the default pod interface cannot be created (see [`DefaultsError`]).
pub fn mutate_vmi_create(
    vmi: &mut VirtualMachineInstance,
    cfg: &ClusterConfig,
) -> Result<(), DefaultsError> {
    set_spec_defaults(cfg, &mut vmi.spec)?;
    set_api_defaults(&mut vmi.spec);
    set_hyperv_dependencies(&mut vmi.spec);
    set_arch_defaults(cfg, &mut vmi.spec);
    let status = vmi
        .status
        .get_or_insert_with(VirtualMachineInstanceStatus::default);
    if let Some(guest) = vmi
        .spec
        .domain
        .memory
        .as_ref()
        .and_then(|m| m.guest.clone())
    {
        status.memory = Some(MemoryStatus {
            guest_at_boot: Some(guest.clone()),
            guest_current: Some(guest.clone()),
            guest_requested: Some(guest),
            memory_overhead: None,
        });
    }
    if let (Some(cpu), None) = (&vmi.spec.domain.cpu, &status.current_cpu_topology) {
        status.current_cpu_topology = Some(CpuTopology {
            cores: cpu.cores,
            sockets: cpu.sockets,
            threads: cpu.threads,
        });
    }
    setup_hotplug(cfg, &mut vmi.spec);

    let arch = vmi.spec.architecture.clone().unwrap_or_default();
    let machine = vmi
        .spec
        .domain
        .machine
        .as_ref()
        .and_then(|m| m.type_.clone())
        .unwrap_or_default();
    let annotations = vmi
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    if matches!(arch.as_str(), "" | "amd64" | "arm64")
        && (machine.contains("q35") || machine.starts_with("virt"))
    {
        annotations
            .entry(PCI_TOPOLOGY_VERSION_ANNOTATION.into())
            .or_insert_with(|| PCI_TOPOLOGY_VERSION_V3.into());
    }
    annotations.insert(LATEST_OBSERVED_API_VERSION_ANNOTATION.into(), "v1".into());
    annotations.insert(STORAGE_OBSERVED_API_VERSION_ANNOTATION.into(), "v1".into());
    let status = vmi
        .status
        .get_or_insert_with(VirtualMachineInstanceStatus::default);
    if !cfg.gate(gates::ROOT) {
        status.runtime_user = NON_ROOT_USER;
    }
    let finalizers = vmi.metadata.finalizers.get_or_insert_with(Vec::new);
    if !finalizers.iter().any(|f| f == VMI_FINALIZER) {
        finalizers.push(VMI_FINALIZER.into());
    }
    status.phase = Some(VirtualMachineInstancePhase::Pending);
    status
        .phase_transition_timestamps
        .push(VirtualMachineInstancePhaseTransitionTimestamp {
            phase: Some(VirtualMachineInstancePhase::Pending),
            phase_transition_timestamp: Some(Time(jiff::Timestamp::now())),
        });
    Ok(())
}
