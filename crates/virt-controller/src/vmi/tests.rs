//! Tests of the VMI reconciler against a scripted API endpoint: which requests one
//! reconcile makes, and that a burst of events never creates a second launcher pod.

use super::*;
use bytes::Bytes;
use futures::channel::mpsc;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Requests the fake API server received: (method, path, body).
#[derive(Default)]
struct Recorded {
    requests: Mutex<Vec<(Method, String, serde_json::Value)>>,
    pod_creates: AtomicUsize,
}

impl Recorded {
    fn requests(&self) -> Vec<(Method, String, serde_json::Value)> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

fn reply(code: StatusCode, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = code;
    resp
}

fn vmi_json() -> serde_json::Value {
    json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "vmi", "namespace": "ns", "uid": "vmi-uid", "resourceVersion": "1",
                     "labels": {"ops.example.com/owner": "a"}},
        "spec": {"domain": {"devices": {}, "memory": {"guest": "128Mi"}}},
    })
}

/// An API endpoint that accepts pod creates after `create_delay` and every patch.
fn client(recorded: &Arc<Recorded>, create_delay: Duration) -> Client {
    let recorded = Arc::clone(recorded);
    let service = tower::service_fn(move |req: Request<kube::client::Body>| {
        let recorded = Arc::clone(&recorded);
        async move {
            let method = req.method().clone();
            let path = req.uri().path().to_owned();
            let bytes = req.into_body().collect().await?.to_bytes();
            let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            if let Ok(mut r) = recorded.requests.lock() {
                r.push((method.clone(), path.clone(), body.clone()));
            }
            let resp = match (&method, path.as_str()) {
                (&Method::POST, "/api/v1/namespaces/ns/pods") => {
                    tokio::time::sleep(create_delay).await;
                    let n = recorded.pod_creates.fetch_add(1, Ordering::SeqCst);
                    let mut pod = body;
                    pod["metadata"]["name"] = json!(format!("virt-launcher-vmi-{n}"));
                    pod["metadata"]["uid"] = json!(format!("pod-uid-{n}"));
                    reply(StatusCode::CREATED, &pod)
                }
                (&Method::PATCH, p) if p.contains("/virtualmachineinstances/") => {
                    reply(StatusCode::OK, &vmi_json())
                }
                (&Method::PATCH, p) if p.starts_with("/api/v1/namespaces/ns/pods/") => reply(
                    StatusCode::OK,
                    &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}),
                ),
                _ => reply(
                    StatusCode::NOT_FOUND,
                    &json!({"kind": "Status", "apiVersion": "v1", "code": 404}),
                ),
            };
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(resp)
        }
    });
    Client::new(service, "default")
}

type Events<K> = mpsc::UnboundedSender<Result<watcher::Event<K>, watcher::Error>>;

/// A reconciler whose informers are fed by the returned senders, already synced with `vmis`.
async fn reconciler(
    client: Client,
    queue: &WorkQueue<String>,
    vmis: Vec<VirtualMachineInstance>,
) -> (
    Arc<VmiReconciler>,
    Events<VirtualMachineInstance>,
    Events<Pod>,
) {
    reconciler_with_pods(client, queue, vmis, Vec::new()).await
}

