use super::*;
use crate::images::{ImportFile, import};

struct Fixture {
    _tmp: tempfile::TempDir,
    data: PathBuf,
    pod: PathBuf,
    hostdisks: PathBuf,
    images: ImageStore,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let pod = data.join("pods").join("pod-uid");
    let hostdisks = data.join("hostdisks");
    std::fs::create_dir_all(&pod).unwrap();
    std::fs::create_dir_all(&hostdisks).unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    for name in ["vmlinux", "initramfs.cpio.gz"] {
        std::fs::write(src.join(name), name).unwrap();
    }
    // A real (empty) qcow2 of 1 GiB: its overlay takes the size from its header.
    let guest = super::overlay::overlay_bytes("none", "raw", 1 << 30).unwrap();
    std::fs::write(src.join("guest.qcow2"), guest).unwrap();
    import(
        &data,
        "kubevirt-rs/test-guest:latest",
        &[
            ImportFile {
                source: src.join("vmlinux"),
                destination: None,
            },
            ImportFile {
                source: src.join("initramfs.cpio.gz"),
                destination: None,
            },
            ImportFile {
                source: src.join("guest.qcow2"),
                destination: Some("/disk/".into()),
            },
        ],
    )
    .unwrap();
    let images = ImageStore::new(&data);
    Fixture {
        _tmp: tmp,
        data,
        pod,
        hostdisks,
        images,
    }
}

impl Fixture {
    fn ctx(&self) -> SpecContext<'_> {
        SpecContext {
            pod_dir: &self.pod,
            images: &self.images,
            host_disk_dir: &self.hostdisks,
            accel: Accel::Tcg,
            direct_io: false,
            pod_interface: None,
            pod_volumes_dir: &self.pod,
        }
    }
}

fn vmi(spec: &serde_json::Value) -> VirtualMachineInstance {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "demo", "namespace": "default", "uid": "1234-uid"},
        "spec": spec,
    }))
    .unwrap()
}

fn demo_vmi() -> VirtualMachineInstance {
    vmi(&serde_json::json!({
        "domain": {
            "cpu": {"cores": 1},
            "memory": {"guest": "128Mi"},
            "firmware": {"kernelBoot": {
                "kernelArgs": "console=ttyS0 panic=-1",
                "container": {
                    "image": "kubevirt-rs/test-guest:latest",
                    "kernelPath": "/vmlinux",
                    "initrdPath": "/initramfs.cpio.gz"
                }
            }},
            "devices": {
                "disks": [],
                "interfaces": [{"name": "default", "masquerade": {}}]
            }
        },
        "networks": [{"name": "default", "pod": {}}]
    }))
}

#[test]
fn the_demo_vm_becomes_a_tcg_kernel_boot_spec_with_files_in_the_pod_dir() {
    let f = fixture();
    let prepared = build_spec(&demo_vmi(), &f.ctx()).unwrap();
    let spec = &prepared.spec;
    let pod = f.pod.display().to_string();
    assert_eq!(spec.vmi.name, "demo");
    assert_eq!(spec.machine_type, "q35");
    assert_eq!(spec.accel, Accel::Tcg);
    assert_eq!(spec.tcg_translation_cache_mib, Some(32));
    assert_eq!(
        (spec.cpu.sockets, spec.cpu.cores, spec.cpu.threads),
        (1, 1, 1)
    );
    assert_eq!(spec.cpu.model, CpuModel::HostModel);
    assert_eq!(spec.memory.guest_bytes, 128 << 20);
    let kb = spec.firmware.kernel_boot.as_ref().unwrap();
    assert_eq!(kb.kernel_path, format!("{pod}/boot/kernel"));
    assert_eq!(
        kb.initrd_path.as_deref(),
        Some(&*format!("{pod}/boot/initrd"))
    );
    assert_eq!(kb.kernel_args, "console=ttyS0 panic=-1");
    assert_eq!(
        spec.paths.serial_log,
        format!("{pod}/guest-console-log.log")
    );
    assert_eq!(spec.paths.qmp_socket, format!("{pod}/qmp.sock"));
    assert_eq!(spec.interfaces.len(), 1);
    assert_eq!(spec.interfaces[0].binding, InterfaceBinding::UserMode);
    assert_eq!(
        spec.interfaces[0].mac_address.as_deref(),
        Some(&*derived_mac("1234-uid", "default"))
    );
    let image_dir = f.data.join("images/kubevirt-rs%2Ftest-guest%3Alatest");
    assert_eq!(
        prepared.files,
        vec![
            FileAction::Link {
                from: image_dir.join("vmlinux"),
                to: f.pod.join("boot/kernel")
            },
            FileAction::Link {
                from: image_dir.join("initramfs.cpio.gz"),
                to: f.pod.join("boot/initrd")
            },
        ]
    );
    prepare_files(&prepared.files).unwrap();
    assert_eq!(
        std::fs::read_to_string(f.pod.join("boot/kernel")).unwrap(),
        "vmlinux"
    );
}

