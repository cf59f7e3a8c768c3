use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::protocol::{Command, DomainState, DomainStatus, LauncherClient, StateReason, UpMessage};
use crate::spec::{
    Accel, Cpu, CpuModel, Disk, Firmware, Graphics, KernelBoot, LauncherSpec, Memory, RuntimePaths,
    VideoModel, VmiIdentity,
};
use crate::test_support::{ProcessGroupGuard, wait_until};
use test_prerequisites::{available, guest_reports, qemu_binary, test_guest};

fn spec_in(dir: &Path, kernel: Option<(PathBuf, PathBuf)>) -> LauncherSpec {
    let path = |name: &str| dir.join(name).to_string_lossy().into_owned();
    LauncherSpec {
        vmi: VmiIdentity {
            name: "testvm".into(),
            namespace: "default".into(),
            uid: "u1".into(),
        },
        machine_type: "q35".into(),
        accel: Accel::Tcg,
        tcg_translation_cache_mib: Some(32),
        cpu: Cpu {
            sockets: 1,
            cores: 1,
            threads: 1,
            max_sockets: None,
            model: CpuModel::HostPassthrough,
            features: vec![],
            tsc_frequency: None,
        },
        memory: Memory {
            guest_bytes: 128 << 20,
            max_guest_bytes: None,
            hotplugged_bytes: 0,
            hugepages: None,
        },
        firmware: Firmware {
            kernel_boot: kernel.map(|(k, i)| KernelBoot {
                kernel_path: k.to_string_lossy().into_owned(),
                initrd_path: Some(i.to_string_lossy().into_owned()),
                kernel_args: "console=ttyS0 panic=-1 quiet tg.quiet=1".into(),
            }),
            ..Firmware::default()
        },
        disks: vec![],
        interfaces: vec![],
        hotplug_ports: 1,
        graphics: None,
        paths: RuntimePaths {
            serial_console_socket: path("serial.sock"),
            serial_log: path("serial.log"),
            qmp_socket: path("qmp.sock"),
            pid_file: path("qemu.pid"),
        },
    }
}

fn options(dir: &Path) -> LauncherOptions {
    let mut opts = LauncherOptions::new(dir.join("launcher.sock"));
    opts.linger = Duration::from_secs(5);
    opts
}

async fn connect(socket: &Path) -> LauncherClient {
    assert!(
        wait_until(Duration::from_secs(5), || socket.exists()).await,
        "launcher socket missing"
    );
    LauncherClient::connect(socket).await.unwrap()
}

async fn next_domain(client: &mut LauncherClient) -> DomainStatus {
    match tokio::time::timeout(Duration::from_secs(60), client.next_event()).await {
        Ok(Ok(UpMessage::Domain(status))) => status,
        Ok(Ok(other)) => panic!("unexpected message {other:?}"),
        Ok(Err(e)) => panic!("connection failed: {e}"),
        Err(_) => panic!("no domain event within 60 s"),
    }
}

fn status_of(ack: Result<serde_json::Value, String>) -> DomainStatus {
    serde_json::from_value(ack.unwrap()).unwrap()
}

#[tokio::test]
async fn fake_qemu_runs_pauses_and_shuts_down_over_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path());
    opts.fake_qemu = true;
    let socket = opts.socket_path.clone();
    let launcher = tokio::spawn(run_launcher(opts));
    let mut client = connect(&socket).await;
    assert_eq!(next_domain(&mut client).await.state, DomainState::Pending);

    let ack = client
        .request(Command::Sync(Box::new(spec_in(dir.path(), None))))
        .await
        .unwrap();
    assert_eq!(status_of(ack).state, DomainState::Running);
    assert_eq!(next_domain(&mut client).await.state, DomainState::Running);

    client.request(Command::Pause).await.unwrap().unwrap();
    let paused = next_domain(&mut client).await;
    assert_eq!(
        (paused.state, paused.reason),
        (DomainState::Paused, StateReason::User)
    );
    client.request(Command::Unpause).await.unwrap().unwrap();
    assert_eq!(next_domain(&mut client).await.state, DomainState::Running);

    client
        .request(Command::Shutdown {
            grace_period_seconds: 1,
        })
        .await
        .unwrap()
        .unwrap();
    let off = next_domain(&mut client).await;
    assert_eq!(
        (off.state, off.reason),
        (DomainState::Shutoff, StateReason::GuestShutdown)
    );
    tokio::time::timeout(Duration::from_secs(5), launcher)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!socket.exists(), "the launcher removes its socket");
    let recorded: DomainStatus = serde_json::from_slice(
        &std::fs::read(dir.path().join(crate::protocol::FINAL_STATE_FILE)).unwrap(),
    )
    .unwrap();
    assert_eq!(
        recorded.state,
        DomainState::Shutoff,
        "the final state is left behind"
    );
}

