//! A Deployment's status from its ReplicaSets, and its conditions: `Available`
//! (`MinimumReplicasAvailable` / `MinimumReplicasUnavailable`) and `Progressing`
//! (`NewReplicaSetCreated`, `FoundNewReplicaSet`, `ReplicaSetUpdated`,
//! `NewReplicaSetAvailable`, `ProgressDeadlineExceeded`, `DeploymentPaused`,
//! `DeploymentResumed`), with kube's messages.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet};
use kube::ResourceExt;

use super::util::{self, max_unavailable, replicas, rs_replicas};
use crate::replicaset::nonzero;

/// kube's default `progressDeadlineSeconds`.
pub const DEFAULT_PROGRESS_DEADLINE_SECONDS: i32 = 600;
/// The `Progressing` reason of a rollout past its deadline.
pub const TIMED_OUT: &str = "ProgressDeadlineExceeded";
/// The `Progressing` reason of a finished rollout.
pub const NEW_RS_AVAILABLE: &str = "NewReplicaSetAvailable";

/// A condition stamped now.
pub fn condition(type_: &str, status: &str, reason: &str, message: String) -> DeploymentCondition {
    let now = crate::now_time();
    DeploymentCondition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message),
        last_update_time: Some(now.clone()),
        last_transition_time: Some(now),
    }
}

/// Sets a condition as kube's `SetDeploymentCondition`: nothing changes when status and
/// reason are the same; the transition time is kept when only the reason changes.
pub fn set_condition(status: &mut DeploymentStatus, mut new: DeploymentCondition) {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    if let Some(current) = conditions.iter().find(|c| c.type_ == new.type_) {
        if current.status == new.status && current.reason == new.reason {
            return;
        }
        if current.status == new.status {
            new.last_transition_time = current.last_transition_time.clone();
        }
    }
    conditions.retain(|c| c.type_ != new.type_);
    conditions.push(new);
}

fn remove_condition(status: &mut DeploymentStatus, type_: &str) {
    if let Some(conditions) = status.conditions.as_mut() {
        conditions.retain(|c| c.type_ != type_);
        if conditions.is_empty() {
            status.conditions = None;
        }
    }
}

/// The `Progressing` condition, if any.
pub fn progressing(status: &DeploymentStatus) -> Option<&DeploymentCondition> {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Progressing")
}

fn deadline(d: &Deployment) -> Option<i32> {
    let seconds = d
        .spec
        .as_ref()
        .and_then(|s| s.progress_deadline_seconds)
        .unwrap_or(DEFAULT_PROGRESS_DEADLINE_SECONDS);
    (seconds != i32::MAX).then_some(seconds)
}

/// Whether the Deployment has a progress deadline (kube: set and not `MaxInt32`).
pub fn has_progress_deadline(d: &Deployment) -> bool {
    deadline(d).is_some()
}

/// The new ReplicaSet runs exactly the wanted, available replicas (kube's `IsSaturated`).
pub fn is_saturated(d: &Deployment, rs: &ReplicaSet) -> bool {
    let want = replicas(d);
    rs_replicas(rs) == want
        && util::desired_replicas_annotation(rs) == Some(want)
        && rs
            .status
            .as_ref()
            .and_then(|s| s.available_replicas)
            .unwrap_or(0)
            == want
}

/// Every replica updated and available, nothing old left (kube's `DeploymentComplete`).
pub fn complete(d: &Deployment, status: &DeploymentStatus) -> bool {
    let want = replicas(d);
    status.updated_replicas.unwrap_or(0) == want
        && status.replicas.unwrap_or(0) == want
        && status.available_replicas.unwrap_or(0) == want
        && status.observed_generation >= d.metadata.generation
}

/// The status the ReplicaSets give, with `Available` set; other conditions and the
/// collision count are taken from `working` (kube's `calculateStatus`).
pub fn calculate(
    d: &Deployment,
    rss: &[ReplicaSet],
    new: Option<&ReplicaSet>,
    working: &DeploymentStatus,
) -> DeploymentStatus {
    let status_of = |rs: &ReplicaSet| rs.status.clone().unwrap_or_default();
    let available: i32 = rss
        .iter()
        .map(|rs| status_of(rs).available_replicas.unwrap_or(0))
        .sum();
    let total: i32 = rss.iter().map(rs_replicas).sum();
    let actual: i32 = rss.iter().map(|rs| status_of(rs).replicas).sum();
    let ready: i32 = rss
        .iter()
        .map(|rs| status_of(rs).ready_replicas.unwrap_or(0))
        .sum();
    let updated = new.map_or(0, |rs| status_of(rs).replicas);
    let count = |n: i32| nonzero(usize::try_from(n.max(0)).unwrap_or(0));
    let mut status = DeploymentStatus {
        observed_generation: d.metadata.generation,
        replicas: count(actual),
        updated_replicas: count(updated),
        ready_replicas: count(ready),
        available_replicas: count(available),
        unavailable_replicas: count(total - available),
        collision_count: working.collision_count,
        conditions: working.conditions.clone(),
        terminating_replicas: None,
    };
    let condition = if available >= replicas(d) - max_unavailable(d) {
        self::condition(
            "Available",
            "True",
            "MinimumReplicasAvailable",
            "Deployment has minimum availability.".into(),
        )
    } else {
        self::condition(
            "Available",
            "False",
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.".into(),
        )
    };
    set_condition(&mut status, condition);
    status
}

