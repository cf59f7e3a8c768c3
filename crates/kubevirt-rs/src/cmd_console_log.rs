//! `kubevirt-rs guest-console-log`: the launcher pod's `guest-console-log` container
//! (upstream's `virt-tail`): streams the guest's serial log to standard output, so the
//! container's log — `kubectl logs POD -c guest-console-log` — is the guest console.
//!
//! Follows `<pod dir>/guest-console-log.log` (written by QEMU, rotated by the launcher with
//! copy-and-truncate): waits for it to appear, copies what is there and what is appended,
//! and starts again from the beginning when the file shrank. Exits on SIGTERM.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use virt_handler::launcher_spec::SERIAL_LOG_FILE;

/// How often the log is checked for new output.
const POLL: Duration = Duration::from_millis(200);

#[derive(Args)]
pub struct ConsoleLogArgs {
    /// Namespace of the VMI.
    #[arg(long)]
    pub namespace: String,
    /// Name of the VMI.
    #[arg(long)]
    pub name: String,
    /// UID of the VMI.
    #[arg(long)]
    pub uid: String,
    /// The launcher directory (the pod's `public` emptyDir).
    #[arg(long)]
    pub pod_dir: PathBuf,
}

pub fn run(args: ConsoleLogArgs) -> anyhow::Result<()> {
    let path = args.pod_dir.join(SERIAL_LOG_FILE);
    let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let follow = tokio::task::spawn_blocking(move || follow(&path));
        tokio::select! {
            done = follow => done.context("follow task")?,
            () = crate::shutdown_signal() => Ok(()),
        }
    })
}

fn follow(path: &std::path::Path) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    let mut offset = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let Ok(mut file) = std::fs::File::open(path) else {
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
        std::thread::sleep(POLL);
    }
}
