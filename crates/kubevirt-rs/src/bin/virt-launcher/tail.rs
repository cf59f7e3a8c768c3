//! `virt-tail`: the launcher pod's `guest-console-log` container
//! (upstream's `virt-tail`): streams the guest's serial log to standard output, so the
//! container's log — `kubectl logs POD -c guest-console-log` — is the guest console.
//!
//! Follows `<pod dir>/guest-console-log.log` (written by QEMU, rotated by the launcher with
//! copy-and-truncate): waits for it to appear, copies what is there and what is appended,
//! and starts again from the beginning when the file shrank. Exits on SIGTERM, and once the
//! launcher is gone (its socket refuses connections or was removed after it had been there),
//! after copying the last output, as upstream's container ends with the domain.

use std::io::{Read, Seek, SeekFrom, Write};
use std::time::Duration;

use anyhow::Context;
use clap::Args;

/// How often the log is checked for new output.
const POLL: Duration = Duration::from_millis(200);

#[derive(Args)]
pub struct ConsoleLogArgs {
    #[command(flatten)]
    pub vmi: crate::VmiArgs,
}

pub fn run(args: &ConsoleLogArgs) -> anyhow::Result<()> {
    let layout = virt_launcher::pod_layout::PodLayout::new(&args.vmi.pod_dir);
    let (path, socket) = (layout.serial_log(), layout.launcher_socket());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let follow = tokio::task::spawn_blocking(move || follow(&path, &socket));
        tokio::select! {
            done = follow => done.context("follow task")?,
            () = crate::shutdown_signal() => Ok(()),
        }
    })
}

/// Whether the launcher has been seen and is gone now.
fn launcher_gone(socket: &std::path::Path, seen: &mut bool) -> bool {
    match std::os::unix::net::UnixStream::connect(socket) {
        Ok(_) => {
            *seen = true;
            false
        }
        Err(e) => {
            *seen
                && matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
                )
        }
    }
}

fn follow(path: &std::path::Path, socket: &std::path::Path) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    let mut launcher_seen = false;
    let mut offset = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // Checked before the last copy, so output written before the launcher ended is kept.
        let gone = launcher_gone(socket, &mut launcher_seen);
        let Ok(mut file) = std::fs::File::open(path) else {
            if gone {
                return Ok(());
            }
            std::thread::sleep(POLL);
            continue;
        };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        if len < offset {
            offset = 0;
        }
        file.seek(SeekFrom::Start(offset))
            .with_context(|| format!("seeking in {}", path.display()))?;
        loop {
            let n = file.read(&mut buf).context("reading the serial log")?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n])
                .context("writing the console log")?;
            offset += n as u64;
        }
        out.flush().context("writing the console log")?;
        if gone {
            return Ok(());
        }
        std::thread::sleep(POLL);
    }
}
