//! The EndpointSlice and disruption controllers against a real API server. No scheduler or
//! node agent runs: the tests bind pods at creation and set their status (pod IP, `Ready`)
//! through the status subresource, as a node agent would.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const NS: &str = "default";
const DEADLINE: Duration = Duration::from_secs(60);

/// An API server with the controller-manager running; stops both when dropped.
struct Harness {
    cluster: testkit::InProcessCluster,
    cancel: CancellationToken,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl Harness {
    async fn start() -> Harness {
        let cluster = testkit::InProcessCluster::start_without_crds()
            .await
            .expect("API server");
        let cancel = CancellationToken::new();
        let nodes: Api<Node> = Api::all(cluster.client.clone());
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "z1"}}
        }))
        .expect("node");
        nodes
            .create(&PostParams::default(), &node)
            .await
            .expect("create node");
        tokio::spawn(kubevirt_controller_manager::run(
            cluster.client.clone(),
            kubevirt_controller_manager::Config::default(),
            cancel.clone(),
        ));
        Harness { cluster, cancel }
    }

    fn client(&self) -> kube::Client {
        self.cluster.client.clone()
    }
}

async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    testkit::wait_until_async(DEADLINE, what, check)
        .await
        .expect("condition reached")
}

/// Creates a pod bound to `n1` with the given labels and container ports.
async fn create_pod(client: &kube::Client, name: &str, app: &str, ports: serde_json::Value) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"nodeName": "n1", "containers": [
            {"name": "main", "image": "example.invalid/app", "ports": ports}]}
    }))
    .expect("pod");
    Api::<Pod>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
}

/// Sets a pod's status as a node agent would: running, with `ip` (if any) and `Ready`.
async fn set_status(client: &kube::Client, name: &str, ip: Option<&str>, ready: bool) {
    let mut status = json!({"phase": "Running", "conditions": [
        {"type": "Ready", "status": if ready { "True" } else { "False" }}]});
    if let Some(ip) = ip {
        status["podIP"] = json!(ip);
        status["podIPs"] = json!([{"ip": ip}]);
    }
    Api::<Pod>::namespaced(client.clone(), NS)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .expect("pod status");
}

async fn create_service(client: &kube::Client, name: &str, selector: Option<&str>) -> Service {
    let mut svc = json!({
        "metadata": {"name": name, "labels": {"team": "kv"}},
        "spec": {"ports": [{"name": "https", "port": 443, "targetPort": "https"}]}
    });
    if let Some(app) = selector {
        svc["spec"]["selector"] = json!({"app": app});
    }
    Api::<Service>::namespaced(client.clone(), NS)
        .create(
            &PostParams::default(),
            &serde_json::from_value(svc).expect("service"),
        )
        .await
        .expect("create service")
}

async fn slices_of(client: &kube::Client, service: &str) -> Vec<EndpointSlice> {
    Api::<EndpointSlice>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// The endpoint of pod `name` in the slices of `service`, with the slice's ports.
async fn endpoint_of(
    client: &kube::Client,
    service: &str,
    name: &str,
) -> Option<(Endpoint, Vec<(String, i32)>)> {
    slices_of(client, service).await.into_iter().find_map(|s| {
        let ports = s
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone().unwrap_or_default(), p.port.unwrap_or(0)))
            .collect();
        s.endpoints
            .into_iter()
            .find(|e| e.target_ref.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .map(|e| (e, ports))
    })
}

fn ready(e: &Endpoint) -> Option<bool> {
    e.conditions.as_ref().and_then(|c| c.ready)
}

/// Services "plain" (no selector) and "web" (selecting app=web, port 443 → named "https"),
/// and four web pods: a and b with "https" on 8443 (b not ready), c without the named port,
/// one without an IP. Returns (plain, web).
async fn web_pods(client: &kube::Client) -> (Service, Service) {
    let plain = create_service(client, "plain", None).await;
    let web = create_service(client, "web", Some("web")).await;
    let https = json!([{"name": "https", "containerPort": 8443}]);
    create_pod(client, "web-a", "web", https.clone()).await;
    create_pod(client, "web-b", "web", https).await;
    create_pod(client, "web-c", "web", json!([])).await;
    create_pod(client, "web-no-ip", "web", json!([])).await;
    set_status(client, "web-a", Some("10.244.0.11"), true).await;
    set_status(client, "web-b", Some("10.244.0.12"), false).await;
    set_status(client, "web-c", Some("10.244.0.13"), true).await;
    set_status(client, "web-no-ip", None, true).await;
    (plain, web)
}

