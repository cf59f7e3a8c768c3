//! End-to-end: a VM's guest reached over the network the way KubeVirt users reach it — a
//! Service made by `virtctl expose` (requested with `curl` from inside another pod's network
//! namespace, as an in-cluster client), a `virtctl port-forward` tunnel through virt-api, `virtctl
//! ssh` and `scp` (the system's OpenSSH through that tunnel to the guest's Dropbear), another
//! VM on the same node by pod IP (each guest fetches the other's page), and a guest on the
//! passt binding, which holds its pod's address. Needs root and the CNI plugins (a pod network), the test
//! guest and QEMU; skips, saying why, without them.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use testkit::{DEADLINE, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

fn virtctl() -> PathBuf {
    Path::new(BIN).with_file_name("virtctl")
}

/// A server with the test guest imported, or `None` (with the reason printed) when the
/// guest or virtctl is missing.
fn start_server_with_guest() -> anyhow::Result<Option<ServerProcess>> {
    let Some(guest) = testkit::available(testkit::test_guest()) else {
        return Ok(None);
    };
    if testkit::available(testkit::virtctl_beside(Path::new(BIN))).is_none() {
        return Ok(None);
    }
    if Command::new("curl").arg("--version").output().is_err() {
        eprintln!("skipped: curl is not installed (apt-get install curl)");
        return Ok(None);
    }
    let mut server = ServerProcess::start(Path::new(BIN), "server", &[])?;
    server.import_test_guest(guest)?;
    Ok(Some(server))
}

/// A serving VM ([`testkit::serving_guest_vm`]) with a masquerade interface forwarding 8080
/// and 22, whose guest runs its SSH server (Dropbear) for `authorized_key`.
fn serving_vm(name: &str, authorized_key: &str) -> String {
    let key = format!(
        "echo '{}' > /root/.ssh/authorized_keys",
        authorized_key.trim()
    );
    testkit::serving_guest_vm_running(
        name,
        "masquerade: {}, ports: [{name: http, port: 8080}, {name: ssh, port: 22}, {name: echo, port: 5353, protocol: UDP}]",
        &["mkdir -p /root/.ssh", &key, "/sbin/sshd-start"],
        &[],
    )
}

/// A throwaway SSH key pair in `dir`: the private key's path and the public key.
fn ssh_key(dir: &Path) -> anyhow::Result<(PathBuf, String)> {
    let key = dir.join("id_ed25519");
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .output()?;
    anyhow::ensure!(out.status.success(), "ssh-keygen: {out:?}");
    let public = std::fs::read_to_string(key.with_extension("pub"))?;
    Ok((key, public))
}

/// `virtctl ssh` and `virtctl scp` with `key`: the system's ssh reaches the guest's SSH server
/// through the port-forward subresource, the remote command's exit status is virtctl's, and
/// a file goes to the guest and back unchanged.
fn ssh_and_scp_reach_the_guest(
    server: &ServerProcess,
    key: &Path,
    dir: &Path,
) -> anyhow::Result<()> {
    let virtctl = |args: &[&str]| {
        let mut command = Command::new(virtctl());
        command
            .args(["--kubeconfig"])
            .arg(server.kubeconfig())
            .args(args)
            .args(["-i"])
            .arg(key)
            .args([
                "-t",
                "-o StrictHostKeyChecking=no",
                "-t",
                "-o UserKnownHostsFile=/dev/null",
            ])
            .stdin(Stdio::null());
        command.output()
    };
    let out = wait_until(DEADLINE, "the guest's SSH server", || {
        let out = virtctl(&["ssh", "root@vm/web", "-c", "cat /www/index.html; uname -n"]).ok()?;
        out.status.success().then_some(out)
    })?;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello-from-web\ntestguest\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = virtctl(&["ssh", "root@vmi/web/default", "-c", "exit 3"])?;
    assert_eq!(out.status.code(), Some(3), "{out:?}");

    let sent = dir.join("sent.txt");
    std::fs::write(&sent, "through scp\n")?;
    let out = virtctl(&["scp", &sent.to_string_lossy(), "root@vm/web:/tmp/got.txt"])?;
    assert!(out.status.success(), "scp to the guest: {out:?}");
    let back = dir.join("back.txt");
    let out = virtctl(&["scp", "root@vm/web:/tmp/got.txt", &back.to_string_lossy()])?;
    assert!(out.status.success(), "scp from the guest: {out:?}");
    assert_eq!(std::fs::read_to_string(&back)?, "through scp\n");
    Ok(())
}

