//! A single-client DHCPv4 server for the guest of a masquerade interface (reference §12.5).
//!
//! It listens on UDP port 67 bound to the in-pod bridge, answers DISCOVER with an OFFER and
//! REQUEST with an ACK (any client MAC, as upstream's masquerade server), always for the
//! same address, and ignores everything else. Replies are broadcast on the bridge: the guest
//! has no address yet. Options: subnet mask, router, DNS servers, domain name and search
//! list from the pod's `resolv.conf`, host name, interface MTU, a lease of 999 days and the
//! server identifier. [`reply`] is pure; [`serve`] is the socket loop.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode};
use dhcproto::{Decodable, Decoder, Encodable, Encoder, Name};

/// Lease time: 999 days, as upstream.
pub const LEASE_SECONDS: u32 = 999 * 24 * 60 * 60;

/// What the server hands out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DhcpConfig {
    /// The server's address on the bridge (the server identifier).
    pub server: Ipv4Addr,
    /// The address the guest gets.
    pub guest: Ipv4Addr,
    /// Its prefix length.
    pub prefix_length: u8,
    /// The default gateway.
    pub router: Ipv4Addr,
    /// IPv4 name servers.
    pub dns: Vec<Ipv4Addr>,
    /// Search domains, in order.
    pub search: Vec<String>,
    /// The guest's host name.
    pub hostname: String,
    /// Interface MTU.
    pub mtu: u16,
    /// Answer only this client (the bridge binding: other guests on the pod network must
    /// not get this address); any client when `None` (masquerade, as upstream).
    pub client_mac: Option<[u8; 6]>,
    /// Classless static routes (option 121, RFC 3442), the default route last; none sends no
    /// option. A client that takes them ignores the router option, so they include the
    /// default route.
    pub routes: Vec<Route>,
}

/// One IPv4 route handed to the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The destination network.
    pub destination: ipnet::Ipv4Net,
    /// The next hop; `None` for a destination on the link (sent as `0.0.0.0`).
    pub gateway: Option<Ipv4Addr>,
}

/// `aa:bb:cc:dd:ee:ff` as bytes.
pub fn parse_mac(mac: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut parts = mac.split(':');
    for byte in &mut out {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
}

/// The parts of a `resolv.conf` the DHCP options carry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolvConf {
    /// IPv4 `nameserver`s.
    pub nameservers: Vec<Ipv4Addr>,
    /// The `search` list (or `domain`).
    pub search: Vec<String>,
}

/// Reads `nameserver` (IPv4 only), `search` and `domain` lines; the last `search` or
/// `domain` line wins, as in the resolver.
pub fn parse_resolv_conf(text: &str) -> ResolvConf {
    let mut out = ResolvConf::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => {
                if let Some(ip) = words.next().and_then(|w| w.parse().ok()) {
                    out.nameservers.push(ip);
                }
            }
            Some("search" | "domain") => out.search = words.map(str::to_owned).collect(),
            _ => {}
        }
    }
    out
}

