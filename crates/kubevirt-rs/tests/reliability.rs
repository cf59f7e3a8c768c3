//! Reliability under churn (`kubevirt-rs server --fake-qemu`): VMs are started, stopped,
//! restarted, deleted and created again at random while the server (API server, scheduler,
//! node agent), the leading virt-controller and virt-handler are SIGKILLed at random moments.
//! Afterwards every VM converges to the last run strategy the test was told was written, no
//! acknowledged write is lost, no VMI has two launcher pods, and no launcher process outlives
//! its VMI or is started twice.
//!
//! Sizes: `KUBEVIRT_RS_CHURN_VMS` VMs (default 30) and two actions per VM, a kill after every
//! tenth action at the most (the actions stop at a time budget); the seed
//! (`KUBEVIRT_RS_CHURN_SEED`, default from the clock) is printed, so a failing run can be
//! repeated. docs/reliability.md records the figures of a larger run.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use testkit::{ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

/// How long the cluster gets to converge after the last action (fake QEMU: seconds per VM
/// under load in a debug build).
const CONVERGENCE: Duration = Duration::from_secs(240);
/// How long the actions may take in all, so that the test fails on its own deadlines (and
/// cleans up) well before the test runner's timeout.
const CHURN_BUDGET: Duration = Duration::from_secs(180);
/// How long one command is retried while a component it needs restarts.
const RETRY: Duration = Duration::from_secs(90);

/// A small deterministic generator (xorshift64*): the run is reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap_or(0)
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn vm(name: &str, run_strategy: &str) -> String {
    format!(
        r"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: {name}
spec:
  runStrategy: {run_strategy}
  template:
    metadata:
      labels: {{churn: test}}
    spec:
      domain:
        memory: {{guest: 64Mi}}
        devices: {{}}
"
    )
}

/// What the test was told is stored: `None` once a delete was acknowledged.
type Expected = BTreeMap<String, Option<&'static str>>;

