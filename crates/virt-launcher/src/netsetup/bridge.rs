//! The bridge binding inside the launcher pod (reference §12.6): the guest takes the pod's
//! address.
//!
//! [`setup_bridge`] builds upstream's in-pod result: the pod interface `eth0` loses its
//! address and is renamed `eth0-nic`, given a MAC of its own (the guest takes the pod's),
//! and enslaved, with MAC learning off, to the bridge `k6t-eth0`, which holds only the DHCP
//! server's link-local `169.254.75.1N/32`; the tap `tap0` is on the bridge; and
//! `arp_ignore=1`, so that the pod answers no ARP for an address it does not hold on the
//! interface asked. The DHCP server ([`super::dhcp`]) then offers the pod's IPv4 address,
//! prefix and gateway to the guest's MAC only — other pods' guests on the node's network
//! must not get it.
//!
//! Deviation: upstream also creates a dummy `eth0` with the pod's MAC and address, for the
//! pod's own view of itself. Kernels without the dummy driver (this project's CI machines
//! among them) cannot, so nothing in the pod keeps the address: the guest alone holds it,
//! which is what traffic to the pod IP needs. CNI DEL finds no `eth0` and releases the
//! address all the same (the namespace's deletion removes the veth).
//!
//! Learning is off on the pod interface because the node's bridge may reflect the guest's
//! broadcasts back to the pod (CNI's `hairpinMode`, on with `portmap`): learning the guest's
//! MAC from them would move it to the pod interface, and the guest would get nothing more.
//!
//! The pod's address, prefix and gateway are read once when the launcher starts
//! ([`discover_ipv4`]), before anything moves, so a retried `sync` builds the same result.
//!
//! # Guarantees
//! [`setup_bridge`] is idempotent: the rename happens once (an existing `eth0-nic` is
//! reused), and the bridge and tap are deleted and made again.

use std::net::Ipv4Addr;

use serde_json::Value;

use super::dhcp::{DhcpConfig, Route};
use super::{NetSetupError, program, run, sysctl};
use crate::protocol::PodInterface;
use crate::spec::PodBridge;

/// The pod interface's IPv4 configuration, as the CNI plugin left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIpv4 {
    /// The pod's address.
    pub address: Ipv4Addr,
    /// Its prefix length.
    pub prefix_length: u8,
    /// The next hop of the default route through the interface.
    pub gateway: Option<Ipv4Addr>,
    /// Every IPv4 route through the interface but the one to its own network (upstream's
    /// `filterRoutesByNonLocalDestination`), handed to the guest as option 121.
    pub routes: Vec<Route>,
}

/// Reads `ip -j addr show dev NAME` and `ip -j route show dev NAME`: the first global IPv4
/// address with its prefix, and the default route's gateway.
pub fn parse_ipv4(addr_json: &str, route_json: &str) -> Option<PodIpv4> {
    let links: Value = serde_json::from_str(addr_json).ok()?;
    let addr = links
        .as_array()?
        .iter()
        .flat_map(|l| l["addr_info"].as_array().into_iter().flatten())
        .find(|a| a["family"] == "inet" && a["scope"] == "global")?;
    let routes: Value = serde_json::from_str(route_json).unwrap_or(Value::Null);
    let gateway = routes
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["dst"] == "default")
        .and_then(|r| r["gateway"].as_str()?.parse().ok());
    let address: Ipv4Addr = addr["local"].as_str()?.parse().ok()?;
    let prefix_length = u8::try_from(addr["prefixlen"].as_u64()?).ok()?;
    let own = ipnet::Ipv4Net::new(address, prefix_length).ok()?.trunc();
    let routes = routes
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let destination = match r["dst"].as_str()? {
                "default" => ipnet::Ipv4Net::default(),
                dst if dst.contains('/') => dst.parse().ok()?,
                host => ipnet::Ipv4Net::new(host.parse().ok()?, 32).ok()?,
            };
            let gateway = match r["gateway"].as_str() {
                Some(gw) => Some(gw.parse().ok()?),
                None => None,
            };
            Some(Route {
                destination,
                gateway,
            })
        })
        .filter(|r| r.destination.prefix_len() == 0 || r.destination.trunc() != own)
        .collect();
    Some(PodIpv4 {
        address,
        prefix_length,
        gateway,
        routes,
    })
}

