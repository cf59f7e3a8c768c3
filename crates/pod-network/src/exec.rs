//! Running the plugins of a [`CniNetwork`] by the CNI contract, and reading their results.
//!
//! For each plugin of the configuration list, in order for ADD and CHECK and in reverse for DEL,
//! the plugin program `<plugin_dir>/<type>` runs with `CNI_COMMAND`, `CNI_CONTAINERID`,
//! `CNI_NETNS`, `CNI_IFNAME`, `CNI_ARGS` and `CNI_PATH` added to this process's environment (the
//! plugins look up `iptables` on `PATH`) and its configuration on stdin: the plugin's entry
//! with the list's `name` and `cniVersion`, the previous plugin's result as `prevResult`, and
//! `runtimeConfig.portMappings` for a plugin whose `capabilities` ask for them. A plugin reports
//! failure with a non-zero exit and a JSON error `{code, msg, details}` on stdout.
//!
//! ADD's final result is cached under the network's result cache directory; DEL and CHECK give
//! it to the plugins as `prevResult`, as other CNI runtimes do, and DEL removes it.
//!
//! The calls block while the plugins run (typically tens of milliseconds); async callers run
//! them on a blocking thread.

use std::io::{self, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use serde::Deserialize;
use serde_json::{Value, json};

use crate::{CniNetwork, PortMapping};

/// A failed CNI operation.
#[derive(Debug, thiserror::Error)]
pub enum CniError {
    /// The configuration list has a plugin without a `type`.
    #[error("a plugin of network {network} has no type")]
    PluginType {
        /// The network.
        network: String,
    },
    /// The plugin program could not be started (not installed?).
    #[error("cannot run CNI plugin {plugin} from {}", dir.display())]
    PluginStart {
        /// The plugin's type.
        plugin: String,
        /// The plugin directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The plugin reported an error by the CNI contract.
    #[error(
        "CNI plugin {plugin} failed with code {code}: {msg}{}",
        details_suffix(details)
    )]
    Plugin {
        /// The plugin's type.
        plugin: String,
        /// The CNI error code (1–99 are the specification's, 100 and up the plugin's own).
        code: u32,
        /// The message.
        msg: String,
        /// Further details, possibly empty.
        details: String,
    },
    /// The plugin exited non-zero without a CNI error on stdout.
    #[error("CNI plugin {plugin} exited with {status}: {stderr}")]
    PluginExit {
        /// The plugin's type.
        plugin: String,
        /// How it exited.
        status: ExitStatus,
        /// What it wrote to stderr.
        stderr: String,
    },
    /// The plugin succeeded but its stdout is not a CNI result.
    #[error("CNI plugin {plugin} printed something that is not a result")]
    PluginOutput {
        /// The plugin's type.
        plugin: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The result of ADD gives the pod no address.
    #[error("the result of network {network} gives the pod no IP address")]
    NoAddress {
        /// The network.
        network: String,
    },
    /// CHECK needs the cached ADD result, and there is none.
    #[error("no cached result of ADD for container {container_id} on {ifname}")]
    NoCachedResult {
        /// The container.
        container_id: String,
        /// The interface.
        ifname: String,
    },
    /// The ADD result could not be written to or read from the cache.
    #[error("cannot use the CNI result cache {}", path.display())]
    ResultCache {
        /// The cache file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

fn details_suffix(details: &str) -> String {
    if details.is_empty() {
        String::new()
    } else {
        format!(" ({details})")
    }
}

/// A pod's addresses from the result of ADD.
#[derive(Debug, Clone, PartialEq)]
pub struct PodAddresses {
    /// The pod's IPv4 address, if it got one.
    pub ipv4: Option<PodIp>,
    /// The pod's IPv6 address, if it got one.
    pub ipv6: Option<PodIp>,
    /// The interfaces the plugins created: the pod's (with `sandbox`) and the host's veth end
    /// and bridge (without).
    pub interfaces: Vec<CniInterface>,
    /// The whole result as the last plugin printed it.
    pub result: Value,
}

/// One address of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodIp {
    /// The address.
    pub address: IpAddr,
    /// Its prefix length on the pod's interface.
    pub prefix_len: u8,
    /// The gateway of its network, if the result names one.
    pub gateway: Option<IpAddr>,
}

/// An interface of a CNI result.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct CniInterface {
    /// Its name.
    pub name: String,
    /// Its MAC address.
    #[serde(default)]
    pub mac: Option<String>,
    /// The network namespace it is in; `None` for the host's.
    #[serde(default)]
    pub sandbox: Option<String>,
}

#[derive(Deserialize)]
struct ResultIp {
    address: String,
    #[serde(default)]
    gateway: Option<IpAddr>,
    #[serde(default)]
    interface: Option<usize>,
}

#[derive(Deserialize)]
struct ResultBody {
    #[serde(default)]
    interfaces: Vec<CniInterface>,
    #[serde(default)]
    ips: Vec<ResultIp>,
}

#[derive(Deserialize)]
struct PluginError {
    code: u32,
    #[serde(default)]
    msg: String,
    #[serde(default)]
    details: String,
}

/// What every plugin of one operation gets.
pub(crate) struct Invocation<'a> {
    pub(crate) command: &'static str,
    pub(crate) container_id: &'a str,
    pub(crate) netns: &'a str,
    pub(crate) ifname: &'a str,
    pub(crate) port_mappings: &'a [PortMapping],
    /// `CNI_ARGS` (`K=V;…`), empty for none.
    pub(crate) cni_args: &'a str,
}

