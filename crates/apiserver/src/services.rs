//! Services as kube-apiserver serves them: cluster IPs from the service CIDR, and the
//! `kubernetes` Service in `default` that in-cluster clients reach the API server through.
//!
//! Data flow: [`ClusterIpAllocation`] is an admission hook. On a Service create it gives
//! the Service a free address of [`SERVICE_CIDR`] (or checks the one asked for), fills
//! `clusterIPs`, `ipFamilies` and `ipFamilyPolicy`, and defaults port protocols and target
//! ports; on an update it keeps the address (an empty `clusterIP` keeps the stored one, a
//! different one is refused). [`ensure_kubernetes_service`] runs once at start, after the
//! server knows its port: it creates or updates Service `default/kubernetes` (cluster IP
//! [`kubernetes_service_ip`], port 443 `https`), and the Endpoints and EndpointSlice
//! `kubernetes` naming the server's address, as kube-apiserver's endpoint reconciler does.
//! Routing a cluster IP to its endpoints is the service proxy's job (kube-proxy's role).
//!
//! # Guarantees
//! - No two Services get the same cluster IP, also when created concurrently: an address
//!   handed out is held in memory until the write is visible in the store (or for
//!   [`RESERVATION`] if the write never happens).
//! - A Service's cluster IP never changes once set.

use std::collections::{BTreeSet, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kubevirt_store::Store;
use serde_json::{Value, json};

use crate::admission::{Admission, AdmissionRequest, Operation, Phase};
use crate::cause::Cause;
use crate::handlers::common::{WriteOptions, decode_record};
use crate::handlers::{create, update};
use crate::state::ApiState;
use crate::status::ApiError;

/// The service CIDR (kube-apiserver's `--service-cluster-ip-range`, kubeadm's default).
pub const SERVICE_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 96, 0, 0), 12);

/// How long an allocated address stays held when its write does not show up in the store.
pub const RESERVATION: Duration = Duration::from_secs(60);

/// The name of the API server's own Service (in `default`) and its endpoints.
pub const KUBERNETES_SERVICE: &str = "kubernetes";

const SERVICES: &str = "/registry/core/services/";
const APISERVER_USER: &str = "system:apiserver";

/// The first address of [`SERVICE_CIDR`]: the `kubernetes` Service's cluster IP.
pub fn kubernetes_service_ip() -> Ipv4Addr {
    Ipv4Addr::from(u32::from(SERVICE_CIDR.0) + 1)
}

fn in_service_cidr(ip: Ipv4Addr) -> bool {
    let mask = u32::MAX << (32 - u32::from(SERVICE_CIDR.1));
    u32::from(ip) & mask == u32::from(SERVICE_CIDR.0)
}

/// The admission hook that allocates and keeps Services' cluster IPs.
pub struct ClusterIpAllocation {
    store: Store,
    /// Addresses handed out whose Service may not be stored yet.
    reserved: Mutex<HashMap<Ipv4Addr, Instant>>,
}

impl ClusterIpAllocation {
    /// A hook reading the Services stored in `store`.
    pub fn new(store: Store) -> Self {
        ClusterIpAllocation {
            store,
            reserved: Mutex::new(HashMap::new()),
        }
    }

    /// Every cluster IP of a stored Service.
    fn used(&self) -> BTreeSet<Ipv4Addr> {
        let listed = self.store.list(SERVICES, None, None);
        listed
            .records
            .iter()
            .filter_map(|r| decode_record(r).ok())
            .flat_map(|svc| cluster_ips(&svc))
            .collect()
    }

    /// Holds `wanted` (or, when `None`, the first free address after the `kubernetes`
    /// one), or says why it cannot.
    fn allocate(&self, wanted: Option<Ipv4Addr>) -> Result<Ipv4Addr, AllocationError> {
        let used = self.used();
        let mut reserved = self.reserved.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        reserved.retain(|ip, at| !used.contains(ip) && now.duration_since(*at) < RESERVATION);
        let taken = |ip: &Ipv4Addr| used.contains(ip) || reserved.contains_key(ip);
        let ip = match wanted {
            Some(ip) if !in_service_cidr(ip) => return Err(AllocationError::OutOfRange),
            Some(ip) if taken(&ip) => return Err(AllocationError::Allocated),
            Some(ip) => ip,
            None => {
                let first = u32::from(kubernetes_service_ip()) + 1;
                let size = 1u32 << (32 - u32::from(SERVICE_CIDR.1));
                // The broadcast address of the range is never handed out.
                let last = u32::from(SERVICE_CIDR.0) + size - 2;
                (first..=last)
                    .map(Ipv4Addr::from)
                    .find(|ip| !taken(ip))
                    .ok_or(AllocationError::Full)?
            }
        };
        reserved.insert(ip, now);
        Ok(ip)
    }
}

