//! `kubevirt-rs-bench`: benchmarks that print figures (never timed tests). `scripts/bench.sh`
//! runs them and writes `docs/benchmarks.md`.

mod apiserver;
mod stats;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "kubevirt-rs-bench", about = "kubevirt-rs benchmarks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// API server: create throughput (1 and 16 clients), mutating latency, watch delivery latency.
    Apiserver {
        /// Objects created per measurement.
        #[arg(long, default_value_t = 4000)]
        objects: usize,
    },
}

fn main() -> anyhow::Result<()> {
    let _ = rustls_provider();
    let runtime = tokio::runtime::Runtime::new()?;
    match Cli::parse().command {
        Command::Apiserver { objects } => {
            let report = runtime.block_on(apiserver::run(objects))?;
            println!("{report}");
        }
    }
    Ok(())
}

/// kube-rs and the server both use ring; make it the process default.
fn rustls_provider() -> Result<(), std::sync::Arc<rustls::crypto::CryptoProvider>> {
    rustls::crypto::ring::default_provider().install_default()
}
