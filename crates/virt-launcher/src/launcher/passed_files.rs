//! The files virt-handler passed the launcher (`passFile`), by key.
//!
//! A hotplugged claim's image lies outside the launcher's directories, where the launcher
//! may not open paths; virt-handler opens it and passes the open file instead. The launcher
//! keeps it here until a disk of the spec names its key (`passedFile`): QEMU then gets a copy
//! of the descriptor, at start by inheritance (`-add-fd`) or live by QMP `add-fd`.
//!
//! # Guarantees
//! - A key holds at most one file: passing another under the same key closes the first.
//! - [`PassedFiles::for_disks`] hands out duplicates, so a file replaced or removed while a
//!   start or an attach uses it stays open until that is done.
//! - The table's files are closed when a live-attached disk using them is detached, and when
//!   the launcher exits.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::{Mutex, PoisonError};

use nix::fcntl::{FcntlArg, OFlag, fcntl};

use crate::spec::Disk;

/// What a `passFile` without a descriptor is answered.
pub(super) const NO_DESCRIPTOR: &str = "passFile carries no file descriptor";

/// The passed files, by key.
#[derive(Debug, Default)]
pub(super) struct PassedFiles {
    files: Mutex<BTreeMap<String, OwnedFd>>,
}

impl PassedFiles {
    /// Keeps `fd` under `key` (the `passFile` command), closing a file kept there before.
    pub(super) fn insert(&self, key: &str, fd: Option<OwnedFd>) -> Result<(), String> {
        let fd = fd.ok_or(NO_DESCRIPTOR)?;
        if key.is_empty() {
            return Err("passFile needs a non-empty key".to_owned());
        }
        let replaced = self.lock().insert(key.to_owned(), fd);
        tracing::info!(key, replaced = replaced.is_some(), "received a passed file");
        Ok(())
    }

    /// Closes the file kept under `key`, if any.
    pub(super) fn remove(&self, key: &str) {
        if self.lock().remove(key).is_some() {
            tracing::info!(key, "closed a passed file");
        }
    }

    /// Duplicates of the passed files of those of `disks` that name one, by disk name.
    ///
    /// # Errors
    /// A message naming the disk when its key was not passed, or when the file's access mode
    /// does not fit the disk (QEMU finds a file in an fd set only by the exact access mode:
    /// read-write for a writable disk, read-only for a `readonly` disk or a CD-ROM).
    pub(super) fn for_disks<'a>(
        &self,
        disks: impl IntoIterator<Item = &'a Disk>,
    ) -> Result<BTreeMap<String, OwnedFd>, String> {
        let files = self.lock();
        let mut chosen = BTreeMap::new();
        for disk in disks {
            let Some(key) = &disk.passed_file else {
                continue;
            };
            let file = files.get(key).ok_or_else(|| {
                format!(
                    "disk {:?}: no file was passed with the key {key:?} (passFile first)",
                    disk.name
                )
            })?;
            let flags = fcntl(file, FcntlArg::F_GETFL)
                .map_err(|e| format!("disk {:?}: the passed file {key:?}: {e}", disk.name))?;
            let mode = OFlag::from_bits_truncate(flags) & OFlag::O_ACCMODE;
            let read_only = disk.readonly || disk.cdrom;
            let wanted = if read_only {
                OFlag::O_RDONLY
            } else {
                OFlag::O_RDWR
            };
            if mode != wanted {
                let needs = if read_only { "read-only" } else { "read-write" };
                return Err(format!(
                    "disk {:?}: the file passed with the key {key:?} is not open {needs}, as the disk needs",
                    disk.name
                ));
            }
            let copy = file
                .try_clone()
                .map_err(|e| format!("disk {:?}: the passed file {key:?}: {e}", disk.name))?;
            chosen.insert(disk.name.clone(), copy);
        }
        Ok(chosen)
    }

    /// A duplicate of the file kept under `key`.
    #[cfg(test)]
    pub(super) fn get(&self, key: &str) -> Option<OwnedFd> {
        self.lock().get(key).and_then(|fd| fd.try_clone().ok())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, OwnedFd>> {
        self.files.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(name: &str, key: Option<&str>, readonly: bool) -> Disk {
        serde_json::from_value(serde_json::json!({
            "name": name, "sourcePath": format!("/claims/{name}.img"),
            "passedFile": key, "readonly": readonly,
        }))
        .unwrap()
    }

    fn open(read_write: bool) -> OwnedFd {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::OpenOptions::new()
            .read(true)
            .write(read_write)
            .open(file.path())
            .unwrap()
            .into()
    }

    #[test]
    fn a_disk_gets_its_file_only_when_the_key_was_passed_with_the_right_access() {
        let files = PassedFiles::default();
        let disks = [disk("hot", Some("vol1"), false), disk("root", None, false)];
        let err = files.for_disks(&disks).unwrap_err();
        assert!(
            err.contains("\"vol1\"") && err.contains("passFile"),
            "{err}"
        );
        assert_eq!(files.insert("vol1", None).unwrap_err(), NO_DESCRIPTOR);
        files.insert("vol1", Some(open(false))).unwrap();
        let err = files.for_disks(&disks).unwrap_err();
        assert!(err.contains("read-write"), "{err}");
        files.insert("vol1", Some(open(true))).unwrap();
        let chosen = files.for_disks(&disks).unwrap();
        assert_eq!(chosen.keys().collect::<Vec<_>>(), ["hot"]);
        let read_only = [disk("iso", Some("vol1"), true)];
        assert!(
            files
                .for_disks(&read_only)
                .unwrap_err()
                .contains("read-only")
        );
        files.remove("vol1");
        assert!(files.get("vol1").is_none());
    }
}
