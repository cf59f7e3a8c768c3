//! Which guests need a fixed TSC frequency, and which frequency (upstream's
//! `watch/topology/tsc.go`): shared by virt-controller, which places such guests
//! (`topologyHints`, node selectors), and virt-handler, which starts their QEMU at it.

use crate::v1::VirtualMachineInstance;

/// Why a guest needs a fixed TSC frequency.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TscRequirement {
    /// `invtsc`: the guest cannot boot without it.
    RequiredForBoot,
    /// Hyper-V reenlightenment: the guest cannot migrate without it.
    RequiredForMigration,
    /// Neither.
    NotRequired,
}

impl TscRequirement {
    /// Upstream's reason text.
    pub fn reason(self) -> &'static str {
        match self {
            TscRequirement::RequiredForBoot => {
                "VMI with invtsc CPU feature must have tsc frequency defined in order to boot"
            }
            TscRequirement::RequiredForMigration => {
                "HyperV Reenlightenment VMIs cannot migrate when TSC Frequency is not exposed on the cluster: guest timers might be inconsistent"
            }
            TscRequirement::NotRequired => "",
        }
    }
}

/// The guest's TSC requirement (upstream's `GetTscFrequencyRequirement`).
pub fn tsc_requirement(vmi: &VirtualMachineInstance) -> TscRequirement {
    let invtsc = vmi.spec.domain.cpu.as_ref().is_some_and(|cpu| {
        cpu.features.iter().any(|f| {
            // An empty policy is `require`, as the API defines it.
            f.name == "invtsc"
                && matches!(f.policy.as_deref(), None | Some("" | "require" | "force"))
        })
    });
    if invtsc {
        return TscRequirement::RequiredForBoot;
    }
    let reenlightenment = vmi
        .spec
        .domain
        .features
        .as_ref()
        .and_then(|f| f.hyperv.as_ref())
        .and_then(|h| h.reenlightenment.as_ref())
        .and_then(|r| r.enabled)
        .unwrap_or(false);
    if reenlightenment {
        TscRequirement::RequiredForMigration
    } else {
        TscRequirement::NotRequired
    }
}

/// The hinted frequency, when one above zero is set.
pub fn hinted_frequency(vmi: &VirtualMachineInstance) -> Option<i64> {
    vmi.status
        .as_ref()
        .and_then(|s| s.topology_hints.as_ref())
        .and_then(|h| h.tsc_frequency)
        .filter(|f| *f > 0)
}

/// The frequency the guest runs at, when it needs one and its hints give one (upstream's
/// `IsManualTSCFrequencyRequired`): what the launcher pod's node selector and QEMU use.
pub fn manual_tsc_frequency(vmi: &VirtualMachineInstance) -> Option<i64> {
    if tsc_requirement(vmi) == TscRequirement::NotRequired {
        return None;
    }
    hinted_frequency(vmi)
}
