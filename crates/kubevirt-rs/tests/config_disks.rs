//! End-to-end: a VM's `configMap`, `secret`, `downwardAPI` and `serviceAccount` volumes reach
//! the guest as upstream's ISO 9660 disks, and cloud-init `userDataBase64` runs in it. On a
//! real test guest (TCG) the guest mounts each disk and reads the map's key, the secret's key,
//! its own VMI labels, and its namespace and token; the base64 user data prints on the
//! console, and so does user data from a Secret (`secretRef`) in a second VM; a third reads
//! its `cloudInitConfigDrive` (OpenStack layout, `config-2`). The first one's `sysprep` volume
//! is a CD-ROM labelled `unattendCD` holding the map's `autounattend.xml`. Skips (saying why)
//! when the test guest, QEMU or virtctl is missing.

use std::path::Path;

use testkit::{DEADLINE, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

const SOURCES: &str = r"apiVersion: v1
kind: ConfigMap
metadata:
  name: app-config
data:
  greeting: hello from the map
---
apiVersion: v1
kind: Secret
metadata:
  name: app-secret
stringData:
  password: s3cr3t-value
---
apiVersion: v1
kind: Secret
metadata:
  name: ci-secret
stringData:
  userdata: |
    #!/bin/sh
    echo USER-DATA-FROM-SECRET
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: sysprep-answers
data:
  autounattend.xml: <unattend>ANSWER-FILE-FROM-THE-MAP</unattend>
";

/// `#!/bin/sh` + `echo USER-DATA-FROM-BASE64`.
const USER_DATA_BASE64: &str = "IyEvYmluL3NoCmVjaG8gVVNFUi1EQVRBLUZST00tQkFTRTY0Cg==";

fn vm() -> String {
    format!(
        r#"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: cfg
spec:
  runStrategy: Always
  template:
    metadata:
      labels: {{app: config-disks}}
    spec:
      domain:
        memory: {{guest: 128Mi}}
        firmware:
          kernelBoot:
            kernelArgs: "console=ttyS0 panic=-1 quiet tg.quiet=1"
            container:
              image: kubevirt-rs/test-guest:latest
              kernelPath: /vmlinux
              initrdPath: /initramfs.cpio.gz
        devices:
          disks:
          - {{name: settings, disk: {{bus: virtio}}}}
          - {{name: creds, disk: {{bus: virtio}}}}
          - {{name: podinfo, disk: {{bus: virtio}}}}
          - {{name: ci, disk: {{bus: virtio}}}}
          - {{name: sa, disk: {{bus: virtio}}}}
          - {{name: unattend, cdrom: {{bus: scsi}}}}
      volumes:
      - name: settings
        configMap: {{name: app-config, volumeLabel: CFGDATA}}
      - name: creds
        secret: {{secretName: app-secret}}
      - name: podinfo
        downwardAPI:
          fields:
          - {{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}
      - name: ci
        cloudInitNoCloud: {{userDataBase64: {USER_DATA_BASE64}}}
      - name: sa
        serviceAccount: {{serviceAccountName: default}}
      - name: unattend
        sysprep: {{configMap: {{name: sysprep-answers}}}}
"#
    )
}

#[test]
fn config_map_secret_and_downward_api_disks_show_their_files_in_the_guest() -> anyhow::Result<()> {
    let Some(server) = ServerProcess::start_with_test_guest(Path::new(BIN))? else {
        return Ok(());
    };
    let result = scenario(&server);
    testkit::with_log(&server, result)
}

/// What `cat` of `file` on the ISO disk `device` prints in the guest.
fn read_on_disk(server: &ServerProcess, device: &str, file: &str) -> anyhow::Result<String> {
    server.guest_run(
        "cfg",
        &format!("mount -t iso9660 -o ro {device} /mnt && cat /mnt/{file}; echo; umount /mnt"),
    )
}

/// Waits for the VM `vm` to boot its guest; returns its launcher pod.
fn booted(server: &ServerProcess, vm: &str) -> anyhow::Result<String> {
    let pod = wait_until(DEADLINE, "the launcher pod Running", || {
        let pod = server.get(
            &["pods", "-l", &format!("vm.kubevirt.io/name={vm}")],
            r#"{.items[?(@.status.phase=="Running")].metadata.name}"#,
        );
        (!pod.is_empty()).then_some(pod)
    })?;
    wait_until(DEADLINE, "the guest to boot", || {
        server
            .guest_console(&pod)
            .contains("GUEST-READY")
            .then_some(())
    })
    .map_err(|e| anyhow::anyhow!("{e}\nguest console:\n{}", server.guest_console(&pod)))?;
    Ok(pod)
}

fn scenario(server: &ServerProcess) -> anyhow::Result<()> {
    server.apply(SOURCES)?;
    server.apply(&vm())?;
    let pod = booted(server, "cfg")?;
    let console = server.guest_console(&pod);
    assert!(
        console.contains("USER-DATA-FROM-BASE64"),
        "the base64 user data ran:\n{console}"
    );
    let greeting = read_on_disk(server, "/dev/vda", "greeting")?;
    assert!(greeting.contains("hello from the map"), "{greeting}");
    let password = read_on_disk(server, "/dev/vdb", "password")?;
    assert!(password.contains("s3cr3t-value"), "{password}");
    let labels = read_on_disk(server, "/dev/vdc", "labels")?;
    assert!(labels.contains(r#"app="config-disks""#), "{labels}");
    let namespace = read_on_disk(server, "/dev/vde", "namespace")?;
    assert!(namespace.contains("default"), "{namespace}");
    let listing = server.guest_run(
        "cfg",
        "mount -t iso9660 -o ro /dev/vde /mnt && ls /mnt && test -s /mnt/token && echo TOKEN-PRESENT; umount /mnt",
    )?;
    assert!(
        listing.contains("ca.crt") && listing.contains("TOKEN-PRESENT"),
        "{listing}"
    );
    // The sysprep CD-ROM (SCSI: the test guest has no AHCI driver): upstream's label, the
    // map's answer file.
    let label = server.guest_run(
        "cfg",
        "echo LABEL:$(dd if=/dev/sr0 bs=1 skip=32808 count=10 2>/dev/null):END",
    )?;
    assert!(label.contains("LABEL:unattendCD:END"), "{label}");
    let answer = read_on_disk(server, "/dev/sr0", "autounattend.xml")?;
    assert!(answer.contains("ANSWER-FILE-FROM-THE-MAP"), "{answer}");

    // User data from a Secret, in a second VM (one guest at a time).
    server.ok(&["delete", "vm", "cfg", "--wait=true"])?;
    server.apply(&testkit::test_guest_vm_with(
        "cfg2",
        &["memory: {guest: 128Mi}"],
        "{disks: [{name: ci, disk: {bus: virtio}}]}",
        &["volumes: [{name: ci, cloudInitNoCloud: {secretRef: {name: ci-secret}}}]"],
    ))?;
    let pod = booted(server, "cfg2")?;
    let console = server.guest_console(&pod);
    assert!(
        console.contains("USER-DATA-FROM-SECRET"),
        "the Secret's user data ran:\n{console}"
    );

    // An OpenStack config drive, in a third VM.
    server.ok(&["delete", "vm", "cfg2", "--wait=true"])?;
    server.apply(&testkit::test_guest_vm_with(
        "cfg3",
        &["memory: {guest: 128Mi}"],
        "{disks: [{name: drive, disk: {bus: virtio}}]}",
        &[r#"volumes: [{name: drive, cloudInitConfigDrive: {userData: "CONFIG-DRIVE-USER-DATA"}}]"#],
    ))?;
    booted(server, "cfg3")?;
    let uid = server.get(&["vmi", "cfg3"], "{.metadata.uid}");
    let drive = server.guest_run(
        "cfg3",
        "mount -t iso9660 -o ro /dev/vda /mnt && cat /mnt/openstack/latest/user_data; echo; cat /mnt/openstack/latest/meta_data.json; echo; umount /mnt",
    )?;
    assert!(drive.contains("CONFIG-DRIVE-USER-DATA"), "{drive}");
    assert!(drive.contains(&format!(r#""uuid":"{uid}""#)), "{drive}");
    Ok(())
}
