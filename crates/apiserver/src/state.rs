//! Shared server state handed to every handler.

use std::collections::HashMap;
use std::sync::Arc;

use kubevirt_store::Store;

use crate::admission::Admission;
use crate::metrics::Metrics;
use crate::registry::Registry;

/// Everything a request handler needs; one per server, shared behind an `Arc`.
pub struct ApiState {
    pub store: Store,
    pub registry: Registry,
    pub metrics: Metrics,
    /// Admission hooks, called in order before every write.
    pub admission: Vec<Arc<dyn Admission>>,
    /// Bearer token → user name.
    pub tokens: HashMap<String, String>,
    /// Credentials for the server's own outgoing calls.
    pub outgoing: Outgoing,
}

/// The CA and client identities the server uses when it calls out (aggregated APIs, node
/// log servers); empty in states built without a PKI (unit tests).
#[derive(Clone, Debug, Default)]
pub struct Outgoing {
    /// The cluster CA (PEM).
    pub ca_pem: String,
    /// Certificate and key (PEM) presented to aggregated API backends.
    pub proxy_client: Option<(String, String)>,
    /// Certificate and key (PEM) presented to node log servers.
    pub kubelet_client: Option<(String, String)>,
}

impl ApiState {
    /// State over `store` with the built-in resources, no admission hooks and no tokens.
    pub fn new(store: Store) -> ApiState {
        ApiState {
            store,
            registry: Registry::new(),
            metrics: Metrics::default(),
            admission: Vec::new(),
            tokens: HashMap::new(),
            outgoing: Outgoing::default(),
        }
    }
}
