//! `virt-probe`: upstream's program of that name, run by kubelet inside the `compute`
//! container for a VMI's `exec` and `guestAgentPing` probes. It asks the launcher of the pod
//! (its command socket in the pod directory) to ping the guest agent or to run the command
//! in the guest through it, and exits 0 when that succeeded — the probe's verdict. Flags are
//! upstream's (`--domainName`, `--timeoutSeconds`, `--guestAgentPing`, `--command C -- ARGS`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use virt_launcher::pod_layout::PodLayout;
use virt_launcher::protocol::{Command, GuestExecResult, LauncherClient};

#[derive(Args)]
pub struct VirtProbeArgs {
    /// The domain, `<namespace>_<name>` (reported in messages).
    #[arg(long = "domainName")]
    pub domain_name: String,
    /// How long the probe may take.
    #[arg(long = "timeoutSeconds", default_value_t = 1)]
    pub timeout_seconds: u64,
    /// Ping the guest agent.
    #[arg(long = "guestAgentPing", conflicts_with = "command")]
    pub guest_agent_ping: bool,
    /// The program to run in the guest.
    #[arg(long, required_unless_present = "guest_agent_ping")]
    pub command: Option<String>,
    /// Its arguments (after `--`).
    #[arg(last = true)]
    pub args: Vec<String>,
    /// The launcher directory, as the compute container sees it.
    #[arg(long, default_value = "/var/run/kubevirt")]
    pub pod_dir: PathBuf,
}

pub fn run(args: &VirtProbeArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let timeout = Duration::from_secs(args.timeout_seconds.max(1));
    runtime
        .block_on(async { tokio::time::timeout(timeout, probe(args)).await })
        .map_err(|_| {
            anyhow::anyhow!(
                "probe of {} timed out after {} s",
                args.domain_name,
                timeout.as_secs()
            )
        })?
}

async fn probe(args: &VirtProbeArgs) -> anyhow::Result<()> {
    let socket = PodLayout::new(&args.pod_dir).launcher_socket();
    let mut launcher = LauncherClient::connect(&socket)
        .await
        .with_context(|| format!("connecting to the launcher of {}", args.domain_name))?;
    let command = match &args.command {
        Some(program) if !args.guest_agent_ping => Command::GuestExec {
            command: std::iter::once(program.clone())
                .chain(args.args.iter().cloned())
                .collect(),
            timeout_seconds: args.timeout_seconds.max(1),
        },
        _ => Command::GuestPing,
    };
    let answer = launcher
        .request(command)
        .await
        .context("talking to the launcher")?
        .map_err(|message| anyhow::anyhow!("{}: {message}", args.domain_name))?;
    if args.guest_agent_ping {
        return Ok(());
    }
    let result: GuestExecResult =
        serde_json::from_value(answer).context("the launcher's answer")?;
    if result.exit_code != 0 {
        bail!(
            "command exited with {} in {}: {}",
            result.exit_code,
            args.domain_name,
            result.output.trim()
        );
    }
    print!("{}", result.output);
    Ok(())
}
