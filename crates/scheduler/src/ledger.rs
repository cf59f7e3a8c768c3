//! What the pods on each node request, kept incrementally (kube-scheduler's cache).
//!
//! Data flow: every pod watch event goes through [`Ledger::apply`] / [`Ledger::delete`]
//! (and a re-list through [`Ledger::restart`] … [`Ledger::relisted`]), which parse that one
//! pod's requests and move them between node totals. The scheduling pass reads the totals
//! ([`Ledger::requested`]) instead of summing every pod, so a pass costs what its pending
//! pods cost, not what the whole cluster costs. A pod the scheduler binds is
//! [`Ledger::assume`]d at once, before the watch shows it bound; the watch then confirms it,
//! or [`Ledger::forget`] drops it when the binding failed.
//!
//! # Guarantees
//! - A pod counts once, on one node: the node its latest watch event names, or the node it
//!   was assumed on while the watch still shows it unbound.
//! - A pod that has terminated (`Succeeded`/`Failed`) or is gone counts nowhere.
//! - A pod being deleted still counts until it is gone or terminated, as in kube-scheduler
//!   (its containers may still run).
//!
//! # Assumptions
//! Events of one pod arrive in order (one watch stream), and a pod's uid names it for its
//! whole life.
//!
//! # Caveats
//! An assumption lapses only through the watch (bound, terminated, deleted, or absent from a
//! re-list) or [`Ledger::forget`]; there is no expiry timer. A pod assumed while a re-list is
//! under way and deleted before that list was taken stays counted until the next re-list.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::Pod;

use crate::fit;

/// Requested amounts by resource name, in thousandths (as [`fit::pod_requests`]).
pub type Requests = BTreeMap<String, i128>;

/// How the ledger knows a pod's node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// The scheduler bound it; the watch does not show it bound yet.
    Assumed,
    /// The watch shows it bound.
    Confirmed,
}

#[derive(Clone, Debug)]
struct Entry {
    node: String,
    requests: Requests,
    placement: Placement,
}

/// Per-node requested resources, updated pod by pod (see the module docs).
#[derive(Debug, Default)]
pub struct Ledger {
    pods: HashMap<String, Entry>,
    by_node: BTreeMap<String, Requests>,
    /// During a re-list: the uids it has shown so far.
    relisting: Option<HashSet<String>>,
}

fn uid(pod: &Pod) -> Option<&str> {
    pod.metadata.uid.as_deref().filter(|u| !u.is_empty())
}