/// One configuration list with where its plugins and cached results are: what running the
/// plugins needs, for the node's pod network and for secondary networks alike.
pub(crate) struct Runner<'a> {
    pub(crate) name: &'a str,
    pub(crate) list: &'a Value,
    pub(crate) plugin_dir: &'a Path,
    pub(crate) result_cache_dir: &'a Path,
}

impl CniNetwork {
    fn runner<'a>(&'a self, list: &'a Value) -> Runner<'a> {
        Runner {
            name: &self.name,
            list,
            plugin_dir: &self.plugin_dir,
            result_cache_dir: &self.result_cache_dir,
        }
    }

    /// Attaches the pod's network namespace `netns` to the network: runs ADD through the
    /// configuration list and returns the pod's addresses. `port_mappings` are its hostPorts
    /// (ignored without `port_map`).
    ///
    /// When a plugin fails, the plugins are run with DEL (best effort) so nothing half-made
    /// stays behind, and the first error is returned.
    pub fn add(
        &self,
        container_id: &str,
        netns: &Path,
        ifname: &str,
        port_mappings: &[PortMapping],
    ) -> Result<PodAddresses, CniError> {
        let list = self.config_list();
        let runner = self.runner(&list);
        let netns_text = netns.to_string_lossy();
        let call = Invocation {
            command: "ADD",
            container_id,
            netns: &netns_text,
            ifname,
            port_mappings,
            cni_args: "",
        };
        let added = runner
            .run_chain(&call)
            .and_then(|result| self.addresses(ifname, result));
        let addresses = match added {
            Ok(addresses) => addresses,
            Err(error) => {
                tracing::warn!(network = %self.name, container_id, %error, "CNI ADD failed, undoing");
                let _ = self.del(container_id, netns, ifname, port_mappings);
                return Err(error);
            }
        };
        if let Err(error) = runner.cache(container_id, ifname, &addresses.result) {
            let _ = self.del(container_id, netns, ifname, port_mappings);
            return Err(error);
        }
        tracing::debug!(network = %self.name, container_id, ipv4 = ?addresses.ipv4, "CNI ADD");
        Ok(addresses)
    }

    /// Detaches the pod: runs DEL through the configuration list in reverse order, then drops the
    /// cached result. Give the same `port_mappings` as to ADD (`portmap` removes only the rules of
    /// the mappings it is told of).
    ///
    /// Idempotent, as CNI requires: deleting twice, after a failed ADD or after a reboot is not an
    /// error. When no namespace is mounted at `netns` any more (the file is gone, or it is the
    /// bare mount point a node agent killed between creating it and mounting on it leaves) the
    /// plugins get an empty `CNI_NETNS` and release what they hold outside it (reservations,
    /// rules); `bridge` would otherwise fail on the file's filesystem type for ever. Every plugin
    /// runs even if one fails; the first error is returned.
    pub fn del(
        &self,
        container_id: &str,
        netns: &Path,
        ifname: &str,
        port_mappings: &[PortMapping],
    ) -> Result<(), CniError> {
        let list = self.config_list();
        self.runner(&list)
            .del(container_id, netns, ifname, port_mappings, "")
    }

