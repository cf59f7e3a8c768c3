//! A pod's volumes on this node, with kubelet's layout and checks, and what each container
//! sees of them (mounts and environment).
//!
//! Layout, as kubelet's `/var/lib/kubelet/pods/<uid>/volumes/<plugin>/<name>`:
//! - `emptyDir`: `<pod dir>/volumes/kubernetes.io~empty-dir/<name>/`, living as long as the pod.
//! - `configMap`, `secret`, `downwardAPI`, `projected`: `kubernetes.io~configmap`,
//!   `kubernetes.io~secret`, `kubernetes.io~downward-api`, `kubernetes.io~projected`, written
//!   by [`atomic`] (kubelet's AtomicWriter: a `..data` link to a timestamped directory and one
//!   link per top-level name) from what [`projection`] computes of the source objects. Service
//!   account tokens of projected volumes come from the TokenRequest API, bound to the pod, and
//!   are renewed once 80% of their lifetime has passed ([`token`]).
//! - `hostPath`: its path as the node's [`HostPathMap`] resolves it (node-local prefixes such
//!   as `/var/lib/kubelet` live below the node's data directory), after kubelet's `type` check
//!   on the resolved path (`DirectoryOrCreate` and `FileOrCreate` create it).
//!
//! - `persistentVolumeClaim`: the claim's bound PersistentVolume, whose `hostPath` (or
//!   `local` path) resolves through the node's [`HostPathMap`] as a `hostPath` volume does
//!   (the embedded local provisioner's volumes are below the node's data directory); the
//!   claim's `readOnly` mounts it read-only. Resolved once per pod: a binding does not change.
//!   A `volumeMode: Block` volume is a block device: its path itself, or, for a regular file
//!   (the local provisioner's image), the loop device attached to it ([`loop_device`]).
//!
//! Each container gets its `volumeMounts` bind-mounted at their `mountPath` (with `subPath` and
//! `readOnly`) in its own mount namespace ([`super::process`]), and the block device of each of
//! its `volumeDevices` bind-mounted at its `devicePath` ([`device_mounts`]); as kubelet, a
//! `Block` volume named in `volumeMounts`, or another named in `volumeDevices`, keeps the pod
//! from starting. Its environment ([`env`]) has
//! the `KUBERNETES_SERVICE_*` variables, `envFrom` and `env` (values, downward-API fields and
//! resources, configMap and secret keys).
//!
//! # Guarantees
//! - A missing source (configMap, secret, ServiceAccount token) that is not `optional` keeps
//!   the pod in `ContainerCreating` with kubelet's message
//!   (`MountVolume.SetUp failed for volume "x" : configmap "y" not found`), retried every pass.
//! - A change of a configMap or secret a pod's volume is filled from reaches the volume
//!   within a pass of the pod runner, which watches both kinds ([`uses_source`],
//!   [`VolumeManager::invalidate`]); kubelet takes up to its sync period plus its cache TTL
//!   (about a minute) instead. Sources are read again every [`RESYNC_PERIOD`] besides, for
//!   what a watch cannot report (downward-API fields, service-account tokens). A change is
//!   written atomically. A source that disappears after the volume was set up leaves the last
//!   content in place, as kubelet does.
//! - Item paths that are absolute or contain `..` are refused before anything is written.
//! - A claim that is missing, not bound, or bound to a volume that does not name it back
//!   keeps the pod in `ContainerCreating` with kubelet's message
//!   (`error processing PVC default/data: PVC is not bound`), retried every pass.
//!
//! # Caveats
//! - Other kinds (and persistent volumes other than `hostPath`/`local`) are not prepared: a pod
//!   that uses one waits in `ContainerCreating` with the reason in its container status.
//! - Without a private root the device's mount point is a file on the host's `/dev`: an empty
//!   one is created at the `devicePath` when nothing is there (a directory there, such as
//!   `/dev/disk`, cannot take the device and the container does not start). A `readOnly` claim
//!   does not make its device read-only (a read-only bind mount does not stop writes to a
//!   device node).

pub mod atomic;
pub mod env;
pub mod loop_device;
pub mod projection;
pub mod token;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, HostPathVolumeSource, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimVolumeSource, Pod, Secret, Volume,
};
use kube::api::Api;
use tracing::warn;

use super::process::BindMount;
use crate::host_paths::{HostPathError, HostPathMap};
use projection::{DEFAULT_MODE, NodeResources, SourceKind, mode_bits};

/// How often the sources of a pod's volumes are read again while it runs.
pub const RESYNC_PERIOD: Duration = Duration::from_secs(10);

/// A volume that cannot be set up (the pod waits in `ContainerCreating`).
#[derive(Debug, thiserror::Error)]
#[error("MountVolume.SetUp failed for volume \"{volume}\"")]
pub struct VolumeError {
    /// The volume's name.
    pub volume: String,
    #[source]
    pub cause: SetUpError,
}

impl VolumeError {
    /// kubelet's event and status message: `MountVolume.SetUp failed for volume "x" : <cause>`.
    pub fn message(&self) -> String {
        let mut message = format!("{self} : {}", self.cause);
        let mut source = std::error::Error::source(&self.cause);
        while let Some(s) = source {
            message = format!("{message}: {s}");
            source = s.source();
        }
        message
    }
}

