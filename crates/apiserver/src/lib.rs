//! Kubernetes-compatible REST API server over `kubevirt-store`.
//!
//! No `k8s-openapi` here: objects are `serde_json::Value`s. Request flow:
//! [`server`] (TLS, router) → [`auth`] → [`handlers`] (pure [`request`] parsing, then one
//! file per verb) → the store. [`registry`] knows the served resources (built-in and from
//! [`crd`]s); [`discovery`], [`openapi`] and [`table`] render what kubectl asks for;
//! [`status`] turns every failure into a `Status`.
//!
//! The pure algorithms live in their own modules so they can be tested and fuzzed alone:
//! - [`protobuf`]: Kubernetes protobuf request bodies → JSON,
//! - [`schema`]: CRD `openAPIV3Schema` validation, pruning and defaulting,
//! - [`jsonpath`]: the JSONPath subset of `additionalPrinterColumns`,
//! - [`patch`]: JSON Patch, JSON merge patch and strategic merge patch.
//!
//! Kubernetes API behaviours not implemented yet (each answers sensibly, never wrongly
//! silently, unless noted):
//! - server-side apply (`application/apply-patch+yaml` → 415 with a clear message) and
//!   `managedFields`;
//! - garbage collection of dependents: `propagationPolicy` is accepted, but every policy
//!   deletes the owner at once and dependents stay (seam: `handlers::delete`);
//! - graceful pod deletion (`deletionGracePeriodSeconds` countdown for bound pods);
//! - `scale` subresources (not advertised in discovery, 404);
//! - list snapshots: `continue` pages read current state; `resourceVersionMatch=Exact` and
//!   lists "at" an old revision read the current state;
//! - unknown-field detection for built-in kinds (only CRD schemas prune/report);
//! - webhook admission and aggregation (seam: [`admission::Admission`], called on every write);
//! - certificate rotation (the CA and leaf certificates are long-lived);
//! - RBAC authorization (every authenticated user may do everything).

pub mod admission;
pub mod aggregation;
pub mod auth;
pub mod cause;
pub mod client;
pub mod crd;
pub mod discovery;
pub mod gc;
pub mod handlers;
pub mod jsonpath;
pub mod logs;
pub mod metadata;
pub mod metrics;
pub mod openapi;
pub mod patch;
pub mod pki;
pub mod protobuf;
pub mod registry;
pub mod request;
pub mod schema;
pub mod selectors;
pub mod server;
pub mod state;
pub mod status;
pub mod table;
pub mod webhook;

pub use server::{Config, RunningServer, ServerError, run, start};
