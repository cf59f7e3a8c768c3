//! VMI endpoints forwarded to the node: `pause`, `unpause`, `softreboot`, `freeze`,
//! `unfreeze` (200 on success), and the guest-agent queries `guestosinfo`, `userlist`,
//! `filesystemlist`.
//!
//! The pure `check_*` functions hold upstream's pre-checks; the handlers fetch the VMI,
//! check, and (unless dry-run) forward through [`super::node::NodeClient`].

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kube::Api;
use kubevirt_api::v1::{
    ConditionStatus, PauseOptions, UnpauseOptions, VirtualMachine, VirtualMachineInstance,
    VirtualMachineInstanceConditionType, VirtualMachineInstancePhase,
};

use super::error::{Res, SubError};
use super::node::NodeClient;
use super::state_change::phase;
use super::{Ctx, decode, dry_run, get_vmi, respond};

fn vmi_name(vmi: &VirtualMachineInstance) -> &str {
    vmi.metadata.name.as_deref().unwrap_or("")
}

fn condition(
    vmi: &VirtualMachineInstance,
    type_: &VirtualMachineInstanceConditionType,
) -> Option<ConditionStatus> {
    vmi.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == *type_)
        .map(|c| c.status.clone())
}

fn running(vmi: &VirtualMachineInstance) -> bool {
    phase(vmi) == VirtualMachineInstancePhase::Running
}

/// Upstream's checks before `pause`.
///
/// # Errors
/// 409 not running / already paused, 403 for a non-guest-agent liveness probe.
pub fn check_pause(vmi: &VirtualMachineInstance) -> Result<(), SubError> {
    let name = vmi_name(vmi);
    if !running(vmi) {
        return Err(SubError::conflict(Res::Vmi, name, "VM is not running"));
    }
    if vmi
        .spec
        .liveness_probe
        .as_ref()
        .is_some_and(|p| p.guest_agent_ping.is_none())
    {
        return Err(SubError::forbidden(
            Res::Vmi,
            name,
            "Pausing VMIs with a non-GuestAgentPing LivenessProbe is not supported",
        ));
    }
    if condition(vmi, &VirtualMachineInstanceConditionType::Paused).is_some() {
        return Err(SubError::conflict(Res::Vmi, name, "VMI is already paused"));
    }
    Ok(())
}

/// Upstream's checks before `unpause`; `vm` is the VM of the same name, if any.
///
/// # Errors
/// 409 snapshot in progress / not running / not paused.
pub fn check_unpause(
    vmi: &VirtualMachineInstance,
    vm: Option<&VirtualMachine>,
) -> Result<(), SubError> {
    let name = vmi_name(vmi);
    if vm
        .and_then(|v| v.status.as_ref())
        .is_some_and(|s| s.snapshot_in_progress.is_some())
    {
        return Err(SubError::conflict(
            Res::Vmi,
            name,
            "VM snapshot is in progress",
        ));
    }
    if !running(vmi) {
        return Err(SubError::conflict(Res::Vmi, name, "VMI is not running"));
    }
    if condition(vmi, &VirtualMachineInstanceConditionType::Paused).is_none() {
        return Err(SubError::conflict(Res::Vmi, name, "VMI is not paused"));
    }
    Ok(())
}

/// Upstream's checks before `softreboot`.
///
/// # Errors
/// 409 not running / paused / neither agent nor ACPI.
pub fn check_soft_reboot(vmi: &VirtualMachineInstance) -> Result<(), SubError> {
    let name = vmi_name(vmi);
    if !running(vmi) {
        return Err(SubError::conflict(Res::Vmi, name, "VM is not running"));
    }
    if condition(vmi, &VirtualMachineInstanceConditionType::Paused) == Some(ConditionStatus::True) {
        return Err(SubError::conflict(Res::Vmi, name, "VMI is paused"));
    }
    let acpi_disabled = vmi
        .spec
        .domain
        .features
        .as_ref()
        .and_then(|f| f.acpi.as_ref())
        .is_some_and(|a| a.enabled == Some(false));
    if condition(vmi, &VirtualMachineInstanceConditionType::AgentConnected).is_none()
        && acpi_disabled
    {
        return Err(SubError::conflict(
            Res::Vmi,
            name,
            "VMI neither have the agent connected nor the ACPI feature enabled",
        ));
    }
    Ok(())
}

/// Upstream's checks before a guest-agent query (answered as plain-text 500s).
///
/// # Errors
/// 500 not running / no agent.
pub fn check_guest_agent(vmi: &VirtualMachineInstance) -> Result<(), SubError> {
    if !running(vmi) {
        return Err(SubError::plain(500, "VMI is not running"));
    }
    if condition(vmi, &VirtualMachineInstanceConditionType::AgentConnected).is_none() {
        return Err(SubError::plain(
            500,
            "VMI does not have guest agent connected",
        ));
    }
    Ok(())
}