/// Why a volume cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetUpError {
    /// Creating or inspecting a path failed.
    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A `hostPath` has `..` components or leads out of its mapped directory.
    #[error(transparent)]
    HostPath(#[from] HostPathError),
    /// A `hostPath` is not of its declared `type`.
    #[error("hostPath type check failed: {path} is not a {expected}")]
    HostPathType { path: String, expected: String },
    /// The volume's name is no single path element.
    #[error("invalid volume name")]
    InvalidName,
    /// The volume kind is not supported by this node.
    #[error("{kind} volumes are not supported by this node yet")]
    Unsupported { kind: &'static str },
    /// A `persistentVolumeClaim` volume's claim is missing or unbound, or its volume is
    /// missing or does not name the claim (kubelet's wording).
    #[error("error processing PVC {claim}: {problem}")]
    Claim { claim: String, problem: String },
    /// A claim's volume mode does not fit how a container uses it (kubelet's wording).
    #[error("volume {volume} has volumeMode {mode}, but is specified in {field}")]
    VolumeMode {
        volume: String,
        mode: &'static str,
        field: &'static str,
    },
    /// A `Block` volume's path is neither a block device nor a file, or no loop device could
    /// be attached to its file.
    #[error("block volume {path}: {problem}")]
    BlockDevice { path: String, problem: String },
    /// A configMap or secret the volume needs does not exist (and is not optional).
    #[error("{kind} \"{name}\" not found")]
    NotFound { kind: &'static str, name: String },
    /// Reading a configMap or secret failed.
    #[error("couldn't get {kind} {name}")]
    Get {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// The service-account token could not be requested.
    #[error("failed to fetch token")]
    Token(#[source] token::TokenError),
    /// A source cannot be projected (a missing key, an unknown field).
    #[error(transparent)]
    Projection(#[from] projection::ProjectionError),
    /// Writing the volume's files failed, or an item path is not allowed.
    #[error(transparent)]
    Write(#[from] atomic::AtomicError),
}

/// `<pod dir>/volumes/kubernetes.io~empty-dir/<name>`.
pub fn empty_dir_path(pod_dir: &Path, name: &str) -> PathBuf {
    plugin_dir(pod_dir, "kubernetes.io~empty-dir", name)
}

/// `<pod dir>/volumes/<plugin>/<name>`.
fn plugin_dir(pod_dir: &Path, plugin: &str, name: &str) -> PathBuf {
    pod_dir.join("volumes").join(plugin).join(name)
}

/// Resolves a `hostPath` through the node's [`HostPathMap`] and checks its `type` on the
/// resolved path.
fn host_path(source: &HostPathVolumeSource, map: &HostPathMap) -> Result<PathBuf, SetUpError> {
    let (path, dir) = map.resolve(&source.path)?;
    check_host_path(source, &path)?;
    if let Some(dir) = dir {
        // The check may have created the path: it must still be inside.
        HostPathMap::check_inside(&source.path, &path, &dir)?;
        return std::fs::canonicalize(&path).or(Ok(path));
    }
    Ok(path)
}

fn check_host_path(source: &HostPathVolumeSource, path: &Path) -> Result<(), SetUpError> {
    use std::os::unix::fs::FileTypeExt;
    let path = path.to_owned();
    let io = |source| SetUpError::Io {
        path: path.clone(),
        source,
    };
    let kind = source.type_.as_deref().unwrap_or("");
    let meta = std::fs::metadata(&path);
    let wrong = |expected: &str| SetUpError::HostPathType {
        path: source.path.clone(),
        expected: expected.to_owned(),
    };
    match kind {
        "" => {}
        "DirectoryOrCreate" => match meta {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(wrong("directory")),
            Err(_) => std::fs::create_dir_all(&path).map_err(io)?,
        },
        "Directory" => {
            if !meta.is_ok_and(|m| m.is_dir()) {
                return Err(wrong("directory"));
            }
        }
        "FileOrCreate" => match meta {
            Ok(m) if m.is_file() => {}
            Ok(_) => return Err(wrong("file")),
            Err(_) => {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(io)?;
                }
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&path)
                    .map_err(io)?;
            }
        },
        "File" => {
            if !meta.is_ok_and(|m| m.is_file()) {
                return Err(wrong("file"));
            }
        }
        "Socket" => {
            if !meta.is_ok_and(|m| m.file_type().is_socket()) {
                return Err(wrong("socket"));
            }
        }
        "CharDevice" => {
            if !meta.is_ok_and(|m| m.file_type().is_char_device()) {
                return Err(wrong("character device"));
            }
        }
        "BlockDevice" => {
            if !meta.is_ok_and(|m| m.file_type().is_block_device()) {
                return Err(wrong("block device"));
            }
        }
        other => return Err(wrong(other)),
    }
    Ok(())
}

/// Sets up a volume of the node's own (`emptyDir`, `hostPath`); `None` for other kinds.
fn local_volume(
    volume: &Volume,
    pod_dir: &Path,
    host_paths: &HostPathMap,
) -> Option<Result<PathBuf, SetUpError>> {
    if volume.empty_dir.is_some() {
        let dir = empty_dir_path(pod_dir, &volume.name);
        return Some(
            private_fs::create_dir_all(&dir)
                .map(|()| dir.clone())
                .map_err(|source| SetUpError::Io { path: dir, source }),
        );
    }
    volume
        .host_path
        .as_ref()
        .map(|source| host_path(source, host_paths))
}

/// The volumes of the pods of this node: sets them up, keeps the API-backed ones current,
/// and remembers service-account tokens until they are due for renewal.
pub struct VolumeManager {
    client: kube::Client,
    host_ip: String,
    host_paths: HostPathMap,
    node: NodeResources,
    tokens: token::TokenCache,
    /// When each pod's sources were last read: pod uid → instant.
    synced: BTreeMap<String, Instant>,
    /// The resolved paths of `persistentVolumeClaim` volumes: (pod uid, volume) → path and
    /// whether it is a `Block` volume's device.
    claims: BTreeMap<(String, String), (PathBuf, bool)>,
}

/// The plugin directories of the API-backed kinds: configMap, secret, downwardAPI, projected.
const API_PLUGINS: [&str; 4] = [
    "kubernetes.io~configmap",
    "kubernetes.io~secret",
    "kubernetes.io~downward-api",
    "kubernetes.io~projected",
];

/// A volume the API feeds, and where kubelet keeps it.
/// Whether a volume of `pod` is filled from the `kind` object `name` of the pod's namespace
/// (a `configMap` or `secret` volume, or a source of a `projected` one).
pub fn uses_source(pod: &Pod, kind: SourceKind, name: &str) -> bool {
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    volumes.into_iter().any(|v| {
        let direct = match kind {
            SourceKind::ConfigMap => v.config_map.as_ref().map(|c| c.name.as_str()),
            SourceKind::Secret => v.secret.as_ref().and_then(|s| s.secret_name.as_deref()),
        };
        let projected = v
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten())
            .any(|source| match kind {
                SourceKind::ConfigMap => source.config_map.as_ref().is_some_and(|c| c.name == name),
                SourceKind::Secret => source.secret.as_ref().is_some_and(|s| s.name == name),
            });
        direct == Some(name) || projected
    })
}

fn api_plugin(volume: &Volume) -> Option<&'static str> {
    [
        volume.config_map.is_some(),
        volume.secret.is_some(),
        volume.downward_api.is_some(),
        volume.projected.is_some(),
    ]
    .iter()
    .position(|&is| is)
    .map(|i| API_PLUGINS[i])
}

/// Whether `path` is the directory of an API-backed volume: those are always mounted
/// read-only, as kubelet mounts them whatever the `volumeMount` says.
fn is_api_volume(path: &Path) -> bool {
    path.parent()
        .and_then(Path::file_name)
        .is_some_and(|plugin| API_PLUGINS.iter().any(|p| plugin == *p))
}

impl VolumeManager {
    /// A manager reading sources through `client`; `host_ip` is what `status.hostIP` and
    /// `status.podIP` read; `host_paths` says where `hostPath` volumes are on this machine.
    pub fn new(client: kube::Client, host_ip: String, host_paths: HostPathMap) -> VolumeManager {
        VolumeManager {
            client,
            host_ip,
            host_paths,
            node: NodeResources::of_this_host(),
            tokens: token::TokenCache::default(),
            synced: BTreeMap::new(),
            claims: BTreeMap::new(),
        }
    }

    /// The next [`prepare`](Self::prepare) of the pod `uid` reads its sources again (one of
    /// them changed), whenever it was last read.
    pub fn invalidate(&mut self, uid: &str) {
        self.synced.remove(uid);
    }

    /// Drops what is remembered of pods no longer known (by uid).
    pub fn forget(&mut self, known: &BTreeSet<String>) {
        self.synced.retain(|uid, _| known.contains(uid));
        self.claims.retain(|(uid, _), _| known.contains(uid));
        self.tokens.forget(known);
    }

    /// Prepares every volume of `pod` below `pod_dir` (and brings API-backed ones up to date
    /// once per [`RESYNC_PERIOD`]); returns each volume's host path by name.
    ///
    /// # Errors
    /// [`VolumeError`] for the first volume that cannot be set up.
    pub async fn prepare(
        &mut self,
        pod: &Pod,
        pod_dir: &Path,
    ) -> Result<BTreeMap<String, PathBuf>, VolumeError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let resync = self
            .synced
            .get(&uid)
            .is_none_or(|at| at.elapsed() >= RESYNC_PERIOD);
        let mut paths = BTreeMap::new();
        let mut block = BTreeSet::new();
        for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let name = volume.name.clone();
            let failed = |cause| VolumeError {
                volume: name.clone(),
                cause,
            };
            // The API server checks volume names (DNS labels); a name that is no single path
            // element would place the volume outside its plugin directory.
            if !is_plain_name(&name) {
                return Err(failed(SetUpError::InvalidName));
            }
            let path = if let Some(plugin) = api_plugin(volume) {
                let dir = plugin_dir(pod_dir, plugin, &name);
                let set_up = std::fs::symlink_metadata(dir.join(atomic::DATA_DIR_NAME)).is_ok();
                if !set_up || resync {
                    let written = match self.payload(pod, volume).await {
                        Ok(payload) => atomic::write(&dir, &payload).map_err(SetUpError::from),
                        Err(e) => Err(e),
                    };
                    match written {
                        Ok(_) => {}
                        Err(cause) if set_up => {
                            let e = failed(cause);
                            warn!(pod = %super::pod_key(pod), error = %e.message(), "volume not updated; keeping its last content");
                        }
                        Err(cause) => return Err(failed(cause)),
                    }
                }
                dir
            } else if let Some(local) = local_volume(volume, pod_dir, &self.host_paths) {
                local.map_err(failed)?
            } else if let Some(source) = &volume.persistent_volume_claim {
                let key = (uid.clone(), name.clone());
                let (path, is_block) = match self.claims.get(&key) {
                    Some(claim) => claim.clone(),
                    None => {
                        let claim = self.claim_volume(pod, source).await.map_err(failed)?;
                        self.claims.insert(key, claim.clone());
                        claim
                    }
                };
                if is_block {
                    block.insert(name.clone());
                }
                path
            } else {
                return Err(failed(SetUpError::Unsupported {
                    kind: "this kind of",
                }));
            };
            paths.insert(name, path);
        }
        if let Some(e) = volume_mode_error(pod, &block) {
            return Err(e);
        }
        if resync {
            self.synced.insert(uid, Instant::now());
        }
        Ok(paths)
    }

    /// The directory of a `persistentVolumeClaim` volume: claim → bound volume → its path on
    /// this node; for a `Block` volume its block device (and `true`).
    async fn claim_volume(
        &self,
        pod: &Pod,
        source: &PersistentVolumeClaimVolumeSource,
    ) -> Result<(PathBuf, bool), SetUpError> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let name = &source.claim_name;
        let problem = |problem: String| SetUpError::Claim {
            claim: format!("{namespace}/{name}"),
            problem,
        };
        let claim = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| problem(format!("failed to fetch PVC from API server: {e}")))?
            .ok_or_else(|| {
                problem(format!(
                    "failed to fetch PVC from API server: persistentvolumeclaims \"{name}\" not found"
                ))
            })?;
        let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        let volume_name = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .filter(|v| !v.is_empty() && bound)
            .ok_or_else(|| problem("PVC is not bound".into()))?;
        let volume = Api::<PersistentVolume>::all(self.client.clone())
            .get_opt(&volume_name)
            .await
            .map_err(|e| problem(format!("failed to fetch PV {volume_name} from API server: {e}")))?
            .ok_or_else(|| {
                problem(format!(
                    "failed to fetch PV {volume_name} from API server: persistentvolumes \"{volume_name}\" not found"
                ))
            })?;
        let spec = volume.spec.unwrap_or_default();
        let ref_uid = spec.claim_ref.as_ref().and_then(|r| r.uid.clone());
        if ref_uid.is_none() || ref_uid != claim.metadata.uid {
            return Err(problem(format!(
                "found PV object {volume_name} but its ClaimRef.UID {} does not point to claim.UID {}",
                ref_uid.unwrap_or_default(),
                claim.metadata.uid.unwrap_or_default()
            )));
        }
        if spec.volume_mode.as_deref() == Some("Block") {
            let path = match (spec.host_path, spec.local) {
                (Some(host), _) => host.path,
                (None, Some(local)) => local.path,
                (None, None) => {
                    return Err(SetUpError::Unsupported {
                        kind: "this kind of persistent",
                    });
                }
            };
            let unchecked = HostPathVolumeSource { path, type_: None };
            return Ok((
                block_device(&host_path(&unchecked, &self.host_paths)?).await?,
                true,
            ));
        }
        let host = match (spec.host_path, spec.local) {
            (Some(host), _) => host,
            (None, Some(local)) => HostPathVolumeSource {
                path: local.path,
                type_: Some("Directory".into()),
            },
            (None, None) => {
                return Err(SetUpError::Unsupported {
                    kind: "this kind of persistent",
                });
            }
        };
        Ok((host_path(&host, &self.host_paths)?, false))
    }

    /// The environment of `container` ([`env`]); `kubernetes_service` is where pods reach the
    /// API server.
    ///
    /// # Errors
    /// [`env::EnvError`] for a missing non-optional source or key.
    pub async fn container_env(
        &self,
        pod: &Pod,
        container: &Container,
        kubernetes_service: Option<(&str, u16)>,
        pod_ip: &str,
    ) -> Result<Vec<(String, String)>, env::EnvError> {
        let ctx = env::EnvContext {
            client: &self.client,
            host_ip: &self.host_ip,
            pod_ip,
            node: self.node,
            kubernetes_service,
        };
        env::container_env(&ctx, pod, container).await
    }

    /// The files of an API-backed volume.
    async fn payload(&mut self, pod: &Pod, volume: &Volume) -> Result<atomic::Payload, SetUpError> {
        if let Some(cm) = &volume.config_map {
            let default_mode = mode_bits(cm.default_mode, DEFAULT_MODE);
            return self
                .key_to_path(
                    pod,
                    SourceKind::ConfigMap,
                    &cm.name,
                    cm.items.as_deref(),
                    default_mode,
                    cm.optional,
                )
                .await;
        }
        if let Some(secret) = &volume.secret {
            let default_mode = mode_bits(secret.default_mode, DEFAULT_MODE);
            let name = secret.secret_name.clone().unwrap_or_default();
            return self
                .key_to_path(
                    pod,
                    SourceKind::Secret,
                    &name,
                    secret.items.as_deref(),
                    default_mode,
                    secret.optional,
                )
                .await;
        }
        if let Some(downward) = &volume.downward_api {
            let default_mode = mode_bits(downward.default_mode, DEFAULT_MODE);
            return Ok(projection::downward_api(
                pod,
                downward.items.as_deref().unwrap_or_default(),
                default_mode,
                &self.host_ip,
                self.node,
            )?);
        }
        let Some(projected) = &volume.projected else {
            return Ok(atomic::Payload::new());
        };
        let default_mode = mode_bits(projected.default_mode, DEFAULT_MODE);
        let mut payload = atomic::Payload::new();
        for source in projected.sources.iter().flatten() {
            let part = if let Some(cm) = &source.config_map {
                self.key_to_path(
                    pod,
                    SourceKind::ConfigMap,
                    &cm.name,
                    cm.items.as_deref(),
                    default_mode,
                    cm.optional,
                )
                .await?
            } else if let Some(secret) = &source.secret {
                self.key_to_path(
                    pod,
                    SourceKind::Secret,
                    &secret.name,
                    secret.items.as_deref(),
                    default_mode,
                    secret.optional,
                )
                .await?
            } else if let Some(downward) = &source.downward_api {
                projection::downward_api(
                    pod,
                    downward.items.as_deref().unwrap_or_default(),
                    default_mode,
                    &self.host_ip,
                    self.node,
                )?
            } else if let Some(sa) = &source.service_account_token {
                let token = self
                    .tokens
                    .token(&self.client, pod, sa)
                    .await
                    .map_err(SetUpError::Token)?;
                atomic::Payload::from([(
                    sa.path.clone(),
                    atomic::FileProjection {
                        data: token.into_bytes(),
                        mode: default_mode,
                    },
                )])
            } else {
                return Err(SetUpError::Unsupported {
                    kind: "this projected source of",
                });
            };
            payload.extend(part);
        }
        Ok(payload)
    }

    /// The files of a configMap or secret source (empty when an optional source is missing).
    async fn key_to_path(
        &self,
        pod: &Pod,
        kind: SourceKind,
        name: &str,
        items: Option<&[k8s_openapi::api::core::v1::KeyToPath]>,
        default_mode: u32,
        optional: Option<bool>,
    ) -> Result<atomic::Payload, SetUpError> {
        let optional = optional.unwrap_or(false);
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        match fetch_data(&self.client, kind, namespace, name).await {
            Ok(Some(data)) => Ok(projection::key_to_path(
                kind,
                &data,
                items,
                default_mode,
                optional,
            )?),
            Ok(None) if optional => Ok(atomic::Payload::new()),
            Ok(None) => Err(SetUpError::NotFound {
                kind: kind_name(kind),
                name: name.to_owned(),
            }),
            Err(source) => Err(SetUpError::Get {
                kind: kind_name(kind),
                name: format!("{namespace}/{name}"),
                source,
            }),
        }
    }
}

