//! The in-memory state every read is served from: current values, recent history and the
//! registered watchers.
//!
//! Data flow: the writer thread is the only mutator ([`State::apply`], after the batch is
//! durable); API tasks read through [`State::get`], [`State::list`] and register watches
//! with [`State::watch`]. One `std::sync::Mutex` guards the whole state; every critical
//! section is short and never awaits or calls user code.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;
use std::time::Instant;

use crate::watch::{WatchQueue, WatchStream};
use crate::{Event, ListResult, Record, Result, Revision, StoreError};

/// One event of the retained history with the wall time it was applied.
#[derive(Debug)]
pub(crate) struct HistoryEntry {
    pub(crate) event: Event,
    pub(crate) at: Instant,
}

/// The bytes one history event counts against the budget: its key and value.
fn event_bytes(event: &Event) -> usize {
    let record = event.record();
    record.key.len() + record.value.len()
}

/// Current values, history after the compaction point, and watchers.
#[derive(Debug)]
pub(crate) struct State {
    current: BTreeMap<String, Record>,
    history: VecDeque<HistoryEntry>,
    /// Sum of [`event_bytes`] over `history`.
    history_bytes: usize,
    /// The most `history_bytes` may reach before the oldest events are compacted.
    history_budget: usize,
    revision: Revision,
    compacted: Revision,
    watchers: Vec<Arc<WatchQueue>>,
    closed: bool,
}

impl Default for State {
    fn default() -> Self {
        State::new(crate::DEFAULT_HISTORY_BUDGET_BYTES)
    }
}

impl State {
    /// An empty state keeping at most `history_budget` bytes of history.
    pub(crate) fn new(history_budget: usize) -> Self {
        State {
            current: BTreeMap::new(),
            history: VecDeque::new(),
            history_bytes: 0,
            history_budget,
            revision: 0,
            compacted: 0,
            watchers: Vec::new(),
            closed: false,
        }
    }

    /// A state loaded from storage: `history` holds the events after `compacted`, in
    /// revision order, already reflected in `current`. Call [`State::trim_history`]
    /// afterwards to apply the budget.
    pub(crate) fn loaded(
        current: BTreeMap<String, Record>,
        history: Vec<Event>,
        revision: Revision,
        compacted: Revision,
        history_budget: usize,
    ) -> Self {
        let at = Instant::now();
        let history: VecDeque<HistoryEntry> = history
            .into_iter()
            .map(|event| HistoryEntry { event, at })
            .collect();
        State {
            current,
            history_bytes: history.iter().map(|entry| event_bytes(&entry.event)).sum(),
            history,
            history_budget,
            revision,
            compacted,
            watchers: Vec::new(),
            closed: false,
        }
    }

    pub(crate) fn history_bytes(&self) -> usize {
        self.history_bytes
    }

    /// If the history is over its byte budget, compacts the oldest events until it is
    /// at most three quarters full; returns the new compaction point if it moved.
    pub(crate) fn trim_history(&mut self) -> Option<Revision> {
        if self.history_bytes <= self.history_budget {
            return None;
        }
        let target = self.history_budget - self.history_budget / 4;
        let mut compacted = None;
        while self.history_bytes > target {
            let Some(entry) = self.history.pop_front() else {
                break;
            };
            self.history_bytes -= event_bytes(&entry.event);
            compacted = Some(entry.event.record().revision);
        }
        if let Some(revision) = compacted {
            self.compacted = revision;
        }
        compacted
    }

    pub(crate) fn revision(&self) -> Revision {
        self.revision
    }

    pub(crate) fn compacted(&self) -> Revision {
        self.compacted
    }

    pub(crate) fn get(&self, key: &str) -> Option<&Record> {
        self.current.get(key)
    }

    pub(crate) fn history_len(&self) -> usize {
        self.history.len()
    }

