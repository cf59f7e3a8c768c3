//! Live changes to a running domain: what a `sync` of a started domain applies.
//!
//! The handler sends the whole spec on every change; [`plan`] compares it with the spec the
//! domain runs and yields the steps QEMU can take without a restart:
//!
//! | spec field | step | QMP |
//! |---|---|---|
//! | `cpu.sockets` raised (up to `maxSockets`) | plug the missing vCPUs | `query-hotpluggable-cpus`, `device_add` per vCPU |
//! | `memory.hotpluggedBytes` changed | resize the virtio-mem device | `qom-set virtio-mem0 requested-size` |
//!
//! Everything else is what the domain booted with: a spec that changes it (fewer sockets,
//! another boot memory, another topology) is refused with a message saying a restart applies
//! it, and nothing is changed — the VM controller decides about `RestartRequired` from the
//! templates, the launcher only refuses what it cannot do. The guest onlines plugged vCPUs
//! and memory itself (udev in distributions); QEMU reports virtio-mem progress with
//! `MEMORY_DEVICE_SIZE_CHANGE`, which the supervisor turns into the domain's current memory.

use serde_json::{Value, json};

use crate::argv::memory::{HOTPLUG_MEMORY_DEVICE, check_hotplugged};
use crate::qmp::QmpClient;
use crate::spec::LauncherSpec;

/// One change to make on the running domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    /// Plug vCPUs until `sockets` sockets are populated.
    PlugSockets {
        /// Sockets wanted.
        sockets: u32,
    },
    /// Ask the virtio-mem device for this many bytes.
    ResizeHotplugMemory {
        /// Bytes wanted on top of the boot memory.
        bytes: u64,
    },
}

/// The steps from the running spec to the wanted one, or why they cannot be taken live.
pub(super) fn plan(running: &LauncherSpec, wanted: &LauncherSpec) -> Result<Vec<Step>, String> {
    let (now, next) = (&running.cpu, &wanted.cpu);
    if (now.cores, now.threads, now.max_sockets) != (next.cores, next.threads, next.max_sockets) {
        return Err(
            "the vCPU topology (cores, threads, maxSockets) of a running domain changes only with a restart"
                .into(),
        );
    }
    let mut steps = Vec::new();
    if next.sockets < now.sockets {
        return Err(format!(
            "the domain runs {} sockets: a reduction to {} takes a restart",
            now.sockets, next.sockets
        ));
    }
    if next.sockets > now.sockets {
        let max = now.max_sockets.unwrap_or(now.sockets);
        if next.sockets > max {
            return Err(format!(
                "{} sockets exceed the domain's maxSockets {max}",
                next.sockets
            ));
        }
        steps.push(Step::PlugSockets {
            sockets: next.sockets,
        });
    }
    let (now, next) = (&running.memory, &wanted.memory);
    if (now.guest_bytes, now.max_guest_bytes) != (next.guest_bytes, next.max_guest_bytes) {
        return Err(
            "the boot memory and maxGuest of a running domain change only with a restart".into(),
        );
    }
    if next.hotplugged_bytes != now.hotplugged_bytes {
        check_hotplugged(wanted).map_err(|e| e.to_string())?;
        steps.push(Step::ResizeHotplugMemory {
            bytes: next.hotplugged_bytes,
        });
    }
    Ok(steps)
}

/// Takes `step` on the domain behind `qmp`.
pub(super) async fn apply(qmp: &QmpClient, step: &Step) -> Result<(), String> {
    match step {
        Step::PlugSockets { sockets } => plug_sockets(qmp, *sockets).await,
        Step::ResizeHotplugMemory { bytes } => qmp
            .execute(
                "qom-set",
                Some(json!({
                    "path": HOTPLUG_MEMORY_DEVICE,
                    "property": "requested-size",
                    "value": bytes,
                })),
            )
            .await
            .map(drop)
            .map_err(|e| format!("resizing the hotplug memory: {e}")),
    }
}

/// Plugs every vCPU QEMU offers in a socket below `sockets` that is still empty.
async fn plug_sockets(qmp: &QmpClient, sockets: u32) -> Result<(), String> {
    let offered = qmp
        .execute("query-hotpluggable-cpus", None)
        .await
        .map_err(|e| format!("listing the hotpluggable vCPUs: {e}"))?;
    for slot in empty_slots_below(&offered, sockets) {
        qmp.device_add(slot)
            .await
            .map_err(|e| format!("plugging a vCPU: {e}"))?;
    }
    Ok(())
}

