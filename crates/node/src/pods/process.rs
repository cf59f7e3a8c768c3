//! Host processes for pod containers: start in their own process group, record, re-adopt, stop.
//!
//! Each container runs in a new process group that it leads (its pid is the group id; set
//! at spawn, so there is no window where the group does not exist yet), detached from the
//! server's group: a Ctrl-C or a kill of the server does not reach it, so it survives a
//! restart of the server, and stopping the group stops everything the container started
//! (the launcher keeps QEMU in its group). The runner records
//! the pid and the process start time (from `/proc/<pid>/stat`, to detect pid reuse) in
//! `<pod dir>/<container>.json`; after a restart it re-adopts every record whose process is
//! still the same. While the runner is the parent it learns the exit code from `wait`; for a
//! re-adopted process that has gone it reports `ContainerStatusUnknown` (exit code 137), as
//! kubelet does when it cannot know.
//!
//! The pod directory is created `0700`, logs and records `0600`, and the container runs with
//! umask `077`, so everything it creates there (sockets, disks, logs) is owner-only too.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::stat::{Mode, umask};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// Errors of process management.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// Creating the pod's state directory or log file failed.
    #[error("preparing {path}")]
    Prepare {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Spawning the container's program failed.
    #[error("starting {program}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    /// Writing the process record failed; the started process (pid `pid`) and its group were
    /// killed and reaped, so no unrecorded container keeps running.
    #[error("recording process {pid} in {path} (the process was killed)")]
    Record {
        path: PathBuf,
        pid: i32,
        #[source]
        source: std::io::Error,
    },
}

/// What the runner remembers of a started container, on disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessRecord {
    pub pid: i32,
    /// Field 22 of `/proc/<pid>/stat` at start: tells a re-used pid from ours.
    pub start_ticks: u64,
    /// RFC 3339 time the container started.
    pub started_at: String,
    /// How often the container was restarted before this run.
    #[serde(default)]
    pub restart_count: u32,
}

/// How a container ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExitRecord {
    pub exit_code: i32,
    /// `Completed`, `Error`, `OOMKilled` or `ContainerStatusUnknown`.
    pub reason: String,
    pub finished_at: String,
}

/// The files of one container under its pod directory.
#[derive(Clone, Debug)]
pub struct ContainerPaths {
    pub record: PathBuf,
    pub exit: PathBuf,
    pub log: PathBuf,
}

impl ContainerPaths {
    pub fn new(pod_dir: &Path, container: &str) -> ContainerPaths {
        ContainerPaths {
            record: pod_dir.join(format!("{container}.json")),
            exit: pod_dir.join(format!("{container}.exit")),
            log: pod_dir.join(format!("{container}.log")),
        }
    }
}

/// The start time (clock ticks since boot) of `pid`, if it runs.
pub fn start_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces.
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(19)?.parse().ok()
}

/// Whether the recorded process is still the one we started (and not a zombie).
pub fn is_alive(record: &ProcessRecord) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", record.pid)) else {
        return false;
    };
    let Some(close) = stat.rfind(')') else {
        return false;
    };
    let state = stat[close + 2..].chars().next();
    state != Some('Z') && start_ticks(record.pid) == Some(record.start_ticks)
}

/// Writes `value` as JSON to `path` atomically, owner-only.
pub(crate) fn write_json<T: Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    private_fs::write_atomic(path, &bytes)
}

/// Gives the container process the umask `077`, so whatever it creates in its pod directory
/// (sockets, disks, logs; QEMU inherits it) is owner-only whatever the runner's umask.
#[allow(unsafe_code)]
fn private_umask(command: &mut tokio::process::Command) {
    // SAFETY: the closure runs in the forked child before `exec` and only makes the
    // async-signal-safe system call `umask`; it takes no lock and does not allocate.
    unsafe {
        command.pre_exec(|| {
            umask(Mode::from_bits_truncate(private_fs::CHILD_UMASK));
            Ok(())
        });
    }
}

/// A volume bind-mounted into the container's private mount namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindMount {
    /// The host path (a directory or a file).
    pub source: PathBuf,
    /// Where the container sees it.
    pub target: PathBuf,
    pub read_only: bool,
}

