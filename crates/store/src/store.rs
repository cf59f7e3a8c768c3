//! The public `Store` handle. (Skeleton: signatures are the contract; bodies are being written.)

use std::path::Path;

use crate::{Encode, ListResult, Record, Result, Revision};

/// A handle to the store; cheap to clone, shared by all API server tasks.
#[derive(Clone)]
pub struct Store {}

/// Events for keys under a prefix with revisions greater than the start revision, in
/// revision order. Ends (`None`) when the store closes; yields an error once if the
/// watcher fell too far behind, after which the caller must re-list.
pub struct WatchStream {}

impl WatchStream {
    /// The next event, waiting for one.
    pub async fn next(&mut self) -> Option<Result<crate::Event>> {
        todo!()
    }
}

impl Store {
    /// A store that keeps everything in memory (the reference backend).
    pub fn in_memory() -> Store {
        todo!()
    }

    /// Opens (creating if needed) a durable store in the SQLite file at `path`.
    pub fn open_sqlite(_path: &Path) -> Result<Store> {
        todo!()
    }

    /// The revision of the newest write.
    pub fn current_revision(&self) -> Revision {
        todo!()
    }

    /// The oldest revision a watch may start after.
    pub fn compacted_revision(&self) -> Revision {
        todo!()
    }

    /// The current value of `key`.
    pub fn get(&self, _key: &str) -> Option<Record> {
        todo!()
    }

    /// Current records whose keys start with `prefix`, in key order, starting after the
    /// key `start_after` when given, at most `limit` when given.
    pub fn list(
        &self,
        _prefix: &str,
        _start_after: Option<&str>,
        _limit: Option<usize>,
    ) -> ListResult {
        todo!()
    }

    /// Creates `key`; fails with `AlreadyExists` if present. Returns once durable.
    pub async fn create(&self, _key: &str, _encode: Encode) -> Result<Record> {
        todo!()
    }

    /// Replaces `key` if its current revision is `expected`. Returns once durable.
    pub async fn update(&self, _key: &str, _expected: Revision, _encode: Encode) -> Result<Record> {
        todo!()
    }

    /// Deletes `key` (if `expected` is given, only at that revision). Returns the delete event's record.
    pub async fn delete(&self, _key: &str, _expected: Option<Revision>) -> Result<Record> {
        todo!()
    }

    /// Watches keys under `prefix` for events with revision greater than `after`.
    /// Fails with `Compacted` if `after` is older than the retained history.
    pub fn watch(&self, _prefix: &str, _after: Revision) -> Result<WatchStream> {
        todo!()
    }

    /// Drops history at or below `revision` (never the current values).
    pub fn compact(&self, _revision: Revision) {
        todo!()
    }
}
