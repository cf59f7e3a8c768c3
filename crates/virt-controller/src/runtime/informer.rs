//! Informers: one watch per resource kind, a read cache, and change handlers.
//!
//! Data flow: `kube::runtime::watcher` (list, then watch; re-list and re-watch after errors,
//! paced by kube's default backoff) → [`Informer::run`] applies each event to a reflector
//! [`Store`] → then calls the registered handlers with the [`Change`] (old and new object),
//! which typically add keys to a [`WorkQueue`] (the object's own key, or its owner's).
//!
//! Handlers run after the store is updated, so a reconcile triggered by a change always
//! finds that change (or a newer one) in the cache. After each full (re-)list the handlers
//! see every listed object (`Added` or `Updated`) and a `Deleted` for every cached object the
//! list no longer contains, so no change missed while the watch was down goes unnoticed.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::pin::pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use super::queue::WorkQueue;

/// One change seen by an informer, after it has been applied to the cache.
#[derive(Debug)]
pub enum Change<'a, K> {
    /// An object appeared (watch event, or listed for the first time).
    Added(&'a K),
    /// An object changed, or was listed again after a re-list.
    Updated {
        /// The cached object before the change.
        old: &'a K,
        /// The object now in the cache.
        new: &'a K,
    },
    /// An object disappeared (watch event, or missing from a re-list): its last known state.
    Deleted(&'a K),
}

impl<K> Change<'_, K> {
    /// The object as it is now, or its last state if it was deleted.
    pub fn object(&self) -> &K {
        match self {
            Change::Added(obj) | Change::Deleted(obj) => obj,
            Change::Updated { new, .. } => new,
        }
    }
}

type Handler<K> = Box<dyn Fn(&Change<'_, K>) + Send + Sync>;

/// The informer stopped before its first complete list.
#[derive(Debug, thiserror::Error)]
#[error("informer stopped before it synced")]
pub struct InformerStopped;

/// Read access to a running informer: its cache and its sync state. Cheap to clone.
pub struct InformerHandle<K: Resource + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    store: Store<K>,
    synced: watch::Receiver<bool>,
}

impl<K: Resource + 'static> Clone for InformerHandle<K>
where
    K::DynamicType: Eq + Hash + Clone,
{
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            synced: self.synced.clone(),
        }
    }
}

impl<K: Resource + Clone + 'static> InformerHandle<K>
where
    K::DynamicType: Eq + Hash + Clone + Default,
{
    /// The cache. Empty until the first list completed.
    pub fn store(&self) -> &Store<K> {
        &self.store
    }

    /// The cached object `name` in `namespace` (`None` for cluster-scoped kinds).
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        let mut obj_ref = ObjectRef::new(name);
        if let Some(ns) = namespace {
            obj_ref = obj_ref.within(ns);
        }
        self.store.get(&obj_ref)
    }

    /// The cached object with key `namespace/name` (or `name`).
    pub fn get_by_key(&self, key: &str) -> Option<Arc<K>> {
        let (namespace, name) = super::split_key(key);
        self.get(namespace, name)
    }

    /// Whether the first complete list has reached the cache and the handlers.
    pub fn has_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Waits until the first complete list has reached the cache and the handlers.
    pub async fn wait_for_sync(&self) -> Result<(), InformerStopped> {
        let mut synced = self.synced.clone();
        synced
            .wait_for(|synced| *synced)
            .await
            .map(|_| ())
            .map_err(|_| InformerStopped)
    }
}

/// A watch of one resource kind feeding a cache and change handlers.
///
/// Register handlers with [`on_change`](Self::on_change) or [`enqueue`](Self::enqueue),
/// take [`handle`](Self::handle)s for reading, then spawn [`run`](Self::run).
///
/// # Guarantees
/// - Handlers are called one at a time, in event order, after the cache reflects the event.
/// - [`InformerHandle::wait_for_sync`] returns only after the first list is in the cache and
///   every listed object has been passed to the handlers.
///
/// # Assumptions
/// - Handlers are quick and do not block (they add keys to queues); they run on the
///   informer's task.
///
/// # Caveats
/// - Between a lost watch and the end of the next re-list the cache may be stale; that is
///   the nature of informers, and why controllers use expectations.
pub struct Informer<K: Resource + Clone + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    writer: Writer<K>,
    handlers: Vec<Handler<K>>,
    synced: watch::Sender<bool>,
    handle: InformerHandle<K>,
}

