//! The workload controllers against a real API server, with the real scheduler and real
//! kubectl. A test-only stand-in for the node agent marks bound pods Running and Ready and
//! finishes graceful deletions, as a kubelet would.

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const NS: &str = "default";
const DEADLINE: Duration = Duration::from_secs(60);

struct Harness {
    cluster: testkit::InProcessCluster,
    cancel: CancellationToken,
    /// Stops the controller-manager only (see [`Harness::restart_controller_manager`]).
    manager: CancellationToken,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl Harness {
    async fn start(nodes: &[(&str, &str)]) -> Harness {
        let cluster = testkit::InProcessCluster::start_without_crds()
            .await
            .expect("API server");
        let cancel = CancellationToken::new();
        let client = cluster.client.clone();
        for (name, role) in nodes {
            create_node(&client, name, role).await;
        }
        let manager = cancel.child_token();
        tokio::spawn(kubevirt_controller_manager::run(
            client.clone(),
            kubevirt_controller_manager::Config::default(),
            manager.clone(),
        ));
        let scheduler = kubevirt_scheduler::run(client.clone());
        let stop = cancel.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = scheduler => {},
                () = stop.cancelled() => {},
            }
        });
        tokio::spawn(fake_kubelet(client, cancel.clone()));
        Harness {
            cluster,
            cancel,
            manager,
        }
    }

    /// Stops the controller-manager and starts a new one (empty caches and expectations).
    fn restart_controller_manager(&mut self) {
        self.manager.cancel();
        self.manager = self.cancel.child_token();
        tokio::spawn(kubevirt_controller_manager::run(
            self.client(),
            kubevirt_controller_manager::Config::default(),
            self.manager.clone(),
        ));
    }

    fn client(&self) -> kube::Client {
        self.cluster.client.clone()
    }

    fn kubeconfig(&self) -> PathBuf {
        self.cluster.server().expect("server").kubeconfig.clone()
    }

    /// Runs kubectl against the server (off the async runtime; it may block on a watch).
    async fn kubectl(&self, args: &[&str]) -> Output {
        let kubeconfig = self.kubeconfig();
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .args(&args)
                .output()
                .expect("run kubectl")
        })
        .await
        .expect("kubectl task")
    }

    async fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args).await;
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    async fn apply(&self, manifest: serde_json::Value) {
        let path = self
            .cluster
            .data_dir()
            .join(format!("manifest-{}.json", uuid_like()));
        std::fs::write(&path, manifest.to_string()).expect("write manifest");
        self.kubectl_ok(&["apply", "-f", &path.display().to_string()])
            .await;
    }
}

fn uuid_like() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

async fn create_node(client: &kube::Client, name: &str, role: &str) {
    let api: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "role": role}}
    }))
    .expect("node");
    api.create(&PostParams::default(), &node)
        .await
        .expect("create node");
    let status = json!({"status": {
        "allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"},
        "capacity": {"cpu": "8", "memory": "16Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .expect("node status");
}

/// A kubelet stand-in: bound pods become Running and Ready; pods marked for deletion are
/// removed (grace period 0), as the node agent does once their containers stopped.
async fn fake_kubelet(client: kube::Client, cancel: CancellationToken) {
    let api: Api<Pod> = Api::all(client.clone());
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .applied_objects();
    let mut stream = std::pin::pin!(stream);
    loop {
        let pod = tokio::select! {
            () = cancel.cancelled() => return,
            next = stream.next() => match next {
                Some(Ok(pod)) => pod,
                Some(Err(_)) => continue,
                None => return,
            },
        };
        let bound = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty());
        if !bound {
            continue;
        }
        let pods: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
        if pod.metadata.deletion_timestamp.is_some() {
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            };
            let _ = pods.delete(&pod.name_any(), &params).await;
            continue;
        }
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if !ready {
            let now = jiff::Timestamp::now()
                .strftime("%Y-%m-%dT%H:%M:%SZ")
                .to_string();
            let status = json!({"status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": now}]}});
            let _ = pods
                .patch_status(
                    &pod.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(status),
                )
                .await;
        }
    }
}