#[tokio::test]
async fn a_service_gets_slices_of_its_ready_and_unready_pods_grouped_by_resolved_ports() {
    let h = Harness::start().await;
    let client = h.client();
    let (_, web) = web_pods(&client).await;
    let (a, ports) = eventually("web-a in a slice", || async {
        endpoint_of(&client, "web", "web-a").await
    })
    .await;
    assert_eq!(
        ports,
        [("https".to_owned(), 8443)],
        "the named port resolved"
    );
    assert_eq!(a.addresses, ["10.244.0.11"]);
    assert_eq!(ready(&a), Some(true));
    assert_eq!(a.node_name.as_deref(), Some("n1"));
    assert_eq!(a.zone.as_deref(), Some("z1"));
    let (b, _) = eventually("web-b in a slice", || async {
        endpoint_of(&client, "web", "web-b").await
    })
    .await;
    let conditions = b.conditions.clone().unwrap_or_default();
    assert_eq!(
        (conditions.ready, conditions.serving, conditions.terminating),
        (Some(false), Some(false), Some(false))
    );
    let (c, c_ports) = eventually("web-c in a slice", || async {
        endpoint_of(&client, "web", "web-c").await
    })
    .await;
    assert!(
        c_ports.is_empty(),
        "a pod without the named port: {c_ports:?}"
    );
    assert_eq!(ready(&c), Some(true));

    let slices = slices_of(&client, "web").await;
    assert_eq!(slices.len(), 2, "one slice per port set: {slices:?}");
    assert!(slices.iter().all(|s| {
        s.endpoints
            .iter()
            .all(|e| e.target_ref.as_ref().and_then(|r| r.name.as_deref()) != Some("web-no-ip"))
    }));
    for slice in &slices {
        assert!(slice.name_any().starts_with("web-"));
        assert_eq!(slice.address_type, "IPv4");
        assert_eq!(
            slice
                .labels()
                .get("endpointslice.kubernetes.io/managed-by")
                .map(String::as_str),
            Some("endpointslice-controller.k8s.io")
        );
        assert_eq!(slice.labels().get("team").map(String::as_str), Some("kv"));
        let owner = &slice.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("Service", "web")
        );
        assert_eq!(Some(&owner.uid), web.metadata.uid.as_ref());
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true))
        );
    }
    // "plain" was created before "web", whose slices exist by now: no selector, no slice.
    assert!(slices_of(&client, "plain").await.is_empty());
}

