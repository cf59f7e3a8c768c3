//! Kubernetes-compatible REST API server over `kubevirt-store`.
//!
//! No `k8s-openapi` here: objects are `serde_json::Value`s. Request flow:
//! [`server`] (TLS, router) → [`auth`] → [`rbac`] → [`handlers`] (pure [`request`] parsing, then one
//! file per verb) → the store. [`registry`] knows the served resources (built-in and from
//! [`crd`]s); [`discovery`], [`openapi`] and [`table`] render what kubectl asks for;
//! [`status`] turns every failure into a `Status`; [`catch_panic`] turns a panicking
//! handler into one too.
//!
//! The pure algorithms live in their own modules so they can be tested and fuzzed alone:
//! - [`protobuf`]: Kubernetes protobuf request bodies → JSON,
//! - [`schema`]: CRD `openAPIV3Schema` validation, pruning and defaulting,
//! - [`metadata`] and [`core_validation`]: metadata and built-in kind validation
//!   (field-path causes),
//! - [`defaults`]: kube's defaulting of built-in kinds (pods, pod templates, `apps/v1`),
//!   applied on create and update before admission,
//! - [`jsonpath`]: the JSONPath subset of `additionalPrinterColumns`,
//! - [`patch`]: JSON Patch, JSON merge patch and strategic merge patch.
//!
//! Object lifecycle and the calls out of the server:
//! - [`gc`]: the garbage collector (ownerReferences; Background, Foreground with
//!   `blockOwnerDeletion`, Orphan; a start-up scan for owners deleted while down);
//! - [`handlers::delete`]: graceful deletion of pods bound to a node;
//! - [`webhook`]: admission webhooks (AdmissionReview v1 over HTTPS) behind the
//!   [`admission::Admission`] seam, in a mutating phase before schema validation and a
//!   validating phase after it;
//! - [`routing`]: Service references (webhooks, APIServices) routed to a ready endpoint
//!   of the Service's EndpointSlices, as kube-apiserver's endpoint routing;
//! - [`aggregation`]: APIService proxying (websocket upgrades included);
//! - [`handlers::scale`]: the `scale` subresource (`autoscaling/v1` Scale);
//! - [`handlers::eviction`]: `pods/eviction` (`policy/v1` Eviction: admission,
//!   PodDisruptionBudgets, then a delete), what `kubectl drain` uses;
//! - [`logs`]: `pods/log` from the node's log server (its contract is documented there);
//! - [`client`]: the outgoing HTTPS client they share;
//! - [`serviceaccount`]: service-account tokens (issued through `serviceaccounts/token`,
//!   checked by [`auth`]);
//! - [`rbac`]: authorization as kube's RBAC authorizer decides (Roles, ClusterRoles with
//!   aggregation, bindings; `system:masters` always allowed) from an in-memory index fed by
//!   a store watch, impersonation (`Impersonate-*`, the `impersonate` verb), kube's bootstrap
//!   policy, escalation prevention (`escalate`/`bind`), 403 `Forbidden` in kube's words,
//!   and the `authorization.k8s.io` reviews;
//! - [`builtin_controllers`]: kube-controller-manager's serviceaccount and
//!   root-ca-cert-publisher roles (a `default` ServiceAccount and a `kube-root-ca.crt`
//!   ConfigMap in every namespace).
//!
//! Kubernetes API behaviours not implemented yet (each answers sensibly, never wrongly
//! silently, unless noted):
//! - server-side apply (`application/apply-patch+yaml` → 415 with a clear message) and
//!   `managedFields`;
//! - list snapshots: `continue` pages read current state; `resourceVersionMatch=Exact` and
//!   lists "at" an old revision read the current state;
//! - unknown-field detection for built-in kinds (only CRD schemas prune/report);
//! - namespace deletion removes the contents synchronously with grace period 0 (kube's
//!   namespace controller waits for graceful pod termination);
//! - webhooks: no `reinvocationPolicy` or `matchPolicy: Equivalent`; of `matchConditions`
//!   only `object.metadata.name.startsWith("…")` is evaluated (other CEL counts as met);
//!   webhooks see objects before CRD schema defaulting (defaults are applied after
//!   mutation);
//! - aggregated discovery lists an aggregated group's versions without resources (the
//!   legacy `/apis/<group>/<version>` document comes from the backend);
//! - certificate rotation (the CA and leaf certificates are long-lived);
//! - authentication: a client certificate of our CA is its subject (CN user, O groups),
//!   as with kube's x509 authenticator; legacy Secret-based service-account tokens are
//!   not issued or accepted; anonymous requests are refused except the health and version
//!   paths;
//! - the RBAC index is not shared with the list/watch of RBAC objects (two readers of the
//!   same store prefix).

pub mod admission;
pub mod aggregation;
pub mod auth;
pub mod builtin_controllers;
pub mod catch_panic;
pub mod cause;
pub mod client;
pub mod core_validation;
pub mod crd;
pub mod defaults;
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
pub mod qos;
pub mod rbac;
pub mod registry;
pub mod request;
pub mod routing;
pub mod schema;
pub mod selectors;
pub mod server;
pub mod serviceaccount;
pub mod services;
pub mod state;
pub mod status;
pub mod table;
pub mod webhook;

pub use server::{Config, RunningServer, ServerError, run, start};
