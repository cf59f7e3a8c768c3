//! One pass over a Deployment: finding or creating the new ReplicaSet, scaling, the rollout
//! strategies and history cleanup (kube's `sync.go`, `rolling.go`, `recreate.go`).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use serde_json::json;
use tracing::info;

use super::status;
use super::util::{
    self, POD_TEMPLATE_HASH, REVISION, by_creation, max_surge, max_unavailable, replicas,
    rs_replicas,
};
use crate::ownership::{controller_of, controller_reference};
use crate::{Context, Error};

/// kube's default `revisionHistoryLimit`.
pub const DEFAULT_REVISION_HISTORY_LIMIT: i32 = 10;

/// What one pass knows and has written so far.
pub struct Pass<'a> {
    ctx: &'a Context,
    pub(super) d: Deployment,
    /// The ReplicaSets the Deployment controls, oldest first, as last read or written.
    pub(super) rss: Vec<ReplicaSet>,
    /// Index of the new ReplicaSet (template equal to the Deployment's) in `rss`.
    pub(super) new: Option<usize>,
    /// The status being built (conditions set during the pass).
    pub(super) status: DeploymentStatus,
}

fn available(rs: &ReplicaSet) -> i32 {
    rs.status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
}

impl<'a> Pass<'a> {
    /// A pass over `d` and the ReplicaSets it controls.
    pub fn new(ctx: &'a Context, d: Deployment, owned: &[Arc<ReplicaSet>]) -> Self {
        let mut rss: Vec<ReplicaSet> = owned.iter().map(|rs| (**rs).clone()).collect();
        rss.sort_by(by_creation);
        let status = d.status.clone().unwrap_or_default();
        Pass {
            ctx,
            d,
            rss,
            new: None,
            status,
        }
    }

    fn api(&self) -> Api<ReplicaSet> {
        Api::namespaced(
            self.ctx.client.clone(),
            &self.d.namespace().unwrap_or_default(),
        )
    }

    /// Indices of the old ReplicaSets, oldest first.
    fn old(&self) -> Vec<usize> {
        (0..self.rss.len())
            .filter(|&i| Some(i) != self.new)
            .collect()
    }

    fn total_replicas(&self) -> i32 {
        self.rss.iter().map(rs_replicas).sum()
    }

    /// Writes `rss[i]` as it is now (an update with its `resourceVersion`).
    async fn update(&mut self, i: usize) -> Result<(), Error> {
        let rs = &self.rss[i];
        let name = rs.name_any();
        let updated = self
            .api()
            .replace(&name, &PostParams::default(), rs)
            .await
            .map_err(|source| Error::UpdateReplicaSet { name, source })?;
        self.rss[i] = updated;
        Ok(())
    }

    /// Scales `rss[i]` to `to` and refreshes its replica annotations; returns whether the
    /// size changed (kube's `scaleReplicaSet`).
    async fn scale_rs(&mut self, i: usize, to: i32) -> Result<bool, Error> {
        let from = rs_replicas(&self.rss[i]);
        let desired = replicas(&self.d);
        let max = desired + max_surge(&self.d);
        let annotations_changed = util::set_replicas_annotations(&mut self.rss[i], desired, max);
        if from == to && !annotations_changed {
            return Ok(false);
        }
        self.rss[i]
            .spec
            .get_or_insert_with(ReplicaSetSpec::default)
            .replicas = Some(to);
        self.update(i).await?;
        if from != to {
            let direction = if to > from { "up" } else { "down" };
            info!(
                deployment = %crate::ownership::key(&self.d.metadata),
                "Scaled {direction} replica set {} from {from} to {to}",
                self.rss[i].name_any()
            );
        }
        Ok(from != to)
    }

