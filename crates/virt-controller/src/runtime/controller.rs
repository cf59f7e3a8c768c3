//! The controller driver: N workers pull keys from a [`WorkQueue`] and reconcile them.
//!
//! Data flow: informer handlers add keys → workers [`get`](WorkQueue::get) a key → the
//! [`Reconciler`] reads caches and acts → on success the key's backoff is
//! [`forget`](WorkQueue::forget)-ed (and it is re-added later for
//! [`Action::RequeueAfter`]); on error it is re-added with
//! [`add_rate_limited`](WorkQueue::add_rate_limited) and the error's
//! [`reason`](ControllerError::reason) is counted. Each reconcile runs in its own `tracing`
//! span carrying the controller name and the key.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::queue::WorkQueue;

/// An error of a reconcile, with a short machine-readable reason.
///
/// The reason becomes the `reason` label of the error metric and, in the controllers, the
/// reason of the failure condition (for example `FailedCreate`). Keep the set of reasons
/// small and fixed: never put names or messages into it.
pub trait ControllerError: std::error::Error + Send + Sync + 'static {
    /// A CamelCase reason such as `FailedCreate`.
    fn reason(&self) -> &str;
}

/// What to do with a key after a successful reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing more until the next event for the key.
    Done,
    /// Reconcile the key again after the given time, even without an event.
    RequeueAfter(Duration),
}

/// The per-key logic of one controller.
pub trait Reconciler: Send + Sync + 'static {
    /// The error of a failed reconcile.
    type Error: ControllerError;

    /// Brings the object named by `key` (`namespace/name`) towards its desired state.
    fn reconcile(&self, key: &str) -> impl Future<Output = Result<Action, Self::Error>> + Send;
}

/// Any `Fn(String) -> impl Future<Output = Result<Action, E>>` is a reconciler.
impl<F, Fut, E> Reconciler for F
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send,
    E: ControllerError,
{
    type Error = E;

    fn reconcile(&self, key: &str) -> impl Future<Output = Result<Action, E>> + Send {
        self(key.to_owned())
    }
}

/// A named controller: a queue, a reconciler and a number of workers.
///
/// # Guarantees
/// - A key is reconciled by at most one worker at a time (the queue's guarantee).
/// - Every key taken from the queue is marked `done`, whatever the reconcile returned.
/// - After cancellation no new reconcile starts; reconciles already running finish.
///
/// # Assumptions
/// - The reconciler is idempotent and reads current state itself: a key may be reconciled
///   more often than it changed.
///
/// # Caveats
/// - A reconcile that panics kills its worker; the remaining workers go on, and
///   [`run`](Self::run) reports the panic when it returns.
pub struct Controller<R> {
    name: String,
    queue: WorkQueue<String>,
    reconciler: Arc<R>,
    workers: usize,
}

impl<R: Reconciler> Controller<R> {
    /// A controller called `name` that reconciles the keys of `queue` with `reconciler`.
    pub fn new(name: &str, queue: WorkQueue<String>, reconciler: R) -> Self {
        Self {
            name: name.to_owned(),
            queue,
            reconciler: Arc::new(reconciler),
            workers: 1,
        }
    }

    /// Sets the number of concurrent workers (at least one; KubeVirt runs 3 for VMs and 10
    /// for VMIs).
    #[must_use]
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self
    }

    /// The queue event handlers feed.
    pub fn queue(&self) -> &WorkQueue<String> {
        &self.queue
    }

    /// Runs the workers until `cancel` fires or the queue shuts down, then shuts the queue
    /// down and waits for running reconciles to finish.
    ///
    /// Returns the number of workers that panicked.
    pub async fn run(self, cancel: CancellationToken) -> usize {
        tracing::info!(controller = %self.name, workers = self.workers, "starting controller");
        let mut workers = JoinSet::new();
        for _ in 0..self.workers {
            workers.spawn(worker(
                self.name.clone(),
                self.queue.clone(),
                Arc::clone(&self.reconciler),
                cancel.clone(),
            ));
        }
        let queue = self.queue.clone();
        let stop = cancel.clone();
        let mut panics = 0;
        tokio::select! {
            () = stop.cancelled() => {}
            () = async {
                // Returns once every worker has ended (the queue was shut down elsewhere).
                while let Some(res) = workers.join_next().await {
                    panics += usize::from(res.is_err());
                }
            } => {}
        }
        queue.shut_down();
        while let Some(res) = workers.join_next().await {
            panics += usize::from(res.is_err());
        }
        tracing::info!(controller = %self.name, "controller stopped");
        panics
    }
}

