//! kubelet's AtomicWriter: a volume directory whose whole content changes in one `rename`.
//!
//! Layout of a volume directory with the files `a` and `dir/b`:
//!
//! ```text
//! ..2026_01_02_15_04_05.123456789/a        the data of one version
//! ..2026_01_02_15_04_05.123456789/dir/b
//! ..data -> ..2026_01_02_15_04_05.123456789 the current version
//! a -> ..data/a                             one link per top-level name
//! dir -> ..data/dir
//! ```
//!
//! A new version is written to a new timestamped directory, then `..data_tmp` is pointed at
//! it and renamed over `..data`: a reader that opens `a` sees the old or the new version,
//! never a mix. Links of names no longer in the payload and the old directory are removed
//! after the switch.
//!
//! # Guarantees
//! - Nothing is written outside the volume directory: every path is checked by
//!   [`validate_path`] (relative, no `..` element, not starting with `..`) before any write.
//! - An unchanged payload writes nothing (the current version is compared first).
//!
//! # Caveats
//! One writer per directory (the pod runner is single-threaded per pod).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

/// The link to the current version.
pub const DATA_DIR_NAME: &str = "..data";
const DATA_DIR_TMP_NAME: &str = "..data_tmp";

/// The longest item path kubelet accepts (and its longest element).
const MAX_PATH_LENGTH: usize = 4096;
const MAX_FILE_NAME_LENGTH: usize = 255;

/// One file of a payload: its bytes and its mode (permission bits).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileProjection {
    pub data: Vec<u8>,
    pub mode: u32,
}

/// The files of a volume by relative path.
pub type Payload = BTreeMap<String, FileProjection>;

/// Errors of an atomic write.
#[derive(Debug, thiserror::Error)]
pub enum AtomicError {
    /// An item path would leave the volume directory or is otherwise not allowed.
    #[error("invalid path {path:?}: {reason}")]
    InvalidPath { path: String, reason: &'static str },
    /// A file-system operation failed.
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Checks an item path as kubelet does: relative, no `..` element, not starting with `..`,
/// within the length limits.
///
/// # Errors
/// [`AtomicError::InvalidPath`] naming the rule broken.
pub fn validate_path(path: &str) -> Result<(), AtomicError> {
    let invalid = |reason| {
        Err(AtomicError::InvalidPath {
            path: path.to_owned(),
            reason,
        })
    };
    if path.is_empty() {
        return invalid("must not be empty");
    }
    if path.len() > MAX_PATH_LENGTH {
        return invalid("is too long");
    }
    if Path::new(path).is_absolute() {
        return invalid("must be relative");
    }
    if path.starts_with("..") {
        return invalid("must not start with '..'");
    }
    for element in path.split('/') {
        if element == ".." {
            return invalid("must not contain '..'");
        }
        if element.len() > MAX_FILE_NAME_LENGTH {
            return invalid("has an element that is too long");
        }
    }
    if !Path::new(path)
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return invalid("must be a plain relative path");
    }
    Ok(())
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> AtomicError {
    let path = path.to_owned();
    move |source| AtomicError::Io { op, path, source }
}

/// The first element of each payload path: the user-visible links.
fn top_level_names(payload: &Payload) -> BTreeSet<String> {
    payload
        .keys()
        .filter_map(|p| {
            Path::new(p).components().find_map(|c| match c {
                Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
                _ => None,
            })
        })
        .collect()
}

/// Whether the current version holds exactly `payload` (same paths, bytes and modes).
fn is_current(data_dir: &Path, payload: &Payload) -> bool {
    if !data_dir.is_dir() {
        return false;
    }
    let mut found = BTreeSet::new();
    if !collect_files(data_dir, Path::new(""), &mut found) {
        return false;
    }
    let normalized: BTreeSet<PathBuf> = payload
        .keys()
        .map(|p| Path::new(p).components().collect())
        .collect();
    if found != normalized {
        return false;
    }
    payload.iter().all(|(path, file)| {
        let full = data_dir.join(path);
        std::fs::read(&full).is_ok_and(|d| d == file.data)
            && std::fs::metadata(&full).is_ok_and(|m| m.permissions().mode() & 0o7777 == file.mode)
    })
}

fn collect_files(root: &Path, rel: &Path, out: &mut BTreeSet<PathBuf>) -> bool {
    let Ok(entries) = std::fs::read_dir(root.join(rel)) else {
        return false;
    };
    for entry in entries.flatten() {
        let rel = rel.join(entry.file_name());
        match entry.file_type() {
            Ok(t) if t.is_dir() => {
                if !collect_files(root, &rel, out) {
                    return false;
                }
            }
            Ok(_) => {
                out.insert(rel);
            }
            Err(_) => return false,
        }
    }
    true
}

/// A fresh version directory name, `..<UTC timestamp>.<nanoseconds>`, as kubelet's.
fn version_dir_name() -> String {
    let now = jiff::Timestamp::now();
    let stamp = jiff::fmt::strtime::format("%Y_%m_%d_%H_%M_%S", now).unwrap_or_default();
    format!("..{stamp}.{:09}", now.subsec_nanosecond())
}

/// Writes `payload` into `dir` atomically; returns whether anything changed.
///
/// # Errors
/// [`AtomicError`] for an invalid path (before anything is written) or a failed write; the
/// previous version stays current when the write fails before the switch.
pub fn write(dir: &Path, payload: &Payload) -> Result<bool, AtomicError> {
    for path in payload.keys() {
        validate_path(path)?;
    }
    private_fs::create_dir_all(dir).map_err(io("creating", dir))?;
    let data_link = dir.join(DATA_DIR_NAME);
    let old_version = std::fs::read_link(&data_link).ok();
    if old_version.is_some() && is_current(&data_link, payload) {
        return Ok(false);
    }
    let version = version_dir_name();
    let version_dir = dir.join(&version);
    std::fs::create_dir(&version_dir).map_err(io("creating", &version_dir))?;
    std::fs::set_permissions(&version_dir, std::fs::Permissions::from_mode(0o755))
        .map_err(io("setting the mode of", &version_dir))?;
    for (path, file) in payload {
        let full = version_dir.join(path);
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent).map_err(io("creating", parent))?;
        }
        std::fs::write(&full, &file.data).map_err(io("writing", &full))?;
        std::fs::set_permissions(&full, std::fs::Permissions::from_mode(file.mode))
            .map_err(io("setting the mode of", &full))?;
    }
    let tmp_link = dir.join(DATA_DIR_TMP_NAME);
    let _ = std::fs::remove_file(&tmp_link);
    std::os::unix::fs::symlink(&version, &tmp_link).map_err(io("linking", &tmp_link))?;
    std::fs::rename(&tmp_link, &data_link).map_err(io("switching", &data_link))?;
    let wanted = top_level_names(payload);
    for name in &wanted {
        let link = dir.join(name);
        if std::fs::read_link(&link).is_err() {
            let target = Path::new(DATA_DIR_NAME).join(name);
            std::os::unix::fs::symlink(&target, &link).map_err(io("linking", &link))?;
        }
    }
    remove_stale(dir, &wanted, &version);
    Ok(true)
}

