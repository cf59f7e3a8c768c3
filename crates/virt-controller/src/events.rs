//! Kubernetes Events of the VM and VMI controllers (`kubectl describe vm|vmi`).
//!
//! Data flow: a controller calls [`EventRecorder::record`] after acting on the API (a VMI or
//! pod created or deleted, or a failure to); the recorder publishes an `events.k8s.io/v1`
//! Event through kube-rs' [`Recorder`], which creates it, or patches its `series` when the
//! same event repeats within a few minutes.
//!
//! Reasons, types and messages are upstream's (`pkg/virt-controller/watch/common/events.go`,
//! `pkg/controller/controller.go`); the reporting controller is upstream's
//! `virtualmachine-controller`, the component name both its VM and VMI recorders use.
//!
//! # Guarantees
//! Recording never fails a reconcile: a failed publish is logged at warn and dropped.
//!
//! # Caveats
//! - Upstream writes core `v1` Events; these are `events.k8s.io/v1`, with `action`
//!   [`ACTION_CREATE`] or [`ACTION_DELETE`]. Our embedded API server keeps the two Event
//!   APIs apart, so these do not yet show in core `v1` lists (what `kubectl describe`
//!   reads); `kubectl get events.v1.events.k8s.io` shows them.
//! - kube-rs folds a repeat of the same (type, reason, action, regarding, related) into the
//!   first event's `series` and keeps the first note. Successes name the created or deleted
//!   object as `related`, so each one is its own event; repeated failures of one action are
//!   counted in one event showing the first error.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// The reporting controller (upstream's event source component of the VM and VMI
/// controllers).
pub const REPORTING_CONTROLLER: &str = "virtualmachine-controller";

/// `SuccessfulCreate`: a VMI (VM controller) or launcher pod (VMI controller) was created.
pub const SUCCESSFUL_CREATE: &str = "SuccessfulCreate";
/// `FailedCreate`: creating a VMI or launcher pod failed.
pub const FAILED_CREATE: &str = "FailedCreate";
/// `SuccessfulDelete`: a VMI or launcher pod was deleted.
pub const SUCCESSFUL_DELETE: &str = "SuccessfulDelete";
/// `FailedDelete`: deleting a VMI or launcher pod failed.
pub const FAILED_DELETE: &str = "FailedDelete";

/// The `action` of creation events.
pub const ACTION_CREATE: &str = "Create";
/// The `action` of deletion events.
pub const ACTION_DELETE: &str = "Delete";

/// One recorder shared by the VM and VMI controllers (cheap to clone; clones share the
/// series cache).
#[derive(Clone)]
pub struct EventRecorder {
    recorder: Recorder,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder")
            .field("controller", &REPORTING_CONTROLLER)
            .finish_non_exhaustive()
    }
}

impl EventRecorder {
    /// A recorder reporting as [`REPORTING_CONTROLLER`] from this host.
    pub fn new(client: Client) -> Self {
        Self {
            recorder: Recorder::new(client, Reporter::from(REPORTING_CONTROLLER)),
        }
    }

    /// A `Normal` event about `regarding`.
    pub async fn normal(
        &self,
        regarding: &ObjectReference,
        related: Option<ObjectReference>,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.record(EventType::Normal, regarding, related, reason, action, note)
            .await;
    }

    /// A `Warning` event about `regarding`.
    pub async fn warning(
        &self,
        regarding: &ObjectReference,
        related: Option<ObjectReference>,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.record(EventType::Warning, regarding, related, reason, action, note)
            .await;
    }

    /// Publishes the event; a failure is logged, never returned.
    pub async fn record(
        &self,
        type_: EventType,
        regarding: &ObjectReference,
        related: Option<ObjectReference>,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: related,
        };
        if let Err(error) = self.recorder.publish(&event, regarding).await {
            tracing::warn!(
                %error,
                reason,
                name = regarding.name.as_deref().unwrap_or_default(),
                "recording an event failed"
            );
        }
    }
}
