//! kube-scheduler's role in the embedded Kubernetes: binds pending pods to nodes. It knows
//! nothing of KubeVirt; on a real cluster kube-scheduler does this and this crate is not run.
//!
//!
//! Data flow: watches pods without `spec.nodeName` whose `schedulerName` is empty or
//! `default-scheduler`, and all nodes; for each pending pod it runs the pure filters of
//! [`fit`] against the nodes and what their pods already request (the [`ledger`], kept
//! from the pod watch event by event, with the pods it bound assumed until the watch shows
//! them bound), then `POST`s a `pods/binding`. When nothing fits it sets the pod's `PodScheduled=False` condition with
//! reason `Unschedulable` and kube-scheduler's message (which the VMI controller copies, so
//! the VM shows `ErrorUnschedulable`), and retries when nodes or pods change.
//!
//! Volumes ([`volume_binding`], kube-scheduler's VolumeBinding): it also watches claims,
//! volumes and StorageClasses. A pod whose claim is missing stays Pending with
//! `0/N nodes are available: persistentvolumeclaim "x" not found.`; a bound claim's volume
//! restricts the nodes to its node affinity; an unbound `WaitForFirstConsumer` claim gets the
//! chosen node as `volume.kubernetes.io/selected-node` and the pod is bound once the PV
//! controller has bound the claim.

pub mod fit;
pub mod ledger;
pub mod volume_binding;

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    Binding, Node, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;
use tracing::{debug, info, warn};

/// Errors of the scheduler loop.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    /// Binding a pod to its node failed.
    #[error("binding pod {pod} to node {node}")]
    Bind {
        pod: String,
        node: String,
        #[source]
        source: kube::Error,
    },
    /// Naming the node of a `WaitForFirstConsumer` claim failed.
    #[error("selecting node {node} for claim {claim}")]
    SelectNode {
        claim: String,
        node: String,
        #[source]
        source: kube::Error,
    },
    /// Recording the Unschedulable condition failed.
    #[error("updating the PodScheduled condition of pod {pod}")]
    MarkUnschedulable {
        pod: String,
        #[source]
        source: kube::Error,
    },
}

fn is_pending_for_us(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else { return false };
    let scheduler_ok = matches!(
        spec.scheduler_name.as_deref(),
        None | Some("") | Some("default-scheduler")
    );
    let unbound = spec.node_name.as_deref().is_none_or(str::is_empty);
    let phase_ok = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_none_or(|p| p == "Pending");
    scheduler_ok && unbound && phase_ok && pod.metadata.deletion_timestamp.is_none()
}

fn unschedulable_message(pod: &Pod) -> Option<&str> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .and_then(|c| c.message.as_deref())
}

/// Bindings sent at once in one pass (kube-scheduler binds each pod in a goroutine of its
/// own; here a bounded number of requests are in flight).
const CONCURRENT_BINDINGS: usize = 16;

