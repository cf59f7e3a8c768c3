//! Where a `hostPath` volume lives on this machine: every embedded node is like a kind node, a
//! container with its own file system for the node-local state (`/var/lib/kubelet`,
//! `/var/run/kubevirt`, …), so node agents sharing a machine do not share that state.
//!
//! A [`HostPathMap`] lists path prefixes and the directory each one stands for. A `hostPath`
//! at or below a listed prefix resolves below its directory (the longest prefix wins); any
//! other path (`/dev`, `/proc`, `/sys`, a test's temporary directory) is the machine's own.
//!
//! The standard layout of a node whose data directory is `<data>` ([`HostPathMap::for_node`]):
//!
//! | `hostPath` prefix | resolves under |
//! |---|---|
//! | `/var/lib/kubelet/pods` | `<data>/pods` (the node's pod directories) |
//! | `/var/lib/kubelet` | `<data>/root/var/lib/kubelet` |
//! | `/var/run/kubevirt`, `/run/kubevirt` | `<data>/root/var/run/kubevirt` |
//! | `/var/run/kubevirt-private`, `/run/kubevirt-private` | `<data>/root/var/run/kubevirt-private`|
//! | `/var/lib/kubevirt` | `<data>/root/var/lib/kubevirt` |
//! | `/var/lib/kubevirt-rs` | `<data>/root/var/lib/kubevirt-rs` |
//! | `/opt/local-path-provisioner` ([`LOCAL_VOLUMES_PATH`]) | `<data>/storage` (local PersistentVolumes) |
//!
//! (`/var/run` is `/run` on a node, so both spellings name one directory.)
//!
//! # Guarantees
//! - A path with a `..` component is refused, mapped or not, with kubelet's message
//!   (``invalid HostPath `/a/../b`: must not contain '..'``).
//! - A mapped path never resolves outside its directory: symbolic links below the directory
//!   that lead out of it are refused, before and after the `type` check creates anything.
//! - The directory of a mapping is created (`0700`) when a path below it is first resolved,
//!   as a node's own `/var/lib/kubelet` exists before any pod asks for it.

use std::path::{Component, Path, PathBuf};

/// Where the node's local PersistentVolumes are as a `hostPath` names them (the directory
/// of k3s' local-path provisioner); [`HostPathMap::for_node`] maps it to
/// [`local_volumes_dir`].
pub const LOCAL_VOLUMES_PATH: &str = "/opt/local-path-provisioner";

/// The directory of a node's local PersistentVolumes on this machine: `<data>/storage`.
pub fn local_volumes_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("storage")
}

/// `hostPath` prefixes and the directories they stand for (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostPathMap {
    /// (prefix as pods write it, directory on this machine).
    prefixes: Vec<(PathBuf, PathBuf)>,
}

