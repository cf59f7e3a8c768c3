//! The node controller: notices nodes whose virt-handler stopped beating and fails the VMIs
//! left on them, so that their VMs can start again elsewhere (upstream's
//! `pkg/virt-controller/watch/node`).
//!
//! Data flow: informers on Nodes and VMIs feed the queue `virt-controller-node`, keyed by node
//! name (a VMI by its `status.nodeName`). A reconcile reads the Node from the cache; a Node
//! that is gone, or whose `kubevirt.io/heartbeat` annotation is older than the heartbeat
//! timeout ([`is_unresponsive`]), is unresponsive. Then, as upstream:
//! 1. while the Node's `kubevirt.io/schedulable` label is `"true"`: a Normal event
//!    `NodeUnresponsive` on the Node and a strategic-merge patch of the label to `"false"`
//!    (virt-handler sets it back with its next heartbeat);
//! 2. the VMIs labelled `kubevirt.io/nodeName` with the node in phase `Running` or `Scheduled`
//!    are listed from the API; if the Node exists, runs no `kubevirt.io=virt-handler` pod and
//!    the handler DaemonSet is fully scheduled or ready, a Warning event says the VMIs are
//!    orphaned;
//! 3. each of those VMIs without an alive launcher pod on the node ([`alive_launcher_pods`]:
//!    controlled by a VMI, not `Failed`/`Succeeded`, not every container terminated) gets a
//!    Normal event and the JSON Patch `replace /status/phase Failed`, `add /status/reason
//!    NodeUnresponsive`, one after the other. VMIs whose pod still lives are left alone.
//!
//! An existing Node is looked at again after the recheck interval (upstream's minute, or the
//! heartbeat timeout when that is shorter), whatever happened.
//!
//! # Caveats
//! - The heartbeat timeout is upstream's 5 minutes unless `--node-heartbeat-timeout` sets
//!   another (upstream has no setting; tests need a shorter one). virt-handler beats every
//!   1–2.2 minutes by default, so a timeout below its interval marks healthy nodes too.
//! - A node without the annotation is never unresponsive; a malformed one is logged and not
//!   looked at again until the Node changes (both as upstream).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use kubevirt_api::constants as c;
use kubevirt_api::v1::{VirtualMachineInstance, VirtualMachineInstancePhase as Phase};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info};

use crate::runtime::controller::{Action, Controller, ControllerError, Reconciler};
use crate::runtime::events::{EventRecorder, EventType};
use crate::runtime::informer::{Informer, InformerHandle};
use crate::runtime::json_patch;
use crate::runtime::metrics::Metrics;
use crate::runtime::queue::{RateLimiterConfig, WorkQueue};

/// Name of the node controller's queue (as upstream).
pub const QUEUE_NAME: &str = "virt-controller-node";
/// The component its events are recorded as (as upstream).
pub const EVENT_COMPONENT: &str = "node-controller";
/// Upstream's heartbeat timeout.
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// Upstream's recheck interval for existing nodes.
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(60);
/// The reason of the node controller's events and of the VMIs it fails (as upstream).
pub const NODE_UNRESPONSIVE_REASON: &str = "NodeUnresponsive";
/// The event on a Node marked unschedulable.
pub const NODE_UNRESPONSIVE_MESSAGE: &str =
    "virt-handler is not responsive, marking node as unresponsive";
/// The event on a Node whose VMIs have no handler.
pub const ORPHANED_VMIS_MESSAGE: &str = "virt-handler is not present, there are orphaned vmis on this node. Run virt-handler on this node to migrate or remove them.";

/// The event on a VMI the controller fails.
pub fn vmi_failed_message(node: &str) -> String {
    format!("virt-handler on node {node} is not responsive, marking VMI as failed")
}

/// Configuration of [`run_node_controller`].
#[derive(Clone, Copy, Debug)]
pub struct NodeControllerConfig {
    /// How old a heartbeat may be before the node counts as unresponsive.
    pub heartbeat_timeout: Duration,
    /// Concurrent workers (upstream `--node-controller-threads`, default 3).
    pub workers: usize,
}

impl Default for NodeControllerConfig {
    fn default() -> Self {
        Self {
            heartbeat_timeout: DEFAULT_HEARTBEAT_TIMEOUT,
            workers: 3,
        }
    }
}

/// A heartbeat annotation that is not an RFC 3339 time.
#[derive(Debug, thiserror::Error)]
#[error("heartbeat annotation {value:?} is not a timestamp")]
pub struct MalformedHeartbeat {
    /// The annotation's value.
    pub value: String,
}