/// [`reconciler`] with `pods` in the pod cache.
async fn reconciler_with_pods(
    client: Client,
    queue: &WorkQueue<String>,
    vmis: Vec<VirtualMachineInstance>,
    pods: Vec<Pod>,
) -> (
    Arc<VmiReconciler>,
    Events<VirtualMachineInstance>,
    Events<Pod>,
) {
    let pod_expectations = Arc::new(Expectations::new());
    let vmi_expectations = Arc::new(Expectations::new());
    let mut vmi_informer = Informer::<VirtualMachineInstance>::new();
    let mut pod_informer = Informer::<Pod>::new();
    register_handlers(
        &mut vmi_informer,
        &mut pod_informer,
        queue,
        &pod_expectations,
        &vmi_expectations,
    );
    let (vmi_handle, pod_handle) = (vmi_informer.handle(), pod_informer.handle());
    let (vmi_tx, vmi_rx) = mpsc::unbounded();
    let (pod_tx, pod_rx) = mpsc::unbounded();
    tokio::spawn(vmi_informer.run_stream(vmi_rx));
    tokio::spawn(pod_informer.run_stream(pod_rx));
    let mut init = vec![watcher::Event::Init];
    init.extend(vmis.into_iter().map(watcher::Event::InitApply));
    init.push(watcher::Event::InitDone);
    for event in init {
        let _ = vmi_tx.unbounded_send(Ok(event));
    }
    let mut init = vec![watcher::Event::Init];
    init.extend(pods.into_iter().map(watcher::Event::InitApply));
    init.push(watcher::Event::InitDone);
    for event in init {
        let _ = pod_tx.unbounded_send(Ok(event));
    }
    assert!(vmi_handle.wait_for_sync().await.is_ok());
    assert!(pod_handle.wait_for_sync().await.is_ok());
    let vm_informer = Informer::<VirtualMachine>::new();
    let vm_handle = vm_informer.handle();
    vm_informer
        .run_stream(futures::stream::iter([
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitDone),
        ]))
        .await;
    let claim_informer = Informer::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::new();
    let claim_handle = claim_informer.handle();
    claim_informer
        .run_stream(futures::stream::iter([
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitDone),
        ]))
        .await;
    let (_, patterns) = watch::channel(MetadataSyncPatterns {
        labels: crate::metadata_sync::SyncPatterns::parse_flag("ops.example.com/*").0,
        annotations: Default::default(),
    });
    let reconciler = VmiReconciler {
        recorder: Arc::new(EventRecorder::new(
            client.clone(),
            crate::vm::EVENT_COMPONENT,
        )),
        client,
        vmis: vmi_handle,
        pods: pod_handle,
        vms: vm_handle,
        claims: claim_handle,
        data_volumes: Informer::<kubevirt_api::cdi::DataVolume>::new().handle(),
        pod_expectations,
        vmi_expectations,
        launcher: LauncherPodConfig::default(),
        patterns,
        cluster: watch::channel(ClusterSettings::default()).1,
    };
    (Arc::new(reconciler), vmi_tx, pod_tx)
}