/// One worker: take a key, reconcile it, settle it, repeat.
async fn worker<R: Reconciler>(
    name: String,
    queue: WorkQueue<String>,
    reconciler: Arc<R>,
    cancel: CancellationToken,
) {
    loop {
        let key = tokio::select! {
            biased;
            () = cancel.cancelled() => return,
            key = queue.get() => match key {
                Some(key) => key,
                None => return,
            },
        };
        process(&name, &queue, reconciler.as_ref(), &key).await;
        queue.done(&key);
    }
}

/// Reconciles `key` once and re-queues it according to the outcome.
async fn process<R: Reconciler>(name: &str, queue: &WorkQueue<String>, reconciler: &R, key: &str) {
    let span = tracing::info_span!("reconcile", controller = %name, key = %key);
    let started = Instant::now();
    let result = reconciler.reconcile(key).instrument(span.clone()).await;
    let metrics = queue.metrics();
    metrics.observe_reconcile(started.elapsed().as_secs_f64());
    let _entered = span.enter();
    match result {
        Ok(Action::Done) => queue.forget(&key.to_owned()),
        Ok(Action::RequeueAfter(delay)) => {
            queue.forget(&key.to_owned());
            queue.add_after(key.to_owned(), delay);
        }
        Err(err) => {
            metrics.inc_error(err.reason());
            let retries = queue.num_requeues(&key.to_owned());
            tracing::warn!(reason = err.reason(), retries, error = %error_chain(&err), "reconcile failed");
            queue.add_rate_limited(key.to_owned());
        }
    }
}