fn wait_phase(server: &ServerProcess, vmi: &str, phase: &str) -> anyhow::Result<()> {
    wait_until(DEADLINE, &format!("VMI {vmi} phase {phase}"), || {
        (server.get(&[&format!("vmi/{vmi}")], "{.status.phase}") == phase).then_some(())
    })
    .map_err(|e| anyhow::anyhow!("{e}\nserver log:\n{}", testkit::tail(&server.log(), 40)))
}

fn launcher_pod(server: &ServerProcess, vm: &str) -> String {
    server.get(
        &["pods", "-l", &format!("vm.kubevirt.io/name={vm}")],
        "{.items[0].metadata.name}",
    )
}

/// The launcher pod's IP, or `None` when the server has no pod network (the pod then has
/// the host's address).
fn pod_ip(server: &ServerProcess, vm: &str) -> Option<String> {
    let pod = launcher_pod(server, vm);
    let ip = server.get(&[&format!("pod/{pod}")], "{.status.podIP}");
    let host = server.get(&[&format!("pod/{pod}")], "{.status.hostIP}");
    (!ip.is_empty() && ip != host).then_some(ip)
}

/// One HTTP GET of `/` from this (host) process; the answer on success.
fn http_get(addr: &str) -> Option<String> {
    use std::io::{Read, Write};
    let addr: std::net::SocketAddr = addr.parse().ok()?;
    let mut stream =
        std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2)).ok()?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    stream.write_all(b"GET / HTTP/1.0\r\n\r\n").ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    Some(text)
}

/// An HTTP GET of `url` from inside the network namespace of `pod` (namespace `ns`), as a
/// client running in that pod makes it (`curl` under `nsenter`).
fn http_get_from_pod(server: &ServerProcess, ns: &str, pod: &str, url: &str) -> Option<String> {
    let uid = server.get(&["-n", ns, &format!("pod/{pod}")], "{.metadata.uid}");
    let netns = server.data_dir().join("node").join("netns").join(uid);
    let out = Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["curl", "-s", "-m", "3", url])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A process this test started, killed (by its pid) and reaped when dropped.
struct Started(Child);

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free loopback port (bound and released; the kernel does not hand it out again soon).
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The passt binding: the guest takes its pod's address from passt, its listed port answers
/// at the pod IP from the host and an unlisted one does not, and it reaches `web` at
/// `web_ip` (through passt, with the pod's address).
fn a_passt_guest_holds_the_pod_ip(server: &ServerProcess, web_ip: &str) -> anyhow::Result<()> {
    // At most two guests at once: the peer's is on its way out.
    wait_until(DEADLINE, "the peer's VMI to go", || {
        (!server.kubectl(&["get", "vmi", "peer"]).status.success()).then_some(())
    })?;
    server.apply(&testkit::serving_guest_vm(
        "pt",
        "passtBinding: {}, ports: [{name: http, port: 8080}]",
        &[],
    ))?;
    wait_phase(server, "pt", "Running")?;
    let ip = crate::pod_ip(server, "pt").ok_or_else(|| anyhow::anyhow!("pt's pod IP"))?;
    let addresses = wait_until(DEADLINE, "the passt guest's address", || {
        server
            .guest_run("pt", "ip -4 -o addr show dev eth0")
            .ok()
            .filter(|out| out.contains(&format!("inet {ip}/")))
    })?;
    assert!(addresses.contains("RUN-DONE rc=0"), "{addresses}");
    assert_eq!(
        server.get(&["vmi", "pt"], "{.status.interfaces[0].ipAddress}"),
        ip
    );
    wait_until(
        DEADLINE,
        "the passt guest's listed port from the host",
        || http_get(&format!("{ip}:8080")).filter(|t| t.contains("hello-from-pt")),
    )?;
    let second = server.guest_run("pt", "httpd -p 8081 -h /www && echo started")?;
    assert!(second.contains("started"), "{second}");
    assert_eq!(
        http_get(&format!("{ip}:8081")),
        None,
        "a port not listed is not forwarded"
    );
    let seen = wait_until(DEADLINE, "the passt guest to reach web", || {
        server
            .guest_run("pt", &format!("wget -q -O- http://{web_ip}:8080/"))
            .ok()
            .filter(|out| out.contains("hello-from-web"))
    })?;
    assert!(seen.contains("RUN-DONE rc=0"), "{seen}");
    server.ok(&["delete", "vm", "pt", "--wait=false"])?;
    Ok(())
}

