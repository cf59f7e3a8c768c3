//! `POST pods/{name}/eviction` (a `policy/v1` Eviction): a pod deletion that honours
//! PodDisruptionBudgets, as kube-apiserver's eviction REST (`kubectl drain` uses it).
//!
//! Flow: the Eviction names the pod of the URL; admission runs for `pods/eviction` `CREATE`
//! with the Eviction as object (virt-api's launcher eviction webhook answers there); then
//! - a pod already terminating, or in phase `Succeeded`, `Failed` or `Pending`, is deleted
//!   without looking at budgets;
//! - otherwise the budgets in the pod's namespace whose selector matches its labels are
//!   found: more than one is a 500 (as kube); with one, a budget not yet observed by its
//!   controller (`status.observedGeneration` behind) or with no `disruptionsAllowed` refuses
//!   with 429 `TooManyRequests` (cause `DisruptionBudget`) — `kubectl drain` retries those —
//!   unless the pod is not Ready and the budget is healthy (`IfHealthyBudget`, kube's
//!   default, or `AlwaysAllow`); else the budget's `disruptionsAllowed` is decremented and
//!   the pod noted in `disruptedPods` (with the budget's revision, retried on conflict), and
//!   the pod deleted with the Eviction's `deleteOptions` (its UID as precondition).
//!
//! The answer is kube's: 201 with a `Success` Status.

use serde_json::{Value, json};

use super::common::{
    Reply, WriteOptions, admission_request, admit, decode_listed, encoder, get_object, now_rfc3339,
    store_error, timed,
};
use super::delete::{self, DeleteOptions};
use crate::admission::{Operation, Phase};
use crate::cause::Cause;
use crate::registry::ResourceInfo;
use crate::state::ApiState;
use crate::status::ApiError;

/// kube's message when a budget forbids the eviction.
pub const VIOLATES_BUDGET: &str =
    "Cannot evict pod as it would violate the pod's disruption budget.";

/// How often the budget update is retried after a conflict.
const BUDGET_ATTEMPTS: usize = 5;

fn too_many_requests(cause: String) -> ApiError {
    let mut e = ApiError::new(429, "TooManyRequests", VIOLATES_BUDGET);
    e.causes = vec![Cause::new("DisruptionBudget", "", cause)];
    e
}

/// Whether the pod may go without consulting budgets (kube's `canIgnorePDB`).
fn ignores_budgets(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_string()
        || matches!(
            pod["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed" | "Pending")
        )
}

fn pod_is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// The budgets of `namespace` whose selector matches `pod` (a missing selector matches
/// nothing, an empty one everything, as `policy/v1`).
fn matching_budgets(
    state: &ApiState,
    budgets: &ResourceInfo,
    namespace: &str,
    pod: &Value,
) -> Vec<(Value, u64)> {
    state
        .store
        .list(&budgets.list_prefix(Some(namespace)), None, None)
        .records
        .iter()
        .filter_map(|r| decode_listed(r).map(|v| (v, r.revision)))
        .filter(|(pdb, _)| {
            let selector = &pdb["spec"]["selector"];
            selector.is_object()
                && crate::webhook::selector_matches(selector, &pod["metadata"]["labels"])
        })
        .collect()
}

/// What the budget decides for an eviction of `pod`.
#[derive(Debug)]
pub enum BudgetDecision {
    /// Evict without touching the budget (an unready pod and a healthy budget).
    Allow,
    /// Evict and record the disruption in the budget (the new budget).
    Consume(Value),
    /// Refuse.
    Refuse(ApiError),
}

/// kube's budget check for one budget (pure: the tests' oracle).
pub fn decide(pdb: &Value, pod: &Value, now: &str) -> BudgetDecision {
    let name = pdb["metadata"]["name"].as_str().unwrap_or_default();
    let status = &pdb["status"];
    let generation = pdb["metadata"]["generation"].as_i64().unwrap_or(0);
    if status["observedGeneration"].as_i64().unwrap_or(0) < generation {
        return BudgetDecision::Refuse(too_many_requests(format!(
            "The disruption budget {name} is still being processed by the server."
        )));
    }
    let allowed = status["disruptionsAllowed"].as_i64().unwrap_or(0);
    if allowed < 0 {
        return BudgetDecision::Refuse(ApiError::forbidden("pdb disruptions allowed is negative"));
    }
    let healthy = status["currentHealthy"].as_i64().unwrap_or(0);
    let desired = status["desiredHealthy"].as_i64().unwrap_or(0);
    let policy = pdb["spec"]["unhealthyPodEvictionPolicy"]
        .as_str()
        .unwrap_or("IfHealthyBudget");
    if !pod_is_ready(pod) && (policy == "AlwaysAllow" || healthy >= desired) {
        return BudgetDecision::Allow;
    }
    if allowed == 0 {
        return BudgetDecision::Refuse(too_many_requests(format!(
            "The disruption budget {name} needs {desired} healthy pods and has {healthy} currently"
        )));
    }
    let mut next = pdb.clone();
    next["status"]["disruptionsAllowed"] = json!(allowed - 1);
    let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
    if !next["status"]["disruptedPods"].is_object() {
        next["status"]["disruptedPods"] = json!({});
    }
    next["status"]["disruptedPods"][pod_name] = json!(now);
    BudgetDecision::Consume(next)
}