/// Polls `check` against the API until it gives `Some`.
async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    testkit::wait_until_async(DEADLINE, what, check)
        .await
        .expect("condition reached")
}

async fn active_pods(client: &kube::Client, selector: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels(selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

fn template(app: &str) -> serde_json::Value {
    json!({"metadata": {"labels": {"app": app}},
        "spec": {"containers": [{"name": "c", "image": "example.com/app:v1"}]}})
}

#[tokio::test]
async fn a_replica_set_keeps_its_replicas_adopts_orphans_and_reports_status() {
    let h = Harness::start(&[("n1", "worker")]).await;
    let client = h.client();
    let rs_api: Api<ReplicaSet> = Api::namespaced(client.clone(), NS);
    let rs: ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": template("web")}
    }))
    .expect("rs");
    let rs = rs_api
        .create(&PostParams::default(), &rs)
        .await
        .expect("create rs");

    let status = eventually("3 ready and available replicas", || async {
        let s = rs_api.get("web").await.ok()?.status?;
        (s.ready_replicas == Some(3) && s.available_replicas == Some(3)).then_some(s)
    })
    .await;
    assert_eq!(status.replicas, 3);
    assert_eq!(status.fully_labeled_replicas, Some(3));
    assert_eq!(status.observed_generation, Some(1));
    let pods = active_pods(&client, "app=web").await;
    assert_eq!(pods.len(), 3, "never more pods than replicas");
    for pod in &pods {
        let name = pod.name_any();
        let suffix = name.strip_prefix("web-").expect("generated name");
        assert_eq!(suffix.len(), 5, "{name}");
        let owner = &pod.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("ReplicaSet", "web")
        );
        assert_eq!(owner.uid, rs.uid().expect("uid"));
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true))
        );
    }

    // Scaling down deletes the surplus; a deleted pod is replaced.
    rs_api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .expect("scale down");
    let survivor = eventually("one pod left", || async {
        let pods = active_pods(&client, "app=web").await;
        let s = rs_api.get("web").await.ok()?.status?;
        (pods.len() == 1 && s.replicas == 1 && s.observed_generation == Some(2))
            .then(|| pods[0].clone())
    })
    .await;
    Api::<Pod>::namespaced(client.clone(), NS)
        .delete(&survivor.name_any(), &DeleteParams::default())
        .await
        .expect("delete pod");
    eventually("a replacement pod", || async {
        let pods = active_pods(&client, "app=web").await;
        (pods.len() == 1 && pods[0].uid() != survivor.uid()).then_some(())
    })
    .await;

    // An orphan that matches the selector is adopted (and, being surplus, deleted).
    let orphan: Pod = serde_json::from_value(json!({
        "metadata": {"name": "stray", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "example.com/app:v1"}]}
    }))
    .expect("pod");
    Api::<Pod>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &orphan)
        .await
        .expect("create orphan");
    eventually("the orphan adopted or removed, one replica", || async {
        let pods = active_pods(&client, "app=web").await;
        let all_owned = pods.iter().all(|p| {
            p.owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && o.name == "web")
        });
        (pods.len() == 1 && all_owned).then_some(())
    })
    .await;
}

/// A Deployment of 2 replicas; a null `strategy` is left out (kube's default applies).
#[tokio::test]
async fn a_restarted_controller_manager_resumes_from_what_exists() {
    let mut h = Harness::start(&[("n1", "worker")]).await;
    let client = h.client();
    h.apply(deployment("svc", &serde_json::Value::Null)).await;
    h.kubectl_ok(&["rollout", "status", "deploy/svc", "--timeout=60s"])
        .await;
    let before: Vec<String> = active_pods(&client, "app=svc")
        .await
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(before.len(), 2);

    h.restart_controller_manager();
    h.kubectl_ok(&["scale", "deploy/svc", "--replicas=3"]).await;
    let out = h
        .kubectl_ok(&["rollout", "status", "deploy/svc", "--timeout=60s"])
        .await;
    assert!(out.contains("successfully rolled out"), "{out}");
    let after: Vec<String> = active_pods(&client, "app=svc")
        .await
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(after.len(), 3, "{after:?}");
    assert!(
        before.iter().all(|p| after.contains(p)),
        "the running pods were kept: {before:?} → {after:?}"
    );
    assert_eq!(replica_sets(&client, "svc").await.len(), 1);
}

