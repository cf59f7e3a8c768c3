//! The single writer: a dedicated OS thread that owns the SQLite connection and applies
//! writes in batches (group commit).
//!
//! Data flow: callers send a [`Request`] over a channel and await a oneshot reply. The
//! thread takes every queued request (up to [`MAX_BATCH`]), checks each precondition in
//! order against the current state plus the earlier writes of the batch, assigns
//! consecutive revisions, calls each `Encode`, appends the batch in one SQLite
//! transaction, then applies it to the in-memory state (which publishes it to watchers)
//! and only then answers the callers. A batch whose commit fails is answered with the
//! error, leaves the state as it was, and its WAL frames are overwritten
//! ([`crate::sqlite::Db::overwrite_refused_commit`]).

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use tokio::sync::oneshot;

use crate::sqlite::{self, Db, Row};
use crate::state::State;
use crate::watch::lock;
use crate::{Encode, Event, Record, Result, Revision, StoreError};

/// The most requests committed in one transaction.
pub(crate) const MAX_BATCH: usize = 1024;

/// The answer to a write: the outcome, or the payload of a panic raised by its `Encode`
/// (re-raised in the caller).
pub(crate) type Reply = thread::Result<Result<Record>>;

/// A write to apply.
pub(crate) enum Op {
    Create(Encode),
    Update(Revision, Encode),
    Delete(Option<Revision>),
}

/// A message to the writer thread.
pub(crate) enum Request {
    Write {
        key: String,
        op: Op,
        reply: oneshot::Sender<Reply>,
    },
    /// Compact the SQLite rows up to `revision`; answers the number of rows deleted.
    Compact {
        revision: Revision,
        reply: Option<oneshot::Sender<Result<usize>>>,
    },
}

/// Starts the writer thread; it ends when every sender is dropped.
pub(crate) fn spawn(
    state: Arc<Mutex<State>>,
    db: Option<Db>,
) -> std::io::Result<(Sender<Request>, JoinHandle<()>)> {
    let (sender, receiver) = mpsc::channel();
    let handle = thread::Builder::new()
        .name("store-writer".to_owned())
        .spawn(move || run(&state, db, &receiver))?;
    Ok((sender, handle))
}

fn run(state: &Mutex<State>, mut db: Option<Db>, receiver: &Receiver<Request>) {
    while let Ok(first) = receiver.recv() {
        let mut writes = Vec::new();
        let mut compactions = Vec::new();
        let mut next = Some(first);
        while let Some(request) = next {
            match request {
                Request::Write { key, op, reply } => writes.push((key, op, reply)),
                Request::Compact { revision, reply } => compactions.push((revision, reply)),
            }
            next = if writes.len() < MAX_BATCH {
                receiver.try_recv().ok()
            } else {
                None
            };
        }
        if !writes.is_empty()
            && let Some(revision) = commit_batch(state, db.as_mut(), writes)
        {
            // The history went over its byte budget: compact the rows as well.
            tracing::debug!(revision, "store history over its byte budget: compacted");
            compactions.push((revision, None));
        }
        for (revision, reply) in compactions {
            let outcome = match db.as_mut() {
                Some(db) => db.compact(revision).map_err(StoreError::Sqlite),
                None => Ok(0),
            };
            if let Err(error) = &outcome {
                tracing::warn!(revision, %error, "store compaction failed");
            }
            if let Some(reply) = reply {
                let _ = reply.send(outcome);
            }
        }
    }
    tracing::debug!("store writer stopped");
}

/// A write whose precondition held, waiting for the commit.
struct Planned {
    event: Event,
    prev_revision: Revision,
    reply: oneshot::Sender<Reply>,
}

