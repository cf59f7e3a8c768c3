//! Pod networking inside the launcher pod: the masquerade binding, the bridge binding
//! ([`bridge`]) and the passt binding ([`passt`]).
//!
//! Data flow: at start the launcher [`discover`]s its pod interface (`eth0`), but only when
//! it runs in a network namespace of its own ([`own_network_namespace`]);
//! it reports it in its protocol hello, and virt-handler then sends interfaces with
//! [`InterfaceBinding::Masquerade`](crate::spec::InterfaceBinding). On `sync`, before QEMU
//! starts, [`setup_masquerade`] builds upstream's in-pod result (reference §12.3): the bridge
//! `k6t-eth0` (MAC `02:00:00:00:00:00`, the pod MTU, `10.0.2.1/24`, `route_localnet`), the
//! tap `tap0` on it, IPv4 forwarding, and the `nat` table of [`nft`]; then [`dhcp`] answers
//! the guest on the bridge with `10.0.2.2/24`, router `10.0.2.1` and the pod's DNS.
//!
//! Upstream splits this into a privileged phase in virt-handler (links, sysctls, nftables)
//! and an unprivileged one in the launcher (DHCP); here the launcher, which runs as root in
//! its pod, does both (ADR 0006).
//!
//! # Guarantees
//! - [`setup_masquerade`] is idempotent: it deletes the bridge and tap it would create and
//!   replaces the `nat` table in one nft transaction, so a retried `sync` starts clean.
//!
//! # Assumptions
//! - The pod network is IPv4 only (the embedded node's CNI gives one IPv4 address); no
//!   DHCPv6 and no `ip6 nat` table.

pub mod bridge;
pub mod dhcp;
pub mod nft;
pub mod passt;

use std::net::Ipv4Addr;

use serde_json::Value;

use crate::protocol::PodInterface;
use crate::spec::Masquerade;

/// The MAC of the in-pod bridge (upstream's `StaticMasqueradeBridgeMAC`).
pub const BRIDGE_MAC: &str = "02:00:00:00:00:00";
/// The pod's resolver configuration, the source of the DHCP DNS options.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";

