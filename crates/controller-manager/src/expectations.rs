//! Expectations (kube's `ControllerExpectations`, by identity rather than by count): what a
//! controller created or deleted and has not seen in its cache yet.
//!
//! Before creating N pods the controller records that it expects N pods it has not seen (and
//! which pods of the owner it has seen); before deleting, the uids it deletes. The informer's
//! subscriber calls [`Expectations::observe`] for every change of a pod the owner controls,
//! before the owner is reconciled: a pod uid not seen before counts as one creation observed;
//! a terminating or vanished pod counts as its deletion observed. While anything is still
//! expected, the owner's reconcile does not create or delete (it would act on a cache that lags
//! its own writes) and computes status only.
//!
//! # Guarantees
//! - No double creation while the cache lags: after deciding to create N pods the controller
//!   creates nothing more for that owner until N new pods have been seen, the failed creations
//!   were given back, or [`TIMEOUT`] passed. The expectation is recorded before the first
//!   request, so a watch event that beats the API server's answer still counts.
//! - A deleted pod counts as observed once the cache shows it terminating or gone.
//!
//! # Caveats
//! Expectations live in memory: after a restart the controller starts from a full cache
//! (the informers are synced before any reconcile), which needs none.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// After this long, outstanding expectations are given up (kube: 5 minutes), so a lost
/// watch event cannot stall an owner for ever.
pub const TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug)]
struct Pending {
    creations: usize,
    known: HashSet<String>,
    deletions: HashSet<String>,
    since: Instant,
}

/// Outstanding creations and deletions per owner key (`namespace/name`).
#[derive(Debug, Default)]
pub struct Expectations {
    by_owner: Mutex<HashMap<String, Pending>>,
}

impl Expectations {
    fn with<R>(&self, f: impl FnOnce(&mut HashMap<String, Pending>) -> R) -> R {
        let mut guard = self
            .by_owner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut guard)
    }

    fn entry<'a>(map: &'a mut HashMap<String, Pending>, key: &str) -> &'a mut Pending {
        map.entry(key.to_owned()).or_insert_with(|| Pending {
            creations: 0,
            known: HashSet::new(),
            deletions: HashSet::new(),
            since: Instant::now(),
        })
    }

    /// Records that the owner `key` is about to create `count` pods; `known` are the uids of
    /// the pods it controls now.
    pub fn expect_creations(
        &self,
        key: &str,
        count: usize,
        known: impl IntoIterator<Item = String>,
    ) {
        self.with(|m| {
            let p = Self::entry(m, key);
            p.creations += count;
            p.known.extend(known);
            p.since = Instant::now();
        });
    }

    /// Records a pod (by uid) the owner `key` deleted.
    pub fn expect_deletion(&self, key: &str, pod_uid: &str) {
        self.with(|m| {
            let p = Self::entry(m, key);
            p.deletions.insert(pod_uid.to_owned());
            p.since = Instant::now();
        });
    }

    /// Gives back a creation that failed (its pod will never show up).
    pub fn creation_failed(&self, key: &str) {
        self.with(|m| {
            if let Some(p) = m.get_mut(key) {
                p.creations = p.creations.saturating_sub(1);
            }
        });
    }

    /// Forgets a deletion that failed.
    pub fn deletion_failed(&self, key: &str, pod_uid: &str) {
        self.with(|m| {
            if let Some(p) = m.get_mut(key) {
                p.deletions.remove(pod_uid);
            }
        });
    }

    /// Notes a change the cache now holds for a pod of owner `key`.
    pub fn observe(&self, key: &str, uid: &str, terminating_or_gone: bool) {
        self.with(|m| {
            if let Some(p) = m.get_mut(key) {
                if p.creations > 0 && p.known.insert(uid.to_owned()) {
                    p.creations -= 1;
                }
                if terminating_or_gone {
                    p.deletions.remove(uid);
                }
                if p.creations == 0 && p.deletions.is_empty() {
                    m.remove(key);
                }
            }
        });
    }

    /// Whether the owner may act: nothing outstanding, or the outstanding items timed out.
    pub fn satisfied(&self, key: &str) -> bool {
        self.with(|m| match m.get(key) {
            None => true,
            Some(p)
                if (p.creations == 0 && p.deletions.is_empty()) || p.since.elapsed() > TIMEOUT =>
            {
                m.remove(key);
                true
            }
            Some(_) => false,
        })
    }

    /// Drops everything about an owner that is gone.
    pub fn forget(&self, key: &str) {
        self.with(|m| {
            m.remove(key);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_waits_until_its_created_pods_are_seen() {
        let e = Expectations::default();
        e.expect_creations("ns/rs", 2, ["old".to_owned()]);
        assert!(!e.satisfied("ns/rs"));
        e.observe("ns/rs", "old", false);
        e.observe("ns/rs", "u1", false);
        e.observe("ns/rs", "u1", false);
        assert!(
            !e.satisfied("ns/rs"),
            "an update of a seen pod is no new pod"
        );
        e.observe("ns/rs", "u2", false);
        assert!(e.satisfied("ns/rs"));
    }

    #[test]
    fn a_deleted_pod_counts_once_it_is_terminating() {
        let e = Expectations::default();
        e.expect_deletion("ns/rs", "u1");
        e.observe("ns/rs", "u1", false);
        assert!(!e.satisfied("ns/rs"));
        e.observe("ns/rs", "u1", true);
        assert!(e.satisfied("ns/rs"));
    }

    #[test]
    fn a_failed_creation_is_not_waited_for() {
        let e = Expectations::default();
        e.expect_creations("ns/rs", 1, []);
        e.creation_failed("ns/rs");
        assert!(e.satisfied("ns/rs"));
    }
}
