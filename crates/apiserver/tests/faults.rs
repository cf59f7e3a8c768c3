//! Fault injection below the API server. A full disk: the process's file-size limit, so every
//! write of SQLite past it fails with `EFBIG` as a full disk fails with `ENOSPC`. A failing
//! fsync: a seccomp filter answers the store's `fsync` with `EIO` while the fault is on.
//! Either way writes are answered with 500 and leave nothing behind, reads go on, and once
//! the fault clears the service resumes. nextest runs each test in a process of its own, so
//! the lowered limit and the filter are that test's alone.

mod common;

use common::TestServer;
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use serde_json::json;

const CMS: &str = "/api/v1/namespaces/default/configmaps";

fn config_map(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}})
}

#[tokio::test]
async fn a_full_disk_fails_writes_cleanly_and_the_service_resumes_when_it_has_room() {
    // A write past the limit raises SIGXFSZ, which would end the process: refused writes
    // must come back as errors instead, as they do on a full disk.
    // SAFETY: ignoring a signal installs no handler code.
    #[allow(unsafe_code)]
    unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGXFSZ,
            nix::sys::signal::SigHandler::SigIgn,
        )
        .expect("ignore SIGXFSZ");
    }
    let s = TestServer::start().await;
    let before = s.request("POST", CMS, Some(&config_map("before"))).await;
    assert_eq!(
        before.status,
        201,
        "{}",
        String::from_utf8_lossy(&before.body)
    );

    let (soft, hard) = getrlimit(Resource::RLIMIT_FSIZE).expect("getrlimit");
    // No file of the process may grow past one page: every SQLite write (a WAL frame is a
    // page and its header) fails.
    setrlimit(Resource::RLIMIT_FSIZE, 4096, hard).expect("setrlimit");
    let refused = s.request("POST", CMS, Some(&config_map("during"))).await;
    let update = s
        .request(
            "PUT",
            &format!("{CMS}/before"),
            Some(&json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "before"}, "data": {"k": "changed"}})),
        )
        .await;
    let read = s.request("GET", &format!("{CMS}/before"), None).await;
    setrlimit(Resource::RLIMIT_FSIZE, soft, hard).expect("setrlimit");

    assert_eq!(
        refused.status,
        500,
        "a create on a full disk: {}",
        String::from_utf8_lossy(&refused.body)
    );
    assert_eq!(
        refused.json()["kind"],
        "Status",
        "{}",
        String::from_utf8_lossy(&refused.body)
    );
    assert_eq!(
        update.status,
        500,
        "an update on a full disk: {}",
        String::from_utf8_lossy(&update.body)
    );
    assert_eq!(
        read.status,
        200,
        "reads go on: {}",
        String::from_utf8_lossy(&read.body)
    );
    assert_eq!(read.json()["data"]["k"], "v");

    // Nothing of the refused writes is there, and the service resumes.
    let missing = s.request("GET", &format!("{CMS}/during"), None).await;
    assert_eq!(
        missing.status,
        404,
        "{}",
        String::from_utf8_lossy(&missing.body)
    );
    let kept = s.request("GET", &format!("{CMS}/before"), None).await;
    assert_eq!(
        kept.json()["data"]["k"],
        "v",
        "the refused update left the object as it was"
    );
    let after = s.request("POST", CMS, Some(&config_map("during"))).await;
    assert_eq!(
        after.status,
        201,
        "{}",
        String::from_utf8_lossy(&after.body)
    );
    let listed = s.request("GET", CMS, None).await;
    let listed = listed.json();
    let names: Vec<&str> = listed["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .filter(|n| *n == "before" || *n == "during")
        .collect();
    assert_eq!(names, ["before", "during"]);

    // And after a restart on the same data, the store holds exactly the acknowledged writes.
    let dir = s.stop().await;
    let s = TestServer::start_in(dir).await;
    let kept = s.request("GET", &format!("{CMS}/before"), None).await;
    assert_eq!(kept.json()["data"]["k"], "v");
    let after = s.request("GET", &format!("{CMS}/during"), None).await;
    assert_eq!(after.status, 200);
}