    /// Checks that the pod's network is still as ADD left it: runs CHECK through the list with
    /// the cached ADD result.
    ///
    /// Caveat: `portmap` 1.1.1 (Debian bookworm) fails CHECK for a pod with hostPorts and no
    /// IPv6 chain ("could not check ipv6 dnat"); without hostPorts it passes.
    pub fn check(
        &self,
        container_id: &str,
        netns: &Path,
        ifname: &str,
        port_mappings: &[PortMapping],
    ) -> Result<(), CniError> {
        let list = self.config_list();
        let runner = self.runner(&list);
        let path = runner.cache_path(container_id, ifname);
        let prev = read_cached(&path)?.ok_or_else(|| CniError::NoCachedResult {
            container_id: container_id.to_owned(),
            ifname: ifname.to_owned(),
        })?;
        let netns_text = netns.to_string_lossy();
        let call = Invocation {
            command: "CHECK",
            container_id,
            netns: &netns_text,
            ifname,
            port_mappings,
            cni_args: "",
        };
        for plugin in plugins(&list) {
            runner.invoke(plugin, &call, Some(&prev))?;
        }
        Ok(())
    }

    fn addresses(&self, ifname: &str, result: Value) -> Result<PodAddresses, CniError> {
        let body = ResultBody::deserialize(&result).map_err(|source| CniError::PluginOutput {
            plugin: "(result)".into(),
            source,
        })?;
        let pod_interface = body
            .interfaces
            .iter()
            .position(|i| i.name == ifname && i.sandbox.as_deref().is_some_and(|s| !s.is_empty()));
        let mut ipv4 = None;
        let mut ipv6 = None;
        // Prefer the addresses on the pod's interface; take any when the result does not say.
        let on_pod = |ip: &&ResultIp| pod_interface.is_none() || ip.interface == pod_interface;
        for ip in body.ips.iter().filter(on_pod) {
            let Some(parsed) = parse_ip(ip) else { continue };
            let slot = if parsed.address.is_ipv4() {
                &mut ipv4
            } else {
                &mut ipv6
            };
            slot.get_or_insert(parsed);
        }
        if ipv4.is_none() && ipv6.is_none() {
            return Err(CniError::NoAddress {
                network: self.name.clone(),
            });
        }
        Ok(PodAddresses {
            ipv4,
            ipv6,
            interfaces: body.interfaces,
            result,
        })
    }

    /// The cache file of one attachment ([`Runner::cache_path`]).
    #[cfg(test)]
    fn cache_path(&self, container_id: &str, ifname: &str) -> PathBuf {
        let list = Value::Null;
        self.runner(&list).cache_path(container_id, ifname)
    }
}

