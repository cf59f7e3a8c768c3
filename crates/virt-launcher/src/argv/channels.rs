//! The guest agent's channel, as upstream gives every domain one: a virtio-serial controller
//! and the port [`crate::qga::GUEST_AGENT_CHANNEL`], whose host end is a unix socket QEMU
//! listens on (`wait=off`: the guest starts without a client) and the launcher connects to.
//!
//! The launcher adds these arguments itself, for the socket of its own directory
//! ([`crate::pod_layout::GUEST_AGENT_SOCKET`]), rather than reading a path from the spec: a
//! handler's spec stays what older launchers accept, and every domain a launcher of this
//! version starts has the channel (a migration target gets it exactly as its source).

use super::escape;

/// QEMU's id of the guest agent's port; its `VSERPORT_CHANGE` events carry it.
pub const GUEST_AGENT_PORT_ID: &str = "channel0";

/// The arguments of the guest agent's channel with its host end at `socket`.
pub fn guest_agent_args(socket: &str) -> Vec<String> {
    vec![
        "-device".into(),
        "virtio-serial-pci,id=virtio-serial0".into(),
        "-chardev".into(),
        format!(
            "socket,id=charchannel0,path={},server=on,wait=off",
            escape(socket)
        ),
        "-device".into(),
        format!(
            "virtserialport,bus=virtio-serial0.0,nr=1,chardev=charchannel0,id={GUEST_AGENT_PORT_ID},name={}",
            crate::qga::GUEST_AGENT_CHANNEL
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_is_named_for_the_agent_and_its_socket_is_escaped() {
        let args = guest_agent_args("/run/a,b/guest-agent.sock");
        assert_eq!(
            args[3],
            "socket,id=charchannel0,path=/run/a,,b/guest-agent.sock,server=on,wait=off"
        );
        assert!(
            args[5].ends_with("id=channel0,name=org.qemu.guest_agent.0"),
            "{args:?}"
        );
    }
}
