//! Pure builders of the pod `status` the runner reports, in kubelet's shape.

use serde_json::{Value, json};

/// What the runner knows of one container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContainerState {
    /// Not running yet, or cannot start (`ErrImagePull`, `ImagePullBackOff`,
    /// `ContainerCreating`, `CreateContainerConfigError`, `CrashLoopBackOff`).
    Waiting {
        reason: String,
        message: Option<String>,
    },
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
}

/// One container's report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerReport {
    pub name: String,
    pub image: String,
    pub state: ContainerState,
    pub restart_count: u32,
    /// Running and its startup probe (if any) succeeded.
    pub started: bool,
    /// Started and its readiness probe (if any) succeeds.
    pub ready: bool,
}

impl ContainerReport {
    /// A report whose `started` and `ready` follow the state alone (a container without
    /// probes).
    pub fn new(name: String, image: String, state: ContainerState, restart_count: u32) -> Self {
        let running = matches!(state, ContainerState::Running { .. });
        Self {
            name,
            image,
            state,
            restart_count,
            started: running,
            ready: running,
        }
    }

    fn running(&self) -> bool {
        matches!(self.state, ContainerState::Running { .. })
    }

    /// Running, and ready by its probes.
    pub fn is_ready(&self) -> bool {
        self.running() && self.ready
    }
}

fn condition(type_: &str, status: bool, now: &str) -> Value {
    json!({"type": type_, "status": if status { "True" } else { "False" }, "lastTransitionTime": now})
}

/// The pod phase kubelet computes from its containers and the restart policy.
pub fn pod_phase(containers: &[ContainerReport], restart_policy: &str) -> &'static str {
    let waiting = containers
        .iter()
        .filter(|c| matches!(c.state, ContainerState::Waiting { .. }))
        .count();
    let running = containers.iter().filter(|c| c.running()).count();
    let failed = containers
        .iter()
        .filter(
            |c| matches!(c.state, ContainerState::Terminated { exit_code, .. } if exit_code != 0),
        )
        .count();
    if containers.is_empty() || (waiting > 0 && running == 0 && failed == 0) {
        return "Pending";
    }
    if running > 0 || waiting > 0 {
        return "Running";
    }
    // Every container has terminated.
    match restart_policy {
        "Always" => "Running",
        "OnFailure" if failed > 0 => "Running",
        _ if failed > 0 => "Failed",
        _ => "Succeeded",
    }
}

/// The pod status for `containers` (without `qosClass`: the API server set it at creation,
/// and the strategic-merge report leaves it).
///
/// `gates_ready` tells whether every readiness gate of the pod has its condition `True`: the
/// pod is `Ready` only when its containers are and its gates are, as kubelet computes it.
pub fn pod_status(
    containers: &[ContainerReport],
    restart_policy: &str,
    gates_ready: bool,
    host_ip: &str,
    pod_ip: &str,
    start_time: &str,
    now: &str,
) -> Value {
    let phase = pod_phase(containers, restart_policy);
    let all_ready = !containers.is_empty() && containers.iter().all(ContainerReport::is_ready);
    let statuses: Vec<Value> = containers
        .iter()
        .map(|c| {
            let (state, id) = match &c.state {
                ContainerState::Waiting { reason, message } => {
                    let mut w = json!({"reason": reason});
                    if let Some(m) = message {
                        w["message"] = json!(m);
                    }
                    (json!({"waiting": w}), None)
                }
                ContainerState::Running { started_at, pid } => (
                    json!({"running": {"startedAt": started_at}}),
                    Some(format!("kubevirt-rs://{pid}")),
                ),
                ContainerState::Terminated {
                    exit_code,
                    reason,
                    started_at,
                    finished_at,
                } => (
                    json!({"terminated": {"exitCode": exit_code, "reason": reason, "startedAt": started_at, "finishedAt": finished_at}}),
                    None,
                ),
            };
            let mut s = json!({
                "name": c.name, "image": c.image, "imageID": c.image, "ready": c.is_ready(),
                "started": c.running() && c.started, "restartCount": c.restart_count, "state": state
            });
            if let Some(id) = id {
                s["containerID"] = json!(id);
            }
            s
        })
        .collect();
    let mut status = json!({
        "phase": phase,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": start_time,
        "conditions": [
            condition("PodReadyToStartContainers", !pod_ip.is_empty(), now),
            condition("Initialized", true, now),
            condition("Ready", all_ready && gates_ready, now),
            condition("ContainersReady", all_ready, now),
            condition("PodScheduled", true, now),
        ],
        "containerStatuses": statuses,
    });
    if !pod_ip.is_empty() {
        status["podIP"] = json!(pod_ip);
        status["podIPs"] = json!([{"ip": pod_ip}]);
    }
    status
}