async fn forward(ctx: &Ctx, vmi: &VirtualMachineInstance, sub: &str) -> Result<(), SubError> {
    forward_body(ctx, vmi, sub, Bytes::new()).await
}

async fn forward_body(
    ctx: &Ctx,
    vmi: &VirtualMachineInstance,
    sub: &str,
    body: Bytes,
) -> Result<(), SubError> {
    let node = ctx
        .node
        .as_ref()
        .ok_or_else(|| SubError::internal("no client credentials for node agents configured"))?;
    let target = NodeClient::locate(&ctx.client, vmi).await?;
    node.put_body(&target, sub, body).await
}

/// Upstream's check before `freeze` and `unfreeze`.
///
/// # Errors
/// 409 not running.
pub fn check_freeze(vmi: &VirtualMachineInstance) -> Result<(), SubError> {
    if !running(vmi) {
        return Err(SubError::conflict(
            Res::Vmi,
            vmi_name(vmi),
            "VMI is not running",
        ));
    }
    Ok(())
}

/// `freeze` (the body, with its `unfreezeTimeout`, goes to the node, which checks it, as
/// upstream's) or `unfreeze`.
async fn freeze(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    sub: &str,
    body: Bytes,
) -> Result<StatusCode, SubError> {
    let vmi = get_vmi(ctx, ns, name).await?;
    check_freeze(&vmi)?;
    forward_body(ctx, &vmi, sub, body).await?;
    Ok(StatusCode::OK)
}

/// `PUT …/virtualmachineinstances/{name}/freeze`.
pub(super) async fn freeze_handler(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    respond(freeze(&ctx, &ns, &name, "freeze", body).await)
}

/// `PUT …/virtualmachineinstances/{name}/unfreeze`.
pub(super) async fn unfreeze_handler(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    respond(freeze(&ctx, &ns, &name, "unfreeze", Bytes::new()).await)
}

async fn pause(ctx: &Ctx, ns: &str, name: &str, body: &[u8]) -> Result<StatusCode, SubError> {
    let opts: PauseOptions = decode(body)?;
    let vmi = get_vmi(ctx, ns, name).await?;
    check_pause(&vmi)?;
    if !dry_run(&opts.dry_run) {
        forward(ctx, &vmi, "pause").await?;
    }
    Ok(StatusCode::OK)
}

async fn unpause(ctx: &Ctx, ns: &str, name: &str, body: &[u8]) -> Result<StatusCode, SubError> {
    let opts: UnpauseOptions = decode(body)?;
    let vmi = get_vmi(ctx, ns, name).await?;
    let vm = match Api::<VirtualMachine>::namespaced(ctx.client.clone(), ns)
        .get_opt(name)
        .await
    {
        Ok(vm) => vm,
        Err(e) => return Err(SubError::internal(e)),
    };
    check_unpause(&vmi, vm.as_ref())?;
    if !dry_run(&opts.dry_run) {
        forward(ctx, &vmi, "unpause").await?;
    }
    Ok(StatusCode::OK)
}

async fn soft_reboot(ctx: &Ctx, ns: &str, name: &str) -> Result<StatusCode, SubError> {
    let vmi = get_vmi(ctx, ns, name).await?;
    check_soft_reboot(&vmi)?;
    forward(ctx, &vmi, "softreboot").await?;
    Ok(StatusCode::OK)
}

/// Asks the node for the guest agent's `query`; its JSON body is the answer. Failures are
/// plain-text 500s, as upstream's.
async fn guest_agent(ctx: &Ctx, ns: &str, name: &str, query: &str) -> Result<Bytes, SubError> {
    let vmi = get_vmi(ctx, ns, name)
        .await
        .map_err(|e| SubError::plain(500, e.message))?;
    check_guest_agent(&vmi)?;
    let node = ctx
        .node
        .as_ref()
        .ok_or_else(|| SubError::plain(500, "no client credentials for node agents configured"))?;
    let target = NodeClient::locate(&ctx.client, &vmi)
        .await
        .map_err(|e| SubError::plain(500, e.message))?;
    node.get(&target, query)
        .await
        .map_err(|e| SubError::plain(500, e.message))
}