/// A second VM on the node: each guest reaches the other's service at its pod IP (`web`'s is
/// `web_ip`).
fn peers_reach_each_other(server: &ServerProcess, web_ip: &str) -> anyhow::Result<()> {
    // The bridge binding: the guest holds the pod's address itself.
    server.apply(&testkit::serving_guest_vm("peer", "bridge: {}", &[]))?;
    wait_phase(server, "peer", "Running")?;
    let peer_ip =
        crate::pod_ip(server, "peer").ok_or_else(|| anyhow::anyhow!("the peer's pod IP"))?;
    assert_ne!(peer_ip, web_ip, "two pods, two addresses");
    let addresses = wait_until(DEADLINE, "the bridge-bound guest's address", || {
        server
            .guest_run("peer", "ip -4 -o addr show dev eth0")
            .ok()
            .filter(|out| out.contains(&format!("inet {peer_ip}/")))
    })?;
    assert!(addresses.contains("RUN-DONE rc=0"), "{addresses}");
    assert_eq!(
        server.get(&["vmi", "peer"], "{.status.interfaces[0].ipAddress}"),
        peer_ip
    );
    wait_until(DEADLINE, "the bridge-bound guest from the host", || {
        http_get(&format!("{peer_ip}:8080")).filter(|t| t.contains("hello-from-peer"))
    })
    .map_err(|e| {
        // What the host and the guest see of each other, for a failure that only shows up
        // under load.
        let host = Command::new("ip")
            .args(["neigh", "show", &peer_ip])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let route = Command::new("ip")
            .args(["route", "get", &peer_ip])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let guest = server
            .guest_run("peer", "ip -4 -o addr; ip route; ip neigh; netstat -ltn")
            .unwrap_or_default();
        anyhow::anyhow!("{e}\nhost neighbour: {host}host route: {route}guest:\n{guest}")
    })?;
    // (Debian's busybox wget crashes with `-T`.)
    for (from, to, answer) in [
        ("peer", web_ip, "hello-from-web"),
        ("web", peer_ip.as_str(), "hello-from-peer"),
    ] {
        let last = std::cell::RefCell::new(String::new());
        let seen = wait_until(DEADLINE, &format!("{from}'s guest to reach {to}"), || {
            let out = server.guest_run(from, &format!("wget -q -O- http://{to}:8080/"));
            let out = out.unwrap_or_else(|e| e.to_string());
            last.replace(out.clone());
            out.contains(answer).then_some(out)
        })
        .map_err(|e| {
            let seen = server
                .guest_run(from, "ip -4 -o addr; ip route; ip neigh")
                .unwrap_or_default();
            anyhow::anyhow!(
                "{e}; last answer: {}\n{from}'s network: {seen}",
                last.borrow()
            )
        })?;
        assert!(seen.contains("RUN-DONE rc=0"), "{seen}");
    }
    server.ok(&["delete", "vm", "peer", "--wait=false"])?;
    Ok(())
}

/// `virtctl port-forward vm/web PORT` running, and the first line it printed (which says
/// where it listens).
fn port_forward(server: &ServerProcess, port: &str) -> anyhow::Result<(Started, String)> {
    let mut forward = Started(
        Command::new(virtctl())
            .env("KUBECONFIG", server.kubeconfig())
            .args(["port-forward", "vm/web", port])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?,
    );
    let stderr = forward.0.stderr.take().expect("piped stderr");
    let mut first = String::new();
    BufReader::new(stderr).read_line(&mut first)?;
    Ok((forward, first))
}

