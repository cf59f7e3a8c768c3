//! The node's image store: which container images this node can run, and with what.
//!
//! The embedded node has no container runtime and pulls nothing: an image is a name the
//! store knows, mapped to the programs its file system would hold (`command[0]` → a program
//! on this machine) and the environment its image config would set. The embedded server
//! registers the project's own images (the `kubevirt-rs` binary of this version under each
//! component image's name). A container whose image the store does not know gets kubelet's
//! `ErrImagePull` and nothing runs; a `command[0]` the image does not hold fails the
//! container as kubelet's runtime does (`StartError`, exit code 128).
//!
//! Other versions of the project's images are *releases*: `kubevirt-rs images import-release
//! <tag> <binary>` places a binary at `<releases dir>/<tag>/kubevirt-rs`, and from then on
//! every repository of a [`ReleaseFamily`] resolves under that tag to the family's image with
//! that binary. The store looks a release up when a container starts, so a release imported
//! into a running server is usable at once (an upgrade only patches the KubeVirt CR's
//! `imageTag`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What one image provides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Image {
    /// `command[0]` names (as written in pod specs, with or without a directory) → the
    /// program that runs for them.
    pub programs: BTreeMap<String, PathBuf>,
    /// The image's entrypoint, used when a container gives no `command`.
    pub entrypoint: Vec<String>,
    /// Environment of the image config; the container's `env` overrides it.
    pub env: Vec<(String, String)>,
}

/// The images of a node, by reference (`registry/repository:tag`).
#[derive(Debug, Clone, Default)]
pub struct ImageStore {
    images: BTreeMap<String, Image>,
    releases: Option<ReleaseFamily>,
}

/// Repositories whose every tag is a release of the project's programs (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseFamily {
    /// Directory holding one directory per tag, each with that release's programs.
    pub dir: PathBuf,
    /// Canonical repositories (without tag) → the image each tag provides: its `programs`
    /// are looked up by file name in the tag's directory.
    pub repositories: BTreeMap<String, Image>,
}

impl ReleaseFamily {
    /// The family's image for `reference` when its repository belongs to the family and its
    /// tag has been imported: each program of the repository's image whose file the tag's
    /// directory holds (a program the release lacks is not in its image, so a container
    /// naming it fails as on a real node).
    fn lookup(&self, reference: &str) -> Option<Image> {
        let canonical = canonical(reference);
        let (repository, tag) = canonical.rsplit_once(':')?;
        // The tag becomes a path component: only the OCI tag grammar, which has no `/`
        // and cannot be `.` or `..`.
        if !is_tag(tag) || repository.contains('@') {
            return None;
        }
        let template = self.repositories.get(repository)?;
        let tag_dir = self.dir.join(tag);
        let programs: BTreeMap<String, PathBuf> = template
            .programs
            .iter()
            .filter_map(|(name, path)| {
                let file = tag_dir.join(path.file_name()?);
                file.is_file().then(|| (name.clone(), file))
            })
            .collect();
        if programs.is_empty() {
            return None;
        }
        let mut image = template.clone();
        image.programs = programs;
        Some(image)
    }

    /// The repository of `reference` without its tag, as the family keys it.
    pub fn repository_of(reference: &str) -> String {
        let canonical = canonical(reference);
        match canonical.rsplit_once(':') {
            Some((repository, tag)) if !tag.contains('/') => repository.to_owned(),
            _ => canonical,
        }
    }
}

/// Why a release cannot be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportReleaseError {
    /// The tag is not an OCI tag.
    #[error("{0:?} is not an image tag ([A-Za-z0-9_][A-Za-z0-9._-]{{0,127}})")]
    InvalidTag(String),
    /// Copying the binary failed.
    #[error("importing {binary} as release {tag}: {source}")]
    Io {
        tag: String,
        binary: PathBuf,
        source: std::io::Error,
    },
}

/// Imports `binaries` as release `tag` of a family whose directory is `dir`: a private copy
/// of each at `dir/<tag>/<its file name>` (mode `0700`), written to a temporary file and
/// renamed into place, so a container starting meanwhile sees the old release or the new one,
/// never half a binary. Importing a tag again replaces its binaries; running processes keep
/// the ones they started with. Returns the tag's directory.
///
/// # Errors
/// [`ImportReleaseError`] for a tag that is not one, or when copying fails.
pub fn import_release(
    dir: &Path,
    tag: &str,
    binaries: &[&Path],
) -> Result<PathBuf, ImportReleaseError> {
    if !is_tag(tag) {
        return Err(ImportReleaseError::InvalidTag(tag.to_owned()));
    }
    let tag_dir = dir.join(tag);
    for binary in binaries {
        let io = |source| ImportReleaseError::Io {
            tag: tag.to_owned(),
            binary: binary.to_path_buf(),
            source,
        };
        private_fs::create_dir_all(&tag_dir).map_err(io)?;
        let program = binary
            .file_name()
            .ok_or_else(|| io(std::io::Error::other("not a file name")))?
            .to_string_lossy();
        let target = tag_dir.join(&*program);
        let tmp = tag_dir.join(format!(".{program}.tmp"));
        std::fs::copy(binary, &tmp).map_err(io)?;
        private_fs::set_mode(&tmp, 0o700).map_err(io)?;
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(io)?;
        std::fs::rename(&tmp, &target).map_err(io)?;
    }
    Ok(tag_dir)
}

