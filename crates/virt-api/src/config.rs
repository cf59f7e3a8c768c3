//! The cluster configuration admission depends on, derived from the `KubeVirt` CR's
//! `spec.configuration` with upstream's defaults filled in.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kubevirt_api::v1::{EvictionStrategy, KubeVirt, KubeVirtConfiguration};

/// Feature gate names checked by admission.
pub mod gates {
    /// `hostDisk` volumes.
    pub const HOST_DISK: &str = "HostDisk";
    /// `downwardMetrics` volumes and devices.
    pub const DOWNWARD_METRICS: &str = "DownwardMetrics";
    /// NUMA guest mapping passthrough.
    pub const NUMA: &str = "NUMA";
    /// Host devices and GPUs.
    pub const HOST_DEVICES: &str = "HostDevices";
    /// GPUs.
    pub const GPU: &str = "GPU";
    /// VSOCK devices.
    pub const VSOCK: &str = "VSOCK";
    /// SCSI persistent reservation on LUNs.
    pub const PERSISTENT_RESERVATION: &str = "PersistentReservation";
    /// virtiofs on PVCs.
    pub const VIRTIOFS_STORAGE: &str = "EnableVirtioFsStorageVolumes";
    /// Sidecar hooks.
    pub const SIDECAR: &str = "Sidecar";
    /// Ignition data annotation.
    pub const IGNITION: &str = "ExperimentalIgnitionSupport";
    /// Decentralized live migration (`WaitAsReceiver`, `sendTo`/`receive`).
    pub const DECENTRALIZED_LIVE_MIGRATION: &str = "DecentralizedLiveMigration";
    /// Declarative volume hotplug (empty CD-ROMs).
    pub const DECLARATIVE_HOTPLUG_VOLUMES: &str = "DeclarativeHotplugVolumes";
    /// Running the launcher as root.
    pub const ROOT: &str = "Root";
    /// `domain.rebootPolicy`.
    pub const REBOOT_POLICY: &str = "RebootPolicy";
    /// `reservedOverhead.memLock`.
    pub const RESERVED_OVERHEAD_MEMLOCK: &str = "ReservedOverheadMemlock";
    /// `portRanges` on interfaces.
    pub const PORT_RANGES: &str = "PortRangesSpec";
    /// The core passt binding (`passtBinding`). Beta: on unless disabled.
    pub const PASST_BINDING: &str = "PasstBinding";

    /// Upstream's Beta gates among these: enabled unless listed in
    /// `developerConfiguration.disabledFeatureGates`.
    pub const BETA: &[&str] = &[PASST_BINDING];
}

/// Cluster-wide settings admission reads. [`Default`] is upstream's default configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterConfig {
    /// Default architecture (`amd64`).
    pub default_architecture: String,
    /// Default machine type (`q35`).
    pub machine_type: String,
    /// Allowed machine types, as globs (`q35*`, `pc-q35*`).
    pub emulated_machines: Vec<String>,
    /// Default CPU model; `None` means `host-model`.
    pub cpu_model: Option<String>,
    /// Default CPU request (`100m`).
    pub cpu_request: Quantity,
    /// Binding of the default pod interface (`bridge`).
    pub default_network_interface: String,
    /// Whether bridge binding is allowed on the pod network.
    pub permit_bridge_interface_on_pod_network: bool,
    /// Default eviction strategy (none set means `None`, as upstream leaves it unset).
    pub eviction_strategy: Option<EvictionStrategy>,
    /// Enabled feature gates.
    pub feature_gates: BTreeSet<String>,
    /// `developerConfiguration.disabledFeatureGates` (they turn Beta gates off).
    pub disabled_feature_gates: BTreeSet<String>,
    /// Whether software emulation is allowed.
    pub use_emulation: bool,
    /// `Stage` or `LiveUpdate`.
    pub vm_rollout_strategy: String,
    /// Ratio between boot and maximum sockets / memory for hotplug.
    pub max_hotplug_ratio: u32,
    /// Cluster-wide maximum sockets (0 = derive from the ratio).
    pub max_cpu_sockets: u32,
    /// Cluster-wide maximum guest memory.
    pub max_guest: Option<Quantity>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            default_architecture: "amd64".into(),
            machine_type: "q35".into(),
            emulated_machines: vec!["q35*".into(), "pc-q35*".into()],
            cpu_model: None,
            cpu_request: Quantity("100m".into()),
            default_network_interface: "bridge".into(),
            permit_bridge_interface_on_pod_network: true,
            eviction_strategy: None,
            feature_gates: BTreeSet::new(),
            disabled_feature_gates: BTreeSet::new(),
            use_emulation: false,
            vm_rollout_strategy: "LiveUpdate".into(),
            max_hotplug_ratio: 4,
            max_cpu_sockets: 0,
            max_guest: None,
        }
    }
}

impl ClusterConfig {
    /// Builds the configuration from a `KubeVirt` CR (or the defaults without one).
    #[must_use]
    pub fn from_kubevirt(kv: Option<&KubeVirt>) -> Self {
        kv.and_then(|kv| kv.spec.configuration.as_ref())
            .map_or_else(Self::default, Self::from_configuration)
    }

