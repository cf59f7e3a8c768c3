//! The local provisioner (`kubevirt-rs.io/local`, the embedded server's default class): a
//! claim's volume is a directory of its node, `pvc-<claim uid>`, below the node's local
//! volume directory.
//!
//! A node sees that directory as a `hostPath` ([`LocalStorage::node_path`], e.g.
//! `/opt/local-path-provisioner/pvc-<uid>`), which its host-path map resolves below its data
//! directory; this process, on the same machine, reaches it as
//! [`LocalStorage::nodes`]`[node]/pvc-<uid>`. The PersistentVolume carries the node path and a
//! required node affinity to `kubernetes.io/hostname=<node>`.
//!
//! A `volumeMode: Block` claim's volume is the same directory holding [`BLOCK_IMAGE`], a sparse
//! file of the requested size attached to a loop device ([`super::loop_device`]); the volume is
//! a `Block` one whose `local` path is that file, and the node gives a pod the loop device
//! attached to it (attaching one again after a reboot), as kubelet does for a file-backed block
//! volume. Releasing the volume detaches its loop devices before the directory goes.
//!
//! # Guarantees
//! - Only a directory this provisioner names is created or deleted: the volume's name is a
//!   single path element starting `pvc-`, its `hostPath` (a `Block` volume's `local` path) is
//!   exactly the node path of that name (of its [`BLOCK_IMAGE`]), its node is one this process
//!   knows, and the directory on this machine is a real directory (not a symbolic link)
//!   directly inside the node's volume directory. Anything else is refused with a
//!   [`PathError`] and nothing is touched.
//!
//! # Caveats
//! Capacity is not enforced for a `Filesystem` volume: a directory holds what its file system
//! lets it. A `Block` volume's image is sparse: its blocks are taken as the guest writes.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use serde_json::json;

/// The provisioner name of the local class.
pub const PROVISIONER: &str = "kubevirt-rs.io/local";
/// The image file of a `Block`-mode volume in its directory.
pub const BLOCK_IMAGE: &str = "block.img";

/// Where the local volumes of the embedded nodes are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalStorage {
    /// The directory of local volumes as a node's `hostPath` names it.
    pub node_path: PathBuf,
    /// Node name → that directory on this machine. Empty: nothing is provisioned.
    pub nodes: BTreeMap<String, PathBuf>,
}

/// Why a volume's directory is not one the provisioner may touch, or touching it failed.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// The volume's name is not `pvc-…` as a single path element.
    #[error("volume name {0:?} is not one the local provisioner gives")]
    Name(String),
    /// The volume has no `hostPath` (or `local`) path of the node directory.
    #[error("volume {volume} has path {path:?}, not {expected:?}")]
    Path {
        volume: String,
        path: Option<String>,
        expected: PathBuf,
    },
    /// The volume's node is not one of this machine's.
    #[error("volume {volume} is on node {node:?}, which has no local volume directory here")]
    Node {
        volume: String,
        node: Option<String>,
    },
    /// The directory on this machine is not a plain directory inside the node's volume
    /// directory (a symbolic link, a file).
    #[error("{} is not a directory of the local provisioner", path.display())]
    NotOurs { path: PathBuf },
    /// Creating, inspecting or removing the directory failed.
    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The name of a claim's volume: `pvc-<claim uid>`, as kube's provisioners name them.
pub fn volume_name(claim_uid: &str) -> String {
    format!("pvc-{claim_uid}")
}

/// Whether `name` is a single path element starting `pvc-`.
fn is_volume_name(name: &str) -> bool {
    let mut parts = Path::new(name).components();
    name.starts_with("pvc-")
        && !name.contains('/')
        && matches!(parts.next(), Some(Component::Normal(_)))
        && parts.next().is_none()
}

/// The node a volume's required node affinity names (`kubernetes.io/hostname In [node]`).
pub fn volume_node(volume: &PersistentVolume) -> Option<&str> {
    volume
        .spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms
        .first()?
        .match_expressions
        .as_ref()?
        .iter()
        .find(|r| r.key == "kubernetes.io/hostname" && r.operator == "In")?
        .values
        .as_ref()?
        .first()
        .map(String::as_str)
}