fn deployment(name: &str, strategy: &serde_json::Value) -> serde_json::Value {
    let mut d = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"replicas": 2, "revisionHistoryLimit": 1,
            "selector": {"matchLabels": {"app": name}}, "template": template(name)}});
    if !strategy.is_null() {
        d["spec"]["strategy"] = strategy.clone();
    }
    d
}

async fn replica_sets(client: &kube::Client, app: &str) -> Vec<ReplicaSet> {
    let mut rss = Api::<ReplicaSet>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    rss.sort_by_key(|rs| {
        rs.annotations()
            .get("deployment.kubernetes.io/revision")
            .and_then(|r| r.parse::<i64>().ok())
    });
    rss
}

/// The first rollout of `api`: one ReplicaSet named by its template hash, kube's
/// annotations, a complete status.
async fn assert_first_rollout(client: &kube::Client) {
    let rss = replica_sets(client, "api").await;
    assert_eq!(rss.len(), 1);
    let first = &rss[0];
    let hash = first
        .labels()
        .get("pod-template-hash")
        .expect("hash")
        .clone();
    assert_eq!(first.name_any(), format!("api-{hash}"));
    assert!((1..=10).contains(&hash.len()));
    let a = first.annotations();
    assert_eq!(
        a.get("deployment.kubernetes.io/revision")
            .map(String::as_str),
        Some("1")
    );
    assert_eq!(
        a.get("deployment.kubernetes.io/desired-replicas")
            .map(String::as_str),
        Some("2")
    );
    assert_eq!(
        a.get("deployment.kubernetes.io/max-replicas")
            .map(String::as_str),
        Some("3")
    );
    let selector = first.spec.as_ref().expect("spec").selector.clone();
    assert_eq!(
        selector
            .match_labels
            .expect("labels")
            .get("pod-template-hash"),
        Some(&hash)
    );

    let d_api: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let d = d_api.get("api").await.expect("deployment");
    let status = d.status.clone().expect("status");
    assert_eq!(
        (
            status.replicas,
            status.updated_replicas,
            status.ready_replicas,
            status.available_replicas
        ),
        (Some(2), Some(2), Some(2), Some(2))
    );
    assert_eq!(status.observed_generation, d.metadata.generation);
    let reason = |d: &Deployment, t: &str| {
        d.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == t))
            .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
    };
    assert_eq!(
        reason(&d, "Available"),
        Some(("True".into(), "MinimumReplicasAvailable".into()))
    );
    assert_eq!(
        reason(&d, "Progressing"),
        Some(("True".into(), "NewReplicaSetAvailable".into()))
    );
}

