//! Blobs by digest: `<dir>/sha256/<hex>`, shared by every image pulled through the cache.
//!
//! A blob gets its name only after its content was hashed and matched its digest
//! ([`BlobCache::insert`]): it is written under a temporary name in the same directory and
//! renamed, so a present blob is always complete and verified.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::reference::is_sha256_digest;

/// Errors of the blob cache.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The digest is not `sha256:<64 hex>`.
    #[error("unsupported digest {0:?}: only sha256 digests are accepted")]
    UnsupportedDigest(String),
    /// The content does not hash to its digest.
    #[error("blob content hashes to {actual}, not to its digest {expected}")]
    Mismatch {
        /// The digest it should have.
        expected: String,
        /// The digest it has.
        actual: String,
    },
    /// Reading or writing the cache failed.
    #[error("blob cache {0:?}")]
    Io(PathBuf, #[source] std::io::Error),
}

/// The digest of `reader`'s content, as `sha256:<hex>`.
///
/// # Errors
/// The reader's error.
pub fn sha256_of(mut reader: impl Read) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let hex: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(format!("sha256:{hex}"))
}

/// A directory of blobs named by digest.
#[derive(Debug, Clone)]
pub struct BlobCache {
    dir: PathBuf,
}

impl BlobCache {
    /// The cache in `dir` (created on first insert).
    pub fn new(dir: impl Into<PathBuf>) -> BlobCache {
        BlobCache { dir: dir.into() }
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the blob of `digest` is (or would be).
    ///
    /// # Errors
    /// [`CacheError::UnsupportedDigest`] for anything but a well-formed sha256 digest (so
    /// the name can never leave the cache directory).
    pub fn path(&self, digest: &str) -> Result<PathBuf, CacheError> {
        if !is_sha256_digest(digest) {
            return Err(CacheError::UnsupportedDigest(digest.to_owned()));
        }
        Ok(self.dir.join("sha256").join(&digest["sha256:".len()..]))
    }

    /// The blob's path when it is in the cache.
    ///
    /// # Errors
    /// As [`Self::path`].
    pub fn get(&self, digest: &str) -> Result<Option<PathBuf>, CacheError> {
        let path = self.path(digest)?;
        Ok(std::fs::symlink_metadata(&path)
            .is_ok_and(|m| m.is_file())
            .then_some(path))
    }

    /// A fresh temporary file name in the cache, for a download that [`Self::insert`] names.
    ///
    /// # Errors
    /// [`CacheError::Io`] when the cache directory cannot be created.
    pub fn temporary(&self) -> Result<PathBuf, CacheError> {
        let dir = self.dir.join("sha256");
        create_private_dir(&dir).map_err(|e| CacheError::Io(dir.clone(), e))?;
        Ok(dir.join(format!(".download-{:016x}", rand::random::<u64>())))
    }

    /// Gives the downloaded file `temporary` its name `digest` after checking its content
    /// hashes to it; a mismatching file is removed.
    ///
    /// # Errors
    /// [`CacheError::Mismatch`] when the content does not match, [`CacheError::Io`].
    pub fn insert(&self, temporary: &Path, digest: &str) -> Result<PathBuf, CacheError> {
        let target = self.path(digest)?;
        let io = |e| CacheError::Io(temporary.to_owned(), e);
        let actual = std::fs::File::open(temporary)
            .and_then(sha256_of)
            .map_err(io)?;
        if actual != digest {
            let _ = std::fs::remove_file(temporary);
            return Err(CacheError::Mismatch {
                expected: digest.to_owned(),
                actual,
            });
        }
        set_file_mode(temporary).map_err(io)?;
        std::fs::rename(temporary, &target).map_err(io)?;
        Ok(target)
    }
}

pub(crate) fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

fn set_file_mode(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blob_is_named_by_its_digest_only_when_its_content_matches() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = BlobCache::new(tmp.path().join("blobs"));
        let digest = sha256_of(&b"hello"[..]).unwrap();
        assert_eq!(
            digest,
            "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        let t = cache.temporary().unwrap();
        std::fs::write(&t, b"hello").unwrap();
        let path = cache.insert(&t, &digest).unwrap();
        assert_eq!(cache.get(&digest).unwrap(), Some(path));

        let other = sha256_of(&b"other"[..]).unwrap();
        let t = cache.temporary().unwrap();
        std::fs::write(&t, b"tampered").unwrap();
        let err = cache.insert(&t, &other).unwrap_err();
        assert!(matches!(err, CacheError::Mismatch { .. }), "{err}");
        assert!(!t.exists(), "the mismatching download is removed");
        assert_eq!(cache.get(&other).unwrap(), None);
    }

    #[test]
    fn digests_that_are_not_sha256_never_become_paths() {
        let cache = BlobCache::new("/nonexistent");
        for bad in ["sha256:../../etc/passwd", "md5:abc", "sha256:ABC", ""] {
            assert!(
                matches!(cache.path(bad), Err(CacheError::UnsupportedDigest(_))),
                "{bad}"
            );
        }
    }
}