impl LocalStorage {
    /// The directory of `volume` on this machine, after the checks of the module docs (the
    /// directory itself need not exist).
    ///
    /// # Errors
    /// [`PathError`] when the volume is not one this provisioner would have made here.
    pub fn local_dir(&self, volume: &PersistentVolume) -> Result<PathBuf, PathError> {
        let name = volume.metadata.name.clone().unwrap_or_default();
        if !is_volume_name(&name) {
            return Err(PathError::Name(name));
        }
        let spec = volume.spec.as_ref();
        let path = spec
            .and_then(|s| s.host_path.as_ref().map(|h| h.path.clone()))
            .or_else(|| spec.and_then(|s| s.local.as_ref().map(|l| l.path.clone())));
        let block = spec.and_then(|s| s.volume_mode.as_deref()) == Some("Block");
        let expected = if block {
            self.node_path.join(&name).join(BLOCK_IMAGE)
        } else {
            self.node_path.join(&name)
        };
        if self.node_path.as_os_str().is_empty()
            || path.as_deref().map(Path::new) != Some(&expected)
        {
            return Err(PathError::Path {
                volume: name,
                path,
                expected,
            });
        }
        let node = volume_node(volume);
        let Some(base) = node.and_then(|n| self.nodes.get(n)) else {
            return Err(PathError::Node {
                volume: name,
                node: node.map(str::to_owned),
            });
        };
        let dir = base.join(&name);
        check_plain_dir(base, &dir)?;
        Ok(dir)
    }