#[test]
fn the_spec_serialises_to_the_expected_launcher_json() {
    let f = fixture();
    let spec = build_spec(&demo_vmi(), &f.ctx()).unwrap().spec;
    let json = serde_json::to_value(&spec).unwrap();
    let pod = f.pod.display().to_string();
    let expected = serde_json::json!({
        "vmi": {"name": "demo", "namespace": "default", "uid": "1234-uid"},
        "machineType": "q35",
        "accel": "tcg",
        "tcgTranslationCacheMib": 32,
        "cpu": {"sockets": 1, "cores": 1, "threads": 1, "model": "host-model"},
        "memory": {"guestBytes": 134_217_728},
        "firmware": {
            "bootloader": "bios",
            "kernelBoot": {
                "kernelPath": format!("{pod}/boot/kernel"),
                "initrdPath": format!("{pod}/boot/initrd"),
                "kernelArgs": "console=ttyS0 panic=-1"
            }
        },
        "disks": [],
        "interfaces": [{
            "name": "default", "model": "virtio", "binding": "userMode",
            "macAddress": derived_mac("1234-uid", "default")
        }],
        "hotplugPorts": 3,
        "graphics": {"video": "vga", "vncSocket": format!("{pod}/vnc.sock")},
        "paths": {
            "serialConsoleSocket": format!("{pod}/serial0.sock"),
            "serialLog": format!("{pod}/guest-console-log.log"),
            "qmpSocket": format!("{pod}/qmp.sock"),
            "pidFile": format!("{pod}/qemu.pid")
        }
    });
    assert_eq!(json, expected);
}

#[test]
fn graphics_follow_autoattach_graphics_device_and_the_video_type() {
    let f = fixture();
    let with_devices = |extra: serde_json::Value| {
        let mut vmi = serde_json::to_value(demo_vmi()).unwrap();
        for (key, value) in extra.as_object().unwrap() {
            vmi["spec"]["domain"]["devices"][key] = value.clone();
        }
        build_spec(&serde_json::from_value(vmi).unwrap(), &f.ctx())
    };
    let off = with_devices(serde_json::json!({"autoattachGraphicsDevice": false})).unwrap();
    assert_eq!(off.spec.graphics, None);
    for (video, model) in [
        (serde_json::json!({}), VideoModel::Vga),
        (
            serde_json::json!({"video": {"type": "bochs"}}),
            VideoModel::Bochs,
        ),
        (
            serde_json::json!({"video": {"type": "virtio"}}),
            VideoModel::Virtio,
        ),
    ] {
        let graphics = with_devices(video)
            .unwrap()
            .spec
            .graphics
            .expect("graphics");
        assert_eq!(graphics.video, model);
        assert_eq!(graphics.vnc_socket, format!("{}/vnc.sock", f.pod.display()));
    }
    let err = with_devices(serde_json::json!({"video": {"type": "cirrus"}})).unwrap_err();
    assert!(err.to_string().contains("\"cirrus\""), "{err}");
}