fn vmi() -> VirtualMachineInstance {
    serde_json::from_value(vmi_json()).unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn a_new_vmi_gets_one_launcher_pod_and_goes_scheduling_in_one_patch() {
    let recorded = Arc::new(Recorded::default());
    let queue = WorkQueue::new("test");
    let (reconciler, _vmis, _pods) =
        reconciler(client(&recorded, Duration::ZERO), &queue, vec![vmi()]).await;
    let action = reconciler.reconcile("ns/vmi").await;
    assert!(matches!(action, Ok(Action::Done)), "{action:?}");

    let (events, requests): (Vec<_>, Vec<_>) = recorded
        .requests()
        .into_iter()
        .partition(|(_, p, _)| p == "/api/v1/namespaces/ns/events");
    assert_eq!(events.len(), 1, "one event: {events:?}");
    let event = &events[0].2;
    assert_eq!(event["reason"], "SuccessfulCreate");
    assert_eq!(event["type"], "Normal");
    assert_eq!(
        event["message"],
        "Created virtual machine pod virt-launcher-vmi-0"
    );
    assert_eq!(event["involvedObject"]["kind"], "VirtualMachineInstance");
    assert_eq!(event["involvedObject"]["uid"], "vmi-uid");
    let summary: Vec<(Method, &str)> = requests
        .iter()
        .map(|(m, p, _)| (m.clone(), p.as_str()))
        .collect();
    assert_eq!(
        summary,
        vec![
            (Method::POST, "/api/v1/namespaces/ns/pods"),
            (
                Method::PATCH,
                "/api/v1/namespaces/ns/pods/virt-launcher-vmi-0/status"
            ),
            (
                Method::PATCH,
                "/apis/kubevirt.io/v1/namespaces/ns/virtualmachineinstances/vmi"
            ),
        ]
    );
    let pod = &requests[0].2;
    assert_eq!(pod["metadata"]["generateName"], "virt-launcher-vmi-");
    assert_eq!(
        pod["metadata"]["labels"]["kubevirt.io/created-by"],
        "vmi-uid"
    );
    assert_eq!(pod["metadata"]["labels"]["ops.example.com/owner"], "a");
    let unpaused = &requests[1].2["status"]["conditions"][0];
    assert_eq!(
        (&unpaused["type"], &unpaused["status"]),
        (
            &json!("kubevirt.io/virtual-machine-unpaused"),
            &json!("True")
        )
    );
    let patch = requests[2].2.as_array().cloned().unwrap_or_default();
    assert_eq!(
        patch[0],
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": "1"})
    );
    assert_eq!(patch[1]["op"], "add");
    assert_eq!(patch[1]["path"], "/status");
    assert_eq!(patch[1]["value"]["phase"], "Scheduling");
    assert_eq!(patch[1]["value"]["activePods"], json!({"pod-uid-0": ""}));
}

#[tokio::test(start_paused = true)]
async fn labels_reach_a_launcher_pod_that_is_no_longer_running() {
    let recorded = Arc::new(Recorded::default());
    let queue = WorkQueue::new("test");
    let mut running = vmi_json();
    running["status"] = json!({"phase": "Running"});
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "virt-launcher-vmi-x", "namespace": "ns", "uid": "pod-uid",
                     "labels": {"kubevirt.io": "virt-launcher"},
                     "ownerReferences": [{"apiVersion": "kubevirt.io/v1",
                         "kind": "VirtualMachineInstance", "name": "vmi", "uid": "vmi-uid",
                         "controller": true}]},
        "spec": {"containers": [{"name": "compute", "image": "img"}]},
        "status": {"phase": "Failed"}
    }))
    .unwrap_or_default();
    let (reconciler, _vmis, _pods) = reconciler_with_pods(
        client(&recorded, Duration::ZERO),
        &queue,
        vec![serde_json::from_value(running).unwrap_or_default()],
        vec![pod],
    )
    .await;
    let action = reconciler.reconcile("ns/vmi").await;
    assert!(matches!(action, Ok(Action::Done)), "{action:?}");
    let label_patch = recorded
        .requests()
        .into_iter()
        .find(|(m, p, _)| {
            m == Method::PATCH && p == "/api/v1/namespaces/ns/pods/virt-launcher-vmi-x"
        })
        .map(|(_, _, body)| body);
    let ops = label_patch
        .and_then(|b| b.as_array().cloned())
        .unwrap_or_default();
    assert!(
        ops.iter()
            .any(|op| op["path"] == "/metadata/labels"
                && op["value"]["ops.example.com/owner"] == "a"),
        "{ops:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn two_hundred_events_during_an_in_flight_pod_create_make_one_pod() {
    let recorded = Arc::new(Recorded::default());
    let queue = WorkQueue::new("test");
    let (reconciler, _vmis, pods) = reconciler(
        client(&recorded, Duration::from_millis(50)),
        &queue,
        vec![vmi()],
    )
    .await;
    let controller = Controller::new(
        "vmi",
        queue.clone(),
        SharedReconciler(Arc::clone(&reconciler)),
    )
    .workers(10);
    let cancel = CancellationToken::new();
    let run = tokio::spawn(controller.run(cancel.clone()));

    for _ in 0..200 {
        queue.add("ns/vmi".to_owned());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(recorded.pod_creates.load(Ordering::SeqCst), 1);

    // The pod's watch event arrives: expectation lowered, key re-queued, still one pod.
    let created = recorded
        .requests()
        .into_iter()
        .find(|(m, _, _)| m == Method::POST)
        .map(|(_, _, body)| body);
    let mut pod: Pod = created
        .and_then(|b| serde_json::from_value(b).ok())
        .unwrap_or_default();
    pod.metadata.name = Some("virt-launcher-vmi-0".into());
    pod.metadata.uid = Some("pod-uid-0".into());
    let _ = pods.unbounded_send(Ok(watcher::Event::Apply(pod)));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(reconciler.pod_expectations.satisfied("ns/vmi"));
    assert_eq!(recorded.pod_creates.load(Ordering::SeqCst), 1);

    cancel.cancel();
    assert_eq!(run.await.ok(), Some(0));
}

#[test]
fn only_a_cached_vm_with_the_referenced_uid_owns_a_vmi() {
    let mut owned = vmi();
    owned.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "kubevirt.io/v1".into(),
            kind: "VirtualMachine".into(),
            name: "vm".into(),
            uid: "vm-uid".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        },
    ]);
    let vm_with = |uid: &str| {
        let mut vm = VirtualMachine::new("vm", Default::default());
        vm.metadata.uid = Some(uid.into());
        Arc::new(vm)
    };
    let lookup = |uid: &'static str| move |key: &str| (key == "ns/vm").then(|| vm_with(uid));
    assert!(has_owner_vm(&owned, lookup("vm-uid")));
    assert!(
        !has_owner_vm(&owned, lookup("recreated-uid")),
        "force-removed and recreated"
    );
    assert!(!has_owner_vm(&owned, |_| None), "VM gone");
    assert!(
        !has_owner_vm(&vmi(), lookup("vm-uid")),
        "no owner reference"
    );
}