/// Plans, commits and applies one batch; returns the new compaction point if applying
/// it took the history over its byte budget.
fn commit_batch(
    state: &Mutex<State>,
    db: Option<&mut Db>,
    writes: Vec<(String, Op, oneshot::Sender<Reply>)>,
) -> Option<Revision> {
    let planned = plan(state, writes);
    if planned.is_empty() {
        return None;
    }
    if let Some(db) = db {
        let rows: Vec<Row<'_>> = planned
            .iter()
            .map(|p| Row {
                event: &p.event,
                prev_revision: p.prev_revision,
            })
            .collect();
        if let Err(error) = db.append(&rows) {
            tracing::error!(%error, writes = planned.len(), "store commit failed");
            // Before anyone hears of the failure, so that a crash right after it cannot
            // bring the refused writes back.
            if let Err(error) = db.overwrite_refused_commit() {
                tracing::warn!(%error, "overwriting the refused commit's WAL frames failed");
            }
            for p in planned {
                let _ = p
                    .reply
                    .send(Ok(Err(StoreError::Sqlite(sqlite::copy_error(&error)))));
            }
            return None;
        }
    }
    let at = Instant::now();
    let mut compacted = None;
    {
        let mut state = lock(state);
        for p in &planned {
            compacted = state.apply(p.event.clone(), at).or(compacted);
        }
    }
    for p in planned {
        let record = p.event.record().clone();
        let _ = p.reply.send(Ok(Ok(record)));
    }
    compacted
}

/// Checks the preconditions in order and builds the events; rejected writes are answered
/// here and take no revision.
fn plan(state: &Mutex<State>, writes: Vec<(String, Op, oneshot::Sender<Reply>)>) -> Vec<Planned> {
    let mut next = lock(state).revision() + 1;
    // Keys written earlier in this batch: their value after that write.
    let mut overlay: HashMap<String, Option<Record>> = HashMap::new();
    let mut planned = Vec::with_capacity(writes.len());
    for (key, op, reply) in writes {
        let current = match overlay.get(&key) {
            Some(value) => value.clone(),
            // The lock is not held while `Encode` runs: it may read the store.
            None => lock(state).get(&key).cloned(),
        };
        match decide(key, op, current, next) {
            Ok((event, prev_revision)) => {
                let after = match &event {
                    Event::Put { record, .. } => Some(record.clone()),
                    Event::Delete { .. } => None,
                };
                overlay.insert(event.record().key.clone(), after);
                planned.push(Planned {
                    event,
                    prev_revision,
                    reply,
                });
                next += 1;
            }
            Err(answer) => {
                let _ = reply.send(answer);
            }
        }
    }
    planned
}

fn encode(encode: Encode, revision: Revision) -> Result<Arc<[u8]>, Reply> {
    catch_unwind(AssertUnwindSafe(move || encode(revision)))
        .map(Arc::from)
        .map_err(Err)
}

/// The event a write produces at `revision` and the revision of the row it supersedes,
/// or the answer that rejects it.
fn decide(
    key: String,
    op: Op,
    current: Option<Record>,
    revision: Revision,
) -> Result<(Event, Revision), Reply> {
    let check = |expected: Option<Revision>, current: Option<Record>| match current {
        None => Err(Ok(Err(StoreError::NotFound(key.clone())))),
        Some(c) => match expected {
            Some(expected) if expected != c.revision => Err(Ok(Err(StoreError::Conflict {
                key: key.clone(),
                expected,
                current: c.revision,
            }))),
            _ => Ok(c),
        },
    };
    match op {
        Op::Create(enc) => {
            if current.is_some() {
                return Err(Ok(Err(StoreError::AlreadyExists(key))));
            }
            let value = encode(enc, revision)?;
            let record = Record {
                key,
                value,
                revision,
                create_revision: revision,
            };
            Ok((Event::Put { record, prev: None }, 0))
        }
        Op::Update(expected, enc) => {
            let prev = check(Some(expected), current)?;
            let value = encode(enc, revision)?;
            let record = Record {
                key,
                value,
                revision,
                create_revision: prev.create_revision,
            };
            let prev_revision = prev.revision;
            Ok((
                Event::Put {
                    record,
                    prev: Some(prev),
                },
                prev_revision,
            ))
        }
        Op::Delete(expected) => {
            let last = check(expected, current)?;
            let prev_revision = last.revision;
            let record = Record { revision, ..last };
            Ok((Event::Delete { record }, prev_revision))
        }
    }
}
