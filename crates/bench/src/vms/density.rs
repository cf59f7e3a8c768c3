//! Density: create a batch of `runStrategy: Always` VMs (paced or all at once), wait until
//! every VMI is Running, read creation→Running from `phaseTransitionTimestamps`, optionally
//! patch a synced label into every template and time its arrival on the launcher pods, then
//! delete the batch and time until every launcher pod is gone. API requests are counted over
//! create→Running and delete→gone (the label-sync phase in between is left out).

use std::time::{Duration, Instant};

use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

use super::cluster::{Cluster, RequestCounts, Seen, VM_LABEL};
use crate::stats::Percentiles;

/// The synced label the label-sync measurement patches.
pub const SYNCED_LABEL: &str = "ops.example.com/bench";

/// How a batch is created and what its guests are.
#[derive(Clone, Debug)]
pub struct Batch {
    /// Shown in tables: "fake QEMU, 100 ms apart" …
    pub label: String,
    pub prefix: String,
    pub count: usize,
    /// Pause between creates (zero: all at once).
    pub interval: Duration,
    /// Guest memory of each VM.
    pub guest_mib: u64,
    /// Patch [`SYNCED_LABEL`] into every template once Running and time its arrival.
    pub label_sync: bool,
    /// Sample memory (server, launchers, QEMU) once all are Running.
    pub sample_memory: bool,
    pub deadline: Duration,
}

/// Figures of one batch.
#[derive(Clone, Debug, Default)]
pub struct BatchResult {
    pub batch_label: String,
    pub count: usize,
    pub to_running: Percentiles,
    /// Create request sent → VMI Running seen by the harness's watch (ms resolution); the
    /// samples of the plot.
    pub observed: Vec<Duration>,
    /// Time until all were Running (until giving up when `stuck`).
    pub all_running: Duration,
    /// Set when not every VMI became Running: why the wait gave up.
    pub stuck: Option<String>,
    pub all_gone: Duration,
    pub requests: RequestCounts,
    pub label_sync: Option<Percentiles>,
    pub server_rss_kib: u64,
    /// RSS per replica of each KubeVirt component pod.
    pub components_rss_kib: std::collections::BTreeMap<String, Vec<u64>>,
    /// `(RSS, RssAnon)` per launcher.
    pub launcher_rss_kib: Vec<super::cluster::LauncherMemory>,
    pub qemu: Vec<super::procfs::QemuMemory>,
}

/// A VM that starts at once and boots no OS: no disks, no kernel, no NIC — QEMU starts and
/// the firmware finds nothing to boot, so the vCPU idles.
fn vm_manifest(name: &str, guest_mib: u64) -> serde_json::Value {
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": name, "labels": {VM_LABEL: name}},
        "spec": {
            "runStrategy": "Always",
            "template": {
                "metadata": {"labels": {VM_LABEL: name}},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "domain": {
                        "cpu": {"cores": 1},
                        "memory": {"guest": format!("{guest_mib}Mi")},
                        "devices": {"disks": [], "autoattachPodInterface": false,
                                    "autoattachSerialConsole": true}
                    }
                }
            }
        }
    })
}

pub async fn run(cluster: &Cluster, batch: &Batch) -> anyhow::Result<BatchResult> {
    let names: Vec<String> = (0..batch.count)
        .map(|i| format!("{}-{i:04}", batch.prefix))
        .collect();
    let vms = cluster.vms();
    let before = cluster.request_counts().await?;
    eprintln!("  {}: creating {} VMs", batch.label, batch.count);
    let start = Instant::now();
    let creates = names.iter().enumerate().map(|(i, name)| {
        let (vms, object) = (vms.clone(), vm_manifest(name, batch.guest_mib));
        let delay = batch.interval * u32::try_from(i).unwrap_or(u32::MAX);
        async move {
            tokio::time::sleep_until(tokio::time::Instant::from_std(start + delay)).await;
            let object: DynamicObject = serde_json::from_value(object)?;
            let sent = Instant::now();
            vms.create(&PostParams::default(), &object).await?;
            anyhow::Ok(sent)
        }
    });
    let sent: Vec<Instant> = futures::future::try_join_all(creates).await?;
    let waited = cluster
        .wait_for(
            "VMIs Running",
            batch.deadline,
            |s| running(s, &names) == names.len(),
            |s| format!("{}/{} Running", running(s, &names), names.len()),
        )
        .await;
    let all_running = start.elapsed();
    let stuck = match waited {
        Ok(_) => None,
        Err(e) => {
            // Report what did run, name the rest, and still clean up.
            eprintln!("  {}: {e:#}", batch.label);
            Some(format!("{}: {e:#}", batch.label))
        }
    };
    eprintln!(
        "  {}: all {} Running after {:.1} s",
        batch.label,
        batch.count,
        all_running.as_secs_f64()
    );
    let (samples, observed): (Vec<Duration>, Vec<Duration>) = {
        let seen = cluster
            .seen
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?;
        let samples = names
            .iter()
            .filter_map(|n| seen.vmis.get(n).and_then(|v| v.to_running))
            .collect();
        let observed = names
            .iter()
            .zip(&sent)
            .filter_map(|(n, at)| {
                let running = seen.vmis.get(n)?.running_seen?;
                Some(running.saturating_duration_since(*at))
            })
            .collect();
        (samples, observed)
    };
    let running_counts = cluster.request_counts().await?.since(&before);

    let mut result = BatchResult {
        batch_label: batch.label.clone(),
        count: batch.count,
        to_running: Percentiles::of(samples),
        observed,
        all_running,
        stuck,
        ..BatchResult::default()
    };
    if batch.sample_memory {
        // Let launchers and QEMU settle after the start.
        tokio::time::sleep(Duration::from_secs(2)).await;
        result.server_rss_kib = cluster.server_rss_kib();
        result.components_rss_kib = cluster.component_rss_kib();
        result.launcher_rss_kib = cluster.launcher_rss_kib();
        result.qemu = cluster.qemu_memory(batch.guest_mib);
    }
    if batch.label_sync && result.stuck.is_none() {
        result.label_sync = Some(label_sync(cluster, &names, batch.deadline).await?);
    }

    let (all_gone, delete_counts) = delete_all(cluster, batch, &names).await?;
    result.all_gone = all_gone.unwrap_or_else(|e| {
        result.stuck = Some(match result.stuck.take() {
            Some(earlier) => format!("{earlier}; {e}"),
            None => e,
        });
        Duration::ZERO
    });
    result.requests = running_counts.plus(&delete_counts);
    Ok(result)
}

