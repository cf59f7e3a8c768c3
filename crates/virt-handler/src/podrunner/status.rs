//! Pure builders of the pod `status` the runner reports, in kubelet's shape.

use serde_json::{Value, json};

/// What the runner knows of a pod's main container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContainerState {
    Running {
        started_at: String,
        pid: i32,
    },
    Terminated {
        exit_code: i32,
        reason: String,
        started_at: String,
        finished_at: String,
    },
    /// The image names nothing this runner can run.
    Unrunnable {
        message: String,
    },
}

fn condition(type_: &str, status: bool, now: &str) -> Value {
    json!({"type": type_, "status": if status { "True" } else { "False" }, "lastTransitionTime": now})
}

/// The pod status for `state` of container `main` (other containers of the pod, like
/// `guest-console-log`, share its state: they are views of the same process).
///
/// `gates_ready` tells whether every readiness gate of the pod has its condition `True`: the
/// pod is `Ready` only when its containers are and its gates are, as kubelet computes it.
pub fn pod_status(
    containers: &[(String, String)],
    gates_ready: bool,
    state: &ContainerState,
    host_ip: &str,
    now: &str,
) -> Value {
    let (phase, ready, container_state, reason, message) = match state {
        ContainerState::Running { started_at, .. } => (
            "Running",
            true,
            json!({"running": {"startedAt": started_at}}),
            None,
            None,
        ),
        ContainerState::Terminated {
            exit_code,
            reason,
            started_at,
            finished_at,
        } => (
            if *exit_code == 0 {
                "Succeeded"
            } else {
                "Failed"
            },
            false,
            json!({"terminated": {"exitCode": exit_code, "reason": reason, "startedAt": started_at, "finishedAt": finished_at}}),
            None,
            None,
        ),
        ContainerState::Unrunnable { message } => (
            "Failed",
            false,
            json!({"waiting": {"reason": "ErrImagePull", "message": message}}),
            Some("UnsupportedImage"),
            Some(message.clone()),
        ),
    };
    let container_id = match state {
        ContainerState::Running { pid, .. } => Some(format!("kubevirt-rs://{pid}")),
        _ => None,
    };
    let statuses: Vec<Value> = containers
        .iter()
        .map(|(name, image)| {
            let mut s = json!({
                "name": name, "image": image, "imageID": image, "ready": ready,
                "started": ready, "restartCount": 0, "state": container_state.clone()
            });
            if let Some(id) = &container_id {
                s["containerID"] = json!(id);
            }
            s
        })
        .collect();
    let start_time = match state {
        ContainerState::Running { started_at, .. }
        | ContainerState::Terminated { started_at, .. } => {
            json!(started_at)
        }
        ContainerState::Unrunnable { .. } => json!(now),
    };
    let mut status = json!({
        "phase": phase,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": host_ip,
        "podIPs": [{"ip": host_ip}],
        "startTime": start_time,
        "qosClass": "Burstable",
        "conditions": [
            condition("PodReadyToStartContainers", true, now),
            condition("Initialized", true, now),
            condition("Ready", ready && gates_ready, now),
            condition("ContainersReady", ready, now),
            condition("PodScheduled", true, now),
        ],
        "containerStatuses": statuses,
    });
    if let Some(reason) = reason {
        status["reason"] = json!(reason);
    }
    if let Some(message) = message {
        status["message"] = json!(message);
    }
    status
}

/// Whether the reported status already says what `wanted` says (ignoring timestamps), so
/// the runner writes a pod status only when something changed.
pub fn same_report(current: Option<&Value>, wanted: &Value) -> bool {
    let Some(current) = current else { return false };
    let phase = |v: &Value| v.get("phase").cloned();
    let states = |v: &Value| {
        v.get("containerStatuses")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|c| {
                        let kind = c
                            .get("state")
                            .and_then(Value::as_object)
                            .and_then(|o| o.keys().next().cloned());
                        (c.get("name").cloned(), kind, c.get("containerID").cloned())
                    })
                    .collect::<Vec<_>>()
            })
    };
    let ready = |v: &Value| {
        v.get("conditions")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().find(|c| c["type"] == "Ready"))
            .map(|c| c["status"].clone())
    };
    phase(current) == phase(wanted)
        && states(current) == states(wanted)
        && ready(current) == ready(wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn containers() -> Vec<(String, String)> {
        vec![("compute".into(), "kubevirt-rs/virt-launcher:v0".into())]
    }

    #[test]
    fn a_running_container_makes_a_ready_running_pod() {
        let s = pod_status(
            &containers(),
            true,
            &ContainerState::Running {
                started_at: "t0".into(),
                pid: 42,
            },
            "127.0.0.1",
            "t1",
        );
        assert_eq!(s["phase"], "Running");
        assert_eq!(
            s["containerStatuses"][0]["state"]["running"]["startedAt"],
            "t0"
        );
        assert_eq!(s["containerStatuses"][0]["containerID"], "kubevirt-rs://42");
        let ready = s["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .find(|c| c["type"] == "Ready")
            .cloned();
        assert_eq!(ready.expect("ready")["status"], "True");
    }

    #[test]
    fn a_false_readiness_gate_makes_a_running_pod_unready() {
        let running = ContainerState::Running {
            started_at: "t0".into(),
            pid: 1,
        };
        let s = pod_status(&containers(), false, &running, "h", "t");
        let ready = s["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .find(|c| c["type"] == "Ready")
            .cloned();
        assert_eq!(ready.expect("ready")["status"], "False");
        let with_gates = pod_status(&containers(), true, &running, "h", "t");
        assert!(
            !same_report(Some(&s), &with_gates),
            "a Ready change must be reported"
        );
    }

    #[test]
    fn exit_codes_decide_succeeded_or_failed() {
        let done = |code| ContainerState::Terminated {
            exit_code: code,
            reason: "r".into(),
            started_at: "a".into(),
            finished_at: "b".into(),
        };
        assert_eq!(
            pod_status(&containers(), true, &done(0), "h", "t")["phase"],
            "Succeeded"
        );
        let failed = pod_status(&containers(), true, &done(2), "h", "t");
        assert_eq!(failed["phase"], "Failed");
        assert_eq!(
            failed["containerStatuses"][0]["state"]["terminated"]["exitCode"],
            2
        );
    }

    #[test]
    fn an_unrunnable_image_fails_the_pod_with_a_reason() {
        let s = pod_status(
            &containers(),
            true,
            &ContainerState::Unrunnable {
                message: "no".into(),
            },
            "h",
            "t",
        );
        assert_eq!(s["phase"], "Failed");
        assert_eq!(s["reason"], "UnsupportedImage");
        assert_eq!(
            s["containerStatuses"][0]["state"]["waiting"]["reason"],
            "ErrImagePull"
        );
    }

    #[test]
    fn reports_differing_only_in_timestamps_are_the_same() {
        let a = pod_status(
            &containers(),
            true,
            &ContainerState::Running {
                started_at: "t0".into(),
                pid: 1,
            },
            "h",
            "t1",
        );
        let b = pod_status(
            &containers(),
            true,
            &ContainerState::Running {
                started_at: "t0".into(),
                pid: 1,
            },
            "h",
            "t2",
        );
        assert!(same_report(Some(&a), &b));
        let c = pod_status(
            &containers(),
            true,
            &ContainerState::Running {
                started_at: "t0".into(),
                pid: 2,
            },
            "h",
            "t2",
        );
        assert!(!same_report(Some(&a), &c));
        assert!(!same_report(None, &a));
    }
}
