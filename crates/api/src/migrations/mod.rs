//! `migrations.kubevirt.io` API group.

pub mod v1alpha1;
