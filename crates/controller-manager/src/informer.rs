//! Shared informers: one watch per kind for the whole controller-manager, a cache (kube-rs
//! reflector store) and a fan-out of every change to the controllers that asked for it.
//!
//! Data flow: `watcher` → `reflect` (the store is updated first) → each subscriber's
//! channel gets a [`Seen`]. A controller maps what it sees to the keys it reconciles, so when
//! its reconcile runs the store already holds the change that triggered it.
//!
//! # Guarantees
//! - A subscriber never sees a change before the store holds it.
//! - Deletions are delivered (with the last known object), so owners of a deleted pod are
//!   woken up.
//!
//! # Caveats
//! - After a re-list (the watch fell behind), an object deleted meanwhile yields no deletion:
//!   its owner is woken only by its other objects' changes (a re-list of the owner kind wakes
//!   every owner).
//! - Channels are unbounded: a controller that stops reading would make them grow; controllers
//!   read them for as long as they run and all end together on cancellation.

use std::fmt::Debug;
use std::sync::Arc;

use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// One change an informer saw.
#[derive(Debug)]
pub(crate) struct Seen<K> {
    /// The object as it is now (or was last, if deleted).
    pub object: Arc<K>,
    /// Whether the object is gone.
    pub deleted: bool,
}

/// The cache of one kind and the receivers of its changes, one per subscriber.
pub(crate) struct Informer<K: Resource<DynamicType = ()> + 'static> {
    pub store: Store<K>,
    pub receivers: Vec<mpsc::UnboundedReceiver<Seen<K>>>,
}

/// Starts watching `api` (all namespaces) for `subscribers` subscribers; the watch ends with
/// `cancel`.
pub(crate) fn spawn<K>(api: Api<K>, subscribers: usize, cancel: CancellationToken) -> Informer<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let (senders, receivers): (Vec<_>, Vec<_>) =
        (0..subscribers).map(|_| mpsc::unbounded_channel()).unzip();
    tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer);
        let mut stream = std::pin::pin!(stream);
        loop {
            let event = tokio::select! {
                () = cancel.cancelled() => return,
                event = stream.next() => event,
            };
            let (object, deleted) = match event {
                None => return,
                Some(Err(e)) => {
                    warn!(kind = %K::kind(&()), error = %e, "watch failed; retrying");
                    continue;
                }
                Some(Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o))) => (o, false),
                Some(Ok(watcher::Event::Delete(o))) => (o, true),
                Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => continue,
            };
            let object = Arc::new(object);
            for tx in &senders {
                let _ = tx.send(Seen {
                    object: Arc::clone(&object),
                    deleted,
                });
            }
        }
    });
    Informer { store, receivers }
}