#[tokio::test]
async fn slices_follow_readiness_deletion_selector_changes_and_the_service() {
    let h = Harness::start().await;
    let client = h.client();
    let (plain, _) = web_pods(&client).await;
    eventually("web-b and web-c in slices", || async {
        endpoint_of(&client, "web", "web-b").await?;
        endpoint_of(&client, "web", "web-c").await
    })
    .await;
    // A change that alters no endpoint (it wakes the Service), then one that does: the slice
    // the second leaves alone keeps its resourceVersion, so nothing was rewritten needlessly.
    let c_slice = |slices: Vec<EndpointSlice>| {
        slices
            .into_iter()
            .find(|s| s.ports.as_deref().unwrap_or_default().is_empty())
            .and_then(|s| s.resource_version())
    };
    let before = c_slice(slices_of(&client, "web").await);
    Api::<Pod>::namespaced(client.clone(), NS)
        .patch(
            "web-c",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"touched": "yes"}}})),
        )
        .await
        .expect("annotate web-c");
    set_status(&client, "web-b", Some("10.244.0.12"), true).await;
    eventually("web-b ready", || async {
        let (b, _) = endpoint_of(&client, "web", "web-b").await?;
        (ready(&b) == Some(true)).then_some(())
    })
    .await;
    assert!(before.is_some());
    assert_eq!(c_slice(slices_of(&client, "web").await), before);

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.delete("web-a", &DeleteParams::default())
        .await
        .expect("delete web-a");
    eventually("web-a terminating or gone", || async {
        match endpoint_of(&client, "web", "web-a").await {
            None => Some(()),
            Some((a, _)) => {
                let c = a.conditions.unwrap_or_default();
                (c.terminating == Some(true) && c.ready == Some(false)).then_some(())
            }
        }
    })
    .await;
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    match pods.delete("web-a", &now).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => panic!("delete web-a now: {e}"),
    }
    eventually("web-a gone from the slices", || async {
        let left = endpoint_of(&client, "web", "web-a").await;
        let b = endpoint_of(&client, "web", "web-b").await;
        (left.is_none() && b.is_some()).then_some(())
    })
    .await;

    // A selector added later brings slices; losing it takes them away.
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    services
        .patch(
            &plain.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"selector": {"app": "web"}}})),
        )
        .await
        .expect("add selector");
    eventually("plain's slice", || async {
        endpoint_of(&client, "plain", "web-b").await
    })
    .await;
    services
        .patch(
            "plain",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"selector": null}})),
        )
        .await
        .expect("drop selector");
    eventually("plain's slices removed", || async {
        slices_of(&client, "plain").await.is_empty().then_some(())
    })
    .await;

    // A deleted Service's slices go with it (owner reference, garbage collector).
    services
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete web");
    eventually("web's slices collected", || async {
        slices_of(&client, "web").await.is_empty().then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_service_selecting_nothing_keeps_an_empty_placeholder_slice() {
    let h = Harness::start().await;
    let client = h.client();
    create_service(&client, "empty", Some("nothing")).await;
    let slices = eventually("a placeholder slice", || async {
        let s = slices_of(&client, "empty").await;
        (!s.is_empty()).then_some(s)
    })
    .await;
    assert_eq!(slices.len(), 1);
    assert!(slices[0].endpoints.is_empty());
    assert!(slices[0].ports.as_deref().unwrap_or_default().is_empty());
}

async fn budget_status(
    client: &kube::Client,
    name: &str,
) -> Option<k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus> {
    Api::<PodDisruptionBudget>::namespaced(client.clone(), NS)
        .get(name)
        .await
        .ok()?
        .status
}

#[tokio::test]
async fn a_disruption_budget_allows_what_its_healthy_pods_exceed() {
    let h = Harness::start().await;
    let client = h.client();
    create_pod(&client, "db-0", "db", json!([])).await;
    create_pod(&client, "db-1", "db", json!([])).await;
    set_status(&client, "db-0", None, true).await;
    set_status(&client, "db-1", None, true).await;
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), NS);
    for (name, app) in [("db", "db"), ("none", "nothing")] {
        let pdb = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}}
        }))
        .expect("pdb");
        budgets
            .create(&PostParams::default(), &pdb)
            .await
            .expect("create pdb");
    }

    let db = eventually("db's status", || async {
        budget_status(&client, "db")
            .await
            .filter(|s| s.expected_pods == 2 && s.current_healthy == 2)
    })
    .await;
    assert_eq!((db.desired_healthy, db.disruptions_allowed), (1, 1));
    assert_eq!(db.observed_generation, Some(1));
    let c = &db.conditions.unwrap_or_default()[0];
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
        ("DisruptionAllowed", "True", "SufficientPods")
    );

    let none = eventually("none's status", || async {
        budget_status(&client, "none")
            .await
            .filter(|s| s.observed_generation.is_some())
    })
    .await;
    assert_eq!(
        (
            none.current_healthy,
            none.desired_healthy,
            none.expected_pods
        ),
        (0, 1, 0)
    );
    assert_eq!(none.disruptions_allowed, 0);
    let c = &none.conditions.unwrap_or_default()[0];
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "InsufficientPods")
    );

    // A pod that stops being ready leaves no disruption to spare.
    set_status(&client, "db-1", None, false).await;
    let db = eventually("db with one healthy pod", || async {
        budget_status(&client, "db")
            .await
            .filter(|s| s.current_healthy == 1)
    })
    .await;
    assert_eq!(db.disruptions_allowed, 0);
    assert_eq!(
        db.conditions.unwrap_or_default()[0].reason,
        "InsufficientPods"
    );
}

#[tokio::test]
async fn a_percentage_budget_counts_against_the_scale_of_the_pods_controller() {
    let h = Harness::start().await;
    let client = h.client();
    let rs = serde_json::from_value(json!({
        "metadata": {"name": "queue"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "queue"}},
            "template": {
                "metadata": {"labels": {"app": "queue"}},
                "spec": {"nodeName": "n1", "containers": [
                    {"name": "main", "image": "example.invalid/queue"}]}
            }
        }
    }))
    .expect("replica set");
    Api::<k8s_openapi::api::apps::v1::ReplicaSet>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &rs)
        .await
        .expect("create replica set");
    let pdb = serde_json::from_value(json!({
        "metadata": {"name": "queue"},
        "spec": {"maxUnavailable": "34%", "selector": {"matchLabels": {"app": "queue"}}}
    }))
    .expect("pdb");
    Api::<PodDisruptionBudget>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pdb)
        .await
        .expect("create pdb");
    let pods = eventually("the replica set's pods", || async {
        let pods = Api::<Pod>::namespaced(client.clone(), NS)
            .list(&ListParams::default().labels("app=queue"))
            .await
            .ok()?
            .items;
        (pods.len() == 3).then_some(pods)
    })
    .await;
    for pod in pods.iter().take(2) {
        set_status(&client, &pod.name_any(), None, true).await;
    }
    // 34% of 3 rounds up to 2 unavailable: 1 must stay healthy, 2 are.
    let status = eventually("the budget counted", || async {
        budget_status(&client, "queue")
            .await
            .filter(|s| s.current_healthy == 2)
    })
    .await;
    assert_eq!(
        (
            status.expected_pods,
            status.desired_healthy,
            status.disruptions_allowed
        ),
        (3, 1, 1)
    );
}
