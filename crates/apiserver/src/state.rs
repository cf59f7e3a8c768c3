//! Shared server state handed to every handler.

use std::collections::HashMap;
use std::sync::Arc;

use kubevirt_store::Store;

use crate::admission::Admission;
use crate::metrics::Metrics;
use crate::rbac::Authorizer;
use crate::registry::Registry;
use crate::serviceaccount::TokenIssuer;

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
    /// Signs and verifies service-account tokens; `None` only if no key could be made
    /// (then token requests fail and only certificates and the tokens file authenticate).
    pub token_issuer: Option<Arc<TokenIssuer>>,
    /// RBAC over the store's Roles, ClusterRoles and bindings.
    pub authorizer: Arc<Authorizer>,
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
    /// State over `store` with the built-in resources, RBAC's escalation check as the only
    /// admission hook, no tokens file
    /// and a service-account token issuer whose key is kept nowhere.
    pub fn new(store: Store) -> ApiState {
        let authorizer = Arc::new(Authorizer::new(store.clone()));
        ApiState {
            admission: vec![Arc::new(crate::rbac::escalation::EscalationCheck::new(
                authorizer.clone(),
            ))],
            authorizer,
            store,
            registry: Registry::new(),
            metrics: Metrics::default(),
            tokens: HashMap::new(),
            outgoing: Outgoing::default(),
            token_issuer: TokenIssuer::ephemeral().ok().map(Arc::new),
        }
    }
}
