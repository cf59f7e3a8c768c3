//! A pod's network: its own network namespace, attached to the node's pod bridge by the
//! standard CNI plugins (`bridge` with `host-local` IPAM, then `portmap` for hostPorts).
//!
//! The node agent runs pods as host processes; each pod gets a network namespace and these
//! steps, all synchronous (run them on a blocking thread from async code):
//!
//! 1. once per node: [`enable_ip_forwarding`];
//! 2. per pod: [`NetworkNamespace::create`] (with `lo` up), then [`CniNetwork::add`] with the
//!    namespace's path, which returns the pod's [`PodAddresses`] for its status;
//! 3. per container: [`NetworkNamespace::enter_fd`] before spawning and [`join_in_child`] on
//!    the `Command`, so the process starts inside the pod's network;
//! 4. on pod removal: [`CniNetwork::del`] (idempotent), then [`NetworkNamespace::delete`].
//!
//! After a restart the agent re-adopts a pod's namespace with [`NetworkNamespace::open`]; the
//! ADD results cached under [`CniNetwork::result_cache_dir`] let DEL and CHECK work then too.
//!
//! Node agents that share a machine take a [`PodNetworkSlot`] each: a bridge name and pod CIDR
//! of their own for as long as they live. When a node's network goes for good, [`delete_bridge`]
//! removes its bridge (the `bridge` plugin never does).
//!
//! Secondary networks (a NetworkAttachmentDefinition's configuration, as Multus runs them) are
//! [`Attachment`]s: any CNI configuration, added as one more interface of the namespace.
//!
//! Modules: [`attachment`] secondary networks, [`netns`] the namespaces, [`config`] the network and its configuration list,
//! [`exec`] running the plugins, [`host`] the node's one global setting and its bridge,
//! [`slot`] the allocator of bridges and CIDRs; `sys` the few `unsafe` system calls.

pub mod attachment;
pub mod config;
pub mod exec;
pub mod host;
pub mod netns;
pub mod slot;
mod sys;

pub use attachment::{Attachment, AttachmentConfigError, AttachmentStatus};
pub use config::{
    CNI_VERSION, CniNetwork, DEFAULT_IPAM_DATA_DIR, DEFAULT_PLUGIN_DIR, DEFAULT_RESULT_CACHE_DIR,
    InvalidCidr, Ipv4Cidr, PortMapping, Protocol,
};
pub use exec::{CniError, CniInterface, PodAddresses, PodIp};
pub use host::{HostError, delete_bridge, enable_ip_forwarding};
pub use netns::{DEFAULT_RUN_DIR, NetnsError, NetworkNamespace, delete_path};
pub use slot::{DEFAULT_LOCK_DIR, MAX_SLOT, PodNetworkSlot, SlotError};
pub use sys::{enter, join_in_child};
