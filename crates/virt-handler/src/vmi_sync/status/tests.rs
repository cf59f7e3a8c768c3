use super::*;
use virt_launcher::protocol::PodInterface;
use virt_launcher::spec::{
    Cpu, CpuModel, Firmware, Interface, InterfaceBinding, Masquerade, Memory, RuntimePaths,
    VmiIdentity,
};

const NOW: &str = "2026-11-30T10:00:00Z";

fn scheduled_vmi() -> VirtualMachineInstance {
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "demo", "namespace": "default", "uid": "u1"},
        "spec": {
            "domain": {"devices": {"interfaces": [{"name": "default", "masquerade": {}}]}},
            "networks": [{"name": "default", "pod": {}}]
        },
        "status": {
            "phase": "Scheduled",
            "nodeName": "node01",
            "conditions": [{"type": "Ready", "status": "False", "reason": "GuestNotRunning"}],
            "phaseTransitionTimestamps": [
                {"phase": "Pending", "phaseTransitionTimestamp": "2026-11-30T09:59:58Z"},
                {"phase": "Scheduled", "phaseTransitionTimestamp": "2026-11-30T09:59:59Z"}
            ]
        }
    }))
    .unwrap()
}

fn spec(accel: Accel) -> LauncherSpec {
    LauncherSpec {
        vmi: VmiIdentity {
            name: "demo".into(),
            namespace: "default".into(),
            uid: "u1".into(),
        },
        machine_type: "q35".into(),
        accel,
        tcg_translation_cache_mib: None,
        cpu: Cpu {
            sockets: 1,
            cores: 2,
            threads: 1,
            max_sockets: None,
            model: CpuModel::HostModel,
            features: vec![],
            tsc_frequency: None,
        },
        memory: Memory {
            guest_bytes: 128 << 20,
            max_guest_bytes: None,
            hotplugged_bytes: 0,
            hugepages: None,
        },
        firmware: Firmware::default(),
        disks: vec![],
        interfaces: vec![Interface {
            name: "default".into(),
            model: "virtio".into(),
            binding: InterfaceBinding::Masquerade(Masquerade {
                pod_interface: "eth0".into(),
                bridge: "k6t-eth0".into(),
                tap: "tap0".into(),
                gateway: [10, 0, 2, 1].into(),
                guest: [10, 0, 2, 2].into(),
                prefix_length: 24,
                ports: vec![],
            }),
            mac_address: Some("52:54:00:aa:bb:cc".into()),
            boot_order: None,
            link_down: false,
        }],
        hotplug_ports: 0,
        graphics: None,
        paths: RuntimePaths {
            serial_console_socket: "/p/s".into(),
            serial_log: "/p/l".into(),
            qmp_socket: "/p/q".into(),
            pid_file: "/p/pid".into(),
        },
    }
}

fn domain(state: DomainState, reason: StateReason) -> Observation {
    Observation::Domain(DomainStatus {
        state,
        reason,
        qemu_pid: Some(1),
        ..DomainStatus::pending()
    })
}

fn facts(accel: Accel) -> DomainFacts {
    DomainFacts {
        hotplug: Default::default(),
        spec: Some(spec(accel)),
        accel_reason: "the CPU offers no vmx/svm: using software emulation".into(),
        pod_interface: Some(PodInterface {
            name: "eth0".into(),
            mac: "0a:58:0a:f5:00:07".into(),
            ip_addresses: vec!["10.245.0.7".into()],
            mtu: 1500,
        }),
    }
}

fn with_status(mut vmi: VirtualMachineInstance, status: &Value) -> VirtualMachineInstance {
    vmi.status = serde_json::from_value(status.clone()).unwrap();
    vmi
}

