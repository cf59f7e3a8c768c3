//! Template changes that reach a running VMI without a restart (upstream's `LiveUpdate`
//! rollout strategy, reference §2.7 and §6): CPU sockets, guest memory, node selector,
//! affinity and tolerations.
//!
//! [`live_fields_of`] copies these fields from the current template into the template the VMI
//! was started from, so `RestartRequired` compares only what cannot change live. [`plan`]
//! then decides, per field, as upstream's handlers do: patch the VMI's spec (virt-handler
//! plugs the vCPUs and memory into the running domain), ask for a restart with upstream's
//! message, or wait for a hotplug in progress. Upstream writes each field with a patch of its
//! own; here every change of one reconcile goes into one JSON Patch with a `test` of each value
//! it replaces.
//!
//! Deviation: upstream completes memory hotplug with a live migration and so requires a
//! migratable VMI; here the launcher resizes the virtio-mem device in place, so
//! migratability is not asked. The pod's resource requests are not raised (the embedded node
//! does not resize pods).

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kubevirt_api::live_update::memory_hotplug_error;
use kubevirt_api::quantity::Quantity as ExactQuantity;
use kubevirt_api::v1::{
    VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceConditionType as CondType,
    VirtualMachineInstanceSpec,
};
use serde_json::{Value, json};

/// What the live update of one reconcile wants.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LivePlan {
    /// JSON Patch operations on the VMI (empty: nothing to change).
    pub vmi_ops: Vec<Value>,
    /// A change that only a restart applies, with upstream's message.
    pub restart_required: Option<String>,
    /// A change that must wait (a hotplug in progress): reconcile again later.
    pub wait: Option<String>,
}

/// Copies the live-updatable fields of `current` into `last_seen` (upstream's list).
pub fn live_fields_of(
    current: &VirtualMachineInstanceSpec,
    last_seen: &mut VirtualMachineInstanceSpec,
) {
    if let (Some(now), Some(seen)) = (&current.domain.cpu, &mut last_seen.domain.cpu) {
        seen.sockets = now.sockets;
    }
    if let Some(guest) = current.domain.memory.as_ref().and_then(|m| m.guest.clone()) {
        last_seen
            .domain
            .memory
            .get_or_insert_with(Default::default)
            .guest = Some(guest);
    }
    last_seen.node_selector.clone_from(&current.node_selector);
    last_seen.affinity.clone_from(&current.affinity);
    last_seen.tolerations.clone_from(&current.tolerations);
}

fn bytes(q: Option<&Quantity>) -> Option<i128> {
    q.and_then(|q| ExactQuantity::try_from(q).ok())
        .map(|q| q.value())
}

fn has_condition(vmi: &VirtualMachineInstance, type_: &CondType, status: &str) -> bool {
    vmi.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| &c.type_ == type_ && c.status.as_str() == status)
    })
}

/// The live changes from the VM's template to its running VMI.
pub fn plan(vm: &VirtualMachine, vmi: &VirtualMachineInstance) -> LivePlan {
    let mut live = LivePlan::default();
    let Some(template) = vm.spec.template.spec.as_ref() else {
        return live;
    };
    cpu(template, vmi, &mut live);
    placement(template, vmi, &mut live);
    memory(template, vmi, &mut live);
    live
}

fn cpu(template: &VirtualMachineInstanceSpec, vmi: &VirtualMachineInstance, live: &mut LivePlan) {
    let (Some(want), Some(has)) = (&template.domain.cpu, &vmi.spec.domain.cpu) else {
        return;
    };
    // An unset count is one socket (the webhook writes it into the VMI).
    let (want, now) = (want.sockets.unwrap_or(1), has.sockets.unwrap_or(1));
    if want == now {
        return;
    }
    if has_condition(vmi, &CondType::HotVcpuChange, "True") {
        live.wait = Some("another CPU hotplug is in progress".into());
        return;
    }
    if want > has.max_sockets.unwrap_or(0) {
        live.restart_required = Some(
            "CPU sockets updated in template spec to a value higher than what's available".into(),
        );
    } else if want < now {
        live.restart_required = Some("Reduction of CPU socket count requires a restart".into());
    } else if template.architecture.as_deref() == Some("arm64") {
        live.restart_required = Some("ARM doesn't support CPU hotplug".into());
    } else {
        live.vmi_ops
            .push(json!({"op": "test", "path": "/spec/domain/cpu/sockets", "value": has.sockets}));
        live.vmi_ops
            .push(json!({"op": "replace", "path": "/spec/domain/cpu/sockets", "value": want}));
    }
}