#[tokio::test]
async fn a_fake_domain_migrates_from_one_launcher_to_another_through_their_sockets() {
    let (source_dir, target_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut launchers = Vec::new();
    let mut clients = Vec::new();
    for dir in [&source_dir, &target_dir] {
        let mut opts = options(dir.path());
        opts.fake_qemu = true;
        let socket = opts.socket_path.clone();
        launchers.push(tokio::spawn(run_launcher(opts)));
        let mut client = connect(&socket).await;
        assert_eq!(next_domain(&mut client).await.state, DomainState::Pending);
        clients.push(client);
    }
    let (mut source, mut target) = (clients.remove(0), clients.remove(0));
    source
        .request(Command::Sync(Box::new(spec_in(source_dir.path(), None))))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next_domain(&mut source).await.state, DomainState::Running);
    let incoming = target_dir.path().join("migration-target.sock");
    let ack = target
        .request(Command::Receive {
            spec: Box::new(spec_in(target_dir.path(), None)),
            socket: incoming.display().to_string(),
            block_socket: None,
            block_disks: Vec::new(),
            post_copy: false,
        })
        .await
        .unwrap();
    let waiting = status_of(ack);
    assert_eq!(
        (waiting.state, waiting.reason),
        (DomainState::Paused, StateReason::Migration)
    );
    assert_eq!(
        next_domain(&mut target).await.reason,
        StateReason::Migration
    );
    source
        .request(Command::Migrate {
            uri: format!("unix:{}", incoming.display()),
            progress_timeout_seconds: 150,
            completion_timeout_seconds: 150,
            bandwidth_bytes_per_second: 0,
            block_socket: None,
            block_disks: Vec::new(),
            auto_converge: false,
            post_copy: false,
        })
        .await
        .unwrap()
        .unwrap();
    let arrived = next_domain(&mut target).await;
    assert_eq!(
        (arrived.state, arrived.reason),
        (DomainState::Running, StateReason::Migrated)
    );
    let gone = loop {
        let status = next_domain(&mut source).await;
        if status.is_final() {
            break status;
        }
    };
    assert_eq!(
        (gone.state, gone.reason),
        (DomainState::Shutoff, StateReason::Migrated)
    );
    assert_eq!(
        gone.migration.map(|m| m.state),
        Some(crate::protocol::MigrationJobState::Completed)
    );
    let source_launcher = launchers.remove(0);
    tokio::time::timeout(Duration::from_secs(10), source_launcher)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    target.request(Command::Kill).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_reconnecting_handler_first_learns_the_current_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path());
    opts.fake_qemu = true;
    let socket = opts.socket_path.clone();
    let launcher = tokio::spawn(run_launcher(opts));
    let mut first = connect(&socket).await;
    first
        .request(Command::Sync(Box::new(spec_in(dir.path(), None))))
        .await
        .unwrap()
        .unwrap();
    drop(first);

    let mut second = connect(&socket).await;
    assert_eq!(next_domain(&mut second).await.state, DomainState::Running);
    let again = second
        .request(Command::Sync(Box::new(spec_in(dir.path(), None))))
        .await
        .unwrap();
    assert_eq!(
        status_of(again).state,
        DomainState::Running,
        "sync is idempotent"
    );
    second.request(Command::Kill).await.unwrap().unwrap();
    let off = next_domain(&mut second).await;
    assert_eq!(
        (off.state, off.reason),
        (DomainState::Shutoff, StateReason::Destroyed)
    );
    tokio::time::timeout(Duration::from_secs(5), launcher)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn commands_before_sync_and_impossible_specs_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path());
    opts.fake_qemu = true;
    let socket = opts.socket_path.clone();
    let launcher = tokio::spawn(run_launcher(opts));
    let mut client = connect(&socket).await;
    let err = client.request(Command::Pause).await.unwrap().unwrap_err();
    assert!(err.contains("sync first"), "{err}");
    let mut spec = spec_in(dir.path(), None);
    spec.memory.max_guest_bytes = Some(1 << 20);
    let err = client
        .request(Command::Sync(Box::new(spec)))
        .await
        .unwrap()
        .unwrap_err();
    assert!(err.contains("maxGuest"), "{err}");
    let status = status_of(client.request(Command::Status).await.unwrap());
    assert_eq!(status.state, DomainState::Pending);
    launcher.abort();
}

