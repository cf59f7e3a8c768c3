//! Measures the launcher's own memory beside a running guest.
//!
//! Runs the launcher on a single-threaded runtime (as the `launcher` subcommand is meant
//! to), drives it in-process to boot the test guest under TCG, and prints the process's
//! RSS while the guest runs, the boot time to `GUEST-READY`, and QEMU's RSS.
//!
//! Usage: `cargo run --release -p virt-launcher --example launcher_rss -- GUEST_DIR`
//! (GUEST_DIR holds `vmlinux` and `initramfs.cpio.gz` from `scripts/build-test-guest.sh`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use virt_launcher::protocol::{Command, LauncherClient, UpMessage};
use virt_launcher::spec::LauncherSpec;
use virt_launcher::{LauncherOptions, run_launcher};

fn rss_kib(pid: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .map_or_else(|| "unknown".to_owned(), |v| v.trim().to_owned())
}

fn spec(dir: &Path, guest: &Path) -> anyhow::Result<LauncherSpec> {
    let p = |name: &str| dir.join(name).display().to_string();
    Ok(serde_json::from_value(serde_json::json!({
        "vmi": {"name": "rss", "namespace": "default", "uid": "rss"},
        "accel": "tcg",
        "tcgTranslationCacheMib": 32,
        "cpu": {"sockets": 1, "cores": 1, "threads": 1},
        "memory": {"guestBytes": 128u64 << 20},
        "firmware": {"kernelBoot": {
            "kernelPath": guest.join("vmlinux").display().to_string(),
            "initrdPath": guest.join("initramfs.cpio.gz").display().to_string(),
            "kernelArgs": "console=ttyS0 panic=-1 quiet tg.quiet=1"
        }},
        "paths": {"serialConsoleSocket": p("serial.sock"), "serialLog": p("serial.log"),
                  "qmpSocket": p("qmp.sock"), "pidFile": p("qemu.pid")}
    }))?)
}

fn main() -> anyhow::Result<()> {
    let guest = PathBuf::from(
        std::env::args()
            .nth(1)
            .ok_or_else(|| anyhow::anyhow!("usage: launcher_rss GUEST_DIR"))?,
    );
    let dir = tempfile::tempdir()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut opts = LauncherOptions::new(dir.path().join("launcher.sock"));
        opts.linger = Duration::from_secs(2);
        let socket = opts.socket_path.clone();
        let launcher = tokio::spawn(run_launcher(opts));
        while !socket.exists() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut client = LauncherClient::connect(&socket).await?;
        let started = Instant::now();
        let ack = client
            .request(Command::Sync(Box::new(spec(dir.path(), &guest)?)))
            .await?;
        let status: virt_launcher::protocol::DomainStatus =
            serde_json::from_value(ack.map_err(anyhow::Error::msg)?)?;
        let qemu_pid = status
            .qemu_pid
            .ok_or_else(|| anyhow::anyhow!("no QEMU pid"))?;
        let log = dir.path().join("serial.log");
        let deadline = Instant::now() + Duration::from_secs(90);
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("GUEST-READY")
        {
            anyhow::ensure!(Instant::now() < deadline, "guest did not boot");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!(
            "boot to GUEST-READY: {:.2} s",
            started.elapsed().as_secs_f64()
        );
        tokio::time::sleep(Duration::from_secs(2)).await; // let RSS settle before reading it
        println!("launcher RSS: {}", rss_kib("self"));
        println!("QEMU RSS:     {}", rss_kib(&qemu_pid.to_string()));
        client
            .request(Command::Shutdown {
                grace_period_seconds: 30,
            })
            .await?
            .map_err(anyhow::Error::msg)?;
        loop {
            if let UpMessage::Domain(s) = client.next_event().await?
                && s.is_final()
            {
                println!("final state: {:?} / {:?}", s.state, s.reason);
                break;
            }
        }
        launcher.await??;
        Ok(())
    })
}
