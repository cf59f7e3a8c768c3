//! From Services and EndpointSlices to an nftables ruleset: pure functions, no I/O.
//!
//! Each port of a Service with a cluster IP becomes one rule in the `prerouting` nat chain:
//! traffic that arrives on one of the proxy's ingress interfaces for `clusterIP:port` is
//! marked and destination-NATed to one of the port's ready endpoints (chosen at random per
//! connection when there are several, as kube-proxy's nftables mode does). Marked traffic
//! that leaves again through an ingress interface (a pod calling a Service whose endpoint
//! is a pod on the same bridge) is masqueraded, so replies come back through the NAT.
//! Ports without a ready endpoint get no rule.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The packet mark of proxied traffic (the bit kube-proxy uses for "masquerade me").
pub const MASQUERADE_MARK: u32 = 0x4000;

/// The transport protocols a rule can match.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    fn parse(s: Option<&str>) -> Option<Protocol> {
        match s.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    fn nft(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// One Service port and where its traffic goes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PortRule {
    /// `namespace/name:port-name`, for the rule's comment.
    pub service: String,
    pub cluster_ip: Ipv4Addr,
    pub protocol: Protocol,
    pub port: u16,
    /// Ready endpoints, sorted and without duplicates.
    pub endpoints: Vec<(Ipv4Addr, u16)>,
}

impl PortRule {
    /// Whether an endpoint is on this host's loopback (the ingress interfaces then need
    /// `route_localnet`).
    pub fn has_loopback_endpoint(&self) -> bool {
        self.endpoints.iter().any(|(ip, _)| ip.is_loopback())
    }
}

/// The rules for `service` from the EndpointSlices that belong to it (slices of other
/// Services are ignored). Headless and ExternalName Services give none.
pub fn port_rules(service: &Service, slices: &[&EndpointSlice]) -> Vec<PortRule> {
    let Some(spec) = &service.spec else {
        return vec![];
    };
    if spec.type_.as_deref() == Some("ExternalName") {
        return vec![];
    }
    let Some(cluster_ip) = spec
        .cluster_ip
        .as_deref()
        .and_then(|ip| ip.parse::<Ipv4Addr>().ok())
    else {
        return vec![];
    };
    let name = service.metadata.name.as_deref().unwrap_or_default();
    let namespace = service.metadata.namespace.as_deref().unwrap_or_default();
    let own: Vec<&EndpointSlice> = slices
        .iter()
        .copied()
        .filter(|s| {
            s.metadata.namespace.as_deref() == Some(namespace)
                && s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL))
                    .map(String::as_str)
                    == Some(name)
                && s.address_type == "IPv4"
        })
        .collect();
    let mut rules = vec![];
    for port in spec.ports.iter().flatten() {
        let Some(protocol) = Protocol::parse(port.protocol.as_deref()) else {
            continue;
        };
        let Ok(service_port) = u16::try_from(port.port) else {
            continue;
        };
        let port_name = port.name.as_deref().unwrap_or_default();
        let mut endpoints = vec![];
        for slice in &own {
            // The slice's port of the same name carries the resolved target port.
            let Some(target) = slice.ports.iter().flatten().find(|p| {
                p.name.as_deref().unwrap_or_default() == port_name
                    && Protocol::parse(p.protocol.as_deref()) == Some(protocol)
            }) else {
                continue;
            };
            let Some(target_port) = target.port.and_then(|p| u16::try_from(p).ok()) else {
                continue;
            };
            for endpoint in &slice.endpoints {
                let ready = endpoint
                    .conditions
                    .as_ref()
                    .and_then(|c| c.ready)
                    .unwrap_or(true);
                if !ready {
                    continue;
                }
                for address in &endpoint.addresses {
                    if let Ok(ip) = address.parse::<Ipv4Addr>() {
                        endpoints.push((ip, target_port));
                    }
                }
            }
        }
        // The target port is taken from the slices only: without a slice there is no
        // endpoint, so no rule.
        endpoints.sort();
        endpoints.dedup();
        if endpoints.is_empty() {
            continue;
        }
        rules.push(PortRule {
            service: format!("{namespace}/{name}:{port_name}"),
            cluster_ip,
            protocol,
            port: service_port,
            endpoints,
        });
    }
    rules
}

/// Every Service's rules, in a stable order.
pub fn all_rules<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    slices: &[&EndpointSlice],
) -> Vec<PortRule> {
    let mut by_service: BTreeMap<(String, String), Vec<PortRule>> = BTreeMap::new();
    for svc in services {
        let key = (
            svc.metadata.namespace.clone().unwrap_or_default(),
            svc.metadata.name.clone().unwrap_or_default(),
        );
        by_service.insert(key, port_rules(svc, slices));
    }
    by_service.into_values().flatten().collect()
}

