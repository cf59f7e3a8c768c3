//! The masquerade binding's nftables ruleset (pure), after upstream's (reference §12.4).
//!
//! Table `ip nat` with the base chains `prerouting`, `input`, `output`, `postrouting` and
//! the regular chains `KUBEVIRT_PREINBOUND` / `KUBEVIRT_POSTINBOUND`:
//! - the guest's outgoing traffic is masqueraded to the pod IP;
//! - traffic arriving on the pod interface is DNATed to the guest (every port, or only the
//!   interface's `ports`);
//! - traffic from the pod's loopback to a forwarded port reaches the guest too (output DNAT,
//!   SNAT to the gateway so the guest's reply comes back through the bridge).
//!
//! The legacy TCP migration ports rule (upstream's rule 4) is left out: it applies only to
//! VMIs whose `status.migrationTransport` is not `Unix`, which new VMIs always are.
//! The script replaces the table in one transaction (`table` + `delete table` + `table {…}`).

use std::fmt::Write;

use crate::spec::Masquerade;

/// The loopback address the SNAT/DNAT rules match (`127.0.0.1`).
const LOOPBACK: &str = "127.0.0.1";

/// The `nft -f` script for `m`.
pub fn masquerade_ruleset(m: &Masquerade) -> String {
    let (guest, gateway) = (m.guest, m.gateway);
    let (pod, bridge) = (&m.pod_interface, &m.bridge);
    let mut preinbound = String::new();
    let mut postinbound = String::new();
    let mut output = String::new();
    if m.ports.is_empty() {
        let _ = writeln!(preinbound, "\t\tcounter dnat to {guest}");
        let _ = writeln!(
            postinbound,
            "\t\tip saddr {{ {LOOPBACK} }} counter snat to {gateway}"
        );
        let _ = writeln!(
            output,
            "\t\tip daddr {{ {LOOPBACK} }} counter dnat to {guest}"
        );
    } else {
        for port in &m.ports {
            let (proto, p) = (port.protocol.to_ascii_lowercase(), port.port);
            let _ = writeln!(
                preinbound,
                "\t\t{proto} dport {{ {p} }} counter dnat to {guest}"
            );
            let _ = writeln!(
                postinbound,
                "\t\t{proto} dport {p} ip saddr {{ {LOOPBACK} }} counter snat to {gateway}"
            );
            let _ = writeln!(
                output,
                "\t\tip daddr {{ {LOOPBACK} }} {proto} dport {p} counter dnat to {guest}"
            );
        }
    }
    format!(
        "table ip nat\n\
         delete table ip nat\n\
         table ip nat {{\n\
         \tchain prerouting {{\n\
         \t\ttype nat hook prerouting priority -100; policy accept;\n\
         \t\tiifname \"{pod}\" counter jump KUBEVIRT_PREINBOUND\n\
         \t}}\n\
         \tchain input {{\n\
         \t\ttype nat hook input priority 100; policy accept;\n\
         \t}}\n\
         \tchain output {{\n\
         \t\ttype nat hook output priority -100; policy accept;\n\
         {output}\
         \t}}\n\
         \tchain postrouting {{\n\
         \t\ttype nat hook postrouting priority 100; policy accept;\n\
         \t\tip saddr {guest} counter masquerade\n\
         \t\toifname \"{bridge}\" counter jump KUBEVIRT_POSTINBOUND\n\
         \t}}\n\
         \tchain KUBEVIRT_PREINBOUND {{\n\
         {preinbound}\
         \t}}\n\
         \tchain KUBEVIRT_POSTINBOUND {{\n\
         {postinbound}\
         \t}}\n\
         }}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::super::tests::masquerade;
    use super::*;
    use crate::spec::ForwardedPort;

    fn golden(name: &str, rendered: &str) {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/nft")
            .join(name);
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, rendered).unwrap();
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(
            rendered,
            expected,
            "{} differs (UPDATE_GOLDEN=1 to accept)",
            path.display()
        );
    }

    #[test]
    fn without_ports_every_port_is_forwarded_to_the_guest() {
        golden(
            "masquerade-all-ports.nft",
            &masquerade_ruleset(&masquerade()),
        );
    }

    #[test]
    fn with_ports_only_those_are_forwarded() {
        let mut m = masquerade();
        m.ports = vec![
            ForwardedPort {
                protocol: "TCP".into(),
                port: 8080,
            },
            ForwardedPort {
                protocol: "udp".into(),
                port: 53,
            },
        ];
        let script = masquerade_ruleset(&m);
        assert!(script.contains("tcp dport { 8080 } counter dnat to 10.0.2.2"));
        assert!(!script.contains("\t\tcounter dnat to"));
        golden("masquerade-ports.nft", &script);
    }

    /// Loads the script into a scratch network namespace when `unshare` and `nft` work
    /// (root); checks that nft accepts it.
    #[test]
    fn nft_accepts_the_ruleset() {
        let probe = std::process::Command::new("unshare")
            .args(["-n", "nft", "list", "tables"])
            .output();
        if !probe.is_ok_and(|o| o.status.success()) {
            eprintln!("skipped: needs root for unshare -n and nft");
            return;
        }
        let script = masquerade_ruleset(&masquerade());
        let script = format!("{script}{}", masquerade_ruleset(&masquerade()));
        let mut child = std::process::Command::new("unshare")
            .args(["-n", "nft", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
