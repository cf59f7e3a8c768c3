//! kube-proxy's role in the embedded Kubernetes: Services' cluster IPs reach their
//! endpoints. It knows nothing of KubeVirt; on a real cluster kube-proxy (or the cluster's
//! CNI) does this and this crate is not run.
//!
//! Data flow: watches all Services and EndpointSlices; after each change it computes the
//! rules ([`rules`]: one destination NAT per Service port with ready endpoints) and, when
//! they differ from what is installed, replaces the node's nftables table with them in one
//! `nft -f` transaction (the `nft` tool of Debian's `nftables`). Rules match only traffic
//! arriving on the node's pod-network interfaces ([`ProxyConfig::interfaces`]), so several
//! embedded servers on one machine do not take each other's traffic. An endpoint on the
//! host's loopback (the `kubernetes` Service names the API server at `127.0.0.1`) needs
//! `route_localnet` on those interfaces, which the proxy sets once they exist.
//!
//! # Guarantees
//! - The table is replaced atomically: a connection never sees half a ruleset.
//! - When [`run`] returns (cancelled), the table is gone.
//!
//! # Caveats
//! - IPv4 and `ClusterIP` only: no NodePorts, no session affinity, no traffic from the
//!   host itself (its processes reach endpoints directly).

pub mod rules;

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// How often a failed apply, or an interface that does not exist yet, is retried.
pub const RETRY_EVERY: Duration = Duration::from_millis(500);

/// The `nft` binary.
pub const NFT: &str = "nft";

/// How the proxy runs.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// The nftables table (family `ip`) this proxy owns; unique per node on a machine.
    pub table: String,
    /// The interfaces whose incoming traffic is proxied (the node's pod bridges).
    pub interfaces: Vec<String>,
}

/// Errors installing the rules.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// `nft` could not be run.
    #[error("running {NFT}")]
    Spawn(#[source] std::io::Error),
    /// `nft` refused the script.
    #[error("{NFT} refused the ruleset: {0}")]
    Refused(String),
    /// Setting `route_localnet` on an interface failed.
    #[error("setting {0:?}")]
    Sysctl(PathBuf, #[source] std::io::Error),
}

/// The table of the proxy whose traffic arrives on `interface` (a node's pod bridge).
pub fn table_name(interface: &str) -> String {
    format!("kubevirt-rs-{interface}")
}

/// Removes `table` (nothing to do when it does not exist), e.g. after its proxy was killed.
///
/// # Errors
/// As [`apply`].
pub fn remove_table(table: &str) -> Result<(), ProxyError> {
    apply(&rules::render_removal(table))
}

/// Runs `script` through `nft -f -` as one transaction.
///
/// # Errors
/// [`ProxyError::Spawn`] when `nft` cannot run, [`ProxyError::Refused`] with its message.
pub fn apply(script: &str) -> Result<(), ProxyError> {
    let mut child = Command::new(NFT)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(ProxyError::Spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(ProxyError::Spawn)?;
    }
    let out = child.wait_with_output().map_err(ProxyError::Spawn)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(ProxyError::Refused(
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ))
    }
}

/// Allows traffic arriving on `interface` to be NATed to loopback addresses. `Ok(false)`
/// when the interface does not exist (yet).
fn allow_loopback_targets(interface: &str) -> Result<bool, ProxyError> {
    let path = PathBuf::from(format!(
        "/proc/sys/net/ipv4/conf/{interface}/route_localnet"
    ));
    match std::fs::write(&path, b"1") {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(ProxyError::Sysctl(path, e)),
    }
}

/// Follows Services and EndpointSlices and keeps the node's table in step until `cancel`
/// fires, then removes the table.
pub async fn run(client: kube::Client, config: ProxyConfig, cancel: CancellationToken) {
    let (changed_tx, mut changed) = mpsc::channel::<()>(1);
    let (services, services_writer) = reflector::store::<Service>();
    let (slices, slices_writer) = reflector::store::<EndpointSlice>();
    let follow = |stream: futures::stream::BoxStream<'static, ()>| {
        let tx = changed_tx.clone();
        tokio::spawn(stream.for_each(move |()| {
            let tx = tx.clone();
            async move {
                let _ = tx.try_send(());
            }
        }))
    };
    let services_task = follow(
        watcher(
            kube::Api::<Service>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect(services_writer)
        .map(|_| ())
        .boxed(),
    );
    let slices_task = follow(
        watcher(
            kube::Api::<EndpointSlice>::all(client),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect(slices_writer)
        .map(|_| ())
        .boxed(),
    );
    let mut installed: Option<String> = None;
    // Interfaces that have `route_localnet` set, and whether the rules need it.
    let mut localnet_set: BTreeSet<String> = BTreeSet::new();
    let mut needs_localnet = false;
    let mut retry = tokio::time::interval(RETRY_EVERY);
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            Some(()) = changed.recv() => {}
            _ = retry.tick() => {
                let settled = installed.is_some()
                    && (!needs_localnet || localnet_set.len() == config.interfaces.len());
                if settled {
                    continue;
                }
            }
        }
        let service_list = services.state();
        let slice_list = slices.state();
        let slice_refs: Vec<&EndpointSlice> = slice_list.iter().map(|s| s.as_ref()).collect();
        let port_rules = rules::all_rules(service_list.iter().map(|s| s.as_ref()), &slice_refs);
        needs_localnet = port_rules
            .iter()
            .any(rules::PortRule::has_loopback_endpoint);
        if needs_localnet {
            for interface in &config.interfaces {
                if localnet_set.contains(interface) {
                    continue;
                }
                match allow_loopback_targets(interface) {
                    Ok(true) => {
                        localnet_set.insert(interface.clone());
                    }
                    Ok(false) => debug!(interface, "not there yet"),
                    Err(e) => warn!(error = %e, "service proxy"),
                }
            }
        }
        let script = rules::render(&config.table, &config.interfaces, &port_rules);
        if installed.as_deref() == Some(script.as_str()) {
            continue;
        }
        match apply(&script) {
            Ok(()) => {
                info!(table = %config.table, rules = port_rules.len(), "service rules installed");
                installed = Some(script);
            }
            Err(e) => {
                warn!(error = %e, "service proxy: will retry");
                installed = None;
            }
        }
    }
    services_task.abort();
    slices_task.abort();
    if let Err(e) = remove_table(&config.table) {
        warn!(table = %config.table, error = %e, "removing the service rules");
    }
}
