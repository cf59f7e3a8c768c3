//! The real CNI plugins on a bridge of the test's own: two pods get distinct addresses, reach
//! each other and are reached from the host, hostPorts work, and DEL leaves nothing behind.

mod common;

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::Path;
use std::process::Command;

use common::{Fixture, fetch, ip, ip_in, serve_in};
use pod_network::{CniError, CniNetwork, NetworkNamespace, PortMapping};

#[test]
fn two_pods_get_distinct_addresses_reach_each_other_and_leave_nothing_after_del() {
    let Some(()) = common::prerequisites() else {
        return;
    };
    pod_network::enable_ip_forwarding().expect("ip_forward");
    let fixture = Fixture::new('a', 24);
    let mut ns_a = fixture.netns("pod-a");
    let mut ns_b = fixture.netns("pod-b");
    let id_a = format!("{}-pod-a", common::unique('a'));
    let id_b = format!("{}-pod-b", common::unique('a'));
    let mut pod_a = fixture.add(&id_a, &ns_a, &[]);
    let mut pod_b = fixture.add(&id_b, &ns_b, &[]);

    let (ip_a, ip_b) = (pod_a.ipv4(), pod_b.ipv4());
    assert!(fixture.net.subnet.contains(ip_a), "{ip_a}");
    assert!(fixture.net.subnet.contains(ip_b), "{ip_b}");
    assert_ne!(ip_a, ip_b);
    assert_eq!(
        pod_a.addresses.ipv4.unwrap().gateway,
        Some(IpAddr::V4(fixture.net.gateway))
    );
    let mut reserved = fixture.reservations();
    reserved.sort();
    let mut expected = vec![ip_a, ip_b];
    expected.sort();
    assert_eq!(reserved, expected);

    // A child process joined through pre_exec sees the pod's interface and address.
    let addr_a = ip_in(ns_a.ns(), &["-o", "-4", "addr", "show", "dev", "eth0"]);
    assert!(addr_a.contains(&format!("{ip_a}/24")), "{addr_a}");

    // The host and pod B reach a server in pod A at its address.
    let port = serve_in(ns_a.ns(), 0, 2, "hello from a").port();
    let server = SocketAddr::new(ip_a, port);
    assert_eq!(fetch(server).expect("host to pod"), "hello from a");
    let from_b = ns_b.ns().run_in(|| fetch(server)).expect("enter pod b");
    assert_eq!(from_b.expect("pod to pod"), "hello from a");

    let veths: Vec<String> = [pod_a.host_veths(), pod_b.host_veths()].concat();
    assert_eq!(veths.len(), 2, "{veths:?}");
    for veth in &veths {
        assert!(Path::new("/sys/class/net").join(veth).exists(), "{veth}");
    }
    pod_a.del();
    pod_b.del();
    for veth in &veths {
        assert!(!Path::new("/sys/class/net").join(veth).exists(), "{veth}");
    }
    assert_eq!(fixture.reservations(), Vec::<IpAddr>::new());
    let links = ip_in(ns_a.ns(), &["-o", "link", "show"]);
    assert!(!links.contains("eth0"), "{links}");
    let nat = iptables_nat();
    assert!(!nat.contains(&id_a) && !nat.contains(&id_b), "{nat}");

    let (path_a, path_b) = (ns_a.path().to_path_buf(), ns_b.path().to_path_buf());
    ns_a.delete();
    ns_b.delete();
    assert!(!path_a.exists() && !path_b.exists());
}

#[test]
fn check_passes_and_deleting_twice_or_after_the_namespace_is_gone_is_not_an_error() {
    let Some(()) = common::prerequisites() else {
        return;
    };
    let fixture = Fixture::new('b', 24);
    let mut ns = fixture.netns("pod");
    let id = format!("{}-pod", common::unique('b'));
    let pod = fixture.add(&id, &ns, &[]);
    fixture
        .net
        .check(&id, ns.path(), "eth0", &[])
        .expect("CNI CHECK");
    let path = ns.path().to_path_buf();
    drop(pod); // DEL
    fixture
        .net
        .del(&id, &path, "eth0", &[])
        .expect("second DEL");
    ns.delete();
    // As after a reboot: no namespace, no cached result.
    fixture
        .net
        .del(&id, &path, "eth0", &[])
        .expect("DEL without namespace");
    // As after a node agent killed between creating the mount point and mounting on it.
    std::fs::write(&path, b"").expect("bare mount point");
    fixture
        .net
        .del(&id, &path, "eth0", &[])
        .expect("DEL with a bare mount point");
    pod_network::delete_path(&path).expect("second namespace delete");
    assert!(matches!(
        fixture.net.check(&id, &path, "eth0", &[]),
        Err(CniError::NoCachedResult { .. })
    ));
    assert_eq!(fixture.reservations(), Vec::<IpAddr>::new());
}

#[test]
fn a_host_port_reaches_the_pod() {
    let Some(()) = common::prerequisites() else {
        return;
    };
    pod_network::enable_ip_forwarding().expect("ip_forward");
    let fixture = Fixture::new('c', 24);
    let ns = fixture.netns("pod");
    let host_port = free_port();
    let ports = [PortMapping::tcp(host_port, 8080)];
    let id = format!("{}-pod", common::unique('c'));
    let pod = fixture.add(&id, &ns, &ports);
    serve_in(ns.ns(), 8080, 1, "hello through the host port");
    // The bridge's address is one of the host's own, which portmap's OUTPUT rule matches.
    let through_host = SocketAddr::new(IpAddr::V4(fixture.net.gateway), host_port);
    assert_eq!(
        fetch(through_host).expect("host port"),
        "hello through the host port"
    );
    drop(pod);
    let nat = iptables_nat();
    assert!(!nat.contains(&id), "portmap rules left after DEL: {nat}");
}

