//! `virtctl`: the KubeVirt command-line client.
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "virtctl", about = "Control KubeVirt virtual machines", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the client version.
    Version,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Version => {
            println!(
                "Client Version: version.Info{{GitVersion:\"v{}\", GoVersion:\"n/a\", Compiler:\"rustc\", Platform:\"{}/{}\"}}",
                env!("CARGO_PKG_VERSION"),
                std::env::consts::OS,
                std::env::consts::ARCH
            );
        }
    }
    Ok(())
}
