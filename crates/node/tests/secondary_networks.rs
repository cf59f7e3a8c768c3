//! Secondary networks (the node agent playing Multus) on a real API server with the real CNI
//! plugins: a NetworkAttachmentDefinition with `bridge` + `host-local`, a pod that names it in
//! `k8s.v1.cni.cncf.io/networks`, and the annotation changed while the pod runs. The node's
//! slot bridge and the definition's own bridge are deleted when the test ends, even on failure.

mod common;

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use common::{NODE, Node, TOOLS, create, wait_for};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kubevirt_node::pods::multus::{NETWORK_STATUS_ANNOTATION, NETWORKS_ANNOTATION};
use pod_network::{Ipv4Cidr, NetworkNamespace};
use serde_json::{Value, json};

/// Deletes the definition's bridge on the host when dropped.
struct BridgeGuard(String);

impl Drop for BridgeGuard {
    fn drop(&mut self) {
        let _ = pod_network::delete_bridge(&self.0);
    }
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Installs the CRD and creates definition `name` (bridge `bridge`, addresses of `subnet`),
/// retrying until the new resource is served.
async fn create_definition(node: &Node, name: &str, bridge: &str, subnet: Ipv4Cidr) {
    let crds = Api::<DynamicObject>::all_with(
        node.client.clone(),
        &resource(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
        ),
    );
    let crd: DynamicObject =
        serde_json::from_value(kubevirt_node::network_attachments::objects().remove(0))
            .expect("crd");
    crds.create(&PostParams::default(), &crd)
        .await
        .expect("create the CRD");
    let nads = Api::<DynamicObject>::namespaced_with(
        node.client.clone(),
        "default",
        &resource(
            "k8s.cni.cncf.io",
            "v1",
            "NetworkAttachmentDefinition",
            "network-attachment-definitions",
        ),
    );
    let config = json!({"cniVersion": "0.3.1", "name": name, "type": "bridge", "bridge": bridge,
        "ipam": {"type": "host-local", "subnet": subnet.to_string()}});
    let nad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": name}, "spec": {"config": config.to_string()},
    }))
    .expect("nad");
    testkit::wait_until_async(Duration::from_secs(30), "the definition created", || {
        let (nads, nad) = (&nads, &nad);
        async move { nads.create(&PostParams::default(), nad).await.ok() }
    })
    .await
    .expect("definition");
}

fn network_status(pod: &Pod) -> Vec<Value> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NETWORK_STATUS_ANNOTATION))
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default()
}

fn status_of<'a>(status: &'a [Value], interface: &str) -> Option<&'a Value> {
    status.iter().find(|s| s["interface"] == interface)
}

