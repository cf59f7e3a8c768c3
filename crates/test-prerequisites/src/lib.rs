//! What tests need from the host — QEMU, the test guest, command-line tools — and one rule for
//! when it is missing.
//!
//! A plain `cargo test` on a machine without QEMU skips the tests that need it and says why.
//! `scripts/test.sh` installs every prerequisite and sets [`REQUIRE_ENV`], so there a missing
//! prerequisite fails the test instead: the suite cannot pass by skipping.
//!
//! ```no_run
//! # fn boots_a_guest() {
//! let Some(guest) = test_prerequisites::available(test_prerequisites::test_guest()) else {
//!     return; // skipped, and the reason is printed
//! };
//! let kernel = guest.kernel();
//! # }
//! ```
//!
//! # Guarantees
//! A [`TestGuest`] holds an exclusive lock on a file shared by every test process of the user,
//! so at most one test boots guests at a time (a test boots at most two) whatever the test
//! runner's grouping says. The lock is released when the `TestGuest` is dropped or the process
//! dies.

use std::fs::File;
use std::path::{Path, PathBuf};

pub mod registry;

/// Set (to anything but `0` or empty) by `scripts/test.sh`: a missing prerequisite is a failure.
pub const REQUIRE_ENV: &str = "KUBEVIRT_RS_REQUIRE_PREREQUISITES";

/// Where `scripts/build-test-guest.sh` put the test guest (`vmlinux`, `initramfs.cpio.gz`)
/// and `scripts/build-test-guest-disk.sh` its bootable disk image ([`DISK_IMAGE`]).
pub const GUEST_ENV: &str = "KUBEVIRT_RS_TEST_GUEST";

/// The test guest's bootable raw disk image in the guest directory: SYSLINUX on a FAT
/// "superfloppy" that BIOS firmware boots into the same kernel and initramfs, with
/// `console=ttyS0` (`scripts/build-test-guest-disk.sh`).
pub const DISK_IMAGE: &str = "disk.img";

/// Whether a missing prerequisite fails the test ([`REQUIRE_ENV`] is set).
pub fn required() -> bool {
    std::env::var_os(REQUIRE_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// `Some` when the prerequisite is there. Otherwise prints why the test skips and returns
/// `None` — or, when [`required`], panics with the reason, failing the test.
pub fn available<T>(prerequisite: Result<T, String>) -> Option<T> {
    available_when(required(), prerequisite)
}

fn available_when<T>(required: bool, prerequisite: Result<T, String>) -> Option<T> {
    match prerequisite {
        Ok(found) => Some(found),
        Err(why) if required => {
            panic!("missing test prerequisite: {why} ({REQUIRE_ENV} is set, so this fails)")
        }
        Err(why) => {
            eprintln!("skipped: {why}");
            None
        }
    }
}

/// `program` on `PATH`, or why it is missing (naming the Debian `package` that has it).
pub fn command(program: &str, package: &str) -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| format!("{program} is not installed (apt-get install {package})"))
}

/// `qemu-system-x86_64` on `PATH`.
pub fn qemu_binary() -> Result<PathBuf, String> {
    command("qemu-system-x86_64", "qemu-system-x86")
}

/// The test guest and QEMU to boot it, with the machine-wide guest lock held (see the
/// crate's Guarantees). The guest comes from [`GUEST_ENV`], else from the cache directory
/// `scripts/build-test-guest.sh` uses (`$XDG_CACHE_HOME` or `~/.cache`, then `kubevirt-rs/guest`).
pub fn test_guest() -> Result<TestGuest, String> {
    let dir = guest_dir()?;
    for file in ["vmlinux", "initramfs.cpio.gz"] {
        if !dir.join(file).is_file() {
            return Err(format!(
                "{} has no {file} (run scripts/build-test-guest.sh)",
                dir.display()
            ));
        }
    }
    let qemu = qemu_binary()?;
    let lock = lock_file(&guest_lock_path())?;
    Ok(TestGuest {
        dir,
        qemu,
        _lock: lock,
    })
}

/// The test guest's files and the lock that lets this test boot it.
#[derive(Debug)]
pub struct TestGuest {
    dir: PathBuf,
    qemu: PathBuf,
    _lock: File,
}

impl TestGuest {
    /// The directory holding `vmlinux` and `initramfs.cpio.gz`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The guest kernel.
    pub fn kernel(&self) -> PathBuf {
        self.dir.join("vmlinux")
    }

    /// The guest's initramfs.
    pub fn initrd(&self) -> PathBuf {
        self.dir.join("initramfs.cpio.gz")
    }

    /// The QEMU binary that boots it.
    pub fn qemu(&self) -> &Path {
        &self.qemu
    }

