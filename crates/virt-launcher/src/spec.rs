//! The launcher spec: everything virt-handler tells a launcher about one VMI.
//!
//! virt-handler builds a [`LauncherSpec`] from the VMI (`kubevirt.io/v1`) and sends it as
//! JSON in the `sync` command of the launcher protocol; [`crate::argv::qemu_argv`] turns it
//! into a QEMU command line. Field names follow the VMI's (`domain.cpu.maxSockets`,
//! `domain.memory.maxGuest`, `firmware.bootloader.efi.secureBoot`, `disks[].bootOrder` …)
//! so the mapping stays obvious, but every value here is already resolved: sizes are
//! bytes, images are host paths, and defaults have been applied by the handler.

use serde::{Deserialize, Serialize};

/// The whole description of one domain as the launcher needs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LauncherSpec {
    /// Which VMI this domain belongs to.
    pub vmi: VmiIdentity,
    /// QEMU machine type; only the `q35` family is supported (`q35`, `pc-q35-7.2` …).
    #[serde(default = "default_machine_type")]
    pub machine_type: String,
    /// Hardware acceleration, already decided by the handler (see [`crate::accel`]).
    pub accel: Accel,
    /// Size of the TCG translation cache in MiB (QEMU's `tb-size`); TCG only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcg_translation_cache_mib: Option<u32>,
    /// vCPU topology and model.
    pub cpu: Cpu,
    /// Guest memory.
    pub memory: Memory,
    /// Firmware, SMBIOS identity and direct kernel boot.
    #[serde(default)]
    pub firmware: Firmware,
    /// Disks in VMI order.
    #[serde(default)]
    pub disks: Vec<Disk>,
    /// Network interfaces in VMI order.
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    /// Number of empty `pcie-root-port`s created for later hotplug of disks and NICs.
    #[serde(default)]
    pub hotplug_ports: u32,
    /// The video device and VNC server (`autoattachGraphicsDevice`); none without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graphics: Option<Graphics>,
    /// Host paths of the domain's runtime files.
    pub paths: RuntimePaths,
}

fn default_machine_type() -> String {
    "q35".to_owned()
}

/// Identity of the VMI the domain runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VmiIdentity {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.uid`.
    pub uid: String,
}

/// Hardware acceleration used for the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// Linux KVM.
    Kvm,
    /// QEMU's software emulation (KubeVirt's `useEmulation`).
    Tcg,
}

/// `domain.cpu`: topology and model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Cpu {
    /// Sockets present at boot.
    pub sockets: u32,
    /// Cores per socket.
    pub cores: u32,
    /// Threads per core.
    pub threads: u32,
    /// Sockets the topology has room for (CPU hotplug); at least `sockets`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sockets: Option<u32>,
    /// The CPU model.
    #[serde(default)]
    pub model: CpuModel,
    /// Features switched on or off on top of the model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<CpuFeature>,
    /// The guest's fixed TSC frequency in Hz (a guest with `invtsc` or Hyper-V
    /// reenlightenment, at the frequency of its topology hints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tsc_frequency: Option<u64>,
}

/// `domain.cpu.model`: `host-passthrough`, `host-model` or a named QEMU model.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum CpuModel {
    /// The host CPU as it is.
    #[default]
    HostPassthrough,
    /// A model close to the host CPU.
    HostModel,
    /// A named QEMU CPU model such as `Skylake-Server` or `qemu64`.
    Named(String),
}

impl From<String> for CpuModel {
    fn from(value: String) -> Self {
        match value.as_str() {
            "host-passthrough" => Self::HostPassthrough,
            "host-model" => Self::HostModel,
            _ => Self::Named(value),
        }
    }
}

impl From<CpuModel> for String {
    fn from(value: CpuModel) -> Self {
        match value {
            CpuModel::HostPassthrough => "host-passthrough".to_owned(),
            CpuModel::HostModel => "host-model".to_owned(),
            CpuModel::Named(name) => name,
        }
    }
}

/// `domain.cpu.features[]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CpuFeature {
    /// QEMU feature name, e.g. `pcid`.
    pub name: String,
    /// KubeVirt policy: `require`/`force` switch it on, `disable`/`forbid` off,
    /// `optional` leaves the model's default.
    #[serde(default = "default_feature_policy")]
    pub policy: String,
}

fn default_feature_policy() -> String {
    "require".to_owned()
}

