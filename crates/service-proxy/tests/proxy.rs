//! The service proxy against a real API server, real nftables and a network namespace the
//! test creates: a pod-like namespace behind a bridge reaches a Service's endpoint through
//! its cluster IP, and the API server through the `kubernetes` Service (with `kubectl`, so
//! the serving certificate is checked for that address too).

use std::io::Write;
use std::net::TcpListener;
use std::process::{Command, Output};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, PostParams};
use kubevirt_service_proxy::{ProxyConfig, run};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn prerequisites() -> Option<()> {
    test_prerequisites::available((|| {
        if !nix::unistd::geteuid().is_root() {
            return Err("the service proxy needs root (nftables, namespaces)".to_owned());
        }
        test_prerequisites::command("nft", "nftables")?;
        test_prerequisites::command("ip", "iproute2")?;
        test_prerequisites::command("kubectl", "kubernetes-client")?;
        Ok(())
    })())
}

fn sh(args: &[&str]) -> Output {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("running a command")
}

fn must(args: &[&str]) {
    let out = sh(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A bridge with an address and a namespace plugged into it; removed on drop.
struct PodLikeNetwork {
    bridge: String,
    netns: String,
    table: String,
}

impl PodLikeNetwork {
    fn new() -> Self {
        let id = std::process::id();
        let third = id % 250;
        let net = PodLikeNetwork {
            bridge: format!("kvsp{id}b"),
            netns: format!("kvsp{id}"),
            table: format!("kvsp-test-{id}"),
        };
        let (gw, pod) = (
            format!("10.250.{third}.1/24"),
            format!("10.250.{third}.2/24"),
        );
        let (host_end, pod_end) = (format!("kvsp{id}h"), format!("kvsp{id}c"));
        must(&["ip", "netns", "add", &net.netns]);
        must(&["ip", "link", "add", &net.bridge, "type", "bridge"]);
        must(&["ip", "addr", "add", &gw, "dev", &net.bridge]);
        must(&["ip", "link", "set", &net.bridge, "up"]);
        must(&[
            "ip", "link", "add", &host_end, "type", "veth", "peer", "name", &pod_end,
        ]);
        must(&["ip", "link", "set", &host_end, "master", &net.bridge, "up"]);
        must(&["ip", "link", "set", &pod_end, "netns", &net.netns]);
        let n = net.netns.as_str();
        must(&["ip", "-n", n, "addr", "add", &pod, "dev", &pod_end]);
        must(&["ip", "-n", n, "link", "set", &pod_end, "up"]);
        must(&["ip", "-n", n, "link", "set", "lo", "up"]);
        let via = format!("10.250.{third}.1");
        must(&["ip", "-n", n, "route", "add", "default", "via", &via]);
        net
    }

    /// Runs `script` with bash inside the namespace.
    fn run(&self, script: &str) -> Output {
        sh(&[
            "ip",
            "netns",
            "exec",
            &self.netns,
            "timeout",
            "5",
            "bash",
            "-c",
            script,
        ])
    }

    fn table(&self) -> Option<String> {
        let out = sh(&["nft", "list", "table", "ip", &self.table]);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for PodLikeNetwork {
    fn drop(&mut self) {
        let _ = sh(&["ip", "netns", "del", &self.netns]);
        let _ = sh(&["ip", "link", "del", &self.bridge]);
        let _ = sh(&["nft", "delete", "table", "ip", &self.table]);
    }
}

/// Service `default/web` (port 8080 `http`) with one EndpointSlice naming
/// `127.0.0.1:endpoint_port`; returns its cluster IP.
async fn create_web_service(client: &kube::Client, endpoint_port: u16) -> String {
    let services = Api::<Service>::namespaced(client.clone(), "default");
    let web: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"ports": [{"name": "http", "port": 8080}]},
    }))
    .expect("service");
    let web = services
        .create(&PostParams::default(), &web)
        .await
        .expect("creating the Service");
    let web_ip = web.spec.and_then(|s| s.cluster_ip).expect("a cluster IP");
    assert!(
        web_ip.starts_with("10.") && web_ip != "10.96.0.1",
        "{web_ip}"
    );
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
        "ports": [{"name": "http", "port": endpoint_port, "protocol": "TCP"}],
    }))
    .expect("slice");
    Api::<EndpointSlice>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &slice)
        .await
        .expect("creating the EndpointSlice");
    web_ip
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_reaches_services_and_the_api_server_through_cluster_ips() {
    let Some(()) = prerequisites() else { return };
    let cluster = testkit::InProcessCluster::start_without_crds()
        .await
        .expect("API server");
    let client = cluster.client.clone();
    let api_port = cluster.server().expect("server").addr.port();

    // The API server publishes itself as Service default/kubernetes.
    let kubernetes = Api::<Service>::namespaced(client.clone(), "default")
        .get("kubernetes")
        .await
        .expect("the kubernetes Service");
    let spec = kubernetes.spec.expect("spec");
    assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.1"));
    let slice = Api::<EndpointSlice>::namespaced(client.clone(), "default")
        .get("kubernetes")
        .await
        .expect("the kubernetes EndpointSlice");
    assert_eq!(slice.endpoints[0].addresses, vec!["127.0.0.1".to_owned()]);
    assert_eq!(
        slice.ports.as_ref().and_then(|p| p[0].port),
        Some(i32::from(api_port))
    );

    // An endpoint on the host's loopback answering "hello".
    let listener = TcpListener::bind("127.0.0.1:0").expect("listener");
    let endpoint_port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let _ = conn.write_all(b"hello\n");
        }
    });
    let services = Api::<Service>::namespaced(client.clone(), "default");
    let web_ip = create_web_service(&client, endpoint_port).await;

    let net = PodLikeNetwork::new();
    let cancel = CancellationToken::new();
    let proxy = tokio::spawn(run(
        client.clone(),
        ProxyConfig {
            table: net.table.clone(),
            interfaces: vec![net.bridge.clone()],
        },
        cancel.clone(),
    ));

    let read_web = format!("exec 3<>/dev/tcp/{web_ip}/8080 && head -c 5 <&3");
    let hello =
        testkit::wait_until_async(testkit::DEADLINE, "the Service to answer", || {
            let out = net.run(&read_web);
            async move {
                (out.status.success()).then(|| String::from_utf8_lossy(&out.stdout).into_owned())
            }
        })
        .await
        .expect("reaching the Service");
    assert_eq!(hello, "hello");

    // kubectl from the namespace, at the kubernetes Service's address: TLS verifies too.
    let kubeconfig = cluster.server().expect("server").kubeconfig.clone();
    let kubectl = format!(
        "kubectl --kubeconfig {} --server https://10.96.0.1:443 get namespace default -o name",
        kubeconfig.display()
    );
    let out = net.run(&kubectl);
    assert!(
        out.status.success(),
        "kubectl through the kubernetes Service: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "namespace/default"
    );

    // A deleted Service's rule goes.
    services
        .delete("web", &DeleteParams::default())
        .await
        .expect("deleting the Service");
    testkit::wait_until(testkit::DEADLINE, "the Service's rule to go", || {
        net.table().filter(|t| !t.contains(&web_ip))
    })
    .expect("rule removed");

    cancel.cancel();
    proxy.await.expect("proxy task");
    assert!(
        net.table().is_none(),
        "the table is removed when the proxy stops"
    );
}
