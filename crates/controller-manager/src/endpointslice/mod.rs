//! The EndpointSlice controller (kube's `pkg/controller/endpointslice`): keeps, for every
//! Service with a selector, EndpointSlices listing the pods it selects, which the service
//! proxy and the API server's Service routing read.
//!
//! Data flow: Service, EndpointSlice and pod changes → Service keys (a slice wakes the Service
//! its `kubernetes.io/service-name` label names; a pod wakes the Services of its namespace
//! whose selector matches it and those whose slices list it) → `reconcile`: unless the cache
//! still lags this controller's own writes ([`Tracker`]), compute the desired slices from the
//! cached pods ([`desired`]) and create, update or delete slices until they match.
//!
//! # Guarantees
//! - Slices are written only when their endpoints, ports or labels differ; updates carry the
//!   slice's `resourceVersion`, so a conflict means a newer slice (and another reconcile).
//! - No reconcile acts on a cache that does not yet hold the slices it created, updated or
//!   deleted, so slices are not created twice.
//! - A Service that lost its selector loses its managed slices; a deleted Service's slices are
//!   removed by the API server's garbage collector (owner reference).
//!
//! # Caveats
//! - Services without a selector (and `ExternalName` ones) get no slices; the slices this
//!   controller made for them earlier are deleted (kube leaves them). `default/kubernetes` is
//!   left alone: the API server keeps its slice.
//! - A pod whose node is not in the cache is left out and the Service is looked at again
//!   a few seconds later (a node's arrival wakes nothing).
//! - No topology hints, trafficDistribution or EndpointSlice mirroring.

pub mod desired;

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::informer::Seen;
use crate::{Context, Error, ownership};
use desired::{CONTROLLER_NAME, LABEL_MANAGED_BY, LABEL_SERVICE_NAME};

/// How long to wait before looking again at a Service whose slices lag in the cache, or
/// that selects a pod on an unknown node (its own events usually come first).
const RECHECK: Duration = Duration::from_secs(2);

/// What the cache must show of a slice this controller wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Written {
    /// At least this `resourceVersion` (a create or update).
    AtLeast(String),
    /// Gone.
    Deleted,
}

/// The slices each Service's last reconcile wrote, until the cache shows them (kube's
/// `EndpointSliceTracker`).
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    written: Mutex<HashMap<String, HashMap<String, Written>>>,
}

impl Tracker {
    fn record(&self, service: &str, slice: String, written: Written) {
        if let Ok(mut map) = self.written.lock() {
            map.entry(service.to_owned())
                .or_default()
                .insert(slice, written);
        }
    }

    fn forget(&self, service: &str) {
        if let Ok(mut map) = self.written.lock() {
            map.remove(service);
        }
    }

    /// Whether `cached` (the Service's slices in the cache) shows every write; clears what
    /// it shows.
    fn caught_up(&self, service: &str, cached: &[Arc<EndpointSlice>]) -> bool {
        let Ok(mut map) = self.written.lock() else {
            return true;
        };
        let Some(writes) = map.get_mut(service) else {
            return true;
        };
        writes.retain(|name, written| {
            let seen = cached
                .iter()
                .find(|s| s.metadata.name.as_ref() == Some(name));
            let shown = match (written, seen) {
                (Written::Deleted, seen) => seen.is_none(),
                (Written::AtLeast(_), None) => false,
                (Written::AtLeast(rv), Some(s)) => {
                    let cached_rv = s.resource_version().unwrap_or_default();
                    match (cached_rv.parse::<u64>(), rv.parse::<u64>()) {
                        (Ok(c), Ok(w)) => c >= w,
                        _ => cached_rv == *rv,
                    }
                }
            };
            !shown
        });
        let done = writes.is_empty();
        if done {
            map.remove(service);
        }
        done
    }
}

