//! Owner-only files, directories and sockets, whatever the process umask.
//!
//! Everything below the handler's data directory — pod directories, disks, logs, process
//! records, sockets — belongs to the user that runs the node agent and its launchers, and to
//! nobody else: a guest disk or a console socket readable by another local user is a leak.
//! These helpers give directories `0700` and files `0600` at creation and then set the mode
//! explicitly, because the creation mode is filtered through the umask. Used by the launcher,
//! virt-handler and the embedded node agent, so there is one implementation; it knows neither.

pub mod log_rotation;

use std::fs::{File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of private directories.
pub const DIR_MODE: u32 = 0o700;
/// Mode of private files and sockets.
pub const FILE_MODE: u32 = 0o600;
/// The umask under which children (launcher, QEMU) create their files and sockets.
pub const CHILD_UMASK: u32 = 0o077;

/// Sets `path`'s permission bits to `mode` (following no symlink is not needed here: every
/// caller names a path it has just created).
///
/// # Errors
/// The `chmod` error.
pub fn set_mode(path: &Path, mode: u32) -> io::Result<()> {
    std::fs::set_permissions(path, Permissions::from_mode(mode))
}

/// Creates `path` and its missing parents with mode `0700` and sets `path` itself to `0700`
/// (also when it existed: a directory made by an earlier version under a permissive umask is
/// tightened).
///
/// # Errors
/// The `mkdir` or `chmod` error.
pub fn create_dir_all(path: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(path)?;
    set_mode(path, DIR_MODE)
}

/// Opens `path` for appending, creating it with mode `0600`, and sets the mode to `0600`.
///
/// # Errors
/// The `open` or `chmod` error.
pub fn open_append(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(FILE_MODE)
        .open(path)?;
    file.set_permissions(Permissions::from_mode(FILE_MODE))?;
    Ok(file)
}

/// Opens `path` for writing, created or truncated, with mode `0600`.
///
/// # Errors
/// The `open` or `chmod` error.
pub fn create_truncated(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .open(path)?;
    file.set_permissions(Permissions::from_mode(FILE_MODE))?;
    Ok(file)
}

/// Writes `bytes` to `path` (created or truncated) with mode `0600`.
///
/// # Errors
/// The `open`, `chmod` or `write` error.
pub fn write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    create_truncated(path)?.write_all(bytes)
}

/// Writes `bytes` to `path` atomically (a `0600` temporary file `path.tmp`, then a rename).
///
/// # Errors
/// As [`write`], or the rename error.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permission bits of `path` (without following a final symlink).
    fn mode_of(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .expect("metadata")
            .permissions()
            .mode()
            & 0o777
    }

    /// Clears the umask of this test process (nextest runs each test in its own process).
    fn permissive_umask() {
        nix::sys::stat::umask(nix::sys::stat::Mode::empty());
    }

    #[test]
    fn files_and_directories_are_private_under_a_permissive_umask() {
        permissive_umask();
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("a/b");
        create_dir_all(&dir).expect("mkdir");
        assert_eq!(mode_of(&dir), DIR_MODE);
        assert_eq!(mode_of(&tmp.path().join("a")), DIR_MODE);
        let log = dir.join("x.log");
        drop(open_append(&log).expect("open"));
        assert_eq!(mode_of(&log), FILE_MODE);
        let record = dir.join("x.json");
        write_atomic(&record, b"{}").expect("write");
        assert_eq!(mode_of(&record), FILE_MODE);
    }

    #[test]
    fn an_existing_permissive_directory_is_tightened() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("old");
        std::fs::create_dir(&dir).expect("mkdir");
        set_mode(&dir, 0o755).expect("chmod");
        create_dir_all(&dir).expect("mkdir again");
        assert_eq!(mode_of(&dir), DIR_MODE);
    }
}
