//! VMI → launcher spec: what virt-handler sends in the launcher's `sync` command.
//!
//! Data flow: [`build_spec`] reads the VMI (`kubevirt.io/v1`), resolves image names through
//! the local [`ImageStore`] and returns a [`PreparedSpec`]: the [`LauncherSpec`] with every
//! value resolved (bytes, host paths, defaults) plus the [`FileAction`]s that must happen in
//! the pod directory before the launcher can use it. [`prepare_files`] performs them,
//! idempotently: a file that exists is left alone, so a re-sync after a handler restart never
//! overwrites a running guest's disk.
//!
//! Disk handling:
//! - `containerDisk`: the image's disk is hard-linked into the pod directory
//!   (`disks/base/<name>.<fmt>`, copied across filesystems) and the guest gets an empty qcow2
//!   overlay over it (`disks/<name>.qcow2`, written by [`overlay`] without `qemu-img`): QEMU
//!   opens the backing disk read-only, so the image stays pristine and the guest's writes
//!   are ephemeral, gone with the pod.
//! - `emptyDisk`: a sparse raw file of `capacity` in the pod directory.
//! - `cloudInitNoCloud`: a small FAT `cidata` disk built with `mkfs.vfat` and `mcopy`, from
//!   the Secrets of `secretRef` / `networkDataSecretRef` (mounted in the launcher pod), else
//!   `userData` / `networkData` or their base64 forms (which win, as upstream).
//! - `cloudInitConfigDrive`: an OpenStack config drive, an ISO labelled `config-2` with
//!   `openstack/latest/{meta_data.json,user_data,network_data.json}`, the data resolved as for
//!   NoCloud.
//! - `hostDisk`: a file below the configured host-disk directory (checked without following
//!   symlinks, created sparse for `DiskOrCreate`), hard-linked into the pod directory because
//!   the launcher only opens paths below it.
//! - `persistentVolumeClaim` / `dataVolume`: the claim's `disk.img` where the launcher pod
//!   mounts it (the launcher creates a missing one); a hotpluggable one only once its file was
//!   passed to the launcher ([`hotplug_file_passed`]). A `Block`-mode claim (the VMI's
//!   `volumeStatus` says so) is the block device the pod gets at `/dev/<volume>`, raw.
//! - `ephemeral` (`ephemeral.persistentVolumeClaim`): an empty qcow2 overlay in the launcher
//!   directory (`disks/<name>.qcow2`) over the claim's image — its `disk.img` where the pod
//!   mounts the claim read-only, or its `/dev/<volume>` — which the launcher writes in its own
//!   mount namespace, the only place the claim is seen (upstream's launcher does the same); the
//!   image must exist, and the guest's writes go to the overlay only, lost with the pod.
//! - `configMap`, `secret`, `downwardAPI`, `serviceAccount` (token, `ca.crt`, `namespace`): an
//!   ISO 9660 image (`genisoimage`, Joliet and Rock
//!   Ridge, labelled with the volume's `volumeLabel`, as upstream) of the files the kubelet put
//!   in the launcher pod's volume, built once at start: later changes of the source do not
//!   reach a running guest, as upstream.
//! - `sysprep` (`configMap` or `secret`): the same ISO of the map's or secret's keys, labelled
//!   `unattendCD` as upstream; one of them must be `autounattend.xml` or `unattend.xml`
//!   (any case), else upstream's "Sysprep drive should contain …" error.
//!
//! Kernel and initrd of `kernelBoot.container` are hard-linked (copied across filesystems).
//! Everything unsupported is a [`SpecError`], which the caller reports on the VMI.

mod prepare;

/// qcow2 overlays, shared with the launcher (which writes those of ephemeral volumes).
pub use virt_launcher::overlay;

pub use prepare::{prepare_files, supports_direct_io};

use std::path::{Path, PathBuf};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kubevirt_api::quantity::Quantity as ExactQuantity;
use kubevirt_api::v1::{
    DiskBus as VmiDiskBus, DriverCache, VirtualMachineInstance, VirtualMachineInstanceSpec, Volume,
};
use virt_launcher::spec::{
    Accel, Bootloader, CacheMode, Cpu, CpuFeature, CpuModel, Disk, DiskBus, DiskFormat, Efi,
    Firmware, ForwardedPort, Graphics, Interface, InterfaceBinding, IoMode, KernelBoot,
    LauncherSpec, Masquerade, Memory, Passt, PodBridge, RuntimePaths, VideoModel, VmiIdentity,
};

use virt_launcher::protocol::PodInterface;

use crate::images::{ImageError, ImageStore};

/// OVMF firmware from Debian's `ovmf` package.
pub const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
/// OVMF variable-store template.
pub const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";
/// OVMF built with secure boot.
pub const OVMF_CODE_SECBOOT: &str = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd";
/// Variable store with Microsoft's keys enrolled, for secure boot.
pub const OVMF_VARS_SECBOOT: &str = "/usr/share/OVMF/OVMF_VARS_4M.ms.fd";
/// TCG translation cache size: QEMU's default of 1 GiB costs ~48 MiB RSS for no benefit here.
pub const TCG_TRANSLATION_CACHE_MIB: u32 = 32;
/// Empty `pcie-root-port`s kept for later hotplug of disks and NICs.
pub const HOTPLUG_PORTS: u32 = 3;
/// The VM network of the masquerade binding when `pod.vmNetworkCIDR` is not set
/// (upstream's `DefaultVMCIDR`).
pub const DEFAULT_VM_CIDR: &str = "10.0.2.0/24";
/// The in-pod bridge of the primary pod interface (upstream's `DefaultBridgeName`).
pub const MASQUERADE_BRIDGE: &str = "k6t-eth0";
/// The tap device of the primary pod interface.
pub const MASQUERADE_TAP: &str = "tap0";

/// The VMI cannot be turned into a launcher spec.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The VMI asks for something this implementation does not do.
    #[error("{0}")]
    Unsupported(String),
    /// The VMI is inconsistent (a disk without a volume, a bad quantity …).
    #[error("{0}")]
    Invalid(String),
    /// An image could not be resolved in the local image store.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// A host disk path is not usable.
    #[error("hostDisk {volume:?}: {reason}")]
    HostDisk {
        /// The volume name.
        volume: String,
        /// Why.
        reason: String,
    },
    /// Preparing a file in the pod directory failed.
    #[error("preparing {path:?}")]
    Prepare {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A helper program (`mkfs.vfat`, `mcopy`) failed.
    #[error("{program} failed: {message}")]
    Tool {
        /// The program.
        program: String,
        /// Its stderr or the spawn error.
        message: String,
    },
}

impl SpecError {
    /// Short machine-readable reason for conditions and events.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Unsupported(_) => "Unsupported",
            Self::Invalid(_) => "InvalidSpec",
            Self::Image(_) => "ImageNotFound",
            Self::HostDisk { .. } => "HostDiskNotUsable",
            Self::Prepare { .. } | Self::Tool { .. } => "PrepareFailed",
        }
    }
}

