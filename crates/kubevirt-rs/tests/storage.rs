//! End-to-end: the embedded storage. A claim without `storageClassName` gets the default
//! class `local` (WaitForFirstConsumer); a pod using it makes the scheduler select its node,
//! the local provisioner make `pvc-<uid>` below the node's data directory and bind it, and the
//! node mount it. What a pod writes there outlives the pod and is seen by the next pod of the
//! claim; a `readOnly` claim cannot be written; a claim in use waits for its pod to go
//! (pvc-protection), and deleting the claim deletes the volume and its directory. A missing claim and a `Block` claim stay Pending with kube's messages. The pods
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

#[test]
fn a_missing_claim_and_a_block_claim_keep_their_pods_pending() -> anyhow::Result<()> {
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
      storage: 1Gi
",
    )?;
    server.apply(&pod("raw-user", "raw", false, &mount, &args))?;
    let event = wait_until(DEADLINE, "the Block claim to be refused", || {
        let events = server.get(&["events"],
            r#"{range .items[?(@.involvedObject.name=="raw")]}{.type} {.reason}: {.message}{"\n"}{end}"#,
        );
        events
            .lines()
            .find(|e| e.contains("ProvisioningFailed"))
            .map(str::to_owned)
    })
    .map_err(fail(&server))?;
    assert!(event.starts_with("Warning ProvisioningFailed: "), "{event}");
    assert!(
        event.contains("volumeMode Block is not supported"),
        "{event}"
    );
    assert_eq!(server.get(&["pvc", "raw"], "{.status.phase}"), "Pending");
    assert_eq!(
        server.get(&["pod", "raw-user"], "{.status.phase}"),
        "Pending"
    );
    assert_eq!(server.get(&["pod", "raw-user"], "{.spec.nodeName}"), "");

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