impl Runner<'_> {
    /// The list's `cniVersion`, the project's when it names none.
    fn version(&self) -> &str {
        self.list["cniVersion"]
            .as_str()
            .unwrap_or(crate::CNI_VERSION)
    }

    /// Runs DEL through the list in reverse order, then drops the cached result (see
    /// [`CniNetwork::del`]).
    pub(crate) fn del(
        &self,
        container_id: &str,
        netns: &Path,
        ifname: &str,
        port_mappings: &[PortMapping],
        cni_args: &str,
    ) -> Result<(), CniError> {
        let netns_text = if crate::NetworkNamespace::open_path(netns).is_ok() {
            netns.to_string_lossy()
        } else {
            "".into()
        };
        let call = Invocation {
            command: "DEL",
            container_id,
            netns: &netns_text,
            ifname,
            port_mappings,
            cni_args,
        };
        let path = self.cache_path(container_id, ifname);
        let prev = read_cached(&path)?;
        let mut first_error = None;
        for plugin in plugins(self.list).iter().rev() {
            if let Err(error) = self.invoke(plugin, &call, prev.as_ref()) {
                tracing::warn!(network = %self.name, container_id, %error, "CNI DEL failed");
                first_error.get_or_insert(error);
            }
        }
        if let Some(error) = first_error {
            return Err(error);
        }
        match std::fs::remove_file(&path) {
            Err(source) if source.kind() != io::ErrorKind::NotFound => {
                Err(CniError::ResultCache { path, source })
            }
            _ => Ok(()),
        }
    }

    /// Writes ADD's final result to the cache, for DEL and CHECK.
    pub(crate) fn cache(
        &self,
        container_id: &str,
        ifname: &str,
        result: &Value,
    ) -> Result<(), CniError> {
        let path = self.cache_path(container_id, ifname);
        std::fs::create_dir_all(self.result_cache_dir)
            .and_then(|()| std::fs::write(&path, result.to_string()))
            .map_err(|source| CniError::ResultCache { path, source })
    }

    /// Runs ADD through every plugin, each getting the previous one's result.
    pub(crate) fn run_chain(&self, call: &Invocation<'_>) -> Result<Value, CniError> {
        let mut prev = None;
        for plugin in plugins(self.list) {
            let result = self.invoke(plugin, call, prev.as_ref())?;
            prev = Some(result);
        }
        prev.ok_or_else(|| CniError::NoAddress {
            network: self.name.to_owned(),
        })
    }

    /// Runs one plugin; returns its parsed stdout (`null` when it printed nothing).
    fn invoke(
        &self,
        plugin: &Value,
        call: &Invocation<'_>,
        prev: Option<&Value>,
    ) -> Result<Value, CniError> {
        let kind = plugin["type"]
            .as_str()
            .filter(|k| !k.is_empty() && !k.contains(['/', '\0']) && *k != "." && *k != "..")
            .ok_or_else(|| CniError::PluginType {
                network: self.name.to_owned(),
            })?
            .to_owned();
        let stdin = plugin_config(plugin, self.name, self.version(), prev, call.port_mappings);
        let start_error = |source| CniError::PluginStart {
            plugin: kind.clone(),
            dir: self.plugin_dir.to_path_buf(),
            source,
        };
        let mut child = Command::new(self.plugin_dir.join(&kind))
            .env("CNI_COMMAND", call.command)
            .env("CNI_CONTAINERID", call.container_id)
            .env("CNI_NETNS", call.netns)
            .env("CNI_IFNAME", call.ifname)
            .env("CNI_ARGS", call.cni_args)
            .env("CNI_PATH", self.plugin_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(start_error)?;
        if let Some(mut input) = child.stdin.take() {
            // The configuration is far smaller than a pipe's buffer; a plugin that exits without
            // reading it (broken pipe) is judged by its exit status below.
            let _ = input.write_all(stdin.to_string().as_bytes());
        }
        let output = child.wait_with_output().map_err(start_error)?;
        tracing::trace!(plugin = %kind, command = call.command, status = %output.status, "CNI plugin ran");
        if !output.status.success() {
            return Err(plugin_failure(
                &kind,
                output.status,
                &output.stdout,
                &output.stderr,
            ));
        }
        if output.stdout.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&output.stdout).map_err(|source| CniError::PluginOutput {
            plugin: kind,
            source,
        })
    }

    /// The cache file of one attachment; the container ID and interface name are made safe for
    /// a file name.
    pub(crate) fn cache_path(&self, container_id: &str, ifname: &str) -> PathBuf {
        let safe = |s: &str| -> String {
            s.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                        c
                    } else {
                        '_'
                    }
                })
                .collect()
        };
        self.result_cache_dir.join(format!(
            "{}-{}-{}",
            safe(self.name),
            safe(container_id),
            safe(ifname)
        ))
    }
}

fn plugins(list: &Value) -> &[Value] {
    list["plugins"].as_array().map_or(&[], Vec::as_slice)
}

/// A plugin's stdin: its entry, plus the list's name and version, the previous result and the
/// runtime configuration it declared a capability for.
fn plugin_config(
    plugin: &Value,
    network: &str,
    version: &str,
    prev: Option<&Value>,
    port_mappings: &[PortMapping],
) -> Value {
    let mut config = plugin.clone();
    config["name"] = json!(network);
    config["cniVersion"] = json!(version);
    if let Some(prev) = prev.filter(|p| !p.is_null()) {
        config["prevResult"] = prev.clone();
    }
    if plugin["capabilities"]["portMappings"] == json!(true) {
        config["runtimeConfig"] = json!({ "portMappings": port_mappings });
    }
    config
}

fn plugin_failure(plugin: &str, status: ExitStatus, stdout: &[u8], stderr: &[u8]) -> CniError {
    match serde_json::from_slice::<PluginError>(stdout) {
        Ok(error) => CniError::Plugin {
            plugin: plugin.to_owned(),
            code: error.code,
            msg: error.msg,
            details: error.details,
        },
        Err(_) => CniError::PluginExit {
            plugin: plugin.to_owned(),
            status,
            stderr: String::from_utf8_lossy(stderr).trim().to_owned(),
        },
    }
}