/// Whether the reported status already says what `wanted` says (ignoring timestamps), so
/// the runner writes a pod status only when something changed.
pub fn same_report(current: Option<&Value>, wanted: &Value) -> bool {
    let Some(current) = current else { return false };
    let field = |v: &Value, k: &str| v.get(k).cloned();
    let states = |v: &Value| {
        v.get("containerStatuses")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|c| {
                        let state = c.get("state").and_then(Value::as_object);
                        let kind = state.and_then(|o| o.keys().next().cloned());
                        let reason = state
                            .and_then(|o| o.values().next())
                            .and_then(|s| s.get("reason"))
                            .cloned();
                        // A waiting container's message says what it waits for (a volume's
                        // claim not found, then not bound): a new one is news.
                        let waiting = state
                            .and_then(|o| o.get("waiting"))
                            .and_then(|s| s.get("message"))
                            .cloned();
                        (
                            c.get("name").cloned(),
                            kind,
                            (reason, waiting),
                            c.get("containerID").cloned(),
                            c.get("restartCount").cloned(),
                            c.get("ready").cloned(),
                            c.get("started").cloned(),
                        )
                    })
                    .collect::<Vec<_>>()
            })
    };
    let condition = |v: &Value, type_: &str| {
        v.get("conditions")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().find(|c| c["type"] == type_))
            .map(|c| c["status"].clone())
    };
    let ready = |v: &Value| (condition(v, "Ready"), condition(v, "ContainersReady"));
    field(current, "phase") == field(wanted, "phase")
        && field(current, "podIP") == field(wanted, "podIP")
        && states(current) == states(wanted)
        && ready(current) == ready(wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(name: &str, state: ContainerState) -> ContainerReport {
        ContainerReport::new(name.into(), "kubevirt-rs/virt-launcher:v0".into(), state, 0)
    }

    fn running(pid: i32) -> ContainerState {
        ContainerState::Running {
            started_at: "t0".into(),
            pid,
        }
    }

    fn done(code: i32) -> ContainerState {
        ContainerState::Terminated {
            exit_code: code,
            reason: "r".into(),
            started_at: "a".into(),
            finished_at: "b".into(),
        }
    }

    fn ready(s: &Value) -> Value {
        s["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .find(|c| c["type"] == "Ready")
            .expect("ready")["status"]
            .clone()
    }

    #[test]
    fn running_containers_make_a_ready_running_pod_with_its_ip() {
        let s = pod_status(
            &[report("compute", running(42)), report("log", running(43))],
            "Never",
            true,
            "127.0.0.1",
            "10.244.0.5",
            "t0",
            "t1",
        );
        assert_eq!(s["phase"], "Running");
        assert_eq!(s["podIP"], "10.244.0.5");
        assert_eq!(s["containerStatuses"][1]["containerID"], "kubevirt-rs://43");
        assert_eq!(ready(&s), "True");
    }

    #[test]
    fn a_false_readiness_gate_or_a_waiting_container_makes_the_pod_unready() {
        let all = [report("compute", running(1))];
        let gated = pod_status(&all, "Never", false, "h", "", "t", "t");
        assert_eq!(ready(&gated), "False");
        let open = pod_status(&all, "Never", true, "h", "", "t", "t");
        assert!(
            !same_report(Some(&gated), &open),
            "a Ready change must be reported"
        );
        let waiting = ContainerState::Waiting {
            reason: "ErrImagePull".into(),
            message: Some("no".into()),
        };
        let mixed = pod_status(
            &[report("compute", running(1)), report("log", waiting)],
            "Never",
            true,
            "h",
            "",
            "t",
            "t",
        );
        assert_eq!(mixed["phase"], "Running");
        assert_eq!(ready(&mixed), "False");
    }

    #[test]
    fn an_unready_running_container_makes_the_pod_unready_and_the_change_is_reported() {
        let mut probing = report("c", running(1));
        probing.ready = false;
        let unready = pod_status(&[probing.clone()], "Always", true, "h", "ip", "t", "t");
        assert_eq!(ready(&unready), "False");
        assert_eq!(unready["containerStatuses"][0]["ready"], false);
        assert_eq!(unready["containerStatuses"][0]["started"], true);
        probing.ready = true;
        let now_ready = pod_status(&[probing.clone()], "Always", true, "h", "ip", "t", "t");
        assert_eq!(ready(&now_ready), "True");
        assert!(!same_report(Some(&unready), &now_ready));
        probing.started = false;
        probing.ready = false;
        let starting = pod_status(&[probing], "Always", true, "h", "ip", "t", "t");
        assert_eq!(starting["containerStatuses"][0]["started"], false);
        assert!(!same_report(Some(&unready), &starting));
    }

    #[test]
    fn phases_follow_exit_codes_and_the_restart_policy() {
        let phase = |states: Vec<ContainerState>, policy| {
            let reports: Vec<_> = states.into_iter().map(|s| report("c", s)).collect();
            pod_phase(&reports, policy)
        };
        assert_eq!(phase(vec![done(0), done(0)], "Never"), "Succeeded");
        assert_eq!(phase(vec![done(0), done(2)], "Never"), "Failed");
        assert_eq!(phase(vec![done(2)], "OnFailure"), "Running");
        assert_eq!(phase(vec![done(0)], "OnFailure"), "Succeeded");
        assert_eq!(phase(vec![done(0)], "Always"), "Running");
        let image = ContainerState::Waiting {
            reason: "ErrImagePull".into(),
            message: None,
        };
        assert_eq!(phase(vec![image], "Never"), "Pending");
        assert_eq!(phase(vec![], "Never"), "Pending");
    }

    #[test]
    fn an_unknown_image_leaves_the_pod_pending_with_err_image_pull() {
        let s = pod_status(
            &[report(
                "compute",
                ContainerState::Waiting {
                    reason: "ErrImagePull".into(),
                    message: Some("Failed to pull image".into()),
                },
            )],
            "Never",
            true,
            "h",
            "",
            "t",
            "t",
        );
        assert_eq!(s["phase"], "Pending");
        assert_eq!(
            s["containerStatuses"][0]["state"]["waiting"]["reason"],
            "ErrImagePull"
        );
        let backoff = pod_status(
            &[report(
                "compute",
                ContainerState::Waiting {
                    reason: "ImagePullBackOff".into(),
                    message: None,
                },
            )],
            "Never",
            true,
            "h",
            "",
            "t",
            "t",
        );
        assert!(
            !same_report(Some(&s), &backoff),
            "a new waiting reason is reported"
        );
    }

    #[test]
    fn reports_differing_only_in_timestamps_are_the_same() {
        let a = pod_status(
            &[report("c", running(1))],
            "Never",
            true,
            "h",
            "ip",
            "t0",
            "t1",
        );
        let b = pod_status(
            &[report("c", running(1))],
            "Never",
            true,
            "h",
            "ip",
            "t0",
            "t2",
        );
        assert!(same_report(Some(&a), &b));
        let c = pod_status(
            &[report("c", running(2))],
            "Never",
            true,
            "h",
            "ip",
            "t0",
            "t2",
        );
        assert!(!same_report(Some(&a), &c));
        assert!(!same_report(None, &a));
    }

    #[test]
    fn a_new_waiting_message_is_reported() {
        let waiting = |message: &str| {
            pod_status(
                &[report(
                    "c",
                    ContainerState::Waiting {
                        reason: "ContainerCreating".into(),
                        message: Some(message.into()),
                    },
                )],
                "Never",
                true,
                "h",
                "",
                "t",
                "t",
            )
        };
        let missing = waiting("claim not found");
        assert!(same_report(Some(&missing), &waiting("claim not found")));
        assert!(!same_report(Some(&missing), &waiting("PVC is not bound")));
    }
}