/// `domain.memory` and `domain.memory.hugepages`, in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Memory {
    /// Memory the guest sees at boot, in bytes (a whole number of MiB).
    pub guest_bytes: u64,
    /// Memory the guest may grow to by hotplug, in bytes; above `guest_bytes` to enable it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_guest_bytes: Option<u64>,
    /// Memory wanted on top of `guest_bytes` (the VMI's `memory.guest` minus its
    /// `status.memory.guestAtBoot`), plugged by the virtio-mem device; at most
    /// `max_guest_bytes - guest_bytes`, in whole blocks of the device.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hotplugged_bytes: u64,
    /// Back the guest memory with huge pages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugepages: Option<Hugepages>,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// Huge-page backing of guest memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hugepages {
    /// Page size in bytes (`2Mi` → 2097152).
    pub page_size_bytes: u64,
    /// The hugetlbfs mount providing pages of that size.
    pub mount_path: String,
}

/// `domain.firmware`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Firmware {
    /// BIOS (SeaBIOS, the default) or EFI (OVMF).
    #[serde(default)]
    pub bootloader: Bootloader,
    /// SMBIOS system UUID (`firmware.uuid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// SMBIOS system serial number (`firmware.serial`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// Direct kernel boot (`firmware.kernelBoot`), with the images already on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_boot: Option<KernelBoot>,
}

/// `firmware.bootloader`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Bootloader {
    /// Legacy BIOS.
    #[default]
    Bios,
    /// UEFI through OVMF.
    Efi(Efi),
}

/// `firmware.bootloader.efi` with the OVMF files resolved on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Efi {
    /// Use the secure-boot OVMF build and enforce signatures.
    #[serde(default)]
    pub secure_boot: bool,
    /// OVMF code image, mapped read-only.
    pub code_path: String,
    /// This VMI's own, writable copy of the OVMF variable store.
    pub vars_path: String,
}

/// `firmware.kernelBoot`: boot a kernel directly instead of from a disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KernelBoot {
    /// Host path of the kernel (an ELF `vmlinux` boots fastest, through PVH).
    pub kernel_path: String,
    /// Host path of the initrd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd_path: Option<String>,
    /// Kernel command line (`kernelArgs`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kernel_args: String,
}

/// One disk (`domain.devices.disks[]` joined with its volume).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Disk {
    /// The disk's name in the VMI; QEMU's device id is `ua-<name>`.
    pub name: String,
    /// Host path of the image; with [`Disk::passed_file`] only its name (in logs and
    /// messages), never opened.
    pub source_path: String,
    /// Image format.
    #[serde(default)]
    pub format: DiskFormat,
    /// The bus the guest sees the disk on.
    #[serde(default)]
    pub bus: DiskBus,
    /// Present the disk as a CD-ROM (implies read-only).
    #[serde(default)]
    pub cdrom: bool,
    /// Boot priority, 1 first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_order: Option<u32>,
    /// Serial number the guest sees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// Host cache mode.
    #[serde(default)]
    pub cache: CacheMode,
    /// Attach read-only.
    #[serde(default)]
    pub readonly: bool,
    /// When the image does not exist, create it as a sparse raw file of this many bytes
    /// first: the `disk.img` of a filesystem claim, which upstream's launcher creates the same
    /// way. Only allowed below the claim disks directory (see
    /// [`crate::launcher::LauncherOptions::claim_disks_dir`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_size: Option<u64>,
    /// Open the image from the file the handler passed under this key (protocol command
    /// `passFile`) instead of from `source_path`: a hotplugged claim's image that virt-handler
    /// opened outside the launcher's directories. The host-path checks do not apply to such a
    /// disk; the file must be open read-write, or read-only for a `readonly` disk or CD-ROM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passed_file: Option<String>,
    /// When the image (a qcow2 at `source_path`, below the launcher directory) does not
    /// exist, create it first as an empty overlay over this raw image or block device, which
    /// must exist: the `disk.img` of an `ephemeral` volume's claim where the launcher pod
    /// mounts it, or the claim's block device at `/dev/<volume>`. The guest's writes stay in
    /// the overlay; the claim is never written (upstream's ephemeral disk). The backing must
    /// lie below the claim disks directory or be a block device directly in `/dev`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlay_backing: Option<String>,
    /// `source_path` is a block device (a `Block`-mode claim at `/dev/<volume>`): QEMU opens
    /// it with its `host_device` driver, and it must be a block device directly in `/dev`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub block_device: bool,
    /// QEMU's asynchronous I/O for the image (`aio`); `None`: QEMU's default (a thread pool).
    /// `native` needs [`CacheMode::None`] (O_DIRECT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<IoMode>,
}