/// Removes links of names no longer in the payload and versions other than `current`.
fn remove_stale(dir: &Path, wanted: &BTreeSet<String>, current: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name == DATA_DIR_NAME || name == current {
            continue;
        }
        if name.starts_with("..") {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = std::fs::remove_dir_all(&path);
            }
        } else if !wanted.contains(&name)
            && std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink())
        {
            let _ = std::fs::remove_file(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(files: &[(&str, &str, u32)]) -> Payload {
        files
            .iter()
            .map(|(p, d, m)| {
                (
                    (*p).to_owned(),
                    FileProjection {
                        data: d.as_bytes().to_vec(),
                        mode: *m,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn paths_that_leave_the_volume_are_rejected() {
        for bad in ["../x", "a/../../x", "/etc/passwd", "..data", "", "a/.."] {
            assert!(validate_path(bad).is_err(), "{bad}");
        }
        for good in ["a", "dir/b", "a..b", "./c"] {
            assert!(validate_path(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn files_are_reached_through_the_data_link_with_their_modes() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("vol");
        assert!(write(&dir, &payload(&[("a", "1", 0o644), ("d/b", "2", 0o400)])).expect("write"));
        assert_eq!(std::fs::read_to_string(dir.join("a")).expect("a"), "1");
        assert_eq!(std::fs::read_to_string(dir.join("d/b")).expect("b"), "2");
        assert_eq!(
            std::fs::read_link(dir.join("a")).expect("link"),
            Path::new("..data/a")
        );
        let mode = std::fs::metadata(dir.join("d/b"))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o400);
        assert!(!write(&dir, &payload(&[("a", "1", 0o644), ("d/b", "2", 0o400)])).expect("same"));
    }

    #[test]
    fn an_update_switches_the_data_link_and_drops_removed_names() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("vol");
        write(&dir, &payload(&[("a", "1", 0o644), ("gone", "x", 0o644)])).expect("write");
        let first = std::fs::read_link(dir.join(DATA_DIR_NAME)).expect("data");
        write(&dir, &payload(&[("a", "2", 0o644)])).expect("update");
        let second = std::fs::read_link(dir.join(DATA_DIR_NAME)).expect("data");
        assert_ne!(first, second);
        assert!(!dir.join(&first).exists(), "the old version is removed");
        assert_eq!(std::fs::read_to_string(dir.join("a")).expect("a"), "2");
        assert!(std::fs::symlink_metadata(dir.join("gone")).is_err());
    }

    #[test]
    fn an_invalid_path_writes_nothing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("vol");
        let err = write(
            &dir,
            &payload(&[("ok", "1", 0o644), ("../escape", "x", 0o644)]),
        );
        assert!(matches!(err, Err(AtomicError::InvalidPath { .. })));
        assert!(!dir.exists());
        assert!(!tmp.path().join("escape").exists());
    }
}
