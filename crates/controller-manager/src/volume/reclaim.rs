//! One pass over a volume (kube's `syncVolume`): `Available` while unclaimed, `Bound` while
//! its claim names it, `Released` once its claim is gone, and then, with reclaim policy
//! `Delete`, deleted — with its directory when the local provisioner made it (a `Block` one's
//! loop devices detached first).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tracing::{info, warn};

use super::claim::set_volume_phase;
use super::{PROVISIONED_BY, PROVISIONER};
use crate::{Context, Error};

/// Whether the claim `reference` names still exists (a live read: the cache may not show a
/// claim created a moment ago).
async fn claim_exists(
    ctx: &Context,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
) -> Result<bool, Error> {
    let (Some(namespace), Some(name)) = (reference.namespace.as_deref(), reference.name.as_deref())
    else {
        return Ok(false);
    };
    let cached = ctx
        .claims
        .get(&ObjectRef::<PersistentVolumeClaim>::new(name).within(namespace));
    let same =
        |c: &PersistentVolumeClaim| reference.uid.is_none() || c.metadata.uid == reference.uid;
    if cached.as_deref().is_some_and(same) {
        return Ok(true);
    }
    let live = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|source| Error::WriteClaim {
            name: name.to_owned(),
            source,
        })?;
    Ok(live.as_ref().is_some_and(same))
}

/// One pass over a volume (see the module docs).
pub(super) async fn reconcile(
    volume: Arc<PersistentVolume>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    if volume.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let Some(reference) = volume.spec.as_ref().and_then(|s| s.claim_ref.clone()) else {
        set_volume_phase(&ctx, &volume, "Available", None).await?;
        return Ok(Action::await_change());
    };
    if claim_exists(&ctx, &reference).await? {
        let claim = ctx.claims.get(
            &ObjectRef::<PersistentVolumeClaim>::new(reference.name.as_deref().unwrap_or_default())
                .within(reference.namespace.as_deref().unwrap_or_default()),
        );
        let names_us = claim
            .as_ref()
            .and_then(|c| c.spec.as_ref())
            .and_then(|s| s.volume_name.as_deref())
            == volume.metadata.name.as_deref();
        if names_us {
            set_volume_phase(&ctx, &volume, "Bound", None).await?;
        } else if volume
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_none()
        {
            // Pre-bound, its claim not bound yet: the claim's pass binds it.
            set_volume_phase(&ctx, &volume, "Available", None).await?;
        }
        return Ok(Action::await_change());
    }
    let policy = volume
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or("Retain");
    if policy != "Delete" {
        set_volume_phase(&ctx, &volume, "Released", None).await?;
        return Ok(Action::await_change());
    }
    // Released and deleted in one pass; a volume that cannot be deleted goes `Failed`
    // (never back to `Released`, so the two writes cannot wake each other for ever).
    let name = volume.name_any();
    if volume.annotations().get(PROVISIONED_BY).map(String::as_str) != Some(PROVISIONER) {
        let message = format!(
            "error getting deleter volume plugin for volume \"{name}\": no deletable volume plugin matched"
        );
        set_volume_phase(&ctx, &volume, "Failed", Some(&message)).await?;
        return Ok(Action::await_change());
    }
    if let Err(e) = ctx.local_storage.delete_volume(&volume).await {
        let message = format!("Delete of volume \"{name}\" failed: {e}");
        warn!(volume = %name, error = %e, "volume directory not deleted");
        set_volume_phase(&ctx, &volume, "Failed", Some(&message)).await?;
        return Ok(Action::requeue(Duration::from_secs(60)));
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: volume.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match Api::<PersistentVolume>::all(ctx.client.clone())
        .delete(&name, &params)
        .await
    {
        Ok(_) => info!(volume = %name, "deleted released volume and its directory"),
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(source) => return Err(Error::WriteVolume { name, source }),
    }
    Ok(Action::await_change())
}