#[test]
fn topology_memory_efi_and_disks_are_resolved() {
    let f = fixture();
    let v = vmi(&serde_json::json!({
        "domain": {
            "cpu": {"sockets": 2, "cores": 2, "threads": 1, "maxSockets": 4, "model": "Skylake-Server"},
            "memory": {"guest": "1Gi", "maxGuest": "4Gi"},
            "firmware": {"uuid": "5d307ca9-b3ef-428c-8861-06e72d69f223", "serial": "s-1", "bootloader": {"efi": {"secureBoot": false}}},
            "devices": {"disks": [
                {"name": "root", "disk": {"bus": "virtio"}, "bootOrder": 1},
                {"name": "scratch", "disk": {"bus": "sata"}, "cache": "writeback"},
                {"name": "host", "disk": {}}
            ]}
        },
        "volumes": [
            {"name": "root", "containerDisk": {"image": "kubevirt-rs/test-guest:latest"}},
            {"name": "scratch", "emptyDisk": {"capacity": "2Gi"}},
            {"name": "host", "hostDisk": {"path": f.hostdisks.join("h.img").display().to_string(), "type": "DiskOrCreate", "capacity": "1Mi"}}
        ]
    }));
    let prepared = build_spec(&v, &f.ctx()).unwrap();
    let spec = &prepared.spec;
    assert_eq!(
        (spec.cpu.sockets, spec.cpu.cores, spec.cpu.max_sockets),
        (2, 2, Some(4))
    );
    assert_eq!(spec.cpu.model, CpuModel::Named("Skylake-Server".into()));
    assert_eq!(spec.memory.guest_bytes, 1 << 30);
    assert_eq!(spec.memory.max_guest_bytes, Some(4 << 30));
    assert_eq!(
        spec.firmware.uuid.as_deref(),
        Some("5d307ca9-b3ef-428c-8861-06e72d69f223")
    );
    match &spec.firmware.bootloader {
        Bootloader::Efi(efi) => {
            assert_eq!(efi.code_path, OVMF_CODE);
            assert_eq!(
                efi.vars_path,
                f.pod.join("efi-vars.fd").display().to_string()
            );
        }
        Bootloader::Bios => panic!("expected EFI"),
    }
    let root = &spec.disks[0];
    assert_eq!(root.format, DiskFormat::Qcow2);
    assert_eq!(
        root.source_path,
        f.pod.join("disks/root.qcow2").display().to_string()
    );
    assert_eq!(root.boot_order, Some(1));
    assert_eq!(
        root.cache,
        CacheMode::Writethrough,
        "no O_DIRECT in this context"
    );
    assert_eq!(spec.disks[1].bus, DiskBus::Sata);
    assert_eq!(spec.disks[1].cache, CacheMode::Writeback);
    // The EFI vars copy needs Debian's ovmf package; check the disk actions only.
    let disk_actions: Vec<_> = prepared
        .files
        .iter()
        .filter(|a| !matches!(a, FileAction::Copy { from, .. } if from.starts_with("/usr")))
        .cloned()
        .collect();
    prepare_files(&disk_actions).unwrap();
    assert_eq!(
        std::fs::metadata(f.pod.join("disks/scratch.img"))
            .unwrap()
            .len(),
        2 << 30
    );
    // The image's disk is linked in as the backing file of an overlay of its size.
    let base = f.pod.join("disks/base/root.qcow2");
    assert_eq!(
        super::overlay::virtual_size(&base, true).unwrap(),
        1 << 30,
        "the image's disk"
    );
    let overlay = f.pod.join("disks/root.qcow2");
    assert_eq!(
        super::overlay::virtual_size(&overlay, true).unwrap(),
        1 << 30
    );
    let header = std::fs::read(&overlay).unwrap();
    assert!(
        header
            .windows(b"base/root.qcow2".len())
            .any(|w| w == b"base/root.qcow2"),
        "the overlay names its backing file relative to itself"
    );
    assert_eq!(
        std::fs::metadata(f.pod.join("disks/host.img"))
            .unwrap()
            .len(),
        1 << 20
    );
    // A second prepare leaves existing files alone.
    std::fs::write(f.pod.join("disks/root.qcow2"), "guest wrote").unwrap();
    prepare_files(&disk_actions).unwrap();
    assert_eq!(
        std::fs::read_to_string(f.pod.join("disks/root.qcow2")).unwrap(),
        "guest wrote"
    );
}

