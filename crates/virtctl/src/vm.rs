//! The request/response commands: start, stop, restart, migrate, migrate-cancel,
//! pause/unpause, soft-reboot, freeze/unfreeze, add/removevolume, guestosinfo, userlist, fslist, version.

use kube::Api;
use kube::api::{DeleteParams, ListParams};
use kubevirt_api::v1::VirtualMachineInstanceMigration;
use serde_json::json;

use crate::Error;
use crate::cli::{AddVolume, Named, PauseTarget, RemoveVolume, Start, Stop};
use crate::client::{Ctx, Kind, SUBRESOURCES, api_message};

fn dry_run(on: bool) -> serde_json::Value {
    if on { json!(["All"]) } else { json!([]) }
}

fn fail(what: &str, err: &kube::Error) -> Error {
    Error::Message(format!("{what} {}", api_message(err)))
}

/// `virtctl start`.
///
/// # Errors
/// The refused request.
pub async fn start(ctx: &Ctx, a: &Start) -> Result<(), Error> {
    let body = json!({"paused": a.paused, "dryRun": dry_run(a.dry_run)});
    ctx.put(Kind::Vm, &a.name, "start", &body)
        .await
        .map_err(|e| fail("Error starting VirtualMachine", &e))?;
    println!("VM {} was scheduled to start", a.name);
    Ok(())
}

fn force_grace(a: &Stop) -> Result<Option<i64>, Error> {
    if a.grace_period.is_some() != a.force {
        return Err(Error::Message(
            "Must both use --force=true and set --grace-period.".into(),
        ));
    }
    Ok(a.grace_period)
}

/// `virtctl stop`.
///
/// # Errors
/// Bad flags or the refused request.
pub async fn stop(ctx: &Ctx, a: &Stop) -> Result<(), Error> {
    let grace = force_grace(a)?;
    let mut body = json!({"dryRun": dry_run(a.dry_run)});
    if let Some(g) = grace {
        body["gracePeriod"] = json!(g);
    }
    let what = if grace.is_some() {
        "error force stopping VirtualMachine:"
    } else {
        "error stopping VirtualMachine"
    };
    ctx.put(Kind::Vm, &a.name, "stop", &body)
        .await
        .map_err(|e| fail(what, &e))?;
    println!("VM {} was scheduled to stop", a.name);
    Ok(())
}

/// `virtctl restart`.
///
/// # Errors
/// Bad flags or the refused request.
pub async fn restart(ctx: &Ctx, a: &Stop) -> Result<(), Error> {
    let grace = force_grace(a)?;
    let mut body = json!({"dryRun": dry_run(a.dry_run)});
    if let Some(g) = grace {
        body["gracePeriodSeconds"] = json!(g);
    }
    ctx.put(Kind::Vm, &a.name, "restart", &body)
        .await
        .map_err(|e| fail("Error restarting VirtualMachine", &e))?;
    println!("VM {} was scheduled to restart", a.name);
    Ok(())
}

/// `virtctl migrate`.
///
/// # Errors
/// The refused request.
pub async fn migrate(ctx: &Ctx, a: &Named) -> Result<(), Error> {
    let body = json!({"dryRun": dry_run(a.dry_run)});
    ctx.put(Kind::Vm, &a.name, "migrate", &body)
        .await
        .map_err(|e| fail("Error migrating VirtualMachine", &e))?;
    println!("VM {} was scheduled to migrate", a.name);
    Ok(())
}

/// `virtctl migrate-cancel`: deletes the VMI's migration that has not finished.
///
/// # Errors
/// No active migration, or the failed call.
pub async fn migrate_cancel(ctx: &Ctx, a: &Named) -> Result<(), Error> {
    let api: Api<VirtualMachineInstanceMigration> =
        Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let list = api.list(&ListParams::default()).await.map_err(|e| {
        Error::Message(format!(
            "Error fetching virtual machine instance migration list  {}",
            api_message(&e)
        ))
    })?;
    let active = list.items.iter().find(|m| {
        m.spec.vmi_name.as_deref() == Some(a.name.as_str())
            && !m
                .status
                .as_ref()
                .and_then(|s| s.phase.as_ref())
                .is_some_and(|p| matches!(p.as_str(), "Succeeded" | "Failed"))
    });
    let Some(mig) = active.and_then(|m| m.metadata.name.clone()) else {
        return Err(Error::Message(format!(
            "Found no migration to cancel for {}",
            a.name
        )));
    };
    let dp = DeleteParams {
        dry_run: a.dry_run,
        ..Default::default()
    };
    api.delete(&mig, &dp).await.map_err(|e| {
        Error::Message(format!(
            "Error canceling migration {mig} of a VirtualMachine {}: {}",
            a.name,
            api_message(&e)
        ))
    })?;
    println!("VM {} was scheduled to migrate-cancel", a.name);
    Ok(())
}