    /// Finds the new ReplicaSet (creating it if `create`), raises its revision above the old
    /// ones and copies that revision to the Deployment (kube's
    /// `getAllReplicaSetsAndSyncRevision`).
    pub(super) async fn sync_revision(&mut self, create: bool) -> Result<(), Error> {
        self.new = util::find_new(&self.d, &self.rss);
        let max_old = self
            .old()
            .iter()
            .map(|&i| util::revision(&self.rss[i]))
            .max()
            .unwrap_or(0);
        let new_revision = max_old + 1;
        let min_ready = self.d.spec.as_ref().and_then(|s| s.min_ready_seconds);
        if let Some(i) = self.new {
            let changed =
                util::set_new_rs_annotations(&self.d, &mut self.rss[i], new_revision, true);
            let spec = self.rss[i].spec.get_or_insert_with(ReplicaSetSpec::default);
            let min_ready_changed = spec.min_ready_seconds != min_ready;
            spec.min_ready_seconds = min_ready;
            if changed || min_ready_changed {
                self.update(i).await?;
            }
            let revision = self.rss[i]
                .annotations()
                .get(REVISION)
                .cloned()
                .unwrap_or_default();
            self.set_deployment_revision(&revision).await?;
            if status::progressing(&self.status).is_none() {
                let message = format!("Found new replica set \"{}\"", self.rss[i].name_any());
                status::set_condition(
                    &mut self.status,
                    status::condition("Progressing", "True", "FoundNewReplicaSet", message),
                );
            }
            return Ok(());
        }
        if !create {
            return Ok(());
        }
        self.create_new(new_revision).await
    }

