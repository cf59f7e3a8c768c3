//! The DataVolume controller: kube-rs's controller runtime over DataVolumes, woken by the
//! claims and importer pods they own.
//!
//! One reconcile of a DataVolume: being deleted → nothing (the garbage collector removes its
//! claim and pod through their owner references); no claim → create it; the import cannot run
//! (unsupported source, no size) → `Failed`; no importer pod and not done → create it; pod
//! finished → read its last log line (the failure, as `FallbackToLogsOnError` would report it);
//! pod running → its last log line may be progress, and the DataVolume is looked at again in
//! two seconds; then the status ([`crate::status::desired_status`]) is written when it
//! changed; a succeeded import's pod is deleted.
//!
//! # Guarantees
//! - Every step is idempotent: a crash anywhere is repaired by the next reconcile (an existing
//!   claim or pod is reused, "already exists" is no error).
//! - A status is written only when it differs from the one read.
//!
//! # Caveats
//! - A claim of the DataVolume's name that the DataVolume does not control is left alone and
//!   the DataVolume stays `Pending` (CDI's claim adoption is not implemented).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, LogParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use kubevirt_api::cdi::{DataVolume, DataVolumePhase};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::claim::{claim_for, controlled_by, importer_pod};
use crate::status::{Observed, desired_status, progress_of};

/// How often a running import's progress is read.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(2);

/// How soon the log of a failed importer is read again when it could not be.
const LOG_RETRY: Duration = Duration::from_secs(1);
/// How long after the importer exited its log is waited for.
const LOG_PATIENCE: i64 = 15;

/// Whether the importer's container finished more than [`LOG_PATIENCE`] seconds ago (or
/// reports no finish time).
fn finished_long_ago(pod: Option<&Pod>, now: &Time) -> bool {
    let finished = pod
        .and_then(|p| p.status.as_ref())
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.finished_at.as_ref());
    finished.is_none_or(|t| now.0.as_second() - t.0.as_second() > LOG_PATIENCE)
}

/// A failed reconcile; retried with a backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing an object failed.
    #[error("{operation}")]
    Api {
        /// What was being done.
        operation: &'static str,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

fn api(operation: &'static str) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Api { operation, source }
}

struct Context {
    client: Client,
    importer_image: String,
}

/// Runs the DataVolume controller until `cancel`.
pub async fn run(client: Client, importer_image: String, cancel: CancellationToken) {
    let dvs: Api<DataVolume> = Api::all(client.clone());
    let claims: Api<PersistentVolumeClaim> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client.clone());
    let importers = watcher::Config::default().labels(&format!("app={}", crate::APP_LABEL_VALUE));
    let ctx = Arc::new(Context {
        client,
        importer_image,
    });
    Controller::new(dvs, watcher::Config::default())
        .owns(claims, importers.clone())
        .owns(pods, importers)
        .graceful_shutdown_on(cancel.cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "DataVolume reconcile failed");
            }
        })
        .await;
}

// kube-rs's controller hands the object over by value.
#[allow(clippy::needless_pass_by_value)]
fn error_policy(dv: Arc<DataVolume>, error: &Error, _: Arc<Context>) -> Action {
    tracing::warn!(dv = %dv.name_any(), error = %error, cause = ?std::error::Error::source(error), "DataVolume reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// Creates `object`, treating "already exists" as done (a previous reconcile made it).
async fn create_once<K>(api: &Api<K>, object: &K) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// The last non-empty line of the importer's log, or why it cannot be read.
async fn last_log_line(pods: &Api<Pod>, name: &str) -> Result<String, String> {
    let params = LogParams {
        tail_lines: Some(5),
        ..LogParams::default()
    };
    let log = pods.logs(name, &params).await.map_err(|e| e.to_string())?;
    log.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| "the importer's log is empty".to_owned())
}

/// The DataVolume's claim (created when missing: it is then `None` until it is read back),
/// or why it cannot be made.
async fn ensure_claim(
    client: &Client,
    dv: &DataVolume,
) -> Result<(Option<PersistentVolumeClaim>, Option<String>), Error> {
    let namespace = dv.namespace().unwrap_or_default();
    let name = dv.name_any();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
    let pvc = claims
        .get_opt(&name)
        .await
        .map_err(api("reading the claim"))?;
    match (pvc, claim_for(dv)) {
        (Some(pvc), _) => Ok((Some(pvc), None)),
        (None, Ok(claim)) => {
            create_once(&claims, &claim)
                .await
                .map_err(api("creating the claim"))?;
            tracing::info!(dv = %name, "created the DataVolume's claim");
            Ok((None, None))
        }
        (None, Err(e)) => Ok((None, Some(e.to_string()))),
    }
}

async fn reconcile(dv: Arc<DataVolume>, ctx: Arc<Context>) -> Result<Action, Error> {
    if dv.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let namespace = dv.namespace().unwrap_or_default();
    let name = dv.name_any();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let (pvc, mut failure) = ensure_claim(&ctx.client, &dv).await?;
    let ours = pvc.as_ref().filter(|p| controlled_by(*p, &dv));
    let pod_name = crate::importer_pod_name(&name);
    let mut pod = pods
        .get_opt(&pod_name)
        .await
        .map_err(api("reading the importer pod"))?;
    let done = matches!(
        dv.phase(),
        DataVolumePhase::Succeeded | DataVolumePhase::Failed
    );
    let mut progress = None;
    if let (Some(pvc), None, false, None) = (ours, &pod, done, &failure) {
        match importer_pod(&dv, pvc, &ctx.importer_image) {
            Ok(importer) => {
                create_once(&pods, &importer)
                    .await
                    .map_err(api("creating the importer pod"))?;
                tracing::info!(dv = %name, pod = %pod_name, "created the importer pod");
                pod = Some(importer);
            }
            Err(e) => failure = Some(e.to_string()),
        }
    }
    let pod_phase = pod
        .as_ref()
        .and_then(|p| p.status.as_ref())
        .and_then(|s| s.phase.clone());
    let mut requeue = Action::await_change();
    match pod_phase.as_deref() {
        Some("Failed") if !done => match last_log_line(&pods, &pod_name).await {
            Ok(line) => failure = Some(line),
            // The node may not serve the log of a container that just exited yet: look
            // again soon rather than failing without the importer's message, for a while.
            Err(_) if !finished_long_ago(pod.as_ref(), &now) => {
                return Ok(Action::requeue(LOG_RETRY));
            }
            Err(e) => failure = Some(format!("Import failed (its log cannot be read: {e})")),
        },
        Some("Running") => {
            progress = last_log_line(&pods, &pod_name).await.ok();
            requeue = Action::requeue(PROGRESS_INTERVAL);
        }
        _ => {}
    }
    let progress = progress.as_deref().and_then(progress_of);
    let status = desired_status(
        &dv,
        &Observed {
            pvc: ours,
            pod: pod.as_ref(),
            failure: failure.as_deref(),
            progress,
            now: &now,
        },
    );
    if dv.status.as_ref() != Some(&status) {
        let dvs: Api<DataVolume> = Api::namespaced(ctx.client.clone(), &namespace);
        let patch = json!({"status": status});
        dvs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(api("writing the DataVolume status"))?;
        if status.phase != dv.status.as_ref().and_then(|s| s.phase.clone()) {
            tracing::info!(dv = %name, phase = ?status.phase, "DataVolume phase");
        }
    }
    if status.phase == Some(DataVolumePhase::Succeeded) && pod_phase.as_deref() == Some("Succeeded")
    {
        match pods.delete(&pod_name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(api("deleting the importer pod")(e)),
        }
    }
    Ok(requeue)
}
