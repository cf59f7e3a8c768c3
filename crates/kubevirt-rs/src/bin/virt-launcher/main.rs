//! `virt-launcher`: the programs of the launcher image, in one small binary (no Kubernetes
//! client, no TLS stack, a current-thread runtime), so every VM's launcher pod costs a few
//! MiB instead of the pages of the whole `kubevirt-rs` binary.
//!
//! What runs is chosen by the name it is started under, as upstream's image has one binary
//! per program:
//! - `virt-launcher` — one VMI's launcher, the `compute` container ([`launcher`]);
//! - `virt-tail` — the `guest-console-log` container, which streams the serial log ([`tail`]);
//! - `virt-probe` — a VMI's `exec` or `guestAgentPing` probe, run in `compute` ([`probe`]).
//!
//! The image store (and `scripts/build-images.sh`) make all three names this file.

use std::ffi::OsString;
use std::path::Path;

use clap::Parser;

mod launcher;
#[path = "../../lifecycle.rs"]
mod lifecycle;
mod probe;
mod tail;

use lifecycle::shutdown_signal;

#[derive(Parser)]
#[command(
    name = "virt-launcher",
    about = "Run one VMI's QEMU (the launcher pod's compute container)",
    version
)]
struct LauncherCli {
    #[command(flatten)]
    args: launcher::LauncherArgs,
}

#[derive(Parser)]
#[command(
    name = "virt-tail",
    about = "Stream a VMI's serial console log",
    version
)]
struct TailCli {
    #[command(flatten)]
    args: tail::ConsoleLogArgs,
}

#[derive(Parser)]
#[command(
    name = "virt-probe",
    about = "Ping a VMI's guest agent or run a probe command in the guest",
    version
)]
struct ProbeCli {
    #[command(flatten)]
    args: probe::VirtProbeArgs,
}

/// The VMI a launcher pod's container serves and the pod directory it shares (the pod's
/// `public` emptyDir as the container sees it: sockets, disks, logs); `virt-launcher` and
/// `virt-tail` take them alike.
#[derive(clap::Args)]
pub struct VmiArgs {
    /// Namespace of the VMI.
    #[arg(long)]
    pub namespace: String,
    /// Name of the VMI.
    #[arg(long)]
    pub name: String,
    /// UID of the VMI.
    #[arg(long)]
    pub uid: String,
    /// The pod directory.
    #[arg(long)]
    pub pod_dir: std::path::PathBuf,
}

/// The program `argv0` names: its file name, whatever directory it was started from.
fn program(argv0: Option<&OsString>) -> String {
    argv0
        .and_then(|a| Path::new(a).file_name())
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn main() -> anyhow::Result<()> {
    lifecycle::init_logging();
    let argv: Vec<OsString> = std::env::args_os().collect();
    match program(argv.first()).as_str() {
        "virt-tail" => tail::run(&TailCli::parse_from(argv).args),
        "virt-probe" => probe::run(&ProbeCli::parse_from(argv).args),
        _ => launcher::run(LauncherCli::parse_from(argv).args),
    }
}

#[cfg(test)]
mod tests {
    use super::program;
    use std::ffi::OsString;

    #[test]
    fn the_program_is_the_file_name_it_was_started_under() {
        let name = |s: &str| program(Some(&OsString::from(s)));
        assert_eq!(name("/usr/bin/virt-probe"), "virt-probe");
        assert_eq!(name("virt-tail"), "virt-tail");
        assert_eq!(name("./virt-launcher"), "virt-launcher");
        assert_eq!(program(None), "");
    }
}
