//! `kubevirt-rs-bench vms`: density, API calls per VMI, memory, boot overhead and label-sync
//! latency against a real `kubevirt-rs server` process.
//!
//! Two servers run one after the other, each on a temporary data directory:
//! 1. **fake QEMU** (`server --fake-qemu`): launchers report a running domain without QEMU,
//!    as upstream's KWOK density test does — the control plane at scale (N = 10, 100, 1,000),
//!    plus label sync (`--additional-launcher-labels-sync 'ops.example.com/*'`); the node is
//!    declared KWOK-sized so its two real CPUs do not cap the batch.
//! 2. **real QEMU** (TCG): VMs without disk, kernel or NIC (QEMU starts, the firmware finds
//!    nothing to boot, the vCPU idles) for per-VM costs, then the demo VM (the test guest)
//!    against plain QEMU with the launcher's own arguments for the boot overhead.
//!
//! Progress goes to stderr, Markdown to the returned report, the creation→Running CDF to a
//! PNG. Every VM and process is cleaned up when a step fails or the run is interrupted
//! (see [`cluster::Cluster`]).

mod boot;
mod cluster;
mod density;
mod procfs;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::stats::{Percentiles, Table};
use cluster::Cluster;
use density::{Batch, BatchResult};

/// What to run.
#[derive(Clone, Debug)]
pub struct VmsOptions {
    /// The `kubevirt-rs` binary (default: next to this one).
    pub server_binary: Option<PathBuf>,
    /// Batch size with fake QEMU, paced and all at once (also the label-sync count).
    pub vms: usize,
    /// Control-plane scale batches with fake QEMU (all at once), each on a fresh server with
    /// [`VMS_PER_NODE`] VMs per node.
    pub scale_vms: Vec<usize>,
    /// Batch size with real QEMU guests.
    pub real_vms: usize,
    /// Pause between paced creates.
    pub interval: Duration,
    /// The test guest (`vmlinux`, `initramfs.cpio.gz`); no boot measurement without it.
    pub guest_dir: Option<PathBuf>,
    pub boot_runs: usize,
    /// Where the creation→Running CDF is written.
    pub plot: PathBuf,
    /// Where each server's logs are copied before its data directory goes.
    pub keep_logs: Option<PathBuf>,
    /// Run the fake-QEMU server only.
    pub fake_only: bool,
}

/// Copies the cluster's logs to `<keep_logs>/<name>/` when asked to (a failure is a note,
/// not an error: the figures stand without the logs).
fn keep_logs(cluster: &Cluster, options: &VmsOptions, name: &str, results: &mut Results) {
    if let Some(dir) = &options.keep_logs {
        let dir = dir.join(name);
        match cluster.save_logs(&dir) {
            Ok(()) => eprintln!("logs copied to {}", dir.display()),
            Err(e) => results.notes.push(format!("Logs not kept: {e:#}")),
        }
    }
}

/// VMs per node in the scale batches: a node's pod CIDR is a /24 (253 pod addresses, as
/// kube-controller-manager's default `--node-cidr-mask-size`), and a VM is one pod.
const VMS_PER_NODE: usize = 200;

/// Guest memory of the idle real-QEMU VMs.
const GUEST_MIB: u64 = 128;

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

fn secs(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64())
}

fn avg(values: &[u64]) -> u64 {
    if values.is_empty() {
        0
    } else {
        values.iter().sum::<u64>() / values.len() as u64
    }
}

/// Memory rows: `(server, N, result)`.
struct MemoryRow {
    server: &'static str,
    n: usize,
    server_rss_kib: u64,
    /// RSS per replica of each KubeVirt component.
    components_kib: std::collections::BTreeMap<String, Vec<u64>>,
    launcher_kib: Vec<cluster::LauncherMemory>,
    qemu: Vec<procfs::QemuMemory>,
}

