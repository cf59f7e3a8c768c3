//! VM defaults on CREATE (`vm-mutator.go`): a random firmware UUID and serial for the template,
//! architecture and machine type, and the PCI topology annotation on the template.

use kubevirt_api::constants::{PCI_TOPOLOGY_VERSION_ANNOTATION, PCI_TOPOLOGY_VERSION_V3};
use kubevirt_api::v1::{Firmware, VirtualMachine};

use crate::config::ClusterConfig;

/// Applies the VM CREATE defaults.
pub fn mutate_vm_create(vm: &mut VirtualMachine, cfg: &ClusterConfig) {
    if vm.metadata.deletion_timestamp.is_some() {
        return;
    }
    let Some(spec) = vm.spec.template.spec.as_mut() else {
        return;
    };
    let fw = spec.domain.firmware.get_or_insert_with(Firmware::default);
    if fw.uuid.as_deref().unwrap_or("").is_empty() {
        fw.uuid = Some(uuid::Uuid::new_v4().to_string());
    }
    if fw.serial.as_deref().unwrap_or("").is_empty() {
        fw.serial = Some(uuid::Uuid::new_v4().to_string());
    }
    if spec.architecture.as_deref().unwrap_or("").is_empty() {
        spec.architecture = Some(cfg.default_architecture.clone());
    }
    let arch = spec.architecture.clone().unwrap_or_default();
    let machine = spec.domain.machine.get_or_insert_with(Default::default);
    if machine.type_.as_deref().unwrap_or("").is_empty() {
        machine.type_ = Some(cfg.machine_type_for(&arch));
    }
    let machine = machine.type_.clone().unwrap_or_default();
    if matches!(arch.as_str(), "" | "amd64" | "arm64")
        && (machine.contains("q35") || machine.starts_with("virt"))
    {
        vm.spec
            .template
            .metadata
            .get_or_insert_with(Default::default)
            .annotations
            .get_or_insert_with(Default::default)
            .entry(PCI_TOPOLOGY_VERSION_ANNOTATION.into())
            .or_insert_with(|| PCI_TOPOLOGY_VERSION_V3.into());
    }
}
