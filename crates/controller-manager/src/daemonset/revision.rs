//! A DaemonSet's history as ControllerRevisions (kube's `daemon/update.go`): one revision
//! per template, named `<daemonset>-<hash>`, labelled `controller-revision-hash: <hash>`,
//! holding `{"spec": {"template": …, "$patch": "replace"}}` and a revision number; the
//! current template's revision always has the highest number.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use serde_json::json;

use super::CONTROLLER_REVISION_HASH;
use crate::deployment::util::{compute_hash, equal_ignore_hash};
use crate::ownership::{controller_of, controller_reference};
use crate::{Context, Error};

/// kube's default `revisionHistoryLimit` of a DaemonSet.
pub const DEFAULT_REVISION_HISTORY_LIMIT: i32 = 10;

/// The template a revision holds.
fn template_of(revision: &ControllerRevision) -> Option<PodTemplateSpec> {
    let mut template = revision
        .data
        .as_ref()?
        .0
        .get("spec")?
        .get("template")?
        .clone();
    if let Some(t) = template.as_object_mut() {
        t.remove("$patch");
    }
    serde_json::from_value(template).ok()
}

fn owned_revisions(ctx: &Context, ds: &DaemonSet) -> Vec<Arc<ControllerRevision>> {
    let uid = ds.metadata.uid.as_deref().unwrap_or_default();
    let namespace = ds.namespace();
    ctx.revisions
        .state()
        .into_iter()
        .filter(|r| r.namespace() == namespace)
        .filter(|r| controller_of(&r.metadata).is_some_and(|o| o.uid == uid))
        .collect()
}

fn api(ctx: &Context, ds: &DaemonSet) -> Api<ControllerRevision> {
    Api::namespaced(ctx.client.clone(), &ds.namespace().unwrap_or_default())
}

/// Makes sure the current template has a revision with the highest number; returns its hash.
pub(super) async fn construct_history(ctx: &Context, ds: &DaemonSet) -> Result<String, Error> {
    let template = ds.spec.clone().unwrap_or_default().template;
    let revisions = owned_revisions(ctx, ds);
    let max = revisions.iter().map(|r| r.revision).max().unwrap_or(0);
    let current = revisions
        .iter()
        .filter(|r| template_of(r).is_some_and(|t| equal_ignore_hash(&t, &template)))
        .max_by_key(|r| r.revision);
    if let Some(current) = current {
        let hash = current
            .labels()
            .get(CONTROLLER_REVISION_HASH)
            .cloned()
            .unwrap_or_else(|| compute_hash(&template, collision_count(ds)));
        let others_max = revisions
            .iter()
            .filter(|r| r.metadata.uid != current.metadata.uid)
            .map(|r| r.revision)
            .max()
            .unwrap_or(0);
        if current.revision <= others_max {
            let mut updated = (**current).clone();
            updated.revision = max + 1;
            let name = updated.name_any();
            api(ctx, ds)
                .replace(&name, &PostParams::default(), &updated)
                .await
                .map_err(|source| Error::WriteRevision { name, source })?;
        }
        return Ok(hash);
    }
    let hash = compute_hash(&template, collision_count(ds));
    let name = format!("{}-{hash}", ds.name_any());
    let mut labels: BTreeMap<String, String> = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(CONTROLLER_REVISION_HASH.to_owned(), hash.clone());
    let mut data = serde_json::to_value(&template).map_err(|source| Error::Encode {
        what: "the DaemonSet template",
        source,
    })?;
    if let Some(t) = data.as_object_mut() {
        t.insert("$patch".into(), json!("replace"));
    }
    let revision = ControllerRevision {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: ds.namespace(),
            labels: Some(labels),
            owner_references: Some(vec![controller_reference(ds)]),
            ..ObjectMeta::default()
        },
        data: Some(RawExtension(json!({"spec": {"template": data}}))),
        revision: max + 1,
    };
    match api(ctx, ds).create(&PostParams::default(), &revision).await {
        Ok(_) => Ok(hash),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let existing =
                api(ctx, ds)
                    .get(&name)
                    .await
                    .map_err(|source| Error::WriteRevision {
                        name: name.clone(),
                        source,
                    })?;
            let ours = controller_of(&existing.metadata)
                .is_some_and(|o| Some(&o.uid) == ds.metadata.uid.as_ref());
            if ours && template_of(&existing).is_some_and(|t| equal_ignore_hash(&t, &template)) {
                return Ok(hash);
            }
            // Another template owns this name: the next hash includes a higher count.
            let mut updated = ds.clone();
            let mut status: DaemonSetStatus = ds.status.clone().unwrap_or_default();
            status.collision_count = Some(collision_count(ds).unwrap_or(0) + 1);
            updated.status = Some(status);
            Api::<DaemonSet>::namespaced(ctx.client.clone(), &ds.namespace().unwrap_or_default())
                .replace_status(&ds.name_any(), &PostParams::default(), &updated)
                .await
                .map_err(|source| Error::UpdateStatus {
                    kind: "DaemonSet",
                    name: ds.name_any(),
                    source,
                })?;
            Err(Error::HashCollision { name })
        }
        Err(source) => Err(Error::WriteRevision { name, source }),
    }
}

fn collision_count(ds: &DaemonSet) -> Option<i32> {
    ds.status.as_ref().and_then(|s| s.collision_count)
}

/// Deletes the oldest revisions beyond `revisionHistoryLimit` that no live pod still uses.
pub(super) async fn cleanup_history(
    ctx: &Context,
    ds: &DaemonSet,
    pods: &[Arc<Pod>],
    current_hash: &str,
) -> Result<(), Error> {
    let limit = ds
        .spec
        .as_ref()
        .and_then(|s| s.revision_history_limit)
        .unwrap_or(DEFAULT_REVISION_HISTORY_LIMIT)
        .max(0);
    let in_use: HashSet<&str> = pods
        .iter()
        .filter_map(|p| p.labels().get(CONTROLLER_REVISION_HASH).map(String::as_str))
        .chain([current_hash])
        .collect();
    let mut old: Vec<Arc<ControllerRevision>> = owned_revisions(ctx, ds)
        .into_iter()
        .filter(|r| {
            r.labels()
                .get(CONTROLLER_REVISION_HASH)
                .is_none_or(|h| !in_use.contains(h.as_str()))
        })
        .collect();
    let excess = old
        .len()
        .saturating_sub(usize::try_from(limit).unwrap_or(0));
    old.sort_by_key(|r| r.revision);
    for revision in old.into_iter().take(excess) {
        let name = revision.name_any();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: revision.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api(ctx, ds).delete(&name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(source) => return Err(Error::WriteRevision { name, source }),
        }
    }
    Ok(())
}
