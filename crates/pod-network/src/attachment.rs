//! Secondary networks of a pod: any CNI configuration (a NetworkAttachmentDefinition's
//! `spec.config`), run as an extra interface in the pod's network namespace, as Multus does.
//!
//! Data flow: [`Attachment::parse`] takes the configuration text — a single plugin
//! configuration (with a `type`) or a configuration list (with `plugins`) — and normalises it
//! to a list; `host-local` IPAM without a `dataDir` gets the node's, so reservations stay with
//! the node's other state. [`Attachment::add`] runs ADD with the interface name the pod asked
//! for and returns what the result says of that interface ([`AttachmentStatus`]: MAC and
//! addresses, for Multus' `network-status`); [`Attachment::del`] runs DEL with the result ADD
//! cached. The caller keeps the normalised [`Attachment::config_list`] with the attachment, so
//! DEL runs the same plugins even when the definition changed or went meanwhile.
//!
//! Unlike the pod network an attachment needs no address: a `bridge` without IPAM is a plain
//! layer-2 link, the usual case for a VM's bridged secondary interface.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::CniError;
use crate::exec::{Invocation, Runner};

/// The configuration text is not a usable CNI configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachmentConfigError {
    /// Not JSON, or not an object.
    #[error("the CNI configuration is not a JSON object: {0}")]
    NotAnObject(String),
    /// Neither a `type` nor a non-empty `plugins` list.
    #[error("the CNI configuration has neither a plugin type nor a plugins list")]
    NoPlugins,
    /// A plugin entry without a plain `type`.
    #[error("plugin {index} of the CNI configuration has no usable type")]
    PluginType {
        /// Its position in the list.
        index: usize,
    },
}

/// One secondary network, ready to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Attachment {
    /// The network's name (the configuration's `name`, else the definition's).
    pub name: String,
    /// The normalised configuration list.
    pub config_list: Value,
    /// Where the plugin programs are.
    pub plugin_dir: PathBuf,
    /// Where ADD results are cached for DEL.
    pub result_cache_dir: PathBuf,
}

/// What ADD gave the pod's interface of an attachment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentStatus {
    /// The interface's MAC, if the result names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Its addresses without prefix, in the result's order.
    #[serde(default)]
    pub ips: Vec<String>,
}

impl Attachment {
    /// Reads a CNI configuration (see the module docs). `default_name` names a configuration
    /// without a `name`; `ipam_data_dir` is given to `host-local` IPAM without a `dataDir`.
    pub fn parse(
        text: &str,
        default_name: &str,
        ipam_data_dir: &Path,
        plugin_dir: &Path,
        result_cache_dir: &Path,
    ) -> Result<Self, AttachmentConfigError> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| AttachmentConfigError::NotAnObject(e.to_string()))?;
        let Value::Object(mut object) = value else {
            return Err(AttachmentConfigError::NotAnObject(
                "another JSON value".into(),
            ));
        };
        let name = object
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .unwrap_or(default_name)
            .to_owned();
        let version = object
            .get("cniVersion")
            .and_then(Value::as_str)
            .unwrap_or(crate::CNI_VERSION)
            .to_owned();
        let mut plugins = match object.remove("plugins") {
            Some(Value::Array(plugins)) if !plugins.is_empty() => plugins,
            Some(_) => return Err(AttachmentConfigError::NoPlugins),
            None if object.contains_key("type") => {
                object.remove("name");
                object.remove("cniVersion");
                vec![Value::Object(object)]
            }
            None => return Err(AttachmentConfigError::NoPlugins),
        };
        for (index, plugin) in plugins.iter_mut().enumerate() {
            let usable = plugin["type"].as_str().is_some_and(|t| {
                !t.is_empty() && !t.contains(['/', '\0']) && t != "." && t != ".."
            });
            if !usable {
                return Err(AttachmentConfigError::PluginType { index });
            }
            let ipam = &mut plugin["ipam"];
            if ipam["type"] == "host-local" && ipam.get("dataDir").is_none() {
                ipam["dataDir"] = json!(ipam_data_dir);
            }
        }
        Ok(Self {
            name: name.clone(),
            config_list: json!({"cniVersion": version, "name": name, "plugins": plugins}),
            plugin_dir: plugin_dir.to_path_buf(),
            result_cache_dir: result_cache_dir.to_path_buf(),
        })
    }

    fn runner(&self) -> Runner<'_> {
        Runner {
            name: &self.name,
            list: &self.config_list,
            plugin_dir: &self.plugin_dir,
            result_cache_dir: &self.result_cache_dir,
        }
    }

    /// Adds interface `ifname` in `netns` (container ID `container_id`, `cni_args` as
    /// `CNI_ARGS`). On a failure the plugins are run with DEL (best effort) and the first
    /// error is returned.
    pub fn add(
        &self,
        container_id: &str,
        netns: &Path,
        ifname: &str,
        cni_args: &str,
    ) -> Result<AttachmentStatus, CniError> {
        let runner = self.runner();
        let netns_text = netns.to_string_lossy();
        let call = Invocation {
            command: "ADD",
            container_id,
            netns: &netns_text,
            ifname,
            port_mappings: &[],
            cni_args,
        };
        let added = runner
            .run_chain(&call)
            .and_then(|result| runner.cache(container_id, ifname, &result).map(|()| result));
        match added {
            Ok(result) => {
                tracing::debug!(network = %self.name, container_id, ifname, "CNI ADD of a secondary network");
                Ok(status_of(&result, ifname))
            }
            Err(error) => {
                tracing::warn!(network = %self.name, container_id, %error, "CNI ADD failed, undoing");
                let _ = self.del(container_id, netns, ifname, cni_args);
                Err(error)
            }
        }
    }

    /// Removes interface `ifname` (idempotent, as [`crate::CniNetwork::del`]).
    pub fn del(
        &self,
        container_id: &str,
        netns: &Path,
        ifname: &str,
        cni_args: &str,
    ) -> Result<(), CniError> {
        self.runner()
            .del(container_id, netns, ifname, &[], cni_args)
    }
}

