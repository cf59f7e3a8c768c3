//! End-to-end: volume hotplug on a running real guest (the test guest, TCG). With the
//! `HotplugVolumes` gate on, `virtctl addvolume --persist` adds a claim to the VM: the VM
//! template gets it, an `hp-volume-…` attachment pod mounts it on the node, the volume walks to
//! `Ready`, and the guest sees a new SCSI disk (virtctl's default bus) and writes to it — what it wrote lands in the claim's
//! `disk.img` — while its QEMU keeps running; virt-handler's pod is deleted and its
//! successor keeps the volume attached. `virtctl removevolume --persist` takes it away:
//! the guest loses the disk, the attachment pod and the volume status go. Added again, the
//! volume follows the VM across a restart, and the data is still on it. A volume added without
//! `--persist` reaches the running VMI only. Skips (saying why)
//! when the test guest, QEMU or virtctl is missing.

use std::path::{Path, PathBuf};

use testkit::{DEADLINE, ServerProcess, guest_reports, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

const CLAIMS: &str = r"apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: hot-data
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests: {storage: 64Mi}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: hot-extra
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests: {storage: 32Mi}
";

fn volume_phase(server: &ServerProcess) -> String {
    phase_of(server, "hot-data")
}

fn phase_of(server: &ServerProcess, volume: &str) -> String {
    server.get(
        &["vmi", "hot"],
        &format!(r#"{{.status.volumeStatus[?(@.name=="{volume}")].phase}}"#),
    )
}

fn attachment_pods(server: &ServerProcess) -> String {
    server.get(
        &["pods", "-l", "kubevirt.io=hotplug-disk"],
        "{.items[*].metadata.name}",
    )
}

/// The disks the guest of `pod` reported last.
fn guest_disks(server: &ServerProcess, pod: &str) -> Option<String> {
    guest_reports(&server.guest_console(pod))
        .last()
        .map(|r| r.disks.clone())
}

/// The claim's disk image on the node.
fn claim_image(server: &ServerProcess) -> PathBuf {
    let volume = server.get(&["pvc", "hot-data"], "{.spec.volumeName}");
    server
        .data_dir()
        .join("node/storage")
        .join(volume)
        .join("disk.img")
}

fn add_volume(server: &ServerProcess) -> anyhow::Result<()> {
    // The gate reaches virt-api through its watch of the KubeVirt CR.
    wait_until(DEADLINE, "virtctl addvolume to be accepted", || {
        server
            .virtctl(&["addvolume", "hot", "--volume-name=hot-data", "--persist"])
            .ok()
    })?;
    Ok(())
}

/// Waits for the volume to be `Ready` and for the guest of `pod` to report `disks`.
fn wait_attached(server: &ServerProcess, pod: &str, disks: &str) -> anyhow::Result<()> {
    wait_until(DEADLINE, "the hotplugged volume Ready", || {
        (volume_phase(server) == "Ready").then_some(())
    })?;
    wait_until(DEADLINE, &format!("the guest to see {disks:?}"), || {
        (guest_disks(server, pod).as_deref() == Some(disks)).then_some(())
    })
    .map_err(|e| {
        anyhow::anyhow!(
            "{e}\nVMI disks: {}\nVM disks: {}\nguest console:\n{}",
            server.get(&["vmi", "hot"], "{.spec.domain.devices.disks}"),
            server.get(&["vm", "hot"], "{.spec.template.spec.domain.devices.disks}"),
            server.guest_console(pod)
        )
    })
}

#[test]
fn a_claim_is_hotplugged_into_a_running_guest_written_removed_and_kept_across_a_restart()
-> anyhow::Result<()> {
    let Some(server) = ServerProcess::start_with_test_guest(Path::new(BIN))? else {
        return Ok(());
    };
    let result = scenario(&server);
    testkit::with_log(&server, result)
}

fn scenario(server: &ServerProcess) -> anyhow::Result<()> {
    server.patch_kubevirt(r#"{"spec":{"configuration":{"developerConfiguration":{"featureGates":["HotplugVolumes"]}}}}"#)?;
    server.apply(CLAIMS)?;
    server.apply(&testkit::test_guest_vm("hot", &["memory: {guest: 128Mi}"]))?;
    let (pod, uid) = wait_until(DEADLINE, "the launcher pod Running", || {
        server.running_launcher("hot")
    })?;
    wait_until(DEADLINE, "the guest to boot", || {
        server
            .guest_console(&pod)
            .contains("GUEST-READY")
            .then_some(())
    })?;
    assert_eq!(
        guest_disks(server, &pod).as_deref(),
        Some(""),
        "no disk at boot"
    );
    let qemu_pid = || {
        std::fs::read_to_string(testkit::launcher_dir(server.data_dir(), &uid).join("qemu.pid"))
            .unwrap_or_default()
    };
    let pid = qemu_pid();

    // Add: template, attachment pod, Ready, the guest sees and writes the disk.
    add_volume(server)?;
    wait_attached(server, &pod, "sda")?;
    // The volume status names the device as the guest does.
    wait_until(DEADLINE, "the hotplugged volume's target", || {
        let target = server.get(
            &["vmi", "hot"],
            r#"{.status.volumeStatus[?(@.name=="hot-data")].target}"#,
        );
        (target == "sda").then_some(())
    })?;
    let template_claim = server.get(
        &["vm", "hot"],
        r#"{.spec.template.spec.volumes[?(@.name=="hot-data")].persistentVolumeClaim.claimName}"#,
    );
    assert_eq!(
        template_claim, "hot-data",
        "--persist keeps it in the template"
    );
    assert_eq!(
        server.get(&["vm", "hot"], "{.status.volumeRequests}"),
        "",
        "the request is done"
    );
    let events = server.get(
        &[
            "events",
            "--field-selector",
            "involvedObject.kind=VirtualMachineInstance",
        ],
        "{.items[*].message}",
    );
    assert!(
        events.contains("Created hotplug attachment pod hp-volume-"),
        "the VMI's events: {events}"
    );
    let holder = attachment_pods(server);
    assert!(
        holder.starts_with("hp-volume-"),
        "attachment pod: {holder:?}"
    );
    let owner = server.get(
        &["pods", &holder],
        "{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}",
    );
    assert_eq!(owner, format!("Pod/{pod}"));
    let wrote = server.guest_run("hot", "echo HOTPLUG-WRITTEN | dd of=/dev/sda conv=fsync")?;
    assert!(wrote.contains("RUN-DONE rc=0"), "{wrote}");
    let image = std::fs::read(claim_image(server))?;
    assert!(
        image.starts_with(b"HOTPLUG-WRITTEN"),
        "the claim's disk.img holds what the guest wrote"
    );
    assert_eq!(qemu_pid(), pid, "the domain was not restarted");

    handler_restart_keeps_the_volume(server, &pod)?;
    assert_eq!(qemu_pid(), pid, "the domain outlived its handler");
    // The new handler drives the removal of what the old one attached.
    remove_volume(server, &pod, &qemu_pid, &pid)?;
    restart_and_add_unpersisted(server, &pod)
}

/// Deletes virt-handler's pod: the DaemonSet's new pod takes over the running VMI, whose
/// hotplugged volume stays `Ready` and in the guest (upstream keeps the attachment in the VMI,
/// so a restarted handler knows it).
fn handler_restart_keeps_the_volume(server: &ServerProcess, pod: &str) -> anyhow::Result<()> {
    let handler_pod = || {
        server.get(
            &["pods", "-n", "kubevirt", "-l", "kubevirt.io=virt-handler"],
            "{range .items[*]}{.metadata.uid} {.status.phase} {.status.containerStatuses[0].ready}{\"\\n\"}{end}",
        )
    };
    let before = handler_pod();
    let old_uid = before
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned();
    anyhow::ensure!(!old_uid.is_empty(), "no virt-handler pod: {before:?}");
    server.ok(&[
        "-n",
        "kubevirt",
        "delete",
        "pod",
        "-l",
        "kubevirt.io=virt-handler",
        "--wait=false",
    ])?;
    wait_until(DEADLINE, "a new virt-handler pod to be ready", || {
        let now = handler_pod();
        let lines: Vec<&str> = now.lines().filter(|l| !l.trim().is_empty()).collect();
        (lines.len() == 1 && !lines[0].starts_with(&old_uid) && lines[0].ends_with("Running true"))
            .then_some(())
    })?;
    assert_eq!(
        phase_of(server, "hot-data"),
        "Ready",
        "the volume stays attached"
    );
    assert_eq!(
        guest_disks(server, pod).as_deref(),
        Some("sda"),
        "the guest keeps the disk"
    );
    let read = server.guest_run("hot", "head -c 15 /dev/sda; echo")?;
    assert!(
        read.contains("HOTPLUG-WRITTEN"),
        "the disk still reads back: {read}"
    );
    Ok(())
}

/// Removes the volume with `--persist`: the guest loses it, the attachment pod and the status
/// entry go, the template forgets it, the domain runs on.
fn remove_volume(
    server: &ServerProcess,
    pod: &str,
    qemu_pid: &dyn Fn() -> String,
    pid: &str,
) -> anyhow::Result<()> {
    // Remove: the guest loses it, the attachment pod and the status entry go.
    server.virtctl(&["removevolume", "hot", "--volume-name=hot-data", "--persist"])?;
    wait_until(DEADLINE, "the guest to lose the disk", || {
        (guest_disks(server, pod).as_deref() == Some("")).then_some(())
    })?;
    wait_until(
        DEADLINE,
        "the attachment pod and the volume status to go",
        || (attachment_pods(server).is_empty() && volume_phase(server).is_empty()).then_some(()),
    )?;
    assert_eq!(
        server.get(&["vm", "hot"], "{.spec.template.spec.volumes[*].name}"),
        "",
        "--persist removed it from the template"
    );
    assert_eq!(qemu_pid(), pid, "the domain was not restarted");
    // The handler records upstream's Event for the removal.
    wait_until(DEADLINE, "the VolumeUnplugged event", || {
        let events = server.get(
            &["events"],
            r#"{range .items[?(@.reason=="VolumeUnplugged")]}{.involvedObject.name}/{.source.component}/{.message}{"\n"}{end}"#,
        );
        events
            .lines()
            .any(|l| l == "hot/virt-handler/Volume hot-data has been unplugged")
            .then_some(())
    })?;
    Ok(())
}

/// Adds the volume again, restarts the VM (it comes back with its data), then adds a second
/// one without `--persist`.
fn restart_and_add_unpersisted(server: &ServerProcess, pod: &str) -> anyhow::Result<()> {
    // Added again, it comes back after a restart of the VM, with its data.
    add_volume(server)?;
    wait_attached(server, pod, "sda")?;
    server.virtctl(&["restart", "hot"])?;
    let (new_pod, _) = wait_until(DEADLINE, "a new launcher pod Running", || {
        server
            .running_launcher("hot")
            .filter(|(name, _)| *name != pod)
    })?;
    wait_attached(server, &new_pod, "sda")?;
    let read = server.guest_run("hot", "head -c 15 /dev/sda; echo")?;
    assert!(read.contains("HOTPLUG-WRITTEN"), "{read}");

    // Without --persist the volume goes to the running VMI only.
    server.virtctl(&["addvolume", "hot", "--volume-name=hot-extra"])?;
    wait_until(DEADLINE, "the second volume Ready", || {
        (phase_of(server, "hot-extra") == "Ready").then_some(())
    })?;
    wait_until(DEADLINE, "the guest to see both disks", || {
        (guest_disks(server, &new_pod).as_deref() == Some("sda,sdb")).then_some(())
    })?;
    assert_eq!(
        server.get(&["vm", "hot"], "{.spec.template.spec.volumes[*].name}"),
        "hot-data",
        "not persisted"
    );
    Ok(())
}