enum AllocationError {
    OutOfRange,
    Allocated,
    Full,
}

fn cluster_ips(svc: &Value) -> Vec<Ipv4Addr> {
    let spec = &svc["spec"];
    let mut ips: Vec<Ipv4Addr> = spec["clusterIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str()?.parse().ok())
        .collect();
    if let Some(ip) = spec["clusterIP"].as_str().and_then(|s| s.parse().ok()) {
        ips.push(ip);
    }
    ips
}

fn service_type(svc: &Value) -> &str {
    svc["spec"]["type"].as_str().unwrap_or("ClusterIP")
}

/// Kube's defaults for a Service's ports and policies (set before the address is chosen).
fn default_spec(svc: &mut Value) {
    let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    spec.entry("type").or_insert_with(|| json!("ClusterIP"));
    spec.entry("sessionAffinity")
        .or_insert_with(|| json!("None"));
    if spec["type"] != "ExternalName" {
        spec.entry("internalTrafficPolicy")
            .or_insert_with(|| json!("Cluster"));
    }
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for port in ports.iter_mut().filter_map(Value::as_object_mut) {
            port.entry("protocol").or_insert_with(|| json!("TCP"));
            if !port.contains_key("targetPort")
                && let Some(p) = port.get("port").cloned()
            {
                port.insert("targetPort".into(), p);
            }
        }
    }
}

#[async_trait::async_trait]
impl Admission for ClusterIpAllocation {
    async fn admit(
        &self,
        phase: Phase,
        request: &AdmissionRequest<'_>,
        object: &mut Value,
    ) -> Result<Vec<String>, ApiError> {
        if phase != Phase::Mutating
            || !request.resource.group.is_empty()
            || request.resource.plural != "services"
            || request.subresource.is_some()
        {
            return Ok(vec![]);
        }
        // A malformed object (a spec that is not an object) is schema validation's to refuse.
        if !object.is_object() || object.get("spec").is_some_and(|s| !s.is_object()) {
            return Ok(vec![]);
        }
        let invalid = |field: &str, message: String| {
            ApiError::invalid(
                "",
                "Service",
                request.name,
                vec![Cause::new("FieldValueInvalid", field, message)],
            )
        };
        match request.operation {
            Operation::Create => {
                default_spec(object);
                if service_type(object) == "ExternalName" {
                    return Ok(vec![]);
                }
                let spec = &mut object["spec"];
                let asked = spec["clusterIP"]
                    .as_str()
                    .or_else(|| spec["clusterIPs"][0].as_str())
                    .unwrap_or("")
                    .to_owned();
                if asked == "None" {
                    spec["clusterIP"] = json!("None");
                    spec["clusterIPs"] = json!(["None"]);
                } else {
                    let wanted = if asked.is_empty() {
                        None
                    } else {
                        Some(asked.parse::<Ipv4Addr>().map_err(|_| {
                            invalid(
                                "spec.clusterIPs[0]",
                                format!("\"{asked}\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"),
                            )
                        })?)
                    };
                    let ip = self.allocate(wanted).map_err(|e| match e {
                        AllocationError::OutOfRange => invalid(
                            "spec.clusterIPs",
                            format!(
                                "[]string{{\"{asked}\"}}: failed to allocate IP {asked}: the provided IP ({asked}) is not in the valid range. The range of valid IPs is {}/{}",
                                SERVICE_CIDR.0, SERVICE_CIDR.1
                            ),
                        ),
                        AllocationError::Allocated => invalid(
                            "spec.clusterIPs",
                            format!(
                                "[]string{{\"{asked}\"}}: failed to allocate IP {asked}: provided IP is already allocated"
                            ),
                        ),
                        AllocationError::Full => ApiError::internal(
                            "failed to allocate a serviceIP: range is full".to_owned(),
                        ),
                    })?;
                    spec["clusterIP"] = json!(ip.to_string());
                    spec["clusterIPs"] = json!([ip.to_string()]);
                }
                spec["ipFamilies"] = json!(["IPv4"]);
                spec["ipFamilyPolicy"] = json!("SingleStack");
                Ok(vec![])
            }
            Operation::Update => {
                let Some(old) = request.old_object else {
                    return Ok(vec![]);
                };
                default_spec(object);
                let old_ip = old["spec"]["clusterIP"].clone();
                if old_ip.is_null() || service_type(object) == "ExternalName" {
                    return Ok(vec![]);
                }
                let spec = &mut object["spec"];
                let new_ip = spec["clusterIP"].as_str().unwrap_or("");
                if new_ip.is_empty() {
                    spec["clusterIP"] = old_ip;
                    spec["clusterIPs"] = old["spec"]["clusterIPs"].clone();
                } else if spec["clusterIP"] != old_ip {
                    return Err(invalid(
                        "spec.clusterIPs[0]",
                        format!("Invalid value: []string{{\"{new_ip}\"}}: may not change once set"),
                    ));
                } else if spec["clusterIPs"].is_null() {
                    spec["clusterIPs"] = old["spec"]["clusterIPs"].clone();
                }
                for key in ["ipFamilies", "ipFamilyPolicy"] {
                    if spec[key].is_null() && !old["spec"][key].is_null() {
                        spec[key] = old["spec"][key].clone();
                    }
                }
                Ok(vec![])
            }
            Operation::Delete => Ok(vec![]),
        }
    }
}