/// Deletes the batch's VMs; returns the time until their launcher pods are gone (or why
/// they did not go) and the API requests meanwhile.
async fn delete_all(
    cluster: &Cluster,
    batch: &Batch,
    names: &[String],
) -> anyhow::Result<(Result<Duration, String>, RequestCounts)> {
    eprintln!("  {}: deleting", batch.label);
    let vms = cluster.vms();
    let before = cluster.request_counts().await?;
    let start = Instant::now();
    let deletes = names.iter().map(|name| {
        let vms = vms.clone();
        async move { vms.delete(name, &DeleteParams::default()).await.map(|_| ()) }
    });
    for deleted in futures::future::join_all(deletes).await {
        deleted?;
    }
    let gone = cluster
        .wait_for(
            "launcher pods gone",
            batch.deadline,
            |s| pods_left(s, names) == 0,
            |s| format!("{} pods left", pods_left(s, names)),
        )
        .await
        .map(|_| start.elapsed())
        .map_err(|e| format!("{e:#}"));
    match &gone {
        Ok(took) => eprintln!(
            "  {}: all pods gone after {:.1} s",
            batch.label,
            took.as_secs_f64()
        ),
        Err(e) => eprintln!("  {}: {e}", batch.label),
    }
    let counts = cluster.request_counts().await?.since(&before);
    Ok((gone, counts))
}

fn running(seen: &Seen, names: &[String]) -> usize {
    names
        .iter()
        .filter(|n| {
            seen.vmis
                .get(*n)
                .is_some_and(|v| v.phase == "Running" && v.to_running.is_some())
        })
        .count()
}

fn pods_left(seen: &Seen, names: &[String]) -> usize {
    names.iter().filter(|n| seen.pods.contains(*n)).count()
}

/// Patches [`SYNCED_LABEL`] into every VM's template and measures until each launcher pod
/// carries it (arrival stamped by the pod watch).
async fn label_sync(
    cluster: &Cluster,
    names: &[String],
    deadline: Duration,
) -> anyhow::Result<Percentiles> {
    eprintln!("  label sync: patching {} templates", names.len());
    let value = "v1";
    let vms = cluster.vms();
    let patches = names.iter().map(|name| {
        let vms = vms.clone();
        async move {
            let patch =
                json!({"spec": {"template": {"metadata": {"labels": {SYNCED_LABEL: value}}}}});
            let sent = Instant::now();
            vms.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            anyhow::Ok((name.clone(), sent))
        }
    });
    let sent: Vec<(String, Instant)> = futures::future::try_join_all(patches).await?;
    let key = |n: &String| (n.clone(), SYNCED_LABEL.to_owned(), value.to_owned());
    cluster
        .wait_for(
            "label on launcher pods",
            deadline,
            |s| {
                sent.iter()
                    .all(|(n, _)| s.label_arrivals.contains_key(&key(n)))
            },
            |s| {
                let arrived = sent
                    .iter()
                    .filter(|(n, _)| s.label_arrivals.contains_key(&key(n)))
                    .count();
                format!("{arrived}/{} pods labelled", sent.len())
            },
        )
        .await?;
    let seen = cluster
        .seen
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?;
    Ok(Percentiles::of(
        sent.iter()
            .filter_map(|(n, at)| {
                seen.label_arrivals
                    .get(&key(n))
                    .map(|arrived| arrived.saturating_duration_since(*at))
            })
            .collect(),
    ))
}
