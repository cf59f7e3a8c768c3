//! [`Command::DomainStats`](crate::protocol::Command::DomainStats): what the domain has used,
//! read when asked, from the same sources libvirt reads for upstream's domain stats.
//!
//! - CPU time of the QEMU process: `/proc/<pid>/stat`; its resident set:
//!   `VmRSS` of `/proc/<pid>/status`.
//! - Per vCPU: QMP `query-cpus-fast` names each vCPU's thread; its `schedstat` gives the time
//!   it ran and the time it waited, runnable, for a host CPU (nanoseconds, so no clock-tick
//!   conversion).
//! - Per interface: the tap device's counters in `/proc/net/dev` of the launcher's network
//!   namespace (the pod's), turned around: what the tap transmitted the guest received.
//! - Per disk: QMP `query-blockstats`, matched to the disk by its device id `ua-<name>`.
//! - The guest's filesystems: its agent's `guest-get-fsinfo` (added by the domain, which owns
//!   the agent's channel).
//! - While an outgoing migration is active: its memory transfer from QMP `query-migrate`
//!   (the disks of a block migration go through their own mirror jobs, not counted here).
//!
//! Interfaces without a tap (user-mode networking) have no counters to read and are left
//! out.

use std::collections::HashMap;

use serde_json::Value;

use crate::protocol::{DiskStats, DomainStats, InterfaceStats, MigrationStats, VcpuStats};
use crate::qmp::QmpClient;
use crate::spec::{InterfaceBinding, LauncherSpec};

/// Clock ticks per second of `/proc/<pid>/stat` (Linux's `USER_HZ`, 100 on the
/// architectures QEMU guests run on here).
const USER_HZ: f64 = 100.0;

/// What a started domain is made of, as the stats need it.
pub(super) struct Subject<'a> {
    pub pid: u32,
    pub qmp: &'a QmpClient,
    pub spec: &'a LauncherSpec,
    /// The guest's memory now (boot plus plugged).
    pub memory_bytes: u64,
    /// An outgoing migration is active.
    pub migrating: bool,
}

/// Reads the stats of `subject`.
///
/// # Errors
/// When QEMU's process or QMP cannot be read (the domain just ended).
pub(super) async fn read(subject: Subject<'_>) -> Result<DomainStats, String> {
    let Subject {
        pid,
        qmp,
        spec,
        memory_bytes,
        migrating,
    } = subject;
    let read = |path: String| std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"));
    let process = ProcessStat::parse(&read(format!("/proc/{pid}/stat"))?)
        .ok_or("unexpected /proc/<pid>/stat")?;
    let resident = vm_rss_bytes(&read(format!("/proc/{pid}/status"))?).unwrap_or(0);
    let cpus = qmp
        .execute("query-cpus-fast", None)
        .await
        .map_err(|e| format!("query-cpus-fast: {e}"))?;
    let vcpus = vcpu_threads(&cpus)
        .into_iter()
        .filter_map(|(id, tid)| {
            let (ran, waited) = schedstat(
                &std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?,
            )?;
            Some(VcpuStats {
                id,
                running_seconds: nanos(ran),
                delay_seconds: nanos(waited),
            })
        })
        .collect();
    let blockstats = qmp
        .execute("query-blockstats", None)
        .await
        .map_err(|e| format!("query-blockstats: {e}"))?;
    let net_dev = std::fs::read_to_string("/proc/self/net/dev").unwrap_or_default();
    let migration = if migrating {
        qmp.execute("query-migrate", None)
            .await
            .ok()
            .and_then(|info| migration_stats(&info))
    } else {
        None
    };
    Ok(DomainStats {
        cpu_user_seconds: process.user_ticks as f64 / USER_HZ,
        cpu_system_seconds: process.system_ticks as f64 / USER_HZ,
        vcpus,
        memory_resident_bytes: resident,
        memory_domain_bytes: memory_bytes,
        interfaces: interfaces(spec, &net_dev),
        disks: disks(spec, &blockstats),
        migration,
        filesystems: Vec::new(),
    })
}

/// The memory transfer of an active migration's `query-migrate` answer (`None` before QEMU
/// reports RAM figures).
fn migration_stats(info: &Value) -> Option<MigrationStats> {
    let ram = info.get("ram")?;
    let field = |name: &str| ram.get(name).and_then(Value::as_u64).unwrap_or(0);
    let mbps = ram.get("mbps").and_then(Value::as_f64).unwrap_or(0.0);
    Some(MigrationStats {
        data_total_bytes: field("total"),
        data_remaining_bytes: field("remaining"),
        data_processed_bytes: field("transferred"),
        dirty_rate_bytes_per_second: field("dirty-pages-rate").saturating_mul(field("page-size")),
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        transfer_rate_bytes_per_second: (mbps * 1e6 / 8.0) as u64,
    })
}

