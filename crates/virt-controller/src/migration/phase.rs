//! The migration's phase machine (upstream's `sync` failure checks and
//! `processMigrationPhase`, local migrations only): a pure function of the migration, its VMI
//! and its target pod.
//!
//! Failure checks come first, in upstream's order; then one step of progression:
//! `""` → `Pending` → `Scheduling` (target pod exists) → `Scheduled` (target pod ready) →
//! `PreparingTarget` (hand-off seen on the VMI: `migrationState.migrationUid` is this migration
//! and `targetNode` set) → `TargetReady` (`targetNodeAddress` set) → `Running`
//! (`startTimestamp` set) → `Succeeded` (`completed`, and no `HotVCPUChange`,
//! `HotMemoryChange=True` or `MigrationRequired=True`).

use k8s_openapi::api::core::v1::Pod;
use kubevirt_api::v1::{
    MigrationConditionType, MigrationPhase, VirtualMachineInstance,
    VirtualMachineInstanceConditionType as VmiCond, VirtualMachineInstanceMigration,
    VirtualMachineInstanceMigrationState,
};

use crate::runtime::events::EventType;
use crate::vmi::status::{pod_is_down, pod_is_ready};

/// Upstream's event reasons.
pub const FAILED_MIGRATION: &str = "FailedMigration";
pub const SUCCESSFUL_MIGRATION: &str = "SuccessfulMigration";

/// What the VMI needs from this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmiAction {
    /// Nothing.
    None,
    /// Create the target pod (phase `Pending`, no pod yet).
    CreateTargetPod,
    /// Hand the migration over to the handlers: write `migrationState` and the target label.
    HandOff,
    /// Ask the source handler to abort (`migrationState.abortRequested`).
    Abort,
}

/// The outcome of one pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The phase to write.
    pub phase: MigrationPhase,
    /// An event on the migration.
    pub event: Option<(EventType, &'static str, &'static str)>,
    /// Add the `migrationAbortRequested` condition.
    pub abort_condition: bool,
    /// What to do to the VMI or the target pod.
    pub action: VmiAction,
}

impl Decision {
    fn stay(phase: MigrationPhase) -> Self {
        Decision {
            phase,
            event: None,
            abort_condition: false,
            action: VmiAction::None,
        }
    }

    fn fail(message: &'static str) -> Self {
        Decision {
            event: Some((EventType::Warning, FAILED_MIGRATION, message)),
            ..Self::stay(MigrationPhase::Failed)
        }
    }

    fn to(phase: MigrationPhase) -> Self {
        Self::stay(phase)
    }
}

/// The VMI's migration state.
pub fn migration_state(
    vmi: &VirtualMachineInstance,
) -> Option<&VirtualMachineInstanceMigrationState> {
    vmi.status.as_ref()?.migration_state.as_ref()
}

/// Whether the VMI's migration state belongs to `migration` (upstream's hand-off test).
pub fn handed_off(
    migration: &VirtualMachineInstanceMigration,
    vmi: &VirtualMachineInstance,
) -> bool {
    let uid = migration.metadata.uid.as_deref();
    uid.is_some() && migration_state(vmi).and_then(|s| s.migration_uid.as_deref()) == uid
}

fn has_abort_condition(migration: &VirtualMachineInstanceMigration) -> bool {
    migration.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == MigrationConditionType::AbortRequested)
    })
}

fn vmi_is_final(vmi: &VirtualMachineInstance) -> bool {
    vmi.status
        .as_ref()
        .and_then(|s| s.phase.as_ref())
        .is_some_and(kubevirt_api::v1::VirtualMachineInstancePhase::is_final)
}

/// Whether the target pod has been created: the phase is past `Pending`.
fn target_created(phase: &MigrationPhase) -> bool {
    matches!(
        phase,
        MigrationPhase::Scheduling
            | MigrationPhase::Scheduled
            | MigrationPhase::PreparingTarget
            | MigrationPhase::TargetReady
            | MigrationPhase::Running
    )
}