#[derive(Default)]
struct Results {
    batches: Vec<(&'static str, BatchResult)>,
    memory: Vec<MemoryRow>,
    label_sync: Option<(usize, Percentiles)>,
    boot: Option<boot::BootResult>,
    notes: Vec<String>,
}

impl Results {
    fn add(&mut self, server: &'static str, result: BatchResult) {
        if !result.launcher_rss_kib.is_empty() || result.server_rss_kib > 0 {
            self.memory.push(MemoryRow {
                server,
                n: result.count,
                server_rss_kib: result.server_rss_kib,
                components_kib: result.components_rss_kib.clone(),
                launcher_kib: result.launcher_rss_kib.clone(),
                qemu: result.qemu.clone(),
            });
        }
        if let Some(stuck) = &result.stuck {
            self.notes.push(format!(
                "Not every VMI became Running ({server}, N = {}): {stuck}. The \
                 figures of that row cover the VMIs that did.",
                result.count
            ));
        }
        if let Some(p) = &result.label_sync {
            self.label_sync = Some((result.count, p.clone()));
        }
        self.batches.push((server, result));
    }
}

fn server_binary(options: &VmsOptions) -> anyhow::Result<PathBuf> {
    if let Some(path) = &options.server_binary {
        return Ok(path.clone());
    }
    let exe = std::env::current_exe().context("locating the bench binary")?;
    Ok(exe.with_file_name("kubevirt-rs"))
}

async fn idle_memory(cluster: &Cluster, server: &'static str, results: &mut Results) {
    tokio::time::sleep(Duration::from_secs(3)).await;
    results.memory.push(MemoryRow {
        server,
        n: 0,
        server_rss_kib: cluster.server_rss_kib(),
        components_kib: cluster.component_rss_kib(),
        launcher_kib: Vec::new(),
        qemu: Vec::new(),
    });
}

fn batch(label: &str, prefix: &str, count: usize, interval: Duration) -> Batch {
    Batch {
        label: label.to_owned(),
        prefix: prefix.to_owned(),
        count,
        interval,
        guest_mib: GUEST_MIB,
        label_sync: false,
        sample_memory: false,
        deadline: Duration::from_secs(120 + count as u64 / 2),
    }
}

async fn fake_qemu(
    binary: &std::path::Path,
    options: &VmsOptions,
    results: &mut Results,
) -> anyhow::Result<()> {
    eprintln!("== fake QEMU: starting kubevirt-rs server --fake-qemu");
    let args = fake_server_args(1);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let cluster = Cluster::start(binary, &args).await?;
    idle_memory(&cluster, "fake QEMU", results).await;
    let paced_label = format!("fake, {} ms apart", options.interval.as_millis());
    let plan = [
        Batch {
            sample_memory: true,
            ..batch("fake, all at once", "f10", 10, Duration::ZERO)
        },
        Batch {
            sample_memory: true,
            label_sync: true,
            ..batch(&paced_label, "fp", options.vms, options.interval)
        },
        batch("fake, all at once", "fb", options.vms, Duration::ZERO),
    ];
    for b in plan.iter().filter(|b| b.count > 0) {
        let result = density::run(&cluster, b).await;
        if result.is_err() {
            keep_logs(&cluster, options, "fake-qemu", results);
        }
        results.add("fake QEMU", result?);
    }
    keep_logs(&cluster, options, "fake-qemu", results);
    Ok(())
}

/// The server arguments of a fake-QEMU cluster: KWOK-sized nodes (fake launchers use
/// nothing, so the batch measures the control plane and not this machine's two cores).
fn fake_server_args(nodes: usize) -> Vec<String> {
    [
        "--fake-qemu",
        "--additional-launcher-labels-sync",
        "ops.example.com/*",
        "--node-capacity",
        "cpu=1k,memory=4Ti,pods=10k",
        "--nodes",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([nodes.to_string()])
    .collect()
}

/// One control-plane scale batch of `count` fake-QEMU VMs on a server of its own, with as
/// many nodes as the batch needs pod addresses.
async fn fake_qemu_scale(
    binary: &std::path::Path,
    options: &VmsOptions,
    count: usize,
    results: &mut Results,
) -> anyhow::Result<()> {
    let nodes = count.div_ceil(VMS_PER_NODE).max(1);
    eprintln!("== fake QEMU, {count} VMs: starting kubevirt-rs server --fake-qemu --nodes {nodes}");
    let args = fake_server_args(nodes);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let cluster = Cluster::start(binary, &args).await?;
    let label = format!("fake, all at once, {nodes} nodes");
    let b = Batch {
        sample_memory: true,
        ..batch(&label, "fs", count, Duration::ZERO)
    };
    let result = density::run(&cluster, &b).await;
    keep_logs(&cluster, options, &format!("fake-qemu-{count}"), results);
    results.add("fake QEMU", result?);
    Ok(())
}

async fn real_qemu(
    binary: &std::path::Path,
    options: &VmsOptions,
    results: &mut Results,
) -> anyhow::Result<()> {
    eprintln!("== real QEMU (TCG): starting kubevirt-rs server");
    let cluster = Cluster::start(binary, &[]).await?;
    idle_memory(&cluster, "QEMU (TCG)", results).await;
    let paced_label = format!("QEMU, {} ms apart", options.interval.as_millis());
    let plan = [
        Batch {
            sample_memory: true,
            ..batch(&paced_label, "rp", options.real_vms, options.interval)
        },
        batch("QEMU, all at once", "rb", options.real_vms, Duration::ZERO),
    ];
    for b in plan.iter().filter(|b| b.count > 0) {
        results.add("QEMU (TCG)", density::run(&cluster, b).await?);
    }
    match &options.guest_dir {
        Some(dir) if options.boot_runs > 0 => {
            eprintln!(
                "== boot overhead: demo VM vs plain QEMU, {} runs",
                options.boot_runs
            );
            boot::import_guest(binary, &cluster, dir)?;
            results.boot = Some(boot::run(&cluster, options.boot_runs).await?);
        }
        _ => results
            .notes
            .push("Boot overhead not measured: no test guest (`--guest-dir`).".into()),
    }
    keep_logs(&cluster, options, "real-qemu", results);
    Ok(())
}

/// Runs everything and returns the Markdown report.
pub async fn run(options: VmsOptions) -> anyhow::Result<String> {
    let binary = server_binary(&options)?;
    let mut results = Results::default();
    if options.vms > 0
        && let Err(e) = fake_qemu(&binary, &options, &mut results).await
    {
        eprintln!("fake QEMU run failed: {e:#}");
        results
            .notes
            .push(format!("The fake-QEMU run failed: {e:#}"));
    }
    for &count in options.scale_vms.iter().filter(|n| **n > 0) {
        if let Err(e) = fake_qemu_scale(&binary, &options, count, &mut results).await {
            eprintln!("fake QEMU scale run ({count}) failed: {e:#}");
            results
                .notes
                .push(format!("The fake-QEMU scale run of {count} failed: {e:#}"));
        }
    }
    if options.fake_only {
        results
            .notes
            .push("Real QEMU not run (`--fake-only`).".into());
    } else if let Err(e) = real_qemu(&binary, &options, &mut results).await {
        eprintln!("real QEMU run failed: {e:#}");
        results
            .notes
            .push(format!("The real-QEMU run failed: {e:#}"));
    }
    let series: Vec<(String, Vec<Duration>)> = results
        .batches
        .iter()
        .filter(|(_, r)| r.count >= 10)
        .map(|(_, r)| {
            (
                format!("{}, N = {}", r.batch_label, r.count),
                r.observed.clone(),
            )
        })
        .collect();
    if let Err(e) = crate::plot::cdf_png(&options.plot, "VMI creation → Running (CDF)", &series) {
        results.notes.push(format!("No plot: {e:#}"));
    } else {
        eprintln!("plot written to {}", options.plot.display());
    }
    Ok(report(&results))
}
fn report(results: &Results) -> String {
    let mut out = String::new();
    density_section(&mut out, results);
    api_section(&mut out, results);
    memory_section(&mut out, results);
    boot_section(&mut out, results);
    label_section(&mut out, results);
    for note in &results.notes {
        let _ = writeln!(out, "\n> {note}");
    }
    out
}

fn density_section(out: &mut String, results: &Results) {
    let _ = writeln!(out, "### Density: VMI creation → Running\n");
    let _ = writeln!(
        out,
        "p50/p95/p99: from each VMI's `status.phaseTransitionTimestamps` (Running − \
         creationTimestamp), as upstream's density test; both are whole-second Kubernetes \
         timestamps, so each sample is ±1 s. watch: from the harness's create request to the \
         watch event showing the VMI Running (ms resolution; the plot). KubeVirt anchor (batch \
         of 100, bare metal): p50 15–25 s, p95 20–40 s.\n"
    );
    let mut t = Table::new(&[
        "guests",
        "creation",
        "N",
        "p50 s",
        "p95 s",
        "p99 s",
        "watch p50 s",
        "watch p95 s",
        "watch p99 s",
        "all Running s",
        "delete → pods gone s",
    ]);
    for (server, r) in &results.batches {
        let observed = Percentiles::of(r.observed.clone());
        t.row(vec![
            (*server).to_owned(),
            r.batch_label.clone(),
            r.count.to_string(),
            secs(r.to_running.at(50.0)),
            secs(r.to_running.at(95.0)),
            secs(r.to_running.at(99.0)),
            secs(observed.at(50.0)),
            secs(observed.at(95.0)),
            secs(observed.at(99.0)),
            secs(r.all_running),
            secs(r.all_gone),
        ]);
    }
    out.push_str(&t.markdown());
}

fn api_section(out: &mut String, results: &Results) {
    let _ = writeln!(
        out,
        "\n### API writes per VMI (create → Running → delete)\n"
    );
    let _ = writeln!(
        out,
        "From the API server's `apiserver_request_total`; the harness's own VM creates and \
         deletes are left out of the total. Pod status PATCHes are the embedded pod \
         runner's (kubelet's role; upstream's figures count KubeVirt's components only). \
         KubeVirt anchor: ≈ 6.5 VMI writes (UPDATE + PATCH) and 2.2 pod PATCHes per VMI; \
         goal: ≤ 1.5 VMI writes and ≤ 1 pod write per VMI.\n"
    );
    let mut t = Table::new(&[
        "guests",
        "creation",
        "N",
        "VMI UPDATE",
        "VMI PATCH",
        "pod PATCH",
        "pod UPDATE",
        "pod status PATCH (kubelet)",
        "all writes",
    ]);
    for (server, r) in &results.batches {
        let per = |n: u64| format!("{:.2}", n as f64 / r.count.max(1) as f64);
        let q = &r.requests;
        t.row(vec![
            (*server).to_owned(),
            r.batch_label.clone(),
            r.count.to_string(),
            per(q.count("PUT", "virtualmachineinstances")),
            per(q.count("PATCH", "virtualmachineinstances")),
            per(q.count_sub("PATCH", "pods", "")),
            per(q.count("PUT", "pods")),
            per(q.count_sub("PATCH", "pods", "status")),
            per(q.control_plane_writes()),
        ]);
    }
    out.push_str(&t.markdown());
    if let Some((_, r)) = results.batches.iter().max_by_key(|(_, r)| r.count) {
        let mut writes: Vec<_> = r
            .requests
            .0
            .iter()
            .filter(|((v, _, _), n)| **n > 0 && !matches!(v.as_str(), "GET" | "LIST" | "WATCH"))
            .collect();
        writes.sort_by(|a, b| b.1.cmp(a.1));
        let _ = writeln!(out, "\nWrites per VMI by request, N = {}:", r.count);
        for ((verb, resource, sub), n) in writes {
            let sub = if sub.is_empty() {
                String::new()
            } else {
                format!("/{sub}")
            };
            let _ = writeln!(
                out,
                "- {verb} {resource}{sub}: {:.2}",
                *n as f64 / r.count.max(1) as f64
            );
        }
    }
}

fn memory_section(out: &mut String, results: &Results) {
    let _ = writeln!(out, "\n### Memory (RSS)\n");
    let _ = writeln!(
        out,
        "Server = the embedded Kubernetes in one process (API server, scheduler, \
         controller-manager, node agent, service proxy); virt-api, virt-controller and \
         virt-handler are pods of their own, each column the average RSS of one replica \
         (2, 2 and one per node); the sum is the server and every replica. Per VM: \
         averages; launcher = the `compute` container's `virt-launcher`, private = its \
         `RssAnon`, PSS = its proportional set size, pod = with the `guest-console-log` container's `virt-tail`. QEMU \
         overhead = QEMU RSS − guest RAM actually touched; the TCG part is its translation \
         cache, which KVM does not have. KubeVirt anchors: virt-controller ≈ 60 MB + virt-api \
         ≈ 140 MB + virt-handler ≈ 20 MB; 240 MiB fixed per-VM budget.\n"
    );
    let mut t = Table::new(&[
        "guests",
        "N",
        "server MiB",
        "virt-api MiB",
        "virt-controller MiB",
        "virt-handler MiB",
        "control plane MiB (sum)",
        "launcher MiB/VM",
        "launcher private MiB/VM",
        "launcher PSS MiB/VM",
        "launcher pod MiB/VM",
        "QEMU MiB/VM",
        "guest RAM touched",
        "TCG cache",
        "QEMU overhead",
    ]);
    for m in &results.memory {
        let q = |f: fn(&procfs::QemuMemory) -> u64| {
            if m.qemu.is_empty() {
                "–".to_owned()
            } else {
                mib(avg(&m.qemu.iter().map(f).collect::<Vec<_>>()))
            }
        };
        let launcher = |f: fn(&cluster::LauncherMemory) -> u64| {
            if m.launcher_kib.is_empty() {
                "–".to_owned()
            } else {
                mib(avg(&m.launcher_kib.iter().map(f).collect::<Vec<_>>()))
            }
        };
        let component = |name: &str| match m.components_kib.get(name) {
            Some(replicas) if !replicas.is_empty() => mib(avg(replicas)),
            _ => "–".to_owned(),
        };
        t.row(vec![
            m.server.to_owned(),
            m.n.to_string(),
            mib(m.server_rss_kib),
            component("virt-api"),
            component("virt-controller"),
            component("virt-handler"),
            mib(m.server_rss_kib + m.components_kib.values().flatten().sum::<u64>()),
            launcher(|l| l.rss_kib),
            launcher(|l| l.anon_kib),
            launcher(|l| l.pss_kib),
            launcher(|l| l.pod_kib),
            q(|x| x.rss_kib),
            q(|x| x.guest_kib),
            q(|x| x.tcg_kib),
            q(procfs::QemuMemory::overhead_kib),
        ]);
    }
    out.push_str(&t.markdown());
}

fn boot_section(out: &mut String, results: &Results) {
    if let Some(b) = &results.boot {
        let _ = writeln!(out, "\n### Boot overhead (test guest, TCG)\n");
        let _ = writeln!(
            out,
            "`kubectl apply` of `examples/vm-demo.yaml` until `GUEST-READY` on the serial \
             console, against plain `qemu-system-x86_64` with the launcher's arguments. Goal: \
             ratio ≤ 1.15.\n"
        );
        let mut t = Table::new(&["path", "runs", "min s", "median s", "max s"]);
        for (name, p) in [
            ("kubevirt-rs (kubectl apply)", &b.stack),
            ("… of which kubectl apply itself", &b.kubectl),
            ("… of which until QEMU started", &b.to_qemu),
            ("plain QEMU", &b.plain),
        ] {
            t.row(vec![
                name.to_owned(),
                p.len().to_string(),
                secs(p.at(0.0)),
                secs(p.at(50.0)),
                secs(p.at(100.0)),
            ]);
        }
        out.push_str(&t.markdown());
        let plain = b.plain.at(50.0).as_secs_f64().max(1e-9);
        let ratio = b.stack.at(50.0).as_secs_f64() / plain;
        // Without kubectl's own start and request: from the VM's creation to the marker.
        let control = (b.stack.at(50.0).as_secs_f64() - b.kubectl.at(50.0).as_secs_f64()) / plain;
        let _ = writeln!(
            out,
            "\nRatio of medians: **{ratio:.2}**; from the VM's creation (kubectl's part \
             left out): **{control:.2}**; VM created → QEMU started: {:.0} ms (medians; QEMU \
             `-accel {}`)",
            (b.to_qemu.at(50.0).as_secs_f64() - b.kubectl.at(50.0).as_secs_f64()) * 1000.0,
            b.accel
        );
    }
}

fn label_section(out: &mut String, results: &Results) {
    if let Some((n, p)) = &results.label_sync {
        let _ = writeln!(out, "\n### Label sync latency (fake QEMU)\n");
        let _ = writeln!(
            out,
            "Merge-patch `ops.example.com/bench` into each running VM's template (server with \
             `--additional-launcher-labels-sync 'ops.example.com/*'`) until the launcher pod \
             has it (pod watch arrival).\n"
        );
        let mut t = Table::new(&["VMs", "p50 ms", "p95 ms", "max ms"]);
        t.row(vec![
            n.to_string(),
            format!("{:.0}", p.p50_ms()),
            format!("{:.0}", p.at(95.0).as_secs_f64() * 1000.0),
            format!("{:.0}", p.max_ms()),
        ]);
        out.push_str(&t.markdown());
    }
}
