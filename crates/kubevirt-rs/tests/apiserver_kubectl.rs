//! End-to-end tests of the embedded API server driven by the real `kubectl` (and `curl`
//! for the crash test). Each test starts `kubevirt-rs server|apiserver` in its own process
//! group on a free port and a temporary data directory; the guard kills it (SIGKILL by pid) on drop.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(30);

/// A running server process; killed on drop.
struct Server {
    child: Child,
    data: PathBuf,
    addr: String,
}

impl Server {
    fn start(subcommand: &str, data: &Path) -> Server {
        let kubeconfig = data.join("kubeconfig");
        let _ = std::fs::remove_file(&kubeconfig);
        let child = Command::new(env!("CARGO_BIN_EXE_kubevirt-rs"))
            .args([subcommand, "--data-dir"])
            .arg(data)
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()
            .expect("start server");
        let mut server = Server {
            child,
            data: data.to_owned(),
            addr: String::new(),
        };
        let start = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(&kubeconfig)
                && let Some(line) = text.lines().find(|l| l.trim().starts_with("server: "))
            {
                server.addr = line
                    .trim()
                    .trim_start_matches("server: https://")
                    .to_owned();
                break;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "server did not write its kubeconfig"
            );
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("server exited early: {status}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// SIGKILL by pid (the server has no children), then reap it. Idempotent: a reaped
    /// child is never signalled again.
    fn kill(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        // `server` also runs the pod runner: stop the launchers (and guests) it started.
        testkit::kill_launchers(&self.data);
    }

    fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", self.data.join("kubeconfig"))
            .env("KUBECACHEDIR", self.data.join("kubecache"))
            .output()
            .expect("run kubectl")
    }

    /// Runs kubectl, asserts success, returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs kubectl, asserts failure, returns stderr.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            !out.status.success(),
            "kubectl {args:?} unexpectedly succeeded"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    fn apply(&self, yaml: &str) -> Output {
        let path = self.data.join(format!("m-{}.yaml", rand_suffix()));
        std::fs::write(&path, yaml).expect("write manifest");
        self.kubectl(&["apply", "-f", path.to_str().unwrap_or_default()])
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// A background `kubectl get -w`, killed on drop; lines arrive on a channel.
struct Watcher {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Watcher {
    fn start(server: &Server, args: &[&str]) -> Watcher {
        let mut child = Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", server.data.join("kubeconfig"))
            .env("KUBECACHEDIR", server.data.join("kubecache"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start kubectl -w");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Watcher { child, lines }
    }

    fn wait_for(&self, needle: &str) -> String {
        let start = Instant::now();
        while let Some(left) = DEADLINE.checked_sub(start.elapsed()) {
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        panic!("watch never printed {needle:?}");
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm1\n  labels: {app: demo}\ndata: {a: \"1\"}\n";

/// Strategic merge patch on a custom resource is a 415 as on kube; merge patch and explain work.
fn kubevirt_vm_is_served_and_explained(s: &Server) {
    let vm = "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata:\n  name: vm1\nspec:\n  runStrategy: Halted\n  template:\n    metadata:\n      labels: {app: demo}\n    spec:\n      domain:\n        devices: {}\n        resources: {requests: {memory: 64Mi}}\n";
    let out = s.apply(vm);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = s.fails(&[
        "patch",
        "vm",
        "vm1",
        "-p",
        r#"{"spec":{"runStrategy":"Always"}}"#,
    ]);
    assert!(err.contains("not supported"), "{err}");
    s.ok(&[
        "patch",
        "vm",
        "vm1",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"runStrategy":"Always"}}"#,
    ]);
    let explain = s.ok(&["explain", "vm.spec"]);
    assert!(explain.contains("runStrategy"), "{explain}");
}

#[test]
fn kubectl_drives_the_full_object_lifecycle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Server::start("server", dir.path());

    let ns = s.ok(&["get", "ns"]);
    for n in ["default", "kube-system", "kube-public", "kubevirt"] {
        assert!(ns.contains(n), "{ns}");
    }
    let resources = s.ok(&["api-resources"]);
    assert!(
        resources.contains("vm,vms") && resources.contains("vmi,vmis"),
        "{resources}"
    );

    let watch = Watcher::start(&s, &["get", "cm", "-w"]);
    assert!(s.apply(CM).status.success());
    watch.wait_for("cm1");
    assert!(
        String::from_utf8_lossy(&s.apply(CM).stdout).contains("unchanged"),
        "re-apply is a no-op"
    );
    let yaml = s.ok(&["get", "cm", "cm1", "-o", "yaml"]);
    assert!(
        yaml.contains("a: \"1\"") && yaml.contains("resourceVersion"),
        "{yaml}"
    );
    let table = s.ok(&["get", "cm", "--show-labels"]);
    assert!(
        table.contains("DATA") && table.contains("app=demo"),
        "{table}"
    );

    s.ok(&["label", "cm", "cm1", "env=prod"]);
    s.ok(&["annotate", "cm", "cm1", "note=hi"]);
    s.ok(&[
        "patch",
        "cm",
        "cm1",
        "--type",
        "merge",
        "-p",
        r#"{"data":{"b":"2"}}"#,
    ]);
    s.ok(&[
        "patch",
        "cm",
        "cm1",
        "--type",
        "json",
        "-p",
        r#"[{"op":"add","path":"/data/c","value":"3"}]"#,
    ]);
    s.ok(&[
        "patch",
        "cm",
        "cm1",
        "--type",
        "strategic",
        "-p",
        r#"{"data":{"d":"4"}}"#,
    ]);
    let json = s.ok(&["get", "cm", "cm1", "-o", "json"]);
    for want in [
        "\"env\": \"prod\"",
        "\"note\": \"hi\"",
        "\"b\": \"2\"",
        "\"c\": \"3\"",
        "\"d\": \"4\"",
    ] {
        assert!(json.contains(want), "{want} missing in {json}");
    }
    let filtered = s.ok(&["get", "cm", "-l", "env=prod", "-o", "name"]);
    assert_eq!(filtered.trim(), "configmap/cm1");

    // A replace carrying a stale resourceVersion is refused.
    let stale = dir.path().join("stale.json");
    std::fs::write(&stale, &json).expect("write");
    s.ok(&["label", "cm", "cm1", "more=1"]);
    let err = s.fails(&["replace", "-f", stale.to_str().unwrap_or_default()]);
    assert!(err.contains("the object has been modified"), "{err}");

    kubevirt_vm_is_served_and_explained(&s);

    // Delete and wait for it.
    s.ok(&["delete", "cm", "cm1", "--wait=false"]);
    s.ok(&["wait", "--for=delete", "cm/cm1", "--timeout=20s"]);
    watch.wait_for("cm1");
    let err = s.fails(&["get", "cm", "cm1"]);
    assert!(err.contains("NotFound"), "{err}");

    // `kubectl get -o json` of several objects prints a `v1` `List`, which `kubectl create -f`
    // takes back with the default (strict) validation.
    s.ok(&["create", "cm", "listed-a", "--from-literal=k=a"]);
    s.ok(&["create", "cm", "listed-b", "--from-literal=k=b"]);
    let list = s.ok(&["get", "cm", "listed-a", "listed-b", "-o", "json"]);
    assert!(list.contains("\"kind\": \"List\""), "{list}");
    let list_file = s.data.join("list.json");
    std::fs::write(&list_file, &list).expect("write the list");
    s.ok(&["delete", "cm", "listed-a", "listed-b"]);
    let created = s.ok(&["create", "-f", list_file.to_str().unwrap_or_default()]);
    assert!(
        created.contains("listed-a created") && created.contains("listed-b created"),
        "{created}"
    );
    assert_eq!(
        s.ok(&["get", "cm", "listed-b", "-o", "jsonpath={.data.k}"]),
        "b"
    );
}

const WIDGET_CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: Color, type: string, jsonPath: .spec.color}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [color]
            properties:
              color: {type: string, enum: [red, blue]}
              size: {type: integer, minimum: 1, default: 3}
          status:
            type: object
            properties:
              conditions:
                type: array
                items:
                  type: object
                  properties:
                    type: {type: string}
                    status: {type: string}
"#;

#[test]
fn a_crd_applied_at_run_time_is_served_validated_and_pruned() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Server::start("apiserver", dir.path());
    let out = s.apply(WIDGET_CRD);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/widgets.example.com",
        "--timeout=20s",
    ]);

    let bad = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: bad}\nspec: {color: green, size: 0}\n";
    let out = s.apply(bad);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("is invalid") && err.contains("spec.color"),
        "{err}"
    );

    let unknown = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w0}\nspec: {color: red, bogus: 1}\n";
    let out = s.apply(unknown);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("unknown field"),
        "{err}"
    );

    let good = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {color: red, bogus: 1}\n";
    let path = dir.path().join("good.yaml");
    std::fs::write(&path, good).expect("write");
    s.ok(&[
        "apply",
        "--validate=false",
        "-f",
        path.to_str().unwrap_or_default(),
    ]);
    let json = s.ok(&["get", "wd", "w1", "-o", "json"]);
    assert!(
        !json.contains("\"bogus\": 1"),
        "unknown field pruned: {json}"
    );
    assert!(json.contains("\"size\": 3"), "default applied: {json}");
    let table = s.ok(&["get", "widgets"]);
    assert!(table.contains("COLOR"), "{table}");

    s.ok(&[
        "patch",
        "widget",
        "w1",
        "--subresource=status",
        "--type",
        "merge",
        "-p",
        r#"{"status":{"conditions":[{"type":"Ready","status":"True"}]}}"#,
    ]);
    s.ok(&[
        "wait",
        "--for=condition=Ready",
        "widget/w1",
        "--timeout=20s",
    ]);
}