/// The isolation a container process gets: its `argv[0]`, its own mount namespace with the
/// pod's volumes at their `mountPath`s, and the pod's network namespace.
#[derive(Clone, Debug, Default)]
pub struct Sandbox {
    /// `argv[0]` as the pod spec wrote it (the program itself when `None`).
    pub argv0: Option<String>,
    /// Volumes to mount; with none the process shares the host's mount namespace.
    pub mounts: Vec<BindMount>,
    /// The pod's network namespace (a `/run/netns/<name>`-style file), if it has one.
    pub netns: Option<PathBuf>,
    /// The host name the process sees in a UTS namespace of its own (kubelet gives a pod
    /// not in the host's network its `spec.hostname`, else its name); `None` shares the host's.
    pub hostname: Option<String>,
}

/// Creates the mount points of `mounts` on the host file system: without a private root
/// (the container sees the host's files, see the ADR on pod isolation) a bind mount needs
/// an existing target. A directory for a directory source, an empty file for a file.
///
/// A mount below an earlier one (a claim at `/path/vol` in a volume at `/path`, as in a
/// hotplug attachment pod) lands on what the earlier mount shows there, so its mount point is
/// created in the earlier mount's source instead — as a container runtime creates it inside
/// the mounted volume.
fn create_mount_points(mounts: &[BindMount]) -> std::io::Result<()> {
    for (i, m) in mounts.iter().enumerate() {
        let target = mounts[..i]
            .iter()
            .rev()
            .find_map(|outer| {
                let rest = m.target.strip_prefix(&outer.target).ok()?;
                let plain = rest
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)));
                (plain && !rest.as_os_str().is_empty() && outer.source.is_dir())
                    .then(|| outer.source.join(rest))
            })
            .unwrap_or_else(|| m.target.clone());
        if m.source.is_dir() {
            std::fs::create_dir_all(&target)?;
        } else if !target.exists() {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&target)?;
        }
    }
    Ok(())
}

/// Enters the pod's network namespace and a private mount namespace with the volumes, in the
/// forked child before `exec`.
#[allow(unsafe_code)]
fn isolate(command: &mut tokio::process::Command, sandbox: &Sandbox) -> std::io::Result<()> {
    let netns = match &sandbox.netns {
        Some(path) => Some(std::fs::File::open(path)?),
        None => None,
    };
    create_mount_points(&sandbox.mounts)?;
    let mounts = sandbox.mounts.clone();
    let hostname = sandbox.hostname.clone();
    // SAFETY: the closure runs in the forked child before `exec`. It calls `setns`,
    // `unshare`, `sethostname` and `mount` only, with paths, names and files prepared before
    // the fork (nix turns short paths into C strings on the stack), and takes no lock.
    unsafe {
        command.pre_exec(move || {
            if let Some(ns) = &netns {
                nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)?;
            }
            if let Some(name) = &hostname {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUTS)?;
                nix::unistd::sethostname(name)?;
            }
            if mounts.is_empty() {
                return Ok(());
            }
            use nix::mount::{MsFlags, mount};
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
            mount(
                None::<&str>,
                "/",
                None::<&str>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&str>,
            )?;
            for m in &mounts {
                mount(
                    Some(&m.source),
                    &m.target,
                    None::<&str>,
                    MsFlags::MS_BIND | MsFlags::MS_REC,
                    None::<&str>,
                )?;
                if m.read_only {
                    mount(
                        None::<&str>,
                        &m.target,
                        None::<&str>,
                        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
                        None::<&str>,
                    )?;
                }
            }
            Ok(())
        });
    }
    Ok(())
}

