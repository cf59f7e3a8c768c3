//! The node agent against a real API server: which images run, and what a container sees of
//! its volumes.

mod common;

use std::path::PathBuf;

use common::{NODE, TOOLS, create, start, wait_for, waiting_reason};
use serde_json::json;

#[tokio::test]
async fn an_image_the_store_does_not_know_never_starts_a_process() {
    let node = start().await;
    let pod = create(
        &node,
        json!({"metadata": {"name": "foreign"}, "spec": {"nodeName": NODE, "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox", "command": ["/bin/sh", "-c", "sleep 600"]}]}}),
    )
    .await;
    let seen = wait_for(&node, "foreign", "ErrImagePull", |p| {
        matches!(
            waiting_reason(p).as_deref(),
            Some("ErrImagePull" | "ImagePullBackOff")
        )
    })
    .await;
    assert_eq!(
        seen.status.and_then(|s| s.phase).as_deref(),
        Some("Pending")
    );
    let uid = pod.metadata.uid.expect("uid");
    let record = node.tmp.path().join("node/pods").join(uid).join("c.json");
    assert!(!record.exists(), "no process may have been started");
}

#[tokio::test]
async fn a_container_runs_its_command_and_sees_its_empty_dir_at_the_mount_path() {
    if test_prerequisites::available(if nix::unistd::geteuid().is_root() {
        Ok(())
    } else {
        Err("mount namespaces need root".to_owned())
    })
    .is_none()
    {
        return;
    }
    let node = start().await;
    // A mount path of this test only: the container sees the volume there, the host does not.
    let mount = PathBuf::from(format!("/tmp/kvrs-node-test-{}", std::process::id()));
    let pod = create(
        &node,
        json!({"metadata": {"name": "writer"}, "spec": {"nodeName": NODE, "restartPolicy": "Never",
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [{"name": "c", "image": TOOLS,
                "command": ["sh", "-c"], "args": ["echo \"$GREETING from $POD\" > \"$0/out\"", mount],
                "env": [{"name": "GREETING", "value": "hello"},
                        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                "volumeMounts": [{"name": "data", "mountPath": mount}]}]}}),
    )
    .await;
    let done = wait_for(&node, "writer", "Succeeded", |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded")
    })
    .await;
    let exit = done
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| {
            c.first()?
                .state
                .as_ref()?
                .terminated
                .as_ref()
                .map(|t| t.exit_code)
        });
    assert_eq!(exit, Some(0));
    let uid = pod.metadata.uid.expect("uid");
    let volume = node
        .tmp
        .path()
        .join("node/pods")
        .join(uid)
        .join("volumes/kubernetes.io~empty-dir/data/out");
    assert_eq!(
        std::fs::read_to_string(&volume).expect("the volume's file"),
        "hello from writer\n"
    );
    assert!(
        !mount.join("out").exists(),
        "the bind mount was private to the container"
    );
    let _ = std::fs::remove_dir(&mount);
}

fn phase(p: &k8s_openapi::api::core::v1::Pod) -> Option<&str> {
    p.status.as_ref().and_then(|s| s.phase.as_deref())
}

