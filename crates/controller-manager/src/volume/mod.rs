//! kube's PersistentVolume controller (`pkg/controller/volume/persistentvolume`) with a
//! local provisioner for one machine ([`provisioner`]): claims are bound to volumes, volumes
//! of the local class are made on demand and deleted with their claims.
//!
//! Data flow:
//! ```text
//!  claims, volumes, classes (informers)
//!     │ a claim wakes itself and the volume it names (or `pvc-<uid>`); a volume wakes
//!     │ itself and the claim of its claimRef; a class wakes its claims; a pod its claims
//!     ▼
//!  protection.rs  kube's pvc-protection: the `kubernetes.io/pvc-protection` finalizer on
//!             every claim, removed once a claim being deleted is used by no pod
//!  claim.rs   unbound claim → a matching volume ([`binder`]) or, for the local class
//!             (Immediate, or WaitForFirstConsumer once the scheduler annotated the node),
//!             a new volume `pvc-<uid>` pre-bound to it → bind: volume claimRef, claim
//!             volumeName and annotations, both `status.phase: Bound`
//!  reclaim.rs volume whose claim is gone → Released; reclaim Delete of a local volume →
//!             its loop devices detached (Block), its directory and the volume deleted
//! ```
//!
//! # Guarantees
//! - A volume is bound to one claim: its `claimRef` is written first, with its
//!   `resourceVersion` (a conflict retries on the newer object), and a claim only takes a
//!   volume whose `claimRef` names it.
//! - A volume is released only after a live read confirms its claim is gone (the cache may
//!   lag), and only a directory the provisioner made is deleted ([`provisioner`]).
//! - A claim used by a pod that is not finished is not deleted (its finalizer stays until a
//!   live list of the namespace's pods confirms no pod uses it), so a volume is never
//!   deleted under a running pod.
//! - A `volumeMode: Block` claim of the local class gets a sparse image of its request
//!   attached to a loop device ([`loop_device`]); where none can be set up it gets a
//!   `ProvisioningFailed` event saying so, nothing is left behind, and it stays `Pending`
//!   (tried again every 15 s).
//!
//! # Caveats
//! - Claims with a label `selector` bind only to the volume they name or that names them.
//! - Each distinct event is recorded once per claim (no counts, no aggregation).
//! - The protection finalizer is added by this controller, not at admission: a claim deleted
//!   in the moment before its first pass is not protected (nor is any claim when the
//!   controller-manager does not run, which also means no claim waits for it). Volumes get no
//!   `kubernetes.io/pv-protection`.
//! - Resizing, volume attributes classes and data sources are not implemented.

mod claim;
pub mod loop_device;
mod protection;
pub mod provisioner;
mod reclaim;

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    Event, EventSource, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::Context;
use crate::informer::Seen;
pub use kubevirt_scheduler::volume_binding::binder;
pub use provisioner::{LocalStorage, PROVISIONER};

/// The annotation the scheduler puts on a `WaitForFirstConsumer` claim: its node.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Set on a claim once its binding is complete.
pub const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// Set on a claim or volume the controller bound (not the user).
pub const BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
/// The provisioner that made a volume.
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// The provisioner a claim waits for.
pub const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// The component name of the controller's events.
const COMPONENT: &str = "persistentvolume-controller";

/// What the volume controllers remember between passes: the events already recorded.
#[derive(Default)]
pub(crate) struct State {
    /// (claim uid, reason, message) of every recorded event.
    recorded: Mutex<BTreeSet<(String, String, String)>>,
}

