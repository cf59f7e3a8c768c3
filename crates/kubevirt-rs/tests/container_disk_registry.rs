//! End-to-end: containerDisks pulled from a real OCI registry on loopback (Debian's
//! `docker-registry`).
//!
//! With `kubevirt-rs server --fake-qemu` (no guest boots): a VM whose disk image was pushed
//! there reaches `Running` with the pushed disk as the backing file of its qcow2 overlay in its
//! launcher's directory; a VM whose image does not exist shows upstream's `ErrImagePull`, then
//! `ImagePullBackOff`, and its domain is never started; a VM whose image is in a registry with
//! basic authentication runs with its `imagePullSecret`.
//!
//! With real QEMU (TCG): the test guest's bootable disk image
//! (`scripts/build-test-guest-disk.sh`), pushed as a containerDisk (the disk under `/disk/`),
//! boots a VM without kernelBoot from the pulled disk -- SYSLINUX, then `GUEST-READY` on the
//! console -- and runs its cloud-init NoCloud user data; then the seed article's (upstream's)
//! `examples/vm-cirros.yaml`, unchanged but for the registry host, with that disk pushed as
//! `kubevirt/cirros-container-disk-demo:devel`, is created `Halted`, started by patching its
//! `runStrategy` to `Always` as the article does, goes to `Running` and its guest boots and
//! prints its user data.
//!
//! Skips (saying why) without `docker-registry`, and the booting test without QEMU, the test
//! guest or its disk image.

use std::path::Path;
use std::time::Duration;

use oci_pull::ImageReference;
use oci_pull::push::{ImageFile, push_files};
use test_prerequisites::registry::TestRegistry;
use testkit::{DEADLINE, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

fn vm(name: &str, image: &str) -> String {
    format!(
        r"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: {name}
spec:
  runStrategy: Always
  template:
    spec:
      domain:
        memory: {{guest: 128Mi}}
        devices:
          disks:
            - name: containerdisk
              disk: {{bus: virtio}}
      volumes:
        - name: containerdisk
          containerDisk: {{image: {image}}}
"
    )
}

fn jsonpath(server: &ServerProcess, what: &str, path: &str) -> String {
    server
        .ok(&["get", what, "-o", &format!("jsonpath={path}")])
        .unwrap_or_default()
}

fn wait_for(server: &ServerProcess, what: &str, path: &str, want: &str) -> anyhow::Result<()> {
    wait_until(DEADLINE, &format!("{what} {path} = {want}"), || {
        (jsonpath(server, what, path) == want).then_some(())
    })
    .map_err(|e| {
        anyhow::anyhow!(
            "{e}; it is {:?}\nserver log:\n{}",
            jsonpath(server, what, path),
            testkit::tail(&server.log(), 40)
        )
    })
}

fn push(
    registry: &TestRegistry,
    name: &str,
    disk: &[u8],
    credentials: Option<&oci_pull::Credentials>,
) -> anyhow::Result<()> {
    let reference = ImageReference::parse(&format!("{}/{name}", registry.host()))?;
    let files = [ImageFile {
        path: "disk/disk.img".into(),
        content: disk.to_vec(),
    }];
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(push_files(&reference, credentials, &files))?;
    Ok(())
}

fn launcher_pod_uid(server: &ServerProcess, vm: &str) -> String {
    server
        .ok(&[
            "get",
            "pods",
            "-l",
            &format!("vm.kubevirt.io/name={vm}"),
            "-o",
            "jsonpath={.items[0].metadata.uid}",
        ])
        .unwrap_or_default()
}

#[test]
fn container_disks_come_from_loopback_registries_missing_ones_back_off_private_ones_use_their_secret()
-> anyhow::Result<()> {
    let Some(registry) = TestRegistry::start_if_installed().map_err(anyhow::Error::msg)? else {
        return Ok(());
    };
    let disk: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 253) as u8).collect();
    push(&registry, "guest:latest", &disk, None)?;
    let server = ServerProcess::start(Path::new(BIN), "server", &["--fake-qemu"])?;
    missing_image_backs_off(&server, &registry)?;
    pulled_disk_backs_the_overlay(&server, &registry, &disk)?;
    kernel_boot_container_is_pulled(&server, &registry)?;
    let private = private_image_needs_its_secret(&server, &disk)?;
    drop(server);
    drop(registry);
    drop(private);
    Ok(())
}

