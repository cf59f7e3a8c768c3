//! Pure mutators: KubeVirt's defaults applied to objects on CREATE, plus the JSON patch that
//! turns the submitted object into the mutated one.
//!
//! [`vmi`] follows upstream's order (`vmi-mutator.go` + `pkg/defaults`); [`vm`] fills the
//! template firmware; [`migration`] adds the selector label and finalizer; [`patch`] diffs two
//! JSON values into RFC 6902 operations.

pub mod migration;
pub mod patch;
pub mod vm;
pub mod vmi;

pub use migration::mutate_migration_create;
pub use patch::diff;
pub use vm::mutate_vm_create;
pub use vmi::{DefaultsError, mutate_vmi_create, set_spec_defaults};

#[cfg(test)]
mod tests;
