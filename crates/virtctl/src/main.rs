//! `virtctl`: the KubeVirt command-line client (thin main; the commands live in the library).

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = virtctl::Cli::parse();
    match virtctl::run(cli).await.map_err(anyhow::Error::from) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if let Some(virtctl::Error::Exited(code)) = e.downcast_ref::<virtctl::Error>() {
                // ssh and scp said what went wrong; their status is virtctl's.
                return ExitCode::from(u8::try_from(*code).unwrap_or(1));
            }
            eprintln!("Error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
