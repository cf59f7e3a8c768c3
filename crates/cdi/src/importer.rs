//! The importer (`kubevirt-rs cdi-importer`, run in the importer pod): writes the DataVolume's
//! data as `disk.img` into the mounted claim.
//!
//! - blank: a sparse raw file of the given size;
//! - registry: the image is pulled with [`oci_pull`] (a `docker://` URL as CDI's; a loopback
//!   registry may be plain HTTP, as for containerDisks; `--auth-dir` holds the Secret's
//!   `accessKeyId` and `secretKey`) into a scratch directory on the claim, and the one file in
//!   its `/disk/` directory becomes `disk.img` — converted to raw with `qemu-img` when it is
//!   qcow2, as CDI does;
//! - http: a plain-HTTP download (the embedded CDI has no TLS client for sources).
//!
//! The image is written beside the target and renamed into place, so a crash leaves no
//! half-written `disk.img`. Progress goes to stdout as `Progress: N%` lines, which the
//! controller reads from the pod's log; a failure's message is the last line (stderr).

use std::path::{Path, PathBuf};

use http_body_util::BodyExt;

/// What to import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A sparse image of this many bytes.
    Blank {
        /// Size of the image.
        size: u64,
    },
    /// A container image with the disk in `/disk/`.
    Registry {
        /// `docker://host/repository:tag`.
        endpoint: String,
    },
    /// A disk image at an `http://` URL.
    Http {
        /// The URL.
        endpoint: String,
    },
}

/// One import.
#[derive(Debug, Clone)]
pub struct Config {
    /// The source.
    pub source: Source,
    /// The image to write (`/data/disk.img`).
    pub target: PathBuf,
    /// Directory with `accessKeyId` and `secretKey`, when the source needs credentials.
    pub auth_dir: Option<PathBuf>,
}

/// Why an import failed; its message is what the DataVolume's `Running` condition shows.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// Writing the image failed.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The registry URL is not one.
    #[error("invalid registry URL {url}: {reason}")]
    Url {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// Pulling the image failed.
    #[error("Unable to pull image {endpoint}: {reason}")]
    Pull {
        /// The image.
        endpoint: String,
        /// What the registry or the puller said.
        reason: String,
    },
    /// The image has no disk in `/disk/`.
    #[error("the image {0} has no file in /disk/")]
    NoDisk(String),
    /// Converting a qcow2 image needs `qemu-img`.
    #[error("converting the qcow2 image to raw failed: {0}")]
    Convert(String),
    /// Downloading failed.
    #[error("Unable to download {endpoint}: {reason}")]
    Download {
        /// The URL.
        endpoint: String,
        /// Why.
        reason: String,
    },
}

fn write_error(path: &Path) -> impl FnOnce(std::io::Error) -> ImportError + '_ {
    move |source| ImportError::Write {
        path: path.to_owned(),
        source,
    }
}

/// The temporary file beside `target` that is renamed into place.
fn partial(target: &Path) -> PathBuf {
    let mut name = target.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    target.with_file_name(name)
}

/// Runs one import.
///
/// # Errors
/// [`ImportError`].
pub async fn run(config: &Config) -> Result<(), ImportError> {
    let target = &config.target;
    let tmp = partial(target);
    match &config.source {
        Source::Blank { size } => {
            let file = std::fs::File::create(&tmp).map_err(write_error(&tmp))?;
            file.set_len(*size).map_err(write_error(&tmp))?;
            file.sync_all().map_err(write_error(&tmp))?;
        }
        Source::Registry { endpoint } => {
            import_registry(endpoint, config.auth_dir.as_deref(), target, &tmp).await?;
        }
        Source::Http { endpoint } => download(endpoint, &tmp).await?,
    }
    std::fs::rename(&tmp, target).map_err(write_error(target))?;
    println!("Progress: 100.00%");
    Ok(())
}

fn read_credentials(dir: &Path) -> Option<oci_pull::Credentials> {
    let read = |file: &str| {
        std::fs::read_to_string(dir.join(file))
            .ok()
            .map(|s| s.trim().to_owned())
    };
    Some(oci_pull::Credentials {
        username: read("accessKeyId")?,
        password: read("secretKey")?,
    })
}