/// Setting up the pod network failed.
#[derive(Debug, thiserror::Error)]
pub enum NetSetupError {
    /// `ip` or `nft` could not be run or failed.
    #[error("{program} failed: {message}")]
    Command {
        /// The program.
        program: &'static str,
        /// Its stderr, or why it could not run.
        message: String,
    },
    /// A sysctl could not be written.
    #[error("cannot set {path}")]
    Sysctl {
        /// The `/proc/sys` path.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The DHCP server could not listen on the bridge.
    #[error("cannot start the DHCP server on {bridge}")]
    Dhcp {
        /// The bridge.
        bridge: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Whether this process runs in a network namespace of its own: one other than PID 1's
/// (the host's) or, where PID 1's cannot be read (sandboxes hide it even from root), other
/// than the namespace of the process that started the launcher (the node agent, which
/// joins the pod's namespace only in the child it spawns). False when neither can be read.
pub fn own_network_namespace() -> bool {
    let own = std::fs::read_link("/proc/self/ns/net");
    let parent = format!("/proc/{}/ns/net", nix::unistd::getppid());
    let reference = std::fs::read_link("/proc/1/ns/net").or_else(|_| std::fs::read_link(parent));
    match (own, reference) {
        (Ok(own), Ok(reference)) => own != reference,
        _ => false,
    }
}

/// The pod interface `name` when this process has a network namespace of its own and the
/// interface exists there; `None` otherwise (the launcher shares the host's network).
pub fn discover(name: &str) -> Option<PodInterface> {
    if !own_network_namespace() {
        return None;
    }
    let out = std::process::Command::new(program("ip"))
        .args(["-j", "addr", "show", "dev", name])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    parse_ip_addr(&String::from_utf8_lossy(&out.stdout), name)
}

/// Where `name` (`ip`, `nft`) is: found through `PATH`, else in the system directories. A
/// container's environment may have no `PATH` at all, and the C library's default search
/// path has no `sbin`.
pub fn program(name: &str) -> std::path::PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(std::path::PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| std::path::PathBuf::from(name))
}

/// Reads `ip -j addr show dev NAME`: MAC, MTU and the global addresses, IPv4 first.
pub fn parse_ip_addr(json: &str, name: &str) -> Option<PodInterface> {
    let links: Value = serde_json::from_str(json).ok()?;
    let link = links.as_array()?.iter().find(|l| l["ifname"] == name)?;
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for addr in link["addr_info"].as_array().into_iter().flatten() {
        if addr["scope"] != "global" {
            continue;
        }
        let Some(local) = addr["local"].as_str() else {
            continue;
        };
        match addr["family"].as_str() {
            Some("inet") => v4.push(local.to_owned()),
            Some("inet6") => v6.push(local.to_owned()),
            _ => {}
        }
    }
    v4.extend(v6);
    Some(PodInterface {
        name: name.to_owned(),
        mac: link["address"].as_str()?.to_owned(),
        ip_addresses: v4,
        mtu: u32::try_from(link["mtu"].as_u64()?).ok()?,
    })
}

/// The `ip -batch` script that creates the bridge and the tap (after the old ones were
/// deleted).
pub fn link_script(m: &Masquerade, mtu: u32) -> String {
    let Masquerade {
        bridge,
        tap,
        gateway,
        prefix_length,
        ..
    } = m;
    format!(
        "link add {bridge} type bridge\n\
         link set {bridge} address {BRIDGE_MAC} mtu {mtu}\n\
         addr add {gateway}/{prefix_length} dev {bridge}\n\
         tuntap add dev {tap} mode tap\n\
         link set {tap} mtu {mtu} master {bridge}\n\
         link set {tap} up\n\
         link set {bridge} up\n"
    )
}

async fn run(program: &'static str, args: &[&str], stdin: &str) -> Result<(), NetSetupError> {
    use tokio::io::AsyncWriteExt;
    let fail = |message: String| NetSetupError::Command { program, message };
    let mut child = tokio::process::Command::new(self::program(program))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| fail(e.to_string()))?;
    if let Some(mut input) = child.stdin.take() {
        input
            .write_all(stdin.as_bytes())
            .await
            .map_err(|e| fail(e.to_string()))?;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| fail(e.to_string()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(fail(String::from_utf8_lossy(&out.stderr).trim().to_owned()))
    }
}

fn sysctl(path: &str, value: &str) -> Result<(), NetSetupError> {
    std::fs::write(path, value).map_err(|source| NetSetupError::Sysctl {
        path: path.to_owned(),
        source,
    })
}

/// Builds the masquerade binding in this network namespace (see the module docs).
///
/// # Errors
/// [`NetSetupError`] for the first step that fails.
pub async fn setup_masquerade(m: &Masquerade, pod: &PodInterface) -> Result<(), NetSetupError> {
    for link in [&m.tap, &m.bridge] {
        // Left by an earlier attempt: absent is the usual case, so the result is ignored.
        let _ = run("ip", &["link", "del", link], "").await;
    }
    run("ip", &["-batch", "-"], &link_script(m, pod.mtu)).await?;
    sysctl("/proc/sys/net/ipv4/ip_forward", "1")?;
    sysctl(
        &format!("/proc/sys/net/ipv4/conf/{}/route_localnet", m.bridge),
        "1",
    )?;
    run("nft", &["-f", "-"], &nft::masquerade_ruleset(m)).await?;
    tracing::info!(bridge = %m.bridge, tap = %m.tap, guest = %m.guest, "masquerade network ready");
    Ok(())
}

/// The DHCP settings for the guest of `m`, with DNS from `resolv_conf` (its text).
pub fn dhcp_config(
    m: &Masquerade,
    pod: &PodInterface,
    hostname: &str,
    resolv_conf: &str,
) -> dhcp::DhcpConfig {
    let resolv = dhcp::parse_resolv_conf(resolv_conf);
    dhcp::DhcpConfig {
        server: m.gateway,
        guest: m.guest,
        prefix_length: m.prefix_length,
        router: m.gateway,
        dns: resolv.nameservers,
        search: resolv.search,
        hostname: hostname.to_owned(),
        mtu: u16::try_from(pod.mtu).unwrap_or(1500),
        client_mac: None,
        routes: Vec::new(),
    }
}

/// Starts the DHCP server for `m`'s guest on its bridge; it runs until the launcher exits.
///
/// # Errors
/// [`NetSetupError::Dhcp`] when the socket cannot be bound to the bridge.
pub fn start_dhcp(
    m: &Masquerade,
    pod: &PodInterface,
    hostname: &str,
) -> Result<tokio::task::JoinHandle<()>, NetSetupError> {
    let resolv = std::fs::read_to_string(RESOLV_CONF).unwrap_or_default();
    serve_dhcp(&m.bridge, dhcp_config(m, pod, hostname, &resolv))
}

/// Starts a DHCP server with `config` on `bridge`; it runs until the launcher exits.
///
/// # Errors
/// [`NetSetupError::Dhcp`] when the socket cannot be bound to the bridge.
pub fn serve_dhcp(
    bridge: &str,
    config: dhcp::DhcpConfig,
) -> Result<tokio::task::JoinHandle<()>, NetSetupError> {
    let socket = dhcp::bind(bridge).map_err(|source| NetSetupError::Dhcp {
        bridge: bridge.to_owned(),
        source,
    })?;
    Ok(tokio::spawn(dhcp::serve(socket, config)))
}

/// The mask of a prefix length.
pub(crate) fn prefix_mask(prefix_length: u8) -> Ipv4Addr {
    let bits = u32::MAX
        .checked_shl(32 - u32::from(prefix_length.min(32)))
        .unwrap_or(0);
    Ipv4Addr::from(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn masquerade() -> Masquerade {
        Masquerade {
            pod_interface: "eth0".into(),
            bridge: "k6t-eth0".into(),
            tap: "tap0".into(),
            gateway: [10, 0, 2, 1].into(),
            guest: [10, 0, 2, 2].into(),
            prefix_length: 24,
            ports: vec![],
        }
    }

    #[test]
    fn the_pod_interface_is_read_from_ip_json_with_ipv4_first() {
        let json = r#"[{"ifindex":2,"ifname":"eth0","mtu":1450,"address":"0a:58:0a:f5:00:07",
            "addr_info":[
              {"family":"inet6","local":"fd00::7","prefixlen":64,"scope":"global"},
              {"family":"inet6","local":"fe80::1","prefixlen":64,"scope":"link"},
              {"family":"inet","local":"10.245.0.7","prefixlen":24,"scope":"global"}]}]"#;
        let pod = parse_ip_addr(json, "eth0").unwrap();
        assert_eq!(pod.mac, "0a:58:0a:f5:00:07");
        assert_eq!(pod.mtu, 1450);
        assert_eq!(pod.ip_addresses, ["10.245.0.7", "fd00::7"]);
        assert!(parse_ip_addr(json, "eth1").is_none());
    }

    #[test]
    fn the_link_script_builds_upstreams_bridge_and_tap() {
        assert_eq!(
            link_script(&masquerade(), 1500),
            "link add k6t-eth0 type bridge\n\
             link set k6t-eth0 address 02:00:00:00:00:00 mtu 1500\n\
             addr add 10.0.2.1/24 dev k6t-eth0\n\
             tuntap add dev tap0 mode tap\n\
             link set tap0 mtu 1500 master k6t-eth0\n\
             link set tap0 up\n\
             link set k6t-eth0 up\n"
        );
    }

    #[test]
    fn prefix_masks() {
        assert_eq!(prefix_mask(24), Ipv4Addr::new(255, 255, 255, 0));
        assert_eq!(prefix_mask(0), Ipv4Addr::new(0, 0, 0, 0));
        assert_eq!(prefix_mask(32), Ipv4Addr::new(255, 255, 255, 255));
    }
}
