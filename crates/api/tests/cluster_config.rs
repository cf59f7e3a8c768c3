//! The shared KubeVirt CR watch against our API server: a subscriber sees the CR appear,
//! change and go away, without an API call of its own.

use std::time::Duration;

use anyhow::Context;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kubevirt_api::cluster_config::{self, ClusterConfigWatch};
use kubevirt_api::v1::KubeVirt;
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(30);

fn use_emulation(kv: Option<&KubeVirt>) -> Option<bool> {
    kv?.spec
        .configuration
        .as_ref()?
        .developer_configuration
        .as_ref()?
        .use_emulation
}

async fn wait_for(
    watch: &ClusterConfigWatch<Option<bool>>,
    want: Option<bool>,
) -> anyhow::Result<()> {
    let mut rx = watch.receiver();
    tokio::time::timeout(DEADLINE, rx.wait_for(|v| *v == want))
        .await
        .with_context(|| format!("waiting for useEmulation {want:?}"))?
        .context("the watch ended")?;
    assert_eq!(watch.current(), want);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_sees_the_cr_created_updated_and_deleted() -> anyhow::Result<()> {
    let cluster = testkit::InProcessCluster::start().await?;
    let api: Api<KubeVirt> = Api::namespaced(cluster.client.clone(), "kubevirt");
    let watch = cluster_config::subscribe(api.clone(), use_emulation);
    assert_eq!(watch.current(), None, "defaults before any CR");

    let kv: KubeVirt = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
        "spec": {"configuration": {"developerConfiguration": {"useEmulation": true}}}
    }))?;
    api.create(&PostParams::default(), &kv).await?;
    wait_for(&watch, Some(true)).await?;

    let patch =
        json!({"spec": {"configuration": {"developerConfiguration": {"useEmulation": false}}}});
    api.patch("kubevirt", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    wait_for(&watch, Some(false)).await?;

    api.delete("kubevirt", &DeleteParams::default()).await?;
    wait_for(&watch, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cr_that_exists_before_subscribing_is_seen_from_the_first_list() -> anyhow::Result<()> {
    let cluster = testkit::InProcessCluster::start().await?;
    let api: Api<KubeVirt> = Api::namespaced(cluster.client.clone(), "kubevirt");
    let kv: KubeVirt = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
        "spec": {"configuration": {"developerConfiguration": {"useEmulation": true}}}
    }))?;
    api.create(&PostParams::default(), &kv).await?;
    let all: Api<KubeVirt> = Api::all(cluster.client.clone());
    let watch = cluster_config::subscribe(all, use_emulation);
    wait_for(&watch, Some(true)).await
}