/// `device_add` arguments for the empty vCPU slots of `query-hotpluggable-cpus` whose socket
/// is below `sockets`, in socket/core/thread order, each with the id `vcpu-S-C-T`.
fn empty_slots_below(offered: &Value, sockets: u32) -> Vec<Value> {
    let id = |props: &Value, key: &str| props.get(key).and_then(Value::as_u64).unwrap_or(0);
    let mut slots: Vec<(u64, u64, u64, Value)> = offered
        .as_array()
        .into_iter()
        .flatten()
        .filter(|slot| slot.get("qom-path").is_none())
        .filter_map(|slot| {
            let props = slot.get("props")?;
            let driver = slot.get("type")?.as_str()?;
            let (s, c, t) = (
                id(props, "socket-id"),
                id(props, "core-id"),
                id(props, "thread-id"),
            );
            if s >= u64::from(sockets) {
                return None;
            }
            let mut args = json!({"driver": driver, "id": format!("vcpu-{s}-{c}-{t}")});
            for (key, value) in props.as_object()? {
                args[key] = value.clone();
            }
            Some((s, c, t, args))
        })
        .collect();
    slots.sort_by_key(|(s, c, t, _)| (*s, *c, *t));
    slots.into_iter().map(|(.., args)| args).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::argv::tests::minimal_spec;

    const MIB: u64 = 1024 * 1024;

    fn hotpluggable() -> LauncherSpec {
        let mut spec = minimal_spec();
        spec.cpu.sockets = 1;
        spec.cpu.max_sockets = Some(4);
        spec.memory.guest_bytes = 1024 * MIB;
        spec.memory.max_guest_bytes = Some(2048 * MIB);
        spec
    }

    #[test]
    fn more_sockets_and_more_memory_are_live_steps() {
        let running = hotpluggable();
        let mut wanted = running.clone();
        wanted.cpu.sockets = 2;
        wanted.memory.hotplugged_bytes = 128 * MIB;
        assert_eq!(
            plan(&running, &wanted).unwrap(),
            vec![
                Step::PlugSockets { sockets: 2 },
                Step::ResizeHotplugMemory { bytes: 128 * MIB }
            ]
        );
        assert_eq!(plan(&running, &running).unwrap(), vec![]);
    }

    #[test]
    fn what_only_a_restart_changes_is_refused_with_nothing_applied() {
        let mut running = hotpluggable();
        running.cpu.sockets = 2;
        let mut fewer = running.clone();
        fewer.cpu.sockets = 1;
        assert!(plan(&running, &fewer).unwrap_err().contains("restart"));
        let mut beyond = running.clone();
        beyond.cpu.sockets = 5;
        assert!(plan(&running, &beyond).unwrap_err().contains("maxSockets"));
        let mut boot = running.clone();
        boot.memory.guest_bytes = 2048 * MIB;
        assert!(plan(&running, &boot).unwrap_err().contains("restart"));
        let mut unaligned = running.clone();
        unaligned.memory.hotplugged_bytes = MIB;
        assert!(plan(&running, &unaligned).unwrap_err().contains("block"));
    }

    #[test]
    fn only_empty_slots_below_the_wanted_sockets_are_plugged_in_order() {
        // As QEMU 7.2 answers query-hotpluggable-cpus for -smp 1,sockets=4,maxcpus=4.
        let offered = json!([
            {"props": {"core-id": 0, "thread-id": 0, "node-id": 0, "socket-id": 3}, "vcpus-count": 1, "type": "max-x86_64-cpu"},
            {"props": {"core-id": 0, "thread-id": 0, "node-id": 0, "socket-id": 2}, "vcpus-count": 1, "type": "max-x86_64-cpu"},
            {"props": {"core-id": 0, "thread-id": 0, "node-id": 0, "socket-id": 1}, "vcpus-count": 1, "type": "max-x86_64-cpu"},
            {"props": {"core-id": 0, "thread-id": 0, "node-id": 0, "socket-id": 0}, "vcpus-count": 1, "qom-path": "/machine/unattached/device[0]", "type": "max-x86_64-cpu"}
        ]);
        assert_eq!(
            empty_slots_below(&offered, 3),
            vec![
                json!({"driver": "max-x86_64-cpu", "id": "vcpu-1-0-0", "core-id": 0, "thread-id": 0, "node-id": 0, "socket-id": 1}),
                json!({"driver": "max-x86_64-cpu", "id": "vcpu-2-0-0", "core-id": 0, "thread-id": 0, "node-id": 0, "socket-id": 2}),
            ]
        );
    }
}