/// What [`build_spec`] needs besides the VMI.
#[derive(Debug, Clone)]
pub struct SpecContext<'a> {
    /// The launcher pod's directory; every runtime file goes below it.
    pub pod_dir: &'a Path,
    /// Where image names resolve.
    pub images: &'a ImageStore,
    /// Host disks must lie below this directory.
    pub host_disk_dir: &'a Path,
    /// The accelerator, already decided.
    pub accel: Accel,
    /// Whether the pod directory's filesystem supports `O_DIRECT` (cache mode `none`).
    pub direct_io: bool,
    /// The launcher's pod interface, when it runs in a network namespace of its own (from
    /// its hello); masquerade interfaces then get the masquerade binding, else user mode.
    pub pod_interface: Option<&'a PodInterface>,
    /// The launcher pod's `volumes` directory in the kubelet's layout, as this handler sees it
    /// (`<pods>/<uid>/volumes`): `configMap`, `secret` and `downwardAPI` disks are built from
    /// the files the kubelet put there.
    pub pod_volumes_dir: &'a Path,
}

/// A file the pod directory needs before the launcher starts the domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileAction {
    /// Copy `from` to `to` (a writable private copy).
    Copy {
        /// Source.
        from: PathBuf,
        /// Destination in the pod directory.
        to: PathBuf,
    },
    /// Hard-link `from` at `to`; copy when they are on different filesystems.
    Link {
        /// Source.
        from: PathBuf,
        /// Destination in the pod directory.
        to: PathBuf,
    },
    /// Hard-link `from` at `to` and never copy: what the guest writes through `to` must reach
    /// `from` (a `hostDisk`), so a link across filesystems fails instead of silently copying.
    Share {
        /// The file the guest writes.
        from: PathBuf,
        /// Destination in the pod directory.
        to: PathBuf,
    },
    /// Create a sparse file of `size` bytes.
    Sparse {
        /// The file.
        path: PathBuf,
        /// Size in bytes.
        size: u64,
    },
    /// Write an empty qcow2 overlay at `path` over `backing` (a file of the pod directory,
    /// named relative to the overlay's directory in its header; QEMU opens it read-only).
    Overlay {
        /// The overlay.
        path: PathBuf,
        /// The backing disk.
        backing: PathBuf,
        /// The backing disk's format.
        backing_format: DiskFormat,
    },
    /// Build an ISO 9660 image (Joliet and Rock Ridge, upstream's) of the files at the top of
    /// the kubelet volume directory `source`, labelled `label` when given.
    ConfigIso {
        /// The image file.
        path: PathBuf,
        /// The volume id.
        label: Option<String>,
        /// The pod volume's directory (a host path).
        source: PathBuf,
    },
    /// Build an OpenStack config drive: an ISO 9660 image labelled `config-2` holding these
    /// files at their relative paths (`openstack/latest/meta_data.json`, …).
    ConfigDrive {
        /// The image file.
        path: PathBuf,
        /// `(relative path, content)` pairs.
        files: Vec<(String, String)>,
    },
    /// Build a NoCloud `cidata` FAT image holding these files.
    CloudInit {
        /// The image file.
        path: PathBuf,
        /// `(name, content)` pairs: `meta-data`, `user-data`, `network-config`.
        files: Vec<(String, String)>,
    },
}

impl FileAction {
    /// The file the action creates.
    pub fn target(&self) -> &Path {
        match self {
            Self::Copy { to, .. } | Self::Link { to, .. } | Self::Share { to, .. } => to,
            Self::Sparse { path, .. }
            | Self::CloudInit { path, .. }
            | Self::ConfigDrive { path, .. }
            | Self::ConfigIso { path, .. }
            | Self::Overlay { path, .. } => path,
        }
    }

    /// The same action with its target below `host_dir` instead of `launcher_dir`: the spec
    /// names files as the launcher sees them in its pod; the handler writes them where that
    /// directory is on the node. Targets elsewhere are kept.
    pub fn on_host(&self, launcher_dir: &Path, host_dir: &Path) -> FileAction {
        let map = |p: &Path| match p.strip_prefix(launcher_dir) {
            Ok(rest) => host_dir.join(rest),
            Err(_) => p.to_owned(),
        };
        match self {
            Self::Copy { from, to } => Self::Copy {
                from: from.clone(),
                to: map(to),
            },
            Self::Link { from, to } => Self::Link {
                from: from.clone(),
                to: map(to),
            },
            Self::Share { from, to } => Self::Share {
                from: from.clone(),
                to: map(to),
            },
            Self::Sparse { path, size } => Self::Sparse {
                path: map(path),
                size: *size,
            },
            Self::CloudInit { path, files } => Self::CloudInit {
                path: map(path),
                files: files.clone(),
            },
            Self::ConfigDrive { path, files } => Self::ConfigDrive {
                path: map(path),
                files: files.clone(),
            },
            Self::ConfigIso {
                path,
                label,
                source,
            } => Self::ConfigIso {
                path: map(path),
                label: label.clone(),
                source: source.clone(),
            },
            Self::Overlay {
                path,
                backing,
                backing_format,
            } => Self::Overlay {
                path: map(path),
                backing: map(backing),
                backing_format: *backing_format,
            },
        }
    }
}

/// A launcher spec and the files it relies on.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedSpec {
    /// The spec to send.
    pub spec: LauncherSpec,
    /// What to create first, in order.
    pub files: Vec<FileAction>,
}

/// Bytes of a Kubernetes quantity (`128Mi` → 134217728), rounded up as Kubernetes' `Value()`
/// rounds.
fn quantity_bytes(what: &str, q: &Quantity) -> Result<u64, SpecError> {
    ExactQuantity::try_from(q)
        .ok()
        .and_then(|q| u64::try_from(q.value()).ok())
        .ok_or_else(|| SpecError::Invalid(format!("{what}: {:?} is not a quantity", q.0)))
}

fn round_up_mib(bytes: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    bytes.div_ceil(MIB) * MIB
}

/// Builds the launcher spec of `vmi`.
///
/// # Errors
/// [`SpecError`] for unsupported features, missing images and inconsistent VMIs.
pub fn build_spec(
    vmi: &VirtualMachineInstance,
    ctx: &SpecContext<'_>,
) -> Result<PreparedSpec, SpecError> {
    let spec = &vmi.spec;
    let meta = &vmi.metadata;
    let mut files = Vec::new();
    let pod = ctx.pod_dir;
    let layout = virt_launcher::pod_layout::PodLayout::new(pod);
    let path = |p: std::path::PathBuf| p.display().to_string();
    let machine_type = spec
        .domain
        .machine
        .as_ref()
        .and_then(|m| m.type_.clone())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "q35".to_owned());
    if !machine_type.starts_with("q35") && !machine_type.starts_with("pc-q35") {
        return Err(SpecError::Unsupported(format!(
            "machine type {machine_type:?} is not supported: only q35 is"
        )));
    }
    let launcher_spec = LauncherSpec {
        vmi: VmiIdentity {
            name: meta.name.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
        },
        machine_type,
        accel: ctx.accel,
        tcg_translation_cache_mib: (ctx.accel == Accel::Tcg).then_some(TCG_TRANSLATION_CACHE_MIB),
        cpu: Cpu {
            // Upstream's `IsManualTSCFrequencyRequired`: the frequency virt-controller placed
            // the guest for.
            tsc_frequency: kubevirt_api::tsc::manual_tsc_frequency(vmi)
                .and_then(|hz| u64::try_from(hz).ok()),
            ..cpu(spec)?
        },
        memory: memory(vmi)?,
        firmware: firmware(spec, ctx, &mut files)?,
        disks: disks(vmi, ctx, &mut files)?,
        interfaces: interfaces(vmi, ctx.pod_interface, &layout)?,
        hotplug_ports: HOTPLUG_PORTS,
        graphics: graphics(spec, &path(layout.vnc_socket()))?,
        paths: RuntimePaths {
            serial_console_socket: path(layout.serial_console_socket()),
            serial_log: path(layout.serial_log()),
            qmp_socket: path(layout.qmp_socket()),
            pid_file: path(layout.pid_file()),
        },
    };
    virt_launcher::qemu_argv(&launcher_spec).map_err(|e| SpecError::Invalid(e.to_string()))?;
    Ok(PreparedSpec {
        spec: launcher_spec,
        files,
    })
}