/// A disk's asynchronous I/O (the VMI's `io`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoMode {
    /// A user-space thread pool.
    Threads,
    /// Linux native AIO (O_DIRECT only).
    Native,
}

/// Disk image format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskFormat {
    /// Raw image or block device.
    #[default]
    Raw,
    /// qcow2 image.
    Qcow2,
}

/// Disk bus as named in the VMI (`disk.bus`, `cdrom.bus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskBus {
    /// virtio-blk.
    #[default]
    Virtio,
    /// SATA, on the q35 built-in AHCI controller.
    Sata,
    /// SCSI, on a virtio-scsi controller.
    Scsi,
    /// USB storage: valid in a VMI but not supported by this launcher yet.
    Usb,
}

/// Host cache mode (`disk.cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheMode {
    /// O_DIRECT on the host, guest-visible write cache on (KubeVirt's default where supported).
    #[default]
    None,
    /// Host page cache, every write flushed.
    Writethrough,
    /// Host page cache, flushes on guest request.
    Writeback,
}

/// One network interface (`domain.devices.interfaces[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Interface {
    /// The interface's name in the VMI; QEMU's device id is `ua-<name>`.
    pub name: String,
    /// NIC model: `virtio` (default), `e1000`, `e1000e`, `rtl8139`.
    #[serde(default = "default_nic_model")]
    pub model: String,
    /// How the NIC reaches the network on the host.
    #[serde(default)]
    pub binding: InterfaceBinding,
    /// MAC address, `aa:bb:cc:dd:ee:ff`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac_address: Option<String>,
    /// Boot priority for network boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_order: Option<u32>,
    /// The link is down (the VMI interface's `state: down`); QEMU's `set_link`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub link_down: bool,
}

fn default_nic_model() -> String {
    "virtio".to_owned()
}

/// The host side of an interface.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum InterfaceBinding {
    /// QEMU user-mode networking (slirp): used when the launcher shares the host's network
    /// (no pod network namespace); the guest gets 10.0.2.15 by DHCP from QEMU.
    #[default]
    UserMode,
    /// KubeVirt's masquerade binding: a tap device on an in-pod bridge, NAT between the pod
    /// interface and the guest, and a DHCP server in the launcher ([`crate::netsetup`]).
    Masquerade(Masquerade),
    /// KubeVirt's bridge binding: the pod interface and a tap device on an in-pod bridge, and
    /// the guest gets the pod's address by DHCP from the launcher ([`crate::netsetup::bridge`]).
    /// Newer than the first spec revision: an older launcher refuses a spec with it.
    Bridge(PodBridge),
    /// KubeVirt's core passt binding (`passtBinding`): passt, started by the launcher in the
    /// pod's network namespace, gives the guest the pod's addresses by DHCP and carries its
    /// traffic as the pod's own sockets; QEMU's NIC talks to passt over a unix stream socket
    /// ([`crate::netsetup::passt`]). Newer than the bridge binding: an older launcher refuses
    /// a spec with it.
    Passt(Passt),
}

/// The passt binding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Passt {
    /// The pod's interface passt takes the addresses and routes from (`eth0`).
    pub pod_interface: String,
    /// The unix socket passt listens on and QEMU connects to.
    pub socket: String,
    /// passt's log file.
    pub log: String,
    /// Ports of the pod forwarded to the guest (`interfaces[].ports`); empty forwards every
    /// TCP and UDP port, as upstream.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ForwardedPort>,
}

/// The bridge binding (upstream's names: `eth0` renamed `eth0-nic` on the bridge `k6t-eth0`
/// with the tap `tap0`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodBridge {
    /// The pod's interface (`eth0`).
    pub pod_interface: String,
    /// What it is renamed to on the bridge (`eth0-nic`).
    pub renamed: String,
    /// The in-pod bridge (`k6t-eth0`).
    pub bridge: String,
    /// The tap device QEMU opens (`tap0`).
    pub tap: String,
    /// The DHCP server's address on the bridge (upstream's `169.254.75.1N/32`, N the
    /// interface's index).
    pub server: std::net::Ipv4Addr,
}

