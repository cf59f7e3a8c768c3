//! The RBAC authorizer: an in-memory index of every Role, ClusterRole, RoleBinding and
//! ClusterRoleBinding, kept up to date from one store watch on the RBAC prefix, and kube's
//! evaluation over it.
//!
//! Data flow: the first decision lists the RBAC prefix from the store and opens a watch
//! from the list's revision; every decision then first applies the events the watch has
//! ready (never waiting), then evaluates against the index. A watch that lagged or ended
//! is replaced by a fresh list.
//!
//! # Guarantees
//! - Read-your-writes: the store queues a write's watch event before the write is
//!   acknowledged, so a decision made after a client saw its RBAC write acknowledged sees
//!   that write (a new RoleBinding takes effect on the very next request).
//! - `system:masters` is allowed everything, whatever the index holds.
//! - ClusterRole aggregation is evaluated at decision time, transitively (`admin` gets
//!   `edit`'s rules and `edit` gets `view`'s), with cycles cut.
//!
//! # Caveats
//! - A RoleBinding or ClusterRoleBinding naming a role that does not exist grants nothing
//!   (kube does the same and says so in the decision's reason; we do not).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError};

use futures::FutureExt;
use kubevirt_store::{Event, Store, WatchStream};
use tracing::{debug, warn};

use super::attributes::Attributes;
use super::rules::{Binding, ClusterRole, PolicyRule};
use crate::auth::User;
use crate::handlers::common::decode_record;

/// The superuser group (kube's `system:masters`).
pub const MASTERS_GROUP: &str = "system:masters";

/// Every RBAC object lives under this store prefix.
const PREFIX: &str = "/registry/rbac.authorization.k8s.io/";

/// An authorization decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// Why (kube's RBAC reason for an allow: which binding of which role to which subject).
    pub reason: String,
}

#[derive(Debug, Default)]
struct Index {
    /// (namespace, name) → rules.
    roles: HashMap<(String, String), Vec<PolicyRule>>,
    cluster_roles: HashMap<String, ClusterRole>,
    /// namespace → name → binding.
    role_bindings: HashMap<String, HashMap<String, Binding>>,
    cluster_role_bindings: HashMap<String, Binding>,
}

/// What a store key under [`PREFIX`] names.
enum Key<'a> {
    Role(&'a str, &'a str),
    ClusterRole(&'a str),
    RoleBinding(&'a str, &'a str),
    ClusterRoleBinding(&'a str),
}

fn parse_key(key: &str) -> Option<Key<'_>> {
    let rest = key.strip_prefix(PREFIX)?;
    let (plural, rest) = rest.split_once('/')?;
    let namespaced = || rest.split_once('/');
    Some(match plural {
        "roles" => namespaced().map(|(ns, n)| Key::Role(ns, n))?,
        "rolebindings" => namespaced().map(|(ns, n)| Key::RoleBinding(ns, n))?,
        "clusterroles" => Key::ClusterRole(rest),
        "clusterrolebindings" => Key::ClusterRoleBinding(rest),
        _ => return None,
    })
}

impl Index {
    fn put(&mut self, record: &kubevirt_store::Record) {
        let Some(key) = parse_key(&record.key) else {
            return;
        };
        let obj = match decode_record(record) {
            Ok(o) => o,
            Err(e) => {
                warn!(key = %record.key, error = %e.message, "RBAC object unreadable: it grants nothing");
                return self.remove(&record.key);
            }
        };
        match key {
            Key::Role(ns, n) => {
                self.roles
                    .insert((ns.into(), n.into()), PolicyRule::list_from(&obj));
            }
            Key::ClusterRole(n) => {
                self.cluster_roles
                    .insert(n.into(), ClusterRole::from_json(&obj));
            }
            Key::RoleBinding(ns, n) => {
                let mut b = Binding::from_json(&obj);
                b.namespace = ns.into();
                self.role_bindings
                    .entry(ns.into())
                    .or_default()
                    .insert(n.into(), b);
            }
            Key::ClusterRoleBinding(n) => {
                let mut b = Binding::from_json(&obj);
                b.namespace = String::new();
                self.cluster_role_bindings.insert(n.into(), b);
            }
        }
    }

