//! VirtualMachineInstanceMigration rules (`migration-create-admitter.go`,
//! `migration-update-admitter.go`). The VMI and the other migrations of the namespace are passed
//! in by the caller, which looks them up.

use kubevirt_api::constants::MIGRATION_SELECTOR_LABEL;
use kubevirt_api::v1::{
    VirtualMachineInstance, VirtualMachineInstanceMigration, VirtualMachineInstancePhase,
};

use super::{Cause, FieldPath, reason};
use crate::config::{ClusterConfig, gates};

/// Context of a migration CREATE.
#[derive(Clone, Copy, Debug)]
pub struct MigrationContext<'a> {
    /// The VMI named by `spec.vmiName`, if it exists.
    pub vmi: Option<&'a VirtualMachineInstance>,
    /// The other migrations in the namespace.
    pub others: &'a [VirtualMachineInstanceMigration],
    /// The requester is virt-controller's service account.
    pub user_is_virt_controller: bool,
}

/// Validates a migration CREATE; stops at the first failing step, like upstream.
#[must_use]
pub fn validate_migration(
    m: &VirtualMachineInstanceMigration,
    ctx: MigrationContext<'_>,
    cfg: &ClusterConfig,
) -> Vec<Cause> {
    let vmi_name = m.spec.vmi_name.as_deref().unwrap_or("");
    if vmi_name.is_empty() {
        return vec![Cause::required(
            "vmiName is missing",
            FieldPath::new("spec").child("vmiName"),
        )];
    }
    if m.spec.priority.is_some() && !ctx.user_is_virt_controller {
        return vec![Cause::new(
            reason::FORBIDDEN,
            "Migration priority queue, only virt-controller is allowed to set priority field",
            "spec.migrationPriority",
        )];
    }
    let ns = m.metadata.namespace.as_deref().unwrap_or("");
    let Some(vmi) = ctx.vmi else {
        return vec![Cause::invalid(
            format!("the VMI \"{ns}/{vmi_name}\" does not exist"),
            "",
        )];
    };
    let phase = vmi.status.as_ref().and_then(|s| s.phase.clone());
    if matches!(
        phase,
        Some(VirtualMachineInstancePhase::Succeeded | VirtualMachineInstancePhase::Failed)
    ) {
        return vec![Cause::invalid("Cannot migrate VMI in finalized state.", "")];
    }
    let not_migratable = vmi.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_.as_str() == "LiveMigratable" && c.status.as_str() == "False")
    });
    if let Some(cond) = not_migratable {
        return vec![Cause::invalid(
            format!(
                "Cannot migrate VMI, Reason: {}, Message: {}",
                cond.reason.as_deref().unwrap_or(""),
                cond.message.as_deref().unwrap_or("")
            ),
            "",
        )];
    }
    let in_flight = ctx.others.iter().find(|o| {
        o.spec.vmi_name.as_deref() == Some(vmi_name)
            && o.metadata.uid != m.metadata.uid
            && !o
                .status
                .as_ref()
                .and_then(|s| s.phase.as_ref())
                .is_some_and(|p| p.is_final())
    });
    if let Some(o) = in_flight {
        return vec![Cause::invalid(
            format!(
                "in-flight migration detected. Active migration job ({}) is currently already in progress for VMI {vmi_name}.",
                o.metadata.uid.as_deref().unwrap_or("")
            ),
            "",
        )];
    }
    if m.spec.send_to.is_some() || m.spec.receive.is_some() {
        if !cfg.gate(gates::DECENTRALIZED_LIVE_MIGRATION) {
            return vec![Cause::new(
                reason::NOT_SUPPORTED,
                format!(
                    "{} feature gate is not enabled in kubevirt resource",
                    gates::DECENTRALIZED_LIVE_MIGRATION
                ),
                "",
            )];
        }
        if let (Some(s), Some(r)) = (&m.spec.send_to, &m.spec.receive)
            && s.migration_id != r.migration_id
        {
            return vec![Cause::invalid(
                format!(
                    "sendTo migrationID {} does not match receive migrationID {}",
                    s.migration_id, r.migration_id
                ),
                "",
            )];
        }
    }
    Vec::new()
}

/// Validates a migration UPDATE: the spec is immutable; the selector label stays while in flight.
#[must_use]
pub fn validate_migration_update(
    old: &VirtualMachineInstanceMigration,
    new: &VirtualMachineInstanceMigration,
) -> Vec<Cause> {
    if old.spec != new.spec {
        return vec![Cause::new(
            reason::NOT_SUPPORTED,
            "update of Migration object's spec is restricted",
            "",
        )];
    }
    let finished = new
        .status
        .as_ref()
        .and_then(|s| s.phase.as_ref())
        .is_some_and(|p| p.is_final());
    let label = |m: &VirtualMachineInstanceMigration| {
        m.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(MIGRATION_SELECTOR_LABEL))
            .cloned()
    };
    if let (Some(old_v), false) = (label(old), finished) {
        let f = FieldPath::new("metadata").child("labels");
        match label(new) {
            None => {
                return vec![Cause::invalid(
                    "selector label can't be removed from an in-flight migration",
                    f,
                )];
            }
            Some(v) if v != old_v => {
                return vec![Cause::invalid(
                    "selector label can't be modified on an in-flight migration",
                    f,
                )];
            }
            Some(_) => {}
        }
    }
    Vec::new()
}
