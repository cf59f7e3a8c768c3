//! VM endpoints: `start`, `stop`, `restart` (decided by [`super::state_change`]) and
//! `migrate` (creates a `VirtualMachineInstanceMigration`). All answer 202 on success.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kubevirt_api::v1::{
    MigrateOptions, RestartOptions, StartOptions, StopOptions, VirtualMachine,
    VirtualMachineInstance, VirtualMachineInstanceMigration, VirtualMachineInstanceMigrationSpec,
    VirtualMachineInstancePhase,
};
use serde_json::json;

use super::error::{Res, SubError};
use super::state_change::{
    VmPatch, check_restart_options, grace_period_patch, phase, plan_restart, plan_start, plan_stop,
};
use super::{Ctx, decode, dry_run, get_vm, get_vmi, get_vmi_opt, json_patch, respond};

async fn apply(ctx: &Ctx, ns: &str, name: &str, plan: VmPatch, dry: bool) -> Result<(), SubError> {
    let api: Api<VirtualMachine> = Api::namespaced(ctx.client.clone(), ns);
    let pp = PatchParams {
        dry_run: dry,
        ..Default::default()
    };
    let result = match plan {
        VmPatch::Spec(p) => {
            api.patch(name, &pp, &Patch::Json::<()>(json_patch(p)?))
                .await
        }
        VmPatch::Status(p) => {
            api.patch_status(name, &pp, &Patch::Json::<()>(json_patch(p)?))
                .await
        }
        VmPatch::Nothing => return Ok(()),
    };
    result
        .map(drop)
        .map_err(|e| SubError::from_patch(Res::Vm, name, &e))
}

async fn patch_vmi(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    patch: serde_json::Value,
) -> Result<(), SubError> {
    Api::<VirtualMachineInstance>::namespaced(ctx.client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Json::<()>(json_patch(patch)?),
        )
        .await
        .map(drop)
        .map_err(SubError::internal)
}

async fn start(ctx: &Ctx, ns: &str, name: &str, body: &[u8]) -> Result<StatusCode, SubError> {
    let vm = get_vm(ctx, ns, name).await?;
    let vmi = get_vmi_opt(ctx, ns, name).await?;
    let opts: StartOptions = decode(body)?;
    let plan = plan_start(&vm, vmi.as_ref(), &opts)?;
    apply(ctx, ns, name, plan, dry_run(&opts.dry_run)).await?;
    Ok(StatusCode::ACCEPTED)
}

async fn stop(ctx: &Ctx, ns: &str, name: &str, body: &[u8]) -> Result<StatusCode, SubError> {
    let opts: StopOptions = decode(body)?;
    let vm = get_vm(ctx, ns, name).await?;
    let vmi = get_vmi_opt(ctx, ns, name).await?;
    if let Some(patch) = grace_period_patch(vmi.as_ref(), &opts)
        && !dry_run(&opts.dry_run)
    {
        patch_vmi(ctx, ns, name, patch).await?;
    }
    let plan = plan_stop(&vm, vmi.as_ref(), &opts)?;
    apply(ctx, ns, name, plan, dry_run(&opts.dry_run)).await?;
    Ok(StatusCode::ACCEPTED)
}

fn grace_patch(old: Option<i64>, new: Option<i64>) -> serde_json::Value {
    let set = match new {
        Some(v) => json!({"op": "add", "path": "/spec/terminationGracePeriodSeconds", "value": v}),
        None => json!({"op": "remove", "path": "/spec/terminationGracePeriodSeconds"}),
    };
    json!([{"op": "test", "path": "/spec/terminationGracePeriodSeconds", "value": old}, set])
}

async fn restart(ctx: &Ctx, ns: &str, name: &str, body: &[u8]) -> Result<StatusCode, SubError> {
    let opts: RestartOptions = decode(body)?;
    check_restart_options(&opts)?;
    let vm = get_vm(ctx, ns, name).await?;
    let vmi = get_vmi_opt(ctx, ns, name).await?;
    let plan = plan_restart(&vm, vmi.as_ref())?;
    let dry = dry_run(&opts.dry_run);
    let force = opts.grace_period_seconds == Some(0) && !dry;
    let old_grace = vmi
        .as_ref()
        .and_then(|v| v.spec.termination_grace_period_seconds);
    if force {
        patch_vmi(ctx, ns, name, grace_patch(old_grace, Some(1))).await?;
    }
    if let Err(e) = apply(ctx, ns, name, plan, dry).await {
        if force {
            // Best effort: the request failed, put the grace period back.
            let _ = patch_vmi(ctx, ns, name, grace_patch(Some(1), old_grace)).await;
        }
        return Err(e);
    }
    if force && let Some(uid) = vmi.as_ref().and_then(|v| v.metadata.uid.as_deref()) {
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
        let list = pods
            .list(&ListParams::default().labels(&format!("kubevirt.io/created-by={uid}")))
            .await
            .map_err(SubError::internal)?;
        for pod in list.items.iter().filter_map(|p| p.metadata.name.as_deref()) {
            pods.delete(pod, &DeleteParams::default().grace_period(0))
                .await
                .map_err(|e| SubError::internal(format!("Failed to delete VMI pod: {e}")))?;
        }
    }
    Ok(StatusCode::ACCEPTED)
}

async fn migrate(ctx: &Ctx, ns: &str, name: &str, body: &[u8]) -> Result<StatusCode, SubError> {
    let opts: MigrateOptions = decode(body)?;
    get_vm(ctx, ns, name).await?;
    let vmi = get_vmi(ctx, ns, name).await?;
    if phase(&vmi) != VirtualMachineInstancePhase::Running {
        return Err(SubError::conflict(Res::Vm, name, "VM is not running"));
    }
    let mut vmim = VirtualMachineInstanceMigration::new(
        "",
        VirtualMachineInstanceMigrationSpec {
            vmi_name: Some(name.to_owned()),
            added_node_selector: opts.added_node_selector.clone(),
            ..Default::default()
        },
    );
    vmim.metadata.name = None;
    vmim.metadata.generate_name = Some("kubevirt-migrate-vm-".to_owned());
    vmim.metadata.namespace = Some(ns.to_owned());
    let pp = PostParams {
        dry_run: dry_run(&opts.dry_run),
        ..Default::default()
    };
    Api::<VirtualMachineInstanceMigration>::namespaced(ctx.client.clone(), ns)
        .create(&pp, &vmim)
        .await
        .map_err(SubError::internal)?;
    Ok(StatusCode::ACCEPTED)
}

/// `PUT …/virtualmachines/{name}/start`.
pub(super) async fn start_handler(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    respond(start(&ctx, &ns, &name, &body).await)
}

/// `PUT …/virtualmachines/{name}/stop`.
pub(super) async fn stop_handler(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    respond(stop(&ctx, &ns, &name, &body).await)
}

/// `PUT …/virtualmachines/{name}/restart`.
pub(super) async fn restart_handler(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    respond(restart(&ctx, &ns, &name, &body).await)
}

/// `PUT …/virtualmachines/{name}/migrate`.
pub(super) async fn migrate_handler(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    respond(migrate(&ctx, &ns, &name, &body).await)
}
