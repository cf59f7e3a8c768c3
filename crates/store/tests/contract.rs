//! The contract every backend keeps, run against the in-memory store and SQLite.

use std::collections::HashSet;
use std::sync::Arc;

use kubevirt_store::{
    Encode, Event, Record, Revision, Store, StoreError, StoreOptions, WatchStream,
};

/// A store plus whatever must outlive it (the temporary directory of a SQLite file).
pub struct Fixture {
    pub store: Store,
    _dir: Option<tempfile::TempDir>,
}

fn memory() -> Fixture {
    Fixture {
        store: Store::in_memory(),
        _dir: None,
    }
}

fn sqlite() -> Fixture {
    let dir = tempfile::tempdir().expect("temporary directory");
    let store = Store::open_sqlite(&dir.path().join("store.db")).expect("open store");
    Fixture {
        store,
        _dir: Some(dir),
    }
}

fn value(text: &str) -> Encode {
    let text = text.to_owned();
    Box::new(move |_| text.into_bytes())
}

fn text(record: &Record) -> &str {
    std::str::from_utf8(&record.value).expect("utf-8 value")
}

async fn next(watch: &mut WatchStream) -> Event {
    watch
        .next()
        .await
        .expect("watch open")
        .expect("watch event")
}

fn summary(event: &Event) -> (&'static str, String, Revision) {
    let kind = match event {
        Event::Put { prev: None, .. } => "create",
        Event::Put { prev: Some(_), .. } => "update",
        Event::Delete { .. } => "delete",
    };
    (kind, event.record().key.clone(), event.record().revision)
}