/// The IPv4 configuration of the pod interface `name` (see [`parse_ipv4`]); `None` when it
/// has none or `ip` cannot tell.
pub fn discover_ipv4(name: &str) -> Option<PodIpv4> {
    let ip = |args: &[&str]| {
        let out = std::process::Command::new(program("ip"))
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let addr = ip(&["-j", "addr", "show", "dev", name])?;
    let routes = ip(&["-j", "route", "show", "dev", name]).unwrap_or_default();
    parse_ipv4(&addr, &routes)
}

/// A locally administered MAC for the renamed pod interface and the bridge, derived from the
/// pod's (which the guest takes): the bridge must not hold the guest's MAC itself, or frames
/// for the guest would end in the bridge instead of on the tap.
pub fn nic_mac(pod_mac: &str) -> String {
    match pod_mac.split_once(':') {
        Some((_, rest)) => format!("02:{rest}"),
        None => "02:00:00:00:00:01".to_owned(),
    }
}

/// The `ip -batch` script that renames the pod interface and drops its address (run once).
pub fn rename_script(b: &PodBridge, pod: &PodInterface) -> String {
    let PodBridge {
        pod_interface,
        renamed,
        ..
    } = b;
    format!(
        "link set {pod_interface} down\n\
         addr flush dev {pod_interface}\n\
         link set {pod_interface} name {renamed}\n\
         link set {renamed} address {}\n",
        nic_mac(&pod.mac)
    )
}

/// The `ip -batch` script that builds the bridge and the tap.
pub fn link_script(b: &PodBridge, pod: &PodInterface, ipv4: Option<&PodIpv4>) -> String {
    let PodBridge {
        renamed,
        bridge,
        tap,
        server,
        ..
    } = b;
    let mtu = pod.mtu;
    let mut script = format!(
        "link add {bridge} type bridge\n\
         link set {bridge} address {} mtu {mtu}\n",
        nic_mac(&pod.mac)
    );
    if ipv4.is_some() {
        script.push_str(&format!("addr add {server}/32 dev {bridge}\n"));
    }
    script.push_str(&format!(
        "link set {renamed} master {bridge}\n\
         link set {renamed} type bridge_slave learning off\n\
         tuntap add dev {tap} mode tap\n\
         link set {tap} mtu {mtu} master {bridge}\n\
         link set {renamed} up\n\
         link set {tap} up\n\
         link set {bridge} up\n"
    ));
    script
}

/// Builds the bridge binding in this network namespace (see the module docs).
///
/// # Errors
/// [`NetSetupError`] for the first step that fails.
pub async fn setup_bridge(
    b: &PodBridge,
    pod: &PodInterface,
    ipv4: Option<&PodIpv4>,
) -> Result<(), NetSetupError> {
    let renamed_exists = run("ip", &["link", "show", "dev", &b.renamed], "")
        .await
        .is_ok();
    if !renamed_exists {
        run("ip", &["-batch", "-"], &rename_script(b, pod)).await?;
    }
    for link in [&b.tap, &b.bridge] {
        let _ = run("ip", &["link", "del", link], "").await;
    }
    run("ip", &["-batch", "-"], &link_script(b, pod, ipv4)).await?;
    if ipv4.is_some() {
        sysctl("/proc/sys/net/ipv4/conf/all/arp_ignore", "1")?;
    }
    tracing::info!(bridge = %b.bridge, tap = %b.tap, address = ?ipv4.map(|v| v.address), "bridge network ready");
    Ok(())
}

/// Removes what [`setup_bridge`] made for `b`: the tap, the bridge and the renamed pod
/// interface (a veth: its peer on the node goes with it). Links already gone are fine.
pub async fn remove_bridge(b: &PodBridge) {
    for link in [&b.tap, &b.bridge, &b.renamed] {
        let _ = run("ip", &["link", "del", link], "").await;
    }
    tracing::info!(bridge = %b.bridge, tap = %b.tap, "bridge network removed");
}

/// The DHCP settings for the guest with MAC `guest_mac` on `b`: the pod's address, prefix
/// and gateway; DNS from `resolv_conf` (its text). `None` without a pod IPv4 address
/// (upstream then disables IPAM).
pub fn dhcp_config(
    b: &PodBridge,
    pod: &PodInterface,
    ipv4: Option<&PodIpv4>,
    guest_mac: &str,
    hostname: &str,
    resolv_conf: &str,
) -> Option<DhcpConfig> {
    let v4 = ipv4?;
    let resolv = super::dhcp::parse_resolv_conf(resolv_conf);
    Some(DhcpConfig {
        server: b.server,
        guest: v4.address,
        prefix_length: v4.prefix_length,
        router: v4.gateway.unwrap_or(b.server),
        dns: resolv.nameservers,
        search: resolv.search,
        hostname: hostname.to_owned(),
        mtu: u16::try_from(pod.mtu).unwrap_or(1500),
        client_mac: super::dhcp::parse_mac(guest_mac),
        routes: v4.routes.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bridge() -> PodBridge {
        PodBridge {
            pod_interface: "eth0".into(),
            renamed: "eth0-nic".into(),
            bridge: "k6t-eth0".into(),
            tap: "tap0".into(),
            server: [169, 254, 75, 10].into(),
        }
    }

    fn pod() -> PodInterface {
        PodInterface {
            name: "eth0".into(),
            mac: "0a:58:0a:f5:00:07".into(),
            ip_addresses: vec!["10.245.0.7".into()],
            mtu: 1450,
        }
    }

    #[test]
    fn the_pod_address_prefix_and_gateway_are_read_from_ip_json() {
        let addr = r#"[{"ifname":"eth0","addr_info":[
            {"family":"inet6","local":"fe80::1","prefixlen":64,"scope":"link"},
            {"family":"inet","local":"10.245.0.7","prefixlen":24,"scope":"global"}]}]"#;
        let routes = r#"[{"dst":"10.245.0.0/24","protocol":"kernel","scope":"link"},
            {"dst":"default","gateway":"10.245.0.1","flags":[]},
            {"dst":"10.96.0.0/12","gateway":"10.245.0.254"},
            {"dst":"169.254.1.1","scope":"link"}]"#;
        let route = |destination: &str, gateway: Option<[u8; 4]>| Route {
            destination: destination.parse().unwrap(),
            gateway: gateway.map(Ipv4Addr::from),
        };
        assert_eq!(
            parse_ipv4(addr, routes),
            Some(PodIpv4 {
                address: [10, 245, 0, 7].into(),
                prefix_length: 24,
                gateway: Some([10, 245, 0, 1].into()),
                // The route to the pod's own network is left out, as upstream.
                routes: vec![
                    route("0.0.0.0/0", Some([10, 245, 0, 1])),
                    route("10.96.0.0/12", Some([10, 245, 0, 254])),
                    route("169.254.1.1/32", None),
                ],
            })
        );
        assert_eq!(parse_ipv4("[]", routes), None);
    }

    #[test]
    fn the_scripts_take_the_address_off_the_pod_interface_and_put_it_on_the_bridge() {
        let v4 = PodIpv4 {
            address: [10, 245, 0, 7].into(),
            prefix_length: 24,
            gateway: Some([10, 245, 0, 1].into()),
            routes: Vec::new(),
        };
        assert_eq!(
            rename_script(&bridge(), &pod()),
            "link set eth0 down\naddr flush dev eth0\nlink set eth0 name eth0-nic\n\
             link set eth0-nic address 02:58:0a:f5:00:07\n"
        );
        assert_eq!(
            link_script(&bridge(), &pod(), Some(&v4)),
            "link add k6t-eth0 type bridge\n\
             link set k6t-eth0 address 02:58:0a:f5:00:07 mtu 1450\n\
             addr add 169.254.75.10/32 dev k6t-eth0\n\
             link set eth0-nic master k6t-eth0\n\
             link set eth0-nic type bridge_slave learning off\n\
             tuntap add dev tap0 mode tap\n\
             link set tap0 mtu 1450 master k6t-eth0\n\
             link set eth0-nic up\nlink set tap0 up\nlink set k6t-eth0 up\n"
        );
        let dhcp = dhcp_config(
            &bridge(),
            &pod(),
            Some(&v4),
            "0a:58:0a:f5:00:07",
            "vm",
            "nameserver 10.96.0.10\n",
        )
        .expect("dhcp");
        assert_eq!(dhcp.guest, v4.address);
        assert_eq!(dhcp.router, Ipv4Addr::new(10, 245, 0, 1));
        assert_eq!(dhcp.server, Ipv4Addr::new(169, 254, 75, 10));
        assert_eq!(dhcp.client_mac, Some([0x0a, 0x58, 0x0a, 0xf5, 0x00, 0x07]));
        assert_eq!(dhcp_config(&bridge(), &pod(), None, "", "vm", ""), None);
    }
}