fn curl_create(s: &Server, name: &str) -> Option<u16> {
    let pki = s.data.join("pki");
    let body = format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}"}},"data":{{"k":"{name}"}}}}"#
    );
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
        ])
        .arg("--cacert")
        .arg(pki.join("ca.crt"))
        .arg("--cert")
        .arg(pki.join("admin.crt"))
        .arg("--key")
        .arg(pki.join("admin.key"))
        .args([
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "-d",
            &body,
        ])
        .arg(format!(
            "https://{}/api/v1/namespaces/default/configmaps",
            s.addr
        ))
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

#[test]
fn every_acknowledged_create_survives_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = Server::start("apiserver", dir.path());
    let (tx, rx) = mpsc::channel::<String>();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acked = std::thread::scope(|scope| {
        for client in 0..8 {
            let tx = tx.clone();
            let stop = stop.clone();
            let s = &s;
            scope.spawn(move || {
                for i in 0.. {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let name = format!("c{client}-{i}");
                    match curl_create(s, &name) {
                        Some(201) => {
                            let _ = tx.send(name);
                        }
                        _ => break,
                    }
                }
            });
        }
        drop(tx);
        // Let the clients get going, then kill the server mid-flight.
        let mut acked = Vec::new();
        while acked.len() < 40 {
            match rx.recv_timeout(DEADLINE) {
                Ok(n) => acked.push(n),
                Err(_) => panic!("clients made no progress"),
            }
        }
        let _ = Command::new("kill")
            .args(["-s", "KILL", &s.child.id().to_string()])
            .status();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        acked.extend(rx.iter());
        acked
    });
    s.kill();
    drop(s);
    let s = Server::start("apiserver", dir.path());
    let names = s.ok(&["get", "cm", "-o", "name"]);
    for name in &acked {
        assert!(
            names.contains(&format!("configmap/{name}\n")),
            "acknowledged {name} lost after SIGKILL"
        );
    }
    assert!(acked.len() >= 40);
}