/// Upstream's graphics: unless `autoattachGraphicsDevice` is false, a video device
/// (`devices.video.type`, by default `vga` as upstream's x86_64 converter without
/// `bochsDisplayForEFIGuests`) and a VNC server on the pod directory's `vnc.sock`.
fn graphics(
    spec: &VirtualMachineInstanceSpec,
    vnc_socket: &str,
) -> Result<Option<Graphics>, SpecError> {
    let devices = &spec.domain.devices;
    if devices.autoattach_graphics_device == Some(false) {
        return Ok(None);
    }
    let video = match devices.video.as_ref().and_then(|v| v.type_.as_deref()) {
        None | Some("vga") => VideoModel::Vga,
        Some("bochs") => VideoModel::Bochs,
        Some("virtio") => VideoModel::Virtio,
        Some(other) => {
            return Err(SpecError::Unsupported(format!(
                "video type {other:?} is not supported: use vga, bochs or virtio"
            )));
        }
    };
    Ok(Some(Graphics {
        video,
        vnc_socket: vnc_socket.to_owned(),
    }))
}

/// vCPU topology: sockets/cores/threads default to 1; without any topology the CPU
/// request (or limit) in whole CPUs becomes the number of cores, as upstream does.
fn cpu(spec: &VirtualMachineInstanceSpec) -> Result<Cpu, SpecError> {
    let vmi_cpu = spec.domain.cpu.clone().unwrap_or_default();
    let mut cores = vmi_cpu.cores.unwrap_or(0);
    let sockets = vmi_cpu.sockets.unwrap_or(0);
    let threads = vmi_cpu.threads.unwrap_or(0);
    if cores == 0 && sockets == 0 && threads == 0 {
        let resources = spec.domain.resources.clone().unwrap_or_default();
        let cpus = resources
            .limits
            .get("cpu")
            .or_else(|| resources.requests.get("cpu"))
            .and_then(|q| ExactQuantity::try_from(q).ok())
            .map(|q| q.value());
        cores = cpus.and_then(|c| u32::try_from(c).ok()).unwrap_or(1);
    }
    let model = match vmi_cpu.model.as_deref() {
        None | Some("") => CpuModel::HostModel,
        Some(other) => CpuModel::from(other.to_owned()),
    };
    Ok(Cpu {
        sockets: sockets.max(1),
        cores: cores.max(1),
        threads: threads.max(1),
        max_sockets: vmi_cpu.max_sockets.filter(|m| *m > 0),
        model,
        features: vmi_cpu
            .features
            .iter()
            .map(|f| CpuFeature {
                name: f.name.clone(),
                policy: f.policy.clone().unwrap_or_else(|| "require".to_owned()),
            })
            .collect(),
        tsc_frequency: None,
    })
}

/// Guest memory from `memory.guest`, else `resources.requests.memory` (else the limit).
///
/// With memory hotplug (`maxGuest`) the domain boots with `status.memory.guestAtBoot` and a
/// virtio-mem device plugs the rest of `memory.guest` (upstream's split): a `memory.guest`
/// raised on a running VMI becomes more hotplugged memory, never another boot size.
fn memory(vmi: &VirtualMachineInstance) -> Result<Memory, SpecError> {
    let spec = &vmi.spec;
    let vmi_memory = spec.domain.memory.clone().unwrap_or_default();
    let resources = spec.domain.resources.clone().unwrap_or_default();
    let guest = vmi_memory
        .guest
        .as_ref()
        .or_else(|| resources.requests.get("memory"))
        .or_else(|| resources.limits.get("memory"))
        .ok_or_else(|| {
            SpecError::Invalid(
                "no guest memory: set domain.memory.guest or domain.resources.requests.memory"
                    .into(),
            )
        })?;
    let guest_bytes = round_up_mib(quantity_bytes("memory", guest)?);
    let max_guest_bytes = vmi_memory
        .max_guest
        .as_ref()
        .map(|q| quantity_bytes("memory.maxGuest", q).map(round_up_mib))
        .transpose()?;
    if vmi_memory.hugepages.is_some() {
        return Err(SpecError::Unsupported(
            "hugepages are not supported by the embedded mode yet".into(),
        ));
    }
    let at_boot = vmi
        .status
        .as_ref()
        .and_then(|s| s.memory.as_ref())
        .and_then(|m| m.guest_at_boot.as_ref())
        .filter(|_| max_guest_bytes.is_some())
        .map(|q| quantity_bytes("status.memory.guestAtBoot", q).map(round_up_mib))
        .transpose()?
        .unwrap_or(guest_bytes);
    Ok(Memory {
        guest_bytes: at_boot,
        max_guest_bytes,
        hotplugged_bytes: guest_bytes.saturating_sub(at_boot),
        hugepages: None,
    })
}