/// `virtctl pause|unpause vm|vmi NAME` (a VM's VMI has the VM's name).
///
/// # Errors
/// The refused request.
pub async fn pause(ctx: &Ctx, target: &PauseTarget, pause: bool) -> Result<(), Error> {
    let (PauseTarget::Vm(a) | PauseTarget::Vmi(a)) = target;
    let sub = if pause { "pause" } else { "unpause" };
    let body = json!({"dryRun": dry_run(a.dry_run)});
    ctx.put(Kind::Vmi, &a.name, sub, &body).await.map_err(|e| {
        let verb = if pause { "pausing" } else { "unpausing" };
        Error::Message(format!(
            "Error {verb} VirtualMachineInstance {}: {}",
            a.name,
            api_message(&e)
        ))
    })?;
    println!("VMI {} was scheduled to {sub}", a.name);
    Ok(())
}

/// `virtctl soft-reboot`.
///
/// # Errors
/// The refused request.
pub async fn soft_reboot(ctx: &Ctx, a: &Named) -> Result<(), Error> {
    ctx.put(Kind::Vmi, &a.name, "softreboot", &json!({}))
        .await
        .map_err(|e| fail("Error soft rebooting VirtualMachineInstance", &e))?;
    println!("VMI {} was scheduled to soft-reboot", a.name);
    Ok(())
}

/// `virtctl freeze`.
///
/// # Errors
/// The refused request.
pub async fn freeze(ctx: &Ctx, a: &crate::cli::Freeze) -> Result<(), Error> {
    ctx.put(
        Kind::Vmi,
        &a.name,
        "freeze",
        &json!({"unfreezeTimeout": a.unfreeze_timeout}),
    )
    .await
    .map_err(|e| fail("Error freezing VirtualMachineInstance", &e))?;
    println!("VMI {} was frozen", a.name);
    Ok(())
}

/// `virtctl unfreeze`.
///
/// # Errors
/// The refused request.
pub async fn unfreeze(ctx: &Ctx, a: &Named) -> Result<(), Error> {
    ctx.put(Kind::Vmi, &a.name, "unfreeze", &json!({}))
        .await
        .map_err(|e| fail("Error unfreezing VirtualMachineInstance", &e))?;
    println!("VMI {} was unfrozen", a.name);
    Ok(())
}

/// The `AddVolumeOptions` body of `addvolume`.
pub fn add_volume_body(a: &AddVolume) -> serde_json::Value {
    let mut disk = json!({"name": a.volume_name});
    disk[a.disk_type.as_str()] = json!({"bus": a.bus});
    if let Some(serial) = &a.serial {
        disk["serial"] = json!(serial);
    }
    json!({
        "name": a.volume_name,
        "disk": disk,
        "volumeSource": {"persistentVolumeClaim": {"claimName": a.volume_name, "hotpluggable": true}},
        "dryRun": dry_run(a.dry_run),
    })
}

/// `virtctl addvolume`.
///
/// # Errors
/// The refused request.
pub async fn add_volume(ctx: &Ctx, a: &AddVolume) -> Result<(), Error> {
    let kind = if a.persist { Kind::Vm } else { Kind::Vmi };
    ctx.put(kind, &a.name, "addvolume", &add_volume_body(a))
        .await
        .map_err(|e| fail("error adding volume,", &e))?;
    println!(
        "Successfully submitted add volume request to VM {} for volume {}",
        a.name, a.volume_name
    );
    Ok(())
}