impl<K> Default for Informer<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<K> Informer<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    /// An informer with an empty cache and no handlers.
    pub fn new() -> Self {
        let writer = Writer::default();
        let (synced, synced_rx) = watch::channel(false);
        let handle = InformerHandle {
            store: writer.as_reader(),
            synced: synced_rx,
        };
        Self {
            writer,
            handlers: Vec::new(),
            synced,
            handle,
        }
    }

    /// A handle to read the cache and wait for the first sync.
    pub fn handle(&self) -> InformerHandle<K> {
        self.handle.clone()
    }

    /// Calls `handler` for every change.
    pub fn on_change(&mut self, handler: impl Fn(&Change<'_, K>) + Send + Sync + 'static) {
        self.handlers.push(Box::new(handler));
    }

    /// Adds to `queue` the keys `keys_of` returns for the changed object; for an update,
    /// the keys of both the old and the new object (so that, say, a pod moving from one owner
    /// to another wakes both owners).
    pub fn enqueue<I>(
        &mut self,
        queue: WorkQueue<String>,
        keys_of: impl Fn(&K) -> I + Send + Sync + 'static,
    ) where
        I: IntoIterator<Item = String>,
    {
        self.on_change(move |change| match change {
            Change::Added(obj) | Change::Deleted(obj) => {
                keys_of(obj).into_iter().for_each(|k| queue.add(k))
            }
            Change::Updated { old, new } => {
                for key in keys_of(old).into_iter().chain(keys_of(new)) {
                    queue.add(key);
                }
            }
        });
    }

    /// Watches `api` with `config` until the returned future is dropped, restarting the
    /// watch with kube's default backoff after errors.
    pub async fn run(self, api: Api<K>, config: watcher::Config) {
        let stream = watcher(api, config).default_backoff();
        self.run_stream(stream).await;
    }

    /// Feeds the informer from any watcher-like event stream (used by [`run`](Self::run) and
    /// by tests). Returns when the stream ends.
    pub async fn run_stream<S>(mut self, stream: S)
    where
        S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    {
        let mut stream = pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => self.apply(&event),
                Err(error) => tracing::warn!(
                    kind = %K::kind(&K::DynamicType::default()),
                    %error,
                    "watch failed; it is restarted after a backoff"
                ),
            }
        }
    }

    fn dispatch(&self, change: &Change<'_, K>) {
        for handler in &self.handlers {
            handler(change);
        }
    }

    fn apply(&mut self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Apply(obj) => {
                let old = self.handle.store.get(&ObjectRef::from_obj(obj));
                self.writer.apply_watcher_event(event);
                match old {
                    Some(old) => self.dispatch(&Change::Updated {
                        old: &old,
                        new: obj,
                    }),
                    None => self.dispatch(&Change::Added(obj)),
                }
            }
            watcher::Event::Delete(obj) => {
                self.writer.apply_watcher_event(event);
                self.dispatch(&Change::Deleted(obj));
            }
            watcher::Event::Init | watcher::Event::InitApply(_) => {
                self.writer.apply_watcher_event(event);
            }
            watcher::Event::InitDone => {
                let mut before: HashMap<ObjectRef<K>, Arc<K>> = self
                    .handle
                    .store
                    .state()
                    .into_iter()
                    .map(|obj| (ObjectRef::from_obj(obj.as_ref()), obj))
                    .collect();
                self.writer.apply_watcher_event(event);
                for new in self.handle.store.state() {
                    match before.remove(&ObjectRef::from_obj(new.as_ref())) {
                        Some(old) => self.dispatch(&Change::Updated {
                            old: &old,
                            new: &new,
                        }),
                        None => self.dispatch(&Change::Added(&new)),
                    }
                }
                for gone in before.into_values() {
                    self.dispatch(&Change::Deleted(&gone));
                }
                self.synced.send_replace(true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::api::ObjectMeta;
    use std::sync::Mutex;

    fn pod(name: &str, rv: &str, owner: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                resource_version: Some(rv.into()),
                owner_references: owner.map(|o| {
                    vec![OwnerReference {
                        name: o.into(),
                        kind: "VirtualMachineInstance".into(),
                        controller: Some(true),
                        ..OwnerReference::default()
                    }]
                }),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn describe(change: &Change<'_, Pod>) -> String {
        let name = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
        let rv = |p: &Pod| p.metadata.resource_version.clone().unwrap_or_default();
        match change {
            Change::Added(p) => format!("added {}@{}", name(p), rv(p)),
            Change::Updated { old, new } => {
                format!("updated {} {}->{}", name(new), rv(old), rv(new))
            }
            Change::Deleted(p) => format!("deleted {}@{}", name(p), rv(p)),
        }
    }

    type Log = Arc<Mutex<Vec<String>>>;

    /// An informer whose handler logs every change; events are applied directly with
    /// `apply`, so every assertion sees a settled state.
    fn logging_informer() -> (Informer<Pod>, InformerHandle<Pod>, Log) {
        let mut informer = Informer::<Pod>::new();
        let log = Arc::new(Mutex::new(Vec::new()));
        {
            let log = Arc::clone(&log);
            informer.on_change(move |change| {
                if let Ok(mut log) = log.lock() {
                    log.push(describe(change));
                }
            });
        }
        let handle = informer.handle();
        (informer, handle, log)
    }

    fn take(log: &Mutex<Vec<String>>) -> Vec<String> {
        log.lock()
            .map(|mut l| std::mem::take(&mut *l))
            .unwrap_or_default()
    }

    #[tokio::test]
    async fn the_first_list_fills_the_cache_before_sync_is_reported() {
        let (mut informer, handle, log) = logging_informer();
        informer.apply(&watcher::Event::Init);
        informer.apply(&watcher::Event::InitApply(pod("a", "1", None)));
        assert!(!handle.has_synced());
        assert!(
            handle.get(Some("default"), "a").is_none(),
            "not visible before InitDone"
        );
        assert!(take(&log).is_empty());
        informer.apply(&watcher::Event::InitApply(pod("b", "2", None)));
        informer.apply(&watcher::Event::InitDone);
        assert!(handle.has_synced());
        assert!(handle.wait_for_sync().await.is_ok());
        assert_eq!(handle.store().len(), 2);
        let mut seen = take(&log);
        seen.sort();
        assert_eq!(seen, ["added a@1", "added b@2"]);
    }

    #[test]
    fn watch_events_update_the_cache_then_reach_the_handlers_with_the_old_object() {
        let (mut informer, handle, log) = logging_informer();
        informer.apply(&watcher::Event::Init);
        informer.apply(&watcher::Event::InitDone);
        informer.apply(&watcher::Event::Apply(pod("a", "1", None)));
        informer.apply(&watcher::Event::Apply(pod("a", "2", None)));
        let cached = handle.get_by_key("default/a");
        assert_eq!(
            cached.and_then(|p| p.metadata.resource_version.clone()),
            Some("2".to_owned())
        );
        informer.apply(&watcher::Event::Delete(pod("a", "3", None)));
        assert!(handle.get_by_key("default/a").is_none());
        assert_eq!(take(&log), ["added a@1", "updated a 1->2", "deleted a@3"]);
    }

    #[tokio::test]
    async fn a_relist_after_a_watch_error_reports_objects_deleted_meanwhile() {
        let (informer, handle, log) = logging_informer();
        let events = vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(pod("a", "1", None))),
            Ok(watcher::Event::InitApply(pod("b", "2", None))),
            Ok(watcher::Event::InitDone),
            // The watch breaks; the watcher re-lists and b is gone.
            Err(watcher::Error::NoResourceVersion),
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(pod("a", "5", None))),
            Ok(watcher::Event::InitDone),
        ];
        informer.run_stream(futures::stream::iter(events)).await;
        let seen = take(&log);
        let (first_list, relist) = seen.split_at(2);
        let mut first_list = first_list.to_vec();
        first_list.sort();
        assert_eq!(first_list, ["added a@1", "added b@2"]);
        assert_eq!(relist, ["updated a 1->5", "deleted b@2"]);
        assert_eq!(handle.store().len(), 1);
    }

    #[tokio::test]
    async fn enqueue_adds_the_owner_key_of_old_and_new_objects() {
        let queue = WorkQueue::new("vmi");
        let mut informer = Informer::<Pod>::new();
        informer.enqueue(queue.clone(), |pod: &Pod| {
            let ns = pod.metadata.namespace.clone().unwrap_or_default();
            pod.metadata
                .owner_references
                .iter()
                .flatten()
                .filter(|o| o.controller == Some(true))
                .map(|o| format!("{ns}/{}", o.name))
                .collect::<Vec<_>>()
        });
        informer.apply(&watcher::Event::Init);
        informer.apply(&watcher::Event::InitApply(pod(
            "virt-launcher-x",
            "1",
            Some("vmi-a"),
        )));
        informer.apply(&watcher::Event::InitDone);
        assert_eq!(queue.get().await.as_deref(), Some("default/vmi-a"));
        queue.done(&"default/vmi-a".to_owned());

        informer.apply(&watcher::Event::Apply(pod(
            "virt-launcher-x",
            "2",
            Some("vmi-b"),
        )));
        informer.apply(&watcher::Event::Apply(pod("orphan", "3", None)));
        let mut keys = vec![queue.get().await, queue.get().await];
        keys.sort();
        assert_eq!(
            keys,
            [
                Some("default/vmi-a".to_owned()),
                Some("default/vmi-b".to_owned())
            ]
        );
        assert!(queue.is_empty());
    }

    #[tokio::test]
    async fn wait_for_sync_fails_when_the_informer_stops_before_syncing() {
        let (informer, handle, _log) = logging_informer();
        informer
            .run_stream(futures::stream::iter(vec![Ok(watcher::Event::Init)]))
            .await;
        assert!(!handle.has_synced());
        assert!(handle.wait_for_sync().await.is_err());
    }
}