/// One scheduling pass over every pending pod. Returns how many were bound.
///
/// Nodes are chosen one pod after the other against `ledger`, each chosen pod assumed on its
/// node before the next is placed; the bindings are then sent concurrently, and a binding
/// that fails is forgotten again.
///
/// # Guarantees
/// A pod is bound at most once: a pod the ledger holds as assumed is not bound again while
/// the cache still shows it pending, and it counts against its node, so a burst of pods
/// never overcommits a node between two cache refreshes.
pub async fn schedule_pending(
    client: &kube::Client,
    pods: &[std::sync::Arc<Pod>],
    nodes: &[Node],
    volumes: volume_binding::Volumes<'_>,
    ledger: &mut ledger::Ledger,
) -> Result<usize, SchedulerError> {
    let mut to_bind: Vec<(std::sync::Arc<Pod>, String)> = Vec::new();
    for pod in pods.iter().filter(|p| is_pending_for_us(p)) {
        if pod
            .metadata
            .uid
            .as_deref()
            .is_some_and(|uid| ledger.is_assumed(uid))
        {
            continue;
        }
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        let pod_volumes = match volume_binding::pre_filter(pod, volumes) {
            Ok(v) => v,
            Err(reason) => {
                let message = format!("0/{} nodes are available: {reason}.", nodes.len());
                mark_unschedulable(&api, pod, &message).await?;
                continue;
            }
        };
        if pod_volumes.binding {
            // Its claims are being bound on the node they were given: bind it after them.
            continue;
        }
        match fit::choose_node_with(pod, nodes, ledger.requested(), |n| pod_volumes.admits(n)) {
            Ok(node) => {
                let node_name = node.metadata.name.clone().unwrap_or_default();
                if !pod_volumes.to_select.is_empty() {
                    select_node(client, &pod_volumes.to_select, &node_name).await?;
                    let name = pod.metadata.name.as_deref().unwrap_or_default();
                    info!(pod = %format!("{namespace}/{name}"), node = %node_name, "selected the node of the pod's claims");
                    continue;
                }
                ledger.assume(pod, &node_name);
                to_bind.push((std::sync::Arc::clone(pod), node_name));
            }
            Err(message) => mark_unschedulable(&api, pod, &message).await?,
        }
    }
    let results: Vec<_> = futures::stream::iter(to_bind)
        .map(|(pod, node)| {
            let client = client.clone();
            async move {
                let outcome = bind(&client, &pod, &node).await;
                (pod, node, outcome)
            }
        })
        .buffer_unordered(CONCURRENT_BINDINGS)
        .collect()
        .await;
    let mut bound = 0;
    let mut failed = None;
    for (pod, node, outcome) in results {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        match outcome {
            Ok(()) => bound += 1,
            // Already bound (by someone else) or deleted meanwhile: the watch repairs.
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
                ledger.forget(uid);
                debug!(pod = ?pod.metadata.name, code = e.code, "binding skipped");
            }
            Err(source) => {
                ledger.forget(uid);
                failed.get_or_insert(SchedulerError::Bind {
                    pod: pod.metadata.name.clone().unwrap_or_default(),
                    node,
                    source,
                });
            }
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(bound),
    }
}

/// `POST`s the pod's `binding` to `node`.
async fn bind(client: &kube::Client, pod: &Pod, node: &str) -> Result<(), kube::Error> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let binding = Binding {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            ..Default::default()
        },
        target: ObjectReference {
            kind: Some("Node".into()),
            name: Some(node.to_owned()),
            api_version: Some("v1".into()),
            ..Default::default()
        },
    };
    api.create_subresource::<_, serde_json::Value>(
        "binding",
        &name,
        &PostParams::default(),
        &binding,
    )
    .await?;
    info!(pod = %format!("{namespace}/{name}"), %node, "bound pod");
    Ok(())
}

/// Sets the pod's `PodScheduled=False` condition (reason `Unschedulable`) unless it already
/// carries `message`.
async fn mark_unschedulable(
    api: &Api<Pod>,
    pod: &Pod,
    message: &str,
) -> Result<(), SchedulerError> {
    if unschedulable_message(pod) == Some(message) {
        return Ok(());
    }
    let name = pod.metadata.name.clone().unwrap_or_default();
    let now = crate::now_rfc3339();
    let patch = json!({"status": {"conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": message, "lastTransitionTime": now
    }]}});
    api.patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .map_err(|source| SchedulerError::MarkUnschedulable {
            pod: name.clone(),
            source,
        })?;
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    warn!(pod = %format!("{namespace}/{name}"), %message, "pod is unschedulable");
    Ok(())
}

/// Names `node` on each `WaitForFirstConsumer` claim (namespace, name) as its
/// `volume.kubernetes.io/selected-node`, for the PV controller to provision or bind there.
async fn select_node(
    client: &kube::Client,
    claims: &[(String, String)],
    node: &str,
) -> Result<(), SchedulerError> {
    let patch = json!({"metadata": {"annotations": {volume_binding::SELECTED_NODE: node}}});
    for (namespace, name) in claims {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            // Deleted meanwhile: the next pass sees it missing.
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(source) => {
                return Err(SchedulerError::SelectNode {
                    claim: format!("{namespace}/{name}"),
                    node: node.to_owned(),
                    source,
                });
            }
        }
    }
    Ok(())
}

