//! The DaemonSet controller (kube's `pkg/controller/daemon`): one pod per eligible node.
//!
//! Data flow: DaemonSet, pod, Node and ControllerRevision changes → keys (a pod or revision
//! wakes its controller, an orphan pod every DaemonSet whose selector matches it, a Node
//! every DaemonSet) → `reconcile`: claim the namespace's pods, make sure a
//! ControllerRevision holds the current template (`revision.rs`; its hash becomes the pods'
//! `controller-revision-hash` label), then, with the expectations satisfied:
//! - per node, whether a daemon pod should run there (`nodeSelector`, required node affinity,
//!   taints against the template's tolerations plus the ones kube adds, see
//!   [`node_should_run`]); create the missing pods (bound through
//!   `spec.affinity.nodeAffinity` matchFields `metadata.name`, left to the scheduler), delete
//!   failed pods, duplicates, pods on nodes that should not run one or that are gone;
//! - `RollingUpdate`: delete old pods, unavailable ones first, keeping at most
//!   `maxUnavailable` nodes without an available pod (the next pass creates their
//!   replacements);
//! - status (`desiredNumberScheduled`, `currentNumberScheduled`, `numberMisscheduled`,
//!   `numberReady`, `numberAvailable`, `numberUnavailable`, `updatedNumberScheduled`,
//!   `observedGeneration`) when it changed, and old revisions beyond `revisionHistoryLimit`
//!   deleted.
//!
//! # Guarantees
//! At most one pod is created per node and pass, and nothing is created or deleted while an
//! earlier pass is unobserved ([`crate::expectations`]).
//!
//! # Caveats
//! - `maxSurge` is not supported (kube's default is 0); failed pods are replaced at once,
//!   without kube's back-off.
//! - The embedded scheduler leaves pods on NotReady nodes pending, where kube-scheduler
//!   would bind a daemon pod that tolerates `node.kubernetes.io/not-ready`.

mod revision;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    Toleration,
};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::informer::Seen;
use crate::ownership::{self, controller_of, controller_reference, selector_matches};
use crate::pods;
use crate::replicaset::{create_slow_start, delete_pods, nonzero};
use crate::{Context, Error};

/// The label with the hash of the template a daemon pod (and its revision) was made from.
pub const CONTROLLER_REVISION_HASH: &str = "controller-revision-hash";
/// The deprecated label with the DaemonSet's generation, still set by kube.
pub const POD_TEMPLATE_GENERATION: &str = "pod-template-generation";

fn expectation_key(ds: &DaemonSet) -> String {
    format!("DaemonSet/{}", ownership::key(&ds.metadata))
}

/// Runs the controller until `cancel` fires.
pub(crate) async fn run(
    ctx: Arc<Context>,
    daemon_sets: UnboundedReceiver<Seen<DaemonSet>>,
    pods: UnboundedReceiver<Seen<Pod>>,
    nodes: UnboundedReceiver<Seen<Node>>,
    revisions: UnboundedReceiver<Seen<ControllerRevision>>,
    config: kube::runtime::controller::Config,
    cancel: CancellationToken,
) {
    let own = {
        let ctx = ctx.clone();
        UnboundedReceiverStream::new(daemon_sets).filter_map(move |seen| {
            let out = if seen.deleted {
                ctx.expectations.forget(&expectation_key(&seen.object));
                None
            } else {
                Some(ObjectRef::from_obj(&*seen.object))
            };
            futures::future::ready(out)
        })
    };
    let from_pods = {
        let ctx = ctx.clone();
        UnboundedReceiverStream::new(pods)
            .flat_map(move |seen| futures::stream::iter(pod_owners(&ctx, &seen)))
    };
    let from_nodes = {
        let ctx = ctx.clone();
        UnboundedReceiverStream::new(nodes).flat_map(move |_| {
            let all: Vec<ObjectRef<DaemonSet>> = ctx
                .daemon_sets
                .state()
                .iter()
                .map(|ds| ObjectRef::from_obj(&**ds))
                .collect();
            futures::stream::iter(all)
        })
    };
    let from_revisions = UnboundedReceiverStream::new(revisions).filter_map(|seen| {
        let r = &seen.object;
        let out = controller_of(&r.metadata)
            .filter(|o| o.kind == "DaemonSet")
            .map(|o| ObjectRef::new(&o.name).within(&r.namespace().unwrap_or_default()));
        futures::future::ready(out)
    });
    let queue = futures::stream::select(
        futures::stream::select(own, from_pods),
        futures::stream::select(from_nodes, from_revisions),
    )
    .map(Ok::<_, Infallible>);
    let stream = kube::runtime::controller::applier(
        |ds, ctx| Box::pin(reconcile(ds, ctx)),
        crate::error_policy,
        ctx.clone(),
        ctx.daemon_sets.clone(),
        queue,
        config,
    );
    crate::drive(stream, cancel).await;
}

