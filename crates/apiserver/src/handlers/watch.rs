//! `GET …?watch=true`: a chunked stream of `{"type": …, "object": …}` lines.
//!
//! From `resourceVersion` absent or `0`, the stream starts with a synthetic `ADDED` per
//! current object, then follows the store from the list's revision. From a specific
//! revision it resumes after it; a compacted revision yields one `410 Expired` ERROR event.
//! Selectors are applied to old and new values, so an object that stops matching is sent
//! as `DELETED` and one that starts matching as `ADDED`, as kube-apiserver does.
//!
//! # Guarantees
//! - Events are delivered in revision order, each at most once.
//! - The producer task ends when the client goes away, the store closes, or the timeout
//!   expires.
//!
//! # Caveats
//! - A slow client that lets the store's per-watch buffer overflow gets an ERROR 410 and must
//!   re-list (kube-rs `watcher` and client-go informers do).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kubevirt_store::{Event, StoreError};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tracing::debug;

use super::common::{decode_listed, set_rv};
use super::list::list_objects;
use crate::registry::ResourceInfo;
use crate::request::IncludeObject;
use crate::selectors::Selectors;
use crate::state::ApiState;
use crate::status::ApiError;
use crate::table;

/// How often bookmarks are sent when the client allows them.
pub const BOOKMARK_INTERVAL: Duration = Duration::from_secs(15);

/// What the watch request asked for.
#[derive(Clone, Debug)]
pub struct WatchParams {
    pub namespace: Option<String>,
    pub resource_version: Option<String>,
    pub selectors: Selectors,
    pub bookmarks: bool,
    pub timeout: Option<Duration>,
    pub send_initial_events: bool,
    /// Send objects as one-row Tables.
    pub table: Option<IncludeObject>,
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

struct Emitter {
    info: Arc<ResourceInfo>,
    table: Option<IncludeObject>,
    tx: mpsc::Sender<Bytes>,
}

impl Emitter {
    async fn send(&self, kind: &str, obj: Value) -> bool {
        let obj = match self.table {
            Some(include) => {
                let meta = json!({"resourceVersion": obj["metadata"]["resourceVersion"].clone()});
                table::table(&self.info, &[obj], &meta, include, jiff::Timestamp::now())
            }
            None => obj,
        };
        self.tx.send(line(kind, &obj)).await.is_ok()
    }

