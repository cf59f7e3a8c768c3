//! The status part of kube's disruption controller (`pkg/controller/disruption`): for every
//! PodDisruptionBudget, how many of its pods are healthy, how many must be, and so how many
//! may be disrupted (what the eviction API checks).
//!
//! Data flow: PodDisruptionBudget and pod changes → PDB keys (a pod wakes every PDB of its
//! namespace) → `reconcile`: the pods its selector matches → `expectedPods` and
//! `desiredHealthy` (an integer `minAvailable` against the matching pods; a percentage or
//! `maxUnavailable` against the scale of the pods' controllers) → `currentHealthy` (ready,
//! not being deleted, not recently evicted) → status with the `DisruptionAllowed` condition,
//! written when it changed.
//!
//! # Guarantees
//! - `disruptionsAllowed` is `currentHealthy - desiredHealthy`, and never above zero while no
//!   pod is expected or the expected count cannot be worked out (the status then says
//!   `SyncFailed`), as kube's fail-safe does.
//! - Status is written only when it changed, with the PDB's `resourceVersion`.
//!
//! # Caveats
//! - Scales are read for ReplicaSets and Deployments from the caches; pods of other
//!   controllers make a percentage or `maxUnavailable` budget fail safe.
//! - A controller's scale change is seen when its pods change, not before.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::informer::Seen;
use crate::ownership::{controller_of, selector_is_empty, selector_matches};
use crate::{Context, Error, pods};

/// The condition type of a PDB's status.
pub const DISRUPTION_ALLOWED: &str = "DisruptionAllowed";
/// Reason of [`DISRUPTION_ALLOWED`] `True`.
pub const SUFFICIENT_PODS: &str = "SufficientPods";
/// Reason of [`DISRUPTION_ALLOWED`] `False` for too few healthy pods.
pub const INSUFFICIENT_PODS: &str = "InsufficientPods";
/// Reason of [`DISRUPTION_ALLOWED`] `False` when the status could not be worked out.
pub const SYNC_FAILED: &str = "SyncFailed";
/// How long an evicted pod (in `status.disruptedPods`) is not counted healthy while it is
/// not yet being deleted (kube's `DeletionTimeout`).
pub const DELETION_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs the controller until `cancel` fires.
pub(crate) async fn run(
    ctx: Arc<Context>,
    budgets: UnboundedReceiver<Seen<PodDisruptionBudget>>,
    pods: UnboundedReceiver<Seen<Pod>>,
    config: kube::runtime::controller::Config,
    cancel: CancellationToken,
) {
    let own = UnboundedReceiverStream::new(budgets).filter_map(|seen| {
        futures::future::ready((!seen.deleted).then(|| ObjectRef::from_obj(&*seen.object)))
    });
    let from_pods = {
        let ctx = ctx.clone();
        UnboundedReceiverStream::new(pods).flat_map(move |seen| {
            let namespace = seen.object.namespace();
            let keys: Vec<ObjectRef<PodDisruptionBudget>> = ctx
                .budgets
                .state()
                .iter()
                .filter(|b| b.namespace() == namespace)
                .map(|b| ObjectRef::from_obj(&**b))
                .collect();
            futures::stream::iter(keys)
        })
    };
    let queue = futures::stream::select(own, from_pods).map(Ok::<_, Infallible>);
    let stream = kube::runtime::controller::applier(
        |pdb, ctx| Box::pin(reconcile(pdb, ctx)),
        crate::error_policy,
        ctx.clone(),
        ctx.budgets.clone(),
        queue,
        config,
    );
    crate::drive(stream, cancel).await;
}

/// Whether a PDB selects `pod` (policy/v1: an empty selector selects every pod of the
/// namespace, a missing one none).
fn selects(pdb: &PodDisruptionBudget, pod: &Pod) -> bool {
    match pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) {
        None => false,
        Some(sel) if selector_is_empty(sel) => true,
        Some(sel) => selector_matches(sel, pod.labels()),
    }
}

/// `value` of `total` (an integer, or a percentage rounded up), as kube's
/// `GetScaledValueFromIntOrPercent`.
fn scaled(value: &IntOrString, total: i32) -> Result<i32, String> {
    match value {
        IntOrString::Int(n) => Ok(*n),
        IntOrString::String(s) => {
            let percent: i64 = s
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| format!("invalid value for IntOrString: invalid value {s:?}"))?;
            let scaled = (percent * i64::from(total) + 99).div_euclid(100);
            Ok(i32::try_from(scaled).unwrap_or(i32::MAX))
        }
    }
}