/// `virtctl port-forward`: a local port tunnelled through virt-api to the guest's 8080 of `web`.
fn port_forward_reaches_the_guest(server: &ServerProcess) -> anyhow::Result<()> {
    // virtctl port-forward: a local port tunnelled through virt-api to the guest's 8080.
    let local = free_port()?;
    let (forward, first) = port_forward(server, &format!("{local}:8080"))?;
    assert!(
        first.contains(&format!("127.0.0.1:{local}")) && first.contains("8080"),
        "virtctl port-forward: {first}"
    );
    let answer = wait_until(DEADLINE, "the guest through port-forward", || {
        http_get(&format!("127.0.0.1:{local}")).filter(|t| t.contains("hello-from-web"))
    })?;
    assert!(answer.starts_with("HTTP/1."), "{answer}");
    // A second connection through the same forward opens its own tunnel.
    let again = http_get(&format!("127.0.0.1:{local}")).unwrap_or_default();
    assert!(again.contains("hello-from-web"), "{again}");
    // A port the guest does not serve: the tunnel is refused, the local connection closes.
    let out = Command::new(virtctl())
        .env("KUBECONFIG", server.kubeconfig())
        .args(["port-forward", "--stdio=true", "vmi/web", "1"])
        .stdin(Stdio::null())
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("dialing VM"),
        "port-forward to a closed port: {err}"
    );
    drop(forward);
    udp_port_forward_reaches_the_guest(server)?;
    tunnel_metrics_follow_an_open_tunnel(server)
}