fn pod_owners(ctx: &Context, seen: &Seen<Pod>) -> Vec<ObjectRef<DaemonSet>> {
    let pod = &seen.object;
    let namespace = pod.namespace().unwrap_or_default();
    if let Some(owner) = controller_of(&pod.metadata) {
        if owner.kind != "DaemonSet" {
            return Vec::new();
        }
        ctx.expectations.observe(
            &format!("DaemonSet/{namespace}/{}", owner.name),
            pod.metadata.uid.as_deref().unwrap_or_default(),
            seen.deleted || pod.metadata.deletion_timestamp.is_some(),
        );
        return vec![ObjectRef::new(&owner.name).within(&namespace)];
    }
    if seen.deleted {
        return Vec::new();
    }
    ctx.daemon_sets
        .state()
        .iter()
        .filter(|ds| ds.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|ds| {
            ds.spec
                .as_ref()
                .is_some_and(|s| selector_matches(&s.selector, pod.labels()))
        })
        .map(|ds| ObjectRef::from_obj(&**ds))
        .collect()
}

/// The node a daemon pod is for: `spec.nodeName`, or the node its affinity names.
pub fn target_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = spec.node_name.as_ref().filter(|n| !n.is_empty()) {
        return Some(n.clone());
    }
    spec.affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms
        .iter()
        .flat_map(|t| t.match_fields.iter().flatten())
        .find(|r| r.key == "metadata.name" && r.operator == "In")
        .and_then(|r| r.values.as_ref()?.first().cloned())
}

/// The tolerations kube adds to every daemon pod (`AddOrUpdateDaemonPodTolerations`).
fn default_tolerations(host_network: bool) -> Vec<Toleration> {
    let mut out: Vec<(&str, &str)> = vec![
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ];
    if host_network {
        out.push(("node.kubernetes.io/network-unavailable", "NoSchedule"));
    }
    out.into_iter()
        .map(|(key, effect)| Toleration {
            key: Some(key.to_owned()),
            operator: Some("Exists".to_owned()),
            effect: Some(effect.to_owned()),
            ..Toleration::default()
        })
        .collect()
}

/// The daemon pod for `node`: the template with the revision labels, kube's tolerations and a
/// required node affinity for exactly that node (replacing any required node affinity).
pub fn daemon_pod(ds: &DaemonSet, node: &str, hash: &str) -> Pod {
    let template = ds.spec.clone().unwrap_or_default().template;
    let namespace = ds.namespace().unwrap_or_default();
    let mut pod = pods::pod_from_template(
        &template,
        &namespace,
        &ds.name_any(),
        controller_reference(ds),
    );
    let labels = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(CONTROLLER_REVISION_HASH.to_owned(), hash.to_owned());
    if let Some(generation) = ds.metadata.generation {
        labels.insert(POD_TEMPLATE_GENERATION.to_owned(), generation.to_string());
    }
    let spec = pod.spec.get_or_insert_with(Default::default);
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    for t in default_tolerations(spec.host_network == Some(true)) {
        tolerations.retain(|x| !(x.key == t.key && x.effect == t.effect));
        tolerations.push(t);
    }
    let term = NodeSelectorTerm {
        match_fields: Some(vec![NodeSelectorRequirement {
            key: "metadata.name".into(),
            operator: "In".into(),
            values: Some(vec![node.to_owned()]),
        }]),
        match_expressions: None,
    };
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    let node_affinity = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    node_affinity.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
        node_selector_terms: vec![term],
    });
    pod
}

/// `(should run, should continue running)` of a daemon pod on `node` (kube's
/// `NodeShouldRunDaemonPod`): node name, `nodeSelector` and required node affinity of the
/// template must match; an untolerated taint stops new pods, and existing ones too if it is
/// `NoExecute`.
pub fn node_should_run(ds: &DaemonSet, node: &Node) -> (bool, bool) {
    let template = ds.spec.clone().unwrap_or_default().template;
    let spec = template.spec.unwrap_or_default();
    let name = node.metadata.name.as_deref().unwrap_or_default();
    if spec
        .node_name
        .as_deref()
        .is_some_and(|n| !n.is_empty() && n != name)
    {
        return (false, false);
    }
    if !kubevirt_scheduler::fit::node_selectors_match(&spec, node) {
        return (false, false);
    }
    let mut tolerations = spec.tolerations.unwrap_or_default();
    tolerations.extend(default_tolerations(spec.host_network == Some(true)));
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let untolerated = |effect: &str| {
        taints
            .iter()
            .any(|t| t.effect == effect && !kubevirt_scheduler::fit::tolerates(&tolerations, t))
    };
    if untolerated("NoExecute") {
        return (false, false);
    }
    if untolerated("NoSchedule") {
        return (false, true);
    }
    (true, true)
}

