//! Webhook round trips over real HTTPS (rustls client, certificate from rcgen): a VMI CREATE
//! mutation whose patch applies cleanly, a denial with every cause in one 422, VM warnings, and
//! a 400 for a body that is not an AdmissionReview.

use std::collections::BTreeSet;
use std::sync::Arc;

use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::*;

struct Harness {
    server: WebhookServer,
    ca: CertificateDer<'static>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start() -> Harness {
    let key = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (_tx, rx) = watch::channel(ClusterConfig::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let config = WebhookServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        cert_pem: key.cert.pem().into_bytes(),
        key_pem: key.signing_key.serialize_pem().into_bytes(),
        cluster_config: rx,
        service_accounts: kubevirt_service_accounts("kubevirt"),
        client: None,
    };
    let server = run_webhook_server(config, async move {
        let _ = stop_rx.await;
    })
    .await
    .unwrap();
    Harness {
        server,
        ca: key.cert.der().clone(),
        _stop: stop_tx,
    }
}

async fn post(h: &Harness, path: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(h.ca.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(h.server.addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::post(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, bytes)
}

fn review(operation: &str, object: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "req-1",
            "operation": operation,
            "userInfo": {"username": "alice"},
            "object": object,
        }
    }))
    .unwrap()
}

fn vmi() -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {"domain": {"devices": {}, "memory": {"guest": "1Gi"}}, "volumes": [{"name": "root", "containerDisk": {"image": "x"}}]}
    })
}

#[tokio::test]
async fn vmi_mutation_over_https_returns_a_json_patch_that_applies() {
    let h = start().await;
    let (status, body) = post(&h, paths::VMI_MUTATE, review("CREATE", &vmi())).await;
    assert_eq!(status, 200);
    let resp: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(resp["kind"], "AdmissionReview");
    assert_eq!(resp["response"]["uid"], "req-1");
    assert_eq!(resp["response"]["allowed"], true);
    assert_eq!(resp["response"]["patchType"], "JSONPatch");
    let raw = base64::engine::general_purpose::STANDARD
        .decode(resp["response"]["patch"].as_str().unwrap())
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&raw).unwrap();
    let mut doc = vmi();
    json_patch::patch(&mut doc, &patch).unwrap();
    assert_eq!(doc["status"]["phase"], "Pending");
    assert_eq!(
        doc["spec"]["domain"]["devices"]["disks"],
        json!([{"name": "root", "disk": {"bus": "sata"}}])
    );
    assert_eq!(
        doc["metadata"]["finalizers"],
        json!(["kubevirt.io/foregroundDeleteVirtualMachine"])
    );
}

#[tokio::test]
async fn invalid_vmi_is_denied_with_all_causes_in_one_422() {
    let h = start().await;
    let mut bad = vmi();
    bad["spec"]["hostname"] = json!("-bad");
    bad["spec"]["domain"]["devices"]["inputs"] =
        json!([{"name": "i", "bus": "ps2", "type": "tablet"}]);
    bad["spec"]["domain"]["devices"]["disks"] = json!([{"name": "root", "disk": {"bus": "ide"}}]);
    let (status, body) = post(&h, paths::VMI_VALIDATE_CREATE, review("CREATE", &bad)).await;
    assert_eq!(status, 200);
    let resp: Value = serde_json::from_slice(&body).unwrap();
    let r = &resp["response"];
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 422);
    assert_eq!(r["status"]["reason"], "Invalid");
    let fields: Vec<&str> = r["status"]["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert!(fields.contains(&"spec.hostname"), "{fields:?}");
    assert!(fields.contains(&"spec.domain.devices.inputs[0].bus"));
    assert!(fields.contains(&"spec.domain.devices.disks[0].disk.bus"));
    assert_eq!(
        r["status"]["details"]["causes"][0]["reason"],
        "FieldValueInvalid"
    );
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("IDE bus is not supported")
    );
}

#[tokio::test]
async fn vm_with_spec_running_is_allowed_with_a_deprecation_warning() {
    let h = start().await;
    let vm = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "vm", "namespace": "default"},
        "spec": {"running": false, "template": {"spec": vmi()["spec"].clone()}}
    });
    let (_, body) = post(&h, paths::VM_VALIDATE, review("CREATE", &vm)).await;
    let resp: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(resp["response"]["allowed"], true);
    assert_eq!(
        resp["response"]["warnings"],
        json!(["spec.running is deprecated, please use spec.runStrategy instead."])
    );
}