fn names(reply: &common::Reply) -> Vec<String> {
    let mut names: Vec<String> = reply.json()["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

fn assert_refused(reply: &common::Reply, what: &str) {
    let body = String::from_utf8_lossy(&reply.body);
    assert_eq!(reply.status, 500, "{what} while fsync fails: {body}");
    assert_eq!(reply.json()["kind"], "Status", "{body}");
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[tokio::test]
async fn failing_fsync_fails_writes_cleanly_and_the_service_resumes() {
    let Some(fault) = test_prerequisites::available(failing_fsync::install()) else {
        return;
    };
    let s = TestServer::start().await;
    let before = s.request("POST", CMS, Some(&config_map("before"))).await;
    assert_eq!(
        before.status,
        201,
        "{}",
        String::from_utf8_lossy(&before.body)
    );
    assert!(
        fault.passed() > 0,
        "the store's commits go through the filter"
    );

    fault.set(true);
    let refused = s.request("POST", CMS, Some(&config_map("refused"))).await;
    let update = s
        .request(
            "PUT",
            &format!("{CMS}/before"),
            Some(&json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "before"}, "data": {"k": "changed"}})),
        )
        .await;
    let read = s.request("GET", &format!("{CMS}/before"), None).await;
    fault.set(false);
    assert!(fault.refused() > 0, "the refused writes reached fsync");
    assert_refused(&refused, "a create");
    assert_refused(&update, "an update");
    assert_eq!(
        read.status,
        200,
        "reads go on: {}",
        String::from_utf8_lossy(&read.body)
    );
    assert_eq!(read.json()["data"]["k"], "v");

    // Nothing of the refused writes is there, and the service resumes once fsync works.
    let missing = s.request("GET", &format!("{CMS}/refused"), None).await;
    assert_eq!(
        missing.status,
        404,
        "{}",
        String::from_utf8_lossy(&missing.body)
    );
    let kept = s.request("GET", &format!("{CMS}/before"), None).await;
    assert_eq!(
        kept.json()["data"]["k"],
        "v",
        "the refused update left the object as it was"
    );
    let after = s.request("POST", CMS, Some(&config_map("after"))).await;
    assert_eq!(
        after.status,
        201,
        "{}",
        String::from_utf8_lossy(&after.body)
    );

    // A write refused just before the server goes down (as a kill during the fault) must not
    // come back when its data is opened again: SQLite wrote its frames, only their fsync
    // failed.
    fault.set(true);
    let last = s
        .request("POST", CMS, Some(&config_map("refused-last")))
        .await;
    assert_refused(&last, "a create");
    let dir = s.stop().await;
    fault.set(false);

    let s = TestServer::start_in(dir).await;
    let listed = s.request("GET", CMS, None).await;
    let listed = names(&listed);
    let ours: Vec<&str> = listed
        .iter()
        .map(String::as_str)
        .filter(|n| ["before", "refused", "after", "refused-last"].contains(n))
        .collect();
    assert_eq!(
        ours,
        ["after", "before"],
        "after a restart only the acknowledged writes"
    );
    let kept = s.request("GET", &format!("{CMS}/before"), None).await;
    assert_eq!(kept.json()["data"]["k"], "v");
    let again = s
        .request("POST", CMS, Some(&config_map("refused-last")))
        .await;
    assert_eq!(
        again.status,
        201,
        "{}",
        String::from_utf8_lossy(&again.body)
    );
}
/// Failing fsync, for real: a seccomp filter hands every `fsync`, `fdatasync` and
/// `sync_file_range` of the threads created after it to a supervisor thread, which answers
/// `EIO` while the fault is on and lets the call run otherwise.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[allow(unsafe_code)]
mod failing_fsync {
    use std::os::fd::{FromRawFd, OwnedFd, RawFd};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use nix::libc;

    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 0xc000_003e;
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 0xc000_00b7;

    /// The switch and what the supervisor did.
    #[derive(Default)]
    pub struct Fault {
        failing: AtomicBool,
        refused: AtomicUsize,
        passed: AtomicUsize,
    }

    impl Fault {
        pub fn set(&self, failing: bool) {
            self.failing.store(failing, Ordering::SeqCst);
        }

