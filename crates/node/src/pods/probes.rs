//! kubelet's prober: `startupProbe`, `readinessProbe` and `livenessProbe` of running containers.
//!
//! Data flow: for every running container with probes the runner asks [`Prober::observe`],
//! which starts one worker task per probe the first time it sees the container's process (a
//! restarted container, a new pid, gets new workers and fresh results, as kubelet resets them
//! per container ID). Each worker waits `initialDelaySeconds` from the container's start, then
//! probes every `periodSeconds` (default 10) with a `timeoutSeconds` (default 1) deadline, and
//! turns the outcomes into a result once `successThreshold` (1) successes or
//! `failureThreshold` (3) failures ran in a row. When a result changes it wakes the runner,
//! which writes the pod status only then.
//!
//! Probes: `httpGet` (HTTP or HTTPS, the latter without certificate verification as kubelet;
//! host the pod IP unless `host` is given; the port by number or by the name of a container
//! port; `path`, `httpHeaders`; a status of 200–399 succeeds; redirects are not followed, a
//! 3xx counts as success) and `tcpSocket` (a connection succeeds). The node agent runs in the
//! host network namespace and reaches pod IPs over the node's bridge; pods in the host
//! network are probed on their pod IP, the node's address.
//!
//! Semantics, as kubelet: until the `startupProbe` succeeded the other probes do not run and
//! the container is neither started nor ready; a container without a `readinessProbe` is ready
//! once started; a failed `livenessProbe` or `startupProbe` asks the runner to restart the
//! container ([`ProbeStatus::restart`]).
//!
//! `exec` runs the command in the container ([`super::exec`]: its image's program, the
//! container's namespaces) and succeeds when it exits 0; on the timeout it is killed.
//!
//! # Caveats
//! `grpc` probes are not run (a warning is logged): they count as succeeding, so a pod that
//! uses one is not kept unready forever by a check this node cannot make.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, HTTPGetAction, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tracing::{debug, info, warn};

/// The `User-Agent` kubelet's HTTP probes send.
pub const USER_AGENT: &str = "kube-probe/1.33";

/// What the probes say of one container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeStatus {
    /// Its `startupProbe` succeeded, or it has none.
    pub started: bool,
    /// Started and its `readinessProbe` (if any) succeeds.
    pub ready: bool,
    /// Kubelet's message when a liveness or startup probe failed and the container is to be
    /// restarted.
    pub restart: Option<String>,
}

/// Which probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Startup,
    Readiness,
    Liveness,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Startup => "startup",
            Kind::Readiness => "readiness",
            Kind::Liveness => "liveness",
        }
    }
}

/// The results of a container's probes.
#[derive(Clone, Copy, Debug)]
struct Results {
    started: bool,
    ready: bool,
    /// A liveness or startup probe failed (its kind).
    failed: Option<Kind>,
}

struct Workers {
    pid: i32,
    results: Arc<Mutex<Results>>,
    has_readiness: bool,
    tasks: Vec<AbortHandle>,
}

impl Drop for Workers {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The probe workers of this node's containers.
pub struct Prober {
    /// By (pod uid, container name).
    workers: BTreeMap<(String, String), Workers>,
    /// Wakes the runner when a result changes.
    notify: mpsc::UnboundedSender<()>,
}

/// Where and how a container is probed.
#[derive(Clone, Debug)]
struct Target {
    pod_ip: String,
    container: Container,
    /// Where `exec` probes run.
    exec: super::exec::ExecTarget,
    /// Seconds since the container started (for `initialDelaySeconds`).
    running_for: Duration,
}

fn seconds(value: Option<i32>, default: i32) -> Duration {
    Duration::from_secs(u64::try_from(value.unwrap_or(default).max(0)).unwrap_or(0))
}

fn has_probes(container: &Container) -> bool {
    container.startup_probe.is_some()
        || container.readiness_probe.is_some()
        || container.liveness_probe.is_some()
}

impl Prober {
    /// A prober that wakes the runner through `notify` when a result changes.
    pub fn new(notify: mpsc::UnboundedSender<()>) -> Self {
        Self {
            workers: BTreeMap::new(),
            notify,
        }
    }

