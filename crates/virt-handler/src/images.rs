//! The local image store of the embedded mode: what `containerDisk.image` and
//! `kernelBoot.container.image` names resolve to when there is no container runtime.
//!
//! Layout: `<data_dir>/images/<encoded reference>/` ([`sanitise_name`], injective) holds the image's files at the paths they
//! would have inside the container image (`/vmlinux`, `/disk/guest.img` …). [`import`]
//! copies host files in (the `kubevirt-rs images import NAME FILE…` subcommand);
//! [`ImageStore::resolve`] turns an image name and a path inside the image into a host path,
//! refusing `..` and symlinks through [`virt_launcher::safe_path`]. Image directories are
//! `0700` and image files `0600`.
//!
//! Images that are not there are pulled from their OCI registry ([`ImageStore::ensure`],
//! through [`oci_pull`]) into the same layout, as kubelet would have the container runtime
//! pull them: layers are cached by digest in `.blobs/` (shared by every image), the image is
//! unpacked into a temporary directory renamed into place, and the manifest digest it came
//! from is recorded in `.pulled/<encoded reference>`. An image without that record was
//! imported by hand and is used as it is whatever the pull policy, as a node's pre-loaded
//! image. Names starting with `.` are never image directories ([`sanitise_name`] encodes a
//! leading `.`).

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use oci_pull::{Credentials, ImageReference, Puller};

use virt_launcher::private_fs;
use virt_launcher::safe_path::{SafePathError, check_beneath};

