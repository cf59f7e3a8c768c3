//! End-to-end: containerDisks pulled from a real OCI registry on loopback (Debian's
//! `docker-registry`). A VM whose disk image was pushed there reaches `Running` with the
//! pushed disk as the backing file of its qcow2 overlay in its launcher's directory; a VM whose image does not exist shows upstream's
//! `ErrImagePull`, then `ImagePullBackOff`, and its domain is never started; a VM whose image
//! is in a registry with basic authentication runs with its `imagePullSecret`. Runs
//! `kubevirt-rs server --fake-qemu`, so no guest boots; skips (saying why) without
//! `docker-registry`.

use std::path::Path;

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