/// The masquerade binding, every name and address resolved by the handler (upstream's
/// names: `k6t-eth0`, `tap0`, the VM network `10.0.2.0/24`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Masquerade {
    /// The pod's interface traffic arrives on (`eth0`).
    pub pod_interface: String,
    /// The in-pod bridge (`k6t-eth0`).
    pub bridge: String,
    /// The tap device QEMU opens (`tap0`).
    pub tap: String,
    /// The gateway address on the bridge (`10.0.2.1`).
    pub gateway: std::net::Ipv4Addr,
    /// The address the guest gets by DHCP (`10.0.2.2`).
    pub guest: std::net::Ipv4Addr,
    /// Prefix length of the VM network (24).
    pub prefix_length: u8,
    /// Ports forwarded to the guest (`interfaces[].ports`); empty forwards every port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ForwardedPort>,
}

/// One forwarded port of a masquerade interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ForwardedPort {
    /// `tcp` or `udp`.
    pub protocol: String,
    /// The port number.
    pub port: u16,
}

/// A video device with a password-less VNC server on a unix socket, as upstream's libvirt
/// domain has (`<graphics type="vnc"><listen type="socket" …/>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Graphics {
    /// The video device model.
    #[serde(default)]
    pub video: VideoModel,
    /// Unix socket QEMU's VNC server listens on (virt-handler bridges `vnc` to it).
    pub vnc_socket: String,
}

/// Video device model (`domain.devices.video.type`, upstream's libvirt names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VideoModel {
    /// Standard VGA with Bochs VBE extensions (upstream's default on x86_64).
    #[default]
    Vga,
    /// A framebuffer without legacy VGA (upstream's choice for EFI guests with
    /// `bochsDisplayForEFIGuests`).
    Bochs,
    /// virtio-gpu with VGA compatibility.
    Virtio,
}

/// Host paths of the files QEMU creates or writes for this domain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuntimePaths {
    /// Unix socket of the serial console (virtctl console attaches here).
    pub serial_console_socket: String,
    /// Append-only log of everything the guest writes to its serial console.
    pub serial_log: String,
    /// Unix socket of the QMP monitor.
    pub qmp_socket: String,
    /// File QEMU writes its pid to.
    pub pid_file: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_model_strings_round_trip() {
        for (text, model) in [
            ("host-passthrough", CpuModel::HostPassthrough),
            ("host-model", CpuModel::HostModel),
            ("Skylake-Server", CpuModel::Named("Skylake-Server".into())),
        ] {
            let json = serde_json::to_string(&model).unwrap();
            assert_eq!(json, format!("\"{text}\""));
            assert_eq!(serde_json::from_str::<CpuModel>(&json).unwrap(), model);
        }
    }

    #[test]
    fn efi_bootloader_is_tagged_like_the_vmi() {
        let fw: Firmware = serde_json::from_str(
            r#"{"bootloader":{"efi":{"secureBoot":true,"codePath":"c","varsPath":"v"}}}"#,
        )
        .unwrap();
        assert_eq!(
            fw.bootloader,
            Bootloader::Efi(Efi {
                secure_boot: true,
                code_path: "c".into(),
                vars_path: "v".into()
            })
        );
        let bios: Firmware = serde_json::from_str(r#"{"bootloader":"bios"}"#).unwrap();
        assert_eq!(bios.bootloader, Bootloader::Bios);
    }

    #[test]
    fn a_disk_names_its_passed_file_only_when_it_has_one() {
        let disk: Disk = serde_json::from_str(
            r#"{"name":"hot","sourcePath":"/claims/hot/disk.img","passedFile":"vol1"}"#,
        )
        .unwrap();
        assert_eq!(disk.passed_file.as_deref(), Some("vol1"));
        let json = serde_json::to_value(&disk).unwrap();
        assert_eq!(json["passedFile"], "vol1");
        let plain = Disk {
            passed_file: None,
            ..disk
        };
        let json = serde_json::to_string(&plain).unwrap();
        assert!(!json.contains("passedFile"), "{json}");
        let decoded: Disk = serde_json::from_str(&json).unwrap();
        assert_eq!(decoded.passed_file, None);
    }

    #[test]
    fn unknown_disk_bus_is_rejected_when_decoding() {
        let err = serde_json::from_str::<DiskBus>("\"floppy\"").unwrap_err();
        assert!(err.to_string().contains("unknown variant"), "{err}");
    }
}