fn bound_node(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// Whether the pod has finished and so holds nothing on its node.
pub fn is_terminated(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn add(totals: &mut Requests, requests: &Requests) {
    for (resource, v) in requests {
        *totals.entry(resource.clone()).or_default() += v;
    }
}

fn subtract(totals: &mut Requests, requests: &Requests) {
    for (resource, v) in requests {
        if let Some(total) = totals.get_mut(resource) {
            *total -= v;
            if *total == 0 {
                totals.remove(resource);
            }
        }
    }
}

impl Ledger {
    /// What the counted pods request, by node name (nodes with nothing counted are absent).
    pub fn requested(&self) -> &BTreeMap<String, Requests> {
        &self.by_node
    }

    /// How the pod with `uid` is counted, if it is.
    pub fn placement(&self, uid: &str) -> Option<(&str, Placement)> {
        self.pods.get(uid).map(|e| (e.node.as_str(), e.placement))
    }

    /// Whether the scheduler bound the pod and waits for the watch to show it.
    pub fn is_assumed(&self, uid: &str) -> bool {
        self.placement(uid)
            .is_some_and(|(_, p)| p == Placement::Assumed)
    }

    /// How many pods are counted.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether no pod is counted.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    fn put(&mut self, uid: &str, entry: Entry) {
        self.remove(uid);
        add(
            self.by_node.entry(entry.node.clone()).or_default(),
            &entry.requests,
        );
        self.pods.insert(uid.to_owned(), entry);
    }

    fn remove(&mut self, uid: &str) {
        let Some(old) = self.pods.remove(uid) else {
            return;
        };
        if let Some(totals) = self.by_node.get_mut(&old.node) {
            subtract(totals, &old.requests);
            if totals.is_empty() {
                self.by_node.remove(&old.node);
            }
        }
    }

    /// A pod as the watch shows it now (added, modified, or listed).
    pub fn apply(&mut self, pod: &Pod) {
        let Some(uid) = uid(pod) else { return };
        if let Some(seen) = &mut self.relisting {
            seen.insert(uid.to_owned());
        }
        if is_terminated(pod) {
            self.remove(uid);
            return;
        }
        match bound_node(pod) {
            Some(node) => {
                let requests = fit::pod_requests(pod);
                let unchanged = self.pods.get(uid).is_some_and(|e| {
                    e.placement == Placement::Confirmed && e.node == node && e.requests == requests
                });
                if !unchanged {
                    let node = node.to_owned();
                    self.put(
                        uid,
                        Entry {
                            node,
                            requests,
                            placement: Placement::Confirmed,
                        },
                    );
                }
            }
            // Unbound: an assumption stands until the watch catches up with the binding.
            None if self.is_assumed(uid) => {}
            None => self.remove(uid),
        }
    }

    /// The watch shows the pod deleted.
    pub fn delete(&mut self, pod: &Pod) {
        if let Some(uid) = uid(pod) {
            self.remove(uid);
        }
    }

    /// The scheduler is binding `pod` to `node`: count it there from now on.
    pub fn assume(&mut self, pod: &Pod, node: &str) {
        let Some(uid) = uid(pod) else { return };
        if let Some(seen) = &mut self.relisting {
            seen.insert(uid.to_owned());
        }
        self.put(
            uid,
            Entry {
                node: node.to_owned(),
                requests: fit::pod_requests(pod),
                placement: Placement::Assumed,
            },
        );
    }

    /// Binding the pod with `uid` failed: drop its assumption (a confirmed pod stays).
    pub fn forget(&mut self, uid: &str) {
        if self.is_assumed(uid) {
            self.remove(uid);
        }
    }

    /// The watch starts a re-list: pods it does not show again until [`Ledger::relisted`]
    /// are gone.
    pub fn restart(&mut self) {
        self.relisting = Some(HashSet::new());
    }

    /// The re-list is complete: drop every pod it did not show.
    pub fn relisted(&mut self) {
        let Some(seen) = self.relisting.take() else {
            return;
        };
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|uid| !seen.contains(*uid))
            .cloned()
            .collect();
        for uid in gone {
            self.remove(&uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(uid: &str, node: Option<&str>, phase: &str, memory: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("p-{uid}"), "namespace": "default", "uid": uid},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "c", "image": "x",
                    "resources": {"requests": {"cpu": "100m", "memory": memory}}}]
            },
            "status": {"phase": phase}
        }))
        .expect("pod")
    }

    const MI: i128 = 1024 * 1024 * 1000;

    fn on(ledger: &Ledger, node: &str, resource: &str) -> i128 {
        ledger
            .requested()
            .get(node)
            .and_then(|r| r.get(resource))
            .copied()
            .unwrap_or(0)
    }

    #[test]
    fn a_bound_pod_counts_on_its_node_and_an_unbound_one_nowhere() {
        let mut ledger = Ledger::default();
        ledger.apply(&pod("a", Some("n1"), "Running", "256Mi"));
        ledger.apply(&pod("b", None, "Pending", "256Mi"));
        assert_eq!(on(&ledger, "n1", "memory"), 256 * MI);
        assert_eq!(on(&ledger, "n1", "cpu"), 100);
        assert_eq!(on(&ledger, "n1", "pods"), 1000);
        assert_eq!(ledger.len(), 1);
    }

    #[test]
    fn repeated_events_of_one_pod_count_it_once() {
        let mut ledger = Ledger::default();
        for phase in ["Pending", "Running", "Running"] {
            ledger.apply(&pod("a", Some("n1"), phase, "256Mi"));
        }
        assert_eq!(on(&ledger, "n1", "memory"), 256 * MI);
    }

    #[test]
    fn an_update_of_the_requests_replaces_the_old_amount() {
        let mut ledger = Ledger::default();
        ledger.apply(&pod("a", Some("n1"), "Running", "256Mi"));
        ledger.apply(&pod("a", Some("n1"), "Running", "1Gi"));
        assert_eq!(on(&ledger, "n1", "memory"), 1024 * MI);
    }

    #[test]
    fn a_terminated_pod_frees_its_requests() {
        let mut ledger = Ledger::default();
        ledger.apply(&pod("a", Some("n1"), "Running", "256Mi"));
        ledger.apply(&pod("b", Some("n1"), "Running", "512Mi"));
        ledger.apply(&pod("a", Some("n1"), "Succeeded", "256Mi"));
        assert_eq!(on(&ledger, "n1", "memory"), 512 * MI);
        ledger.apply(&pod("b", Some("n1"), "Failed", "512Mi"));
        assert!(ledger.requested().is_empty());
        assert!(ledger.is_empty());
    }

    #[test]
    fn a_deleted_pod_frees_its_requests_and_a_deleting_one_still_counts() {
        let mut ledger = Ledger::default();
        let mut deleting = pod("a", Some("n1"), "Running", "256Mi");
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
        );
        ledger.apply(&deleting);
        assert_eq!(on(&ledger, "n1", "memory"), 256 * MI);
        ledger.delete(&deleting);
        assert!(ledger.requested().is_empty());
    }

    #[test]
    fn an_assumed_pod_counts_before_the_watch_shows_it_bound() {
        let mut ledger = Ledger::default();
        let pending = pod("a", None, "Pending", "256Mi");
        ledger.apply(&pending);
        ledger.assume(&pending, "n1");
        assert!(ledger.is_assumed("a"));
        assert_eq!(on(&ledger, "n1", "memory"), 256 * MI);
        // A late event from before the binding keeps the assumption.
        ledger.apply(&pending);
        assert_eq!(ledger.placement("a"), Some(("n1", Placement::Assumed)));
        assert_eq!(on(&ledger, "n1", "memory"), 256 * MI);
    }

    #[test]
    fn the_watch_confirms_an_assumption_on_the_node_it_shows() {
        let mut ledger = Ledger::default();
        ledger.assume(&pod("a", None, "Pending", "256Mi"), "n1");
        ledger.apply(&pod("a", Some("n1"), "Pending", "256Mi"));
        assert_eq!(ledger.placement("a"), Some(("n1", Placement::Confirmed)));
        assert_eq!(on(&ledger, "n1", "memory"), 256 * MI);
        // Someone else bound it elsewhere: the watch wins.
        ledger.assume(&pod("b", None, "Pending", "256Mi"), "n1");
        ledger.apply(&pod("b", Some("n2"), "Pending", "256Mi"));
        assert_eq!(on(&ledger, "n1", "memory"), 256 * MI);
        assert_eq!(on(&ledger, "n2", "memory"), 256 * MI);
    }

    #[test]
    fn forgetting_a_failed_binding_frees_the_node_but_not_a_confirmed_pod() {
        let mut ledger = Ledger::default();
        ledger.assume(&pod("a", None, "Pending", "256Mi"), "n1");
        ledger.forget("a");
        assert!(ledger.requested().is_empty());
        ledger.apply(&pod("b", Some("n1"), "Running", "256Mi"));
        ledger.forget("b");
        assert_eq!(on(&ledger, "n1", "memory"), 256 * MI);
    }

    #[test]
    fn an_assumed_pod_that_terminates_or_is_deleted_frees_its_requests() {
        let mut ledger = Ledger::default();
        ledger.assume(&pod("a", None, "Pending", "256Mi"), "n1");
        ledger.apply(&pod("a", None, "Failed", "256Mi"));
        assert!(ledger.requested().is_empty());
        ledger.assume(&pod("b", None, "Pending", "256Mi"), "n1");
        ledger.delete(&pod("b", None, "Pending", "256Mi"));
        assert!(ledger.requested().is_empty());
    }

    #[test]
    fn a_relist_drops_pods_it_no_longer_shows() {
        let mut ledger = Ledger::default();
        ledger.apply(&pod("a", Some("n1"), "Running", "256Mi"));
        ledger.apply(&pod("b", Some("n1"), "Running", "512Mi"));
        ledger.assume(&pod("c", None, "Pending", "1Gi"), "n2");
        ledger.restart();
        ledger.apply(&pod("b", Some("n1"), "Running", "512Mi"));
        // Assumed during the re-list: kept even though the list predates it.
        ledger.assume(&pod("d", None, "Pending", "1Gi"), "n2");
        ledger.relisted();
        assert_eq!(on(&ledger, "n1", "memory"), 512 * MI);
        assert_eq!(on(&ledger, "n2", "memory"), 1024 * MI);
        assert_eq!(ledger.len(), 2);
        assert!(ledger.is_assumed("d"));
    }
}