/// The MAC and addresses a CNI result gives the sandbox interface `ifname`.
pub fn status_of(result: &Value, ifname: &str) -> AttachmentStatus {
    let interfaces = result["interfaces"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let index = interfaces
        .iter()
        .position(|i| i["name"] == ifname && i["sandbox"].as_str().is_some_and(|s| !s.is_empty()));
    let mac = index
        .and_then(|i| interfaces[i]["mac"].as_str())
        .map(str::to_owned);
    let ips = result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|ip| index.is_none() || ip["interface"].as_u64() == index.map(|i| i as u64))
        .filter_map(|ip| ip["address"].as_str()?.split('/').next().map(str::to_owned))
        .collect();
    AttachmentStatus { mac, ips }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Attachment, AttachmentConfigError> {
        Attachment::parse(
            text,
            "default/blue",
            Path::new("/data/ipam"),
            Path::new("/plugins"),
            Path::new("/cache"),
        )
    }

    #[test]
    fn a_single_plugin_configuration_becomes_a_list_with_the_nodes_ipam_directory() {
        let attachment = parse(
            r#"{"cniVersion":"0.3.1","name":"blue","type":"bridge","bridge":"br-blue",
                "ipam":{"type":"host-local","subnet":"192.168.50.0/24"}}"#,
        )
        .unwrap();
        assert_eq!(attachment.name, "blue");
        assert_eq!(
            attachment.config_list,
            json!({"cniVersion": "0.3.1", "name": "blue", "plugins": [{
                "type": "bridge", "bridge": "br-blue",
                "ipam": {"type": "host-local", "subnet": "192.168.50.0/24", "dataDir": "/data/ipam"},
            }]})
        );
    }

    #[test]
    fn a_list_keeps_its_plugins_and_an_unnamed_one_takes_the_definitions_name() {
        let attachment =
            parse(r#"{"plugins":[{"type":"bridge","bridge":"br1"},{"type":"tuning"}]}"#).unwrap();
        assert_eq!(attachment.name, "default/blue");
        assert_eq!(attachment.config_list["cniVersion"], crate::CNI_VERSION);
        assert_eq!(attachment.config_list["plugins"][1]["type"], "tuning");
        assert!(
            attachment.config_list["plugins"][0]
                .get("ipam")
                .is_none_or(Value::is_null)
        );
    }

    #[test]
    fn unusable_configurations_are_refused_with_the_reason() {
        assert!(matches!(
            parse("not json"),
            Err(AttachmentConfigError::NotAnObject(_))
        ));
        assert!(matches!(
            parse("[1]"),
            Err(AttachmentConfigError::NotAnObject(_))
        ));
        assert_eq!(
            parse(r#"{"name":"x"}"#),
            Err(AttachmentConfigError::NoPlugins)
        );
        assert_eq!(
            parse(r#"{"plugins":[]}"#),
            Err(AttachmentConfigError::NoPlugins)
        );
        assert_eq!(
            parse(r#"{"plugins":[{"type":"bridge"},{"type":"../../bin/sh"}]}"#),
            Err(AttachmentConfigError::PluginType { index: 1 })
        );
    }

    #[test]
    fn the_status_is_that_of_the_sandbox_interface() {
        let result = json!({
            "interfaces": [
                {"name": "br1", "mac": "aa:00:00:00:00:01"},
                {"name": "pod1234", "mac": "aa:00:00:00:00:03", "sandbox": "/run/netns/p"},
            ],
            "ips": [
                {"interface": 0, "address": "192.168.50.1/24"},
                {"interface": 1, "address": "192.168.50.7/24", "gateway": "192.168.50.1"},
            ],
        });
        assert_eq!(
            status_of(&result, "pod1234"),
            AttachmentStatus {
                mac: Some("aa:00:00:00:00:03".into()),
                ips: vec!["192.168.50.7".into()],
            }
        );
        assert_eq!(
            status_of(&json!({}), "pod1234"),
            AttachmentStatus::default()
        );
    }
}
