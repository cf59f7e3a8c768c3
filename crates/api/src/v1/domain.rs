//! The domain of a VMI (`spec.domain`): resources, CPU, memory, machine, firmware, clock and
//! hypervisor features. Devices live in [`super::devices`].

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::devices::Devices;
use crate::string_enum::string_enum;

/// CPU model that passes the host CPU through unchanged.
pub const CPU_MODEL_HOST_PASSTHROUGH: &str = "host-passthrough";
/// CPU model that copies the host CPU model and features.
pub const CPU_MODEL_HOST_MODEL: &str = "host-model";
/// The CPU model used when none is configured.
pub const DEFAULT_CPU_MODEL: &str = CPU_MODEL_HOST_MODEL;

string_enum! {
    /// How IO threads are allocated to disks.
    pub enum IoThreadsPolicy {
        /// One IO thread shared by all disks (besides dedicated ones).
        Shared = "shared",
        /// A pool of IO threads assigned round-robin.
        Auto = "auto",
        /// A supplemental pool sized by `ioThreads.supplementalPoolThreadCount`.
        SupplementalPool = "supplementalPool",
    }
}

string_enum! {
    /// What happens when the guest reboots.
    pub enum RebootPolicy {
        /// The guest reboots silently.
        Reboot = "Reboot",
        /// The VMI terminates, letting a VM controller recreate it.
        Terminate = "Terminate",
    }
}

string_enum! {
    /// Whether the memlock rlimit must account for guest memory.
    pub enum MemLockRequirement {
        /// The rlimit is not raised.
        NotRequired = "NotRequired",
        /// The rlimit covers guest memory and overhead.
        Required = "Required",
    }
}

/// The virtual hardware of a VMI (`spec.domain`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DomainSpec {
    /// Compute resources requested for the VMI.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// CPU topology and model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    /// Guest memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    /// Emulated machine type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine: Option<Machine>,
    /// Firmware (UUID, bootloader, serial, kernel boot, ACPI tables).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub firmware: Option<Firmware>,
    /// Guest clock and timers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock: Option<Clock>,
    /// Hypervisor features (ACPI, APIC, Hyper-V, SMM, KVM).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub features: Option<Features>,
    /// Devices of the domain.
    pub devices: Devices,
    /// How IO threads are allocated (`shared`, `auto`, `supplementalPool`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io_threads_policy: Option<IoThreadsPolicy>,
    /// IO thread settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io_threads: Option<DiskIoThreads>,
    /// SMBIOS chassis information.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chassis: Option<Chassis>,
    /// Confidential computing (SEV, SNP, TDX).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launch_security: Option<LaunchSecurity>,
    /// Behaviour on guest reboot (`Reboot` or `Terminate`).
    #[schemars(extend("enum" = ["Reboot", "Terminate"]))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reboot_policy: Option<RebootPolicy>,
}

/// Resources of a VMI: `requests`, `limits` and `overcommitGuestOverhead`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRequirements {
    /// Minimum resources required.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, Quantity>,
    /// Maximum resources allowed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, Quantity>,
    /// Do not request the guest overhead memory on top of the requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overcommit_guest_overhead: Option<bool>,
}

/// CPU topology, model and placement.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cpu {
    /// Cores per socket.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    /// Sockets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sockets: Option<u32>,
    /// Upper bound of sockets for CPU hotplug.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sockets: Option<u32>,
    /// Threads per core.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// CPU model; `host-model` and `host-passthrough` are special values.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// CPU features to add or remove.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<CpuFeature>,
    /// Pin vCPUs to dedicated host CPUs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dedicated_cpu_placement: Option<bool>,
    /// NUMA topology of the guest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa: Option<Numa>,
    /// Give the emulator thread its own dedicated CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isolate_emulator_thread: Option<bool>,
    /// Realtime tuning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub realtime: Option<Realtime>,
}

/// A CPU feature and its policy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CpuFeature {
    /// Feature name.
    pub name: String,
    /// One of `force`, `require`, `optional`, `disable`, `forbid` (empty means `require`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
}

/// Guest NUMA topology.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Numa {
    /// Mirror the host NUMA topology of the pinned CPUs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_mapping_passthrough: Option<NumaGuestMappingPassthrough>,
}