    /// The guest's bootable raw disk image ([`DISK_IMAGE`]), or why it is missing; for
    /// [`available`], which skips or fails the test as for the guest itself.
    ///
    /// # Errors
    /// When `scripts/build-test-guest-disk.sh` has not built it in [`Self::dir`].
    pub fn disk_image(&self) -> Result<PathBuf, String> {
        disk_image_in(&self.dir)
    }
}

fn disk_image_in(dir: &Path) -> Result<PathBuf, String> {
    let disk = dir.join(DISK_IMAGE);
    if disk.metadata().is_ok_and(|m| m.is_file() && m.len() > 0) {
        Ok(disk)
    } else {
        Err(format!(
            "{} has no {DISK_IMAGE} (run scripts/build-test-guest-disk.sh {})",
            dir.display(),
            dir.display()
        ))
    }
}

/// One `GUEST-SEES` report of the test guest's console: what it sees after boot and after
/// every CPU, memory or block device change (`scripts/build-test-guest.sh`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestSees {
    /// Online CPUs as the kernel lists them (`0-1`).
    pub cpus: String,
    /// `MemTotal` in KiB.
    pub mem_kib: u64,
    /// Block devices, comma-separated (`vda,sda`; empty for none).
    pub disks: String,
}

/// The `GUEST-SEES` reports in a console log, oldest first.
pub fn guest_reports(console: &str) -> Vec<GuestSees> {
    console
        .lines()
        .filter_map(|l| l.trim().strip_prefix("GUEST-SEES "))
        .map(|l| {
            let field = |key: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(key))
                    .unwrap_or_default()
                    .to_owned()
            };
            GuestSees {
                cpus: field("cpus="),
                mem_kib: field("mem=").parse().unwrap_or(0),
                disks: field("disks="),
            }
        })
        .collect()
}

fn guest_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os(GUEST_ENV).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache")))
        .ok_or_else(|| format!("{GUEST_ENV} is not set and neither is XDG_CACHE_HOME or HOME"))?;
    Ok(cache.join("kubevirt-rs/guest"))
}

fn guest_lock_path() -> PathBuf {
    std::env::temp_dir().join(format!("kubevirt-rs-test-guest-{}.lock", uid()))
}

/// Blocks until this process holds the exclusive lock on `path`.
fn lock_file(path: &Path) -> Result<File, String> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| format!("cannot open the guest lock {}: {e}", path.display()))?;
    file.lock()
        .map_err(|e| format!("cannot take the guest lock {}: {e}", path.display()))?;
    Ok(file)
}

fn uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map_or(0, |m| m.uid())
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_that_is_not_on_path_names_its_package() {
        let why = command("kubevirt-rs-no-such-program", "some-package").unwrap_err();
        assert!(why.contains("apt-get install some-package"), "{why}");
    }

    #[test]
    fn a_program_on_path_is_found() {
        let sh = command("sh", "dash").expect("sh is on PATH");
        assert!(sh.is_absolute(), "{}", sh.display());
    }

    #[test]
    fn a_missing_disk_image_names_the_script_that_builds_it() {
        let dir = std::env::temp_dir().join(format!("prereq-disk-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let why = disk_image_in(&dir).unwrap_err();
        assert!(why.contains("scripts/build-test-guest-disk.sh"), "{why}");
        std::fs::write(dir.join(DISK_IMAGE), b"").expect("empty disk");
        assert!(disk_image_in(&dir).is_err(), "an empty file is no disk");
        std::fs::write(dir.join(DISK_IMAGE), b"disk").expect("disk");
        assert_eq!(disk_image_in(&dir), Ok(dir.join(DISK_IMAGE)));
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn an_available_prerequisite_is_returned() {
        assert_eq!(available::<u8>(Ok(7)), Some(7));
    }

    #[test]
    fn a_missing_prerequisite_skips_unless_required() {
        assert_eq!(available_when::<u8>(false, Err("no qemu".into())), None);
        let failed = std::panic::catch_unwind(|| available_when::<u8>(true, Err("no qemu".into())));
        let message = failed.expect_err("required and missing must fail");
        let message = message
            .downcast_ref::<String>()
            .expect("a formatted message");
        assert!(
            message.contains("no qemu") && message.contains(REQUIRE_ENV),
            "{message}"
        );
    }

    #[test]
    fn a_second_lock_waits_for_the_first() {
        let dir = std::env::temp_dir().join(format!("prereq-lock-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("guest.lock");
        let first = lock_file(&path).expect("first lock");
        let other = File::options().write(true).open(&path).expect("open lock");
        assert!(matches!(
            other.try_lock(),
            Err(std::fs::TryLockError::WouldBlock)
        ));
        drop(first);
        other.try_lock().expect("free after the first is dropped");
        drop(other);
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