#[test]
fn cpu_requests_become_cores_when_no_topology_is_given() {
    let f = fixture();
    let v = vmi(&serde_json::json!({
        "domain": {"resources": {"requests": {"cpu": "1500m", "memory": "100M"}}, "devices": {}}
    }));
    let spec = build_spec(&v, &f.ctx()).unwrap().spec;
    assert_eq!(spec.cpu.cores, 2);
    assert_eq!(
        spec.memory.guest_bytes,
        96 << 20,
        "100M rounded up to whole MiB"
    );
}

#[test]
fn quantities_round_up_as_kubernetes_value_does() {
    let f = fixture();
    // 1.0001 CPUs is more than one: two cores (the old thousandths truncated it to one).
    let v = vmi(&serde_json::json!({
        "domain": {"resources": {"requests": {"cpu": "1.0001", "memory": "1.5Gi"}}, "devices": {}}
    }));
    let spec = build_spec(&v, &f.ctx()).unwrap().spec;
    assert_eq!(spec.cpu.cores, 2);
    assert_eq!(spec.memory.guest_bytes, 1536 << 20);
}

#[test]
fn unsupported_volumes_and_bindings_are_clear_errors() {
    let f = fixture();
    let ephemeral = vmi(&serde_json::json!({
        "domain": {"memory": {"guest": "128Mi"}, "devices": {"disks": [{"name": "d", "disk": {}}]}},
        "volumes": [{"name": "d", "ephemeral": {}}]
    }));
    let err = build_spec(&ephemeral, &f.ctx()).unwrap_err();
    assert!(matches!(err, SpecError::Invalid(_)));
    assert!(err.to_string().contains("persistentVolumeClaim"), "{err}");
    let metrics = vmi(&serde_json::json!({
        "domain": {"memory": {"guest": "128Mi"}, "devices": {"disks": [{"name": "d", "disk": {}}]}},
        "volumes": [{"name": "d", "downwardMetrics": {}}]
    }));
    let err = build_spec(&metrics, &f.ctx()).unwrap_err();
    assert!(matches!(err, SpecError::Unsupported(_)));
    assert_eq!(
        err.to_string(),
        "volume \"d\": downwardMetrics volumes are not supported yet"
    );

    // A claim too small for any image is refused with its size.
    let tiny = vmi(&serde_json::json!({
        "domain": {"memory": {"guest": "128Mi"}, "devices": {"disks": [{"name": "d", "disk": {}}]}},
        "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "c"}}]
    }));
    let mut tiny = tiny;
    tiny.status.get_or_insert_default().volume_status = serde_json::from_value(serde_json::json!([
        {"name": "d", "target": "", "persistentVolumeClaimInfo": {"capacity": {"storage": "512Ki"}}}
    ]))
    .unwrap();
    let err = build_spec(&tiny, &f.ctx()).unwrap_err();
    assert!(err.to_string().contains("524288 bytes"), "{err}");

    let missing_image = vmi(&serde_json::json!({
        "domain": {"memory": {"guest": "128Mi"}, "devices": {"disks": [{"name": "d", "disk": {}}]}},
        "volumes": [{"name": "d", "containerDisk": {"image": "quay.io/nope:1"}}]
    }));
    let err = build_spec(&missing_image, &f.ctx()).unwrap_err();
    assert_eq!(err.reason(), "ImageNotFound");

    let sriov = vmi(&serde_json::json!({
        "domain": {"memory": {"guest": "128Mi"}, "devices": {"interfaces": [{"name": "n", "sriov": {}}]}},
        "networks": [{"name": "n", "pod": {}}]
    }));
    assert!(matches!(
        build_spec(&sriov, &f.ctx()).unwrap_err(),
        SpecError::Unsupported(_)
    ));

    let outside = vmi(&serde_json::json!({
        "domain": {"memory": {"guest": "128Mi"}, "devices": {"disks": [{"name": "d", "disk": {}}]}},
        "volumes": [{"name": "d", "hostDisk": {"path": "/etc/passwd", "type": "Disk"}}]
    }));
    assert_eq!(
        build_spec(&outside, &f.ctx()).unwrap_err().reason(),
        "HostDiskNotUsable"
    );

    // A relative path is refused, even one that names a file below the host-disk directory:
    // it would be opened relative to the handler's working directory.
    std::fs::write(f.hostdisks.join("rel.img"), b"x").unwrap();
    let relative = vmi(&serde_json::json!({
        "domain": {"memory": {"guest": "128Mi"}, "devices": {"disks": [{"name": "d", "disk": {}}]}},
        "volumes": [{"name": "d", "hostDisk": {"path": "rel.img", "type": "Disk"}}]
    }));
    let err = build_spec(&relative, &f.ctx()).unwrap_err();
    assert_eq!(err.reason(), "HostDiskNotUsable");
    assert!(err.to_string().contains("not absolute"), "{err}");

    // A symlink component is refused even when it points inside the directory.
    std::fs::create_dir(f.hostdisks.join("real")).unwrap();
    std::fs::write(f.hostdisks.join("real/d.img"), b"x").unwrap();
    std::os::unix::fs::symlink(f.hostdisks.join("real"), f.hostdisks.join("via")).unwrap();
    let through_link = vmi(&serde_json::json!({
        "domain": {"memory": {"guest": "128Mi"}, "devices": {"disks": [{"name": "d", "disk": {}}]}},
        "volumes": [{"name": "d", "hostDisk": {"path": f.hostdisks.join("via/d.img").display().to_string(), "type": "Disk"}}]
    }));
    assert_eq!(
        build_spec(&through_link, &f.ctx()).unwrap_err().reason(),
        "HostDiskNotUsable"
    );

    // An absolute path below the directory is linked from where it was checked.
    let inside = vmi(&serde_json::json!({
        "domain": {"memory": {"guest": "128Mi"}, "devices": {"disks": [{"name": "d", "disk": {}}]}},
        "volumes": [{"name": "d", "hostDisk": {"path": f.hostdisks.join("real/d.img").display().to_string(), "type": "Disk"}}]
    }));
    let prepared = build_spec(&inside, &f.ctx()).unwrap();
    assert!(
        prepared.files.iter().any(|a| matches!(a,
            FileAction::Share { from, .. } if from == &f.hostdisks.join("real/d.img"))),
        "{:?}",
        prepared.files
    );

    let no_memory = vmi(&serde_json::json!({"domain": {"devices": {}}}));
    assert_eq!(
        build_spec(&no_memory, &f.ctx()).unwrap_err().reason(),
        "InvalidSpec"
    );
}

