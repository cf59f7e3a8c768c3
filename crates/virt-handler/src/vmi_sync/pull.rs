//! The images a VMI needs, pulled before its launcher gets the spec.
//!
//! Data flow: [`images_of`] lists the VMI's `containerDisk` volumes and its
//! `kernelBoot.container` with their pull policy and pull secret → [`ensure_images`] reads each
//! secret (type `kubernetes.io/dockerconfigjson`, in the VMI's namespace) and asks the
//! [`ImageStore`] to make the image present → a failure becomes kubelet's reasons through
//! [`PullBackoff`]: `ErrImagePull` on the first failure, `ImagePullBackOff` while retrying
//! with a delay of 10 s doubling to 5 min, and `ErrImageNeverPull` for a missing image with
//! policy `Never`.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kubevirt_api::v1::VirtualMachineInstance;
use tokio::time::Instant;

use crate::images::{ImageError, ImageStore, PullPolicy};

/// The first retry delay after a failed pull (kubelet's).
pub const BACKOFF_INITIAL: Duration = Duration::from_secs(10);
/// The longest retry delay (kubelet's).
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// The Secret type of image pull secrets.
const DOCKER_CONFIG_JSON_TYPE: &str = "kubernetes.io/dockerconfigjson";
/// Its data key.
const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";

/// One image a VMI needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NeededImage {
    /// The image reference.
    pub image: String,
    /// Its pull policy.
    pub policy: PullPolicy,
    /// The name of its pull secret in the VMI's namespace.
    pub secret: Option<String>,
}

/// The containerDisk volumes' images and the `kernelBoot.container` image, in that order,
/// each once.
pub fn images_of(vmi: &VirtualMachineInstance) -> Vec<NeededImage> {
    let mut out: Vec<NeededImage> = Vec::new();
    let mut add = |image: &str, policy: Option<&str>, secret: Option<&String>| {
        if image.trim().is_empty() || out.iter().any(|n| n.image == image) {
            return;
        }
        out.push(NeededImage {
            image: image.to_owned(),
            policy: PullPolicy::for_image(policy, image),
            secret: secret.filter(|s| !s.is_empty()).cloned(),
        });
    };
    for volume in &vmi.spec.volumes {
        if let Some(cd) = &volume.volume_source.container_disk {
            add(
                &cd.image,
                cd.image_pull_policy.as_deref(),
                cd.image_pull_secret.as_ref(),
            );
        }
    }
    let container = vmi
        .spec
        .domain
        .firmware
        .as_ref()
        .and_then(|f| f.kernel_boot.as_ref())
        .and_then(|k| k.container.as_ref());
    if let Some(c) = container {
        add(
            &c.image,
            c.image_pull_policy.as_deref(),
            c.image_pull_secret.as_ref(),
        );
    }
    out
}

/// Why an image is not there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullFailure {
    /// The image.
    pub image: String,
    /// What went wrong, with its causes.
    pub message: String,
    /// The policy is `Never` and the image is missing.
    pub never: bool,
}

fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The registry credentials of `secret` in `namespace` for `image`'s registry.
async fn credentials(
    client: &kube::Client,
    namespace: &str,
    secret: &str,
    image: &str,
) -> Result<Option<oci_pull::Credentials>, String> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let found = api
        .get_opt(secret)
        .await
        .map_err(|e| format!("reading the image pull secret {namespace}/{secret}: {e}"))?
        .ok_or_else(|| format!("the image pull secret {namespace}/{secret} does not exist"))?;
    if found.type_.as_deref() != Some(DOCKER_CONFIG_JSON_TYPE) {
        return Err(format!(
            "the image pull secret {namespace}/{secret} is not of type {DOCKER_CONFIG_JSON_TYPE}"
        ));
    }
    let document = found
        .data
        .as_ref()
        .and_then(|d| d.get(DOCKER_CONFIG_JSON_KEY))
        .ok_or_else(|| {
            format!("the image pull secret {namespace}/{secret} has no {DOCKER_CONFIG_JSON_KEY}")
        })?;
    let registry = oci_pull::ImageReference::parse(image)
        .map_err(|e| e.to_string())?
        .registry;
    oci_pull::auth::credentials_for(&document.0, &registry)
        .map_err(|e| format!("the image pull secret {namespace}/{secret}: {}", chain(&e)))
}

/// Makes every image of `vmi` present in `store`.
///
/// # Errors
/// The first image that could not be made present.
pub async fn ensure_images(
    client: &kube::Client,
    store: &ImageStore,
    vmi: &VirtualMachineInstance,
) -> Result<(), PullFailure> {
    let namespace = vmi.metadata.namespace.clone().unwrap_or_default();
    for needed in images_of(vmi) {
        let fail = |message: String, never: bool| PullFailure {
            image: needed.image.clone(),
            message,
            never,
        };
        // A present image needs no secret unless its policy asks the registry again.
        let asks_registry = needed.policy == PullPolicy::Always || !store.contains(&needed.image);
        let creds = match &needed.secret {
            Some(secret) if asks_registry && needed.policy != PullPolicy::Never => {
                credentials(client, &namespace, secret, &needed.image)
                    .await
                    .map_err(|m| fail(m, false))?
            }
            _ => None,
        };
        match store
            .ensure(&needed.image, needed.policy, creds.as_ref())
            .await
        {
            Ok(()) => {}
            Err(e @ ImageError::NeverPull(_)) => return Err(fail(e.to_string(), true)),
            Err(e) => return Err(fail(chain(&e), false)),
        }
    }
    Ok(())
}

