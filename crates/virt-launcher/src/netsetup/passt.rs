//! The passt binding: [passt](https://passt.top) in the launcher pod's network namespace.
//!
//! passt is a user-mode network stack: it answers the guest's DHCP (and NDP, DHCPv6) with the
//! pod interface's own addresses, routes and MTU, and turns the guest's connections into
//! ordinary sockets of the pod, so traffic leaves with the pod IP and nothing in the pod is
//! reconfigured (no bridge, tap or NAT). Ports of the pod listed on the interface (all TCP
//! and UDP ports when none are) are bound by passt and forwarded to the guest, as upstream's
//! `generatePasstPortForward`. QEMU's NIC connects to passt's unix socket.
//!
//! Upstream lets libvirt start passt in vhost-user mode; Debian's passt (2023) predates
//! vhost-user, so here the launcher starts it in its socket mode, which QEMU ≥ 7.2 speaks
//! natively (`-netdev stream`).
//!
//! passt drops to `nobody` when started as root, and `nobody` could not bind in the launcher
//! directory (owner-only); `--runas 0` keeps root's identity, and passt still isolates itself
//! (its own user, mount, IPC, UTS and PID namespaces, an empty root, seccomp) before it serves
//! the guest.

use std::ffi::OsString;

use crate::spec::Passt;

/// passt's command line for binding `p`: in the foreground (the launcher supervises it),
/// for one client (it quits when its QEMU goes, also when the launcher was killed and could
/// not stop it: its namespaces clear the parent-death signal), quiet, logging to `p.log`, addresses and routes from `p.pod_interface`, listening on
/// `p.socket`, the ports forwarded.
#[must_use]
pub fn args(p: &Passt) -> Vec<OsString> {
    let mut args: Vec<OsString> = [
        "--foreground",
        "--one-off",
        "--quiet",
        "--runas",
        "0",
        "--interface",
        &p.pod_interface,
        "--socket",
        &p.socket,
        "--log-file",
        &p.log,
    ]
    .iter()
    .map(OsString::from)
    .collect();
    let list = |protocol: &str| {
        p.ports
            .iter()
            .filter(|f| f.protocol == protocol)
            .map(|f| f.port.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let (tcp, udp) = if p.ports.is_empty() {
        ("all".to_owned(), "all".to_owned())
    } else {
        (list("tcp"), list("udp"))
    };
    for (flag, spec) in [("--tcp-ports", tcp), ("--udp-ports", udp)] {
        if !spec.is_empty() {
            args.push(flag.into());
            args.push(spec.into());
        }
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::ForwardedPort;

    fn passt(ports: &[(&str, u16)]) -> Passt {
        Passt {
            pod_interface: "eth0".into(),
            socket: "/run/p.sock".into(),
            log: "/run/p.log".into(),
            ports: ports
                .iter()
                .map(|(protocol, port)| ForwardedPort {
                    protocol: (*protocol).into(),
                    port: *port,
                })
                .collect(),
        }
    }

    fn line(p: &Passt) -> String {
        args(p)
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn no_listed_port_forwards_every_tcp_and_udp_port_as_upstream() {
        assert_eq!(
            line(&passt(&[])),
            "--foreground --one-off --quiet --runas 0 --interface eth0 --socket /run/p.sock \
             --log-file /run/p.log --tcp-ports all --udp-ports all"
        );
    }

    #[test]
    fn listed_ports_are_forwarded_by_protocol_and_nothing_else() {
        let p = passt(&[("tcp", 8080), ("tcp", 22), ("udp", 53)]);
        assert!(
            line(&p).ends_with("--tcp-ports 8080,22 --udp-ports 53"),
            "{}",
            line(&p)
        );
        let tcp_only = passt(&[("tcp", 80)]);
        assert!(
            line(&tcp_only).ends_with("--tcp-ports 80"),
            "{}",
            line(&tcp_only)
        );
    }
}
