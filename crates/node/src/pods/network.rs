//! Each pod's network namespace on the node's pod network, as kubelet's sandbox and CNI do.
//!
//! Data flow: before a pod's first container starts, [`PodNetworks::set_up`] creates the network
//! namespace `<data dir>/netns/<pod uid>`, runs CNI ADD on it (interface `eth0`, container ID =
//! the pod's uid, the pod's hostPorts as `portmap` mappings) and writes what it got to
//! `<pod dir>/network.json` ([`NetworkRecord`]); every container of the pod then starts inside
//! that namespace, and the record's addresses are the pod's `podIP`/`podIPs`. When the pod
//! ends (terminal phase, or removal after its containers stopped) [`PodNetworks::tear_down`]
//! runs CNI DEL and deletes the namespace; the record stays, marked released, so a finished pod
//! keeps reporting the IP it had. `host-local`'s reservations and the ADD result cache live
//! under `<data dir>/cni/`, so node agents that share a machine share nothing but the host's
//! network namespace (where each has its own bridge and CIDR).
//!
//! # Guarantees
//! - The record is written before any container joins the namespace: a container never runs in
//!   a namespace the node could not re-adopt.
//! - After a restart a pod whose record and namespace exist is re-adopted as it is (no new
//!   address, no plugin run). Anything else — a namespace without a record (the agent died
//!   during ADD), a record without a namespace (a reboot) — is cleaned with DEL first and made
//!   anew.
//! - Tear-down is idempotent: DEL and the namespace deletion succeed when there is nothing (left)
//!   to remove, and a pod that never had a network costs two `stat`s.
//!
//! # Caveats
//! The plugins run synchronously, on a blocking thread; a pod's ADD takes a few tens of
//! milliseconds (logged at debug level with the time it took).

use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use pod_network::{CniNetwork, NetworkNamespace, PortMapping, Protocol};
use serde::{Deserialize, Serialize};

use super::process;

/// The file in a pod directory that records the pod's network.
pub const NETWORK_RECORD_FILE: &str = "network.json";

/// The pod's interface, as kubelet names it.
pub const POD_INTERFACE: &str = "eth0";

/// The CNI network name of the node's pod network (`host-local` keeps its reservations under
/// `<data dir>/cni/networks/<name>/`).
pub const NETWORK_NAME: &str = "kubevirt-rs-pods";

/// Why a pod's network could not be set up or torn down (its containers wait in
/// `ContainerCreating`, or its removal is retried).
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// The pod's network namespace could not be created or deleted.
    #[error("the network namespace of pod {uid}")]
    Namespace {
        uid: String,
        #[source]
        source: pod_network::NetnsError,
    },
    /// A CNI plugin failed.
    #[error("CNI {operation} for pod {uid}")]
    Cni {
        operation: &'static str,
        uid: String,
        #[source]
        source: pod_network::CniError,
    },
    /// The directory of the namespaces could not be created.
    #[error("creating {}", path.display())]
    StateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The pod's network record could not be written.
    #[error("recording the network of pod {uid} in {}", path.display())]
    Record {
        uid: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// What the node knows of one pod's network, in `<pod dir>/network.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkRecord {
    /// The pod's network namespace.
    pub netns: PathBuf,
    /// The pod's addresses, IPv4 first (`status.podIPs`).
    pub ips: Vec<IpAddr>,
    /// The hostPorts given to ADD (DEL needs the same).
    #[serde(default)]
    pub port_mappings: Vec<PortMapping>,
    /// DEL ran and the namespace is gone; the addresses are kept for the status.
    #[serde(default)]
    pub released: bool,
    /// The MAC of the pod's interface, as the result of ADD names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

impl NetworkRecord {
    /// The pod's primary IP (`status.podIP`).
    pub fn pod_ip(&self) -> Option<String> {
        self.ips.first().map(ToString::to_string)
    }
}

/// The node's pod network.
#[derive(Debug, Clone)]
pub struct PodNetworks {
    cni: CniNetwork,
    netns_dir: PathBuf,
}

/// The hostPorts of a pod's containers as `portmap` mappings.
pub fn port_mappings(pod: &Pod) -> Vec<PortMapping> {
    let containers = pod.spec.iter().flat_map(|s| s.containers.iter());
    containers
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let host_port = u16::try_from(p.host_port?).ok().filter(|p| *p > 0)?;
            Some(PortMapping {
                host_port,
                container_port: u16::try_from(p.container_port).ok()?,
                protocol: match p.protocol.as_deref() {
                    Some("UDP") => Protocol::Udp,
                    Some("SCTP") => Protocol::Sctp,
                    _ => Protocol::Tcp,
                },
                host_ip: p.host_ip.as_deref().and_then(|ip| ip.parse().ok()),
            })
        })
        .collect()
}

/// Whether the pod shares the node's network namespace (`spec.hostNetwork`).
pub fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// The pod's network record, if it has one.
pub fn read_record(pod_dir: &Path) -> Option<NetworkRecord> {
    process::read_json(&pod_dir.join(NETWORK_RECORD_FILE))
}