/// kubelet's image pull back-off for one VMI.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PullBackoff {
    failures: u32,
    next: Option<Instant>,
}

impl PullBackoff {
    /// The delay after `failures` consecutive failures: 10 s, doubling, at most 5 min.
    pub fn delay(failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(16);
        BACKOFF_INITIAL
            .saturating_mul(1 << doublings)
            .min(BACKOFF_MAX)
    }

    /// When the next pull may be tried; `None` when there is no back-off.
    pub fn next_attempt(&self) -> Option<Instant> {
        self.next
    }

    /// Whether a pull may be tried at `now`.
    pub fn may_try(&self, now: Instant) -> bool {
        self.next.is_none_or(|next| now >= next)
    }

    /// Records a failed pull at `now`; returns the condition's `(reason, message)`.
    pub fn failed(&mut self, now: Instant, failure: &PullFailure) -> (String, String) {
        self.failures = self.failures.saturating_add(1);
        self.next = Some(now + Self::delay(self.failures));
        let image = &failure.image;
        let (reason, message) = if failure.never {
            ("ErrImageNeverPull", failure.message.clone())
        } else if self.failures == 1 {
            (
                "ErrImagePull",
                format!("Failed to pull image \"{image}\": {}", failure.message),
            )
        } else {
            (
                "ImagePullBackOff",
                format!("Back-off pulling image \"{image}\": {}", failure.message),
            )
        };
        (reason.to_owned(), message)
    }

    /// Records a successful pull: no more back-off.
    pub fn succeeded(&mut self) {
        *self = PullBackoff::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi(json: serde_json::Value) -> VirtualMachineInstance {
        serde_json::from_value(json).expect("vmi")
    }

    #[test]
    fn container_disks_and_the_kernel_boot_container_are_needed_once_each() {
        let v = vmi(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "a", "namespace": "ns"},
            "spec": {
                "domain": {"devices": {}, "firmware": {"kernelBoot": {"container": {
                    "image": "127.0.0.1:5000/kernel:v1", "kernelPath": "/vmlinux"}}}},
                "volumes": [
                    {"name": "a", "containerDisk": {"image": "127.0.0.1:5000/guest:latest",
                        "imagePullSecret": "creds"}},
                    {"name": "b", "containerDisk": {"image": "127.0.0.1:5000/guest:latest"}},
                    {"name": "c", "containerDisk": {"image": "quay.io/x:v2", "imagePullPolicy": "Never"}},
                    {"name": "d", "emptyDisk": {"capacity": "1Mi"}}
                ]
            }
        }));
        let needed = images_of(&v);
        assert_eq!(
            needed,
            vec![
                NeededImage {
                    image: "127.0.0.1:5000/guest:latest".into(),
                    policy: PullPolicy::Always,
                    secret: Some("creds".into()),
                },
                NeededImage {
                    image: "quay.io/x:v2".into(),
                    policy: PullPolicy::Never,
                    secret: None,
                },
                NeededImage {
                    image: "127.0.0.1:5000/kernel:v1".into(),
                    policy: PullPolicy::IfNotPresent,
                    secret: None,
                },
            ]
        );
    }

    #[test]
    fn pull_failures_back_off_from_10_seconds_doubling_to_5_minutes() {
        let delays: Vec<u64> = (1..=8).map(|n| PullBackoff::delay(n).as_secs()).collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(PullBackoff::delay(u32::MAX), BACKOFF_MAX);
    }

    #[test]
    fn the_first_failure_is_err_image_pull_and_retries_image_pull_back_off() {
        let failure = PullFailure {
            image: "127.0.0.1:1/x:latest".into(),
            message: "connection refused".into(),
            never: false,
        };
        let mut backoff = PullBackoff::default();
        let now = Instant::now();
        assert!(backoff.may_try(now));
        let (reason, message) = backoff.failed(now, &failure);
        assert_eq!(reason, "ErrImagePull");
        assert_eq!(
            message,
            "Failed to pull image \"127.0.0.1:1/x:latest\": connection refused"
        );
        assert!(!backoff.may_try(now + Duration::from_secs(9)));
        assert!(backoff.may_try(now + Duration::from_secs(10)));
        let (reason, message) = backoff.failed(now + Duration::from_secs(10), &failure);
        assert_eq!(reason, "ImagePullBackOff");
        assert!(message.starts_with("Back-off pulling image"), "{message}");
        assert_eq!(backoff.next_attempt(), Some(now + Duration::from_secs(30)));
        backoff.succeeded();
        assert!(backoff.may_try(now));
    }
}
