//! End-to-end: the embedded storage. A claim without `storageClassName` gets the default
//! class `local` (WaitForFirstConsumer); a pod using it makes the scheduler select its node,
//! the local provisioner make `pvc-<uid>` below the node's data directory and bind it, and the
//! node mount it. What a pod writes there outlives the pod and is seen by the next pod of the
//! claim; a `readOnly` claim cannot be written; a claim in use waits for its pod to go
//! (pvc-protection), and deleting the claim deletes the volume and its directory. A missing
//! claim keeps its pod Pending with kube's message. A `Block` claim is provisioned as a sparse
//! image attached to a loop device; its pod gets the device at its `devicePath`, what is
//! written there lands in the image, and deleting the claim detaches the device. The pods
//! run the project's own image (`kubevirt-rs apiserver` as a long-running process that writes
//! its files into the volume, `kubevirt-rs manifests` as a short one).

use std::path::{Path, PathBuf};

use testkit::{DEADLINE, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

fn image() -> String {
    format!("kubevirt-rs/virt-operator:{}", env!("CARGO_PKG_VERSION"))
}

fn fail(server: &ServerProcess) -> impl Fn(anyhow::Error) -> anyhow::Error + '_ {
    move |e| anyhow::anyhow!("{e}\nserver log:\n{}", server.log())
}

/// A pod running `args` of the project's image with claim `claim` at `mount`.
fn pod(name: &str, claim: &str, read_only: bool, mount: &Path, args: &[String]) -> String {
    let args = serde_json::to_string(args).unwrap_or_default();
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: {image}
    command: ["kubevirt-rs"]
    args: {args}
    volumeMounts:
    - name: data
      mountPath: {mount}
  volumes:
  - name: data
    persistentVolumeClaim:
      claimName: {claim}
      readOnly: {read_only}
"#,
        image = image(),
        mount = mount.display(),
    )
}

fn wait_phase(server: &ServerProcess, pod: &str, phase: &str) -> anyhow::Result<()> {
    wait_until(DEADLINE, &format!("pod {pod} to be {phase}"), || {
        (server.get(&["pod", pod], "{.status.phase}") == phase).then_some(())
    })
}

fn apiserver_args(dir: &Path) -> Vec<String> {
    vec![
        "apiserver".into(),
        "--data-dir".into(),
        dir.display().to_string(),
        "--listen".into(),
        "127.0.0.1:0".into(),
    ]
}

/// The default class is `local`, as the embedded server installs it.
fn assert_default_class(server: &ServerProcess) {
    let class = server.get(&["storageclass", "local"],
        r#"{.provisioner} {.volumeBindingMode} {.reclaimPolicy} {.metadata.annotations.storageclass\.kubernetes\.io/is-default-class}"#,
    );
    assert_eq!(
        class,
        "kubevirt-rs.io/local WaitForFirstConsumer Delete true"
    );
}

/// The claim `data` is bound to `volume`, provisioned on the node of pod `pod`.
fn assert_bound(server: &ServerProcess, volume: &str, pod: &str) {
    assert_eq!(
        server.get(&["pvc", "data"],
            "{.status.phase} {.spec.volumeName} {.metadata.annotations.volume\\.kubernetes\\.io/selected-node}"
        ),
        format!(
            "Bound {volume} {}",
            server.get(&["pod", pod], "{.spec.nodeName}")
        )
    );
    assert_eq!(
        server.get(&["pv", volume],
            "{.status.phase} {.spec.claimRef.name} {.spec.capacity.storage} {.spec.hostPath.path} {.metadata.annotations.pv\\.kubernetes\\.io/provisioned-by}"
        ),
        format!("Bound data 1Gi /opt/local-path-provisioner/{volume} kubevirt-rs.io/local")
    );
}

/// A pod mounting the claim read-only cannot write into it.
fn read_only_pod_fails(server: &ServerProcess, mount: &Path, dir: &Path) -> anyhow::Result<()> {
    let write = vec![
        "manifests".to_owned(),
        "--output-dir".to_owned(),
        mount.join("deploy").display().to_string(),
    ];
    server.apply(&pod("read-only", "data", true, mount, &write))?;
    wait_phase(server, "read-only", "Failed").map_err(fail(server))?;
    assert!(!dir.join("deploy").exists());
    server.ok(&["delete", "pod", "read-only", "--wait=true"])?;
    Ok(())
}

