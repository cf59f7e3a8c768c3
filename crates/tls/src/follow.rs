//! Files followed per handshake: certificates, keys and CA bundles that a renewal replaces on
//! disk while the process keeps serving.
//!
//! Data flow: every use ([`Followed::current`]) looks at the files' status (`stat`, which
//! follows symbolic links) → when any file's identity (device, inode, length, modification
//! time) differs from the one of the loaded value, the files are read again and parsed → the
//! new value replaces the old one; otherwise the loaded value is returned.
//!
//! # Guarantees
//! - A handshake that starts after a renewal has been written sees the renewed files: there
//!   is no polling period in which an expired certificate could still be served.
//! - The atomic switch of a Secret or ConfigMap volume (the `..data` symbolic link pointing at
//!   a new timestamped directory, as kubelet's and our node agent's volume writers do) is seen
//!   as a change of every file, since the link now resolves to other inodes.
//! - A half-written renewal (a new certificate beside the old key, a truncated file) is not
//!   used: the loaded value stays, and the files are tried again at the next use.
//!
//! # Caveats
//! Two `stat` calls per use of a certificate pair; a rewrite in place that keeps the length and
//! the modification time (to the file system's resolution) is not noticed.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use crate::pem::{self, PemError};
use crate::server::ConfigError;

/// What identifies a file's current content, as its path resolves now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: i64,
    mtime_nsec: i64,
}

fn stamp(path: &Path) -> std::io::Result<Stamp> {
    let m = std::fs::metadata(path)?;
    Ok(Stamp {
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        mtime: m.mtime(),
        mtime_nsec: m.mtime_nsec(),
    })
}

/// Builds the followed value from the contents of the files, in the order of the paths.
type Loader<T> = dyn Fn(&[Vec<u8>]) -> Result<Arc<T>, ConfigError> + Send + Sync;

/// A value built from files and rebuilt when they change; see the module documentation.
pub(crate) struct Followed<T: ?Sized> {
    paths: Vec<PathBuf>,
    loaded: RwLock<(Vec<Stamp>, Arc<T>)>,
    load: Box<Loader<T>>,
}

impl<T: ?Sized> std::fmt::Debug for Followed<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Followed")
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

impl<T: ?Sized> Followed<T> {
    /// Loads the value from `paths` now.
    ///
    /// # Errors
    /// When a file cannot be read or `load` refuses its content.
    pub(crate) fn new(
        paths: Vec<PathBuf>,
        load: impl Fn(&[Vec<u8>]) -> Result<Arc<T>, ConfigError> + Send + Sync + 'static,
    ) -> Result<Self, ConfigError> {
        let (stamps, value) = read(&paths, &load)?;
        Ok(Self {
            paths,
            loaded: RwLock::new((stamps, value)),
            load: Box::new(load),
        })
    }

    /// The value for the files as they are now (the last good one while they are unusable).
    pub(crate) fn current(&self) -> Arc<T> {
        let stamps: Result<Vec<Stamp>, _> = self.paths.iter().map(|p| stamp(p)).collect();
        {
            let loaded = self.loaded.read().unwrap_or_else(PoisonError::into_inner);
            match &stamps {
                Ok(s) if *s == loaded.0 => return loaded.1.clone(),
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(paths = ?self.paths, error = %e, "a followed file is missing; keeping the loaded one");
                    return loaded.1.clone();
                }
            }
        }
        match read(&self.paths, &self.load) {
            Ok((stamps, value)) => {
                tracing::info!(paths = ?self.paths, "reloaded renewed TLS material");
                *self.loaded.write().unwrap_or_else(PoisonError::into_inner) =
                    (stamps, value.clone());
                value
            }
            Err(e) => {
                tracing::debug!(paths = ?self.paths, error = %e, "renewed TLS material is not usable yet; keeping the loaded one");
                self.loaded
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .1
                    .clone()
            }
        }
    }
}

/// The stamps taken before reading (so a change during the read is seen at the next use) and
/// the value of the contents.
fn read<T: ?Sized>(
    paths: &[PathBuf],
    load: &(impl Fn(&[Vec<u8>]) -> Result<Arc<T>, ConfigError> + ?Sized),
) -> Result<(Vec<Stamp>, Arc<T>), ConfigError> {
    let stamps = paths
        .iter()
        .map(|p| stamp(p).map_err(|e| PemError::ReadFile(p.clone(), e)))
        .collect::<Result<Vec<_>, _>>()?;
    let contents = paths
        .iter()
        .map(|p| pem::read(p))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((stamps, load(&contents)?))
}