fn firmware(
    spec: &VirtualMachineInstanceSpec,
    ctx: &SpecContext<'_>,
    files: &mut Vec<FileAction>,
) -> Result<Firmware, SpecError> {
    let fw = spec.domain.firmware.clone().unwrap_or_default();
    let bootloader = match fw.bootloader.as_ref().and_then(|b| b.efi.as_ref()) {
        Some(efi) => {
            let secure_boot = efi.secure_boot.unwrap_or(true);
            let (code, vars) = if secure_boot {
                (OVMF_CODE_SECBOOT, OVMF_VARS_SECBOOT)
            } else {
                (OVMF_CODE, OVMF_VARS)
            };
            let vars_path = ctx.pod_dir.join("efi-vars.fd");
            files.push(FileAction::Copy {
                from: PathBuf::from(vars),
                to: vars_path.clone(),
            });
            Bootloader::Efi(Efi {
                secure_boot,
                code_path: code.to_owned(),
                vars_path: vars_path.display().to_string(),
            })
        }
        None => Bootloader::Bios,
    };
    let kernel_boot = match fw.kernel_boot.as_ref() {
        Some(kb) => {
            let Some(container) = kb.container.as_ref() else {
                return Err(SpecError::Invalid(
                    "firmware.kernelBoot needs a container with the kernel".into(),
                ));
            };
            let boot_dir = ctx.pod_dir.join("boot");
            let mut link = |path_in_image: &str, name: &str| -> Result<String, SpecError> {
                let from = ctx.images.resolve(&container.image, path_in_image)?;
                let to = boot_dir.join(name);
                files.push(FileAction::Link {
                    from,
                    to: to.clone(),
                });
                Ok(to.display().to_string())
            };
            let kernel_path = match container.kernel_path.as_deref() {
                Some(p) if !p.is_empty() => link(p, "kernel")?,
                _ => {
                    return Err(SpecError::Invalid(
                        "firmware.kernelBoot.container.kernelPath is required".into(),
                    ));
                }
            };
            let initrd_path = match container.initrd_path.as_deref() {
                Some(p) if !p.is_empty() => Some(link(p, "initrd")?),
                _ => None,
            };
            Some(KernelBoot {
                kernel_path,
                initrd_path,
                kernel_args: kb.kernel_args.clone().unwrap_or_default(),
            })
        }
        None => None,
    };
    Ok(Firmware {
        bootloader,
        uuid: fw.uuid.filter(|u| !u.is_empty()),
        serial: fw.serial.filter(|s| !s.is_empty()),
        kernel_boot,
    })
}

/// The bus a disk is attached to; without one a disk is virtio and a cdrom sata, as the
/// mutating webhook defaults them (QEMU has no virtio cdrom).
fn disk_bus(bus: Option<&VmiDiskBus>, cdrom: bool, name: &str) -> Result<DiskBus, SpecError> {
    match bus {
        None if cdrom => Ok(DiskBus::Sata),
        None | Some(VmiDiskBus::Virtio) => Ok(DiskBus::Virtio),
        Some(VmiDiskBus::Sata) => Ok(DiskBus::Sata),
        Some(VmiDiskBus::Scsi) => Ok(DiskBus::Scsi),
        Some(other) => Err(SpecError::Unsupported(format!(
            "disk {name:?}: bus {:?} is not supported",
            other.as_str()
        ))),
    }
}

fn disk_format(path: &Path) -> DiskFormat {
    if path.extension().is_some_and(|e| e == "qcow2") {
        DiskFormat::Qcow2
    } else {
        DiskFormat::Raw
    }
}

/// Where a volume's data comes from, resolved.
struct Source {
    path: PathBuf,
    format: DiskFormat,
    /// Create the image of this size first when it is missing (a claim's `disk.img`).
    create_size: Option<u64>,
    /// The launcher creates the image as an empty overlay over this (an ephemeral volume's
    /// claim image, as the launcher sees it).
    overlay_backing: Option<String>,
    /// The image is a block device (a `Block`-mode claim).
    block_device: bool,
}

impl Source {
    fn at(path: PathBuf, format: DiskFormat) -> Source {
        Source {
            path,
            format,
            create_size: None,
            overlay_backing: None,
            block_device: false,
        }
    }
}

/// The ISO 9660 volume id of sysprep disks (upstream's `sysprepVolumeLabel`).
pub const SYSPREP_VOLUME_LABEL: &str = "unattendCD";

/// Where the launcher sees the data of claim-backed volume `name`: the block device the pod
/// gets at `/dev/<name>` for a `Block`-mode claim, else the claim's `disk.img` where the pod
/// mounts it.
fn claim_image(vmi: &VirtualMachineInstance, name: &str) -> (PathBuf, bool) {
    if vmi.status.as_ref().is_some_and(|s| s.claim_is_block(name)) {
        (Path::new("/dev").join(name), true)
    } else {
        (
            Path::new(virt_launcher::pod_layout::CLAIM_DISKS_DIR)
                .join(name)
                .join(virt_launcher::pod_layout::CLAIM_DISK_IMAGE),
            false,
        )
    }
}

/// The filesystem overhead assumed when the VMI's volume status does not give one (CDI's
/// default, which upstream applies to filesystem claims).
const DEFAULT_FILESYSTEM_OVERHEAD: f64 = 0.055;

/// The size of a claim's `disk.img`, as upstream's launcher sizes one it creates: the claim's
/// capacity, else its request (from the VMI's `status.volumeStatus`, which virt-controller fills
/// from the claim)
/// less its filesystem overhead, aligned down to 1 MiB. `None` when the capacity is unknown: an
/// existing image is used as it is.
pub(crate) fn claim_disk_size(
    vmi: &VirtualMachineInstance,
    volume: &str,
) -> Result<Option<u64>, SpecError> {
    const MIB: u64 = 1 << 20;
    let info = vmi
        .status
        .as_ref()
        .and_then(|s| s.volume_status.iter().find(|v| v.name == volume))
        .and_then(|v| v.persistent_volume_claim_info.as_ref());
    // The bound volume's capacity; the request while the claim is not bound yet.
    let storage = |i: &kubevirt_api::v1::PersistentVolumeClaimInfo| {
        i.capacity
            .get("storage")
            .or_else(|| i.requests.get("storage"))
            .cloned()
    };
    let Some(capacity) = info.and_then(storage) else {
        return Ok(None);
    };
    let capacity = quantity_bytes("persistentVolumeClaimInfo.capacity", &capacity)?;
    let overhead = info
        .and_then(|i| i.filesystem_overhead.as_deref())
        .and_then(|o| o.parse::<f64>().ok())
        .filter(|o| (0.0..1.0).contains(o))
        .unwrap_or(DEFAULT_FILESYSTEM_OVERHEAD);
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let usable = (capacity as f64 * (1.0 - overhead)) as u64;
    let aligned = usable / MIB * MIB;
    if aligned == 0 {
        return Err(SpecError::Invalid(format!(
            "volume {volume:?}: the claim's capacity {capacity} bytes leaves no room for a disk image"
        )));
    }
    Ok(Some(aligned))
}

