//! End-to-end tests of virt-api through `kubevirt-rs server` and the real `kubectl`/`virtctl`:
//! the mutating webhook's defaults, the validating webhook's refusals (upstream's message and
//! field path, nothing stored), the subresource API behind the aggregation proxy (virtctl
//! start/stop/restart/pause/unpause, upstream's status codes), and `virtctl console` under a
//! pseudo-terminal and `virtctl vnc --proxy-only` under an RFB handshake against a real guest.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testkit::{DEADLINE, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

/// `virtctl` is built next to `kubevirt-rs` (same target directory).
fn virtctl() -> PathBuf {
    Path::new(BIN).with_file_name("virtctl")
}

/// Why virtctl tests cannot run, if they cannot.
fn virtctl_built() -> Result<PathBuf, String> {
    testkit::virtctl_beside(Path::new(BIN))
}

fn virtctl_run(server: &ServerProcess, args: &[&str]) -> std::process::Output {
    Command::new(virtctl())
        .args(args)
        .env("KUBECONFIG", server.kubeconfig())
        .output()
        .unwrap_or_else(|e| panic!("running virtctl {args:?}: {e}"))
}

fn field(server: &ServerProcess, what: &str, path: &str) -> String {
    server
        .ok(&["get", what, "-o", &format!("jsonpath={path}")])
        .unwrap_or_default()
}

/// A stopped VM named `driven`, booting the test guest when `kernel_boot` (else no OS).
fn driven_vm(kernel_boot: bool) -> String {
    let firmware = if kernel_boot {
        "        firmware:\n          kernelBoot:\n            kernelArgs: \"console=ttyS0 panic=-1 quiet tg.quiet=1\"\n            container:\n              image: kubevirt-rs/test-guest:latest\n              kernelPath: /vmlinux\n              initrdPath: /initramfs.cpio.gz\n"
    } else {
        ""
    };
    format!(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata:\n  name: driven\nspec:\n  runStrategy: Halted\n  template:\n    spec:\n      domain:\n        memory: {{guest: 128Mi}}\n{firmware}        devices: {{}}\n"
    )
}

#[test]
fn a_created_vmi_is_defaulted_by_the_mutating_webhook() -> anyhow::Result<()> {
    let server = ServerProcess::start(Path::new(BIN), "server", &["--fake-qemu"])?;
    server.apply(
        r#"apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: defaults
spec:
  domain:
    memory: {guest: 128Mi}
    devices: {}
  volumes:
    - name: containerdisk
      containerDisk: {image: kubevirt-rs/test-guest-disk:latest}
"#,
    )?;
    let vmi: serde_json::Value =
        serde_json::from_str(&server.ok(&["get", "vmi", "defaults", "-o", "json"])?)?;
    let spec = &vmi["spec"];
    assert_eq!(spec["domain"]["machine"]["type"], "q35", "{spec}");
    assert_eq!(
        spec["domain"]["devices"]["disks"][0]["name"],
        "containerdisk"
    );
    assert_eq!(
        spec["domain"]["devices"]["disks"][0]["disk"]["bus"], "sata",
        "upstream's amd64 default bus"
    );
    assert_eq!(
        spec["domain"]["devices"]["interfaces"][0]["name"],
        "default"
    );
    assert!(
        spec["domain"]["devices"]["interfaces"][0]["bridge"].is_object(),
        "default binding is bridge"
    );
    assert_eq!(
        spec["networks"][0],
        serde_json::json!({"name": "default", "pod": {}})
    );
    assert!(
        spec["domain"]["firmware"]["uuid"]
            .as_str()
            .is_some_and(|u| u.len() == 36),
        "firmware uuid"
    );
    let finalizers = vmi["metadata"]["finalizers"].to_string();
    assert!(
        finalizers.contains("kubevirt.io/foregroundDeleteVirtualMachine"),
        "{finalizers}"
    );
    assert_eq!(
        vmi["metadata"]["annotations"]["kubevirt.io/latest-observed-api-version"],
        "v1"
    );
    Ok(())
}