fn pod_hash(pod: &Pod) -> Option<&str> {
    pod.labels()
        .get(CONTROLLER_REVISION_HASH)
        .map(String::as_str)
}

/// Oldest first (kube's `podByCreationTimestampAndPhase`, phase aside).
fn by_age(pods: &mut [Arc<Pod>]) {
    pods.sort_by(|a, b| {
        let t = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
        t(a).cmp(&t(b))
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
}

/// One pass over a DaemonSet.
pub(crate) async fn reconcile(ds: Arc<DaemonSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = ds.namespace().unwrap_or_default();
    let key = expectation_key(&ds);
    let needs_sync = ctx.expectations.satisfied(&key);
    let spec = ds.spec.clone().unwrap_or_default();
    let candidates: Vec<Arc<Pod>> = ctx
        .pods
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(namespace.as_str()))
        .collect();
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let owned = ownership::claim(&api, &*ds, &spec.selector, candidates).await?;
    let hash = revision::construct_history(&ctx, &ds).await?;
    let nodes: Vec<Arc<Node>> = ctx.nodes.state();
    let mut by_node: BTreeMap<String, Vec<Arc<Pod>>> = BTreeMap::new();
    let mut without_node = Vec::new();
    for pod in &owned {
        match target_node(pod) {
            Some(n) => by_node.entry(n).or_default().push(pod.clone()),
            None => without_node.push(pod.clone()),
        }
    }
    for pods in by_node.values_mut() {
        by_age(pods);
    }
    if needs_sync && ds.metadata.deletion_timestamp.is_none() {
        let pass = Pass {
            ctx: &ctx,
            ds: &ds,
            key: &key,
            api: &api,
            nodes: &nodes,
            by_node: &by_node,
            hash: &hash,
        };
        pass.manage(without_node).await?;
        if ctx.expectations.satisfied(&key) && is_rolling_update(&ds) {
            pass.rolling_update().await?;
        }
        revision::cleanup_history(&ctx, &ds, &owned, &hash).await?;
    }
    let now = crate::now();
    let status = calculate_status(&ds, &nodes, &by_node, &hash, now);
    if ds.status.as_ref() != Some(&status) {
        let mut updated = (*ds).clone();
        updated.status = Some(status);
        Api::<DaemonSet>::namespaced(ctx.client.clone(), &namespace)
            .replace_status(&ds.name_any(), &PostParams::default(), &updated)
            .await
            .map_err(|source| Error::UpdateStatus {
                kind: "DaemonSet",
                name: ds.name_any(),
                source,
            })?;
    }
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let wait = owned
        .iter()
        .filter_map(|p| pods::until_available(p, min_ready, now))
        .min();
    Ok(wait.map_or_else(Action::await_change, Action::requeue))
}

fn is_rolling_update(ds: &DaemonSet) -> bool {
    ds.spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|s| s.type_.as_deref())
        .is_none_or(|t| t == "RollingUpdate")
}

/// What a pass over one DaemonSet acts on: the nodes, its pods by node, the current hash.
struct Pass<'a> {
    ctx: &'a Context,
    ds: &'a DaemonSet,
    /// The expectations key.
    key: &'a str,
    api: &'a Api<Pod>,
    nodes: &'a [Arc<Node>],
    by_node: &'a BTreeMap<String, Vec<Arc<Pod>>>,
    hash: &'a str,
}

