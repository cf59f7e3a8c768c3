//! virt-controller: the cluster-wide KubeVirt controllers.
//!
//! Data flow: [`runtime::informer`]s watch the API server and fill read-only caches; their
//! event handlers map changed objects to keys on a rate-limited [`runtime::queue`]; a
//! [`runtime::controller`] runs workers that pull keys and call a reconciler, which reads
//! from the caches, consults [`runtime::expectations`] and writes through the API. Only the
//! replica holding the [`runtime::leader`] lease runs controllers.

pub mod runtime;

pub mod metadata_sync;
pub mod sync_failure;

pub mod vm;

pub mod app;
pub mod evacuation;
pub mod kubevirt_config;
pub mod migration;
pub mod node;
pub mod serving;
pub mod topology;
pub mod vmi;
pub mod workload_updater;
