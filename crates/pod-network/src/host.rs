//! What the node itself needs for pod networking.
//!
//! Only one global setting is touched: `net.ipv4.ip_forward`, so the node routes between the
//! pod bridge and its other interfaces (the `bridge` plugin's masquerading is useless without
//! it). Nothing else on the host is changed here; the plugins manage their bridge, veths and
//! iptables rules themselves.

use std::io;

const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// The node could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// `net.ipv4.ip_forward` could not be set.
    #[error("cannot set net.ipv4.ip_forward=1")]
    IpForward(#[source] io::Error),
}

/// Sets `net.ipv4.ip_forward=1` (host-wide, until reboot) unless it is set already.
pub fn enable_ip_forwarding() -> Result<(), HostError> {
    let current = std::fs::read_to_string(IP_FORWARD).map_err(HostError::IpForward)?;
    if current.trim() == "1" {
        return Ok(());
    }
    std::fs::write(IP_FORWARD, b"1\n").map_err(HostError::IpForward)?;
    tracing::info!("set net.ipv4.ip_forward=1 for the pod network");
    Ok(())
}