    /// Creates the directory of a new volume `name` on `node` and returns it.
    ///
    /// # Errors
    /// [`PathError`] for an unknown node, a bad name, a link in the way, or an I/O error.
    pub fn create_dir(&self, node: &str, name: &str) -> Result<PathBuf, PathError> {
        if !is_volume_name(name) {
            return Err(PathError::Name(name.to_owned()));
        }
        let Some(base) = self.nodes.get(node) else {
            return Err(PathError::Node {
                volume: name.to_owned(),
                node: Some(node.to_owned()),
            });
        };
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| PathError::Io { path, source }
        };
        private_fs::create_dir_all(base).map_err(io(base))?;
        let dir = base.join(name);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(&dir)(e)),
        }
        check_plain_dir(base, &dir)?;
        private_fs::set_mode(&dir, 0o700).map_err(io(&dir))?;
        Ok(dir)
    }

    /// Removes the directory of `volume` and everything in it (nothing when it is gone).
    ///
    /// # Errors
    /// [`PathError`] when the volume is not this provisioner's here or removal fails.
    pub fn delete_dir(&self, volume: &PersistentVolume) -> Result<(), PathError> {
        let dir = self.local_dir(volume)?;
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(PathError::Io { path: dir, source }),
        }
    }

    /// Creates the sparse image of `size` bytes of a new `Block` volume in its directory
    /// `dir` (from [`Self::create_dir`]), owner-only; an existing one (a retried
    /// provisioning) is kept. Returns the image.
    ///
    /// # Errors
    /// [`PathError::NotOurs`] for anything but a regular file in its place, or an I/O error.
    pub fn create_block_image(&self, dir: &Path, size: u64) -> Result<PathBuf, PathError> {
        use std::os::unix::fs::OpenOptionsExt;
        let image = dir.join(BLOCK_IMAGE);
        let created = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            // `create_new` (O_EXCL) fails on anything in place, a symbolic link included.
            .mode(0o600)
            .open(&image);
        match created {
            Ok(file) => file.set_len(size).map_err(|source| PathError::Io {
                path: image.clone(),
                source,
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let regular = std::fs::symlink_metadata(&image).is_ok_and(|m| m.is_file());
                if !regular {
                    return Err(PathError::NotOurs { path: image });
                }
            }
            Err(source) => {
                return Err(PathError::Io {
                    path: image,
                    source,
                });
            }
        }
        Ok(image)
    }

    /// The image of a `Block` volume of this provisioner's on this machine (after the checks
    /// of [`Self::local_dir`]); `None` for a `Filesystem` one.
    ///
    /// # Errors
    /// As [`Self::local_dir`].
    pub fn block_image(&self, volume: &PersistentVolume) -> Result<Option<PathBuf>, PathError> {
        let dir = self.local_dir(volume)?;
        let block = volume.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block");
        Ok(block.then(|| dir.join(BLOCK_IMAGE)))
    }

    /// Deletes the volume's data on this machine: a `Block` volume's loop devices are
    /// detached, then its directory removed ([`Self::delete_dir`]).
    ///
    /// # Errors
    /// [`PathError`] as [`Self::delete_dir`]; a loop device that cannot be detached is an
    /// [`PathError::Io`] naming the image.
    pub async fn delete_volume(&self, volume: &PersistentVolume) -> Result<(), PathError> {
        if let Some(image) = self.block_image(volume)? {
            super::loop_device::detach_all(&image)
                .await
                .map_err(|why| PathError::Io {
                    path: image.clone(),
                    source: std::io::Error::other(format!("detaching its loop device: {why}")),
                })?;
        }
        self.delete_dir(volume)
    }

    /// The volume for `claim` on `node`: `pvc-<uid>`, the claim's request as capacity and
    /// its access modes and volume mode, the class's reclaim policy, pre-bound to the claim;
    /// a `Filesystem` one names its directory as a `hostPath`, a `Block` one its
    /// [`BLOCK_IMAGE`] as a `local` path.
    pub fn volume_for(
        &self,
        claim: &PersistentVolumeClaim,
        class: &str,
        reclaim_policy: &str,
        node: &str,
    ) -> Result<PersistentVolume, serde_json::Error> {
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let name = volume_name(&uid);
        let spec = claim.spec.clone().unwrap_or_default();
        let block = spec.volume_mode.as_deref() == Some("Block");
        let storage = spec
            .resources
            .and_then(|r| r.requests)
            .and_then(|r| r.get("storage").cloned());
        let dir = self.node_path.join(&name);
        let (mode, source) = if block {
            ("Block", json!({"local": {"path": dir.join(BLOCK_IMAGE)}}))
        } else {
            (
                "Filesystem",
                json!({"hostPath": {"path": dir, "type": "Directory"}}),
            )
        };
        let mut volume = json!({
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": name,
                "annotations": {super::PROVISIONED_BY: PROVISIONER},
                "labels": {"kubernetes.io/hostname": node},
            },
            "spec": {
                "capacity": {"storage": storage},
                "accessModes": spec.access_modes.unwrap_or_default(),
                "persistentVolumeReclaimPolicy": reclaim_policy,
                "storageClassName": class,
                "volumeMode": mode,
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}},
                "claimRef": {
                    "kind": "PersistentVolumeClaim",
                    "apiVersion": "v1",
                    "namespace": claim.metadata.namespace,
                    "name": claim.metadata.name,
                    "uid": uid,
                    "resourceVersion": claim.metadata.resource_version,
                },
            },
        });
        if let (Some(spec), Some(source)) = (volume["spec"].as_object_mut(), source.as_object()) {
            spec.extend(source.clone());
        }
        serde_json::from_value(volume)
    }
}

