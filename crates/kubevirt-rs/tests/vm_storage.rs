//! End-to-end (`kubevirt-rs server --fake-qemu`): a VM whose disk is a claim. While the claim
//! is missing the VM shows `ErrorPvcNotFound` and no launcher pod exists; once the claim is
//! created the VM starts, the claim is provisioned and bound on the node, and the launcher
//! creates the claim's `disk.img` sparse at the claim's capacity less the filesystem overhead.
//! A restart keeps the image (and what the guest wrote into it).

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
