//! `kubevirt-rs`: the multi-call binary (server, apiserver, crds, …).
use clap::{Parser, Subcommand};

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
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crds => print!("{}", kubevirt_api::crd::all_crds_yaml()?),
    }
    Ok(())
}