    async fn create_new(&mut self, new_revision: i64) -> Result<(), Error> {
        let spec = self.d.spec.clone().unwrap_or_default();
        let mut template = spec.template.clone();
        let hash = util::compute_hash(&template, self.status.collision_count);
        let mut labels = template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        labels.insert(POD_TEMPLATE_HASH.to_owned(), hash.clone());
        template
            .metadata
            .get_or_insert_with(ObjectMeta::default)
            .labels = Some(labels.clone());
        let mut selector: LabelSelector = spec.selector.clone();
        selector
            .match_labels
            .get_or_insert_with(BTreeMap::new)
            .insert(POD_TEMPLATE_HASH.to_owned(), hash.clone());
        let name = format!("{}-{hash}", self.d.name_any());
        let mut rs = ReplicaSet {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: self.d.namespace(),
                labels: Some(labels),
                owner_references: Some(vec![controller_reference(&self.d)]),
                ..ObjectMeta::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(0),
                min_ready_seconds: spec.min_ready_seconds,
                selector,
                template: Some(template),
            }),
            status: None,
        };
        let count = self.new_rs_new_replicas(0);
        if let Some(s) = rs.spec.as_mut() {
            s.replicas = Some(count);
        }
        util::set_new_rs_annotations(&self.d, &mut rs, new_revision, false);
        let created = match self.api().create(&PostParams::default(), &rs).await {
            Ok(created) => created,
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let existing =
                    self.api()
                        .get(&name)
                        .await
                        .map_err(|source| Error::CreateReplicaSet {
                            name: name.clone(),
                            source,
                        })?;
                let ours = controller_of(&existing.metadata)
                    .is_some_and(|r| Some(&r.uid) == self.d.metadata.uid.as_ref());
                let same = existing
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.as_ref())
                    .is_some_and(|t| util::equal_ignore_hash(t, &spec.template));
                if ours && same {
                    // The cache had not caught up with our own creation.
                    self.rss.push(existing);
                    self.new = Some(self.rss.len() - 1);
                    return Ok(());
                }
                let mut status = self.status.clone();
                status.collision_count = Some(status.collision_count.unwrap_or(0) + 1);
                write_status(self.ctx, &self.d, status).await?;
                return Err(Error::HashCollision { name });
            }
            Err(source) => {
                let message = format!("Failed to create new replica set \"{name}\": {source}");
                let mut status = self.status.clone();
                status::set_condition(
                    &mut status,
                    status::condition("Progressing", "False", "ReplicaSetCreateError", message),
                );
                write_status(self.ctx, &self.d, status).await?;
                return Err(Error::CreateReplicaSet { name, source });
            }
        };
        info!(
            deployment = %crate::ownership::key(&self.d.metadata),
            "Scaled up replica set {name} from 0 to {count}"
        );
        self.rss.push(created);
        self.new = Some(self.rss.len() - 1);
        self.set_deployment_revision(&new_revision.to_string())
            .await?;
        let message = format!("Created new replica set \"{name}\"");
        status::set_condition(
            &mut self.status,
            status::condition("Progressing", "True", "NewReplicaSetCreated", message),
        );
        Ok(())
    }

    /// Copies the new ReplicaSet's revision to the Deployment's annotation.
    async fn set_deployment_revision(&mut self, revision: &str) -> Result<(), Error> {
        if self.d.annotations().get(REVISION).map(String::as_str) == Some(revision) {
            return Ok(());
        }
        let api: Api<Deployment> = Api::namespaced(
            self.ctx.client.clone(),
            &self.d.namespace().unwrap_or_default(),
        );
        let patch = json!({"metadata": {"annotations": {REVISION: revision}}});
        self.d = api
            .patch(
                &self.d.name_any(),
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await
            .map_err(|source| Error::UpdateDeployment {
                name: self.d.name_any(),
                source,
            })?;
        Ok(())
    }

    /// How many replicas the new ReplicaSet (now at `current`) may have (kube's
    /// `NewRSNewReplicas`).
    fn new_rs_new_replicas(&self, current: i32) -> i32 {
        let want = replicas(&self.d);
        if util::is_recreate(&self.d) {
            return want;
        }
        let total =
            self.total_replicas() - self.new.map_or(0, |i| rs_replicas(&self.rss[i])) + current;
        let max_total = want + max_surge(&self.d);
        if total >= max_total {
            return current;
        }
        current + (max_total - total).min(want - current).max(0)
    }

    /// A rolling update step: scale the new ReplicaSet up, else the old ones down, else
    /// clean up (kube's `rolloutRolling`).
    pub(super) async fn rollout_rolling(mut self) -> Result<Action, Error> {
        self.sync_revision(true).await?;
        if self.reconcile_new().await? {
            return self.sync_rollout_status().await;
        }
        if self.reconcile_old().await? {
            return self.sync_rollout_status().await;
        }
        if status::complete(&self.d, &self.status) {
            self.cleanup().await?;
        }
        self.sync_rollout_status().await
    }

    async fn reconcile_new(&mut self) -> Result<bool, Error> {
        let Some(i) = self.new else {
            return Ok(false);
        };
        let want = replicas(&self.d);
        let current = rs_replicas(&self.rss[i]);
        if current == want {
            return Ok(false);
        }
        if current > want {
            return self.scale_rs(i, want).await;
        }
        let to = self.new_rs_new_replicas(current);
        self.scale_rs(i, to).await
    }

    async fn reconcile_old(&mut self) -> Result<bool, Error> {
        let old: Vec<usize> = self
            .old()
            .into_iter()
            .filter(|&i| rs_replicas(&self.rss[i]) > 0)
            .collect();
        if old.is_empty() {
            return Ok(false);
        }
        let min_available = replicas(&self.d) - max_unavailable(&self.d);
        let new_unavailable = self
            .new
            .map_or(0, |i| rs_replicas(&self.rss[i]) - available(&self.rss[i]));
        let max_scaled_down = self.total_replicas() - min_available - new_unavailable;
        if max_scaled_down <= 0 {
            return Ok(false);
        }
        // Unhealthy old replicas go first: they do not count against availability.
        let mut cleaned = 0;
        for &i in &old {
            if cleaned >= max_scaled_down {
                break;
            }
            let current = rs_replicas(&self.rss[i]);
            let healthy = available(&self.rss[i]);
            if current == 0 || current <= healthy {
                continue;
            }
            let count = (max_scaled_down - cleaned).min(current - healthy);
            self.scale_rs(i, current - count).await?;
            cleaned += count;
        }
        // Then healthy ones, as far as availability allows.
        let available_now: i32 = self.rss.iter().map(available).sum();
        let mut scaled = 0;
        if available_now > min_available {
            let budget = available_now - min_available;
            for &i in &old {
                if scaled >= budget {
                    break;
                }
                let current = rs_replicas(&self.rss[i]);
                if current == 0 {
                    continue;
                }
                let count = current.min(budget - scaled);
                self.scale_rs(i, current - count).await?;
                scaled += count;
            }
        }
        Ok(cleaned + scaled > 0)
    }

    /// Recreate: old ReplicaSets to zero, wait for their pods to go, then the new one up
    /// (kube's `rolloutRecreate`).
    pub(super) async fn rollout_recreate(mut self) -> Result<Action, Error> {
        self.sync_revision(false).await?;
        let mut scaled = false;
        for i in self.old() {
            if rs_replicas(&self.rss[i]) > 0 {
                scaled |= self.scale_rs(i, 0).await?;
            }
        }
        if scaled || self.old_pods_running() {
            return self.sync_rollout_status().await;
        }
        if self.new.is_none() {
            self.sync_revision(true).await?;
        }
        if let Some(i) = self.new {
            self.scale_rs(i, replicas(&self.d)).await?;
        }
        if status::complete(&self.d, &self.status) {
            self.cleanup().await?;
        }
        self.sync_rollout_status().await
    }

    fn old_pods_running(&self) -> bool {
        let old = self.old();
        if old
            .iter()
            .any(|&i| self.rss[i].status.as_ref().is_some_and(|s| s.replicas > 0))
        {
            return true;
        }
        let uids: Vec<&str> = old
            .iter()
            .filter_map(|&i| self.rss[i].metadata.uid.as_deref())
            .collect();
        self.ctx.pods.state().iter().any(|p| {
            controller_of(&p.metadata).is_some_and(|r| uids.contains(&r.uid.as_str()))
                && !crate::pods::is_terminal(p)
        })
    }

    /// Whether an active ReplicaSet was last scaled for another `spec.replicas`.
    pub(super) fn is_scaling_event(&self) -> bool {
        let want = replicas(&self.d);
        self.rss
            .iter()
            .filter(|rs| rs_replicas(rs) > 0)
            .any(|rs| util::desired_replicas_annotation(rs).is_some_and(|v| v != want))
    }

    /// Paused or scaled: scale proportionally, clean up when paused, status (kube's `sync`).
    pub(super) async fn sync(mut self) -> Result<Action, Error> {
        self.sync_revision(false).await?;
        self.scale().await?;
        if self.d.spec.as_ref().and_then(|s| s.paused) == Some(true) {
            self.cleanup().await?;
        }
        self.sync_deployment_status().await
    }

    /// A Deployment being deleted: status only.
    pub(super) async fn sync_status_only(mut self) -> Result<Action, Error> {
        self.sync_revision(false).await?;
        self.sync_deployment_status().await
    }

    /// Sets `Progressing` to `DeploymentPaused`/`DeploymentResumed` when `paused` flipped.
    pub(super) fn check_paused_conditions(&mut self) {
        if !status::has_progress_deadline(&self.d) {
            return;
        }
        let reason = status::progressing(&self.status).and_then(|c| c.reason.clone());
        if reason.as_deref() == Some(status::TIMED_OUT) {
            return;
        }
        let paused = self.d.spec.as_ref().and_then(|s| s.paused) == Some(true);
        let condition = if paused && reason.as_deref() != Some("DeploymentPaused") {
            status::condition(
                "Progressing",
                "Unknown",
                "DeploymentPaused",
                "Deployment is paused".into(),
            )
        } else if !paused && reason.as_deref() == Some("DeploymentPaused") {
            status::condition(
                "Progressing",
                "Unknown",
                "DeploymentResumed",
                "Deployment is resumed".into(),
            )
        } else {
            return;
        };
        status::set_condition(&mut self.status, condition);
    }

    /// Proportional scaling (kube's `scale`).
    async fn scale(&mut self) -> Result<(), Error> {
        let want = replicas(&self.d);
        let active: Vec<usize> = (0..self.rss.len())
            .filter(|&i| rs_replicas(&self.rss[i]) > 0)
            .collect();
        // One active (or none: the newest) takes all the replicas.
        let single = match active.as_slice() {
            [] => self.new.or_else(|| self.old().last().copied()),
            [i] => Some(*i),
            _ => None,
        };
        if let Some(i) = single {
            if rs_replicas(&self.rss[i]) != want {
                self.scale_rs(i, want).await?;
            }
            return Ok(());
        }
        if let Some(i) = self
            .new
            .filter(|&i| status::is_saturated(&self.d, &self.rss[i]))
        {
            for j in active.into_iter().filter(|&j| j != i) {
                self.scale_rs(j, 0).await?;
            }
            return Ok(());
        }
        if util::is_recreate(&self.d) {
            return Ok(());
        }
        let allowed = if want > 0 {
            want + max_surge(&self.d)
        } else {
            0
        };
        let current: i32 = active.iter().map(|&i| rs_replicas(&self.rss[i])).sum();
        let to_add = allowed - current;
        let mut order = active;
        // Larger first; among equals newer first when growing, older first when shrinking.
        order.sort_by(|&a, &b| {
            let by_size = rs_replicas(&self.rss[b]).cmp(&rs_replicas(&self.rss[a]));
            let by_age = by_creation(&self.rss[a], &self.rss[b]);
            by_size.then(if to_add > 0 { by_age.reverse() } else { by_age })
        });
        let mut sizes: Vec<(usize, i32)> = Vec::new();
        let mut added = 0;
        for &i in &order {
            let proportion = if to_add == 0 {
                0
            } else {
                self.proportion(&self.rss[i], to_add, added)
            };
            sizes.push((i, rs_replicas(&self.rss[i]) + proportion));
            added += proportion;
        }
        if let Some(first) = sizes.first_mut() {
            first.1 = (first.1 + to_add - added).max(0);
        }
        for (i, size) in sizes {
            self.scale_rs(i, size).await?;
        }
        Ok(())
    }

    /// The share of `to_add` (of which `added` is given out) for `rs` (kube's `GetProportion`).
    fn proportion(&self, rs: &ReplicaSet, to_add: i32, added: i32) -> i32 {
        let current = rs_replicas(rs);
        if current == 0 || to_add == added {
            return 0;
        }
        let want = replicas(&self.d);
        let fraction = if want == 0 {
            -current
        } else {
            let total = f64::from(want + max_surge(&self.d));
            let annotated = util::max_replicas_annotation(rs).unwrap_or_else(|| {
                self.d
                    .status
                    .as_ref()
                    .map_or(0, |s| s.replicas.unwrap_or(0))
            });
            if annotated == 0 {
                0
            } else {
                let size = (f64::from(current) * total / f64::from(annotated)).round() as i32;
                size - current
            }
        };
        let allowed = to_add - added;
        if to_add > 0 {
            fraction.min(allowed)
        } else {
            fraction.max(allowed)
        }
    }

    /// Deletes the oldest idle ReplicaSets beyond `revisionHistoryLimit`.
    async fn cleanup(&mut self) -> Result<(), Error> {
        let limit = self
            .d
            .spec
            .as_ref()
            .and_then(|s| s.revision_history_limit)
            .unwrap_or(DEFAULT_REVISION_HISTORY_LIMIT);
        let mut cleanable: Vec<usize> = self
            .old()
            .into_iter()
            .filter(|&i| self.rss[i].metadata.deletion_timestamp.is_none())
            .collect();
        let excess = i64::try_from(cleanable.len()).unwrap_or(i64::MAX) - i64::from(limit.max(0));
        if excess <= 0 {
            return Ok(());
        }
        cleanable.sort_by(|&a, &b| {
            util::revision(&self.rss[a])
                .cmp(&util::revision(&self.rss[b]))
                .then_with(|| by_creation(&self.rss[a], &self.rss[b]))
        });
        for &i in cleanable.iter().take(usize::try_from(excess).unwrap_or(0)) {
            let rs = &self.rss[i];
            let status = rs.status.clone().unwrap_or_default();
            if status.replicas != 0
                || rs_replicas(rs) != 0
                || rs.metadata.generation > status.observed_generation
            {
                continue;
            }
            let name = rs.name_any();
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: rs.metadata.uid.clone(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            info!(deployment = %crate::ownership::key(&self.d.metadata), replicaset = %name, "deleting old replica set");
            match self.api().delete(&name, &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(source) => return Err(Error::DeleteReplicaSet { name, source }),
            }
        }
        Ok(())
    }

    /// Status from the ReplicaSets (kube's `syncDeploymentStatus`).
    async fn sync_deployment_status(self) -> Result<Action, Error> {
        let new = self.new.map(|i| &self.rss[i]);
        let status = status::calculate(&self.d, &self.rss, new, &self.status);
        write_status(self.ctx, &self.d, status).await?;
        Ok(Action::await_change())
    }

    /// Status and the `Progressing` condition (kube's `syncRolloutStatus`); requeues for the
    /// progress deadline of an unfinished rollout.
    async fn sync_rollout_status(self) -> Result<Action, Error> {
        let new = self.new.map(|i| &self.rss[i]);
        let (status, requeue) = status::rollout(&self.d, &self.rss, new, &self.status);
        write_status(self.ctx, &self.d, status).await?;
        Ok(requeue.map_or_else(Action::await_change, Action::requeue))
    }
}

/// Writes `status` unless the Deployment shows it already (an update with its
/// `resourceVersion`).
pub(super) async fn write_status(
    ctx: &Context,
    d: &Deployment,
    status: DeploymentStatus,
) -> Result<(), Error> {
    if d.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let mut updated = d.clone();
    updated.status = Some(status);
    let api: Api<Deployment> =
        Api::namespaced(ctx.client.clone(), &d.namespace().unwrap_or_default());
    api.replace_status(&d.name_any(), &PostParams::default(), &updated)
        .await
        .map_err(|source| Error::UpdateStatus {
            kind: "Deployment",
            name: d.name_any(),
            source,
        })?;
    Ok(())
}
