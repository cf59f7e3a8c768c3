//! The subresource router against the real embedded API server: start/stop/restart change
//! `spec.runStrategy` / `status.stateChangeRequests` as upstream, conflicts answer 409; and
//! the one-listener router of webhooks and subresources (`virt_api::server`).

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use kube::Api;
use kube::api::PostParams;
use kubevirt_api::v1::{RunStrategy, VirtualMachine};
use serde_json::{Value, json};
use tower::ServiceExt;

struct Harness {
    client: kube::Client,
    app: axum::Router,
    _cluster: testkit::InProcessCluster,
}

async fn harness() -> anyhow::Result<Harness> {
    let cluster = testkit::InProcessCluster::start().await?;
    let client = cluster.client.clone();
    let (_tx, rx) = tokio::sync::watch::channel(virt_api::ClusterConfig::default());
    let app = virt_api::subresources::router(client.clone(), None, rx, false);
    Ok(Harness {
        client,
        app,
        _cluster: cluster,
    })
}

impl Harness {
    async fn put(&self, kind: &str, name: &str, sub: &str, body: Value) -> (StatusCode, Value) {
        let req = Request::builder()
            .method(Method::PUT)
            .uri(format!(
                "/apis/subresources.kubevirt.io/v1/namespaces/default/{kind}/{name}/{sub}"
            ))
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let res = self.app.clone().oneshot(req).await.unwrap();
        let code = res.status();
        let bytes = axum::body::to_bytes(res.into_body(), 1 << 20)
            .await
            .unwrap();
        (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    async fn create_vm(&self, name: &str, strategy: &str) -> anyhow::Result<()> {
        let vm: VirtualMachine = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"runStrategy": strategy, "template": {"spec": {"domain": {"devices": {}}}}},
        }))?;
        Api::<VirtualMachine>::namespaced(self.client.clone(), "default")
            .create(&PostParams::default(), &vm)
            .await?;
        Ok(())
    }

    async fn vm(&self, name: &str) -> VirtualMachine {
        Api::<VirtualMachine>::namespaced(self.client.clone(), "default")
            .get(name)
            .await
            .unwrap()
    }
}

fn requests(vm: &VirtualMachine) -> Value {
    json!(
        vm.status
            .as_ref()
            .map(|s| s.state_change_requests.clone())
            .unwrap_or_default()
    )
}

#[tokio::test]
async fn start_and_stop_flip_the_run_strategy_and_conflicts_answer_409() -> anyhow::Result<()> {
    let h = harness().await?;
    h.create_vm("halted", "Halted").await?;

    let (code, _) = h.put("virtualmachines", "halted", "start", json!({})).await;
    assert_eq!(code, StatusCode::ACCEPTED);
    assert_eq!(
        h.vm("halted").await.spec.run_strategy,
        Some(RunStrategy::Always)
    );

    let (code, status) = h.put("virtualmachines", "halted", "start", json!({})).await;
    assert_eq!(code, StatusCode::CONFLICT);
    assert_eq!(
        status["message"],
        "Operation cannot be fulfilled on virtualmachine.kubevirt.io \"halted\": Always does not support manual start requests"
    );

    let (code, _) = h.put("virtualmachines", "halted", "stop", json!({})).await;
    assert_eq!(code, StatusCode::ACCEPTED);
    assert_eq!(
        h.vm("halted").await.spec.run_strategy,
        Some(RunStrategy::Halted)
    );

    let (code, status) = h.put("virtualmachines", "halted", "stop", json!({})).await;
    assert_eq!(code, StatusCode::CONFLICT);
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .ends_with(": VM is not running")
    );

    let (code, status) = h
        .put("virtualmachines", "halted", "restart", json!({}))
        .await;
    assert_eq!(code, StatusCode::CONFLICT);
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .ends_with("RunStategy Halted does not support manual restart requests")
    );
    Ok(())
}

#[tokio::test]
async fn manual_start_records_a_start_request_and_a_second_one_is_refused() -> anyhow::Result<()> {
    let h = harness().await?;
    h.create_vm("manual", "Manual").await?;

    let (code, _) = h
        .put(
            "virtualmachines",
            "manual",
            "start",
            json!({"paused": true}),
        )
        .await;
    assert_eq!(code, StatusCode::ACCEPTED);
    let vm = h.vm("manual").await;
    assert_eq!(vm.spec.run_strategy, Some(RunStrategy::Manual));
    assert_eq!(
        requests(&vm),
        json!([{"action": "Start", "data": {"paused": "true"}}])
    );

    let (code, status) = h.put("virtualmachines", "manual", "start", json!({})).await;
    assert_eq!(code, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("stop/start already underway")
    );

    let (code, status) = h.put("virtualmachines", "manual", "stop", json!({})).await;
    assert_eq!(code, StatusCode::CONFLICT, "no VMI: {status}");
    Ok(())
}

