//! Migration defaults on CREATE (`migration-create-mutator.go`): the selector label naming the
//! VMI and the migration finalizer.

use kubevirt_api::constants::{MIGRATION_FINALIZER, MIGRATION_SELECTOR_LABEL};
use kubevirt_api::v1::VirtualMachineInstanceMigration;

/// Applies the migration CREATE defaults.
pub fn mutate_migration_create(m: &mut VirtualMachineInstanceMigration) {
    let vmi = m.spec.vmi_name.clone().unwrap_or_default();
    m.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(MIGRATION_SELECTOR_LABEL.into(), vmi);
    let finalizers = m.metadata.finalizers.get_or_insert_with(Vec::new);
    if !finalizers.iter().any(|f| f == MIGRATION_FINALIZER) {
        finalizers.push(MIGRATION_FINALIZER.into());
    }
}