#[test]
fn invalid_manifests_are_refused_with_upstreams_messages_and_nothing_is_stored()
-> anyhow::Result<()> {
    let server = ServerProcess::start(Path::new(BIN), "server", &["--fake-qemu"])?;
    let cases = [
        (
            "bad-vm",
            "vm",
            "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {name: bad-vm}\nspec:\n  running: true\n  runStrategy: Always\n  template: {spec: {domain: {devices: {}}}}\n",
            "Running and RunStrategy are mutually exclusive",
        ),
        (
            "bad-firmware",
            "vmi",
            "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: bad-firmware}\nspec:\n  domain:\n    devices: {}\n    firmware: {bootloader: {bios: {}, efi: {}}}\n",
            "spec.domain.firmware.bootloader has both EFI and BIOS configured, but they are mutually exclusive.",
        ),
        (
            "bad-cloudinit",
            "vmi",
            "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: bad-cloudinit}\nspec:\n  domain: {devices: {}}\n  volumes: [{name: ci, cloudInitNoCloud: {}}]\n",
            "must have at least one userdatasource or one networkdatasource set",
        ),
    ];
    for (name, kind, manifest, message) in cases {
        let path = server.data_dir().join(format!("{name}.yaml"));
        std::fs::write(&path, manifest)?;
        let out = server.kubectl(&["apply", "-f", &path.display().to_string()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name} was accepted");
        assert!(
            stderr.contains("is invalid") && stderr.contains(message),
            "{name}: {stderr}"
        );
        let get = server.kubectl(&["get", kind, name]);
        assert!(!get.status.success(), "{name} was stored although refused");
    }
    // VMI update rules: the spec of an existing VMI is immutable to users.
    server.apply(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: steady}\nspec:\n  domain:\n    memory: {guest: 128Mi}\n    devices: {}\n",
    )?;
    let out = server.kubectl(&[
        "patch",
        "vmi",
        "steady",
        "--type=merge",
        "-p",
        r#"{"spec":{"domain":{"cpu":{"cores":4}}}}"#,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("update of VMI object is restricted"),
        "{stderr}"
    );
    let cores = server.ok(&[
        "get",
        "vmi",
        "steady",
        "-o",
        "jsonpath={.spec.domain.cpu.cores}",
    ])?;
    assert_ne!(cores, "4", "the refused update was stored");
    // Migration rules: a migration must name an existing VMI.
    let path = server.data_dir().join("migration.yaml");
    std::fs::write(
        &path,
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstanceMigration\nmetadata: {name: nowhere}\nspec: {vmiName: absent}\n",
    )?;
    let out = server.kubectl(&["create", "-f", &path.display().to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("the VMI \"default/absent\" does not exist"),
        "{stderr}"
    );
    assert!(
        !server.kubectl(&["get", "vmim", "nowhere"]).status.success(),
        "the refused migration was stored"
    );
    Ok(())
}

/// A server with a stopped VM `driven`: a real guest when the test guest exists, otherwise
/// fake QEMU (the same control flow).
fn start_driven_server() -> anyhow::Result<ServerProcess> {
    // A real guest when one is available; otherwise the same control flow with fake QEMU.
    // `available` fails the test instead when scripts/test.sh requires every prerequisite.
    let server = match testkit::available(testkit::test_guest()) {
        Some(guest) => {
            let mut server = ServerProcess::start(Path::new(BIN), "server", &[])?;
            server.import_test_guest(guest)?;
            server.apply(&driven_vm(true))?;
            server
        }
        None => {
            eprintln!("driving a fake-QEMU VM instead");
            let server = ServerProcess::start(Path::new(BIN), "server", &["--fake-qemu"])?;
            server.apply(&driven_vm(false))?;
            server
        }
    };
    Ok(server)
}

#[test]
fn virtctl_drives_a_vm_and_subresource_errors_have_upstreams_codes() -> anyhow::Result<()> {
    if testkit::available(virtctl_built()).is_none() {
        return Ok(());
    }
    let server = start_driven_server()?;
    let status = |s: &ServerProcess| field(s, "vm/driven", "{.status.printableStatus}");
    wait_until(DEADLINE, "Stopped", || {
        (status(&server) == "Stopped").then_some(())
    })?;

    let out = virtctl_run(&server, &["start", "driven"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "VM driven was scheduled to start"
    );
    wait_until(DEADLINE, "Running", || {
        (status(&server) == "Running").then_some(())
    })?;

    // Starting a running VM is a 409 with upstream's message.
    let again = virtctl_run(&server, &["start", "driven"]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("VM is already running"),
        "{again:?}"
    );

    let out = virtctl_run(&server, &["pause", "vm", "driven"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(DEADLINE, "Paused", || {
        (status(&server) == "Paused").then_some(())
    })?;
    // As on a cluster: the launcher pod's readiness gate turns False, so the VMI is not Ready.
    wait_until(DEADLINE, "the paused VMI to be not Ready", || {
        let ready = field(
            &server,
            "vmi/driven",
            r#"{.status.conditions[?(@.type=="Ready")].status}"#,
        );
        (ready == "False").then_some(())
    })?;
    let out = virtctl_run(&server, &["unpause", "vm", "driven"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(DEADLINE, "Running again", || {
        (status(&server) == "Running").then_some(())
    })?;

    let uid = field(&server, "vmi/driven", "{.metadata.uid}");
    let out = virtctl_run(&server, &["restart", "driven"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(DEADLINE, "a new VMI after restart", || {
        let now = field(&server, "vmi/driven", "{.metadata.uid}");
        (!now.is_empty() && now != uid && status(&server) == "Running").then_some(())
    })?;

    let out = virtctl_run(&server, &["stop", "driven"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(DEADLINE, "Stopped again", || {
        (status(&server) == "Stopped").then_some(())
    })?;
    let again = virtctl_run(&server, &["stop", "driven"]);
    assert!(!again.status.success(), "stopping a stopped VM succeeded");
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("VM is not running"),
        "{again:?}"
    );

    // The raw answers carry upstream's codes: 202 for accepted state changes, 409 on conflict,
    // 404 for a VM that does not exist.
    let body = server.data_dir().join("start-options.json");
    std::fs::write(&body, "{}")?;
    let code = |path: &str| -> String {
        let out = server.kubectl(&["replace", "--raw", path, "-f", &body.display().to_string()]);
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let missing =
        code("/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/absent/start");
    assert!(
        missing.contains("NotFound") || missing.contains("not found"),
        "{missing}"
    );
    only_the_front_proxy_reaches_virt_api(&server)
}

/// virt-api's subresources trust the API server's front-proxy certificate only: the admin's
/// certificate of the cluster CA, straight to virt-api's pod, is refused at the handshake,
/// while the front proxy's gets an answer from virt-api itself.
fn only_the_front_proxy_reaches_virt_api(server: &ServerProcess) -> anyhow::Result<()> {
    let pod_ip = server.get(
        &["pods", "-n", "kubevirt", "-l", "kubevirt.io=virt-api"],
        "{.items[0].status.podIP}",
    );
    anyhow::ensure!(!pod_ip.is_empty(), "virt-api has no pod IP");
    let pki = server.data_dir().join("pki");
    let direct = |identity: &str| {
        let url = format!(
            "https://{pod_ip}:8443/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/absent/start"
        );
        let out = std::process::Command::new("curl")
            .args([
                "-sk",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "-X",
                "PUT",
                "-d",
                "{}",
            ])
            .arg("--cert")
            .arg(pki.join(format!("{identity}.crt")))
            .arg("--key")
            .arg(pki.join(format!("{identity}.key")))
            .arg(&url)
            .output()
            .expect("curl runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(
        direct("front-proxy-client"),
        "404",
        "the front proxy's certificate reaches virt-api"
    );
    assert_eq!(
        direct("admin"),
        "000",
        "a cluster-CA certificate gets no answer from virt-api"
    );
    Ok(())
}

/// Reads from the pty master until `needle` appears or the deadline passes.
fn read_until(master: &mut std::fs::File, needle: &str, deadline: Duration) -> String {
    let start = Instant::now();
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while start.elapsed() < deadline && !seen.contains(needle) {
        match master.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(_) => break,
        }
    }
    seen
}

#[test]
fn virtctl_console_and_vnc_reach_the_guest() -> anyhow::Result<()> {
    let Some(guest) = testkit::available(testkit::test_guest()) else {
        return Ok(());
    };
    if testkit::available(virtctl_built()).is_none() {
        return Ok(());
    }
    let mut server = ServerProcess::start(Path::new(BIN), "server", &[])?;
    server.import_test_guest(guest)?;
    let demo = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/vm-demo.yaml"),
    )?;
    server.apply(&demo)?;
    wait_until(DEADLINE, "the demo VMI running", || {
        (field(&server, "vmi/demo", "{.status.phase}") == "Running").then_some(())
    })?;

    let pty = nix::pty::openpty(None, None)?;
    let slave: OwnedFd = pty.slave;
    let mut child = Command::new(virtctl())
        .args(["console", "demo"])
        .env("KUBECONFIG", server.kubeconfig())
        .stdin(Stdio::from(slave.try_clone()?))
        .stdout(Stdio::from(slave.try_clone()?))
        .stderr(Stdio::from(slave))
        .spawn()?;
    let mut master = std::fs::File::from(pty.master);
    nix::fcntl::fcntl(
        &master,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )?;
    let banner = read_until(&mut master, "escape sequence is ^]", DEADLINE);
    assert!(
        banner.contains("Successfully connected to demo console"),
        "{banner}"
    );
    // The guest is a shell loop on its serial console: it answers "ping" with "PONG".
    let answer = wait_until(DEADLINE, "PONG from the guest", || {
        master.write_all(b"ping\r").ok()?;
        let seen = read_until(&mut master, "PONG", Duration::from_secs(2));
        seen.contains("PONG").then_some(seen)
    })?;
    assert!(answer.contains("PONG"));
    master.write_all(&[0x1d])?; // Ctrl+]
    let status = wait_until(DEADLINE, "virtctl console to exit on Ctrl+]", || {
        child.try_wait().ok().flatten()
    })?;
    assert!(status.success(), "virtctl console exited with {status}");
    assert_vnc_proxy_serves_the_display(&server)
}

/// The RFB 3.8 handshake of a viewer (security type None, shared session) up to the first
/// framebuffer update; returns the framebuffer's size and the update's rectangle count.
fn rfb_first_update(vnc: &mut std::net::TcpStream) -> anyhow::Result<(u16, u16, u16)> {
    fn read<const N: usize>(s: &mut std::net::TcpStream) -> anyhow::Result<[u8; N]> {
        let mut buf = [0u8; N];
        s.read_exact(&mut buf)?;
        Ok(buf)
    }
    let version: [u8; 12] = read(vnc)?;
    anyhow::ensure!(&version == b"RFB 003.008\n", "server version {version:?}");
    vnc.write_all(b"RFB 003.008\n")?;
    let [count] = read::<1>(vnc)?;
    let mut types = vec![0u8; usize::from(count)];
    vnc.read_exact(&mut types)?;
    anyhow::ensure!(
        types.contains(&1),
        "security type None not offered: {types:?}"
    );
    vnc.write_all(&[1])?;
    let result: [u8; 4] = read(vnc)?;
    anyhow::ensure!(
        u32::from_be_bytes(result) == 0,
        "security result {result:?}"
    );
    vnc.write_all(&[1])?; // ClientInit: shared
    let size: [u8; 4] = read(vnc)?;
    let (width, height) = (
        u16::from_be_bytes([size[0], size[1]]),
        u16::from_be_bytes([size[2], size[3]]),
    );
    let _pixel_format: [u8; 16] = read(vnc)?;
    let name_len = u32::from_be_bytes(read::<4>(vnc)?);
    let mut name = vec![0u8; usize::try_from(name_len)?];
    vnc.read_exact(&mut name)?;
    // FramebufferUpdateRequest of the whole screen, not incremental.
    let [w0, w1] = width.to_be_bytes();
    let [h0, h1] = height.to_be_bytes();
    vnc.write_all(&[3, 0, 0, 0, 0, 0, w0, w1, h0, h1])?;
    let header: [u8; 4] = read(vnc)?;
    anyhow::ensure!(
        header[0] == 0,
        "message type {} is no FramebufferUpdate",
        header[0]
    );
    Ok((width, height, u16::from_be_bytes([header[2], header[3]])))
}

/// `virtctl vnc --proxy-only --port 0` against the running `demo` VMI: the printed port
/// speaks RFB with the guest's framebuffer.
fn assert_vnc_proxy_serves_the_display(server: &ServerProcess) -> anyhow::Result<()> {
    use std::io::BufRead;
    let mut proxy = Command::new(virtctl())
        .args(["vnc", "--proxy-only", "--port", "0", "demo"])
        .env("KUBECONFIG", server.kubeconfig())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    std::io::BufReader::new(proxy.stdout.take().expect("stdout")).read_line(&mut line)?;
    let printed: serde_json::Value = serde_json::from_str(&line)
        .map_err(|e| anyhow::anyhow!("virtctl vnc printed {line:?}: {e}"))?;
    let port = u16::try_from(printed["port"].as_u64().unwrap_or_default())?;
    anyhow::ensure!(port != 0, "no port in {line:?}");

    let mut vnc = std::net::TcpStream::connect(("127.0.0.1", port))?;
    vnc.set_read_timeout(Some(DEADLINE))?;
    let handshake = rfb_first_update(&mut vnc);
    let _ = proxy.kill();
    let _ = proxy.wait();
    let (width, height, rects) = handshake?;
    eprintln!("VNC framebuffer {width}x{height}, first update of {rects} rectangle(s)");
    // QEMU's VGA shows 640x480 before the guest sets a mode, 720x400 in text mode.
    anyhow::ensure!(
        (320..=4096).contains(&width) && (200..=4096).contains(&height),
        "framebuffer {width}x{height}"
    );
    anyhow::ensure!(rects >= 1, "an update without rectangles");
    Ok(())
}