    fn remove(&mut self, key: &str) {
        match parse_key(key) {
            Some(Key::Role(ns, n)) => {
                self.roles.remove(&(ns.to_owned(), n.to_owned()));
            }
            Some(Key::ClusterRole(n)) => {
                self.cluster_roles.remove(n);
            }
            Some(Key::RoleBinding(ns, n)) => {
                if let Some(m) = self.role_bindings.get_mut(ns) {
                    m.remove(n);
                }
            }
            Some(Key::ClusterRoleBinding(n)) => {
                self.cluster_role_bindings.remove(n);
            }
            None => {}
        }
    }

    /// A ClusterRole's effective rules: its own, or with an `aggregationRule` the rules
    /// of every ClusterRole its selectors match (transitively).
    fn cluster_role_rules(&self, name: &str) -> Vec<PolicyRule> {
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        self.collect_cluster_role(name, &mut seen, &mut out);
        out
    }

    fn collect_cluster_role(
        &self,
        name: &str,
        seen: &mut BTreeSet<String>,
        out: &mut Vec<PolicyRule>,
    ) {
        if !seen.insert(name.to_owned()) {
            return;
        }
        let Some(role) = self.cluster_roles.get(name) else {
            return;
        };
        let Some(selectors) = &role.aggregation else {
            out.extend(role.rules.iter().cloned());
            return;
        };
        let mut matched: Vec<&String> = self
            .cluster_roles
            .iter()
            .filter(|(n, r)| *n != name && selectors.iter().any(|s| s.matches(&r.labels)))
            .map(|(n, _)| n)
            .collect();
        matched.sort();
        for n in matched {
            self.collect_cluster_role(n, seen, out);
        }
    }

    fn binding_rules(&self, b: &Binding) -> Vec<PolicyRule> {
        match b.role_kind.as_str() {
            "ClusterRole" => self.cluster_role_rules(&b.role_name),
            "Role" if !b.namespace.is_empty() => self
                .roles
                .get(&(b.namespace.clone(), b.role_name.clone()))
                .cloned()
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// Visits the rules that apply to `user` in `namespace` (cluster-wide bindings
    /// always, RoleBindings of `namespace` when it is not empty), with the allow reason
    /// each would give; stops when `visit` returns `false`.
    fn visit(
        &self,
        user: &User,
        namespace: &str,
        mut visit: impl FnMut(&PolicyRule, &dyn Fn() -> String) -> bool,
    ) {
        let mut crbs: Vec<&Binding> = self.cluster_role_bindings.values().collect();
        crbs.sort_by(|a, b| a.name.cmp(&b.name));
        for b in crbs {
            let Some(subject) = b.subject_for(user) else {
                continue;
            };
            for rule in self.binding_rules(b) {
                let why = || {
                    format!(
                        "RBAC: allowed by ClusterRoleBinding \"{}\" of ClusterRole \"{}\" to {}",
                        b.name,
                        b.role_name,
                        subject.describe()
                    )
                };
                if !visit(&rule, &why) {
                    return;
                }
            }
        }
        if namespace.is_empty() {
            return;
        }
        let Some(rbs) = self.role_bindings.get(namespace) else {
            return;
        };
        let mut rbs: Vec<&Binding> = rbs.values().collect();
        rbs.sort_by(|a, b| a.name.cmp(&b.name));
        for b in rbs {
            let Some(subject) = b.subject_for(user) else {
                continue;
            };
            for rule in self.binding_rules(b) {
                let why = || {
                    format!(
                        "RBAC: allowed by RoleBinding \"{}/{}\" of {} \"{}\" to {}",
                        b.name,
                        b.namespace,
                        b.role_kind,
                        b.role_name,
                        subject.describe()
                    )
                };
                if !visit(&rule, &why) {
                    return;
                }
            }
        }
    }
}

struct Inner {
    index: Index,
    watch: Option<WatchStream>,
}

/// RBAC over an in-memory index of the store's RBAC objects (see the module docs).
pub struct Authorizer {
    store: Store,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorizer").finish_non_exhaustive()
    }
}

impl Authorizer {
    /// An authorizer over `store`'s RBAC objects (read on first use).
    pub fn new(store: Store) -> Authorizer {
        Authorizer {
            store,
            inner: Mutex::new(Inner {
                index: Index::default(),
                watch: None,
            }),
        }
    }