/// Why a `hostPath` cannot be resolved.
#[derive(Debug, thiserror::Error)]
pub enum HostPathError {
    /// The path has a `..` component.
    #[error("invalid HostPath `{0}`: must not contain '..'")]
    Backsteps(String),
    /// The path leads outside its mapped directory (through a symbolic link).
    #[error("invalid HostPath `{path}`: resolves outside {}", dir.display())]
    Escapes { path: String, dir: PathBuf },
    /// The mapped directory could not be created or inspected.
    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Whether `path` has a `..` component (kubelet's `ValidatePathNoBacksteps`).
fn has_backsteps(path: &str) -> bool {
    path.split('/').any(|part| part == "..")
}

impl HostPathMap {
    /// A map of `prefixes`: (path prefix as pods write it, directory it stands for).
    pub fn new(prefixes: impl IntoIterator<Item = (PathBuf, PathBuf)>) -> Self {
        Self {
            prefixes: prefixes.into_iter().collect(),
        }
    }

    /// The standard layout of the node whose data directory is `data_dir`, with its pods in
    /// `data_dir/pods` ([`crate::NodeConfig::pods_dir`]); see the module docs.
    pub fn for_node(data_dir: &Path) -> Self {
        let root = data_dir.join("root");
        let under_root = |path: &str| root.join(path.trim_start_matches('/'));
        Self::new([
            ("/var/lib/kubelet/pods".into(), data_dir.join("pods")),
            ("/var/lib/kubelet".into(), under_root("/var/lib/kubelet")),
            ("/var/run/kubevirt".into(), under_root("/var/run/kubevirt")),
            ("/run/kubevirt".into(), under_root("/var/run/kubevirt")),
            (
                "/var/run/kubevirt-private".into(),
                under_root("/var/run/kubevirt-private"),
            ),
            (
                "/run/kubevirt-private".into(),
                under_root("/var/run/kubevirt-private"),
            ),
            ("/var/lib/kubevirt".into(), under_root("/var/lib/kubevirt")),
            (
                "/var/lib/kubevirt-rs".into(),
                under_root("/var/lib/kubevirt-rs"),
            ),
            (LOCAL_VOLUMES_PATH.into(), local_volumes_dir(data_dir)),
        ])
    }

    /// The listed (prefix, directory) pairs.
    pub fn prefixes(&self) -> &[(PathBuf, PathBuf)] {
        &self.prefixes
    }

    /// The mapping `path` falls under (the longest matching prefix) and the rest of `path`
    /// below it; `None` for a path that stays the machine's.
    fn mapping_of<'a>(&'a self, path: &'a Path) -> Option<(&'a Path, &'a Path)> {
        self.prefixes
            .iter()
            .filter(|(prefix, _)| path.starts_with(prefix))
            .max_by_key(|(prefix, _)| prefix.components().count())
            .and_then(|(prefix, dir)| Some((dir.as_path(), path.strip_prefix(prefix).ok()?)))
    }

    /// Where the `hostPath` `path` is on this machine, before its `type` check: below its
    /// mapped directory (created if missing), or `path` itself. Returns the directory of the
    /// mapping too, for [`HostPathMap::check_inside`] once the `type` check has run.
    ///
    /// # Errors
    /// [`HostPathError`] for `..` components, a path leading out of its directory, or a
    /// mapped directory that cannot be created.
    pub fn resolve(&self, path: &str) -> Result<(PathBuf, Option<PathBuf>), HostPathError> {
        if has_backsteps(path) {
            return Err(HostPathError::Backsteps(path.to_owned()));
        }
        let requested = Path::new(path);
        let Some((dir, rest)) = self.mapping_of(requested) else {
            return Ok((requested.to_owned(), None));
        };
        private_fs::create_dir_all(dir).map_err(|source| HostPathError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let resolved: PathBuf = dir.join(
            rest.components()
                .filter(|c| matches!(c, Component::Normal(_)))
                .collect::<PathBuf>(),
        );
        Self::check_inside(path, &resolved, dir)?;
        Ok((resolved, Some(dir.to_owned())))
    }

    /// Checks that the deepest existing part of `resolved` is still inside `dir` once symbolic
    /// links are followed.
    ///
    /// # Errors
    /// [`HostPathError::Escapes`] when it is not, [`HostPathError::Io`] when `dir` cannot be
    /// inspected.
    pub fn check_inside(path: &str, resolved: &Path, dir: &Path) -> Result<(), HostPathError> {
        let dir_real = std::fs::canonicalize(dir).map_err(|source| HostPathError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let existing = resolved
            .ancestors()
            .find(|p| std::fs::symlink_metadata(p).is_ok())
            .unwrap_or(dir);
        // A dangling link is refused too: where it would lead is not known to be inside.
        let real = std::fs::canonicalize(existing).ok();
        if real.is_some_and(|real| real.starts_with(&dir_real)) {
            Ok(())
        } else {
            Err(HostPathError::Escapes {
                path: path.to_owned(),
                dir: dir.to_owned(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_listed_prefix_wins_and_other_paths_stay_the_machines() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("node");
        let map = HostPathMap::for_node(&data);
        let resolved = |p: &str| map.resolve(p).expect("resolves").0;
        assert_eq!(resolved("/var/lib/kubelet/pods"), data.join("pods"));
        assert_eq!(
            resolved("/var/lib/kubelet/pods/uid/volumes"),
            data.join("pods/uid/volumes")
        );
        assert_eq!(
            resolved("/var/lib/kubelet/device-plugins/"),
            data.join("root/var/lib/kubelet/device-plugins")
        );
        assert_eq!(
            resolved("/var/run/kubevirt"),
            data.join("root/var/run/kubevirt")
        );
        assert_eq!(
            resolved("/run/kubevirt/sockets"),
            data.join("root/var/run/kubevirt/sockets")
        );
        assert_eq!(
            resolved("/var/run/kubevirt-private"),
            data.join("root/var/run/kubevirt-private")
        );
        assert_eq!(
            resolved("/var/lib/kubevirt-rs//x/./y"),
            data.join("root/var/lib/kubevirt-rs/x/y")
        );
        // Prefixes match whole components only.
        assert_eq!(
            resolved("/var/lib/kubeletx"),
            PathBuf::from("/var/lib/kubeletx")
        );
        assert_eq!(
            resolved("/opt/local-path-provisioner/pvc-1"),
            data.join("storage/pvc-1")
        );
        assert_eq!(resolved("/dev/kvm"), PathBuf::from("/dev/kvm"));
        assert_eq!(resolved("/proc"), PathBuf::from("/proc"));
        assert!(data.join("root/var/lib/kubelet").is_dir());
        assert!(
            !data.join("root/var/lib/kubelet/device-plugins").exists(),
            "only the mapping's directory is created"
        );
        assert_eq!(
            HostPathMap::default()
                .resolve("/var/lib/kubelet")
                .expect("x")
                .0,
            PathBuf::from("/var/lib/kubelet")
        );
    }

    #[test]
    fn backsteps_are_refused_with_kubelets_message() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let map = HostPathMap::for_node(tmp.path());
        for path in ["/var/lib/kubelet/../../etc", "/tmp/../etc", ".."] {
            let e = map.resolve(path).expect_err("refused");
            assert_eq!(
                e.to_string(),
                format!("invalid HostPath `{path}`: must not contain '..'")
            );
        }
        assert!(map.resolve("/var/lib/kubelet/a..b").is_ok());
    }

    #[test]
    fn a_symbolic_link_out_of_the_mapped_directory_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("node");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&outside).expect("outside");
        let map = HostPathMap::for_node(&data);
        map.resolve("/var/run/kubevirt").expect("mapped dir");
        let dir = data.join("root/var/run/kubevirt");
        std::os::unix::fs::symlink(&outside, dir.join("out")).expect("link");
        std::os::unix::fs::symlink("inner", dir.join("in")).expect("link");
        std::fs::create_dir(dir.join("inner")).expect("inner");
        assert!(matches!(
            map.resolve("/var/run/kubevirt/out/x"),
            Err(HostPathError::Escapes { .. })
        ));
        assert!(matches!(
            map.resolve("/var/run/kubevirt/out"),
            Err(HostPathError::Escapes { .. })
        ));
        assert!(map.resolve("/var/run/kubevirt/in/x").is_ok());
    }
}
