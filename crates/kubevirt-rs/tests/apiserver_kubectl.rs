//! End-to-end tests of the embedded API server driven by the real `kubectl` (and `curl`
//! for the crash test), each against its own `kubevirt-rs server|apiserver` process from
//! testkit's [`ServerProcess`] (a free port, a temporary data directory, killed on drop).

use std::path::Path;
use std::process::Command;
use std::sync::mpsc;

use testkit::{DEADLINE, ServerProcess};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm1\n  labels: {app: demo}\ndata: {a: \"1\"}\n";

/// Strategic merge patch on a custom resource is a 415 as on kube; merge patch and explain work.
fn kubevirt_vm_is_served_and_explained(s: &ServerProcess) -> anyhow::Result<()> {
    let vm = "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata:\n  name: vm1\nspec:\n  runStrategy: Halted\n  template:\n    metadata:\n      labels: {app: demo}\n    spec:\n      domain:\n        devices: {}\n        resources: {requests: {memory: 64Mi}}\n";
    let out = s.apply_output(vm)?;
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
    ])?;
    assert!(err.contains("not supported"), "{err}");
    s.ok(&[
        "patch",
        "vm",
        "vm1",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"runStrategy":"Always"}}"#,
    ])?;
    let explain = s.ok(&["explain", "vm.spec"])?;
    assert!(explain.contains("runStrategy"), "{explain}");
    Ok(())
}