#[test]
fn cloud_init_no_cloud_becomes_a_cidata_disk() {
    let tools = test_prerequisites::command("mkfs.vfat", "dosfstools")
        .and_then(|_| test_prerequisites::command("mcopy", "mtools"));
    if test_prerequisites::available(tools).is_none() {
        return;
    }
    let f = fixture();
    let v = vmi(&serde_json::json!({
        "domain": {"memory": {"guest": "128Mi"}, "devices": {"disks": [{"name": "ci", "disk": {}}]}},
        "volumes": [{"name": "ci", "cloudInitNoCloud": {"userData": "#!/bin/sh\necho hi\n"}}]
    }));
    let prepared = build_spec(&v, &f.ctx()).unwrap();
    prepare_files(&prepared.files).unwrap();
    let image = f.pod.join("disks/ci-cidata.img");
    let listing = std::process::Command::new("mdir")
        .args(["-b", "-i"])
        .arg(&image)
        .arg("::")
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert!(listing.contains("user-data"), "{listing}");
    assert!(listing.contains("meta-data"), "{listing}");
}

#[test]
fn base64_cloud_init_data_wins_over_the_plain_field_and_bad_base64_is_refused() {
    let tools = test_prerequisites::command("mkfs.vfat", "dosfstools")
        .and_then(|_| test_prerequisites::command("mcopy", "mtools"));
    if test_prerequisites::available(tools).is_none() {
        return;
    }
    let f = fixture();
    let with = |source: serde_json::Value| {
        vmi(&serde_json::json!({
            "domain": {"memory": {"guest": "128Mi"}, "devices": {"disks": [{"name": "ci", "disk": {}}]}},
            "volumes": [{"name": "ci", "cloudInitNoCloud": source}]
        }))
    };
    // "#!/bin/sh\necho from base64\n"
    let v = with(serde_json::json!({
        "userData": "#!/bin/sh\necho plain\n",
        "userDataBase64": "IyEvYmluL3NoCmVjaG8gZnJvbSBiYXNlNjQK",
    }));
    let prepared = build_spec(&v, &f.ctx()).unwrap();
    prepare_files(&prepared.files).unwrap();
    let image = f.pod.join("disks/ci-cidata.img");
    let user_data = std::process::Command::new("mtype")
        .arg("-i")
        .arg(&image)
        .arg("::user-data")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&user_data.stdout),
        "#!/bin/sh\necho from base64\n"
    );
    let bad = with(serde_json::json!({"userDataBase64": "not base64!"}));
    let err = build_spec(&bad, &f.ctx()).unwrap_err();
    assert_eq!(err.reason(), "InvalidSpec");
    assert!(err.to_string().contains("userDataBase64"), "{err}");
}