    /// Applies one durable event: updates the current value, appends it to the history
    /// and offers it to the watchers (dropping those that lagged or went away). Returns
    /// the new compaction point if the history went over its budget.
    pub(crate) fn apply(&mut self, event: Event, at: Instant) -> Option<Revision> {
        match &event {
            Event::Put { record, .. } => {
                self.current.insert(record.key.clone(), record.clone());
            }
            Event::Delete { record } => {
                self.current.remove(&record.key);
            }
        }
        self.revision = event.record().revision;
        // A queue only referenced from here belongs to a dropped stream.
        self.watchers
            .retain(|queue| Arc::strong_count(queue) > 1 && queue.offer(&event));
        self.history_bytes += event_bytes(&event);
        self.history.push_back(HistoryEntry { event, at });
        self.trim_history()
    }

    /// Current records under `prefix`, in key order, after `start_after`, at most `limit`
    /// (`Some(0)` means no limit, as in Kubernetes).
    pub(crate) fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<usize>,
    ) -> ListResult {
        let lower = match start_after {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        let limit = limit.filter(|&n| n > 0).unwrap_or(usize::MAX);
        let mut matching = self
            .current
            .range::<str, _>((lower, Bound::Unbounded))
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(_, record)| record);
        let records: Vec<Record> = matching.by_ref().take(limit).cloned().collect();
        let more = records.len() == limit && matching.next().is_some();
        ListResult {
            records,
            revision: self.revision,
            more,
        }
    }

    /// Registers a watch for events under `prefix` after revision `after`.
    pub(crate) fn watch(
        &mut self,
        prefix: &str,
        after: Revision,
        capacity: usize,
    ) -> Result<WatchStream> {
        if after < self.compacted {
            return Err(StoreError::Compacted {
                requested: after,
                oldest: self.compacted,
            });
        }
        let start = self
            .history
            .partition_point(|entry| entry.event.record().revision <= after);
        let backlog: VecDeque<Event> = self
            .history
            .range(start..)
            .map(|entry| &entry.event)
            .filter(|event| event.record().key.starts_with(prefix))
            .cloned()
            .collect();
        let last = backlog
            .back()
            .map_or(after, |event| event.record().revision);
        let queue = Arc::new(WatchQueue::new(prefix, after, last, capacity));
        if self.closed {
            queue.close();
        } else {
            self.watchers.push(Arc::clone(&queue));
        }
        Ok(WatchStream::new(backlog, queue))
    }

    /// Drops history at or below `revision` (clamped to the current revision); returns
    /// the new compaction point if it moved.
    pub(crate) fn compact(&mut self, revision: Revision) -> Option<Revision> {
        let revision = revision.min(self.revision);
        if revision <= self.compacted {
            return None;
        }
        let keep = self
            .history
            .partition_point(|entry| entry.event.record().revision <= revision);
        for entry in self.history.drain(..keep) {
            self.history_bytes -= event_bytes(&entry.event);
        }
        self.compacted = revision;
        Some(revision)
    }

    /// The newest revision whose event was applied at or before `cutoff`.
    pub(crate) fn revision_applied_by(&self, cutoff: Instant) -> Option<Revision> {
        let end = self.history.partition_point(|entry| entry.at <= cutoff);
        end.checked_sub(1)
            .and_then(|index| self.history.get(index))
            .map(|entry| entry.event.record().revision)
    }

    /// Ends every watch (the store is closing); later watches end at once.
    pub(crate) fn close(&mut self) {
        self.closed = true;
        for queue in self.watchers.drain(..) {
            queue.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn put(key: &str, revision: Revision) -> Event {
        Event::Put {
            record: Record {
                key: key.to_owned(),
                value: Arc::from(key.as_bytes()),
                revision,
                create_revision: revision,
            },
            prev: None,
        }
    }

    fn state_with(keys: &[&str]) -> State {
        let mut state = State::default();
        let at = Instant::now();
        for (index, key) in keys.iter().enumerate() {
            assert_eq!(state.apply(put(key, index as Revision + 1), at), None);
        }
        state
    }

    fn keys(result: &ListResult) -> Vec<&str> {
        result.records.iter().map(|r| r.key.as_str()).collect()
    }

    #[test]
    fn list_with_start_after_before_the_prefix_starts_at_the_prefix() {
        let state = state_with(&["/a/1", "/b/1", "/b/2", "/c/1"]);
        let result = state.list("/b/", Some("/a/9"), None);
        assert_eq!(keys(&result), ["/b/1", "/b/2"]);
        assert!(!result.more);
    }

    #[test]
    fn list_with_limit_equal_to_the_remaining_count_reports_no_more() {
        let state = state_with(&["/b/1", "/b/2", "/c/1"]);
        let result = state.list("/b/", None, Some(2));
        assert_eq!(keys(&result), ["/b/1", "/b/2"]);
        assert!(!result.more);
        let result = state.list("/b/", None, Some(1));
        assert_eq!(keys(&result), ["/b/1"]);
        assert!(result.more);
    }

    #[test]
    fn list_with_limit_zero_returns_everything() {
        let state = state_with(&["/b/1", "/b/2"]);
        assert_eq!(keys(&state.list("/b/", None, Some(0))), ["/b/1", "/b/2"]);
    }

    #[test]
    fn compaction_is_clamped_to_the_current_revision_and_never_moves_back() {
        let mut state = state_with(&["/a", "/b", "/c"]);
        assert_eq!(state.compact(10), Some(3));
        assert_eq!(state.compact(2), None);
        assert_eq!(state.compacted(), 3);
        assert_eq!(state.history_len(), 0);
    }

    #[test]
    fn history_over_its_byte_budget_is_compacted_to_three_quarters_from_the_oldest() {
        // Each event is 10 bytes: a 2-byte key and an 8-byte value.
        let event = |revision: Revision| Event::Put {
            record: Record {
                key: format!("/{}", revision % 10),
                value: Arc::from(&b"12345678"[..]),
                revision,
                create_revision: revision,
            },
            prev: None,
        };
        let mut state = State::new(100);
        let at = Instant::now();
        for revision in 1..=10 {
            assert_eq!(state.apply(event(revision), at), None, "within the budget");
        }
        assert_eq!(state.history_bytes(), 100);
        // 110 bytes: down to at most 75, so the four oldest events go.
        assert_eq!(state.apply(event(11), at), Some(4));
        assert_eq!(state.compacted(), 4);
        assert_eq!(state.history_len(), 7);
        assert_eq!(state.history_bytes(), 70);
        assert!(matches!(
            state.watch("/", 3, 10),
            Err(StoreError::Compacted {
                requested: 3,
                oldest: 4
            })
        ));
        assert!(state.watch("/", 4, 10).is_ok());
        assert_eq!(state.compact(6), Some(6));
        assert_eq!(
            state.history_bytes(),
            50,
            "explicit compaction is accounted"
        );
    }

    #[test]
    fn one_event_larger_than_the_budget_leaves_an_empty_history() {
        let mut state = State::new(4);
        let compacted = state.apply(put("/a-long-key", 1), Instant::now());
        assert_eq!(compacted, Some(1));
        assert_eq!(state.history_len(), 0);
        assert_eq!(state.history_bytes(), 0);
        assert_eq!(state.get("/a-long-key").map(|r| r.revision), Some(1));
        assert!(
            state.watch("/", 1, 10).is_ok(),
            "a watch from now still works"
        );
    }

    #[test]
    fn revision_applied_by_finds_the_newest_event_not_after_the_cutoff() {
        let mut state = State::default();
        let start = Instant::now();
        state.apply(put("/a", 1), start);
        state.apply(put("/b", 2), start + Duration::from_secs(10));
        state.apply(put("/c", 3), start + Duration::from_secs(20));
        assert_eq!(
            state.revision_applied_by(start - Duration::from_secs(1)),
            None
        );
        assert_eq!(state.revision_applied_by(start), Some(1));
        assert_eq!(
            state.revision_applied_by(start + Duration::from_secs(15)),
            Some(2)
        );
        assert_eq!(
            state.revision_applied_by(start + Duration::from_secs(60)),
            Some(3)
        );
    }
}