#[tokio::test]
async fn paths_through_a_symlink_are_refused_when_a_base_dir_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("vmlinux"), b"k").unwrap();
    std::fs::write(outside.path().join("initrd"), b"i").unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.path().join("boot")).unwrap();
    let mut opts = options(dir.path());
    opts.fake_qemu = true;
    opts.base_dir = Some(dir.path().to_owned());
    let socket = opts.socket_path.clone();
    let launcher = tokio::spawn(run_launcher(opts));
    let mut client = connect(&socket).await;
    let boot = dir.path().join("boot");
    let spec = spec_in(
        dir.path(),
        Some((boot.join("vmlinux"), boot.join("initrd"))),
    );
    let err = client
        .request(Command::Sync(Box::new(spec)))
        .await
        .unwrap()
        .unwrap_err();
    assert!(err.contains("is a symlink"), "{err}");
    launcher.abort();
}

#[tokio::test]
async fn a_qemu_that_cannot_start_is_reported_crashed_with_its_error() {
    let Some(qemu) = available(qemu_binary()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path());
    opts.qemu_binary = qemu;
    let socket = opts.socket_path.clone();
    let launcher = tokio::spawn(run_launcher(opts));
    let mut client = connect(&socket).await;
    assert_eq!(next_domain(&mut client).await.state, DomainState::Pending);
    let missing = dir.path().join("missing");
    let spec = spec_in(
        dir.path(),
        Some((missing.join("vmlinux"), missing.join("initrd"))),
    );
    let err = client
        .request(Command::Sync(Box::new(spec)))
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        err.contains("vmlinux"),
        "QEMU's complaint names the kernel: {err}"
    );
    let crashed = next_domain(&mut client).await;
    assert_eq!(
        (crashed.state, crashed.reason),
        (DomainState::Crashed, StateReason::FailedToStart)
    );
    tokio::time::timeout(Duration::from_secs(10), launcher)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// Starts the test guest (real QEMU under TCG) behind a launcher in `dir`; returns the
/// launcher task, its client and QEMU's pid (guarded: its group is killed when dropped).
async fn running_test_guest(
    dir: &Path,
) -> Option<(
    tokio::task::JoinHandle<Result<(), LauncherError>>,
    LauncherClient,
    u32,
    ProcessGroupGuard,
)> {
    let guest = available(test_guest())?;
    let mut opts = options(dir);
    opts.qemu_binary = guest.qemu().to_owned();
    let socket = opts.socket_path.clone();
    let launcher = tokio::spawn(run_launcher(opts));
    let mut client = connect(&socket).await;
    let spec = spec_in(dir, Some((guest.kernel(), guest.initrd())));
    let running = status_of(client.request(Command::Sync(Box::new(spec))).await.unwrap());
    assert_eq!(running.state, DomainState::Running);
    let pid = running.qemu_pid.expect("a QEMU pid");
    let guard = ProcessGroupGuard(i32::try_from(pid).unwrap());
    Some((launcher, client, pid, guard))
}

/// The final state the launcher reports.
async fn final_domain(client: &mut LauncherClient) -> DomainStatus {
    loop {
        let status = next_domain(client).await;
        if status.is_final() {
            return status;
        }
    }
}

