//! The VM controller against our API server, started in-process by testkit on a temporary
//! data directory with the KubeVirt CRDs installed. The test plays virt-handler by writing
//! VMI phases itself.

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Event;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kubevirt_api::constants::{VM_CONTROLLER_FINALIZER, VM_GENERATION_ANNOTATION};
use kubevirt_api::v1::{PrintableStatus, VirtualMachine, VirtualMachineInstance};
use serde_json::json;
use testkit::wait_until_async;
use tokio_util::sync::CancellationToken;
use virt_controller::runtime::metrics::Metrics;
use virt_controller::vm::{VmControllerConfig, run_vm_controller};

const DEADLINE: Duration = Duration::from_secs(30);

async fn printable_status(vms: &Api<VirtualMachine>) -> Option<PrintableStatus> {
    vms.get("testvm").await.ok()?.status?.printable_status
}

async fn wait_status(vms: &Api<VirtualMachine>, want: PrintableStatus) -> anyhow::Result<()> {
    wait_until_async(DEADLINE, &format!("printableStatus {want:?}"), || async {
        (printable_status(vms).await.as_ref() == Some(&want)).then_some(())
    })
    .await
}

async fn set_vmi_phase(vmis: &Api<VirtualMachineInstance>, phase: &str) -> anyhow::Result<()> {
    let patch = json!({"status": {"phase": phase, "phaseTransitionTimestamps": [
        {"phase": phase, "phaseTransitionTimestamp": "2024-01-01T00:00:00Z"}
    ]}});
    vmis.patch("testvm", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .context("patching the VMI phase")?;
    Ok(())
}

/// The in-process API server with the CRDs (testkit), and the VM controller running against it.
struct Harness {
    client: Client,
    cluster: testkit::InProcessCluster,
    cancel: CancellationToken,
    controller: tokio::task::JoinHandle<()>,
}

impl Harness {
    async fn start() -> anyhow::Result<Harness> {
        let cluster = testkit::InProcessCluster::start().await?;
        let client = cluster.client.clone();
        let cancel = CancellationToken::new();
        let controller = {
            let client = client.clone();
            let cancel = cancel.clone();
            tokio::spawn(async move {
                let metrics = Metrics::new();
                let config = VmControllerConfig::fixed(Default::default(), Default::default(), 2);
                run_vm_controller(client, config, &metrics, cancel).await;
            })
        };
        Ok(Harness {
            client,
            cluster,
            cancel,
            controller,
        })
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        self.cancel.cancel();
        self.controller.await?;
        self.cluster.stop().await;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_starts_runs_and_stops_against_the_embedded_api_server() -> anyhow::Result<()> {
    let harness = Harness::start().await?;
    let client = harness.client.clone();
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), "default");
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), "default");
    let vm: VirtualMachine = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "testvm", "namespace": "default"},
        "spec": {"runStrategy": "Always", "template": {
            "metadata": {"labels": {"kubevirt.io/vm": "testvm"}},
            "spec": {"domain": {"devices": {}}, "volumes": [
                {"name": "containerdisk", "containerDisk": {"image": "quay.io/containerdisks/cirros"}}
            ]}
        }}
    }))?;
    let created = vms.create(&PostParams::default(), &vm).await?;

    let vmi = wait_until_async(DEADLINE, "the VMI", || async {
        vmis.get("testvm").await.ok()
    })
    .await?;
    let owner = &vmi.metadata.owner_references.clone().unwrap_or_default()[0];
    assert_eq!(Some(&owner.uid), created.metadata.uid.as_ref());
    assert_eq!(
        (owner.controller, owner.block_owner_deletion),
        (Some(true), Some(true))
    );
    assert!(
        vmi.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&VM_CONTROLLER_FINALIZER.to_owned())
    );
    assert_eq!(
        vmi.metadata.labels.unwrap_or_default()["kubevirt.io/vm"],
        "testvm"
    );
    let annotations = vmi.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations
            .get(VM_GENERATION_ANNOTATION)
            .map(String::as_str),
        Some("1")
    );
    assert_eq!(vmi.spec.domain.devices.disks[0].name, "containerdisk");
    wait_status(&vms, PrintableStatus::Starting).await?;
    let vm = vms.get("testvm").await?;
    assert!(
        vm.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&VM_CONTROLLER_FINALIZER.to_owned())
    );

    set_vmi_phase(&vmis, "Running").await?;
    wait_status(&vms, PrintableStatus::Running).await?;

    vms.patch(
        "testvm",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"runStrategy": "Halted"}})),
    )
    .await?;
    wait_until_async(DEADLINE, "the VMI deletion", || async {
        vmis.get("testvm")
            .await
            .ok()?
            .metadata
            .deletion_timestamp
            .map(|_| ())
    })
    .await?;
    wait_status(&vms, PrintableStatus::Stopping).await?;
    set_vmi_phase(&vmis, "Succeeded").await?;
    wait_until_async(DEADLINE, "the VMI to disappear", || async {
        matches!(vmis.get_opt("testvm").await, Ok(None)).then_some(())
    })
    .await?;
    wait_status(&vms, PrintableStatus::Stopped).await?;
    // `Stopped` already shows while the final VMI still exists; `created` follows once the
    // controller has seen the VMI go (created=false is omitted, as upstream).
    let status = wait_until_async(DEADLINE, "created to be cleared", || async {
        let status = vms.get("testvm").await.ok()?.status.unwrap_or_default();
        status.created.is_none().then_some(status)
    })
    .await?;
    assert_eq!(status.created, None, "created=false is omitted as upstream");
    assert_eq!(
        status.start_failure, None,
        "a VMI that ran is no start failure"
    );

    harness.stop().await
}