/// `ip -4 -o addr` as seen inside the namespace at `netns`.
fn addresses_in(netns: &Path) -> String {
    let namespace = NetworkNamespace::open_path(netns).expect("the pod's netns");
    namespace
        .run_in(|| {
            std::process::Command::new("ip")
                .args(["-4", "-o", "addr"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        })
        .expect("enter")
        .expect("ip")
}

#[tokio::test]
async fn a_pod_gets_the_interfaces_its_annotation_names_also_while_it_runs() {
    let Some(()) = common::network_prerequisites() else {
        return;
    };
    let node = common::start_networked().await;
    let slot_bridge = node
        .config
        .pod_network
        .as_ref()
        .expect("network")
        .bridge
        .clone();
    // One definition bridge per slot bridge, so concurrent runs never share one.
    let bridge = BridgeGuard(format!("{slot_bridge}s"));
    let subnet: Ipv4Cidr = "192.168.251.0/24".parse().expect("cidr");
    create_definition(&node, "blue", &bridge.0, subnet).await;

    let mount = node.tmp.path().join("mnt/a");
    create(
        &node,
        json!({"metadata": {"name": "a", "annotations": {NETWORKS_ANNOTATION: "blue@net1"}},
            "spec": {"nodeName": NODE, "volumes": [{"name": "out", "emptyDir": {}}],
            "containers": [{"name": "c", "image": TOOLS, "command": ["sh", "-c"],
                "args": ["ip -4 -o addr show net1 > \"$0/net1.tmp\"; mv \"$0/net1.tmp\" \"$0/net1\"; exec sleep 600",
                         mount.display().to_string()],
                "volumeMounts": [{"name": "out", "mountPath": mount.display().to_string()}]}]}}),
    )
    .await;
    let a = wait_for(&node, "a", "pod a running with its network status", |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            && status_of(&network_status(p), "net1").is_some()
    })
    .await;
    let uid = a.metadata.uid.clone().expect("uid");
    let status = network_status(&a);
    assert_eq!(status[0]["interface"], "eth0");
    assert_eq!(status[0]["default"], true);
    let net1 = status_of(&status, "net1").expect("net1");
    assert_eq!(net1["name"], "default/blue");
    let ip: IpAddr = net1["ips"][0]
        .as_str()
        .expect("an address")
        .parse()
        .expect("ip");
    assert!(subnet.contains(ip), "{ip} not in {subnet}");
    // The container started with the interface there, holding the address IPAM gave it.
    let seen = node
        .config
        .pods_dir()
        .join(&uid)
        .join("volumes/kubernetes.io~empty-dir/out/net1");
    let seen =
        testkit::wait_until_async(Duration::from_secs(60), "the container's view", || async {
            std::fs::read_to_string(&seen).ok()
        })
        .await
        .expect("the container's file");
    assert!(seen.contains(&format!("inet {ip}/24")), "{seen}");

    attach_and_detach_while_running(&node, &uid, ip).await;
}

/// Attaches a second interface to the running pod `uid` (its first has `first_ip`), then
/// detaches the first: the namespace, the reservations and the status follow.
async fn attach_and_detach_while_running(node: &Node, uid: &str, first_ip: IpAddr) {
    let ip = first_ip;
    // Attach a second interface to the running pod, then detach the first.
    let pods = Api::<Pod>::namespaced(node.client.clone(), "default");
    let annotate = |value: &str| json!({"metadata": {"annotations": {NETWORKS_ANNOTATION: value}}});
    pods.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(&annotate("blue@net1,blue@net2")),
    )
    .await
    .expect("annotate");
    let a = wait_for(node, "a", "net2 in the network status", |p| {
        status_of(&network_status(p), "net2").is_some()
    })
    .await;
    let netns = node.config.data_dir.join("netns").join(uid);
    let net2 = status_of(&network_status(&a), "net2")
        .cloned()
        .expect("net2");
    let ip2 = net2["ips"][0].as_str().expect("an address").to_owned();
    assert_ne!(ip2, ip.to_string());
    let inside = addresses_in(&netns);
    assert!(inside.contains(&format!("inet {ip2}/24")), "{inside}");

    pods.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(&annotate("blue@net2")),
    )
    .await
    .expect("annotate");
    wait_for(node, "a", "net1 gone from the network status", |p| {
        let status = network_status(p);
        status_of(&status, "net1").is_none() && status_of(&status, "net2").is_some()
    })
    .await;
    let inside = addresses_in(&netns);
    assert!(!inside.contains(" net1 "), "{inside}");
    let reservation = node
        .config
        .data_dir
        .join("cni/networks/blue")
        .join(ip.to_string());
    assert!(
        !reservation.exists(),
        "the address of net1 is still reserved"
    );
    assert_eq!(
        a.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running")
    );
}

#[tokio::test]
async fn a_pod_naming_a_missing_definition_waits_with_the_reason() {
    let Some(()) = common::network_prerequisites() else {
        return;
    };
    let node = common::start_networked().await;
    create(
        &node,
        json!({"metadata": {"name": "m", "annotations": {NETWORKS_ANNOTATION: "nowhere@net1"}},
            "spec": {"nodeName": NODE,
            "containers": [{"name": "c", "image": TOOLS, "command": ["sh", "-c", "exec sleep 600"]}]}}),
    )
    .await;
    let m = wait_for(&node, "m", "pod m waiting with a reason", |p| {
        common::waiting_reason(p).as_deref() == Some("ContainerCreating")
            && message(p).contains("nowhere")
    })
    .await;
    assert!(
        message(&m).contains("attaching network default/nowhere"),
        "{}",
        message(&m)
    );
}

fn message(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.message.clone())
        .unwrap_or_default()
}
