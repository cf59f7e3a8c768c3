//! Secondary networks of a pod, as Multus gives them: the node agent plays Multus.
//!
//! Data flow: a pod's `k8s.v1.cni.cncf.io/networks` annotation names NetworkAttachmentDefinitions
//! ([`parse_networks`]: the comma list `[namespace/]name[@interface]` or Multus' JSON list
//! form). For each one the node agent reads the definition (`spec.config`, a CNI
//! configuration), runs it as an extra interface in the pod's network namespace
//! ([`pod_network::Attachment`]) and keeps what it attached in `<pod dir>/secondary-networks.json`
//! ([`SecondaryRecord`], with the configuration it ran, so a removal runs the same plugins
//! whatever happened to the definition). It then writes `k8s.v1.cni.cncf.io/network-status`
//! ([`network_status`]): the pod network first (`default: true`), then each attachment.
//!
//! The annotation is followed for the pod's whole life, as Multus' dynamic networks
//! controller does: an entry added to a running pod's annotation is attached to its namespace,
//! an entry removed is detached ([`plan`]), and the status follows.
//!
//! # Guarantees
//! - An interface is in the record before the status names it, and leaves the record only
//!   after its DEL succeeded: a node agent restarted at any point detaches what it attached.
//! - Interfaces are matched by (network, interface name): changing only the MAC of an entry
//!   does not re-attach it.
//!
//! # Caveats
//! - A definition is read when its interface is attached; a later change of its `spec.config`
//!   reaches pods only through a new attachment.
//! - Multus' `ips`, `default-route`, `portMappings` and `bandwidth` selection fields are not
//!   supported and are ignored.

use std::collections::BTreeSet;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::process;

/// The pod annotation listing the secondary networks it wants.
pub const NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";
/// The pod annotation reporting the networks it has.
pub const NETWORK_STATUS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/network-status";
/// The file in a pod directory that records its secondary networks.
pub const SECONDARY_RECORD_FILE: &str = "secondary-networks.json";

/// The API group of NetworkAttachmentDefinitions.
pub const NAD_GROUP: &str = "k8s.cni.cncf.io";
/// The API version of NetworkAttachmentDefinitions.
pub const NAD_VERSION: &str = "v1";
/// The kind.
pub const NAD_KIND: &str = "NetworkAttachmentDefinition";
/// The resource (plural).
pub const NAD_PLURAL: &str = "network-attachment-definitions";

/// One network a pod asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkSelection {
    /// The definition's namespace (the pod's when not given).
    pub namespace: String,
    /// The definition's name.
    pub name: String,
    /// The interface in the pod (`net1`, `net2`, … by position when not given).
    pub interface: String,
    /// The MAC asked for, if any (passed on to the plugins as `MAC` in `CNI_ARGS`).
    pub mac: Option<String>,
}

impl NetworkSelection {
    /// `namespace/name`, as `network-status` names it.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Multus' JSON form of one selection (the fields this node supports).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JsonSelection {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    interface: Option<String>,
    #[serde(default)]
    mac: Option<String>,
}

/// A Kubernetes object name as a definition has one: a DNS subdomain.
fn is_object_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !s.starts_with(['-', '.'])
        && !s.ends_with(['-', '.'])
}

/// A Linux interface name the pod may ask for.
fn is_interface_name(s: &str) -> bool {
    (1..16).contains(&s.len())
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'/' | b':' | b',' | b';' | b'='))
}

