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
        }
    }
}