/// Runs the controller until `cancel` fires.
pub(crate) async fn run(
    ctx: Arc<Context>,
    services: UnboundedReceiver<Seen<Service>>,
    slices: UnboundedReceiver<Seen<EndpointSlice>>,
    pods: UnboundedReceiver<Seen<Pod>>,
    config: kube::runtime::controller::Config,
    cancel: CancellationToken,
) {
    let own = {
        let ctx = ctx.clone();
        UnboundedReceiverStream::new(services).filter_map(move |seen| {
            let out = if seen.deleted {
                ctx.slice_tracker
                    .forget(&ownership::key(&seen.object.metadata));
                None
            } else {
                Some(ObjectRef::from_obj(&*seen.object))
            };
            futures::future::ready(out)
        })
    };
    let from_slices = UnboundedReceiverStream::new(slices)
        .filter_map(|seen| futures::future::ready(service_of_slice(&seen.object)));
    let from_pods = {
        let ctx = ctx.clone();
        UnboundedReceiverStream::new(pods)
            .flat_map(move |seen| futures::stream::iter(services_of_pod(&ctx, &seen.object)))
    };
    let queue = futures::stream::select(own, futures::stream::select(from_slices, from_pods))
        .map(Ok::<_, Infallible>);
    let stream = kube::runtime::controller::applier(
        |svc, ctx| Box::pin(reconcile(svc, ctx)),
        crate::error_policy,
        ctx.clone(),
        ctx.services.clone(),
        queue,
        config,
    );
    crate::drive(stream, cancel).await;
}

/// Whether this controller manages `slice`; the Service it belongs to.
fn service_of_slice(slice: &EndpointSlice) -> Option<ObjectRef<Service>> {
    let labels = slice.labels();
    if labels.get(LABEL_MANAGED_BY).map(String::as_str) != Some(CONTROLLER_NAME) {
        return None;
    }
    let name = labels.get(LABEL_SERVICE_NAME)?;
    Some(ObjectRef::new(name).within(&slice.namespace().unwrap_or_default()))
}

/// The Services a pod change concerns: those of its namespace that select it now, and those
/// whose slices list it (it may have stopped matching, or be gone).
fn services_of_pod(ctx: &Context, pod: &Pod) -> Vec<ObjectRef<Service>> {
    let namespace = pod.namespace().unwrap_or_default();
    let mut keys: BTreeSet<String> = ctx
        .services
        .state()
        .iter()
        .filter(|s| s.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|s| selector(s).is_some_and(|sel| selects(sel, pod)))
        .map(|s| s.name_any())
        .collect();
    let name = pod.metadata.name.as_deref();
    for slice in ctx.endpoint_slices.state() {
        if slice.namespace().as_deref() != Some(namespace.as_str()) {
            continue;
        }
        let lists_pod = slice
            .endpoints
            .iter()
            .any(|e| e.target_ref.as_ref().and_then(|r| r.name.as_deref()) == name);
        if let (true, Some(svc)) = (lists_pod, service_of_slice(&slice)) {
            keys.insert(svc.name);
        }
    }
    keys.into_iter()
        .map(|name| ObjectRef::new(&name).within(&namespace))
        .collect()
}

/// A Service's selector, if it has a non-empty one and is not an `ExternalName` Service
/// (those get no endpoints, as in kube).
fn selector(service: &Service) -> Option<&std::collections::BTreeMap<String, String>> {
    let spec = service.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") {
        return None;
    }
    spec.selector.as_ref().filter(|s| !s.is_empty())
}