/// The OCI distribution spec's tag grammar: `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
pub fn is_tag(tag: &str) -> bool {
    let mut chars = tag.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && tag.len() <= 128
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Why a container cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// The image is not in the store (kubelet's `ErrImagePull`).
    #[error("Failed to pull image \"{0}\": image not known to this node's image store")]
    NotFound(String),
    /// The image does not hold the command (kubelet's `StartError`).
    #[error(
        "failed to create containerd task: exec: \"{command}\": executable file not found in image {image}"
    )]
    NoSuchCommand { image: String, command: String },
    /// Neither the container nor the image names a command.
    #[error("no command specified for image {0}")]
    NoCommand(String),
}

/// What to execute for a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The program to execute.
    pub program: PathBuf,
    /// `argv[0]` as the pod spec wrote it.
    pub argv0: String,
    /// The rest of `command` followed by `args`.
    pub args: Vec<String>,
    /// The image's environment.
    pub env: Vec<(String, String)>,
}

/// `docker.io/library/x` and `x` name the same image; so do `x` and `x:latest`.
fn canonical(reference: &str) -> String {
    let without_registry = reference
        .strip_prefix("docker.io/library/")
        .or_else(|| reference.strip_prefix("docker.io/"))
        .unwrap_or(reference);
    let last = without_registry
        .rsplit('/')
        .next()
        .unwrap_or(without_registry);
    if last.contains(':') || last.contains('@') {
        without_registry.to_owned()
    } else {
        format!("{without_registry}:latest")
    }
}

impl ImageStore {
    /// An empty store: nothing runs.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) `reference`.
    pub fn insert(&mut self, reference: &str, image: Image) {
        self.images.insert(canonical(reference), image);
    }

    /// Resolves the tags of `family`'s repositories that no image inserted by
    /// [`ImageStore::insert`] holds to the releases imported into `family.dir`.
    pub fn set_releases(&mut self, family: ReleaseFamily) {
        self.releases = Some(family);
    }

    /// Whether `reference` is known.
    pub fn contains(&self, reference: &str) -> bool {
        self.find(reference).is_some()
    }