/// Marker: map the guest NUMA topology from the host.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NumaGuestMappingPassthrough {}

/// Realtime tuning of vCPUs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Realtime {
    /// vCPUs that get realtime scheduling.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mask: Option<String>,
}

/// Guest memory.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Memory {
    /// Back memory with huge pages.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hugepages: Option<Hugepages>,
    /// Memory visible to the guest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest: Option<Quantity>,
    /// Upper bound for memory hotplug.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_guest: Option<Quantity>,
    /// Extra overhead reserved for the VMI.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved_overhead: Option<ReservedOverhead>,
}

/// Huge page settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hugepages {
    /// Huge page size, e.g. `2Mi` or `1Gi`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_size: Option<String>,
}

/// Extra memory overhead reservation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReservedOverhead {
    /// Memory added to the computed overhead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub added_overhead: Option<Quantity>,
    /// Whether memlock rlimits must account for the VM (`Required` or `NotRequired`).
    #[schemars(extend("enum" = ["NotRequired", "Required"]))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem_lock: Option<MemLockRequirement>,
}

/// Emulated machine type.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Machine {
    /// Machine type, e.g. `q35`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
}

/// Firmware of the domain.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Firmware {
    /// SMBIOS UUID of the guest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// BIOS or EFI.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bootloader: Option<Bootloader>,
    /// SMBIOS serial number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// Boot a kernel and initrd directly.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_boot: Option<KernelBoot>,
    /// Extra ACPI tables.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acpi: Option<Acpi>,
}

/// Bootloader selection: `bios` or `efi`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Bootloader {
    /// Legacy BIOS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bios: Option<Bios>,
    /// UEFI.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub efi: Option<Efi>,
}

/// Legacy BIOS settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Bios {
    /// Show BIOS output on the serial console.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_serial: Option<bool>,
}

/// UEFI settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Efi {
    /// Enable Secure Boot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secure_boot: Option<bool>,
    /// Keep the EFI variable store across reboots.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent: Option<bool>,
}

/// Direct kernel boot.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelBoot {
    /// Kernel command line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_args: Option<String>,
    /// Image holding the kernel and initrd.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<KernelBootContainer>,
}

/// Container image with a kernel and initrd.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelBootContainer {
    /// Image reference.
    pub image: String,
    /// Pull secret name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_secret: Option<String>,
    /// Pull policy (`Always`, `Never`, `IfNotPresent`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// Path of the kernel inside the image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_path: Option<String>,
    /// Path of the initrd inside the image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initrd_path: Option<String>,
}

/// Extra ACPI tables taken from volumes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Acpi {
    /// Volume holding the SLIC table.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slic_name_ref: Option<String>,
    /// Volume holding the MSDM table.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub msdm_name_ref: Option<String>,
}

/// Guest clock: an offset (`utc` or `timezone`) and timers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Clock {
    /// Guest clock is UTC plus an offset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub utc: Option<ClockOffsetUtc>,
    /// Guest clock follows this time zone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// Timers exposed to the guest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timer: Option<Timer>,
}

/// UTC clock offset.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClockOffsetUtc {
    /// Offset in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset_seconds: Option<i64>,
}

/// Timers exposed to the guest.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Timer {
    /// HPET timer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hpet: Option<HpetTimer>,
    /// KVM paravirtual clock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kvm: Option<KvmTimer>,
    /// PIT timer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pit: Option<PitTimer>,
    /// RTC timer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rtc: Option<RtcTimer>,
    /// Hyper-V reference time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hyperv: Option<HypervTimer>,
}

/// HPET timer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HpetTimer {
    /// `delay`, `catchup`, `merge` or `discard`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tick_policy: Option<String>,
    /// Whether the timer is present (defaults to true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub present: Option<bool>,
}

/// PIT timer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PitTimer {
    /// `delay`, `catchup` or `discard`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tick_policy: Option<String>,
    /// Whether the timer is present (defaults to true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub present: Option<bool>,
}

/// RTC timer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RtcTimer {
    /// `delay` or `catchup`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tick_policy: Option<String>,
    /// Whether the timer is present (defaults to true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub present: Option<bool>,
    /// `guest` or `wall`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub track: Option<String>,
}