#[test]
fn domain_states_map_to_phases_like_upstream() {
    let d = |state, reason| DomainStatus {
        state,
        reason,
        ..DomainStatus::pending()
    };
    assert_eq!(
        phase_for(&d(DomainState::Pending, StateReason::Unknown), true),
        None
    );
    assert_eq!(
        phase_for(&d(DomainState::Running, StateReason::Booted), true),
        Some(Phase::Running)
    );
    assert_eq!(
        phase_for(&d(DomainState::Paused, StateReason::User), true),
        Some(Phase::Running)
    );
    assert_eq!(
        phase_for(&d(DomainState::Shutoff, StateReason::GuestShutdown), true),
        Some(Phase::Succeeded)
    );
    assert_eq!(
        phase_for(&d(DomainState::Shutoff, StateReason::Destroyed), true),
        Some(Phase::Failed)
    );
    assert_eq!(
        phase_for(&d(DomainState::Shutoff, StateReason::Destroyed), false),
        Some(Phase::Succeeded)
    );
    assert_eq!(
        phase_for(&d(DomainState::Crashed, StateReason::QemuExited), true),
        Some(Phase::Failed)
    );
}

#[test]
fn a_destroyed_domain_fails_only_when_acpi_and_a_grace_period_were_there() {
    let mut vmi = scheduled_vmi();
    // No `features`: upstream's converter puts no ACPI in the domain.
    assert!(!acpi_shutdown_attempted(&vmi));
    vmi.spec.domain.features = Some(serde_json::from_value(json!({"acpi": {}})).unwrap());
    assert!(acpi_shutdown_attempted(&vmi));
    vmi.spec.termination_grace_period_seconds = Some(0);
    assert!(!acpi_shutdown_attempted(&vmi));
    vmi.spec.termination_grace_period_seconds = None;
    vmi.spec.domain.features =
        Some(serde_json::from_value(json!({"acpi": {"enabled": false}})).unwrap());
    assert!(!acpi_shutdown_attempted(&vmi));
    let status = desired_status(
        &vmi,
        &domain(DomainState::Shutoff, StateReason::Destroyed),
        &facts(Accel::Kvm),
        NOW,
    );
    assert_eq!(status["phase"], "Succeeded");
    assert!(status.get("reason").is_none());
}

#[test]
fn a_user_mode_interface_reports_no_address() {
    let mut facts = facts(Accel::Kvm);
    facts.spec.as_mut().unwrap().interfaces[0].binding = InterfaceBinding::UserMode;
    facts.pod_interface = None;
    let desired = desired_status(
        &scheduled_vmi(),
        &domain(DomainState::Running, StateReason::Booted),
        &facts,
        NOW,
    );
    let iface = &desired["interfaces"][0];
    assert_eq!(iface["name"], "default");
    assert_eq!(iface["mac"], "52:54:00:aa:bb:cc");
    assert!(iface.get("ipAddress").is_none(), "{iface}");
}

#[test]
fn a_running_domain_moves_a_scheduled_vmi_to_running_with_its_status_fields() {
    let vmi = scheduled_vmi();
    let desired = desired_status(
        &vmi,
        &domain(DomainState::Running, StateReason::Booted),
        &facts(Accel::Tcg),
        NOW,
    );
    assert_eq!(desired["phase"], "Running");
    let stamps = desired["phaseTransitionTimestamps"].as_array().unwrap();
    assert_eq!(stamps.len(), 3);
    assert_eq!(
        stamps[2],
        json!({"phase": "Running", "phaseTransitionTimestamp": NOW})
    );
    assert_eq!(
        desired["interfaces"][0]["ipAddress"], "10.245.0.7",
        "masquerade reports the pod IP"
    );
    assert_eq!(
        desired["interfaces"][0]["ipAddresses"],
        json!(["10.245.0.7"])
    );
    assert_eq!(desired["interfaces"][0]["mac"], "52:54:00:aa:bb:cc");
    assert_eq!(desired["interfaces"][0]["infoSource"], "domain");
    assert_eq!(desired["currentCPUTopology"]["cores"], 2);
    assert_eq!(desired["memory"]["guestAtBoot"], "128Mi");
    assert_eq!(desired["machine"]["type"], "q35");
    let conditions = desired["conditions"].as_array().unwrap();
    let find = |t: &str| conditions.iter().find(|c| c["type"] == t).cloned();
    assert_eq!(
        find("Ready").unwrap()["reason"],
        "GuestNotRunning",
        "controller's condition kept"
    );
    assert_eq!(find("LiveMigratable").unwrap()["status"], "True");
    assert_eq!(find("SoftwareEmulation").unwrap()["status"], "True");

    let patch = status_patch(&vmi, &desired).unwrap();
    let ops = patch.as_array().unwrap();
    assert_eq!(
        ops[0],
        json!({"op": "test", "path": "/status/phase", "value": "Scheduled"})
    );
    assert!(
        ops.iter()
            .any(|o| o["path"] == "/status/phase" && o["value"] == "Running")
    );
    assert!(
        ops.iter()
            .any(|o| o["op"] == "test" && o["path"] == "/status/conditions"),
        "conditions are rewritten only if unchanged meanwhile"
    );
}

