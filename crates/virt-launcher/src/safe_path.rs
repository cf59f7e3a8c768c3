//! Opening host paths without following symlinks or leaving a base directory.
//!
//! Paths in a launcher spec (disk images, kernels, sockets) come from the VMI and from
//! volumes a user controls. If such a path, or any directory on the way to it, is a
//! symlink, a user could point QEMU at a host file outside the VMI's directories
//! (upstream KubeVirt's CVEs of 2025–26 were of this kind). Every component is therefore
//! opened with `openat(…, O_NOFOLLOW)` relative to the already opened parent, starting at
//! the base directory, and `..` is refused outright.
//!
//! # Guarantees
//! - The returned descriptor refers to an object reached through real directories below
//!   `base`; no component was a symlink at the time it was opened.
//!
//! # Caveats
//! - QEMU receives a path, not the descriptor, so a component swapped for a symlink after
//!   the check is not caught; the check narrows the window to the directories the VMI's
//!   user can write, which the handler creates fresh per VMI.

use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;

/// A path that may not be used.
#[derive(Debug, thiserror::Error)]
pub enum SafePathError {
    /// The path contains `..` or is empty.
    #[error("path {0:?} contains '..' or is empty")]
    Traversal(PathBuf),
    /// An absolute path does not start with the base directory.
    #[error("path {path:?} is outside {base:?}")]
    OutsideBase {
        /// The base directory.
        base: PathBuf,
        /// The path given.
        path: PathBuf,
    },
    /// A component is a symlink.
    #[error("{component:?} of {path:?} is a symlink")]
    Symlink {
        /// The path given.
        path: PathBuf,
        /// The symlink component.
        component: PathBuf,
    },
    /// A component could not be opened.
    #[error("cannot open {component:?} of {path:?} without following symlinks")]
    Open {
        /// The path given.
        path: PathBuf,
        /// The component that failed.
        component: PathBuf,
        /// The error from `openat`; `ELOOP` means a symlink.
        #[source]
        source: nix::Error,
    },
}

/// Opens `path` (absolute below `base`, or relative to it) with `O_PATH`, following no
/// symlink on the way; the result can be used with `fstat` or as an `openat` directory.
///
/// # Errors
/// [`SafePathError`] on `..`, a path outside `base`, or any symlink component.
pub fn open_beneath(base: &Path, path: &Path) -> Result<OwnedFd, SafePathError> {
    let relative = relative_to_base(base, path)?;
    let open = |dir: &OwnedFd, name: &Path, flags: OFlag| {
        openat(
            dir,
            name,
            flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|source| SafePathError::Open {
            path: path.to_owned(),
            component: name.to_owned(),
            source,
        })
    };
    let root = nix::fcntl::open(
        base,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|source| SafePathError::Open {
        path: path.to_owned(),
        component: base.to_owned(),
        source,
    })?;
    let components: Vec<_> = relative.components().collect();
    let mut current = root;
    for component in &components {
        let Component::Normal(name) = component else {
            return Err(SafePathError::Traversal(path.to_owned()));
        };
        // No O_DIRECTORY: a symlinked directory must reach the check below, not fail
        // with ENOTDIR; a file in the middle fails at the next openat.
        current = open(&current, Path::new(name), OFlag::O_PATH)?;
        // With O_PATH, O_NOFOLLOW opens a symlink itself instead of failing: look.
        let stat = nix::sys::stat::fstat(&current).map_err(|source| SafePathError::Open {
            path: path.to_owned(),
            component: PathBuf::from(name),
            source,
        })?;
        if stat.st_mode & nix::libc::S_IFMT == nix::libc::S_IFLNK {
            return Err(SafePathError::Symlink {
                path: path.to_owned(),
                component: PathBuf::from(name),
            });
        }
    }
    Ok(current)
}

/// Checks `path` like [`open_beneath`] and returns it as an absolute path below `base`.
///
/// # Errors
/// As [`open_beneath`].
pub fn check_beneath(base: &Path, path: &Path) -> Result<PathBuf, SafePathError> {
    open_beneath(base, path)?;
    Ok(base.join(relative_to_base(base, path)?))
}

