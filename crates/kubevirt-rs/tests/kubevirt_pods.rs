//! End-to-end: `kubevirt-rs server` installs KubeVirt from deploy/'s manifests and runs its
//! components as pods, each its own process: virt-api and virt-controller as Deployments
//! (2/2 Available), virt-handler as a DaemonSet. The seed article's Deployment-args check
//! shows the CR's controller flags; SIGKILLing the leading virt-controller hands the Lease to
//! the other replica, and a VM created afterwards starts. With `--fake-qemu` (a control-plane
//! test).

use std::path::Path;

use testkit::{DEADLINE, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

/// A Lease is taken over once it has not been renewed for its duration (15 s) plus the
/// retry period: longer than the default deadline leaves room for.
const TAKEOVER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(90);

fn get(server: &ServerProcess, args: &[&str], template: &str) -> String {
    let mut all = vec!["-n", "kubevirt", "get"];
    all.extend_from_slice(args);
    let template = format!("jsonpath={template}");
    all.extend(["-o", template.as_str()]);
    server.ok(&all).unwrap_or_default()
}

fn fail(server: &ServerProcess) -> impl Fn(anyhow::Error) -> anyhow::Error + '_ {
    move |e| anyhow::anyhow!("{e}\nserver log:\n{}", server.log())
}

/// The pid the node agent recorded for container `container` of pod `kubevirt/pod`.
fn container_pid(server: &ServerProcess, pod: &str, container: &str) -> anyhow::Result<i32> {
    server.container_pid("kubevirt", pod, container)
}

