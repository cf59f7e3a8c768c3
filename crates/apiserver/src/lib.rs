//! Kubernetes-compatible REST API server over `kubevirt-store`.
//!
//! No `k8s-openapi` here: objects are `serde_json::Value`s. The pure algorithms live in
//! their own modules so they can be tested and fuzzed alone:
//! - [`protobuf`]: Kubernetes protobuf request bodies → JSON,
//! - [`schema`]: CRD `openAPIV3Schema` validation, pruning and defaulting,
//! - [`jsonpath`]: the JSONPath subset of `additionalPrinterColumns`,
//! - [`patch`]: JSON Patch, JSON merge patch and strategic merge patch.

pub mod cause;
pub mod jsonpath;
pub mod patch;
pub mod protobuf;
pub mod schema;