#[test]
fn an_unchanged_observation_writes_nothing() {
    let vmi = scheduled_vmi();
    let obs = domain(DomainState::Running, StateReason::Booted);
    let desired = desired_status(&vmi, &obs, &facts(Accel::Kvm), NOW);
    let running = with_status(vmi, &desired);
    let again = desired_status(&running, &obs, &facts(Accel::Kvm), "2026-11-30T10:05:00Z");
    assert_eq!(status_patch(&running, &again), None);
}

#[test]
fn a_domain_without_interfaces_is_not_written_again() {
    let vmi = scheduled_vmi();
    let mut spec = spec(Accel::Kvm);
    spec.interfaces.clear();
    let obs = domain(DomainState::Running, StateReason::Booted);
    let mut facts = facts(Accel::Kvm);
    facts.spec = Some(spec);
    let desired = desired_status(&vmi, &obs, &facts, NOW);
    assert_eq!(desired["interfaces"], json!([]));
    // What the handler reads back: the typed status leaves the empty list out.
    let running = with_status(vmi, &desired);
    assert!(
        serde_json::to_value(&running.status)
            .unwrap()
            .get("interfaces")
            .is_none(),
        "the typed status drops an empty interfaces list"
    );
    let again = desired_status(&running, &obs, &facts, "2026-11-30T10:05:00Z");
    assert_eq!(status_patch(&running, &again), None);
}

