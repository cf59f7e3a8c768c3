//! The garbage collector: deletes dependents whose owners are gone, and carries out
//! Foreground and Orphan deletion (kube's `garbagecollector`, in-process).
//!
//! Data flow: one task watches every key (`/registry/`) of the store and keeps an index
//! owner uid → dependent keys (from `metadata.ownerReferences`). Events put work items on
//! a queue; each item is re-checked against the store (the truth) before anything is
//! written, and every write goes through the normal handlers (admission included):
//! - a deleted object's dependents are checked: a dependent whose owners are all gone is
//!   deleted (Background); one that still has a live owner only loses the dangling
//!   references;
//! - an owner marked with the `foregroundDeletion` finalizer gets its dependents deleted;
//!   once none with `blockOwnerDeletion: true` is left, the finalizer is removed and the
//!   update path deletes the owner;
//! - an owner marked with the `orphan` finalizer gets its references removed from every
//!   dependent, then the finalizer is removed.
//!
//! At start (and every [`RESCAN_PERIOD`]) every object with owner references or a
//! collector finalizer is checked, so dependents of owners deleted while the server was
//! down are collected too.
//!
//! # Guarantees
//! - A dependent is deleted only after a fresh read showed none of its owners exists (by
//!   uid) or that its remaining owners are all being deleted in the foreground; the delete
//!   carries a uid precondition, so a re-created object of the same name is never hit.
//! - The index is rebuilt from a fresh list if the watch falls behind (410).
//!
//! # Caveats
//! - An owner reference naming a kind this server does not serve counts as a live owner
//!   (the dependent is kept), where kube would report an error and retry.
//! - Failed writes are retried at the next rescan; conflicts are retried at once.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use kubevirt_store::{Event, Record, StoreError};
use serde_json::{Value, json};
use tracing::{debug, warn};

use crate::handlers::common::{WriteOptions, decode_record, get_object, meta_mut};
use crate::handlers::delete::{
    self, DeleteOptions, FOREGROUND_FINALIZER, ORPHAN_FINALIZER, Preconditions,
};
use crate::handlers::update::write_update;
use crate::registry::ResourceInfo;
use crate::state::ApiState;
use crate::status::ApiError;

/// How often every object is re-checked, besides the checks driven by events.
pub const RESCAN_PERIOD: Duration = Duration::from_secs(60);

/// The user the collector writes as.
const GC_USER: &str = "system:serviceaccount:kube-system:generic-garbage-collector";

/// One work item: a store key to look at.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Item {
    /// Check a dependent's owners.
    Dependent(String),
    /// Carry out a Foreground or Orphan deletion of this owner.
    Owner(String),
}

#[derive(Clone, Debug)]
struct OwnerRef {
    api_version: String,
    kind: String,
    name: String,
    uid: String,
    block: bool,
}

