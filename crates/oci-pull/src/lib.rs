//! Container images from OCI registries, pulled into a blob cache and unpacked into a
//! directory: what a container runtime does for kubelet, for the one consumer that needs
//! an image's files rather than a container (virt-handler's containerDisks and
//! `kernelBoot.container`).
//!
//! Data flow: [`ImageReference::parse`] reads the name → [`Puller::pull`] fetches the manifest
//! (Docker v2 or OCI; from an index or manifest list the `linux/amd64` entry) with
//! `oci-client`, anonymously or with [`Credentials`] from a `.dockerconfigjson`
//! ([`auth::credentials_for`]) → every layer not yet in the [`BlobCache`] is downloaded,
//! its digest checked, and named by digest → [`unpack::unpack_layers`] applies the layers
//! into a temporary directory renamed onto the target.
//!
//! # Guarantees
//! - Plain HTTP only for loopback registries (`localhost`, `127.0.0.0/8`, `::1`), as
//!   container runtimes allow; TLS (rustls with the system's roots) for everything else.
//! - Every blob's content is checked against its digest before it is cached or used; a
//!   manifest pulled by digest is checked against that digest.
//! - The target is replaced whole or not at all (see [`unpack`]).
//!
//! # Caveats
//! - Layers compressed with zstd are refused; gzip and uncompressed tar are supported.
//! - With [`Puller::in_network_namespace`] the pull runs on a thread of its own inside that
//!   namespace (virt-handler pulls in the node's, as kubelet does, so a loopback registry is
//!   the node's loopback); when joining it fails the pull runs where the caller is.

pub mod auth;
pub mod cache;
pub mod push;
pub mod reference;
pub mod unpack;

use std::path::{Path, PathBuf};
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol, linux_amd64_resolver};
use oci_client::manifest::{
    IMAGE_DOCKER_LAYER_GZIP_MEDIA_TYPE, IMAGE_DOCKER_LAYER_TAR_MEDIA_TYPE,
    IMAGE_LAYER_GZIP_MEDIA_TYPE, IMAGE_LAYER_MEDIA_TYPE,
};
use oci_client::secrets::RegistryAuth;

pub use auth::{AuthError, Credentials};
pub use cache::{BlobCache, CacheError};
pub use reference::{ImageReference, ReferenceError};
pub use unpack::UnpackError;

/// How long connecting to a registry may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a registry may stay silent during a response.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a pull failed.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// The manifest could not be fetched (unknown image, unreachable registry, denied).
    #[error("fetching the manifest of {reference}")]
    Manifest {
        /// The image.
        reference: String,
        /// The registry client's error.
        #[source]
        source: oci_client::errors::OciDistributionError,
    },
    /// A layer could not be downloaded or did not match its digest.
    #[error("fetching layer {digest} of {reference}")]
    Blob {
        /// The image.
        reference: String,
        /// The layer's digest.
        digest: String,
        /// The registry client's error.
        #[source]
        source: oci_client::errors::OciDistributionError,
    },
    /// A layer has a media type that is not a (gzip) tar layer.
    #[error(
        "layer {digest} of {reference} has media type {media_type:?}, which is not a tar layer"
    )]
    LayerType {
        /// The image.
        reference: String,
        /// The layer's digest.
        digest: String,
        /// Its media type.
        media_type: String,
    },
    /// The registry client could not be set up.
    #[error("setting up the registry client")]
    Client(#[source] oci_client::errors::OciDistributionError),
    /// The blob cache refused or failed.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// Unpacking the layers failed.
    #[error(transparent)]
    Unpack(#[from] UnpackError),
    /// The pull's thread or task ended without a result.
    #[error("the pull task ended unexpectedly: {0}")]
    Task(String),
}

/// What a pull did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulled {
    /// The image manifest's digest (of the `linux/amd64` manifest for an index).
    pub digest: String,
    /// False when the target already held this digest and was left alone.
    pub unpacked: bool,
    /// Layers downloaded (the others came from the cache).
    pub downloaded_layers: usize,
}

/// Pulls images through one blob cache.
#[derive(Debug, Clone)]
pub struct Puller {
    cache: BlobCache,
    network_namespace: Option<PathBuf>,
}

/// One pull's inputs, owned (it may run on a thread of its own).
#[derive(Clone)]
struct Job {
    reference: ImageReference,
    credentials: Option<Credentials>,
    target: PathBuf,
    current_digest: Option<String>,
    cache: BlobCache,
}

impl Puller {
    /// A puller caching blobs in `cache_dir`.
    pub fn new(cache_dir: impl Into<PathBuf>) -> Puller {
        Puller {
            cache: BlobCache::new(cache_dir),
            network_namespace: None,
        }
    }

    /// Runs pulls inside the network namespace at `path` (`/proc/<pid>/ns/net`).
    #[must_use]
    pub fn in_network_namespace(mut self, path: impl Into<PathBuf>) -> Puller {
        self.network_namespace = Some(path.into());
        self
    }

    /// The blob cache.
    pub fn cache(&self) -> &BlobCache {
        &self.cache
    }