fn missing_image_backs_off(server: &ServerProcess, registry: &TestRegistry) -> anyhow::Result<()> {
    // A missing image first: ErrImagePull lasts one back-off period (10 s).
    server.apply(&vm("missing", &format!("{}/missing:v1", registry.host())))?;
    wait_for(
        server,
        "vm/missing",
        "{.status.printableStatus}",
        "ErrImagePull",
    )?;
    let condition = jsonpath(
        server,
        "vmi/missing",
        r#"{.status.conditions[?(@.type=="Synchronized")].message}"#,
    );
    assert!(
        condition.starts_with(&format!(
            "Failed to pull image \"{}/missing:v1\"",
            registry.host()
        )),
        "{condition}"
    );
    wait_for(
        server,
        "vm/missing",
        "{.status.printableStatus}",
        "ImagePullBackOff",
    )?;
    assert_eq!(
        jsonpath(server, "vmi/missing", "{.status.phase}"),
        "Scheduled"
    );
    let uid = launcher_pod_uid(server, "missing");
    let dir = testkit::launcher_dir(server.data_dir(), uid.trim());
    assert!(
        !dir.join("disks").exists(),
        "nothing was prepared for a domain that cannot start"
    );

    Ok(())
}

fn pulled_disk_backs_the_overlay(
    server: &ServerProcess,
    registry: &TestRegistry,
    disk: &[u8],
) -> anyhow::Result<()> {
    server.apply(&vm("pulled", &format!("{}/guest:latest", registry.host())))?;
    wait_for(server, "vmi/pulled", "{.status.phase}", "Running")?;
    wait_for(server, "vm/pulled", "{.status.printableStatus}", "Running")?;
    let uid = launcher_pod_uid(server, "pulled");
    let disks = testkit::launcher_dir(server.data_dir(), uid.trim()).join("disks");
    assert!(
        std::fs::read(disks.join("base/containerdisk.img")).is_ok_and(|d| d == *disk),
        "the overlay's backing disk is the pushed one: {}",
        disks.display()
    );
    let overlay = std::fs::read(disks.join("containerdisk.qcow2"))?;
    assert!(
        overlay.starts_with(b"QFI\xfb"),
        "the guest writes to a qcow2 overlay"
    );

    Ok(())
}

fn kernel_boot_container_is_pulled(
    server: &ServerProcess,
    registry: &TestRegistry,
) -> anyhow::Result<()> {
    // kernelBoot.container comes from the registry the same way.
    let reference = ImageReference::parse(&format!("{}/kernel:v1", registry.host()))?;
    let boot_files = [
        ImageFile {
            path: "boot/vmlinux".into(),
            content: b"kernel".to_vec(),
        },
        ImageFile {
            path: "boot/initrd".into(),
            content: b"initrd".to_vec(),
        },
    ];
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(push_files(&reference, None, &boot_files))?;
    server.apply(&format!(
        r"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: kernel
spec:
  runStrategy: Always
  template:
    spec:
      domain:
        memory: {{guest: 128Mi}}
        firmware:
          kernelBoot:
            container: {{image: {reference}, kernelPath: /boot/vmlinux, initrdPath: /boot/initrd}}
        devices: {{}}
"
    ))?;
    wait_for(server, "vmi/kernel", "{.status.phase}", "Running")?;
    let uid = launcher_pod_uid(server, "kernel");
    let boot = testkit::launcher_dir(server.data_dir(), uid.trim()).join("boot");
    assert_eq!(std::fs::read(boot.join("kernel"))?, b"kernel");
    assert_eq!(std::fs::read(boot.join("initrd"))?, b"initrd");

    Ok(())
}

