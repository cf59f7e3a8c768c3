//! A rate-limited, de-duplicating work queue with client-go's semantics.
//!
//! Event handlers [`add`](WorkQueue::add) keys; workers [`get`](WorkQueue::get) a key,
//! reconcile it and call [`done`](WorkQueue::done). After a failed reconcile the worker calls
//! [`add_rate_limited`](WorkQueue::add_rate_limited); after a successful one
//! [`forget`](WorkQueue::forget).
//!
//! State of a key, as in client-go:
//! - *dirty*: needs processing. A dirty key is queued at most once, however often it is added.
//! - *processing*: handed out by `get` and not yet `done`. Adding it again only marks it
//!   dirty; `done` then puts it back on the queue, so one key is never reconciled by two
//!   workers at once.
//! - *waiting*: added with a delay. Only the earliest pending delay of a key is kept.
//!
//! Delayed keys need no background task: a worker waiting in `get` sleeps until the earliest
//! delay expires and moves due keys onto the queue itself.
//!
//! The default [`RateLimiter`] is KubeVirt's controller limiter (client-go's
//! `DefaultTypedControllerRateLimiter`): the larger of a per-key exponential backoff
//! (5 ms · 2^failures, at most 1000 s) and an overall token bucket (10 per second, burst 100).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::metrics::ControllerMetrics;

/// Parameters of [`RateLimiter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimiterConfig {
    /// Backoff after the first failure of a key; doubles with every further failure.
    pub base_delay: Duration,
    /// Upper bound of the per-key backoff.
    pub max_delay: Duration,
    /// Sustained rate of the overall token bucket, in keys per second (at least 1).
    pub qps: u32,
    /// Size of the overall token bucket.
    pub burst: u32,
}

impl Default for RateLimiterConfig {
    /// KubeVirt's defaults: 5 ms … 1000 s per key, 10 qps with a burst of 100 overall.
    fn default() -> Self {
        Self {
            base_delay: Duration::from_millis(5),
            max_delay: Duration::from_secs(1000),
            qps: 10,
            burst: 100,
        }
    }
}

const NANOS_PER_SEC: i128 = 1_000_000_000;

/// A token bucket that hands out reservations, as `golang.org/x/time/rate`.
///
/// Tokens are counted in billionths so that refill and waits are exact integers.
#[derive(Debug)]
struct TokenBucket {
    qps: i128,
    burst: i128,
    /// Available tokens × 10⁹; negative when reservations are outstanding.
    tokens: i128,
    last: Option<Instant>,
}

impl TokenBucket {
    fn new(qps: u32, burst: u32) -> Self {
        let burst = i128::from(burst) * NANOS_PER_SEC;
        Self {
            qps: i128::from(qps.max(1)),
            burst,
            tokens: burst,
            last: None,
        }
    }

    /// Takes one token and returns how long the caller must wait for it.
    fn reserve(&mut self, now: Instant) -> Duration {
        if let Some(last) = self.last {
            let elapsed = i128::try_from(now.saturating_duration_since(last).as_nanos())
                .unwrap_or(i128::MAX / 2);
            self.tokens = self
                .tokens
                .saturating_add(elapsed.saturating_mul(self.qps))
                .min(self.burst);
        }
        self.last = Some(now);
        self.tokens -= NANOS_PER_SEC;
        if self.tokens >= 0 {
            return Duration::ZERO;
        }
        // Each nanosecond refills `qps` units; round the wait up.
        let wait = (-self.tokens + self.qps - 1) / self.qps;
        Duration::from_nanos(u64::try_from(wait).unwrap_or(u64::MAX))
    }
}

/// KubeVirt's default controller rate limiter: the maximum of a per-key exponential backoff
/// and an overall token bucket.
///
/// Pure: the caller passes the current time, so it is testable without a clock.
#[derive(Debug)]
pub struct RateLimiter<T> {
    config: RateLimiterConfig,
    failures: HashMap<T, u32>,
    bucket: TokenBucket,
}

impl<T: Eq + Hash + Clone> RateLimiter<T> {
    /// A limiter with `config`; the token bucket starts full.
    pub fn new(config: RateLimiterConfig) -> Self {
        Self {
            config,
            failures: HashMap::new(),
            bucket: TokenBucket::new(config.qps, config.burst),
        }
    }

