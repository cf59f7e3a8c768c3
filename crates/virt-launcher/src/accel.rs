//! Choosing between KVM and TCG.
//!
//! A `/dev/kvm` node is not proof that KVM works: on nested or paravirtualised hosts
//! (PVM, for instance) it exists and opens, yet guests die mid-boot with emulation
//! failures. KVM is therefore used only when all three hold:
//!
//! 1. the CPU advertises hardware virtualisation (`vmx` or `svm` in `/proc/cpuinfo`),
//! 2. a hardware KVM module is loaded (`/sys/module/kvm_intel` or `/sys/module/kvm_amd`),
//! 3. `/dev/kvm` opens read-write.
//!
//! Otherwise the guest runs under TCG, as upstream's `developerConfiguration.useEmulation`
//! does (the VMI then carries the `SoftwareEmulation` condition). [`AccelMode`] lets an
//! operator force either; forcing KVM is obeyed even when the checks fail.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::spec::Accel;

/// What the operator asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccelMode {
    /// Detect (the default).
    #[default]
    Auto,
    /// Always KVM.
    Kvm,
    /// Always TCG.
    Tcg,
}

impl std::str::FromStr for AccelMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "kvm" => Ok(Self::Kvm),
            "tcg" => Ok(Self::Tcg),
            other => Err(format!(
                "unknown acceleration {other:?}, expected auto, kvm or tcg"
            )),
        }
    }
}

/// The host facts the decision rests on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// Contents of `/proc/cpuinfo`.
    pub cpuinfo: String,
    /// `/sys/module/kvm_intel` or `/sys/module/kvm_amd` exists.
    pub kvm_module_loaded: bool,
    /// `/dev/kvm` opened read-write.
    pub dev_kvm_usable: bool,
}

/// The chosen accelerator and why, for logs and the VMI condition message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccelDecision {
    /// The accelerator to use.
    pub accel: Accel,
    /// Human-readable reason.
    pub reason: String,
}

/// Decides from `facts`; pure, so every branch is unit-tested.
pub fn decide_accel(mode: AccelMode, facts: &HostFacts) -> AccelDecision {
    let decision = |accel, reason: &str| AccelDecision {
        accel,
        reason: reason.to_owned(),
    };
    match mode {
        AccelMode::Kvm => decision(Accel::Kvm, "KVM forced by configuration"),
        AccelMode::Tcg => decision(Accel::Tcg, "software emulation forced by configuration"),
        AccelMode::Auto if !cpu_has_virtualisation(&facts.cpuinfo) => decision(
            Accel::Tcg,
            "the CPU offers no vmx/svm: using software emulation",
        ),
        AccelMode::Auto if !facts.kvm_module_loaded => decision(
            Accel::Tcg,
            "neither kvm_intel nor kvm_amd is loaded: using software emulation",
        ),
        AccelMode::Auto if !facts.dev_kvm_usable => decision(
            Accel::Tcg,
            "/dev/kvm cannot be opened read-write: using software emulation",
        ),
        AccelMode::Auto => decision(Accel::Kvm, "hardware virtualisation available"),
    }
}

/// Reads the host facts and decides.
pub fn detect_accel(mode: AccelMode) -> AccelDecision {
    if mode != AccelMode::Auto {
        return decide_accel(mode, &HostFacts::default());
    }
    let facts = HostFacts {
        cpuinfo: std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default(),
        kvm_module_loaded: Path::new("/sys/module/kvm_intel").exists()
            || Path::new("/sys/module/kvm_amd").exists(),
        dev_kvm_usable: std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .is_ok(),
    };
    decide_accel(mode, &facts)
}

fn cpu_has_virtualisation(cpuinfo: &str) -> bool {
    cpuinfo
        .lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(key, _)| key.trim() == "flags")
        .any(|(_, flags)| flags.split_whitespace().any(|f| f == "vmx" || f == "svm"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const VMX: &str = "processor\t: 0\nflags\t\t: fpu vme vmx sse2\n";
    const NESTED_PVM: &str =
        "processor\t: 0\nflags\t\t: fpu vme sse2 hypervisor\nvmx flags\t: none\n";

    fn facts(cpuinfo: &str, module: bool, dev: bool) -> HostFacts {
        HostFacts {
            cpuinfo: cpuinfo.to_owned(),
            kvm_module_loaded: module,
            dev_kvm_usable: dev,
        }
    }

    #[test]
    fn kvm_is_used_when_cpu_module_and_device_all_agree() {
        assert_eq!(
            decide_accel(AccelMode::Auto, &facts(VMX, true, true)).accel,
            Accel::Kvm
        );
        let amd = "flags : svm lm\n";
        assert_eq!(
            decide_accel(AccelMode::Auto, &facts(amd, true, true)).accel,
            Accel::Kvm
        );
    }

    #[test]
    fn a_usable_dev_kvm_without_vmx_or_svm_means_tcg() {
        let d = decide_accel(AccelMode::Auto, &facts(NESTED_PVM, true, true));
        assert_eq!(d.accel, Accel::Tcg);
        assert!(d.reason.contains("vmx/svm"), "{}", d.reason);
    }

    #[test]
    fn vmx_without_a_hardware_kvm_module_means_tcg() {
        assert_eq!(
            decide_accel(AccelMode::Auto, &facts(VMX, false, true)).accel,
            Accel::Tcg
        );
    }

    #[test]
    fn vmx_and_module_without_a_writable_dev_kvm_means_tcg() {
        assert_eq!(
            decide_accel(AccelMode::Auto, &facts(VMX, true, false)).accel,
            Accel::Tcg
        );
    }

    #[test]
    fn forcing_overrides_detection_both_ways() {
        assert_eq!(
            decide_accel(AccelMode::Kvm, &facts("", false, false)).accel,
            Accel::Kvm
        );
        assert_eq!(
            decide_accel(AccelMode::Tcg, &facts(VMX, true, true)).accel,
            Accel::Tcg
        );
    }

    #[test]
    fn accel_mode_parses_its_three_names() {
        assert_eq!("auto".parse::<AccelMode>(), Ok(AccelMode::Auto));
        assert_eq!("tcg".parse::<AccelMode>(), Ok(AccelMode::Tcg));
        assert!("xen".parse::<AccelMode>().is_err());
    }
}