/// Checks that the parent directory of `path` is reachable below `base` without symlinks
/// and that `path` itself is not a symlink if it exists — for files QEMU is about to
/// create, such as sockets and logs.
///
/// # Errors
/// As [`open_beneath`].
pub fn check_parent_beneath(base: &Path, path: &Path) -> Result<PathBuf, SafePathError> {
    let relative = relative_to_base(base, path)?;
    let parent = relative.parent().unwrap_or(Path::new(""));
    if parent.as_os_str().is_empty() {
        nix::fcntl::open(base, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty()).map_err(
            |source| SafePathError::Open {
                path: path.to_owned(),
                component: base.to_owned(),
                source,
            },
        )?;
    } else {
        open_beneath(base, parent)?;
    }
    match open_beneath(base, &relative) {
        Ok(_) => {}
        Err(SafePathError::Open {
            source: nix::Error::ENOENT,
            ..
        }) => {}
        Err(e) => return Err(e),
    }
    Ok(base.join(relative))
}

fn relative_to_base(base: &Path, path: &Path) -> Result<PathBuf, SafePathError> {
    if path.as_os_str().is_empty() || path.components().any(|c| c == Component::ParentDir) {
        return Err(SafePathError::Traversal(path.to_owned()));
    }
    let relative = if path.is_absolute() {
        path.strip_prefix(base)
            .map_err(|_| SafePathError::OutsideBase {
                base: base.to_owned(),
                path: path.to_owned(),
            })?
            .to_owned()
    } else {
        path.to_owned()
    };
    Ok(relative
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("vmi/disks")).unwrap();
        std::fs::write(dir.path().join("vmi/disks/disk.img"), b"x").unwrap();
        dir
    }

    #[test]
    fn a_plain_file_below_the_base_opens() {
        let dir = tree();
        let base = dir.path();
        assert!(open_beneath(base, Path::new("vmi/disks/disk.img")).is_ok());
        let abs = base.join("vmi/disks/disk.img");
        assert_eq!(check_beneath(base, &abs).unwrap(), abs);
    }

    #[test]
    fn a_symlinked_file_is_refused_even_when_it_points_inside() {
        let dir = tree();
        symlink(
            dir.path().join("vmi/disks/disk.img"),
            dir.path().join("vmi/link.img"),
        )
        .unwrap();
        let err = open_beneath(dir.path(), Path::new("vmi/link.img")).unwrap_err();
        assert!(matches!(err, SafePathError::Symlink { .. }), "{err}");
    }

    #[test]
    fn a_symlinked_directory_escaping_the_base_is_refused() {
        let dir = tree();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        symlink(outside.path(), dir.path().join("vmi/escape")).unwrap();
        let err = open_beneath(dir.path(), Path::new("vmi/escape/secret")).unwrap_err();
        assert!(
            matches!(
                err,
                SafePathError::Symlink { .. } | SafePathError::Open { .. }
            ),
            "{err}"
        );
    }

    #[test]
    fn dot_dot_is_refused_before_touching_the_filesystem() {
        let dir = tree();
        let err = open_beneath(dir.path(), Path::new("vmi/../../etc/passwd")).unwrap_err();
        assert!(matches!(err, SafePathError::Traversal(_)), "{err}");
    }

    #[test]
    fn an_absolute_path_outside_the_base_is_refused() {
        let dir = tree();
        let err = open_beneath(dir.path(), Path::new("/etc/passwd")).unwrap_err();
        assert!(matches!(err, SafePathError::OutsideBase { .. }), "{err}");
    }

    #[test]
    fn a_socket_to_be_created_needs_only_a_real_parent() {
        let dir = tree();
        let sock = dir.path().join("vmi/qmp.sock");
        assert_eq!(check_parent_beneath(dir.path(), &sock).unwrap(), sock);
        symlink("/tmp", dir.path().join("vmi/qmp-link")).unwrap();
        assert!(check_parent_beneath(dir.path(), &dir.path().join("vmi/qmp-link")).is_err());
    }
}
