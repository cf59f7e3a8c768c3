//! The ClusterRole aggregation controller (kube-controller-manager's
//! `clusterrole-aggregation`): the stored `rules` of a ClusterRole with an
//! `aggregationRule` become the union of the rules of every other ClusterRole its
//! selectors match (selector by selector, roles by name, duplicates dropped), so
//! `kubectl get clusterrole view -o yaml` shows what `view` grants.
//!
//! Data flow: list the ClusterRoles, write every aggregated one whose rules differ, then
//! follow a store watch on ClusterRoles and do it again on every event (its own writes
//! included, which then find nothing to change). Writes go through the update handler as
//! `system:serviceaccount:kube-system:clusterrole-aggregation-controller`.
//!
//! # Guarantees
//! - The authorizer does not wait for this controller: it evaluates aggregation itself at
//!   decision time, so a new labelled role grants at once; this controller only makes the
//!   stored objects show it.
//!
//! # Caveats
//! - A conflicting write (someone updated the role meanwhile) is retried on the next
//!   event or after [`RETRY_AFTER`].

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tracing::{debug, warn};

use super::rules::ClusterRole;
use crate::handlers::common::{WriteOptions, decode_record};
use crate::handlers::update;
use crate::state::ApiState;

/// How long a failed pass waits before the next one.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

const PREFIX: &str = "/registry/rbac.authorization.k8s.io/clusterroles/";
const USER: &str = "system:serviceaccount:kube-system:clusterrole-aggregation-controller";

/// Starts the controller; it runs until the task is aborted or the store closes.
pub fn spawn(state: Arc<ApiState>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(state))
}

/// The rules each aggregated ClusterRole of `roles` should store, where they differ from
/// what it stores: (name, the role object with the new rules).
pub fn pending(roles: &[Value]) -> Vec<(String, Value)> {
    let mut named: Vec<(&str, &Value, ClusterRole)> = roles
        .iter()
        .map(|r| {
            (
                r["metadata"]["name"].as_str().unwrap_or(""),
                r,
                ClusterRole::from_json(r),
            )
        })
        .collect();
    named.sort_by(|a, b| a.0.cmp(b.0));
    let mut out = Vec::new();
    for (name, obj, role) in &named {
        let Some(selectors) = &role.aggregation else {
            continue;
        };
        let mut rules: Vec<Value> = Vec::new();
        for selector in selectors {
            for (other, other_obj, other_role) in &named {
                if other == name || !selector.matches(&other_role.labels) {
                    continue;
                }
                for rule in other_obj["rules"].as_array().into_iter().flatten() {
                    if !rules.contains(rule) {
                        rules.push(rule.clone());
                    }
                }
            }
        }
        let stored = obj["rules"].as_array().cloned().unwrap_or_default();
        if stored != rules {
            let mut updated = (*obj).clone();
            updated["rules"] = json!(rules);
            out.push(((*name).to_owned(), updated));
        }
    }
    out
}

/// One pass: every aggregated role gets its rules; `false` if a write failed.
async fn reconcile(state: &ApiState) -> bool {
    let Some(info) = state
        .registry
        .find("rbac.authorization.k8s.io", "v1", "clusterroles")
    else {
        return true;
    };
    let roles: Vec<Value> = state
        .store
        .list(PREFIX, None, None)
        .records
        .iter()
        .filter_map(|r| decode_record(r).ok())
        .collect();
    let opts = WriteOptions {
        user: USER.into(),
        ..WriteOptions::default()
    };
    let mut ok = true;
    for (name, role) in pending(&roles) {
        if let Err(e) = update::update(state, &info, None, &name, None, role, &opts).await {
            debug!(role = %name, error = %e.message, "aggregation: will retry");
            ok = false;
        }
    }
    ok
}

async fn run(state: Arc<ApiState>) {
    loop {
        let revision = state.store.current_revision();
        let mut ok = reconcile(&state).await;
        let mut watch = match state.store.watch(PREFIX, revision) {
            Ok(w) => w,
            Err(e) => {
                warn!(error = %e, "aggregation: watch failed; retrying");
                tokio::time::sleep(RETRY_AFTER).await;
                continue;
            }
        };
        loop {
            let event = tokio::select! {
                ev = watch.next() => ev,
                () = tokio::time::sleep(RETRY_AFTER), if !ok => {
                    ok = reconcile(&state).await;
                    continue;
                }
            };
            match event {
                Some(Ok(_)) => ok = reconcile(&state).await,
                Some(Err(_)) => break,
                None => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aggregated_role_gets_the_rules_of_the_roles_it_selects_once() {
        let agg = json!({"metadata": {"name": "view"}, "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"to-view": "true"}}]}});
        let rule = json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]});
        let a = json!({"metadata": {"name": "a", "labels": {"to-view": "true"}}, "rules": [rule]});
        let b = json!({"metadata": {"name": "b", "labels": {"to-view": "true"}}, "rules": [rule, {"verbs": ["list"], "nonResourceURLs": ["/x"]}]});
        let other = json!({"metadata": {"name": "c"}, "rules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}]});
        let todo = pending(&[agg, b, a, other]);
        assert_eq!(todo.len(), 1);
        assert_eq!(todo[0].0, "view");
        assert_eq!(todo[0].1["rules"].as_array().unwrap().len(), 2);
        let done = todo[0].1.clone();
        assert!(
            pending(&[done]).len() == 1,
            "alone it selects nothing, so its rules go"
        );
    }
}
