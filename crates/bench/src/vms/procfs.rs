//! Process memory from `/proc`: RSS of a pid, and QEMU's RSS split into guest RAM, the TCG
//! translation cache and the rest (from `/proc/<pid>/smaps`).

use std::path::Path;

/// `VmRSS` of `pid` in KiB, if the process exists.
pub fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

/// `RssAnon` of `pid` in KiB: the private part of its RSS (file pages of the shared
/// `kubevirt-rs` binary are left out).
pub fn rss_anon_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "RssAnon:")
}

/// `Pss` of `pid` in KiB (`/proc/<pid>/smaps_rollup`): its private pages plus its share of
/// the pages it shares, so a binary mapped by a hundred launchers counts a hundredth in each.
pub fn pss_kib(pid: u32) -> Option<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    rollup
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// How long ago `pid` was started (from its start time in `/proc/<pid>/stat` against
/// `/proc/uptime`: 10 ms resolution at the usual 100 ticks a second).
pub fn started_ago(pid: u32) -> Option<std::time::Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) start at field 3: `starttime` is 22.
    let after_comm = &stat[stat.rfind(')')? + 2..];
    let ticks: u64 = after_comm.split_whitespace().nth(22 - 3)?.parse().ok()?;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|hz| *hz > 0)
        .unwrap_or(100);
    let started = ticks as f64 / hz as f64;
    Some(std::time::Duration::from_secs_f64(
        (uptime - started).max(0.0),
    ))
}

/// The pid in `path` (a QEMU pid file or a pod runner record with a `pid` field).
pub fn pid_from_file(path: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(path).ok()?;
    if let Ok(n) = text.trim().parse::<u32>() {
        return Some(n);
    }
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()?
        .get("pid")?
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
}

/// QEMU's resident memory, split by mapping.
#[derive(Clone, Copy, Debug, Default)]
pub struct QemuMemory {
    /// Total RSS.
    pub rss_kib: u64,
    /// Resident part of the guest RAM mapping (guest memory actually touched).
    pub guest_kib: u64,
    /// Resident part of executable anonymous mappings: TCG's translation cache (KVM has none).
    pub tcg_kib: u64,
}

impl QemuMemory {
    /// RSS minus touched guest RAM.
    pub fn overhead_kib(&self) -> u64 {
        self.rss_kib.saturating_sub(self.guest_kib)
    }
}

/// Reads `/proc/<pid>/smaps`: the guest RAM is the anonymous mapping of exactly
/// `guest_mib` MiB; the TCG translation cache is the anonymous executable (`rwx`) mapping.
pub fn qemu_memory(pid: u32, guest_mib: u64) -> Option<QemuMemory> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    Some(parse_smaps(&smaps, guest_mib))
}

fn parse_smaps(smaps: &str, guest_mib: u64) -> QemuMemory {
    let mut memory = QemuMemory::default();
    let (mut anonymous, mut executable, mut size) = (false, false, 0u64);
    let mut guest_taken = false;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or_default();
        if first.contains('-') && !first.ends_with(':') {
            // A mapping header: "start-end perms offset dev inode [path]".
            let perms = fields.next().unwrap_or_default();
            let path = fields.nth(3);
            executable = perms.contains('x') && perms.contains('w');
            anonymous = path.is_none();
            size = 0;
        } else if first == "Size:" {
            size = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        } else if first == "Rss:" {
            let rss: u64 = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            memory.rss_kib += rss;
            if anonymous && !guest_taken && guest_mib > 0 && size == guest_mib * 1024 {
                memory.guest_kib += rss;
                guest_taken = true;
            } else if anonymous && executable {
                memory.tcg_kib += rss;
            }
        }
    }
    memory
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaps_split_guest_ram_and_translation_cache() {
        let smaps = "\
55d0-55d1 r-xp 00000000 08:01 123 /usr/bin/qemu-system-x86_64
Size:               4096 kB
Rss:                2000 kB
7f00-7f01 rw-p 00000000 00:00 0
Size:             131072 kB
Rss:               20000 kB
7f02-7f03 rwxp 00000000 00:00 0
Size:              32768 kB
Rss:                9000 kB
7f04-7f05 rw-p 00000000 00:00 0
Size:               8192 kB
Rss:                 500 kB
";
        let m = parse_smaps(smaps, 128);
        assert_eq!(m.rss_kib, 31_500);
        assert_eq!(m.guest_kib, 20_000);
        assert_eq!(m.tcg_kib, 9_000);
        assert_eq!(m.overhead_kib(), 11_500);
    }
}
