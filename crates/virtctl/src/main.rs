//! `virtctl`: the KubeVirt command-line client (thin main; the commands live in the library).

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = virtctl::Cli::parse();
    match virtctl::run(cli).await.map_err(anyhow::Error::from) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