#[allow(clippy::cast_precision_loss)]
fn nanos(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// The fields of `/proc/<pid>/stat` the stats use.
#[derive(Debug, PartialEq, Eq)]
struct ProcessStat {
    user_ticks: u64,
    system_ticks: u64,
}

impl ProcessStat {
    /// Parses the line; the command name (field 2) may hold spaces and parentheses, so
    /// fields are counted from its last `)`.
    fn parse(stat: &str) -> Option<Self> {
        let (_, rest) = stat.rsplit_once(") ")?;
        // `rest` starts at field 3 (state).
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse().ok();
        Some(Self {
            user_ticks: field(14)?,
            system_ticks: field(15)?,
        })
    }
}

/// `VmRSS` of `/proc/<pid>/status`, in bytes.
fn vm_rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `schedstat`: nanoseconds on a CPU, nanoseconds waiting for one.
fn schedstat(text: &str) -> Option<(u64, u64)> {
    let mut fields = text.split_whitespace().map(str::parse::<u64>);
    Some((fields.next()?.ok()?, fields.next()?.ok()?))
}

/// `query-cpus-fast`: (vCPU index, thread id).
fn vcpu_threads(cpus: &Value) -> Vec<(u32, u64)> {
    cpus.as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            Some((
                u32::try_from(c["cpu-index"].as_u64()?).ok()?,
                c["thread-id"].as_u64()?,
            ))
        })
        .collect()
}

/// The counters of each device in `/proc/net/dev`: the 16 numbers after `name:`.
fn net_dev(text: &str) -> HashMap<&str, Vec<u64>> {
    text.lines()
        .filter_map(|line| {
            let (name, counters) = line.split_once(':')?;
            let counters: Vec<u64> = counters
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            (counters.len() >= 16).then_some((name.trim(), counters))
        })
        .collect()
}

/// Each tap-backed interface of `spec`, counted from the guest's side.
fn interfaces(spec: &LauncherSpec, net_dev_text: &str) -> Vec<InterfaceStats> {
    let devices = net_dev(net_dev_text);
    spec.interfaces
        .iter()
        .filter_map(|iface| {
            let tap = match &iface.binding {
                InterfaceBinding::Masquerade(m) => &m.tap,
                InterfaceBinding::Bridge(b) => &b.tap,
                InterfaceBinding::UserMode | InterfaceBinding::Passt(_) => return None,
            };
            // Receive: bytes packets errs drop fifo frame compressed multicast;
            // transmit: bytes packets errs drop fifo colls carrier compressed.
            let c = devices.get(tap.as_str())?;
            Some(InterfaceStats {
                name: iface.name.clone(),
                receive_bytes: c[8],
                receive_packets: c[9],
                receive_errors: c[10],
                receive_dropped: c[11],
                transmit_bytes: c[0],
                transmit_packets: c[1],
                transmit_errors: c[2],
                transmit_dropped: c[3],
            })
        })
        .collect()
}

/// The disk a `query-blockstats` entry belongs to: its `qdev` is the device id (`ua-<name>`)
/// or, for a virtio disk, the QOM path of the device's backend
/// (`/machine/peripheral/ua-<name>/virtio-backend`).
fn disk_name(qdev: &str) -> Option<&str> {
    let id = qdev
        .strip_prefix("/machine/peripheral/")
        .map_or(qdev, |rest| rest.split('/').next().unwrap_or(rest));
    id.strip_prefix("ua-")
}

