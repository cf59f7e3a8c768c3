//! Server-side `Table` output (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`).
//!
//! Column definitions come from a CRD version's `additionalPrinterColumns` (evaluated with
//! [`crate::jsonpath`]) or from a small table of built-in printers; every row carries the
//! object as `PartialObjectMetadata` (or the full object with `includeObject=Object`).

use serde_json::{Value, json};

use crate::jsonpath::{JsonPath, format_cell};
use crate::registry::ResourceInfo;
use crate::request::IncludeObject;

/// Kubernetes' HumanDuration (`45s`, `3m5s`, `125m`, `2d2h`, `3y`).
pub fn human_duration(secs: i64) -> String {
    let s = secs.max(0);
    if s < 2 * 60 {
        return format!("{s}s");
    }
    let m = s / 60;
    if m < 10 {
        let rs = s % 60;
        return if rs == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{rs}s")
        };
    }
    if m < 3 * 60 {
        return format!("{m}m");
    }
    let h = s / 3600;
    if h < 8 {
        let rm = m % 60;
        return if rm == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{rm}m")
        };
    }
    if h < 48 {
        return format!("{h}h");
    }
    if h < 24 * 8 {
        let d = h / 24;
        let rh = h % 24;
        return if rh == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{rh}h")
        };
    }
    if h < 24 * 365 * 2 {
        return format!("{}d", h / 24);
    }
    if h < 24 * 365 * 8 {
        let y = h / 24 / 365;
        let rd = (h / 24) % 365;
        return if rd == 0 {
            format!("{y}y")
        } else {
            format!("{y}y{rd}d")
        };
    }
    format!("{}y", h / 24 / 365)
}

/// The age of an RFC 3339 timestamp relative to `now`, as HumanDuration; `<unknown>` if absent.
pub fn age(ts: &Value, now: jiff::Timestamp) -> Value {
    match ts.as_str().and_then(|s| s.parse::<jiff::Timestamp>().ok()) {
        Some(t) => json!(human_duration(now.as_second() - t.as_second())),
        None => json!("<unknown>"),
    }
}

fn col(name: &str, type_: &str, priority: i64) -> Value {
    let format = if name == "Name" { "name" } else { "" };
    json!({"name": name, "type": type_, "format": format, "description": "", "priority": priority})
}

/// Column definitions for a resource.
pub fn columns(info: &ResourceInfo) -> Vec<Value> {
    let name = col("Name", "string", 0);
    let age = col("Age", "date", 0);
    if let Some(crd) = &info.crd {
        if crd.printer_columns.is_empty() {
            return vec![name, age];
        }
        let mut v = vec![name];
        v.extend(crd.printer_columns.iter().map(|c| {
            json!({"name": c.name, "type": c.type_, "format": c.format, "description": c.description, "priority": c.priority})
        }));
        return v;
    }
    let s = |n: &str| col(n, "string", 0);
    let w = |n: &str| col(n, "string", 1);
    let i = |n: &str| col(n, "integer", 0);
    match (info.group.as_str(), info.plural.as_str()) {
        ("", "pods") => vec![
            name,
            s("Ready"),
            s("Status"),
            s("Restarts"),
            age,
            w("IP"),
            w("Node"),
        ],
        ("", "nodes") => vec![
            name,
            s("Status"),
            s("Roles"),
            age,
            s("Version"),
            w("Internal-IP"),
        ],
        ("", "namespaces") => vec![name, s("Status"), age],
        ("", "services") => vec![
            name,
            s("Type"),
            s("Cluster-IP"),
            s("External-IP"),
            s("Port(s)"),
            age,
        ],
        ("", "configmaps") => vec![name, i("Data"), age],
        ("", "secrets") => vec![name, s("Type"), i("Data"), age],
        ("", "persistentvolumeclaims" | "persistentvolumes")
        | ("storage.k8s.io", "storageclasses") => storage_columns(&info.plural, name, age),
        ("", "events") => vec![
            s("Last Seen"),
            s("Type"),
            s("Reason"),
            s("Object"),
            s("Message"),
            col("Name", "string", 1),
        ],
        ("apps", "deployments") => vec![name, s("Ready"), i("Up-to-date"), i("Available"), age],
        ("apps", "replicasets") => vec![name, i("Desired"), i("Current"), i("Ready"), age],
        ("apps", "daemonsets") => vec![
            name,
            i("Desired"),
            i("Current"),
            i("Ready"),
            i("Up-to-date"),
            i("Available"),
            age,
        ],
        ("coordination.k8s.io", "leases") => vec![name, s("Holder"), age],
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            vec![name, col("Created At", "date", 0)]
        }
        _ => vec![name, age],
    }
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_str().unwrap_or("")
}