fn is_mac(s: &str) -> bool {
    let parts: Vec<_> = s.split(':').collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Reads the networks annotation of a pod in `pod_namespace` (see the module docs).
///
/// # Errors
/// A message naming the entry that is malformed: not JSON where JSON was meant, a bad
/// namespace, name, interface or MAC, or an interface named twice (`eth0` is the pod
/// network's).
pub fn parse_networks(value: &str, pod_namespace: &str) -> Result<Vec<NetworkSelection>, String> {
    let value = value.trim();
    let raw: Vec<JsonSelection> = if value.starts_with('[') {
        serde_json::from_str(value).map_err(|e| format!("not a JSON list of networks: {e}"))?
    } else {
        value
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(|item| {
                let (path, interface) = match item.split_once('@') {
                    Some((path, iface)) => (path, Some(iface.to_owned())),
                    None => (item, None),
                };
                let (namespace, name) = match path.split_once('/') {
                    Some((ns, name)) => (Some(ns.to_owned()), name.to_owned()),
                    None => (None, path.to_owned()),
                };
                JsonSelection {
                    name,
                    namespace,
                    interface,
                    mac: None,
                }
            })
            .collect()
    };
    let mut interfaces = BTreeSet::from(["eth0".to_owned()]);
    let mut out = Vec::with_capacity(raw.len());
    for (index, entry) in raw.into_iter().enumerate() {
        let namespace = entry
            .namespace
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| pod_namespace.to_owned());
        if !is_object_name(&namespace) || namespace.contains('.') {
            return Err(format!("network {index}: {namespace:?} is not a namespace"));
        }
        if !is_object_name(&entry.name) {
            return Err(format!(
                "network {index}: {:?} is not a NetworkAttachmentDefinition name",
                entry.name
            ));
        }
        let interface = entry
            .interface
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| format!("net{}", index + 1));
        if !is_interface_name(&interface) {
            return Err(format!(
                "network {index}: {interface:?} is not an interface name"
            ));
        }
        if !interfaces.insert(interface.clone()) {
            return Err(format!(
                "network {index}: interface {interface:?} is used twice"
            ));
        }
        if let Some(mac) = entry.mac.as_deref().filter(|m| !is_mac(m)) {
            return Err(format!("network {index}: {mac:?} is not a MAC address"));
        }
        out.push(NetworkSelection {
            namespace,
            name: entry.name,
            interface,
            mac: entry.mac,
        });
    }
    Ok(out)
}

/// One secondary network attached to a pod.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attached {
    /// `namespace/name` of the definition.
    pub network: String,
    /// The interface in the pod.
    pub interface: String,
    /// The CNI network name the plugins were given.
    pub cni_name: String,
    /// The configuration list ADD ran (DEL runs it again).
    pub config_list: Value,
    /// The `CNI_ARGS` ADD got (DEL gets them again).
    #[serde(default)]
    pub cni_args: String,
    /// What ADD gave the interface.
    #[serde(default)]
    pub status: pod_network::AttachmentStatus,
}

/// What the node attached to one pod, in `<pod dir>/secondary-networks.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SecondaryRecord {
    /// The attachments, in the order they were made.
    #[serde(default)]
    pub attachments: Vec<Attached>,
}

/// The pod's secondary-network record (empty when it has none).
pub fn read_record(pod_dir: &Path) -> SecondaryRecord {
    process::read_json(&pod_dir.join(SECONDARY_RECORD_FILE)).unwrap_or_default()
}

/// Writes the pod's secondary-network record.
pub fn write_record(pod_dir: &Path, record: &SecondaryRecord) -> std::io::Result<()> {
    process::write_json(&pod_dir.join(SECONDARY_RECORD_FILE), record)
}

/// What to change: the selections to attach, and the attachments to detach.
pub fn plan<'a>(
    wanted: &'a [NetworkSelection],
    attached: &'a [Attached],
) -> (Vec<&'a NetworkSelection>, Vec<&'a Attached>) {
    let matches =
        |w: &NetworkSelection, a: &Attached| w.key() == a.network && w.interface == a.interface;
    let add = wanted
        .iter()
        .filter(|w| !attached.iter().any(|a| matches(w, a)))
        .collect();
    let remove = attached
        .iter()
        .filter(|a| !wanted.iter().any(|w| matches(w, a)))
        .collect();
    (add, remove)
}

/// The `CNI_ARGS` Multus gives the plugins of a pod's secondary network.
pub fn cni_args(namespace: &str, name: &str, uid: &str, mac: Option<&str>) -> String {
    let mut args = format!(
        "IgnoreUnknown=true;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID={uid};K8S_POD_UID={uid}"
    );
    if let Some(mac) = mac {
        args.push_str(&format!(";MAC={mac}"));
    }
    args
}

/// The `network-status` annotation: the pod network (`default: true`) on `eth0` with the
/// pod's addresses, then every attachment.
pub fn network_status(
    default_network: &str,
    pod_ips: &[std::net::IpAddr],
    pod_mac: Option<&str>,
    attached: &[Attached],
) -> String {
    let mut entries = Vec::with_capacity(attached.len() + 1);
    let mut primary = json!({
        "name": default_network,
        "interface": super::network::POD_INTERFACE,
        "ips": pod_ips.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "default": true,
        "dns": {},
    });
    if let Some(mac) = pod_mac {
        primary["mac"] = json!(mac);
    }
    entries.push(primary);
    for a in attached {
        let mut entry = json!({
            "name": a.network,
            "interface": a.interface,
            "ips": a.status.ips,
            "dns": {},
        });
        if let Some(mac) = &a.status.mac {
            entry["mac"] = json!(mac);
        }
        entries.push(entry);
    }
    Value::Array(entries).to_string()
}

