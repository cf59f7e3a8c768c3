//! End-to-end: a VMI's CPU model and required CPU features are scheduling constraints, as
//! upstream's: virt-controller asks for nodes labelled `cpu-model.node.kubevirt.io/<model>` and
//! `cpu-feature.node.kubevirt.io/<feature>`, which each handler sets from what its QEMU reports.
//! A VMI asking for a model no node has stays Pending with the pod's `PodScheduled=False` /
//! `Unschedulable` on the VMI; one asking for a feature its node has runs. Fake QEMU for the
//! guests; the node's labels come from the real QEMU probe, so QEMU must be installed.

use std::path::Path;

use testkit::{DEADLINE, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

fn vmi(name: &str, cpu: &str) -> String {
    format!(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata:\n  name: {name}\n\
         spec:\n  domain:\n    cpu: {cpu}\n    memory: {{guest: 64Mi}}\n    devices: {{}}\n"
    )
}

#[test]
fn a_cpu_model_no_node_has_keeps_the_vmi_pending_and_a_present_feature_runs() -> anyhow::Result<()>
{
    if testkit::available(testkit::command("qemu-system-x86_64", "qemu-system-x86")).is_none() {
        return Ok(());
    }
    let server = ServerProcess::start(Path::new(BIN), "server", &["--fake-qemu"])?;
    // A feature the node's CPU has, from the handler's labels.
    let feature = testkit::with_log(
        &server,
        wait_until(DEADLINE, "the node's CPU feature labels", || {
            let labels = server.get(&["nodes"], "{.items[0].metadata.labels}");
            let labels: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(&labels).ok()?;
            labels
                .keys()
                .find_map(|k| k.strip_prefix("cpu-feature.node.kubevirt.io/"))
                .map(str::to_owned)
        }),
    )?;

    server.apply(&vmi("nowhere", "{model: NoSuchModel}"))?;
    let condition = testkit::with_log(
        &server,
        wait_until(DEADLINE, "the VMI to be unschedulable", || {
            let got = server.get(
                &["vmi", "nowhere"],
                r#"{.status.phase} {.status.conditions[?(@.type=="PodScheduled")].status} {.status.conditions[?(@.type=="PodScheduled")].reason} {.status.conditions[?(@.type=="PodScheduled")].message}"#,
            );
            got.contains("Unschedulable").then_some(got)
        }),
    )?;
    assert!(
        condition.starts_with("Scheduling False Unschedulable 0/1 nodes are available"),
        "{condition}"
    );
    let selector = server.get(
        &["pods", "-l", "kubevirt.io/created-by"],
        "{.items[0].spec.nodeSelector}",
    );
    assert!(
        selector.contains(r#""cpu-model.node.kubevirt.io/NoSuchModel":"true""#),
        "{selector}"
    );

    server.apply(&vmi(
        "featured",
        &format!("{{features: [{{name: {feature}, policy: require}}]}}"),
    ))?;
    testkit::with_log(
        &server,
        wait_until(DEADLINE, "the VMI with a present feature Running", || {
            (server.get(&["vmi", "featured"], "{.status.phase}") == "Running").then_some(())
        }),
    )?;
    assert_eq!(
        server.get(&["vmi", "nowhere"], "{.status.phase}"),
        "Scheduling"
    );
    Ok(())
}