    /// Builds the configuration from `spec.configuration` of a `KubeVirt` CR.
    #[must_use]
    pub fn from_configuration(c: &KubeVirtConfiguration) -> Self {
        let mut cfg = Self::default();
        if let Some(m) = c.machine_type.as_ref().filter(|m| !m.is_empty()) {
            cfg.machine_type.clone_from(m);
        }
        if !c.emulated_machines.is_empty() {
            cfg.emulated_machines.clone_from(&c.emulated_machines);
        }
        cfg.cpu_model = c.cpu_model.clone().filter(|m| !m.is_empty());
        if let Some(r) = &c.cpu_request {
            cfg.cpu_request = r.clone();
        }
        if let Some(net) = &c.network {
            if let Some(i) = net
                .default_network_interface
                .as_ref()
                .filter(|i| !i.is_empty())
            {
                cfg.default_network_interface.clone_from(i);
            }
            if let Some(p) = net.permit_bridge_interface_on_pod_network {
                cfg.permit_bridge_interface_on_pod_network = p;
            }
        }
        cfg.eviction_strategy.clone_from(&c.eviction_strategy);
        if let Some(dev) = &c.developer_configuration {
            cfg.feature_gates = dev
                .feature_gates
                .iter()
                .filter(|g| !dev.disabled_feature_gates.contains(g))
                .cloned()
                .collect();
            cfg.disabled_feature_gates = dev.disabled_feature_gates.iter().cloned().collect();
            cfg.use_emulation = dev.use_emulation.unwrap_or(false);
        }
        if let Some(s) = c.vm_rollout_strategy.as_ref().filter(|s| !s.is_empty()) {
            cfg.vm_rollout_strategy.clone_from(s);
        }
        if let Some(lu) = &c.live_update_configuration {
            cfg.max_hotplug_ratio = lu.max_hotplug_ratio.filter(|r| *r > 0).unwrap_or(4);
            cfg.max_cpu_sockets = lu.max_cpu_sockets.unwrap_or(0);
            cfg.max_guest.clone_from(&lu.max_guest);
        }
        cfg
    }

    /// Whether a feature gate is enabled: listed, or Beta ([`gates::BETA`]) and not
    /// disabled (upstream's precedence: explicit enable, explicit disable, Beta).
    #[must_use]
    pub fn gate(&self, name: &str) -> bool {
        self.feature_gates.contains(name)
            || (gates::BETA.contains(&name) && !self.disabled_feature_gates.contains(name))
    }

    /// Whether VM changes roll out live (`LiveUpdate`, the default).
    #[must_use]
    pub fn live_update(&self) -> bool {
        self.vm_rollout_strategy == "LiveUpdate"
    }

    /// Machine type for an architecture (`q35` on amd64, `virt` on arm64).
    #[must_use]
    pub fn machine_type_for(&self, arch: &str) -> String {
        match arch {
            "arm64" => "virt".into(),
            "s390x" => "s390-ccw-virtio".into(),
            _ => self.machine_type.clone(),
        }
    }

    /// Allowed machine-type globs for an architecture.
    #[must_use]
    pub fn emulated_machines_for(&self, arch: &str) -> Vec<String> {
        match arch {
            "arm64" => vec!["virt*".into()],
            "s390x" => vec!["s390-ccw-virtio*".into()],
            _ => self.emulated_machines.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubevirt_api::v1::{DeveloperConfiguration, KubeVirtSpec, NetworkConfiguration};

    #[test]
    fn defaults_match_upstream_cluster_config() {
        let cfg = ClusterConfig::from_kubevirt(None);
        assert_eq!(cfg.machine_type, "q35");
        assert_eq!(cfg.cpu_request.0, "100m");
        assert_eq!(cfg.default_network_interface, "bridge");
        assert!(cfg.permit_bridge_interface_on_pod_network);
        assert_eq!(cfg.max_hotplug_ratio, 4);
        assert!(cfg.live_update());
    }

    #[test]
    fn kubevirt_configuration_overrides_defaults_and_drops_disabled_gates() {
        let kv = KubeVirt::new(
            "kubevirt",
            KubeVirtSpec {
                configuration: Some(KubeVirtConfiguration {
                    machine_type: Some("pc-q35-rhel9".into()),
                    network: Some(NetworkConfiguration {
                        default_network_interface: Some("masquerade".into()),
                        ..NetworkConfiguration::default()
                    }),
                    developer_configuration: Some(DeveloperConfiguration {
                        feature_gates: vec!["HostDisk".into(), "NUMA".into()],
                        disabled_feature_gates: vec!["NUMA".into()],
                        ..DeveloperConfiguration::default()
                    }),
                    ..KubeVirtConfiguration::default()
                }),
                ..KubeVirtSpec::default()
            },
        );
        let cfg = ClusterConfig::from_kubevirt(Some(&kv));
        assert_eq!(cfg.machine_type, "pc-q35-rhel9");
        assert_eq!(cfg.default_network_interface, "masquerade");
        assert!(cfg.gate("HostDisk"));
        assert!(!cfg.gate("NUMA"));
    }
}
