//! Controller expectations: creations and deletions a controller has asked for but not yet
//! seen in its informer cache.
//!
//! A controller that creates a pod and then reconciles again before the pod's watch event
//! arrives would otherwise see "no pod" in its cache and create a second one. So before each
//! create (delete) it raises an expectation for its key; the informer's event handler lowers
//! it when the event arrives; and `reconcile` only acts while the key is
//! [`satisfied`](Expectations::satisfied). If the API call fails, the controller lowers the
//! expectation itself, as the event will never come.
//!
//! Semantics as upstream (`pkg/controller/expectations.go`):
//! - a key without a record is satisfied;
//! - a record is satisfied when both counters are ≤ 0, or when it is older than the
//!   [`EXPECTATIONS_TIMEOUT`] of five minutes (strictly), so a lost event cannot wedge a key;
//! - setting expectations replaces the record and restarts its clock; observing without a
//!   record does nothing; counters may go negative;
//! - deletions are tracked by object key (for example `namespace/name` of a pod), and only an
//!   observed deletion of an expected key lowers the count.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// After this long without being fulfilled, a record counts as satisfied.
pub const EXPECTATIONS_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// Pending creations and deletions of one controller key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pending {
    /// Creations not yet observed.
    pub add: i64,
    /// Deletions not yet observed.
    pub del: i64,
}

#[derive(Debug)]
struct Record {
    add: i64,
    del: i64,
    set_at: Instant,
}

#[derive(Debug, Default)]
struct State {
    records: HashMap<String, Record>,
    /// Object keys whose deletion a controller key expects.
    deletions: HashMap<String, HashSet<String>>,
}

/// UID-tracking controller expectations.
///
/// # Guarantees
/// - Every method is atomic with respect to the others: a `satisfied` call never sees half of
///   an `expect_*` or `*_observed`.
/// - Between `expect_creations(k, n)` and the n-th `creation_observed(k)` (or
///   [`EXPECTATIONS_TIMEOUT`]), `satisfied(k)` is false for every caller.
///
/// # Assumptions
/// - Expectations are raised *before* the API call they cover, so the watch event that lowers
///   them cannot arrive first.
/// - Time comes from tokio's clock; tests may pause it.
///
/// # Caveats
/// - Expectations live in memory only: after a restart every key is satisfied, which is safe
///   because the informers then list the whole state before workers start.
#[derive(Debug)]
pub struct Expectations {
    ttl: Duration,
    state: Mutex<State>,
}

impl Default for Expectations {
    fn default() -> Self {
        Self::new()
    }
}

impl Expectations {
    /// Expectations with upstream's five-minute timeout.
    pub fn new() -> Self {
        Self::with_timeout(EXPECTATIONS_TIMEOUT)
    }