/// The answer to `request`, or `None` when it gets none.
pub fn reply(request: &Message, config: &DhcpConfig) -> Option<Message> {
    if request.opcode() != Opcode::BootRequest {
        return None;
    }
    if let Some(mac) = config.client_mac
        && request.chaddr().get(..6) != Some(&mac[..])
    {
        return None;
    }
    let kind = match request.opts().msg_type()? {
        MessageType::Discover => MessageType::Offer,
        MessageType::Request => MessageType::Ack,
        _ => return None,
    };
    let mut msg = Message::new_with_id(
        request.xid(),
        Ipv4Addr::UNSPECIFIED,
        config.guest,
        config.server,
        request.giaddr(),
        request.chaddr(),
    );
    msg.set_opcode(Opcode::BootReply)
        .set_htype(request.htype())
        .set_flags(request.flags());
    let opts = msg.opts_mut();
    opts.insert(DhcpOption::MessageType(kind));
    opts.insert(DhcpOption::ServerIdentifier(config.server));
    opts.insert(DhcpOption::AddressLeaseTime(LEASE_SECONDS));
    opts.insert(DhcpOption::SubnetMask(super::prefix_mask(
        config.prefix_length,
    )));
    opts.insert(DhcpOption::Router(vec![config.router]));
    if !config.routes.is_empty() {
        let mut routes = config.routes.clone();
        // Upstream's order: the default route last.
        routes.sort_by_key(|r| r.destination.prefix_len() == 0);
        opts.insert(DhcpOption::ClasslessStaticRoute(
            routes
                .iter()
                .map(|r| (r.destination, r.gateway.unwrap_or(Ipv4Addr::UNSPECIFIED)))
                .collect(),
        ));
    }
    if !config.dns.is_empty() {
        opts.insert(DhcpOption::DomainNameServer(config.dns.clone()));
    }
    let names: Vec<Name> = config
        .search
        .iter()
        .filter_map(|d| Name::from_utf8(d).ok())
        .collect();
    if !names.is_empty() {
        opts.insert(DhcpOption::DomainSearch(names));
    }
    if let Some(longest) = config.search.iter().max_by_key(|d| d.len()) {
        opts.insert(DhcpOption::DomainName(longest.clone()));
    }
    if !config.hostname.is_empty() {
        opts.insert(DhcpOption::Hostname(config.hostname.clone()));
    }
    opts.insert(DhcpOption::InterfaceMtu(config.mtu));
    Some(msg)
}

/// A UDP socket on port 67 bound to `device`, able to broadcast.
///
/// # Errors
/// The socket calls' errors.
pub fn bind(device: &str) -> std::io::Result<tokio::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_address(true)?;
    socket.set_broadcast(true)?;
    socket.bind_device(Some(device.as_bytes()))?;
    socket.set_nonblocking(true)?;
    let any = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 67));
    socket.bind(&any.into())?;
    tokio::net::UdpSocket::from_std(socket.into())
}