/// Node selector, affinity and tolerations follow the template (upstream's
/// `VMNodeSelectorPatch`, `VMIAffinityPatch`, `VMITolerationsPatch`).
fn placement(
    template: &VirtualMachineInstanceSpec,
    vmi: &VirtualMachineInstance,
    live: &mut LivePlan,
) {
    let fields: [(&str, Value, Value, bool); 3] = [
        (
            "/spec/nodeSelector",
            json!(template.node_selector),
            json!(vmi.spec.node_selector),
            template.node_selector.is_empty(),
        ),
        (
            "/spec/affinity",
            json!(template.affinity),
            json!(vmi.spec.affinity),
            template.affinity.is_none(),
        ),
        (
            "/spec/tolerations",
            json!(template.tolerations),
            json!(vmi.spec.tolerations),
            template.tolerations.is_empty(),
        ),
    ];
    for (path, want, has, want_none) in fields {
        if want == has {
            continue;
        }
        let has_none = has.is_null()
            || has.as_array().is_some_and(Vec::is_empty)
            || has.as_object().is_some_and(serde_json::Map::is_empty);
        match (has_none, want_none) {
            (true, true) => {}
            (true, false) => live
                .vmi_ops
                .push(json!({"op": "add", "path": path, "value": want})),
            (false, true) => {
                live.vmi_ops
                    .push(json!({"op": "test", "path": path, "value": has}));
                live.vmi_ops.push(json!({"op": "remove", "path": path}));
            }
            (false, false) => {
                live.vmi_ops
                    .push(json!({"op": "test", "path": path, "value": has}));
                live.vmi_ops
                    .push(json!({"op": "replace", "path": path, "value": want}));
            }
        }
    }
}

