//! virt-api: KubeVirt's admission webhooks and the `subresources.kubevirt.io` API.
//!
//! Data flow: the API server sends an `AdmissionReview` over HTTPS to [`webhook`]; the handler
//! decodes the object, runs the pure [`mutate`] functions (defaults, returned as an RFC 6902 JSON
//! patch) or the pure [`validate`] functions (field-path [`validate::Cause`]s, answered as one
//! 422 `Invalid` status), both driven by a [`ClusterConfig`] derived from the `KubeVirt` CR.
//! The validators take no I/O. The API server proxies `subresources.kubevirt.io` (an aggregated
//! APIService, [`subresources::api_service`]) to [`subresources`]: on VMs `start`, `stop`,
//! `restart`, `migrate`, `addvolume`, `removevolume`; on VMIs `pause`, `unpause`, `softreboot`,
//! `addvolume`, `removevolume`, `guestosinfo`, `userlist`, `filesystemlist`, `console` and
//! `vnc` (pause, unpause, soft reboot, console and VNC relayed to the virt-handler of the
//! VMI's node; the three guest-agent ones answer upstream's "VMI does not have guest agent
//! connected", as the launcher has no agent channel); plus `version` and `healthz`.
//!
//! Entry points for the binary: [`server::run_virt_api_server`] (webhooks and subresources on
//! one HTTPS listener, as upstream's virt-api serves them on port 8443), or
//! [`webhook::run_webhook_server`] and [`subresources::run_subresource_server`] apart;
//! [`webhook::webhook_configurations_for`] and [`subresources::api_service`] (the registration
//! objects to create in the API server).

pub mod config;
pub mod metrics;
pub mod mutate;
pub mod server;
mod serving;
pub mod subresources;
pub mod validate;
pub mod webhook;

pub use config::ClusterConfig;
