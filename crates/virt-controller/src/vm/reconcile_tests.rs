//! Tests of one VM reconcile against a scripted API endpoint: the cases where upstream
//! returns a plain error — retried with backoff — and writes no status.

use super::*;
use crate::vm::tests::fixtures::{time, vm, vmi};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use kubevirt_api::v1::{RunStrategy, VirtualMachineInstancePhase as Phase};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// (method, path) of every request the endpoint received.
type Requests = Arc<Mutex<Vec<(Method, String)>>>;

fn reply(code: StatusCode, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = code;
    resp
}

fn status(code: u16, reason: &str) -> serde_json::Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
           "reason": reason, "message": reason})
}

/// An endpoint that answers `GET` of the VM with `fresh_vm`, fails every `PATCH` of the VM
/// object with 422 and accepts everything else with an empty object.
fn client(requests: &Requests, fresh_vm: VirtualMachine) -> Client {
    let requests = Arc::clone(requests);
    let service = tower::service_fn(move |req: Request<kube::client::Body>| {
        let requests = Arc::clone(&requests);
        let fresh_vm = fresh_vm.clone();
        async move {
            let method = req.method().clone();
            let path = req.uri().path().to_owned();
            let _ = req.into_body().collect().await?;
            if let Ok(mut r) = requests.lock() {
                r.push((method.clone(), path.clone()));
            }
            let vm_path = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/testvm";
            let resp = match (&method, path.as_str()) {
                (&Method::GET, p) if p == vm_path => reply(
                    StatusCode::OK,
                    &serde_json::to_value(&fresh_vm).unwrap_or_default(),
                ),
                (&Method::PATCH, p) if p == vm_path => reply(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    &status(422, "the test operation failed"),
                ),
                (&Method::PATCH, p) if p.strip_suffix("/status") == Some(vm_path) => reply(
                    StatusCode::OK,
                    &serde_json::to_value(&fresh_vm).unwrap_or_default(),
                ),
                // CDI is not installed.
                (&Method::POST, "/apis/cdi.kubevirt.io/v1beta1/namespaces/default/datavolumes") => {
                    reply(
                        StatusCode::NOT_FOUND,
                        &status(404, "the server could not find the requested resource"),
                    )
                }
                _ => reply(StatusCode::OK, &json!({})),
            };
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(resp)
        }
    });
    Client::new(service, "default")
}

async fn synced<K>(objects: Vec<K>) -> InformerHandle<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let informer = Informer::<K>::new();
    let handle = informer.handle();
    let mut events = vec![Ok(watcher::Event::Init)];
    events.extend(
        objects
            .into_iter()
            .map(|o| Ok(watcher::Event::InitApply(o))),
    );
    events.push(Ok(watcher::Event::InitDone));
    informer.run_stream(futures::stream::iter(events)).await;
    handle
}

/// A context with `vm` and `vmis` cached and the scripted endpoint behind it.
async fn context(
    vm: VirtualMachine,
    vmis: Vec<VirtualMachineInstance>,
    fresh_vm: VirtualMachine,
) -> (Context, Requests) {
    let requests = Requests::default();
    let (_, sync) = watch::channel(MetadataSyncPatterns::default());
    let ctx = Context {
        client: client(&requests, fresh_vm.clone()),
        vms: synced(vec![vm]).await,
        vmis: synced(vmis).await,
        revisions: synced(Vec::new()).await,
        claims: synced(Vec::new()).await,
        data_volumes: synced(Vec::new()).await,
        expectations: Arc::new(Expectations::new()),
        dv_expectations: Arc::new(Expectations::new()),
        sync,
        cluster: watch::channel(crate::kubevirt_config::ClusterSettings::default()).1,
        recorder: Arc::new(EventRecorder::new(
            client(&requests, fresh_vm.clone()),
            EVENT_COMPONENT,
        )),
    };
    (ctx, requests)
}

/// `vm` as the controller sees it after the API-version annotations were recorded.
fn observed(mut vm: VirtualMachine) -> VirtualMachine {
    vm.metadata.annotations = Some(BTreeMap::from([(
        LATEST_OBSERVED_API_VERSION_ANNOTATION.to_owned(),
        VERSION.to_owned(),
    )]));
    vm
}