fn owner_refs(obj: &Value) -> Vec<OwnerRef> {
    obj["metadata"]["ownerReferences"]
        .as_array()
        .map(|refs| {
            refs.iter()
                .map(|r| OwnerRef {
                    api_version: r["apiVersion"].as_str().unwrap_or("").to_owned(),
                    kind: r["kind"].as_str().unwrap_or("").to_owned(),
                    name: r["name"].as_str().unwrap_or("").to_owned(),
                    uid: r["uid"].as_str().unwrap_or("").to_owned(),
                    block: r["blockOwnerDeletion"].as_bool().unwrap_or(false),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn has_finalizer(obj: &Value, f: &str) -> bool {
    obj["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x == f))
}

fn is_deleting(obj: &Value) -> bool {
    obj["metadata"]["deletionTimestamp"].is_string()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The owner → dependents index and the work queue.
#[derive(Default)]
struct Index {
    /// Dependent key → the uids of its owners.
    owners_of: HashMap<String, Vec<String>>,
    /// Owner uid → dependent keys.
    dependents: HashMap<String, HashSet<String>>,
    /// Owners in Foreground/Orphan deletion: uid → key.
    deleting_owners: HashMap<String, String>,
    queue: VecDeque<Item>,
    queued: HashSet<Item>,
}

impl Index {
    fn push(&mut self, item: Item) {
        if self.queued.insert(item.clone()) {
            self.queue.push_back(item);
        }
    }

    fn pop(&mut self) -> Option<Item> {
        let item = self.queue.pop_front()?;
        self.queued.remove(&item);
        Some(item)
    }

    fn forget(&mut self, key: &str) -> Vec<String> {
        let owners = self.owners_of.remove(key).unwrap_or_default();
        for o in &owners {
            if let Some(set) = self.dependents.get_mut(o) {
                set.remove(key);
                if set.is_empty() {
                    self.dependents.remove(o);
                }
            }
        }
        owners
    }

    /// Records the current value of a key; queues the work it implies.
    fn put(&mut self, record: &Record, scan: bool) {
        let key = &record.key;
        let bytes = &record.value[..];
        let maybe_owned = contains(bytes, b"ownerReferences");
        let maybe_deleting = contains(bytes, b"deletionTimestamp");
        if !maybe_owned && !maybe_deleting {
            self.forget(key);
            return;
        }
        let Ok(obj) = serde_json::from_slice::<Value>(bytes) else {
            return;
        };
        let before = self.forget(key);
        let refs = owner_refs(&obj);
        if !refs.is_empty() {
            let uids: Vec<String> = refs.iter().map(|r| r.uid.clone()).collect();
            // New references may name absent owners (kube's "virtual" owners): check them.
            let changed = uids != before;
            for u in &uids {
                self.dependents
                    .entry(u.clone())
                    .or_default()
                    .insert(key.clone());
            }
            self.owners_of.insert(key.clone(), uids);
            if scan || changed {
                self.push(Item::Dependent(key.clone()));
            }
        }
        let uid = obj["metadata"]["uid"].as_str().unwrap_or("").to_owned();
        if is_deleting(&obj)
            && (has_finalizer(&obj, FOREGROUND_FINALIZER) || has_finalizer(&obj, ORPHAN_FINALIZER))
        {
            self.deleting_owners.insert(uid, key.clone());
            self.push(Item::Owner(key.clone()));
        } else {
            self.deleting_owners.remove(&uid);
        }
    }

    /// Records a deletion: the object's dependents and its waiting owners need a look.
    fn delete(&mut self, record: &Record) {
        let owners = self.forget(&record.key);
        for o in owners {
            if let Some(k) = self.deleting_owners.get(&o).cloned() {
                self.push(Item::Owner(k));
            }
        }
        let Ok(obj) = serde_json::from_slice::<Value>(&record.value) else {
            return;
        };
        let uid = obj["metadata"]["uid"].as_str().unwrap_or("").to_owned();
        self.deleting_owners.remove(&uid);
        let deps: Vec<String> = self
            .dependents
            .get(&uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        for d in deps {
            self.push(Item::Dependent(d));
        }
    }
}

/// Starts the collector on the current tokio runtime; abort the handle to stop it.
pub fn spawn(state: Arc<ApiState>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(state))
}

async fn run(state: Arc<ApiState>) {
    'rebuild: loop {
        // (Re)build the index from a list, then follow the watch from that revision.
        let mut index = Index::default();
        let listed = state.store.list("/registry/", None, None);
        for r in &listed.records {
            index.put(r, true);
        }
        let mut watch = match state.store.watch("/registry/", listed.revision) {
            Ok(w) => w,
            Err(e) => {
                warn!(error = %e, "garbage collector: watch failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let mut rescan = tokio::time::interval(RESCAN_PERIOD);
        rescan.tick().await;
        loop {
            // Apply every ready event before doing work, so checks see a fresh index.
            while watch.ready() > 0 {
                match watch.next().await {
                    Some(Ok(ev)) => apply(&mut index, &ev),
                    Some(Err(_)) => continue 'rebuild,
                    None => return,
                }
            }
            if let Some(item) = index.pop() {
                match process(&state, &index, &item).await {
                    Ok(()) => {}
                    Err(e) if e.code == 409 => index.push(item),
                    Err(e) => warn!(?item, error = %e.message, "garbage collector: will retry"),
                }
                continue;
            }
            tokio::select! {
                ev = watch.next() => match ev {
                    Some(Ok(ev)) => apply(&mut index, &ev),
                    Some(Err(StoreError::Compacted { .. })) => break,
                    Some(Err(e)) => { warn!(error = %e, "garbage collector: watch error"); break; }
                    None => return,
                },
                _ = rescan.tick() => {
                    for r in state.store.list("/registry/", None, None).records {
                        index.put(&r, true);
                    }
                }
            }
        }
    }
}

fn apply(index: &mut Index, ev: &Event) {
    match ev {
        Event::Put { record, .. } => index.put(record, false),
        Event::Delete { record } => index.delete(record),
    }
}

fn gc_opts() -> WriteOptions {
    WriteOptions {
        user: GC_USER.into(),
        ..WriteOptions::default()
    }
}

/// The resource and object stored at `key`, if any.
fn load(state: &ApiState, key: &str) -> Option<(Arc<ResourceInfo>, Value, u64)> {
    let record = state.store.get(key)?;
    let obj = decode_record(&record).ok()?;
    let info = state.registry.find_kind(
        obj["apiVersion"].as_str().unwrap_or(""),
        obj["kind"].as_str().unwrap_or(""),
    )?;
    Some((info, obj, record.revision))
}

/// What became of one owner reference.
#[derive(Debug, PartialEq, Eq)]
enum OwnerState {
    /// No object with that uid.
    Absent,
    /// Exists and is not being deleted in the foreground.
    Live,
    /// Being deleted in the foreground (waits for its dependents).
    Waiting,
}

fn owner_state(state: &ApiState, dependent_ns: Option<&str>, r: &OwnerRef) -> OwnerState {
    let Some(info) = state.registry.find_kind(&r.api_version, &r.kind) else {
        return OwnerState::Live;
    };
    let ns = if info.namespaced { dependent_ns } else { None };
    if info.namespaced && ns.is_none() {
        return OwnerState::Absent;
    }
    match get_object(state, &info, ns, &r.name) {
        Ok((o, _)) if o["metadata"]["uid"] == r.uid.as_str() => {
            if is_deleting(&o) && has_finalizer(&o, FOREGROUND_FINALIZER) {
                OwnerState::Waiting
            } else {
                OwnerState::Live
            }
        }
        _ => OwnerState::Absent,
    }
}

async fn process(state: &ApiState, index: &Index, item: &Item) -> Result<(), ApiError> {
    match item {
        Item::Dependent(key) => check_dependent(state, key).await,
        Item::Owner(key) => {
            let deps: Vec<String> = match load(state, key) {
                Some((_, o, _)) => {
                    let uid = o["metadata"]["uid"].as_str().unwrap_or("");
                    index
                        .dependents
                        .get(uid)
                        .map(|s| s.iter().cloned().collect())
                        .unwrap_or_default()
                }
                None => return Ok(()),
            };
            process_owner(state, key, &deps).await
        }
    }
}

async fn check_dependent(state: &ApiState, key: &str) -> Result<(), ApiError> {
    let Some((info, obj, rev)) = load(state, key) else {
        return Ok(());
    };
    let refs = owner_refs(&obj);
    if refs.is_empty() {
        return Ok(());
    }
    let ns = obj["metadata"]["namespace"].as_str();
    let name = obj["metadata"]["name"].as_str().unwrap_or("");
    let states: Vec<OwnerState> = refs.iter().map(|r| owner_state(state, ns, r)).collect();
    let live = states.contains(&OwnerState::Live);
    let waiting = states.contains(&OwnerState::Waiting);
    if !live {
        // Every owner is gone or waiting for its dependents: this one goes.
        let policy = if waiting && has_dependents(state, &obj) {
            "Foreground"
        } else {
            "Background"
        };
        if is_deleting(&obj) {
            return Ok(());
        }
        debug!(key, policy, "garbage collector: deleting dependent");
        let options = DeleteOptions {
            propagation_policy: Some(policy.into()),
            preconditions: Some(Preconditions {
                uid: obj["metadata"]["uid"].as_str().map(str::to_owned),
                resource_version: None,
            }),
            ..DeleteOptions::default()
        };
        return match delete::delete(state, &info, ns, name, &options, &gc_opts()).await {
            Err(e) if e.code == 404 => Ok(()),
            other => other.map(|_| ()),
        };
    }
    // A live owner keeps the object: drop dangling references, and stop blocking owners
    // that wait for their dependents.
    let mut changed = false;
    let mut new = obj.clone();
    if let Some(arr) = new["metadata"]["ownerReferences"].as_array_mut() {
        let mut i = 0;
        arr.retain(|_| {
            let keep = states[i] != OwnerState::Absent;
            i += 1;
            changed |= !keep;
            keep
        });
        for (r, s) in arr
            .iter_mut()
            .zip(states.iter().filter(|s| **s != OwnerState::Absent))
        {
            if *s == OwnerState::Waiting && r["blockOwnerDeletion"] == true {
                r["blockOwnerDeletion"] = json!(false);
                changed = true;
            }
        }
    }
    if changed {
        write_update(state, &info, ns, name, None, new, &obj, rev, &gc_opts()).await?;
    }
    Ok(())
}

fn has_dependents(state: &ApiState, obj: &Value) -> bool {
    let uid = obj["metadata"]["uid"].as_str().unwrap_or("");
    let needle = format!("\"uid\":\"{uid}\"");
    state
        .store
        .list("/registry/", None, None)
        .records
        .iter()
        .any(|r| contains(&r.value, b"ownerReferences") && contains(&r.value, needle.as_bytes()))
}

/// Removes `finalizer` from the owner at `key` (the update path deletes it when it was
/// the last one).
async fn remove_finalizer(state: &ApiState, key: &str, finalizer: &str) -> Result<(), ApiError> {
    let Some((info, obj, rev)) = load(state, key) else {
        return Ok(());
    };
    let mut new = obj.clone();
    if let Some(arr) = meta_mut(&mut new)
        .get_mut("finalizers")
        .and_then(Value::as_array_mut)
    {
        arr.retain(|f| f != finalizer);
    }
    let ns = obj["metadata"]["namespace"].as_str();
    let name = obj["metadata"]["name"].as_str().unwrap_or("");
    write_update(state, &info, ns, name, None, new, &obj, rev, &gc_opts()).await?;
    Ok(())
}

async fn process_owner(state: &ApiState, key: &str, deps: &[String]) -> Result<(), ApiError> {
    let Some((_, owner, _)) = load(state, key) else {
        return Ok(());
    };
    if !is_deleting(&owner) {
        return Ok(());
    }
    let uid = owner["metadata"]["uid"].as_str().unwrap_or("").to_owned();
    if has_finalizer(&owner, ORPHAN_FINALIZER) {
        for d in deps {
            let Some((info, obj, rev)) = load(state, d) else {
                continue;
            };
            let mut new = obj.clone();
            if let Some(arr) = new["metadata"]["ownerReferences"].as_array_mut() {
                arr.retain(|r| r["uid"] != uid.as_str());
                if arr.is_empty()
                    && let Some(m) = new["metadata"].as_object_mut()
                {
                    m.remove("ownerReferences");
                }
            }
            if new != obj {
                let ns = obj["metadata"]["namespace"].as_str();
                let name = obj["metadata"]["name"].as_str().unwrap_or("");
                write_update(state, &info, ns, name, None, new, &obj, rev, &gc_opts()).await?;
            }
        }
        return remove_finalizer(state, key, ORPHAN_FINALIZER).await;
    }
    if has_finalizer(&owner, FOREGROUND_FINALIZER) {
        for d in deps {
            Box::pin(check_dependent(state, d)).await?;
        }
        // Blocking dependents left after the checks (deleted ones come back through the
        // watch and re-queue this owner).
        let blocking = deps.iter().any(|d| {
            load(state, d)
                .is_some_and(|(_, obj, _)| owner_refs(&obj).iter().any(|r| r.uid == uid && r.block))
        });
        if !blocking {
            return remove_finalizer(state, key, FOREGROUND_FINALIZER).await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handlers::{create, delete::delete};
    use kubevirt_store::Store;

    fn state() -> Arc<ApiState> {
        Arc::new(ApiState::new(Store::in_memory()))
    }

    /// Waits (on store events, at most 10 s) until `cond` holds.
    async fn wait_until(state: &ApiState, cond: impl Fn() -> bool) {
        let mut w = state
            .store
            .watch("/registry/", state.store.current_revision())
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !cond() {
            tokio::time::timeout_at(deadline, w.next())
                .await
                .expect("condition not reached in time");
        }
    }

    async fn make(state: &ApiState, obj: Value) -> Value {
        let info = state
            .registry
            .find_kind(
                obj["apiVersion"].as_str().unwrap(),
                obj["kind"].as_str().unwrap(),
            )
            .unwrap();
        let ns = obj["metadata"]["namespace"].as_str().map(str::to_owned);
        create::create(state, &info, ns.as_deref(), obj, &gc_opts())
            .await
            .unwrap()
            .body
    }

    async fn ns(state: &ApiState) {
        make(
            state,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}),
        )
        .await;
    }

    fn cm(name: &str, owner: Option<(&Value, bool)>) -> Value {
        let mut o = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}});
        if let Some((owner, block)) = owner {
            o["metadata"]["ownerReferences"] = json!([{
                "apiVersion": "v1", "kind": "ConfigMap",
                "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
                "blockOwnerDeletion": block,
            }]);
        }
        o
    }

    fn exists(state: &ApiState, name: &str) -> bool {
        state
            .store
            .get(&format!("/registry/core/configmaps/default/{name}"))
            .is_some()
    }

    fn get(state: &ApiState, name: &str) -> Value {
        let r = state
            .store
            .get(&format!("/registry/core/configmaps/default/{name}"))
            .unwrap();
        decode_record(&r).unwrap()
    }

    async fn del(state: &ApiState, name: &str, policy: &str) -> u16 {
        let info = state.registry.find("", "v1", "configmaps").unwrap();
        let options = DeleteOptions {
            propagation_policy: Some(policy.into()),
            ..DeleteOptions::default()
        };
        delete(state, &info, Some("default"), name, &options, &gc_opts())
            .await
            .unwrap()
            .code
    }

    #[tokio::test]
    async fn background_deletion_collects_dependents_and_their_dependents() {
        let s = state();
        ns(&s).await;
        let gc = spawn(s.clone());
        let owner = make(&s, cm("owner", None)).await;
        let child = make(&s, cm("child", Some((&owner, false)))).await;
        make(&s, cm("grandchild", Some((&child, false)))).await;
        make(&s, cm("bystander", None)).await;
        del(&s, "owner", "Background").await;
        wait_until(&s, || !exists(&s, "child") && !exists(&s, "grandchild")).await;
        assert!(exists(&s, "bystander"));
        gc.abort();
    }

    #[tokio::test]
    async fn orphan_deletion_keeps_dependents_without_the_reference() {
        let s = state();
        ns(&s).await;
        let gc = spawn(s.clone());
        let owner = make(&s, cm("owner", None)).await;
        make(&s, cm("child", Some((&owner, true)))).await;
        del(&s, "owner", "Orphan").await;
        wait_until(&s, || !exists(&s, "owner")).await;
        assert!(exists(&s, "child"));
        assert!(
            get(&s, "child")["metadata"]
                .get("ownerReferences")
                .is_none()
        );
        gc.abort();
    }

    #[tokio::test]
    async fn foreground_deletion_removes_blocking_dependents_before_the_owner() {
        let s = state();
        ns(&s).await;
        // Finalizer on the dependent keeps it (and so the owner) until we release it.
        let owner = make(&s, cm("owner", None)).await;
        let mut child = cm("child", Some((&owner, true)));
        child["metadata"]["finalizers"] = json!(["test/hold"]);
        make(&s, child).await;
        let gc = spawn(s.clone());
        del(&s, "owner", "Foreground").await;
        wait_until(&s, || is_deleting(&get(&s, "child"))).await;
        let o = get(&s, "owner");
        assert!(is_deleting(&o));
        assert!(has_finalizer(&o, FOREGROUND_FINALIZER));
        // Release the dependent: it goes, then the owner.
        // Like any client, retry on a conflict with the collector's own writes.
        loop {
            let (info, c, rev) = load(&s, "/registry/core/configmaps/default/child").unwrap();
            let mut released = c.clone();
            released["metadata"]["finalizers"] = json!([]);
            match write_update(
                &s,
                &info,
                Some("default"),
                "child",
                None,
                released,
                &c,
                rev,
                &gc_opts(),
            )
            .await
            {
                Err(e) if e.code == 409 => continue,
                other => {
                    other.unwrap();
                    break;
                }
            }
        }
        wait_until(&s, || !exists(&s, "owner")).await;
        assert!(!exists(&s, "child"));
        gc.abort();
    }

    #[tokio::test]
    async fn dependents_of_owners_deleted_while_the_collector_was_down_are_collected_at_start() {
        let s = state();
        ns(&s).await;
        let owner = make(&s, cm("owner", None)).await;
        make(&s, cm("child", Some((&owner, false)))).await;
        // A live second owner keeps its dependent; the dangling reference is dropped.
        let other = make(&s, cm("other", None)).await;
        let mut shared = cm("shared", Some((&owner, false)));
        shared["metadata"]["ownerReferences"]
            .as_array_mut()
            .unwrap()
            .push(json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": other["metadata"]["uid"]}));
        make(&s, shared).await;
        del(&s, "owner", "Background").await;
        assert!(exists(&s, "child"));
        let gc = spawn(s.clone());
        wait_until(&s, || !exists(&s, "child")).await;
        wait_until(&s, || {
            get(&s, "shared")["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|a| a.len() == 1)
        })
        .await;
        assert_eq!(
            get(&s, "shared")["metadata"]["ownerReferences"][0]["name"],
            "other"
        );
        gc.abort();
    }

    #[tokio::test]
    async fn a_dependent_with_a_uid_mismatched_owner_is_collected() {
        let s = state();
        ns(&s).await;
        let gc = spawn(s.clone());
        let mut fake_owner = make(&s, cm("owner", None)).await;
        fake_owner["metadata"]["uid"] = json!("not-the-real-uid");
        make(&s, cm("child", Some((&fake_owner, false)))).await;
        wait_until(&s, || !exists(&s, "child")).await;
        assert!(exists(&s, "owner"));
        gc.abort();
    }
}