/// `configmap` or `secret`, as kubelet's messages name them.
fn kind_name(kind: SourceKind) -> &'static str {
    match kind {
        SourceKind::ConfigMap => "configmap",
        SourceKind::Secret => "secret",
    }
}

/// The keys of a configMap (`data` and `binaryData`) or a secret (`data`, and `stringData`
/// should a server keep it); `None` when the object does not exist.
pub(crate) async fn fetch_data(
    client: &kube::Client,
    kind: SourceKind,
    namespace: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, kube::Error> {
    let mut data = BTreeMap::new();
    match kind {
        SourceKind::ConfigMap => {
            let Some(cm) = Api::<ConfigMap>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await?
            else {
                return Ok(None);
            };
            for (k, v) in cm.binary_data.into_iter().flatten() {
                data.insert(k, v.0);
            }
            for (k, v) in cm.data.into_iter().flatten() {
                data.insert(k, v.into_bytes());
            }
        }
        SourceKind::Secret => {
            let Some(secret) = Api::<Secret>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await?
            else {
                return Ok(None);
            };
            for (k, v) in secret.string_data.into_iter().flatten() {
                data.insert(k, v.into_bytes());
            }
            for (k, v) in secret.data.into_iter().flatten() {
                data.insert(k, v.0);
            }
        }
    }
    Ok(Some(data))
}

/// One normal path element (no `/`, not `.` or `..`).
fn is_plain_name(name: &str) -> bool {
    let mut components = Path::new(name).components();
    matches!(components.next(), Some(Component::Normal(_)))
        && components.next().is_none()
        && !name.contains('/')
}

/// A `subPath` stays inside its volume: relative, without `..`.
fn safe_sub_path(sub: &str) -> Option<&Path> {
    let path = Path::new(sub);
    path.components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then_some(path)
}

/// The block device of a `Block` volume at `path`: the device itself, or the loop device of a
/// regular file.
async fn block_device(path: &Path) -> Result<PathBuf, SetUpError> {
    use std::os::unix::fs::FileTypeExt;
    let problem = |problem: String| SetUpError::BlockDevice {
        path: path.display().to_string(),
        problem,
    };
    let meta = std::fs::metadata(path).map_err(|e| problem(e.to_string()))?;
    if meta.file_type().is_block_device() {
        Ok(path.to_owned())
    } else if meta.is_file() {
        loop_device::device_for(path)
            .await
            .map_err(|e| problem(format!("no loop device could be attached: {e}")))
    } else {
        Err(problem("is neither a block device nor a file".into()))
    }
}

/// kubelet's check of how the containers of `pod` use its volumes: a `Block` volume (one of
/// `block`) only in `volumeDevices`, any other only in `volumeMounts`; the first misuse.
fn volume_mode_error(pod: &Pod, block: &BTreeSet<String>) -> Option<VolumeError> {
    let spec = pod.spec.as_ref();
    let containers = spec.into_iter().flat_map(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(s.containers.iter())
    });
    for container in containers {
        let mounted = container.volume_mounts.iter().flatten().map(|m| &m.name);
        if let Some(name) = mounted.into_iter().find(|n| block.contains(*n)) {
            return Some(VolumeError {
                volume: name.clone(),
                cause: SetUpError::VolumeMode {
                    volume: name.clone(),
                    mode: "Block",
                    field: "volumeMounts",
                },
            });
        }
        let devices = container.volume_devices.iter().flatten().map(|d| &d.name);
        if let Some(name) = devices.into_iter().find(|n| !block.contains(*n)) {
            return Some(VolumeError {
                volume: name.clone(),
                cause: SetUpError::VolumeMode {
                    volume: name.clone(),
                    mode: "Filesystem",
                    field: "volumeDevices",
                },
            });
        }
    }
    None
}