#[test]
fn a_claim_is_provisioned_on_its_pods_node_outlives_its_pods_and_goes_with_its_claim()
-> anyhow::Result<()> {
    let server = ServerProcess::start(Path::new(BIN), "server", &["--no-kubevirt", "--fake-qemu"])?;
    assert_default_class(&server);
    server.apply(
        r"apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
",
    )?;
    // The default class was given at admission; the PV controller marks it Pending.
    wait_until(
        DEADLINE,
        "the claim to be Pending in the default class",
        || {
            let claim = server.get(&["pvc", "data"], "{.spec.storageClassName} {.status.phase}");
            (claim == "local Pending").then_some(())
        },
    )
    .map_err(fail(&server))?;
    let uid = server.get(&["pvc", "data"], "{.metadata.uid}");
    let volume = format!("pvc-{uid}");
    let dir: PathBuf = server.data_dir().join("node/storage").join(&volume);
    let mount = server.data_dir().join("mnt/data");

    // A long-running pod writing into the claim: the claim is bound on the pod's node.
    server.apply(&pod(
        "writer",
        "data",
        false,
        &mount,
        &apiserver_args(&mount.join("api")),
    ))?;
    wait_phase(&server, "writer", "Running").map_err(fail(&server))?;
    assert_bound(&server, &volume, "writer");
    let ca = dir.join("api/pki/ca.crt");
    let kubeconfig = dir.join("api/kubeconfig");
    wait_until(
        DEADLINE,
        "the pod's files in the volume's directory",
        || {
            std::fs::read_to_string(&kubeconfig)
                .ok()
                .filter(|k| k.contains("server: https://"))
        },
    )
    .map_err(fail(&server))?;
    let first_ca = std::fs::read(&ca)?;
    let first_kubeconfig = std::fs::read_to_string(&kubeconfig)?;
    server.ok(&["delete", "pod", "writer", "--wait=true"])?;
    assert_eq!(std::fs::read(&ca)?, first_ca, "the files outlive the pod");

    // readOnly is honoured: writing fails, the pod fails.
    read_only_pod_fails(&server, &mount, &dir)?;

    // The next pod of the claim sees them: its API server keeps the CA it finds.
    server.apply(&pod(
        "again",
        "data",
        false,
        &mount,
        &apiserver_args(&mount.join("api")),
    ))?;
    wait_phase(&server, "again", "Running").map_err(fail(&server))?;
    wait_until(DEADLINE, "the second pod to write its kubeconfig", || {
        std::fs::read_to_string(&kubeconfig)
            .ok()
            .filter(|k| k.contains("server: https://") && *k != first_kubeconfig)
    })
    .map_err(fail(&server))?;
    assert_eq!(
        std::fs::read(&ca)?,
        first_ca,
        "the second pod used the first one's CA"
    );

    // A claim in use is kept (pvc-protection) until its pod is gone; then deleting it
    // deletes the volume and its directory.
    server.ok(&["delete", "pvc", "data", "--wait=false"])?;
    wait_until(DEADLINE, "the claim to be marked deleted", || {
        let deleted = server.get(&["pvc", "data"], "{.metadata.deletionTimestamp}");
        (!deleted.is_empty()).then_some(())
    })
    .map_err(fail(&server))?;
    assert_eq!(
        server.get(&["pvc", "data"], "{.metadata.finalizers}"),
        r#"["kubernetes.io/pvc-protection"]"#
    );
    assert!(dir.join("api/kubeconfig").exists());
    server.ok(&["delete", "pod", "again", "--wait=true"])?;
    wait_until(
        DEADLINE,
        "the volume and its directory to be deleted",
        || {
            let gone = server.kubectl(&["get", "pv", &volume]);
            (!gone.status.success() && !dir.exists()).then_some(())
        },
    )
    .map_err(fail(&server))?;
    assert!(server.data_dir().join("node/storage").is_dir());
    Ok(())
}

/// A pod running `args` of the project's image with the `Block` claim `claim` as the device
/// `device`.
fn block_pod(name: &str, claim: &str, device: &str, args: &[String]) -> String {
    let args = serde_json::to_string(args).unwrap_or_default();
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: {image}
    command: ["kubevirt-rs"]
    args: {args}
    volumeDevices:
    - name: data
      devicePath: {device}
  volumes:
  - name: data
    persistentVolumeClaim:
      claimName: {claim}
"#,
        image = image(),
    )
}