macro_rules! contract_suite {
    ($make:expr) => {
        use super::*;

        #[tokio::test]
        async fn create_stores_the_value_and_a_second_create_is_already_exists() {
            let f = $make();
            let record = f.store.create("/a", value("one")).await.unwrap();
            assert_eq!(record.revision, 1);
            assert_eq!(record.create_revision, 1);
            assert_eq!(f.store.get("/a"), Some(record.clone()));
            let err = f.store.create("/a", value("two")).await.unwrap_err();
            assert!(matches!(err, StoreError::AlreadyExists(k) if k == "/a"));
            assert_eq!(text(&f.store.get("/a").unwrap()), "one");
            assert_eq!(f.store.current_revision(), 1);
        }

        #[tokio::test]
        async fn update_checks_the_expected_revision_and_keeps_the_create_revision() {
            let f = $make();
            let created = f.store.create("/a", value("one")).await.unwrap();
            f.store.create("/b", value("other")).await.unwrap();
            let updated = f.store.update("/a", created.revision, value("two")).await.unwrap();
            assert_eq!(updated.revision, 3);
            assert_eq!(updated.create_revision, 1);
            assert_eq!(text(&f.store.get("/a").unwrap()), "two");
            let err = f.store.update("/a", created.revision, value("three")).await.unwrap_err();
            assert!(matches!(
                err,
                StoreError::Conflict { ref key, expected: 1, current: 3 } if key == "/a"
            ));
            let err = f.store.update("/missing", 1, value("x")).await.unwrap_err();
            assert!(matches!(err, StoreError::NotFound(k) if k == "/missing"));
            assert_eq!(f.store.current_revision(), 3, "failed writes take no revision");
        }

        #[tokio::test]
        async fn delete_with_and_without_expected_revision() {
            let f = $make();
            let a = f.store.create("/a", value("one")).await.unwrap();
            f.store.create("/b", value("two")).await.unwrap();
            let err = f.store.delete("/a", Some(a.revision + 1)).await.unwrap_err();
            assert!(matches!(err, StoreError::Conflict { expected: 2, current: 1, .. }));
            let deleted = f.store.delete("/a", Some(a.revision)).await.unwrap();
            assert_eq!(deleted.revision, 3);
            assert_eq!(deleted.create_revision, 1);
            assert_eq!(text(&deleted), "one", "the delete carries the last value");
            assert_eq!(f.store.get("/a"), None);
            let deleted = f.store.delete("/b", None).await.unwrap();
            assert_eq!(deleted.revision, 4);
            let err = f.store.delete("/b", None).await.unwrap_err();
            assert!(matches!(err, StoreError::NotFound(_)));
            let again = f.store.create("/a", value("new")).await.unwrap();
            assert_eq!(again.create_revision, 5, "a re-created key starts over");
        }

        #[tokio::test]
        async fn revisions_are_global_and_strictly_increasing() {
            let f = $make();
            let mut last = f.store.current_revision();
            for i in 0..10 {
                let key = format!("/k/{}", i % 3);
                let record = match f.store.get(&key) {
                    None => f.store.create(&key, value("v")).await.unwrap(),
                    Some(r) if i % 2 == 0 => f.store.update(&key, r.revision, value("w")).await.unwrap(),
                    Some(_) => f.store.delete(&key, None).await.unwrap(),
                };
                assert_eq!(record.revision, last + 1);
                last = record.revision;
                assert_eq!(f.store.current_revision(), last);
            }
        }

        #[tokio::test]
        async fn list_filters_by_prefix_in_key_order_with_limit_and_continue() {
            let f = $make();
            for key in ["/pods/b", "/pods/a", "/pods/c", "/podsx/a", "/nodes/a", "/pods/d"] {
                f.store.create(key, value(key)).await.unwrap();
            }
            let all = f.store.list("/pods/", None, None);
            let keys: Vec<_> = all.records.iter().map(|r| r.key.as_str()).collect();
            assert_eq!(keys, ["/pods/a", "/pods/b", "/pods/c", "/pods/d"]);
            assert!(!all.more);
            assert_eq!(all.revision, 6);

            let mut seen = Vec::new();
            let mut start_after: Option<String> = None;
            loop {
                let page = f.store.list("/pods/", start_after.as_deref(), Some(3));
                seen.extend(page.records.iter().map(|r| r.key.clone()));
                if !page.more {
                    break;
                }
                start_after = page.records.last().map(|r| r.key.clone());
            }
            assert_eq!(seen, keys);
            let page = f.store.list("/pods/", Some("/pods/a"), Some(2));
            let page_keys: Vec<_> = page.records.iter().map(|r| r.key.as_str()).collect();
            assert_eq!(page_keys, ["/pods/b", "/pods/c"]);
            assert!(page.more);
            assert!(f.store.list("/none/", None, None).records.is_empty());
        }

        #[tokio::test]
        async fn watch_from_zero_replays_everything_then_follows_live_events() {
            let f = $make();
            let a = f.store.create("/a", value("1")).await.unwrap();
            f.store.update("/a", a.revision, value("2")).await.unwrap();
            f.store.delete("/a", None).await.unwrap();
            let mut watch = f.store.watch("/", 0).unwrap();
            f.store.create("/b", value("3")).await.unwrap();
            let mut got = Vec::new();
            for _ in 0..4 {
                got.push(summary(&next(&mut watch).await));
            }
            assert_eq!(
                got,
                [
                    ("create", "/a".to_owned(), 1),
                    ("update", "/a".to_owned(), 2),
                    ("delete", "/a".to_owned(), 3),
                    ("create", "/b".to_owned(), 4),
                ]
            );
            assert_eq!(watch.ready(), 0);
        }

        #[tokio::test]
        async fn watch_events_carry_values_and_previous_values() {
            let f = $make();
            let mut watch = f.store.watch("/", 0).unwrap();
            let a = f.store.create("/a", value("1")).await.unwrap();
            f.store.update("/a", a.revision, value("2")).await.unwrap();
            f.store.delete("/a", None).await.unwrap();
            assert!(matches!(next(&mut watch).await, Event::Put { ref record, prev: None } if text(record) == "1"));
            match next(&mut watch).await {
                Event::Put { record, prev: Some(prev) } => {
                    assert_eq!((text(&record), record.revision), ("2", 2));
                    assert_eq!(prev, a);
                }
                other => panic!("unexpected {other:?}"),
            }
            match next(&mut watch).await {
                Event::Delete { record } => {
                    assert_eq!((text(&record), record.revision, record.create_revision), ("2", 3, 1));
                }
                other => panic!("unexpected {other:?}"),
            }
        }

        #[tokio::test]
        async fn watch_from_the_middle_and_from_current_skip_earlier_events() {
            let f = $make();
            for i in 1..=5 {
                f.store.create(&format!("/k/{i}"), value("v")).await.unwrap();
            }
            let mut middle = f.store.watch("/k/", 3).unwrap();
            let mut current = f.store.watch("/k/", f.store.current_revision()).unwrap();
            f.store.create("/k/6", value("v")).await.unwrap();
            let revisions: Vec<_> = [
                next(&mut middle).await,
                next(&mut middle).await,
                next(&mut middle).await,
            ]
            .iter()
            .map(|e| e.record().revision)
            .collect();
            assert_eq!(revisions, [4, 5, 6]);
            assert_eq!(next(&mut current).await.record().revision, 6);
            assert_eq!(current.ready(), 0);
        }

        #[tokio::test]
        async fn watch_delivers_only_keys_under_its_prefix() {
            let f = $make();
            f.store.create("/pods/a", value("v")).await.unwrap();
            f.store.create("/nodes/a", value("v")).await.unwrap();
            let mut watch = f.store.watch("/pods/", 0).unwrap();
            f.store.create("/podsx/a", value("v")).await.unwrap();
            f.store.create("/nodes/b", value("v")).await.unwrap();
            f.store.create("/pods/b", value("v")).await.unwrap();
            let keys = [next(&mut watch).await, next(&mut watch).await]
                .map(|e| e.record().key.clone());
            assert_eq!(keys, ["/pods/a", "/pods/b"]);
            assert_eq!(watch.ready(), 0);
        }

        #[tokio::test]
        async fn watch_before_the_compaction_point_is_compacted() {
            let f = $make();
            for i in 1..=5 {
                f.store.create(&format!("/k/{i}"), value("v")).await.unwrap();
            }
            f.store.compact(3);
            assert_eq!(f.store.compacted_revision(), 3);
            let err = f.store.watch("/", 2).unwrap_err();
            assert!(matches!(err, StoreError::Compacted { requested: 2, oldest: 3 }));
            let mut watch = f.store.watch("/", 3).unwrap();
            assert_eq!(next(&mut watch).await.record().revision, 4);
            assert_eq!(f.store.list("/k/", None, None).records.len(), 5, "values stay");
            f.store.compact(100);
            assert_eq!(f.store.compacted_revision(), 5, "clamped to the current revision");
            f.store.compact(1);
            assert_eq!(f.store.compacted_revision(), 5, "never moves back");
        }

        #[tokio::test]
        async fn slow_watcher_gets_its_queued_events_then_one_compacted_error() {
            let f = $make();
            let mut watch = f.store.watch_with_capacity("/", 0, 2).unwrap();
            for i in 1..=4 {
                f.store.create(&format!("/k/{i}"), value("v")).await.unwrap();
            }
            assert_eq!(next(&mut watch).await.record().revision, 1);
            assert_eq!(next(&mut watch).await.record().revision, 2);
            let err = watch.next().await.unwrap().unwrap_err();
            assert!(matches!(err, StoreError::Compacted { requested: 2, oldest: 3 }));
            assert!(watch.next().await.is_none());
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn sixteen_concurrent_writers_get_dense_unique_revisions() {
            let f = $make();
            let start = f.store.current_revision();
            let mut watch = f.store.watch("/", start).unwrap();
            let mut tasks = Vec::new();
            for t in 0..16 {
                let store = f.store.clone();
                tasks.push(tokio::spawn(async move {
                    let mut revisions = Vec::new();
                    for i in 0..100 {
                        let key = format!("/c/{t:02}/{i:03}");
                        revisions.push(store.create(&key, value(&key)).await.unwrap().revision);
                        // Each acknowledged write is visible at once.
                        assert!(store.get(&key).is_some());
                    }
                    revisions
                }));
            }
            let mut all = HashSet::new();
            for task in tasks {
                for revision in task.await.unwrap() {
                    assert!(all.insert(revision), "revision {revision} given twice");
                }
            }
            let expected: HashSet<Revision> = (start + 1..=start + 1600).collect();
            assert_eq!(all, expected);
            assert_eq!(f.store.current_revision(), start + 1600);
            let listed = f.store.list("/c/", None, None);
            assert_eq!(listed.records.len(), 1600);
            assert!(listed.records.iter().all(|r| text(r) == r.key));
            for revision in start + 1..=start + 1600 {
                assert_eq!(next(&mut watch).await.record().revision, revision);
            }
        }

        #[tokio::test]
        async fn encode_receives_the_revision_the_record_gets() {
            let f = $make();
            let mut tasks = Vec::new();
            for t in 0..8 {
                let store = f.store.clone();
                tasks.push(tokio::spawn(async move {
                    let key = format!("/e/{t}");
                    let created = store
                        .create(&key, Box::new(|rev| rev.to_string().into_bytes()))
                        .await
                        .unwrap();
                    assert_eq!(text(&created), created.revision.to_string());
                    let updated = store
                        .update(&key, created.revision, Box::new(|rev| rev.to_string().into_bytes()))
                        .await
                        .unwrap();
                    assert_eq!(text(&updated), updated.revision.to_string());
                }));
            }
            for task in tasks {
                task.await.unwrap();
            }
        }

        #[tokio::test]
        async fn conflicting_writes_queued_together_see_each_other() {
            let f = $make();
            let creates: Vec<_> = (0..8)
                .map(|_| {
                    let store = f.store.clone();
                    tokio::spawn(async move { store.create("/same", value("v")).await })
                })
                .collect();
            let mut ok = 0;
            for task in creates {
                match task.await.unwrap() {
                    Ok(_) => ok += 1,
                    Err(StoreError::AlreadyExists(_)) => {}
                    Err(other) => panic!("unexpected {other}"),
                }
            }
            assert_eq!(ok, 1);
            assert_eq!(f.store.current_revision(), 1);
        }

        #[tokio::test]
        async fn encode_may_read_the_store() {
            let f = $make();
            f.store.create("/a", value("first")).await.unwrap();
            let reader = f.store.clone();
            let record = f
                .store
                .create("/b", Box::new(move |_| reader.get("/a").unwrap().value.to_vec()))
                .await
                .unwrap();
            assert_eq!(text(&record), "first");
        }

        #[tokio::test]
        async fn watches_end_when_the_last_handle_drops() {
            let f = $make();
            let mut watch = f.store.watch("/", 0).unwrap();
            f.store.create("/a", value("v")).await.unwrap();
            let Fixture { store, _dir } = f;
            drop(store);
            assert_eq!(next(&mut watch).await.record().key, "/a");
            assert!(watch.next().await.is_none());
        }

        #[tokio::test]
        async fn a_panicking_encode_fails_only_its_write() {
            let f = $make();
            let store = f.store.clone();
            let outcome = tokio::spawn(async move {
                store.create("/boom", Box::new(|_| panic!("encode failed"))).await
            })
            .await;
            assert!(outcome.unwrap_err().is_panic());
            let record = f.store.create("/fine", value("v")).await.unwrap();
            assert_eq!(record.revision, 1, "the panicking write took no revision");
            assert_eq!(f.store.get("/boom"), None);
        }
    };
}

mod memory {
    contract_suite!(crate::memory);
}

mod sqlite {
    contract_suite!(crate::sqlite);
}

/// 4000 bytes of history: four events of `/k/N` (4 bytes) with a 1000-byte value.
const SMALL_BUDGET: StoreOptions = StoreOptions {
    history_budget_bytes: 4000,
};

async fn history_is_capped_by_its_byte_budget(store: &Store) {
    let big = "x".repeat(1000);
    for i in 0..10 {
        store.create(&format!("/k/{i}"), value(&big)).await.unwrap();
    }
    assert!(store.history_bytes() <= 4000, "{}", store.history_bytes());
    let oldest = store.compacted_revision();
    assert!(oldest > 1 && oldest < 10, "compacted to {oldest}");
    assert_eq!(store.history_bytes(), store.history_len() * 1004);
    let err = store.watch("/", 1).unwrap_err();
    assert!(
        matches!(err, StoreError::Compacted { requested: 1, oldest: o } if o == oldest),
        "{err}"
    );
    let mut watch = store.watch("/", oldest).unwrap();
    assert_eq!(next(&mut watch).await.record().revision, oldest + 1);
    assert_eq!(
        store.list("/k/", None, None).records.len(),
        10,
        "values stay"
    );
}

#[tokio::test]
async fn in_memory_history_is_capped_by_its_byte_budget() {
    history_is_capped_by_its_byte_budget(&Store::in_memory_with(&SMALL_BUDGET)).await;
}

#[tokio::test]
async fn sqlite_history_is_capped_by_its_byte_budget() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_sqlite_with(&dir.path().join("store.db"), &SMALL_BUDGET).unwrap();
    history_is_capped_by_its_byte_budget(&store).await;
}

#[test]
fn records_share_their_value_bytes() {
    let value: Arc<[u8]> = Arc::from(&b"x"[..]);
    let record = Record {
        key: "/a".to_owned(),
        value: Arc::clone(&value),
        revision: 1,
        create_revision: 1,
    };
    assert!(Arc::ptr_eq(&record.clone().value, &value));
}
