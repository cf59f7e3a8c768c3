//! CDI's DataVolume status from what the controller observed: the claim, the importer pod and
//! what the importer last said (its log's last line).
//!
//! | observed | phase | `Running` |
//! |---|---|---|
//! | no claim yet, or no importer pod | `Pending` | False `Pending` |
//! | importer pod `Pending` | `ImportScheduled` | False `Pending` |
//! | importer pod `Running` | `ImportInProgress` | True `Pod is running` |
//! | importer pod `Succeeded` (or `Succeeded` before) | `Succeeded` | False `Completed` |
//! | importer pod `Failed`, or the source cannot be imported | `Failed` | False `Error`, the importer's message |
//!
//! `Bound` follows the claim's phase; `Ready` is True only when `Succeeded`. `progress` is
//! `N/A` until the importer reports a percentage, `100.0%` when done. A condition keeps its
//! transition time while its status stays.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kubevirt_api::cdi::{
    DataVolume, DataVolumeCondition, DataVolumePhase as Phase, DataVolumeStatus,
};

/// What the controller saw of one DataVolume's import.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// The claim of the DataVolume's name.
    pub pvc: Option<&'a PersistentVolumeClaim>,
    /// The importer pod.
    pub pod: Option<&'a Pod>,
    /// Why the import cannot run or failed (the importer's last log line, or a spec error).
    pub failure: Option<&'a str>,
    /// The importer's last reported progress (`45.00%`).
    pub progress: Option<&'a str>,
    /// The time of this observation.
    pub now: &'a Time,
}

fn pod_phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

/// The phase, `Running` condition (status, reason, message) and progress.
fn phase_of(
    dv: &DataVolume,
    obs: &Observed<'_>,
) -> (Phase, (&'static str, &'static str, String), String) {
    let done = || ("False", "Completed", "Import Complete".to_owned());
    if dv.phase() == Phase::Succeeded {
        return (Phase::Succeeded, done(), "100.0%".into());
    }
    if let Some(message) = obs.failure {
        return (
            Phase::Failed,
            ("False", "Error", message.to_owned()),
            "N/A".into(),
        );
    }
    let progress = obs.progress.unwrap_or("N/A").to_owned();
    match (obs.pvc, obs.pod.map(pod_phase)) {
        (Some(_), Some("Succeeded")) => (Phase::Succeeded, done(), "100.0%".into()),
        (Some(_), Some("Failed")) => (
            Phase::Failed,
            ("False", "Error", "Import failed".into()),
            progress,
        ),
        (Some(_), Some("Running")) => (
            Phase::ImportInProgress,
            ("True", "Pod is running", String::new()),
            progress,
        ),
        (Some(_), Some(_)) => (
            Phase::ImportScheduled,
            ("False", "Pending", "Import pod is pending".into()),
            progress,
        ),
        _ => (
            Phase::Pending,
            ("False", "Pending", String::new()),
            progress,
        ),
    }
}

/// Sets `type_` in `conditions`, keeping the old transition time when the status is unchanged.
fn put(
    conditions: &mut Vec<DataVolumeCondition>,
    type_: &str,
    (status, reason, message): (&str, &str, String),
    now: &Time,
) {
    let old = conditions.iter().position(|c| c.type_ == type_);
    let transition = old
        .map(|i| &conditions[i])
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    let new = DataVolumeCondition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        last_transition_time: Some(transition),
        last_heart_beat_time: Some(now.clone()),
        reason: Some(reason.to_owned()).filter(|r| !r.is_empty()),
        message: Some(message).filter(|m| !m.is_empty()),
    };
    match old {
        // An unchanged condition keeps its heartbeat too: no write for nothing.
        Some(i)
            if conditions[i].status == new.status
                && conditions[i].reason == new.reason
                && conditions[i].message == new.message => {}
        Some(i) => conditions[i] = new,
        None => conditions.push(new),
    }
}

/// The status `dv` should have after `obs`.
pub fn desired_status(dv: &DataVolume, obs: &Observed<'_>) -> DataVolumeStatus {
    let mut status = dv.status.clone().unwrap_or_default();
    // A failed import is final (its importer is never restarted): keep what it said.
    if dv.phase() == Phase::Failed {
        return status;
    }
    let (phase, running, progress) = phase_of(dv, obs);
    let name = dv.metadata.name.clone().unwrap_or_default();
    let claim_phase = obs
        .pvc
        .and_then(|p| p.status.as_ref())
        .and_then(|s| s.phase.as_deref());
    let bound = match claim_phase {
        Some("Bound") => ("True", "Bound", format!("PVC {name} Bound")),
        Some(other) if obs.pvc.is_some() => ("False", "Pending", format!("PVC {name} {other}")),
        _ if obs.pvc.is_some() => ("False", "Pending", format!("PVC {name} Pending")),
        _ => ("Unknown", "NotFound", format!("PVC {name} not found")),
    };
    let ready = if phase == Phase::Succeeded {
        ("True", "", String::new())
    } else {
        ("False", "", String::new())
    };
    put(&mut status.conditions, "Bound", bound, obs.now);
    put(&mut status.conditions, "Ready", ready, obs.now);
    put(&mut status.conditions, "Running", running, obs.now);
    status.phase = Some(phase);
    status.progress = Some(progress);
    status.claim_name = obs.pvc.map(|_| name);
    status
}