#[tokio::test]
async fn a_deployment_rolls_out_restarts_cleans_up_history_and_is_garbage_collected() {
    let h = Harness::start(&[("n1", "worker")]).await;
    let client = h.client();
    h.apply(deployment(
        "api",
        &json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}),
    ))
    .await;
    let out = h
        .kubectl_ok(&["rollout", "status", "deploy/api", "--timeout=60s"])
        .await;
    assert!(out.contains("successfully rolled out"), "{out}");

    assert_first_rollout(&client).await;
    let d_api: Api<Deployment> = Api::namespaced(client.clone(), NS);

    // A restart and a new image: each rolls to a new ReplicaSet; history keeps one old one.
    let changes: [&[&str]; 2] = [
        &["rollout", "restart", "deploy/api"],
        &["set", "image", "deploy/api", "c=example.com/app:v2"],
    ];
    for (change, revision) in changes.into_iter().zip(["2", "3"]) {
        h.kubectl_ok(change).await;
        let out = h
            .kubectl_ok(&["rollout", "status", "deploy/api", "--timeout=60s"])
            .await;
        assert!(out.contains("successfully rolled out"), "{out}");
        let d = d_api.get("api").await.expect("deployment");
        assert_eq!(
            d.annotations()
                .get("deployment.kubernetes.io/revision")
                .map(String::as_str),
            Some(revision)
        );
    }
    let rss = eventually(
        "old replica sets beyond the history limit deleted",
        || async {
            let rss = replica_sets(&client, "api").await;
            (rss.len() == 2).then_some(rss)
        },
    )
    .await;
    let (old, new) = (&rss[0], &rss[1]);
    assert_eq!(old.spec.as_ref().and_then(|s| s.replicas), Some(0));
    assert_eq!(new.spec.as_ref().and_then(|s| s.replicas), Some(2));
    assert_eq!(
        new.annotations()
            .get("deployment.kubernetes.io/revision")
            .map(String::as_str),
        Some("3")
    );
    let new_hash = new.labels().get("pod-template-hash").expect("hash").clone();
    let pods = active_pods(&client, "app=api").await;
    assert_eq!(pods.len(), 2);
    assert!(
        pods.iter()
            .all(|p| p.labels().get("pod-template-hash") == Some(&new_hash))
    );

    // Undo goes back to revision 2's template: its ReplicaSet becomes revision 4.
    let previous = old.name_any();
    h.kubectl_ok(&["rollout", "undo", "deploy/api"]).await;
    let out = h
        .kubectl_ok(&["rollout", "status", "deploy/api", "--timeout=60s"])
        .await;
    assert!(out.contains("successfully rolled out"), "{out}");
    let back = Api::<ReplicaSet>::namespaced(client.clone(), NS)
        .get(&previous)
        .await
        .expect("the revision 2 replica set");
    let a = back.annotations();
    assert_eq!(
        a.get("deployment.kubernetes.io/revision")
            .map(String::as_str),
        Some("4")
    );
    assert_eq!(
        a.get("deployment.kubernetes.io/revision-history")
            .map(String::as_str),
        Some("2")
    );
    assert_eq!(back.spec.as_ref().and_then(|s| s.replicas), Some(2));

    // Deleting the Deployment removes its ReplicaSets and their pods (garbage collector).
    d_api
        .delete("api", &DeleteParams::background())
        .await
        .expect("delete deployment");
    eventually("replica sets and pods collected", || async {
        let rss = replica_sets(&client, "api").await;
        let pods = Api::<Pod>::namespaced(client.clone(), NS)
            .list(&ListParams::default().labels("app=api"))
            .await
            .ok()?;
        (rss.is_empty() && pods.items.is_empty()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_recreate_deployment_replaces_all_pods_at_once() {
    let h = Harness::start(&[("n1", "worker")]).await;
    let client = h.client();
    h.apply(deployment("db", &json!({"type": "Recreate"})))
        .await;
    h.kubectl_ok(&["rollout", "status", "deploy/db", "--timeout=60s"])
        .await;
    h.kubectl_ok(&["rollout", "restart", "deploy/db"]).await;
    let out = h
        .kubectl_ok(&["rollout", "status", "deploy/db", "--timeout=60s"])
        .await;
    assert!(out.contains("successfully rolled out"), "{out}");
    let rss = replica_sets(&client, "db").await;
    assert_eq!(rss.len(), 2);
    assert_eq!(rss[0].spec.as_ref().and_then(|s| s.replicas), Some(0));
    assert_eq!(rss[1].spec.as_ref().and_then(|s| s.replicas), Some(2));
}

fn condition_reason(d: &Deployment, type_: &str) -> Option<String> {
    d.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)?
        .reason
        .clone()
}

/// Counts the active pods with `selector` after every watch event; returns (once the watch
/// has its initial list) a task giving the largest count seen when `stop` fires.
async fn track_max_active_pods(
    client: &kube::Client,
    selector: &str,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<usize> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let config = watcher::Config::default().labels(selector);
    let (synced_tx, synced) = tokio::sync::oneshot::channel();
    let mut synced_tx = Some(synced_tx);
    let task = tokio::spawn(async move {
        let mut active = std::collections::BTreeSet::new();
        let mut max = 0;
        let stream = watcher(api, config).default_backoff();
        let mut stream = std::pin::pin!(stream);
        loop {
            let event = tokio::select! {
                () = stop.cancelled() => return max,
                e = stream.next() => e,
            };
            match event {
                Some(Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p))) => {
                    if p.metadata.deletion_timestamp.is_none() {
                        active.insert(p.name_any());
                    } else {
                        active.remove(&p.name_any());
                    }
                }
                Some(Ok(watcher::Event::Delete(p))) => {
                    active.remove(&p.name_any());
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    if let Some(tx) = synced_tx.take() {
                        let _ = tx.send(());
                    }
                }
                Some(_) => {}
                None => return max,
            }
            max = max.max(active.len());
        }
    });
    synced.await.expect("the watch synced");
    task
}