/// The private registry, kept running by the caller until the server is gone.
fn private_image_needs_its_secret(
    server: &ServerProcess,
    disk: &[u8],
) -> anyhow::Result<Option<TestRegistry>> {
    // A private registry: the VM's imagePullSecret (made by kubectl) lets the handler pull.
    let Some(private) =
        TestRegistry::start_with_basic_auth_if_installed().map_err(anyhow::Error::msg)?
    else {
        return Ok(None);
    };
    let credentials = oci_pull::Credentials {
        username: test_prerequisites::registry::USER.into(),
        password: test_prerequisites::registry::PASSWORD.into(),
    };
    push(&private, "guest:v1", disk, Some(&credentials))?;
    server.ok(&[
        "create",
        "secret",
        "docker-registry",
        "private-registry",
        &format!("--docker-server={}", private.host()),
        &format!("--docker-username={}", credentials.username),
        &format!("--docker-password={}", credentials.password),
    ])?;
    let manifest = vm("private", &format!("{}/guest:v1", private.host())).replace(
        "containerDisk: {image: ",
        "containerDisk: {imagePullSecret: private-registry, image: ",
    );
    server.apply(&manifest)?;
    wait_for(server, "vmi/private", "{.status.phase}", "Running")?;
    Ok(Some(private))
}

/// How long a guest booting from its disk under TCG may take to print `GUEST-READY` once its
/// launcher pod runs (about 6 s on an idle machine; the whole suite shares two cores).
const BOOT_DEADLINE: Duration = Duration::from_secs(120);

/// The seed article's `examples/vm-cirros.yaml` (upstream KubeVirt's), as it gives it.
const VM_CIRROS: &str = r"---
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  labels:
    kubevirt.io/vm: vm-cirros
  name: vm-cirros
spec:
  runStrategy: Halted
  template:
    metadata:
      labels:
        kubevirt.io/vm: vm-cirros
    spec:
      domain:
        devices:
          disks:
          - disk:
              bus: virtio
            name: containerdisk
          - disk:
              bus: virtio
            name: cloudinitdisk
        memory:
          guest: 128Mi
        resources: {}
      terminationGracePeriodSeconds: 0
      volumes:
      - containerDisk:
          image: registry:5000/kubevirt/cirros-container-disk-demo:devel
        name: containerdisk
      - cloudInitNoCloud:
          userData: |
            #!/bin/sh

            echo 'printed from cloud-init userdata'
        name: cloudinitdisk
";

#[test]
fn a_guest_boots_from_a_pulled_container_disk_and_the_seed_vm_cirros_runs() -> anyhow::Result<()> {
    // The guest lock first (at most one test boots guests), held until the server is gone.
    let Some(guest) = test_prerequisites::available(test_prerequisites::test_guest()) else {
        return Ok(());
    };
    let Some(disk_image) = test_prerequisites::available(guest.disk_image()) else {
        return Ok(());
    };
    let Some(registry) = TestRegistry::start_if_installed().map_err(anyhow::Error::msg)? else {
        return Ok(());
    };
    let disk = std::fs::read(&disk_image)?;
    push(&registry, "kubevirt-rs/test-guest-disk:v1", &disk, None)?;
    push(
        &registry,
        "kubevirt/cirros-container-disk-demo:devel",
        &disk,
        None,
    )?;
    let server = ServerProcess::start(Path::new(BIN), "server", &[])?;
    let result = guest_boots_from_the_pulled_disk(&server, &registry, &disk)
        .and_then(|()| seed_vm_cirros_runs(&server, &registry));
    let result = testkit::with_log(&server, result);
    drop(server);
    drop(registry);
    drop(guest);
    result
}

/// Waits for VM `vm`'s launcher pod to run and its guest to print `GUEST-READY`; returns the
/// pod's name, uid and the guest console.
fn booted(server: &ServerProcess, vm: &str) -> anyhow::Result<(String, String, String)> {
    let (pod, uid) = wait_until(
        DEADLINE,
        &format!("the launcher pod of {vm} Running"),
        || server.running_launcher(vm),
    )
    .map_err(|e| {
        anyhow::anyhow!(
            "{e}; vm: {}",
            server.get(&["vm", vm], "{.status.printableStatus}")
        )
    })?;
    let console = wait_until(BOOT_DEADLINE, &format!("the guest of {vm} to boot"), || {
        let console = server.guest_console(&pod);
        console.contains("GUEST-READY").then_some(console)
    })
    .map_err(|e| anyhow::anyhow!("{e}\nguest console:\n{}", server.guest_console(&pod)))?;
    Ok((pod, uid, console))
}