/// Whether the rollout moved since the last status (kube's `DeploymentProgressing`).
fn made_progress(old: &DeploymentStatus, new: &DeploymentStatus) -> bool {
    let n = |v: Option<i32>| v.unwrap_or(0);
    let old_old = n(old.replicas) - n(old.updated_replicas);
    let new_old = n(new.replicas) - n(new.updated_replicas);
    n(new.updated_replicas) > n(old.updated_replicas)
        || n(new.ready_replicas) > n(old.ready_replicas)
        || new_old < old_old
        || n(new.available_replicas) > n(old.available_replicas)
}

/// When the `Progressing` condition last moved plus the deadline, if that is in the future;
/// `Err(())` if it is past.
fn time_left(d: &Deployment, status: &DeploymentStatus) -> Option<Result<Duration, ()>> {
    let seconds = deadline(d)?;
    let condition = progressing(status)?;
    match condition.reason.as_deref() {
        Some(NEW_RS_AVAILABLE) => return None,
        Some(TIMED_OUT) => return Some(Err(())),
        _ => {}
    }
    let from = condition.last_update_time.as_ref()?.0;
    let at = from + jiff::SignedDuration::from_secs(i64::from(seconds));
    let left = at.duration_since(crate::now());
    Some(Duration::try_from(left).map_err(drop))
}

/// The status after a rollout step and when to look again for the deadline (kube's
/// `syncRolloutStatus` and `requeueStuckDeployment`).
pub fn rollout(
    d: &Deployment,
    rss: &[ReplicaSet],
    new: Option<&ReplicaSet>,
    working: &DeploymentStatus,
) -> (DeploymentStatus, Option<Duration>) {
    let mut status = calculate(d, rss, new, working);
    if !has_progress_deadline(d) {
        remove_condition(&mut status, "Progressing");
        return (status, None);
    }
    let current = progressing(&status).cloned();
    let done = status.replicas == status.updated_replicas
        && current
            .as_ref()
            .is_some_and(|c| c.reason.as_deref() == Some(NEW_RS_AVAILABLE));
    if !done {
        let name = new.map(ResourceExt::name_any).unwrap_or_default();
        let previous = d.status.clone().unwrap_or_default();
        if complete(d, &status) {
            let message = format!("ReplicaSet \"{name}\" has successfully progressed.");
            set_condition(
                &mut status,
                condition("Progressing", "True", NEW_RS_AVAILABLE, message),
            );
        } else if made_progress(&previous, &status) {
            let message = if new.is_some() {
                format!("ReplicaSet \"{name}\" is progressing.")
            } else {
                String::new()
            };
            let mut updated = condition("Progressing", "True", "ReplicaSetUpdated", message);
            if let Some(c) = current.as_ref().filter(|c| c.status == "True") {
                updated.last_transition_time = c.last_transition_time.clone();
            }
            remove_condition(&mut status, "Progressing");
            set_condition(&mut status, updated);
        } else if matches!(time_left(d, &status), Some(Err(()))) {
            let message = format!("ReplicaSet \"{name}\" has timed out progressing.");
            set_condition(
                &mut status,
                condition("Progressing", "False", TIMED_OUT, message),
            );
        }
    }
    let requeue = if complete(d, &status) {
        None
    } else {
        match time_left(d, &status) {
            Some(Ok(left)) => Some(left + Duration::from_secs(1)),
            _ => None,
        }
    };
    (status, requeue)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(replicas: i32) -> Deployment {
        serde_json::from_value(json!({"metadata": {"name": "d", "generation": 2},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "a"}},
                "template": {"spec": {"containers": []}}}}))
        .expect("deployment")
    }

    fn rs(name: &str, replicas: i32, available: i32) -> ReplicaSet {
        serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "a"}}},
            "status": {"replicas": replicas, "readyReplicas": available, "availableReplicas": available}}))
        .expect("rs")
    }

    fn reason<'a>(status: &'a DeploymentStatus, type_: &str) -> Option<&'a str> {
        status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == type_)
            .and_then(|c| c.reason.as_deref())
    }

    #[test]
    fn a_finished_rollout_is_available_and_has_progressed() {
        let d = deployment(2);
        let new = rs("d-new", 2, 2);
        let (status, requeue) = rollout(
            &d,
            std::slice::from_ref(&new),
            Some(&new),
            &DeploymentStatus::default(),
        );
        assert_eq!(status.observed_generation, Some(2));
        assert_eq!(status.updated_replicas, Some(2));
        assert_eq!(status.unavailable_replicas, None);
        assert_eq!(
            reason(&status, "Available"),
            Some("MinimumReplicasAvailable")
        );
        assert_eq!(reason(&status, "Progressing"), Some(NEW_RS_AVAILABLE));
        assert_eq!(requeue, None);
    }

    #[test]
    fn a_rollout_in_progress_is_updated_and_requeued_for_its_deadline() {
        let d = deployment(2);
        let old = rs("d-old", 1, 1);
        let new = rs("d-new", 2, 0);
        let (status, requeue) = rollout(
            &d,
            &[old, new.clone()],
            Some(&new),
            &DeploymentStatus::default(),
        );
        assert_eq!(status.replicas, Some(3));
        assert_eq!(status.unavailable_replicas, Some(2));
        assert_eq!(
            reason(&status, "Available"),
            Some("MinimumReplicasUnavailable"),
            "25% of 2 rounds down: no replica may be unavailable"
        );
        assert_eq!(reason(&status, "Progressing"), Some("ReplicaSetUpdated"));
        assert!(requeue.is_some());
    }

    #[test]
    fn too_few_available_replicas_make_the_deployment_unavailable() {
        let d = deployment(4);
        let new = rs("d-new", 4, 1);
        let status = calculate(
            &d,
            std::slice::from_ref(&new),
            Some(&new),
            &DeploymentStatus::default(),
        );
        assert_eq!(
            reason(&status, "Available"),
            Some("MinimumReplicasUnavailable")
        );
    }
}
