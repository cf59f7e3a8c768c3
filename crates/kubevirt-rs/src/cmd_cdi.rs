//! `kubevirt-rs cdi-controller` and `kubevirt-rs cdi-importer`: the embedded server's minimal
//! CDI ([`kubevirt_cdi`]): the DataVolume controller (in-cluster configuration, its
//! Deployment in namespace `cdi`) and the importer of one DataVolume (its importer pod).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use tokio_util::sync::CancellationToken;

#[derive(Args)]
pub struct ControllerArgs {
    /// Kubeconfig (default: the in-cluster configuration, else `KUBECONFIG`).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Image of importer pods.
    #[arg(long, default_value_t = kubevirt_cdi::importer_image())]
    pub importer_image: String,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum SourceKind {
    Blank,
    Registry,
    Http,
}

#[derive(Args)]
pub struct ImporterArgs {
    /// The kind of source.
    #[arg(long)]
    pub source: SourceKind,
    /// The source's URL (registry and http).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// The size of a blank image.
    #[arg(long)]
    pub size_bytes: Option<u64>,
    /// The image to write.
    #[arg(long)]
    pub target: PathBuf,
    /// Directory with the source Secret's `accessKeyId` and `secretKey`.
    #[arg(long)]
    pub auth_dir: Option<PathBuf>,
}

pub fn run_controller(args: ControllerArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let client =
            crate::kube_config::client(args.kubeconfig.as_deref(), "cdi-controller").await?;
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        tokio::spawn(async move {
            crate::shutdown_signal().await;
            stop.cancel();
        });
        kubevirt_cdi::controller::run(client, args.importer_image, cancel).await;
        Ok(())
    })
}

pub fn run_importer(args: ImporterArgs) -> anyhow::Result<()> {
    let endpoint = || {
        args.endpoint
            .clone()
            .context("--endpoint is required for this source")
    };
    let source = match args.source {
        SourceKind::Blank => kubevirt_cdi::importer::Source::Blank {
            size: args
                .size_bytes
                .context("--size-bytes is required for a blank image")?,
        },
        SourceKind::Registry => kubevirt_cdi::importer::Source::Registry {
            endpoint: endpoint()?,
        },
        SourceKind::Http => kubevirt_cdi::importer::Source::Http {
            endpoint: endpoint()?,
        },
    };
    let config = kubevirt_cdi::importer::Config {
        source,
        target: args.target,
        auth_dir: args.auth_dir,
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    if let Err(e) = runtime.block_on(kubevirt_cdi::importer::run(&config)) {
        // The last line of the log is the DataVolume's message (as a termination message
        // with `FallbackToLogsOnError`): nothing may follow it.
        eprintln!("{e}");
        std::process::exit(1);
    }
    Ok(())
}
