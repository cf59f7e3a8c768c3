//! vCPU model and topology.
//!
//! Model mapping (checked against Debian's QEMU 7.2):
//!
//! | spec model         | accel kvm | accel tcg |
//! |--------------------|-----------|-----------|
//! | `host-passthrough` | `host`    | `max`     |
//! | `host-model`       | `host`    | `max`     |
//! | named, e.g. `Skylake-Server` | as named | as named |
//!
//! `host` needs KVM (QEMU refuses it under TCG); `max` under TCG is every feature TCG
//! emulates, the closest thing to "the host CPU". Without libvirt there is no expansion of
//! `host-model` into a named model, so under KVM it is passed through as well.
//!
//! A fixed TSC frequency (`tscFrequency`) is the model's `tsc-frequency` property.
//!
//! Topology: QEMU requires `sockets × cores × threads = maxcpus`, so `sockets` on the
//! command line is the spec's `maxSockets` and `cpus` (the vCPUs online at boot) is
//! `sockets × cores × threads` of the spec; the difference is room for CPU hotplug.

use super::{Args, ArgvError};
use crate::spec::{Accel, CpuModel, LauncherSpec};

pub(super) fn push(spec: &LauncherSpec, args: &mut Args) -> Result<(), ArgvError> {
    args.push_pair("-cpu", model_option(spec)?);
    args.push_pair("-smp", smp_option(spec)?);
    Ok(())
}

fn model_option(spec: &LauncherSpec) -> Result<String, ArgvError> {
    let cpu = &spec.cpu;
    let mut value = match (&cpu.model, spec.accel) {
        (CpuModel::HostPassthrough | CpuModel::HostModel, Accel::Kvm) => "host".to_owned(),
        (CpuModel::HostPassthrough | CpuModel::HostModel, Accel::Tcg) => "max".to_owned(),
        (CpuModel::Named(name), _) => {
            if !plain_word(name) {
                return Err(ArgvError::CpuModel(format!(
                    "{name:?} is not a QEMU CPU model name"
                )));
            }
            name.clone()
        }
    };
    for feature in &cpu.features {
        if !plain_word(&feature.name) {
            return Err(ArgvError::CpuModel(format!(
                "{:?} is not a CPU feature name",
                feature.name
            )));
        }
        let sign = match feature.policy.as_str() {
            "require" | "force" => '+',
            "disable" | "forbid" => '-',
            "optional" => continue,
            other => {
                return Err(ArgvError::CpuModel(format!(
                    "feature {:?}: unknown policy {other:?}",
                    feature.name
                )));
            }
        };
        value.push(',');
        value.push(sign);
        value.push_str(&feature.name);
    }
    if let Some(hz) = cpu.tsc_frequency {
        // libvirt's `<timer name='tsc' frequency=…>`; QEMU takes it under TCG too.
        value.push_str(&format!(",tsc-frequency={hz}"));
    }
    Ok(value)
}

fn plain_word(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn smp_option(spec: &LauncherSpec) -> Result<String, ArgvError> {
    let cpu = &spec.cpu;
    if cpu.sockets == 0 || cpu.cores == 0 || cpu.threads == 0 {
        return Err(ArgvError::CpuTopology(
            "sockets, cores and threads must be at least 1".into(),
        ));
    }
    let max_sockets = cpu.max_sockets.unwrap_or(cpu.sockets);
    if max_sockets < cpu.sockets {
        return Err(ArgvError::CpuTopology(format!(
            "maxSockets {max_sockets} is below sockets {}",
            cpu.sockets
        )));
    }
    let per_socket = u64::from(cpu.cores) * u64::from(cpu.threads);
    let cpus = u64::from(cpu.sockets) * per_socket;
    let max_cpus = u64::from(max_sockets) * per_socket;
    if max_cpus > 288 {
        return Err(ArgvError::CpuTopology(format!(
            "{max_cpus} vCPUs exceed q35's 288"
        )));
    }
    Ok(format!(
        "cpus={cpus},sockets={max_sockets},cores={},threads={},maxcpus={max_cpus}",
        cpu.cores, cpu.threads
    ))
}

#[cfg(test)]
mod tests {
    use super::super::tests::minimal_spec;
    use super::*;
    use crate::spec::CpuFeature;

    #[test]
    fn host_passthrough_becomes_max_under_tcg_and_host_under_kvm() {
        let mut spec = minimal_spec();
        spec.accel = Accel::Tcg;
        assert_eq!(model_option(&spec).unwrap(), "max");
        spec.accel = Accel::Kvm;
        spec.tcg_translation_cache_mib = None;
        assert_eq!(model_option(&spec).unwrap(), "host");
    }

    #[test]
    fn features_follow_their_policy() {
        let mut spec = minimal_spec();
        spec.cpu.model = CpuModel::Named("Skylake-Server".into());
        spec.cpu.features = vec![
            CpuFeature {
                name: "pcid".into(),
                policy: "require".into(),
            },
            CpuFeature {
                name: "hle".into(),
                policy: "disable".into(),
            },
            CpuFeature {
                name: "vmx".into(),
                policy: "optional".into(),
            },
        ];
        assert_eq!(model_option(&spec).unwrap(), "Skylake-Server,+pcid,-hle");
    }

    #[test]
    fn a_fixed_tsc_frequency_is_the_models_property() {
        let mut spec = minimal_spec();
        spec.accel = Accel::Tcg;
        spec.cpu.features = vec![CpuFeature {
            name: "invtsc".into(),
            policy: "require".into(),
        }];
        spec.cpu.tsc_frequency = Some(2_500_000_000);
        assert_eq!(
            model_option(&spec).unwrap(),
            "max,+invtsc,tsc-frequency=2500000000"
        );
    }

    #[test]
    fn max_sockets_sizes_the_topology_and_sockets_the_online_cpus() {
        let mut spec = minimal_spec();
        spec.cpu.sockets = 2;
        spec.cpu.cores = 2;
        spec.cpu.threads = 1;
        spec.cpu.max_sockets = Some(4);
        assert_eq!(
            smp_option(&spec).unwrap(),
            "cpus=4,sockets=4,cores=2,threads=1,maxcpus=8"
        );
    }

    #[test]
    fn max_sockets_below_sockets_is_refused() {
        let mut spec = minimal_spec();
        spec.cpu.sockets = 2;
        spec.cpu.max_sockets = Some(1);
        assert!(matches!(smp_option(&spec), Err(ArgvError::CpuTopology(_))));
    }

    #[test]
    fn a_model_name_with_a_comma_is_refused() {
        let mut spec = minimal_spec();
        spec.cpu.model = CpuModel::Named("max,+evil".into());
        assert!(matches!(model_option(&spec), Err(ArgvError::CpuModel(_))));
    }
}
