//! MigrationPolicy matching (upstream's `matchPolicy` and `applyMigrationPolicySpec`): at
//! hand-off the migration controller picks the policy that selects the VMI with the most
//! labels and overlays its fields on the cluster's migration configuration; the VMI's
//! `migrationState` names the policy (`migrationPolicyName`) and carries the result.
//!
//! A policy selects a VMI when every label of its `virtualMachineInstanceSelector` is on the
//! VMI and every label of its `namespaceSelector` is on the VMI's namespace; a policy without
//! `selectors` selects nothing. The most matched labels win, VMI labels breaking a tie, then
//! the lexicographically first name.
//!
//! Difference from upstream: upstream evaluates a selector only when the VMI has labels at
//! all (and the namespace selector then against the namespace's), so a VMI without labels
//! matches every policy whatever its selectors say; here each selector is checked against
//! its own labels, always.

use std::collections::BTreeMap;

use kubevirt_api::migrations::v1alpha1::{MigrationPolicy, MigrationPolicySpec};
use kubevirt_api::v1::MigrationConfiguration;

/// The number of labels a policy matched: (VMI's and namespace's, VMI's), compared in that
/// order; `None` when it does not select the VMI.
fn score(
    policy: &MigrationPolicy,
    vmi_labels: &BTreeMap<String, String>,
    namespace_labels: &BTreeMap<String, String>,
) -> Option<(usize, usize)> {
    let selectors = policy.spec.selectors.as_ref()?;
    let count = |selector: Option<&BTreeMap<String, String>>, labels: &BTreeMap<String, String>| {
        let selector = selector.into_iter().flatten();
        let mut n = 0;
        for (key, value) in selector {
            if labels.get(key) != Some(value) {
                return None;
            }
            n += 1;
        }
        Some(n)
    };
    let vmi = count(
        selectors.virtual_machine_instance_selector.as_ref(),
        vmi_labels,
    )?;
    let namespace = count(selectors.namespace_selector.as_ref(), namespace_labels)?;
    Some((vmi + namespace, vmi))
}

/// The policy for a VMI with `vmi_labels` in a namespace with `namespace_labels`, if any.
#[must_use]
pub fn matching<'a>(
    policies: &'a [MigrationPolicy],
    vmi_labels: &BTreeMap<String, String>,
    namespace_labels: &BTreeMap<String, String>,
) -> Option<&'a MigrationPolicy> {
    policies
        .iter()
        .filter_map(|p| Some((score(p, vmi_labels, namespace_labels)?, p)))
        .max_by(|(a, p), (b, q)| a.cmp(b).then_with(|| q.metadata.name.cmp(&p.metadata.name)))
        .map(|(_, p)| p)
}

/// `base` with the fields `spec` sets; `allowWorkloadDisruption` follows `allowPostCopy` when
/// only that is set (upstream's backward compatibility).
#[must_use]
pub fn apply(base: MigrationConfiguration, spec: &MigrationPolicySpec) -> MigrationConfiguration {
    let mut out = base;
    if spec.allow_workload_disruption.is_none() && spec.allow_post_copy.is_some() {
        out.allow_workload_disruption = spec.allow_post_copy;
    }
    out.allow_auto_converge = spec.allow_auto_converge.or(out.allow_auto_converge);
    out.bandwidth_per_migration = spec
        .bandwidth_per_migration
        .clone()
        .or(out.bandwidth_per_migration);
    out.completion_timeout_per_gi_b = spec
        .completion_timeout_per_gi_b
        .or(out.completion_timeout_per_gi_b);
    out.max_downtime_ms = spec.max_downtime_ms.or(out.max_downtime_ms);
    out.allow_post_copy = spec.allow_post_copy.or(out.allow_post_copy);
    out.allow_workload_disruption = spec
        .allow_workload_disruption
        .or(out.allow_workload_disruption);
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn policy(name: &str, selectors: &serde_json::Value) -> MigrationPolicy {
        serde_json::from_value(json!({
            "apiVersion": "migrations.kubevirt.io/v1alpha1", "kind": "MigrationPolicy",
            "metadata": {"name": name}, "spec": {"selectors": selectors},
        }))
        .unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_policy_matching_the_most_labels_wins_then_vmi_labels_then_the_name() {
        let vmi = labels(&[("app", "db"), ("tier", "gold")]);
        let ns = labels(&[("team", "a")]);
        let policies = [
            policy(
                "one-vmi-label",
                &json!({"virtualMachineInstanceSelector": {"app": "db"}}),
            ),
            policy(
                "two-vmi-labels",
                &json!({"virtualMachineInstanceSelector": {"app": "db", "tier": "gold"}}),
            ),
            policy(
                "vmi-and-namespace",
                &json!({"virtualMachineInstanceSelector": {"app": "db"},
                        "namespaceSelector": {"team": "a"}}),
            ),
            policy(
                "a-mismatch",
                &json!({"virtualMachineInstanceSelector": {"app": "web"}}),
            ),
            policy("no-selectors", &json!(null)),
        ];
        let name = |p: Option<&MigrationPolicy>| p.and_then(|p| p.metadata.name.clone());
        // Two labels each: the VMI's two labels beat one VMI and one namespace label.
        assert_eq!(
            name(matching(&policies, &vmi, &ns)).as_deref(),
            Some("two-vmi-labels")
        );
        // Same score: the first name.
        let tied = [
            policy("b", &json!({"namespaceSelector": {"team": "a"}})),
            policy("a", &json!({"namespaceSelector": {"team": "a"}})),
        ];
        assert_eq!(name(matching(&tied, &vmi, &ns)).as_deref(), Some("a"));
        // A namespace selector is checked against the namespace, a VMI without labels too.
        let other_ns = labels(&[("team", "b")]);
        assert_eq!(name(matching(&tied, &vmi, &other_ns)), None);
        assert_eq!(
            name(matching(&policies[..1], &BTreeMap::new(), &ns)),
            None,
            "a VMI without labels is not selected by a VMI selector"
        );
        // An empty selector selects every VMI, with no label matched.
        let empty = [policy("all", &json!({}))];
        assert_eq!(name(matching(&empty, &vmi, &ns)).as_deref(), Some("all"));
    }

    #[test]
    fn a_policy_overlays_only_what_it_sets_and_post_copy_carries_disruption() {
        let base = MigrationConfiguration {
            allow_auto_converge: Some(false),
            completion_timeout_per_gi_b: Some(150),
            allow_post_copy: Some(false),
            allow_workload_disruption: Some(false),
            ..MigrationConfiguration::default()
        };
        let spec: MigrationPolicySpec = serde_json::from_value(json!({
            "allowAutoConverge": true, "allowPostCopy": true, "bandwidthPerMigration": "64Mi"
        }))
        .unwrap();
        let out = apply(base, &spec);
        assert_eq!(out.allow_auto_converge, Some(true));
        assert_eq!(out.allow_post_copy, Some(true));
        assert_eq!(out.allow_workload_disruption, Some(true));
        assert_eq!(out.completion_timeout_per_gi_b, Some(150));
        assert_eq!(
            out.bandwidth_per_migration.map(|q| q.0).as_deref(),
            Some("64Mi")
        );
    }
}