        /// Syncs answered `EIO` so far.
        pub fn refused(&self) -> usize {
            self.refused.load(Ordering::SeqCst)
        }

        /// Syncs let through so far.
        pub fn passed(&self) -> usize {
            self.passed.load(Ordering::SeqCst)
        }
    }

    const fn statement(code: u32, k: u32) -> libc::sock_filter {
        libc::sock_filter {
            code: code as u16,
            jt: 0,
            jf: 0,
            k,
        }
    }

    const fn jump_if_equal(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt,
            jf,
            k,
        }
    }

    /// Installs the filter on the calling thread (and so on every thread it creates from
    /// now on) and starts the supervisor, which is created first and so runs unfiltered;
    /// or why the kernel refused the filter.
    pub fn install() -> Result<Arc<Fault>, String> {
        let fault = Arc::new(Fault::default());
        let (send, receive) = std::sync::mpsc::channel::<OwnedFd>();
        let supervised = Arc::clone(&fault);
        std::thread::Builder::new()
            .name("fsync-fault".to_owned())
            .spawn(move || {
                // No listener: the filter was refused, and there is nothing to supervise.
                if let Ok(listener) = receive.recv() {
                    supervise(&listener, &supervised);
                }
            })
            .expect("supervisor thread");

        let nr = |n: libc::c_long| u32::try_from(n).expect("syscall number");
        let program = [
            statement(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 4),
            jump_if_equal(AUDIT_ARCH, 0, 4),
            statement(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
            jump_if_equal(nr(libc::SYS_fsync), 3, 0),
            jump_if_equal(nr(libc::SYS_fdatasync), 2, 0),
            jump_if_equal(nr(libc::SYS_sync_file_range), 1, 0),
            statement(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
            statement(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_USER_NOTIF),
        ];
        let fprog = libc::sock_fprog {
            len: u16::try_from(program.len()).expect("program length"),
            filter: program.as_ptr().cast_mut(),
        };
        // SAFETY: plain system calls; `fprog` points at `program`, alive for the call.
        let fd = unsafe {
            assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
                &raw const fprog,
            )
        };
        if fd < 0 {
            return Err(format!(
                "a seccomp filter with a user-space listener (Linux 5.5 or later) makes fsync \
                 fail: {}",
                std::io::Error::last_os_error()
            ));
        }
        let fd = RawFd::try_from(fd).expect("listener fd");
        // SAFETY: the kernel just returned this descriptor and nothing else owns it.
        send.send(unsafe { OwnedFd::from_raw_fd(fd) })
            .expect("supervisor");
        Ok(fault)
    }

    fn supervise(listener: &OwnedFd, fault: &Fault) {
        use std::os::fd::AsRawFd;
        loop {
            // SAFETY: all-zero is a valid value of these plain C structs, and the kernel
            // requires the request zeroed.
            let mut request: libc::seccomp_notif = unsafe { std::mem::zeroed() };
            // SAFETY: the ioctl writes one `seccomp_notif` into `request`.
            let got = unsafe {
                libc::ioctl(
                    listener.as_raw_fd(),
                    libc::SECCOMP_IOCTL_NOTIF_RECV,
                    &raw mut request,
                )
            };
            if got != 0 {
                // EINTR, or the calling thread went away: wait for the next one.
                continue;
            }
            // SAFETY: as above.
            let mut response: libc::seccomp_notif_resp = unsafe { std::mem::zeroed() };
            response.id = request.id;
            if fault.failing.load(Ordering::SeqCst) {
                response.error = -libc::EIO;
                fault.refused.fetch_add(1, Ordering::SeqCst);
            } else {
                response.flags =
                    u32::try_from(libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE).expect("flag");
                fault.passed.fetch_add(1, Ordering::SeqCst);
            }
            // SAFETY: the ioctl reads one `seccomp_notif_resp`. A caller that went away
            // meanwhile makes it fail with ENOENT, which is fine.
            unsafe {
                libc::ioctl(
                    listener.as_raw_fd(),
                    libc::SECCOMP_IOCTL_NOTIF_SEND,
                    &raw const response,
                );
            }
        }
    }
}