    async fn bookmark(&self, rev: u64, initial_end: bool) -> bool {
        let mut meta = json!({"resourceVersion": rev.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = json!({"kind": self.info.kind, "apiVersion": self.info.api_version(), "metadata": meta});
        self.tx.send(line("BOOKMARK", &obj)).await.is_ok()
    }

    async fn error(&self, e: &ApiError) -> bool {
        self.tx.send(line("ERROR", &e.to_status())).await.is_ok()
    }
}

/// Classifies one store event for a watcher with `selectors`.
///
/// Undecodable values are treated as lists treat them (skipped with a warning): an
/// object whose new value is corrupt leaves the watch as `DELETED` (its last good
/// value), one whose old value was corrupt enters it as `ADDED`.
pub fn classify(event: &Event, selectors: &Selectors) -> Option<(&'static str, Value)> {
    match event {
        Event::Put { record, prev } => {
            let old = prev.as_ref().and_then(decode_listed);
            let old_m = old.as_ref().is_some_and(|o| selectors.matches(o));
            let Some(new) = decode_listed(record) else {
                let mut gone = old.filter(|_| old_m)?;
                set_rv(&mut gone, record.revision);
                return Some(("DELETED", gone));
            };
            let new_m = selectors.matches(&new);
            match (old_m, new_m) {
                (true, true) => Some(("MODIFIED", new)),
                (false, true) => Some(("ADDED", new)),
                (true, false) => {
                    let mut gone = new;
                    set_rv(&mut gone, record.revision);
                    Some(("DELETED", gone))
                }
                (false, false) => None,
            }
        }
        Event::Delete { record } => {
            let mut obj = decode_listed(record)?;
            if !selectors.matches(&obj) {
                return None;
            }
            set_rv(&mut obj, record.revision);
            Some(("DELETED", obj))
        }
    }
}

/// Starts the watch; returns the receiving end of the event lines.
pub fn start(
    state: Arc<ApiState>,
    info: Arc<ResourceInfo>,
    params: WatchParams,
) -> Result<mpsc::Receiver<Bytes>, ApiError> {
    let prefix = info.list_prefix(params.namespace.as_deref());
    let from_now = matches!(params.resource_version.as_deref(), None | Some("0"));
    let (initial, after) = if from_now || params.send_initial_events {
        let (items, rev, _) = list_objects(
            &state,
            &info,
            params.namespace.as_deref(),
            &params.selectors,
            None,
            None,
        )?;
        (items, rev)
    } else {
        let rv = params.resource_version.as_deref().unwrap_or("0");
        let rev: u64 = rv
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))?;
        (Vec::new(), rev)
    };
    let (tx, rx) = mpsc::channel(64);
    let emitter = Emitter {
        info: info.clone(),
        table: params.table,
        tx,
    };
    let stream = state.store.watch(&prefix, after);
    tokio::spawn(async move {
        state.metrics.watch_started(&info);
        run(&emitter, stream, initial, after, &params).await;
        state.metrics.watch_ended(&info);
        debug!(resource = info.plural, "watch ended");
    });
    Ok(rx)
}

async fn run(
    em: &Emitter,
    stream: Result<kubevirt_store::WatchStream, StoreError>,
    initial: Vec<Value>,
    after: u64,
    params: &WatchParams,
) {
    let mut stream = match stream {
        Ok(s) => s,
        Err(StoreError::Compacted { requested, oldest }) => {
            let _ = em
                .error(&ApiError::expired(format!(
                    "too old resource version: {requested} ({oldest})"
                )))
                .await;
            return;
        }
        Err(e) => {
            let _ = em.error(&ApiError::internal(e.to_string())).await;
            return;
        }
    };
    for obj in initial {
        if !em.send("ADDED", obj).await {
            return;
        }
    }
    if params.send_initial_events && params.bookmarks && !em.bookmark(after, true).await {
        return;
    }
    // A timeout too large to add to the clock (`timeoutSeconds` near u64::MAX) is none.
    let deadline = params
        .timeout
        .and_then(|t| tokio::time::Instant::now().checked_add(t));
    let mut last_rev = after;
    let mut ticker = tokio::time::interval(BOOKMARK_INTERVAL);
    ticker.tick().await;
    loop {
        let timeout = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            ev = stream.next() => match ev {
                None => return,
                Some(Err(StoreError::Compacted { requested, oldest })) => {
                    let _ = em.error(&ApiError::expired(format!("too old resource version: {requested} ({oldest})"))).await;
                    return;
                }
                Some(Err(e)) => {
                    let _ = em.error(&ApiError::expired(format!("watch fell behind: {e}"))).await;
                    return;
                }
                Some(Ok(event)) => {
                    last_rev = event.record().revision;
                    if let Some((kind, obj)) = classify(&event, &params.selectors)
                        && !em.send(kind, obj).await
                    {
                        return;
                    }
                }
            },
            _ = ticker.tick(), if params.bookmarks => {
                if !em.bookmark(last_rev, false).await { return }
            }
            _ = em.tx.closed() => return,
            _ = timeout => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubevirt_store::Record;

    fn rec(obj: &Value, rev: u64) -> Record {
        Record {
            key: "/k".into(),
            value: serde_json::to_vec(obj).unwrap().into(),
            revision: rev,
            create_revision: 1,
        }
    }

    #[test]
    fn an_object_leaving_the_selector_is_deleted_and_one_entering_is_added() {
        let sel = Selectors::parse(Some("app=web"), None).unwrap();
        let web = json!({"metadata": {"name": "a", "labels": {"app": "web"}}});
        let db = json!({"metadata": {"name": "a", "labels": {"app": "db"}}});
        let leave = Event::Put {
            record: rec(&db, 3),
            prev: Some(rec(&web, 2)),
        };
        assert_eq!(classify(&leave, &sel).unwrap().0, "DELETED");
        let enter = Event::Put {
            record: rec(&web, 4),
            prev: Some(rec(&db, 3)),
        };
        assert_eq!(classify(&enter, &sel).unwrap().0, "ADDED");
        let other = Event::Put {
            record: rec(&db, 5),
            prev: Some(rec(&db, 4)),
        };
        assert!(classify(&other, &sel).is_none());
        let modified = Event::Put {
            record: rec(&web, 6),
            prev: Some(rec(&web, 5)),
        };
        assert_eq!(classify(&modified, &sel).unwrap().0, "MODIFIED");
        let gone = Event::Delete {
            record: rec(&web, 7),
        };
        let (kind, obj) = classify(&gone, &sel).unwrap();
        assert_eq!(kind, "DELETED");
        assert_eq!(obj["metadata"]["resourceVersion"], "7");
    }

    #[tokio::test]
    async fn a_watch_from_before_the_history_kept_by_the_byte_budget_gets_410_too_old() {
        let store = kubevirt_store::Store::in_memory_with(&kubevirt_store::StoreOptions {
            history_budget_bytes: 2000,
        });
        let state = Arc::new(ApiState::new(store));
        let info = state.registry.find("", "v1", "configmaps").unwrap();
        for i in 0..10 {
            let key = info.key(Some("default"), &format!("c{i}"));
            let obj =
                json!({"metadata": {"name": format!("c{i}")}, "data": {"x": "y".repeat(500)}});
            state
                .store
                .create(&key, super::super::common::encoder(obj))
                .await
                .unwrap();
        }
        assert!(state.store.compacted_revision() > 1);
        let params = WatchParams {
            namespace: Some("default".into()),
            resource_version: Some("1".into()),
            selectors: Selectors::default(),
            bookmarks: false,
            timeout: None,
            send_initial_events: false,
            table: None,
        };
        let mut rx = start(state.clone(), info, params).unwrap();
        let line: Value = serde_json::from_slice(&rx.recv().await.unwrap()).unwrap();
        assert_eq!(line["type"], "ERROR");
        assert_eq!(line["object"]["code"], 410);
        assert_eq!(line["object"]["reason"], "Expired");
        let message = line["object"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("too old resource version: 1 ("),
            "{message}"
        );
        assert!(rx.recv().await.is_none(), "the watch ends");
    }

    #[tokio::test]
    async fn a_timeout_too_large_for_the_clock_means_no_timeout() {
        let state = Arc::new(ApiState::new(kubevirt_store::Store::in_memory()));
        let info = state.registry.find("", "v1", "configmaps").unwrap();
        let key = info.key(Some("default"), "c");
        let obj = json!({"metadata": {"name": "c"}});
        state
            .store
            .create(&key, super::super::common::encoder(obj))
            .await
            .unwrap();
        let params = WatchParams {
            namespace: Some("default".into()),
            resource_version: None,
            selectors: Selectors::default(),
            bookmarks: false,
            timeout: Some(Duration::from_secs(u64::MAX)),
            send_initial_events: false,
            table: None,
        };
        let mut rx = start(state.clone(), info, params).unwrap();
        let line: Value = serde_json::from_slice(&rx.recv().await.unwrap()).unwrap();
        assert_eq!(line["type"], "ADDED");
        let key = state
            .registry
            .find("", "v1", "configmaps")
            .unwrap()
            .key(Some("default"), "d");
        state
            .store
            .create(
                &key,
                super::super::common::encoder(json!({"metadata": {"name": "d"}})),
            )
            .await
            .unwrap();
        let line: Value = serde_json::from_slice(&rx.recv().await.unwrap()).unwrap();
        assert_eq!(
            line["object"]["metadata"]["name"], "d",
            "the watch follows live events"
        );
    }

    fn corrupt(rev: u64) -> Record {
        Record {
            key: "/k".into(),
            value: b"{not json".to_vec().into(),
            revision: rev,
            create_revision: 1,
        }
    }

    #[test]
    fn corrupt_values_in_watch_events_are_skipped_like_in_lists() {
        let sel = Selectors::default();
        let good = json!({"metadata": {"name": "a"}});
        let broken = Event::Put {
            record: rec(&good, 3),
            prev: Some(corrupt(2)),
        };
        assert_eq!(classify(&broken, &sel).unwrap().0, "ADDED");
        let breaking = Event::Put {
            record: corrupt(4),
            prev: Some(rec(&good, 3)),
        };
        let (kind, obj) = classify(&breaking, &sel).unwrap();
        assert_eq!(kind, "DELETED");
        assert_eq!(obj["metadata"]["resourceVersion"], "4");
        let still = Event::Put {
            record: corrupt(5),
            prev: Some(corrupt(4)),
        };
        assert!(classify(&still, &sel).is_none());
        assert!(classify(&Event::Delete { record: corrupt(6) }, &sel).is_none());
    }
}
