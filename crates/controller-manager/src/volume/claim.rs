//! One pass over a claim: finish its binding, or find it a volume, or provision one.
//!
//! Flow (kube's `syncClaim`): a claim naming a volume (`spec.volumeName`) gets the rest of the
//! binding written (the volume's `claimRef` if unset, the claim's annotations, both phases);
//! an unbound claim of a `WaitForFirstConsumer` class waits for the scheduler's
//! [`SELECTED_NODE`](super::SELECTED_NODE) annotation; then the smallest matching volume is
//! bound ([`super::binder`]), or, for the local class, a volume is provisioned on the node.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use tracing::info;

use super::{
    BIND_COMPLETED, BOUND_BY_CONTROLLER, PROVISIONER, SELECTED_NODE, STORAGE_PROVISIONER, binder,
    provisioner, record,
};
use crate::{Context, Error};

/// How often a claim that waits for something no event announces is looked at again.
const RETRY: Duration = Duration::from_secs(15);

fn annotation<'a>(claim: &'a PersistentVolumeClaim, key: &str) -> Option<&'a str> {
    claim.annotations().get(key).map(String::as_str)
}

fn phase(claim: &PersistentVolumeClaim) -> &str {
    claim
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

fn write_claim(name: &str) -> impl FnOnce(kube::Error) -> Error + '_ {
    move |source| Error::WriteClaim {
        name: name.to_owned(),
        source,
    }
}

fn write_volume(name: &str) -> impl FnOnce(kube::Error) -> Error + '_ {
    move |source| Error::WriteVolume {
        name: name.to_owned(),
        source,
    }
}

/// Sets the claim's `status.phase` (and for `Bound` its capacity and access modes) unless
/// it already shows it.
async fn set_claim_phase(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    phase_now: &str,
    volume: Option<&PersistentVolume>,
) -> Result<(), Error> {
    let spec = volume.and_then(|v| v.spec.as_ref());
    let capacity = spec.and_then(|s| s.capacity.clone());
    let modes = spec.and_then(|s| s.access_modes.clone());
    let status = claim.status.clone().unwrap_or_default();
    if phase(claim) == phase_now
        && (volume.is_none() || (status.capacity == capacity && status.access_modes == modes))
    {
        return Ok(());
    }
    let patch = match volume {
        Some(_) => {
            json!({"status": {"phase": phase_now, "capacity": capacity, "accessModes": modes}})
        }
        None => json!({"status": {"phase": phase_now}}),
    };
    let name = claim.name_any();
    Api::<PersistentVolumeClaim>::namespaced(
        ctx.client.clone(),
        &claim.namespace().unwrap_or_default(),
    )
    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
    .await
    .map_err(write_claim(&name))?;
    Ok(())
}

/// Sets the volume's `status.phase` unless it already shows it.
pub(super) async fn set_volume_phase(
    ctx: &Context,
    volume: &PersistentVolume,
    phase_now: &str,
    message: Option<&str>,
) -> Result<(), Error> {
    let status = volume.status.as_ref();
    if status.and_then(|s| s.phase.as_deref()) == Some(phase_now)
        && status.and_then(|s| s.message.as_deref()) == message
    {
        return Ok(());
    }
    let name = volume.name_any();
    let patch = json!({"status": {"phase": phase_now, "message": message}});
    Api::<PersistentVolume>::all(ctx.client.clone())
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(write_volume(&name))?;
    Ok(())
}