    /// What the probes say of `container` of pod `uid`, running as `pid` since `started_at`
    /// (RFC 3339); starts its probe workers when this process is new.
    pub fn observe(
        &mut self,
        uid: &str,
        container: &Container,
        pid: i32,
        started_at: &str,
        pod_ip: &str,
        exec: impl FnOnce() -> super::exec::ExecTarget,
    ) -> ProbeStatus {
        if !has_probes(container) {
            self.stop(uid, &container.name);
            return ProbeStatus {
                started: true,
                ready: true,
                restart: None,
            };
        }
        let key = (uid.to_owned(), container.name.clone());
        let stale = self.workers.get(&key).is_some_and(|w| w.pid != pid);
        if stale {
            self.workers.remove(&key);
        }
        let workers = self.workers.entry(key).or_insert_with(|| {
            let running_for = started_at
                .parse::<jiff::Timestamp>()
                .ok()
                .and_then(|t| Duration::try_from(jiff::Timestamp::now().duration_since(t)).ok())
                .unwrap_or_default();
            start_workers(
                pid,
                &Target {
                    pod_ip: pod_ip.to_owned(),
                    container: container.clone(),
                    exec: exec(),
                    running_for,
                },
                &self.notify,
            )
        });
        let results = workers.results.lock().map(|r| *r).unwrap_or(Results {
            started: false,
            ready: false,
            failed: None,
        });
        let restart = results.failed.map(|kind| {
            format!(
                "Container {} failed {} probe, will be restarted",
                container.name,
                kind.name()
            )
        });
        ProbeStatus {
            started: results.started,
            ready: results.started && (!workers.has_readiness || results.ready),
            restart,
        }
    }

    /// Stops the workers of a container that does not run (any more).
    pub fn stop(&mut self, uid: &str, container: &str) {
        self.workers.remove(&(uid.to_owned(), container.to_owned()));
    }

    /// Stops the workers of every pod not in `known` (by uid).
    pub fn forget(&mut self, known: &BTreeSet<String>) {
        self.workers.retain(|(uid, _), _| known.contains(uid));
    }

    /// Stops every worker of pod `uid`.
    pub fn stop_pod(&mut self, uid: &str) {
        self.workers.retain(|(u, _), _| u != uid);
    }
}

fn start_workers(pid: i32, target: &Target, notify: &mpsc::UnboundedSender<()>) -> Workers {
    let container = &target.container;
    let results = Arc::new(Mutex::new(Results {
        started: container.startup_probe.is_none(),
        ready: false,
        failed: None,
    }));
    let mut tasks = Vec::new();
    for (kind, probe) in [
        (Kind::Startup, &container.startup_probe),
        (Kind::Readiness, &container.readiness_probe),
        (Kind::Liveness, &container.liveness_probe),
    ] {
        let Some(probe) = probe.clone() else { continue };
        let worker = Worker {
            kind,
            probe,
            target: target.clone(),
            results: results.clone(),
            notify: notify.clone(),
        };
        tasks.push(tokio::spawn(worker.run()).abort_handle());
    }
    Workers {
        pid,
        results,
        has_readiness: container.readiness_probe.is_some(),
        tasks,
    }
}

/// One probe of one container, run periodically.
struct Worker {
    kind: Kind,
    probe: Probe,
    target: Target,
    results: Arc<Mutex<Results>>,
    notify: mpsc::UnboundedSender<()>,
}

impl Worker {
    async fn run(self) {
        let delay = seconds(self.probe.initial_delay_seconds, 0);
        if let Some(wait) = delay.checked_sub(self.target.running_for) {
            tokio::time::sleep(wait).await;
        }
        let period = seconds(self.probe.period_seconds, 10).max(Duration::from_secs(1));
        let timeout = seconds(self.probe.timeout_seconds, 1).max(Duration::from_secs(1));
        let success_threshold = self.probe.success_threshold.unwrap_or(1).max(1);
        let failure_threshold = self.probe.failure_threshold.unwrap_or(3).max(1);
        let mut last: Option<bool> = None;
        let mut run = 0;
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let started = self.results.lock().is_ok_and(|r| r.started);
            match self.kind {
                // Kubelet stops probing startup once it succeeded.
                Kind::Startup if started => return,
                Kind::Readiness | Kind::Liveness if !started => continue,
                _ => {}
            }
            let ok = match tokio::time::timeout(timeout, probe_once(&self.probe, &self.target))
                .await
            {
                Ok(Ok(())) => true,
                Ok(Err(e)) => {
                    debug!(container = %self.target.container.name, probe = self.kind.name(), error = %e, "probe failed");
                    false
                }
                Err(_) => {
                    debug!(container = %self.target.container.name, probe = self.kind.name(), "probe timed out");
                    false
                }
            };
            run = if last == Some(ok) { run + 1 } else { 1 };
            last = Some(ok);
            let threshold = if ok {
                success_threshold
            } else {
                failure_threshold
            };
            if run < threshold {
                continue;
            }
            if self.apply(ok) {
                let _ = self.notify.send(());
            }
            if !ok && self.kind != Kind::Readiness {
                // The container is restarted; this process is not probed again.
                return;
            }
        }
    }