/// Upstream's `isNodeUnresponsive`: a missing Node is unresponsive; a Node whose heartbeat is
/// older than `timeout` at `now` is; one without the annotation is not.
///
/// # Errors
/// [`MalformedHeartbeat`] when the annotation is not a timestamp.
pub fn is_unresponsive(
    node: Option<&Node>,
    timeout: Duration,
    now: Timestamp,
) -> Result<bool, MalformedHeartbeat> {
    let Some(node) = node else {
        return Ok(true);
    };
    let Some(value) = node.annotations().get(c::HEARTBEAT_ANNOTATION) else {
        return Ok(false);
    };
    let beat: Timestamp = value.trim().parse().map_err(|_| MalformedHeartbeat {
        value: value.clone(),
    })?;
    let age = now.duration_since(beat);
    Ok(age.is_positive() && age.unsigned_abs() > timeout)
}

/// Whether the Node's `kubevirt.io/schedulable` label is `"true"`.
pub fn is_schedulable(node: Option<&Node>) -> bool {
    node.is_some_and(|n| {
        n.labels()
            .get(c::NODE_SCHEDULABLE_LABEL)
            .is_some_and(|v| v == "true")
    })
}

/// The UID of the VMI controlling `pod`, if a VMI does.
fn controlling_vmi_uid(pod: &Pod) -> Option<&str> {
    pod.owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "VirtualMachineInstance")
        .map(|o| o.uid.as_str())
}

/// Upstream's `alivePodsOnNode` filter: pods controlled by a VMI whose phase is neither
/// `Failed` nor `Succeeded` and of which not every container has terminated.
pub fn alive_launcher_pods(pods: &[Pod]) -> Vec<&Pod> {
    pods.iter()
        .filter(|pod| controlling_vmi_uid(pod).is_some())
        .filter(|pod| {
            let status = pod.status.as_ref();
            let statuses = status
                .and_then(|s| s.container_statuses.as_deref())
                .unwrap_or_default();
            let all_terminated = !statuses.is_empty()
                && statuses
                    .iter()
                    .all(|cs| cs.state.as_ref().is_some_and(|s| s.terminated.is_some()));
            let phase = status.and_then(|s| s.phase.as_deref());
            !all_terminated && !matches!(phase, Some("Failed" | "Succeeded"))
        })
        .collect()
}

/// The VMIs among `vmis` that no pod of `alive` is controlled by (matched by namespace and
/// UID, as upstream's `filterStuckVirtualMachinesWithoutPods`).
pub fn vmis_without_pods<'a>(
    vmis: &'a [VirtualMachineInstance],
    alive: &[&Pod],
) -> Vec<&'a VirtualMachineInstance> {
    vmis.iter()
        .filter(|vmi| {
            !alive.iter().any(|pod| {
                pod.metadata.namespace == vmi.metadata.namespace
                    && controlling_vmi_uid(pod) == vmi.metadata.uid.as_deref()
            })
        })
        .collect()
}

/// Upstream's `ActiveVirtualMachinesOnNode` filter: phase `Running` or `Scheduled`.
pub fn is_active(vmi: &VirtualMachineInstance) -> bool {
    matches!(
        vmi.status.as_ref().and_then(|s| s.phase.as_ref()),
        Some(Phase::Running | Phase::Scheduled)
    )
}

/// Upstream's `checkDaemonSetStatus`: whether the one virt-handler DaemonSet has every
/// desired pod scheduled or ready (so a node without a handler pod will not get one soon).
///
/// # Errors
/// When there is not exactly one DaemonSet.
pub fn handler_daemonset_settled(sets: &[DaemonSet]) -> Result<bool, NodeError> {
    let [ds] = sets else {
        return Err(NodeError::HandlerDaemonSets(sets.len()));
    };
    let status = ds.status.clone().unwrap_or_default();
    let desired = status.desired_number_scheduled;
    Ok(desired == status.current_number_scheduled || desired == status.number_ready)
}

/// The JSON Patch that fails a VMI on an unresponsive node (upstream's exact operations).
pub fn failed_vmi_patch() -> serde_json::Value {
    json!([
        {"op": "replace", "path": "/status/phase", "value": "Failed"},
        {"op": "add", "path": "/status/reason", "value": NODE_UNRESPONSIVE_REASON},
    ])
}

