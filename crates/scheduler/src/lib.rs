//! kube-scheduler's role in the embedded Kubernetes: binds pending pods to nodes. It knows
//! nothing of KubeVirt; on a real cluster kube-scheduler does this and this crate is not run.
//!
//!
//! Data flow: watches pods without `spec.nodeName` whose `schedulerName` is empty or
//! `default-scheduler`, and all nodes; for each pending pod it runs the pure filters of
//! [`fit`] against the nodes and what their pods already request, then `POST`s a
//! `pods/binding`. When nothing fits it sets the pod's `PodScheduled=False` condition with
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
pub mod volume_binding;

use std::collections::BTreeMap;
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

fn is_terminated(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// What the pods bound to each node request.
fn requested_by_node(pods: &[std::sync::Arc<Pod>]) -> BTreeMap<String, BTreeMap<String, i128>> {
    let mut out: BTreeMap<String, BTreeMap<String, i128>> = BTreeMap::new();
    for pod in pods {
        let Some(node) = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty())
        else {
            continue;
        };
        if is_terminated(pod) {
            continue;
        }
        let entry = out.entry(node).or_default();
        for (resource, v) in fit::pod_requests(pod) {
            *entry.entry(resource).or_default() += v;
        }
    }
    out
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

/// Pods this scheduler bound that its cache does not show bound yet: pod uid → node
/// (kube-scheduler's "assumed" pods).
pub type Assumed = BTreeMap<String, String>;

/// One scheduling pass over every pending pod. Returns how many were bound.
///
/// # Guarantees
/// A pod is bound at most once: pods in `assumed` are not bound again while the cache still
/// shows them pending, and they count against their node.
///
/// # Caveats
/// Pods bound in this pass count against their node for the rest of the pass, so a burst of
/// pods never overcommits a node between two cache refreshes.
pub async fn schedule_pending(
    client: &kube::Client,
    pods: &[std::sync::Arc<Pod>],
    nodes: &[Node],
    volumes: volume_binding::Volumes<'_>,
    assumed: &mut Assumed,
) -> Result<usize, SchedulerError> {
    let mut requested = requested_by_node(pods);
    // Forget assumptions the cache has caught up with (bound, or the pod is gone).
    assumed.retain(|uid, _| {
        pods.iter()
            .any(|p| p.metadata.uid.as_deref() == Some(uid.as_str()) && is_pending_for_us(p))
    });
    for pod in pods.iter().filter(|p| is_pending_for_us(p)) {
        if let Some(node) = pod.metadata.uid.as_ref().and_then(|uid| assumed.get(uid)) {
            let entry = requested.entry(node.clone()).or_default();
            for (resource, v) in fit::pod_requests(pod) {
                *entry.entry(resource).or_default() += v;
            }
        }
    }
    let mut bound = 0;
    for pod in pods.iter().filter(|p| is_pending_for_us(p)) {
        if pod
            .metadata
            .uid
            .as_ref()
            .is_some_and(|uid| assumed.contains_key(uid))
        {
            continue;
        }
        let name = pod.metadata.name.clone().unwrap_or_default();
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
        match fit::choose_node_with(pod, nodes, &requested, |n| pod_volumes.admits(n)) {
            Ok(node) => {
                let node_name = node.metadata.name.clone().unwrap_or_default();
                if !pod_volumes.to_select.is_empty() {
                    select_node(client, &pod_volumes.to_select, &node_name).await?;
                    info!(pod = %format!("{namespace}/{name}"), node = %node_name, "selected the node of the pod's claims");
                    continue;
                }
                let binding = Binding {
                    metadata: kube::api::ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(namespace.clone()),
                        ..Default::default()
                    },
                    target: ObjectReference {
                        kind: Some("Node".into()),
                        name: Some(node_name.clone()),
                        api_version: Some("v1".into()),
                        ..Default::default()
                    },
                };
                let res = api
                    .create_subresource::<_, serde_json::Value>(
                        "binding",
                        &name,
                        &PostParams::default(),
                        &binding,
                    )
                    .await;
                match res {
                    Ok(_) => {
                        if let Some(uid) = &pod.metadata.uid {
                            assumed.insert(uid.clone(), node_name.clone());
                        }
                        info!(pod = %format!("{namespace}/{name}"), node = %node_name, "bound pod");
                        let entry = requested.entry(node_name).or_default();
                        for (resource, v) in fit::pod_requests(pod) {
                            *entry.entry(resource).or_default() += v;
                        }
                        bound += 1;
                    }
                    // Already bound (a racing pass) or deleted meanwhile: the next event repairs.
                    Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
                        debug!(pod = %name, code = e.code, "binding skipped");
                    }
                    Err(source) => {
                        return Err(SchedulerError::Bind {
                            pod: name,
                            node: node_name,
                            source,
                        });
                    }
                }
            }
            Err(message) => mark_unschedulable(&api, pod, &message).await?,
        }
    }
    Ok(bound)
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
        .map(|_| ());
    let nodes = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(node_writer)
        .map(|_| ());
    let (claim_store, claim_writer) = reflector::store::<PersistentVolumeClaim>();
    let (volume_store, volume_writer) = reflector::store::<PersistentVolume>();
    let (class_store, class_writer) = reflector::store::<StorageClass>();
    let claims = watcher(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(claim_writer)
    .map(|_| ());
    let volumes = watcher(
        Api::<PersistentVolume>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(volume_writer)
    .map(|_| ());
    let classes = watcher(
        Api::<StorageClass>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(class_writer)
    .map(|_| ());
    let mut changes = futures::stream::select_all([
        pods.boxed(),
        nodes.boxed(),
        claims.boxed(),
        volumes.boxed(),
        classes.boxed(),
    ]);
    let mut retry = tokio::time::interval(Duration::from_secs(1));
    let mut assumed = Assumed::new();
    loop {
        tokio::select! {
            change = changes.next() => if change.is_none() { return },
            _ = retry.tick() => {},
        }
        // Drain whatever else is ready so a burst of events gives one pass.
        while let Some(Some(())) = futures::FutureExt::now_or_never(changes.next()) {}
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
            schedule_pending(&client, &pod_store.state(), &nodes, seen, &mut assumed).await
        {
            warn!(error = %e, "scheduling pass failed; retrying");
        }
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