fn respond_json(result: Result<Bytes, SubError>) -> Response {
    match result {
        Ok(body) => (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(e) => respond(Err(e)),
    }
}

/// `PUT …/virtualmachineinstances/{name}/pause`.
pub(super) async fn pause_handler(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    respond(pause(&ctx, &ns, &name, &body).await)
}

/// `PUT …/virtualmachineinstances/{name}/unpause`.
pub(super) async fn unpause_handler(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    respond(unpause(&ctx, &ns, &name, &body).await)
}

/// `PUT …/virtualmachineinstances/{name}/softreboot`.
pub(super) async fn soft_reboot_handler(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    respond(soft_reboot(&ctx, &ns, &name).await)
}

/// `GET …/virtualmachineinstances/{name}/guestosinfo`.
pub(super) async fn guest_os_info_handler(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    respond_json(guest_agent(&ctx, &ns, &name, "guestosinfo").await)
}

/// `GET …/virtualmachineinstances/{name}/userlist`.
pub(super) async fn user_list_handler(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    respond_json(guest_agent(&ctx, &ns, &name, "userlist").await)
}

/// `GET …/virtualmachineinstances/{name}/filesystemlist`.
pub(super) async fn filesystem_list_handler(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    respond_json(guest_agent(&ctx, &ns, &name, "filesystemlist").await)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn vmi(
        phase: &str,
        extra_status: serde_json::Value,
        spec: serde_json::Value,
    ) -> VirtualMachineInstance {
        let mut status = json!({"phase": phase});
        if let (Some(s), serde_json::Value::Object(e)) = (status.as_object_mut(), extra_status) {
            s.extend(e);
        }
        let mut spec_v = json!({"domain": {"devices": {}}});
        if let (Some(s), serde_json::Value::Object(e)) = (spec_v.as_object_mut(), spec) {
            s.extend(e);
        }
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "v", "namespace": "default"},
            "spec": spec_v, "status": status,
        }))
        .unwrap()
    }

    fn paused() -> serde_json::Value {
        json!({"conditions": [{"type": "Paused", "status": "True"}]})
    }

    fn inner(r: Result<(), SubError>) -> (u16, String) {
        let e = r.unwrap_err();
        (e.code, e.message.rsplit(": ").next().unwrap().to_owned())
    }

    #[test]
    fn pause_needs_a_running_unpaused_vmi_without_a_plain_liveness_probe() {
        assert!(check_pause(&vmi("Running", json!({}), json!({}))).is_ok());
        assert_eq!(
            inner(check_pause(&vmi("Scheduled", json!({}), json!({})))),
            (409, "VM is not running".into())
        );
        assert_eq!(
            inner(check_pause(&vmi("Running", paused(), json!({})))),
            (409, "VMI is already paused".into())
        );
        let probe = json!({"livenessProbe": {"tcpSocket": {"port": 22}}});
        assert_eq!(
            inner(check_pause(&vmi("Running", json!({}), probe))),
            (
                403,
                "Pausing VMIs with a non-GuestAgentPing LivenessProbe is not supported".into()
            )
        );
    }

    #[test]
    fn unpause_needs_a_paused_running_vmi_and_no_snapshot() {
        assert!(check_unpause(&vmi("Running", paused(), json!({})), None).is_ok());
        assert_eq!(
            inner(check_unpause(&vmi("Running", json!({}), json!({})), None)),
            (409, "VMI is not paused".into())
        );
        assert_eq!(
            inner(check_unpause(&vmi("Pending", paused(), json!({})), None)),
            (409, "VMI is not running".into())
        );
        let mut vm = VirtualMachine::new("v", Default::default());
        vm.status = Some(serde_json::from_value(json!({"snapshotInProgress": "s"})).unwrap());
        assert_eq!(
            inner(check_unpause(
                &vmi("Running", paused(), json!({})),
                Some(&vm)
            )),
            (409, "VM snapshot is in progress".into())
        );
    }

    #[test]
    fn soft_reboot_refuses_paused_and_acpi_less_agentless_vmis() {
        assert!(check_soft_reboot(&vmi("Running", json!({}), json!({}))).is_ok());
        assert_eq!(
            inner(check_soft_reboot(&vmi("Running", paused(), json!({})))),
            (409, "VMI is paused".into())
        );
        let no_acpi = json!({"domain": {"devices": {}, "features": {"acpi": {"enabled": false}}}});
        assert_eq!(
            inner(check_soft_reboot(&vmi("Running", json!({}), no_acpi))),
            (
                409,
                "VMI neither have the agent connected nor the ACPI feature enabled".into()
            )
        );
    }

    #[test]
    fn freeze_needs_a_running_vmi() {
        assert!(check_freeze(&vmi("Running", json!({}), json!({}))).is_ok());
        assert_eq!(
            inner(check_freeze(&vmi("Scheduled", json!({}), json!({})))),
            (409, "VMI is not running".into())
        );
    }

    #[test]
    fn guest_agent_queries_answer_plain_500s() {
        let e = check_guest_agent(&vmi("Running", json!({}), json!({}))).unwrap_err();
        assert_eq!((e.code, e.plain), (500, true));
        assert_eq!(e.message, "VMI does not have guest agent connected");
        let e = check_guest_agent(&vmi("Pending", json!({}), json!({}))).unwrap_err();
        assert_eq!(e.message, "VMI is not running");
    }
}
