//! `addvolume` / `removevolume` on a VM or a VMI.
//!
//! Data flow: feature-gate check → body decode and option checks → on a VMI, a guarded
//! JSON patch of `spec.volumes` and `spec.domain.devices.disks`; on a VM, with the
//! `HotplugVolumes` gate a guarded patch of `status.volumeRequests` (the VM controller
//! applies it), with only `DeclarativeHotplugVolumes` the same volume/disk patch on the
//! template. The pure [`plan_volume_patch`] and [`plan_volume_request`] decide the patch.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kubevirt_api::v1::{
    AddVolumeOptions, RemoveVolumeOptions, VirtualMachine, VirtualMachineInstance,
    VirtualMachineInstancePhase,
};
use serde_json::{Value, json};

use super::error::{Res, SubError};
use super::state_change::phase;
use super::{Ctx, dry_run, get_vm, get_vmi, json_patch, respond};

/// The `HotplugVolumes` feature gate.
pub const HOTPLUG_VOLUMES: &str = "HotplugVolumes";
const GATE_MESSAGE: &str =
    "Enable DeclarativeHotplugVolumes or HotplugVolumes feature gate to use this API.";
const NO_BODY: &str = "Request with no body, a new name is expected as the request body";

/// A volume change request.
#[derive(Debug, Clone, PartialEq)]
pub enum VolumeChange {
    /// Add a volume and its disk.
    Add(Box<AddVolumeOptions>),
    /// Remove a volume and its disk.
    Remove(RemoveVolumeOptions),
}

impl VolumeChange {
    fn name(&self) -> &str {
        match self {
            VolumeChange::Add(o) => &o.name,
            VolumeChange::Remove(o) => &o.name,
        }
    }

    fn dry_run(&self) -> bool {
        match self {
            VolumeChange::Add(o) => dry_run(&o.dry_run),
            VolumeChange::Remove(o) => dry_run(&o.dry_run),
        }
    }
}

/// Decodes and checks the body of `addvolume` (`add = true`) or `removevolume`; the disk
/// takes the volume's name and a PVC/DataVolume source is marked hotpluggable.
///
/// # Errors
/// 400 with upstream's messages.
pub fn parse_volume_change(body: &[u8], add: bool) -> Result<VolumeChange, SubError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(SubError::bad_request(NO_BODY));
    }
    if !add {
        let opts: RemoveVolumeOptions =
            serde_json::from_slice(body).map_err(SubError::undecodable)?;
        if opts.name.is_empty() {
            return Err(SubError::bad_request(
                "RemoveVolumeOptions requires name to be set",
            ));
        }
        return Ok(VolumeChange::Remove(opts));
    }
    // The disk takes the volume's name, so the body's disk may come without one.
    let mut raw: serde_json::Value = serde_json::from_slice(body).map_err(SubError::undecodable)?;
    let name = raw["name"].clone();
    if let Some(disk) = raw
        .get_mut("disk")
        .and_then(serde_json::Value::as_object_mut)
    {
        disk.insert(
            "name".to_owned(),
            if name.is_string() { name } else { json!("") },
        );
    }
    let mut opts: AddVolumeOptions = serde_json::from_value(raw).map_err(SubError::undecodable)?;
    if opts.name.is_empty() {
        return Err(SubError::bad_request(
            "AddVolumeOptions requires name to be set",
        ));
    }
    let Some(disk) = opts.disk.as_mut() else {
        return Err(SubError::bad_request(
            "AddVolumeOptions requires disk to not be nil",
        ));
    };
    disk.name.clone_from(&opts.name);
    let Some(source) = opts.volume_source.as_mut() else {
        return Err(SubError::bad_request(
            "AddVolumeOptions requires VolumeSource to not be nil",
        ));
    };
    if let Some(pvc) = source.persistent_volume_claim.as_mut() {
        pvc.hotpluggable = Some(true);
    }
    if let Some(dv) = source.data_volume.as_mut() {
        dv.hotpluggable = Some(true);
    }
    Ok(VolumeChange::Add(Box::new(opts)))
}

fn source_name(volume: &Value) -> Option<&str> {
    volume["persistentVolumeClaim"]["claimName"]
        .as_str()
        .or_else(|| volume["dataVolume"]["name"].as_str())
}

fn is_hotpluggable(volume: &Value) -> bool {
    volume["persistentVolumeClaim"]["hotpluggable"] == json!(true)
        || volume["dataVolume"]["hotpluggable"] == json!(true)
}

