//! The guest-agent routes of the REST server: `guestosinfo`, `userlist` and `filesystemlist`
//! (GET), answered with upstream's types from what the launcher's agent link reports
//! ([`Command::GuestAgentInfo`]), and `softreboot` (PUT, [`Command::SoftReboot`]).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kubevirt_api::v1::{
    GuestAgentCommandInfo, VirtualMachineInstanceFileSystem, VirtualMachineInstanceFileSystemDisk,
    VirtualMachineInstanceFileSystemInfo, VirtualMachineInstanceFileSystemList,
    VirtualMachineInstanceGuestAgentInfo, VirtualMachineInstanceGuestOsInfo,
    VirtualMachineInstanceGuestOsUser, VirtualMachineInstanceGuestOsUserList,
};
use virt_launcher::protocol::{Command, GuestAgentInfo, GuestFilesystem, GuestUser};

use super::{Refusal, RestState, pod_launcher};

/// Sends `command` to the launcher of the VMI and returns its ack's value.
pub(super) async fn ask_launcher(
    state: &RestState,
    namespace: &str,
    name: &str,
    command: Command,
) -> Result<serde_json::Value, Refusal> {
    let (_, mut client) = pod_launcher(state, namespace, name).await?;
    match client.request(command).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(message)) => Err(Refusal::internal(message)),
        Err(e) => Err(Refusal::internal(format!("talking to the launcher: {e}"))),
    }
}

/// `GET …/{guestosinfo|userlist|filesystemlist}`.
pub(super) async fn query(
    State(state): State<RestState>,
    Path((namespace, name, query)): Path<(String, String, String)>,
) -> Response {
    if !matches!(
        query.as_str(),
        "guestosinfo" | "userlist" | "filesystemlist"
    ) {
        return (StatusCode::NOT_FOUND, format!("unknown query {query}")).into_response();
    }
    let value = match ask_launcher(&state, &namespace, &name, Command::GuestAgentInfo).await {
        Ok(value) => value,
        Err(refusal) => return refusal.into_response(),
    };
    let info: GuestAgentInfo = match serde_json::from_value(value) {
        Ok(info) => info,
        Err(e) => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the launcher's guest agent answer: {e}"),
            )
                .into_response();
        }
    };
    let body = match query.as_str() {
        "guestosinfo" => serde_json::to_value(guest_os_info(info)),
        "userlist" => serde_json::to_value(VirtualMachineInstanceGuestOsUserList {
            items: info.users.into_iter().map(user).collect(),
        }),
        _ => serde_json::to_value(VirtualMachineInstanceFileSystemList {
            items: info.filesystems.into_iter().map(filesystem).collect(),
        }),
    };
    match body {
        Ok(body) => axum::Json(body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Upstream's `VirtualMachineInstanceGuestAgentInfo` from the launcher's answer.
fn guest_os_info(info: GuestAgentInfo) -> VirtualMachineInstanceGuestAgentInfo {
    let agent = info.agent;
    VirtualMachineInstanceGuestAgentInfo {
        guest_agent_version: agent.version,
        supported_commands: agent
            .supported_commands
            .into_iter()
            .map(|c| GuestAgentCommandInfo {
                name: c.name,
                enabled: Some(c.enabled),
            })
            .collect(),
        hostname: agent.hostname,
        // The protocol's `GuestOs` has upstream's field names.
        os: agent
            .os
            .and_then(|os| serde_json::to_value(os).ok())
            .and_then(|os| serde_json::from_value::<VirtualMachineInstanceGuestOsInfo>(os).ok()),
        timezone: agent.timezone,
        user_list: info.users.into_iter().map(user).collect(),
        fs_info: Some(VirtualMachineInstanceFileSystemInfo {
            disks: info.filesystems.into_iter().map(filesystem).collect(),
        }),
        fs_freeze_status: agent.fs_freeze_status,
    }
}

fn user(user: GuestUser) -> VirtualMachineInstanceGuestOsUser {
    VirtualMachineInstanceGuestOsUser {
        user_name: user.name,
        domain: user.domain,
        login_time: user.login_time,
    }
}

fn filesystem(fs: GuestFilesystem) -> VirtualMachineInstanceFileSystem {
    let bytes = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
    VirtualMachineInstanceFileSystem {
        disk_name: fs.disk_name,
        mount_point: fs.mount_point,
        file_system_type: fs.file_system_type,
        used_bytes: bytes(fs.used_bytes),
        total_bytes: bytes(fs.total_bytes),
        disk: fs
            .disks
            .into_iter()
            .map(|d| VirtualMachineInstanceFileSystemDisk {
                serial: d.serial,
                bus_type: d.bus_type,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_launchers_answer_becomes_upstreams_guest_agent_info() {
        let info: GuestAgentInfo = serde_json::from_value(json!({
            "connected": true,
            "version": "7.2.0",
            "supportedCommands": [{"name": "guest-ping", "enabled": true}],
            "hostname": "testguest",
            "os": {"prettyName": "kubevirt-rs test guest", "id": "kubevirt-rs-test-guest"},
            "timezone": "UTC, 0",
            "users": [{"name": "root", "loginTime": 1.5e9}],
            "filesystems": [{"diskName": "vda", "mountPoint": "/data", "fileSystemType": "ext4",
                "usedBytes": 1, "totalBytes": 2, "disks": [{"busType": "virtio"}]}],
        }))
        .expect("launcher answer");
        let shown = serde_json::to_value(guest_os_info(info)).expect("json");
        assert_eq!(
            shown,
            json!({
                "guestAgentVersion": "7.2.0",
                "supportedCommands": [{"name": "guest-ping", "enabled": true}],
                "hostname": "testguest",
                "os": {"prettyName": "kubevirt-rs test guest", "id": "kubevirt-rs-test-guest"},
                "timezone": "UTC, 0",
                "userList": [{"userName": "root", "loginTime": 1.5e9}],
                "fsInfo": {"disks": [{"diskName": "vda", "mountPoint": "/data",
                    "fileSystemType": "ext4", "usedBytes": 1, "totalBytes": 2,
                    "disk": [{"busType": "virtio"}]}]},
            })
        );
    }
}
