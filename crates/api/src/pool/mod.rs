//! `pool.kubevirt.io` API group.

pub mod v1beta1;
