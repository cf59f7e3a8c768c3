//! Named, persistent network namespaces, kept as `ip netns` keeps them: an empty file
//! `<run dir>/<name>` (by default `/run/netns/<name>`) on which the namespace's nsfs file is
//! bind-mounted. The mount holds the namespace alive with no process in it, and the path is what
//! the CNI plugins get as `CNI_NETNS`.
//!
//! # How
//! Done in-process with `nix` rather than by running `ip netns add`: a short-lived thread
//! unshares its network namespace (`CLONE_NEWNET` changes only the calling thread), sets `IFF_UP`
//! on its `lo` with the interface-flags ioctl, and bind-mounts `/proc/thread-self/ns/net` onto the
//! file; then the thread ends and the mount keeps the namespace. This needs no helper program and
//! lets the run directory be chosen (iproute2 compiles `/run/netns` in), which tests use to keep
//! their namespaces to themselves. Everything past `lo` — veths, addresses, routes — is the CNI
//! plugins' work (see [`crate::CniNetwork`]).
//!
//! # Caveats
//! `ip netns` also turns the run directory into a shared mount of its own, so that namespaces
//! added later appear in mount namespaces cloned earlier. Pods here are host processes in the
//! host's mount namespace, so that is not done. Deleting a namespace removes its name; the
//! namespace itself lives on until the last process in it exits and the last descriptor to it is
//! closed.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};
use nix::sys::statfs::{NSFS_MAGIC, statfs};

/// Where `ip netns` keeps its named network namespaces, and the default run directory here.
pub const DEFAULT_RUN_DIR: &str = "/run/netns";