fn or_none(s: &str) -> Value {
    if s.is_empty() {
        json!("<none>")
    } else {
        json!(s)
    }
}

fn pod_cells(o: &Value, now: jiff::Timestamp) -> Vec<Value> {
    let statuses = o["status"]["containerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let total = o["spec"]["containers"].as_array().map_or(0, Vec::len);
    let ready = statuses.iter().filter(|c| c["ready"] == true).count();
    let restarts: i64 = statuses
        .iter()
        .filter_map(|c| c["restartCount"].as_i64())
        .sum();
    let mut status = str_at(o, &["status", "reason"]).to_owned();
    if status.is_empty() {
        status = str_at(o, &["status", "phase"]).to_owned();
    }
    for c in &statuses {
        let waiting = str_at(c, &["state", "waiting", "reason"]);
        let terminated = str_at(c, &["state", "terminated", "reason"]);
        if !waiting.is_empty() {
            status = waiting.to_owned();
        } else if !terminated.is_empty() {
            status = terminated.to_owned();
        }
    }
    if o["metadata"]["deletionTimestamp"].is_string() {
        status = "Terminating".into();
    }
    vec![
        json!(format!("{ready}/{total}")),
        json!(status),
        json!(restarts.to_string()),
        age(&o["metadata"]["creationTimestamp"], now),
        or_none(str_at(o, &["status", "podIP"])),
        or_none(str_at(o, &["spec", "nodeName"])),
    ]
}

fn node_cells(o: &Value, now: jiff::Timestamp) -> Vec<Value> {
    let conditions = o["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ready = conditions
        .iter()
        .find(|c| c["type"] == "Ready")
        .map(|c| c["status"] == "True");
    let mut status = match ready {
        Some(true) => "Ready".to_owned(),
        Some(false) => "NotReady".to_owned(),
        None => "Unknown".to_owned(),
    };
    if o["spec"]["unschedulable"] == true {
        status.push_str(",SchedulingDisabled");
    }
    let roles: Vec<&str> = o["metadata"]["labels"]
        .as_object()
        .map(|m| {
            m.keys()
                .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                .collect()
        })
        .unwrap_or_default();
    let ip = o["status"]["addresses"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["type"] == "InternalIP"))
        .map(|x| str_at(x, &["address"]).to_owned())
        .unwrap_or_default();
    vec![
        json!(status),
        or_none(&roles.join(",")),
        age(&o["metadata"]["creationTimestamp"], now),
        json!(str_at(o, &["status", "nodeInfo", "kubeletVersion"])),
        or_none(&ip),
    ]
}

fn service_cells(o: &Value, now: jiff::Timestamp) -> Vec<Value> {
    let ports: Vec<String> = o["spec"]["ports"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    let proto = p["protocol"].as_str().unwrap_or("TCP");
                    match p["nodePort"].as_i64() {
                        Some(np) => format!("{}:{np}/{proto}", p["port"]),
                        None => format!("{}/{proto}", p["port"]),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    let type_ = o["spec"]["type"].as_str().unwrap_or("ClusterIP");
    vec![
        json!(type_),
        or_none(str_at(o, &["spec", "clusterIP"])),
        or_none(""),
        or_none(&ports.join(",")),
        age(&o["metadata"]["creationTimestamp"], now),
    ]
}

fn int(o: &Value, path: &[&str]) -> i64 {
    let mut cur = o;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_i64().unwrap_or(0)
}

fn event_cells(o: &Value, now: jiff::Timestamp) -> Vec<Value> {
    let created = &o["metadata"]["creationTimestamp"];

    let last = if o["lastTimestamp"].is_string() {
        &o["lastTimestamp"]
    } else if o["eventTime"].is_string() {
        &o["eventTime"]
    } else {
        created
    };
    let obj = format!(
        "{}/{}",
        str_at(o, &["involvedObject", "kind"]).to_ascii_lowercase(),
        str_at(o, &["involvedObject", "name"])
    );
    vec![
        age(last, now),
        json!(str_at(o, &["type"])),
        json!(str_at(o, &["reason"])),
        json!(obj),
        json!(str_at(o, &["message"])),
        json!(o["metadata"]["name"].as_str().unwrap_or("")),
    ]
}

fn apps_cells(plural: &str, o: &Value, now: jiff::Timestamp) -> Vec<Value> {
    let created = &o["metadata"]["creationTimestamp"];
    match plural {
        "deployments" => vec![
            json!(format!(
                "{}/{}",
                int(o, &["status", "readyReplicas"]),
                o["spec"]["replicas"].as_i64().unwrap_or(1)
            )),
            json!(int(o, &["status", "updatedReplicas"])),
            json!(int(o, &["status", "availableReplicas"])),
            age(created, now),
        ],
        "replicasets" => vec![
            json!(o["spec"]["replicas"].as_i64().unwrap_or(1)),
            json!(int(o, &["status", "replicas"])),
            json!(int(o, &["status", "readyReplicas"])),
            age(created, now),
        ],
        "daemonsets" => vec![
            json!(int(o, &["status", "desiredNumberScheduled"])),
            json!(int(o, &["status", "currentNumberScheduled"])),
            json!(int(o, &["status", "numberReady"])),
            json!(int(o, &["status", "updatedNumberScheduled"])),
            json!(int(o, &["status", "numberAvailable"])),
            age(created, now),
        ],
        _ => vec![age(created, now)],
    }
}

/// The columns of claims, volumes and classes, as kube's printers define them.
fn storage_columns(plural: &str, name: Value, age: Value) -> Vec<Value> {
    let s = |n: &str| col(n, "string", 0);
    let w = |n: &str| col(n, "string", 1);
    match plural {
        "persistentvolumeclaims" => vec![
            name,
            s("Status"),
            s("Volume"),
            s("Capacity"),
            s("Access Modes"),
            s("StorageClass"),
            s("VolumeAttributesClass"),
            age,
            w("VolumeMode"),
        ],
        "persistentvolumes" => vec![
            name,
            s("Capacity"),
            s("Access Modes"),
            s("Reclaim Policy"),
            s("Status"),
            s("Claim"),
            s("StorageClass"),
            s("VolumeAttributesClass"),
            s("Reason"),
            age,
            w("VolumeMode"),
        ],
        _ => vec![
            name,
            s("Provisioner"),
            s("ReclaimPolicy"),
            s("VolumeBindingMode"),
            s("AllowVolumeExpansion"),
            age,
        ],
    }
}

/// `RWO,ROX,RWX,RWOP` as kubectl abbreviates access modes.
fn access_modes(modes: &Value) -> Value {
    let short: Vec<&str> = modes
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|m| match m {
            "ReadWriteOnce" => "RWO",
            "ReadOnlyMany" => "ROX",
            "ReadWriteMany" => "RWX",
            "ReadWriteOncePod" => "RWOP",
            other => other,
        })
        .collect();
    json!(short.join(","))
}

/// The cells after the name of claims, volumes and classes; a default class's name reads
/// `<name> (default)`, as kubectl prints it.
fn storage_cells(plural: &str, o: &Value, now: jiff::Timestamp, row: &mut [Value]) -> Vec<Value> {
    let created = &o["metadata"]["creationTimestamp"];
    let mode = |v: &Value| json!(v.as_str().unwrap_or("Filesystem"));
    match plural {
        "persistentvolumeclaims" => vec![
            json!(str_at(o, &["status", "phase"])),
            json!(str_at(o, &["spec", "volumeName"])),
            json!(str_at(o, &["status", "capacity", "storage"])),
            access_modes(&o["status"]["accessModes"]),
            or_none(str_at(o, &["spec", "storageClassName"])),
            or_none(str_at(o, &["spec", "volumeAttributesClassName"])),
            age(created, now),
            mode(&o["spec"]["volumeMode"]),
        ],
        "persistentvolumes" => {
            let claim = match (
                str_at(o, &["spec", "claimRef", "namespace"]),
                str_at(o, &["spec", "claimRef", "name"]),
            ) {
                (_, "") => String::new(),
                (ns, name) => format!("{ns}/{name}"),
            };
            vec![
                json!(str_at(o, &["spec", "capacity", "storage"])),
                access_modes(&o["spec"]["accessModes"]),
                json!(str_at(o, &["spec", "persistentVolumeReclaimPolicy"])),
                json!(str_at(o, &["status", "phase"])),
                json!(claim),
                json!(str_at(o, &["spec", "storageClassName"])),
                or_none(str_at(o, &["spec", "volumeAttributesClassName"])),
                json!(str_at(o, &["status", "reason"])),
                age(created, now),
                mode(&o["spec"]["volumeMode"]),
            ]
        }
        _ => {
            let annotations = &o["metadata"]["annotations"];
            let default = [
                "storageclass.kubernetes.io/is-default-class",
                "storageclass.beta.kubernetes.io/is-default-class",
            ]
            .iter()
            .any(|a| annotations[*a].as_str() == Some("true"));
            if default && let Some(name) = row.first_mut() {
                *name = json!(format!("{} (default)", name.as_str().unwrap_or_default()));
            }
            let policy = o["reclaimPolicy"].as_str().unwrap_or("Delete");
            let binding = o["volumeBindingMode"].as_str().unwrap_or("Immediate");
            vec![
                json!(str_at(o, &["provisioner"])),
                json!(policy),
                json!(binding),
                json!(o["allowVolumeExpansion"].as_bool().unwrap_or(false)),
                age(created, now),
            ]
        }
    }
}

/// The cells of one row, in column order.
pub fn cells(info: &ResourceInfo, o: &Value, now: jiff::Timestamp) -> Vec<Value> {
    let name = json!(o["metadata"]["name"].as_str().unwrap_or(""));
    let created = &o["metadata"]["creationTimestamp"];
    if let Some(crd) = &info.crd {
        if crd.printer_columns.is_empty() {
            return vec![name, age(created, now)];
        }
        let mut row = vec![name];
        for c in &crd.printer_columns {
            let cell = match JsonPath::parse(&c.json_path) {
                Ok(p) => {
                    let selected = p.select(o);
                    format_cell(&c.type_, &selected, now)
                }
                Err(_) => Value::Null,
            };
            row.push(cell);
        }
        return row;
    }
    let mut row = vec![name.clone()];
    let rest = match (info.group.as_str(), info.plural.as_str()) {
        ("", "pods") => pod_cells(o, now),
        ("", "nodes") => node_cells(o, now),
        ("", "namespaces") => vec![json!(str_at(o, &["status", "phase"])), age(created, now)],
        ("", "services") => service_cells(o, now),
        ("", "configmaps") => {
            let n = o["data"].as_object().map_or(0, |m| m.len())
                + o["binaryData"].as_object().map_or(0, |m| m.len());
            vec![json!(n), age(created, now)]
        }
        ("", "secrets") => {
            let n = o["data"].as_object().map_or(0, |m| m.len());
            let t = o["type"].as_str().unwrap_or("Opaque");
            vec![json!(t), json!(n), age(created, now)]
        }
        ("", "persistentvolumeclaims" | "persistentvolumes")
        | ("storage.k8s.io", "storageclasses") => storage_cells(&info.plural, o, now, &mut row),
        ("", "events") => return event_cells(o, now),
        ("apps", plural) => apps_cells(plural, o, now),
        ("coordination.k8s.io", "leases") => {
            vec![
                json!(str_at(o, &["spec", "holderIdentity"])),
                age(created, now),
            ]
        }
        ("apiextensions.k8s.io", "customresourcedefinitions") => vec![created.clone()],
        _ => vec![age(created, now)],
    };
    row.extend(rest);
    row
}

/// The `PartialObjectMetadata` of an object.
pub fn partial_metadata(o: &Value) -> Value {
    let mut meta = o["metadata"].clone();
    if let Some(m) = meta.as_object_mut() {
        m.remove("managedFields");
    }
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta})
}