/// Creates or updates Service `default/kubernetes` and its Endpoints and EndpointSlice so
/// that they name `advertise` (the API server's address), as kube-apiserver's endpoint
/// reconciler does at start.
///
/// # Errors
/// The [`ApiError`] of a write that failed.
pub async fn ensure_kubernetes_service(
    state: &ApiState,
    advertise: SocketAddr,
) -> Result<(), ApiError> {
    let ns = "default";
    let port = advertise.port();
    let ip = advertise.ip().to_string();
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": KUBERNETES_SERVICE,
            "namespace": ns,
            "labels": {"component": "apiserver", "provider": "kubernetes"},
        },
        "spec": {
            "type": "ClusterIP",
            "clusterIP": kubernetes_service_ip().to_string(),
            "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}],
            "sessionAffinity": "None",
        },
    });
    let endpoints = json!({
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {
            "name": KUBERNETES_SERVICE,
            "namespace": ns,
            "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"},
        },
        "subsets": [{
            "addresses": [{"ip": ip}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        }],
    });
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": KUBERNETES_SERVICE,
            "namespace": ns,
            "labels": {"kubernetes.io/service-name": KUBERNETES_SERVICE},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    });
    apply(state, ("", "v1", "services"), ns, service, "spec").await?;
    apply(state, ("", "v1", "endpoints"), ns, endpoints, "subsets").await?;
    apply(
        state,
        ("discovery.k8s.io", "v1", "endpointslices"),
        ns,
        slice,
        "endpoints",
    )
    .await?;
    // An EndpointSlice's ports live beside its endpoints.
    Ok(())
}