#[test]
fn kubectl_drives_the_full_object_lifecycle() -> anyhow::Result<()> {
    let s = ServerProcess::start(Path::new(BIN), "server", &[])?;

    let ns = s.ok(&["get", "ns"])?;
    for n in ["default", "kube-system", "kube-public", "kubevirt"] {
        assert!(ns.contains(n), "{ns}");
    }
    let resources = s.ok(&["api-resources"])?;
    assert!(
        resources.contains("vm,vms") && resources.contains("vmi,vmis"),
        "{resources}"
    );

    let watch = s.watch(&["get", "cm", "-w"])?;
    assert!(s.apply_output(CM)?.status.success());
    watch.wait_for("cm1", DEADLINE)?;
    assert!(
        String::from_utf8_lossy(&s.apply_output(CM)?.stdout).contains("unchanged"),
        "re-apply is a no-op"
    );
    let yaml = s.ok(&["get", "cm", "cm1", "-o", "yaml"])?;
    assert!(
        yaml.contains("a: \"1\"") && yaml.contains("resourceVersion"),
        "{yaml}"
    );
    let table = s.ok(&["get", "cm", "--show-labels"])?;
    assert!(
        table.contains("DATA") && table.contains("app=demo"),
        "{table}"
    );

    s.ok(&["label", "cm", "cm1", "env=prod"])?;
    s.ok(&["annotate", "cm", "cm1", "note=hi"])?;
    s.ok(&[
        "patch",
        "cm",
        "cm1",
        "--type",
        "merge",
        "-p",
        r#"{"data":{"b":"2"}}"#,
    ])?;
    s.ok(&[
        "patch",
        "cm",
        "cm1",
        "--type",
        "json",
        "-p",
        r#"[{"op":"add","path":"/data/c","value":"3"}]"#,
    ])?;
    s.ok(&[
        "patch",
        "cm",
        "cm1",
        "--type",
        "strategic",
        "-p",
        r#"{"data":{"d":"4"}}"#,
    ])?;
    let json = s.ok(&["get", "cm", "cm1", "-o", "json"])?;
    for want in [
        "\"env\": \"prod\"",
        "\"note\": \"hi\"",
        "\"b\": \"2\"",
        "\"c\": \"3\"",
        "\"d\": \"4\"",
    ] {
        assert!(json.contains(want), "{want} missing in {json}");
    }
    let filtered = s.ok(&["get", "cm", "-l", "env=prod", "-o", "name"])?;
    assert_eq!(filtered.trim(), "configmap/cm1");

    // A replace carrying a stale resourceVersion is refused.
    let stale = s.data_dir().join("stale.json");
    std::fs::write(&stale, &json).expect("write");
    s.ok(&["label", "cm", "cm1", "more=1"])?;
    let err = s.fails(&["replace", "-f", stale.to_str().unwrap_or_default()])?;
    assert!(err.contains("the object has been modified"), "{err}");

    kubevirt_vm_is_served_and_explained(&s)?;

    // Delete and wait for it.
    s.ok(&["delete", "cm", "cm1", "--wait=false"])?;
    s.ok(&["wait", "--for=delete", "cm/cm1", "--timeout=20s"])?;
    watch.wait_for("cm1", DEADLINE)?;
    let err = s.fails(&["get", "cm", "cm1"])?;
    assert!(err.contains("NotFound"), "{err}");

    // `kubectl get -o json` of several objects prints a `v1` `List`, which `kubectl create -f`
    // takes back with the default (strict) validation.
    s.ok(&["create", "cm", "listed-a", "--from-literal=k=a"])?;
    s.ok(&["create", "cm", "listed-b", "--from-literal=k=b"])?;
    let list = s.ok(&["get", "cm", "listed-a", "listed-b", "-o", "json"])?;
    assert!(list.contains("\"kind\": \"List\""), "{list}");
    let list_file = s.data_dir().join("list.json");
    std::fs::write(&list_file, &list).expect("write the list");
    s.ok(&["delete", "cm", "listed-a", "listed-b"])?;
    let created = s.ok(&["create", "-f", list_file.to_str().unwrap_or_default()])?;
    assert!(
        created.contains("listed-a created") && created.contains("listed-b created"),
        "{created}"
    );
    assert_eq!(
        s.ok(&["get", "cm", "listed-b", "-o", "jsonpath={.data.k}"])?,
        "b"
    );
    Ok(())
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
fn a_crd_applied_at_run_time_is_served_validated_and_pruned() -> anyhow::Result<()> {
    let s = ServerProcess::start(Path::new(BIN), "apiserver", &[])?;
    let out = s.apply_output(WIDGET_CRD)?;
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
    ])?;

    let bad = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: bad}\nspec: {color: green, size: 0}\n";
    let out = s.apply_output(bad)?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("is invalid") && err.contains("spec.color"),
        "{err}"
    );

    let unknown = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w0}\nspec: {color: red, bogus: 1}\n";
    let out = s.apply_output(unknown)?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("unknown field"),
        "{err}"
    );

    let good = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {color: red, bogus: 1}\n";
    let path = s.data_dir().join("good.yaml");
    std::fs::write(&path, good).expect("write");
    s.ok(&[
        "apply",
        "--validate=false",
        "-f",
        path.to_str().unwrap_or_default(),
    ])?;
    let json = s.ok(&["get", "wd", "w1", "-o", "json"])?;
    assert!(
        !json.contains("\"bogus\": 1"),
        "unknown field pruned: {json}"
    );
    assert!(json.contains("\"size\": 3"), "default applied: {json}");
    let table = s.ok(&["get", "widgets"])?;
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
    ])?;
    s.ok(&[
        "wait",
        "--for=condition=Ready",
        "widget/w1",
        "--timeout=20s",
    ])?;
    Ok(())
}

fn curl_create(s: &ServerProcess, addr: &str, name: &str) -> Option<u16> {
    let pki = s.data_dir().join("pki");
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
            "https://{addr}/api/v1/namespaces/default/configmaps"
        ))
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

#[test]
fn every_acknowledged_create_survives_sigkill() -> anyhow::Result<()> {
    let mut s = ServerProcess::start(Path::new(BIN), "apiserver", &[])?;
    let addr = s.address()?;
    let pid = s.pid().map(|p| p.to_string()).unwrap_or_default();
    let (tx, rx) = mpsc::channel::<String>();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acked = std::thread::scope(|scope| {
        for client in 0..8 {
            let tx = tx.clone();
            let stop = stop.clone();
            let (s, addr) = (&s, &addr);
            scope.spawn(move || {
                for i in 0.. {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let name = format!("c{client}-{i}");
                    match curl_create(s, addr, &name) {
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
        let _ = Command::new("kill").args(["-s", "KILL", &pid]).status();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        acked.extend(rx.iter());
        acked
    });
    // Start again on the same data directory.
    s.restart()?;
    let names = s.ok(&["get", "cm", "-o", "name"])?;
    for name in &acked {
        assert!(
            names.contains(&format!("configmap/{name}\n")),
            "acknowledged {name} lost after SIGKILL"
        );
    }
    assert!(acked.len() >= 40);
    Ok(())
}