/// The loop devices `file` is attached to, as `losetup` lists them.
fn loop_devices_of(file: &Path) -> String {
    let out = std::process::Command::new("losetup")
        .args(["--list", "--noheadings", "--output", "NAME", "--associated"])
        .arg(file)
        .output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

#[test]
fn a_block_claim_is_a_loop_device_of_a_sparse_image_given_to_its_pod() -> anyhow::Result<()> {
    use std::io::{Read, Seek, Write};
    let root = nix::unistd::Uid::effective().is_root();
    let loops = if root && Path::new("/dev/loop-control").exists() {
        Ok(())
    } else {
        Err("Block claims need loop devices (root and /dev/loop-control)".to_owned())
    };
    if testkit::available(loops).is_none() {
        return Ok(());
    }
    let server = ServerProcess::start(Path::new(BIN), "server", &["--no-kubevirt", "--fake-qemu"])?;
    let _detach = testkit::DetachLoopsOnDrop(server.data_dir().to_owned());
    let mount = server.data_dir().join("mnt/raw");
    server.apply(
        r"apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: raw
spec:
  accessModes: [ReadWriteOnce]
  volumeMode: Block
  resources:
    requests:
      storage: 64Mi
",
    )?;
    let device = "/dev/kvrs-e2e-raw";
    server.apply(&block_pod(
        "raw-user",
        "raw",
        device,
        &apiserver_args(&mount.join("api")),
    ))?;
    wait_phase(&server, "raw-user", "Running").map_err(fail(&server))?;
    let volume = server.get(&["pvc", "raw"], "{.spec.volumeName}");
    assert_eq!(
        server.get(&["pvc", "raw"], "{.status.phase} {.spec.volumeMode}"),
        "Bound Block"
    );
    assert_eq!(
        server.get(
            &["pv", &volume],
            "{.spec.volumeMode} {.spec.local.path} {.spec.capacity.storage}"
        ),
        format!("Block /opt/local-path-provisioner/{volume}/block.img 64Mi")
    );
    let dir = server.data_dir().join("node/storage").join(&volume);
    let image = dir.join("block.img");
    let meta = std::fs::metadata(&image)?;
    assert_eq!(meta.len(), 64 << 20);
    assert!(
        std::os::unix::fs::MetadataExt::blocks(&meta) < 1024,
        "sparse: {meta:?}"
    );
    let attached = loop_devices_of(&image);
    assert!(attached.starts_with("/dev/loop"), "attached: {attached:?}");

    // The container sees the loop device at its devicePath (through its mount namespace),
    // and what is written there is in the image.
    let pid = server.container_pid("default", "raw-user", "main")?;
    let in_container = PathBuf::from(format!("/proc/{pid}/root")).join(&device[1..]);
    {
        use std::os::unix::fs::FileTypeExt;
        let kind = std::fs::metadata(&in_container)?.file_type();
        assert!(
            kind.is_block_device(),
            "{}: {kind:?}",
            in_container.display()
        );
        let mut dev = std::fs::OpenOptions::new()
            .write(true)
            .open(&in_container)?;
        dev.seek(std::io::SeekFrom::Start(1 << 20))?;
        dev.write_all(b"WRITTEN-THROUGH-THE-DEVICE")?;
        dev.sync_all()?;
    }
    let mut file = std::fs::File::open(&image)?;
    file.seek(std::io::SeekFrom::Start(1 << 20))?;
    let mut seen = [0u8; 26];
    file.read_exact(&mut seen)?;
    assert_eq!(&seen, b"WRITTEN-THROUGH-THE-DEVICE");

    // Deleting the pod and then the claim detaches the device and removes the image.
    server.ok(&["delete", "pod", "raw-user", "--wait=true"])?;
    server.ok(&["delete", "pvc", "raw", "--wait=true"])?;
    wait_until(DEADLINE, "the block volume to be released", || {
        let gone = server.kubectl(&["get", "pv", &volume]);
        (!gone.status.success() && !dir.exists()).then_some(())
    })
    .map_err(fail(&server))?;
    assert_eq!(loop_devices_of(&image), "", "detached");
    // The mount point the node made on the host's /dev (no private root) is an empty file.
    if std::fs::metadata(device).is_ok_and(|m| m.is_file() && m.len() == 0) {
        let _ = std::fs::remove_file(device);
    }
    Ok(())
}

#[test]
fn a_missing_claim_keeps_its_pod_pending() -> anyhow::Result<()> {
    let server = ServerProcess::start(Path::new(BIN), "server", &["--no-kubevirt", "--fake-qemu"])?;
    let mount = server.data_dir().join("mnt/x");
    let args = apiserver_args(&mount.join("api"));
    server.apply(&pod("orphan", "missing", false, &mount, &args))?;
    wait_until(DEADLINE, "the pod to be unschedulable", || {
        let condition = server.get(&["pod", "orphan"],
            r#"{.status.conditions[?(@.type=="PodScheduled")].reason}: {.status.conditions[?(@.type=="PodScheduled")].message}"#,
        );
        (condition
            == r#"Unschedulable: 0/1 nodes are available: persistentvolumeclaim "missing" not found."#)
            .then_some(())
    })
    .map_err(fail(&server))?;

    // A pod bound by name bypasses the scheduler: the node waits for its claim, retrying.
    let node = server.get(&["nodes"], "{.items[0].metadata.name}");
    let pinned = pod("pinned", "later", false, &mount, &args).replace(
        "spec:\n  restartPolicy",
        &format!("spec:\n  nodeName: {node}\n  restartPolicy"),
    );
    server.apply(&pinned)?;
    let waiting = |problem: &str| {
        let expected = format!(
            "ContainerCreating MountVolume.SetUp failed for volume \"data\" : error processing PVC default/later: {problem}"
        );
        wait_until(DEADLINE, &format!("the pod to wait for its claim: {problem}"), || {
            let state = server.get(&["pod", "pinned"],
                "{.status.containerStatuses[0].state.waiting.reason} {.status.containerStatuses[0].state.waiting.message}",
            );
            (state == expected).then_some(())
        })
        .map_err(fail(&server))
    };
    waiting(r#"failed to fetch PVC from API server: persistentvolumeclaims "later" not found"#)?;
    // A WaitForFirstConsumer claim of a pod that bypassed the scheduler stays unbound, as in
    // kube.
    server.apply(
        r"apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: later
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
",
    )?;
    waiting("PVC is not bound")?;
    Ok(())
}
