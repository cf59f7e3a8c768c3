//! The images of `images/` (built by `scripts/build-images.sh`) fit the manifests: every
//! image a Deployment or DaemonSet names has a Containerfile whose `ENTRYPOINT` is the
//! container's `command`, and one a pod must run as non-root declares a numeric non-root
//! `USER`. A file check only; nothing is built.

use std::path::{Path, PathBuf};

use kubevirt_install::{BINARY, InstallConfig, manifests};
use serde_json::Value;

fn images_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../images")
}

/// The parts of a Containerfile the manifests depend on.
#[derive(Debug)]
struct Containerfile {
    from: Vec<String>,
    entrypoint: Vec<String>,
    user: Option<String>,
}

/// Reads `images/<name>/Containerfile` (`ENTRYPOINT` in its JSON form; line continuations
/// joined, comments skipped).
fn containerfile(name: &str) -> Containerfile {
    let path = images_dir().join(name).join("Containerfile");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("image {name}: reading {}: {e}", path.display()));
    let mut file = Containerfile {
        from: Vec::new(),
        entrypoint: Vec::new(),
        user: None,
    };
    let joined = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("\\\n", " ");
    for line in joined.lines() {
        let Some((instruction, rest)) = line.trim().split_once(char::is_whitespace) else {
            continue;
        };
        let rest = rest.trim();
        match instruction.to_ascii_uppercase().as_str() {
            "FROM" => file.from.push(rest.to_owned()),
            "USER" => file.user = Some(rest.to_owned()),
            "ENTRYPOINT" => {
                file.entrypoint = serde_json::from_str(rest).unwrap_or_else(|e| {
                    panic!("image {name}: ENTRYPOINT {rest} is not a JSON array of strings: {e}")
                });
            }
            _ => {}
        }
    }
    file
}

/// `<registry>/<name>:<tag>` → `<name>` when the image is one of `config`'s.
fn image_name<'a>(config: &InstallConfig, image: &'a str) -> Option<&'a str> {
    let rest = image.strip_prefix(&format!("{}/", config.image_registry))?;
    let rest = rest.strip_prefix(&config.image_prefix)?;
    rest.strip_suffix(&format!(":{}", config.image_tag))
}

/// Every workload object (Deployment, DaemonSet) of the installation.
fn workloads(config: &InstallConfig) -> Vec<Value> {
    manifests(config)
        .expect("manifests")
        .into_iter()
        .flat_map(|g| g.objects)
        .filter(|o| matches!(o["kind"].as_str(), Some("Deployment" | "DaemonSet")))
        .collect()
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| v.as_str().expect("a string").to_owned())
        .collect()
}

#[test]
fn every_image_of_the_manifests_has_a_containerfile_with_the_containers_command() {
    let config = InstallConfig::default();
    let mut checked = Vec::new();
    for workload in workloads(&config) {
        let pod = &workload["spec"]["template"]["spec"];
        let pod_non_root = pod["securityContext"]["runAsNonRoot"] == Value::Bool(true);
        let containers = strings_of(&pod["initContainers"]).chain(strings_of(&pod["containers"]));
        for container in containers {
            let image = container["image"].as_str().expect("an image");
            let name = image_name(&config, image)
                .unwrap_or_else(|| panic!("{image} is not one of the installation's images"));
            let file = containerfile(name);
            assert_eq!(
                file.entrypoint,
                strings(&container["command"]),
                "image {name}: the Containerfile's ENTRYPOINT is not the container's command"
            );
            let non_root =
                pod_non_root || container["securityContext"]["runAsNonRoot"] == Value::Bool(true);
            let run_as_user = !container["securityContext"]["runAsUser"].is_null()
                || !pod["securityContext"]["runAsUser"].is_null();
            if non_root && !run_as_user {
                // The kubelet refuses a non-numeric or root USER under runAsNonRoot.
                let user = file.user.as_deref().unwrap_or("0");
                let uid: u32 = user.parse().unwrap_or_else(|_| {
                    panic!("image {name}: USER {user} must be numeric (runAsNonRoot)")
                });
                assert_ne!(
                    uid, 0,
                    "image {name} runs as root but its pod needs non-root"
                );
            }
            checked.push(name.to_owned());
        }
    }
    checked.sort();
    assert_eq!(checked, ["virt-api", "virt-controller", "virt-handler"]);
}

fn strings_of(value: &Value) -> impl Iterator<Item = &Value> {
    value.as_array().into_iter().flatten()
}

#[test]
fn the_launcher_image_virt_controller_is_given_has_a_containerfile() {
    let config = InstallConfig::default();
    let controller = workloads(&config)
        .into_iter()
        .find(|w| w["metadata"]["name"] == "virt-controller")
        .expect("the virt-controller Deployment");
    let args = strings(&controller["spec"]["template"]["spec"]["containers"][0]["args"]);
    let at = args
        .iter()
        .position(|a| a == "--launcher-image")
        .expect("--launcher-image");
    let name = image_name(&config, &args[at + 1]).expect("the launcher image is ours");
    assert_eq!(name, "virt-launcher");
    // virt-controller's launcher pods run `virt-launcher` in `compute` (and `virt-tail` in
    // `guest-console-log`, which sets its own command).
    assert_eq!(containerfile(name).entrypoint, ["virt-launcher"]);
}

#[test]
fn every_containerfile_is_from_scratch_and_runs_the_binary() {
    let mut names: Vec<String> = std::fs::read_dir(images_dir())
        .expect("images/")
        .map(|e| e.expect("an entry"))
        .filter(|e| e.path().join("Containerfile").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "cdi-controller",
            "cdi-importer",
            "virt-api",
            "virt-controller",
            "virt-handler",
            "virt-launcher",
            "virt-operator"
        ]
    );
    for name in &names {
        let file = containerfile(name);
        // Nothing can be pulled where the images are built (scripts/build-images.sh).
        assert_eq!(file.from, ["scratch"], "image {name}");
        // The launcher image runs its own small binary; the others the multi-call one.
        let program = if name == "virt-launcher" {
            "virt-launcher"
        } else {
            BINARY
        };
        assert_eq!(
            file.entrypoint.first().map(String::as_str),
            Some(program),
            "image {name}"
        );
        assert!(file.user.is_some(), "image {name} declares no USER");
    }
}