fn list_patch(ops: &mut Vec<Value>, path: &str, old: &Value, new: &[Value]) {
    let old_list = old.as_array().filter(|a| !a.is_empty());
    ops.push(json!({"op": "test", "path": path, "value": old_list}));
    let op = if old_list.is_some() { "replace" } else { "add" };
    ops.push(json!({"op": op, "path": path, "value": new}));
}

/// The guarded JSON patch that applies `change` to the VMI spec `spec` (a VMI's `spec` at
/// `prefix = "/spec"`, or a VM template's at `/spec/template/spec`).
///
/// # Errors
/// 409 when the name or source exists (add) or the volume is missing or not hotpluggable
/// (remove); `res`/`name` name the object in the message.
pub fn plan_volume_patch(
    spec: &Value,
    prefix: &str,
    change: &VolumeChange,
    res: Res,
    name: &str,
) -> Result<Value, SubError> {
    let volumes: Vec<Value> = spec["volumes"].as_array().cloned().unwrap_or_default();
    let disks: Vec<Value> = spec["domain"]["devices"]["disks"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let (new_volumes, new_disks) = match change {
        VolumeChange::Add(opts) => {
            let mut volume =
                serde_json::to_value(&opts.volume_source).map_err(SubError::internal)?;
            volume["name"] = json!(opts.name);
            let new_source = source_name(&volume);
            for v in &volumes {
                if v["name"] == json!(opts.name) {
                    return Err(SubError::conflict(
                        res,
                        name,
                        format!(
                            "Unable to add volume [{}] because volume with that name already exists",
                            opts.name
                        ),
                    ));
                }
                if new_source.is_some() && source_name(v) == new_source {
                    return Err(SubError::conflict(
                        res,
                        name,
                        format!(
                            "Unable to add volume source [{}] because it already exists",
                            new_source.unwrap_or_default()
                        ),
                    ));
                }
            }
            let mut vs = volumes.clone();
            vs.push(volume);
            let mut ds = disks.clone();
            ds.push(serde_json::to_value(&opts.disk).map_err(SubError::internal)?);
            (vs, ds)
        }
        VolumeChange::Remove(opts) => {
            let Some(v) = volumes.iter().find(|v| v["name"] == json!(opts.name)) else {
                return Err(SubError::conflict(
                    res,
                    name,
                    format!(
                        "Unable to remove volume [{}] because it does not exist",
                        opts.name
                    ),
                ));
            };
            if !is_hotpluggable(v) {
                return Err(SubError::conflict(
                    res,
                    name,
                    format!(
                        "Unable to remove volume [{}] because it is not hotpluggable",
                        opts.name
                    ),
                ));
            }
            let keep = |x: &&Value| x["name"] != json!(opts.name);
            (
                volumes.iter().filter(keep).cloned().collect(),
                disks.iter().filter(keep).cloned().collect(),
            )
        }
    };
    let mut ops = Vec::new();
    list_patch(
        &mut ops,
        &format!("{prefix}/volumes"),
        &spec["volumes"],
        &new_volumes,
    );
    list_patch(
        &mut ops,
        &format!("{prefix}/domain/devices/disks"),
        &spec["domain"]["devices"]["disks"],
        &new_disks,
    );
    Ok(Value::Array(ops))
}

/// The guarded status patch that appends `change` to the VM's `status.volumeRequests`.
///
/// # Errors
/// 409 when a request for the same volume is already pending.
pub fn plan_volume_request(vm: &VirtualMachine, change: &VolumeChange) -> Result<Value, SubError> {
    let name = vm.metadata.name.as_deref().unwrap_or("");
    let current = vm
        .status
        .as_ref()
        .map(|s| s.volume_requests.clone())
        .unwrap_or_default();
    for r in &current {
        let pending_add = r.add_volume_options.as_ref().map(|o| o.name.as_str());
        let pending_remove = r.remove_volume_options.as_ref().map(|o| o.name.as_str());
        let conflict = match change {
            VolumeChange::Add(o) => pending_add == Some(&o.name) || pending_remove == Some(&o.name),
            VolumeChange::Remove(o) => pending_remove == Some(&o.name),
        };
        if conflict {
            return Err(SubError::conflict(
                Res::Vm,
                name,
                format!(
                    "unable to add volume request for volume [{}], a request for it is already pending",
                    change.name()
                ),
            ));
        }
    }
    let request = match change {
        VolumeChange::Add(o) => json!({"addVolumeOptions": o}),
        VolumeChange::Remove(o) => json!({"removeVolumeOptions": o}),
    };
    let mut new = serde_json::to_value(&current).map_err(SubError::internal)?;
    if let Some(list) = new.as_array_mut() {
        list.push(request);
    }
    let mut ops = Vec::new();
    if vm.status.is_none() {
        ops.push(json!({"op": "add", "path": "/status", "value": {"volumeRequests": new}}));
    } else {
        let old = serde_json::to_value(&current).map_err(SubError::internal)?;
        list_patch(
            &mut ops,
            "/status/volumeRequests",
            &old,
            new.as_array().map_or(&[], Vec::as_slice),
        );
    }
    Ok(Value::Array(ops))
}

fn gates(ctx: &Ctx) -> (bool, bool) {
    let cfg = ctx.cluster_config.borrow();
    (
        cfg.feature_gates.contains(HOTPLUG_VOLUMES),
        cfg.feature_gates
            .contains(crate::config::gates::DECLARATIVE_HOTPLUG_VOLUMES),
    )
}

async fn vmi_volume(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    body: &[u8],
    add: bool,
) -> Result<StatusCode, SubError> {
    let (hotplug, declarative) = gates(ctx);
    if !hotplug && !declarative {
        return Err(SubError::bad_request(GATE_MESSAGE));
    }
    let change = parse_volume_change(body, add)?;
    let vmi = get_vmi(ctx, ns, name).await?;
    let owned_by_vm = vmi
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.kind == "VirtualMachine");
    if owned_by_vm && !hotplug {
        return Err(SubError::bad_request(format!(
            "VMI {ns}/{name} is owned by a VM"
        )));
    }
    if phase(&vmi) != VirtualMachineInstancePhase::Running {
        return Err(SubError::conflict(Res::Vmi, name, "VMI is not running"));
    }
    let spec = serde_json::to_value(&vmi.spec).map_err(SubError::internal)?;
    let patch = plan_volume_patch(&spec, "/spec", &change, Res::Vmi, name)?;
    let api: Api<VirtualMachineInstance> = Api::namespaced(ctx.client.clone(), ns);
    let pp = PatchParams {
        dry_run: change.dry_run(),
        ..Default::default()
    };
    api.patch(name, &pp, &Patch::Json::<()>(json_patch(patch)?))
        .await
        .map_err(|e| SubError::from_kube(Res::Vmi, name, &e))?;
    Ok(StatusCode::ACCEPTED)
}

