//! API server benchmark: create throughput with 1 and 16 concurrent clients, mutating
//! latency percentiles, and watch delivery latency with 1 and 100 watchers — measured with
//! the kube-rs client over HTTPS against an in-process server on a temporary SQLite file
//! (fsync on every commit, as in production).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchParams};
use kube::core::WatchEvent;

use crate::stats::{Percentiles, Table};

/// One create-throughput measurement.
pub struct CreateRun {
    pub objects: usize,
    pub elapsed: Duration,
    pub latency: Percentiles,
}

impl CreateRun {
    pub fn per_second(&self) -> f64 {
        self.objects as f64 / self.elapsed.as_secs_f64()
    }
}

async fn client_for(server: &kubevirt_apiserver::RunningServer) -> anyhow::Result<kube::Client> {
    let kubeconfig =
        kube::config::Kubeconfig::read_from(&server.kubeconfig).context("kubeconfig")?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .context("client config")?;
    kube::Client::try_from(config).context("client")
}

fn config_map(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        data: Some([("k".to_owned(), "v".repeat(64))].into()),
        ..Default::default()
    }
}

/// Creates `objects` ConfigMaps from `clients` concurrent clients (each its own connection).
pub async fn create_throughput(
    server: &kubevirt_apiserver::RunningServer,
    clients: usize,
    objects: usize,
    tag: &str,
) -> anyhow::Result<CreateRun> {
    let mut apis = Vec::new();
    for _ in 0..clients {
        apis.push(Api::<ConfigMap>::namespaced(
            client_for(server).await?,
            "default",
        ));
    }
    let per_client = objects / clients;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (c, api) in apis.into_iter().enumerate() {
        let tag = tag.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(per_client);
            for i in 0..per_client {
                let t = Instant::now();
                api.create(
                    &PostParams::default(),
                    &config_map(&format!("{tag}-{c}-{i}")),
                )
                .await?;
                latencies.push(t.elapsed());
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.context("client task")??);
    }
    Ok(CreateRun {
        objects: per_client * clients,
        elapsed: start.elapsed(),
        latency: Percentiles::of(latencies),
    })
}

/// Time from starting a create until each of `watchers` watches delivers its ADDED event.
pub async fn watch_latency(
    server: &kubevirt_apiserver::RunningServer,
    watchers: usize,
    events: usize,
) -> anyhow::Result<Percentiles> {
    let client = client_for(server).await?;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let started: Arc<std::sync::Mutex<Vec<Option<Instant>>>> =
        Arc::new(std::sync::Mutex::new(vec![None; events]));
    let rv = api
        .list(&Default::default())
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let mut tasks = Vec::new();
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(watchers);
    for _ in 0..watchers {
        let api = api.clone();
        let rv = rv.clone();
        let started = started.clone();
        let ready = ready_tx.clone();
        tasks.push(tokio::spawn(async move {
            let params = WatchParams::default().labels("bench=watch").timeout(290);
            let mut stream = api.watch(&params, &rv).await?.boxed();
            let _ = ready.send(()).await;
            let mut out = Vec::with_capacity(events);
            while out.len() < events {
                match stream.next().await {
                    Some(Ok(WatchEvent::Added(cm))) => {
                        let index: usize = cm
                            .metadata
                            .name
                            .as_deref()
                            .and_then(|n| n.rsplit('-').next())
                            .and_then(|i| i.parse().ok())
                            .unwrap_or(0);
                        let at = started
                            .lock()
                            .map_err(|_| anyhow::anyhow!("poisoned"))?
                            .get(index)
                            .copied()
                            .flatten();
                        if let Some(at) = at {
                            out.push(at.elapsed());
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(e.into()),
                    None => break,
                }
            }
            anyhow::Ok(out)
        }));
    }
    for _ in 0..watchers {
        ready_rx.recv().await;
    }
    for i in 0..events {
        let mut cm = config_map(&format!("watch-{watchers}-{i}"));
        cm.metadata.labels = Some([("bench".to_owned(), "watch".to_owned())].into());
        if let Ok(mut s) = started.lock() {
            s[i] = Some(Instant::now());
        }
        api.create(&PostParams::default(), &cm).await?;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(
            tokio::time::timeout(Duration::from_secs(60), task)
                .await
                .context("watchers timed out")?
                .context("watch task")??,
        );
    }
    Ok(Percentiles::of(all))
}

/// Runs the whole API server benchmark and returns its Markdown report.
pub async fn run(objects: usize) -> anyhow::Result<String> {
    let dir = tempfile::tempdir().context("temp dir")?;
    let server = kubevirt_apiserver::start(kubevirt_apiserver::Config {
        data_dir: dir.path().to_owned(),
        listen: "127.0.0.1:0".parse().context("addr")?,
        initial_objects: Vec::new(),
    })
    .await
    .context("starting the API server")?;
    eprintln!("api server benchmark: warming up");
    create_throughput(&server, 4, 200, "warm").await?;
    let mut table = Table::new(&[
        "clients",
        "creates",
        "creates/s",
        "p50 ms",
        "p99 ms",
        "max ms",
    ]);
    for clients in [1, 16] {
        eprintln!("api server benchmark: {objects} creates with {clients} client(s)");
        let run = create_throughput(&server, clients, objects, &format!("c{clients}")).await?;
        table.row(vec![
            clients.to_string(),
            run.objects.to_string(),
            format!("{:.0}", run.per_second()),
            format!("{:.2}", run.latency.p50_ms()),
            format!("{:.2}", run.latency.p99_ms()),
            format!("{:.2}", run.latency.max_ms()),
        ]);
    }
    let mut watch = Table::new(&["watchers", "events each", "p50 ms", "p99 ms", "max ms"]);
    for watchers in [1, 100] {
        eprintln!("api server benchmark: watch delivery to {watchers} watcher(s)");
        let p = watch_latency(&server, watchers, 50).await?;
        watch.row(vec![
            watchers.to_string(),
            "50".into(),
            format!("{:.2}", p.p50_ms()),
            format!("{:.2}", p.p99_ms()),
            format!("{:.2}", p.max_ms()),
        ]);
    }
    server.stop().await;
    Ok(format!(
        "### Create throughput and mutating latency (ConfigMaps over HTTPS, kube-rs client, SQLite with fsync)\n\n{}\n### Watch delivery latency (create start → ADDED event at each watcher)\n\n{}",
        table.markdown(),
        watch.markdown()
    ))
}
