//! Firmware (SeaBIOS or OVMF), SMBIOS system identity and direct kernel boot.
//!
//! EFI maps OVMF's code image read-only as the first pflash unit and the VMI's own copy
//! of the variable store as the second; secure boot additionally locks the flash to SMM.
//! Direct kernel boot with secure boot is refused: QEMU would hand an unverified kernel to
//! the guest, silently defeating what the user asked for.

use super::{Args, ArgvError, absolute, escape};
use crate::spec::{Bootloader, LauncherSpec};

pub(super) fn push(spec: &LauncherSpec, args: &mut Args) -> Result<(), ArgvError> {
    let firmware = &spec.firmware;
    if let Bootloader::Efi(efi) = &firmware.bootloader {
        absolute("OVMF code", &efi.code_path)?;
        absolute("OVMF variables", &efi.vars_path)?;
        if efi.secure_boot {
            if firmware.kernel_boot.is_some() {
                return Err(ArgvError::Firmware(
                    "secure boot cannot verify a directly booted kernel".to_owned(),
                ));
            }
            args.push_pair("-global", "driver=cfi.pflash01,property=secure,value=on");
        }
        args.push_pair(
            "-drive",
            format!(
                "if=pflash,format=raw,unit=0,readonly=on,file={}",
                escape(&efi.code_path)
            ),
        );
        args.push_pair(
            "-drive",
            format!(
                "if=pflash,format=raw,unit=1,file={}",
                escape(&efi.vars_path)
            ),
        );
    }
    let mut smbios = "type=1,manufacturer=KubeVirt,product=None,family=KubeVirt".to_owned();
    if let Some(uuid) = &firmware.uuid {
        if !is_uuid(uuid) {
            return Err(ArgvError::Firmware(format!("{uuid:?} is not a UUID")));
        }
        args.push_pair("-uuid", uuid.clone());
        smbios.push_str(&format!(",uuid={uuid}"));
    }
    if let Some(serial) = &firmware.serial {
        smbios.push_str(&format!(",serial={}", escape(serial)));
    }
    args.push_pair("-smbios", smbios);
    if let Some(kernel) = &firmware.kernel_boot {
        absolute("kernel", &kernel.kernel_path)?;
        args.push_pair("-kernel", kernel.kernel_path.clone());
        if let Some(initrd) = &kernel.initrd_path {
            absolute("initrd", initrd)?;
            args.push_pair("-initrd", initrd.clone());
        }
        if !kernel.kernel_args.is_empty() {
            args.push_pair("-append", kernel.kernel_args.clone());
        }
    }
    Ok(())
}

fn is_uuid(s: &str) -> bool {
    let groups: Vec<_> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.chars().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::super::{qemu_argv, tests::minimal_spec};
    use super::*;
    use crate::spec::Efi;

    #[test]
    fn secure_boot_with_a_direct_kernel_is_refused() {
        let mut spec = minimal_spec();
        spec.firmware.bootloader = Bootloader::Efi(Efi {
            secure_boot: true,
            code_path: "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd".into(),
            vars_path: "/run/vmi/OVMF_VARS.fd".into(),
        });
        assert!(matches!(qemu_argv(&spec), Err(ArgvError::Firmware(_))));
    }

    #[test]
    fn a_malformed_uuid_is_refused() {
        let mut spec = minimal_spec();
        spec.firmware.uuid = Some("not-a-uuid".into());
        assert!(matches!(qemu_argv(&spec), Err(ArgvError::Firmware(_))));
    }

    #[test]
    fn uuid_goes_to_both_the_machine_and_smbios() {
        let mut spec = minimal_spec();
        spec.firmware.uuid = Some("5d307ca9-b3ef-428c-8861-06e72d69f223".into());
        spec.firmware.serial = Some("s,1".into());
        let argv = qemu_argv(&spec).unwrap();
        let uuid_at = argv.iter().position(|a| a == "-uuid").unwrap();
        assert_eq!(argv[uuid_at + 1], "5d307ca9-b3ef-428c-8861-06e72d69f223");
        assert!(
            argv.iter()
                .any(|a| a.ends_with("uuid=5d307ca9-b3ef-428c-8861-06e72d69f223,serial=s,,1"))
        );
    }
}