async fn vm_volume(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    body: &[u8],
    add: bool,
) -> Result<StatusCode, SubError> {
    let (hotplug, declarative) = gates(ctx);
    if !hotplug && !declarative {
        return Err(SubError::bad_request(GATE_MESSAGE));
    }
    let change = parse_volume_change(body, add)?;
    let vm = get_vm(ctx, ns, name).await?;
    let api: Api<VirtualMachine> = Api::namespaced(ctx.client.clone(), ns);
    let pp = PatchParams {
        dry_run: change.dry_run(),
        ..Default::default()
    };
    let result = if hotplug {
        let patch = plan_volume_request(&vm, &change)?;
        api.patch_status(name, &pp, &Patch::Json::<()>(json_patch(patch)?))
            .await
    } else {
        let spec = serde_json::to_value(&vm.spec.template.spec).map_err(SubError::internal)?;
        let patch = plan_volume_patch(&spec, "/spec/template/spec", &change, Res::Vm, name)?;
        api.patch(name, &pp, &Patch::Json::<()>(json_patch(patch)?))
            .await
    };
    result.map_err(|e| SubError::from_kube(Res::Vm, name, &e))?;
    Ok(StatusCode::ACCEPTED)
}

/// `PUT …/virtualmachines/{name}/addvolume`.
pub(super) async fn vm_add(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    respond(vm_volume(&ctx, &ns, &name, &body, true).await)
}

/// `PUT …/virtualmachines/{name}/removevolume`.
pub(super) async fn vm_remove(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    respond(vm_volume(&ctx, &ns, &name, &body, false).await)
}

/// `PUT …/virtualmachineinstances/{name}/addvolume`.
pub(super) async fn vmi_add(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    respond(vmi_volume(&ctx, &ns, &name, &body, true).await)
}