/// `virtctl port-forward vm/web udp/LOCAL:5353`: a datagram from the host reaches the guest's
/// UDP listener (OpenBSD netcat) and its answer comes back to the sender.
fn udp_port_forward_reaches_the_guest(server: &ServerProcess) -> anyhow::Result<()> {
    let listening = server.guest_run(
        "web",
        "(echo pong-udp; sleep 120) | nc.openbsd -u -l -p 5353 > /tmp/udp.txt 2>&1 & echo listening",
    )?;
    assert!(listening.contains("listening"), "{listening}");
    let local = free_port()?;
    let (forward, first) = port_forward(server, &format!("udp/{local}:5353"))?;
    assert!(
        first.contains(&format!("forwarding udp 127.0.0.1:{local} to 5353")),
        "virtctl port-forward: {first}"
    );
    let socket = std::net::UdpSocket::bind("127.0.0.1:0")?;
    socket.set_read_timeout(Some(std::time::Duration::from_secs(2)))?;
    let answer = wait_until(DEADLINE, "the guest's UDP answer", || {
        socket.send_to(b"ping-udp\n", ("127.0.0.1", local)).ok()?;
        let mut buf = [0u8; 64];
        let (n, _) = socket.recv_from(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    })?;
    assert_eq!(answer, "pong-udp\n");
    let seen = server.guest_run("web", "cat /tmp/udp.txt")?;
    assert!(seen.contains("ping-udp"), "{seen}");
    drop(forward);
    Ok(())
}

/// The sum over both virt-api replicas of the samples of `family` for the VMI `web`.
fn virt_api_gauge(server: &ServerProcess, family: &str) -> anyhow::Result<Option<f64>> {
    let samples = server.metric_samples("virt-api", "virt-api.kubevirt.svc", family)?;
    let values: Vec<f64> = samples
        .iter()
        .filter(|l| l.contains(r#"namespace="default",vmi="web"}"#))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    Ok((!values.is_empty()).then(|| values.iter().sum()))
}

/// virt-api's `/metrics`: a `--stdio` port-forward counts as one active tunnel while it is
/// open, and its close stamps the VMI's last API connection.
fn tunnel_metrics_follow_an_open_tunnel(server: &ServerProcess) -> anyhow::Result<()> {
    let ready = server.metric_samples(
        "virt-api",
        "virt-api.kubevirt.svc",
        "kubevirt_virt_api_ready_status",
    )?;
    assert_eq!(
        ready, ["kubevirt_virt_api_ready_status 1"; 2],
        "both replicas ready"
    );
    let tunnel = Started(
        Command::new(virtctl())
            .env("KUBECONFIG", server.kubeconfig())
            .args(["port-forward", "--stdio=true", "vmi/web", "8080"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    wait_until(DEADLINE, "virt-api to count the open tunnel", || {
        let open = virt_api_gauge(server, "kubevirt_portforward_active_tunnels").ok()??;
        (open == 1.0).then_some(())
    })?;
    drop(tunnel);
    wait_until(DEADLINE, "the closed tunnel to stamp the VMI", || {
        let open = virt_api_gauge(server, "kubevirt_portforward_active_tunnels").ok()??;
        let stamp =
            virt_api_gauge(server, "kubevirt_vmi_last_api_connection_timestamp_seconds").ok()??;
        (open == 0.0 && stamp > 0.0).then_some(())
    })?;
    Ok(())
}

#[test]
fn a_vm_exposed_by_virtctl_answers_on_its_cluster_ip_and_through_port_forward() -> anyhow::Result<()>
{
    let Some(server) = start_server_with_guest()? else {
        return Ok(());
    };
    if testkit::available(testkit::command("ssh", "openssh-client")).is_none() {
        return Ok(());
    }
    let keys = tempfile::tempdir()?;
    let (key, public) = ssh_key(keys.path())?;
    server.apply(&serving_vm("web", &public))?;
    wait_phase(&server, "web", "Running")?;
    let Some(pod_ip) = pod_ip(&server, "web") else {
        eprintln!("skipped: the server has no pod network (needs root and the CNI plugins)");
        return Ok(());
    };
    wait_until(
        DEADLINE,
        "the guest's HTTP server through the pod IP",
        || http_get(&format!("{pod_ip}:8080")).filter(|t| t.contains("hello-from-web")),
    )
    .map_err(|e| anyhow::anyhow!("{e}\nserver log:\n{}", testkit::tail(&server.log(), 40)))?;

    // virtctl expose: upstream's Service, selecting the launcher pod by its VMI id.
    let out = Command::new(virtctl())
        .env("KUBECONFIG", server.kubeconfig())
        .args(["expose", "vm", "web", "--port", "8080", "--name", "web"])
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("Service web successfully created for vm web"),
        "virtctl expose: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        server.get(&["svc/web"], "{.spec.selector.vmi\\.kubevirt\\.io/id}"),
        "web"
    );
    assert_eq!(
        server.get(&["svc/web"], "{.metadata.ownerReferences[0].kind}"),
        "VirtualMachine"
    );
    let cluster_ip = server.get(&["svc/web"], "{.spec.clusterIP}");
    let slice = |server: &ServerProcess| {
        server.get(
            &["endpointslices", "-l", "kubernetes.io/service-name=web"],
            "{.items[*].endpoints[*].addresses[0]}",
        )
    };
    wait_until(DEADLINE, "the Service's endpoint", || {
        (slice(&server) == pod_ip).then_some(())
    })?;
    // An in-cluster client (here: inside virt-api's pod) reaches the guest at the cluster IP.
    let api_pod = server.get(
        &["-n", "kubevirt", "pods", "-l", "kubevirt.io=virt-api"],
        "{.items[0].metadata.name}",
    );
    let started = std::time::Instant::now();
    let body = wait_until(DEADLINE, "the guest through the cluster IP", || {
        http_get_from_pod(
            &server,
            "kubevirt",
            &api_pod,
            &format!("http://{cluster_ip}:8080/"),
        )
        .filter(|t| t.contains("hello-from-web"))
    })?;
    eprintln!(
        "expose: {cluster_ip}:8080 answered after {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(body.trim(), "hello-from-web");

    port_forward_reaches_the_guest(&server)?;
    peers_reach_each_other(&server, &pod_ip)?;
    a_passt_guest_holds_the_pod_ip(&server, &pod_ip)?;
    ssh_and_scp_reach_the_guest(&server, &key, keys.path())?;

    // Deleting the VM removes the endpoints (and the Service it owns).
    server.ok(&["delete", "vm", "web", "--wait=false"])?;
    wait_until(DEADLINE, "the endpoints to go", || {
        slice(&server).is_empty().then_some(())
    })?;
    Ok(())
}