fn guest_boots_from_the_pulled_disk(
    server: &ServerProcess,
    registry: &TestRegistry,
    disk: &[u8],
) -> anyhow::Result<()> {
    let manifest = format!(
        r"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: fromdisk
spec:
  runStrategy: Always
  template:
    spec:
      terminationGracePeriodSeconds: 0
      domain:
        memory: {{guest: 128Mi}}
        devices:
          disks:
            - name: containerdisk
              disk: {{bus: virtio}}
            - name: cloudinit
              disk: {{bus: virtio}}
      volumes:
        - name: containerdisk
          containerDisk: {{image: {}/kubevirt-rs/test-guest-disk:v1}}
        - name: cloudinit
          cloudInitNoCloud:
            userData: |
              #!/bin/sh
              echo USER-DATA-IN-THE-PULLED-DISK-GUEST
",
        registry.host()
    );
    server.apply(&manifest)?;
    let (_pod, uid, console) = booted(server, "fromdisk")?;
    // SYSLINUX's banner: the firmware booted the disk's boot sector, no kernel was passed.
    assert!(
        console.contains("SYSLINUX"),
        "the guest was booted by the disk's bootloader:\n{console}"
    );
    assert!(
        console.contains("USER-DATA-IN-THE-PULLED-DISK-GUEST")
            && console.contains("USER-DATA-DONE rc=0"),
        "the cloud-init user data ran:\n{console}"
    );
    let seen = test_prerequisites::guest_reports(&console);
    assert_eq!(
        seen.last().map(|s| s.disks.as_str()),
        Some("vda,vdb"),
        "the guest sees its container disk and its cloud-init disk:\n{console}"
    );
    wait_for(server, "vmi/fromdisk", "{.status.phase}", "Running")?;
    wait_for(
        server,
        "vm/fromdisk",
        "{.status.printableStatus}",
        "Running",
    )?;
    let disks = testkit::launcher_dir(server.data_dir(), &uid).join("disks");
    assert!(
        std::fs::read(disks.join("base/containerdisk.img")).is_ok_and(|d| d == disk),
        "the overlay's backing disk is the pushed one: {}",
        disks.display()
    );
    // One guest at a time: this one goes before the next boots.
    server.ok(&["delete", "vm", "fromdisk", "--wait=true"])?;
    Ok(())
}

fn seed_vm_cirros_runs(server: &ServerProcess, registry: &TestRegistry) -> anyhow::Result<()> {
    let manifest = VM_CIRROS.replace("registry:5000/", &format!("{}/", registry.host()));
    assert_eq!(
        manifest.lines().count(),
        VM_CIRROS.lines().count(),
        "only the registry host changes"
    );
    let file = server.data_dir().join("vm-cirros.yaml");
    std::fs::write(&file, &manifest)?;
    // The article's steps: create it (Halted: nothing runs), start it by patching its
    // runStrategy, watch it go to Running.
    server.ok(&["create", "-f", &file.display().to_string()])?;
    wait_for(
        server,
        "vm/vm-cirros",
        "{.status.printableStatus}",
        "Stopped",
    )?;
    assert!(
        server.kubectl(&["get", "vmi", "vm-cirros"]).status.code() != Some(0),
        "a Halted VM has no VMI"
    );
    server.ok(&[
        "patch",
        "virtualmachine",
        "vm-cirros",
        "--type=merge",
        "-p",
        r#"{"spec":{"runStrategy": "Always"}}"#,
    ])?;
    let (_pod, _uid, console) = booted(server, "vm-cirros")?;
    assert!(
        console.contains("printed from cloud-init userdata"),
        "the manifest's user data ran:\n{console}"
    );
    wait_for(server, "vmi/vm-cirros", "{.status.phase}", "Running")?;
    wait_for(
        server,
        "vm/vm-cirros",
        "{.status.printableStatus}",
        "Running",
    )?;
    assert_eq!(
        jsonpath(
            server,
            "vmi/vm-cirros",
            "{.spec.volumes[0].containerDisk.image}"
        ),
        format!(
            "{}/kubevirt/cirros-container-disk-demo:devel",
            registry.host()
        )
    );
    // And stopped the article's way.
    server.ok(&[
        "patch",
        "virtualmachine",
        "vm-cirros",
        "--type=merge",
        "-p",
        r#"{"spec":{"runStrategy": "Halted"}}"#,
    ])?;
    wait_for(
        server,
        "vm/vm-cirros",
        "{.status.printableStatus}",
        "Stopped",
    )?;
    server.ok(&["delete", "virtualmachine", "vm-cirros", "--wait=true"])?;
    Ok(())
}