/// Why one reconcile of a node failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Patching the schedulable label failed.
    #[error("failed to mark node {0} as unschedulable")]
    MarkUnschedulable(String, #[source] kube::Error),
    /// Listing the node's VMIs failed.
    #[error("failed fetching vmis for node {0}")]
    ListVmis(String, #[source] kube::Error),
    /// Listing the node's pods or the handler DaemonSet failed.
    #[error("failed fetching pods for node {0}")]
    ListPods(String, #[source] kube::Error),
    /// Listing the handler DaemonSets failed.
    #[error("listing the virt-handler DaemonSet")]
    ListDaemonSets(#[source] kube::Error),
    /// Not exactly one virt-handler DaemonSet exists.
    #[error("should only be running one virt-handler DaemonSet, found {0}")]
    HandlerDaemonSets(usize),
    /// Failing some VMIs failed.
    #[error("{}", .0.join("; "))]
    FailVmis(Vec<String>),
}

impl ControllerError for NodeError {
    fn reason(&self) -> &str {
        match self {
            NodeError::MarkUnschedulable(..) => "FailedMarkUnschedulable",
            NodeError::ListVmis(..) | NodeError::ListPods(..) | NodeError::ListDaemonSets(_) => {
                "FailedList"
            }
            NodeError::HandlerDaemonSets(_) => "HandlerDaemonSets",
            NodeError::FailVmis(_) => "FailedPatchVMI",
        }
    }
}

/// Everything a reconcile needs; shared by the workers.
pub struct NodeReconciler {
    client: Client,
    nodes: InformerHandle<Node>,
    recorder: Arc<EventRecorder>,
    heartbeat_timeout: Duration,
}

impl NodeReconciler {
    fn recheck(&self, node: Option<&Node>) -> Action {
        match node {
            Some(_) => Action::RequeueAfter(RECHECK_INTERVAL.min(self.heartbeat_timeout)),
            None => Action::Done,
        }
    }

    async fn reconcile_node(&self, name: &str) -> Result<Action, NodeError> {
        let node = self.nodes.get(None, name);
        let node = node.as_deref();
        match is_unresponsive(node, self.heartbeat_timeout, Timestamp::now()) {
            Ok(false) => return Ok(self.recheck(node)),
            Ok(true) => {}
            Err(e) => {
                error!(node = name, error = %e, "failed to determine if node is responsive, will not reenqueue");
                return Ok(Action::Done);
            }
        }
        if let Some(node) = node.filter(|n| is_schedulable(Some(n))) {
            self.mark_unschedulable(node).await?;
        }
        let vmis = self.active_vmis(name).await?;
        if !vmis.is_empty() {
            if let Some(node) = node {
                self.event_if_orphaned(node).await?;
            }
            self.fail_vmis_without_pods(name, &vmis).await?;
        }
        Ok(self.recheck(node))
    }

    async fn mark_unschedulable(&self, node: &Node) -> Result<(), NodeError> {
        let name = node.name_any();
        self.recorder
            .record(
                node,
                EventType::Normal,
                NODE_UNRESPONSIVE_REASON,
                NODE_UNRESPONSIVE_MESSAGE,
            )
            .await;
        info!(node = %name, "marking node as unresponsive");
        let body = json!({"metadata": {"labels": {c::NODE_SCHEDULABLE_LABEL: "false"}}});
        Api::<Node>::all(self.client.clone())
            .patch(&name, &PatchParams::default(), &Patch::Strategic(body))
            .await
            .map_err(|e| NodeError::MarkUnschedulable(name.clone(), e))?;
        Ok(())
    }

    async fn active_vmis(&self, node: &str) -> Result<Vec<VirtualMachineInstance>, NodeError> {
        let selector = format!("{} in ({node})", c::NODE_NAME_LABEL);
        let list = Api::<VirtualMachineInstance>::all(self.client.clone())
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| NodeError::ListVmis(node.to_owned(), e))?;
        Ok(list.items.into_iter().filter(is_active).collect())
    }

    async fn pods_on_node(&self, node: &str, labels: Option<&str>) -> Result<Vec<Pod>, NodeError> {
        let mut params = ListParams::default().fields(&format!("spec.nodeName={node}"));
        if let Some(labels) = labels {
            params = params.labels(labels);
        }
        let list = Api::<Pod>::all(self.client.clone())
            .list(&params)
            .await
            .map_err(|e| NodeError::ListPods(node.to_owned(), e))?;
        Ok(list.items)
    }

    async fn event_if_orphaned(&self, node: &Node) -> Result<(), NodeError> {
        let name = node.name_any();
        let handler = format!("{}={}", c::APP_LABEL, c::VIRT_HANDLER_VALUE);
        if !self.pods_on_node(&name, Some(&handler)).await?.is_empty() {
            return Ok(());
        }
        let sets = Api::<DaemonSet>::all(self.client.clone())
            .list(&ListParams::default().labels(&handler))
            .await
            .map_err(NodeError::ListDaemonSets)?;
        // Not settled: a handler may still come to this node; the recheck looks again.
        if handler_daemonset_settled(&sets.items)? {
            self.recorder
                .record(
                    node,
                    EventType::Warning,
                    NODE_UNRESPONSIVE_REASON,
                    ORPHANED_VMIS_MESSAGE,
                )
                .await;
        }
        Ok(())
    }

    async fn fail_vmis_without_pods(
        &self,
        node: &str,
        vmis: &[VirtualMachineInstance],
    ) -> Result<(), NodeError> {
        let pods = self.pods_on_node(node, None).await?;
        let alive = alive_launcher_pods(&pods);
        let mut errors = Vec::new();
        // One after the other: no update storm where something is already wrong.
        for vmi in vmis_without_pods(vmis, &alive) {
            let message = vmi_failed_message(node);
            self.recorder
                .record(vmi, EventType::Normal, NODE_UNRESPONSIVE_REASON, &message)
                .await;
            let ns = vmi.namespace().unwrap_or_default();
            let name = vmi.name_any();
            debug!(vmi = %name, namespace = %ns, "moving vmi on unresponsive node to failed state");
            let api: Api<VirtualMachineInstance> = Api::namespaced(self.client.clone(), &ns);
            let result =
                match json_patch(failed_vmi_patch().as_array().cloned().unwrap_or_default()) {
                    Ok(patch) => api
                        .patch(&name, &PatchParams::default(), &patch)
                        .await
                        .map(|_| ()),
                    Err(e) => Err(kube::Error::SerdeError(e)),
                };
            if let Err(e) = result {
                errors.push(format!(
                    "failed to move vmi {name} in namespace {ns} to final state: {}",
                    crate::runtime::controller::error_chain(&e)
                ));
            }
        }
        match errors.is_empty() {
            true => Ok(()),
            false => Err(NodeError::FailVmis(errors)),
        }
    }
}

impl Reconciler for NodeReconciler {
    type Error = NodeError;

    async fn reconcile(&self, key: &str) -> Result<Action, NodeError> {
        self.reconcile_node(key).await
    }
}

/// Runs the node controller until `cancel` fires.
pub async fn run_node_controller(
    client: Client,
    config: NodeControllerConfig,
    metrics: &Metrics,
    cancel: CancellationToken,
) {
    let queue =
        WorkQueue::with_config(RateLimiterConfig::default(), metrics.controller(QUEUE_NAME));
    let mut node_informer = Informer::<Node>::new();
    node_informer.enqueue(queue.clone(), |node: &Node| Some(node.name_any()));
    let mut vmi_informer = Informer::<VirtualMachineInstance>::new();
    let q = queue.clone();
    // As upstream: VMI additions and updates only, keyed by the VMI's node.
    vmi_informer.on_change(move |change| {
        if matches!(change, crate::runtime::informer::Change::Deleted(_)) {
            return;
        }
        if let Some(node) = change
            .object()
            .status
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty())
        {
            q.add(node);
        }
    });
    let (nodes, vmis) = (node_informer.handle(), vmi_informer.handle());
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(node_informer.run(Api::all(client.clone()), watcher::Config::default()));
    tasks.spawn(vmi_informer.run(Api::all(client.clone()), watcher::Config::default()));
    let synced = async {
        nodes.wait_for_sync().await?;
        vmis.wait_for_sync().await
    };
    tokio::select! {
        () = cancel.cancelled() => { tasks.abort_all(); return; }
        res = synced => if res.is_err() { tasks.abort_all(); return; },
    }
    let reconciler = NodeReconciler {
        recorder: Arc::new(EventRecorder::new(client.clone(), EVENT_COMPONENT)),
        client,
        nodes,
        heartbeat_timeout: config.heartbeat_timeout,
    };
    let panics = Controller::new(QUEUE_NAME, queue, reconciler)
        .workers(config.workers)
        .run(cancel)
        .await;
    if panics > 0 {
        error!(panics, "node controller workers panicked");
    }
    tasks.abort_all();
}

#[cfg(test)]
mod tests;