#[tokio::test]
async fn a_body_that_is_not_an_admission_review_gets_400() {
    let h = start().await;
    assert_eq!(
        post(&h, paths::VMI_MUTATE, b"not json".to_vec()).await.0,
        400
    );
    assert_eq!(
        post(
            &h,
            paths::VMI_MUTATE,
            b"{\"kind\": \"AdmissionReview\"}".to_vec()
        )
        .await
        .0,
        400
    );
}

#[tokio::test]
async fn an_undecodable_object_is_denied_with_400_in_the_review() {
    let h = start().await;
    let (status, body) = post(
        &h,
        paths::VMI_VALIDATE_CREATE,
        review("CREATE", &json!({"spec": {"domain": 5}})),
    )
    .await;
    assert_eq!(status, 200);
    let resp: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(resp["response"]["allowed"], false);
    assert_eq!(resp["response"]["status"]["code"], 400);
}

#[tokio::test]
async fn user_status_changes_on_vmi_update_are_reverted_but_service_accounts_keep_theirs() {
    let h = start().await;
    let old = json!({"metadata": {"name": "t"}, "spec": {"domain": {"devices": {}}}, "status": {"phase": "Running"}});
    let new = json!({"metadata": {"name": "t"}, "spec": {"domain": {"devices": {}}}, "status": {"phase": "Failed"}});
    let body = |user: &str| {
        serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u", "operation": "UPDATE", "userInfo": {"username": user}, "object": new, "oldObject": old}}))
        .unwrap()
    };
    let (_, b) = post(&h, paths::VMI_MUTATE, body("alice")).await;
    let resp: Value = serde_json::from_slice(&b).unwrap();
    let raw = base64::engine::general_purpose::STANDARD
        .decode(resp["response"]["patch"].as_str().unwrap())
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&raw).unwrap();
    let mut doc = new.clone();
    json_patch::patch(&mut doc, &patch).unwrap();
    assert_eq!(doc["status"]["phase"], "Running");
    assert_eq!(doc["spec"], new["spec"]);
    let (_, b) = post(
        &h,
        paths::VMI_MUTATE,
        body("system:serviceaccount:kubevirt:kubevirt-handler"),
    )
    .await;
    let resp: Value = serde_json::from_slice(&b).unwrap();
    assert!(resp["response"].get("patch").is_none());
}

#[test]
fn service_account_names_are_upstreams() {
    let sas: BTreeSet<String> = kubevirt_service_accounts("kubevirt");
    assert!(sas.contains("system:serviceaccount:kubevirt:kubevirt-controller"));
    assert_eq!(sas.len(), 4);
}

#[tokio::test]
async fn vm_data_volume_templates_need_a_name_and_a_referencing_volume() {
    let h = start().await;
    let blank = json!({"pvc": {"accessModes": ["ReadWriteOnce"]}, "source": {"blank": {}}});
    let vm = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "vm", "namespace": "default"},
        "spec": {
            "runStrategy": "Halted",
            "dataVolumeTemplates": [
                {"metadata": {}, "spec": blank.clone()},
                {"metadata": {"name": "unused"}, "spec": blank},
            ],
            "template": {"spec": vmi()["spec"].clone()}
        }
    });
    let (status, body) = post(&h, paths::VM_VALIDATE, review("CREATE", &vm)).await;
    assert_eq!(status, 200);
    let resp: Value = serde_json::from_slice(&body).unwrap();
    let r = &resp["response"];
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 422);
    let causes: Vec<(String, String, String)> = r["status"]["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
            (s("reason"), s("field"), s("message"))
        })
        .collect();
    let want = |field: &str, message: &str| {
        (
            "FieldValueRequired".to_owned(),
            field.to_owned(),
            message.to_owned(),
        )
    };
    assert_eq!(
        causes,
        [
            want(
                "spec.dataVolumeTemplate[0].name",
                "'name' field must not be empty for DataVolumeTemplate entry spec.dataVolumeTemplate[0].name."
            ),
            want(
                "spec.dataVolumeTemplate[1]",
                "DataVolumeTemplate entry spec.dataVolumeTemplate[1] must be referenced in the VMI template's 'volumes' list"
            ),
        ]
    );
}
