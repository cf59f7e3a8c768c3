//! How an install writes KubeVirt's workloads ([`Rollout`]) and waits for them on the update
//! path, as upstream's `Reconciler.Sync` and `syncDaemonSet` do.
//!
//! On the update path virt-handler goes first and takes upstream's canary rollout
//! (`processCanaryUpgrade`):
//!
//! ```text
//!  DaemonSet written with maxUnavailable 1 ─► one pod of the new strategy (the canary) Ready?
//!        │ a canary that crashed: Warning FailedUpdate "daemonSet virt-handler rollout failed"
//!        ▼
//!  maxUnavailable 10% ─► every scheduled pod of the new strategy Ready ─► maxUnavailable 1
//! ```
//!
//! A pod belongs to the new strategy when it carries the strategy's
//! `kubevirt.io/install-strategy-{version,registry,identifier}` annotations (upstream's
//! `PodIsUpToDate`); the installer puts them on every workload's pod template.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kubevirt_api::events::{EventRecorder, EventType};
use serde_json::{Value, json};
use tracing::info;

use crate::strategy::{self, Strategy};

/// The kinds of KubeVirt's workloads, which an install orders by [`Rollout`].
pub const WORKLOAD_KINDS: [&str; 2] = ["DaemonSet", "Deployment"];

/// How long an update waits for one component to roll out before the pass fails (and is
/// retried by the next reconcile, which finds the component further along).
pub const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(180);

/// Upstream's `daemonSetDefaultMaxUnavailable`: the canary's, and the value at rest.
const DEFAULT_MAX_UNAVAILABLE: i32 = 1;
/// Upstream's `daemonSetFastMaxUnavailable`: once the canary is Ready.
const FAST_MAX_UNAVAILABLE: &str = "10%";
/// Upstream's event reason for a canary that crashed.
pub const FAILED_UPDATE_REASON: &str = "FailedUpdate";

/// The order in which an install writes KubeVirt's workloads: upstream's two paths
/// (`Reconciler.Sync`, `shouldTakeUpdatePath`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rollout {
    /// A first installation or a rollback: virt-api, virt-controller, then virt-handler, written
    /// one after the other. Upstream waits for virt-api before the controllers; with nothing
    /// installed yet there is nothing that waiting protects, so this path does not wait.
    Create,
    /// An update to another version: virt-handler first (the canary rollout), then
    /// virt-controller, virt-api last, each rolled out (every pod updated and ready) before the
    /// next is written, so that a newer virt-controller never drives an older handler and the
    /// API changes last.
    Update,
}

impl Rollout {
    /// Upstream's `shouldTakeUpdatePath`: a version was observed and the target is newer (by
    /// semantic version where both are one; any change otherwise).
    pub fn for_versions(observed: Option<&str>, target: &str) -> Rollout {
        let Some(observed) = observed.filter(|o| !o.is_empty()) else {
            return Rollout::Create;
        };
        let semver = |v: &str| semver::Version::parse(v.strip_prefix('v').unwrap_or(v)).ok();
        match (semver(observed), semver(target)) {
            (Some(o), Some(t)) if t <= o => Rollout::Create,
            _ if observed == target => Rollout::Create,
            _ => Rollout::Update,
        }
    }

    /// Where component `component` comes in this path's order.
    pub fn rank(self, component: &str) -> usize {
        let order: [&str; 3] = match self {
            Rollout::Create => ["virt-api", "virt-controller", "virt-handler"],
            Rollout::Update => ["virt-handler", "virt-controller", "virt-api"],
        };
        order
            .iter()
            .position(|c| *c == component)
            .unwrap_or(order.len())
    }