/// KVM paravirtual clock.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KvmTimer {
    /// Whether the timer is present (defaults to true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub present: Option<bool>,
}

/// Hyper-V reference time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HypervTimer {
    /// Whether the timer is present (defaults to true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub present: Option<bool>,
}

/// Hypervisor features of the domain.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Features {
    /// ACPI.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acpi: Option<FeatureState>,
    /// APIC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub apic: Option<FeatureApic>,
    /// Enable every Hyper-V enlightenment the host supports.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hyperv_passthrough: Option<HypervPassthrough>,
    /// Individual Hyper-V enlightenments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hyperv: Option<FeatureHyperv>,
    /// System management mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub smm: Option<FeatureState>,
    /// KVM features.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kvm: Option<FeatureKvm>,
    /// Paravirtual spinlocks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pvspinlock: Option<FeatureState>,
}

/// An on/off feature; `enabled` defaults to true when the struct is present.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FeatureState {
    /// Whether the feature is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// APIC feature.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FeatureApic {
    /// Whether the feature is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Paravirtual end of interrupt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_of_interrupt: Option<bool>,
}

/// Hyper-V passthrough.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HypervPassthrough {
    /// Whether the feature is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// Hyper-V enlightenments.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FeatureHyperv {
    /// Relaxed timing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relaxed: Option<FeatureState>,
    /// Virtual APIC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vapic: Option<FeatureState>,
    /// Spinlock retries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spinlocks: Option<FeatureSpinlocks>,
    /// Virtual processor index.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vpindex: Option<FeatureState>,
    /// Processor time accounting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<FeatureState>,
    /// Synthetic interrupt controller.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub synic: Option<FeatureState>,
    /// Synthetic timers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub synictimer: Option<SyNicTimer>,
    /// Hypervisor reset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reset: Option<FeatureState>,
    /// Hypervisor vendor id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vendorid: Option<FeatureVendorId>,
    /// Frequency MSRs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frequencies: Option<FeatureState>,
    /// Re-enlightenment on migration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reenlightenment: Option<FeatureState>,
    /// Paravirtual TLB flush.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tlbflush: Option<TlbFlush>,
    /// Paravirtual IPIs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipi: Option<FeatureState>,
    /// Enlightened VMCS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evmcs: Option<FeatureState>,
}

/// Hyper-V spinlocks.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FeatureSpinlocks {
    /// Whether the feature is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Retries before notifying the hypervisor (defaults to 4096).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spinlocks: Option<u32>,
}

/// Hyper-V synthetic timers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyNicTimer {
    /// Whether the feature is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Direct mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct: Option<FeatureState>,
}

/// Hyper-V vendor id.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FeatureVendorId {
    /// Whether the feature is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// The vendor id string.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vendorid: Option<String>,
}

/// Hyper-V TLB flush.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlbFlush {
    /// Whether the feature is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Direct mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct: Option<FeatureState>,
    /// Extended mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extended: Option<FeatureState>,
}

/// KVM features.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FeatureKvm {
    /// Hide the KVM signature from the guest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden: Option<bool>,
}

/// IO thread settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskIoThreads {
    /// Size of the supplemental IO thread pool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub supplemental_pool_thread_count: Option<u32>,
}

/// SMBIOS chassis information.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Chassis {
    /// Manufacturer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manufacturer: Option<String>,
    /// Version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Serial number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// Asset tag.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asset: Option<String>,
    /// SKU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sku: Option<String>,
}

/// Confidential computing settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LaunchSecurity {
    /// AMD SEV.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sev: Option<Sev>,
    /// AMD SEV-SNP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snp: Option<SevSnp>,
    /// Intel TDX.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tdx: Option<Tdx>,
}

/// AMD SEV.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Sev {
    /// Guest policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<SevPolicy>,
    /// Request attestation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attestation: Option<SevAttestation>,
    /// Session blob.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Guest owner DH certificate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dh_cert: Option<String>,
}

/// SEV guest policy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SevPolicy {
    /// SEV-ES.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encrypted_state: Option<bool>,
}

/// Marker: SEV attestation requested.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SevAttestation {}

/// Marker: AMD SEV-SNP.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SevSnp {}

/// Marker: Intel TDX.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Tdx {}