fn volume_source(
    vmi: &VirtualMachineInstance,
    volume: &Volume,
    ctx: &SpecContext<'_>,
    files: &mut Vec<FileAction>,
) -> Result<Source, SpecError> {
    let disks_dir = ctx.pod_dir.join("disks");
    let name = &volume.name;
    let src = &volume.volume_source;
    if let Some(cd) = &src.container_disk {
        let from = ctx.images.resolve_disk(&cd.image, cd.path.as_deref())?;
        let format = disk_format(&from);
        let ext = if format == DiskFormat::Qcow2 {
            "qcow2"
        } else {
            "img"
        };
        let base = disks_dir.join("base").join(format!("{name}.{ext}"));
        let overlay = disks_dir.join(format!("{name}.qcow2"));
        files.push(FileAction::Link {
            from,
            to: base.clone(),
        });
        files.push(FileAction::Overlay {
            path: overlay.clone(),
            backing: base,
            backing_format: format,
        });
        return Ok(Source::at(overlay, DiskFormat::Qcow2));
    }
    if let Some(empty) = &src.empty_disk {
        let size = quantity_bytes("emptyDisk.capacity", &empty.capacity)?;
        let path = disks_dir.join(format!("{name}.img"));
        files.push(FileAction::Sparse {
            path: path.clone(),
            size,
        });
        return Ok(Source::at(path, DiskFormat::Raw));
    }
    if let Some(ci) = &src.cloud_init_no_cloud {
        return cloud_init_disk(vmi, name, ci, ctx, &disks_dir, files);
    }
    if let Some(cd) = &src.cloud_init_config_drive {
        return config_drive_disk(vmi, name, cd, ctx, &disks_dir, files);
    }
    if let Some(hd) = &src.host_disk {
        return host_disk(name, hd, ctx, files);
    }
    if let Some((plugin, label)) = config_disk(src) {
        let path = disks_dir.join(format!("{name}.iso"));
        files.push(FileAction::ConfigIso {
            path: path.clone(),
            label,
            source: ctx.pod_volumes_dir.join(plugin).join(name),
        });
        return Ok(Source::at(path, DiskFormat::Raw));
    }
    if let Some(sysprep) = &src.sysprep {
        return sysprep_disk(name, sysprep, ctx, &disks_dir, files);
    }
    if let Some(ephemeral) = &src.ephemeral {
        if ephemeral.persistent_volume_claim.is_none() {
            return Err(SpecError::Invalid(format!(
                "volume {name:?}: an ephemeral volume needs a persistentVolumeClaim"
            )));
        }
        // The pod mounts the claim read-only (virt-controller's template); the launcher
        // writes the overlay over its image, the one place that sees the claim.
        let (backing, _) = claim_image(vmi, name);
        return Ok(Source {
            overlay_backing: Some(backing.display().to_string()),
            ..Source::at(disks_dir.join(format!("{name}.qcow2")), DiskFormat::Qcow2)
        });
    }
    if src.claim_name().is_some() {
        // The launcher pod mounts the claim there (virt-controller's template), or gives it
        // as a block device; the launcher creates a missing image in a filesystem claim, as
        // upstream's does, and QEMU opens it in place.
        let (path, block) = claim_image(vmi, name);
        if block {
            return Ok(Source {
                block_device: true,
                ..Source::at(path, DiskFormat::Raw)
            });
        }
        return Ok(Source {
            create_size: claim_disk_size(vmi, name)?,
            ..Source::at(path, DiskFormat::Raw)
        });
    }
    let kind = src
        .set_sources()
        .first()
        .copied()
        .unwrap_or("this volume type");
    Err(SpecError::Unsupported(format!(
        "volume {name:?}: {kind} volumes are not supported yet"
    )))
}

/// The sysprep disk of volume `name`: an ISO labelled [`SYSPREP_VOLUME_LABEL`] of the keys of
/// its ConfigMap or Secret (in the launcher pod's volume of that name), which must include
/// `autounattend.xml` or `unattend.xml` (any case), as upstream checks.
fn sysprep_disk(
    name: &str,
    sysprep: &kubevirt_api::v1::SysprepSource,
    ctx: &SpecContext<'_>,
    disks_dir: &Path,
    files: &mut Vec<FileAction>,
) -> Result<Source, SpecError> {
    let plugin = match (&sysprep.config_map, &sysprep.secret) {
        (Some(_), _) => "kubernetes.io~configmap",
        (None, Some(_)) => "kubernetes.io~secret",
        (None, None) => {
            return Err(SpecError::Invalid(format!(
                "volume {name:?}: a sysprep volume needs a configMap or a secret"
            )));
        }
    };
    let source = ctx.pod_volumes_dir.join(plugin).join(name);
    check_unattend_present(&source)?;
    let path = disks_dir.join(format!("{name}.iso"));
    files.push(FileAction::ConfigIso {
        path: path.clone(),
        label: Some(SYSPREP_VOLUME_LABEL.to_owned()),
        source,
    });
    Ok(Source::at(path, DiskFormat::Raw))
}

/// Upstream's `validateUnattendPresence`: the sysprep volume holds `autounattend.xml` or
/// `unattend.xml` (names compared in lower case), with upstream's messages.
fn check_unattend_present(dir: &Path) -> Result<(), SpecError> {
    const AUTOUNATTEND: &str = "autounattend.xml";
    const UNATTEND: &str = "unattend.xml";
    let files = std::fs::read_dir(dir)
        .map_err(|e| e.to_string())
        .and_then(|_| prepare::volume_files(dir).map_err(|e| error_chain(&e)))
        .map_err(|e| {
            SpecError::Invalid(format!(
                "Error validating that {AUTOUNATTEND} or {UNATTEND} have been provided: {e}"
            ))
        })?;
    let present = files.iter().any(|(file, _)| {
        let file = file.to_lowercase();
        file == AUTOUNATTEND || file == UNATTEND
    });
    if present {
        Ok(())
    } else {
        Err(SpecError::Invalid(format!(
            "Sysprep drive should contain {AUTOUNATTEND} or {UNATTEND} but neither were found."
        )))
    }
}

/// An error and its causes, `: `-separated.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

/// The NoCloud `cidata` disk of a `cloudInitNoCloud` volume.
fn cloud_init_disk(
    vmi: &VirtualMachineInstance,
    name: &str,
    ci: &kubevirt_api::v1::CloudInitNoCloudSource,
    ctx: &SpecContext<'_>,
    disks_dir: &Path,
    files: &mut Vec<FileAction>,
) -> Result<Source, SpecError> {
    let uid = vmi.metadata.uid.clone().unwrap_or_default();
    let host = vmi
        .spec
        .hostname
        .clone()
        .or_else(|| vmi.metadata.name.clone())
        .unwrap_or_default();
    let mut content = vec![(
        "meta-data".to_owned(),
        format!("instance-id: {uid}\nlocal-hostname: {host}\n"),
    )];
    let (user_data, network_data) = cloud_init_data(
        name,
        ctx,
        CloudInitSources {
            user_secret: ci.secret_ref.is_some(),
            user_base64: ci.user_data_base64.as_deref(),
            user: ci.user_data.as_deref(),
            network_secret: ci.network_data_secret_ref.is_some(),
            network_base64: ci.network_data_base64.as_deref(),
            network: ci.network_data.as_deref(),
        },
    )?;
    content.push(("user-data".to_owned(), user_data.unwrap_or_default()));
    if let Some(net) = network_data {
        content.push(("network-config".to_owned(), net));
    }
    let path = disks_dir.join(format!("{name}-cidata.img"));
    files.push(FileAction::CloudInit {
        path: path.clone(),
        files: content,
    });
    Ok(Source::at(path, DiskFormat::Raw))
}

/// Where a cloud-init volume's user and network data come from.
#[derive(Clone, Copy)]
struct CloudInitSources<'a> {
    user_secret: bool,
    user_base64: Option<&'a str>,
    user: Option<&'a str>,
    network_secret: bool,
    network_base64: Option<&'a str>,
    network: Option<&'a str>,
}