/// Fault: QEMU dies under the launcher (its QMP socket closes with it). The launcher reports
/// the domain crashed, as libvirt reports a QEMU that went away, and ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qemu_killed_under_the_launcher_is_reported_crashed() {
    let dir = tempfile::tempdir().unwrap();
    let Some((launcher, mut client, pid, _guard)) = running_test_guest(dir.path()).await else {
        return;
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(30), final_domain(&mut client))
        .await
        .expect("the launcher reports the end");
    assert_eq!(
        (ended.state, ended.reason),
        (DomainState::Crashed, StateReason::QemuExited)
    );
    tokio::time::timeout(Duration::from_secs(10), launcher)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// Fault: QEMU hangs (stopped: it answers neither the power button nor QMP). A shutdown
/// with a grace period of 1 s still ends it: the launcher answers, kills QEMU's group after
/// the grace period and reports the domain destroyed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_qemu_is_killed_after_the_shutdown_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let Some((launcher, mut client, pid, _guard)) = running_test_guest(dir.path()).await else {
        return;
    };
    let qemu = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
    nix::sys::signal::kill(qemu, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let answered = tokio::time::timeout(
        Duration::from_secs(30),
        client.request(Command::Shutdown {
            grace_period_seconds: 1,
        }),
    )
    .await
    .expect("the shutdown is answered although QEMU hangs");
    drop(answered);
    let ended = tokio::time::timeout(Duration::from_secs(30), final_domain(&mut client))
        .await
        .expect("the launcher ends the hung QEMU");
    assert!(ended.is_final(), "{ended:?}");
    assert!(
        nix::sys::signal::kill(qemu, None).is_err(),
        "QEMU ({pid}) is gone"
    );
    tokio::time::timeout(Duration::from_secs(10), launcher)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// The real thing: boots the test guest under TCG, waits for its marker on the serial
/// log, powers it off through ACPI and checks the launcher reports a guest shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_guest_boots_and_powers_off_through_acpi() {
    let Some(guest) = available(test_guest()) else {
        return;
    };
    let qemu = guest.qemu().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path());
    opts.qemu_binary = qemu;
    let socket = opts.socket_path.clone();
    let launcher = tokio::spawn(run_launcher(opts));
    let mut client = connect(&socket).await;
    let mut spec = spec_in(dir.path(), Some((guest.kernel(), guest.initrd())));
    let vnc_socket = dir.path().join("vnc.sock");
    spec.graphics = Some(Graphics {
        video: VideoModel::Vga,
        vnc_socket: vnc_socket.to_string_lossy().into_owned(),
    });
    let serial_log = PathBuf::from(&spec.paths.serial_log);

    let started = std::time::Instant::now();
    let running = status_of(client.request(Command::Sync(Box::new(spec))).await.unwrap());
    assert_eq!(running.state, DomainState::Running);
    let pid = running.qemu_pid.expect("a QEMU pid");
    let _guard = ProcessGroupGuard(i32::try_from(pid).unwrap());
    // Running means the VNC server is there already, not only QMP.
    assert_vnc_server_greets(&vnc_socket).await;
    let ready = wait_until(Duration::from_secs(90), || {
        std::fs::read_to_string(&serial_log).is_ok_and(|log| log.contains("GUEST-READY"))
    })
    .await;
    assert!(
        ready,
        "no GUEST-READY; serial log:\n{}",
        std::fs::read_to_string(&serial_log).unwrap_or_default()
    );
    eprintln!("boot to GUEST-READY: {:?}", started.elapsed());
    eprintln!("launcher test process {}", rss_line());

    client
        .request(Command::Shutdown {
            grace_period_seconds: 30,
        })
        .await
        .unwrap()
        .unwrap();
    let off = loop {
        let status = next_domain(&mut client).await;
        if status.is_final() {
            break status;
        }
    };
    assert_eq!(
        (off.state, off.reason, off.exit_code),
        (DomainState::Shutoff, StateReason::GuestShutdown, Some(0))
    );
    let log = std::fs::read_to_string(&serial_log).unwrap();
    assert!(
        log.contains("ACPI-POWER-BUTTON"),
        "the guest saw the power button:\n{log}"
    );
    tokio::time::timeout(Duration::from_secs(10), launcher)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// Live changes on the test guest: a second `sync` plugs a socket and 128 MiB through the