/// The core `v1` Events about the VM `testvm`, found as `kubectl describe vm` finds them.
async fn vm_events(client: &Client) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let selector = "involvedObject.kind=VirtualMachine,involvedObject.name=testvm";
    events
        .list(&ListParams::default().fields(selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

async fn wait_event(client: &Client, reason: &str, count: i32) -> anyhow::Result<Event> {
    wait_until_async(DEADLINE, &format!("event {reason} x{count}"), || async {
        vm_events(client)
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reason) && e.count == Some(count))
    })
    .await
}

async fn set_run_strategy(vms: &Api<VirtualMachine>, strategy: &str) -> anyhow::Result<()> {
    let patch = json!({"spec": {"runStrategy": strategy}});
    vms.patch("testvm", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .context("patching the run strategy")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_and_stopping_a_vm_records_upstreams_events_and_aggregates_repeats()
-> anyhow::Result<()> {
    let harness = Harness::start().await?;
    let client = harness.client.clone();
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), "default");
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), "default");
    let vm: VirtualMachine = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "testvm", "namespace": "default"},
        "spec": {"runStrategy": "Always", "template": {
            "spec": {"domain": {"devices": {}}}
        }}
    }))?;
    let created = vms.create(&PostParams::default(), &vm).await?;

    let started = wait_event(&client, "SuccessfulCreate", 1).await?;
    assert_eq!(started.type_.as_deref(), Some("Normal"));
    assert_eq!(
        started.message.as_deref(),
        Some("Started the virtual machine by creating the new virtual machine instance testvm")
    );
    assert_eq!(started.involved_object.uid, created.metadata.uid);
    assert_eq!(
        started.involved_object.api_version.as_deref(),
        Some("kubevirt.io/v1")
    );
    assert_eq!(
        started.source.and_then(|s| s.component).as_deref(),
        Some("virtualmachine-controller")
    );

    let vmi_uid = wait_until_async(DEADLINE, "the VMI", || async {
        vmis.get("testvm").await.ok()?.metadata.uid
    })
    .await?;
    set_vmi_phase(&vmis, "Running").await?;
    set_run_strategy(&vms, "Halted").await?;
    let stopped = wait_event(&client, "SuccessfulDelete", 1).await?;
    assert_eq!(stopped.type_.as_deref(), Some("Normal"));
    assert_eq!(
        stopped.message,
        Some(format!(
            "Stopped the virtual machine by deleting the virtual machine instance {vmi_uid}"
        ))
    );
    set_vmi_phase(&vmis, "Succeeded").await?;
    wait_until_async(DEADLINE, "the VMI to disappear", || async {
        matches!(vmis.get_opt("testvm").await, Ok(None)).then_some(())
    })
    .await?;
    wait_status(&vms, PrintableStatus::Stopped).await?;

    // Starting again repeats the first event exactly: it is counted, not recorded twice.
    set_run_strategy(&vms, "Always").await?;
    let again = wait_event(&client, "SuccessfulCreate", 2).await?;
    assert_eq!(again.metadata.name, started.metadata.name);
    let creates = vm_events(&client)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("SuccessfulCreate"))
        .count();
    assert_eq!(creates, 1, "a repeat is aggregated into the first Event");

    harness.stop().await
}
