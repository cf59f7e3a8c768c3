//! kubelet's prober against a real API server: readiness follows probes of servers the
//! containers run, and a failing liveness probe restarts its container.

mod common;

use common::{NODE, TOOLS, create, start, wait_for};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use serde_json::json;

fn container<'a>(pod: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == name)
}

fn running(pod: &Pod, name: &str) -> bool {
    container(pod, name)
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.running.is_some())
}

fn ready(pod: &Pod, name: &str) -> bool {
    container(pod, name).is_some_and(|c| c.ready)
}

fn condition(pod: &Pod, type_: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

/// A port nothing listens on (bound once, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

#[tokio::test]
async fn readiness_follows_an_http_probe_of_the_containers_server_and_a_closed_port_stays_unready()
{
    if test_prerequisites::available(test_prerequisites::command("busybox", "busybox")).is_none() {
        return;
    }
    let node = start().await;
    let site = tempfile::tempdir().expect("site");
    std::fs::write(site.path().join("index.html"), "ok").expect("index");
    let (web_port, closed_port) = (free_port(), free_port());
    // The server starts only once the test says so: until then the probe finds nothing.
    let serve = "while [ ! -e \"$0/go\" ]; do sleep 0.1; done; exec busybox httpd -f -p \"127.0.0.1:$1\" -h \"$0\"";
    create(
        &node,
        json!({"metadata": {"name": "probed"}, "spec": {"nodeName": NODE,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "web", "image": TOOLS, "command": ["sh", "-c", serve, site.path(), web_port.to_string()],
                 "ports": [{"name": "http", "containerPort": web_port}],
                 "readinessProbe": {"httpGet": {"path": "/index.html", "port": "http"}, "periodSeconds": 1}},
                {"name": "closed", "image": TOOLS, "command": ["sh", "-c", "exec sleep 600"],
                 "readinessProbe": {"tcpSocket": {"port": closed_port}, "periodSeconds": 1}}]}}),
    )
    .await;
    let up = wait_for(&node, "probed", "both containers running", |p| {
        running(p, "web") && running(p, "closed")
    })
    .await;
    assert!(!ready(&up, "web"), "no server answers yet");
    assert!(!ready(&up, "closed"));
    assert_eq!(condition(&up, "Ready").as_deref(), Some("False"));
    std::fs::write(site.path().join("go"), "").expect("go");
    let served = wait_for(&node, "probed", "web ready", |p| ready(p, "web")).await;
    assert!(
        !ready(&served, "closed"),
        "a tcpSocket probe on a closed port keeps its container unready"
    );
    assert_eq!(condition(&served, "Ready").as_deref(), Some("False"));
    assert_eq!(
        condition(&served, "ContainersReady").as_deref(),
        Some("False")
    );
    let started = container(&served, "web").and_then(|c| c.started);
    assert_eq!(started, Some(true));
}

#[tokio::test]
async fn a_failing_liveness_probe_restarts_its_container() {
    let node = start().await;
    let closed_port = free_port();
    create(
        &node,
        json!({"metadata": {"name": "dead"}, "spec": {"nodeName": NODE,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": TOOLS, "command": ["sh", "-c", "exec sleep 600"],
                "livenessProbe": {"tcpSocket": {"port": closed_port}, "periodSeconds": 1,
                                  "failureThreshold": 1}}]}}),
    )
    .await;
    // The restart count only moves when the container is started again by the runner.
    let restarted = wait_for(&node, "dead", "a restart", |p| {
        container(p, "c").is_some_and(|c| c.restart_count >= 1)
    })
    .await;
    assert!(container(&restarted, "c").is_some_and(|c| c.restart_count >= 1));
}