/// Answers DHCP requests on `socket` until the task is dropped.
pub async fn serve(socket: tokio::net::UdpSocket, config: DhcpConfig) {
    let mut buf = vec![0u8; 1500];
    let to = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::BROADCAST, 68));
    loop {
        let len = match socket.recv_from(&mut buf).await {
            Ok((len, _)) => len,
            Err(e) => {
                tracing::warn!(error = %e, "DHCP server cannot receive; stopping");
                return;
            }
        };
        let Ok(request) = Message::decode(&mut Decoder::new(&buf[..len])) else {
            tracing::debug!("ignoring a malformed DHCP packet");
            continue;
        };
        let Some(answer) = reply(&request, &config) else {
            continue;
        };
        let mut out = Vec::new();
        if answer.encode(&mut Encoder::new(&mut out)).is_err() {
            continue;
        }
        match socket.send_to(&out, to).await {
            Ok(_) => {
                tracing::debug!(kind = ?answer.opts().msg_type(), guest = %config.guest, "DHCP reply sent")
            }
            Err(e) => tracing::warn!(error = %e, "cannot send a DHCP reply"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> DhcpConfig {
        DhcpConfig {
            server: [10, 0, 2, 1].into(),
            guest: [10, 0, 2, 2].into(),
            prefix_length: 24,
            router: [10, 0, 2, 1].into(),
            dns: vec![[10, 96, 0, 10].into()],
            search: vec![
                "default.svc.cluster.local".into(),
                "svc.cluster.local".into(),
            ],
            hostname: "demo".into(),
            mtu: 1500,
            client_mac: None,
            routes: Vec::new(),
        }
    }

    fn request(kind: MessageType) -> Message {
        let mut m = Message::new_with_id(
            0x1234,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            &[0x52, 0x54, 0, 1, 2, 3],
        );
        m.opts_mut().insert(DhcpOption::MessageType(kind));
        m
    }

    #[test]
    fn a_discover_gets_an_offer_of_the_guest_address_with_upstreams_options() {
        let offer = reply(&request(MessageType::Discover), &config()).unwrap();
        // Through the wire and back, as the guest sees it.
        let mut bytes = Vec::new();
        offer.encode(&mut Encoder::new(&mut bytes)).unwrap();
        let offer = Message::decode(&mut Decoder::new(&bytes)).unwrap();
        assert_eq!(offer.opcode(), Opcode::BootReply);
        assert_eq!(offer.xid(), 0x1234);
        assert_eq!(offer.yiaddr(), Ipv4Addr::new(10, 0, 2, 2));
        assert_eq!(offer.chaddr(), &[0x52, 0x54, 0, 1, 2, 3]);
        let opts = offer.opts();
        assert_eq!(opts.msg_type(), Some(MessageType::Offer));
        let get = |c| opts.get(c).cloned();
        use dhcproto::v4::OptionCode as C;
        assert_eq!(
            get(C::SubnetMask),
            Some(DhcpOption::SubnetMask([255, 255, 255, 0].into()))
        );
        assert_eq!(
            get(C::Router),
            Some(DhcpOption::Router(vec![[10, 0, 2, 1].into()]))
        );
        assert_eq!(
            get(C::DomainNameServer),
            Some(DhcpOption::DomainNameServer(vec![[10, 96, 0, 10].into()]))
        );
        assert_eq!(
            get(C::DomainName),
            Some(DhcpOption::DomainName("default.svc.cluster.local".into()))
        );
        assert_eq!(
            get(C::AddressLeaseTime),
            Some(DhcpOption::AddressLeaseTime(86_313_600))
        );
        assert_eq!(
            get(C::ServerIdentifier),
            Some(DhcpOption::ServerIdentifier([10, 0, 2, 1].into()))
        );
        assert_eq!(get(C::InterfaceMtu), Some(DhcpOption::InterfaceMtu(1500)));
        assert_eq!(get(C::Hostname), Some(DhcpOption::Hostname("demo".into())));
        assert!(matches!(get(C::DomainSearch), Some(DhcpOption::DomainSearch(n)) if n.len() == 2));
    }

    #[test]
    fn routes_go_out_as_rfc_3442_classless_routes_with_the_default_last() {
        assert_eq!(
            reply(&request(MessageType::Discover), &config())
                .unwrap()
                .opts()
                .get(dhcproto::v4::OptionCode::ClasslessStaticRoute),
            None,
            "no routes, no option"
        );
        let mut with_routes = config();
        with_routes.routes = vec![
            Route {
                destination: "0.0.0.0/0".parse().unwrap(),
                gateway: Some([10, 0, 2, 1].into()),
            },
            Route {
                destination: "10.96.0.0/12".parse().unwrap(),
                gateway: None,
            },
        ];
        let offer = reply(&request(MessageType::Discover), &with_routes).unwrap();
        let mut bytes = Vec::new();
        offer.encode(&mut Encoder::new(&mut bytes)).unwrap();
        // Option 121, 12 bytes: width 12 and the two significant octets of 10.96/12, on the
        // link (0.0.0.0); then width 0 (the default route) through 10.0.2.1.
        let option = [121, 12, 12, 10, 96, 0, 0, 0, 0, 0, 10, 0, 2, 1];
        assert!(
            bytes.windows(option.len()).any(|w| w == option),
            "{bytes:?}"
        );
    }

    #[test]
    fn a_request_gets_an_ack_and_other_messages_no_answer() {
        let ack = reply(&request(MessageType::Request), &config()).unwrap();
        assert_eq!(ack.opts().msg_type(), Some(MessageType::Ack));
        for kind in [
            MessageType::Release,
            MessageType::Decline,
            MessageType::Inform,
        ] {
            assert!(reply(&request(kind), &config()).is_none(), "{kind:?}");
        }
        let mut from_server = request(MessageType::Discover);
        from_server.set_opcode(Opcode::BootReply);
        assert!(reply(&from_server, &config()).is_none());
    }

    #[test]
    fn resolv_conf_gives_ipv4_name_servers_and_the_search_list() {
        let parsed = parse_resolv_conf(
            "# comment\nnameserver 10.96.0.10\nnameserver fd00::10\nsearch a.svc b.svc\noptions ndots:5\n",
        );
        assert_eq!(parsed.nameservers, [Ipv4Addr::new(10, 96, 0, 10)]);
        assert_eq!(parsed.search, ["a.svc", "b.svc"]);
    }
}