#[test]
fn new_launcher_pods_take_the_crs_positive_cpu_allocation_ratio() {
    let base = LauncherPodConfig::default();
    let with = |ratio| ClusterSettings {
        cpu_allocation_ratio: ratio,
        ..ClusterSettings::default()
    };
    assert_eq!(
        effective_launcher(&base, &with(Some(4))).cpu_allocation_ratio,
        4
    );
    assert_eq!(
        effective_launcher(&base, &with(None)).cpu_allocation_ratio,
        10
    );
    assert_eq!(
        effective_launcher(&base, &with(Some(0))).cpu_allocation_ratio,
        10
    );
}

#[test]
fn new_launcher_pods_follow_the_crs_use_emulation_when_it_is_set() {
    let with = |use_emulation| ClusterSettings {
        use_emulation,
        ..ClusterSettings::default()
    };
    let kvm = LauncherPodConfig::default();
    assert!(effective_launcher(&kvm, &with(Some(true))).use_emulation);
    assert!(!effective_launcher(&kvm, &with(None)).use_emulation);
    let tcg = LauncherPodConfig {
        use_emulation: true,
        ..LauncherPodConfig::default()
    };
    assert!(!effective_launcher(&tcg, &with(Some(false))).use_emulation);
    assert!(effective_launcher(&tcg, &with(None)).use_emulation);
}

#[tokio::test(start_paused = true)]
async fn a_changed_sync_pattern_requeues_every_vmi() {
    let queue = WorkQueue::new("test");
    let mut vmi_informer = Informer::<VirtualMachineInstance>::new();
    let handle = vmi_informer.handle();
    let (tx, rx) = mpsc::unbounded();
    vmi_informer.on_change(|_| {});
    tokio::spawn(vmi_informer.run_stream(rx));
    for event in [
        watcher::Event::Init,
        watcher::Event::InitApply(vmi()),
        watcher::Event::InitDone,
    ] {
        let _ = tx.unbounded_send(Ok(event));
    }
    assert!(handle.wait_for_sync().await.is_ok());
    let (set, patterns) = watch::channel(MetadataSyncPatterns::default());
    tokio::spawn(requeue_on_pattern_change(patterns, handle, queue.clone()));
    tokio::task::yield_now().await;
    assert_eq!(queue.len(), 0);
    let _ = set.send(MetadataSyncPatterns {
        labels: crate::metadata_sync::SyncPatterns::parse_flag("ops.example.com/*").0,
        annotations: Default::default(),
    });
    let key = tokio::time::timeout(Duration::from_secs(1), queue.get()).await;
    assert_eq!(key.ok().flatten().as_deref(), Some("ns/vmi"));
}

#[tokio::test(start_paused = true)]
async fn only_a_changed_skip_backup_hooks_on_the_cr_requeues_every_vmi() {
    let queue = WorkQueue::new("test");
    let mut vmi_informer = Informer::<VirtualMachineInstance>::new();
    let handle = vmi_informer.handle();
    let (tx, rx) = mpsc::unbounded();
    vmi_informer.on_change(|_| {});
    tokio::spawn(vmi_informer.run_stream(rx));
    for event in [
        watcher::Event::Init,
        watcher::Event::InitApply(vmi()),
        watcher::Event::InitDone,
    ] {
        let _ = tx.unbounded_send(Ok(event));
    }
    assert!(handle.wait_for_sync().await.is_ok());
    let (set, cluster) = watch::channel(ClusterSettings::default());
    tokio::spawn(requeue_on_skip_hooks_change(cluster, handle, queue.clone()));
    tokio::task::yield_now().await;
    let _ = set.send(ClusterSettings {
        cpu_allocation_ratio: Some(4),
        ..ClusterSettings::default()
    });
    let key = tokio::time::timeout(Duration::from_secs(1), queue.get()).await;
    assert!(key.is_err(), "another CR change re-queues nothing");
    let _ = set.send(ClusterSettings {
        skip_backup_hooks: Some("true".into()),
        ..ClusterSettings::default()
    });
    let key = tokio::time::timeout(Duration::from_secs(1), queue.get()).await;
    assert_eq!(key.ok().flatten().as_deref(), Some("ns/vmi"));
}