    /// Pulls `reference` into `target`. When the registry's manifest digest equals
    /// `current_digest` and `target` exists, nothing is downloaded or unpacked.
    ///
    /// # Errors
    /// [`PullError`].
    pub async fn pull(
        &self,
        reference: &ImageReference,
        credentials: Option<&Credentials>,
        target: &Path,
        current_digest: Option<&str>,
    ) -> Result<Pulled, PullError> {
        let job = Job {
            reference: reference.clone(),
            credentials: credentials.cloned(),
            target: target.to_owned(),
            current_digest: current_digest.map(str::to_owned),
            cache: self.cache.clone(),
        };
        let Some(namespace) = self.network_namespace.clone() else {
            return job.run().await;
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("oci-pull".into())
            .spawn(move || {
                if let Err(e) = join_network_namespace(&namespace) {
                    tracing::warn!(namespace = %namespace.display(), error = %e, "cannot join the network namespace to pull in; pulling in this one");
                }
                let result = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime.block_on(job.run()),
                    Err(e) => Err(PullError::Task(e.to_string())),
                };
                let _ = tx.send(result);
            });
        if let Err(e) = spawned {
            return Err(PullError::Task(e.to_string()));
        }
        rx.await
            .map_err(|_| PullError::Task("the pull thread ended".into()))?
    }
}

fn join_network_namespace(path: &Path) -> std::io::Result<()> {
    let file = std::fs::File::open(path)?;
    nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)
}

/// A registry client for `reference`: HTTP for loopback registries, HTTPS otherwise.
pub(crate) fn client_for(
    reference: &ImageReference,
) -> Result<oci_client::Client, oci_client::errors::OciDistributionError> {
    // reqwest is built without a default TLS provider: use ring, as every other TLS user of
    // the project (a provider installed earlier by the process is kept).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let protocol = if reference.is_loopback() {
        ClientProtocol::Http
    } else {
        ClientProtocol::Https
    };
    oci_client::Client::try_from(ClientConfig {
        protocol,
        platform_resolver: Some(Box::new(linux_amd64_resolver)),
        connect_timeout: Some(CONNECT_TIMEOUT),
        read_timeout: Some(READ_TIMEOUT),
        ..ClientConfig::default()
    })
}

pub(crate) fn registry_auth(credentials: Option<&Credentials>) -> RegistryAuth {
    match credentials {
        Some(c) => RegistryAuth::Basic(c.username.clone(), c.password.clone()),
        None => RegistryAuth::Anonymous,
    }
}

/// Removes a file when dropped (a no-op once it was renamed away).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

const LAYER_TYPES: &[&str] = &[
    IMAGE_LAYER_MEDIA_TYPE,
    IMAGE_LAYER_GZIP_MEDIA_TYPE,
    IMAGE_DOCKER_LAYER_TAR_MEDIA_TYPE,
    IMAGE_DOCKER_LAYER_GZIP_MEDIA_TYPE,
];

impl Job {
    async fn run(self) -> Result<Pulled, PullError> {
        let name = self.reference.to_string();
        let client = client_for(&self.reference).map_err(PullError::Client)?;
        let reference = self.reference.to_client();
        let auth = registry_auth(self.credentials.as_ref());
        let (manifest, digest) = client
            .pull_image_manifest(&reference, &auth)
            .await
            .map_err(|source| PullError::Manifest {
                reference: name.clone(),
                source,
            })?;
        if self.current_digest.as_deref() == Some(digest.as_str()) && self.target.is_dir() {
            return Ok(Pulled {
                digest,
                unpacked: false,
                downloaded_layers: 0,
            });
        }
        let mut layers = Vec::new();
        let mut downloaded = 0;
        for layer in &manifest.layers {
            if !LAYER_TYPES.contains(&layer.media_type.as_str()) {
                return Err(PullError::LayerType {
                    reference: name,
                    digest: layer.digest.clone(),
                    media_type: layer.media_type.clone(),
                });
            }
            if let Some(path) = self.cache.get(&layer.digest)? {
                layers.push(path);
                continue;
            }
            let temporary = self.cache.temporary()?;
            // Removed however the download ends, also when this future is dropped midway.
            let _cleanup = RemoveOnDrop(temporary.clone());
            let fetched = async {
                let file = tokio::fs::File::create(&temporary)
                    .await
                    .map_err(oci_client::errors::OciDistributionError::from)?;
                client.pull_blob(&reference, layer, file).await
            }
            .await;
            if let Err(source) = fetched {
                return Err(PullError::Blob {
                    reference: name,
                    digest: layer.digest.clone(),
                    source,
                });
            }
            layers.push(self.cache.insert(&temporary, &layer.digest)?);
            downloaded += 1;
        }
        let target = self.target.clone();
        tokio::task::spawn_blocking(move || unpack::unpack_layers(&layers, &target))
            .await
            .map_err(|e| PullError::Task(e.to_string()))??;
        tracing::info!(image = %name, %digest, downloaded, "image pulled");
        Ok(Pulled {
            digest,
            unpacked: true,
            downloaded_layers: downloaded,
        })
    }
}