/// Binds `claim` and `volume` in kube's order: the volume's `claimRef` (with its
/// `resourceVersion`), its phase, the claim's `volumeName` and annotations, its phase.
async fn bind(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    volume: &PersistentVolume,
) -> Result<(), Error> {
    let volume_name = volume.name_any();
    let volume = if binder::is_bound_to(volume, claim)
        && volume
            .spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .is_some_and(|r| r.uid.is_some())
    {
        volume.clone()
    } else {
        let mut updated = volume.clone();
        let spec = updated.spec.get_or_insert_default();
        spec.claim_ref = Some(k8s_openapi::api::core::v1::ObjectReference {
            kind: Some("PersistentVolumeClaim".into()),
            api_version: Some("v1".into()),
            namespace: claim.metadata.namespace.clone(),
            name: claim.metadata.name.clone(),
            uid: claim.metadata.uid.clone(),
            resource_version: claim.metadata.resource_version.clone(),
            ..Default::default()
        });
        updated
            .annotations_mut()
            .insert(BOUND_BY_CONTROLLER.into(), "yes".into());
        Api::<PersistentVolume>::all(ctx.client.clone())
            .replace(&volume_name, &PostParams::default(), &updated)
            .await
            .map_err(write_volume(&volume_name))?
    };
    set_volume_phase(ctx, &volume, "Bound", None).await?;
    let name = claim.name_any();
    let named = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == Some(&volume_name);
    let claim = if named && annotation(claim, BIND_COMPLETED) == Some("yes") {
        claim.clone()
    } else {
        let mut annotations = serde_json::Map::new();
        annotations.insert(BIND_COMPLETED.into(), "yes".into());
        // As kube: on the claim when this controller chose its volume, on the volume when
        // it set the claimRef.
        if !named {
            annotations.insert(BOUND_BY_CONTROLLER.into(), "yes".into());
        }
        // A merge patch: only this controller writes a claim's volumeName, and the volume's
        // claimRef (written above with its resourceVersion) is what makes the binding safe.
        let patch = json!({
            "metadata": {"annotations": annotations},
            "spec": {"volumeName": volume_name},
        });
        Api::<PersistentVolumeClaim>::namespaced(
            ctx.client.clone(),
            &claim.namespace().unwrap_or_default(),
        )
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(write_claim(&name))?
    };
    set_claim_phase(ctx, &claim, "Bound", Some(&volume)).await?;
    info!(claim = %crate::ownership::key(&claim.metadata), volume = %volume_name, "bound claim");
    Ok(())
}

/// One pass over a claim (see the module docs).
pub(super) async fn reconcile(
    claim: Arc<PersistentVolumeClaim>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    super::forget_events(&ctx);
    if super::protection::sync(&ctx, &claim).await? {
        return Ok(Action::await_change());
    }
    let volumes = ctx.volumes.state();
    let named = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|n| !n.is_empty());
    if let Some(name) = named {
        return bind_named(&ctx, &claim, &volumes, name).await;
    }
    if phase(&claim).is_empty() {
        set_claim_phase(&ctx, &claim, "Pending", None).await?;
    }
    let class_name = binder::claim_class(&claim);
    let class = (!class_name.is_empty())
        .then(|| ctx.classes.get(&ObjectRef::<StorageClass>::new(class_name)))
        .flatten();
    let waits = class
        .as_ref()
        .and_then(|c| c.volume_binding_mode.as_deref())
        == Some("WaitForFirstConsumer");
    let selected = annotation(&claim, SELECTED_NODE);
    if waits && selected.is_none() {
        record(
            &ctx,
            &claim,
            false,
            "WaitForFirstConsumer",
            "waiting for first consumer to be created before binding",
        )
        .await;
        return Ok(Action::await_change());
    }
    let node = selected.and_then(|n| ctx.nodes.get(&ObjectRef::<Node>::new(n)));
    if selected.is_some() && node.is_none() {
        // The node is not in the cache yet (or is gone): look again later.
        return Ok(Action::requeue(RETRY));
    }
    if let Some(volume) = binder::find_match(&volumes, &claim, node.as_deref()) {
        bind(&ctx, &claim, volume).await?;
        return Ok(Action::await_change());
    }
    let Some(class) = class else {
        if !class_name.is_empty() {
            let message = format!("storageclass.storage.k8s.io \"{class_name}\" not found");
            record(&ctx, &claim, true, "ProvisioningFailed", &message).await;
            return Ok(Action::requeue(RETRY));
        }
        return Ok(Action::await_change());
    };
    if class.provisioner != PROVISIONER {
        // Another provisioner's class: nothing to do here, as kube leaves it to that one.
        return Ok(Action::await_change());
    }
    let node = match selected {
        Some(n) => n.to_owned(),
        // Immediate binding: the first node with local storage.
        None => match ctx.local_storage.nodes.keys().next() {
            Some(n) => n.clone(),
            None => {
                let message = "no node of this machine has a local volume directory";
                record(&ctx, &claim, true, "ProvisioningFailed", message).await;
                return Ok(Action::requeue(RETRY));
            }
        },
    };
    provision(&ctx, &claim, &class, &node).await
}