fn parse_ip(ip: &ResultIp) -> Option<PodIp> {
    let (address, prefix_len) = ip.address.split_once('/')?;
    Some(PodIp {
        address: address.parse().ok()?,
        prefix_len: prefix_len.parse().ok()?,
        gateway: ip.gateway,
    })
}

fn read_cached(path: &Path) -> Result<Option<Value>, CniError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(serde_json::from_slice(&bytes).ok()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CniError::ResultCache {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn network() -> CniNetwork {
        CniNetwork::new("pods", "kvrs0", "10.244.0.0/24".parse().unwrap())
    }

    #[test]
    fn portmap_gets_the_mappings_and_the_previous_result() {
        let list = network().config_list();
        let prev = json!({ "cniVersion": "1.0.0", "ips": [] });
        let mappings = [PortMapping::tcp(8080, 80)];
        let config = plugin_config(&plugins(&list)[1], "pods", "1.0.0", Some(&prev), &mappings);
        assert_eq!(config["name"], "pods");
        assert_eq!(config["cniVersion"], "1.0.0");
        assert_eq!(config["prevResult"], prev);
        assert_eq!(
            config["runtimeConfig"]["portMappings"][0]["hostPort"],
            json!(8080)
        );
        let bridge = plugin_config(&plugins(&list)[0], "pods", "1.0.0", None, &mappings);
        assert!(bridge.get("prevResult").is_none() && bridge.get("runtimeConfig").is_none());
    }

    #[test]
    fn a_cni_error_on_stdout_becomes_a_typed_error() {
        let status = std::process::Command::new("false").status().unwrap();
        let error = plugin_failure(
            "bridge",
            status,
            br#"{"cniVersion":"1.0.0","code":11,"msg":"try again later","details":"busy"}"#,
            b"",
        );
        assert!(
            matches!(&error, CniError::Plugin { plugin, code: 11, msg, details }
                if plugin == "bridge" && msg == "try again later" && details == "busy"),
            "{error:?}"
        );
        assert_eq!(
            error.to_string(),
            "CNI plugin bridge failed with code 11: try again later (busy)"
        );
        let error = plugin_failure("bridge", status, b"garbage", b"oops\n");
        assert!(
            matches!(&error, CniError::PluginExit { stderr, .. } if stderr == "oops"),
            "{error:?}"
        );
    }

    #[test]
    fn the_pod_addresses_are_those_on_its_interface() {
        let result = json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                { "name": "kvrs0", "mac": "aa:00:00:00:00:01" },
                { "name": "veth1", "mac": "aa:00:00:00:00:02" },
                { "name": "eth0", "mac": "aa:00:00:00:00:03", "sandbox": "/run/netns/p" },
            ],
            "ips": [
                { "interface": 0, "address": "10.244.0.1/24" },
                { "interface": 2, "address": "10.244.0.5/24", "gateway": "10.244.0.1" },
                { "interface": 2, "address": "fd00::5/64" },
            ],
        });
        let addresses = network().addresses("eth0", result).unwrap();
        let ipv4 = addresses.ipv4.unwrap();
        assert_eq!(ipv4.address, "10.244.0.5".parse::<IpAddr>().unwrap());
        assert_eq!(ipv4.prefix_len, 24);
        assert_eq!(ipv4.gateway, Some("10.244.0.1".parse().unwrap()));
        assert_eq!(
            addresses.ipv6.unwrap().address,
            "fd00::5".parse::<IpAddr>().unwrap()
        );
        assert_eq!(addresses.interfaces.len(), 3);
    }

    #[test]
    fn a_result_without_addresses_is_an_error() {
        let result = json!({ "cniVersion": "1.0.0", "interfaces": [], "ips": [] });
        assert!(matches!(
            network().addresses("eth0", result),
            Err(CniError::NoAddress { .. })
        ));
    }

    #[test]
    fn cache_file_names_cannot_leave_the_cache_directory() {
        let path = network().cache_path("../../etc/x", "eth0");
        assert_eq!(
            path.parent().unwrap(),
            Path::new(crate::DEFAULT_RESULT_CACHE_DIR)
        );
    }
}