    /// Records one more failure of `item` and returns how long it must wait before retrying.
    pub fn when(&mut self, item: &T, now: Instant) -> Duration {
        let failures = self.failures.entry(item.clone()).or_insert(0);
        let exp = *failures;
        *failures = failures.saturating_add(1);
        let backoff = if exp >= 64 {
            self.config.max_delay
        } else {
            let nanos = self
                .config
                .base_delay
                .as_nanos()
                .saturating_mul(1u128 << exp);
            let max = self.config.max_delay.as_nanos();
            Duration::from_nanos(u64::try_from(nanos.min(max)).unwrap_or(u64::MAX))
        };
        backoff.max(self.bucket.reserve(now))
    }

    /// Resets the failure count of `item`. The token bucket is not refunded.
    pub fn forget(&mut self, item: &T) {
        self.failures.remove(item);
    }

    /// How many times `item` has failed since it was last forgotten.
    pub fn num_requeues(&self, item: &T) -> u32 {
        self.failures.get(item).copied().unwrap_or(0)
    }
}

/// Mutable queue state, behind one mutex.
#[derive(Debug)]
struct State<T> {
    queue: VecDeque<T>,
    dirty: HashSet<T>,
    processing: HashSet<T>,
    /// Delayed keys ordered by due time (ties broken by insertion order).
    waiting: BTreeMap<(Instant, u64), T>,
    /// The entry of each delayed key in `waiting`.
    waiting_index: HashMap<T, (Instant, u64)>,
    next_seq: u64,
    limiter: RateLimiter<T>,
    shutting_down: bool,
}

impl<T: Eq + Hash + Clone> State<T> {
    /// Marks `item` dirty and queues it unless it is already dirty or being processed.
    /// Returns whether a new item became ready for `get`.
    fn insert(&mut self, item: T, metrics: &ControllerMetrics) -> bool {
        if self.shutting_down || self.dirty.contains(&item) {
            return false;
        }
        metrics.inc_adds();
        self.dirty.insert(item.clone());
        if self.processing.contains(&item) {
            return false;
        }
        self.queue.push_back(item);
        metrics.set_depth(self.queue.len());
        true
    }

    /// Schedules `item` for `due`, keeping an earlier schedule if there is one.
    fn schedule(&mut self, item: T, due: Instant) {
        if let Some(&existing) = self.waiting_index.get(&item) {
            if existing.0 <= due {
                return;
            }
            self.waiting.remove(&existing);
        }
        let entry = (due, self.next_seq);
        self.next_seq += 1;
        self.waiting.insert(entry, item.clone());
        self.waiting_index.insert(item, entry);
    }

    /// Moves every delayed key due at `now` onto the queue.
    fn promote_due(&mut self, now: Instant, metrics: &ControllerMetrics) {
        while let Some(entry) = self.waiting.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let item = entry.remove();
            self.waiting_index.remove(&item);
            self.insert(item, metrics);
        }
    }

    fn next_due(&self) -> Option<Instant> {
        self.waiting.keys().next().map(|(due, _)| *due)
    }
}

/// A rate-limited, de-duplicating work queue (see the module docs).
///
/// Cheap to clone; clones share the queue.
///
/// # Guarantees
/// - A key is handed out by [`get`](Self::get) to at most one worker at a time.
/// - A key added any number of times before a worker takes it is handed out once.
/// - A key added while it is being processed is handed out again after
///   [`done`](Self::done); the change is never lost.
/// - `get` is cancel-safe: a dropped `get` future takes nothing off the queue.
///
/// # Assumptions
/// - Every key returned by `get` is passed to `done` exactly once, also on failure.
///
/// # Caveats
/// - After [`shut_down`](Self::shut_down) new and delayed keys are dropped, but keys that were
///   already ready are still handed out; `get` returns `None` once they are gone.
/// - Delays are honoured only while some worker is waiting in `get`; a delayed key becomes
///   visible to `len` when a worker next looks at the queue.
#[derive(Debug)]
pub struct WorkQueue<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Clone for WorkQueue<T> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

#[derive(Debug)]
struct Shared<T> {
    state: Mutex<State<T>>,
    notify: Notify,
    metrics: ControllerMetrics,
}

impl<T: Eq + Hash + Clone> WorkQueue<T> {
    /// A queue with KubeVirt's default rate limiter whose metrics nobody scrapes.
    pub fn new(name: &str) -> Self {
        Self::with_config(
            RateLimiterConfig::default(),
            ControllerMetrics::unregistered(name),
        )
    }

