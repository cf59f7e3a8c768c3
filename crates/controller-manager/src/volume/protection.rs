//! kube's pvc-protection controller (`pkg/controller/volume/pvcprotection`): a claim carries
//! the finalizer [`FINALIZER`] while it exists; once it is being deleted the finalizer is
//! removed as soon as no pod uses the claim, so its volume is released only then.
//!
//! A pod uses a claim when it is in the claim's namespace, names it in a
//! `persistentVolumeClaim` volume, and has not finished (`Succeeded`/`Failed`), scheduled or
//! not, as kube counts it.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::json;

use crate::{Context, Error};

/// The finalizer that keeps a claim used by a pod.
pub const FINALIZER: &str = "kubernetes.io/pvc-protection";

/// The claims a pod names (in its namespace).
pub(super) fn claims_of(pod: &Pod) -> Vec<ObjectRef<PersistentVolumeClaim>> {
    let namespace = pod.namespace().unwrap_or_default();
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| ObjectRef::new(&c.claim_name).within(&namespace))
        .collect()
}

/// Whether `pod` keeps `claim` (see the module docs).
fn uses(pod: &Pod, claim: &PersistentVolumeClaim) -> bool {
    let finished = matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    !finished
        && pod.namespace() == claim.namespace()
        && claims_of(pod)
            .iter()
            .any(|r| Some(r.name.as_str()) == claim.metadata.name.as_deref())
}

/// Sets the claim's finalizers to `finalizers` (with its resourceVersion: a newer claim is
/// handled by the next pass).
async fn set_finalizers(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    let name = claim.name_any();
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": claim.metadata.resource_version,
    }});
    match Api::<PersistentVolumeClaim>::namespaced(
        ctx.client.clone(),
        &claim.namespace().unwrap_or_default(),
    )
    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
    .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(source) => Err(Error::WriteClaim { name, source }),
    }
}

/// Adds the finalizer to a live claim, or removes it from a deleted one no pod uses;
/// returns whether the claim is being deleted (nothing else is then done with it).
pub(super) async fn sync(ctx: &Context, claim: &PersistentVolumeClaim) -> Result<bool, Error> {
    let finalizers = claim.finalizers().to_vec();
    let protected = finalizers.iter().any(|f| f == FINALIZER);
    if claim.metadata.deletion_timestamp.is_none() {
        if !protected {
            let mut with = finalizers;
            with.push(FINALIZER.to_owned());
            set_finalizers(ctx, claim, with).await?;
        }
        return Ok(false);
    }
    if !protected || ctx.pods.state().iter().any(|p| uses(p, claim)) {
        return Ok(true);
    }
    // The cache may lag behind a pod created a moment ago: ask the API server.
    let namespace = claim.namespace().unwrap_or_default();
    let live = Api::<Pod>::namespaced(ctx.client.clone(), &namespace)
        .list(&ListParams::default())
        .await
        .map_err(|source| Error::WriteClaim {
            name: claim.name_any(),
            source,
        })?;
    if live.items.iter().any(|p| uses(p, claim)) {
        return Ok(true);
    }
    let without = finalizers.into_iter().filter(|f| f != FINALIZER).collect();
    set_finalizers(ctx, claim, without).await?;
    tracing::info!(claim = %crate::ownership::key(&claim.metadata), "claim no longer used; protection removed");
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_unfinished_pods_of_the_claims_namespace_that_name_it_use_it() {
        let claim: PersistentVolumeClaim =
            serde_json::from_value(json!({"metadata": {"name": "data", "namespace": "a"}}))
                .expect("claim");
        let pod = |namespace: &str, claim: &str, phase: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": namespace},
                "spec": {"containers": [], "volumes": [
                    {"name": "v", "persistentVolumeClaim": {"claimName": claim}}]},
                "status": {"phase": phase}
            }))
            .expect("pod")
        };
        assert!(uses(&pod("a", "data", "Running"), &claim));
        assert!(uses(&pod("a", "data", "Pending"), &claim));
        assert!(!uses(&pod("a", "data", "Succeeded"), &claim));
        assert!(!uses(&pod("a", "data", "Failed"), &claim));
        assert!(!uses(&pod("b", "data", "Running"), &claim));
        assert!(!uses(&pod("a", "other", "Running"), &claim));
    }
}