/// The user and network data of cloud-init volume `name`, as upstream resolves them: from the
/// Secret when one is referenced (mounted in the launcher pod as `<name>-udata`/`-ndata`),
/// else the base64 field decoded, else the plain one.
fn cloud_init_data(
    name: &str,
    ctx: &SpecContext<'_>,
    sources: CloudInitSources<'_>,
) -> Result<(Option<String>, Option<String>), SpecError> {
    let secrets = ctx.pod_volumes_dir.join("kubernetes.io~secret");
    let user = if sources.user_secret {
        Some(secret_key(
            &secrets.join(format!("{name}-udata")),
            ["userdata", "userData"],
        )?)
    } else {
        decoded_or_plain(name, "userDataBase64", sources.user_base64, sources.user)?
    };
    let network = if sources.network_secret {
        Some(secret_key(
            &secrets.join(format!("{name}-ndata")),
            ["networkdata", "networkData"],
        )?)
    } else {
        decoded_or_plain(
            name,
            "networkDataBase64",
            sources.network_base64,
            sources.network,
        )?
    };
    Ok((user, network))
}

/// The OpenStack config drive of a `cloudInitConfigDrive` volume (upstream's layout:
/// `openstack/latest/{meta_data.json,user_data,network_data.json}`, label `config-2`).
fn config_drive_disk(
    vmi: &VirtualMachineInstance,
    name: &str,
    cd: &kubevirt_api::v1::CloudInitConfigDriveSource,
    ctx: &SpecContext<'_>,
    disks_dir: &Path,
    files: &mut Vec<FileAction>,
) -> Result<Source, SpecError> {
    let (user_data, network_data) = cloud_init_data(
        name,
        ctx,
        CloudInitSources {
            user_secret: cd.secret_ref.is_some(),
            user_base64: cd.user_data_base64.as_deref(),
            user: cd.user_data.as_deref(),
            network_secret: cd.network_data_secret_ref.is_some(),
            network_base64: cd.network_data_base64.as_deref(),
            network: cd.network_data.as_deref(),
        },
    )?;
    let vmi_name = vmi.metadata.name.clone().unwrap_or_default();
    let namespace = vmi.metadata.namespace.clone().unwrap_or_default();
    let host = vmi
        .spec
        .hostname
        .clone()
        .unwrap_or_else(|| vmi_name.clone());
    let metadata = serde_json::json!({
        "instance_id": format!("{vmi_name}.{namespace}"),
        "local_hostname": host,
        "hostname": host,
        "uuid": vmi.metadata.uid.clone().unwrap_or_default(),
    });
    let mut content = vec![
        (
            "openstack/latest/meta_data.json".to_owned(),
            metadata.to_string(),
        ),
        (
            "openstack/latest/user_data".to_owned(),
            user_data.unwrap_or_default(),
        ),
    ];
    if let Some(network) = network_data {
        content.push(("openstack/latest/network_data.json".to_owned(), network));
    }
    let path = disks_dir.join(format!("{name}-configdrive.iso"));
    files.push(FileAction::ConfigDrive {
        path: path.clone(),
        files: content,
    });
    Ok(Source::at(path, DiskFormat::Raw))
}

/// The first of `keys` in the Secret volume at `dir` (the launcher pod's, see virt-controller's
/// template), read through the atomic writer's links only inside the volume.
fn secret_key(dir: &Path, keys: [&str; 2]) -> Result<String, SpecError> {
    let missing = || {
        SpecError::Invalid(format!(
            "no cloud-init data-source found at volume: {} (keys {keys:?})",
            dir.display()
        ))
    };
    if !dir.is_dir() {
        return Err(missing());
    }
    let files = prepare::volume_files(dir)?;
    let path = keys
        .iter()
        .find_map(|key| files.iter().find(|(name, _)| name == key))
        .map(|(_, path)| path)
        .ok_or_else(missing)?;
    std::fs::read_to_string(path).map_err(|source| SpecError::Prepare {
        path: path.clone(),
        source,
    })
}

/// cloud-init data as upstream reads it: the base64 field decoded when set, else the plain one.
fn decoded_or_plain(
    volume: &str,
    field: &str,
    base64: Option<&str>,
    plain: Option<&str>,
) -> Result<Option<String>, SpecError> {
    use base64::Engine;
    match base64.filter(|b| !b.is_empty()) {
        Some(encoded) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .map_err(|e| SpecError::Invalid(format!("volume {volume:?}: {field}: {e}")))?;
            String::from_utf8(bytes)
                .map(Some)
                .map_err(|e| SpecError::Invalid(format!("volume {volume:?}: {field}: {e}")))
        }
        None => Ok(plain.map(str::to_owned)),
    }
}

/// For a `configMap`, `secret`, `downwardAPI` or `serviceAccount` volume: the kubelet's volume
/// plugin directory its files are in and its ISO label (upstream's `volumeLabel`; none for a
/// service account).
fn config_disk(src: &kubevirt_api::v1::VolumeSource) -> Option<(&'static str, Option<String>)> {
    let label = |l: &Option<String>| l.clone().filter(|l| !l.is_empty());
    if let Some(cm) = &src.config_map {
        return Some(("kubernetes.io~configmap", label(&cm.volume_label)));
    }
    if let Some(secret) = &src.secret {
        return Some(("kubernetes.io~secret", label(&secret.volume_label)));
    }
    if src.service_account.is_some() {
        return Some(("kubernetes.io~projected", None));
    }
    src.downward_api
        .as_ref()
        .map(|d| ("kubernetes.io~downward-api", label(&d.volume_label)))
}

fn host_disk(
    name: &str,
    hd: &kubevirt_api::v1::HostDisk,
    ctx: &SpecContext<'_>,
    files: &mut Vec<FileAction>,
) -> Result<Source, SpecError> {
    let fail = |reason: String| SpecError::HostDisk {
        volume: name.to_owned(),
        reason,
    };
    let requested = Path::new(&hd.path);
    // A relative path would be checked below the host-disk directory but opened relative to
    // the handler's working directory; admission refuses it, and so does the node.
    if !requested.is_absolute() {
        return Err(fail(format!("path {:?} is not absolute", hd.path)));
    }
    // From here on only the checked path is used, never the one the spec wrote.
    let path = match hd.type_.as_str() {
        "Disk" => virt_launcher::safe_path::check_beneath(ctx.host_disk_dir, requested)
            .map_err(|e| fail(e.to_string()))?,
        "DiskOrCreate" => {
            let path = virt_launcher::safe_path::check_parent_beneath(ctx.host_disk_dir, requested)
                .map_err(|e| fail(e.to_string()))?;
            let capacity = hd
                .capacity
                .as_ref()
                .ok_or_else(|| fail("DiskOrCreate needs a capacity".into()))?;
            files.push(FileAction::Sparse {
                path: path.clone(),
                size: quantity_bytes("hostDisk.capacity", capacity)?,
            });
            path
        }
        other => return Err(fail(format!("type {other:?} is not Disk or DiskOrCreate"))),
    };
    let to = ctx.pod_dir.join("disks").join(format!("{name}.img"));
    files.push(FileAction::Share {
        from: path,
        to: to.clone(),
    });
    Ok(Source::at(to, DiskFormat::Raw))
}