fn recorded(requests: &Requests) -> Vec<(Method, String)> {
    requests.lock().map(|r| r.clone()).unwrap_or_default()
}

#[tokio::test]
async fn a_failed_finalizer_patch_fails_the_reconcile_without_writing_the_status() {
    let mut vm = observed(vm(RunStrategy::Halted));
    vm.metadata.finalizers = None;
    let (ctx, requests) = context(vm.clone(), Vec::new(), vm).await;
    let result = reconcile(&ctx, "default/testvm").await;
    assert!(
        matches!(result, Err(VmError::FinalizerPatch(_))),
        "{result:?}"
    );
    let paths: Vec<String> = recorded(&requests).into_iter().map(|(_, p)| p).collect();
    assert_eq!(
        paths,
        ["/apis/kubevirt.io/v1/namespaces/default/virtualmachines/testvm"],
        "no status write, so no Failure condition"
    );
}

#[tokio::test]
async fn conflicting_running_and_run_strategy_fail_the_reconcile_without_writing_the_status() {
    let mut vm = observed(vm(RunStrategy::Always));
    vm.spec.running = Some(true);
    let failed = vmi(Phase::Failed);
    let (ctx, requests) = context(vm.clone(), vec![failed], vm).await;
    let result = reconcile(&ctx, "default/testvm").await;
    let Err(err @ VmError::RunStrategy(_)) = result else {
        panic!("{result:?}");
    };
    assert_eq!(
        err.to_string(),
        "Error fetching RunStrategy: running and runstrategy are mutually exclusive"
    );
    assert_eq!(
        recorded(&requests),
        [],
        "startFailure, conditions and the VMI finalizer are left as they are"
    );
}

#[tokio::test]
async fn an_orphan_whose_vm_is_deleting_on_the_fresh_read_is_retried_not_started_beside() {
    let vm = observed(vm(RunStrategy::Always));
    let mut orphan = vmi(Phase::Running);
    orphan.metadata.owner_references = None;
    let mut fresh = vm.clone();
    fresh.metadata.deletion_timestamp = Some(time(0));
    let (ctx, requests) = context(vm, vec![orphan], fresh).await;
    let result = reconcile(&ctx, "default/testvm").await;
    assert!(
        matches!(result, Err(VmError::AdoptRecheck(_))),
        "{result:?}"
    );
    assert_eq!(
        recorded(&requests),
        [(
            Method::GET,
            "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/testvm".to_owned()
        )],
        "no VMI create, no status write"
    );
}

#[tokio::test]
async fn without_cdi_a_data_volume_template_fails_the_sync_and_no_vmi_is_created() {
    let mut vm = observed(vm(RunStrategy::Always));
    vm.spec.data_volume_templates = vec![kubevirt_api::v1::DataVolumeTemplateSpec {
        metadata: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("root".into()),
            ..Default::default()
        }),
        spec: serde_json::from_value(json!({"source": {"blank": {}}})).unwrap_or_default(),
        ..Default::default()
    }];
    let (ctx, requests) = context(vm.clone(), Vec::new(), vm).await;
    let result = reconcile(&ctx, "default/testvm").await;
    let Err(VmError::Sync(failure)) = result else {
        panic!("{result:?}");
    };
    assert_eq!(failure.reason, "FailedCreate");
    assert!(
        failure.message.starts_with(
            "Error encountered while creating DataVolumes: failed to create DataVolume: "
        ),
        "{}",
        failure.message
    );
    let paths: Vec<String> = recorded(&requests).into_iter().map(|(_, p)| p).collect();
    assert!(
        !paths.iter().any(|p| p.contains("virtualmachineinstances")),
        "no VMI: {paths:?}"
    );
    assert!(
        paths
            .iter()
            .any(|p| p.ends_with("/virtualmachines/testvm/status")),
        "the Failure condition is written: {paths:?}"
    );
    assert!(
        ctx.dv_expectations.satisfied("default/testvm"),
        "the failed create is no expectation"
    );
}