/// Runs a kubectl command until it succeeds (the API server or virt-api may be restarting);
/// `accept` turns some failures into successes (a delete of what is gone).
fn acknowledged(
    server: &ServerProcess,
    args: &[&str],
    accept: impl Fn(&str) -> bool,
) -> anyhow::Result<()> {
    wait_until(
        RETRY,
        &format!("kubectl {args:?} to be acknowledged"),
        || {
            let out = server.kubectl(args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            (out.status.success() || accept(&stderr)).then_some(())
        },
    )
}

fn virtctl_restart(server: &ServerProcess, virtctl: &Path, name: &str) -> anyhow::Result<()> {
    wait_until(RETRY, &format!("virtctl restart {name}"), || {
        let out = std::process::Command::new(virtctl)
            .args(["restart", name])
            .env("KUBECONFIG", server.kubeconfig())
            .output()
            .ok()?;
        out.status.success().then_some(())
    })
}

/// One random action on one VM; the expectation changes only once the write is acknowledged.
fn act(
    server: &ServerProcess,
    virtctl: &Path,
    rng: &mut Rng,
    expected: &mut Expected,
) -> anyhow::Result<String> {
    let names: Vec<String> = expected.keys().cloned().collect();
    let name = &names[rng.below(names.len())];
    let current = expected[name];
    let action = match current {
        None => {
            let strategy = if rng.below(2) == 0 {
                "Always"
            } else {
                "Halted"
            };
            let manifest = vm(name, strategy);
            // A create must not land on the deleted VM while it is still terminating (it
            // would be applied to the old object and vanish with it).
            wait_until(RETRY, &format!("the deleted {name} to be gone"), || {
                let out = server.kubectl(&["get", "vm", name]);
                String::from_utf8_lossy(&out.stderr)
                    .contains("NotFound")
                    .then_some(())
            })?;
            wait_until(RETRY, &format!("creating {name}"), || {
                server.apply(&manifest).ok()
            })?;
            expected.insert(name.clone(), Some(strategy));
            format!("create {name} {strategy}")
        }
        Some(strategy) => match rng.below(4) {
            0 => {
                acknowledged(server, &["delete", "vm", name, "--wait=false"], |e| {
                    e.contains("NotFound")
                })?;
                expected.insert(name.clone(), None);
                format!("delete {name}")
            }
            1 if strategy == "Always" => {
                virtctl_restart(server, virtctl, name)?;
                format!("restart {name}")
            }
            _ => {
                let next = if strategy == "Always" {
                    "Halted"
                } else {
                    "Always"
                };
                if next == "Halted" {
                    // As upstream, a start request still pending from a restart turns a
                    // Halted VM back to Always once its VMI is gone: let the restart be
                    // consumed first, so that the last write decides.
                    let what = format!("{name}'s state change requests to be done");
                    wait_until(RETRY, &what, || {
                        let out = server.kubectl(&[
                            "get",
                            "vm",
                            name,
                            "-o",
                            "jsonpath={.status.stateChangeRequests}",
                        ]);
                        (out.status.success() && out.stdout.trim_ascii().is_empty()).then_some(())
                    })?;
                }
                let patch = format!(r#"{{"spec":{{"runStrategy":"{next}"}}}}"#);
                acknowledged(
                    server,
                    &["patch", "vm", name, "--type=merge", "-p", &patch],
                    |_| false,
                )?;
                expected.insert(name.clone(), Some(next));
                format!("runStrategy {name} {next}")
            }
        },
    };
    Ok(action)
}

/// The kinds of process the test kills.
#[derive(Clone, Copy, Debug)]
enum Victim {
    Server,
    LeadingController,
    Handler,
}

fn kubevirt_pod(server: &ServerProcess, label: &str) -> anyhow::Result<Vec<String>> {
    let names = server.ok(&[
        "-n",
        "kubevirt",
        "get",
        "pods",
        "-l",
        &format!("kubevirt.io={label}"),
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ])?;
    Ok(names.split_whitespace().map(str::to_owned).collect())
}

fn sigkill(pid: i32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

fn kill(server: &mut ServerProcess, victim: Victim) -> anyhow::Result<()> {
    match victim {
        Victim::Server => server.restart(),
        Victim::LeadingController => {
            let holder = server.ok(&[
                "-n",
                "kubevirt",
                "get",
                "lease",
                "virt-controller",
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ])?;
            let leader = kubevirt_pod(server, "virt-controller")?
                .into_iter()
                .find(|pod| holder.starts_with(&format!("{pod}_")));
            if let Some(pod) = leader {
                sigkill(server.container_pid("kubevirt", &pod, "virt-controller")?);
            }
            Ok(())
        }
        Victim::Handler => {
            for pod in kubevirt_pod(server, "virt-handler")? {
                sigkill(server.container_pid("kubevirt", &pod, "virt-handler")?);
            }
            Ok(())
        }
    }
}

/// `virt-launcher … --uid U` processes by VMI uid, for the uids in `uids`.
fn launcher_processes(uids: &BTreeSet<String>) -> BTreeMap<String, Vec<i32>> {
    let mut found: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let argv: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let program = argv
            .first()
            .and_then(|a| std::path::Path::new(a).file_name())
            .and_then(|n| n.to_str());
        if program != Some("virt-launcher") {
            continue;
        }
        let uid = argv
            .iter()
            .position(|a| a == "--uid")
            .and_then(|i| argv.get(i + 1));
        if let Some(uid) = uid.filter(|u| uids.contains(*u)) {
            found.entry(uid.clone()).or_default().push(pid);
        }
    }
    found
}

/// The cluster as the test checks it: VMs (name → runStrategy, printableStatus), VMIs
/// (name → uid, phase) and launcher pods (VMI uid → pod names not being deleted).
struct Observed {
    vms: BTreeMap<String, (String, String)>,
    vmis: BTreeMap<String, (String, String)>,
    pods: BTreeMap<String, Vec<String>>,
    pods_total: usize,
}

fn observe(server: &ServerProcess) -> Option<Observed> {
    let list = |kind: &str, extra: &[&str]| -> Option<Vec<serde_json::Value>> {
        let mut args = vec!["get", kind, "-o", "json"];
        args.extend_from_slice(extra);
        let text = server.ok(&args).ok()?;
        let value: serde_json::Value = serde_json::from_str(&text).ok()?;
        value["items"].as_array().cloned()
    };
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    let vms = list("vm", &[])?
        .iter()
        .map(|vm| {
            (
                text(&vm["metadata"]["name"]),
                (
                    text(&vm["spec"]["runStrategy"]),
                    text(&vm["status"]["printableStatus"]),
                ),
            )
        })
        .collect();
    let vmis = list("vmi", &[])?
        .iter()
        .map(|vmi| {
            (
                text(&vmi["metadata"]["name"]),
                (text(&vmi["metadata"]["uid"]), text(&vmi["status"]["phase"])),
            )
        })
        .collect();
    let all_pods = list("pods", &["-l", "kubevirt.io=virt-launcher"])?;
    let mut pods: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pod in &all_pods {
        if pod["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let phase = text(&pod["status"]["phase"]);
        if phase == "Succeeded" || phase == "Failed" {
            continue;
        }
        pods.entry(text(&pod["metadata"]["labels"]["kubevirt.io/created-by"]))
            .or_default()
            .push(text(&pod["metadata"]["name"]));
    }
    Some(Observed {
        vms,
        vmis,
        pods,
        pods_total: all_pods.len(),
    })
}

/// Why the observation does not (yet) match the expectation; `None` when it does.
fn mismatch(expected: &Expected, seen: &Observed) -> Option<String> {
    for (name, strategy) in expected {
        let vm = seen.vms.get(name);
        let vmi = seen.vmis.get(name);
        match (strategy, vm) {
            (None, Some(_)) => return Some(format!("{name}: deleted but still there")),
            (None, None) if vmi.is_some() => return Some(format!("{name}: VMI outlives its VM")),
            (None, None) => {}
            (Some(_), None) => return Some(format!("{name}: acknowledged VM is missing")),
            (Some(want), Some((got, printable))) => {
                if got != want {
                    return Some(format!(
                        "{name}: runStrategy {got}, {want} was acknowledged"
                    ));
                }
                let running = vmi.is_some_and(|(_, phase)| phase == "Running");
                match *want {
                    "Always" if !running || printable != "Running" => {
                        return Some(format!("{name}: not Running yet ({printable}, {vmi:?})"));
                    }
                    "Halted" if vmi.is_some() || printable != "Stopped" => {
                        return Some(format!("{name}: not Stopped yet ({printable}, {vmi:?})"));
                    }
                    _ => {}
                }
            }
        }
    }
    let live: BTreeSet<&String> = seen.vmis.values().map(|(uid, _)| uid).collect();
    for (uid, pods) in &seen.pods {
        if pods.len() > 1 {
            return Some(format!(
                "VMI {uid} has {} launcher pods: {pods:?}",
                pods.len()
            ));
        }
        if !live.contains(uid) {
            return Some(format!("launcher pod {pods:?} of a VMI that is gone"));
        }
    }
    if seen.pods_total != seen.pods.values().map(Vec::len).sum::<usize>() {
        return Some(format!(
            "{} launcher pods are still being removed",
            seen.pods_total - seen.pods.values().map(Vec::len).sum::<usize>()
        ));
    }
    None
}

#[test]
#[allow(clippy::too_many_lines)]
fn churn_with_sigkilled_components_converges_and_loses_nothing() -> anyhow::Result<()> {
    let Some(virtctl) = testkit::available(testkit::virtctl_beside(Path::new(BIN))) else {
        return Ok(());
    };
    let vms = usize::try_from(env_number("KUBEVIRT_RS_CHURN_VMS", 30))?;
    let seed = env_number(
        "KUBEVIRT_RS_CHURN_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs(),
    );
    eprintln!("churn: {vms} VMs, KUBEVIRT_RS_CHURN_SEED={seed}");
    let mut rng = Rng(seed | 1);
    let mut server = ServerProcess::start(
        Path::new(BIN),
        "server",
        &[
            "--fake-qemu",
            "--node-capacity",
            "cpu=64,memory=256Gi,pods=2000",
        ],
    )?;
    let started = Instant::now();

    let mut expected: Expected = BTreeMap::new();
    let mut all = String::new();
    for i in 0..vms {
        let name = format!("churn-{i:03}");
        all.push_str(&vm(&name, "Always"));
        all.push_str("---\n");
        expected.insert(name, Some("Always"));
    }
    server.apply(&all)?;

    // Actions, with a kill of a random victim after every few.
    let actions = vms * 2;
    // At most ten actions between kills: a large run reaches the time budget after a
    // hundred actions or so, and must still kill each kind.
    let kill_every = (actions / 6).clamp(1, 10);
    let mut uids = BTreeSet::new();
    let mut kills = Vec::new();
    let first_victim = rng.below(3);
    let mut log = Vec::new();
    let fail = |server: &ServerProcess, log: &[String], e: anyhow::Error| {
        let text = server.log();
        anyhow::anyhow!(
            "{e}\nseed {seed}; last actions: {:?}\nlog lines of the VMs named above:\n{}\nserver log tail:\n{}",
            &log[log.len().saturating_sub(20)..],
            lines_naming(&text, &e.to_string(), 60),
            testkit::tail(&text, 60)
        )
    };
    let mut done = 0;
    for step in 0..actions {
        if started.elapsed() > CHURN_BUDGET {
            eprintln!("churn: stopping after {step} of {actions} actions (time budget)");
            break;
        }
        done += 1;
        match act(&server, &virtctl, &mut rng, &mut expected) {
            Ok(action) => log.push(action),
            Err(e) => return Err(fail(&server, &log, e)),
        }
        if step % kill_every == kill_every - 1 {
            // The VMIs of now, so that launchers of VMIs deleted later are still known.
            if let Some(seen) = observe(&server) {
                uids.extend(seen.vmis.values().map(|(uid, _)| uid.clone()));
            }
            // Each kind once first (from a seeded start), so every run kills the server, the
            // leading virt-controller and virt-handler; then at random.
            let victims = [Victim::Server, Victim::LeadingController, Victim::Handler];
            let victim = if kills.len() < victims.len() {
                victims[(first_victim + kills.len()) % victims.len()]
            } else {
                victims[rng.below(victims.len())]
            };
            kill(&mut server, victim).map_err(|e| fail(&server, &log, e))?;
            kills.push(victim);
            log.push(format!("kill {victim:?}"));
            eprintln!(
                "churn: {} actions, killed {victim:?} at {:.1}s",
                step + 1,
                started.elapsed().as_secs_f64()
            );
        }
    }
    let churned = started.elapsed();

    // Convergence: every VM as acknowledged, one launcher pod per running VMI.
    let converged = wait_until(
        CONVERGENCE,
        "every VM to converge to its run strategy",
        || {
            let seen = observe(&server)?;
            uids.extend(seen.vmis.values().map(|(uid, _)| uid.clone()));
            mismatch(&expected, &seen).is_none().then_some(seen)
        },
    );
    let seen = match converged {
        Ok(seen) => seen,
        Err(e) => {
            let why = observe(&server).and_then(|seen| mismatch(&expected, &seen));
            return Err(fail(
                &server,
                &log,
                e.context(format!("last mismatch: {why:?}")),
            ));
        }
    };
    let converge_time = started.elapsed() - churned;

    // Processes: exactly one launcher per running VMI, none for VMIs that are gone.
    let running: BTreeSet<String> = seen
        .vmis
        .values()
        .filter(|(_, phase)| phase == "Running")
        .map(|(uid, _)| uid.clone())
        .collect();
    let processes = wait_until(
        Duration::from_secs(60),
        "launchers of gone VMIs to exit",
        || {
            let found = launcher_processes(&uids);
            found
                .keys()
                .all(|uid| running.contains(uid))
                .then_some(found)
        },
    )
    .map_err(|e| {
        let found = launcher_processes(&uids);
        let orphans: Vec<_> = found.keys().filter(|u| !running.contains(*u)).collect();
        fail(
            &server,
            &log,
            e.context(format!("orphaned launchers of VMIs {orphans:?}")),
        )
    })?;
    for uid in &running {
        let pids = processes.get(uid).map_or(0, Vec::len);
        assert_eq!(
            pids, 1,
            "VMI {uid} has {pids} launcher processes (seed {seed})"
        );
    }
    let always = expected.values().filter(|s| **s == Some("Always")).count();
    assert_eq!(running.len(), always, "running VMIs (seed {seed})");
    eprintln!(
        "churn: {done} actions and {} kills ({kills:?}) in {:.1}s; converged {:.1}s later: \
         {always} running, {} VMI uids seen",
        kills.len(),
        churned.as_secs_f64(),
        converge_time.as_secs_f64(),
        uids.len(),
    );
    Ok(())
}

/// The last `lines` lines of `text` that name a VM (`churn-NNN`) that `message` names.
fn lines_naming(text: &str, message: &str, lines: usize) -> String {
    let names: BTreeSet<&str> = message
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.starts_with("churn-"))
        .collect();
    let hits: Vec<&str> = text
        .lines()
        .filter(|l| names.iter().any(|n| l.contains(n)))
        .collect();
    hits[hits.len().saturating_sub(lines)..].join("\n")
}