/// An `nft -f` script that atomically replaces table `ip <table>` with the rules, matching
/// only traffic that arrives on `interfaces`.
pub fn render(table: &str, interfaces: &[String], rules: &[PortRule]) -> String {
    let mut out = String::new();
    // Declaring the table first makes the delete succeed when it does not exist yet; the
    // whole script is one transaction.
    let _ = writeln!(out, "table ip {table} {{}}");
    let _ = writeln!(out, "delete table ip {table}");
    let _ = writeln!(out, "table ip {table} {{");
    let _ = writeln!(out, "  chain prerouting {{");
    let _ = writeln!(
        out,
        "    type nat hook prerouting priority dstnat; policy accept;"
    );
    let ifaces = interface_set(interfaces);
    if !interfaces.is_empty() {
        for rule in rules {
            let _ = write!(
                out,
                "    iifname {ifaces} ip daddr {} {} dport {} meta mark set mark or {MASQUERADE_MARK:#x} ",
                rule.cluster_ip,
                rule.protocol.nft(),
                rule.port
            );
            match rule.endpoints.as_slice() {
                [(ip, port)] => {
                    let _ = write!(out, "dnat ip to {ip}:{port}");
                }
                many => {
                    let map = many
                        .iter()
                        .enumerate()
                        .map(|(i, (ip, port))| format!("{i} : {ip} . {port}"))
                        .collect::<Vec<_>>()
                        .join(", ");
                    let _ = write!(
                        out,
                        "dnat ip to numgen random mod {} map {{ {map} }}",
                        many.len()
                    );
                }
            }
            let _ = writeln!(out, " comment \"{}\"", comment(&rule.service));
        }
    }
    let _ = writeln!(out, "  }}");
    let _ = writeln!(out, "  chain postrouting {{");
    let _ = writeln!(
        out,
        "    type nat hook postrouting priority srcnat; policy accept;"
    );
    if !interfaces.is_empty() {
        let _ = writeln!(
            out,
            "    oifname {ifaces} meta mark & {MASQUERADE_MARK:#x} == {MASQUERADE_MARK:#x} masquerade"
        );
    }
    let _ = writeln!(out, "  }}");
    let _ = writeln!(out, "}}");
    out
}

/// The script that removes the table (ignoring that it may not exist).
pub fn render_removal(table: &str) -> String {
    format!("table ip {table} {{}}\ndelete table ip {table}\n")
}

fn interface_set(interfaces: &[String]) -> String {
    let names = interfaces
        .iter()
        .map(|i| format!("\"{}\"", comment(i)))
        .collect::<Vec<_>>()
        .join(", ");
    format!("{{ {names} }}")
}

/// Object names are DNS labels, but nothing here may end a quoted nft string.
fn comment(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '/' | ':' | '_'))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn service(name: &str, ip: &str, ports: &[(&str, i32)]) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some(ip.into()),
                ports: Some(
                    ports
                        .iter()
                        .map(|(n, p)| ServicePort {
                            name: Some((*n).into()),
                            port: *p,
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn slice(
        service: &str,
        port: (&str, i32),
        endpoints: &[(&str, Option<bool>)],
    ) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some(format!("{service}-abc")),
                namespace: Some("ns".into()),
                labels: Some([(SERVICE_NAME_LABEL.to_owned(), service.to_owned())].into()),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: endpoints
                .iter()
                .map(|(ip, ready)| Endpoint {
                    addresses: vec![(*ip).into()],
                    conditions: Some(EndpointConditions {
                        ready: *ready,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
            ports: Some(vec![EndpointPort {
                name: Some(port.0.into()),
                port: Some(port.1),
                ..Default::default()
            }]),
        }
    }

    #[test]
    fn ready_endpoints_of_the_named_port_are_the_targets() {
        let svc = service("web", "10.96.0.10", &[("http", 80), ("metrics", 9090)]);
        let s1 = slice(
            "web",
            ("http", 8080),
            &[("10.245.0.3", None), ("10.245.0.2", Some(true))],
        );
        let s2 = slice("web", ("http", 8080), &[("10.245.0.9", Some(false))]);
        let other = slice("db", ("http", 8080), &[("10.245.0.7", None)]);
        let rules = port_rules(&svc, &[&s1, &s2, &other]);
        assert_eq!(
            rules.len(),
            1,
            "metrics has no slice port, so no rule: {rules:?}"
        );
        assert_eq!(rules[0].port, 80);
        assert_eq!(
            rules[0].endpoints,
            vec![
                (Ipv4Addr::new(10, 245, 0, 2), 8080),
                (Ipv4Addr::new(10, 245, 0, 3), 8080)
            ],
            "not-ready endpoints and other Services' slices are left out"
        );
    }

    #[test]
    fn headless_and_external_name_services_get_no_rules() {
        let headless = service("h", "None", &[("http", 80)]);
        let s = slice("h", ("http", 8080), &[("10.245.0.3", None)]);
        assert!(port_rules(&headless, &[&s]).is_empty());
        let mut external = service("e", "10.96.0.11", &[("http", 80)]);
        external.spec.as_mut().unwrap().type_ = Some("ExternalName".into());
        let s = slice("e", ("http", 8080), &[("10.245.0.3", None)]);
        assert!(port_rules(&external, &[&s]).is_empty());
    }

    #[test]
    fn the_script_replaces_the_table_and_balances_over_endpoints() {
        let svc = service("web", "10.96.0.10", &[("http", 80)]);
        let s = slice(
            "web",
            ("http", 8080),
            &[("10.245.0.2", None), ("10.245.0.3", None)],
        );
        let rules = port_rules(&svc, &[&s]);
        let script = render("kvrs-proxy", &["kvrs0".into()], &rules);
        assert!(script.starts_with("table ip kvrs-proxy {}\ndelete table ip kvrs-proxy\n"));
        assert!(script.contains(
            "iifname { \"kvrs0\" } ip daddr 10.96.0.10 tcp dport 80 meta mark set mark or 0x4000 \
             dnat ip to numgen random mod 2 map { 0 : 10.245.0.2 . 8080, 1 : 10.245.0.3 . 8080 }"
        ), "{script}");
        assert!(script.contains("oifname { \"kvrs0\" } meta mark & 0x4000 == 0x4000 masquerade"));
    }

    #[test]
    fn names_cannot_break_out_of_quoted_strings() {
        assert_eq!(comment("ns/a\"; flush ruleset"), "ns/aflushruleset");
    }
}