/// virtio-mem device into the running QEMU (same pid), the guest onlines and reports both;
/// a virtio disk is attached and detached; and a spec that only a restart could apply is refused with nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_of_a_running_guest_plugs_vcpus_memory_and_a_disk() {
    const MIB: u64 = 1 << 20;
    let Some(guest) = available(test_guest()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path());
    opts.qemu_binary = guest.qemu().to_owned();
    let socket = opts.socket_path.clone();
    let launcher = tokio::spawn(run_launcher(opts));
    let mut client = connect(&socket).await;
    let mut spec = spec_in(dir.path(), Some((guest.kernel(), guest.initrd())));
    spec.cpu.max_sockets = Some(2);
    spec.memory.guest_bytes = 1024 * MIB;
    spec.memory.max_guest_bytes = Some(2048 * MIB);
    let serial_log = PathBuf::from(&spec.paths.serial_log);
    let serial = || std::fs::read_to_string(&serial_log).unwrap_or_default();
    let running = status_of(
        client
            .request(Command::Sync(Box::new(spec.clone())))
            .await
            .unwrap(),
    );
    let pid = running.qemu_pid.expect("a QEMU pid");
    let _guard = ProcessGroupGuard(i32::try_from(pid).unwrap());
    assert_eq!(running.cpu.map(|c| c.sockets), Some(1));
    assert!(
        wait_until(Duration::from_secs(90), || serial().contains("GUEST-READY")).await,
        "no GUEST-READY:\n{}",
        serial()
    );
    let mem_at_boot = guest_reports(&serial())
        .first()
        .map(|r| r.mem_kib)
        .expect("a GUEST-SEES report before GUEST-READY");

    let mut more = spec.clone();
    more.cpu.sockets = 2;
    more.memory.hotplugged_bytes = 128 * MIB;
    let changed = match client.request(Command::Sync(Box::new(more))).await.unwrap() {
        Ok(value) => serde_json::from_value::<DomainStatus>(value).unwrap(),
        Err(e) => panic!(
            "{e}; QEMU log:\n{}",
            std::fs::read_to_string(dir.path().join("launcher.sock.qemu.log")).unwrap_or_default()
        ),
    };
    assert_eq!(changed.qemu_pid, Some(pid), "the same QEMU");
    assert_eq!(changed.cpu.map(|c| c.sockets), Some(2));
    assert_eq!(changed.memory.map(|m| m.requested_bytes), Some(1152 * MIB));
    let plugged = loop {
        let status = next_domain(&mut client).await;
        if status.memory.is_some_and(|m| m.current_bytes == 1152 * MIB) {
            break status;
        }
    };
    assert_eq!(plugged.qemu_pid, Some(pid));
    assert!(
        wait_until(Duration::from_secs(60), || guest_reports(&serial())
            .iter()
            .any(|r| r.cpus == "0-1" && r.mem_kib == mem_at_boot + 128 * 1024))
        .await,
        "the guest did not report both vCPUs and the memory:\n{}",
        serial()
    );

    let mut live = spec.clone();
    live.cpu.sockets = 2;
    live.memory.hotplugged_bytes = 128 * MIB;
    attach_and_detach_a_disk(&mut client, dir.path(), &live, &serial_log).await;

    let mut fewer = spec.clone();
    fewer.memory.hotplugged_bytes = 128 * MIB;
    let refused = client
        .request(Command::Sync(Box::new(fewer)))
        .await
        .unwrap()
        .unwrap_err();
    assert!(refused.contains("restart"), "{refused}");
    let status = status_of(client.request(Command::Status).await.unwrap());
    assert_eq!(status.cpu.map(|c| c.sockets), Some(2), "nothing changed");
    client.request(Command::Kill).await.unwrap().unwrap();
    tokio::time::timeout(Duration::from_secs(10), launcher)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// Attaches a virtio disk to the running test guest on its free root port, waits for the guest