fn disks(
    vmi: &VirtualMachineInstance,
    ctx: &SpecContext<'_>,
    files: &mut Vec<FileAction>,
) -> Result<Vec<Disk>, SpecError> {
    let mut out = Vec::new();
    for disk in &vmi.spec.domain.devices.disks {
        let volume = vmi
            .spec
            .volumes
            .iter()
            .find(|v| v.name == disk.name)
            .ok_or_else(|| {
                SpecError::Invalid(format!("disk {:?} has no volume of that name", disk.name))
            })?;
        if disk.lun.is_some() {
            return Err(SpecError::Unsupported(format!(
                "disk {:?}: lun disks are not supported",
                disk.name
            )));
        }
        let hotplug = is_hotplug_volume(volume);
        if hotplug && !hotplug_file_passed(vmi, &volume.name) {
            // Not attached yet: the domain gets it once virt-handler passed its file.
            continue;
        }
        let source = if hotplug {
            Source::at(
                Path::new(HOTPLUG_DISKS_DIR).join(format!("{}.img", volume.name)),
                DiskFormat::Raw,
            )
        } else {
            volume_source(vmi, volume, ctx, files)?
        };
        let (bus, readonly, cdrom) = match (&disk.cdrom, &disk.disk) {
            (Some(cd), _) => (cd.bus.as_ref(), cd.readonly.unwrap_or(true), true),
            (None, Some(d)) => (d.bus.as_ref(), d.readonly.unwrap_or(false), false),
            (None, None) => (None, false, false),
        };
        let cache = match disk.cache.as_ref() {
            Some(DriverCache::WriteThrough) => CacheMode::Writethrough,
            Some(DriverCache::WriteBack) => CacheMode::Writeback,
            Some(DriverCache::None) if ctx.direct_io => CacheMode::None,
            // Upstream falls back to writethrough where O_DIRECT is missing (tmpfs).
            None if ctx.direct_io => CacheMode::None,
            _ => CacheMode::Writethrough,
        };
        out.push(Disk {
            name: disk.name.clone(),
            source_path: source.path.display().to_string(),
            format: source.format,
            bus: disk_bus(bus, cdrom, &disk.name)?,
            cdrom,
            boot_order: disk.boot_order,
            serial: disk.serial.clone(),
            cache,
            readonly,
            create_size: source.create_size,
            passed_file: hotplug.then(|| volume.name.clone()),
            io: io_mode(disk, cache, source.block_device)?,
            overlay_backing: source.overlay_backing,
            block_device: source.block_device,
        });
    }
    Ok(out)
}

/// The disk's asynchronous I/O: the VMI's `io`, else upstream's choice (`SetOptimalIOMode`):
/// `native` for a block device opened with O_DIRECT, QEMU's default otherwise. A `native`
/// asked for where the host has no O_DIRECT (tmpfs, where the cache fell back to
/// writethrough) becomes threads, as the cache did; with a cache mode the VMI itself set, it
/// is refused.
fn io_mode(
    disk: &kubevirt_api::v1::Disk,
    cache: CacheMode,
    block_device: bool,
) -> Result<Option<IoMode>, SpecError> {
    use kubevirt_api::v1::DriverIo;
    match (disk.io.as_ref(), cache) {
        (Some(DriverIo::Native), CacheMode::None) => Ok(Some(IoMode::Native)),
        (Some(DriverIo::Native), _)
            if disk.cache.as_ref().is_none_or(|c| *c == DriverCache::None) =>
        {
            Ok(Some(IoMode::Threads))
        }
        (Some(DriverIo::Native), _) => Err(SpecError::Invalid(format!(
            "disk {:?}: io native needs cache none",
            disk.name
        ))),
        (Some(DriverIo::Threads), _) => Ok(Some(IoMode::Threads)),
        (None, CacheMode::None) if block_device => Ok(Some(IoMode::Native)),
        _ => Ok(None),
    }
}

/// Where upstream's launcher sees hotplugged disks; here only the name a passed file goes
/// by in logs (the launcher opens it from the file virt-handler passed, never by path).
pub const HOTPLUG_DISKS_DIR: &str = "/var/run/kubevirt/hotplug-disks";

/// A volume attached through a hotplug attachment pod: a hotpluggable claim (the launcher
/// pod never mounts those).
pub fn is_hotplug_volume(volume: &Volume) -> bool {
    volume.volume_source.is_hotpluggable() && volume.volume_source.claim_name().is_some()
}

/// Whether virt-handler passed the launcher the file of hotplug volume `name`: its status
/// phase is `MountedToPod` or `Ready` (kept in the VMI, so a restarted handler knows).
pub fn hotplug_file_passed(vmi: &VirtualMachineInstance, name: &str) -> bool {
    use kubevirt_api::v1::VolumePhase;
    vmi.status
        .iter()
        .flat_map(|s| s.volume_status.iter())
        .any(|v| {
            v.name == name
                && matches!(
                    v.phase,
                    Some(VolumePhase::MountedToPod | VolumePhase::Ready)
                )
        })
}

/// A stable MAC for an interface without one: QEMU's `52:54:00` prefix and three bytes of
/// an FNV-1a hash of the VMI UID and interface name, so restarts report the same address.
pub fn derived_mac(uid: &str, iface: &str) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in uid.bytes().chain([b'/']).chain(iface.bytes()) {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    let [_, a, b, c] = hash.to_be_bytes();
    format!("52:54:00:{a:02x}:{b:02x}:{c:02x}")
}

fn interfaces(
    vmi: &VirtualMachineInstance,
    pod_interface: Option<&PodInterface>,
    layout: &virt_launcher::pod_layout::PodLayout,
) -> Result<Vec<Interface>, SpecError> {
    let uid = vmi.metadata.uid.clone().unwrap_or_default();
    let mut out = Vec::new();
    let mut pod_network_taken = false;
    for (index, iface) in vmi.spec.domain.devices.interfaces.iter().enumerate() {
        let name = &iface.name;
        let network = vmi.spec.networks.iter().find(|n| &n.name == name);
        if let Some(multus) = network.and_then(|n| n.network_source.multus.as_ref())
            && multus.default != Some(true)
        {
            if let Some(secondary) = secondary_interface(vmi, iface, index)? {
                out.push(secondary);
            }
            continue;
        }
        let Some(pod_network) = network.and_then(|n| n.network_source.pod.as_ref()) else {
            return Err(SpecError::Unsupported(format!(
                "interface {name:?}: only the pod network and secondary Multus networks are supported in the embedded mode"
            )));
        };
        let b = &iface.binding_method;
        if b.masquerade.is_none()
            && b.bridge.is_none()
            && b.passt_binding.is_none()
            && b.slirp.is_none()
        {
            return Err(SpecError::Unsupported(format!(
                "interface {name:?}: only masquerade, bridge, passtBinding and slirp bindings are supported"
            )));
        }
        let spec_mac = iface.mac_address.clone().filter(|m| !m.is_empty());
        // Masquerade and bridge need the launcher's own network namespace; the pod network
        // has one primary interface, so only the first such interface gets it (as upstream
        // gives NAT rules to the first one only). Everything else is user-mode networking.
        let pod = pod_interface.filter(|_| {
            let wants = b.masquerade.is_some() || b.bridge.is_some() || b.passt_binding.is_some();
            let first = wants && !pod_network_taken;
            pod_network_taken |= first;
            first
        });
        let (binding, mac) = match pod {
            // Upstream: the spec's MAC, else the pod interface's (for bridge the guest takes
            // the pod's MAC and address).
            Some(pod) if b.bridge.is_some() => (
                InterfaceBinding::Bridge(pod_bridge(pod, index)),
                spec_mac.unwrap_or_else(|| pod.mac.clone()),
            ),
            Some(pod) if b.passt_binding.is_some() => (
                InterfaceBinding::Passt(Passt {
                    pod_interface: pod.name.clone(),
                    socket: layout.passt_socket().display().to_string(),
                    log: layout.passt_log().display().to_string(),
                    ports: forwarded_ports(name, &iface.ports)?,
                }),
                spec_mac.unwrap_or_else(|| derived_mac(&uid, name)),
            ),
            Some(pod) => (
                InterfaceBinding::Masquerade(masquerade(name, pod, pod_network, &iface.ports)?),
                spec_mac.unwrap_or_else(|| pod.mac.clone()),
            ),
            None => (
                InterfaceBinding::UserMode,
                spec_mac.unwrap_or_else(|| derived_mac(&uid, name)),
            ),
        };
        out.push(Interface {
            name: name.clone(),
            model: iface.model.clone().unwrap_or_else(|| "virtio".to_owned()),
            binding,
            mac_address: Some(mac),
            boot_order: iface.boot_order,
            link_down: iface.state == Some(kubevirt_api::v1::InterfaceState::Down),
        });
    }
    Ok(out)
}

