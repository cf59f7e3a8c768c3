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

pub mod admission;
pub mod auth;
pub mod cause;
pub mod crd;
pub mod discovery;
pub mod handlers;
pub mod jsonpath;
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

pub use server::{Config, RunningServer, ServerError, run, start};
