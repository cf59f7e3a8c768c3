//! Discovery (`APIGroup`, `APIResourceList`), `version` and `healthz` of
//! `subresources.kubevirt.io`, and the `APIService` object that registers the group with
//! the API server's aggregator.

use axum::Json;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

/// The API group served here.
pub const GROUP: &str = "subresources.kubevirt.io";
/// The versions served (upstream serves both; virtctl uses `v1`).
pub const VERSIONS: &[&str] = &["v1", "v1alpha3"];

/// `(resource/subresource, kind, verbs)` of every endpoint served.
const RESOURCES: &[(&str, &str, &[&str])] = &[
    ("virtualmachines/start", "VirtualMachine", &["update"]),
    ("virtualmachines/stop", "VirtualMachine", &["update"]),
    ("virtualmachines/restart", "VirtualMachine", &["update"]),
    ("virtualmachines/migrate", "VirtualMachine", &["update"]),
    ("virtualmachines/addvolume", "VirtualMachine", &["update"]),
    (
        "virtualmachines/removevolume",
        "VirtualMachine",
        &["update"],
    ),
    (
        "virtualmachineinstances/pause",
        "VirtualMachineInstance",
        &["update"],
    ),
    (
        "virtualmachineinstances/unpause",
        "VirtualMachineInstance",
        &["update"],
    ),
    (
        "virtualmachineinstances/softreboot",
        "VirtualMachineInstance",
        &["update"],
    ),
    (
        "virtualmachineinstances/freeze",
        "VirtualMachineInstance",
        &["update"],
    ),
    (
        "virtualmachineinstances/unfreeze",
        "VirtualMachineInstance",
        &["update"],
    ),
    (
        "virtualmachineinstances/addvolume",
        "VirtualMachineInstance",
        &["update"],
    ),
    (
        "virtualmachineinstances/removevolume",
        "VirtualMachineInstance",
        &["update"],
    ),
    (
        "virtualmachineinstances/console",
        "VirtualMachineInstance",
        &["get"],
    ),
    (
        "virtualmachineinstances/vnc",
        "VirtualMachineInstance",
        &["get"],
    ),
    (
        "virtualmachineinstances/portforward",
        "VirtualMachineInstance",
        &["get"],
    ),
    ("virtualmachines/portforward", "VirtualMachine", &["get"]),
    (
        "virtualmachineinstances/guestosinfo",
        "VirtualMachineInstance",
        &["get"],
    ),
    (
        "virtualmachineinstances/userlist",
        "VirtualMachineInstance",
        &["get"],
    ),
    (
        "virtualmachineinstances/filesystemlist",
        "VirtualMachineInstance",
        &["get"],
    ),
];

/// The `APIResourceList` of `version`.
pub fn resource_list(version: &str) -> Value {
    let resources: Vec<Value> = RESOURCES
        .iter()
        .map(|(name, kind, verbs)| {
            json!({"name": name, "singularName": "", "namespaced": true, "kind": kind, "verbs": verbs})
        })
        .collect();
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": format!("{GROUP}/{version}"),
        "resources": resources,
    })
}

/// The `APIGroup` object.
pub fn api_group() -> Value {
    let versions: Vec<Value> = VERSIONS
        .iter()
        .map(|v| json!({"groupVersion": format!("{GROUP}/{v}"), "version": v}))
        .collect();
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": GROUP,
        "versions": versions,
        "preferredVersion": versions[0],
    })
}

fn platform() -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    format!("{}/{arch}", std::env::consts::OS)
}

/// The server's version info (upstream's `version.Info` field names).
pub fn version_info() -> Value {
    json!({
        "gitVersion": format!("v{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "",
        "buildDate": "",
        "goVersion": "n/a",
        "compiler": "rustc",
        "platform": platform(),
    })
}

/// The `APIService` registering `version` of the group; `url` (embedded mode) goes into
/// the `kubevirt-rs.io/url` annotation, and the `spec.service` points at upstream's
/// `kubevirt/virt-api` Service for a real cluster.
pub fn api_service_for(version: &str, ca_bundle_pem: &[u8], url: Option<&str>) -> Value {
    let mut svc = json!({
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {
            "name": format!("{version}.{GROUP}"),
            "labels": {"kubevirt.io": "virt-api"},
        },
        "spec": {
            "group": GROUP,
            "version": version,
            "groupPriorityMinimum": 1000,
            "versionPriority": 15,
            "caBundle": STANDARD.encode(ca_bundle_pem),
            "service": {"namespace": "kubevirt", "name": "virt-api", "port": 443},
        },
    });
    if let Some(url) = url {
        svc["metadata"]["annotations"] = json!({"kubevirt-rs.io/url": url});
    }
    svc
}

/// `GET /apis/subresources.kubevirt.io/{version}`.
pub(super) async fn resources_handler(
    axum::extract::Path(version): axum::extract::Path<String>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if VERSIONS.contains(&version.as_str()) {
        Json(resource_list(&version)).into_response()
    } else {
        super::error::SubError {
            code: 404,
            reason: "NotFound",
            message: "the server could not find the requested resource".into(),
            details: None,
            plain: false,
        }
        .into_response()
    }
}

/// `GET /apis/subresources.kubevirt.io`.
pub(super) async fn group_handler() -> Json<Value> {
    Json(api_group())
}

/// `GET …/version`.
pub(super) async fn version_handler() -> Json<Value> {
    Json(version_info())
}

/// `GET …/healthz`.
pub(super) async fn healthz_handler() -> Json<Value> {
    Json(json!({"apiserver": "ok", "restcontrollers": "ok"}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_list_names_the_vm_and_vmi_subresources() {
        let list = resource_list("v1");
        assert_eq!(list["groupVersion"], "subresources.kubevirt.io/v1");
        let names: Vec<&str> = list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        for want in [
            "virtualmachines/start",
            "virtualmachines/stop",
            "virtualmachineinstances/console",
        ] {
            assert!(names.contains(&want), "{want}");
        }
    }

    #[test]
    fn api_service_carries_the_ca_bundle_and_the_backend_url() {
        let s = api_service_for("v1", b"PEM", Some("https://127.0.0.1:1"));
        assert_eq!(s["metadata"]["name"], "v1.subresources.kubevirt.io");
        assert_eq!(s["spec"]["caBundle"], STANDARD.encode(b"PEM"));
        assert_eq!(
            s["metadata"]["annotations"]["kubevirt-rs.io/url"],
            "https://127.0.0.1:1"
        );
        assert!(api_service_for("v1", b"", None)["metadata"]["annotations"].is_null());
    }
}