    /// A queue with the given limiter parameters reporting to `metrics`.
    pub fn with_config(config: RateLimiterConfig, metrics: ControllerMetrics) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    queue: VecDeque::new(),
                    dirty: HashSet::new(),
                    processing: HashSet::new(),
                    waiting: BTreeMap::new(),
                    waiting_index: HashMap::new(),
                    next_seq: 0,
                    limiter: RateLimiter::new(config),
                    shutting_down: false,
                }),
                notify: Notify::new(),
                metrics,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // The state stays consistent across every early return, so a poisoned lock (a
        // panic elsewhere while holding it) is safe to keep using.
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The metrics handle this queue reports to.
    pub fn metrics(&self) -> &ControllerMetrics {
        &self.shared.metrics
    }

    /// Marks `item` as needing processing.
    pub fn add(&self, item: T) {
        let ready = self.lock().insert(item, &self.shared.metrics);
        if ready {
            self.shared.notify.notify_one();
        }
    }

    /// Adds `item` once `delay` has passed (immediately for a zero delay).
    pub fn add_after(&self, item: T, delay: Duration) {
        if delay.is_zero() {
            return self.add(item);
        }
        {
            let mut state = self.lock();
            if state.shutting_down {
                return;
            }
            state.schedule(item, Instant::now() + delay);
        }
        // Wake a worker so that it re-arms its timer for a possibly earlier deadline.
        self.shared.notify.notify_one();
    }

    /// Adds `item` after the delay the rate limiter assigns to its next failure.
    pub fn add_rate_limited(&self, item: T) {
        let delay = {
            let mut state = self.lock();
            if state.shutting_down {
                return;
            }
            state.limiter.when(&item, Instant::now())
        };
        self.shared.metrics.inc_retries();
        self.add_after(item, delay);
    }

    /// Resets the failure count of `item` (call after a successful reconcile).
    pub fn forget(&self, item: &T) {
        self.lock().limiter.forget(item);
    }

    /// How many times `item` was re-queued with rate limiting since it was last forgotten.
    pub fn num_requeues(&self, item: &T) -> u32 {
        self.lock().limiter.num_requeues(item)
    }

    /// Number of keys ready to be handed out.
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// Whether no key is ready to be handed out.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether [`shut_down`](Self::shut_down) was called.
    pub fn is_shutting_down(&self) -> bool {
        self.lock().shutting_down
    }

    /// Stops accepting keys, drops delayed ones and wakes every waiting worker.
    pub fn shut_down(&self) {
        {
            let mut state = self.lock();
            state.shutting_down = true;
            state.waiting.clear();
            state.waiting_index.clear();
        }
        self.shared.notify.notify_waiters();
    }

    /// Waits for a key to process; `None` once the queue is shut down and drained.
    ///
    /// The caller must call [`done`](Self::done) with the key when it has finished.
    pub async fn get(&self) -> Option<T> {
        loop {
            let mut notified = pin!(self.shared.notify.notified());
            let deadline = {
                let mut state = self.lock();
                state.promote_due(Instant::now(), &self.shared.metrics);
                if let Some(item) = state.queue.pop_front() {
                    self.shared.metrics.set_depth(state.queue.len());
                    state.dirty.remove(&item);
                    state.processing.insert(item.clone());
                    let more = !state.queue.is_empty() || !state.waiting.is_empty();
                    drop(state);
                    if more {
                        // Hand the watch over the remaining keys to another worker.
                        self.shared.notify.notify_one();
                    }
                    return Some(item);
                }
                if state.shutting_down {
                    return None;
                }
                // Register before unlocking so that no wake-up is missed.
                notified.as_mut().enable();
                state.next_due()
            };
            match deadline {
                Some(due) => {
                    tokio::select! {
                        () = notified => {}
                        () = tokio::time::sleep_until(due) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Marks `item` as processed; if it was added meanwhile it is queued again.
    pub fn done(&self, item: &T) {
        let ready = {
            let mut state = self.lock();
            state.processing.remove(item);
            if state.dirty.contains(item) {
                state.queue.push_back(item.clone());
                self.shared.metrics.set_depth(state.queue.len());
                true
            } else {
                false
            }
        };
        if ready {
            self.shared.notify.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;

    fn queue() -> WorkQueue<String> {
        WorkQueue::new("test")
    }

    fn key(s: &str) -> String {
        s.to_owned()
    }

    /// Whether `fut` finishes without time passing (on the paused clock).
    async fn ready_now<F: Future>(fut: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            out = fut => Some(out),
            () = tokio::task::yield_now() => None,
        }
    }

    #[test]
    fn per_key_backoff_doubles_from_five_milliseconds_and_caps_at_a_thousand_seconds() {
        let mut limiter = RateLimiter::new(RateLimiterConfig::default());
        let now = Instant::now();
        let item = key("ns/vm");
        let delays: Vec<_> = (0..6).map(|_| limiter.when(&item, now)).collect();
        assert_eq!(
            delays,
            [5, 10, 20, 40, 80, 160].map(Duration::from_millis).to_vec()
        );
        // 5 ms · 2^18 ≈ 1311 s exceeds the cap; every later failure stays at the cap.
        // Let time pass so that the token bucket does not dominate.
        let mut later = now;
        for _ in 6..18 {
            later += Duration::from_secs(100);
            limiter.when(&item, later);
        }
        assert_eq!(limiter.num_requeues(&item), 18);
        later += Duration::from_secs(100);
        assert_eq!(limiter.when(&item, later), Duration::from_secs(1000));
        later += Duration::from_secs(100);
        assert_eq!(limiter.when(&item, later), Duration::from_secs(1000));
        for _ in 0..100 {
            later += Duration::from_secs(100);
            assert_eq!(limiter.when(&item, later), Duration::from_secs(1000));
        }
    }

    #[test]
    fn forget_resets_the_backoff_of_one_key_only() {
        let mut limiter = RateLimiter::new(RateLimiterConfig::default());
        let now = Instant::now();
        let (a, b) = (key("a"), key("b"));
        limiter.when(&a, now);
        limiter.when(&a, now);
        limiter.when(&b, now);
        limiter.forget(&a);
        assert_eq!(limiter.num_requeues(&a), 0);
        assert_eq!(limiter.num_requeues(&b), 1);
        assert_eq!(limiter.when(&a, now), Duration::from_millis(5));
        assert_eq!(limiter.when(&b, now), Duration::from_millis(10));
    }

    #[test]
    fn token_bucket_allows_a_burst_of_one_hundred_then_ten_per_second() {
        let mut limiter = RateLimiter::new(RateLimiterConfig::default());
        let now = Instant::now();
        for i in 0..100 {
            // First failure of a fresh key: only the 5 ms per-key backoff applies.
            assert_eq!(
                limiter.when(&format!("k{i}"), now),
                Duration::from_millis(5)
            );
        }
        assert_eq!(limiter.when(&key("k100"), now), Duration::from_millis(100));
        assert_eq!(limiter.when(&key("k101"), now), Duration::from_millis(200));
        assert_eq!(limiter.when(&key("k102"), now), Duration::from_millis(300));
        // One second later ten tokens have come back, three of them already reserved.
        let later = now + Duration::from_secs(1);
        for i in 0..7 {
            assert_eq!(
                limiter.when(&format!("m{i}"), later),
                Duration::from_millis(5)
            );
        }
        assert_eq!(limiter.when(&key("m7"), later), Duration::from_millis(100));
        // The bucket never holds more than the burst, however long it rests.
        let much_later = later + Duration::from_secs(3600);
        for i in 0..100 {
            assert_eq!(
                limiter.when(&format!("n{i}"), much_later),
                Duration::from_millis(5)
            );
        }
        assert_eq!(
            limiter.when(&key("n100"), much_later),
            Duration::from_millis(100)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_added_many_times_while_waiting_is_handed_out_once() {
        let q = queue();
        for _ in 0..200 {
            q.add(key("ns/a"));
        }
        q.add(key("ns/b"));
        assert_eq!(q.len(), 2);
        assert_eq!(q.metrics().adds(), 2);
        assert_eq!(q.get().await, Some(key("ns/a")));
        assert_eq!(q.get().await, Some(key("ns/b")));
        assert_eq!(ready_now(q.get()).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_added_during_processing_is_requeued_after_done() {
        let q = queue();
        q.add(key("ns/a"));
        let item = q.get().await;
        assert_eq!(item.as_deref(), Some("ns/a"));
        q.add(key("ns/a"));
        q.add(key("ns/a"));
        // Not handed to a second worker while the first one holds it.
        assert_eq!(ready_now(q.get()).await, None);
        q.done(&key("ns/a"));
        assert_eq!(q.get().await, Some(key("ns/a")));
        q.done(&key("ns/a"));
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_hands_the_key_out_when_the_delay_has_passed() {
        let q = queue();
        let start = Instant::now();
        q.add_after(key("late"), Duration::from_secs(3));
        q.add_after(key("early"), Duration::from_secs(1));
        assert_eq!(q.get().await, Some(key("early")));
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert_eq!(q.get().await, Some(key("late")));
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_keeps_the_earliest_schedule_of_a_key() {
        let q = queue();
        let start = Instant::now();
        q.add_after(key("a"), Duration::from_secs(10));
        q.add_after(key("a"), Duration::from_secs(2));
        q.add_after(key("a"), Duration::from_secs(5));
        assert_eq!(q.get().await, Some(key("a")));
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        q.done(&key("a"));
        // The later schedules were merged into the first one.
        assert_eq!(ready_now(q.get()).await, None);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(ready_now(q.get()).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_worker_wakes_for_a_delay_shorter_than_the_one_it_sleeps_on() {
        let q = queue();
        let start = Instant::now();
        q.add_after(key("slow"), Duration::from_secs(100));
        let worker = tokio::spawn({
            let q = q.clone();
            async move { q.get().await }
        });
        tokio::task::yield_now().await;
        q.add_after(key("fast"), Duration::from_secs(1));
        assert_eq!(worker.await.ok().flatten(), Some(key("fast")));
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_retries_wait_five_ten_twenty_milliseconds() {
        let q = queue();
        let item = key("ns/vm");
        let mut waits = Vec::new();
        for _ in 0..4 {
            let start = Instant::now();
            q.add_rate_limited(item.clone());
            let got = q.get().await;
            assert_eq!(got.as_ref(), Some(&item));
            waits.push(start.elapsed());
            q.done(&item);
        }
        assert_eq!(waits, [5, 10, 20, 40].map(Duration::from_millis).to_vec());
        assert_eq!(q.num_requeues(&item), 4);
        assert_eq!(q.metrics().retries(), 4);
        q.forget(&item);
        assert_eq!(q.num_requeues(&item), 0);
        let start = Instant::now();
        q.add_rate_limited(item.clone());
        q.get().await;
        assert_eq!(start.elapsed(), Duration::from_millis(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_failures_is_spread_at_ten_per_second_after_the_first_hundred() {
        let q = queue();
        let start = Instant::now();
        for i in 0..120 {
            q.add_rate_limited(format!("k{i:03}"));
        }
        let mut arrivals = Vec::new();
        for _ in 0..120 {
            let item = q.get().await;
            assert!(item.is_some());
            arrivals.push(start.elapsed());
        }
        assert!(
            arrivals[..100]
                .iter()
                .all(|t| *t == Duration::from_millis(5))
        );
        let expected: Vec<_> = (1..=20u64)
            .map(|n| Duration::from_millis(100 * n))
            .collect();
        assert_eq!(arrivals[100..].to_vec(), expected);
    }

    #[tokio::test(start_paused = true)]
    async fn shut_down_wakes_waiting_workers_and_drops_new_keys() {
        let q = queue();
        let worker = tokio::spawn({
            let q = q.clone();
            async move { q.get().await }
        });
        tokio::task::yield_now().await;
        q.shut_down();
        assert_eq!(worker.await.ok().flatten(), None);
        q.add(key("a"));
        q.add_after(key("b"), Duration::from_secs(1));
        q.add_rate_limited(key("c"));
        assert_eq!(q.get().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn shut_down_still_hands_out_keys_that_were_ready() {
        let q = queue();
        q.add(key("a"));
        q.add_after(key("later"), Duration::from_secs(1));
        q.shut_down();
        assert!(q.is_shutting_down());
        assert_eq!(q.get().await, Some(key("a")));
        assert_eq!(q.get().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn depth_metric_follows_ready_keys() {
        let q = queue();
        q.add(key("a"));
        q.add(key("b"));
        assert_eq!(q.metrics().depth(), 2);
        let a = q.get().await;
        assert_eq!(q.metrics().depth(), 1);
        q.add(key("a"));
        assert_eq!(q.metrics().depth(), 1);
        if let Some(a) = a {
            q.done(&a);
        }
        assert_eq!(q.metrics().depth(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn many_workers_each_get_distinct_keys() {
        let q = queue();
        let mut workers = Vec::new();
        for _ in 0..4 {
            let q = q.clone();
            workers.push(tokio::spawn(async move {
                let mut seen = Vec::new();
                while let Some(k) = q.get().await {
                    seen.push(k.clone());
                    q.done(&k);
                }
                seen
            }));
        }
        for i in 0..50 {
            q.add(format!("k{i}"));
        }
        for i in 0..50 {
            q.add_after(format!("d{i}"), Duration::from_millis(i));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        q.shut_down();
        let mut all = Vec::new();
        for w in workers {
            all.extend(w.await.unwrap_or_default());
        }
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 100);
    }
}