/// to report it, detaches it and waits for the guest to report it gone.
async fn attach_and_detach_a_disk(
    client: &mut LauncherClient,
    dir: &Path,
    running: &LauncherSpec,
    serial_log: &Path,
) {
    const MIB: u64 = 1 << 20;
    let serial = || std::fs::read_to_string(serial_log).unwrap_or_default();
    let data = dir.join("data.img");
    std::fs::File::create(&data)
        .unwrap()
        .set_len(16 * MIB)
        .unwrap();
    let mut with_disk = running.clone();
    with_disk.disks.push(crate::spec::Disk {
        name: "data".into(),
        source_path: data.to_string_lossy().into_owned(),
        format: crate::spec::DiskFormat::Raw,
        bus: crate::spec::DiskBus::Virtio,
        cdrom: false,
        boot_order: None,
        serial: Some("DATA1".into()),
        cache: crate::spec::CacheMode::Writeback,
        readonly: false,
        create_size: None,
        passed_file: None,
        overlay_backing: None,
        block_device: false,
        io: None,
    });
    client
        .request(Command::Sync(Box::new(with_disk.clone())))
        .await
        .unwrap()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(60), || guest_reports(&serial())
            .last()
            .is_some_and(|r| r.disks == "vda"))
        .await,
        "the guest did not see the attached disk:\n{}",
        serial()
    );
    let mut without_disk = with_disk.clone();
    without_disk.disks.clear();
    client
        .request(Command::Sync(Box::new(without_disk)))
        .await
        .unwrap()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(60), || guest_reports(&serial())
            .last()
            .is_some_and(|r| r.disks.is_empty()))
        .await,
        "the guest did not lose the detached disk:\n{}",
        serial()
    );
}

/// A raw virtio disk named `name`, at `source` (with `passed`: only its name), opened from
/// the passed file `passed` when given.
fn virtio_disk(name: &str, source: &Path, passed: Option<&str>) -> Disk {
    Disk {
        name: name.into(),
        source_path: source.to_string_lossy().into_owned(),
        format: crate::spec::DiskFormat::Raw,
        bus: crate::spec::DiskBus::Virtio,
        cdrom: false,
        boot_order: None,
        serial: None,
        cache: crate::spec::CacheMode::Writeback,
        readonly: false,
        create_size: None,
        passed_file: passed.map(str::to_owned),
        overlay_backing: None,
        block_device: false,
        io: None,
    }
}

/// A sparse image of 16 MiB at `path`, opened read-write.
fn image(path: &Path) -> std::fs::File {
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .unwrap();
    file.set_len(16 << 20).unwrap();
    file
}

#[tokio::test]
async fn a_disk_outside_the_base_dir_is_used_only_from_a_passed_file() {
    let (dir, outside) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut opts = options(dir.path());
    opts.fake_qemu = true;
    opts.base_dir = Some(dir.path().to_owned());
    let socket = opts.socket_path.clone();
    let launcher = tokio::spawn(run_launcher(opts));
    let mut client = connect(&socket).await;
    let (boot_image, hot_image) = (
        outside.path().join("boot.img"),
        outside.path().join("hot.img"),
    );
    let (boot_file, hot_file) = (image(&boot_image), image(&hot_image));

    let mut spec = spec_in(dir.path(), None);
    spec.disks = vec![virtio_disk("boot", &boot_image, Some("boot"))];
    let refused = client
        .request(Command::Sync(Box::new(spec.clone())))
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        refused.contains("no file was passed with the key \"boot\""),
        "{refused}"
    );
    let status = status_of(client.request(Command::Status).await.unwrap());
    assert_eq!(status.state, DomainState::Pending, "nothing was started");
    client.pass_file("boot", &boot_file).await.unwrap().unwrap();
    let running = status_of(
        client
            .request(Command::Sync(Box::new(spec.clone())))
            .await
            .unwrap(),
    );
    assert_eq!(running.state, DomainState::Running);

    // Live: by path outside the base directory, and by a key not passed: both refused.
    let mut by_path = spec.clone();
    by_path.disks.push(virtio_disk("hot", &hot_image, None));
    let refused = client
        .request(Command::Sync(Box::new(by_path)))
        .await
        .unwrap()
        .unwrap_err();
    assert!(refused.contains("outside"), "{refused}");
    let mut by_file = spec.clone();
    by_file
        .disks
        .push(virtio_disk("hot", &hot_image, Some("hot")));
    let refused = client
        .request(Command::Sync(Box::new(by_file.clone())))
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        refused.contains("no file was passed with the key \"hot\""),
        "{refused}"
    );
    // Nothing changed: the domain's only hotplug port is still free for the disk once passed.
    client.pass_file("hot", &hot_file).await.unwrap().unwrap();
    client
        .request(Command::Sync(Box::new(by_file)))
        .await
        .unwrap()
        .unwrap();
    client.request(Command::Kill).await.unwrap().unwrap();
    tokio::time::timeout(Duration::from_secs(10), launcher)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// Passed files on the test guest, with the launcher's base directory set and both images
