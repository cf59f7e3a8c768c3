//! End-to-end (`kubevirt-rs server --fake-qemu`, a real registry on loopback): DataVolumes.
//! A VM with a `blank`, two `registry` (a raw and a qcow2 disk, which the importer converts
//! to raw with `qemu-img`) and an `http` DataVolume template (the http server is the test's,
//! on loopback) shows `Provisioning`, then `Running`; the embedded CDI's DataVolumes reach
//! `Succeeded`, their claims hold `disk.img` (the blank one sparse at the claim's size less
//! CDI's 5.5 % overhead, the imported ones the pushed and the served disk); deleting the VM
//! deletes its DataVolumes and their claims. A DataVolume whose image does not exist is
//! `Failed` with the importer's error, and its VM shows `DataVolumeError` without a VMI.
//! Skips (saying why) without `docker-registry`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use oci_pull::ImageReference;
use oci_pull::push::{ImageFile, push_files};
use test_prerequisites::registry::TestRegistry;
use testkit::{DEADLINE, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

fn vm(name: &str, templates: &str, volumes: &[&str]) -> String {
    let disks: String = volumes
        .iter()
        .map(|v| format!("          - name: {v}\n            disk: {{bus: virtio}}\n"))
        .collect();
    let vols: String = volumes
        .iter()
        .map(|v| format!("      - name: {v}\n        dataVolume: {{name: {v}}}\n"))
        .collect();
    format!(
        r"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: {name}
spec:
  runStrategy: Always
  dataVolumeTemplates:
{templates}  template:
    spec:
      domain:
        memory: {{guest: 64Mi}}
        devices:
          disks:
{disks}      volumes:
{vols}"
    )
}

fn template(name: &str, source: &str) -> String {
    format!(
        "  - metadata: {{name: {name}}}\n    spec:\n      source: {source}\n      storage:\n        resources: {{requests: {{storage: 64Mi}}}}\n"
    )
}

fn push_disk(registry: &TestRegistry, name: &str, disk: &[u8]) -> anyhow::Result<()> {
    let reference = ImageReference::parse(&format!("{}/{name}", registry.host()))?;
    let files = [ImageFile {
        path: "disk/disk.img".into(),
        content: disk.to_vec(),
    }];
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(push_files(&reference, None, &files))?;
    Ok(())
}

fn wait_for(server: &ServerProcess, what: &[&str], path: &str, want: &str) -> anyhow::Result<()> {
    wait_until(DEADLINE, &format!("{what:?} {path} = {want}"), || {
        (server.get(what, path) == want).then_some(())
    })
    .map_err(|e| {
        anyhow::anyhow!(
            "{e}; it is {:?}\nDataVolumes: {}\npods: {}\nserver log:\n{}",
            server.get(what, path),
            server.get(
                &["dv", "-A"],
                "{range .items[*]}{.metadata.name}={.status}{'\\n'}{end}"
            ),
            server.get(
                &["pods", "-A"],
                "{range .items[*]}{.metadata.name}={.status.phase} {end}"
            ),
            testkit::tail(&server.log(), 60)
        )
    })
}

/// A loopback HTTP server answering every request with one file; stopped on drop.
struct HttpFile {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpFile {
    fn serve(content: Vec<u8>) -> anyhow::Result<HttpFile> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(mut stream) = stream else { continue };
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    content.len()
                );
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(&content);
            }
        });
        Ok(HttpFile {
            addr,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for HttpFile {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The `disk.img` in the local volume bound to claim `claim`.
fn claim_image(server: &ServerProcess, claim: &str) -> anyhow::Result<std::path::PathBuf> {
    let volume = server.get(&["pvc", claim], "{.spec.volumeName}");
    anyhow::ensure!(!volume.is_empty(), "claim {claim} is bound");
    Ok(server
        .data_dir()
        .join("node/storage")
        .join(volume)
        .join("disk.img"))
}

#[test]
fn data_volume_templates_are_imported_before_the_vm_runs_and_a_failed_import_is_a_data_volume_error()
-> anyhow::Result<()> {
    let Some(registry) = TestRegistry::start_if_installed().map_err(anyhow::Error::msg)? else {
        return Ok(());
    };
    let disk: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    push_disk(&registry, "disk:v1", &disk)?;
    // The same disk as qcow2: CDI's importer converts it to raw (with qemu-img).
    let scratch = tempfile::tempdir()?;
    std::fs::write(scratch.path().join("raw"), &disk)?;
    let converted = std::process::Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "qcow2"])
        .arg(scratch.path().join("raw"))
        .arg(scratch.path().join("qcow2"))
        .status()
        .map_err(|e| anyhow::anyhow!("qemu-img (Debian's qemu-utils) is needed: {e}"))?;
    anyhow::ensure!(converted.success(), "qemu-img convert failed");
    push_disk(
        &registry,
        "disk:qcow2",
        &std::fs::read(scratch.path().join("qcow2"))?,
    )?;
    let served: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 241) as u8).collect();
    let http = HttpFile::serve(served.clone())?;
    let server = ServerProcess::start(Path::new(BIN), "server", &["--fake-qemu"])?;
    imported_disks_back_a_running_vm(&server, &registry, (&disk, &served), http.addr)?;
    a_missing_image_fails_its_data_volume(&server, &registry)?;
    drop(server);
    drop(registry);
    drop(http);
    Ok(())
}