/// Runs the claim and volume controllers until `cancel` fires.
pub(crate) async fn run(
    ctx: Arc<Context>,
    pods: UnboundedReceiver<Seen<Pod>>,
    claims: Vec<UnboundedReceiver<Seen<PersistentVolumeClaim>>>,
    volumes: Vec<UnboundedReceiver<Seen<PersistentVolume>>>,
    classes: Vec<UnboundedReceiver<Seen<StorageClass>>>,
    config: kube::runtime::controller::Config,
    cancel: CancellationToken,
) {
    let (mut claims, mut volumes) = (claims.into_iter(), volumes.into_iter());
    let (Some(claims_a), Some(claims_b), Some(volumes_a), Some(volumes_b), Some(classes)) = (
        claims.next(),
        claims.next(),
        volumes.next(),
        volumes.next(),
        classes.into_iter().next(),
    ) else {
        return;
    };
    let claim_keys = {
        let ctx = ctx.clone();
        let own = UnboundedReceiverStream::new(claims_a).filter_map(|seen| {
            futures::future::ready((!seen.deleted).then(|| ObjectRef::from_obj(&*seen.object)))
        });
        let from_volumes = UnboundedReceiverStream::new(volumes_a).filter_map(|seen| {
            let claim = seen
                .object
                .spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|r| {
                    Some(
                        ObjectRef::<PersistentVolumeClaim>::new(r.name.as_deref()?)
                            .within(r.namespace.as_deref()?),
                    )
                });
            futures::future::ready(claim)
        });
        let from_classes = UnboundedReceiverStream::new(classes).flat_map(move |seen| {
            let class = seen.object.name_any();
            let keys: Vec<_> = ctx
                .claims
                .state()
                .iter()
                .filter(|c| binder::claim_class(c) == class)
                .map(|c| ObjectRef::from_obj(&**c))
                .collect();
            futures::stream::iter(keys)
        });
        // A pod that stops using its claims (deleted, finished) may release their protection.
        let from_pods = UnboundedReceiverStream::new(pods)
            .flat_map(|seen| futures::stream::iter(protection::claims_of(&seen.object)));
        futures::stream::select(
            futures::stream::select(own, from_volumes),
            futures::stream::select(from_classes, from_pods),
        )
        .map(Ok::<_, Infallible>)
    };
    let volume_keys = {
        let own = UnboundedReceiverStream::new(volumes_b).filter_map(|seen| {
            futures::future::ready((!seen.deleted).then(|| ObjectRef::from_obj(&*seen.object)))
        });
        let from_claims = UnboundedReceiverStream::new(claims_b).flat_map(|seen| {
            let claim = &seen.object;
            let mut keys = vec![];
            if let Some(name) = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()) {
                keys.push(ObjectRef::<PersistentVolume>::new(name));
            }
            if let Some(uid) = &claim.metadata.uid {
                keys.push(ObjectRef::new(&provisioner::volume_name(uid)));
            }
            futures::stream::iter(keys)
        });
        futures::stream::select(own, from_claims).map(Ok::<_, Infallible>)
    };
    let claims = kube::runtime::controller::applier(
        |claim, ctx| Box::pin(claim::reconcile(claim, ctx)),
        crate::error_policy,
        ctx.clone(),
        ctx.claims.clone(),
        claim_keys,
        config.clone(),
    );
    let volumes = kube::runtime::controller::applier(
        |volume, ctx| Box::pin(reclaim::reconcile(volume, ctx)),
        crate::error_policy,
        ctx.clone(),
        ctx.volumes.clone(),
        volume_keys,
        config,
    );
    tokio::join!(
        crate::drive(claims, cancel.clone()),
        crate::drive(volumes, cancel)
    );
}

/// Records a core/v1 Event about `claim` once per distinct reason and message; never fails
/// (errors are logged).
pub(crate) async fn record(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    warning: bool,
    reason: &str,
    message: &str,
) {
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let key = (uid, reason.to_owned(), message.to_owned());
    if let Ok(mut recorded) = ctx.volume_state.recorded.lock()
        && !recorded.insert(key)
    {
        return;
    }
    let namespace = claim.namespace().unwrap_or_default();
    let now = crate::now_time();
    let event = Event {
        metadata: ObjectMeta {
            name: Some(format!(
                "{}.{:x}",
                claim.name_any(),
                jiff::Timestamp::now().as_nanosecond()
            )),
            namespace: Some(namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            kind: Some("PersistentVolumeClaim".into()),
            api_version: Some("v1".into()),
            ..claim.object_ref(&())
        },
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        type_: Some(if warning { "Warning" } else { "Normal" }.to_owned()),
        source: Some(EventSource {
            component: Some(COMPONENT.to_owned()),
            host: None,
        }),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        reporting_component: Some(COMPONENT.to_owned()),
        ..Event::default()
    };
    if warning {
        tracing::warn!(claim = %crate::ownership::key(&claim.metadata), reason, message, "claim event");
    } else {
        tracing::info!(claim = %crate::ownership::key(&claim.metadata), reason, message, "claim event");
    }
    let api: Api<Event> = Api::namespaced(ctx.client.clone(), &namespace);
    if let Err(e) = api.create(&PostParams::default(), &event).await {
        tracing::warn!(reason, error = %e, "could not record event");
    }
}

/// Forgets the events of claims no longer known.
pub(crate) fn forget_events(ctx: &Context) {
    let known: BTreeSet<String> = ctx
        .claims
        .state()
        .iter()
        .filter_map(|c| c.metadata.uid.clone())
        .collect();
    if let Ok(mut recorded) = ctx.volume_state.recorded.lock() {
        recorded.retain(|(uid, _, _)| known.contains(uid));
    }
}
