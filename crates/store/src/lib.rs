//! A versioned key/value log for Kubernetes-style objects, modelled on kine.
//!
//! Every write gets the next global revision (a `u64`, used by the API server as the
//! opaque `resourceVersion`). The store keeps the current value of every key and a
//! history of recent events so watches can resume from a revision; history older than
//! the compaction point answers [`StoreError::Compacted`] (HTTP 410 upstream).
//!
//! Data flow: the API server calls [`Store`] methods with opaque byte values; the store
//! does not parse them. A write's value may depend on its revision (the API server embeds
//! `metadata.resourceVersion`), so writes take an [`Encode`] closure that receives the
//! revision the write will get.
//!
//! Backends: [`Store::open_sqlite`] (durable; WAL, commit before answering, group commit)
//! and [`Store::in_memory`] (the reference backend and test oracle). Both serve reads,
//! lists and watches from memory; SQLite is only read at start-up.
//!
//! Writes go through one writer thread (`writer.rs`) that commits queued writes together
//! (group commit: one transaction, one fsync per batch) and answers each caller only once
//! its write is durable and visible. Watches (`watch.rs`) get the retained history, then
//! live events, from one bounded queue each. History is kept until [`Store::compact`] or
//! the age-based policy of [`Store::spawn_compactor`] drops it, and never beyond a byte
//! budget ([`StoreOptions::history_budget_bytes`]): past it the oldest events are
//! compacted at once, so a watch from before them gets [`StoreError::Compacted`], as
//! etcd answers after a compaction.
//!
//! No Kubernetes types here: this crate must build without `kube` or `k8s-openapi`.

use std::sync::Arc;

/// A global, monotonic store revision. Revision 0 means "nothing written yet".
pub type Revision = u64;

/// Builds the bytes to store for a write, given the revision the write will get.
pub type Encode = Box<dyn FnOnce(Revision) -> Vec<u8> + Send>;

/// One stored key at one revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub key: String,
    /// The bytes given by the writer (opaque to the store).
    pub value: Arc<[u8]>,
    /// Revision of the write that produced this value (for a delete event: the delete's revision).
    pub revision: Revision,
    /// Revision at which this key was created.
    pub create_revision: Revision,
}

/// A change to one key, as delivered to watchers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The key was created (`prev` is `None`) or updated (`prev` is the old value).
    Put {
        record: Record,
        prev: Option<Record>,
    },
    /// The key was deleted; `record` carries the last value and the delete's revision.
    Delete { record: Record },
}

impl Event {
    pub fn record(&self) -> &Record {
        match self {
            Event::Put { record, .. } | Event::Delete { record } => record,
        }
    }
}

/// The result of [`Store::list`].
#[derive(Clone, Debug, Default)]
pub struct ListResult {
    /// Records whose key starts with the prefix, in key order.
    pub records: Vec<Record>,
    /// The revision the list is consistent with.
    pub revision: Revision,
    /// More records follow the last one returned (a limit cut the list short).
    pub more: bool,
}

/// Errors of store operations.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A create found the key already present.
    #[error("key {0} already exists")]
    AlreadyExists(String),
    /// An update or delete found no such key.
    #[error("key {0} not found")]
    NotFound(String),
    /// An update or delete named a revision that is no longer the key's current one.
    #[error("key {key} is at revision {current}, not {expected}")]
    Conflict {
        key: String,
        expected: Revision,
        current: Revision,
    },
    /// A watch or list asked for a revision older than the compaction point.
    #[error("revision {requested} is compacted (oldest available {oldest})")]
    Compacted {
        requested: Revision,
        oldest: Revision,
    },
    /// A list asked for a revision newer than the store's.
    #[error("revision {requested} is in the future (current {current})")]
    FutureRevision {
        requested: Revision,
        current: Revision,
    },
    /// Writing to or reading from SQLite failed.
    #[error("sqlite")]
    Sqlite(#[source] rusqlite::Error),
    /// Creating the SQLite file, or restricting its mode (and its journal's) to 0600,
    /// failed.
    #[error("restricting the mode of {0}")]
    FileMode(std::path::PathBuf, #[source] std::io::Error),
    /// The writer task is gone (the store is shutting down).
    #[error("store is closed")]
    Closed,
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The default of [`StoreOptions::history_budget_bytes`]: 64 MiB.
pub const DEFAULT_HISTORY_BUDGET_BYTES: usize = 64 * 1024 * 1024;

/// How a store is run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreOptions {
    /// The most bytes of watch history to keep (keys plus values of the retained
    /// events). When a write takes the history past it, the oldest events are
    /// compacted until it is three quarters full (so compaction runs now and then, not
    /// on every write). The current values do not count and are never dropped.
    pub history_budget_bytes: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            history_budget_bytes: DEFAULT_HISTORY_BUDGET_BYTES,
        }
    }
}

mod sqlite;
mod state;
mod store;
mod watch;
mod writer;

pub use store::{DEFAULT_HISTORY_RETENTION, DEFAULT_WATCH_CAPACITY, Store, WatchStream};