/// A failed operation on a network namespace.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The name is empty, `.` or `..`, or contains `/` or NUL.
    #[error("invalid network namespace name {name:?}")]
    InvalidName {
        /// The rejected name.
        name: String,
    },
    /// The run directory could not be created.
    #[error("cannot create the network namespace directory {}", dir.display())]
    CreateRunDir {
        /// The run directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A namespace of that name exists already (open it instead).
    #[error("network namespace {} exists already", path.display())]
    AlreadyExists {
        /// Its path.
        path: PathBuf,
    },
    /// The file to mount the namespace on could not be created.
    #[error("cannot create the mount point {}", path.display())]
    CreateMountPoint {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The thread that creates the namespace could not be started or panicked.
    #[error("the thread that creates or enters a network namespace failed")]
    Thread(#[source] io::Error),
    /// `unshare(CLONE_NEWNET)` failed (it needs `CAP_SYS_ADMIN`).
    #[error("cannot create a network namespace")]
    Unshare(#[source] Errno),
    /// `lo` could not be brought up inside the new namespace.
    #[error("cannot bring lo up in the new network namespace")]
    LoopbackUp(#[source] io::Error),
    /// The namespace could not be bind-mounted onto its file.
    #[error("cannot bind-mount the network namespace on {}", path.display())]
    BindMount {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: Errno,
    },
    /// The namespace's file could not be opened or examined.
    #[error("cannot open the network namespace {}", path.display())]
    Open {
        /// Its path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The file exists but no namespace is mounted on it.
    #[error("{} is not a mounted namespace", path.display())]
    NotANamespace {
        /// The file.
        path: PathBuf,
    },
    /// Joining the namespace (`setns`) failed.
    #[error("cannot enter the network namespace {}", path.display())]
    Enter {
        /// Its path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The namespace could not be unmounted from its file.
    #[error("cannot unmount the network namespace {}", path.display())]
    Unmount {
        /// Its path.
        path: PathBuf,
        /// Why.
        #[source]
        source: Errno,
    },
    /// The namespace's file could not be removed after unmounting.
    #[error("cannot remove {}", path.display())]
    Remove {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// A named, persistent network namespace: the path of its bind-mounted nsfs file.
///
/// Dropping the value does nothing; the namespace lasts until [`delete`](Self::delete) (or a
/// reboot), so a restarted node agent re-adopts it with [`open`](Self::open).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkNamespace {
    path: PathBuf,
}

impl NetworkNamespace {
    /// Creates `/run/netns/<name>` with `lo` up, as `ip netns add <name>` does.
    pub fn create(name: &str) -> Result<Self, NetnsError> {
        Self::create_in(Path::new(DEFAULT_RUN_DIR), name)
    }

    /// Creates the namespace `<run_dir>/<name>` with `lo` up, creating `run_dir` if needed.
    pub fn create_in(run_dir: &Path, name: &str) -> Result<Self, NetnsError> {
        let path = named(run_dir, name)?;
        std::fs::create_dir_all(run_dir).map_err(|source| NetnsError::CreateRunDir {
            dir: run_dir.to_path_buf(),
            source,
        })?;
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|source| match source.kind() {
                io::ErrorKind::AlreadyExists => NetnsError::AlreadyExists { path: path.clone() },
                _ => NetnsError::CreateMountPoint {
                    path: path.clone(),
                    source,
                },
            })?;
        let mounted = std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("netns-create".into())
                .spawn_scoped(scope, || mount_new_namespace(&path))
                .map_err(NetnsError::Thread)?
                .join()
                .map_err(|_| NetnsError::Thread(io::Error::other("panicked")))?
        });
        if let Err(error) = mounted {
            // Nothing is mounted on the file on any failure path; best effort.
            let _ = std::fs::remove_file(&path);
            return Err(error);
        }
        tracing::debug!(path = %path.display(), "created network namespace");
        Ok(Self { path })
    }

    /// Opens the existing namespace `/run/netns/<name>`.
    pub fn open(name: &str) -> Result<Self, NetnsError> {
        Self::open_in(Path::new(DEFAULT_RUN_DIR), name)
    }

    /// Opens the existing namespace `<run_dir>/<name>`, e.g. after the node agent restarted.
    pub fn open_in(run_dir: &Path, name: &str) -> Result<Self, NetnsError> {
        Self::open_path(named(run_dir, name)?)
    }

    /// Opens the namespace mounted at `path`; fails unless a namespace is mounted there.
    pub fn open_path(path: impl Into<PathBuf>) -> Result<Self, NetnsError> {
        let path = path.into();
        let fs = statfs(&path).map_err(|errno| NetnsError::Open {
            path: path.clone(),
            source: errno.into(),
        })?;
        if fs.filesystem_type() != NSFS_MAGIC {
            return Err(NetnsError::NotANamespace { path });
        }
        Ok(Self { path })
    }

    /// The namespace's file: what `CNI_NETNS` gets.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The namespace's name (its file name).
    pub fn name(&self) -> &str {
        self.path
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or_default()
    }

    /// Opens a close-on-exec descriptor of the namespace, for [`crate::join_in_child`] or
    /// [`crate::enter`]. Open it before forking: opening is not async-signal-safe.
    pub fn enter_fd(&self) -> Result<OwnedFd, NetnsError> {
        File::open(&self.path)
            .map(OwnedFd::from)
            .map_err(|source| NetnsError::Open {
                path: self.path.clone(),
                source,
            })
    }

    /// Moves the calling thread (only it) into the namespace. Sockets it then creates belong to
    /// the namespace for their whole life, whichever thread uses them later.
    pub fn enter_current_thread(&self) -> Result<(), NetnsError> {
        let fd = self.enter_fd()?;
        crate::enter(std::os::fd::AsFd::as_fd(&fd)).map_err(|source| NetnsError::Enter {
            path: self.path.clone(),
            source,
        })
    }

    /// Runs `f` on a new thread inside the namespace and returns its result; the calling thread
    /// stays where it is. Handy to open a listening or connecting socket in a pod's network.
    pub fn run_in<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, NetnsError> {
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("netns-run".into())
                .spawn_scoped(scope, || {
                    self.enter_current_thread()?;
                    Ok(f())
                })
                .map_err(NetnsError::Thread)?
                .join()
                .map_err(|_| NetnsError::Thread(io::Error::other("panicked")))?
        })
    }

    /// Unmounts the namespace from its file and removes the file, as `ip netns delete` does.
    pub fn delete(self) -> Result<(), NetnsError> {
        delete_path(&self.path)
    }
}

/// Deletes the namespace mounted at `path`, as [`NetworkNamespace::delete`]; a missing file or
/// one with nothing mounted on it is not an error, so deleting twice (or after a reboot, when
/// `/run` is empty) succeeds.
pub fn delete_path(path: &Path) -> Result<(), NetnsError> {
    match umount2(path, MntFlags::MNT_DETACH) {
        Ok(()) | Err(Errno::ENOENT | Errno::EINVAL) => {}
        Err(source) => {
            return Err(NetnsError::Unmount {
                path: path.to_path_buf(),
                source,
            });
        }
    }
    match std::fs::remove_file(path) {
        Ok(()) => {
            tracing::debug!(path = %path.display(), "deleted network namespace");
            Ok(())
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(NetnsError::Remove {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// `<run_dir>/<name>` for a valid name.
fn named(run_dir: &Path, name: &str) -> Result<PathBuf, NetnsError> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(NetnsError::InvalidName {
            name: name.to_owned(),
        });
    }
    Ok(run_dir.join(name))
}

/// On a thread of its own: a new network namespace for this thread, `lo` up, and the namespace
/// bind-mounted on `path`. The thread must end afterwards (it is in the new namespace).
fn mount_new_namespace(path: &Path) -> Result<(), NetnsError> {
    unshare(CloneFlags::CLONE_NEWNET).map_err(NetnsError::Unshare)?;
    crate::sys::set_link_up("lo", true).map_err(NetnsError::LoopbackUp)?;
    mount(
        Some("/proc/thread-self/ns/net"),
        path,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|source| NetnsError::BindMount {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_not_one_path_component_are_rejected() {
        for name in ["", ".", "..", "a/b", "nul\0"] {
            assert!(
                matches!(
                    named(Path::new("/x"), name),
                    Err(NetnsError::InvalidName { .. })
                ),
                "{name:?}"
            );
        }
        assert_eq!(
            named(Path::new("/x"), "pod-1").unwrap(),
            Path::new("/x/pod-1")
        );
    }

    #[test]
    fn deleting_a_path_that_does_not_exist_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        delete_path(&dir.path().join("gone")).unwrap();
    }

    #[test]
    fn a_plain_file_is_not_opened_as_a_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(
            NetworkNamespace::open_path(&file),
            Err(NetnsError::NotANamespace { .. })
        ));
    }
}