/// `dir` is missing, or a real directory whose parent is `base` once links are followed.
fn check_plain_dir(base: &Path, dir: &Path) -> Result<(), PathError> {
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(PathError::Io {
                path: dir.to_owned(),
                source,
            });
        }
    };
    let not_ours = || PathError::NotOurs {
        path: dir.to_owned(),
    };
    if !meta.is_dir() {
        return Err(not_ours());
    }
    let real = std::fs::canonicalize(dir).map_err(|_| not_ours())?;
    let base_real = std::fs::canonicalize(base).map_err(|_| not_ours())?;
    if real.parent() == Some(base_real.as_path()) {
        Ok(())
    } else {
        Err(not_ours())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn storage(base: &Path) -> LocalStorage {
        LocalStorage {
            node_path: PathBuf::from("/opt/local-path-provisioner"),
            nodes: BTreeMap::from([("n1".to_owned(), base.to_owned())]),
        }
    }

    fn claim() -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "default", "uid": "1234"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
        }))
        .expect("claim")
    }

    #[test]
    fn a_provisioned_volume_is_a_directory_of_its_node_and_is_deleted_with_its_content() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let s = storage(&tmp.path().join("storage"));
        let pv = s.volume_for(&claim(), "local", "Delete", "n1").expect("pv");
        assert_eq!(pv.metadata.name.as_deref(), Some("pvc-1234"));
        let spec = pv.spec.as_ref().expect("spec");
        assert_eq!(
            spec.host_path.as_ref().map(|h| h.path.as_str()),
            Some("/opt/local-path-provisioner/pvc-1234")
        );
        assert_eq!(volume_node(&pv), Some("n1"));
        assert_eq!(
            spec.claim_ref.as_ref().and_then(|r| r.uid.as_deref()),
            Some("1234")
        );
        assert_eq!(
            spec.capacity
                .as_ref()
                .and_then(|c| c.get("storage"))
                .map(|q| q.0.as_str()),
            Some("1Gi")
        );
        let dir = s.create_dir("n1", "pvc-1234").expect("created");
        assert_eq!(dir, tmp.path().join("storage/pvc-1234"));
        assert_eq!(s.local_dir(&pv).expect("ours"), dir);
        std::fs::write(dir.join("file"), b"x").expect("write");
        s.delete_dir(&pv).expect("deleted");
        assert!(!dir.exists());
        s.delete_dir(&pv).expect("already gone is fine");
        assert!(tmp.path().join("storage").is_dir(), "the base stays");
    }

    fn block_claim() -> PersistentVolumeClaim {
        let mut claim = claim();
        if let Some(spec) = claim.spec.as_mut() {
            spec.volume_mode = Some("Block".into());
        }
        claim
    }

    #[test]
    fn a_block_volume_is_a_sparse_image_in_its_directory_named_as_its_local_path() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let s = storage(&tmp.path().join("storage"));
        let pv = s
            .volume_for(&block_claim(), "local", "Delete", "n1")
            .expect("pv");
        let spec = pv.spec.as_ref().expect("spec");
        assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
        assert!(spec.host_path.is_none());
        assert_eq!(
            spec.local.as_ref().map(|l| l.path.as_str()),
            Some("/opt/local-path-provisioner/pvc-1234/block.img")
        );
        assert_eq!(volume_node(&pv), Some("n1"));
        let dir = s.create_dir("n1", "pvc-1234").expect("created");
        let image = s.create_block_image(&dir, 8 << 20).expect("image");
        assert_eq!(image, dir.join(BLOCK_IMAGE));
        let meta = std::fs::metadata(&image).expect("meta");
        assert_eq!(meta.len(), 8 << 20);
        assert!(
            std::os::unix::fs::MetadataExt::blocks(&meta) < 64,
            "sparse: {meta:?}"
        );
        // A retried provisioning keeps the image (and what was written).
        std::fs::write(&image, b"data").expect("write");
        s.create_block_image(&dir, 8 << 20).expect("kept");
        assert_eq!(std::fs::read(&image).expect("read"), b"data");
        assert_eq!(s.local_dir(&pv).expect("ours"), dir);
        assert_eq!(s.block_image(&pv).expect("ours"), Some(image.clone()));
        // A Filesystem volume has no image; a Block one naming its directory is not ours.
        let fs = s.volume_for(&claim(), "local", "Delete", "n1").expect("pv");
        assert_eq!(s.block_image(&fs).expect("ours"), None);
        let mut odd = pv.clone();
        if let Some(l) = odd.spec.as_mut().and_then(|s| s.local.as_mut()) {
            l.path = "/opt/local-path-provisioner/pvc-1234".into();
        }
        assert!(matches!(s.local_dir(&odd), Err(PathError::Path { .. })));
        // A link in place of the image is refused.
        std::fs::remove_file(&image).expect("rm");
        std::os::unix::fs::symlink(tmp.path().join("elsewhere"), &image).expect("link");
        assert!(matches!(
            s.create_block_image(&dir, 1 << 20),
            Err(PathError::NotOurs { .. })
        ));
        assert!(!tmp.path().join("elsewhere").exists());
    }

    #[tokio::test]
    async fn releasing_a_block_volume_detaches_its_loop_device_and_removes_its_directory() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let s = storage(&tmp.path().join("storage"));
        let pv = s
            .volume_for(&block_claim(), "local", "Delete", "n1")
            .expect("pv");
        let dir = s.create_dir("n1", "pvc-1234").expect("created");
        let image = s.create_block_image(&dir, 4 << 20).expect("image");
        // Where loop devices work (root), the image is attached as at provisioning.
        let attached = super::super::loop_device::attach(&image).await.ok();
        if attached.is_none() {
            eprintln!("no loop device here: only the directory's removal is checked");
        }
        s.delete_volume(&pv).await.expect("released");
        assert!(!dir.exists());
        if let Some(device) = attached {
            let listed = std::process::Command::new("losetup")
                .arg("--list")
                .output()
                .expect("losetup");
            let listed = String::from_utf8_lossy(&listed.stdout);
            assert!(
                !listed.contains(&image.display().to_string()),
                "{} still attached: {listed}",
                device.display()
            );
        }
    }

    #[test]
    fn a_path_outside_the_nodes_volume_directory_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let s = storage(&tmp.path().join("storage"));
        let mut pv = s.volume_for(&claim(), "local", "Delete", "n1").expect("pv");
        let set_path = |pv: &mut PersistentVolume, path: &str| {
            if let Some(h) = pv.spec.as_mut().and_then(|s| s.host_path.as_mut()) {
                h.path = path.to_owned();
            }
        };
        for bad in [
            "/etc",
            "/opt/local-path-provisioner",
            "/opt/local-path-provisioner/pvc-1234/../../etc",
            "/opt/local-path-provisioner/pvc-other",
            "/var/lib/kubelet/pvc-1234",
        ] {
            set_path(&mut pv, bad);
            assert!(
                matches!(s.local_dir(&pv), Err(PathError::Path { .. })),
                "{bad}"
            );
            assert!(s.delete_dir(&pv).is_err(), "{bad}");
        }
        set_path(&mut pv, "/opt/local-path-provisioner/pvc-1234");
        for bad in ["..", "pvc-a/b", "etc", ""] {
            let mut named = pv.clone();
            named.metadata.name = Some(bad.to_owned());
            assert!(
                matches!(s.local_dir(&named), Err(PathError::Name(_))),
                "{bad:?}"
            );
            assert!(s.create_dir("n1", bad).is_err(), "{bad:?}");
        }
        let mut elsewhere = pv.clone();
        if let Some(a) = elsewhere
            .spec
            .as_mut()
            .and_then(|s| s.node_affinity.as_mut())
        {
            a.required = None;
        }
        assert!(matches!(
            s.local_dir(&elsewhere),
            Err(PathError::Node { .. })
        ));
        assert!(s.create_dir("n2", "pvc-1234").is_err());
        assert!(s.local_dir(&pv).is_ok());
    }

    #[test]
    fn a_symbolic_link_in_place_of_the_directory_is_never_followed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = tmp.path().join("storage");
        let outside = tmp.path().join("precious");
        std::fs::create_dir_all(&base).expect("base");
        std::fs::create_dir_all(&outside).expect("outside");
        std::fs::write(outside.join("keep"), b"x").expect("write");
        std::os::unix::fs::symlink(&outside, base.join("pvc-1234")).expect("link");
        let s = storage(&base);
        let pv = s.volume_for(&claim(), "local", "Delete", "n1").expect("pv");
        assert!(matches!(s.delete_dir(&pv), Err(PathError::NotOurs { .. })));
        assert!(matches!(
            s.create_dir("n1", "pvc-1234"),
            Err(PathError::NotOurs { .. })
        ));
        assert!(outside.join("keep").exists());
    }
}