/// `virtctl removevolume`.
///
/// # Errors
/// The refused request.
pub async fn remove_volume(ctx: &Ctx, a: &RemoveVolume) -> Result<(), Error> {
    let kind = if a.persist { Kind::Vm } else { Kind::Vmi };
    let body = json!({"name": a.volume_name, "dryRun": dry_run(a.dry_run)});
    ctx.put(kind, &a.name, "removevolume", &body)
        .await
        .map_err(|e| fail("error removing volume,", &e))?;
    println!(
        "Successfully submitted remove volume request to VM {} for volume {}",
        a.name, a.volume_name
    );
    Ok(())
}

/// `virtctl guestosinfo`, `userlist`, `fslist`: prints the guest agent's answer to the VMI
/// subresource `sub` as indented JSON; `what` begins upstream's error message.
///
/// # Errors
/// The refused request.
pub async fn guest_agent_query(ctx: &Ctx, a: &Named, sub: &str, what: &str) -> Result<(), Error> {
    let path = crate::client::subresource_path(&ctx.namespace, Kind::Vmi, &a.name, sub);
    let info = ctx.get_json(path).await.map_err(|e| {
        Error::Message(format!(
            "{what} of VirtualMachineInstance {}, {}",
            a.name,
            api_message(&e)
        ))
    })?;
    let text = serde_json::to_string_pretty(&info).map_err(|e| Error::Encode(Box::new(e)))?;
    println!("{text}");
    Ok(())
}

fn platform() -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    format!("{}/{arch}", std::env::consts::OS)
}

fn info_line(label: &str, v: &serde_json::Value) -> String {
    let f = |k: &str| v[k].as_str().unwrap_or("").to_owned();
    format!(
        "{label}: version.Info{{GitVersion:\"{}\", GitCommit:\"{}\", GitTreeState:\"{}\", BuildDate:\"{}\", GoVersion:\"{}\", Compiler:\"{}\", Platform:\"{}\"}}",
        f("gitVersion"),
        f("gitCommit"),
        f("gitTreeState"),
        f("buildDate"),
        f("goVersion"),
        f("compiler"),
        f("platform")
    )
}

/// The `Client Version: …` line.
pub fn client_version() -> String {
    info_line(
        "Client Version",
        &json!({
            "gitVersion": format!("v{}", env!("CARGO_PKG_VERSION")),
            "goVersion": "n/a", "compiler": "rustc", "platform": platform(),
        }),
    )
}

/// `virtctl version`: the client line, then the server's from `…/v1/version`.
///
/// # Errors
/// The server version cannot be read (the caller printed the client line first).
pub async fn server_version(ctx: &Ctx) -> Result<(), Error> {
    let server = ctx
        .get_json(format!("{SUBRESOURCES}/version"))
        .await
        .map_err(|e| {
            Error::Message(format!("Could not get server version: {}", api_message(&e)))
        })?;
    println!("{}", info_line("Server Version", &server));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_version_names_the_crate_version() {
        assert!(client_version().starts_with(&format!(
            "Client Version: version.Info{{GitVersion:\"v{}\"",
            env!("CARGO_PKG_VERSION")
        )));
    }

    #[test]
    fn stop_needs_force_and_grace_period_together() {
        let stop = |g, f| Stop {
            name: "vm".into(),
            grace_period: g,
            force: f,
            dry_run: false,
        };
        assert!(force_grace(&stop(Some(0), false)).is_err());
        assert!(force_grace(&stop(None, true)).is_err());
        assert_eq!(force_grace(&stop(Some(0), true)).unwrap(), Some(0));
        assert_eq!(force_grace(&stop(None, false)).unwrap(), None);
    }

    #[test]
    fn add_volume_body_is_a_hotpluggable_pvc_with_a_scsi_disk() {
        let a = AddVolume {
            name: "vm".into(),
            volume_name: "data".into(),
            serial: Some("s1".into()),
            disk_type: "disk".into(),
            bus: "scsi".into(),
            persist: false,
            dry_run: false,
        };
        let body = add_volume_body(&a);
        let opts: kubevirt_api::v1::AddVolumeOptions = serde_json::from_value(body).unwrap();
        assert_eq!(opts.name, "data");
        assert_eq!(opts.disk.unwrap().serial.as_deref(), Some("s1"));
        let pvc = opts.volume_source.unwrap().persistent_volume_claim.unwrap();
        assert_eq!(pvc.hotpluggable, Some(true));
    }
}
