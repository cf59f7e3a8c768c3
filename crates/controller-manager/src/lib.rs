//! kube-controller-manager's controllers for the embedded Kubernetes: ReplicaSet, Deployment
//! and DaemonSet, EndpointSlices for Services, PodDisruptionBudget status, and the
//! PersistentVolume binder with a local provisioner, as far as
//! KubeVirt's manifests (virt-api and virt-controller Deployments behind Services, the
//! virt-handler DaemonSet, VM Services, VMI disruption budgets) and their users need. It knows
//! nothing of KubeVirt; on a real cluster kube-controller-manager does this and this crate is
//! not run.
//!
//! Data flow:
//! ```text
//!  watch pods, replicasets, deployments, daemonsets, nodes, controllerrevisions, services,
//!        endpointslices, poddisruptionbudgets, persistentvolumeclaims, persistentvolumes,
//!        storageclasses (informer.rs)
//!        │ cache updated first, then each change fanned out to the controllers
//!        ▼
//!  replicaset.rs   ReplicaSet → pods (create from template / delete surplus, adopt, status)
//!  deployment/     Deployment → ReplicaSets (pod-template-hash, revisions, RollingUpdate /
//!                  Recreate, proportional scaling, history cleanup, status and conditions)
//!  daemonset/      DaemonSet → one pod per eligible node (node-name affinity, tolerations,
//!                  ControllerRevisions, RollingUpdate, status)
//!  endpointslice/  Service with a selector → EndpointSlices of its pods (addresses, ready /
//!                  serving / terminating, ports resolved per pod, grouped by port set)
//!  disruption.rs   PodDisruptionBudget → status (healthy / desired / expected pods,
//!                  disruptionsAllowed, the DisruptionAllowed condition)
//!  volume/         PersistentVolumeClaim ↔ PersistentVolume binding, local volumes made
//!                  for claims of the `kubevirt-rs.io/local` class and deleted with them
//!        │ writes through the API server (pods, replicasets, controllerrevisions,
//!        │ endpointslices, */status)
//!        ▼
//!  the scheduler binds pods, the node agent runs them and reports `Ready`; the service proxy
//!  and the API server's Service routing read the EndpointSlices; the eviction API reads
//!  the PDB status; the API server's garbage collector deletes dependents of deleted owners
//!  (ownerReferences).
//! ```
//! Each controller is a `reconcile` and an `error_policy` on kube-rs' `applier` (one
//! reconcile per object at a time), fed by the shared informers.
//!
//! # Guarantees
//! - No reconcile runs before every cache has its initial list, and a reconcile always sees
//!   the change that triggered it.
//! - Pods are never double-created while the pod cache lags ([`expectations`]).
//! - Status is written only when it changed, with the object's `resourceVersion` (a conflict
//!   means a newer object, which triggers another reconcile).
//!
//! # Caveats
//! - No Events are recorded by the workload controllers (`ScalingReplicaSet`,
//!   `SuccessfulCreate`, `NoPods`, …); the changes are logged at info level instead. The
//!   volume controller records its claim events (`ProvisioningFailed`, …).
//! - The API server does not default the workload kinds; unset fields are read with kube's
//!   defaults (replicas 1, RollingUpdate 25%/25%, revisionHistoryLimit 10,
//!   progressDeadlineSeconds 600, DaemonSet RollingUpdate maxUnavailable 1).

pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod endpointslice;
pub mod expectations;
mod informer;
pub mod ownership;
pub mod pods;
pub mod replicaset;
pub mod volume;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use expectations::Expectations;

/// Settings of the controller-manager.
#[derive(Clone, Debug)]
pub struct Config {
    /// How many objects of one kind are reconciled at once (kube-controller-manager's
    /// `--concurrent-*-syncs`, 5 by default).
    pub concurrency: u16,
    /// Where the local provisioner makes volumes (the default: nowhere, so claims of the
    /// local class stay pending).
    pub local_storage: volume::LocalStorage,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            concurrency: 5,
            local_storage: volume::LocalStorage::default(),
        }
    }
}

