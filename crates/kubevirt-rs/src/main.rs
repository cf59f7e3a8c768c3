//! `kubevirt-rs`: the multi-call binary (server, apiserver, api, controller, handler, crds, …).
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

mod cmd_api;
mod cmd_cdi;
mod cmd_controller;
mod cmd_handler;
mod cmd_hotplug_disk;
mod cmd_images;
mod cmd_manifests;
mod cmd_operator;
mod cmd_server;
mod kube_config;
mod lifecycle;

pub(crate) use lifecycle::shutdown_signal;

#[derive(Parser)]
#[command(name = "kubevirt-rs", about = "KubeVirt, in Rust", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the KubeVirt CustomResourceDefinitions as a multi-document YAML stream.
    Crds,
    /// Run everything on this machine: the embedded Kubernetes (API server, scheduler,
    /// controllers, node agents) and KubeVirt installed onto it from deploy/'s manifests
    /// (virt-api, virt-controller and virt-handler as pods).
    Server(cmd_server::ServerArgs),
    /// Run the embedded Kubernetes-compatible API server alone.
    Apiserver(ServerArgs),
    /// Run virt-api (admission webhooks and the subresource API on one HTTPS port) and
    /// register it.
    Api(cmd_api::ApiArgs),
    /// Run virt-controller (VM and VMI controllers behind the `virt-controller` Lease).
    Controller(cmd_controller::ControllerArgs),
    /// Run virt-operator: install KubeVirt for the KubeVirt CR of its namespace, keep it
    /// installed, report the CR's status and uninstall on its deletion (behind the
    /// `virt-operator` Lease).
    Operator(cmd_operator::OperatorArgs),
    /// Run virt-handler for this node.
    Handler(cmd_handler::HandlerArgs),
    /// Keep a hotplug attachment pod running (its `hotplug-disk` container) and let
    /// virt-handler find its mounts.
    HotplugDisk(cmd_hotplug_disk::HotplugDiskArgs),
    /// Print KubeVirt's install manifests (the files of `deploy/`) as multi-document YAML.
    Manifests(cmd_manifests::ManifestsArgs),
    /// Manage the local image store.
    Images(cmd_images::ImagesArgs),
    /// Run the embedded server's DataVolume controller (a minimal CDI).
    CdiController(cmd_cdi::ControllerArgs),
    /// Import one DataVolume's data into its claim (the CDI importer pod).
    CdiImporter(cmd_cdi::ImporterArgs),
}

#[derive(Args)]
struct ServerArgs {
    /// Directory for the database, certificates and kubeconfig files.
    #[arg(long)]
    data_dir: PathBuf,
    /// Address to listen on (port 0 picks a free port; see DATA_DIR/kubeconfig).
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
}

/// A Go-style duration of whole units (`90s`, `5m`, `1h30m`, `500ms`), for flags that
/// upstream's components take as durations.
pub(crate) fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let bad = || format!("invalid duration {text:?} (examples: 30s, 5m, 1h30m, 500ms)");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = std::time::Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let value: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let millis = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return Err(bad()),
        };
        let part = value.checked_mul(millis).ok_or_else(bad)?;
        total = total
            .checked_add(std::time::Duration::from_millis(part))
            .ok_or_else(bad)?;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

fn serve(args: ServerArgs, initial_objects: Vec<serde_json::Value>) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    runtime.block_on(async {
        let config = kubevirt_apiserver::Config {
            data_dir: args.data_dir,
            listen: args.listen,
            initial_objects,
        };
        kubevirt_apiserver::run(config, shutdown_signal())
            .await
            .context("API server")
    })
}

fn main() -> anyhow::Result<()> {
    lifecycle::init_logging();
    match Cli::parse().command {
        Command::Crds => print!("{}", kubevirt_api::crd::all_crds_yaml()?),
        Command::Server(args) => cmd_server::run(args)?,
        Command::Apiserver(args) => serve(args, Vec::new())?,
        Command::Api(args) => cmd_api::run(args)?,
        Command::Controller(args) => cmd_controller::run(args)?,
        Command::Handler(args) => cmd_handler::run(args)?,
        Command::Operator(args) => cmd_operator::run(args)?,
        Command::HotplugDisk(args) => cmd_hotplug_disk::run(&args)?,
        Command::Images(args) => cmd_images::run(args)?,
        Command::Manifests(args) => cmd_manifests::run(args)?,
        Command::CdiController(args) => cmd_cdi::run_controller(args)?,
        Command::CdiImporter(args) => cmd_cdi::run_importer(args)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn durations_parse_as_go_writes_them() {
        let d = super::parse_duration;
        assert_eq!(d("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(d("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(d("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(d("500ms"), Ok(Duration::from_millis(500)));
        for bad in ["", "10", "3d", "h", "-1s", "1.5h"] {
            assert!(d(bad).is_err(), "{bad}");
        }
    }
}