#[test]
fn derived_macs_are_stable_and_local_to_qemus_prefix() {
    let a = derived_mac("uid-1", "default");
    assert_eq!(a, derived_mac("uid-1", "default"));
    assert_ne!(a, derived_mac("uid-2", "default"));
    assert!(a.starts_with("52:54:00:") && a.len() == 17, "{a}");
}

mod golden;

#[test]
fn the_claim_disks_directory_is_where_the_launcher_pod_mounts_claims() {
    assert_eq!(
        virt_launcher::pod_layout::CLAIM_DISKS_DIR,
        kubevirt_api::constants::VMI_DISKS_DIR
    );
}

#[test]
fn a_passt_interface_gets_passts_socket_and_log_in_the_pod_dir_and_its_ports() {
    let f = fixture();
    let pod = PodInterface {
        name: "eth0".into(),
        mac: "0a:58:0a:00:00:05".into(),
        ip_addresses: vec!["10.85.0.5".into()],
        mtu: 1500,
    };
    let ctx = SpecContext {
        pod_interface: Some(&pod),
        ..f.ctx()
    };
    let mut vmi = demo_vmi();
    vmi.spec.domain.devices.interfaces = serde_json::from_value(serde_json::json!([
        {"name": "default", "passtBinding": {},
         "ports": [{"port": 8080}, {"port": 53, "protocol": "UDP"}]}
    ]))
    .unwrap();
    let spec = build_spec(&vmi, &ctx).unwrap().spec;
    let dir = f.pod.display().to_string();
    let InterfaceBinding::Passt(passt) = &spec.interfaces[0].binding else {
        panic!("{:?}", spec.interfaces[0].binding)
    };
    assert_eq!(passt.pod_interface, "eth0");
    assert_eq!(passt.socket, format!("{dir}/passt.sock"));
    assert_eq!(passt.log, format!("{dir}/passt.log"));
    let ports: Vec<(&str, u16)> = passt
        .ports
        .iter()
        .map(|p| (p.protocol.as_str(), p.port))
        .collect();
    assert_eq!(ports, [("tcp", 8080), ("udp", 53)]);
    // The guest's MAC is its own: passt answers it from the pod interface's.
    assert_ne!(
        spec.interfaces[0].mac_address.as_deref(),
        Some("0a:58:0a:00:00:05")
    );
    // Without the pod's own network namespace, user-mode networking, as the other bindings.
    let spec = build_spec(&vmi, &f.ctx()).unwrap().spec;
    assert_eq!(spec.interfaces[0].binding, InterfaceBinding::UserMode);
}

/// A VMI with one disk `d` (`disk` given as JSON) of volume `volume`.
fn one_disk(disk: serde_json::Value, volume: serde_json::Value) -> VirtualMachineInstance {
    let mut volume = volume;
    volume["name"] = "d".into();
    let mut disk = disk;
    disk["name"] = "d".into();
    vmi(&serde_json::json!({
        "domain": {"memory": {"guest": "128Mi"}, "devices": {"disks": [disk]}},
        "volumes": [volume]
    }))
}