/// Upstream's `handleMemoryHotplugRequest`, its checks in its order (less the migratability
/// one, see the module).
fn memory(
    template: &VirtualMachineInstanceSpec,
    vmi: &VirtualMachineInstance,
    live: &mut LivePlan,
) {
    let want = template
        .domain
        .memory
        .as_ref()
        .and_then(|m| m.guest.as_ref());
    let has = vmi
        .spec
        .domain
        .memory
        .as_ref()
        .and_then(|m| m.guest.as_ref());
    let status = vmi.status.as_ref().and_then(|s| s.memory.as_ref());
    let (Some(want), Some(has), Some(status)) = (want, has, status) else {
        return;
    };
    if status.guest_current.is_none() {
        return;
    }
    let restart =
        |live: &mut LivePlan, message: &str| live.restart_required = Some(message.to_owned());
    if has_condition(vmi, &CondType::HotMemoryChange, "False") {
        return restart(
            live,
            "memory updated in template spec. Memory-hotplug failed and is not available for this VM configuration",
        );
    }
    if bytes(Some(want)) == bytes(Some(has)) {
        return;
    }
    let Some(max_guest) = vmi
        .spec
        .domain
        .memory
        .as_ref()
        .and_then(|m| m.max_guest.as_ref())
    else {
        return restart(
            live,
            "memory updated in template spec. Memory-hotplug is not available for this VM configuration",
        );
    };
    if has_condition(vmi, &CondType::HotMemoryChange, "True") {
        live.wait = Some("another memory hotplug is in progress".into());
        return;
    }
    if let Some(e) = memory_hotplug_error(template, Some(max_guest)) {
        return restart(live, &format!("memory hotplug not supported, {e}"));
    }
    let want_bytes = bytes(Some(want));
    if want_bytes < bytes(status.guest_at_boot.as_ref()) {
        return restart(
            live,
            "memory updated in template spec to a value lower than what the VM started with",
        );
    }
    if want_bytes > bytes(Some(max_guest)) {
        return restart(
            live,
            "memory updated in template spec to a value higher than what's available",
        );
    }
    live.vmi_ops
        .push(json!({"op": "test", "path": "/spec/domain/memory/guest", "value": has}));
    live.vmi_ops
        .push(json!({"op": "replace", "path": "/spec/domain/memory/guest", "value": want}));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm_and_vmi(
        template: &Value,
        vmi_spec: &Value,
        vmi_status: &Value,
    ) -> (VirtualMachine, VirtualMachineInstance) {
        let vm = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "vm", "namespace": "default"},
            "spec": {"template": {"spec": template.clone()}},
        }))
        .unwrap();
        let vmi = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm", "namespace": "default"},
            "spec": vmi_spec.clone(),
            "status": vmi_status.clone(),
        }))
        .unwrap();
        (vm, vmi)
    }

    fn domain(sockets: u32, guest: &str) -> Value {
        json!({"domain": {
            "cpu": {"sockets": sockets, "cores": 1, "threads": 1, "maxSockets": 4},
            "memory": {"guest": guest, "maxGuest": "4Gi"},
            "devices": {},
        }})
    }

    fn running() -> Value {
        json!({"phase": "Running", "memory": {"guestAtBoot": "1Gi", "guestCurrent": "1Gi", "guestRequested": "1Gi"}})
    }

    #[test]
    fn more_sockets_and_memory_and_a_node_selector_become_one_vmi_patch() {
        let mut template = domain(2, "1152Mi");
        template["nodeSelector"] = json!({"disk": "ssd"});
        let (vm, vmi) = vm_and_vmi(&template, &domain(1, "1Gi"), &running());
        let live = plan(&vm, &vmi);
        assert_eq!(live.restart_required, None);
        assert_eq!(
            live.vmi_ops,
            vec![
                json!({"op": "test", "path": "/spec/domain/cpu/sockets", "value": 1}),
                json!({"op": "replace", "path": "/spec/domain/cpu/sockets", "value": 2}),
                json!({"op": "add", "path": "/spec/nodeSelector", "value": {"disk": "ssd"}}),
                json!({"op": "test", "path": "/spec/domain/memory/guest", "value": "1Gi"}),
                json!({"op": "replace", "path": "/spec/domain/memory/guest", "value": "1152Mi"}),
            ]
        );
    }

    #[test]
    fn what_cannot_change_live_asks_for_a_restart_with_upstreams_messages() {
        let cases = [
            (
                domain(1, "1Gi"),
                domain(2, "1Gi"),
                "Reduction of CPU socket count requires a restart",
            ),
            (
                domain(5, "1Gi"),
                domain(1, "1Gi"),
                "CPU sockets updated in template spec to a value higher than what's available",
            ),
            (
                domain(1, "512Mi"),
                domain(1, "1Gi"),
                "memory hotplug not supported, Memory hotplug is only available for VMs with at least 1Gi of guest memory",
            ),
            (
                domain(1, "1025Mi"),
                domain(1, "1Gi"),
                "memory hotplug not supported, Guest memory must be 2Mi aligned",
            ),
            (
                domain(1, "5Gi"),
                domain(1, "1Gi"),
                "memory hotplug not supported, Guest memory is greater than the configured maxGuest memory",
            ),
        ];
        for (template, vmi_spec, message) in cases {
            let (vm, vmi) = vm_and_vmi(&template, &vmi_spec, &running());
            let live = plan(&vm, &vmi);
            assert_eq!(live.restart_required.as_deref(), Some(message));
            assert!(live.vmi_ops.is_empty(), "{message}: nothing is patched");
        }
        let mut booted_bigger = running();
        booted_bigger["memory"]["guestAtBoot"] = json!("2Gi");
        let (vm, vmi) = vm_and_vmi(&domain(1, "1536Mi"), &domain(1, "2Gi"), &booted_bigger);
        assert_eq!(
            plan(&vm, &vmi).restart_required.as_deref(),
            Some("memory updated in template spec to a value lower than what the VM started with")
        );
    }

    #[test]
    fn a_template_without_sockets_matches_a_defaulted_vmi_and_writes_nothing() {
        let mut template = domain(1, "1Gi");
        template["domain"]["cpu"] = json!({"cores": 1});
        template["domain"]["memory"] = json!({"guest": "1Gi"});
        let (vm, vmi) = vm_and_vmi(&template, &domain(1, "1Gi"), &running());
        assert_eq!(plan(&vm, &vmi), LivePlan::default());
    }

    #[test]
    fn a_hotplug_in_progress_makes_the_next_one_wait() {
        let mut status = running();
        status["conditions"] = json!([{"type": "HotVCPUChange", "status": "True"}]);
        let (vm, vmi) = vm_and_vmi(&domain(3, "1Gi"), &domain(2, "1Gi"), &status);
        let live = plan(&vm, &vmi);
        assert_eq!(
            live.wait.as_deref(),
            Some("another CPU hotplug is in progress")
        );
        assert!(live.vmi_ops.is_empty());
    }

    #[test]
    fn live_fields_are_ignored_by_the_restart_comparison() {
        let mut current: VirtualMachineInstanceSpec =
            serde_json::from_value(domain(2, "2Gi")).unwrap();
        current.node_selector.insert("disk".into(), "ssd".into());
        let mut seen: VirtualMachineInstanceSpec =
            serde_json::from_value(domain(1, "1Gi")).unwrap();
        live_fields_of(&current, &mut seen);
        assert_eq!(seen, current);
    }
}