impl PodNetworks {
    /// The pod network of a node on `bridge` with `pod_cidr`, its state below `data_dir`
    /// (`netns/`, `cni/networks/`, `cni/results/`), the plugins in `plugin_dir`.
    pub fn new(config: &crate::PodNetworkConfig, data_dir: &Path) -> Self {
        let mut cni = CniNetwork::new(NETWORK_NAME, &config.bridge, config.pod_cidr);
        cni.plugin_dir.clone_from(&config.plugin_dir);
        cni.ipam_data_dir = data_dir.join("cni").join("networks");
        cni.result_cache_dir = data_dir.join("cni").join("results");
        Self {
            cni,
            netns_dir: data_dir.join("netns"),
        }
    }

    /// `<data dir>/netns/<uid>`.
    pub fn netns_path(&self, uid: &str) -> PathBuf {
        self.netns_dir.join(uid)
    }

    /// The CNI network (bridge, CIDR, directories).
    pub fn cni(&self) -> &CniNetwork {
        &self.cni
    }

    /// The pod's network, made when it has none yet (blocking; see the module documentation).
    pub fn set_up(
        &self,
        uid: &str,
        pod_dir: &Path,
        port_mappings: &[PortMapping],
    ) -> Result<NetworkRecord, NetworkError> {
        let netns = self.netns_path(uid);
        let record = read_record(pod_dir);
        if let Some(record) = record.as_ref().filter(|r| !r.released)
            && NetworkNamespace::open_path(&netns).is_ok()
        {
            return Ok(record.clone());
        }
        if record.is_some() || netns.exists() {
            // Left over from an earlier, interrupted attempt (or a reboot).
            self.tear_down(uid, pod_dir)?;
        }
        let namespace_error = |source| NetworkError::Namespace {
            uid: uid.to_owned(),
            source,
        };
        let started = Instant::now();
        private_fs::create_dir_all(&self.netns_dir).map_err(|source| NetworkError::StateDir {
            path: self.netns_dir.clone(),
            source,
        })?;
        let namespace =
            NetworkNamespace::create_in(&self.netns_dir, uid).map_err(namespace_error)?;
        let added = self
            .cni
            .add(uid, namespace.path(), POD_INTERFACE, port_mappings);
        let addresses = match added {
            Ok(addresses) => addresses,
            Err(source) => {
                let _ = namespace.delete();
                return Err(NetworkError::Cni {
                    operation: "ADD",
                    uid: uid.to_owned(),
                    source,
                });
            }
        };
        let record = NetworkRecord {
            netns: namespace.path().to_path_buf(),
            ips: [addresses.ipv4, addresses.ipv6]
                .into_iter()
                .flatten()
                .map(|ip| ip.address)
                .collect(),
            port_mappings: port_mappings.to_vec(),
            released: false,
            mac: addresses
                .interfaces
                .iter()
                .find(|i| i.name == POD_INTERFACE && i.sandbox.is_some())
                .and_then(|i| i.mac.clone()),
        };
        let path = pod_dir.join(NETWORK_RECORD_FILE);
        if let Err(source) = process::write_json(&path, &record) {
            let _ = self
                .cni
                .del(uid, namespace.path(), POD_INTERFACE, port_mappings);
            let _ = namespace.delete();
            return Err(NetworkError::Record {
                uid: uid.to_owned(),
                path,
                source,
            });
        }
        tracing::debug!(
            uid,
            ips = ?record.ips,
            elapsed_ms = started.elapsed().as_millis(),
            "pod network set up (netns + CNI ADD)"
        );
        Ok(record)
    }

    /// Releases the pod's network: DEL, then the namespace; marks the record released
    /// (blocking, idempotent).
    pub fn tear_down(&self, uid: &str, pod_dir: &Path) -> Result<(), NetworkError> {
        let netns = self.netns_path(uid);
        let record = read_record(pod_dir);
        if record.as_ref().is_some_and(|r| r.released) || (record.is_none() && !netns.exists()) {
            return Ok(());
        }
        self.detach_all(uid, pod_dir)?;
        let ports = record
            .as_ref()
            .map(|r| r.port_mappings.clone())
            .unwrap_or_default();
        self.cni
            .del(uid, &netns, POD_INTERFACE, &ports)
            .map_err(|source| NetworkError::Cni {
                operation: "DEL",
                uid: uid.to_owned(),
                source,
            })?;
        pod_network::delete_path(&netns).map_err(|source| NetworkError::Namespace {
            uid: uid.to_owned(),
            source,
        })?;
        if let Some(mut record) = record {
            record.released = true;
            let path = pod_dir.join(NETWORK_RECORD_FILE);
            process::write_json(&path, &record).map_err(|source| NetworkError::Record {
                uid: uid.to_owned(),
                path,
                source,
            })?;
        }
        tracing::debug!(uid, "pod network torn down (CNI DEL + netns)");
        Ok(())
    }
}