/// Whether the phase comes after the hand-off.
fn after_hand_off(phase: &MigrationPhase) -> bool {
    matches!(
        phase,
        MigrationPhase::PreparingTarget | MigrationPhase::TargetReady | MigrationPhase::Running
    )
}

/// Whether a hotplug change still has to be applied on the target (upstream waits for them).
fn hotplug_pending(vmi: &VirtualMachineInstance) -> bool {
    vmi.status.as_ref().is_some_and(|s| {
        s.conditions.iter().any(|c| {
            c.type_ == VmiCond::HotVcpuChange
                || c.is_true(&VmiCond::HotMemoryChange)
                || c.is_true(&VmiCond::MigrationRequired)
        })
    })
}

/// Decides one pass for a migration that is not final. `other_in_progress`: the VMI's
/// migration state belongs to another migration that is not final.
pub fn decide(
    migration: &VirtualMachineInstanceMigration,
    vmi: Option<&VirtualMachineInstance>,
    target_pod: Option<&Pod>,
    other_in_progress: bool,
) -> Decision {
    let phase = migration
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    let Some(vmi) = vmi else {
        return Decision::fail("Migration failed because vmi does not exist.");
    };
    let ours = handed_off(migration, vmi);
    let state = migration_state(vmi);
    let succeeded_source =
        ours && state.is_some_and(|s| s.completed == Some(true) && s.failed != Some(true));
    let deleting = migration.metadata.deletion_timestamp.is_some();
    if vmi_is_final(vmi) && !succeeded_source {
        return Decision::fail("Migration failed vmi shutdown during migration.");
    }
    if deleting && !ours {
        return Decision {
            abort_condition: !has_abort_condition(migration),
            ..Decision::fail("Migration failed due to being canceled")
        };
    }
    if target_pod.is_some_and(pod_is_down) {
        return Decision::fail("Migration failed because target pod shutdown during migration");
    }
    if target_created(&phase) && target_pod.is_none() {
        return Decision::fail("Migration target pod was removed during active migration.");
    }
    if after_hand_off(&phase) {
        match state.and_then(|s| s.migration_uid.as_deref()) {
            None => {
                return Decision::fail(
                    "VMI's migration state was cleared during the active migration.",
                );
            }
            Some(_) if !ours => {
                return Decision::fail(
                    "VMI's migration state was taken over by another migration job during active migration.",
                );
            }
            Some(_) => {}
        }
    }
    if ours && state.is_some_and(|s| s.failed == Some(true)) {
        return Decision::fail("source node reported migration failed");
    }
    if deleting {
        let mut d = Decision::stay(phase);
        d.abort_condition = !has_abort_condition(migration);
        if state.is_none_or(|s| s.abort_requested != Some(true)) {
            d.action = VmiAction::Abort;
        }
        return d;
    }
    progress(phase, vmi, target_pod, ours, other_in_progress)
}

fn progress(
    phase: MigrationPhase,
    vmi: &VirtualMachineInstance,
    target_pod: Option<&Pod>,
    ours: bool,
    other_in_progress: bool,
) -> Decision {
    let state = migration_state(vmi);
    let set = |f: fn(&VirtualMachineInstanceMigrationState) -> bool| state.is_some_and(f);
    match phase {
        MigrationPhase::Unset if other_in_progress => Decision::fail(
            "VMI is not eligible for migration because another migration job is in progress.",
        ),
        MigrationPhase::Unset => Decision::to(MigrationPhase::Pending),
        MigrationPhase::Pending if target_pod.is_some() => Decision::to(MigrationPhase::Scheduling),
        MigrationPhase::Pending => Decision {
            action: VmiAction::CreateTargetPod,
            ..Decision::stay(MigrationPhase::Pending)
        },
        MigrationPhase::Scheduling if target_pod.is_some_and(pod_is_ready) => {
            Decision::to(MigrationPhase::Scheduled)
        }
        MigrationPhase::Scheduled
            if ours && set(|s| s.target_node.as_deref().is_some_and(|n| !n.is_empty())) =>
        {
            Decision::to(MigrationPhase::PreparingTarget)
        }
        MigrationPhase::Scheduled => Decision {
            action: VmiAction::HandOff,
            ..Decision::stay(MigrationPhase::Scheduled)
        },
        MigrationPhase::PreparingTarget
            if set(|s| {
                s.target_node_address
                    .as_deref()
                    .is_some_and(|a| !a.is_empty())
            }) =>
        {
            Decision::to(MigrationPhase::TargetReady)
        }
        MigrationPhase::TargetReady if set(|s| s.start_timestamp.is_some()) => {
            Decision::to(MigrationPhase::Running)
        }
        MigrationPhase::Running if set(|s| s.completed == Some(true)) && !hotplug_pending(vmi) => {
            Decision {
                event: Some((
                    EventType::Normal,
                    SUCCESSFUL_MIGRATION,
                    "Source node reported migration succeeded",
                )),
                ..Decision::to(MigrationPhase::Succeeded)
            }
        }
        other => Decision::stay(other),
    }
}