    fn find(&self, reference: &str) -> Option<std::borrow::Cow<'_, Image>> {
        if let Some(image) = self.images.get(&canonical(reference)) {
            return Some(std::borrow::Cow::Borrowed(image));
        }
        self.releases
            .as_ref()?
            .lookup(reference)
            .map(std::borrow::Cow::Owned)
    }

    /// What runs for a container of `image` with `command` and `args`, as a container
    /// runtime resolves them: `command` replaces the entrypoint, `args` follow.
    ///
    /// # Errors
    /// [`ImageError`] when the image or its command is unknown.
    pub fn resolve(
        &self,
        image: &str,
        command: &[String],
        args: &[String],
    ) -> Result<Resolved, ImageError> {
        let found = self
            .find(image)
            .ok_or_else(|| ImageError::NotFound(image.to_owned()))?;
        let argv: &[String] = if command.is_empty() {
            &found.entrypoint
        } else {
            command
        };
        let (argv0, rest) = argv
            .split_first()
            .ok_or_else(|| ImageError::NoCommand(image.to_owned()))?;
        let base = argv0.rsplit('/').next().unwrap_or(argv0);
        let program = found
            .programs
            .get(argv0.as_str())
            .or_else(|| found.programs.get(base))
            .ok_or_else(|| ImageError::NoSuchCommand {
                image: image.to_owned(),
                command: argv0.clone(),
            })?;
        let mut all_args = rest.to_vec();
        all_args.extend(args.iter().cloned());
        Ok(Resolved {
            program: program.clone(),
            argv0: argv0.clone(),
            args: all_args,
            env: found.env.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> ImageStore {
        let mut s = ImageStore::new();
        s.insert(
            "quay.io/kubevirt-rs/virt-launcher:v1",
            Image {
                programs: BTreeMap::from([("kubevirt-rs".into(), PathBuf::from("/bin/true"))]),
                entrypoint: vec!["kubevirt-rs".into()],
                env: vec![("A".into(), "1".into())],
            },
        );
        s
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn command_replaces_the_entrypoint_and_args_follow_unchanged() {
        let r = store()
            .resolve(
                "quay.io/kubevirt-rs/virt-launcher:v1",
                &strings(&["/usr/bin/kubevirt-rs", "launcher"]),
                &strings(&["--name", "x"]),
            )
            .unwrap();
        assert_eq!(r.program, PathBuf::from("/bin/true"));
        assert_eq!(r.argv0, "/usr/bin/kubevirt-rs");
        assert_eq!(r.args, strings(&["launcher", "--name", "x"]));
        assert_eq!(r.env, vec![("A".to_owned(), "1".to_owned())]);
    }

    #[test]
    fn an_unknown_image_is_err_image_pull_and_a_foreign_command_is_refused() {
        let s = store();
        assert_eq!(
            s.resolve("busybox", &strings(&["sh"]), &[]),
            Err(ImageError::NotFound("busybox".into()))
        );
        // Another tag of a known image is another image.
        assert!(matches!(
            s.resolve("quay.io/kubevirt-rs/virt-launcher:v2", &[], &[]),
            Err(ImageError::NotFound(_))
        ));
        assert!(matches!(
            s.resolve(
                "quay.io/kubevirt-rs/virt-launcher:v1",
                &strings(&["/bin/sh"]),
                &[]
            ),
            Err(ImageError::NoSuchCommand { .. })
        ));
    }

    #[test]
    fn the_entrypoint_runs_without_a_command_and_latest_is_the_default_tag() {
        let mut s = store();
        s.insert(
            "docker.io/library/tool",
            Image {
                programs: BTreeMap::from([("tool".into(), PathBuf::from("/bin/echo"))]),
                entrypoint: vec!["tool".into(), "--x".into()],
                env: vec![],
            },
        );
        let r = s.resolve("tool:latest", &[], &strings(&["y"])).unwrap();
        assert_eq!(r.program, PathBuf::from("/bin/echo"));
        assert_eq!(r.args, strings(&["--x", "y"]));
        assert!(s.contains("tool"));
    }

    #[test]
    fn an_imported_release_resolves_every_repository_of_its_family_under_its_tag() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = store();
        s.set_releases(ReleaseFamily {
            dir: dir.path().to_path_buf(),
            repositories: BTreeMap::from([(
                ReleaseFamily::repository_of("quay.io/kubevirt-rs/virt-launcher:v1"),
                Image {
                    programs: BTreeMap::from([
                        (
                            "kubevirt-rs".to_owned(),
                            PathBuf::from("/usr/bin/kubevirt-rs"),
                        ),
                        (
                            "virt-tail".to_owned(),
                            PathBuf::from("/usr/bin/virt-launcher"),
                        ),
                    ]),
                    entrypoint: vec!["kubevirt-rs".into()],
                    env: vec![("A".into(), "2".into())],
                },
            )]),
        });
        let v2 = "quay.io/kubevirt-rs/virt-launcher:v2";
        assert!(!s.contains(v2), "v2 is not imported yet");
        let built = tempfile::tempdir().unwrap();
        let binary = built.path().join("kubevirt-rs");
        std::fs::write(&binary, b"#!/bin/true").unwrap();
        assert!(matches!(
            import_release(dir.path(), "../v2", &[&binary]),
            Err(ImportReleaseError::InvalidTag(_))
        ));
        import_release(dir.path(), "v2", &[&binary]).unwrap();
        let r = s.resolve(v2, &[], &[]).unwrap();
        assert_eq!(r.program, dir.path().join("v2/kubevirt-rs"));
        // The release holds no virt-launcher: its image has no virt-tail.
        assert!(matches!(
            s.resolve(v2, &strings(&["virt-tail"]), &[]),
            Err(ImageError::NoSuchCommand { .. })
        ));
        assert_eq!(r.env, vec![("A".to_owned(), "2".to_owned())]);
        // An inserted image wins over a release of the same name.
        let v1 = s
            .resolve("quay.io/kubevirt-rs/virt-launcher:v1", &[], &[])
            .unwrap();
        assert_eq!(v1.program, PathBuf::from("/bin/true"));
        // Other repositories and tags that are not path components stay unknown.
        assert!(!s.contains("quay.io/kubevirt-rs/other:v2"));
        for tag in ["..", ".", "a/b", "-x", ""] {
            assert!(!is_tag(tag), "{tag:?}");
            assert!(!s.contains(&format!("quay.io/kubevirt-rs/virt-launcher:{tag}")));
        }
    }
}
