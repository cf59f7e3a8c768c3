//! `kubevirt-rs images`: the local image store of the embedded mode.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use virt_handler::images::{ImportFile, import};

#[derive(Args)]
pub struct ImagesArgs {
    /// The server's data directory (the store is `DATA_DIR/images`).
    #[arg(long, global = true, default_value = ".")]
    pub data_dir: PathBuf,
    #[command(subcommand)]
    pub command: ImagesCommand,
}

#[derive(Subcommand)]
pub enum ImagesCommand {
    /// Copy files into an image: `kubevirt-rs images import kubevirt-rs/test-guest:latest vmlinux initramfs.cpio.gz`.
    Import {
        /// Image name as used in `containerDisk.image` / `kernelBoot.container.image`.
        name: String,
        /// Files to copy; each lands at `/<basename>` (or below `--to`).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Directory inside the image, e.g. `/disk/` for container disks.
        #[arg(long)]
        to: Option<String>,
    },
    /// Register a build of kubevirt-rs as release TAG: every project image
    /// (`kubevirt-rs/virt-operator:TAG` … `kubevirt-rs/virt-launcher:TAG`) then runs that binary
    /// (and the `virt-launcher` built beside it) on the embedded nodes, so patching the
    /// KubeVirt CR's `imageTag` to TAG upgrades to it.
    ImportRelease {
        /// The release's image tag.
        tag: String,
        /// The kubevirt-rs binary of that release.
        binary: PathBuf,
    },
}

pub fn run(args: ImagesArgs) -> anyhow::Result<()> {
    match args.command {
        ImagesCommand::Import { name, files, to } => {
            let dir = to.map(|d| if d.ends_with('/') { d } else { format!("{d}/") });
            let files: Vec<ImportFile> = files
                .into_iter()
                .map(|source| ImportFile {
                    source,
                    destination: dir.clone(),
                })
                .collect();
            let path = import(&args.data_dir, &name, &files)?;
            println!(
                "imported {} file(s) into {name} ({})",
                files.len(),
                path.display()
            );
        }
        ImagesCommand::ImportRelease { tag, binary } => {
            // A release is a build: the launcher image's binary comes from beside the given
            // one (a build that has none gives launcher pods only what its binary holds).
            let launcher = binary.with_file_name(kubevirt_api::constants::LAUNCHER_PROGRAM);
            let mut binaries = vec![binary.as_path()];
            if launcher.is_file() {
                binaries.push(launcher.as_path());
            }
            let path = kubevirt_node::images::import_release(
                &crate::cmd_server::releases_dir(&args.data_dir),
                &tag,
                &binaries,
            )?;
            println!("imported release {tag} ({})", path.display());
        }
    }
    Ok(())
}