/// The importer's progress from one of its log lines (`Progress: 45.00%`).
pub fn progress_of(line: &str) -> Option<&str> {
    let value = line.trim().strip_prefix("Progress: ")?;
    value.ends_with('%').then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dv(status: &serde_json::Value) -> DataVolume {
        serde_json::from_value(json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": "root", "namespace": "ns"}, "spec": {}, "status": status
        }))
        .unwrap()
    }

    fn pvc(phase: &str) -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": "root"}, "status": {"phase": phase}}))
            .unwrap()
    }

    fn pod(phase: &str) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "importer-root"}, "status": {"phase": phase}}),
        )
        .unwrap()
    }

    fn now() -> Time {
        Time("2026-01-01T00:00:00Z".parse().unwrap())
    }

    fn observe(
        pvc: Option<&PersistentVolumeClaim>,
        pod: Option<&Pod>,
        failure: Option<&str>,
    ) -> DataVolumeStatus {
        let now = now();
        desired_status(
            &dv(&json!({})),
            &Observed {
                pvc,
                pod,
                failure,
                progress: None,
                now: &now,
            },
        )
    }

    fn cond<'a>(s: &'a DataVolumeStatus, t: &str) -> (&'a str, Option<&'a str>) {
        let c = s.conditions.iter().find(|c| c.type_ == t).unwrap();
        (c.status.as_str(), c.reason.as_deref())
    }

    #[test]
    fn phases_follow_the_claim_and_the_importer_pod_as_cdi() {
        let s = observe(None, None, None);
        assert_eq!(s.phase, Some(Phase::Pending));
        assert_eq!(s.progress.as_deref(), Some("N/A"));
        assert_eq!(s.claim_name, None);
        let pending = pvc("Pending");
        let s = observe(Some(&pending), Some(&pod("Pending")), None);
        assert_eq!(s.phase, Some(Phase::ImportScheduled));
        assert_eq!(cond(&s, "Bound"), ("False", Some("Pending")));
        let bound = pvc("Bound");
        let s = observe(Some(&bound), Some(&pod("Running")), None);
        assert_eq!(s.phase, Some(Phase::ImportInProgress));
        assert_eq!(cond(&s, "Running"), ("True", Some("Pod is running")));
        assert_eq!(cond(&s, "Bound"), ("True", Some("Bound")));
        assert_eq!(s.claim_name.as_deref(), Some("root"));
        let s = observe(Some(&bound), Some(&pod("Succeeded")), None);
        assert_eq!(s.phase, Some(Phase::Succeeded));
        assert_eq!(s.progress.as_deref(), Some("100.0%"));
        assert_eq!(cond(&s, "Ready"), ("True", None));
        assert_eq!(cond(&s, "Running"), ("False", Some("Completed")));
        let s = observe(Some(&bound), Some(&pod("Failed")), Some("manifest unknown"));
        assert_eq!(s.phase, Some(Phase::Failed));
        let running = s.conditions.iter().find(|c| c.type_ == "Running").unwrap();
        assert_eq!(running.reason.as_deref(), Some("Error"));
        assert_eq!(running.message.as_deref(), Some("manifest unknown"));
        assert_eq!(cond(&s, "Ready"), ("False", None));
    }

    #[test]
    fn a_failed_data_volume_keeps_its_message() {
        let now = now();
        let failed = dv(&json!({"phase": "Failed", "conditions": [
            {"type": "Running", "status": "False", "reason": "Error", "message": "manifest unknown"}]}));
        let bound = pvc("Bound");
        let failed_pod = pod("Failed");
        let s = desired_status(
            &failed,
            &Observed {
                pvc: Some(&bound),
                pod: Some(&failed_pod),
                failure: None,
                progress: None,
                now: &now,
            },
        );
        assert_eq!(Some(&s), failed.status.as_ref());
    }

    #[test]
    fn a_succeeded_data_volume_stays_succeeded_after_its_importer_is_gone() {
        let now = now();
        let done = dv(&json!({"phase": "Succeeded"}));
        let bound = pvc("Bound");
        let s = desired_status(
            &done,
            &Observed {
                pvc: Some(&bound),
                pod: None,
                failure: None,
                progress: None,
                now: &now,
            },
        );
        assert_eq!(s.phase, Some(Phase::Succeeded));
    }

    #[test]
    fn an_unchanged_condition_keeps_its_times() {
        let first = observe(None, None, None);
        let later = Time("2026-01-01T00:01:00Z".parse().unwrap());
        let again = desired_status(
            &dv(&serde_json::to_value(&first).unwrap()),
            &Observed {
                pvc: None,
                pod: None,
                failure: None,
                progress: None,
                now: &later,
            },
        );
        assert_eq!(first, again);
        assert_eq!(progress_of("Progress: 45.00%"), Some("45.00%"));
        assert_eq!(progress_of("pulling"), None);
    }
}