async fn import_registry(
    endpoint: &str,
    auth_dir: Option<&Path>,
    target: &Path,
    tmp: &Path,
) -> Result<(), ImportError> {
    let reference_text = endpoint.strip_prefix("docker://").unwrap_or(endpoint);
    let reference =
        oci_pull::ImageReference::parse(reference_text).map_err(|e| ImportError::Url {
            url: endpoint.to_owned(),
            reason: e.to_string(),
        })?;
    let credentials = auth_dir.and_then(read_credentials);
    let scratch = target.with_file_name(".cdi-scratch");
    let _ = std::fs::remove_dir_all(&scratch);
    let rootfs = scratch.join("rootfs");
    let puller = oci_pull::Puller::new(scratch.join("blobs"));
    println!("Progress: 0.00%");
    let pulled = puller
        .pull(&reference, credentials.as_ref(), &rootfs, None)
        .await;
    let result = match pulled {
        Ok(_) => disk_from(&rootfs, endpoint, tmp),
        Err(e) => Err(ImportError::Pull {
            endpoint: endpoint.to_owned(),
            reason: error_chain(&e),
        }),
    };
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// An error with its causes, `: `-separated.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Whether `path` starts with the qcow2 magic (`QFI\xfb`).
fn is_qcow2(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == *b"QFI\xfb"
}

/// Writes the image's `/disk/` file to `tmp` as raw.
fn disk_from(rootfs: &Path, endpoint: &str, tmp: &Path) -> Result<(), ImportError> {
    let disk_dir = rootfs.join("disk");
    let disk = std::fs::read_dir(&disk_dir)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.is_file())
        .ok_or_else(|| ImportError::NoDisk(endpoint.to_owned()))?;
    if is_qcow2(&disk) {
        let output = std::process::Command::new("qemu-img")
            .args(["convert", "-O", "raw"])
            .arg(&disk)
            .arg(tmp)
            .output()
            .map_err(|e| {
                ImportError::Convert(format!("qemu-img cannot be run (is it installed?): {e}"))
            })?;
        if !output.status.success() {
            return Err(ImportError::Convert(
                String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            ));
        }
        return Ok(());
    }
    std::fs::copy(&disk, tmp).map_err(write_error(tmp))?;
    Ok(())
}

async fn download(endpoint: &str, tmp: &Path) -> Result<(), ImportError> {
    use std::io::Write;
    let failed = |reason: String| ImportError::Download {
        endpoint: endpoint.to_owned(),
        reason,
    };
    let uri: http::Uri = endpoint.parse().map_err(|e| failed(format!("{e}")))?;
    if uri.scheme_str() != Some("http") {
        return Err(failed(
            "only http:// sources are supported by the embedded CDI".into(),
        ));
    }
    let client: hyper_util::client::legacy::Client<_, http_body_util::Empty<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let response = client.get(uri).await.map_err(|e| failed(error_chain(&e)))?;
    if !response.status().is_success() {
        return Err(failed(format!("the server answered {}", response.status())));
    }
    let total = response
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut file = std::fs::File::create(tmp).map_err(write_error(tmp))?;
    let mut body = response.into_body();
    let mut written: u64 = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| failed(error_chain(&e)))?;
        if let Some(data) = frame.data_ref() {
            file.write_all(data).map_err(write_error(tmp))?;
            written += data.len() as u64;
            if let Some(total) = total.filter(|t| *t > 0) {
                #[allow(clippy::cast_precision_loss)]
                let percent = written as f64 * 100.0 / total as f64;
                println!("Progress: {percent:.2}%");
            }
        }
    }
    file.sync_all().map_err(write_error(tmp))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_blank_image_is_sparse_and_of_the_given_size() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("disk.img");
        let config = Config {
            source: Source::Blank { size: 64 << 20 },
            target: target.clone(),
            auth_dir: None,
        };
        run(&config).await.unwrap();
        let meta = std::fs::metadata(&target).unwrap();
        assert_eq!(meta.len(), 64 << 20);
        use std::os::unix::fs::MetadataExt;
        assert!(meta.blocks() * 512 < 1 << 20, "the image is sparse");
        assert!(!partial(&target).exists());
    }

    #[test]
    fn a_qcow2_disk_is_converted_to_raw_with_qemu_img() {
        let dir = tempfile::tempdir().unwrap();
        let raw: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 247) as u8).collect();
        std::fs::write(dir.path().join("raw"), &raw).unwrap();
        let rootfs = dir.path().join("rootfs");
        std::fs::create_dir_all(rootfs.join("disk")).unwrap();
        let status = std::process::Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "qcow2"])
            .arg(dir.path().join("raw"))
            .arg(rootfs.join("disk/disk.qcow2"))
            .status()
            .expect("qemu-img (Debian's qemu-utils) is needed");
        assert!(status.success());
        assert!(is_qcow2(&rootfs.join("disk/disk.qcow2")));
        let out = dir.path().join("out");
        disk_from(&rootfs, "docker://x", &out).unwrap();
        assert!(
            std::fs::read(&out).unwrap() == raw,
            "the raw image of the qcow2 one"
        );
    }

    #[test]
    fn a_raw_disk_is_copied_and_a_missing_disk_is_said() {
        let dir = tempfile::tempdir().unwrap();
        let rootfs = dir.path().join("rootfs");
        std::fs::create_dir_all(rootfs.join("disk")).unwrap();
        let tmp = dir.path().join("out");
        assert!(matches!(
            disk_from(&rootfs, "docker://x", &tmp),
            Err(ImportError::NoDisk(_))
        ));
        std::fs::write(rootfs.join("disk/disk.img"), b"raw bytes").unwrap();
        disk_from(&rootfs, "docker://x", &tmp).unwrap();
        assert_eq!(std::fs::read(&tmp).unwrap(), b"raw bytes");
    }
}
