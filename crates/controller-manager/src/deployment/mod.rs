//! The Deployment controller (kube's `pkg/controller/deployment`): rolls a Deployment out
//! through ReplicaSets, one per pod template.
//!
//! Data flow: Deployment, ReplicaSet and pod changes → keys (a ReplicaSet wakes its
//! controller, an orphan ReplicaSet every Deployment whose selector matches it, a pod its
//! ReplicaSet's Deployment) → `reconcile`: claim the ReplicaSets, then as kube's
//! `syncDeployment`:
//! - paused, or a scaling event (an active ReplicaSet's `desired-replicas` annotation differs
//!   from `spec.replicas`): `Pass::scale` (sync.rs) (proportional scaling), status;
//! - `Recreate`: scale every old ReplicaSet to 0, wait until none of their pods runs, then
//!   create or scale up the new one;
//! - `RollingUpdate`: scale the new ReplicaSet up within `maxSurge`, the old ones down
//!   within `maxUnavailable` (unhealthy ones first), and once complete delete old
//!   ReplicaSets beyond `revisionHistoryLimit`;
//! - then status (`status.rs`): counts, `Available`, `Progressing` with kube's reasons and
//!   messages, `observedGeneration`.
//!
//! # Guarantees
//! - Every ReplicaSet write is an update with the `resourceVersion` the pass read: a pass
//!   never scales from a stale size (a conflict retries the pass).
//! - The new ReplicaSet's name is `<deployment>-<pod-template-hash>`, so two passes never
//!   create two ReplicaSets for one template; a name taken by another template raises
//!   `status.collisionCount`.
//!
//! # Caveats
//! `spec.rollbackTo` (extensions/v1beta1) is not supported; `kubectl rollout undo` works, as
//! it patches the template.

mod status;
pub mod sync;
pub mod util;

use std::convert::Infallible;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::informer::Seen;
use crate::ownership::{self, controller_of, selector_is_empty, selector_matches};
use crate::{Context, Error};

/// Runs the controller until `cancel` fires.
pub(crate) async fn run(
    ctx: Arc<Context>,
    deployments: UnboundedReceiver<Seen<Deployment>>,
    replica_sets: UnboundedReceiver<Seen<ReplicaSet>>,
    pods: UnboundedReceiver<Seen<Pod>>,
    config: kube::runtime::controller::Config,
    cancel: CancellationToken,
) {
    let own = UnboundedReceiverStream::new(deployments).filter_map(|seen| {
        futures::future::ready((!seen.deleted).then(|| ObjectRef::from_obj(&*seen.object)))
    });
    let from_rs = {
        let ctx = ctx.clone();
        UnboundedReceiverStream::new(replica_sets)
            .flat_map(move |seen| futures::stream::iter(rs_owners(&ctx, &seen.object)))
    };
    let from_pods = {
        let ctx = ctx.clone();
        UnboundedReceiverStream::new(pods)
            .flat_map(move |seen| futures::stream::iter(pod_deployment(&ctx, &seen)))
    };
    let queue = futures::stream::select(own, futures::stream::select(from_rs, from_pods))
        .map(Ok::<_, Infallible>);
    let stream = kube::runtime::controller::applier(
        |d, ctx| Box::pin(reconcile(d, ctx)),
        crate::error_policy,
        ctx.clone(),
        ctx.deployments.clone(),
        queue,
        config,
    );
    crate::drive(stream, cancel).await;
}

/// The Deployments a ReplicaSet change concerns.
fn rs_owners(ctx: &Context, rs: &ReplicaSet) -> Vec<ObjectRef<Deployment>> {
    let namespace = rs.namespace().unwrap_or_default();
    if let Some(owner) = controller_of(&rs.metadata) {
        if owner.kind != "Deployment" {
            return Vec::new();
        }
        return vec![ObjectRef::new(&owner.name).within(&namespace)];
    }
    ctx.deployments
        .state()
        .iter()
        .filter(|d| d.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|d| {
            d.spec
                .as_ref()
                .is_some_and(|s| selector_matches(&s.selector, rs.labels()))
        })
        .map(|d| ObjectRef::from_obj(&**d))
        .collect()
}

/// The Deployment of a pod's ReplicaSet, for a Recreate waiting for old pods to go.
fn pod_deployment(ctx: &Context, seen: &Seen<Pod>) -> Option<ObjectRef<Deployment>> {
    let pod = &seen.object;
    if !(seen.deleted || crate::pods::is_terminal(pod)) {
        return None;
    }
    let namespace = pod.namespace().unwrap_or_default();
    let owner = controller_of(&pod.metadata).filter(|o| o.kind == "ReplicaSet")?;
    let rs = ctx
        .replica_sets
        .get(&ObjectRef::new(&owner.name).within(&namespace))?;
    let d = controller_of(&rs.metadata).filter(|o| o.kind == "Deployment")?;
    Some(ObjectRef::new(&d.name).within(&namespace))
}

/// One pass over a Deployment (kube's `syncDeployment`).
pub(crate) async fn reconcile(d: Arc<Deployment>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = d.namespace().unwrap_or_default();
    let spec = d.spec.clone().unwrap_or_default();
    if selector_is_empty(&spec.selector) {
        // kube: "This deployment will select all pods"; only observe the generation.
        let mut status = d.status.clone().unwrap_or_default();
        if status.observed_generation < d.metadata.generation {
            status.observed_generation = d.metadata.generation;
            sync::write_status(&ctx, &d, status).await?;
        }
        return Ok(Action::await_change());
    }
    let candidates: Vec<Arc<ReplicaSet>> = ctx
        .replica_sets
        .state()
        .into_iter()
        .filter(|rs| rs.namespace().as_deref() == Some(namespace.as_str()))
        .collect();
    let api: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), &namespace);
    let owned = ownership::claim(&api, &*d, &spec.selector, candidates).await?;
    let mut pass = sync::Pass::new(&ctx, (*d).clone(), &owned);
    if d.metadata.deletion_timestamp.is_some() {
        return pass.sync_status_only().await;
    }
    pass.check_paused_conditions();
    if spec.paused == Some(true) {
        return pass.sync().await;
    }
    if pass.is_scaling_event() {
        return pass.sync().await;
    }
    if util::is_recreate(&d) {
        pass.rollout_recreate().await
    } else {
        pass.rollout_rolling().await
    }
}