    /// Records a result; whether anything changed.
    fn apply(&self, ok: bool) -> bool {
        let Ok(mut results) = self.results.lock() else {
            return false;
        };
        let before = *results;
        match (self.kind, ok) {
            (Kind::Startup, true) => results.started = true,
            (Kind::Readiness, ready) => results.ready = ready,
            (Kind::Startup | Kind::Liveness, false) => {
                results.failed.get_or_insert(self.kind);
            }
            (Kind::Liveness, true) => {}
        }
        let changed = before.started != results.started
            || before.ready != results.ready
            || before.failed != results.failed;
        if changed {
            info!(container = %self.target.container.name, probe = self.kind.name(), ok, "probe result changed");
        }
        changed
    }
}

/// Why one probe attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The port is neither a number nor the name of a container port.
    #[error("unknown port {0}")]
    Port(String),
    /// Connecting failed.
    #[error("connecting to {0}")]
    Connect(String, #[source] std::io::Error),
    /// The TLS handshake failed or TLS could not be set up.
    #[error("TLS with {0}")]
    Tls(String, #[source] std::io::Error),
    /// Sending the request or reading the answer failed.
    #[error("HTTP probe of {0}")]
    Http(String, #[source] std::io::Error),
    /// The answer was no HTTP response.
    #[error("HTTP probe of {0}: malformed response")]
    Malformed(String),
    /// The answer's status is not 200–399.
    #[error("HTTP probe failed with statuscode: {0}")]
    Status(u16),
    /// The command could not run.
    #[error(transparent)]
    Exec(#[from] super::exec::ExecError),
    /// The command exited with another code than 0 (kubelet's message).
    #[error("command {command:?} exited with {code}: {output}")]
    ExitCode {
        command: Vec<String>,
        code: i32,
        output: String,
    },
}

/// The port `port` names for `container`: a number, or the name of one of its ports.
fn port_number(port: &IntOrString, container: &Container) -> Result<u16, ProbeError> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| ProbeError::Port(n.to_string())),
        IntOrString::String(name) => name.parse::<u16>().ok().map_or_else(
            || {
                container
                    .ports
                    .iter()
                    .flatten()
                    .find(|p| p.name.as_deref() == Some(name.as_str()))
                    .and_then(|p| u16::try_from(p.container_port).ok())
                    .ok_or_else(|| ProbeError::Port(name.clone()))
            },
            Ok,
        ),
    }
}

fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

async fn probe_once(probe: &Probe, target: &Target) -> Result<(), ProbeError> {
    if let Some(http) = &probe.http_get {
        return http_probe(http, target).await;
    }
    if let Some(tcp) = &probe.tcp_socket {
        let host = tcp.host.as_deref().unwrap_or(&target.pod_ip);
        let addr = host_port(host, port_number(&tcp.port, &target.container)?);
        TcpStream::connect(&addr)
            .await
            .map_err(|e| ProbeError::Connect(addr, e))?;
        return Ok(());
    }
    if let Some(command) = probe.exec.as_ref().and_then(|e| e.command.as_ref()) {
        let outcome = super::exec::exec(&target.exec, command).await?;
        if outcome.exit_code == 0 {
            return Ok(());
        }
        return Err(ProbeError::ExitCode {
            command: command.clone(),
            code: outcome.exit_code,
            output: outcome.output.trim().to_owned(),
        });
    }
    // `grpc`: see the module's caveats.
    warn!(container = %target.container.name, "grpc probes are not run by this node; counting as success");
    Ok(())
}

/// The request an `httpGet` probe sends: kubelet's default headers, replaced by the probe's
/// own of the same name.
pub fn http_request(http: &HTTPGetAction, authority: &str) -> String {
    let path = http.path.as_deref().unwrap_or("/");
    let path = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    let mut headers: Vec<(String, String)> = vec![
        ("Host".into(), authority.to_owned()),
        ("User-Agent".into(), USER_AGENT.into()),
        ("Accept".into(), "*/*".into()),
    ];
    let own = http.http_headers.as_deref().unwrap_or_default();
    headers.retain(|(name, _)| !own.iter().any(|h| h.name.eq_ignore_ascii_case(name)));
    headers.extend(own.iter().map(|h| (h.name.clone(), h.value.clone())));
    let mut request = format!("GET {path} HTTP/1.1\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("Connection: close\r\n\r\n");
    request
}

/// The status code of an HTTP response's first line (`HTTP/1.1 200 OK`).
pub fn status_code(head: &[u8]) -> Option<u16> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split_whitespace();
    if !parts.next()?.starts_with("HTTP/") {
        return None;
    }
    parts.next()?.parse().ok()
}

