//! The event recorder every component shares: `recorder.Eventf` of upstream's controllers and
//! virt-handler.
//!
//! Data flow: a controller calls [`EventRecorder::record`] with the object the event is
//! about, a type, a reason and a message → the recorder looks the event up in its cache of
//! events it has written (keyed as client-go keys them: involved object, type, reason,
//! message, source) → a new event is created as a core `v1` Event; a repeat patches the
//! existing object's `count` and `lastTimestamp` instead of creating a second one.
//!
//! Core `v1` rather than `events.k8s.io/v1`: `kubectl describe` lists the core `v1` Events
//! whose `involvedObject` matches, and the embedded API server keeps the two groups
//! separately (it does not convert between them), so only core Events reach `describe`.
//! Upstream's client-go recorder writes core `v1` Events too.
//!
//! # Guarantees
//! Recording never fails the caller: API errors are logged at warn and dropped.
//!
//! # Caveats
//! The aggregation cache is per process and bounded; after a restart (or when the cache is
//! full and cleared) a repeat creates a new Event, as with client-go's LRU cache. Unlike
//! client-go, similar events with different messages are not folded into one "combined"
//! event, and there is no per-object rate limit.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource};
use serde_json::json;

/// At most this many distinct events are remembered for aggregation (client-go: 4096).
const CACHE_SIZE: usize = 4096;

/// `Normal` or `Warning`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Something expected happened.
    Normal,
    /// Something went wrong.
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// An event already written: its object name and how often it was seen.
#[derive(Clone, Debug)]
struct Seen {
    name: String,
    count: i32,
}

/// Records core `v1` Events for one component (`virtualmachine-controller`, …).
pub struct EventRecorder {
    client: Client,
    component: String,
    host: String,
    seen: Mutex<HashMap<String, Seen>>,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder")
            .field("component", &self.component)
            .field("host", &self.host)
            .finish_non_exhaustive()
    }
}

impl EventRecorder {
    /// A recorder reporting as `component` from this host.
    pub fn new(client: Client, component: &str) -> Self {
        let host = hostname::get()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_default();
        Self {
            client,
            component: component.to_owned(),
            host,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// The same recorder naming `host` as its source's host (a node agent names its node,
    /// as client-go's recorder in upstream's handler does, not its pod's hostname).
    #[must_use]
    pub fn on_host(mut self, host: &str) -> Self {
        host.clone_into(&mut self.host);
        self
    }

    /// Records an event about `obj`; never fails (errors are logged).
    pub async fn record<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        kind: EventType,
        reason: &str,
        message: &str,
    ) {
        let regarding = obj.object_ref(&());
        self.record_ref(regarding, kind, reason, message).await;
    }

    /// As [`Self::record`], for an object reference.
    pub async fn record_ref(
        &self,
        regarding: ObjectReference,
        kind: EventType,
        reason: &str,
        message: &str,
    ) {
        let namespace = regarding
            .namespace
            .clone()
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| "default".to_owned());
        let key = self.cache_key(&regarding, kind, reason, message);
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let now = Time(Timestamp::now());
        let previous = self.lookup(&key);
        if let Some(seen) = previous {
            let count = seen.count.saturating_add(1);
            let patch = json!({"count": count, "lastTimestamp": now});
            match api
                .patch(&seen.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.remember(key, seen.name, count);
                    return;
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    tracing::warn!(reason, error = %e, "could not update event");
                    return;
                }
            }
        }
        let name = format!(
            "{}.{:x}",
            regarding.name.as_deref().unwrap_or_default(),
            Timestamp::now().as_nanosecond()
        );
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace),
                ..ObjectMeta::default()
            },
            involved_object: regarding,
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            type_: Some(kind.as_str().to_owned()),
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: Some(self.host.clone()).filter(|h| !h.is_empty()),
            }),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            reporting_component: Some(self.component.clone()),
            reporting_instance: Some(self.host.clone()),
            ..Event::default()
        };
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => self.remember(key, name, 1),
            Err(e) => tracing::warn!(reason, error = %e, "could not record event"),
        }
    }

    fn cache_key(
        &self,
        r: &ObjectReference,
        kind: EventType,
        reason: &str,
        message: &str,
    ) -> String {
        let field = |v: &Option<String>| v.clone().unwrap_or_default();
        [
            self.component.clone(),
            self.host.clone(),
            field(&r.kind),
            field(&r.namespace),
            field(&r.name),
            field(&r.uid),
            field(&r.api_version),
            kind.as_str().to_owned(),
            reason.to_owned(),
            message.to_owned(),
        ]
        .join("\u{0}")
    }

    fn lookup(&self, key: &str) -> Option<Seen> {
        self.seen
            .lock()
            .ok()
            .and_then(|seen| seen.get(key).cloned())
    }

    fn remember(&self, key: String, name: String, count: i32) {
        if let Ok(mut seen) = self.seen.lock() {
            if seen.len() >= CACHE_SIZE && !seen.contains_key(&key) {
                seen.clear();
            }
            seen.insert(key, Seen { name, count });
        }
    }
}