#[tokio::test]
async fn paused_start_of_a_halted_vm_adds_a_start_request_without_touching_the_spec()
-> anyhow::Result<()> {
    let h = harness().await?;
    h.create_vm("paused", "Halted").await?;
    let (code, _) = h
        .put(
            "virtualmachines",
            "paused",
            "start",
            json!({"paused": true}),
        )
        .await;
    assert_eq!(code, StatusCode::ACCEPTED);
    let vm = h.vm("paused").await;
    assert_eq!(vm.spec.run_strategy, Some(RunStrategy::Halted));
    assert_eq!(
        requests(&vm),
        json!([{"action": "Start", "data": {"paused": "true"}}])
    );
    Ok(())
}

#[tokio::test]
async fn dry_run_start_changes_nothing() -> anyhow::Result<()> {
    let h = harness().await?;
    h.create_vm("dry", "Halted").await?;
    let (code, _) = h
        .put(
            "virtualmachines",
            "dry",
            "start",
            json!({"dryRun": ["All"]}),
        )
        .await;
    assert_eq!(code, StatusCode::ACCEPTED);
    assert_eq!(
        h.vm("dry").await.spec.run_strategy,
        Some(RunStrategy::Halted)
    );
    Ok(())
}

#[tokio::test]
async fn missing_objects_and_bad_bodies_get_404_and_400() -> anyhow::Result<()> {
    let h = harness().await?;
    let (code, status) = h.put("virtualmachines", "nope", "start", json!({})).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert_eq!(
        status["message"],
        "virtualmachine.kubevirt.io \"nope\" not found"
    );

    let (code, _) = h
        .put("virtualmachineinstances", "nope", "pause", json!({}))
        .await;
    assert_eq!(code, StatusCode::NOT_FOUND);

    h.create_vm("body", "Halted").await?;
    let (code, status) = h
        .put(
            "virtualmachines",
            "body",
            "stop",
            json!({"gracePeriod": "x"}),
        )
        .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .starts_with("Can not unmarshal Request body to struct")
    );

    let (code, status) = h
        .put(
            "virtualmachines",
            "body",
            "restart",
            json!({"gracePeriodSeconds": 5}),
        )
        .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(
        status["message"],
        "For force restart, only gracePeriod=0 is supported for now"
    );

    let (code, status) = h
        .put("virtualmachines", "body", "addvolume", json!({}))
        .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(
        status["message"],
        "Enable DeclarativeHotplugVolumes or HotplugVolumes feature gate to use this API."
    );
    Ok(())
}

#[tokio::test]
async fn discovery_lists_the_vm_subresources() -> anyhow::Result<()> {
    let h = harness().await?;
    let req = Request::get("/apis/subresources.kubevirt.io/v1").body(Body::empty())?;
    let res = h.app.clone().oneshot(req).await?;
    assert_eq!(res.status(), StatusCode::OK);
    let body: Value =
        serde_json::from_slice(&axum::body::to_bytes(res.into_body(), 1 << 20).await?)?;
    assert_eq!(body["kind"], "APIResourceList");
    assert!(
        body["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "virtualmachines/start")
    );
    Ok(())
}

async fn call(app: &axum::Router, method: Method, uri: &str, body: Value) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let code = res.status();
    let bytes = axum::body::to_bytes(res.into_body(), 1 << 20)
        .await
        .unwrap();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test]
async fn one_listener_serves_webhooks_without_and_subresources_only_with_a_client_certificate()
-> anyhow::Result<()> {
    let h = harness().await?;
    let (_tx, rx) = tokio::sync::watch::channel(virt_api::ClusterConfig::default());
    let app = virt_api::server::router(
        h.client.clone(),
        None,
        rx,
        virt_api::webhook::kubevirt_service_accounts("kubevirt"),
        true,
    );
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u1", "operation": "CREATE",
            "kind": {"group": "kubevirt.io", "version": "v1", "kind": "VirtualMachineInstance"},
            "resource": {"group": "kubevirt.io", "version": "v1", "resource": "virtualmachineinstances"},
            "namespace": "default", "userInfo": {"username": "someone"},
            "object": {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": "v", "namespace": "default"},
                "spec": {"domain": {"devices": {}}}},
        },
    });
    let (code, answer) = call(
        &app,
        Method::POST,
        virt_api::webhook::paths::VMI_MUTATE,
        review,
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{answer}");
    assert_eq!(answer["response"]["uid"], "u1");
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert!(answer["response"]["patch"].is_string(), "{answer}");

    let (code, _) = call(
        &app,
        Method::PUT,
        "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/x/start",
        json!({}),
    )
    .await;
    assert_eq!(code, StatusCode::UNAUTHORIZED, "no client certificate");
    let (code, health) = call(
        &app,
        Method::GET,
        "/apis/subresources.kubevirt.io/v1/healthz",
        Value::Null,
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{health}");
    // Prometheus scrapes without a client certificate too.
    let res = app
        .clone()
        .oneshot(Request::get("/metrics").body(Body::empty())?)
        .await?;
    assert_eq!(res.status(), StatusCode::OK);
    let text = String::from_utf8(
        axum::body::to_bytes(res.into_body(), 1 << 20)
            .await?
            .to_vec(),
    )?;
    assert!(
        text.contains("kubevirt_virt_api_ready_status 1\n"),
        "{text}"
    );
    Ok(())
}