/// The sum of the scales of the controllers of `pods` (kube's `getExpectedScale`); pods
/// without a controller are left out.
fn expected_scale(ctx: &Context, pods: &[Arc<Pod>]) -> Result<i32, String> {
    let mut scales: HashMap<String, i32> = HashMap::new();
    for pod in pods {
        let Some(owner) = controller_of(&pod.metadata) else {
            continue;
        };
        if scales.contains_key(&owner.uid) {
            continue;
        }
        let namespace = pod.namespace().unwrap_or_default();
        let rs = (owner.kind == "ReplicaSet")
            .then(|| {
                ctx.replica_sets
                    .get(&ObjectRef::<ReplicaSet>::new(&owner.name).within(&namespace))
            })
            .flatten()
            .filter(|rs| rs.uid().as_deref() == Some(owner.uid.as_str()));
        let Some(rs) = rs else {
            return Err(format!("found no controllers for pod {:?}", pod.name_any()));
        };
        let deployment = controller_of(&rs.metadata)
            .filter(|o| o.kind == "Deployment")
            .and_then(|o| {
                ctx.deployments
                    .get(&ObjectRef::<Deployment>::new(&o.name).within(&namespace))
                    .filter(|d| d.uid().as_deref() == Some(o.uid.as_str()))
            });
        let (uid, scale) = match deployment {
            Some(d) => (
                d.uid().unwrap_or_default(),
                d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
            ),
            None => (
                owner.uid.clone(),
                rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
            ),
        };
        scales.insert(owner.uid.clone(), 0);
        scales.insert(uid, scale);
    }
    Ok(scales.values().sum())
}

/// `(expectedPods, desiredHealthy)` of a PDB over the pods it selects (kube's
/// `getExpectedPodCount`).
fn expected_and_desired(
    ctx: &Context,
    pdb: &PodDisruptionBudget,
    pods: &[Arc<Pod>],
) -> Result<(i32, i32), String> {
    let spec = pdb.spec.clone().unwrap_or_default();
    let matching = i32::try_from(pods.len()).unwrap_or(i32::MAX);
    if let Some(max_unavailable) = &spec.max_unavailable {
        let expected = expected_scale(ctx, pods)?;
        let desired = (expected - scaled(max_unavailable, expected)?).max(0);
        return Ok((expected, desired));
    }
    match &spec.min_available {
        Some(IntOrString::Int(n)) => Ok((matching, *n)),
        Some(percent @ IntOrString::String(_)) => {
            let expected = expected_scale(ctx, pods)?;
            Ok((expected, scaled(percent, expected)?))
        }
        None => Ok((0, 0)),
    }
}

/// The evictions of `status.disruptedPods` still pending at `now` (pods present, not yet
/// being deleted, evicted less than [`DELETION_TIMEOUT`] ago), and when the first expires.
fn pending_disruptions(
    pdb: &PodDisruptionBudget,
    pods: &[Arc<Pod>],
    now: jiff::Timestamp,
) -> (BTreeMap<String, Time>, Option<Duration>) {
    let recorded = pdb
        .status
        .as_ref()
        .and_then(|s| s.disrupted_pods.clone())
        .unwrap_or_default();
    let mut pending = BTreeMap::new();
    let mut recheck: Option<Duration> = None;
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(at) = recorded.get(&pod.name_any()) else {
            continue;
        };
        let timeout = jiff::SignedDuration::from_secs(
            i64::try_from(DELETION_TIMEOUT.as_secs()).unwrap_or(i64::MAX),
        );
        let Ok(expires) = at.0.checked_add(timeout) else {
            continue;
        };
        if expires > now {
            let left = Duration::try_from(expires.duration_since(now)).unwrap_or_default();
            recheck = Some(recheck.map_or(left, |r| r.min(left)));
            pending.insert(pod.name_any(), at.clone());
        }
    }
    (pending, recheck)
}

/// Sets the `DisruptionAllowed` condition (its transition time changes only with its status).
fn set_condition(
    conditions: &mut Vec<Condition>,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
) {
    let status = if status { "True" } else { "False" };
    let existing = conditions
        .iter_mut()
        .find(|c| c.type_ == DISRUPTION_ALLOWED);
    let transition = match &existing {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => crate::now_time(),
    };
    let condition = Condition {
        type_: DISRUPTION_ALLOWED.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: transition,
        observed_generation: generation,
    };
    match existing {
        Some(c) => *c = condition,
        None => conditions.push(condition),
    }
}