#[tokio::test]
async fn command_and_args_expand_the_containers_variables_as_kubelet_does() {
    let node = start().await;
    let pod = create(
        &node,
        json!({"metadata": {"name": "expand"}, "spec": {"nodeName": NODE, "restartPolicy": "Never",
            "containers": [{"name": "c", "image": TOOLS,
                "command": ["sh", "-c", "echo \"node=$0 escaped=$1 unknown=$2 greeting=$3\""],
                "args": ["$(NODE_NAME)", "$$(NODE_NAME)", "$(NOT_SET)", "$(GREETING)"],
                "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        {"name": "GREETING", "value": "hi-$(NODE_NAME)"}]}]}}),
    )
    .await;
    wait_for(&node, "expand", "Succeeded", |p| {
        phase(p) == Some("Succeeded")
    })
    .await;
    let uid = pod.metadata.uid.expect("uid");
    let paths =
        kubevirt_node::pods::process::ContainerPaths::new(&node.config.pods_dir().join(uid), "c");
    assert_eq!(
        std::fs::read_to_string(&paths.log).expect("the container's log"),
        format!("node={NODE} escaped=$(NODE_NAME) unknown=$(NOT_SET) greeting=hi-{NODE}\n")
    );
}

#[tokio::test]
async fn host_paths_of_node_state_live_in_the_nodes_own_directory() {
    if test_prerequisites::available(if nix::unistd::geteuid().is_root() {
        Ok(())
    } else {
        Err("mount namespaces need root".to_owned())
    })
    .is_none()
    {
        return;
    }
    let node = start().await;
    let dir = format!("/var/lib/kubevirt-rs/node-test-{}", std::process::id());
    let mount = PathBuf::from(format!("/tmp/kvrs-node-hostpath-{}", std::process::id()));
    create(
        &node,
        json!({"metadata": {"name": "state"}, "spec": {"nodeName": NODE, "restartPolicy": "Never",
            "volumes": [{"name": "state", "hostPath": {"path": dir, "type": "DirectoryOrCreate"}}],
            "containers": [{"name": "c", "image": TOOLS,
                "command": ["sh", "-c", "echo kept > \"$0/out\"", mount],
                "volumeMounts": [{"name": "state", "mountPath": mount}]}]}}),
    )
    .await;
    create(
        &node,
        json!({"metadata": {"name": "escape"}, "spec": {"nodeName": NODE, "restartPolicy": "Never",
            "volumes": [{"name": "up", "hostPath": {"path": "/var/lib/kubelet/../../etc"}}],
            "containers": [{"name": "c", "image": TOOLS, "command": ["sh", "-c", "true"],
                "volumeMounts": [{"name": "up", "mountPath": mount}]}]}}),
    )
    .await;
    wait_for(&node, "state", "Succeeded", |p| {
        phase(p) == Some("Succeeded")
    })
    .await;
    let resolved = node
        .config
        .data_dir
        .join("root")
        .join(dir.trim_start_matches('/'));
    assert_eq!(
        std::fs::read_to_string(resolved.join("out")).expect("the file in the node's own dir"),
        "kept\n"
    );
    assert!(
        !std::path::Path::new(&dir).exists(),
        "the machine's own directory is untouched"
    );
    let refused = wait_for(&node, "escape", "the backstep refused", |p| {
        waiting_message(p).is_some_and(|m| m.contains("must not contain '..'"))
    })
    .await;
    assert_eq!(
        waiting_reason(&refused).as_deref(),
        Some("ContainerCreating")
    );
    let _ = std::fs::remove_dir(&mount);
}

fn waiting_message(pod: &k8s_openapi::api::core::v1::Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .waiting
        .as_ref()?
        .message
        .clone()
}

/// `apiserver_request_total` for `DELETE pods` with `code`.
async fn pod_deletes(node: &common::Node, code: u16) -> u64 {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let text = node.client.request_text(request).await.expect("metrics");
    let series = format!(
        "apiserver_request_total{{verb=\"DELETE\",group=\"\",resource=\"pods\",subresource=\"\",code=\"{code}\"}} "
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

#[tokio::test]
async fn a_burst_of_deleted_pods_is_removed_with_one_delete_each() {
    const PODS: usize = 30;
    let node = start().await;
    for i in 0..PODS {
        create(
            &node,
            json!({"metadata": {"name": format!("burst-{i}")}, "spec": {"nodeName": NODE,
                "containers": [{"name": "c", "image": TOOLS, "command": ["sh", "-c", "exec sleep 600"]}]}}),
        )
        .await;
    }
    let api =
        kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(node.client.clone(), "default");
    testkit::wait_until_async(
        std::time::Duration::from_secs(60),
        "every pod Running",
        || {
            let api = &api;
            async move {
                let pods = api.list(&Default::default()).await.ok()?;
                (pods
                    .items
                    .iter()
                    .filter(|p| phase(p) == Some("Running"))
                    .count()
                    == PODS)
                    .then_some(())
            }
        },
    )
    .await
    .expect("the pods run");
    let (ok_before, gone_before) = (pod_deletes(&node, 200).await, pod_deletes(&node, 404).await);
    // All at once, with kubelet's part (stop, then remove) left to the node.
    let deletes = (0..PODS).map(|i| {
        let api = api.clone();
        async move {
            api.delete(&format!("burst-{i}"), &Default::default())
                .await
                .map(|_| ())
        }
    });
    for result in futures::future::join_all(deletes).await {
        result.expect("delete");
    }
    testkit::wait_until_async(
        std::time::Duration::from_secs(60),
        "every pod removed",
        || {
            let api = &api;
            async move {
                api.list(&Default::default())
                    .await
                    .ok()
                    .filter(|l| l.items.is_empty())
            }
        },
    )
    .await
    .expect("the pods are removed");
    let node_deletes = pod_deletes(&node, 200).await - ok_before - PODS as u64;
    let repeated = pod_deletes(&node, 404).await - gone_before;
    assert_eq!(
        (node_deletes, repeated),
        (PODS as u64, 0),
        "the node removes each stopped pod with one DELETE and never deletes a removed pod again"
    );
}