impl PodNetworks {
    /// The secondary network `text` (a definition's `spec.config`) as this node runs it:
    /// plugins, IPAM reservations and results in the pod network's directories.
    pub fn attachment(
        &self,
        text: &str,
        default_name: &str,
    ) -> Result<pod_network::Attachment, pod_network::AttachmentConfigError> {
        pod_network::Attachment::parse(
            text,
            default_name,
            &self.cni.ipam_data_dir,
            &self.cni.plugin_dir,
            &self.cni.result_cache_dir,
        )
    }

    /// Attaches `attachment` to the pod's namespace as `interface`, recording it first in
    /// the pod's secondary-network record (blocking). On a failure nothing stays recorded.
    pub fn attach(
        &self,
        uid: &str,
        pod_dir: &Path,
        attachment: &pod_network::Attachment,
        mut attached: super::multus::Attached,
    ) -> Result<super::multus::Attached, NetworkError> {
        let record_error = |source| NetworkError::Record {
            uid: uid.to_owned(),
            path: pod_dir.join(super::multus::SECONDARY_RECORD_FILE),
            source,
        };
        let mut record = super::multus::read_record(pod_dir);
        record.attachments.push(attached.clone());
        super::multus::write_record(pod_dir, &record).map_err(record_error)?;
        let netns = self.netns_path(uid);
        let added = attachment.add(uid, &netns, &attached.interface, &attached.cni_args);
        record.attachments.pop();
        match added {
            Ok(status) => {
                attached.status = status;
                record.attachments.push(attached.clone());
                super::multus::write_record(pod_dir, &record).map_err(record_error)?;
                Ok(attached)
            }
            Err(source) => {
                let _ = super::multus::write_record(pod_dir, &record);
                Err(NetworkError::Cni {
                    operation: "ADD",
                    uid: uid.to_owned(),
                    source,
                })
            }
        }
    }

    /// Detaches the recorded attachment of `interface` from the pod (blocking, idempotent);
    /// it leaves the record once DEL succeeded.
    pub fn detach(&self, uid: &str, pod_dir: &Path, interface: &str) -> Result<(), NetworkError> {
        let mut record = super::multus::read_record(pod_dir);
        let Some(position) = record
            .attachments
            .iter()
            .position(|a| a.interface == interface)
        else {
            return Ok(());
        };
        let attached = &record.attachments[position];
        let attachment = pod_network::Attachment {
            name: attached.cni_name.clone(),
            config_list: attached.config_list.clone(),
            plugin_dir: self.cni.plugin_dir.clone(),
            result_cache_dir: self.cni.result_cache_dir.clone(),
        };
        attachment
            .del(uid, &self.netns_path(uid), interface, &attached.cni_args)
            .map_err(|source| NetworkError::Cni {
                operation: "DEL",
                uid: uid.to_owned(),
                source,
            })?;
        record.attachments.remove(position);
        let path = pod_dir.join(super::multus::SECONDARY_RECORD_FILE);
        super::multus::write_record(pod_dir, &record).map_err(|source| NetworkError::Record {
            uid: uid.to_owned(),
            path,
            source,
        })
    }

    /// Detaches every secondary network of the pod, last attached first.
    fn detach_all(&self, uid: &str, pod_dir: &Path) -> Result<(), NetworkError> {
        let record = super::multus::read_record(pod_dir);
        for attached in record.attachments.iter().rev() {
            self.detach(uid, pod_dir, &attached.interface)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn host_ports_become_port_mappings_and_plain_ports_do_not() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [
                {"name": "a", "ports": [
                    {"containerPort": 80, "hostPort": 8080},
                    {"containerPort": 53, "hostPort": 5353, "protocol": "UDP", "hostIP": "127.0.0.1"},
                    {"containerPort": 9000},
                ]},
                {"name": "b", "ports": [{"containerPort": 443, "hostPort": 8443, "protocol": "TCP"}]},
            ]},
        }))
        .expect("pod");
        let mut udp = PortMapping::tcp(5353, 53);
        udp.protocol = Protocol::Udp;
        udp.host_ip = Some("127.0.0.1".parse().expect("ip"));
        assert_eq!(
            port_mappings(&pod),
            vec![PortMapping::tcp(8080, 80), udp, PortMapping::tcp(8443, 443)]
        );
        assert!(!host_network(&pod));
    }

    #[test]
    fn a_pod_without_a_network_is_torn_down_without_running_a_plugin() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut config =
            crate::PodNetworkConfig::new("10.245.0.0/24".parse().expect("cidr"), "kvrs-none");
        // No plugin could run from here: the tear-down must not try.
        config.plugin_dir = tmp.path().join("no-plugins");
        let networks = PodNetworks::new(&config, tmp.path());
        networks
            .tear_down("u1", &tmp.path().join("pods/u1"))
            .expect("nothing to tear down");
    }

    #[test]
    fn the_record_keeps_the_addresses_ipv4_first() {
        let record = NetworkRecord {
            netns: "/x".into(),
            ips: vec!["10.245.0.2".parse().expect("ip")],
            port_mappings: vec![],
            released: false,
            mac: None,
        };
        assert_eq!(record.pod_ip().as_deref(), Some("10.245.0.2"));
        let text = serde_json::to_value(&record).expect("json");
        assert_eq!(text["ips"], json!(["10.245.0.2"]));
    }
}