/// Errors of a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Adopting or releasing an object failed.
    #[error(transparent)]
    Claim(#[from] ownership::ClaimError),
    /// Creating a pod failed.
    #[error("creating a pod for {owner}")]
    CreatePod {
        owner: String,
        #[source]
        source: kube::Error,
    },
    /// Deleting a pod failed.
    #[error("deleting pod {pod}")]
    DeletePod {
        pod: String,
        #[source]
        source: kube::Error,
    },
    /// Writing an object's status failed.
    #[error("updating the status of {kind} {name}")]
    UpdateStatus {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// Creating a ReplicaSet failed.
    #[error("creating replica set {name}")]
    CreateReplicaSet {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// Updating a ReplicaSet (scale, annotations) failed.
    #[error("updating replica set {name}")]
    UpdateReplicaSet {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// Deleting an old ReplicaSet failed.
    #[error("deleting replica set {name}")]
    DeleteReplicaSet {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// Updating a Deployment's revision annotation failed.
    #[error("updating deployment {name}")]
    UpdateDeployment {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// Creating, updating or deleting a ControllerRevision failed.
    #[error("writing controller revision {name}")]
    WriteRevision {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// Creating, updating or deleting an EndpointSlice failed.
    #[error("writing endpoint slice {name}")]
    WriteEndpointSlice {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// A new ReplicaSet's name is taken by one with another template: the deployment's
    /// `collisionCount` was raised and the next pass uses another hash.
    #[error("hash collision for replica set {name}")]
    HashCollision { name: String },
    /// Writing a PersistentVolume (claimRef, status, create, delete) failed.
    #[error("writing persistent volume {name}")]
    WriteVolume {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// Reading or writing a PersistentVolumeClaim failed.
    #[error("writing persistent volume claim {name}")]
    WriteClaim {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// A local volume's directory could not be made.
    #[error("making a local volume")]
    LocalVolume(#[source] volume::provisioner::PathError),
    /// Encoding an object failed.
    #[error("encoding {what}")]
    Encode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    /// The kube error behind this one, if any.
    fn api_code(&self) -> Option<u16> {
        let source = match self {
            Error::CreatePod { source, .. }
            | Error::DeletePod { source, .. }
            | Error::UpdateStatus { source, .. }
            | Error::CreateReplicaSet { source, .. }
            | Error::UpdateReplicaSet { source, .. }
            | Error::DeleteReplicaSet { source, .. }
            | Error::UpdateDeployment { source, .. }
            | Error::WriteRevision { source, .. }
            | Error::WriteEndpointSlice { source, .. }
            | Error::WriteVolume { source, .. }
            | Error::WriteClaim { source, .. } => source,
            _ => return None,
        };
        match source {
            kube::Error::Api(e) => Some(e.code),
            _ => None,
        }
    }

    /// Retry soon after a conflict or collision (a newer object is on its way), later
    /// otherwise.
    fn retry_after(&self) -> Duration {
        if matches!(self, Error::HashCollision { .. }) || self.api_code() == Some(409) {
            Duration::from_millis(200)
        } else {
            Duration::from_secs(5)
        }
    }
}

/// What every controller reads: the shared caches, the client and the expectations.
pub struct Context {
    pub client: kube::Client,
    pub pods: Store<Pod>,
    pub replica_sets: Store<ReplicaSet>,
    pub deployments: Store<Deployment>,
    pub daemon_sets: Store<DaemonSet>,
    pub nodes: Store<Node>,
    pub revisions: Store<ControllerRevision>,
    pub services: Store<Service>,
    pub endpoint_slices: Store<EndpointSlice>,
    pub budgets: Store<PodDisruptionBudget>,
    pub claims: Store<PersistentVolumeClaim>,
    pub volumes: Store<PersistentVolume>,
    pub classes: Store<StorageClass>,
    /// Where local volumes are made.
    pub local_storage: volume::LocalStorage,
    /// What the volume controllers remember (events recorded).
    pub(crate) volume_state: volume::State,
    /// Pod creations and deletions per owner (`<Kind>/<namespace>/<name>`).
    pub expectations: Expectations,
    /// The EndpointSlice writes the slice cache does not show yet.
    pub(crate) slice_tracker: endpointslice::Tracker,
}

/// The error policy of every controller: log, retry later (the applier's signature takes the
/// object by value).
#[allow(clippy::needless_pass_by_value)]
fn error_policy<K: kube::Resource>(object: Arc<K>, error: &Error, _ctx: Arc<Context>) -> Action {
    let retry = error.retry_after();
    if retry >= Duration::from_secs(1) {
        warn!(
            name = %object.meta().name.as_deref().unwrap_or_default(),
            namespace = %object.meta().namespace.as_deref().unwrap_or_default(),
            error = %error,
            source = ?std::error::Error::source(error).map(ToString::to_string),
            "reconcile failed; retrying"
        );
    }
    Action::requeue(retry)
}

/// The current time, as the controllers compare it with condition times.
fn now() -> jiff::Timestamp {
    jiff::Timestamp::now()
}

/// `metav1.Time` of now, in whole seconds as kube serialises it.
fn now_time() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    let secs = jiff::Timestamp::now().as_second();
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        jiff::Timestamp::from_second(secs).unwrap_or_else(|_| jiff::Timestamp::now()),
    )
}

/// The shared informers of every controller (the numbers are how many controllers read each
/// kind's changes).
struct Informers {
    pods: informer::Informer<Pod>,
    replica_sets: informer::Informer<ReplicaSet>,
    deployments: informer::Informer<Deployment>,
    daemon_sets: informer::Informer<DaemonSet>,
    nodes: informer::Informer<Node>,
    revisions: informer::Informer<ControllerRevision>,
    services: informer::Informer<Service>,
    endpoint_slices: informer::Informer<EndpointSlice>,
    budgets: informer::Informer<PodDisruptionBudget>,
    claims: informer::Informer<PersistentVolumeClaim>,
    volumes: informer::Informer<PersistentVolume>,
    classes: informer::Informer<StorageClass>,
}

impl Informers {
    fn spawn(client: &kube::Client, cancel: &CancellationToken) -> Informers {
        fn all<K>(
            client: &kube::Client,
            n: usize,
            cancel: &CancellationToken,
        ) -> informer::Informer<K>
        where
            K: kube::Resource<DynamicType = ()>
                + Clone
                + std::fmt::Debug
                + serde::de::DeserializeOwned
                + Send
                + Sync
                + 'static,
        {
            informer::spawn(Api::<K>::all(client.clone()), n, cancel.clone())
        }
        Informers {
            pods: all(client, 6, cancel),
            replica_sets: all(client, 2, cancel),
            deployments: all(client, 1, cancel),
            daemon_sets: all(client, 1, cancel),
            nodes: all(client, 1, cancel),
            revisions: all(client, 1, cancel),
            services: all(client, 1, cancel),
            endpoint_slices: all(client, 1, cancel),
            budgets: all(client, 1, cancel),
            claims: all(client, 2, cancel),
            volumes: all(client, 2, cancel),
            classes: all(client, 1, cancel),
        }
    }

    /// The context of every controller: the caches, the client and the settings.
    fn context(&self, client: kube::Client, config: &Config) -> Context {
        Context {
            client,
            pods: self.pods.store.clone(),
            replica_sets: self.replica_sets.store.clone(),
            deployments: self.deployments.store.clone(),
            daemon_sets: self.daemon_sets.store.clone(),
            nodes: self.nodes.store.clone(),
            revisions: self.revisions.store.clone(),
            services: self.services.store.clone(),
            endpoint_slices: self.endpoint_slices.store.clone(),
            budgets: self.budgets.store.clone(),
            claims: self.claims.store.clone(),
            volumes: self.volumes.store.clone(),
            classes: self.classes.store.clone(),
            local_storage: config.local_storage.clone(),
            volume_state: volume::State::default(),
            expectations: Expectations::default(),
            slice_tracker: endpointslice::Tracker::default(),
        }
    }

    /// Waits until every cache holds its initial list.
    async fn synced(&self) -> Result<(), kube::runtime::reflector::store::WriterDropped> {
        self.pods.store.wait_until_ready().await?;
        self.replica_sets.store.wait_until_ready().await?;
        self.deployments.store.wait_until_ready().await?;
        self.daemon_sets.store.wait_until_ready().await?;
        self.nodes.store.wait_until_ready().await?;
        self.revisions.store.wait_until_ready().await?;
        self.services.store.wait_until_ready().await?;
        self.endpoint_slices.store.wait_until_ready().await?;
        self.budgets.store.wait_until_ready().await?;
        self.claims.store.wait_until_ready().await?;
        self.volumes.store.wait_until_ready().await?;
        self.classes.store.wait_until_ready().await
    }
}

/// Runs the ReplicaSet, Deployment, DaemonSet, EndpointSlice, disruption (PDB status) and
/// volume (PV binder, local provisioner) controllers until `cancel` fires.
///
/// Watches pods, ReplicaSets, Deployments, DaemonSets, Nodes, ControllerRevisions, Services,
/// EndpointSlices, PodDisruptionBudgets, claims, volumes and StorageClasses in all
/// namespaces; no reconcile starts before
/// every cache is synced.
pub async fn run(client: kube::Client, config: Config, cancel: CancellationToken) {
    let informers = Informers::spawn(&client, &cancel);
    tokio::select! {
        () = cancel.cancelled() => return,
        ready = informers.synced() => if ready.is_err() { return },
    }
    info!("controller-manager caches synced; starting controllers");
    let ctx = Arc::new(informers.context(client, &config));
    let Informers {
        pods,
        replica_sets,
        deployments,
        daemon_sets,
        nodes,
        revisions,
        services,
        endpoint_slices,
        budgets,
        claims,
        volumes,
        classes,
    } = informers;
    let (Ok([p0, p1, p2, p3, p4, p5]), Ok([r0, r1])) = (
        <[_; 6]>::try_from(pods.receivers),
        <[_; 2]>::try_from(replica_sets.receivers),
    ) else {
        return;
    };
    let (Some(svc), Some(eps), Some(pdb)) = (
        services.receivers.into_iter().next(),
        endpoint_slices.receivers.into_iter().next(),
        budgets.receivers.into_iter().next(),
    ) else {
        return;
    };
    let (Some(d), Some(ds), Some(n), Some(cr)) = (
        deployments.receivers.into_iter().next(),
        daemon_sets.receivers.into_iter().next(),
        nodes.receivers.into_iter().next(),
        revisions.receivers.into_iter().next(),
    ) else {
        return;
    };
    let controller_config =
        kube::runtime::controller::Config::default().concurrency(config.concurrency);
    tokio::join!(
        replicaset::run(
            ctx.clone(),
            r0,
            p0,
            controller_config.clone(),
            cancel.clone()
        ),
        deployment::run(
            ctx.clone(),
            d,
            r1,
            p1,
            controller_config.clone(),
            cancel.clone()
        ),
        daemonset::run(
            ctx.clone(),
            ds,
            p2,
            n,
            cr,
            controller_config.clone(),
            cancel.clone()
        ),
        endpointslice::run(
            ctx.clone(),
            svc,
            eps,
            p3,
            controller_config.clone(),
            cancel.clone()
        ),
        disruption::run(
            ctx.clone(),
            pdb,
            p4,
            controller_config.clone(),
            cancel.clone()
        ),
        volume::run(
            ctx,
            p5,
            claims.receivers,
            volumes.receivers,
            classes.receivers,
            controller_config,
            cancel
        ),
    );
}

/// Drives an applier stream until it ends, logging what it cannot reconcile.
async fn drive<S, T, E>(stream: S, cancel: CancellationToken)
where
    S: futures::Stream<Item = Result<T, E>>,
    E: std::fmt::Display,
{
    use futures::StreamExt;
    let stream = stream.take_until(cancel.cancelled_owned());
    let mut stream = std::pin::pin!(stream);
    while let Some(result) = stream.next().await {
        if let Err(e) = result {
            tracing::debug!(error = %e, "reconcile not run");
        }
    }
}
