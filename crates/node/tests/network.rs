//! Pods in their own network namespaces on a real API server, with the real CNI plugins: each
//! test node holds a slot of the machine-wide allocator (its own bridge and CIDR), and dropping
//! it releases the pods' networks and deletes the bridge even when an assertion fails.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{NODE, Node, TOOLS, create, wait_for};
use k8s_openapi::api::core::v1::{Node as NodeObject, Pod};
use kube::api::{Api, DeleteParams};
use pod_network::NetworkNamespace;
use serde_json::json;

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

fn pod_ip(pod: &Pod) -> Option<IpAddr> {
    pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().expect("uid")
}

/// The host-side directory of a pod's emptyDir `name`.
fn volume(node: &Node, uid: &str, name: &str) -> PathBuf {
    node.config
        .pods_dir()
        .join(uid)
        .join("volumes/kubernetes.io~empty-dir")
        .join(name)
}

fn netns_file(node: &Node, uid: &str) -> PathBuf {
    node.config.data_dir.join("netns").join(uid)
}

/// `host-local`'s reservation file of `ip`.
fn reservation(node: &Node, ip: IpAddr) -> PathBuf {
    node.config
        .data_dir
        .join("cni/networks")
        .join(kubevirt_node::pods::network::NETWORK_NAME)
        .join(ip.to_string())
}

fn network(node: &Node) -> &kubevirt_node::PodNetworkConfig {
    node.config.pod_network.as_ref().expect("a pod network")
}

fn gateway(node: &Node) -> Ipv4Addr {
    network(node).pod_cidr.first_host()
}

/// A listener (in whatever network the calling thread is in) that greets `connections`
/// clients with `greeting`.
fn greet(listener: TcpListener, connections: usize, greeting: &'static str) -> u16 {
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().take(connections).flatten() {
            let _ = stream.write_all(greeting.as_bytes());
        }
    });
    port
}

