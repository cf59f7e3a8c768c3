//! Caps append-only logs as kubelet caps container logs: past [`MAX_LOG_BYTES`] the log is
//! rotated, and with the log [`MAX_LOG_FILES`] files are kept (`<log>`, `<log>.1` the newest
//! rotated one … `<log>.4` the oldest); the oldest is dropped at the next rotation.
//!
//! The writers (QEMU's serial console log, a container's stdout) hold the file open in append
//! mode and cannot be asked to reopen it, so rotation copies and truncates (logrotate's
//! `copytruncate`): the content is copied to a temporary file, the log is truncated to zero
//! (the writers go on appending at its new end), and the copy replaces `<log>.1` atomically.
//! Readers following the log start again from its beginning when it shrank or when `<log>.1`
//! is a new file (each rotation makes a new inode), even if the log has grown past their
//! offset again since.
//!
//! # Caveats
//! Bytes appended between the copy and the truncation are lost (a window of one copy of at
//! most a few MiB).

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

/// The size past which a log is rotated (kubelet's default `containerLogMaxSize`).
pub const MAX_LOG_BYTES: u64 = 10 * 1024 * 1024;

/// How many files of one log are kept, the current one included (kubelet's default
/// `containerLogMaxFiles`).
pub const MAX_LOG_FILES: usize = 5;

/// `<log>.1`: where the newest rotated content of a log is kept.
pub fn rotated_path(log: &Path) -> PathBuf {
    numbered(log, 1)
}

/// `<log>.n`.
fn numbered(log: &Path, n: usize) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

/// Rotates `log` when it is larger than `max_bytes`, keeping [`MAX_LOG_FILES`] files; returns
/// whether it did. A missing log is not an error (nothing to rotate).
///
/// # Errors
/// As [`rotate_keeping`].
pub fn rotate_if_larger(log: &Path, max_bytes: u64) -> io::Result<bool> {
    rotate_keeping(log, max_bytes, MAX_LOG_FILES)
}

/// Rotates `log` when it is larger than `max_bytes`, keeping `max_files` files of it (the log
/// and `max_files - 1` rotated ones; at least one rotated file is kept); returns whether it
/// did.
///
/// # Errors
/// The I/O error of the copy, the truncation or a rename; the log is left as it was when
/// the copy fails.
pub fn rotate_keeping(log: &Path, max_bytes: u64, max_files: usize) -> io::Result<bool> {
    let len = match std::fs::metadata(log) {
        Ok(meta) => meta.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if len <= max_bytes {
        return Ok(false);
    }
    let rotated = rotated_path(log);
    let mut tmp = rotated.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut source = File::open(log)?;
        let mut copy = crate::create_truncated(&tmp)?;
        io::copy(&mut source, &mut copy)?;
    }
    // Truncate before the renames: a reader that sees `<log>.1` change knows the log has
    // been truncated already.
    OpenOptions::new().write(true).open(log)?.set_len(0)?;
    let kept = max_files.max(2) - 1;
    for n in (1..kept).rev() {
        match std::fs::rename(numbered(log, n), numbered(log, n + 1)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    std::fs::rename(&tmp, &rotated)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn a_log_past_the_limit_is_kept_once_rotated_and_its_writer_goes_on_at_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("guest-console-log.log");
        let mut writer = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        writer.write_all(b"first boot\n").unwrap();
        assert!(!rotate_if_larger(&log, 64).unwrap(), "under the limit");
        writer.write_all(&[b'x'; 100]).unwrap();
        assert!(rotate_if_larger(&log, 64).unwrap());
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
        let kept = std::fs::read(rotated_path(&log)).unwrap();
        assert!(kept.starts_with(b"first boot\n") && kept.len() == 111);
        writer.write_all(b"after\n").unwrap();
        assert_eq!(std::fs::read(&log).unwrap(), b"after\n");
        // A second rotation moves the first rotated file up.
        writer.write_all(&[b'y'; 100]).unwrap();
        assert!(rotate_if_larger(&log, 64).unwrap());
        assert!(
            std::fs::read(rotated_path(&log))
                .unwrap()
                .starts_with(b"after\n")
        );
        assert!(
            std::fs::read(dir.path().join("guest-console-log.log.2"))
                .unwrap()
                .starts_with(b"first boot\n")
        );
    }

    #[test]
    fn five_files_of_a_log_are_kept_and_the_oldest_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("compute.log");
        let mut writer = crate::open_append(&log).unwrap();
        for round in 0..7u8 {
            writer.write_all(&[b'a' + round; 100]).unwrap();
            assert!(rotate_if_larger(&log, 64).unwrap());
        }
        writer.write_all(b"current\n").unwrap();
        let names: Vec<String> = {
            let mut names: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        assert_eq!(
            names,
            [
                "compute.log",
                "compute.log.1",
                "compute.log.2",
                "compute.log.3",
                "compute.log.4"
            ],
            "{MAX_LOG_FILES} files in all"
        );
        assert_eq!(std::fs::read(&log).unwrap(), b"current\n");
        // Newest first: rounds 6, 5, 4, 3; rounds 0..=2 were dropped.
        for (n, round) in [(1, 6u8), (2, 5), (3, 4), (4, 3)] {
            assert_eq!(
                std::fs::read(numbered(&log, n)).unwrap(),
                vec![b'a' + round; 100]
            );
        }
    }

    #[test]
    fn a_missing_log_is_not_rotated() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!rotate_if_larger(&dir.path().join("none.log"), 1).unwrap());
    }
}