/// The bind mounts that give `container` the block device of each of its `volumeDevices` at
/// its `devicePath` (devices of unknown volumes or at a relative path are skipped: the API
/// server refuses both).
pub fn device_mounts(container: &Container, volumes: &BTreeMap<String, PathBuf>) -> Vec<BindMount> {
    container
        .volume_devices
        .iter()
        .flatten()
        .filter(|d| Path::new(&d.device_path).is_absolute())
        .filter_map(|d| {
            Some(BindMount {
                source: volumes.get(&d.name)?.clone(),
                target: PathBuf::from(&d.device_path),
                read_only: false,
            })
        })
        .collect()
}

/// The volumes of `pod` that every container mounts read-only: `persistentVolumeClaim`
/// volumes with `readOnly`.
pub fn read_only_volumes(pod: &Pod) -> BTreeSet<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter(|v| {
            v.persistent_volume_claim
                .as_ref()
                .is_some_and(|c| c.read_only == Some(true))
        })
        .map(|v| v.name.clone())
        .collect()
}

/// The bind mounts of `container`'s `volumeMounts` (mounts of unknown volumes or with an
/// escaping `subPath` are skipped: the API server refuses both); `read_only` names the
/// volumes mounted read-only whatever the mount says ([`read_only_volumes`]).
pub fn bind_mounts(
    container: &Container,
    volumes: &BTreeMap<String, PathBuf>,
    read_only: &BTreeSet<String>,
) -> Vec<BindMount> {
    container
        .volume_mounts
        .iter()
        .flatten()
        .filter_map(|m| {
            let mut source = volumes.get(&m.name)?.clone();
            let read_only = m.read_only.unwrap_or(false)
                || is_api_volume(&source)
                || read_only.contains(&m.name);
            if let Some(sub) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                source = source.join(safe_sub_path(sub)?);
            }
            Some(BindMount {
                source,
                target: PathBuf::from(&m.mount_path),
                read_only,
            })
        })
        .collect()
}

