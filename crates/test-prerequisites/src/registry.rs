//! A real OCI registry for tests: Debian's `docker-registry` (the CNCF distribution registry)
//! serving plain HTTP on a free loopback port, with its storage in a temporary directory.
//!
//! # Guarantees
//! The registry process is killed (by its pid) and reaped when the [`TestRegistry`] is dropped,
//! and its storage removed.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The user of a registry with basic authentication.
pub const USER: &str = "user";
/// Its password.
pub const PASSWORD: &str = "secret-pass";
/// [`USER`] and [`PASSWORD`] as an htpasswd line (bcrypt, the only scheme the registry takes).
const HTPASSWD: &str = "user:$2b$04$8LgP7Me6nKtvezK9lzs1ze5YIqucl5qBtPWOg0xTK9IWnE/rQgZMu";

/// How long the registry may take to answer its first request.
const READY_DEADLINE: Duration = Duration::from_secs(20);

/// `docker-registry` on `PATH`.
pub fn docker_registry() -> Result<PathBuf, String> {
    crate::command("docker-registry", "docker-registry")
}

/// A running registry; see the module's Guarantees.
#[derive(Debug)]
pub struct TestRegistry {
    child: Child,
    address: SocketAddr,
    dir: PathBuf,
}

impl TestRegistry {
    /// A started registry; `None` (skipped, or a failure under [`crate::REQUIRE_ENV`], see
    /// [`crate::available`]) when `docker-registry` is not installed.
    ///
    /// # Errors
    /// An installed registry that does not come up is an error, never a skip.
    pub fn start_if_installed() -> Result<Option<TestRegistry>, String> {
        if crate::available(docker_registry()).is_none() {
            return Ok(None);
        }
        Self::start().map(Some)
    }

    /// Starts a registry on `127.0.0.1:<free port>`, storing below a fresh temporary directory,
    /// and waits until it answers `GET /v2/`.
    ///
    /// # Errors
    /// Why the registry is missing or did not come up.
    pub fn start() -> Result<TestRegistry, String> {
        Self::start_with(None)
    }

    /// As [`Self::start_if_installed`], with basic authentication: only [`USER`] with
    /// [`PASSWORD`] may pull or push.
    ///
    /// # Errors
    /// As [`Self::start_if_installed`].
    pub fn start_with_basic_auth_if_installed() -> Result<Option<TestRegistry>, String> {
        if crate::available(docker_registry()).is_none() {
            return Ok(None);
        }
        Self::start_with(Some(HTPASSWD)).map(Some)
    }

    fn start_with(htpasswd: Option<&str>) -> Result<TestRegistry, String> {
        let binary = docker_registry()?;
        let mut last = String::new();
        // A port picked free can be taken before the registry binds it: try a few.
        for _ in 0..3 {
            match Self::start_once(&binary, htpasswd) {
                Ok(registry) => return Ok(registry),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn start_once(binary: &Path, htpasswd: Option<&str>) -> Result<TestRegistry, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free loopback port: {e}"))?
            .port();
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let dir = std::env::temp_dir().join(format!(
            "kubevirt-rs-registry-{}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(dir.join("storage"))
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let config = dir.join("config.yml");
        let mut text = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {address}\n",
            dir.join("storage").display()
        );
        if let Some(line) = htpasswd {
            let file = dir.join("htpasswd");
            std::fs::write(&file, format!("{line}\n"))
                .map_err(|e| format!("writing {}: {e}", file.display()))?;
            text.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: kubevirt-rs-test\n    path: {}\n",
                file.display()
            ));
        }
        std::fs::write(&config, text).map_err(|e| format!("writing {}: {e}", config.display()))?;
        let log = std::fs::File::create(dir.join("registry.log"))
            .map_err(|e| format!("creating the registry log: {e}"))?;
        let child = Command::new(binary)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", binary.display()))?;
        let mut registry = TestRegistry {
            child,
            address,
            dir,
        };
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = registry.child.try_wait() {
                return Err(format!(
                    "docker-registry exited ({status}): {}",
                    registry.log()
                ));
            }
            if registry.answers() {
                return Ok(registry);
            }
            if started.elapsed() > READY_DEADLINE {
                return Err(format!(
                    "docker-registry did not answer on {address} within {READY_DEADLINE:?}: {}",
                    registry.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn answers(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect_timeout(&self.address, Duration::from_secs(1))
        else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let request = format!(
            "GET /v2/ HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.address
        );
        if stream.write_all(request.as_bytes()).is_err() {
            return false;
        }
        let mut response = String::new();
        let _ = stream.read_to_string(&mut response);
        // 401 is the answer of a registry with authentication: it is up.
        response.starts_with("HTTP/1.1 200") || response.starts_with("HTTP/1.1 401")
    }

    /// `127.0.0.1:<port>`, the registry part of image references.
    pub fn host(&self) -> String {
        self.address.to_string()
    }

    /// The registry's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Where the registry keeps the blob of `digest` (`sha256:<hex>`), to corrupt it in tests.
    pub fn blob_data(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.dir
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(hex.get(..2).unwrap_or_default())
            .join(hex)
            .join("data")
    }

    /// The registry's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("registry.log")).unwrap_or_default()
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
