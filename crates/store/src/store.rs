//! The public [`Store`] handle: reads from the in-memory state, writes through the single
//! writer thread, compaction by revision or by age.
//!
//! Data flow: `get`/`list`/`watch` lock the shared [`State`] briefly and never touch
//! SQLite; `create`/`update`/`delete` send a request to the writer thread
//! ([`crate::writer`]) and await its answer, which comes only after the write is durable
//! and applied to the state.

use std::path::Path;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::sqlite::{self, Db};
use crate::state::State;
pub use crate::watch::WatchStream;
use crate::watch::lock;
use crate::writer::{self, Op, Request};
use crate::{Encode, ListResult, Record, Result, Revision, StoreError, StoreOptions};

/// How many undelivered live events a watcher may have before it is cut off
/// (see [`WatchStream`]).
pub const DEFAULT_WATCH_CAPACITY: usize = 4096;

/// How much history [`Store::spawn_compactor`] should keep at least; the API server's
/// default (clients resume watches from a `resourceVersion` up to this old).
pub const DEFAULT_HISTORY_RETENTION: Duration = Duration::from_secs(5 * 60);

/// A handle to the store; cheap to clone, shared by all API server tasks.
///
/// # Guarantees
/// - Writes are linearizable: revisions are global, consecutive and strictly increasing
///   in commit order; a write is answered only after it is durable (SQLite: committed
///   with `synchronous=FULL`) and visible to `get`, `list` and `watch`.
/// - Concurrent writes share one transaction and one fsync (group commit); a rejected
///   precondition fails only that write and takes no revision.
/// - Reads never block on the writer or on SQLite.
///
/// # Assumptions
/// - `Encode` closures are quick and do not write to this store (they run on the writer
///   thread; a write from inside one would wait for itself). They may read it. A panic
///   in an `Encode` fails only that write and is re-raised in its caller.
/// - One store per SQLite file: the file is locked exclusively while open.
///
/// # Caveats
/// - A write whose caller stops waiting (its future is dropped) may still be applied.
/// - When the last handle drops, the writer finishes the queued writes and exits; the
///   drop waits for it (unless it happens on the writer thread itself, inside an `Encode`).
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    state: Arc<Mutex<State>>,
    sender: Option<Sender<Request>>,
    writer: Option<JoinHandle<()>>,
    durable: bool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.sender.take();
        if let Some(writer) = self.writer.take()
            && writer.thread().id() != thread::current().id()
            && writer.join().is_err()
        {
            tracing::error!("store writer thread panicked");
        }
        lock(&self.state).close();
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = lock(&self.inner.state);
        f.debug_struct("Store")
            .field("durable", &self.inner.durable)
            .field("revision", &state.revision())
            .field("compacted", &state.compacted())
            .finish_non_exhaustive()
    }
}

impl Store {
    fn start(state: State, db: Option<Db>) -> Result<Store> {
        let durable = db.is_some();
        let state = Arc::new(Mutex::new(state));
        let (sender, writer) = writer::spawn(Arc::clone(&state), db).map_err(|error| {
            tracing::error!(%error, "cannot start the store writer thread");
            StoreError::Closed
        })?;
        Ok(Store {
            inner: Arc::new(Inner {
                state,
                sender: Some(sender),
                writer: Some(writer),
                durable,
            }),
        })
    }

    /// A store that keeps everything in memory (the reference backend), with the
    /// default [`StoreOptions`].
    ///
    /// If the OS refuses a thread for the writer, the store is empty and every write
    /// fails with [`StoreError::Closed`].
    pub fn in_memory() -> Store {
        Store::in_memory_with(&StoreOptions::default())
    }

    /// [`Store::in_memory`] with chosen options.
    pub fn in_memory_with(options: &StoreOptions) -> Store {
        let budget = options.history_budget_bytes;
        Store::start(State::new(budget), None).unwrap_or_else(|_| Store {
            inner: Arc::new(Inner {
                state: Arc::new(Mutex::new(State::new(budget))),
                sender: None,
                writer: None,
                durable: false,
            }),
        })
    }

    /// Opens (creating if needed) a durable store in the SQLite file at `path`, with the
    /// default [`StoreOptions`].
    ///
    /// Loads every row: the current values, and the events after the last compaction as
    /// watch history (so watches can resume across a restart), within the history's byte
    /// budget.
    pub fn open_sqlite(path: &Path) -> Result<Store> {
        Store::open_sqlite_with(path, &StoreOptions::default())
    }

    /// [`Store::open_sqlite`] with chosen options.
    ///
    /// The file and its journal files are made 0600 whatever the umask (they hold every
    /// Secret); the directory is the caller's to protect.
    pub fn open_sqlite_with(path: &Path, options: &StoreOptions) -> Result<Store> {
        let file_mode = |(file, e)| StoreError::FileMode(file, e);
        sqlite::restrict_files(path).map_err(file_mode)?;
        let (db, loaded) = Db::open(path).map_err(StoreError::Sqlite)?;
        // The journal files SQLite created while opening (with the database's mode).
        sqlite::restrict_files(path).map_err(file_mode)?;
        tracing::info!(
            keys = loaded.current.len(),
            revision = loaded.revision,
            compacted = loaded.compacted,
            "store opened"
        );
        let mut state = State::loaded(
            loaded.current,
            loaded.history,
            loaded.revision,
            loaded.compacted,
            options.history_budget_bytes,
        );
        let trimmed = state.trim_history();
        let store = Store::start(state, Some(db))?;
        if let Some(revision) = trimmed
            && let Some(sender) = &store.inner.sender
        {
            tracing::info!(revision, "loaded history over its byte budget: compacted");
            let _ = sender.send(Request::Compact {
                revision,
                reply: None,
            });
        }
        Ok(store)
    }