/// Finishes the binding of a claim that names its volume.
async fn bind_named(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    volumes: &[Arc<PersistentVolume>],
    name: &str,
) -> Result<Action, Error> {
    let Some(volume) = volumes
        .iter()
        .find(|v| v.metadata.name.as_deref() == Some(name))
    else {
        if annotation(claim, BIND_COMPLETED) == Some("yes") {
            // Its volume is gone: kube's `ClaimLost`.
            record(
                ctx,
                claim,
                true,
                "ClaimLost",
                "Bound claim has lost its PersistentVolume. Data on the volume is lost!",
            )
            .await;
            set_claim_phase(ctx, claim, "Lost", None).await?;
        } else if phase(claim).is_empty() {
            set_claim_phase(ctx, claim, "Pending", None).await?;
        }
        return Ok(Action::await_change());
    };
    let free = volume.spec.as_ref().is_none_or(|s| s.claim_ref.is_none());
    if binder::is_bound_to(volume, claim) || (free && binder::matches(volume, claim, None)) {
        bind(ctx, claim, volume).await?;
    } else if free {
        let message =
            format!("Cannot bind to requested volume \"{name}\": it does not match the claim");
        record(ctx, claim, true, "VolumeMismatch", &message).await;
        set_claim_phase(ctx, claim, "Pending", None).await?;
    } else if annotation(claim, BIND_COMPLETED) == Some("yes") {
        let message = "Two claims are bound to the same volume, this one is bound incorrectly";
        record(ctx, claim, true, "ClaimMisbound", message).await;
        set_claim_phase(ctx, claim, "Lost", None).await?;
    } else {
        // Asked for a volume another claim holds: it waits, as kube's binder lets it.
        let message = format!("volume \"{name}\" already bound to a different claim.");
        record(ctx, claim, true, "FailedBinding", &message).await;
        set_claim_phase(ctx, claim, "Pending", None).await?;
    }
    Ok(Action::await_change())
}

/// A `Block` volume's sparse image of `bytes` in its directory `dir`, attached to a loop
/// device (an existing attachment is kept).
async fn block_image(ctx: &Context, dir: &std::path::Path, bytes: u64) -> Result<(), String> {
    let image = ctx
        .local_storage
        .create_block_image(dir, bytes)
        .map_err(|e| e.to_string())?;
    let device = super::loop_device::attach(&image).await?;
    info!(image = %image.display(), device = %device.display(), "attached the block volume's image");
    Ok(())
}

/// Makes the claim's volume on `node`: its directory (for a `Block` claim with its image
/// attached to a loop device), then the volume pre-bound to the claim (the next pass binds
/// them).
async fn provision(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    node: &str,
) -> Result<Action, Error> {
    let class_name = class.name_any();
    let failed = |why: String| {
        format!("failed to provision volume with StorageClass \"{class_name}\": {why}")
    };
    if annotation(claim, STORAGE_PROVISIONER) != Some(PROVISIONER) {
        let patch = json!({"metadata": {"annotations": {
            STORAGE_PROVISIONER: PROVISIONER,
            "volume.beta.kubernetes.io/storage-provisioner": PROVISIONER,
        }}});
        let name = claim.name_any();
        Api::<PersistentVolumeClaim>::namespaced(
            ctx.client.clone(),
            &claim.namespace().unwrap_or_default(),
        )
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(write_claim(&name))?;
    }
    let Some(requested) = binder::requested_storage(claim) else {
        let message =
            failed("the claim requests no storage (spec.resources.requests.storage)".into());
        record(ctx, claim, true, "ProvisioningFailed", &message).await;
        return Ok(Action::await_change());
    };
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let name = provisioner::volume_name(&uid);
    let dir = match ctx.local_storage.create_dir(node, &name) {
        Ok(dir) => dir,
        Err(e) => {
            record(
                ctx,
                claim,
                true,
                "ProvisioningFailed",
                &failed(e.to_string()),
            )
            .await;
            return Err(Error::LocalVolume(e));
        }
    };
    if binder::claim_mode(claim) == "Block" {
        // Thousandths of a byte, rounded up to whole bytes.
        let bytes = u64::try_from((requested + 999) / 1000).unwrap_or(u64::MAX);
        if let Err(why) = block_image(ctx, &dir, bytes).await {
            let message = failed(format!(
                "volumeMode Block needs a loop device, and none could be set up on this machine: {why}"
            ));
            record(ctx, claim, true, "ProvisioningFailed", &message).await;
            // Nothing is left behind; loop devices may become available.
            let _ = std::fs::remove_dir_all(&dir);
            return Ok(Action::requeue(RETRY));
        }
    }
    let reclaim = class.reclaim_policy.as_deref().unwrap_or("Delete");
    let volume = ctx
        .local_storage
        .volume_for(claim, &class_name, reclaim, node)
        .map_err(|source| Error::Encode {
            what: "a persistent volume",
            source,
        })?;
    match Api::<PersistentVolume>::all(ctx.client.clone())
        .create(&PostParams::default(), &volume)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(source) => return Err(Error::WriteVolume { name, source }),
    }
    let message = format!("Successfully provisioned volume {name}");
    record(ctx, claim, false, "ProvisioningSucceeded", &message).await;
    Ok(Action::requeue(Duration::from_secs(1)))
}