fn imported_disks_back_a_running_vm(
    server: &ServerProcess,
    registry: &TestRegistry,
    (disk, served): (&[u8], &[u8]),
    http: SocketAddr,
) -> anyhow::Result<()> {
    let registry_source = format!(
        "{{registry: {{url: 'docker://{}/disk:v1'}}}}",
        registry.host()
    );
    let qcow2_source = format!(
        "{{registry: {{url: 'docker://{}/disk:qcow2'}}}}",
        registry.host()
    );
    let http_source = format!("{{http: {{url: 'http://{http}/disk.img'}}}}");
    let templates = template("imported-blank", "{blank: {}}")
        + &template("imported-disk", &registry_source)
        + &template("imported-qcow2", &qcow2_source)
        + &template("imported-http", &http_source);
    server.apply(&vm(
        "imported",
        &templates,
        &[
            "imported-blank",
            "imported-disk",
            "imported-qcow2",
            "imported-http",
        ],
    ))?;
    let status = &["vm", "imported"][..];
    wait_for(server, status, "{.status.printableStatus}", "Provisioning")?;
    wait_for(server, status, "{.status.printableStatus}", "Running")?;
    for dv in [
        "imported-blank",
        "imported-disk",
        "imported-qcow2",
        "imported-http",
    ] {
        let what = &["dv", dv][..];
        assert_eq!(server.get(what, "{.status.phase}"), "Succeeded", "{dv}");
        assert_eq!(server.get(what, "{.status.progress}"), "100.0%", "{dv}");
        assert_eq!(server.get(what, "{.status.claimName}"), dv);
        assert_eq!(
            server.get(what, r#"{.status.conditions[?(@.type=="Ready")].status}"#),
            "True"
        );
        assert_eq!(
            server.get(what, "{.metadata.ownerReferences[0].kind}"),
            "VirtualMachine"
        );
        assert_eq!(
            server.get(&["pvc", dv], "{.metadata.ownerReferences[0].kind}"),
            "DataVolume"
        );
    }
    assert_eq!(
        server.get(
            &["vmi", "imported"],
            r#"{.status.conditions[?(@.type=="DataVolumesReady")].status}"#
        ),
        "True"
    );
    let blank = std::fs::metadata(claim_image(server, "imported-blank")?)?;
    // 64 MiB less CDI's 5.5 % filesystem overhead, aligned down to 1 MiB.
    assert_eq!(blank.len(), 60 << 20);
    {
        use std::os::unix::fs::MetadataExt;
        assert!(blank.blocks() * 512 < 1 << 20, "the blank image is sparse");
    }
    let imported = std::fs::read(claim_image(server, "imported-disk")?)?;
    assert!(imported == disk, "the claim holds the pushed disk");
    let raw = std::fs::read(claim_image(server, "imported-qcow2")?)?;
    assert!(raw == disk, "the claim holds the qcow2 image as raw");
    let downloaded = std::fs::read(claim_image(server, "imported-http")?)?;
    assert!(downloaded == served, "the claim holds the served disk");
    let events = server.get(
        &[
            "events",
            "--field-selector",
            "involvedObject.kind=VirtualMachine,involvedObject.name=imported",
        ],
        "{range .items[*]}{.reason}: {.message}{'\\n'}{end}",
    );
    assert!(
        events.contains("SuccessfulDataVolumeCreate: Created DataVolume imported-blank"),
        "{events}"
    );
    assert_eq!(
        server.get(
            &["pods"],
            "{.items[?(@.metadata.labels.app==\"containerized-data-importer\")].metadata.name}"
        ),
        "",
        "importer pods are deleted after their import"
    );

    server.ok(&["delete", "vm", "imported"])?;
    wait_for(server, &["dv"], "{.items[*].metadata.name}", "")?;
    wait_for(server, &["pvc"], "{.items[*].metadata.name}", "")?;
    Ok(())
}

fn a_missing_image_fails_its_data_volume(
    server: &ServerProcess,
    registry: &TestRegistry,
) -> anyhow::Result<()> {
    let url = format!("docker://{}/missing:v1", registry.host());
    server.apply(&vm(
        "broken",
        &template("broken-disk", &format!("{{registry: {{url: '{url}'}}}}")),
        &["broken-disk"],
    ))?;
    wait_for(server, &["dv", "broken-disk"], "{.status.phase}", "Failed")?;
    let message = server.get(
        &["dv", "broken-disk"],
        r#"{.status.conditions[?(@.type=="Running")].message}"#,
    );
    assert!(
        message.starts_with(&format!("Unable to pull image {url}")),
        "{message}"
    );
    wait_for(
        server,
        &["vm", "broken"],
        "{.status.printableStatus}",
        "DataVolumeError",
    )?;
    assert_eq!(server.get(&["vmi"], "{.items[*].metadata.name}"), "");
    server.ok(&["delete", "vm", "broken"])?;
    wait_for(server, &["dv"], "{.items[*].metadata.name}", "")?;
    Ok(())
}
