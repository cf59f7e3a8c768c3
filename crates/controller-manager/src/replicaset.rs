//! The ReplicaSet controller (kube's `pkg/controller/replicaset`): keeps `spec.replicas` active
//! pods from `spec.template`.
//!
//! Data flow: ReplicaSet and pod changes → keys (a pod wakes its controller, an orphan wakes
//! every ReplicaSet of its namespace whose selector matches it) → `reconcile`: claim the
//! active pods of the namespace (adopt matching orphans, release owned pods that stopped
//! matching), then, when the expectations are satisfied, create the missing pods (slow start:
//! batches of 1, 2, 4, … as kube does, at most 500 per pass) or delete the surplus in kube's
//! order ([`crate::pods::sort_for_deletion`]), then write status (`replicas`,
//! `fullyLabeledReplicas`, `readyReplicas`, `availableReplicas`, `observedGeneration`, the
//! `ReplicaFailure` condition) when it changed.
//!
//! # Guarantees
//! - At most `replicas` active pods are created: creations are expected before they are
//!   requested, and nothing is created or deleted while a previous pass is unobserved.
//! - A ReplicaSet being deleted creates and deletes nothing (the garbage collector removes
//!   its pods).
//!
//! # Caveats
//! A pod that becomes available only `minReadySeconds` after it became ready makes the
//! reconcile requeue itself for that moment (no pod event marks it).

use std::convert::Infallible;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetCondition, ReplicaSetStatus};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::informer::Seen;
use crate::ownership::{self, controller_of, controller_reference, selector_matches};
use crate::pods;
use crate::{Context, Error};

/// At most this many pods are created or deleted in one pass (kube's `burstReplicas`).
pub const BURST_REPLICAS: usize = 500;

/// The expectations key of a ReplicaSet.
fn expectation_key(rs: &ReplicaSet) -> String {
    format!("ReplicaSet/{}", ownership::key(&rs.metadata))
}

/// Runs the controller until `cancel` fires.
pub(crate) async fn run(
    ctx: Arc<Context>,
    replica_sets: UnboundedReceiver<Seen<ReplicaSet>>,
    pods: UnboundedReceiver<Seen<Pod>>,
    config: kube::runtime::controller::Config,
    cancel: CancellationToken,
) {
    let own = {
        let ctx = ctx.clone();
        UnboundedReceiverStream::new(replica_sets).filter_map(move |seen| {
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
    let queue = futures::stream::select(own, from_pods).map(Ok::<_, Infallible>);
    let stream = kube::runtime::controller::applier(
        |rs, ctx| Box::pin(reconcile(rs, ctx)),
        crate::error_policy,
        ctx.clone(),
        ctx.replica_sets.clone(),
        queue,
        config,
    );
    crate::drive(stream, cancel).await;
}

/// The ReplicaSets a pod change concerns; observes the change for their expectations.
fn pod_owners(ctx: &Context, seen: &Seen<Pod>) -> Vec<ObjectRef<ReplicaSet>> {
    let pod = &seen.object;
    let namespace = pod.namespace().unwrap_or_default();
    if let Some(owner) = controller_of(&pod.metadata) {
        if owner.kind != "ReplicaSet" {
            return Vec::new();
        }
        let rs = ObjectRef::<ReplicaSet>::new(&owner.name).within(&namespace);
        let gone = seen.deleted || pod.metadata.deletion_timestamp.is_some();
        ctx.expectations.observe(
            &format!("ReplicaSet/{namespace}/{}", owner.name),
            pod.metadata.uid.as_deref().unwrap_or_default(),
            gone,
        );
        return vec![rs];
    }
    if seen.deleted {
        return Vec::new();
    }
    ctx.replica_sets
        .state()
        .iter()
        .filter(|rs| rs.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|rs| {
            rs.spec
                .as_ref()
                .is_some_and(|s| selector_matches(&s.selector, pod.labels()))
        })
        .map(|rs| ObjectRef::from_obj(&**rs))
        .collect()
}

/// One pass over a ReplicaSet: claim, create or delete, status.
pub(crate) async fn reconcile(rs: Arc<ReplicaSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = rs.namespace().unwrap_or_default();
    let key = expectation_key(&rs);
    let needs_sync = ctx.expectations.satisfied(&key);
    let spec = rs.spec.clone().unwrap_or_default();
    let candidates: Vec<Arc<Pod>> = ctx
        .pods
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(namespace.as_str()) && pods::is_active(p))
        .collect();
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let owned = ownership::claim(&api, &*rs, &spec.selector, candidates).await?;
    let managed = if needs_sync && rs.metadata.deletion_timestamp.is_none() {
        manage_replicas(&ctx, &rs, &key, &owned).await
    } else {
        Ok(())
    };
    let now = crate::now();
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let status = calculate_status(&rs, &owned, managed.as_ref().err(), now);
    if rs.status.as_ref() != Some(&status) {
        let mut updated = (*rs).clone();
        updated.status = Some(status);
        let api: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), &namespace);
        api.replace_status(&rs.name_any(), &PostParams::default(), &updated)
            .await
            .map_err(|source| Error::UpdateStatus {
                kind: "ReplicaSet",
                name: rs.name_any(),
                source,
            })?;
    }
    managed?;
    let wait = owned
        .iter()
        .filter_map(|p| pods::until_available(p, min_ready, now))
        .min();
    Ok(wait.map_or_else(Action::await_change, Action::requeue))
}