/// Whether a Service selector selects `pod`.
fn selects(selector: &std::collections::BTreeMap<String, String>, pod: &Pod) -> bool {
    let labels = pod.labels();
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// One pass over a Service: bring its managed slices in line with the pods it selects.
async fn reconcile(service: Arc<Service>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = service.namespace().unwrap_or_default();
    let name = service.name_any();
    if (namespace == "default" && name == "kubernetes")
        || service.metadata.deletion_timestamp.is_some()
    {
        return Ok(Action::await_change());
    }
    let key = ownership::key(&service.metadata);
    let existing: Vec<Arc<EndpointSlice>> = ctx
        .endpoint_slices
        .state()
        .into_iter()
        .filter(|s| s.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|s| service_of_slice(s).is_some_and(|r| r.name == name))
        .collect();
    if !ctx.slice_tracker.caught_up(&key, &existing) {
        debug!(service = %key, "endpoint slice cache lags this controller's writes");
        return Ok(Action::requeue(RECHECK));
    }
    let (plan, node_missing) = match selector(&service) {
        None => (
            desired::Plan {
                delete: existing,
                ..desired::Plan::default()
            },
            false,
        ),
        Some(sel) => {
            let selected: Vec<Arc<Pod>> = ctx
                .pods
                .state()
                .into_iter()
                .filter(|p| p.namespace().as_deref() == Some(namespace.as_str()))
                .filter(|p| selects(sel, p))
                .collect();
            let node = |n: &str| ctx.nodes.get(&ObjectRef::<Node>::new(n));
            let want = desired::desired_groups(&service, &selected, &node);
            let missing = want.node_missing;
            (desired::plan(&service, want, &existing), missing)
        }
    };
    if !plan.is_empty() {
        info!(
            service = %key,
            create = plan.create.len(),
            update = plan.update.len(),
            delete = plan.delete.len(),
            "syncing endpoint slices"
        );
    }
    write(&ctx, &key, &namespace, plan).await?;
    Ok(if node_missing {
        Action::requeue(RECHECK)
    } else {
        Action::await_change()
    })
}

/// Carries out a plan (creations first and deletions last, so endpoints do not vanish in
/// between), recording each write for the [`Tracker`]; stops at the first error.
async fn write(
    ctx: &Context,
    key: &str,
    namespace: &str,
    plan: desired::Plan,
) -> Result<(), Error> {
    let api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), namespace);
    let failed = |name: String| move |source| Error::WriteEndpointSlice { name, source };
    for slice in plan.create {
        let created = api
            .create(&PostParams::default(), &slice)
            .await
            .map_err(failed(key.to_owned()))?;
        let rv = created.resource_version().unwrap_or_default();
        ctx.slice_tracker
            .record(key, created.name_any(), Written::AtLeast(rv));
    }
    for slice in plan.update {
        let name = slice.name_any();
        let updated = api
            .replace(&name, &PostParams::default(), &slice)
            .await
            .map_err(failed(name.clone()))?;
        let rv = updated.resource_version().unwrap_or_default();
        ctx.slice_tracker.record(key, name, Written::AtLeast(rv));
    }
    for slice in plan.delete {
        let name = slice.name_any();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: slice.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(source) => return Err(failed(name)(source)),
        }
        ctx.slice_tracker.record(key, name, Written::Deleted);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(name: &str, rv: &str) -> Arc<EndpointSlice> {
        let mut s = EndpointSlice::default();
        s.metadata.name = Some(name.into());
        s.metadata.resource_version = Some(rv.into());
        Arc::new(s)
    }

    #[test]
    fn the_tracker_waits_until_the_cache_shows_every_write() {
        let tracker = Tracker::default();
        assert!(tracker.caught_up("ns/web", &[]), "nothing written");
        tracker.record("ns/web", "web-a".into(), Written::AtLeast("7".into()));
        tracker.record("ns/web", "web-b".into(), Written::Deleted);
        let b = slice("web-b", "3");
        assert!(
            !tracker.caught_up("ns/web", &[Arc::clone(&b)]),
            "nothing shown yet"
        );
        assert!(
            !tracker.caught_up("ns/web", &[slice("web-a", "6"), Arc::clone(&b)]),
            "an older web-a, web-b still there"
        );
        assert!(
            !tracker.caught_up("ns/web", &[slice("web-a", "6")]),
            "web-b gone, web-a still older"
        );
        assert!(tracker.caught_up("ns/web", &[slice("web-a", "8")]));
        assert!(
            tracker.caught_up("ns/web", &[]),
            "shown writes are forgotten"
        );
    }
}
