use serde_json::json;

use super::*;

fn vmi(spec_domain: &Value, status: &Value) -> VirtualMachineInstance {
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "a", "namespace": "default"},
        "spec": {"architecture": "amd64", "domain": spec_domain},
        "status": status,
    }))
    .expect("vmi")
}

fn invtsc(policy: &str) -> VirtualMachineInstance {
    vmi(
        &json!({"devices": {}, "cpu": {"features": [{"name": "invtsc", "policy": policy}]}}),
        &json!({}),
    )
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn invtsc_is_needed_to_boot_and_reenlightenment_to_migrate() {
    assert_eq!(
        tsc_requirement(&invtsc("require")),
        TscRequirement::RequiredForBoot
    );
    assert_eq!(
        tsc_requirement(&invtsc("force")),
        TscRequirement::RequiredForBoot
    );
    assert_eq!(
        tsc_requirement(&invtsc("optional")),
        TscRequirement::NotRequired
    );
    let hyperv = vmi(
        &json!({"devices": {}, "features": {"hyperv": {"reenlightenment": {"enabled": true}}}}),
        &json!({}),
    );
    assert_eq!(
        tsc_requirement(&hyperv),
        TscRequirement::RequiredForMigration
    );
    assert!(awaits_hints(&hyperv));
    let mut arm = invtsc("require");
    arm.spec.architecture = Some("arm64".into());
    assert!(!tsc_required(&arm), "amd64 guests only");
}

#[test]
fn hints_are_the_lowest_frequency_of_schedulable_nodes_or_the_configured_one() {
    let fast = labels(&[
        (TSC_FREQUENCY_LABEL, "3000000000"),
        (c::NODE_SCHEDULABLE_LABEL, "true"),
    ]);
    let slow_cordoned = labels(&[
        (TSC_FREQUENCY_LABEL, "2000000000"),
        (c::NODE_SCHEDULABLE_LABEL, "false"),
    ]);
    let mid = labels(&[
        (TSC_FREQUENCY_LABEL, "2500000000"),
        (c::NODE_SCHEDULABLE_LABEL, "true"),
    ]);
    let none = labels(&[(c::NODE_SCHEDULABLE_LABEL, "true")]);
    let guest = invtsc("require");
    let vmis = vec![];
    let cluster = ClusterTsc {
        nodes: vec![
            ("fast", &fast),
            ("slow", &slow_cordoned),
            ("mid", &mid),
            ("none", &none),
        ],
        vmis: &vmis,
    };
    assert_eq!(
        hints_for(&guest, None, &cluster).expect("hints"),
        Some(TopologyHints {
            tsc_frequency: Some(2_500_000_000)
        }),
        "an unschedulable node without guests does not count"
    );
    // The cordoned node counts while it runs a guest.
    let running = vec![vmi(&json!({"devices": {}}), &json!({"nodeName": "slow"}))];
    let cluster = ClusterTsc {
        vmis: &running,
        ..cluster
    };
    assert_eq!(lowest_cluster_frequency(None, &cluster), Ok(2_000_000_000));
    assert_eq!(lowest_cluster_frequency(Some(1_000), &cluster), Ok(1_000));
    assert_eq!(
        hints_for(&guest, Some(0), &cluster).unwrap_err(),
        "failed to determine the lowest tsc frequency on the cluster: the configured minimumClusterTSCFrequency must be greater 0, but got 0"
    );
    assert_eq!(
        hints_for(&vmi(&json!({"devices": {}}), &json!({})), None, &cluster),
        Ok(None),
        "a guest that needs no frequency gets no hints"
    );
}

#[test]
fn a_hinted_frequency_is_the_launchers_and_its_node_selector() {
    let hinted = vmi(
        &json!({"devices": {}, "cpu": {"features": [{"name": "invtsc"}]}}),
        &json!({"topologyHints": {"tscFrequency": 2_500_000_000_i64}}),
    );
    assert!(!awaits_hints(&hinted));
    assert_eq!(manual_tsc_frequency(&hinted), Some(2_500_000_000));
    assert_eq!(
        scheduling_label(2_500_000_000),
        "scheduling.node.kubevirt.io/tsc-frequency-2500000000"
    );
    // No node reported a frequency: hints of 0 let the pod start without a selector.
    let zero = vmi(
        &json!({"devices": {}, "cpu": {"features": [{"name": "invtsc"}]}}),
        &json!({"topologyHints": {"tscFrequency": 0}}),
    );
    assert!(!awaits_hints(&zero));
    assert_eq!(manual_tsc_frequency(&zero), None);
}

#[test]
fn nodes_carry_the_frequencies_they_can_give() {
    let node = 2_000_000_000_i64;
    let within = node + tolerance(node); // 500 kHz above
    let above = node + tolerance(node) + 1;
    let below = 1_500_000_000;
    let in_use: BTreeSet<i64> = [within, above, below].into();
    let (add, remove) = label_diff(&in_use, &[3_000_000_000].into(), node, false);
    assert_eq!(
        add,
        [node, within].into(),
        "a fixed TSC: its own, within the tolerance"
    );
    assert_eq!(remove, [3_000_000_000].into());
    let (add, _) = label_diff(&in_use, &BTreeSet::new(), node, true);
    assert_eq!(
        add,
        [below, node, within].into(),
        "a scalable TSC: anything up to its own"
    );
}

#[test]
fn the_node_patch_adds_and_removes_only_scheduling_labels() {
    let node = labels(&[
        (TSC_FREQUENCY_LABEL, "2000000000"),
        ("scheduling.node.kubevirt.io/tsc-frequency-1000", "true"),
        ("kubernetes.io/hostname", "n1"),
    ]);
    let patch = node_label_patch(&node, &[2_000_000_000].into())
        .expect("readable")
        .expect("a change");
    assert_eq!(
        patch,
        json!({"metadata": {"labels": {
            "scheduling.node.kubevirt.io/tsc-frequency-2000000000": "true",
            "scheduling.node.kubevirt.io/tsc-frequency-1000": null,
        }}})
    );
    let done = labels(&[
        (TSC_FREQUENCY_LABEL, "2000000000"),
        (
            "scheduling.node.kubevirt.io/tsc-frequency-2000000000",
            "true",
        ),
    ]);
    assert_eq!(node_label_patch(&done, &[2_000_000_000].into()), Ok(None));
    assert!(node_label_patch(&labels(&[(TSC_FREQUENCY_LABEL, "fast")]), &BTreeSet::new()).is_err());
}