/// Creates the missing pods or deletes the surplus.
async fn manage_replicas(
    ctx: &Context,
    rs: &ReplicaSet,
    key: &str,
    owned: &[Arc<Pod>],
) -> Result<(), Error> {
    let spec = rs.spec.clone().unwrap_or_default();
    let want = usize::try_from(spec.replicas.unwrap_or(1).max(0)).unwrap_or(0);
    let namespace = rs.namespace().unwrap_or_default();
    let name = rs.name_any();
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    if owned.len() < want {
        let count = (want - owned.len()).min(BURST_REPLICAS);
        let known = owned.iter().filter_map(|p| p.metadata.uid.clone());
        ctx.expectations.expect_creations(key, count, known);
        let template = spec.template.unwrap_or_default();
        let pod = pods::pod_from_template(&template, &namespace, &name, controller_reference(rs));
        info!(replicaset = %ownership::key(&rs.metadata), count, "creating pods");
        create_slow_start(ctx, key, &api, &pod, count, &name).await
    } else if owned.len() > want {
        let mut victims = owned.to_vec();
        pods::sort_for_deletion(&mut victims);
        victims.truncate((owned.len() - want).min(BURST_REPLICAS));
        info!(replicaset = %ownership::key(&rs.metadata), count = victims.len(), "deleting pods");
        delete_pods(ctx, key, &api, &victims).await
    } else {
        Ok(())
    }
}

/// Creates `count` copies of `pod` in batches of 1, 2, 4, …; stops at the first batch with a
/// failure and gives back the expectations of what it did not create.
pub(crate) async fn create_slow_start(
    ctx: &Context,
    key: &str,
    api: &Api<Pod>,
    pod: &Pod,
    count: usize,
    owner: &str,
) -> Result<(), Error> {
    let params = PostParams::default();
    let mut remaining = count;
    let mut batch = 1;
    while remaining > 0 {
        let size = batch.min(remaining);
        let results = futures::future::join_all((0..size).map(|_| api.create(&params, pod))).await;
        remaining -= size;
        let mut first_error = None;
        for result in results {
            match result {
                Ok(created) => debug!(pod = %created.name_any(), "created pod"),
                Err(source) => {
                    ctx.expectations.creation_failed(key);
                    first_error.get_or_insert(source);
                }
            }
        }
        if let Some(source) = first_error {
            for _ in 0..remaining {
                ctx.expectations.creation_failed(key);
            }
            return Err(Error::CreatePod {
                owner: owner.to_owned(),
                source,
            });
        }
        batch *= 2;
    }
    Ok(())
}

/// Deletes `victims` (uid preconditions), expecting each deletion first.
pub(crate) async fn delete_pods(
    ctx: &Context,
    key: &str,
    api: &Api<Pod>,
    victims: &[Arc<Pod>],
) -> Result<(), Error> {
    for pod in victims {
        ctx.expectations
            .expect_deletion(key, pod.metadata.uid.as_deref().unwrap_or_default());
    }
    let results = futures::future::join_all(victims.iter().map(|pod| {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        async move { (pod, api.delete(&pod.name_any(), &params).await) }
    }))
    .await;
    let mut first_error = None;
    for (pod, result) in results {
        match result {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(source) => {
                ctx.expectations
                    .deletion_failed(key, pod.metadata.uid.as_deref().unwrap_or_default());
                first_error.get_or_insert(Error::DeletePod {
                    pod: pod.name_any(),
                    source,
                });
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// `Some(n)` unless `n` is zero (kube's `omitempty` counts).
pub(crate) fn nonzero(n: usize) -> Option<i32> {
    (n > 0).then(|| i32::try_from(n).unwrap_or(i32::MAX))
}

/// The status the ReplicaSet should show for the pods it controls.
pub fn calculate_status(
    rs: &ReplicaSet,
    owned: &[Arc<Pod>],
    manage_error: Option<&Error>,
    now: jiff::Timestamp,
) -> ReplicaSetStatus {
    let spec = rs.spec.clone().unwrap_or_default();
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let template_labels = spec
        .template
        .and_then(|t| t.metadata)
        .and_then(|m| m.labels)
        .unwrap_or_default();
    let fully_labeled = owned
        .iter()
        .filter(|p| {
            template_labels
                .iter()
                .all(|(k, v)| p.labels().get(k) == Some(v))
        })
        .count();
    let ready = owned.iter().filter(|p| pods::is_ready(p)).count();
    let available = owned
        .iter()
        .filter(|p| pods::is_available(p, min_ready, now))
        .count();
    let mut conditions: Vec<ReplicaSetCondition> = rs
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let failure = match manage_error {
        Some(e @ Error::CreatePod { .. }) => Some(("FailedCreate", e)),
        Some(e @ Error::DeletePod { .. }) => Some(("FailedDelete", e)),
        _ => None,
    };
    match failure {
        Some((reason, e)) => {
            let message =
                std::error::Error::source(e).map_or_else(|| e.to_string(), ToString::to_string);
            let existing = conditions.iter().position(|c| c.type_ == "ReplicaFailure");
            if existing.is_none_or(|i| {
                conditions[i].reason.as_deref() != Some(reason) || conditions[i].status != "True"
            }) {
                conditions.retain(|c| c.type_ != "ReplicaFailure");
                conditions.push(ReplicaSetCondition {
                    type_: "ReplicaFailure".into(),
                    status: "True".into(),
                    reason: Some(reason.into()),
                    message: Some(message),
                    last_transition_time: Some(crate::now_time()),
                });
            }
        }
        None if manage_error.is_none() => conditions.retain(|c| c.type_ != "ReplicaFailure"),
        None => {}
    }
    ReplicaSetStatus {
        replicas: i32::try_from(owned.len()).unwrap_or(i32::MAX),
        fully_labeled_replicas: nonzero(fully_labeled),
        ready_replicas: nonzero(ready),
        available_replicas: nonzero(available),
        observed_generation: rs.meta().generation,
        conditions: (!conditions.is_empty()).then_some(conditions),
        terminating_replicas: None,
    }
}
