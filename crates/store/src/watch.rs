//! Watch fan-out: one bounded queue per watcher, fed by the writer.
//!
//! Data flow: [`crate::Store::watch`] copies the matching history into the stream's private
//! backlog and registers a [`WatchQueue`] in the store state, both under the state lock;
//! afterwards the writer offers every applied event to every registered queue (under the
//! same lock, in revision order). [`WatchStream::next`] drains the backlog first, then
//! the queue.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

use crate::{Event, Result, Revision, StoreError};

/// Locks a mutex, ignoring poisoning (the protected data stays consistent: every critical
/// section in this crate completes its update before it can panic).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How a watch ends.
#[derive(Clone, Copy, Debug)]
enum End {
    /// The watcher fell `capacity` events behind; it gets one error, then ends.
    Lagged {
        delivered: Revision,
        dropped: Revision,
    },
    /// The lag error was delivered.
    Finished,
    /// The store closed.
    Closed,
}

#[derive(Debug)]
struct QueueState {
    events: VecDeque<Event>,
    /// Revision of the newest event handed to this watcher (backlog or queue).
    last: Revision,
    end: Option<End>,
}

/// The live half of one watch, shared between the store state and the [`WatchStream`].
#[derive(Debug)]
pub(crate) struct WatchQueue {
    prefix: String,
    after: Revision,
    capacity: usize,
    state: Mutex<QueueState>,
    notify: Notify,
}

impl WatchQueue {
    pub(crate) fn new(prefix: &str, after: Revision, last: Revision, capacity: usize) -> Self {
        WatchQueue {
            prefix: prefix.to_owned(),
            after,
            capacity: capacity.max(1),
            state: Mutex::new(QueueState {
                events: VecDeque::new(),
                last,
                end: None,
            }),
            notify: Notify::new(),
        }
    }

    /// Whether `event` is one this watcher asked for.
    fn wants(&self, event: &Event) -> bool {
        let record = event.record();
        record.revision > self.after && record.key.starts_with(&self.prefix)
    }

    /// Queues `event` if it matches; returns `false` once this watcher takes no more
    /// events (it lagged or closed) so the caller can forget it.
    pub(crate) fn offer(&self, event: &Event) -> bool {
        if !self.wants(event) {
            return true;
        }
        let mut state = lock(&self.state);
        if state.end.is_some() {
            return false;
        }
        if state.events.len() >= self.capacity {
            state.end = Some(End::Lagged {
                delivered: state.last,
                dropped: event.record().revision,
            });
            drop(state);
            self.notify.notify_one();
            return false;
        }
        state.last = event.record().revision;
        state.events.push_back(event.clone());
        drop(state);
        self.notify.notify_one();
        true
    }

    /// Ends the watch after the queued events (the store closed).
    pub(crate) fn close(&self) {
        let mut state = lock(&self.state);
        if state.end.is_none() {
            state.end = Some(End::Closed);
        }
        drop(state);
        self.notify.notify_one();
    }
}

/// Events for keys under a prefix with revisions greater than the start revision, in
/// revision order. Ends (`None`) when the store closes; yields an error once if the
/// watcher fell too far behind, after which the caller must re-list.
///
/// # Guarantees
/// - Events come in strictly increasing revision order, without gaps (every matching
///   event after the start revision is delivered) and without duplicates: the history
///   copy and the registration for live events happen under one lock.
/// - A watcher that has more than its capacity (see [`crate::Store::watch_with_capacity`])
///   of undelivered live events gets every event it had queued, then one
///   [`StoreError::Compacted`] whose `requested` is the revision of the last event it
///   received (or its start revision) and whose `oldest` is the first revision it missed,
///   then `None`. The writer never waits for a slow watcher.
/// - [`WatchStream::next`] is cancel-safe: dropping its future loses no event.
///
/// # Caveats
/// - The stream does not keep the store open: when the last [`crate::Store`] handle
///   drops, the stream yields what it had queued, then `None`.
#[derive(Debug)]
pub struct WatchStream {
    backlog: VecDeque<Event>,
    queue: Arc<WatchQueue>,
}

impl WatchStream {
    pub(crate) fn new(backlog: VecDeque<Event>, queue: Arc<WatchQueue>) -> Self {
        WatchStream { backlog, queue }
    }

    /// The next event, waiting for one.
    pub async fn next(&mut self) -> Option<Result<Event>> {
        if let Some(event) = self.backlog.pop_front() {
            return Some(Ok(event));
        }
        loop {
            if let Some(item) = self.try_next_live() {
                return item;
            }
            // A notification sent after the check above is stored as a permit, so this
            // cannot miss a wake-up.
            self.queue.notify.notified().await;
        }
    }

    /// The next event if one is ready; `None` when the caller must wait.
    fn try_next_live(&mut self) -> Option<Option<Result<Event>>> {
        let mut state = lock(&self.queue.state);
        if let Some(event) = state.events.pop_front() {
            return Some(Some(Ok(event)));
        }
        match state.end {
            None => None,
            Some(End::Lagged { delivered, dropped }) => {
                state.end = Some(End::Finished);
                Some(Some(Err(StoreError::Compacted {
                    requested: delivered,
                    oldest: dropped,
                })))
            }
            Some(End::Finished | End::Closed) => Some(None),
        }
    }

    /// The number of events ready to be returned without waiting.
    pub fn ready(&self) -> usize {
        self.backlog.len() + lock(&self.queue.state).events.len()
    }
}