    /// Runs `f` on the index after applying every ready watch event.
    fn with_index<T>(&self, f: impl FnOnce(&Index) -> T) -> T {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        self.catch_up(&mut inner);
        f(&inner.index)
    }

    fn catch_up(&self, inner: &mut Inner) {
        loop {
            let Some(watch) = inner.watch.as_mut() else {
                let listed = self.store.list(PREFIX, None, None);
                let mut index = Index::default();
                for r in &listed.records {
                    index.put(r);
                }
                inner.index = index;
                match self.store.watch(PREFIX, listed.revision) {
                    Ok(w) => inner.watch = Some(w),
                    Err(e) => {
                        warn!(error = %e, "RBAC watch failed: listing again on the next request");
                        return;
                    }
                }
                continue;
            };
            if watch.ready() == 0 {
                return;
            }
            match watch.next().now_or_never() {
                Some(Some(Ok(Event::Put { record, .. }))) => inner.index.put(&record),
                Some(Some(Ok(Event::Delete { record }))) => inner.index.remove(&record.key),
                Some(Some(Err(e))) => {
                    debug!(error = %e, "RBAC watch ended: listing again");
                    inner.watch = None;
                }
                Some(None) | None => return,
            }
        }
    }

    /// Whether `user` may do what `attrs` describe.
    pub fn authorize(&self, user: &User, attrs: &Attributes) -> Decision {
        if user.groups.iter().any(|g| g == MASTERS_GROUP) {
            return Decision {
                allowed: true,
                reason: String::new(),
            };
        }
        self.with_index(|index| {
            let mut reason = None;
            index.visit(user, &attrs.namespace, |rule, why| {
                if rule.allows(attrs) {
                    reason = Some(why());
                    return false;
                }
                true
            });
            Decision {
                allowed: reason.is_some(),
                reason: reason.unwrap_or_default(),
            }
        })
    }

    /// The effective rules of a `Role` (in `namespace`) or a `ClusterRole` (aggregation
    /// included); empty when it does not exist.
    pub fn role_rules(&self, kind: &str, namespace: &str, name: &str) -> Vec<PolicyRule> {
        self.with_index(|index| match kind {
            "ClusterRole" => index.cluster_role_rules(name),
            "Role" => index
                .roles
                .get(&(namespace.to_owned(), name.to_owned()))
                .cloned()
                .unwrap_or_default(),
            _ => Vec::new(),
        })
    }

