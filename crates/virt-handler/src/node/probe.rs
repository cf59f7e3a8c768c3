//! Asking QEMU what it can run here: the QMP answers [`super::cpu::cpu_labels`] reads.
//!
//! [`probe_qemu`] starts `qemu-system-x86_64 -machine none -nodefaults -S` with a QMP socket
//! in a private temporary directory, asks `query-cpu-definitions`, `query-machines` and the
//! static `query-cpu-model-expansion` of the host CPU (`host` with KVM, `max` under TCG) and
//! of every usable named model, then quits QEMU. The handler probes once per start.
//!
//! # Guarantees
//! QEMU is killed when the probe ends early (an error, the deadline), and the temporary
//! directory is removed either way.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use virt_launcher::qmp::{QmpClient, QmpError};

use super::cpu::{QemuCpuAnswers, named_models};

/// How long a probe may take in all.
pub const PROBE_DEADLINE: Duration = Duration::from_secs(60);

/// Errors of a QEMU probe.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The temporary directory for the QMP socket could not be created.
    #[error("creating the probe directory {0:?}")]
    TempDir(PathBuf, #[source] std::io::Error),
    /// QEMU could not be started.
    #[error("starting {0:?}")]
    Spawn(PathBuf, #[source] std::io::Error),
    /// QEMU exited before its QMP socket accepted.
    #[error("QEMU exited before answering: {0}")]
    Exited(String),
    /// A QMP exchange failed.
    #[error("QMP")]
    Qmp(#[source] QmpError),
    /// The probe did not finish within [`PROBE_DEADLINE`].
    #[error("the QEMU probe took longer than {PROBE_DEADLINE:?}")]
    Deadline,
}

/// Removes the directory when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Probes `qemu` (a path or a name on `PATH`) with KVM when `kvm`, else with TCG.
///
/// # Errors
/// [`ProbeError`] when QEMU cannot be started or does not answer in time.
pub async fn probe_qemu(qemu: &Path, kvm: bool) -> Result<QemuCpuAnswers, ProbeError> {
    let unique = format!(
        "kubevirt-rs-cpu-probe-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    );
    let dir = TempDir(std::env::temp_dir().join(unique));
    virt_launcher::private_fs::create_dir_all(&dir.0)
        .map_err(|e| ProbeError::TempDir(dir.0.clone(), e))?;
    let socket = dir.0.join("qmp.sock");
    let mut child = tokio::process::Command::new(qemu)
        .args(["-machine", "none", "-nodefaults", "-nographic", "-S"])
        .args(["-accel", if kvm { "kvm" } else { "tcg" }])
        .arg("-qmp")
        .arg(format!("unix:{},server=on,wait=off", socket.display()))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| ProbeError::Spawn(qemu.to_owned(), e))?;
    let answers = tokio::time::timeout(PROBE_DEADLINE, async {
        let client = connect(&socket, &mut child).await?;
        let answers = ask(&client, kvm).await.map_err(ProbeError::Qmp)?;
        // QEMU exits on `quit`; the reply may or may not arrive first.
        let _ = client.quit().await;
        let _ = child.wait().await;
        Ok(answers)
    })
    .await
    .map_err(|_| ProbeError::Deadline)?;
    drop(child);
    answers
}

/// Connects once QEMU has created its socket; fails when QEMU exits first.
async fn connect(
    socket: &Path,
    child: &mut tokio::process::Child,
) -> Result<QmpClient, ProbeError> {
    loop {
        if socket.exists() {
            match QmpClient::connect(socket).await {
                Ok((client, _events)) => return Ok(client),
                Err(QmpError::Connect(_)) => {}
                Err(e) => return Err(ProbeError::Qmp(e)),
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                use tokio::io::AsyncReadExt;
                let _ = pipe.read_to_string(&mut stderr).await;
            }
            return Err(ProbeError::Exited(format!("{status}: {}", stderr.trim())));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn ask(client: &QmpClient, kvm: bool) -> Result<QemuCpuAnswers, QmpError> {
    let expand = |name: &str| {
        let name = name.to_owned();
        async move {
            client
                .execute(
                    "query-cpu-model-expansion",
                    Some(json!({"type": "static", "model": {"name": name}})),
                )
                .await
        }
    };
    let definitions = client.execute("query-cpu-definitions", None).await?;
    let machines = client.execute("query-machines", None).await?;
    let host = expand(if kvm { "host" } else { "max" }).await?;
    let mut models = BTreeMap::new();
    for model in named_models(&definitions).into_iter().filter(|m| m.usable) {
        let expansion: Value = expand(&model.name).await?;
        models.insert(model.name, expansion);
    }
    Ok(QemuCpuAnswers {
        definitions,
        machines,
        host,
        models,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::node::cpu::{cpu_labels, obsolete_models};

    #[tokio::test]
    async fn the_real_qemu_answers_give_upstreams_labels() {
        let Some(qemu) = test_prerequisites::available(test_prerequisites::qemu_binary()) else {
            return;
        };
        let answers = probe_qemu(&qemu, false).await.expect("probe");
        let labels = cpu_labels(&answers, &obsolete_models(None));
        let prefixes: BTreeSet<_> = labels
            .keys()
            .filter_map(|k| k.split_once('/').map(|(p, _)| p))
            .collect();
        for prefix in [
            "cpu-model.node.kubevirt.io",
            "cpu-model-migration.node.kubevirt.io",
            "cpu-feature.node.kubevirt.io",
            "host-model-cpu.node.kubevirt.io",
            "cpu-vendor.node.kubevirt.io",
            "machine-type.node.kubevirt.io",
        ] {
            assert!(prefixes.contains(prefix), "{prefix} missing: {labels:?}");
        }
        assert!(labels.contains_key("machine-type.node.kubevirt.io/q35"));
        assert!(!labels.contains_key("cpu-model.node.kubevirt.io/qemu64"));
        assert!(!answers.models.contains_key("max"));
    }

    #[tokio::test]
    async fn a_missing_qemu_is_a_spawn_error_and_leaves_no_directory() {
        let err = probe_qemu(Path::new("/nonexistent/qemu-system-x86_64"), false)
            .await
            .unwrap_err();
        assert!(matches!(err, ProbeError::Spawn(..)), "{err}");
        let leftover = std::fs::read_dir(std::env::temp_dir())
            .expect("temp dir")
            .filter_map(Result::ok)
            .any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("kubevirt-rs-cpu-probe-{}-", std::process::id()))
            });
        assert!(!leftover);
    }
}
