//! End-to-end: the controllers' events reach `kubectl describe` and `kubectl get events`.
//! Runs `kubevirt-rs server --fake-qemu`, so it needs neither QEMU nor a guest image.

use std::path::Path;

use testkit::{DEADLINE, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

const VM: &str = r"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: demo
spec:
  runStrategy: Always
  template:
    spec:
      domain:
        memory: {guest: 128Mi}
        devices: {}
      volumes:
        - name: containerdisk
          containerDisk: {image: kubevirt-rs/test-guest-disk:latest}
";

#[test]
fn kubectl_describe_vm_shows_the_started_event() -> anyhow::Result<()> {
    let server = ServerProcess::start(Path::new(BIN), "server", &["--fake-qemu"])?;
    server.apply(VM)?;
    let described = wait_until(DEADLINE, "the SuccessfulCreate event in describe", || {
        let out = server.ok(&["describe", "vm", "demo"]).ok()?;
        out.contains("SuccessfulCreate").then_some(out)
    })
    .map_err(|e| anyhow::anyhow!("{e}\nserver log:\n{}", server.log()))?;
    assert!(
        described.contains(
            "Started the virtual machine by creating the new virtual machine instance demo"
        ),
        "{described}"
    );
    assert!(
        described.contains("virtualmachine-controller"),
        "{described}"
    );
    let events = wait_until(DEADLINE, "the launcher pod event", || {
        let out = server.ok(&["get", "events", "-A"]).ok()?;
        out.contains("Created virtual machine pod virt-launcher-demo-")
            .then_some(out)
    })?;
    assert!(events.contains("virtualmachineinstance/demo"), "{events}");
    Ok(())
}