/// An error with its causes: `outer: cause: root cause`.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::expectations::Expectations;
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Debug, thiserror::Error)]
    #[error("create failed")]
    struct CreateFailed;

    impl ControllerError for CreateFailed {
        fn reason(&self) -> &str {
            "FailedCreate"
        }
    }

    /// Records when each key was reconciled and fails the first `fail` attempts of each key.
    struct Recorder {
        fail: usize,
        calls: Mutex<HashMap<String, Vec<Instant>>>,
    }

    impl Recorder {
        fn new(fail: usize) -> Arc<Self> {
            Arc::new(Self {
                fail,
                calls: Mutex::new(HashMap::new()),
            })
        }

        fn calls(&self, key: &str) -> Vec<Instant> {
            self.calls
                .lock()
                .map(|c| c.get(key).cloned().unwrap_or_default())
                .unwrap_or_default()
        }
    }

    /// The reconciler side of a shared [`Recorder`].
    struct Recording(Arc<Recorder>);

    impl Reconciler for Recording {
        type Error = CreateFailed;

        async fn reconcile(&self, key: &str) -> Result<Action, CreateFailed> {
            let attempt = {
                let mut calls = self.0.calls.lock().map_err(|_| CreateFailed)?;
                let list = calls.entry(key.to_owned()).or_default();
                list.push(Instant::now());
                list.len()
            };
            if attempt <= self.0.fail {
                Err(CreateFailed)
            } else {
                Ok(Action::Done)
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failed_reconciles_are_retried_with_growing_backoff_and_counted_by_reason() {
        let queue = WorkQueue::new("test");
        let recorder = Recorder::new(3);
        let controller = Controller::new("test", queue.clone(), Recording(Arc::clone(&recorder)));
        let cancel = CancellationToken::new();
        let run = tokio::spawn(controller.run(cancel.clone()));

        let start = Instant::now();
        queue.add("ns/a".to_owned());
        tokio::time::sleep(Duration::from_secs(1)).await;

        let offsets: Vec<_> = recorder
            .calls("ns/a")
            .into_iter()
            .map(|t| t - start)
            .collect();
        assert_eq!(
            offsets,
            [0, 5, 15, 35].map(Duration::from_millis).to_vec(),
            "attempts after 0, 5, 10 and 20 ms of backoff"
        );
        assert_eq!(queue.metrics().errors("FailedCreate"), 3);
        assert_eq!(queue.metrics().reconciles(), 4);
        assert_eq!(queue.num_requeues(&"ns/a".to_owned()), 0, "success forgets");

        cancel.cancel();
        assert_eq!(run.await.ok(), Some(0));
    }

    #[tokio::test(start_paused = true)]
    async fn requeue_after_reconciles_the_key_again_later() {
        let queue = WorkQueue::new("test");
        let count = Arc::new(AtomicUsize::new(0));
        let reconciler = {
            let count = Arc::clone(&count);
            move |_key: String| {
                let count = Arc::clone(&count);
                async move {
                    count.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, CreateFailed>(Action::RequeueAfter(Duration::from_secs(30)))
                }
            }
        };
        let controller = Controller::new("test", queue.clone(), reconciler);
        let cancel = CancellationToken::new();
        let run = tokio::spawn(controller.run(cancel.clone()));
        queue.add("ns/a".to_owned());
        tokio::time::sleep(Duration::from_secs(95)).await;
        // At 0, 30, 60 and 90 seconds.
        assert_eq!(count.load(Ordering::SeqCst), 4);
        cancel.cancel();
        assert_eq!(run.await.ok(), Some(0));
    }

    /// A fake cluster: pods by owner key, with creation acknowledged at once but the watch
    /// event delivered only later.
    #[derive(Default)]
    struct FakeCluster {
        /// Pods the informer cache has seen, by owner key.
        cache: Mutex<HashMap<String, usize>>,
        creates: AtomicUsize,
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_events_during_an_in_flight_create_makes_one_pod() {
        let queue = WorkQueue::new("vmi");
        let expectations = Arc::new(Expectations::new());
        let cluster = Arc::new(FakeCluster::default());
        let reconciler = {
            let expectations = Arc::clone(&expectations);
            let cluster = Arc::clone(&cluster);
            move |key: String| {
                let expectations = Arc::clone(&expectations);
                let cluster = Arc::clone(&cluster);
                async move {
                    if !expectations.satisfied(&key) {
                        return Ok(Action::Done);
                    }
                    let have = cluster
                        .cache
                        .lock()
                        .map_or(0, |c| c.get(&key).copied().unwrap_or(0));
                    if have == 0 {
                        expectations.expect_creations(&key, 1);
                        // The create call takes a while.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        cluster.creates.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok::<_, CreateFailed>(Action::Done)
                }
            }
        };
        let controller = Controller::new("vmi", queue.clone(), reconciler).workers(10);
        let cancel = CancellationToken::new();
        let run = tokio::spawn(controller.run(cancel.clone()));

        // 200 events for the VMI, spread over the time the create is in flight and the watch
        // event of the new pod is still on its way.
        for _ in 0..200 {
            queue.add("ns/vmi".to_owned());
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(cluster.creates.load(Ordering::SeqCst), 1);
        // The pod's watch event arrives: cache updated, expectation lowered, key re-queued.
        if let Ok(mut cache) = cluster.cache.lock() {
            cache.insert("ns/vmi".to_owned(), 1);
        }
        expectations.creation_observed("ns/vmi");
        queue.add("ns/vmi".to_owned());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(cluster.creates.load(Ordering::SeqCst), 1);

        cancel.cancel();
        assert_eq!(run.await.ok(), Some(0));
    }

    #[tokio::test(start_paused = true)]
    async fn cancelling_lets_the_running_reconcile_finish_and_starts_no_new_one() {
        let queue = WorkQueue::new("test");
        let finished = Arc::new(AtomicUsize::new(0));
        let reconciler = {
            let finished = Arc::clone(&finished);
            move |_key: String| {
                let finished = Arc::clone(&finished);
                async move {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    finished.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, CreateFailed>(Action::Done)
                }
            }
        };
        let controller = Controller::new("test", queue.clone(), reconciler);
        let cancel = CancellationToken::new();
        let run = tokio::spawn(controller.run(cancel.clone()));
        queue.add("a".to_owned());
        queue.add("b".to_owned());
        tokio::time::sleep(Duration::from_secs(1)).await;
        cancel.cancel();
        assert_eq!(run.await.ok(), Some(0));
        assert_eq!(finished.load(Ordering::SeqCst), 1);
        assert!(queue.is_shutting_down());
    }

    #[tokio::test(start_paused = true)]
    async fn shutting_the_queue_down_stops_the_controller() {
        let queue = WorkQueue::new("test");
        let controller = Controller::new("test", queue.clone(), |_key: String| async {
            Ok::<_, CreateFailed>(Action::Done)
        })
        .workers(3);
        let run = tokio::spawn(controller.run(CancellationToken::new()));
        tokio::task::yield_now().await;
        queue.shut_down();
        assert_eq!(run.await.ok(), Some(0));
    }
}