    /// Every rule that applies to `user` in `namespace` (cluster-wide ones included):
    /// what a SelfSubjectRulesReview lists. `system:masters` gets kube's superuser rules.
    pub fn rules_for(&self, user: &User, namespace: &str) -> Vec<PolicyRule> {
        if user.groups.iter().any(|g| g == MASTERS_GROUP) {
            return vec![
                PolicyRule {
                    verbs: vec!["*".into()],
                    api_groups: vec!["*".into()],
                    resources: vec!["*".into()],
                    ..PolicyRule::default()
                },
                PolicyRule {
                    verbs: vec!["*".into()],
                    non_resource_urls: vec!["*".into()],
                    ..PolicyRule::default()
                },
            ];
        }
        self.with_index(|index| {
            let mut out = Vec::new();
            index.visit(user, namespace, |rule, _| {
                out.push(rule.clone());
                true
            });
            out
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::rbac::attributes::from_request;

    async fn put(store: &Store, key: &str, v: Value) {
        let bytes = serde_json::to_vec(&v).unwrap();
        store.create(key, Box::new(move |_| bytes)).await.unwrap();
    }

    fn bot() -> User {
        User {
            name: "system:serviceaccount:team:bot".into(),
            groups: vec![
                "system:serviceaccounts".into(),
                "system:authenticated".into(),
            ],
            ..User::default()
        }
    }

    #[tokio::test]
    async fn a_role_binding_takes_effect_at_once_and_only_in_its_namespace() {
        let store = Store::in_memory();
        let authz = Authorizer::new(store.clone());
        let list = from_request("GET", "/api/v1/namespaces/team/pods", "");
        assert!(!authz.authorize(&bot(), &list).allowed);
        put(
            &store,
            "/registry/rbac.authorization.k8s.io/roles/team/reader",
            json!({
                "metadata": {"name": "reader", "namespace": "team"},
                "rules": [{"verbs": ["list"], "apiGroups": [""], "resources": ["pods"]}],
            }),
        )
        .await;
        put(&store, "/registry/rbac.authorization.k8s.io/rolebindings/team/bot-reads", json!({
            "metadata": {"name": "bot-reads", "namespace": "team"},
            "roleRef": {"kind": "Role", "name": "reader", "apiGroup": "rbac.authorization.k8s.io"},
            "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": "team"}],
        })).await;
        let d = authz.authorize(&bot(), &list);
        assert!(d.allowed);
        assert_eq!(
            d.reason,
            "RBAC: allowed by RoleBinding \"bot-reads/team\" of Role \"reader\" to ServiceAccount \"team/bot\""
        );
        let elsewhere = from_request("GET", "/api/v1/namespaces/other/pods", "");
        assert!(!authz.authorize(&bot(), &elsewhere).allowed);
        store
            .delete(
                "/registry/rbac.authorization.k8s.io/rolebindings/team/bot-reads",
                None,
            )
            .await
            .unwrap();
        assert!(!authz.authorize(&bot(), &list).allowed);
    }

    #[tokio::test]
    async fn aggregated_cluster_roles_gather_the_rules_of_the_roles_they_select() {
        let store = Store::in_memory();
        let authz = Authorizer::new(store.clone());
        let agg = |to: &str| json!({"clusterRoleSelectors": [{"matchLabels": {format!("rbac.authorization.k8s.io/aggregate-to-{to}"): "true"}}]});
        put(
            &store,
            "/registry/rbac.authorization.k8s.io/clusterroles/edit",
            json!({
                "metadata": {"name": "edit"}, "aggregationRule": agg("edit"),
            }),
        )
        .await;
        put(&store, "/registry/rbac.authorization.k8s.io/clusterroles/view", json!({
            "metadata": {"name": "view", "labels": {"rbac.authorization.k8s.io/aggregate-to-edit": "true"}},
            "aggregationRule": agg("view"),
        })).await;
        put(
            &store,
            "/registry/rbac.authorization.k8s.io/clusterrolebindings/bot-edits",
            json!({
                "metadata": {"name": "bot-edits"},
                "roleRef": {"kind": "ClusterRole", "name": "edit"},
                "subjects": [{"kind": "Group", "name": "system:serviceaccounts"}],
            }),
        )
        .await;
        let get_widgets = from_request("GET", "/apis/example.com/v1/namespaces/x/widgets/w", "");
        assert!(!authz.authorize(&bot(), &get_widgets).allowed);
        put(&store, "/registry/rbac.authorization.k8s.io/clusterroles/widgets-view", json!({
            "metadata": {"name": "widgets-view", "labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}},
            "rules": [{"verbs": ["get"], "apiGroups": ["example.com"], "resources": ["widgets"]}],
        })).await;
        assert!(authz.authorize(&bot(), &get_widgets).allowed);
        assert_eq!(authz.rules_for(&bot(), "").len(), 1);
    }

    #[test]
    fn masters_are_allowed_everything() {
        let authz = Authorizer::new(Store::in_memory());
        let d = authz.authorize(&User::admin(), &from_request("DELETE", "/api/v1/nodes", ""));
        assert!(d.allowed);
    }
}
