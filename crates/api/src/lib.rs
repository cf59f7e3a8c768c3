//! `kubevirt.io/v1` and `pool.kubevirt.io/v1beta1` API types, constants and CRD generation.
pub mod crd;