async fn http_probe(http: &HTTPGetAction, target: &Target) -> Result<(), ProbeError> {
    let host = http.host.as_deref().unwrap_or(&target.pod_ip);
    let authority = host_port(host, port_number(&http.port, &target.container)?);
    let stream = TcpStream::connect(&authority)
        .await
        .map_err(|e| ProbeError::Connect(authority.clone(), e))?;
    let request = http_request(http, &authority);
    let code = if http.scheme.as_deref() == Some("HTTPS") {
        let config = kubevirt_tls::client_config(&kubevirt_tls::ServerTrust::DangerAcceptAny, None)
            .map_err(|e| ProbeError::Tls(authority.clone(), std::io::Error::other(e)))?;
        let name = tokio_rustls::rustls::pki_types::ServerName::try_from(host.to_owned())
            .map_err(|e| ProbeError::Tls(authority.clone(), std::io::Error::other(e)))?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, stream)
            .await
            .map_err(|e| ProbeError::Tls(authority.clone(), e))?;
        exchange(tls, &request, &authority).await?
    } else {
        exchange(stream, &request, &authority).await?
    };
    if (200..400).contains(&code) {
        Ok(())
    } else {
        Err(ProbeError::Status(code))
    }
}

/// Sends `request` and reads the response's status code.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    request: &str,
    authority: &str,
) -> Result<u16, ProbeError> {
    let io = |e| ProbeError::Http(authority.to_owned(), e);
    stream.write_all(request.as_bytes()).await.map_err(io)?;
    stream.flush().await.map_err(io)?;
    let mut head = Vec::with_capacity(256);
    let mut buf = [0u8; 256];
    while !head.contains(&b'\n') && head.len() < 4096 {
        let n = stream.read(&mut buf).await.map_err(io)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    status_code(&head).ok_or_else(|| ProbeError::Malformed(authority.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(v: serde_json::Value) -> Container {
        serde_json::from_value(v).expect("container")
    }

    #[test]
    fn ports_are_numbers_or_container_port_names() {
        let c = container(serde_json::json!({"name": "c",
            "ports": [{"name": "http", "containerPort": 8080}]}));
        assert_eq!(port_number(&IntOrString::Int(80), &c).expect("n"), 80);
        assert_eq!(
            port_number(&IntOrString::String("http".into()), &c).expect("n"),
            8080
        );
        assert_eq!(
            port_number(&IntOrString::String("81".into()), &c).expect("n"),
            81
        );
        assert!(port_number(&IntOrString::String("grpc".into()), &c).is_err());
        assert!(port_number(&IntOrString::Int(70000), &c).is_err());
    }

    #[test]
    fn requests_carry_kubelets_headers_and_the_probes_own() {
        let http: HTTPGetAction = serde_json::from_value(serde_json::json!({
            "path": "healthz", "port": 8443,
            "httpHeaders": [{"name": "host", "value": "example"}, {"name": "X-A", "value": "1"}]
        }))
        .expect("action");
        let request = http_request(&http, "10.0.0.2:8443");
        assert!(request.starts_with("GET /healthz HTTP/1.1\r\n"));
        assert!(request.contains(&format!("User-Agent: {USER_AGENT}\r\n")));
        assert!(request.contains("host: example\r\n"));
        assert!(!request.contains("Host: 10.0.0.2"));
        assert!(request.contains("X-A: 1\r\n"));
        assert!(request.ends_with("\r\n\r\n"));
    }

    #[test]
    fn status_lines_give_their_code() {
        assert_eq!(status_code(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(status_code(b"HTTP/1.0 302 Found\r\nLocation: x"), Some(302));
        assert_eq!(status_code(b"SSH-2.0-x\r\n"), None);
        assert_eq!(status_code(b""), None);
    }

    #[tokio::test]
    async fn an_http_probe_succeeds_on_2xx_and_3xx_only() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = tokio::spawn(async move {
            for code in [204, 301, 500] {
                let (mut s, _) = listener.accept().await.expect("accept");
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\n\r\n").as_bytes())
                    .await;
            }
        });
        let target = Target {
            exec: super::super::exec::ExecTarget::default(),
            pod_ip: "127.0.0.1".into(),
            container: container(serde_json::json!({"name": "c"})),
            running_for: Duration::ZERO,
        };
        let http: HTTPGetAction =
            serde_json::from_value(serde_json::json!({"port": port})).expect("action");
        assert!(http_probe(&http, &target).await.is_ok());
        assert!(http_probe(&http, &target).await.is_ok());
        assert!(matches!(
            http_probe(&http, &target).await,
            Err(ProbeError::Status(500))
        ));
        server.await.expect("server");
    }
}