#[test]
fn pause_sets_and_unpause_clears_the_paused_condition() {
    let vmi = scheduled_vmi();
    let running = with_status(
        vmi.clone(),
        &desired_status(
            &vmi,
            &domain(DomainState::Running, StateReason::Booted),
            &facts(Accel::Kvm),
            NOW,
        ),
    );
    let paused_status = desired_status(
        &running,
        &domain(DomainState::Paused, StateReason::User),
        &facts(Accel::Kvm),
        NOW,
    );
    let paused = paused_status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Paused")
        .cloned()
        .unwrap();
    assert_eq!(paused["reason"], "PausedByUser");
    assert_eq!(paused["message"], "VMI was paused by user");
    assert_eq!(paused_status["phase"], "Running");
    let paused_vmi = with_status(running, &paused_status);
    let resumed = desired_status(
        &paused_vmi,
        &domain(DomainState::Running, StateReason::Unpaused),
        &facts(Accel::Kvm),
        NOW,
    );
    assert!(
        !resumed["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "Paused")
    );
}

#[test]
fn a_domain_stopped_by_qemu_itself_is_paused_by_an_io_error() {
    let vmi = scheduled_vmi();
    let running = with_status(
        vmi.clone(),
        &desired_status(
            &vmi,
            &domain(DomainState::Running, StateReason::Booted),
            &facts(Accel::Kvm),
            NOW,
        ),
    );
    let status = desired_status(
        &running,
        &domain(DomainState::Paused, StateReason::Emulator),
        &facts(Accel::Kvm),
        NOW,
    );
    let paused = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Paused")
        .cloned()
        .unwrap();
    assert_eq!(paused["reason"], "PausedIOError");
    assert_eq!(
        paused["message"],
        "VMI was paused, low-level IO error detected"
    );
}

#[test]
fn a_crash_fails_the_vmi_without_a_status_reason_and_final_phases_are_left_alone() {
    let vmi = scheduled_vmi();
    let failed = desired_status(
        &vmi,
        &domain(DomainState::Crashed, StateReason::FailedToStart),
        &facts(Accel::Kvm),
        NOW,
    );
    assert_eq!(failed["phase"], "Failed");
    assert!(failed.get("reason").is_none());
    let failed_vmi = with_status(vmi, &failed);
    let later = desired_status(
        &failed_vmi,
        &domain(DomainState::Running, StateReason::Booted),
        &facts(Accel::Kvm),
        NOW,
    );
    assert_eq!(later["phase"], "Failed");
    assert_eq!(status_patch(&failed_vmi, &later), None);
}

#[test]
fn a_vanished_launcher_fails_the_vmi_and_a_refused_sync_is_a_condition() {
    let vmi = scheduled_vmi();
    let gone = desired_status(
        &vmi,
        &Observation::LauncherGone("x".into()),
        &facts(Accel::Kvm),
        NOW,
    );
    assert_eq!(gone["phase"], "Failed");
    assert!(gone.get("reason").is_none());
    let refused = desired_status(
        &vmi,
        &Observation::SyncFailed("ImageNotFound".into(), "image x is missing".into()),
        &facts(Accel::Kvm),
        NOW,
    );
    assert_eq!(refused["phase"], "Scheduled");
    let sync = refused["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Synchronized")
        .cloned()
        .unwrap();
    assert_eq!(sync["status"], "False");
    assert_eq!(sync["reason"], "ImageNotFound");
    assert_eq!(sync["message"], "image x is missing");
}

#[test]
fn bridge_on_the_pod_network_is_not_live_migratable() {
    let mut vmi = scheduled_vmi();
    vmi.spec.domain.devices.interfaces[0]
        .binding_method
        .masquerade = None;
    vmi.spec.domain.devices.interfaces[0].binding_method.bridge = Some(Default::default());
    let desired = desired_status(
        &vmi,
        &domain(DomainState::Running, StateReason::Booted),
        &facts(Accel::Kvm),
        NOW,
    );
    let lm = desired["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "LiveMigratable")
        .cloned()
        .unwrap();
    assert_eq!(lm["status"], "False");
    assert_eq!(lm["reason"], "InterfaceNotLiveMigratable");
    assert_eq!(
        lm["message"],
        "cannot migrate VMI which does not use masquerade or a migratable plugin to connect to the pod network"
    );
    assert!(
        !desired["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "SoftwareEmulation"),
        "no SoftwareEmulation condition under KVM"
    );
}

#[test]
fn an_existing_paused_condition_is_kept_and_an_unknown_pause_reason_adds_none() {
    let vmi = scheduled_vmi();
    let running = with_status(
        vmi.clone(),
        &desired_status(
            &vmi,
            &domain(DomainState::Running, StateReason::Booted),
            &facts(Accel::Kvm),
            NOW,
        ),
    );
    let unknown = desired_status(
        &running,
        &domain(DomainState::Paused, StateReason::Unknown),
        &facts(Accel::Kvm),
        NOW,
    );
    let paused_cond = |s: &Value| {
        s["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Paused")
            .cloned()
    };
    assert_eq!(paused_cond(&unknown), None, "upstream's default case");
    let by_user = with_status(
        running.clone(),
        &desired_status(
            &running,
            &domain(DomainState::Paused, StateReason::User),
            &facts(Accel::Kvm),
            NOW,
        ),
    );
    let later = desired_status(
        &by_user,
        &domain(DomainState::Paused, StateReason::Emulator),
        &facts(Accel::Kvm),
        "2026-11-30T10:05:00Z",
    );
    let kept = paused_cond(&later).unwrap();
    assert_eq!(kept["reason"], "PausedByUser");
    assert_eq!(kept["lastTransitionTime"], NOW);
}

#[test]
fn a_thawed_guest_has_its_freeze_status_removed() {
    let vmi = scheduled_vmi();
    let obs = domain(DomainState::Running, StateReason::Booted);
    let desired = desired_status(&vmi, &obs, &facts(Accel::Kvm), NOW);
    let mut frozen = desired.clone();
    frozen["fsFreezeStatus"] = json!("frozen");
    let running = with_status(vmi, &frozen);
    let thawed = desired_status(&running, &obs, &facts(Accel::Kvm), NOW);
    let patch = status_patch(&running, &thawed).expect("a patch");
    assert!(
        patch
            .as_array()
            .expect("ops")
            .contains(&json!({"op": "remove", "path": "/status/fsFreezeStatus"})),
        "{patch}"
    );
}