/// The interface of a secondary Multus network: the bridge binding on its hashed pod
/// interface, layer 2 only. `None` while it is not to be in the domain: `absent`, or, on a
/// running VMI, before the pod's network status lists its pod interface (`multus-status`,
/// written by virt-controller; a domain starts only once the pod has every interface).
fn secondary_interface(
    vmi: &VirtualMachineInstance,
    iface: &kubevirt_api::v1::Interface,
    index: usize,
) -> Result<Option<Interface>, SpecError> {
    use kubevirt_api::v1::{InterfaceState, VirtualMachineInstancePhase as Phase};
    let name = &iface.name;
    if iface.binding_method.bridge.is_none() {
        return Err(SpecError::Unsupported(format!(
            "interface {name:?}: a secondary network is supported with the bridge binding only"
        )));
    }
    if iface.state == Some(InterfaceState::Absent) {
        return Ok(None);
    }
    let status = vmi.status.as_ref();
    let running = status.and_then(|s| s.phase.as_ref()) == Some(&Phase::Running);
    let on_pod = status.is_some_and(|s| {
        s.interfaces.iter().any(|i| {
            i.name.as_deref() == Some(name.as_str())
                && i.info_source
                    .as_deref()
                    .is_some_and(|src| src.contains("multus-status"))
        })
    });
    if running && !on_pod {
        return Ok(None);
    }
    let pod_interface = kubevirt_api::v1::hashed_pod_interface_name(name);
    let (bridge, tap, renamed) = kubevirt_api::v1::secondary_bridge_names(&pod_interface);
    let last = u8::try_from(10 + index.min(9)).unwrap_or(10);
    let uid = vmi.metadata.uid.clone().unwrap_or_default();
    Ok(Some(Interface {
        name: name.clone(),
        model: iface.model.clone().unwrap_or_else(|| "virtio".to_owned()),
        binding: InterfaceBinding::Bridge(PodBridge {
            pod_interface,
            renamed,
            bridge,
            tap,
            server: std::net::Ipv4Addr::new(169, 254, 75, last),
        }),
        mac_address: Some(
            iface
                .mac_address
                .clone()
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| derived_mac(&uid, name)),
        ),
        boot_order: iface.boot_order,
        link_down: iface.state == Some(InterfaceState::Down),
    }))
}

/// The bridge binding on the pod interface `pod` of the interface at `index` of the VMI's
/// interfaces, with upstream's names (`eth0-nic`, `k6t-eth0`, `tap0`) and DHCP server address
/// (`169.254.75.1N`).
fn pod_bridge(pod: &PodInterface, index: usize) -> PodBridge {
    let last = u8::try_from(10 + index.min(9)).unwrap_or(10);
    PodBridge {
        pod_interface: pod.name.clone(),
        renamed: format!("{}-nic", pod.name),
        bridge: format!("k6t-{}", pod.name),
        tap: "tap0".to_owned(),
        server: std::net::Ipv4Addr::new(169, 254, 75, last),
    }
}

/// The `ports` of interface `name` (protocol `tcp` unless given, lower-cased).
fn forwarded_ports(
    name: &str,
    ports: &[kubevirt_api::v1::Port],
) -> Result<Vec<ForwardedPort>, SpecError> {
    ports
        .iter()
        .map(|p| {
            let port = u16::try_from(p.port)
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| {
                    SpecError::Invalid(format!("interface {name:?}: invalid port {}", p.port))
                })?;
            Ok(ForwardedPort {
                protocol: p
                    .protocol
                    .as_deref()
                    .filter(|p| !p.is_empty())
                    .unwrap_or("tcp")
                    .to_ascii_lowercase(),
                port,
            })
        })
        .collect()
}

/// The masquerade binding of interface `name` on the pod network: gateway and guest are the
/// 2nd and 3rd address of the VM network (`10.0.2.1`, `10.0.2.2`).
fn masquerade(
    name: &str,
    pod: &PodInterface,
    network: &kubevirt_api::v1::PodNetwork,
    ports: &[kubevirt_api::v1::Port],
) -> Result<Masquerade, SpecError> {
    let cidr = network
        .vm_network_cidr
        .as_deref()
        .filter(|c| !c.is_empty())
        .unwrap_or(DEFAULT_VM_CIDR);
    let (network_address, prefix_length) = parse_ipv4_cidr(cidr).ok_or_else(|| {
        SpecError::Invalid(format!(
            "interface {name:?}: invalid vmNetworkCIDR {cidr:?}"
        ))
    })?;
    if prefix_length > 30 {
        return Err(SpecError::Invalid(format!(
            "VM CIDR subnet is too small, at least 2 host addresses are required: {cidr}"
        )));
    }
    let base = u32::from(network_address);
    let ports = forwarded_ports(name, ports)?;
    Ok(Masquerade {
        pod_interface: pod.name.clone(),
        bridge: MASQUERADE_BRIDGE.to_owned(),
        tap: MASQUERADE_TAP.to_owned(),
        gateway: (base + 1).into(),
        guest: (base + 2).into(),
        prefix_length,
        ports,
    })
}

/// `a.b.c.d/n` → the network address (host bits cleared) and `n`.
fn parse_ipv4_cidr(cidr: &str) -> Option<(std::net::Ipv4Addr, u8)> {
    let (addr, len) = cidr.split_once('/')?;
    let addr: std::net::Ipv4Addr = addr.parse().ok()?;
    let len: u8 = len.parse().ok().filter(|l| *l <= 32)?;
    let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
    Some(((u32::from(addr) & mask).into(), len))
}

#[cfg(test)]
mod tests;