#[tokio::test]
async fn a_rolling_update_never_runs_more_pods_than_max_surge_allows() {
    let h = Harness::start(&[("n1", "worker")]).await;
    let client = h.client();
    let mut d = deployment(
        "big",
        &json!({"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}),
    );
    d["spec"]["replicas"] = json!(4);
    h.apply(d).await;
    h.kubectl_ok(&["rollout", "status", "deploy/big", "--timeout=60s"])
        .await;
    let stop = CancellationToken::new();
    let max = track_max_active_pods(&client, "app=big", stop.clone()).await;
    h.kubectl_ok(&["set", "image", "deploy/big", "c=example.com/app:v2"])
        .await;
    h.kubectl_ok(&["rollout", "status", "deploy/big", "--timeout=60s"])
        .await;
    stop.cancel();
    let max = max.await.expect("tracker");
    // 4 replicas: 25% surge rounds up to 1.
    assert!(max <= 5, "{max} active pods during the rollout");
    let rss = replica_sets(&client, "big").await;
    assert_eq!(rss.len(), 2);
    assert_eq!(rss[1].spec.as_ref().and_then(|s| s.replicas), Some(4));
    assert_eq!(
        rss[1]
            .annotations()
            .get("deployment.kubernetes.io/max-replicas")
            .map(String::as_str),
        Some("5")
    );
}

#[tokio::test]
async fn a_paused_deployment_only_scales_until_it_is_resumed() {
    let h = Harness::start(&[("n1", "worker")]).await;
    let client = h.client();
    h.apply(deployment("web", &serde_json::Value::Null)).await;
    h.kubectl_ok(&["rollout", "status", "deploy/web", "--timeout=60s"])
        .await;
    h.kubectl_ok(&["rollout", "pause", "deploy/web"]).await;
    h.kubectl_ok(&["set", "image", "deploy/web", "c=example.com/app:v2"])
        .await;
    h.kubectl_ok(&["scale", "deploy/web", "--replicas=3"]).await;
    let d_api: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let d = eventually("the paused deployment scaled, not rolled", || async {
        let d = d_api.get("web").await.ok()?;
        let s = d.status.clone()?;
        (s.observed_generation == d.metadata.generation && s.available_replicas == Some(3))
            .then_some(d)
    })
    .await;
    assert_eq!(
        condition_reason(&d, "Progressing").as_deref(),
        Some("DeploymentPaused")
    );
    let rss = replica_sets(&client, "web").await;
    assert_eq!(rss.len(), 1, "no new ReplicaSet while paused");
    assert_eq!(
        rss[0]
            .annotations()
            .get("deployment.kubernetes.io/desired-replicas")
            .map(String::as_str),
        Some("3")
    );

    h.kubectl_ok(&["rollout", "resume", "deploy/web"]).await;
    let out = h
        .kubectl_ok(&["rollout", "status", "deploy/web", "--timeout=60s"])
        .await;
    assert!(out.contains("successfully rolled out"), "{out}");
    let d = d_api.get("web").await.expect("deployment");
    assert_eq!(
        condition_reason(&d, "Progressing").as_deref(),
        Some("NewReplicaSetAvailable")
    );
    let pods = active_pods(&client, "app=web").await;
    assert_eq!(pods.len(), 3);
    assert!(pods.iter().all(|p| {
        p.spec
            .as_ref()
            .and_then(|s| s.containers.first()?.image.clone())
            .as_deref()
            == Some("example.com/app:v2")
    }));
}

#[tokio::test]
async fn a_daemon_set_runs_one_pod_per_matching_node_and_rolls_out_updates() {
    let h = Harness::start(&[("n1", "worker"), ("n2", "worker"), ("n3", "infra")]).await;
    let client = h.client();
    h.apply(json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "handler", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "handler"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {"metadata": {"labels": {"app": "handler"}},
                "spec": {"nodeSelector": {"role": "worker"},
                    "containers": [{"name": "c", "image": "example.com/handler:v1"}]}}}}))
        .await;
    let out = h
        .kubectl_ok(&["rollout", "status", "ds/handler", "--timeout=60s"])
        .await;
    assert!(out.contains("successfully rolled out"), "{out}");

    let ds_api: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    let status = ds_api
        .get("handler")
        .await
        .expect("ds")
        .status
        .expect("status");
    assert_eq!(status.desired_number_scheduled, 2);
    assert_eq!(status.current_number_scheduled, 2);
    assert_eq!(status.number_ready, 2);
    assert_eq!(status.number_available, Some(2));
    assert_eq!(status.updated_number_scheduled, Some(2));
    assert_eq!(status.number_misscheduled, 0);
    let pods = active_pods(&client, "app=handler").await;
    let mut nodes: Vec<String> = pods
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    nodes.sort();
    assert_eq!(
        nodes,
        ["n1", "n2"],
        "bound by the scheduler through the node affinity"
    );
    let revisions = revisions_of(&client, "app=handler").await;
    assert_eq!(revisions.len(), 1);
    let hash = revisions[0]
        .labels()
        .get("controller-revision-hash")
        .expect("hash")
        .clone();
    assert!(
        pods.iter()
            .all(|p| p.labels().get("controller-revision-hash") == Some(&hash))
    );

    // A node that comes to match gets its pod.
    Api::<Node>::all(client.clone())
        .patch(
            "n3",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"role": "worker"}}})),
        )
        .await
        .expect("label n3");
    eventually("a daemon pod on n3 as well", || async {
        let s = ds_api.get("handler").await.ok()?.status?;
        (s.desired_number_scheduled == 3 && s.number_available == Some(3)).then_some(())
    })
    .await;

    h.kubectl_ok(&["rollout", "restart", "ds/handler"]).await;
    let out = h
        .kubectl_ok(&["rollout", "status", "ds/handler", "--timeout=60s"])
        .await;
    assert!(out.contains("successfully rolled out"), "{out}");
    let revisions = revisions_of(&client, "app=handler").await;
    assert_eq!(revisions.len(), 2);
    let newest = revisions.iter().max_by_key(|r| r.revision).expect("newest");
    assert_eq!(newest.revision, 2);
    let new_hash = newest
        .labels()
        .get("controller-revision-hash")
        .expect("hash")
        .clone();
    let pods = eventually("three updated daemon pods", || async {
        let pods = active_pods(&client, "app=handler").await;
        (pods.len() == 3).then_some(pods)
    })
    .await;
    assert!(
        pods.iter()
            .all(|p| p.labels().get("controller-revision-hash") == Some(&new_hash))
    );
    // Deleting the DaemonSet removes its pods and revisions (garbage collector).
    ds_api
        .delete("handler", &DeleteParams::foreground())
        .await
        .expect("delete daemon set");
    eventually("daemon pods, revisions and the DaemonSet gone", || async {
        let pods = Api::<Pod>::namespaced(client.clone(), NS)
            .list(&ListParams::default().labels("app=handler"))
            .await
            .ok()?;
        let gone = ds_api.get_opt("handler").await.ok()?.is_none();
        let revisions = revisions_of(&client, "app=handler").await;
        (pods.items.is_empty() && revisions.is_empty() && gone).then_some(())
    })
    .await;
}

async fn revisions_of(client: &kube::Client, selector: &str) -> Vec<ControllerRevision> {
    Api::<ControllerRevision>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels(selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}
