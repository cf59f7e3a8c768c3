//! End-to-end (`kubevirt-rs server --fake-qemu`): a VM whose disk is a claim. While the claim
//! is missing the VM shows `ErrorPvcNotFound` and no launcher pod exists; once the claim is
//! created the VM starts, the claim is provisioned and bound on the node, and the launcher
//! creates the claim's `disk.img` sparse at the claim's capacity less the filesystem overhead.
//! A restart keeps the image (and what the guest wrote into it).
//!
//! On a real test guest (TCG): an `ephemeral` disk over a claim holding a `disk.img` shows the
//! image to the guest, takes its writes, and forgets them across `virtctl restart` while the
//! claim's image stays as it was; a `Block`-mode claim's disk (a loop device of the volume's
//! image) keeps what the guest wrote, in the image, across the restart. Skips (saying why)
//! when the test guest, QEMU, virtctl or loop devices are missing.

use std::path::Path;

use testkit::{DEADLINE, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

const VM: &str = r"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: claimed
spec:
  runStrategy: Always
  template:
    spec:
      domain:
        memory: {guest: 64Mi}
        devices:
          disks:
          - name: data
            disk: {bus: virtio}
      volumes:
      - name: data
        persistentVolumeClaim: {claimName: claimed-data}
";

const CLAIM: &str = r"apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: claimed-data
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests: {storage: 256Mi}
";

#[test]
fn a_vm_waits_for_its_claim_then_runs_on_a_disk_image_in_it() -> anyhow::Result<()> {
    let server = ServerProcess::start(Path::new(BIN), "server", &["--fake-qemu"])?;
    let fail = |e: anyhow::Error| anyhow::anyhow!("{e}\nserver log:\n{}", server.log());
    let status = || server.get(&["vm", "claimed"], "{.status.printableStatus}");
    let launchers = || {
        server.get(
            &["pods", "-l", "vm.kubevirt.io/name=claimed"],
            "{.items[*].metadata.name}",
        )
    };

    server.apply(VM)?;
    wait_until(DEADLINE, "ErrorPvcNotFound", || {
        (status() == "ErrorPvcNotFound").then_some(())
    })
    .map_err(fail)?;
    assert_eq!(
        launchers(),
        "",
        "no launcher pod while the claim is missing"
    );
    let synchronized = server.get(
        &["vmi", "claimed"],
        r#"{.status.conditions[?(@.type=="Synchronized")].message}"#,
    );
    assert_eq!(
        synchronized,
        "PVC default/claimed-data does not exist, waiting for it to appear"
    );

    server.apply(CLAIM)?;
    wait_until(DEADLINE, "the VM Running", || {
        (status() == "Running").then_some(())
    })
    .map_err(fail)?;
    let volume = server.get(&["pvc", "claimed-data"], "{.spec.volumeName}");
    anyhow::ensure!(!volume.is_empty(), "the claim is bound");
    let image = server
        .data_dir()
        .join("node/storage")
        .join(&volume)
        .join("disk.img");
    let meta =
        std::fs::metadata(&image).map_err(|e| fail(anyhow::anyhow!("{}: {e}", image.display())))?;
    // 256 MiB less CDI's default 5.5 % overhead, aligned down to 1 MiB.
    assert_eq!(meta.len(), 241 << 20);
    let capacity = server.get(
        &["vmi", "claimed"],
        r#"{.status.volumeStatus[?(@.name=="data")].persistentVolumeClaimInfo.capacity.storage}"#,
    );
    assert_eq!(capacity, "256Mi");

    // What the guest wrote stays across a restart: the image is used, not recreated.
    std::fs::write(&image, b"written by the guest")?;
    let first = launchers();
    server.ok(&["delete", "vmi", "claimed"])?;
    wait_until(DEADLINE, "a new launcher Running", || {
        let now = launchers();
        (status() == "Running" && !now.is_empty() && now != first).then_some(())
    })
    .map_err(fail)?;
    assert_eq!(std::fs::read(&image)?, b"written by the guest");
    Ok(())
}

/// A claim bound to a volume made by hand (no class) whose directory holds a `disk.img`, and
/// a `Block` claim of the local class.
const GUEST_CLAIMS: &str = r"apiVersion: v1
kind: PersistentVolume
metadata:
  name: golden-pv
spec:
  capacity: {storage: 8Mi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ''
  hostPath: {path: /opt/local-path-provisioner/golden-pv, type: Directory}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: golden
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: ''
  volumeName: golden-pv
  resources:
    requests: {storage: 8Mi}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: blockdata
spec:
  accessModes: [ReadWriteOnce]
  volumeMode: Block
  resources:
    requests: {storage: 32Mi}
";

/// The claim's image: 8 MiB starting `GOLDEN-IMAGE`.
fn golden_image() -> Vec<u8> {
    let mut image = vec![0u8; 8 << 20];
    image[..12].copy_from_slice(b"GOLDEN-IMAGE");
    image
}

/// `count` bytes of the guest's `device` at byte `offset` (a multiple of 512).
fn guest_read(
    server: &ServerProcess,
    device: &str,
    offset: u64,
    count: u64,
) -> anyhow::Result<String> {
    server.guest_run(
        "stor",
        &format!(
            "echo AT-{offset}:$(dd if={device} bs=512 skip={} count=1 2>/dev/null | head -c {count}):END",
            offset / 512
        ),
    )
}

#[test]
fn an_ephemeral_disk_forgets_the_guests_writes_and_a_block_claim_keeps_them() -> anyhow::Result<()>
{
    let root = nix::unistd::Uid::effective().is_root();
    let loops = if root && Path::new("/dev/loop-control").exists() {
        Ok(())
    } else {
        Err("Block claims need loop devices (root and /dev/loop-control)".to_owned())
    };
    if testkit::available(loops).is_none() {
        return Ok(());
    }
    let Some(server) = ServerProcess::start_with_test_guest(Path::new(BIN))? else {
        return Ok(());
    };
    let detach = testkit::DetachLoopsOnDrop(server.data_dir().to_owned());
    let result = guest_storage(&server);
    drop(detach);
    // The mount point the node made for the block device on the host's /dev (no private
    // root) is an empty file; nothing else uses it.
    let mount_point = Path::new("/dev/blockdata");
    if std::fs::metadata(mount_point).is_ok_and(|m| m.is_file() && m.len() == 0) {
        let _ = std::fs::remove_file(mount_point);
    }
    testkit::with_log(&server, result)
}

fn guest_storage(server: &ServerProcess) -> anyhow::Result<()> {
    let golden_dir = server.data_dir().join("node/storage/golden-pv");
    std::fs::create_dir_all(&golden_dir)?;
    let golden = golden_dir.join("disk.img");
    std::fs::write(&golden, golden_image())?;
    server.apply(GUEST_CLAIMS)?;
    server.apply(&testkit::test_guest_vm_with(
        "stor",
        &["memory: {guest: 128Mi}"],
        "{disks: [{name: scratch, disk: {bus: virtio}}, {name: blockdata, disk: {bus: virtio}}]}",
        &["volumes: [{name: scratch, ephemeral: {persistentVolumeClaim: {claimName: golden}}}, {name: blockdata, persistentVolumeClaim: {claimName: blockdata}}]"],
    ))?;
    let booted = |not: Option<&str>| {
        let (pod, uid) = wait_until(DEADLINE, "a launcher pod Running", || {
            server
                .running_launcher("stor")
                .filter(|(name, _)| Some(name.as_str()) != not)
        })?;
        wait_until(DEADLINE, "the guest to boot", || {
            server
                .guest_console(&pod)
                .contains("GUEST-READY")
                .then_some(())
        })
        .map_err(|e| anyhow::anyhow!("{e}\nguest console:\n{}", server.guest_console(&pod)))?;
        anyhow::Ok((pod, uid))
    };
    let (pod, uid) = booted(None)?;

    // The ephemeral disk shows the claim's image and takes the guest's writes.
    let first = guest_read(server, "/dev/vda", 0, 12)?;
    assert!(first.contains("AT-0:GOLDEN-IMAGE:END"), "{first}");
    let wrote = server.guest_run(
        "stor",
        "printf EPHEMERAL-WRITE | dd of=/dev/vda bs=512 seek=8 conv=fsync 2>/dev/null; \
         printf BLOCK-DATA-KEPT | dd of=/dev/vdb bs=512 seek=8 conv=fsync 2>/dev/null; echo WROTE",
    )?;
    assert!(wrote.contains("WROTE"), "{wrote}");
    let back = guest_read(server, "/dev/vda", 4096, 15)?;
    assert!(back.contains("AT-4096:EPHEMERAL-WRITE:END"), "{back}");
    // The writes went to the overlay in the launcher's directory, not to the claim.
    let overlay = testkit::launcher_dir(server.data_dir(), &uid).join("disks/scratch.qcow2");
    anyhow::ensure!(overlay.exists(), "no overlay at {}", overlay.display());
    assert!(
        std::fs::read(&golden)? == golden_image(),
        "the claim's disk.img is unchanged"
    );
    // The Block claim: a loop device of the volume's image, which holds what the guest wrote.
    let volume = server.get(&["pvc", "blockdata"], "{.spec.volumeName}");
    assert_eq!(server.get(&["pv", &volume], "{.spec.volumeMode}"), "Block");
    let image = server
        .data_dir()
        .join("node/storage")
        .join(&volume)
        .join("block.img");
    let on_image =
        || -> anyhow::Result<Vec<u8>> { Ok(std::fs::read(&image)?[4096..4096 + 15].to_vec()) };
    assert_eq!(on_image()?, b"BLOCK-DATA-KEPT");

    // Across a restart: the ephemeral write is gone, the block data stays.
    server.virtctl(&["restart", "stor"])?;
    booted(Some(&pod))?;
    let after = guest_read(server, "/dev/vda", 4096, 15)?;
    assert!(
        after.contains("AT-4096:") && !after.contains("EPHEMERAL-WRITE"),
        "{after}"
    );
    let head = guest_read(server, "/dev/vda", 0, 12)?;
    assert!(head.contains("AT-0:GOLDEN-IMAGE:END"), "{head}");
    let kept = guest_read(server, "/dev/vdb", 4096, 15)?;
    assert!(kept.contains("AT-4096:BLOCK-DATA-KEPT:END"), "{kept}");
    assert!(
        std::fs::read(&golden)? == golden_image(),
        "the claim's disk.img is unchanged"
    );
    assert_eq!(on_image()?, b"BLOCK-DATA-KEPT");
    // Gone with its claim: the volume, its image and its loop device.
    server.ok(&["delete", "vm", "stor", "--wait=true"])?;
    server.ok(&["delete", "pvc", "blockdata", "--wait=true"])?;
    wait_until(DEADLINE, "the block volume to be released", || {
        let gone = server.kubectl(&["get", "pv", &volume]);
        (!gone.status.success() && !image.exists()).then_some(())
    })?;
    Ok(())
}
