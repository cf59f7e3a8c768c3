//! Live updates of running VMs (upstream's `pkg/liveupdate`): the rules shared by the
//! admission webhooks, which refuse a VM that breaks them, and the VM controller, which then
//! asks for a restart instead of hotplugging.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity::Quantity as ExactQuantity;
use crate::v1::VirtualMachineInstanceSpec;

/// Memory hotplug granularity without 1 GiB huge pages (upstream's
/// `HotplugBlockAlignmentBytes`).
pub const HOTPLUG_BLOCK_ALIGNMENT_BYTES: i128 = 2 * 1024 * 1024;
/// Granularity with 1 GiB huge pages, and the least guest memory hotplug works with.
pub const ONE_GIB: i128 = 1024 * 1024 * 1024;
const TWO_MIB: i128 = HOTPLUG_BLOCK_ALIGNMENT_BYTES;

/// The vCPUs of a topology (upstream's `GetNumberOfVCPUs`); an unset or zero count is 1.
pub fn vcpus(sockets: Option<u32>, cores: Option<u32>, threads: Option<u32>) -> u64 {
    [sockets, cores, threads]
        .iter()
        .map(|n| u64::from(n.unwrap_or(1).max(1)))
        .product()
}

fn value_of(q: &Quantity) -> Option<ExactQuantity> {
    ExactQuantity::try_from(q).ok()
}

/// Why memory hotplug cannot be used with `spec` and `max_guest` (`ValidateLiveUpdateMemory`).
#[must_use]
pub fn memory_hotplug_error(
    spec: &VirtualMachineInstanceSpec,
    max_guest: Option<&Quantity>,
) -> Option<String> {
    let d = &spec.domain;
    if d.cpu.as_ref().is_some_and(|c| c.realtime.is_some()) {
        return Some("Memory hotplug is not compatible with realtime VMs".into());
    }
    if d.cpu
        .as_ref()
        .and_then(|c| c.numa.as_ref())
        .is_some_and(|n| n.guest_mapping_passthrough.is_some())
    {
        return Some("Memory hotplug is not compatible with guest mapping passthrough".into());
    }
    if d.launch_security.is_some() {
        return Some("Memory hotplug is not compatible with encrypted VMs".into());
    }
    let Some(guest) = d
        .memory
        .as_ref()
        .and_then(|m| m.guest.as_ref())
        .and_then(value_of)
        .map(|q| q.value())
    else {
        return Some("Guest memory must be configured when memory hotplug is enabled".into());
    };
    let Some(max) = max_guest.and_then(value_of).map(|q| q.value()) else {
        return Some("Max guest memory must be configured when memory hotplug is enabled".into());
    };
    if guest > max {
        return Some("Guest memory is greater than the configured maxGuest memory".into());
    }
    let one_gib_pages = d
        .memory
        .as_ref()
        .and_then(|m| m.hugepages.as_ref())
        .and_then(|h| h.page_size.as_deref())
        == Some("1Gi");
    let (align, align_text) = if one_gib_pages {
        (ONE_GIB, "1Gi")
    } else {
        (TWO_MIB, "2Mi")
    };
    if guest % align != 0 {
        return Some(format!("Guest memory must be {align_text} aligned"));
    }
    if max % align != 0 {
        return Some(format!("MaxGuest must be {align_text} aligned"));
    }
    if spec.architecture.as_deref().is_some_and(|a| a != "amd64") {
        return Some("Memory hotplug is only available for x86_64 VMs".into());
    }
    if guest < ONE_GIB {
        return Some(
            "Memory hotplug is only available for VMs with at least 1Gi of guest memory".into(),
        );
    }
    None
}
