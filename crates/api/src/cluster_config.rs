//! The KubeVirt CR as every component reads it: one watch, each component's own parsed view.
//!
//! Users configure a running installation through the `KubeVirt` CR (`spec.configuration`,
//! `spec.customizeComponents.flags`). virt-controller, virt-api and virt-handler each need a
//! different part of it, parsed their own way, and all of them must see a change without a
//! restart. [`subscribe`] starts one watch of the CR and publishes `parse(current CR)` on a
//! `tokio::sync::watch` channel; [`ClusterConfigWatch`] is the subscriber's handle: the current
//! value without an API call ([`ClusterConfigWatch::current`]) and a receiver to await changes.
//!
//! Data flow: `watcher(Api<KubeVirt>)` → the CRs seen, by name → `parse(first by name)` →
//! `watch::Sender::send_if_modified` → every clone of the handle.
//!
//! # Guarantees
//! - Subscribers see the defaults (`parse(None)`) until the first list completes, then the
//!   parsed CR; a value is published only when it differs from the last one.
//! - With several CRs in scope the first by name counts (upstream allows one per cluster).
//! - The watch task ends when every handle is dropped.
//!
//! # Caveats
//! - Watch errors are retried with the watcher's back-off; meanwhile subscribers keep the last
//!   value they saw.

use std::collections::BTreeMap;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::v1::KubeVirt;

/// A subscriber's handle on the parsed KubeVirt CR.
#[derive(Clone, Debug)]
pub struct ClusterConfigWatch<T> {
    rx: watch::Receiver<T>,
}

impl<T: Clone> ClusterConfigWatch<T> {
    /// A handle that always holds `value` (tests, and components run without a CR watch).
    pub fn fixed(value: T) -> Self {
        let (_tx, rx) = watch::channel(value);
        ClusterConfigWatch { rx }
    }

    /// The configuration in effect now (cached; no API call).
    pub fn current(&self) -> T {
        self.rx.borrow().clone()
    }

    /// A receiver to await changes with (`changed()`), for components that react to them.
    pub fn receiver(&self) -> watch::Receiver<T> {
        self.rx.clone()
    }
}

/// Watches the KubeVirt CRs `api` sees (one namespace, or all) and publishes `parse` of the
/// first one by name; see the module documentation. Must be called on a tokio runtime.
pub fn subscribe<T, F>(api: Api<KubeVirt>, parse: F) -> ClusterConfigWatch<T>
where
    T: PartialEq + Send + Sync + std::fmt::Debug + 'static,
    F: Fn(Option<&KubeVirt>) -> T + Send + 'static,
{
    let (tx, rx) = watch::channel(parse(None));
    tokio::spawn(async move {
        tokio::select! {
            () = follow(api, parse, &tx) => {}
            () = tx.closed() => {}
        }
    });
    ClusterConfigWatch { rx }
}

/// Follows the CRs until the watch stream ends, publishing each change of the parsed value.
async fn follow<T, F>(api: Api<KubeVirt>, parse: F, tx: &watch::Sender<T>)
where
    T: PartialEq + std::fmt::Debug,
    F: Fn(Option<&KubeVirt>) -> T,
{
    let mut current: BTreeMap<String, KubeVirt> = BTreeMap::new();
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = events.next().await {
        match event {
            // Between `Init` and `InitDone` the watcher relists: publish the complete list only.
            Ok(watcher::Event::Init) => {
                current.clear();
                continue;
            }
            Ok(watcher::Event::InitApply(kv)) => {
                current.insert(kv.metadata.name.clone().unwrap_or_default(), kv);
                continue;
            }
            Ok(watcher::Event::InitDone) => {}
            Ok(watcher::Event::Apply(kv)) => {
                current.insert(kv.metadata.name.clone().unwrap_or_default(), kv);
            }
            Ok(watcher::Event::Delete(kv)) => {
                current.remove(kv.metadata.name.as_deref().unwrap_or_default());
            }
            Err(e) => {
                warn!(error = %e, "watching the KubeVirt CR failed; retrying");
                continue;
            }
        }
        let next = parse(current.values().next());
        tx.send_if_modified(|old| {
            if *old == next {
                return false;
            }
            info!(config = ?next, "cluster configuration changed");
            *old = next;
            true
        });
    }
}
