//! `kubevirt.io/v1` and `pool.kubevirt.io/v1beta1` API types, constants and CRD generation.
//!
//! - [`v1`]: VirtualMachineInstance, VirtualMachine, VirtualMachineInstanceMigration,
//!   VirtualMachineInstanceReplicaSet, KubeVirt, with upstream JSON names.
//! - [`pool`] (`v1beta1`): VirtualMachinePool.
//! - [`cdi`]: the `cdi.kubevirt.io/v1beta1` DataVolume fields KubeVirt reads (and its CRD).
//! - [`constants`]: labels, annotations and finalizers KubeVirt writes.
//! - [`crd`]: structural CustomResourceDefinitions generated from the types.
//! - [`quantity`]: exact Kubernetes resource quantities, the one parser every crate uses.
//! - [`live_update`]: the rules of CPU and memory hotplug.
//! - [`events`]: the one Event recorder every component writes its Events with.
//! - [`duration`]: Go durations as `metav1.Duration` spells them.
//! - [`cluster_config`]: the one watch of the `KubeVirt` CR every component subscribes to.
//! - [`rest_client_metrics`]: upstream's `kubevirt_rest_client_*` families, counted by a layer of
//!   every component's client.
//!
//! Apart from [`cluster_config`] and [`events`] the crate does no I/O. Every optional field round-trips: decoding an upstream manifest and
//! encoding it again yields the same JSON, and unknown enum strings are kept verbatim.

mod string_enum;

pub mod cdi;
pub mod cluster_config;
pub mod constants;
pub mod crd;
pub mod duration;
pub mod events;
pub mod exposition;
pub mod live_update;
pub mod migrations;
pub mod pool;
pub mod rest_client_metrics;
pub mod tsc;
pub use k8s_quantity as quantity;
pub mod v1;