/// Both virt-controller replicas serve upstream's port 8443 with the operator's certificate
/// for `virt-controller.kubevirt.svc`: `/leader` and the leading-status gauge say which one
/// leads, both are ready to lead, and `/healthz` reaches the API server.
fn assert_controller_port(server: &ServerProcess, leader: &str) -> anyhow::Result<()> {
    let ca = get(server, &["configmap", "kubevirt-ca"], "{.data.ca-bundle}");
    let pods = get(
        server,
        &["pods", "-l", "kubevirt.io=virt-controller"],
        r#"{range .items[*]}{.metadata.name} {.status.podIP}{"\n"}{end}"#,
    );
    let mut seen = 0;
    for line in pods.lines() {
        let (pod, ip) = line.split_once(' ').unwrap_or_default();
        let leads = pod == leader;
        let address = format!("{ip}:8443");
        let https = |path: &str| {
            testkit::https_get(&address, path, &ca, "virt-controller.kubevirt.svc")
                .map_err(|e| anyhow::anyhow!("GET {path} of {pod} at {address}: {e:#}"))
        };
        assert_eq!(
            https("/leader")?,
            (200, format!(r#"{{"apiserver":{{"leader":"{leads}"}}}}"#)),
            "{pod}"
        );
        let (status, health) = https("/healthz")?;
        assert_eq!(status, 200, "{health}");
        assert!(health.contains(r#""connectivity":"ok""#), "{health}");
        let (status, metrics) = https("/metrics")?;
        assert_eq!(status, 200, "{metrics}");
        let gauge = |name: &str| {
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .map(str::to_owned)
        };
        assert_eq!(
            gauge("kubevirt_virt_controller_leading_status").as_deref(),
            Some(if leads { "1" } else { "0" }),
            "{pod}: {metrics}"
        );
        assert_eq!(
            gauge("kubevirt_virt_controller_ready_status").as_deref(),
            Some("1"),
            "{pod}: {metrics}"
        );
        // The REST client families count this replica's own requests: both read the Lease,
        // only the leader wrote it successfully and watches the VMIs.
        let sent = |code: &str, resource: &str, verb: &str| {
            let labels = format!(r#",resource="{resource}",verb="{verb}"}}"#);
            metrics
                .lines()
                .filter(|l| l.starts_with(&format!("kubevirt_rest_client_requests_total{{{code}")))
                .filter(|l| l.split(' ').next().is_some_and(|k| k.ends_with(&labels)))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .sum::<u64>()
        };
        assert!(sent("", "leases", "GET") >= 1, "{pod}: {metrics}");
        let written =
            sent(r#"code="201""#, "leases", "CREATE") + sent(r#"code="200""#, "leases", "UPDATE");
        assert_eq!(written >= 1, leads, "{pod}: {metrics}");
        assert_eq!(
            sent("", "virtualmachineinstances", "WATCH") >= 1,
            leads,
            "{pod}: {metrics}"
        );
        seen += 1;
    }
    assert_eq!(seen, 2, "two controller pods: {pods}");
    Ok(())
}

#[test]
fn kubevirt_runs_as_pods_and_a_killed_leader_hands_over() -> anyhow::Result<()> {
    let server = ServerProcess::start(
        Path::new(BIN),
        "server",
        &[
            "--fake-qemu",
            "--additional-launcher-labels-sync",
            "ops.example.com/*",
        ],
    )?;

    // Ready means the components are: the three Deployments 2/2 (the operator's, then the
    // two it installs), the handler on the node.
    let ready = get(
        &server,
        &["deploy"],
        "{range .items[*]}{.metadata.name}={.status.availableReplicas}/{.spec.replicas} {end}",
    );
    assert_eq!(
        ready.trim(),
        "virt-api=2/2 virt-controller=2/2 virt-operator=2/2",
        "{}",
        server.log()
    );
    let handlers = get(
        &server,
        &["ds", "virt-handler"],
        "{.status.numberReady}/{.status.desiredNumberScheduled}",
    );
    assert_eq!(handlers, "1/1");
    server.ok(&[
        "-n",
        "kubevirt",
        "rollout",
        "status",
        "deploy/virt-controller",
        "--timeout=60s",
    ])?;

    // Each pod is a process of its own, started from its own command.
    let pods = get(
        &server,
        &["pods", "-l", "kubevirt.io"],
        "{range .items[*]}{.metadata.name} {.spec.containers[0].name} {.status.podIP}\n{end}",
    );
    let mut pids = std::collections::BTreeSet::new();
    for line in pods.lines() {
        let [pod, container, ip] = line.split(' ').collect::<Vec<_>>()[..] else {
            anyhow::bail!("unexpected line {line:?}");
        };
        assert!(!ip.is_empty(), "{pod} has no IP");
        let pid = container_pid(&server, pod, container)?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))?;
        let argv: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let subcommand = container.trim_start_matches("virt-");
        assert_eq!(
            argv.get(1).map(String::as_str),
            Some(subcommand),
            "{argv:?}"
        );
        pids.insert(pid);
    }
    assert_eq!(pids.len(), 7, "seven component processes: {pods}");

    // The seed article's check: the CR's controller flag is in the Deployment's args.
    let args = get(
        &server,
        &["deploy", "virt-controller"],
        r#"{.spec.template.spec.containers[0].command}{" "}{.spec.template.spec.containers[0].args}"#,
    );
    assert_eq!(
        args,
        r#"["kubevirt-rs","controller"] ["--launcher-image","kubevirt-rs/virt-launcher:0.1.0","--namespace","kubevirt","--port","8443","--additional-launcher-labels-sync","ops.example.com/*"]"#
    );

    // SIGKILL the leader: the other replica takes the Lease over.
    let holder = get(
        &server,
        &["lease", "virt-controller"],
        "{.spec.holderIdentity}",
    );
    let leader = get(
        &server,
        &["pods", "-l", "kubevirt.io=virt-controller"],
        "{.items[*].metadata.name}",
    )
    .split(' ')
    .find(|pod| holder.starts_with(&format!("{pod}_")))
    .map(str::to_owned)
    .ok_or_else(|| anyhow::anyhow!("no controller pod holds the Lease ({holder:?})"))?;
    assert_controller_port(&server, &leader)?;
    let pid = container_pid(&server, &leader, "virt-controller")?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    let new_holder = wait_until(TAKEOVER_DEADLINE, "another controller to lead", || {
        let now = get(
            &server,
            &["lease", "virt-controller"],
            "{.spec.holderIdentity}",
        );
        (!now.is_empty() && !now.starts_with(&format!("{leader}_"))).then_some(now)
    })
    .map_err(fail(&server))?;
    assert_ne!(new_holder, holder);

    // A VM created now starts under the new leader.
    server.apply(
        r"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: after-handover
spec:
  runStrategy: Always
  template:
    spec:
      domain:
        memory: {guest: 128Mi}
        devices: {}
",
    )?;
    wait_until(DEADLINE, "the VM to run", || {
        let phase = server
            .ok(&[
                "get",
                "vmi",
                "after-handover",
                "-o",
                "jsonpath={.status.phase}",
            ])
            .unwrap_or_default();
        (phase == "Running").then_some(())
    })
    .map_err(fail(&server))?;
    // The killed container was restarted by its node agent.
    wait_until(DEADLINE, "the killed controller to be restarted", || {
        let restarts = get(
            &server,
            &["pod", &leader],
            "{.status.containerStatuses[0].restartCount}",
        );
        (restarts == "1").then_some(())
    })
    .map_err(fail(&server))?;
    Ok(())
}

#[test]
fn no_kubevirt_gives_the_bare_embedded_kubernetes() -> anyhow::Result<()> {
    let server = ServerProcess::start(Path::new(BIN), "server", &["--no-kubevirt"])?;
    let out = server.kubectl(&["get", "crd", "virtualmachines.kubevirt.io"]);
    assert!(!out.status.success(), "no KubeVirt CRDs");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("NotFound"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let namespaces = server.ok(&["get", "ns", "-o", "jsonpath={.items[*].metadata.name}"])?;
    assert!(
        !namespaces.split(' ').any(|n| n == "kubevirt"),
        "{namespaces}"
    );
    // The embedded Kubernetes itself is there: a node registers.
    wait_until(DEADLINE, "a Ready node", || {
        let status = server
            .ok(&[
                "get",
                "nodes",
                "-o",
                r#"jsonpath={.items[*].status.conditions[?(@.type=="Ready")].status}"#,
            ])
            .unwrap_or_default();
        (status == "True").then_some(())
    })
    .map_err(fail(&server))?;
    Ok(())
}

/// Every component runs with deploy/'s RBAC only: take `create pods` away from
/// virt-controller's ClusterRole and its attempt to start a VM fails with kube's 403, which
/// its log shows.
#[test]
fn virt_controller_without_create_pods_fails_with_a_403() -> anyhow::Result<()> {
    let server = ServerProcess::start(Path::new(BIN), "server", &["--fake-qemu"])?;
    let role = server.ok(&["get", "clusterrole", "kubevirt-controller", "-o", "json"])?;
    let mut role: serde_json::Value = serde_json::from_str(&role)?;
    let shown = role.to_string();
    let rules = role["rules"]
        .as_array_mut()
        .ok_or_else(|| anyhow::anyhow!("no rules in {shown}"))?;
    let mut narrowed = vec![];
    for rule in rules.iter_mut() {
        let core = rule["apiGroups"]
            .as_array()
            .is_some_and(|g| g.iter().any(|g| g == ""));
        let Some(resources) = rule["resources"].as_array_mut() else {
            continue;
        };
        if core && resources.iter().any(|r| r == "pods") {
            resources.retain(|r| r != "pods");
            let verbs: Vec<serde_json::Value> = rule["verbs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|v| *v != "create")
                .cloned()
                .collect();
            narrowed.push(
                serde_json::json!({"apiGroups": [""], "resources": ["pods"], "verbs": verbs}),
            );
        }
    }
    anyhow::ensure!(!narrowed.is_empty(), "no rule grants pods: {shown}");
    rules.extend(narrowed);
    let path = server.data_dir().join("narrowed-role.json");
    std::fs::write(&path, serde_json::to_vec(&role)?)?;
    server.ok(&["replace", "-f", &path.display().to_string()])?;
    let can = server.kubectl(&[
        "auth",
        "can-i",
        "create",
        "pods",
        "--as",
        "system:serviceaccount:kubevirt:kubevirt-controller",
    ]);
    assert_eq!(String::from_utf8_lossy(&can.stdout).trim(), "no");

    server.apply(
        r"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: no-pod
spec:
  runStrategy: Always
  template:
    spec:
      domain:
        memory: {guest: 128Mi}
        devices: {}
",
    )?;
    let forbidden = r#"User "system:serviceaccount:kubevirt:kubevirt-controller" cannot create resource "pods""#;
    wait_until(DEADLINE, "virt-controller's 403", || {
        let logs = server.kubectl(&[
            "-n",
            "kubevirt",
            "logs",
            "-l",
            "kubevirt.io=virt-controller",
            "--tail=-1",
        ]);
        String::from_utf8_lossy(&logs.stdout)
            .contains(forbidden)
            .then_some(())
    })
    .map_err(fail(&server))?;
    let pods = server.ok(&["get", "pods", "-o", "name"])?;
    assert!(pods.is_empty(), "no launcher pod without the right: {pods}");
    Ok(())
}