/// A pod whose container writes its eth0 addresses to its `out` volume and then sleeps.
fn sleeper(node: &Node, name: &str, extra: &serde_json::Value) -> serde_json::Value {
    let mount = mount_path(node, name);
    let mut pod = json!({"metadata": {"name": name}, "spec": {"nodeName": NODE,
        "volumes": [{"name": "out", "emptyDir": {}}],
        "containers": [{"name": "c", "image": TOOLS, "command": ["sh", "-c"],
            "args": ["ip -4 -o addr show eth0 > \"$0/addr.tmp\"; mv \"$0/addr.tmp\" \"$0/addr\"; exec sleep 600",
                     &mount],
            "volumeMounts": [{"name": "out", "mountPath": &mount}]}]}});
    if let (Some(spec), Some(extra)) = (pod["spec"].as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    pod
}

/// Where pod `name`'s container sees its volume: a directory of the test's own (the container
/// sees the host's files, so the mount point is made there).
fn mount_path(node: &Node, name: &str) -> String {
    node.tmp.path().join("mnt").join(name).display().to_string()
}

async fn wait_file(path: &Path) -> String {
    testkit::wait_until_async(Duration::from_secs(60), "the container's file", || async {
        std::fs::read_to_string(path).ok()
    })
    .await
    .expect("the file")
}

async fn wait_gone(node: &Node, name: &str) {
    let api = Api::<Pod>::namespaced(node.client.clone(), "default");
    testkit::wait_until_async(Duration::from_secs(60), "the pod removed", || {
        let api = &api;
        async move { api.get_opt(name).await.ok().filter(Option::is_none) }
    })
    .await
    .expect("pod removed");
}

/// The Node says which addresses its pods get.
async fn assert_node_pod_cidr(node: &Node) {
    let cidr = network(node).pod_cidr;
    let nodes = Api::<NodeObject>::all(node.client.clone());
    let spec = testkit::wait_until_async(Duration::from_secs(60), "the node's podCIDR", || {
        let nodes = &nodes;
        async move {
            nodes
                .get_opt(NODE)
                .await
                .ok()
                .flatten()?
                .spec
                .filter(|s| s.pod_cidr.is_some())
        }
    })
    .await
    .expect("node spec");
    assert_eq!(spec.pod_cidr, Some(cidr.to_string()));
    assert_eq!(spec.pod_cidrs, Some(vec![cidr.to_string()]));
}

/// Pod `b`, which reads what pod a's listener (`port_a`) and the host's (`port_host`, at the
/// bridge's gateway address) send, into its `out` volume; returns it finished.
async fn run_client_pod(node: &Node, ip_a: IpAddr, port_a: u16, port_host: u16) -> Pod {
    let mount = mount_path(node, "b");
    create(
        node,
        json!({"metadata": {"name": "b"}, "spec": {"nodeName": NODE, "restartPolicy": "Never",
            "volumes": [{"name": "out", "emptyDir": {}}],
            "containers": [{"name": "c", "image": TOOLS, "command": ["bash", "-c"],
                "args": ["cat < /dev/tcp/$A/$PORT_A > \"$0/from-a\" && cat < /dev/tcp/$GW/$PORT_HOST > \"$0/from-host\"",
                         &mount],
                "env": [{"name": "A", "value": ip_a.to_string()}, {"name": "PORT_A", "value": port_a.to_string()},
                        {"name": "GW", "value": gateway(node).to_string()}, {"name": "PORT_HOST", "value": port_host.to_string()}],
                "volumeMounts": [{"name": "out", "mountPath": &mount}]}]}}),
    )
    .await;
    wait_for(node, "b", "pod b finished", |p| {
        matches!(phase(p), Some("Succeeded" | "Failed"))
    })
    .await
}

#[tokio::test]
async fn pods_get_addresses_of_the_pod_cidr_see_their_eth0_and_reach_each_other_and_the_host() {
    let Some(()) = common::network_prerequisites() else {
        return;
    };
    let node = common::start_networked().await;
    let cidr = network(&node).pod_cidr;

    assert_node_pod_cidr(&node).await;
    let created = Instant::now();
    create(&node, sleeper(&node, "a", &json!({}))).await;
    let a = wait_for(&node, "a", "pod a running with an IP", |p| {
        phase(p) == Some("Running") && pod_ip(p).is_some()
    })
    .await;
    eprintln!(
        "pod a Running with its own network {} ms after creation",
        created.elapsed().as_millis()
    );
    let ip_a = pod_ip(&a).expect("pod IP");
    assert!(cidr.contains(ip_a), "{ip_a} not in {cidr}");
    assert_ne!(ip_a, IpAddr::V4(gateway(&node)));
    let ips: Vec<String> = a
        .status
        .as_ref()
        .and_then(|s| s.pod_ips.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|p| p.ip)
        .collect();
    assert_eq!(ips, vec![ip_a.to_string()]);
    assert_eq!(
        a.status.as_ref().and_then(|s| s.host_ip.as_deref()),
        Some("127.0.0.1")
    );
    // The container sees its own address on eth0.
    let addr = wait_file(&volume(&node, &uid(&a), "out").join("addr")).await;
    assert!(addr.contains(&format!("inet {ip_a}/24")), "{addr}");
    assert!(netns_file(&node, &uid(&a)).exists());
    assert!(reservation(&node, ip_a).exists());

    // A listener inside pod a's network, and one on the host.
    let ns_a = NetworkNamespace::open_path(netns_file(&node, &uid(&a))).expect("pod a's netns");
    let in_a = ns_a
        .run_in(|| TcpListener::bind("0.0.0.0:0"))
        .expect("enter pod a")
        .expect("listen in pod a");
    let port_a = greet(in_a, 1, "hello from a");
    let port_host = greet(
        TcpListener::bind("0.0.0.0:0").expect("listen"),
        1,
        "hello from the host",
    );

    let b = run_client_pod(&node, ip_a, port_a, port_host).await;
    let out_b = volume(&node, &uid(&b), "out");
    let log = std::fs::read_to_string(node.config.pods_dir().join(uid(&b)).join("c.log"));
    assert_eq!(
        phase(&b),
        Some("Succeeded"),
        "pod b failed to connect: {log:?}"
    );
    assert_eq!(
        std::fs::read_to_string(out_b.join("from-a")).expect("from a"),
        "hello from a"
    );
    assert_eq!(
        std::fs::read_to_string(out_b.join("from-host")).expect("from host"),
        "hello from the host"
    );
    let ip_b = pod_ip(&b).expect("pod b keeps its IP in its status");
    assert!(cidr.contains(ip_b) && ip_b != ip_a, "{ip_b}");
    // A finished pod's network is released, its address back in the pool.
    testkit::wait_until_async(
        Duration::from_secs(60),
        "pod b's network released",
        || async {
            (!netns_file(&node, &uid(&b)).exists() && !reservation(&node, ip_b).exists())
                .then_some(())
        },
    )
    .await
    .expect("released");

    // A hostNetwork pod stays in the host's network.
    create(
        &node,
        json!({"metadata": {"name": "h"}, "spec": {"nodeName": NODE, "hostNetwork": true,
            "containers": [{"name": "c", "image": TOOLS, "command": ["sh", "-c", "exec sleep 600"]}]}}),
    )
    .await;
    let h = wait_for(&node, "h", "pod h running", |p| phase(p) == Some("Running")).await;
    assert_eq!(pod_ip(&h), Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    assert!(!netns_file(&node, &uid(&h)).exists());

    // Deleting pod a removes its namespace and frees its address.
    Api::<Pod>::namespaced(node.client.clone(), "default")
        .delete("a", &DeleteParams::default())
        .await
        .expect("delete a");
    wait_gone(&node, "a").await;
    assert!(!netns_file(&node, &uid(&a)).exists());
    assert!(!reservation(&node, ip_a).exists());
}

#[tokio::test]
async fn a_host_port_reaches_the_pod_and_its_rules_go_with_it() {
    let Some(()) = common::network_prerequisites() else {
        return;
    };
    let node = common::start_networked().await;
    let host_port = TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let pod = create(
        &node,
        json!({"metadata": {"name": "web"}, "spec": {"nodeName": NODE,
            "containers": [{"name": "c", "image": TOOLS, "command": ["sh", "-c", "exec sleep 600"],
                "ports": [{"containerPort": 8080, "hostPort": host_port}]}]}}),
    )
    .await;
    wait_for(&node, "web", "running", |p| phase(p) == Some("Running")).await;
    let ns = NetworkNamespace::open_path(netns_file(&node, &uid(&pod))).expect("netns");
    let listener = ns
        .run_in(|| TcpListener::bind("0.0.0.0:8080"))
        .expect("enter")
        .expect("listen in the pod");
    greet(listener, 1, "hello through the host port");
    // The bridge's address is one of the host's own, which portmap's OUTPUT rule matches.
    let addr = SocketAddr::new(IpAddr::V4(gateway(&node)), host_port);
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read");
    assert_eq!(text, "hello through the host port");

    Api::<Pod>::namespaced(node.client.clone(), "default")
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete");
    wait_gone(&node, "web").await;
    let nat = std::process::Command::new("iptables")
        .args(["-t", "nat", "-S"])
        .output()
        .expect("iptables");
    let nat = String::from_utf8_lossy(&nat.stdout);
    assert!(!nat.contains(&uid(&pod)), "rules left after the pod: {nat}");
}

#[tokio::test]
async fn a_restarted_agent_re_adopts_the_pod_with_its_namespace_and_address() {
    let Some(()) = common::network_prerequisites() else {
        return;
    };
    let mut node = common::start_networked().await;
    create(
        &node,
        sleeper(&node, "kept", &json!({"restartPolicy": "Never"})),
    )
    .await;
    let before = wait_for(&node, "kept", "running", |p| {
        phase(p) == Some("Running") && pod_ip(p).is_some()
    })
    .await;
    let record = |p: &Pod| {
        p.status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .first()?
            .container_id
            .clone()
    };
    let netns = netns_file(&node, &uid(&before));
    let ipam_dir = node
        .config
        .data_dir
        .join("cni/networks")
        .join(kubevirt_node::pods::network::NETWORK_NAME);
    let reservations = || {
        std::fs::read_dir(&ipam_dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().parse::<IpAddr>().is_ok())
            .count()
    };
    assert_eq!(reservations(), 1);
    node.restart_agent();
    // A second pod shows the new agent is at work; the first keeps everything it had.
    create(&node, sleeper(&node, "new", &json!({}))).await;
    let new = wait_for(&node, "new", "running", |p| {
        phase(p) == Some("Running") && pod_ip(p).is_some()
    })
    .await;
    let after = Api::<Pod>::namespaced(node.client.clone(), "default")
        .get("kept")
        .await
        .expect("kept");
    assert_eq!(pod_ip(&after), pod_ip(&before));
    assert_eq!(record(&after), record(&before), "the same process");
    assert_ne!(pod_ip(&new), pod_ip(&before));
    assert!(NetworkNamespace::open_path(&netns).is_ok());
    assert_eq!(reservations(), 2, "no address was taken twice");
}

#[tokio::test]
async fn the_network_of_a_pod_deleted_while_the_agent_was_down_is_released_with_the_orphan() {
    let Some(()) = common::network_prerequisites() else {
        return;
    };
    let mut node = common::start_networked().await;
    // The node keeps one pod: with none at all it would take every pod's absence for a
    // lost store and stop no launcher.
    create(&node, sleeper(&node, "stays", &json!({}))).await;
    create(&node, sleeper(&node, "gone", &json!({}))).await;
    let pod = wait_for(&node, "gone", "running", |p| {
        phase(p) == Some("Running") && pod_ip(p).is_some()
    })
    .await;
    wait_for(&node, "stays", "running", |p| phase(p) == Some("Running")).await;
    let (netns, ip) = (netns_file(&node, &uid(&pod)), pod_ip(&pod).expect("ip"));
    assert!(netns.exists() && reservation(&node, ip).exists());
    // Removed from the API while no agent watches (as a force-deletion during a restart).
    node.stop_agent();
    let api = Api::<Pod>::namespaced(node.client.clone(), "default");
    api.delete("gone", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete");
    wait_gone(&node, "gone").await;
    node.restart_agent();
    // The orphan's container is stopped, then its network released and its directory
    // quarantined, the record of its network kept there. (The two steps follow each other
    // within one pass, so the test waits for both at once.)
    let quarantined = node
        .config
        .pods_dir()
        .join("quarantine")
        .join(uid(&pod))
        .join("network.json");
    testkit::wait_until_async(
        Duration::from_secs(90),
        "the orphan's network released and its directory quarantined",
        || async {
            (!netns.exists() && !reservation(&node, ip).exists() && quarantined.is_file())
                .then_some(())
        },
    )
    .await
    .expect("released and quarantined");
}
