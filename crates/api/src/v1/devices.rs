//! Devices of a domain (`spec.domain.devices`): disks, inputs, GPUs, host devices, filesystems,
//! watchdog, TPM and the autoattach switches. Network interfaces live in [`super::network`].

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::domain::FeatureState;
use super::network::Interface;
use crate::string_enum::string_enum;

string_enum! {
    /// Bus of a disk, LUN or cdrom. IDE is rejected by validation.
    pub enum DiskBus {
        /// virtio-blk.
        Virtio = "virtio",
        /// virtio-scsi.
        Scsi = "scsi",
        /// SATA (AHCI).
        Sata = "sata",
        /// USB storage.
        Usb = "usb",
    }
}

string_enum! {
    /// Host page cache mode of a disk.
    pub enum DriverCache {
        /// No host cache (O_DIRECT).
        None = "none",
        /// Write-through cache.
        WriteThrough = "writethrough",
        /// Write-back cache.
        WriteBack = "writeback",
    }
}

string_enum! {
    /// IO mode of a disk.
    pub enum DriverIo {
        /// User-space thread pool.
        Threads = "threads",
        /// Linux native AIO.
        Native = "native",
    }
}

string_enum! {
    /// What the hypervisor does on a disk IO error.
    pub enum DiskErrorPolicy {
        /// Pause the guest.
        Stop = "stop",
        /// Ignore the error.
        Ignore = "ignore",
        /// Report the error to the guest.
        Report = "report",
        /// Pause only on ENOSPC.
        Enospace = "enospace",
    }
}

/// The disk target of a disk: which of `disk`, `lun` or `cdrom` is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskKind {
    /// `disk`.
    Disk,
    /// `lun`.
    Lun,
    /// `cdrom`.
    CdRom,
}

impl Disk {
    /// The target kinds set on this disk, in `disk`, `lun`, `cdrom` order. Valid disks have at
    /// most one; the defaults turn zero into `disk`.
    #[must_use]
    pub fn kinds(&self) -> Vec<DiskKind> {
        let mut kinds = Vec::new();
        if self.disk.is_some() {
            kinds.push(DiskKind::Disk);
        }
        if self.lun.is_some() {
            kinds.push(DiskKind::Lun);
        }
        if self.cdrom.is_some() {
            kinds.push(DiskKind::CdRom);
        }
        kinds
    }
}

/// The devices of a domain (`spec.domain.devices`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Devices {
    /// Use virtio-transitional devices, for older guests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_virtio_transitional: Option<bool>,
    /// Disable hotplug of disks and interfaces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_hotplug: Option<bool>,
    /// Disks, cdroms and LUNs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<Disk>,
    /// A watchdog device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watchdog: Option<Watchdog>,
    /// Network interfaces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    /// Input devices.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<Input>,
    /// Attach a default pod network interface (defaults to true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoattach_pod_interface: Option<bool>,
    /// Attach a VGA device and VNC (defaults to true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoattach_graphics_device: Option<bool>,
    /// Attach a serial console (defaults to true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoattach_serial_console: Option<bool>,
    /// Log the serial console to a sidecar container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_serial_console: Option<bool>,
    /// Attach a memory balloon (defaults to true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoattach_mem_balloon: Option<bool>,
    /// Attach an input device for the graphics console.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoattach_input_device: Option<bool>,
    /// Attach a VSOCK device.
    #[serde(rename = "autoattachVSOCK", skip_serializing_if = "Option::is_none")]
    pub autoattach_vsock: Option<bool>,
    /// A virtio RNG device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rng: Option<Rng>,
    /// Multi-queue for block devices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_multi_queue: Option<bool>,
    /// Multi-queue for virtio-net (JSON name has a lower-case `q`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_interface_multiqueue: Option<bool>,
    /// GPUs passed through.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<Gpu>,
    /// A virtio-serial port for downward metrics.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub downward_metrics: Option<DownwardMetrics>,
    /// Panic notifiers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub panic_devices: Vec<PanicDevice>,
    /// virtiofs filesystems.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filesystems: Vec<Filesystem>,
    /// Host devices passed through.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_devices: Vec<HostDevice>,
    /// USB redirection from the client.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_passthrough: Option<ClientPassthroughDevices>,
    /// A sound device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sound: Option<SoundDevice>,
    /// An emulated TPM.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tpm: Option<TpmDevice>,
    /// The video device type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub video: Option<VideoDevice>,
}