/// The value of a downward-API `fieldRef` for this pod.
fn field_value(pod: &Pod, field: &str, host_ip: &str, pod_ip: &str) -> Option<String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    match field {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        "status.hostIP" => Some(host_ip.to_owned()),
        "status.podIP" => Some(pod_ip.to_owned()),
        _ => {
            let key = field
                .strip_prefix("metadata.labels['")
                .map(|k| (k, &meta.labels))
                .or_else(|| {
                    field
                        .strip_prefix("metadata.annotations['")
                        .map(|k| (k, &meta.annotations))
                })?;
            key.1.as_ref()?.get(key.0.strip_suffix("']")?).cloned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn volume(v: serde_json::Value) -> Volume {
        serde_json::from_value(v).expect("volume")
    }

    #[test]
    fn a_pod_uses_the_sources_its_volumes_and_projections_name() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [], "volumes": [
                {"name": "a", "secret": {"secretName": "certs"}},
                {"name": "b", "configMap": {"name": "settings"}},
                {"name": "c", "projected": {"sources": [
                    {"configMap": {"name": "kube-root-ca.crt"}},
                    {"secret": {"name": "extra"}}
                ]}}
            ]}
        }))
        .expect("pod");
        assert!(uses_source(&pod, SourceKind::Secret, "certs"));
        assert!(uses_source(&pod, SourceKind::Secret, "extra"));
        assert!(uses_source(&pod, SourceKind::ConfigMap, "settings"));
        assert!(uses_source(&pod, SourceKind::ConfigMap, "kube-root-ca.crt"));
        // The kinds are not confused, and other names are not used.
        assert!(!uses_source(&pod, SourceKind::ConfigMap, "certs"));
        assert!(!uses_source(&pod, SourceKind::Secret, "settings"));
        assert!(!uses_source(&pod, SourceKind::Secret, "other"));
    }

    #[test]
    fn empty_dirs_live_under_the_pod_directory_as_kubelets_do() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let v = volume(json!({"name": "public", "emptyDir": {}}));
        let path = local_volume(&v, tmp.path(), &HostPathMap::default())
            .expect("local")
            .expect("set up");
        let dir = tmp.path().join("volumes/kubernetes.io~empty-dir/public");
        assert_eq!(path, dir);
        assert!(dir.is_dir());
    }

    #[test]
    fn host_path_types_are_checked_and_or_create_creates() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("f");
        std::fs::write(&file, b"x").expect("write");
        let set_up = |path: &Path, kind: &str| {
            let v = volume(json!({"name": "h", "hostPath": {"path": path, "type": kind}}));
            local_volume(&v, tmp.path(), &HostPathMap::default()).expect("local")
        };
        assert!(matches!(
            set_up(&file, "Directory"),
            Err(SetUpError::HostPathType { .. })
        ));
        assert!(set_up(&file, "File").is_ok());
        let made = tmp.path().join("made/here");
        set_up(&made, "DirectoryOrCreate").expect("create");
        assert!(made.is_dir());
        assert!(matches!(
            set_up(&tmp.path().join("none"), "Socket"),
            Err(SetUpError::HostPathType { .. })
        ));
    }

    #[test]
    fn messages_are_kubelets() {
        let e = VolumeError {
            volume: "cfg".into(),
            cause: SetUpError::NotFound {
                kind: "configmap",
                name: "app".into(),
            },
        };
        assert_eq!(
            e.message(),
            "MountVolume.SetUp failed for volume \"cfg\" : configmap \"app\" not found"
        );
        let pvc = volume(json!({"name": "d", "persistentVolumeClaim": {"claimName": "c"}}));
        assert!(local_volume(&pvc, Path::new("/nonexistent"), &HostPathMap::default()).is_none());
        assert_eq!(api_plugin(&pvc), None);
    }

    #[test]
    fn api_volumes_use_kubelets_plugin_directories() {
        let kinds = [
            (
                json!({"name": "a", "configMap": {"name": "x"}}),
                "kubernetes.io~configmap",
            ),
            (
                json!({"name": "a", "secret": {"secretName": "x"}}),
                "kubernetes.io~secret",
            ),
            (
                json!({"name": "a", "downwardAPI": {}}),
                "kubernetes.io~downward-api",
            ),
            (
                json!({"name": "a", "projected": {"sources": []}}),
                "kubernetes.io~projected",
            ),
        ];
        for (v, plugin) in kinds {
            assert_eq!(api_plugin(&volume(v)), Some(plugin));
        }
    }

    #[test]
    fn api_backed_volumes_are_mounted_read_only_and_names_stay_single_elements() {
        let c: Container = serde_json::from_value(
            json!({"name": "c", "volumeMounts": [{"name": "cfg", "mountPath": "/etc/app"}]}),
        )
        .expect("container");
        let dir = PathBuf::from("/pods/u/volumes/kubernetes.io~configmap/cfg");
        let mounts = bind_mounts(
            &c,
            &BTreeMap::from([("cfg".to_owned(), dir)]),
            &BTreeSet::new(),
        );
        assert!(mounts[0].read_only);
        assert!(is_plain_name("kube-api-access-x2b4z"));
        for bad in ["..", ".", "a/b", "", "/abs"] {
            assert!(!is_plain_name(bad), "{bad}");
        }
    }

    #[test]
    fn mounts_follow_volume_mounts_and_sub_paths_cannot_escape() {
        let c: Container = serde_json::from_value(json!({"name": "c", "volumeMounts": [
            {"name": "v", "mountPath": "/var/run/kubevirt"},
            {"name": "v", "mountPath": "/sub", "subPath": "a/b", "readOnly": true},
            {"name": "v", "mountPath": "/evil", "subPath": "../x"},
            {"name": "missing", "mountPath": "/m"},
        ]}))
        .expect("container");
        let volumes = BTreeMap::from([("v".to_owned(), PathBuf::from("/data/v"))]);
        let mounts = bind_mounts(&c, &volumes, &BTreeSet::new());
        assert_eq!(mounts.len(), 2);
        assert!(!mounts[0].read_only);
        assert_eq!(mounts[0].target, PathBuf::from("/var/run/kubevirt"));
        assert_eq!(mounts[1].source, PathBuf::from("/data/v/a/b"));
        assert!(mounts[1].read_only);
    }

    #[test]
    fn a_read_only_claim_is_mounted_read_only_in_every_container() {
        let pod: Pod = serde_json::from_value(json!({"spec": {
        "containers": [{"name": "c", "volumeMounts": [
            {"name": "ro", "mountPath": "/ro"}, {"name": "rw", "mountPath": "/rw"}]}],
        "volumes": [
            {"name": "ro", "persistentVolumeClaim": {"claimName": "a", "readOnly": true}},
            {"name": "rw", "persistentVolumeClaim": {"claimName": "b"}},
        ]}}))
        .expect("pod");
        let read_only = read_only_volumes(&pod);
        assert_eq!(read_only, BTreeSet::from(["ro".to_owned()]));
        let volumes = BTreeMap::from([
            ("ro".to_owned(), PathBuf::from("/s/pvc-a")),
            ("rw".to_owned(), PathBuf::from("/s/pvc-b")),
        ]);
        let container = &pod.spec.as_ref().expect("spec").containers[0];
        let mounts = bind_mounts(container, &volumes, &read_only);
        assert!(mounts[0].read_only);
        assert!(!mounts[1].read_only);
    }

    #[test]
    fn block_volumes_are_devices_at_their_device_path_and_only_there() {
        let pod: Pod = serde_json::from_value(json!({"spec": {
        "containers": [{"name": "c",
            "volumeMounts": [{"name": "fs", "mountPath": "/data"}],
            "volumeDevices": [{"name": "raw", "devicePath": "/dev/raw"},
                              {"name": "unknown", "devicePath": "/dev/x"},
                              {"name": "raw", "devicePath": "relative"}]}],
        "volumes": [
            {"name": "fs", "persistentVolumeClaim": {"claimName": "a"}},
            {"name": "raw", "persistentVolumeClaim": {"claimName": "b"}},
        ]}}))
        .expect("pod");
        let volumes = BTreeMap::from([
            ("fs".to_owned(), PathBuf::from("/s/pvc-a")),
            ("raw".to_owned(), PathBuf::from("/dev/loop3")),
        ]);
        let container = &pod.spec.as_ref().expect("spec").containers[0];
        assert_eq!(
            device_mounts(container, &volumes),
            vec![BindMount {
                source: PathBuf::from("/dev/loop3"),
                target: PathBuf::from("/dev/raw"),
                read_only: false,
            }]
        );
        let only_mounts = bind_mounts(container, &volumes, &BTreeSet::new());
        assert_eq!(only_mounts.len(), 1);
        assert_eq!(only_mounts[0].target, PathBuf::from("/data"));

        // kubelet's checks of the volume modes.
        let block = BTreeSet::from(["raw".to_owned(), "unknown".to_owned()]);
        assert!(volume_mode_error(&pod, &block).is_none(), "as used");
        let e = volume_mode_error(&pod, &BTreeSet::from(["unknown".to_owned()])).expect("misused");
        assert_eq!(
            e.message(),
            "MountVolume.SetUp failed for volume \"raw\" : volume raw has volumeMode Filesystem, but is specified in volumeDevices"
        );
        let e = volume_mode_error(&pod, &BTreeSet::from(["fs".to_owned()])).expect("misused");
        assert!(
            e.message()
                .ends_with("volume fs has volumeMode Block, but is specified in volumeMounts"),
            "{}",
            e.message()
        );
    }

    #[tokio::test]
    async fn a_block_volumes_file_is_given_through_its_loop_device() {
        use std::os::unix::fs::FileTypeExt;
        let tmp = tempfile::tempdir().expect("tempdir");
        assert!(matches!(
            block_device(tmp.path()).await,
            Err(SetUpError::BlockDevice { .. })
        ));
        assert!(block_device(&tmp.path().join("missing")).await.is_err());
        let root = nix::unistd::Uid::effective().is_root();
        if !root || !Path::new("/dev/loop-control").exists() {
            eprintln!("skipped the loop device part: needs root and /dev/loop-control");
            return;
        }
        let image = tmp.path().join("block.img");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(4 << 20))
            .expect("image");
        let device = block_device(&image).await.expect("attached");
        assert!(
            std::fs::metadata(&device)
                .expect("device")
                .file_type()
                .is_block_device()
        );
        assert_eq!(block_device(&image).await.expect("again"), device, "reused");
        assert_eq!(block_device(&device).await.expect("itself"), device);
        let detached = std::process::Command::new("losetup")
            .arg("--detach")
            .arg(&device)
            .status()
            .expect("losetup");
        assert!(detached.success());
    }

    #[test]
    fn claim_messages_are_kubelets() {
        let e = VolumeError {
            volume: "data".into(),
            cause: SetUpError::Claim {
                claim: "default/data".into(),
                problem: "PVC is not bound".into(),
            },
        };
        assert_eq!(
            e.message(),
            "MountVolume.SetUp failed for volume \"data\" : error processing PVC default/data: PVC is not bound"
        );
    }
}