/// Each disk of `spec` that QEMU has block statistics for.
fn disks(spec: &LauncherSpec, blockstats: &Value) -> Vec<DiskStats> {
    let entries = blockstats.as_array().map(Vec::as_slice).unwrap_or_default();
    spec.disks
        .iter()
        .filter_map(|disk| {
            let entry = entries
                .iter()
                .find(|e| e["qdev"].as_str().and_then(disk_name) == Some(disk.name.as_str()))?;
            let s = &entry["stats"];
            let count = |key: &str| s[key].as_u64().unwrap_or(0);
            Some(DiskStats {
                name: disk.name.clone(),
                read_operations: count("rd_operations"),
                write_operations: count("wr_operations"),
                flush_operations: count("flush_operations"),
                read_bytes: count("rd_bytes"),
                write_bytes: count("wr_bytes"),
                read_seconds: nanos(count("rd_total_time_ns")),
                write_seconds: nanos(count("wr_total_time_ns")),
                flush_seconds: nanos(count("flush_total_time_ns")),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_active_migrations_ram_figures_become_byte_counts() {
        let info = serde_json::json!({"status": "active", "ram": {
            "total": 134_217_728_u64, "remaining": 1_000, "transferred": 50_000,
            "dirty-pages-rate": 10, "page-size": 4096, "mbps": 8.0}});
        assert_eq!(
            migration_stats(&info),
            Some(MigrationStats {
                data_total_bytes: 134_217_728,
                data_remaining_bytes: 1_000,
                data_processed_bytes: 50_000,
                dirty_rate_bytes_per_second: 40_960,
                transfer_rate_bytes_per_second: 1_000_000,
            })
        );
        assert_eq!(
            migration_stats(&serde_json::json!({"status": "setup"})),
            None
        );
    }

    #[test]
    fn process_stat_fields_are_counted_after_the_command_name() {
        let line = "4242 (qemu-system-x86 (a) b) S 1 4242 4242 0 -1 4194560 \
                    1500 0 7 0 250 120 0 0 20 0 5 0 100 1000000 2000 18446744073709551615";
        assert_eq!(
            ProcessStat::parse(line),
            Some(ProcessStat {
                user_ticks: 250,
                system_ticks: 120,
            })
        );
        assert_eq!(ProcessStat::parse("garbage"), None);
    }

    #[test]
    fn resident_set_and_schedstat_parse() {
        assert_eq!(
            vm_rss_bytes("Name:\tqemu\nVmRSS:\t  204800 kB\nThreads:\t5\n"),
            Some(204_800 * 1024)
        );
        assert_eq!(
            schedstat("1500000000 250000000 42\n"),
            Some((1_500_000_000, 250_000_000))
        );
        assert_eq!(
            vcpu_threads(
                &json!([{"cpu-index": 0, "thread-id": 11}, {"cpu-index": 1, "thread-id": 12}])
            ),
            vec![(0, 11), (1, 12)]
        );
    }

    fn testdata(name: &str) -> LauncherSpec {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/argv")
            .join(name);
        serde_json::from_str(&std::fs::read_to_string(path).expect("testdata")).expect("spec")
    }

    #[test]
    fn a_taps_counters_are_the_guests_turned_around() {
        let text = "Inter-|   Receive                            |  Transmit\n \
             face |bytes packets errs drop fifo frame compressed multicast|bytes packets errs drop fifo colls carrier compressed\n    \
             lo: 10 1 0 0 0 0 0 0 10 1 0 0 0 0 0 0\n  \
             tap0: 5000 40 1 2 0 0 0 0 9000 70 3 4 0 0 0 0\n";
        let stats = interfaces(&testdata("masquerade.json"), text);
        assert_eq!(
            stats,
            vec![InterfaceStats {
                name: "default".into(),
                receive_bytes: 9000,
                receive_packets: 70,
                receive_errors: 3,
                receive_dropped: 4,
                transmit_bytes: 5000,
                transmit_packets: 40,
                transmit_errors: 1,
                transmit_dropped: 2,
            }]
        );
    }

    #[test]
    fn block_stats_are_matched_to_disks_by_device_id() {
        let blockstats = json!([
            {"device": "", "qdev": "/machine/peripheral/ua-rootdisk/virtio-backend",
             "stats": {"rd_bytes": 4096, "wr_bytes": 512, "rd_operations": 2, "wr_operations": 1,
                       "flush_operations": 1, "rd_total_time_ns": 2_000_000_000_u64,
                       "wr_total_time_ns": 500_000_000, "flush_total_time_ns": 0}},
            {"device": "", "qdev": "ua-scratch", "stats": {"rd_bytes": 1}},
            {"device": "", "qdev": "/machine/peripheral-anon/device[3]", "stats": {}}
        ]);
        let stats = disks(&testdata("disks-all-buses.json"), &blockstats);
        assert_eq!(stats.len(), 2);
        assert_eq!(stats[0].name, "rootdisk");
        assert_eq!(stats[0].read_bytes, 4096);
        assert_eq!(stats[0].write_operations, 1);
        assert!((stats[0].read_seconds - 2.0).abs() < 1e-9);
        assert_eq!(stats[1].name, "scratch");
        assert_eq!(stats[1].read_bytes, 1);
        assert_eq!(disk_name("ua-x"), Some("x"));
        assert_eq!(
            disk_name("/machine/peripheral/ua-y/virtio-backend"),
            Some("y")
        );
        assert_eq!(disk_name("/machine/peripheral-anon/device[0]"), None);
    }
}