/// Upstream's default `unschedulable` target pod timeout (seconds).
pub const UNSCHEDULABLE_POD_TIMEOUT_SECONDS: i64 = 5 * 60;
/// Upstream's default catch-all pending target pod timeout (seconds).
pub const PENDING_POD_TIMEOUT_SECONDS: i64 = 15 * 60;
/// Migration annotation overriding [`UNSCHEDULABLE_POD_TIMEOUT_SECONDS`].
pub const UNSCHEDULABLE_POD_TIMEOUT_ANNOTATION: &str =
    "kubevirt.io/migrationUnschedulablePodTimeoutSeconds";
/// Migration annotation overriding [`PENDING_POD_TIMEOUT_SECONDS`].
pub const PENDING_POD_TIMEOUT_ANNOTATION: &str = "kubevirt.io/migrationPendingPodTimeoutSeconds";
/// Upstream's event reason of an unschedulable target pod.
pub const TARGET_POD_UNSCHEDULABLE: &str = "migrationTargetPodUnschedulable";

/// What upstream's `handlePendingPodTimeout` does about a target pod that is still `Pending`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingPod {
    /// The pod is unschedulable (warn about it).
    pub unschedulable: bool,
    /// Delete it, with this message (a timeout passed).
    pub delete: Option<String>,
    /// Look again after this many seconds.
    pub recheck_seconds: Option<i64>,
}

fn timeout_of(migration: &VirtualMachineInstanceMigration, key: &str, default: i64) -> i64 {
    migration
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The pending-pod timeouts for `pod`, `now_seconds` being the current Unix time; `None` when
/// the pod is not pending (or is being deleted).
pub fn pending_pod(
    migration: &VirtualMachineInstanceMigration,
    pod: &Pod,
    now_seconds: i64,
) -> Option<PendingPod> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Pending") || pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let created = pod.metadata.creation_timestamp.as_ref()?.0.as_second();
    let pending = now_seconds - created;
    let unschedulable = status.conditions.iter().flatten().any(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    });
    let name = format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    );
    let unschedulable_timeout = timeout_of(
        migration,
        UNSCHEDULABLE_POD_TIMEOUT_ANNOTATION,
        UNSCHEDULABLE_POD_TIMEOUT_SECONDS,
    );
    let catch_all = timeout_of(
        migration,
        PENDING_POD_TIMEOUT_ANNOTATION,
        PENDING_POD_TIMEOUT_SECONDS,
    );
    let mut verdict = PendingPod {
        unschedulable,
        delete: None,
        recheck_seconds: None,
    };
    if unschedulable && pending >= unschedulable_timeout {
        verdict.delete = Some(format!("unschedulable pod {name} timeout period exceeded"));
    } else if pending >= catch_all {
        verdict.delete = Some(format!("pending pod {name} timeout period exceeded"));
    } else {
        let mut left = catch_all - pending;
        if unschedulable {
            left = left.min(unschedulable_timeout - pending);
        }
        verdict.recheck_seconds = Some(left.max(1));
    }
    Some(verdict)
}
