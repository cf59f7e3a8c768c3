//! The cluster configuration as the KubeVirt CR states it, published to running components.
//!
//! KubeVirt users change component flags through
//! `spec.customizeComponents.flags.{api,controller,handler}` of the `KubeVirt` CR (upstream's
//! operator then rolls the component's pods). Here the running components pick the change up
//! in place: the shared CR watch ([`kubevirt_api::cluster_config::subscribe`]) publishes a
//! [`ClusterSettings`] ([`ClusterSettings::from_kubevirt`]), and each component derives its effective settings from its
//! command-line flags overlaid with the CR's ([`effective_flag`]) — so changing the label-sync
//! patterns restarts nothing, VMs included.

use std::collections::BTreeMap;

use kubevirt_api::v1::KubeVirt;

/// What the components need from the KubeVirt CR.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterSettings {
    /// `spec.customizeComponents.flags.api`.
    pub api_flags: BTreeMap<String, String>,
    /// `spec.customizeComponents.flags.controller`.
    pub controller_flags: BTreeMap<String, String>,
    /// `spec.customizeComponents.flags.handler`.
    pub handler_flags: BTreeMap<String, String>,
    /// `spec.configuration.developerConfiguration.useEmulation`.
    pub use_emulation: Option<bool>,
    /// `spec.configuration.developerConfiguration.featureGates`.
    pub feature_gates: Vec<String>,
    /// `spec.configuration.developerConfiguration.cpuAllocationRatio`.
    pub cpu_allocation_ratio: Option<i32>,
    /// The CR's `kubevirt.io/skip-backup-hooks` annotation, for VMIs without their own.
    pub skip_backup_hooks: Option<String>,
    /// `spec.configuration.evictionStrategy`: the default of VMIs without their own.
    pub eviction_strategy: Option<kubevirt_api::v1::EvictionStrategy>,
    /// `spec.configuration.migrations.nodeDrainTaintKey` (upstream's default
    /// `kubevirt.io/drain` when unset).
    pub node_drain_taint_key: Option<String>,
    /// `spec.configuration.migrations` (the migration controller's limits and the
    /// configuration it hands to the handlers).
    pub migrations: Option<kubevirt_api::v1::MigrationConfiguration>,
    /// `spec.configuration.vmRolloutStrategy` (`LiveUpdate` when unset).
    pub vm_rollout_strategy: Option<String>,
    /// `spec.configuration.developerConfiguration.minimumClusterTSCFrequency`: the TSC
    /// frequency hinted to guests that need one ([`crate::topology`]).
    pub minimum_cluster_tsc_frequency: Option<i64>,
}

impl ClusterSettings {
    /// Whether template changes roll out to running VMs (`LiveUpdate`, upstream's default
    /// when the CR names no strategy) rather than only at the next start (`Stage`).
    pub fn live_update(&self) -> bool {
        self.vm_rollout_strategy
            .as_deref()
            .is_none_or(|s| s == "LiveUpdate")
    }

    /// The settings a KubeVirt CR states (defaults when there is none).
    pub fn from_kubevirt(kv: Option<&KubeVirt>) -> ClusterSettings {
        let Some(kv) = kv else {
            return ClusterSettings::default();
        };
        let flags = kv
            .spec
            .customize_components
            .as_ref()
            .and_then(|c| c.flags.clone())
            .unwrap_or_default();
        let developer = kv
            .spec
            .configuration
            .as_ref()
            .and_then(|c| c.developer_configuration.as_ref());
        let configuration = kv.spec.configuration.as_ref();
        ClusterSettings {
            vm_rollout_strategy: configuration.and_then(|c| c.vm_rollout_strategy.clone()),
            eviction_strategy: configuration.and_then(|c| c.eviction_strategy.clone()),
            node_drain_taint_key: configuration
                .and_then(|c| c.migrations.as_ref())
                .and_then(|m| m.node_drain_taint_key.clone()),
            migrations: configuration.and_then(|c| c.migrations.clone()),
            api_flags: flags.api,
            controller_flags: flags.controller,
            handler_flags: flags.handler,
            use_emulation: developer.and_then(|d| d.use_emulation),
            feature_gates: developer
                .map(|d| d.feature_gates.clone())
                .unwrap_or_default(),
            cpu_allocation_ratio: developer.and_then(|d| d.cpu_allocation_ratio),
            minimum_cluster_tsc_frequency: developer.and_then(|d| d.minimum_cluster_tsc_frequency),
            skip_backup_hooks: kv
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(kubevirt_api::constants::SKIP_BACKUP_HOOKS_ANNOTATION))
                .cloned(),
        }
    }
}

/// A flag's effective value: the CR's value when it sets the flag (the CR is how users change
/// a running installation), else the command line's.
pub fn effective_flag<'a>(
    cr_flags: &'a BTreeMap<String, String>,
    name: &str,
    command_line: &'a str,
) -> &'a str {
    cr_flags.get(name).map_or(command_line, String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crs_flags_come_from_customize_components() {
        let kv: KubeVirt = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
            "metadata": {"name": "kubevirt", "namespace": "kubevirt",
                "annotations": {"kubevirt.io/skip-backup-hooks": "true"}},
            "spec": {
                "customizeComponents": {"flags": {"controller": {"additional-launcher-labels-sync": "ops.example.com/*"}}},
                "configuration": {"developerConfiguration": {"useEmulation": true, "featureGates": ["LiveMigration"], "cpuAllocationRatio": 4}}
            }
        }))
        .expect("KubeVirt");
        let s = ClusterSettings::from_kubevirt(Some(&kv));
        assert_eq!(
            effective_flag(
                &s.controller_flags,
                "additional-launcher-labels-sync",
                "cli.example.com/*"
            ),
            "ops.example.com/*"
        );
        assert_eq!(
            effective_flag(
                &s.controller_flags,
                "additional-launcher-annotations-sync",
                "a"
            ),
            "a"
        );
        assert_eq!(s.use_emulation, Some(true));
        assert_eq!(s.feature_gates, vec!["LiveMigration".to_owned()]);
        assert_eq!(s.cpu_allocation_ratio, Some(4));
        assert_eq!(s.skip_backup_hooks.as_deref(), Some("true"));
        assert_eq!(
            ClusterSettings::from_kubevirt(None),
            ClusterSettings::default()
        );
    }
}
