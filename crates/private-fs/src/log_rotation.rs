//! Caps append-only logs as kubelet caps container logs: past [`MAX_LOG_BYTES`] the log is
//! rotated and one rotated file, `<log>.1`, is kept.
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

/// `<log>.1`: where a rotated log's content is kept.
pub fn rotated_path(log: &Path) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

/// Rotates `log` when it is larger than `max_bytes`; returns whether it did. A missing log is
/// not an error (nothing to rotate).
///
/// # Errors
/// The I/O error of the copy, the truncation or the rename; the log is left as it was when
/// the copy fails.
pub fn rotate_if_larger(log: &Path, max_bytes: u64) -> io::Result<bool> {
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
    // Truncate before the rename: a reader that sees a new `<log>.1` knows the log has
    // been truncated already.
    OpenOptions::new().write(true).open(log)?.set_len(0)?;
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
        // A second rotation replaces the first rotated file: one is kept.
        writer.write_all(&[b'y'; 100]).unwrap();
        assert!(rotate_if_larger(&log, 64).unwrap());
        assert!(
            std::fs::read(rotated_path(&log))
                .unwrap()
                .starts_with(b"after\n")
        );
        assert!(!dir.path().join("guest-console-log.log.2").exists());
    }

    #[test]
    fn a_missing_log_is_not_rotated() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!rotate_if_larger(&dir.path().join("none.log"), 1).unwrap());
    }
}