    /// Expectations whose records expire after `ttl`.
    pub fn with_timeout(ttl: Duration) -> Self {
        Self {
            ttl,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update is a single map operation, so a poisoned lock holds consistent data.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `key` may act: no record, nothing pending, or the record has expired.
    pub fn satisfied(&self, key: &str) -> bool {
        let state = self.lock();
        match state.records.get(key) {
            None => true,
            Some(r) => (r.add <= 0 && r.del <= 0) || r.set_at.elapsed() > self.ttl,
        }
    }

    /// The counters of `key`, if it has a record.
    pub fn pending(&self, key: &str) -> Option<Pending> {
        self.lock().records.get(key).map(|r| Pending {
            add: r.add,
            del: r.del,
        })
    }

    /// Replaces the record of `key` with `add` creations and `del` deletions and restarts
    /// its clock.
    pub fn set_expectations(&self, key: &str, add: i64, del: i64) {
        self.lock().records.insert(
            key.to_owned(),
            Record {
                add,
                del,
                set_at: Instant::now(),
            },
        );
    }

    /// Expects `n` creations for `key` (replacing any previous record).
    pub fn expect_creations(&self, key: &str, n: i64) {
        self.set_expectations(key, n, 0);
    }

    /// Expects the deletion of each object in `object_keys` for `key` (replacing any previous
    /// record and set).
    pub fn expect_deletions(&self, key: &str, object_keys: &[String]) {
        let mut state = self.lock();
        let set: HashSet<String> = object_keys.iter().cloned().collect();
        let del = i64::try_from(set.len()).unwrap_or(i64::MAX);
        state.deletions.insert(key.to_owned(), set);
        state.records.insert(
            key.to_owned(),
            Record {
                add: 0,
                del,
                set_at: Instant::now(),
            },
        );
    }

    /// One expected creation for `key` happened (or its API call failed).
    pub fn creation_observed(&self, key: &str) {
        self.lower_expectations(key, 1, 0);
    }

    /// `object_key` was deleted (or its delete call failed); lowers the count only if the
    /// deletion of that object was expected for `key`.
    pub fn deletion_observed(&self, key: &str, object_key: &str) {
        let mut state = self.lock();
        let expected = state
            .deletions
            .get_mut(key)
            .is_some_and(|set| set.remove(object_key));
        if expected && let Some(r) = state.records.get_mut(key) {
            r.del -= 1;
        }
    }

    /// Lowers the counters of `key` by `add` and `del`; no-op without a record.
    pub fn lower_expectations(&self, key: &str, add: i64, del: i64) {
        if let Some(r) = self.lock().records.get_mut(key) {
            r.add -= add;
            r.del -= del;
        }
    }

    /// Raises the counters of `key` by `add` and `del`; no-op without a record.
    pub fn raise_expectations(&self, key: &str, add: i64, del: i64) {
        if let Some(r) = self.lock().records.get_mut(key) {
            r.add += add;
            r.del += del;
        }
    }

    /// Forgets everything about `key` (call when the controller's object is gone).
    pub fn delete_expectations(&self, key: &str) {
        let mut state = self.lock();
        state.records.remove(key);
        state.deletions.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_key_without_expectations_is_satisfied() {
        let e = Expectations::new();
        assert!(e.satisfied("ns/vmi"));
        e.creation_observed("ns/vmi");
        assert!(e.satisfied("ns/vmi"));
        assert_eq!(e.pending("ns/vmi"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn pending_creations_hold_until_each_one_is_observed() {
        let e = Expectations::new();
        e.expect_creations("ns/rs", 2);
        assert!(!e.satisfied("ns/rs"));
        e.creation_observed("ns/rs");
        assert!(!e.satisfied("ns/rs"));
        e.creation_observed("ns/rs");
        assert!(e.satisfied("ns/rs"));
        // Extra observations drive the counter negative and stay satisfied.
        e.creation_observed("ns/rs");
        assert_eq!(e.pending("ns/rs"), Some(Pending { add: -1, del: 0 }));
        assert!(e.satisfied("ns/rs"));
    }

    #[tokio::test(start_paused = true)]
    async fn two_hundred_concurrent_checks_never_see_a_pending_creation_as_satisfied() {
        let e = Arc::new(Expectations::new());
        e.expect_creations("ns/vmi", 1);
        let mut checks = tokio::task::JoinSet::new();
        for _ in 0..200 {
            let e = Arc::clone(&e);
            checks.spawn(async move { e.satisfied("ns/vmi") });
        }
        let answers = checks.join_all().await;
        assert_eq!(answers.len(), 200);
        assert!(answers.iter().all(|satisfied| !satisfied));

        e.creation_observed("ns/vmi");
        assert!(e.satisfied("ns/vmi"));
    }

    #[test]
    fn two_hundred_threads_never_see_a_pending_creation_as_satisfied() {
        // Outside a runtime tokio's clock is the real one; nothing here waits on it.
        let e = Arc::new(Expectations::new());
        e.expect_creations("ns/vmi", 1);
        let answers: Vec<bool> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..200)
                .map(|_| {
                    let e = Arc::clone(&e);
                    s.spawn(move || e.satisfied("ns/vmi"))
                })
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        assert_eq!(answers.len(), 200);
        assert!(answers.iter().all(|satisfied| !satisfied));
        e.creation_observed("ns/vmi");
        assert!(e.satisfied("ns/vmi"));
    }

    #[tokio::test(start_paused = true)]
    async fn expectations_expire_strictly_after_five_minutes() {
        let e = Expectations::new();
        e.expect_creations("ns/vmi", 1);
        tokio::time::advance(EXPECTATIONS_TIMEOUT).await;
        assert!(
            !e.satisfied("ns/vmi"),
            "exactly at the timeout it still holds"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(e.satisfied("ns/vmi"));
    }

    #[tokio::test(start_paused = true)]
    async fn setting_expectations_again_restarts_the_clock() {
        let e = Expectations::new();
        e.expect_creations("ns/vmi", 1);
        tokio::time::advance(Duration::from_secs(200)).await;
        e.expect_creations("ns/vmi", 1);
        tokio::time::advance(Duration::from_secs(200)).await;
        assert!(!e.satisfied("ns/vmi"));
        tokio::time::advance(Duration::from_secs(101)).await;
        assert!(e.satisfied("ns/vmi"));
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_deletion_of_an_expected_object_counts() {
        let e = Expectations::new();
        e.expect_deletions("ns/vmi", &["ns/pod-a".to_owned(), "ns/pod-b".to_owned()]);
        assert_eq!(e.pending("ns/vmi"), Some(Pending { add: 0, del: 2 }));
        e.deletion_observed("ns/vmi", "ns/unrelated");
        e.deletion_observed("ns/vmi", "ns/pod-a");
        // The same deletion seen twice (for example delete event and relist) counts once.
        e.deletion_observed("ns/vmi", "ns/pod-a");
        assert_eq!(e.pending("ns/vmi"), Some(Pending { add: 0, del: 1 }));
        assert!(!e.satisfied("ns/vmi"));
        e.deletion_observed("ns/vmi", "ns/pod-b");
        assert!(e.satisfied("ns/vmi"));
    }

    #[tokio::test(start_paused = true)]
    async fn lowering_after_a_failed_create_satisfies_the_key() {
        let e = Expectations::new();
        e.expect_creations("ns/vmi", 3);
        e.lower_expectations("ns/vmi", 3, 0);
        assert!(e.satisfied("ns/vmi"));
        e.raise_expectations("ns/vmi", 1, 0);
        assert!(!e.satisfied("ns/vmi"));
    }

    #[tokio::test(start_paused = true)]
    async fn deleting_expectations_forgets_counts_and_expected_objects() {
        let e = Expectations::new();
        e.expect_deletions("ns/vmi", &["ns/pod-a".to_owned()]);
        e.delete_expectations("ns/vmi");
        assert!(e.satisfied("ns/vmi"));
        assert_eq!(e.pending("ns/vmi"), None);
        e.expect_creations("ns/vmi", 0);
        e.deletion_observed("ns/vmi", "ns/pod-a");
        assert_eq!(e.pending("ns/vmi"), Some(Pending { add: 0, del: 0 }));
    }
}
