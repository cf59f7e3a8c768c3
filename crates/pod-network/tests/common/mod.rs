//! Fixtures of the pod-network tests: each test gets its own bridge, pod CIDR, IPAM and cache
//! directories and namespace names, and guards that remove them even when an assertion fails.
#![allow(dead_code)] // not every test file uses every helper

use std::cell::Cell;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use pod_network::{CniNetwork, NetworkNamespace, PodAddresses, PortMapping, join_in_child};
use tempfile::TempDir;

/// The host has what these tests need: root, `ip`, `iptables` and the CNI plugins. Skips (or
/// fails with `KUBEVIRT_RS_REQUIRE_PREREQUISITES`) otherwise.
pub fn prerequisites() -> Option<()> {
    test_prerequisites::available(check_prerequisites())
}

fn check_prerequisites() -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("pod networking needs root (network namespaces, bridges, iptables)".into());
    }
    test_prerequisites::command("ip", "iproute2")?;
    test_prerequisites::command("iptables", "iptables")?;
    for plugin in ["bridge", "host-local", "portmap"] {
        let path = Path::new(pod_network::DEFAULT_PLUGIN_DIR).join(plugin);
        if !path.is_file() {
            return Err(format!(
                "the CNI plugin {} is not installed (apt-get install containernetworking-plugins)",
                path.display()
            ));
        }
    }
    Ok(())
}

/// A name unique to this test process and `tag`, at most 15 bytes (an interface name).
pub fn unique(tag: char) -> String {
    format!("kvrs-t{}{tag}", std::process::id())
}

/// One test's pod network. Dropping it deletes the bridge (the `bridge` plugin never does).
pub struct Fixture {
    pub net: CniNetwork,
    pub dir: TempDir,
    /// Held until the bridge has its address, so concurrent tests pick distinct CIDRs.
    subnet_lock: Cell<Option<File>>,
    _bridge: BridgeGuard,
}

impl Fixture {
    /// A network named and bridged `unique(tag)` on a 10.244.x.0/`prefix_len` no other
    /// interface of the host uses.
    pub fn new(tag: char, prefix_len: u8) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(std::env::temp_dir().join("kubevirt-rs-pod-network-subnets.lock"))
            .expect("subnet lock file");
        lock.lock().expect("subnet lock");
        let subnet = free_subnet(prefix_len);
        let name = unique(tag);
        let mut net = CniNetwork::new(&name, &name, subnet.parse().expect("cidr"));
        net.ipam_data_dir = dir.path().join("ipam");
        net.result_cache_dir = dir.path().join("results");
        Self {
            net,
            dir,
            subnet_lock: Cell::new(Some(lock)),
            _bridge: BridgeGuard(name),
        }
    }

    /// Where this test keeps its namespaces.
    pub fn netns_dir(&self) -> PathBuf {
        self.dir.path().join("netns")
    }

    /// A new namespace `<name>` in [`Self::netns_dir`], deleted on drop.
    pub fn netns(&self, name: &str) -> NetnsGuard {
        NetnsGuard(Some(
            NetworkNamespace::create_in(&self.netns_dir(), name).expect("create netns"),
        ))
    }

    /// ADD for `netns` as container `id` on eth0; DEL on drop unless [`Pod::del`] ran.
    pub fn add<'a>(&'a self, id: &str, netns: &NetnsGuard, ports: &[PortMapping]) -> Pod<'a> {
        let addresses = self
            .net
            .add(id, netns.path(), "eth0", ports)
            .expect("CNI ADD");
        // The bridge now has its address: others see the CIDR as taken.
        self.subnet_lock.take();
        Pod {
            net: &self.net,
            id: id.to_owned(),
            netns: netns.path().to_path_buf(),
            ports: ports.to_vec(),
            addresses,
            deleted: false,
        }
    }

    /// The IPs `host-local` has reserved (its files named after addresses).
    pub fn reservations(&self) -> Vec<IpAddr> {
        let dir = self.net.ipam_data_dir.join(&self.net.name);
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect()
    }
}