/// Creates `obj`, or rewrites the stored object's `field` (and `ports`) from it when they
/// differ.
async fn apply(
    state: &ApiState,
    (group, version, plural): (&str, &str, &str),
    ns: &str,
    obj: Value,
    field: &str,
) -> Result<(), ApiError> {
    let info = state
        .registry
        .find(group, version, plural)
        .ok_or_else(|| ApiError::internal(format!("{plural} are not served")))?;
    let opts = WriteOptions {
        user: APISERVER_USER.to_owned(),
        ..WriteOptions::default()
    };
    let name = KUBERNETES_SERVICE;
    let Some(record) = state.store.get(&info.key(Some(ns), name)) else {
        return create::create(state, &info, Some(ns), obj, &opts)
            .await
            .map(|_| ());
    };
    let mut stored = decode_record(&record)?;
    let mut changed = false;
    for key in [field, "ports"] {
        if obj.get(key).is_some() && stored[key] != obj[key] {
            if key == "spec" {
                // Keep what admission filled in; only the ports follow the server.
                changed |= stored["spec"]["ports"] != obj["spec"]["ports"];
                stored["spec"]["ports"] = obj["spec"]["ports"].clone();
            } else {
                stored[key] = obj[key].clone();
                changed = true;
            }
        }
    }
    if !changed {
        return Ok(());
    }
    update::update(state, &info, Some(ns), name, None, stored, &opts)
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubernetes_service_ip_is_the_first_of_the_range() {
        assert_eq!(kubernetes_service_ip(), Ipv4Addr::new(10, 96, 0, 1));
        assert!(in_service_cidr(Ipv4Addr::new(10, 111, 255, 254)));
        assert!(!in_service_cidr(Ipv4Addr::new(10, 112, 0, 1)));
    }

    #[test]
    fn addresses_are_handed_out_once_and_asked_ones_are_checked() {
        let alloc = ClusterIpAllocation::new(Store::in_memory());
        let a = alloc.allocate(None).ok().unwrap();
        let b = alloc.allocate(None).ok().unwrap();
        assert_ne!(a, b, "a reserved address is not handed out twice");
        assert_ne!(a, kubernetes_service_ip());
        assert!(matches!(
            alloc.allocate(Some(a)),
            Err(AllocationError::Allocated)
        ));
        assert!(matches!(
            alloc.allocate(Some(Ipv4Addr::new(192, 168, 0, 1))),
            Err(AllocationError::OutOfRange)
        ));
        let wanted = Ipv4Addr::new(10, 100, 0, 7);
        assert_eq!(alloc.allocate(Some(wanted)).ok(), Some(wanted));
    }

    #[tokio::test]
    async fn the_kubernetes_service_and_its_endpoints_follow_the_servers_address() {
        let mut state = ApiState::new(Store::in_memory());
        state
            .admission
            .push(std::sync::Arc::new(ClusterIpAllocation::new(
                state.store.clone(),
            )));
        let ns_info = state.registry.find("", "v1", "namespaces").unwrap();
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}});
        create::create(&state, &ns_info, None, ns, &WriteOptions::default())
            .await
            .unwrap();
        let get = |key: &str| state.store.get(key).map(|r| decode_record(&r).unwrap());
        ensure_kubernetes_service(&state, "127.0.0.1:6443".parse().unwrap())
            .await
            .unwrap();
        let svc = get("/registry/core/services/default/kubernetes").expect("the Service");
        assert_eq!(svc["spec"]["clusterIP"], "10.96.0.1");
        assert_eq!(svc["spec"]["clusterIPs"], json!(["10.96.0.1"]));
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], 6443);
        // A restart on another port moves the endpoints and the target port, not the address.
        ensure_kubernetes_service(&state, "127.0.0.1:7443".parse().unwrap())
            .await
            .unwrap();
        let svc = get("/registry/core/services/default/kubernetes").unwrap();
        assert_eq!(svc["spec"]["clusterIP"], "10.96.0.1");
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], 7443);
        let eps = get("/registry/core/endpoints/default/kubernetes").expect("the Endpoints");
        assert_eq!(eps["subsets"][0]["ports"][0]["port"], 7443);
        let keys: Vec<String> = state
            .store
            .list("/registry/", None, None)
            .records
            .iter()
            .map(|r| r.key.clone())
            .collect();
        let slice = keys
            .iter()
            .find(|k| k.contains("endpointslices"))
            .and_then(|k| get(k))
            .expect("the EndpointSlice");
        assert_eq!(slice["ports"][0]["port"], 7443);
        assert_eq!(slice["endpoints"][0]["addresses"], json!(["127.0.0.1"]));
    }

    #[tokio::test]
    async fn a_malformed_service_is_left_to_validation() {
        let alloc = ClusterIpAllocation::new(Store::in_memory());
        let state = ApiState::new(Store::in_memory());
        let info = state.registry.find("", "v1", "services").unwrap();
        for operation in [Operation::Create, Operation::Update] {
            let old = json!({"spec": {"clusterIP": "10.96.0.9"}});
            let request = AdmissionRequest {
                operation,
                resource: &info,
                subresource: None,
                namespace: Some("default"),
                name: "bad",
                old_object: Some(&old),
                dry_run: false,
                user: "test",
                groups: None,
            };
            let mut bad = json!({"spec": [1, 2]});
            let admitted = alloc.admit(Phase::Mutating, &request, &mut bad).await;
            assert!(admitted.is_ok(), "{operation:?}");
            assert_eq!(bad, json!({"spec": [1, 2]}), "nothing changed");
        }
    }

    #[test]
    fn ports_get_kubes_defaults() {
        let mut svc = json!({"spec": {"ports": [{"port": 80}, {"port": 53, "protocol": "UDP", "targetPort": "dns"}]}});
        default_spec(&mut svc);
        assert_eq!(svc["spec"]["type"], "ClusterIP");
        assert_eq!(svc["spec"]["ports"][0]["protocol"], "TCP");
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], 80);
        assert_eq!(svc["spec"]["ports"][1]["targetPort"], "dns");
    }
}
