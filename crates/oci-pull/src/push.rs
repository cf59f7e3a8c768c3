//! Files published as a one-layer OCI image: how a disk becomes a containerDisk in a registry
//! (the tests push their images with it; upstream users build them with a `FROM scratch`
//! Dockerfile that `ADD`s the disk under `/disk/`).

use std::io::Write;

use oci_client::client::{Config, ImageLayer};

use crate::{Credentials, ImageReference, PullError, client_for, registry_auth};

/// One file of the image: its path inside the image (`disk/disk.img`) and its content.
#[derive(Debug, Clone)]
pub struct ImageFile {
    /// Path inside the image, relative.
    pub path: String,
    /// The content.
    pub content: Vec<u8>,
}

/// Why a push failed.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    /// Building the layer failed.
    #[error("building the image layer")]
    Layer(#[source] std::io::Error),
    /// The registry client could not be set up.
    #[error(transparent)]
    Client(#[from] PullError),
    /// The registry refused the push.
    #[error("pushing {reference}")]
    Push {
        /// The image.
        reference: String,
        /// The registry client's error.
        #[source]
        source: oci_client::errors::OciDistributionError,
    },
}

/// A gzip-compressed tar of `files` (directories for their parents, owner-readable modes).
///
/// # Errors
/// [`PushError::Layer`].
pub fn gzip_layer(files: &[ImageFile]) -> Result<Vec<u8>, PushError> {
    let encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut builder = tar::Builder::new(encoder);
    let mut dirs = std::collections::BTreeSet::new();
    for file in files {
        let path = std::path::Path::new(&file.path);
        let mut parent = std::path::PathBuf::new();
        for component in path.parent().into_iter().flat_map(|p| p.components()) {
            parent.push(component);
            if dirs.insert(parent.clone()) {
                let mut header = tar::Header::new_gnu();
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(0o755);
                header.set_size(0);
                builder
                    .append_data(&mut header, &parent, std::io::empty())
                    .map_err(PushError::Layer)?;
            }
        }
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_size(file.content.len() as u64);
        builder
            .append_data(&mut header, path, file.content.as_slice())
            .map_err(PushError::Layer)?;
    }
    let mut encoder = builder.into_inner().map_err(PushError::Layer)?;
    encoder.flush().map_err(PushError::Layer)?;
    encoder.finish().map_err(PushError::Layer)
}

/// Pushes `files` as a one-layer (gzip) OCI image to `reference`; returns the manifest URL.
///
/// # Errors
/// [`PushError`].
pub async fn push_files(
    reference: &ImageReference,
    credentials: Option<&Credentials>,
    files: &[ImageFile],
) -> Result<String, PushError> {
    let layer = ImageLayer::oci_v1_gzip(gzip_layer(files)?, None);
    let config = Config::oci_v1(
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#
            .to_vec(),
        None,
    );
    let client = client_for(reference).map_err(PullError::Client)?;
    let response = client
        .push(
            &reference.to_client(),
            &[layer],
            config,
            &registry_auth(credentials),
            None,
        )
        .await
        .map_err(|source| PushError::Push {
            reference: reference.to_string(),
            source,
        })?;
    Ok(response.manifest_url)
}