/// The CNI configuration text of a NetworkAttachmentDefinition (`spec.config`).
///
/// # Errors
/// A message when it has none (Multus would then look for a file of that name on the node,
/// which this node does not do).
pub fn definition_config(definition: &Value) -> Result<&str, String> {
    definition["spec"]["config"]
        .as_str()
        .filter(|c| !c.trim().is_empty())
        .ok_or_else(|| "the NetworkAttachmentDefinition has no spec.config".to_owned())
}

/// Brings the pod's secondary networks to what its annotation asks for (see the module
/// docs): detaches what it no longer names, attaches what is new (reading each definition
/// from the API), and returns the `network-status` value for the pod network record
/// `primary` and what is attached now. Every change is tried; the first failure is returned
/// along with the status of what did work.
pub(super) async fn sync(
    client: &kube::Client,
    networks: &super::network::PodNetworks,
    pod: &k8s_openapi::api::core::v1::Pod,
    pod_dir: &Path,
    primary: &super::network::NetworkRecord,
) -> (String, Result<(), String>) {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let annotation = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NETWORKS_ANNOTATION));
    let wanted = match annotation.map(|v| parse_networks(v, &namespace)) {
        None => Ok(Vec::new()),
        Some(parsed) => {
            parsed.map_err(|e| format!("invalid {NETWORKS_ANNOTATION} annotation: {e}"))
        }
    };
    let record = read_record(pod_dir);
    let mut outcome = Ok(());
    if let Ok(wanted) = &wanted {
        let (add, remove) = plan(wanted, &record.attachments);
        for gone in remove {
            let (networks, uid, dir, iface) = (
                networks.clone(),
                uid.clone(),
                pod_dir.to_path_buf(),
                gone.interface.clone(),
            );
            let detached =
                tokio::task::spawn_blocking(move || networks.detach(&uid, &dir, &iface)).await;
            let result = match detached {
                Ok(result) => result.map_err(|e| super::error_chain(&e)),
                Err(e) => Err(e.to_string()),
            };
            if let Err(e) = result {
                tracing::warn!(pod = %format!("{namespace}/{name}"), network = %gone.network, error = %e, "detaching a secondary network failed");
                outcome = outcome.and(Err(format!("detaching network {}: {e}", gone.network)));
            } else {
                tracing::info!(pod = %format!("{namespace}/{name}"), network = %gone.network, interface = %gone.interface, "secondary network detached");
            }
        }
        for selection in add {
            let args = cni_args(&namespace, &name, &uid, selection.mac.as_deref());
            if let Err(e) = attach_one(client, networks, &uid, pod_dir, selection, args).await {
                tracing::warn!(pod = %format!("{namespace}/{name}"), network = %selection.key(), error = %e, "attaching a secondary network failed");
                outcome = outcome.and(Err(format!("attaching network {}: {e}", selection.key())));
            } else {
                tracing::info!(pod = %format!("{namespace}/{name}"), network = %selection.key(), interface = %selection.interface, "secondary network attached");
            }
        }
    }
    let attached = read_record(pod_dir).attachments;
    let status = network_status(
        super::network::NETWORK_NAME,
        &primary.ips,
        primary.mac.as_deref(),
        &attached,
    );
    (status, wanted.map(|_| ()).and(outcome))
}

