//! `kubevirt.io/v1`: the core KubeVirt kinds.
//!
//! One module per concern; every public type is also re-exported here, so callers write
//! `kubevirt_api::v1::VirtualMachine`.

pub mod conditions;
pub mod devices;
pub mod domain;
pub mod kubevirt;
pub mod migration;
pub mod network;
pub mod replicaset;
pub mod subresources;
pub mod vm;
pub mod vmi;
pub mod vmi_status;
pub mod volumes;

pub use conditions::*;
pub use devices::*;
pub use domain::*;
pub use kubevirt::*;
pub use migration::*;
pub use network::*;
pub use replicaset::*;
pub use subresources::*;
pub use vm::*;
pub use vmi::*;
pub use vmi_status::*;
pub use volumes::*;

#[cfg(test)]
mod roundtrip_tests;