/// A `Table` of `objects`.
pub fn table(
    info: &ResourceInfo,
    objects: &[Value],
    list_meta: &Value,
    include: IncludeObject,
    now: jiff::Timestamp,
) -> Value {
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let object = match include {
                IncludeObject::Metadata => partial_metadata(o),
                IncludeObject::Object => o.clone(),
                IncludeObject::None => Value::Null,
            };
            let mut row = json!({"cells": cells(info, o, now)});
            if !object.is_null() {
                row["object"] = object;
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta.clone(),
        "columnDefinitions": columns(info),
        "rows": rows,
    })
}

/// Whether an `Accept` header asks for a Table.
pub fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    #[test]
    fn human_durations_match_kubernetes() {
        assert_eq!(human_duration(45), "45s");
        assert_eq!(human_duration(185), "3m5s");
        assert_eq!(human_duration(125 * 60), "125m");
        assert_eq!(human_duration(5 * 3600 + 60 * 7), "5h7m");
        assert_eq!(human_duration(50 * 3600), "2d2h");
        assert_eq!(human_duration(3 * 365 * 86400), "3y");
    }

    #[test]
    fn pod_rows_show_readiness_status_and_restarts() {
        let r = Registry::new();
        let pods = r.find("", "v1", "pods").unwrap();
        let pod = json!({
            "metadata": {"name": "web", "creationTimestamp": "2020-01-01T00:00:00Z", "labels": {"a": "b"}},
            "spec": {"containers": [{"name": "c"}, {"name": "d"}], "nodeName": "n1"},
            "status": {"phase": "Running", "containerStatuses": [{"ready": true, "restartCount": 2}, {"ready": false, "restartCount": 1}]}
        });
        let now: jiff::Timestamp = "2020-01-01T00:00:45Z".parse().unwrap();
        let t = table(
            &pods,
            &[pod],
            &json!({"resourceVersion": "7"}),
            IncludeObject::Metadata,
            now,
        );
        assert_eq!(t["columnDefinitions"][0]["format"], "name");
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[0], "web");
        assert_eq!(cells[1], "1/2");
        assert_eq!(cells[2], "Running");
        assert_eq!(cells[3], "3");
        assert_eq!(cells[4], "45s");
        assert_eq!(cells[6], "n1");
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(t["rows"][0]["object"]["metadata"]["labels"]["a"], "b");
    }

    #[test]
    fn table_accept_header_is_recognised() {
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
        ));
        assert!(!wants_table("application/json"));
    }

    #[test]
    fn storage_rows_read_as_kubectl_prints_them() {
        let r = Registry::new();
        let now: jiff::Timestamp = "2020-01-01T00:00:45Z".parse().unwrap();
        let created = "2020-01-01T00:00:00Z";
        let row = |group: &str, plural: &str, o: Value| {
            let info = r.find(group, "v1", plural).unwrap();
            cells(&info, &o, now)
        };
        let class = row(
            "storage.k8s.io",
            "storageclasses",
            json!({"metadata": {"name": "local", "creationTimestamp": created, "annotations": {
                "storageclass.kubernetes.io/is-default-class": "true"}},
                "provisioner": "kubevirt-rs.io/local", "volumeBindingMode": "WaitForFirstConsumer"}),
        );
        assert_eq!(
            class,
            [
                json!("local (default)"),
                json!("kubevirt-rs.io/local"),
                json!("Delete"),
                json!("WaitForFirstConsumer"),
                json!(false),
                json!("45s")
            ]
        );
        let volume = row(
            "",
            "persistentvolumes",
            json!({"metadata": {"name": "pvc-1", "creationTimestamp": created},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
                    "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "local",
                    "claimRef": {"namespace": "default", "name": "data"}},
                "status": {"phase": "Bound"}}),
        );
        assert_eq!(
            volume,
            [
                json!("pvc-1"),
                json!("1Gi"),
                json!("RWO,ROX"),
                json!("Delete"),
                json!("Bound"),
                json!("default/data"),
                json!("local"),
                json!("<none>"),
                json!(""),
                json!("45s"),
                json!("Filesystem")
            ]
        );
        let claim = row(
            "",
            "persistentvolumeclaims",
            json!({"metadata": {"name": "data", "creationTimestamp": created},
                "spec": {"volumeName": "pvc-1", "storageClassName": "local"},
                "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]}}),
        );
        assert_eq!(
            claim,
            [
                json!("data"),
                json!("Bound"),
                json!("pvc-1"),
                json!("1Gi"),
                json!("RWO"),
                json!("local"),
                json!("<none>"),
                json!("45s"),
                json!("Filesystem")
            ]
        );
    }
}
