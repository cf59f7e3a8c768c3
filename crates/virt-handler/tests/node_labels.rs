//! The handler's node labels on a real API server: QEMU's answers become upstream's labels,
//! stale owned labels go, other writers' labels stay, and the skip annotation is honoured.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use virt_handler::node::cpu::{QemuCpuAnswers, obsolete_models};
use virt_handler::node::{HostFacts, NodeAgent};

const NODE: &str = "node01";

fn agent() -> NodeAgent {
    let text = include_str!("../testdata/qemu-cpu/qemu-7.2-tcg.json");
    let answers = QemuCpuAnswers::from_json(&serde_json::from_str(text).expect("answers"));
    NodeAgent {
        node_name: NODE.into(),
        facts: HostFacts::default(),
        answers: Some(answers),
    }
}

async fn labels(api: &Api<Node>) -> BTreeMap<String, String> {
    api.get(NODE)
        .await
        .expect("node")
        .metadata
        .labels
        .unwrap_or_default()
}

#[tokio::test]
async fn labels_are_replaced_stale_ones_removed_and_foreign_ones_kept() -> anyhow::Result<()> {
    let cluster = testkit::InProcessCluster::start().await?;
    let api: Api<Node> = Api::all(cluster.client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "labels": {
            "team": "blue",
            "cpu-model.node.kubevirt.io/qemu64": "true",
            "cpu-feature.node.kubevirt.io/no-such-feature": "true",
            "machine-type.node.kubevirt.io/pc-q35-1.0": "true",
        }},
    }))?;
    api.create(&PostParams::default(), &node).await?;
    let agent = agent();
    agent
        .register(&api, &obsolete_models(None))
        .await
        .map_err(anyhow::Error::new)?;
    let got = labels(&api).await;
    assert_eq!(got.get("team").map(String::as_str), Some("blue"));
    assert!(!got.contains_key("cpu-model.node.kubevirt.io/qemu64"));
    assert!(!got.contains_key("cpu-feature.node.kubevirt.io/no-such-feature"));
    assert!(!got.contains_key("machine-type.node.kubevirt.io/pc-q35-1.0"));
    assert_eq!(got["cpu-model.node.kubevirt.io/Westmere"], "true");
    assert_eq!(got["machine-type.node.kubevirt.io/q35"], "true");
    assert_eq!(got["kubevirt.io/schedulable"], "true");
    let node = api.get(NODE).await?;
    let annotations = node.metadata.annotations.unwrap_or_default();
    assert!(annotations.contains_key("kubevirt.io/heartbeat"));

    // A changed obsolete list moves the model labels on the next pass.
    let obsolete = obsolete_models(Some(&BTreeMap::from([("Westmere".to_owned(), true)])));
    agent
        .sync_labels(&api, &obsolete)
        .await
        .map_err(anyhow::Error::new)?;
    let got = labels(&api).await;
    assert!(!got.contains_key("cpu-model.node.kubevirt.io/Westmere"));
    assert_eq!(got["cpu-model.node.kubevirt.io/qemu64"], "true");

    // A node with the skip annotation keeps whatever labels it has.
    api.patch(
        NODE,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {
            "annotations": {"node-labeller.kubevirt.io/skip-node": ""},
            "labels": {"cpu-model.node.kubevirt.io/Westmere": "true"},
        }})),
    )
    .await?;
    agent
        .sync_labels(&api, &obsolete)
        .await
        .map_err(anyhow::Error::new)?;
    assert_eq!(
        labels(&api).await["cpu-model.node.kubevirt.io/Westmere"],
        "true"
    );
    Ok(())
}

#[tokio::test]
async fn a_missing_node_is_reported_not_created() -> anyhow::Result<()> {
    let cluster = testkit::InProcessCluster::start().await?;
    let api: Api<Node> = Api::all(cluster.client.clone());
    let err = agent()
        .register(&api, &obsolete_models(None))
        .await
        .unwrap_err();
    assert!(
        matches!(err, virt_handler::node::NodeError::Missing(_)),
        "{err}"
    );
    assert!(api.get_opt(NODE).await?.is_none());
    Ok(())
}