/// Lets a test keep a handle on the reconciler the controller runs.
struct SharedReconciler(Arc<VmiReconciler>);

impl Reconciler for SharedReconciler {
    type Error = VmiError;

    async fn reconcile(&self, key: &str) -> Result<Action, VmiError> {
        self.0.reconcile_vmi(key).await
    }
}

/// An endpoint that refuses pod creates as PodSecurity admission does and records requests.
fn pod_security_client(recorded: &Arc<Recorded>) -> Client {
    let recorded = Arc::clone(recorded);
    let service = tower::service_fn(move |req: Request<kube::client::Body>| {
        let recorded = Arc::clone(&recorded);
        async move {
            let method = req.method().clone();
            let path = req.uri().path().to_owned();
            let bytes = req.into_body().collect().await?.to_bytes();
            let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            if let Ok(mut r) = recorded.requests.lock() {
                r.push((method.clone(), path.clone(), body));
            }
            let resp = if path == "/api/v1/namespaces/ns/pods" {
                reply(
                    StatusCode::FORBIDDEN,
                    &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "code": 403, "reason": "Forbidden",
                            "message": "pods \"p\" is forbidden: violates PodSecurity \"restricted:latest\""}),
                )
            } else {
                reply(StatusCode::OK, &vmi_json())
            };
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(resp)
        }
    });
    Client::new(service, "default")
}

#[tokio::test(start_paused = true)]
async fn a_pod_refused_by_pod_security_records_a_failed_create_warning_with_the_render_text() {
    let recorded = Arc::new(Recorded::default());
    let queue = WorkQueue::new("test");
    let (reconciler, _vmis, _pods) =
        reconciler(pod_security_client(&recorded), &queue, vec![vmi()]).await;
    let _ = reconciler.reconcile("ns/vmi").await;
    let events: Vec<serde_json::Value> = recorded
        .requests()
        .into_iter()
        .filter(|(_, p, _)| p == "/api/v1/namespaces/ns/events")
        .map(|(_, _, body)| body)
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["reason"], "FailedCreate");
    assert_eq!(events[0]["type"], "Warning");
    let message = events[0]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(
            "failed to render launch manifest: failed to create pod for vmi ns/vmi, it needs a privileged namespace to run: "
        ),
        "{message}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_vmi_whose_claim_is_missing_gets_no_pod_and_says_why() {
    let recorded = Arc::new(Recorded::default());
    let queue = WorkQueue::new("test");
    let mut with_claim = vmi_json();
    with_claim["spec"]["volumes"] =
        json!([{"name": "data", "persistentVolumeClaim": {"claimName": "missing"}}]);
    let vmi: VirtualMachineInstance = serde_json::from_value(with_claim).unwrap_or_default();
    let (reconciler, _vmis, _pods) =
        reconciler(client(&recorded, Duration::ZERO), &queue, vec![vmi]).await;
    // Upstream's informal error: no rate-limited retry, the claim's appearance re-queues.
    let action = reconciler.reconcile("ns/vmi").await;
    assert!(matches!(action, Ok(Action::Done)), "{action:?}");

    let requests = recorded.requests();
    assert!(
        !requests
            .iter()
            .any(|(m, p, _)| m == Method::POST && p == "/api/v1/namespaces/ns/pods"),
        "no launcher pod: {requests:?}"
    );
    let message = "PVC ns/missing does not exist, waiting for it to appear";
    let event = requests
        .iter()
        .find(|(_, p, _)| p == "/api/v1/namespaces/ns/events")
        .map(|(_, _, body)| body.clone())
        .unwrap_or_default();
    assert_eq!(
        (&event["reason"], &event["type"], &event["message"]),
        (
            &json!("FailedPvcNotFound"),
            &json!("Normal"),
            &json!(message)
        )
    );
    let patch = requests
        .iter()
        .find(|(_, p, _)| p.ends_with("/virtualmachineinstances/vmi"))
        .map(|(_, _, body)| body.to_string())
        .unwrap_or_default();
    for wanted in [
        r#""type":"Synchronized""#,
        r#""reason":"FailedPvcNotFound""#,
        r#""type":"PodScheduled""#,
        r#""reason":"Unschedulable""#,
        message,
    ] {
        assert!(patch.contains(wanted), "{wanted} in {patch}");
    }
}