#[test]
fn an_exhausted_range_is_a_typed_plugin_error_and_leaves_nothing() {
    let Some(()) = common::prerequisites() else {
        return;
    };
    // A /30 has one address besides the gateway.
    let fixture = Fixture::new('d', 30);
    let ns_a = fixture.netns("pod-a");
    let ns_b = fixture.netns("pod-b");
    let _pod_a = fixture.add(&format!("{}-a", common::unique('d')), &ns_a, &[]);
    let before = ip(&["-o", "link", "show", "master", &fixture.net.bridge]);
    let error = fixture
        .net
        .add(
            &format!("{}-b", common::unique('d')),
            ns_b.path(),
            "eth0",
            &[],
        )
        .expect_err("no address left");
    assert!(
        matches!(&error, CniError::Plugin { plugin, msg, .. }
            if plugin == "bridge" && msg.contains("no IP addresses available")),
        "{error:?}"
    );
    let after = ip(&["-o", "link", "show", "master", &fixture.net.bridge]);
    assert_eq!(before.lines().count(), after.lines().count(), "{after}");
    assert_eq!(fixture.reservations().len(), 1);
}

#[test]
fn a_plugin_that_reports_an_error_yields_its_code_and_message() {
    // A stand-in plugin: needs neither root nor the real plugins.
    let dir = tempfile::tempdir().expect("temp dir");
    let plugin = dir.path().join("bridge");
    std::fs::write(
        &plugin,
        "#!/bin/sh\ncat >/dev/null\necho '{\"cniVersion\":\"1.0.0\",\"code\":7,\"msg\":\"invalid config\",\"details\":\"no bridge\"}'\nexit 1\n",
    )
    .expect("write plugin");
    let chmod = Command::new("chmod").arg("+x").arg(&plugin).status();
    assert!(chmod.expect("chmod").success());
    let mut net = CniNetwork::new("fake", "fake0", "10.244.99.0/24".parse().unwrap());
    net.plugin_dir = dir.path().to_path_buf();
    net.result_cache_dir = dir.path().join("results");
    net.port_map = false;
    let error = net
        .add("c1", Path::new("/nonexistent"), "eth0", &[])
        .expect_err("the plugin fails");
    assert!(
        matches!(&error, CniError::Plugin { plugin, code: 7, msg, details }
            if plugin == "bridge" && msg == "invalid config" && details == "no bridge"),
        "{error:?}"
    );
}

#[test]
fn a_namespace_under_the_default_directory_has_lo_up_and_can_be_reopened() {
    let Some(()) = common::prerequisites() else {
        return;
    };
    let name = common::unique('e');
    let ns = common::NetnsGuard(Some(NetworkNamespace::create(&name).expect("create")));
    assert_eq!(
        ns.path(),
        Path::new(pod_network::DEFAULT_RUN_DIR).join(&name)
    );
    assert!(matches!(
        NetworkNamespace::create(&name),
        Err(pod_network::NetnsError::AlreadyExists { .. })
    ));
    let reopened = NetworkNamespace::open(&name).expect("reopen");
    assert_eq!(&reopened, ns.ns());
    assert_eq!(reopened.name(), name);
    // lo is up: a server on 127.0.0.1 inside answers.
    let port = reopened
        .run_in(|| TcpListener::bind("127.0.0.1:0"))
        .expect("enter")
        .expect("bind lo");
    let addr = port.local_addr().expect("addr");
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = port.accept() {
            let _ = std::io::Write::write_all(&mut s, b"lo");
        }
    });
    assert_eq!(
        reopened.run_in(|| fetch(addr)).expect("enter").expect("lo"),
        "lo"
    );
    let path = reopened.path().to_path_buf();
    drop(ns);
    assert!(!path.exists());
    assert!(NetworkNamespace::open(&name).is_err());
}

fn iptables_nat() -> String {
    let out = Command::new("iptables")
        .args(["-t", "nat", "-S"])
        .output()
        .expect("iptables");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A TCP port nothing on the host listens on now.
fn free_port() -> u16 {
    TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

#[test]
fn a_bridge_is_deleted_with_its_veths_detached_and_deleting_again_or_a_non_bridge_is_safe() {
    let Some(()) = common::prerequisites() else {
        return;
    };
    let fixture = Fixture::new('f', 24);
    let ns = fixture.netns("pod");
    let mut pod = fixture.add(&format!("{}-pod", common::unique('f')), &ns, &[]);
    let bridge = fixture.net.bridge.clone();
    let sysfs = Path::new("/sys/class/net").join(&bridge);
    assert!(sysfs.join("bridge").is_dir(), "ADD made the bridge");
    assert!(pod_network::delete_bridge(&bridge).expect("delete bridge"));
    assert!(!sysfs.exists());
    for veth in pod.host_veths() {
        let master = Path::new("/sys/class/net").join(&veth).join("master");
        assert!(!master.exists(), "{veth} is still attached");
    }
    assert!(!pod_network::delete_bridge(&bridge).expect("delete again"));
    // The pod is still detached cleanly, and ADD makes the bridge anew.
    pod.del();
    let again = fixture.add(&format!("{}-again", common::unique('f')), &ns, &[]);
    assert!(sysfs.join("bridge").is_dir());
    drop(again);
    assert!(matches!(
        pod_network::delete_bridge("lo"),
        Err(pod_network::HostError::NotABridge { .. })
    ));
    assert!(
        ip(&["-o", "link", "show", "lo"]).contains("UP"),
        "lo was left up"
    );
}