    /// Prepares workload `object` before it is written: on the update path a DaemonSet starts
    /// its canary with `maxUnavailable` 1.
    pub fn prepare(self, object: &mut Value) {
        if self == Rollout::Update && object["kind"] == "DaemonSet" {
            object["spec"]["updateStrategy"]["type"] = json!("RollingUpdate");
            object["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] =
                json!(DEFAULT_MAX_UNAVAILABLE);
        }
    }
}

/// Waits until workload `object` (as just written) has rolled out: a Deployment once its
/// controller saw the written generation and every replica is updated and available; a
/// DaemonSet through the canary rollout.
///
/// # Errors
/// When the API server cannot be read, a canary crashed, or `timeout` passes.
pub async fn wait_rolled_out(
    admin: &kube::Client,
    object: &Value,
    strategy: &Strategy,
    recorder: &EventRecorder,
    timeout: Duration,
) -> anyhow::Result<()> {
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let deadline = tokio::time::Instant::now() + timeout;
    let started = tokio::time::Instant::now();
    let daemonsets = Api::<DaemonSet>::namespaced(admin.clone(), namespace);
    loop {
        let done = if kind == "Deployment" {
            Api::<Deployment>::namespaced(admin.clone(), namespace)
                .get_opt(name)
                .await?
                .is_some_and(|d| deployment_rolled_out(&d))
        } else {
            let Some(ds) = daemonsets.get_opt(name).await? else {
                anyhow::bail!("DaemonSet {name} is gone");
            };
            let pods = Api::<Pod>::namespaced(admin.clone(), namespace)
                .list(&ListParams::default())
                .await?
                .items;
            let canary = Canary::observe(&ds, &pods, strategy);
            match canary.step() {
                CanaryStep::Failed => {
                    let message = format!("daemonSet {name} rollout failed");
                    recorder
                        .record(&ds, EventType::Warning, FAILED_UPDATE_REASON, &message)
                        .await;
                    anyhow::bail!(message);
                }
                CanaryStep::Canary | CanaryStep::Waiting => false,
                CanaryStep::Widen => {
                    info!(name, "canary ready, rolling out the rest");
                    set_max_unavailable(&daemonsets, name, json!(FAST_MAX_UNAVAILABLE)).await?;
                    false
                }
                CanaryStep::Done => {
                    if canary.max_unavailable != Some(json!(DEFAULT_MAX_UNAVAILABLE)) {
                        set_max_unavailable(&daemonsets, name, json!(DEFAULT_MAX_UNAVAILABLE))
                            .await?;
                    }
                    true
                }
            }
        };
        if done {
            info!(
                kind,
                name,
                seconds = started.elapsed().as_secs_f32(),
                "rolled out"
            );
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{kind} {name} has not rolled out within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn set_max_unavailable(
    daemonsets: &Api<DaemonSet>,
    name: &str,
    value: Value,
) -> anyhow::Result<()> {
    let patch = json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": value}}}});
    daemonsets
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// A Deployment whose controller saw its generation, with every replica updated and
/// available and no old replica left.
fn deployment_rolled_out(d: &Deployment) -> bool {
    let wanted = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let status = d.status.clone().unwrap_or_default();
    status.observed_generation >= d.metadata.generation
        && status.updated_replicas.unwrap_or(0) >= wanted
        && status.available_replicas.unwrap_or(0) >= wanted
        && status.replicas.unwrap_or(0) <= status.updated_replicas.unwrap_or(0)
}

/// What the canary rollout of a DaemonSet does next (upstream's `canaryUpgradeStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CanaryStep {
    /// No pod of the new strategy is Ready yet, none crashed: wait.
    Canary,
    /// No pod of the new strategy is Ready and one of them crashed.
    Failed,
    /// The canary is Ready, `maxUnavailable` is still the canary's: widen it.
    Widen,
    /// Widened, not every pod is updated and Ready yet: wait.
    Waiting,
    /// Every scheduled pod is updated and Ready: back to the default `maxUnavailable`.
    Done,
}

/// What a canary decision reads of a DaemonSet and its pods.
#[derive(Debug)]
struct Canary {
    desired: i32,
    updated_ready: i32,
    updated_crashed: bool,
    max_unavailable: Option<Value>,
}

impl Canary {
    fn observe(ds: &DaemonSet, pods: &[Pod], strategy: &Strategy) -> Canary {
        let name = ds.metadata.name.as_deref().unwrap_or_default();
        let updated: Vec<&Pod> =
            pods.iter()
                .filter(|p| {
                    p.metadata.owner_references.iter().flatten().any(|o| {
                        o.controller == Some(true) && o.kind == "DaemonSet" && o.name == name
                    })
                })
                .filter(|p| is_up_to_date(p, strategy))
                .collect();
        Canary {
            desired: ds.status.as_ref().map_or(0, |s| s.desired_number_scheduled),
            updated_ready: i32::try_from(updated.iter().filter(|p| is_ready(p)).count())
                .unwrap_or(i32::MAX),
            updated_crashed: updated.iter().any(|p| has_crashed(p)),
            max_unavailable: ds
                .spec
                .as_ref()
                .and_then(|s| s.update_strategy.as_ref())
                .and_then(|s| s.rolling_update.as_ref())
                .and_then(|r| r.max_unavailable.as_ref())
                .and_then(|v| serde_json::to_value(v).ok()),
        }
    }

    fn step(&self) -> CanaryStep {
        let widened = self
            .max_unavailable
            .as_ref()
            .is_some_and(|v| *v != json!(DEFAULT_MAX_UNAVAILABLE));
        if self.updated_ready >= self.desired {
            CanaryStep::Done
        } else if self.updated_ready == 0 && self.updated_crashed {
            CanaryStep::Failed
        } else if self.updated_ready == 0 {
            CanaryStep::Canary
        } else if widened {
            CanaryStep::Waiting
        } else {
            CanaryStep::Widen
        }
    }
}

/// Upstream's `PodIsUpToDate`: the pod carries the strategy's version, registry and
/// deployment ID.
fn is_up_to_date(pod: &Pod, strategy: &Strategy) -> bool {
    let annotations = pod.metadata.annotations.as_ref();
    let has = |key: &str, want: &str| {
        annotations
            .and_then(|a| a.get(key))
            .is_some_and(|v| v == want)
    };
    has(strategy::VERSION_ANNOTATION, &strategy.version)
        && has(strategy::REGISTRY_ANNOTATION, &strategy.registry)
        && has(strategy::IDENTIFIER_ANNOTATION, &strategy.id)
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Upstream's `PodIsCrashLooping`: a container that terminated or restarted.
fn has_crashed(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|statuses| {
            statuses.iter().any(|c| {
                c.restart_count > 0
                    || c.state.as_ref().is_some_and(|s| s.terminated.is_some())
                    || c.last_state
                        .as_ref()
                        .is_some_and(|s| s.terminated.is_some())
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_to_a_newer_version_takes_upstreams_update_path_and_everything_else_the_create_path()
     {
        use Rollout::{Create, Update};
        let cases = [
            (None, "v1.2.0", Create, "a first installation"),
            (Some("1.2.0"), "1.2.0", Create, "the same version"),
            (Some("v1.2.0"), "v1.3.0", Update, "a newer semantic version"),
            (Some("1.3.0"), "1.2.0", Create, "a rollback"),
            (Some("0.1.0"), "next", Update, "a tag that is not a version"),
            (
                Some("next"),
                "0.1.0",
                Update,
                "from a tag that is not a version",
            ),
        ];
        for (observed, target, want, case) in cases {
            assert_eq!(Rollout::for_versions(observed, target), want, "{case}");
        }
        let order = |r: Rollout| {
            let mut names = ["virt-controller", "virt-api", "virt-handler"];
            names.sort_by_key(|n| r.rank(n));
            names
        };
        assert_eq!(
            order(Update),
            ["virt-handler", "virt-controller", "virt-api"]
        );
        assert_eq!(
            order(Create),
            ["virt-api", "virt-controller", "virt-handler"]
        );
    }

    #[test]
    fn only_the_update_path_starts_a_daemonset_with_the_canarys_max_unavailable() {
        let mut ds =
            json!({"kind": "DaemonSet", "spec": {"updateStrategy": {"type": "RollingUpdate"}}});
        Rollout::Create.prepare(&mut ds);
        assert_eq!(ds["spec"]["updateStrategy"].get("rollingUpdate"), None);
        Rollout::Update.prepare(&mut ds);
        assert_eq!(
            ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
            1
        );
        let mut deployment = json!({"kind": "Deployment", "spec": {}});
        Rollout::Update.prepare(&mut deployment);
        assert_eq!(deployment, json!({"kind": "Deployment", "spec": {}}));
    }

    fn canary(desired: i32, ready: i32, crashed: bool, max_unavailable: Value) -> CanaryStep {
        Canary {
            desired,
            updated_ready: ready,
            updated_crashed: crashed,
            max_unavailable: Some(max_unavailable).filter(|v| !v.is_null()),
        }
        .step()
    }

    #[test]
    fn the_canary_widens_to_ten_percent_once_ready_and_returns_to_one_when_done() {
        use CanaryStep::{Canary, Done, Failed, Waiting, Widen};
        let cases = [
            (3, 0, false, json!(1), Canary, "the canary is not ready yet"),
            (3, 0, true, json!(1), Failed, "the canary crashed"),
            (
                3,
                1,
                true,
                json!(1),
                Widen,
                "a crash after a ready canary is the rollout's",
            ),
            (3, 1, false, json!(1), Widen, "the canary is ready"),
            (3, 1, false, Value::Null, Widen, "the API's default is 1"),
            (3, 2, false, json!("10%"), Waiting, "widened, rolling"),
            (
                3,
                3,
                false,
                json!("10%"),
                Done,
                "every pod updated and ready",
            ),
            (
                1,
                1,
                false,
                json!(1),
                Done,
                "one node: the canary is the rollout",
            ),
            (0, 0, false, json!(1), Done, "scheduled nowhere"),
        ];
        for (desired, ready, crashed, max, want, case) in cases {
            assert_eq!(canary(desired, ready, crashed, max), want, "{case}");
        }
    }

    fn pod(owner: &str, annotations: &Value, ready: &str, restarts: i32) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "annotations": annotations, "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "DaemonSet", "name": owner, "uid": "u",
                "controller": true}]},
            "status": {"conditions": [{"type": "Ready", "status": ready}],
                       "containerStatuses": [{"name": "c", "image": "i", "imageID": "",
                                              "ready": ready == "True", "restartCount": restarts}]}
        }))
        .unwrap()
    }

    #[test]
    fn only_ready_pods_of_the_daemonset_and_the_strategy_count_as_updated() {
        let strategy = Strategy {
            version: "v2".into(),
            registry: "kubevirt-rs".into(),
            id: "abc".into(),
            config_map: "kubevirt-install-strategy-x".into(),
            objects: std::sync::Arc::default(),
        };
        let current = json!({
            strategy::VERSION_ANNOTATION: "v2",
            strategy::REGISTRY_ANNOTATION: "kubevirt-rs",
            strategy::IDENTIFIER_ANNOTATION: "abc",
        });
        let mut old = current.clone();
        old[strategy::VERSION_ANNOTATION] = json!("v1");
        let ds: DaemonSet = serde_json::from_value(json!({
            "metadata": {"name": "virt-handler"},
            "spec": {"selector": {}, "template": {}},
            "status": {"desiredNumberScheduled": 4, "currentNumberScheduled": 4,
                       "numberMisscheduled": 0, "numberReady": 4}
        }))
        .unwrap();
        let pods = [
            pod("virt-handler", &current, "True", 0),
            pod("virt-handler", &current, "False", 2),
            pod("virt-handler", &old, "True", 0),
            pod("other", &current, "True", 0),
        ];
        let seen = Canary::observe(&ds, &pods, &strategy);
        assert_eq!(
            (seen.desired, seen.updated_ready, seen.updated_crashed),
            (4, 1, true)
        );
        assert_eq!(seen.max_unavailable, None);
    }
}