/// Picks x in 100..=250 with no host address or route in 10.244.x.0/24.
fn free_subnet(prefix_len: u8) -> String {
    let taken = ip(&["-o", "-4", "addr", "show"]) + &ip(&["-4", "route", "show", "table", "all"]);
    let start = std::process::id() % 151;
    (0..151)
        .map(|i| 100 + (start + i) % 151)
        .find(|x| !taken.contains(&format!("10.244.{x}.")))
        .map(|x| format!("10.244.{x}.0/{prefix_len}"))
        .expect("a free 10.244.x.0/24 for the test")
}

/// `ip ARGS`' stdout.
pub fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("run ip");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ip ARGS`' stdout, run inside `netns` through `join_in_child`.
pub fn ip_in(netns: &NetworkNamespace, args: &[&str]) -> String {
    let mut command = Command::new("ip");
    command.args(args);
    join_in_child(&mut command, netns.enter_fd().expect("netns fd"));
    let out = command.output().expect("run ip in the pod");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub struct BridgeGuard(String);

impl Drop for BridgeGuard {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "delete", "dev", &self.0])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// A namespace deleted on drop.
pub struct NetnsGuard(pub Option<NetworkNamespace>);

impl NetnsGuard {
    pub fn ns(&self) -> &NetworkNamespace {
        self.0.as_ref().expect("namespace not deleted yet")
    }

    pub fn path(&self) -> &Path {
        self.ns().path()
    }

    /// Deletes it now.
    pub fn delete(&mut self) {
        if let Some(ns) = self.0.take() {
            ns.delete().expect("delete netns");
        }
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if let Some(ns) = self.0.take() {
            let _ = ns.delete();
        }
    }
}

/// A pod attached to the network; DEL on drop unless deleted.
pub struct Pod<'a> {
    pub net: &'a CniNetwork,
    pub id: String,
    pub netns: PathBuf,
    pub ports: Vec<PortMapping>,
    pub addresses: PodAddresses,
    deleted: bool,
}

impl Pod<'_> {
    pub fn ipv4(&self) -> IpAddr {
        self.addresses.ipv4.expect("an IPv4 address").address
    }

    /// The host-side interfaces of the result (veth end; the bridge is left out).
    pub fn host_veths(&self) -> Vec<String> {
        self.addresses
            .interfaces
            .iter()
            .filter(|i| i.sandbox.as_deref().unwrap_or_default().is_empty())
            .filter(|i| i.name != self.net.bridge)
            .map(|i| i.name.clone())
            .collect()
    }

    pub fn del(&mut self) {
        self.net
            .del(&self.id, &self.netns, "eth0", &self.ports)
            .expect("CNI DEL");
        self.deleted = true;
    }
}

impl Drop for Pod<'_> {
    fn drop(&mut self) {
        if !self.deleted {
            let _ = self.net.del(&self.id, &self.netns, "eth0", &self.ports);
        }
    }
}

/// A listener in `netns` on `port` (0: any) that answers `connections` connections with
/// `greeting`, then closes.
/// The socket is opened by a thread that joined the namespace, so it lives there; the thread
/// that serves it needs not be inside.
pub fn serve_in(
    netns: &NetworkNamespace,
    port: u16,
    connections: usize,
    greeting: &'static str,
) -> SocketAddr {
    let listener = netns
        .run_in(|| TcpListener::bind(("0.0.0.0", port)))
        .expect("enter netns")
        .expect("listen in the pod");
    let local = listener.local_addr().expect("local addr");
    std::thread::spawn(move || {
        for mut stream in listener.incoming().take(connections).flatten() {
            let _ = stream.write_all(greeting.as_bytes());
        }
    });
    local
}

/// Connects to `addr` and reads everything the server writes before closing.
pub fn fetch(addr: SocketAddr) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    Ok(text)
}