impl Pass<'_> {
    /// Creates and deletes daemon pods so each eligible node runs one (kube's `manage`);
    /// `without_node` are claimed pods that name no node.
    async fn manage(&self, without_node: Vec<Arc<Pod>>) -> Result<(), Error> {
        let Pass {
            ctx,
            ds,
            key,
            api,
            nodes,
            by_node,
            hash,
        } = *self;
        let mut to_create: Vec<String> = Vec::new();
        let mut to_delete: Vec<Arc<Pod>> = without_node
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        let known: Vec<&str> = nodes
            .iter()
            .filter_map(|n| n.metadata.name.as_deref())
            .collect();
        // Pods for nodes that are gone.
        for (node, pods) in by_node {
            if !known.contains(&node.as_str()) {
                to_delete.extend(
                    pods.iter()
                        .filter(|p| p.metadata.deletion_timestamp.is_none())
                        .cloned(),
                );
            }
        }
        for node in nodes {
            let name = node.metadata.name.clone().unwrap_or_default();
            let (should_run, should_continue) = node_should_run(ds, node);
            let pods = by_node.get(&name).cloned().unwrap_or_default();
            let live: Vec<Arc<Pod>> = pods
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .cloned()
                .collect();
            if should_run && pods.is_empty() {
                to_create.push(name);
            } else if should_continue {
                let (failed, running): (Vec<_>, Vec<_>) = live.into_iter().partition(|p| {
                    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")
                });
                to_delete.extend(failed);
                // Several pods on one node: keep the oldest.
                to_delete.extend(running.into_iter().skip(1));
            } else {
                to_delete.extend(live);
            }
        }
        if !to_delete.is_empty() {
            info!(daemonset = %ownership::key(&ds.metadata), count = to_delete.len(), "deleting daemon pods");
            delete_pods(ctx, key, api, &to_delete).await?;
        }
        if !to_create.is_empty() {
            info!(daemonset = %ownership::key(&ds.metadata), nodes = ?to_create, "creating daemon pods");
            let known = by_node
                .values()
                .flatten()
                .filter_map(|p| p.metadata.uid.clone());
            ctx.expectations
                .expect_creations(key, to_create.len(), known);
            let mut first_error = None;
            for node in &to_create {
                let pod = daemon_pod(ds, node, hash);
                if let Err(e) = create_slow_start(ctx, key, api, &pod, 1, &ds.name_any()).await {
                    first_error.get_or_insert(e);
                }
            }
            if let Some(e) = first_error {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Deletes old pods within `maxUnavailable` (kube's `rollingUpdate` without surge).
    async fn rolling_update(&self) -> Result<(), Error> {
        let Pass {
            ctx,
            ds,
            key,
            api,
            nodes,
            by_node,
            hash,
        } = *self;
        let min_ready = ds
            .spec
            .as_ref()
            .and_then(|s| s.min_ready_seconds)
            .unwrap_or(0);
        let now = crate::now();
        let eligible: Vec<&Arc<Node>> = nodes.iter().filter(|n| node_should_run(ds, n).0).collect();
        let desired = i32::try_from(eligible.len()).unwrap_or(i32::MAX);
        let max_unavailable = ds
            .spec
            .as_ref()
            .and_then(|s| s.update_strategy.as_ref())
            .and_then(|s| s.rolling_update.as_ref())
            .and_then(|r| r.max_unavailable.as_ref())
            .map_or(1, |v| {
                crate::deployment::util::scaled_value(v, desired, true)
            })
            .max(1);
        let mut unavailable = 0;
        let mut replace_now = Vec::new();
        let mut candidates = Vec::new();
        for node in eligible {
            let name = node.metadata.name.clone().unwrap_or_default();
            let live: Vec<&Arc<Pod>> = by_node
                .get(&name)
                .into_iter()
                .flatten()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            let (new, old): (Vec<_>, Vec<_>) =
                live.into_iter().partition(|p| pod_hash(p) == Some(hash));
            if new.len() > 1 || old.len() > 1 {
                continue;
            }
            match (new.first(), old.first()) {
                (None, None) => unavailable += 1,
                (Some(p), _) => {
                    if !pods::is_available(p, min_ready, now) {
                        unavailable += 1;
                    }
                }
                (None, Some(p)) => {
                    if pods::is_available(p, min_ready, now) {
                        candidates.push((*p).clone());
                    } else {
                        replace_now.push((*p).clone());
                    }
                }
            }
        }
        let budget = usize::try_from(
            (max_unavailable - unavailable - i32::try_from(replace_now.len()).unwrap_or(i32::MAX))
                .max(0),
        )
        .unwrap_or(0);
        let mut victims = replace_now;
        victims.extend(candidates.into_iter().take(budget));
        if victims.is_empty() {
            return Ok(());
        }
        info!(daemonset = %ownership::key(&ds.metadata), count = victims.len(), "deleting old daemon pods for the rolling update");
        delete_pods(ctx, key, api, &victims).await
    }
}

/// The status the DaemonSet should show (kube's `updateDaemonSetStatus`).
pub fn calculate_status(
    ds: &DaemonSet,
    nodes: &[Arc<Node>],
    by_node: &BTreeMap<String, Vec<Arc<Pod>>>,
    hash: &str,
    now: jiff::Timestamp,
) -> DaemonSetStatus {
    let min_ready = ds
        .spec
        .as_ref()
        .and_then(|s| s.min_ready_seconds)
        .unwrap_or(0);
    let generation = ds.metadata.generation.map(|g| g.to_string());
    let (mut desired, mut current, mut misscheduled, mut ready, mut available, mut updated) =
        (0usize, 0usize, 0usize, 0usize, 0usize, 0usize);
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let pods = by_node.get(&name).map(Vec::as_slice).unwrap_or_default();
        let (should_run, _) = node_should_run(ds, node);
        if !should_run {
            if !pods.is_empty() {
                misscheduled += 1;
            }
            continue;
        }
        desired += 1;
        let Some(pod) = pods.first() else { continue };
        current += 1;
        if pods::is_ready(pod) {
            ready += 1;
            if pods::is_available(pod, min_ready, now) {
                available += 1;
            }
        }
        let by_generation = generation.is_some()
            && pod.labels().get(POD_TEMPLATE_GENERATION) == generation.as_ref();
        if pod_hash(pod) == Some(hash) || by_generation {
            updated += 1;
        }
    }
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    DaemonSetStatus {
        desired_number_scheduled: count(desired),
        current_number_scheduled: count(current),
        number_misscheduled: count(misscheduled),
        number_ready: count(ready),
        number_available: nonzero(available),
        number_unavailable: nonzero(desired - available.min(desired)),
        updated_number_scheduled: nonzero(updated),
        observed_generation: ds.metadata.generation,
        collision_count: ds.status.as_ref().and_then(|s| s.collision_count),
        conditions: ds.status.as_ref().and_then(|s| s.conditions.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[allow(clippy::needless_pass_by_value)] // test fixtures read best with owned JSON
    fn ds(template_spec: serde_json::Value) -> DaemonSet {
        serde_json::from_value(
            json!({"metadata": {"name": "h", "namespace": "kv", "uid": "u", "generation": 3},
            "spec": {"selector": {"matchLabels": {"app": "h"}},
                "template": {"metadata": {"labels": {"app": "h"}}, "spec": template_spec}}}),
        )
        .expect("ds")
    }

    #[allow(clippy::needless_pass_by_value)] // test fixtures read best with owned JSON
    fn node(extra: serde_json::Value) -> Node {
        let mut v = json!({"metadata": {"name": "n1", "labels": {"role": "worker"}}, "spec": {}});
        if let Some(spec) = extra.get("spec") {
            v["spec"] = spec.clone();
        }
        serde_json::from_value(v).expect("node")
    }

    #[test]
    fn a_daemon_pod_targets_its_node_and_tolerates_what_kube_adds() {
        let pod = daemon_pod(
            &ds(json!({"containers": [{"name": "c", "image": "i"}]})),
            "n1",
            "abc",
        );
        assert_eq!(target_node(&pod).as_deref(), Some("n1"));
        assert_eq!(pod.metadata.generate_name.as_deref(), Some("h-"));
        let labels = pod.metadata.labels.clone().expect("labels");
        assert_eq!(
            labels.get(CONTROLLER_REVISION_HASH).map(String::as_str),
            Some("abc")
        );
        assert_eq!(
            labels.get(POD_TEMPLATE_GENERATION).map(String::as_str),
            Some("3")
        );
        let tolerations = pod.spec.and_then(|s| s.tolerations).expect("tolerations");
        assert!(
            tolerations
                .iter()
                .any(|t| t.key.as_deref() == Some("node.kubernetes.io/not-ready")
                    && t.effect.as_deref() == Some("NoExecute"))
        );
        assert_eq!(tolerations.len(), 6);
    }

    #[test]
    fn node_selector_and_taints_decide_where_daemon_pods_run() {
        let selecting = ds(json!({"containers": [], "nodeSelector": {"role": "worker"}}));
        assert_eq!(node_should_run(&selecting, &node(json!({}))), (true, true));
        let elsewhere = ds(json!({"containers": [], "nodeSelector": {"role": "infra"}}));
        assert_eq!(
            node_should_run(&elsewhere, &node(json!({}))),
            (false, false)
        );
        let no_schedule = node(json!({"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}));
        assert_eq!(node_should_run(&selecting, &no_schedule), (false, true));
        let no_execute = node(json!({"spec": {"taints": [{"key": "k", "effect": "NoExecute"}]}}));
        assert_eq!(node_should_run(&selecting, &no_execute), (false, false));
        let not_ready = node(
            json!({"spec": {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]}}),
        );
        assert_eq!(node_should_run(&selecting, &not_ready), (true, true));
    }
}