/// Evicts pod `name` as the Eviction `eviction` asks.
pub async fn evict(
    state: &ApiState,
    pods: &ResourceInfo,
    ns: Option<&str>,
    name: &str,
    eviction: &Value,
    opts: &WriteOptions,
) -> Result<Reply, ApiError> {
    let named = eviction["metadata"]["name"].as_str().unwrap_or(name);
    if named != name {
        return Err(ApiError::bad_request(
            "name in URL does not match name in Eviction object",
        ));
    }
    let namespace = ns.unwrap_or_default();
    let mut object = eviction.clone();
    let req = admission_request(
        Operation::Create,
        pods,
        Some("eviction"),
        ns,
        name,
        None,
        opts,
    );
    let mut warnings = admit(state, Phase::Mutating, &req, &mut object).await?;
    warnings.extend(admit(state, Phase::Validating, &req, &mut object).await?);

    let (pod, _) = get_object(state, pods, ns, name)?;
    if !ignores_budgets(&pod) {
        consume_budget(state, namespace, name, opts).await?;
    }
    let mut options: DeleteOptions =
        serde_json::from_value(eviction["deleteOptions"].clone()).unwrap_or_default();
    if options.preconditions.is_none() {
        options.preconditions = Some(delete::Preconditions {
            uid: pod["metadata"]["uid"].as_str().map(str::to_owned),
            resource_version: None,
        });
    }
    delete::delete(state, pods, ns, name, &options, opts).await?;
    Ok(Reply {
        code: 201,
        body: json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        warnings,
    })
}

/// Checks the pod's budget and records the disruption, retrying on conflicts.
async fn consume_budget(
    state: &ApiState,
    namespace: &str,
    name: &str,
    opts: &WriteOptions,
) -> Result<(), ApiError> {
    let Some(budgets) = state.registry.find("policy", "v1", "poddisruptionbudgets") else {
        return Ok(());
    };
    let pods = state
        .registry
        .find("", "v1", "pods")
        .ok_or_else(|| ApiError::internal("pods are not served"))?;
    for _ in 0..BUDGET_ATTEMPTS {
        let (pod, _) = get_object(state, &pods, Some(namespace), name)?;
        let found = matching_budgets(state, &budgets, namespace, &pod);
        let (pdb, rev) = match found.as_slice() {
            [] => return Ok(()),
            [one] => one.clone(),
            _ => {
                return Err(ApiError::internal(
                    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                ));
            }
        };
        let next = match decide(&pdb, &pod, &now_rfc3339()) {
            BudgetDecision::Allow => return Ok(()),
            BudgetDecision::Refuse(e) => return Err(e),
            BudgetDecision::Consume(next) => next,
        };
        if opts.dry_run {
            return Ok(());
        }
        let pdb_name = pdb["metadata"]["name"].as_str().unwrap_or_default();
        let key = budgets.key(Some(namespace), pdb_name);
        match timed(state, state.store.update(&key, rev, encoder(next))).await {
            Ok(_) => return Ok(()),
            Err(kubevirt_store::StoreError::Conflict { .. }) => {}
            Err(e) => return Err(store_error(&budgets, pdb_name, e)),
        }
    }
    Err(ApiError::conflict_because(
        "policy",
        "poddisruptionbudgets",
        name,
        "the budget changed too often; try again",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pdb(status: &Value) -> Value {
        json!({"metadata": {"name": "web", "generation": 2}, "spec": {"selector": {}}, "status": status})
    }

    fn pod(ready: bool) -> Value {
        json!({"metadata": {"name": "web-1"}, "status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}})
    }

    #[test]
    fn a_budget_with_room_is_consumed_and_the_pod_noted() {
        let status = json!({"observedGeneration": 2, "disruptionsAllowed": 1,
                            "currentHealthy": 2, "desiredHealthy": 1});
        let BudgetDecision::Consume(next) = decide(&pdb(&status), &pod(true), "T") else {
            panic!("not consumed");
        };
        assert_eq!(next["status"]["disruptionsAllowed"], 0);
        assert_eq!(next["status"]["disruptedPods"]["web-1"], "T");
    }

    #[test]
    fn an_exhausted_or_unobserved_budget_refuses_with_429() {
        let full = json!({"observedGeneration": 2, "disruptionsAllowed": 0,
                          "currentHealthy": 1, "desiredHealthy": 1});
        let BudgetDecision::Refuse(e) = decide(&pdb(&full), &pod(true), "T") else {
            panic!("not refused");
        };
        assert_eq!((e.code, e.reason.as_str()), (429, "TooManyRequests"));
        assert_eq!(e.message, VIOLATES_BUDGET);
        assert_eq!(
            e.causes[0].message,
            "The disruption budget web needs 1 healthy pods and has 1 currently"
        );
        let stale = json!({"observedGeneration": 1, "disruptionsAllowed": 5});
        let BudgetDecision::Refuse(e) = decide(&pdb(&stale), &pod(true), "T") else {
            panic!("not refused");
        };
        assert!(e.causes[0].message.contains("still being processed"));
    }

    #[test]
    fn an_unready_pod_goes_while_the_budget_is_healthy() {
        let healthy = json!({"observedGeneration": 2, "disruptionsAllowed": 0,
                             "currentHealthy": 1, "desiredHealthy": 1});
        assert!(matches!(
            decide(&pdb(&healthy), &pod(false), "T"),
            BudgetDecision::Allow
        ));
        let unhealthy = json!({"observedGeneration": 2, "disruptionsAllowed": 0,
                               "currentHealthy": 0, "desiredHealthy": 1});
        assert!(matches!(
            decide(&pdb(&unhealthy), &pod(false), "T"),
            BudgetDecision::Refuse(_)
        ));
    }

    #[test]
    fn terminating_pending_and_final_pods_ignore_budgets() {
        assert!(ignores_budgets(&json!({"status": {"phase": "Pending"}})));
        assert!(ignores_budgets(&json!({"status": {"phase": "Failed"}})));
        assert!(ignores_budgets(
            &json!({"metadata": {"deletionTimestamp": "x"}, "status": {"phase": "Running"}})
        ));
        assert!(!ignores_budgets(&json!({"status": {"phase": "Running"}})));
    }
}
