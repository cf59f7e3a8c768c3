//! Machine type, accelerator, clock and the PCIe root ports kept free for hotplug.
//!
//! Only the q35 family is produced: its PCIe topology is what hotplug relies on (a
//! device can only be hot-added into an empty `pcie-root-port`). Secure boot needs SMM,
//! and huge pages need the machine to take its RAM from the `memory` area's backend.

use super::{Args, ArgvError, escape, memory};
use crate::spec::{Accel, Bootloader, LauncherSpec};

pub(super) fn push(spec: &LauncherSpec, args: &mut Args) -> Result<(), ArgvError> {
    let machine = &spec.machine_type;
    if machine != "q35" && !machine.starts_with("pc-q35-") {
        return Err(ArgvError::UnsupportedMachine(machine.clone()));
    }
    let mut value = escape(machine);
    if matches!(&spec.firmware.bootloader, Bootloader::Efi(efi) if efi.secure_boot) {
        value.push_str(",smm=on");
    }
    if let Some(backend) = memory::backend_id(spec) {
        value.push_str(",memory-backend=");
        value.push_str(backend);
    }
    args.push_pair("-machine", value);
    args.push_pair("-accel", accel_option(spec)?);
    args.push_pair("-rtc", "base=utc");
    for port in 1..=spec.hotplug_ports {
        args.push_pair(
            "-device",
            format!("pcie-root-port,id=pci.{port},bus=pcie.0,chassis={port}"),
        );
    }
    Ok(())
}

/// The `-accel` value. Under TCG a domain with room for CPU hotplug runs its vCPUs on one
/// host thread (`thread=single`): QEMU 7.2's multi-threaded TCG gives every vCPU a region of
/// the translation cache when it is created and aborts (`tcg_region_initial_alloc`) when the
/// running vCPUs have taken all regions since the last flush — which a booted guest does
/// with a small cache. One thread shares one region set, so a plugged vCPU never needs its
/// own.
fn accel_option(spec: &LauncherSpec) -> Result<String, ArgvError> {
    let accel = plain_accel_option(spec)?;
    let hotplug = spec
        .cpu
        .max_sockets
        .is_some_and(|max| max > spec.cpu.sockets);
    Ok(if spec.accel == Accel::Tcg && hotplug {
        format!("{accel},thread=single")
    } else {
        accel
    })
}

fn plain_accel_option(spec: &LauncherSpec) -> Result<String, ArgvError> {
    match (spec.accel, spec.tcg_translation_cache_mib) {
        (Accel::Kvm, None) => Ok("kvm".to_owned()),
        (Accel::Kvm, Some(_)) => Err(ArgvError::Accel(
            "a TCG translation cache size needs accel tcg".to_owned(),
        )),
        (Accel::Tcg, None) => Ok("tcg".to_owned()),
        (Accel::Tcg, Some(0)) => Err(ArgvError::Accel(
            "the TCG translation cache size must be positive".to_owned(),
        )),
        (Accel::Tcg, Some(mib)) => Ok(format!("tcg,tb-size={mib}")),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{qemu_argv, tests::minimal_spec};
    use super::*;

    #[test]
    fn an_i440fx_machine_is_refused() {
        let mut spec = minimal_spec();
        spec.machine_type = "pc-i440fx-7.2".into();
        assert_eq!(
            qemu_argv(&spec),
            Err(ArgvError::UnsupportedMachine("pc-i440fx-7.2".into()))
        );
    }

    #[test]
    fn translation_cache_size_is_refused_under_kvm() {
        let mut spec = minimal_spec();
        spec.accel = Accel::Kvm;
        spec.tcg_translation_cache_mib = Some(32);
        assert!(matches!(qemu_argv(&spec), Err(ArgvError::Accel(_))));
    }

    #[test]
    fn each_hotplug_port_is_its_own_chassis() {
        let mut spec = minimal_spec();
        spec.hotplug_ports = 3;
        let argv = qemu_argv(&spec).unwrap();
        let ports: Vec<_> = argv
            .iter()
            .filter(|a| a.starts_with("pcie-root-port"))
            .collect();
        assert_eq!(ports.len(), 3);
        assert_eq!(ports[2], "pcie-root-port,id=pci.3,bus=pcie.0,chassis=3");
    }
}