#[test]
fn an_ephemeral_volume_is_an_overlay_the_launcher_makes_over_the_claims_image() {
    let f = fixture();
    let mut eph = one_disk(
        serde_json::json!({"disk": {"bus": "virtio"}}),
        serde_json::json!({"ephemeral": {"persistentVolumeClaim": {"claimName": "golden"}}}),
    );
    let prepared = build_spec(&eph, &f.ctx()).unwrap();
    let disk = &prepared.spec.disks[0];
    assert_eq!(disk.format, DiskFormat::Qcow2);
    assert_eq!(
        Path::new(&disk.source_path),
        f.pod.join("disks/d.qcow2"),
        "the overlay is in the launcher's own directory"
    );
    assert_eq!(
        disk.overlay_backing.as_deref(),
        Some("/var/run/kubevirt-private/vmi-disks/d/disk.img")
    );
    assert_eq!(disk.create_size, None, "the claim's image is never created");
    assert!(!disk.block_device);
    assert!(
        prepared.files.is_empty(),
        "the handler does not see the claim: {:?}",
        prepared.files
    );
    // A Block-mode claim is overlaid at its device.
    eph.status.get_or_insert_default().volume_status = serde_json::from_value(serde_json::json!([
        {"name": "d", "target": "", "persistentVolumeClaimInfo": {"volumeMode": "Block"}}
    ]))
    .unwrap();
    let prepared = build_spec(&eph, &f.ctx()).unwrap();
    assert_eq!(
        prepared.spec.disks[0].overlay_backing.as_deref(),
        Some("/dev/d")
    );
}

#[test]
fn a_block_claim_is_its_device_at_dev_raw_and_never_created() {
    let f = fixture();
    let mut claim = one_disk(
        serde_json::json!({"disk": {"bus": "virtio"}}),
        serde_json::json!({"persistentVolumeClaim": {"claimName": "raw"}}),
    );
    claim.status.get_or_insert_default().volume_status = serde_json::from_value(serde_json::json!([
        {"name": "d", "target": "", "persistentVolumeClaimInfo": {"volumeMode": "Block", "capacity": {"storage": "1Gi"}}}
    ]))
    .unwrap();
    let disk = build_spec(&claim, &f.ctx()).unwrap().spec.disks.remove(0);
    assert_eq!(disk.source_path, "/dev/d");
    assert_eq!(disk.format, DiskFormat::Raw);
    assert!(disk.block_device);
    assert_eq!(disk.create_size, None);
    // A filesystem claim stays the image in its directory.
    claim.status.get_or_insert_default().volume_status = serde_json::from_value(serde_json::json!([
        {"name": "d", "target": "", "persistentVolumeClaimInfo": {"volumeMode": "Filesystem", "capacity": {"storage": "1Gi"}}}
    ]))
    .unwrap();
    let disk = build_spec(&claim, &f.ctx()).unwrap().spec.disks.remove(0);
    assert_eq!(
        disk.source_path,
        "/var/run/kubevirt-private/vmi-disks/d/disk.img"
    );
    assert!(!disk.block_device);
    assert!(disk.create_size.is_some());
}

/// A kubelet configMap or secret volume directory: the atomic writer's layout.
fn kubelet_volume(dir: &Path, files: &[&str]) {
    let stamp = dir.join("..2026_12_06_10_00_00.000000001");
    std::fs::create_dir_all(&stamp).unwrap();
    std::os::unix::fs::symlink("..2026_12_06_10_00_00.000000001", dir.join("..data")).unwrap();
    for name in files {
        std::fs::write(stamp.join(name), format!("<{name}/>")).unwrap();
        std::os::unix::fs::symlink(format!("..data/{name}"), dir.join(name)).unwrap();
    }
}