/// outside it: a boot disk opened from a passed file (`-add-fd`) is read by the guest; a disk
/// passed later is attached live (QMP `add-fd`), seen, written by the guest, and on detach
/// closed by QEMU and by the launcher. The same image by path alone is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_uses_disks_passed_by_descriptor_at_boot_and_live() {
    let Some(guest) = available(test_guest()) else {
        return;
    };
    let (dir, outside) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // The kernel and initrd must lie below the base directory too.
    let boot = dir.path().join("boot");
    std::fs::create_dir(&boot).unwrap();
    for (from, to) in [(guest.kernel(), "vmlinux"), (guest.initrd(), "initrd")] {
        if std::fs::hard_link(&from, boot.join(to)).is_err() {
            std::fs::copy(&from, boot.join(to)).unwrap();
        }
    }
    let mut opts = options(dir.path());
    opts.qemu_binary = guest.qemu().to_owned();
    opts.base_dir = Some(dir.path().to_owned());
    let socket = opts.socket_path.clone();
    let launcher = tokio::spawn(run_launcher(opts));
    let mut client = connect(&socket).await;

    let boot_image = outside.path().join("boot.img");
    let boot_file = image(&boot_image);
    boot_file.write_all_at(b"BOOT-DISK-MARKER\n", 0).unwrap();
    client.pass_file("boot", &boot_file).await.unwrap().unwrap();
    drop(boot_file);
    let mut spec = spec_in(
        dir.path(),
        Some((boot.join("vmlinux"), boot.join("initrd"))),
    );
    spec.disks = vec![virtio_disk("boot", &boot_image, Some("boot"))];
    let serial_log = PathBuf::from(&spec.paths.serial_log);
    let serial = || std::fs::read_to_string(&serial_log).unwrap_or_default();
    let qemu_log =
        || std::fs::read_to_string(dir.path().join("launcher.sock.qemu.log")).unwrap_or_default();
    let running = match client
        .request(Command::Sync(Box::new(spec.clone())))
        .await
        .unwrap()
    {
        Ok(value) => serde_json::from_value::<DomainStatus>(value).unwrap(),
        Err(e) => panic!("{e}; QEMU log:\n{}", qemu_log()),
    };
    let pid = running.qemu_pid.expect("a QEMU pid");
    let _guard = ProcessGroupGuard(i32::try_from(pid).unwrap());
    assert!(
        wait_until(Duration::from_secs(90), || serial().contains("GUEST-READY")).await,
        "no GUEST-READY:\n{}",
        serial()
    );
    assert_eq!(
        guest_reports(&serial()).last().map(|r| r.disks.clone()),
        Some("vda".into())
    );
    let console = Path::new(&spec.paths.serial_console_socket);
    let read = run_in_guest(console, "head -c 16 /dev/vda").await;
    assert!(
        read.contains("BOOT-DISK-MARKER"),
        "the guest reads the boot disk: {read}"
    );

    let hot_image = outside.path().join("hot.img");
    attach_write_and_detach_a_passed_disk(&mut client, &spec, &hot_image, pid).await;
    assert!(
        holds_open(&format!("/proc/{pid}/fd"), &boot_image),
        "the boot disk stays"
    );
    client.request(Command::Kill).await.unwrap().unwrap();
    tokio::time::timeout(Duration::from_secs(10), launcher)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// On the running test guest (`spec`, QEMU `pid`): the image at `hot_image` (outside the
