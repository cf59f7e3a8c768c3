//! virt-operator (upstream's `pkg/virt-operator`): installs KubeVirt onto a cluster and keeps
//! it installed for the KubeVirt CR.
//!
//! ```text
//!  kubevirt::run ──(Lease virt-operator)──► KubeVirt controller (kubevirt.rs)
//!        │ reconcile: status, finalizer, conditions
//!        ▼
//!  installer.rs ──renders── kubevirt_install (deploy/) ──► apply.rs ──► API server
//!        │
//!        ├── rollout.rs: the workloads' order, the update path's waits, virt-handler's canary
//!        └── certificates.rs: the KubeVirt CA and the components' certificates
//!
//!  serving.rs: /metrics (8443) and the CR's admission webhooks (8444), every replica
//! ```
//!
//! `kubevirt-rs operator` runs [`kubevirt::run`]; `kubevirt-rs server` applies `deploy/` and waits
//! with [`installer::wait_ready`]; virt-api (`kubevirt-rs api`) issues its
//! own serving certificate from [`certificates::KubeVirtCa`] when nothing is mounted.

pub mod apply;
pub mod certificates;
pub mod customize;
pub mod installer;
pub mod kubevirt;
pub mod rollout;
pub mod serving;
pub mod strategy;
