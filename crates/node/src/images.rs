//! The node's image store: which container images this node can run, and with what.
//!
//! The embedded node has no container runtime and pulls nothing: an image is a name the
//! store knows, mapped to the programs its file system would hold (`command[0]` → a program
//! on this machine) and the environment its image config would set. The embedded server
//! registers the project's own images (the `kubevirt-rs` binary of this version under each
//! component image's name). A container whose image the store does not know gets kubelet's
//! `ErrImagePull` and nothing runs; a `command[0]` the image does not hold fails the
//! container as kubelet's runtime does (`StartError`, exit code 128).

use std::collections::BTreeMap;
use std::path::PathBuf;

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

    /// Whether `reference` is known.
    pub fn contains(&self, reference: &str) -> bool {
        self.images.contains_key(&canonical(reference))
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
            .images
            .get(&canonical(image))
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
}
