//! Running a command inside a running container, as a container runtime's `exec` does for
//! kubelet's `exec` probes: the container's program for `command[0]` from its image, started
//! in the namespaces of the container's main process (network, UTS, mount — so it sees the
//! pod's address, host name and volumes) with the image's environment and the container's
//! plain `env` values.
//!
//! # Guarantees
//! The command runs in a process group of its own; when the caller stops waiting (a probe's
//! timeout drops the future) the whole group is killed and nothing is left running.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// What `exec` needs of one running container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecTarget {
    /// The container's main process (its namespaces are entered).
    pub pid: i32,
    /// `command[0]` as a probe names it → the image's program for it.
    pub programs: BTreeMap<String, PathBuf>,
    /// The environment the command gets.
    pub env: Vec<(String, String)>,
}

/// How an `exec` ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecOutcome {
    /// The exit code (128 + signal when a signal ended it).
    pub exit_code: i32,
    /// What it printed (stdout, then stderr), for the probe's message.
    pub output: String,
}

/// Why an `exec` could not run.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The command is empty.
    #[error("exec: no command")]
    NoCommand,
    /// The image holds no program for `command[0]`.
    #[error("exec: {0:?} is not in the container's image")]
    NoSuchCommand(String),
    /// The container's namespaces could not be opened or the process not started.
    #[error("exec {0:?}")]
    Start(String, #[source] std::io::Error),
}

/// Kills the command's process group unless it has been reaped.
struct GroupGuard(Option<i32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.take() {
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
    }
}

/// Runs `command` in `target` and waits for it.
///
/// # Errors
/// [`ExecError`] when it cannot be started; its own failure is an [`ExecOutcome`].
#[allow(unsafe_code)]
pub async fn exec(target: &ExecTarget, command: &[String]) -> Result<ExecOutcome, ExecError> {
    let (name, args) = command.split_first().ok_or(ExecError::NoCommand)?;
    let base = name.rsplit('/').next().unwrap_or(name);
    let program = target
        .programs
        .get(name)
        .or_else(|| target.programs.get(base))
        .ok_or_else(|| ExecError::NoSuchCommand(name.clone()))?;
    let start = |e| ExecError::Start(name.clone(), e);
    let open = |kind: &str| std::fs::File::open(format!("/proc/{}/ns/{kind}", target.pid));
    let namespaces = [
        (
            open("net").map_err(start)?,
            nix::sched::CloneFlags::CLONE_NEWNET,
        ),
        (
            open("uts").map_err(start)?,
            nix::sched::CloneFlags::CLONE_NEWUTS,
        ),
        (
            open("mnt").map_err(start)?,
            nix::sched::CloneFlags::CLONE_NEWNS,
        ),
    ];
    let mut cmd = tokio::process::Command::new(program);
    cmd.arg0(name)
        .args(args)
        .env_clear()
        .envs(target.env.iter().map(|(k, v)| (k, v)))
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // SAFETY: the closure runs in the forked, single-threaded child before `exec` and only
    // calls `setns` on descriptors opened before the fork; it takes no lock and allocates
    // nothing.
    unsafe {
        cmd.pre_exec(move || {
            for (file, kind) in &namespaces {
                nix::sched::setns(file, *kind)?;
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(start)?;
    let mut guard = GroupGuard(child.id().and_then(|p| i32::try_from(p).ok()));
    let out = child.wait_with_output().await.map_err(start)?;
    guard.0 = None;
    let exit_code = out.status.code().unwrap_or_else(|| {
        use std::os::unix::process::ExitStatusExt as _;
        128 + out.status.signal().unwrap_or(0)
    });
    let mut output = String::from_utf8_lossy(&out.stdout).into_owned();
    output.push_str(&String::from_utf8_lossy(&out.stderr));
    Ok(ExecOutcome { exit_code, output })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh_target() -> ExecTarget {
        ExecTarget {
            pid: i32::try_from(std::process::id()).expect("pid"),
            programs: BTreeMap::from([("sh".to_owned(), PathBuf::from("/bin/sh"))]),
            env: vec![("GREETING".into(), "hello".into())],
        }
    }

    #[tokio::test]
    async fn a_command_runs_with_the_containers_environment_and_reports_its_exit_code() {
        let target = sh_target();
        let ok = exec(
            &target,
            &["sh".into(), "-c".into(), "echo $GREETING; exit 3".into()],
        )
        .await
        .expect("exec");
        assert_eq!(
            ok,
            ExecOutcome {
                exit_code: 3,
                output: "hello\n".into()
            }
        );
        let missing = exec(&target, &["nothing-here".into()]).await;
        assert!(matches!(missing, Err(ExecError::NoSuchCommand(c)) if c == "nothing-here"));
    }

    #[tokio::test]
    async fn a_command_given_up_on_is_killed_with_its_children() {
        let target = sh_target();
        let dir = tempfile::tempdir().expect("tempdir");
        let marker = dir.path().join("child.pid");
        let script = format!("sleep 30 & echo $! > {}; wait", marker.display());
        let command = ["sh".to_owned(), "-c".to_owned(), script];
        let run = exec(&target, &command);
        let given_up = tokio::time::timeout(std::time::Duration::from_millis(500), run).await;
        assert!(given_up.is_err(), "the command outlived the timeout");
        let child: i32 = std::fs::read_to_string(&marker)
            .expect("marker")
            .trim()
            .parse()
            .expect("pid");
        // SIGKILL of the group reaches the background child; once reaped by init it is gone.
        wait_for(|| nix::sys::signal::kill(Pid::from_raw(child), None).is_err());
    }

    /// Polls `done` for up to five seconds (the killed child is reaped asynchronously).
    fn wait_for(done: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "the child survived");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