#[test]
fn claim_backed_volumes_report_their_cached_claim() {
    let v: VirtualMachineInstance = serde_json::from_value(json!({
        "metadata": {"name": "v", "namespace": "ns"},
        "spec": {"domain": {"devices": {}}, "volumes": [
            {"name": "root", "containerDisk": {"image": "x"}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "c1"}},
            {"name": "gone", "persistentVolumeClaim": {"claimName": "absent"}}
        ]}
    }))
    .unwrap_or_default();
    let claim: k8s_openapi::api::core::v1::PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "c1", "namespace": "ns"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Bound", "capacity": {"storage": "2Gi"}}
    }))
    .unwrap();
    let claim = Arc::new(claim);
    let got = claim_volume_status(&v, |key| (key == "ns/c1").then(|| Arc::clone(&claim)));
    assert_eq!(got.len(), 1, "{got:?}");
    let info = got[0]
        .persistent_volume_claim_info
        .clone()
        .unwrap_or_default();
    assert_eq!(got[0].name, "data");
    assert_eq!(info.claim_name.as_deref(), Some("c1"));
    assert_eq!(info.volume_mode.as_deref(), Some("Filesystem"));
    assert_eq!(info.capacity["storage"].0, "2Gi");
    assert_eq!(info.requests["storage"].0, "1Gi");
    assert_eq!(info.access_modes, vec!["ReadWriteOnce".to_owned()]);
}

#[test]
fn an_ephemeral_volumes_claim_is_required_and_reported_like_a_claim_volume() {
    let v: VirtualMachineInstance = serde_json::from_value(json!({
        "metadata": {"name": "v", "namespace": "ns"},
        "spec": {"domain": {"devices": {}}, "volumes": [
            {"name": "scratch", "ephemeral": {"persistentVolumeClaim": {"claimName": "golden"}}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "c1"}}
        ]}
    }))
    .unwrap_or_default();
    assert_eq!(
        sync::required_claims(&v),
        vec!["ns/golden".to_owned(), "ns/c1".to_owned()]
    );
    // A missing ephemeral claim keeps the pod from being created, as a claim volume's does.
    let plan = sync::plan(&v, &[], None, |claim| {
        (claim == "ns/c1").then_some(sync::VolumeReadiness::Ready)
    });
    assert_eq!(plan, sync::SyncPlan::ClaimMissing("ns/golden".into()));
    let claim: k8s_openapi::api::core::v1::PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "golden", "namespace": "ns"},
        "spec": {"volumeMode": "Block", "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    let claim = Arc::new(claim);
    let got = claim_volume_status(&v, |key| (key == "ns/golden").then(|| Arc::clone(&claim)));
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].name, "scratch");
    let info = got[0]
        .persistent_volume_claim_info
        .clone()
        .unwrap_or_default();
    assert_eq!(info.volume_mode.as_deref(), Some("Block"));
}

#[test]
fn only_conflicts_and_failed_tests_are_lost_races() {
    let response = |code: u16, message: &str| -> kube::core::Status {
        serde_json::from_value(serde_json::json!({
            "status": "Failure", "message": message, "reason": "", "code": code
        }))
        .expect("a Status")
    };
    assert!(lost_race(&response(409, "the object has been modified")));
    assert!(lost_race(&response(
        422,
        "testing value /status/phase failed: found \"Succeeded\""
    )));
    assert!(!lost_race(&response(
        422,
        "VirtualMachineInstance.kubevirt.io \"v\" is invalid: status.phase: Unsupported value"
    )));
    assert!(!lost_race(&response(500, "etcdserver: request timed out")));
}