pub fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Starts `program args` in a new session with its output in `paths.log`. Returns the child
/// handle (to learn the exit code) and the record written to disk.
///
/// # Guarantees
/// When the record cannot be written the child's process group is killed and the child
/// reaped before the error returns: a container without a record would be started again on
/// the next pass, and the first one would run on, unsupervised.
pub async fn spawn(
    program: &Path,
    args: &[String],
    env: &[(String, String)],
    paths: &ContainerPaths,
    sandbox: &Sandbox,
    restart_count: u32,
) -> Result<(tokio::process::Child, ProcessRecord), ProcessError> {
    let prepare = |path: &Path, source| ProcessError::Prepare {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = paths.log.parent() {
        private_fs::create_dir_all(dir).map_err(|e| prepare(dir, e))?;
    }
    let log = private_fs::open_append(&paths.log).map_err(|e| prepare(&paths.log, e))?;
    let log_err = log.try_clone().map_err(|e| prepare(&paths.log, e))?;
    let mut command = tokio::process::Command::new(program);
    if let Some(argv0) = &sandbox.argv0 {
        command.arg0(argv0);
    }
    command
        .env_clear()
        .args(args)
        .process_group(0)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .kill_on_drop(false);
    private_umask(&mut command);
    isolate(&mut command, sandbox).map_err(|e| prepare(&paths.record, e))?;
    let child = command.spawn().map_err(|source| ProcessError::Spawn {
        program: program.display().to_string(),
        source,
    })?;
    let pid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
    let record = ProcessRecord {
        pid,
        start_ticks: start_ticks(pid).unwrap_or(0),
        started_at: crate::now_rfc3339(),
        restart_count,
    };
    let _ = std::fs::remove_file(&paths.exit);
    if let Err(source) = write_json(&paths.record, &record) {
        let mut child = child;
        if pid > 0 {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = child.start_kill();
        let _ = child.wait().await;
        return Err(ProcessError::Record {
            path: paths.record.clone(),
            pid,
            source,
        });
    }
    Ok((child, record))
}

/// Records how a container ended (called by the waiter, or for a vanished re-adopted one).
pub fn record_exit(paths: &ContainerPaths, exit: &ExitRecord) {
    if let Err(e) = write_json(&paths.exit, exit) {
        tracing::warn!(path = %paths.exit.display(), error = %e, "cannot record container exit");
    }
}

/// The exit record for a wait status.
pub fn exit_from_status(status: std::process::ExitStatus) -> ExitRecord {
    use std::os::unix::process::ExitStatusExt;
    let exit_code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(9));
    ExitRecord {
        exit_code,
        reason: if exit_code == 0 {
            "Completed".into()
        } else {
            "Error".into()
        },
        finished_at: crate::now_rfc3339(),
    }
}

/// Sends `signal` to the container's main process only, as kubelet's stop does (its
/// children — QEMU of a launcher — are the main process's to stop).
pub fn signal_main(record: &ProcessRecord, signal: Signal) {
    if record.pid > 0 && is_alive(record) {
        let _ = kill(Pid::from_raw(record.pid), signal);
    }
}

/// Whether any process of the container's process group is left.
pub fn group_alive(record: &ProcessRecord) -> bool {
    record.pid > 0 && killpg(Pid::from_raw(record.pid), None).is_ok()
}

/// Sends `signal` to the container's whole process group (what is left after the grace
/// period).
pub fn signal_group(record: &ProcessRecord, signal: Signal) {
    if group_alive(record) {
        let _ = killpg(Pid::from_raw(record.pid), signal);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_mount_below_another_gets_its_mount_point_inside_the_outer_source() {
        let tmp = tempfile::tempdir().unwrap();
        let (outer, inner) = (tmp.path().join("outer-src"), tmp.path().join("inner-src"));
        std::fs::create_dir_all(&outer).unwrap();
        std::fs::create_dir_all(&inner).unwrap();
        let root = tmp.path().join("root");
        let mount = |source: &std::path::Path, target: &str| super::BindMount {
            source: source.to_owned(),
            target: root.join(target),
            read_only: false,
        };
        let escape = mount(&inner, "path/../elsewhere");
        super::create_mount_points(&[mount(&outer, "path"), mount(&inner, "path/vol"), escape])
            .unwrap();
        assert!(
            outer.join("vol").is_dir(),
            "created where the outer mount shows it"
        );
        assert!(!root.join("path/vol").exists());
        assert!(
            !outer.join("../elsewhere").exists(),
            "never outside the outer source"
        );
    }

    use super::*;

    #[tokio::test]
    async fn a_spawned_process_is_recorded_alive_and_its_exit_code_is_known() {
        let dir = tempfile::tempdir().expect("tempdir");
        let paths = ContainerPaths::new(dir.path(), "compute");
        let (mut child, record) = spawn(
            Path::new("/bin/sh"),
            &["-c".into(), "echo hello; exit 3".into()],
            &[],
            &paths,
            &Sandbox::default(),
            0,
        )
        .await
        .expect("spawn");
        assert!(record.pid > 0);
        let status = child.wait().await.expect("wait");
        let exit = exit_from_status(status);
        assert_eq!(exit.exit_code, 3);
        assert_eq!(exit.reason, "Error");
        assert!(!is_alive(&record), "the process has exited");
        assert_eq!(std::fs::read_to_string(&paths.log).expect("log"), "hello\n");
        let saved: ProcessRecord = read_json(&paths.record).expect("record");
        assert_eq!(saved, record);
    }

    #[tokio::test]
    async fn signalling_the_group_stops_the_process_and_its_children() {
        let dir = tempfile::tempdir().expect("tempdir");
        let paths = ContainerPaths::new(dir.path(), "compute");
        let (mut child, record) = spawn(
            Path::new("/bin/sh"),
            &["-c".into(), "sleep 600 & wait".into()],
            &[],
            &paths,
            &Sandbox::default(),
            0,
        )
        .await
        .expect("spawn");
        assert!(is_alive(&record));
        signal_group(&record, Signal::SIGKILL);
        let status = child.wait().await.expect("wait");
        assert_eq!(exit_from_status(status).exit_code, 137);
    }

    #[test]
    fn a_reused_pid_is_not_mistaken_for_ours() {
        let me = i32::try_from(std::process::id()).expect("pid");
        let ticks = start_ticks(me).expect("own stat");
        let ours = ProcessRecord {
            pid: me,
            start_ticks: ticks,
            started_at: String::new(),
            restart_count: 0,
        };
        assert!(is_alive(&ours));
        let other = ProcessRecord {
            start_ticks: ticks + 1,
            ..ours
        };
        assert!(!is_alive(&other));
    }

    #[tokio::test]
    async fn a_container_whose_record_cannot_be_written_is_killed_not_left_running() {
        let dir = tempfile::tempdir().expect("tempdir");
        let paths = ContainerPaths::new(dir.path(), "compute");
        // A directory where the record goes: renaming the record over it fails.
        std::fs::create_dir_all(paths.record.join("occupied")).expect("block the record");
        let err = spawn(
            Path::new("/bin/sh"),
            &["-c".into(), "sleep 600 & wait".into()],
            &[],
            &paths,
            &Sandbox::default(),
            0,
        )
        .await
        .expect_err("the record cannot be written");
        let ProcessError::Record { pid, .. } = err else {
            panic!("unexpected error {err}");
        };
        assert!(pid > 0);
        // Killed and reaped by `spawn`: the pid no longer names a live process of ours.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            !stat.contains("(sh)"),
            "the unrecorded container still runs: {stat}"
        );
    }

    #[tokio::test]
    async fn pod_directories_logs_records_and_container_files_are_private_under_a_permissive_umask()
    {
        use std::os::unix::fs::PermissionsExt;
        nix::sys::stat::umask(Mode::empty());
        let mode = |p: &Path| {
            std::fs::symlink_metadata(p)
                .expect("metadata")
                .permissions()
                .mode()
                & 0o777
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let pod = dir.path().join("pods/uid-1");
        let paths = ContainerPaths::new(&pod, "compute");
        let made = pod.join("made-by-the-container");
        let (mut child, _) = spawn(
            Path::new("/bin/sh"),
            &["-c".into(), format!("echo disk > {}", made.display())],
            &[],
            &paths,
            &Sandbox::default(),
            0,
        )
        .await
        .expect("spawn");
        let status = child.wait().await.expect("wait");
        record_exit(&paths, &exit_from_status(status));
        assert_eq!(mode(&pod), 0o700);
        assert_eq!(mode(&paths.log), 0o600);
        assert_eq!(mode(&paths.record), 0o600);
        assert_eq!(mode(&paths.exit), 0o600);
        assert_eq!(mode(&made), 0o600);
    }
}
