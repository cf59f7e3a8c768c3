//! The VMI controller against our embedded API server, started in-process on a temporary
//! data directory with the KubeVirt CRDs installed. The test plays the pod runner by marking
//! the launcher pod Running itself.

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kubevirt_api::v1::{VirtualMachineInstance, VirtualMachineInstancePhase as Phase};
use serde_json::json;
use testkit::wait_until_async;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use virt_controller::metadata_sync::MetadataSyncPatterns;
use virt_controller::metadata_sync::SyncPatterns;
use virt_controller::runtime::metrics::Metrics;
use virt_controller::vmi::template::LauncherPodConfig;
use virt_controller::vmi::{VmiControllerConfig, run_vmi_controller};

const DEADLINE: Duration = Duration::from_secs(30);

fn labels(pattern: &str) -> MetadataSyncPatterns {
    MetadataSyncPatterns {
        labels: SyncPatterns::parse_flag(pattern).0,
        annotations: SyncPatterns::default(),
    }
}

async fn launcher_pod(pods: &Api<Pod>, vmi_uid: &str) -> Option<Pod> {
    let selector = format!("kubevirt.io/created-by={vmi_uid}");
    let list = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .ok()?;
    list.items.into_iter().next()
}

fn pod_label(pod: &Pod, key: &str) -> Option<String> {
    pod.metadata.labels.as_ref()?.get(key).cloned()
}

async fn vmi_phase(vmis: &Api<VirtualMachineInstance>) -> Option<Phase> {
    vmis.get("testvmi").await.ok()?.status?.phase
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vmi_gets_a_launcher_pod_is_scheduled_and_its_labels_follow_in_place()
-> anyhow::Result<()> {
    let cluster = testkit::InProcessCluster::start().await?;
    let client = cluster.client.clone();

    let cancel = CancellationToken::new();
    let (set_patterns, patterns) = watch::channel(labels("ops.example.com/*"));
    let controller = {
        let (client, cancel) = (client.clone(), cancel.clone());
        let config = VmiControllerConfig {
            workers: 2,
            ..VmiControllerConfig::new(LauncherPodConfig::default(), patterns)
        };
        tokio::spawn(
            async move { run_vmi_controller(client, config, &Metrics::new(), cancel).await },
        )
    };

    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let vmi: VirtualMachineInstance = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "testvmi", "namespace": "default",
                     "labels": {"ops.example.com/owner": "team-a-v1", "unrelated": "x"}},
        "spec": {"domain": {"devices": {}, "memory": {"guest": "128Mi"}}}
    }))?;
    let created = vmis.create(&PostParams::default(), &vmi).await?;
    let uid = created.metadata.uid.clone().context("VMI uid")?;

    let pod = wait_until_async(DEADLINE, "the launcher pod", || launcher_pod(&pods, &uid)).await?;
    assert_eq!(
        pod_label(&pod, "kubevirt.io").as_deref(),
        Some("virt-launcher")
    );
    assert_eq!(
        pod_label(&pod, "ops.example.com/owner").as_deref(),
        Some("team-a-v1")
    );
    let owner = &pod.metadata.owner_references.clone().unwrap_or_default()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("VirtualMachineInstance", uid.as_str())
    );
    wait_until_async(DEADLINE, "Scheduling", || async {
        (vmi_phase(&vmis).await == Some(Phase::Scheduling)).then_some(())
    })
    .await?;

    let name = pod.metadata.name.clone().context("pod name")?;
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let selector = "involvedObject.kind=VirtualMachineInstance,involvedObject.name=testvmi";
    let created = wait_until_async(DEADLINE, "the SuccessfulCreate event", || async {
        let list = events.list(&ListParams::default().fields(selector)).await;
        list.ok()?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("SuccessfulCreate"))
    })
    .await?;
    assert_eq!(created.type_.as_deref(), Some("Normal"));
    assert_eq!(
        created.message,
        Some(format!("Created virtual machine pod {name}"))
    );

    // Play scheduler and kubelet: bind the pod and report the compute container running.
    let uid_before = pod.metadata.uid.clone();
    pods.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"nodeName": "node01"}})),
    )
    .await
    .context("binding the pod")?;
    let running = json!({"status": {"phase": "Running", "containerStatuses": [{
        "name": "compute", "ready": true, "restartCount": 0, "image": "", "imageID": "",
        "state": {"running": {"startedAt": "2024-01-01T00:00:00Z"}}}]}});
    pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(running))
        .await?;
    wait_until_async(DEADLINE, "Scheduled", || async {
        (vmi_phase(&vmis).await == Some(Phase::Scheduled)).then_some(())
    })
    .await?;
    let scheduled = vmis.get("testvmi").await?;
    assert_eq!(
        scheduled
            .status
            .as_ref()
            .and_then(|s| s.node_name.as_deref()),
        Some("node01")
    );
    wait_until_async(DEADLINE, "the nodeName label on the pod", || async {
        let pod = pods.get(&name).await.ok()?;
        (pod_label(&pod, "kubevirt.io/nodeName").as_deref() == Some("node01")).then_some(())
    })
    .await?;

    // Labels under the prefix follow the VMI on the same pod; others stay as they are.
    let relabel = json!({"metadata": {"labels": {
        "ops.example.com/owner": "team-a-v2", "ops.example.com/dynamic": "enabled", "unrelated": "y"}}});
    vmis.patch("testvmi", &PatchParams::default(), &Patch::Merge(relabel))
        .await?;
    let pod = wait_until_async(DEADLINE, "the relabelled pod", || async {
        let pod = pods.get(&name).await.ok()?;
        (pod_label(&pod, "ops.example.com/owner").as_deref() == Some("team-a-v2")).then_some(pod)
    })
    .await?;
    assert_eq!(
        pod_label(&pod, "ops.example.com/dynamic").as_deref(),
        Some("enabled")
    );
    assert_eq!(
        pod_label(&pod, "unrelated").as_deref(),
        Some("x"),
        "keys outside the patterns are untouched"
    );
    assert_eq!(pod.metadata.uid, uid_before, "patched in place");

    // A new pattern takes effect without a restart.
    set_patterns.send_replace(labels("ops.example.com/*,team/*"));
    vmis.patch(
        "testvmi",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"team/x": "1"}}})),
    )
    .await?;
    wait_until_async(DEADLINE, "the label of the new pattern", || async {
        let pod = pods.get(&name).await.ok()?;
        (pod_label(&pod, "team/x").as_deref() == Some("1")).then_some(())
    })
    .await?;

    cancel.cancel();
    controller.await?;
    Ok(())
}