/// `PUT …/virtualmachineinstances/{name}/removevolume`.
pub(super) async fn vmi_remove(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    respond(vmi_volume(&ctx, &ns, &name, &body, false).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add_body() -> Vec<u8> {
        br#"{"name":"extra","disk":{"disk":{"bus":"scsi"}},"volumeSource":{"persistentVolumeClaim":{"claimName":"pvc1"}}}"#.to_vec()
    }

    #[test]
    fn add_options_need_a_name_a_disk_and_a_source() {
        let msg = |b: &[u8]| parse_volume_change(b, true).unwrap_err().message;
        assert_eq!(msg(b""), NO_BODY);
        assert_eq!(
            msg(br#"{"name":""}"#),
            "AddVolumeOptions requires name to be set"
        );
        assert_eq!(
            msg(br#"{"name":"a"}"#),
            "AddVolumeOptions requires disk to not be nil"
        );
        assert_eq!(
            msg(br#"{"name":"a","disk":{}}"#),
            "AddVolumeOptions requires VolumeSource to not be nil"
        );
        assert_eq!(
            parse_volume_change(br#"{"name":""}"#, false)
                .unwrap_err()
                .message,
            "RemoveVolumeOptions requires name to be set"
        );
    }

    #[test]
    fn added_pvc_is_marked_hotpluggable_and_the_disk_takes_its_name() {
        let VolumeChange::Add(o) = parse_volume_change(&add_body(), true).unwrap() else {
            panic!("expected add");
        };
        assert_eq!(o.disk.unwrap().name, "extra");
        assert_eq!(
            o.volume_source
                .unwrap()
                .persistent_volume_claim
                .unwrap()
                .hotpluggable,
            Some(true)
        );
    }

    #[test]
    fn adding_a_volume_patches_volumes_and_disks_behind_tests() {
        let change = parse_volume_change(&add_body(), true).unwrap();
        let spec = json!({"domain": {"devices": {"disks": [{"name": "root"}]}},
                          "volumes": [{"name": "root", "containerDisk": {"image": "x"}}]});
        let p = plan_volume_patch(&spec, "/spec", &change, Res::Vmi, "vmi").unwrap();
        assert_eq!(
            p[0],
            json!({"op": "test", "path": "/spec/volumes", "value": spec["volumes"]})
        );
        assert_eq!(p[1]["op"], "replace");
        assert_eq!(p[1]["value"][1]["name"], "extra");
        assert_eq!(p[3]["value"][1]["name"], "extra");
    }

    #[test]
    fn adding_an_existing_name_or_source_conflicts() {
        let change = parse_volume_change(&add_body(), true).unwrap();
        let spec = json!({"volumes": [{"name": "extra", "containerDisk": {}}]});
        let e = plan_volume_patch(&spec, "/spec", &change, Res::Vmi, "v").unwrap_err();
        assert_eq!(e.code, 409);
        assert!(e.message.ends_with(
            "Unable to add volume [extra] because volume with that name already exists"
        ));
        let spec =
            json!({"volumes": [{"name": "other", "persistentVolumeClaim": {"claimName": "pvc1"}}]});
        let e = plan_volume_patch(&spec, "/spec", &change, Res::Vmi, "v").unwrap_err();
        assert!(
            e.message
                .ends_with("Unable to add volume source [pvc1] because it already exists")
        );
    }

    #[test]
    fn removing_needs_an_existing_hotpluggable_volume() {
        let change = parse_volume_change(br#"{"name":"root"}"#, false).unwrap();
        let e = plan_volume_patch(&json!({}), "/spec", &change, Res::Vmi, "v").unwrap_err();
        assert!(
            e.message
                .ends_with("Unable to remove volume [root] because it does not exist")
        );
        let spec = json!({"volumes": [{"name": "root", "containerDisk": {}}]});
        let e = plan_volume_patch(&spec, "/spec", &change, Res::Vmi, "v").unwrap_err();
        assert!(
            e.message
                .ends_with("Unable to remove volume [root] because it is not hotpluggable")
        );
        let spec = json!({"volumes": [{"name": "root", "dataVolume": {"name": "d", "hotpluggable": true}}],
                          "domain": {"devices": {"disks": [{"name": "root"}]}}});
        let p = plan_volume_patch(&spec, "/spec", &change, Res::Vmi, "v").unwrap();
        assert_eq!(p[1]["value"], json!([]));
        assert_eq!(p[3]["value"], json!([]));
    }

    #[test]
    fn vm_volume_requests_are_appended_and_duplicates_conflict() {
        let change = parse_volume_change(&add_body(), true).unwrap();
        let vm = VirtualMachine::new("vm", Default::default());
        let p = plan_volume_request(&vm, &change).unwrap();
        assert_eq!(p[0]["path"], "/status");
        assert_eq!(
            p[0]["value"]["volumeRequests"][0]["addVolumeOptions"]["name"],
            "extra"
        );
        let mut vm = vm;
        vm.status = Some(
            serde_json::from_value(json!({"volumeRequests": [p[0]["value"]["volumeRequests"][0]]}))
                .unwrap(),
        );
        assert_eq!(plan_volume_request(&vm, &change).unwrap_err().code, 409);
    }
}