    /// The revision of the newest write.
    pub fn current_revision(&self) -> Revision {
        lock(&self.inner.state).revision()
    }

    /// The oldest revision a watch may start after.
    pub fn compacted_revision(&self) -> Revision {
        lock(&self.inner.state).compacted()
    }

    /// The number of events held as watch history.
    pub fn history_len(&self) -> usize {
        lock(&self.inner.state).history_len()
    }

    /// The bytes of watch history held (see [`StoreOptions::history_budget_bytes`]).
    pub fn history_bytes(&self) -> usize {
        lock(&self.inner.state).history_bytes()
    }

    /// The current value of `key`.
    pub fn get(&self, key: &str) -> Option<Record> {
        lock(&self.inner.state).get(key).cloned()
    }

    /// Current records whose keys start with `prefix`, in key order, starting after the
    /// key `start_after` when given, at most `limit` when given (`Some(0)`: no limit).
    pub fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<usize>,
    ) -> ListResult {
        lock(&self.inner.state).list(prefix, start_after, limit)
    }

    async fn write(&self, key: &str, op: Op) -> Result<Record> {
        let sender = self.inner.sender.as_ref().ok_or(StoreError::Closed)?;
        let (reply, answer) = oneshot::channel();
        sender
            .send(Request::Write {
                key: key.to_owned(),
                op,
                reply,
            })
            .map_err(|_| StoreError::Closed)?;
        match answer.await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(_) => Err(StoreError::Closed),
        }
    }

    /// Creates `key`; fails with `AlreadyExists` if present. Returns once durable.
    pub async fn create(&self, key: &str, encode: Encode) -> Result<Record> {
        self.write(key, Op::Create(encode)).await
    }

    /// Replaces `key` if its current revision is `expected`. Returns once durable.
    pub async fn update(&self, key: &str, expected: Revision, encode: Encode) -> Result<Record> {
        self.write(key, Op::Update(expected, encode)).await
    }

    /// Deletes `key` (if `expected` is given, only at that revision). Returns the delete event's record.
    pub async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<Record> {
        self.write(key, Op::Delete(expected)).await
    }

    /// Watches keys under `prefix` for events with revision greater than `after`.
    /// Fails with `Compacted` if `after` is older than the retained history.
    ///
    /// `after` may be the current revision (only live events) or even newer (events up
    /// to `after` are skipped). Uses [`DEFAULT_WATCH_CAPACITY`].
    pub fn watch(&self, prefix: &str, after: Revision) -> Result<WatchStream> {
        self.watch_with_capacity(prefix, after, DEFAULT_WATCH_CAPACITY)
    }

    /// [`Store::watch`] with a chosen bound on undelivered live events (at least 1); the
    /// history backlog at the start does not count against it.
    pub fn watch_with_capacity(
        &self,
        prefix: &str,
        after: Revision,
        capacity: usize,
    ) -> Result<WatchStream> {
        lock(&self.inner.state).watch(prefix, after, capacity)
    }

    /// Drops history at or below `revision` (never the current values).
    ///
    /// `revision` is clamped to the current revision; a revision at or below the
    /// compaction point does nothing. On SQLite, the superseded rows and tombstones at
    /// or below it are deleted in the background by the writer.
    pub fn compact(&self, revision: Revision) {
        if let Some(revision) = lock(&self.inner.state).compact(revision)
            && self.inner.durable
            && let Some(sender) = &self.inner.sender
        {
            let _ = sender.send(Request::Compact {
                revision,
                reply: None,
            });
        }
    }

    /// [`Store::compact`], then waits until SQLite's rows are compacted too; returns the
    /// number of rows deleted (0 for the in-memory store or when nothing moved).
    pub async fn compact_storage(&self, revision: Revision) -> Result<usize> {
        let Some(revision) = lock(&self.inner.state).compact(revision) else {
            return Ok(0);
        };
        if !self.inner.durable {
            return Ok(0);
        }
        let sender = self.inner.sender.as_ref().ok_or(StoreError::Closed)?;
        let (reply, answer) = oneshot::channel();
        sender
            .send(Request::Compact {
                revision,
                reply: Some(reply),
            })
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Compacts the history applied at or before `cutoff` (wall time of the write);
    /// returns the new compaction point if it moved.
    pub fn compact_applied_before(&self, cutoff: Instant) -> Option<Revision> {
        let revision = lock(&self.inner.state).revision_applied_by(cutoff)?;
        let before = self.compacted_revision();
        self.compact(revision);
        let after = self.compacted_revision();
        (after > before).then_some(after)
    }

    /// Starts the automatic compaction policy on the current tokio runtime: every
    /// `retain / 5` (between 1 s and 60 s) it compacts the history older than `retain`,
    /// so a watch may always resume from any revision written in the last `retain`
    /// (use at least [`DEFAULT_HISTORY_RETENTION`]).
    ///
    /// # Guarantees
    /// - Events younger than `retain` are never compacted by this task.
    /// - The task holds no strong handle between ticks: it ends by itself once the last
    ///   [`Store`] handle drops (or when the returned handle is aborted).
    ///
    /// # Caveats
    /// - Must be called within a tokio runtime. Without writes, nothing is compacted
    ///   (this task trims by age; the byte budget is applied on every write).
    pub fn spawn_compactor(&self, retain: Duration) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let period = (retain / 5).clamp(Duration::from_secs(1), Duration::from_secs(60));
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(period);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                let Some(inner) = weak.upgrade() else { break };
                let store = Store { inner };
                if let Some(cutoff) = Instant::now().checked_sub(retain)
                    && let Some(revision) = store.compact_applied_before(cutoff)
                {
                    tracing::debug!(revision, "store history compacted");
                }
            }
        })
    }
}