/// The status a PDB should show, from the counts or from the error that prevented them.
pub fn calculate_status(
    pdb: &PodDisruptionBudget,
    counts: Result<(i32, i32, i32), String>,
    disrupted: BTreeMap<String, Time>,
) -> PodDisruptionBudgetStatus {
    let old = pdb.status.clone().unwrap_or_default();
    let mut conditions = old.conditions.clone().unwrap_or_default();
    let generation = pdb.metadata.generation;
    match counts {
        Ok((current, desired, expected)) => {
            let allowed = if expected <= 0 {
                0
            } else {
                (current - desired).max(0)
            };
            let reason = if allowed > 0 {
                SUFFICIENT_PODS
            } else {
                INSUFFICIENT_PODS
            };
            set_condition(
                &mut conditions,
                allowed > 0,
                reason,
                String::new(),
                generation,
            );
            PodDisruptionBudgetStatus {
                current_healthy: current,
                desired_healthy: desired,
                expected_pods: expected,
                disruptions_allowed: allowed,
                disrupted_pods: (!disrupted.is_empty()).then_some(disrupted),
                observed_generation: generation,
                conditions: Some(conditions),
            }
        }
        Err(message) => {
            set_condition(
                &mut conditions,
                false,
                SYNC_FAILED,
                message,
                old.observed_generation,
            );
            PodDisruptionBudgetStatus {
                disruptions_allowed: 0,
                conditions: Some(conditions),
                ..old
            }
        }
    }
}

/// One pass over a PDB: count, then write the status if it changed.
async fn reconcile(pdb: Arc<PodDisruptionBudget>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = pdb.namespace().unwrap_or_default();
    let selected: Vec<Arc<Pod>> = ctx
        .pods
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(namespace.as_str()) && selects(&pdb, p))
        .collect();
    let now = crate::now();
    let (disrupted, recheck) = pending_disruptions(&pdb, &selected, now);
    let counts = expected_and_desired(&ctx, &pdb, &selected).map(|(expected, desired)| {
        let healthy = selected
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| !disrupted.contains_key(&p.name_any()))
            .filter(|p| pods::is_ready(p))
            .count();
        (
            i32::try_from(healthy).unwrap_or(i32::MAX),
            desired,
            expected,
        )
    });
    let status = calculate_status(&pdb, counts, disrupted);
    if pdb.status.as_ref() != Some(&status) {
        let mut updated = (*pdb).clone();
        updated.status = Some(status);
        let api: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), &namespace);
        api.replace_status(&pdb.name_any(), &PostParams::default(), &updated)
            .await
            .map_err(|source| Error::UpdateStatus {
                kind: "PodDisruptionBudget",
                name: pdb.name_any(),
                source,
            })?;
    }
    Ok(recheck.map_or_else(Action::await_change, Action::requeue))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pdb(spec: serde_json::Value) -> PodDisruptionBudget {
        let mut pdb = json!({"metadata": {"name": "b", "namespace": "ns", "generation": 3}});
        pdb["spec"] = spec;
        serde_json::from_value(pdb).unwrap()
    }

    #[test]
    fn percentages_round_up_as_kube_does() {
        assert_eq!(scaled(&IntOrString::String("50%".into()), 3), Ok(2));
        assert_eq!(scaled(&IntOrString::String("100%".into()), 3), Ok(3));
        assert_eq!(scaled(&IntOrString::Int(1), 3), Ok(1));
        assert!(scaled(&IntOrString::String("half".into()), 3).is_err());
    }

    #[test]
    fn disruptions_are_allowed_only_above_the_desired_count() {
        let b = pdb(json!({"minAvailable": 1}));
        let s = calculate_status(&b, Ok((2, 1, 2)), BTreeMap::new());
        assert_eq!(s.disruptions_allowed, 1);
        assert_eq!(s.observed_generation, Some(3));
        let c = &s.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", SUFFICIENT_PODS)
        );
        let s = calculate_status(&b, Ok((0, 1, 0)), BTreeMap::new());
        assert_eq!(s.disruptions_allowed, 0);
        let c = &s.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", INSUFFICIENT_PODS)
        );
    }

    #[test]
    fn an_unchanged_budget_computes_the_status_it_already_has() {
        let mut b = pdb(json!({"minAvailable": 1}));
        b.status = Some(calculate_status(&b, Ok((2, 1, 2)), BTreeMap::new()));
        assert_eq!(
            b.status,
            Some(calculate_status(&b, Ok((2, 1, 2)), BTreeMap::new()))
        );
    }

    #[test]
    fn a_failed_count_fails_safe() {
        let mut b = pdb(json!({"maxUnavailable": "10%"}));
        b.status = Some(calculate_status(&b, Ok((2, 1, 2)), BTreeMap::new()));
        let s = calculate_status(&b, Err("found no controllers".into()), BTreeMap::new());
        assert_eq!(s.disruptions_allowed, 0);
        assert_eq!(s.current_healthy, 2);
        let c = &s.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", SYNC_FAILED)
        );
    }
}