/// A disk attached to the domain: exactly one of `disk`, `lun` or `cdrom`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Disk {
    /// Name; matches a volume.
    pub name: String,
    /// Attach as a disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskTarget>,
    /// Attach as a LUN.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lun: Option<LunTarget>,
    /// Attach as a cdrom.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cdrom: Option<CdRomTarget>,
    /// Boot order; lower boots first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_order: Option<u32>,
    /// Serial number shown to the guest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// Give this disk its own IO thread.
    #[serde(rename = "dedicatedIOThread", skip_serializing_if = "Option::is_none")]
    pub dedicated_io_thread: Option<bool>,
    /// `none`, `writethrough` or `writeback`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<DriverCache>,
    /// `threads` or `native`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io: Option<DriverIo>,
    /// Tag exposed through device metadata.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Logical and physical block size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size: Option<BlockSize>,
    /// The disk may be shared between VMIs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shareable: Option<bool>,
    /// `stop`, `ignore`, `report` or `enospace`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_policy: Option<DiskErrorPolicy>,
    /// Track changed blocks for incremental backup.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed_block_tracking: Option<bool>,
}

/// A disk target.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskTarget {
    /// `virtio`, `scsi`, `sata` or `usb`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bus: Option<DiskBus>,
    /// Read-only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readonly: Option<bool>,
    /// PCI address, e.g. `0000:81:01.10`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
}

/// A LUN target.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LunTarget {
    /// Bus.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bus: Option<DiskBus>,
    /// Read-only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readonly: Option<bool>,
    /// Allow SCSI persistent reservations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation: Option<bool>,
}

/// A cdrom target.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CdRomTarget {
    /// Bus.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bus: Option<DiskBus>,
    /// Read-only (defaults to true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readonly: Option<bool>,
    /// `open` or `closed` (defaults to `closed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tray: Option<String>,
}

/// Block size of a disk: `custom` or `matchVolume`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockSize {
    /// Explicit sizes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub custom: Option<CustomBlockSize>,
    /// Take the sizes from the volume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub match_volume: Option<FeatureState>,
}

/// Explicit block sizes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CustomBlockSize {
    /// Logical block size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logical: Option<u32>,
    /// Physical block size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub physical: Option<u32>,
    /// Discard granularity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discard_granularity: Option<u32>,
}

/// A watchdog device: `i6300esb` or `diag288`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Watchdog {
    /// Name.
    pub name: String,
    /// Intel 6300ESB watchdog (x86).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub i6300esb: Option<WatchdogDetails>,
    /// diag288 watchdog (s390x).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diag288: Option<WatchdogDetails>,
}

/// Watchdog settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WatchdogDetails {
    /// `poweroff`, `reset` or `shutdown`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
}

/// An input device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Input {
    /// `usb` or `virtio` (defaults to `usb`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bus: Option<String>,
    /// `tablet` or `keyboard` (defaults to `tablet`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// Name.
    pub name: String,
}

/// Marker: a virtio RNG device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rng {}

/// Marker: a downward metrics virtio-serial port.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DownwardMetrics {}

/// Marker: USB redirection from the client.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientPassthroughDevices {}

/// A GPU: `deviceName`, or a DRA claim (`claimName` + `requestName`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// Name.
    pub name: String,
    /// Resource name of the device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
    /// DRA claim name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// DRA request name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_name: Option<String>,
    /// vGPU display options.
    #[serde(rename = "virtualGPUOptions", skip_serializing_if = "Option::is_none")]
    pub virtual_gpu_options: Option<VgpuOptions>,
    /// Tag exposed through device metadata.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// vGPU options.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VgpuOptions {
    /// Display options.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub display: Option<VgpuDisplayOptions>,
}

/// vGPU display options.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VgpuDisplayOptions {
    /// Use the vGPU as a display.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Enable a ramfb boot display.
    #[serde(rename = "ramFB", skip_serializing_if = "Option::is_none")]
    pub ram_fb: Option<FeatureState>,
}

/// A host device: `deviceName`, or a DRA claim (`claimName` + `requestName`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostDevice {
    /// Name.
    pub name: String,
    /// Resource name of the device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
    /// DRA claim name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// DRA request name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_name: Option<String>,
    /// Tag exposed through device metadata.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// A panic notifier.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PanicDevice {
    /// `hyperv`, `isa` or `pvpanic`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// A filesystem shared with the guest.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Filesystem {
    /// Name; matches a volume.
    pub name: String,
    /// virtiofs transport.
    pub virtiofs: FilesystemVirtiofs,
}

/// Marker: virtiofs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FilesystemVirtiofs {}

/// A sound device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SoundDevice {
    /// Name.
    pub name: String,
    /// `ich9` or `ac97`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// An emulated TPM.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TpmDevice {
    /// Whether the TPM is present (defaults to true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Keep TPM state across restarts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent: Option<bool>,
}

/// The video device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VideoDevice {
    /// Video device type, e.g. `virtio`, `vga`, `bochs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
}