/// Errors of the image store.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The image name is empty or made only of characters that are not kept.
    #[error("invalid image name {0:?}")]
    InvalidName(String),
    /// The image is not in the store.
    #[error(
        "image {image:?} is not in the local image store; import it with `kubevirt-rs images import {image} FILE…`"
    )]
    NotFound {
        /// The image name.
        image: String,
    },
    /// The path inside the image is not usable (`..`, symlink, missing).
    #[error("path {path:?} in image {image:?} cannot be used")]
    Path {
        /// The image name.
        image: String,
        /// The path inside the image.
        path: String,
        /// Why.
        #[source]
        source: SafePathError,
    },
    /// The image holds no disk (`*.img`, `*.qcow2`, `*.raw` under `/disk/` or at its root).
    #[error(
        "image {0:?} holds no disk image (*.img, *.qcow2 or *.raw under /disk/ or at its root)"
    )]
    NoDisk(String),
    /// Copying a file into the store failed.
    #[error("importing {file:?} into image {image:?}")]
    Import {
        /// The image name.
        image: String,
        /// The host file.
        file: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The destination inside the image is not a plain relative path.
    #[error("destination {0:?} inside the image contains '..' or is empty")]
    BadDestination(String),
    /// The image name is not a valid image reference, so it cannot be pulled.
    #[error(transparent)]
    Reference(#[from] oci_pull::ReferenceError),
    /// Pulling the image from its registry failed.
    #[error("pulling {image:?}")]
    Pull {
        /// The image name.
        image: String,
        /// The cause.
        #[source]
        source: Box<oci_pull::PullError>,
    },
    /// The image is missing and its pull policy is `Never` (kubelet's `ErrImageNeverPull`).
    #[error("container image {0:?} is not present with pull policy of Never")]
    NeverPull(String),
    /// Recording the pulled image's digest failed.
    #[error("recording the digest of {image:?}")]
    Record {
        /// The image name.
        image: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// kubelet's image pull policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    /// Ask the registry every time (a changed digest is pulled again).
    Always,
    /// Pull only when the image is missing.
    IfNotPresent,
    /// Never pull: a missing image fails.
    Never,
}

impl PullPolicy {
    /// The policy `policy` names; without one (or an unknown one) Kubernetes' default:
    /// `Always` for a `:latest` or untagged image without digest, else `IfNotPresent`.
    pub fn for_image(policy: Option<&str>, image: &str) -> PullPolicy {
        match policy {
            Some("Always") => PullPolicy::Always,
            Some("IfNotPresent") => PullPolicy::IfNotPresent,
            Some("Never") => PullPolicy::Never,
            _ => match ImageReference::parse(image) {
                Ok(r) if r.digest.is_none() && r.tag.as_deref() == Some("latest") => {
                    PullPolicy::Always
                }
                _ => PullPolicy::IfNotPresent,
            },
        }
    }
}

/// The store below `<data_dir>/images`.
#[derive(Debug, Clone)]
pub struct ImageStore {
    root: PathBuf,
    puller: Puller,
    /// One lock per image directory, so two VMIs of one image pull it once.
    pulling: Arc<Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>>,
}

/// The longest directory name the store makes (the usual file-name limit of Linux).
const MAX_NAME_BYTES: usize = 255;

/// Turns an image reference into a directory name, injectively: letters, digits, `.`, `-`
/// and `_` are kept, every other byte (`/`, `:`, `@`, `%` …) becomes `%XX` (its hex value),
/// and a leading `.` becomes `%2E`. Since `%` itself is encoded, two references never share a
/// directory (`a/b:c` → `a%2Fb%3Ac`, `a_b:c` → `a_b%3Ac`), and no name is `.`, `..` or
/// contains `/`.
///
/// `kubevirt-rs/test-guest:latest` → `kubevirt-rs%2Ftest-guest%3Alatest`. A reference without
/// a tag or digest gets `:latest`, as a container runtime would pull it. `None` for an empty
/// reference or one whose encoding exceeds 255 bytes.
///
/// Directories of the earlier lossy layout (`kubevirt-rs_test-guest_latest`) are not read:
/// reading them back would bring the collisions back; such images are imported again.
pub fn sanitise_name(image: &str) -> Option<String> {
    let image = image.trim();
    if image.is_empty() {
        return None;
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    let with_tag = if last.contains(':') || last.contains('@') {
        image.to_owned()
    } else {
        format!("{image}:latest")
    };
    let mut out = String::with_capacity(with_tag.len());
    for (i, byte) in with_tag.bytes().enumerate() {
        let kept =
            byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_') || (byte == b'.' && i > 0);
        if kept {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    (out.len() <= MAX_NAME_BYTES).then_some(out)
}

/// A path inside an image as a relative path: leading `/` removed, `.` dropped, `..` refused.
fn relative_in_image(path: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in Path::new(path).components() {
        match component {
            Component::Normal(name) => out.push(name),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

impl ImageStore {
    /// The store of `data_dir` (`<data_dir>/images`).
    pub fn new(data_dir: &Path) -> Self {
        let root = data_dir.join("images");
        Self {
            puller: Puller::new(root.join(".blobs")),
            root,
            pulling: Arc::default(),
        }
    }

    /// The same store, pulling inside the network namespace at `path` (the node's, so that
    /// a loopback registry is the node's loopback, as for kubelet's pulls).
    #[must_use]
    pub fn pulling_in_network_namespace(mut self, path: &Path) -> Self {
        self.puller = self.puller.in_network_namespace(path);
        self
    }

    /// Whether `image` is in the store (pulled or imported).
    pub fn contains(&self, image: &str) -> bool {
        self.existing_image_dir(image).is_ok()
    }

    fn record_path(&self, image: &str) -> Result<PathBuf, ImageError> {
        let name = sanitise_name(image).ok_or_else(|| ImageError::InvalidName(image.into()))?;
        Ok(self.root.join(".pulled").join(name))
    }

    /// The manifest digest `image` was pulled at; `None` for an imported or missing image.
    pub fn pulled_digest(&self, image: &str) -> Option<String> {
        let path = self.record_path(image).ok()?;
        let text = std::fs::read_to_string(path).ok()?;
        Some(text.trim().to_owned()).filter(|d| !d.is_empty())
    }

    /// Makes `image` present as `policy` says, pulling it with `credentials` when needed.
    /// An imported image (no pull record) is used as it is.
    ///
    /// # Errors
    /// [`ImageError::NeverPull`], [`ImageError::Reference`], [`ImageError::Pull`],
    /// [`ImageError::Record`].
    pub async fn ensure(
        &self,
        image: &str,
        policy: PullPolicy,
        credentials: Option<&Credentials>,
    ) -> Result<(), ImageError> {
        let dir = self.image_dir(image)?;
        let lock = {
            let mut locks = self
                .pulling
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            Arc::clone(locks.entry(dir.clone()).or_default())
        };
        let _held = lock.lock().await;
        let present = self.contains(image);
        let recorded = self.pulled_digest(image);
        match policy {
            _ if present && recorded.is_none() => return Ok(()),
            PullPolicy::Never if present => return Ok(()),
            PullPolicy::Never => return Err(ImageError::NeverPull(image.to_owned())),
            PullPolicy::IfNotPresent if present => return Ok(()),
            PullPolicy::IfNotPresent | PullPolicy::Always => {}
        }
        let reference = ImageReference::parse(image)?;
        private_fs::create_dir_all(&self.root).map_err(|source| ImageError::Record {
            image: image.to_owned(),
            source,
        })?;
        let pulled = self
            .puller
            .pull(&reference, credentials, &dir, recorded.as_deref())
            .await
            .map_err(|source| ImageError::Pull {
                image: image.to_owned(),
                source: Box::new(source),
            })?;
        if pulled.unpacked || recorded.as_deref() != Some(pulled.digest.as_str()) {
            self.write_record(image, &pulled.digest)
                .map_err(|source| ImageError::Record {
                    image: image.to_owned(),
                    source,
                })?;
        }
        Ok(())
    }

    fn write_record(&self, image: &str, digest: &str) -> std::io::Result<()> {
        let path = self
            .record_path(image)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        if let Some(parent) = path.parent() {
            private_fs::create_dir_all(parent)?;
        }
        let mut temporary = path.clone().into_os_string();
        temporary.push(".writing");
        let temporary = PathBuf::from(temporary);
        std::fs::write(&temporary, digest)?;
        private_fs::set_mode(&temporary, private_fs::FILE_MODE)?;
        std::fs::rename(&temporary, &path)
    }

    fn forget_pull(&self, image: &str) {
        if let Ok(path) = self.record_path(image) {
            let _ = std::fs::remove_file(path);
        }
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of `image`.
    ///
    /// # Errors
    /// [`ImageError::InvalidName`].
    pub fn image_dir(&self, image: &str) -> Result<PathBuf, ImageError> {
        let name = sanitise_name(image).ok_or_else(|| ImageError::InvalidName(image.into()))?;
        Ok(self.root.join(name))
    }

    /// The host path of `path_in_image` inside `image`, reached without symlinks.
    ///
    /// # Errors
    /// [`ImageError::NotFound`] when the image is missing, [`ImageError::Path`] for `..`,
    /// a symlink or a missing file.
    pub fn resolve(&self, image: &str, path_in_image: &str) -> Result<PathBuf, ImageError> {
        let dir = self.existing_image_dir(image)?;
        let path_error = |source| ImageError::Path {
            image: image.to_owned(),
            path: path_in_image.to_owned(),
            source,
        };
        let relative = relative_in_image(path_in_image)
            .ok_or_else(|| path_error(SafePathError::Traversal(path_in_image.into())))?;
        check_beneath(&dir, &relative).map_err(path_error)
    }

    /// The disk of a containerDisk image: `path` when given, else the first (by name)
    /// `*.img`, `*.qcow2` or `*.raw` file under `/disk/`, else at the image root.
    ///
    /// # Errors
    /// As [`Self::resolve`]; [`ImageError::NoDisk`] when the image holds no disk.
    pub fn resolve_disk(&self, image: &str, path: Option<&str>) -> Result<PathBuf, ImageError> {
        if let Some(path) = path.filter(|p| !p.is_empty()) {
            return self.resolve(image, path);
        }
        let dir = self.existing_image_dir(image)?;
        for sub in ["disk", ""] {
            let Ok(entries) = std::fs::read_dir(dir.join(sub)) else {
                continue;
            };
            let mut names: Vec<String> = entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    [".img", ".qcow2", ".raw"]
                        .iter()
                        .any(|ext| n.ends_with(ext))
                })
                .collect();
            names.sort();
            if let Some(first) = names.first() {
                return self.resolve(image, &format!("/{sub}/{first}"));
            }
        }
        Err(ImageError::NoDisk(image.to_owned()))
    }

    fn existing_image_dir(&self, image: &str) -> Result<PathBuf, ImageError> {
        let dir = self.image_dir(image)?;
        let is_dir = std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir());
        if is_dir {
            Ok(dir)
        } else {
            Err(ImageError::NotFound {
                image: image.to_owned(),
            })
        }
    }
}

/// One file to import: a host file and where it goes inside the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportFile {
    /// The host file to copy.
    pub source: PathBuf,
    /// Destination inside the image; a value ending in `/` is a directory that keeps the
    /// file's name. `None` puts the file at `/<basename>`.
    pub destination: Option<String>,
}

/// Copies `files` into `image` in the store below `data_dir`, replacing files of the same
/// name atomically (copy to a temporary name, then rename). Returns the image directory.
///
/// # Errors
/// [`ImageError`] when the name is invalid, a destination is not a plain path, or copying fails.
pub fn import(data_dir: &Path, image: &str, files: &[ImportFile]) -> Result<PathBuf, ImageError> {
    let store = ImageStore::new(data_dir);
    let dir = store.image_dir(image)?;
    for file in files {
        let io_error = |source| ImageError::Import {
            image: image.to_owned(),
            file: file.source.clone(),
            source,
        };
        let base = file
            .source
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let destination = match &file.destination {
            None => format!("/{base}"),
            Some(d) if d.ends_with('/') => format!("{d}{base}"),
            Some(d) => d.clone(),
        };
        let relative =
            relative_in_image(&destination).ok_or(ImageError::BadDestination(destination))?;
        let target = dir.join(&relative);
        let mut parent = target.parent();
        while let Some(p) = parent.filter(|p| p.starts_with(&dir)) {
            private_fs::create_dir_all(p).map_err(io_error)?;
            parent = p.parent();
        }
        let mut temporary = target.clone().into_os_string();
        temporary.push(".importing");
        let temporary = PathBuf::from(temporary);
        // `copy` keeps the source's mode: make the copy owner-only before it gets its name.
        std::fs::copy(&file.source, &temporary).map_err(io_error)?;
        private_fs::set_mode(&temporary, private_fs::FILE_MODE).map_err(io_error)?;
        std::fs::rename(&temporary, &target).map_err(io_error)?;
    }
    // Imported files make the image a hand-made one: never replaced by a pull.
    store.forget_pull(image);
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &Path, name: &str, content: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        path
    }

    #[test]
    fn image_names_become_single_directory_names() {
        assert_eq!(
            sanitise_name("kubevirt-rs/test-guest:latest").unwrap(),
            "kubevirt-rs%2Ftest-guest%3Alatest"
        );
        assert_eq!(
            sanitise_name("registry:5000/kubevirt/cirros").unwrap(),
            "registry%3A5000%2Fkubevirt%2Fcirros%3Alatest"
        );
        assert_eq!(sanitise_name("../x:1").unwrap(), "%2E.%2Fx%3A1");
        assert_eq!(sanitise_name("a%2Fb:c").unwrap(), "a%252Fb%3Ac");
        assert!(sanitise_name("  ").is_none());
        assert!(sanitise_name(&"a".repeat(300)).is_none());
    }

    #[test]
    fn references_that_differ_only_in_separators_map_to_different_directories() {
        let names = [
            "a/b:c", "a_b:c", "a:b:c", "a/b@c", "a%2Fb:c", "a%2fb:c", "a.b:c", ".a:c", "%2Ea:c",
        ];
        let encoded: std::collections::BTreeSet<String> =
            names.iter().map(|n| sanitise_name(n).unwrap()).collect();
        assert_eq!(encoded.len(), names.len(), "{encoded:?}");
    }

    #[test]
    fn images_whose_old_directory_names_collided_keep_their_own_files() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let first = file(tmp.path(), "first.img", "first");
        let second = file(tmp.path(), "second.img", "second");
        for (image, source) in [("a/b:c", first), ("a_b:c", second)] {
            import(
                &data,
                image,
                &[ImportFile {
                    source,
                    destination: Some("/disk/guest.img".into()),
                }],
            )
            .unwrap();
        }
        let store = ImageStore::new(&data);
        let read = |image: &str| {
            std::fs::read_to_string(store.resolve(image, "/disk/guest.img").unwrap()).unwrap()
        };
        assert_eq!(read("a/b:c"), "first");
        assert_eq!(read("a_b:c"), "second");
    }

    #[test]
    fn imported_files_resolve_at_their_basename_or_destination() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let kernel = file(tmp.path(), "vmlinux", "kernel");
        let disk = file(tmp.path(), "guest.qcow2", "disk");
        import(
            &data,
            "kubevirt-rs/test-guest:latest",
            &[
                ImportFile {
                    source: kernel,
                    destination: None,
                },
                ImportFile {
                    source: disk,
                    destination: Some("/disk/".into()),
                },
            ],
        )
        .unwrap();
        let store = ImageStore::new(&data);
        let path = store
            .resolve("kubevirt-rs/test-guest:latest", "/vmlinux")
            .unwrap();
        assert_eq!(std::fs::read_to_string(path).unwrap(), "kernel");
        let disk = store
            .resolve_disk("kubevirt-rs/test-guest:latest", None)
            .unwrap();
        assert!(disk.ends_with("disk/guest.qcow2"), "{disk:?}");
    }

    #[test]
    fn traversal_symlinks_and_missing_images_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = file(tmp.path(), "secret", "no");
        let dir = import(tmp.path(), "img", &[]).unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("link")).unwrap();
        let store = ImageStore::new(tmp.path());
        assert!(matches!(
            store.resolve("img", "/../../secret"),
            Err(ImageError::Path { .. })
        ));
        assert!(matches!(
            store.resolve("img", "/link"),
            Err(ImageError::Path { .. })
        ));
        assert!(matches!(
            store.resolve("other", "/vmlinux"),
            Err(ImageError::NotFound { .. })
        ));
        assert!(matches!(
            store.resolve_disk("img", None),
            Err(ImageError::NoDisk(_))
        ));
    }

    #[test]
    fn import_refuses_destinations_that_leave_the_image() {
        let tmp = tempfile::tempdir().unwrap();
        let f = file(tmp.path(), "f", "x");
        let err = import(
            tmp.path(),
            "img",
            &[ImportFile {
                source: f,
                destination: Some("/../escape".into()),
            }],
        )
        .unwrap_err();
        assert!(matches!(err, ImageError::BadDestination(_)), "{err}");
    }

    #[test]
    fn pull_policies_default_as_kubernetes_does() {
        let p = PullPolicy::for_image;
        assert_eq!(p(None, "127.0.0.1:5000/guest:latest"), PullPolicy::Always);
        assert_eq!(p(None, "cirros"), PullPolicy::Always);
        assert_eq!(p(None, "quay.io/x:v1"), PullPolicy::IfNotPresent);
        let digest = format!("quay.io/x@sha256:{}", "0".repeat(64));
        assert_eq!(p(None, &digest), PullPolicy::IfNotPresent);
        assert_eq!(p(Some("Never"), "x:latest"), PullPolicy::Never);
        assert_eq!(
            p(Some("IfNotPresent"), "x:latest"),
            PullPolicy::IfNotPresent
        );
        assert_eq!(p(Some("Always"), "x:v1"), PullPolicy::Always);
    }

    #[tokio::test]
    async fn imported_images_are_used_as_they_are_and_missing_ones_follow_the_policy() {
        let tmp = tempfile::tempdir().unwrap();
        let disk = file(tmp.path(), "guest.img", "disk");
        let imported = "127.0.0.1:1/imported:latest";
        import(
            tmp.path(),
            imported,
            &[ImportFile {
                source: disk,
                destination: Some("/disk/".into()),
            }],
        )
        .unwrap();
        let store = ImageStore::new(tmp.path());
        // Port 1 answers nothing: an imported image must not be looked up at all.
        store
            .ensure(imported, PullPolicy::Always, None)
            .await
            .unwrap();
        let missing = "127.0.0.1:1/missing:v1";
        let never = store.ensure(missing, PullPolicy::Never, None).await;
        assert!(matches!(never, Err(ImageError::NeverPull(_))), "{never:?}");
        let pulled = store.ensure(missing, PullPolicy::IfNotPresent, None).await;
        assert!(matches!(pulled, Err(ImageError::Pull { .. })), "{pulled:?}");
        assert!(!store.contains(missing));
        let bad = store
            .ensure("Not A Reference", PullPolicy::IfNotPresent, None)
            .await;
        assert!(matches!(bad, Err(ImageError::Reference(_))), "{bad:?}");
    }

    #[test]
    fn imported_images_are_owner_only_under_a_permissive_umask() {
        use std::os::unix::fs::PermissionsExt;
        nix::sys::stat::umask(nix::sys::stat::Mode::empty());
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let tmp = tempfile::tempdir().unwrap();
        let source = file(tmp.path(), "guest.img", "disk");
        private_fs::set_mode(&source, 0o644).unwrap();
        let dir = import(
            tmp.path(),
            "img",
            &[ImportFile {
                source,
                destination: Some("/disk/".into()),
            }],
        )
        .unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("disk")), 0o700);
        assert_eq!(mode(&dir.join("disk/guest.img")), 0o600);
    }
}