/// launcher's directories) is refused by path, attached once passed, written by the guest, and
/// closed by QEMU and the launcher once detached.
async fn attach_write_and_detach_a_passed_disk(
    client: &mut LauncherClient,
    spec: &LauncherSpec,
    hot_image: &Path,
    pid: u32,
) {
    let serial = || std::fs::read_to_string(&spec.paths.serial_log).unwrap_or_default();
    let console = Path::new(&spec.paths.serial_console_socket);
    let hot_file = image(hot_image);
    let mut by_path = spec.clone();
    by_path.disks.push(virtio_disk("hot", hot_image, None));
    let refused = client
        .request(Command::Sync(Box::new(by_path)))
        .await
        .unwrap()
        .unwrap_err();
    assert!(refused.contains("outside"), "{refused}");
    client.pass_file("hot", &hot_file).await.unwrap().unwrap();
    drop(hot_file);
    let mut with_hot = spec.clone();
    with_hot
        .disks
        .push(virtio_disk("hot", hot_image, Some("hot")));
    if let Err(e) = client
        .request(Command::Sync(Box::new(with_hot)))
        .await
        .unwrap()
    {
        panic!("{e}");
    }
    assert!(
        wait_until(Duration::from_secs(60), || guest_reports(&serial())
            .last()
            .is_some_and(|r| r.disks == "vda,vdb"))
        .await,
        "the guest did not see the passed disk:\n{}",
        serial()
    );
    let wrote = run_in_guest(
        console,
        "echo PASSED-FILE-WRITTEN | dd of=/dev/vdb conv=fsync",
    )
    .await;
    assert!(wrote.contains("RUN-DONE rc=0"), "{wrote}");
    let mut written = [0u8; 20];
    std::fs::File::open(hot_image)
        .unwrap()
        .read_exact_at(&mut written, 0)
        .unwrap();
    assert_eq!(&written, b"PASSED-FILE-WRITTEN\n");
    assert!(
        holds_open(&format!("/proc/{pid}/fd"), hot_image),
        "QEMU has the file"
    );

    client
        .request(Command::Sync(Box::new(spec.clone())))
        .await
        .unwrap()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(60), || guest_reports(&serial())
            .last()
            .is_some_and(|r| r.disks == "vda"))
        .await,
        "the guest did not lose the detached disk:\n{}",
        serial()
    );
    assert!(
        !holds_open(&format!("/proc/{pid}/fd"), hot_image),
        "QEMU closed it"
    );
    assert!(
        !holds_open("/proc/self/fd", hot_image),
        "the launcher closed it"
    );
}

/// Whether a descriptor in `fd_dir` (`/proc/<pid>/fd`) refers to `path`.
fn holds_open(fd_dir: &str, path: &Path) -> bool {
    std::fs::read_dir(fd_dir)
        .unwrap()
        .filter_map(Result::ok)
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == path))
}

/// Runs `command` in the test guest through its serial console (`run …`) and returns what it
/// printed up to its `RUN-DONE rc=N` line.
async fn run_in_guest(console: &Path, command: &str) -> String {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let stream = crate::unix_socket::connect(console)
        .await
        .expect("serial console");
    let (read, mut write) = stream.into_split();
    write
        .write_all(format!("run {command}\n").as_bytes())
        .await
        .unwrap();
    let mut lines = BufReader::new(read).lines();
    let mut seen = String::new();
    let done = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            seen.push_str(&line);
            seen.push('\n');
            if line.contains("RUN-DONE rc=") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(done, Ok(true), "no RUN-DONE for {command:?}:\n{seen}");
    seen
}

/// QEMU's VNC server listens on the spec's socket, owner-only, and speaks RFB 3.8.
async fn assert_vnc_server_greets(socket: &Path) {
    use tokio::io::AsyncReadExt;
    assert_eq!(
        crate::test_support::mode_of(socket) & 0o077,
        0,
        "owner-only"
    );
    let mut vnc = crate::unix_socket::connect(socket)
        .await
        .expect("VNC socket");
    let mut version = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(10), vnc.read_exact(&mut version))
        .await
        .expect("a greeting in time")
        .expect("the protocol version");
    assert_eq!(&version, b"RFB 003.008\n");
}

fn rss_line() -> String {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS"))
        .unwrap_or("VmRSS unknown")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test]
async fn the_command_socket_and_final_state_are_owner_only_under_a_permissive_umask() {
    use crate::test_support::{mode_of, permissive_umask};
    permissive_umask();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("launcher.sock");
    let _listener = listen(&socket).unwrap();
    assert_eq!(mode_of(&socket), 0o600);
    record_final_state(&socket, &DomainStatus::pending());
    assert_eq!(
        mode_of(&dir.path().join(crate::protocol::FINAL_STATE_FILE)),
        0o600
    );
}