/// Reads the definition of `selection` and attaches it.
async fn attach_one(
    client: &kube::Client,
    networks: &super::network::PodNetworks,
    uid: &str,
    pod_dir: &Path,
    selection: &NetworkSelection,
    cni_args: String,
) -> Result<(), String> {
    let resource = kube::api::ApiResource {
        group: NAD_GROUP.into(),
        version: NAD_VERSION.into(),
        api_version: format!("{NAD_GROUP}/{NAD_VERSION}"),
        kind: NAD_KIND.into(),
        plural: NAD_PLURAL.into(),
    };
    let api: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(client.clone(), &selection.namespace, &resource);
    let definition = api.get(&selection.name).await.map_err(|e| {
        format!(
            "reading NetworkAttachmentDefinition {}: {e}",
            selection.key()
        )
    })?;
    let config = definition_config(&definition.data)?;
    let attachment = networks
        .attachment(config, &selection.key())
        .map_err(|e| e.to_string())?;
    let attached = Attached {
        network: selection.key(),
        interface: selection.interface.clone(),
        cni_name: attachment.name.clone(),
        config_list: attachment.config_list.clone(),
        cni_args,
        status: pod_network::AttachmentStatus::default(),
    };
    let (networks, uid, dir) = (networks.clone(), uid.to_owned(), pod_dir.to_path_buf());
    tokio::task::spawn_blocking(move || networks.attach(&uid, &dir, &attachment, attached))
        .await
        .map_err(|e| e.to_string())?
        .map(|_| ())
        .map_err(|e| super::error_chain(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selection(ns: &str, name: &str, iface: &str) -> NetworkSelection {
        NetworkSelection {
            namespace: ns.into(),
            name: name.into(),
            interface: iface.into(),
            mac: None,
        }
    }

    #[test]
    fn the_comma_form_takes_namespace_name_and_interface_with_ordinal_defaults() {
        assert_eq!(
            parse_networks(" blue, other/red@pod1234abcd567 ,green", "default").unwrap(),
            vec![
                selection("default", "blue", "net1"),
                selection("other", "red", "pod1234abcd567"),
                selection("default", "green", "net3"),
            ]
        );
        assert_eq!(parse_networks("", "default").unwrap(), vec![]);
    }

    #[test]
    fn the_json_form_is_what_kubevirt_writes() {
        let parsed = parse_networks(
            r#"[{"name":"blue","namespace":"vms","mac":"02:00:00:00:00:01","interface":"podabc"},{"name":"red"}]"#,
            "default",
        )
        .unwrap();
        assert_eq!(
            parsed[0],
            NetworkSelection {
                mac: Some("02:00:00:00:00:01".into()),
                ..selection("vms", "blue", "podabc")
            }
        );
        assert_eq!(parsed[1], selection("default", "red", "net2"));
        assert_eq!(parsed[0].key(), "vms/blue");
    }

    #[test]
    fn malformed_entries_are_refused_naming_the_entry() {
        for (value, needle) in [
            ("[{\"name\":", "not a JSON list"),
            ("Blue", "not a NetworkAttachmentDefinition name"),
            ("a/b/c", "not a NetworkAttachmentDefinition name"),
            ("x.y/blue", "not a namespace"),
            ("blue@eth0", "used twice"),
            ("blue@x,red@x", "used twice"),
            ("blue@averyveryverylongname", "not an interface name"),
            (r#"[{"name":"blue","mac":"zz"}]"#, "not a MAC address"),
        ] {
            let error = parse_networks(value, "default").unwrap_err();
            assert!(error.contains(needle), "{value}: {error}");
        }
    }

    #[test]
    fn the_plan_attaches_new_selections_and_detaches_dropped_ones() {
        let attached = |network: &str, iface: &str| Attached {
            network: network.into(),
            interface: iface.into(),
            cni_name: "n".into(),
            config_list: json!({}),
            cni_args: String::new(),
            status: pod_network::AttachmentStatus::default(),
        };
        let wanted = vec![
            selection("d", "blue", "net1"),
            selection("d", "red", "net2"),
        ];
        let have = vec![attached("d/blue", "net1"), attached("d/green", "net2")];
        let (add, remove) = plan(&wanted, &have);
        assert_eq!(add, vec![&wanted[1]]);
        assert_eq!(remove, vec![&have[1]]);
    }

    #[test]
    fn the_status_lists_the_pod_network_first_then_the_attachments() {
        let status = network_status(
            "pods",
            &["10.245.0.7".parse().unwrap()],
            Some("0a:58:0a:f5:00:07"),
            &[Attached {
                network: "default/blue".into(),
                interface: "net1".into(),
                cni_name: "blue".into(),
                config_list: json!({}),
                cni_args: String::new(),
                status: pod_network::AttachmentStatus {
                    mac: Some("aa:00:00:00:00:03".into()),
                    ips: vec!["192.168.50.7".into()],
                },
            }],
        );
        let status: Value = serde_json::from_str(&status).unwrap();
        assert_eq!(
            status,
            json!([
                {"name": "pods", "interface": "eth0", "ips": ["10.245.0.7"],
                 "mac": "0a:58:0a:f5:00:07", "default": true, "dns": {}},
                {"name": "default/blue", "interface": "net1", "ips": ["192.168.50.7"],
                 "mac": "aa:00:00:00:00:03", "dns": {}},
            ])
        );
        assert!(
            cni_args("d", "p", "u", Some("02:00:00:00:00:01")).ends_with(";MAC=02:00:00:00:00:01")
        );
    }

    #[test]
    fn a_definition_without_config_is_refused() {
        assert_eq!(
            definition_config(&json!({"spec": {"config": "{\"type\":\"bridge\"}"}})),
            Ok("{\"type\":\"bridge\"}")
        );
        assert!(definition_config(&json!({"spec": {}})).is_err());
    }
}
