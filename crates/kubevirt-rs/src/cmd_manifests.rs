//! `kubevirt-rs manifests`: KubeVirt's install manifests (crates/install: the operator's
//! manifest and the CR) as one multi-document YAML stream, or as the files of `deploy/` with
//! `--output-dir`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

#[derive(Args)]
pub struct ManifestsArgs {
    /// Namespace of the components and the KubeVirt CR.
    #[arg(long, default_value = "kubevirt")]
    pub namespace: String,
    /// Registry (with any path) of the images; empty for none.
    #[arg(long, default_value = "kubevirt-rs")]
    pub image_registry: String,
    /// Prefix of the image names.
    #[arg(long, default_value = "")]
    pub image_prefix: String,
    /// Tag of the images (default: this binary's version).
    #[arg(long)]
    pub image_tag: Option<String>,
    /// Pull policy of the containers.
    #[arg(long, default_value = "IfNotPresent")]
    pub image_pull_policy: String,
    /// Image of launcher pods (default: virt-launcher of the registry, prefix and tag).
    #[arg(long)]
    pub launcher_image: Option<String>,
    /// Write one file per group and kustomization.yaml into this directory instead.
    #[arg(long)]
    pub output_dir: Option<PathBuf>,
}

pub fn run(args: ManifestsArgs) -> anyhow::Result<()> {
    let defaults = kubevirt_install::InstallConfig::default();
    let config = kubevirt_install::InstallConfig {
        namespace: args.namespace,
        image_registry: args.image_registry,
        image_prefix: args.image_prefix,
        image_tag: args.image_tag.unwrap_or(defaults.image_tag.clone()),
        image_pull_policy: args.image_pull_policy,
        launcher_image: args.launcher_image,
        ..defaults
    };
    let groups = kubevirt_install::deploy_files(&config).context("generating the manifests")?;
    let Some(dir) = args.output_dir else {
        let objects: Vec<_> = groups.into_iter().flat_map(|g| g.objects).collect();
        print!("{}", kubevirt_install::render_yaml(&objects)?);
        return Ok(());
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for group in &groups {
        let path = dir.join(group.file);
        std::fs::write(&path, kubevirt_install::render_file(group)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let path = dir.join("kustomization.yaml");
    std::fs::write(&path, kubevirt_install::kustomization_yaml(&groups))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