#[test]
fn a_sysprep_volume_is_an_unattend_cd_iso_of_its_map_or_secret_with_an_answer_file() {
    let f = fixture();
    let cdrom = serde_json::json!({"cdrom": {"bus": "sata"}});
    let from_map = one_disk(
        cdrom.clone(),
        serde_json::json!({"sysprep": {"configMap": {"name": "answers"}}}),
    );
    // Without the pod volume: upstream's message with the cause.
    let err = build_spec(&from_map, &f.ctx()).unwrap_err();
    assert!(
        err.to_string().starts_with(
            "Error validating that autounattend.xml or unattend.xml have been provided: "
        ),
        "{err}"
    );
    // Neither answer file: upstream's message.
    let map_dir = f.pod.join("kubernetes.io~configmap/d");
    kubelet_volume(&map_dir, &["other.xml"]);
    let err = build_spec(&from_map, &f.ctx()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Sysprep drive should contain autounattend.xml or unattend.xml but neither were found."
    );
    assert_eq!(err.reason(), "InvalidSpec");
    std::fs::remove_dir_all(&map_dir).unwrap();
    // Names are compared in lower case, as upstream.
    kubelet_volume(&map_dir, &["Autounattend.XML", "other.xml"]);
    let prepared = build_spec(&from_map, &f.ctx()).unwrap();
    let disk = &prepared.spec.disks[0];
    assert!(disk.cdrom && disk.readonly);
    assert_eq!(disk.format, DiskFormat::Raw);
    assert_eq!(
        prepared.files,
        vec![FileAction::ConfigIso {
            path: f.pod.join("disks/d.iso"),
            label: Some("unattendCD".into()),
            source: map_dir.clone(),
        }]
    );
    // From a secret: its kubelet directory.
    let secret_dir = f.pod.join("kubernetes.io~secret/d");
    kubelet_volume(&secret_dir, &["unattend.xml"]);
    let from_secret = one_disk(
        cdrom,
        serde_json::json!({"sysprep": {"secret": {"name": "answers"}}}),
    );
    let prepared = build_spec(&from_secret, &f.ctx()).unwrap();
    assert!(matches!(&prepared.files[0],
        FileAction::ConfigIso { source, label, .. } if *source == secret_dir && label.as_deref() == Some("unattendCD")));
    // Neither source: refused.
    let empty = one_disk(
        serde_json::json!({"cdrom": {}}),
        serde_json::json!({"sysprep": {}}),
    );
    assert_eq!(
        build_spec(&empty, &f.ctx()).unwrap_err().reason(),
        "InvalidSpec"
    );
}

#[test]
fn a_disks_io_is_the_vmis_or_native_for_a_block_device_with_o_direct() {
    let disk = |extra: serde_json::Value| -> kubevirt_api::v1::Disk {
        let mut d = serde_json::json!({"name": "d", "disk": {}});
        d.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(d).unwrap()
    };
    let none = serde_json::json!({});
    assert_eq!(
        io_mode(&disk(none.clone()), CacheMode::None, true).unwrap(),
        Some(IoMode::Native)
    );
    assert_eq!(
        io_mode(&disk(none.clone()), CacheMode::None, false).unwrap(),
        None
    );
    assert_eq!(
        io_mode(&disk(none), CacheMode::Writethrough, true).unwrap(),
        None
    );
    let threads = disk(serde_json::json!({"io": "threads"}));
    assert_eq!(
        io_mode(&threads, CacheMode::None, true).unwrap(),
        Some(IoMode::Threads)
    );
    let native = disk(serde_json::json!({"io": "native", "cache": "none"}));
    assert_eq!(
        io_mode(&native, CacheMode::None, false).unwrap(),
        Some(IoMode::Native)
    );
    // No O_DIRECT here (the cache fell back to writethrough): native falls back to threads.
    assert_eq!(
        io_mode(&native, CacheMode::Writethrough, false).unwrap(),
        Some(IoMode::Threads)
    );
    let conflicting = disk(serde_json::json!({"io": "native", "cache": "writethrough"}));
    let err = io_mode(&conflicting, CacheMode::Writethrough, false).unwrap_err();
    assert_eq!(err.to_string(), r#"disk "d": io native needs cache none"#);
}
