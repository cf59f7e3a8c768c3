//! What the node itself needs for pod networking.
//!
//! Only one global setting is touched: `net.ipv4.ip_forward`, so the node routes between the
//! pod bridge and its other interfaces (the `bridge` plugin's masquerading is useless without
//! it). The plugins manage their bridge, veths and iptables rules themselves; the one thing
//! they never do is remove the bridge, which [`delete_bridge`] does when its network goes.

use std::io;
use std::path::Path;

const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// The node could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// `net.ipv4.ip_forward` could not be set.
    #[error("cannot set net.ipv4.ip_forward=1")]
    IpForward(#[source] io::Error),
    /// An interface of that name exists and is not a bridge; it was left alone.
    #[error("{interface} is not a bridge")]
    NotABridge {
        /// The interface's name.
        interface: String,
    },
    /// The bridge could not be brought down or deleted (not root?).
    #[error("cannot delete the bridge {bridge}")]
    DeleteBridge {
        /// The bridge's name.
        bridge: String,
        /// Why.
        #[source]
        source: io::Error,
    },
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

/// Deletes the Linux bridge `bridge` of the host's network namespace (the one `/sys/class/net`
/// shows), bringing it down first and so detaching whatever veths are still attached to it. Returns whether there was one: a missing
/// bridge is not an error, so this is idempotent. An interface of that name that is not a
/// bridge is refused and kept.
pub fn delete_bridge(bridge: &str) -> Result<bool, HostError> {
    let error = |source| HostError::DeleteBridge {
        bridge: bridge.to_owned(),
        source,
    };
    let gone =
        |e: &io::Error| matches!(e.raw_os_error(), Some(nix::libc::ENODEV | nix::libc::ENXIO));
    if bridge.is_empty() || bridge.contains(['/', '\0']) || bridge == "." || bridge == ".." {
        return Err(error(io::Error::from(io::ErrorKind::InvalidInput)));
    }
    let sysfs = Path::new("/sys/class/net").join(bridge);
    if !sysfs.exists() {
        return Ok(false);
    }
    if !sysfs.join("bridge").is_dir() {
        return Err(HostError::NotABridge {
            interface: bridge.to_owned(),
        });
    }
    match crate::sys::set_link_up(bridge, false) {
        Ok(()) => {}
        Err(e) if gone(&e) => return Ok(false),
        Err(e) => return Err(error(e)),
    }
    match crate::sys::delete_bridge(bridge) {
        Ok(()) => {
            tracing::info!(bridge, "deleted the pod bridge");
            Ok(true)
        }
        Err(e) if gone(&e) => Ok(false),
        Err(e) => Err(error(e)),
    }
}