/// Runs the scheduler until the future is dropped: watches pods and nodes and schedules on
/// every change (coalesced), retrying failed passes after a second.
pub async fn run(client: kube::Client) {
    let (pod_store, pod_writer) = reflector::store::<Pod>();
    let (node_store, node_writer) = reflector::store::<Node>();
    let pods = watcher(Api::<Pod>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(pod_writer)
        .map(|event| event.map_or(Change::Other, |e| Change::Pod(Box::new(e))));
    let nodes = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(node_writer)
        .map(|_| Change::Other);
    let (claim_store, claim_writer) = reflector::store::<PersistentVolumeClaim>();
    let (volume_store, volume_writer) = reflector::store::<PersistentVolume>();
    let (class_store, class_writer) = reflector::store::<StorageClass>();
    let claims = watcher(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(claim_writer)
    .map(|_| Change::Other);
    let volumes = watcher(
        Api::<PersistentVolume>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(volume_writer)
    .map(|_| Change::Other);
    let classes = watcher(
        Api::<StorageClass>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(class_writer)
    .map(|_| Change::Other);
    let mut changes = futures::stream::select_all([
        pods.boxed(),
        nodes.boxed(),
        claims.boxed(),
        volumes.boxed(),
        classes.boxed(),
    ]);
    let mut retry = tokio::time::interval(Duration::from_secs(1));
    let mut ledger = ledger::Ledger::default();
    loop {
        tokio::select! {
            change = changes.next() => match change {
                Some(change) => observe(&mut ledger, change),
                None => return,
            },
            _ = retry.tick() => {},
        }
        // Drain whatever else is ready so a burst of events gives one pass.
        while let Some(Some(change)) = futures::FutureExt::now_or_never(changes.next()) {
            observe(&mut ledger, change);
        }
        // Not ready until every initial list is in; blocking here would stop the watchers.
        let states = [
            ready(&pod_store),
            ready(&node_store),
            ready(&claim_store),
            ready(&volume_store),
            ready(&class_store),
        ];
        if states.contains(&Some(false)) {
            return;
        }
        if states.contains(&None) {
            continue;
        }
        let nodes: Vec<Node> = node_store.state().iter().map(|n| (**n).clone()).collect();
        let (claims, volumes, classes) = (
            claim_store.state(),
            volume_store.state(),
            class_store.state(),
        );
        let seen = volume_binding::Volumes {
            claims: &claims,
            volumes: &volumes,
            classes: &classes,
        };
        if let Err(e) =
            schedule_pending(&client, &pod_store.state(), &nodes, seen, &mut ledger).await
        {
            warn!(error = %e, "scheduling pass failed; retrying");
        }
    }
}

/// What a watch delivered: a pod event (for the ledger) or any other change.
enum Change {
    Pod(Box<watcher::Event<Pod>>),
    Other,
}

/// Keeps the ledger in step with the pod watch (the reflector has applied the same event to
/// the pod cache).
fn observe(ledger: &mut ledger::Ledger, change: Change) {
    let Change::Pod(event) = change else { return };
    match *event {
        watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => ledger.apply(&pod),
        watcher::Event::Delete(pod) => ledger.delete(&pod),
        watcher::Event::Init => ledger.restart(),
        watcher::Event::InitDone => ledger.relisted(),
    }
}

/// Whether a cache holds its initial list: `Some(true)` yes, `None` not yet, `Some(false)`
/// never (its watch is gone).
fn ready<K>(store: &reflector::Store<K>) -> Option<bool>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    futures::FutureExt::now_or_never(store.wait_until_ready()).map(|r| r.is_ok())
}

/// The current time as Kubernetes writes `metav1.Time`: RFC 3339 in UTC, whole seconds.
fn now_rfc3339() -> String {
    jiff::fmt::strtime::format("%Y-%m-%dT%H:%M:%SZ", jiff::Timestamp::now()).unwrap_or_default()
}
