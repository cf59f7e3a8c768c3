//! A container's environment, as kubelet builds it.
//!
//! Order: `envFrom` sources (configMaps and secrets, each key with the source's `prefix`;
//! keys that are no valid variable names are skipped), then `env` (a plain `value`, or
//! `valueFrom` a downward-API `fieldRef` or `resourceFieldRef`, or a `configMapKeyRef` or
//! `secretKeyRef`), later entries overriding earlier ones; then the service variables of the
//! API server (`KUBERNETES_SERVICE_HOST`, `KUBERNETES_SERVICE_PORT`, `KUBERNETES_PORT…`), for
//! names the container does not set itself, so in-cluster clients find the API server.
//! A plain `value` has its `$(NAME)` references expanded ([`super::super::expansion`]) against
//! the variables defined before it (`envFrom`, earlier `env` entries of any kind) and the
//! service variables, as kubelet does; values from sources are not expanded.
//!
//! A missing non-optional source or key fails the container's start with kubelet's
//! `CreateContainerConfigError` and message (`configmap "x" not found`,
//! `couldn't find key k in ConfigMap ns/x`); the runner tries again on its next pass.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::projection::{self, NodeResources, SourceKind};

/// Why a container's environment cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// A configMap or secret the environment needs does not exist.
    #[error("{kind} \"{name}\" not found")]
    NotFound { kind: &'static str, name: String },
    /// A key the environment needs is missing from its configMap or secret.
    #[error("couldn't find key {key} in {kind} {namespace}/{name}")]
    MissingKey {
        kind: &'static str,
        namespace: String,
        name: String,
        key: String,
    },
    /// Reading a configMap or secret failed.
    #[error("couldn't get {kind} {namespace}/{name}")]
    Get {
        kind: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// A `resourceFieldRef` cannot be evaluated.
    #[error(transparent)]
    Resource(#[from] projection::ProjectionError),
}

/// The environment variables kubelet gives every container for the `kubernetes` Service
/// at `host:port`.
pub fn service_env(host: &str, port: u16) -> Vec<(String, String)> {
    let addr = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let url = format!("tcp://{addr}");
    let prefix = format!("KUBERNETES_PORT_{port}_TCP");
    vec![
        ("KUBERNETES_SERVICE_HOST".into(), host.to_owned()),
        ("KUBERNETES_SERVICE_PORT".into(), port.to_string()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".into(), port.to_string()),
        ("KUBERNETES_PORT".into(), url.clone()),
        (prefix.clone(), url),
        (format!("{prefix}_PROTO"), "tcp".into()),
        (format!("{prefix}_PORT"), port.to_string()),
        (format!("{prefix}_ADDR"), host.to_owned()),
    ]
}

/// Whether `name` is a valid environment variable name as the API server checks it
/// (`[-._a-zA-Z][-._a-zA-Z0-9]*`).
fn valid_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || "-._".contains(c))
        && chars.all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
}

fn kind_title(kind: SourceKind) -> &'static str {
    match kind {
        SourceKind::ConfigMap => "ConfigMap",
        SourceKind::Secret => "Secret",
    }
}

fn kind_lower(kind: SourceKind) -> &'static str {
    match kind {
        SourceKind::ConfigMap => "configmap",
        SourceKind::Secret => "secret",
    }
}

/// The keys of a configMap or secret, `None` when it does not exist.
type SourceData = Option<BTreeMap<String, Vec<u8>>>;

/// Fetches sources once per name for one container.
struct Sources<'a> {
    client: &'a kube::Client,
    namespace: &'a str,
    /// By (is a secret, name).
    seen: BTreeMap<(bool, String), SourceData>,
}

impl Sources<'_> {
    async fn get(
        &mut self,
        kind: SourceKind,
        name: &str,
    ) -> Result<Option<&BTreeMap<String, Vec<u8>>>, EnvError> {
        let key = (kind == SourceKind::Secret, name.to_owned());
        if !self.seen.contains_key(&key) {
            let data = super::fetch_data(self.client, kind, self.namespace, name)
                .await
                .map_err(|source| EnvError::Get {
                    kind: kind_lower(kind),
                    namespace: self.namespace.to_owned(),
                    name: name.to_owned(),
                    source,
                })?;
            self.seen.insert(key.clone(), data);
        }
        Ok(self.seen.get(&key).and_then(Option::as_ref))
    }

    /// A required or optional key of a source: `None` when optional and missing.
    async fn key(
        &mut self,
        kind: SourceKind,
        name: &str,
        key: &str,
        optional: bool,
    ) -> Result<Option<String>, EnvError> {
        let namespace = self.namespace.to_owned();
        let Some(data) = self.get(kind, name).await? else {
            return if optional {
                Ok(None)
            } else {
                Err(EnvError::NotFound {
                    kind: kind_lower(kind),
                    name: name.to_owned(),
                })
            };
        };
        match data.get(key) {
            Some(v) => Ok(Some(String::from_utf8_lossy(v).into_owned())),
            None if optional => Ok(None),
            None => Err(EnvError::MissingKey {
                kind: kind_title(kind),
                namespace,
                name: name.to_owned(),
                key: key.to_owned(),
            }),
        }
    }
}

/// What a container's environment is built from besides the pod.
pub struct EnvContext<'a> {
    pub client: &'a kube::Client,
    /// `status.hostIP`.
    pub host_ip: &'a str,
    /// `status.podIP`: the pod's own address, or the node's for pods in its network.
    pub pod_ip: &'a str,
    pub node: NodeResources,
    /// Where pods reach the API server (the `kubernetes` Service).
    pub kubernetes_service: Option<(&'a str, u16)>,
}

/// Sets `name` to `value`, replacing an earlier value in place.
fn set(env: &mut Vec<(String, String)>, name: String, value: String) {
    match env.iter_mut().find(|(k, _)| *k == name) {
        Some(entry) => entry.1 = value,
        None => env.push((name, value)),
    }
}

/// The environment of `container` of `pod`, in kubelet's order (see the module docs).
///
/// # Errors
/// [`EnvError`] for a missing non-optional source or key, or a source that cannot be read.
pub async fn container_env(
    ctx: &EnvContext<'_>,
    pod: &Pod,
    container: &Container,
) -> Result<Vec<(String, String)>, EnvError> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let mut sources = Sources {
        client: ctx.client,
        namespace,
        seen: BTreeMap::new(),
    };
    let service = ctx
        .kubernetes_service
        .map(|(host, port)| service_env(host, port))
        .unwrap_or_default();
    let mut env = Vec::new();
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or_default();
        let (kind, name, optional) = match (&from.config_map_ref, &from.secret_ref) {
            (Some(cm), _) => (SourceKind::ConfigMap, cm.name.clone(), cm.optional),
            (None, Some(s)) => (SourceKind::Secret, s.name.clone(), s.optional),
            (None, None) => continue,
        };
        match sources.get(kind, &name).await? {
            Some(data) => {
                for (key, value) in data {
                    let var = format!("{prefix}{key}");
                    if valid_env_name(&var) {
                        set(&mut env, var, String::from_utf8_lossy(value).into_owned());
                    }
                }
            }
            None if optional.unwrap_or(false) => {}
            None => {
                return Err(EnvError::NotFound {
                    kind: kind_lower(kind),
                    name,
                });
            }
        }
    }
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            // kubelet expands a plain value against what is defined so far, then the service
            // variables; values from sources are taken as they are.
            (Some(v), _) if !v.is_empty() => Some(super::super::expansion::expand(v, |name| {
                env.iter()
                    .chain(service.iter())
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.as_str())
            })),
            (Some(_), _) => Some(String::new()),
            (None, Some(from)) => {
                if let Some(field) = &from.field_ref {
                    super::field_value(pod, &field.field_path, ctx.host_ip, ctx.pod_ip)
                } else if let Some(resource) = &from.resource_field_ref {
                    Some(projection::resource_value(
                        pod,
                        Some(&container.name),
                        resource,
                        ctx.node,
                    )?)
                } else if let Some(r) = &from.config_map_key_ref {
                    let optional = r.optional.unwrap_or(false);
                    sources
                        .key(SourceKind::ConfigMap, &r.name, &r.key, optional)
                        .await?
                } else if let Some(r) = &from.secret_key_ref {
                    let optional = r.optional.unwrap_or(false);
                    sources
                        .key(SourceKind::Secret, &r.name, &r.key, optional)
                        .await?
                } else {
                    None
                }
            }
            (None, None) => Some(String::new()),
        };
        if let Some(value) = value {
            set(&mut env, var.name.clone(), value);
        }
    }
    for (name, value) in service {
        if !env.iter().any(|(k, _)| *k == name) {
            env.push((name, value));
        }
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_variables_name_the_api_server_as_kubelet_does() {
        let env: BTreeMap<_, _> = service_env("10.0.0.1", 6443).into_iter().collect();
        assert_eq!(env["KUBERNETES_SERVICE_HOST"], "10.0.0.1");
        assert_eq!(env["KUBERNETES_SERVICE_PORT"], "6443");
        assert_eq!(env["KUBERNETES_PORT"], "tcp://10.0.0.1:6443");
        assert_eq!(env["KUBERNETES_PORT_6443_TCP_ADDR"], "10.0.0.1");
        let v6: BTreeMap<_, _> = service_env("fd00::1", 443).into_iter().collect();
        assert_eq!(v6["KUBERNETES_PORT"], "tcp://[fd00::1]:443");
    }

    #[tokio::test]
    async fn env_takes_values_downward_api_fields_and_resources_and_the_service() {
        // No API call is made for these entries: the client points nowhere.
        let client = kube::Client::try_from(kube::Config::new(
            "http://127.0.0.1:9".parse().expect("url"),
        ))
        .expect("client");
        let ctx = EnvContext {
            client: &client,
            host_ip: "10.0.0.1",
            pod_ip: "10.245.0.2",
            node: NodeResources {
                cpu_millis: 2000,
                memory_bytes: 1 << 30,
            },
            kubernetes_service: Some(("127.0.0.1", 6443)),
        };
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"a": "b"}},
            "spec": {"nodeName": "node01", "containers": [{"name": "c",
                "resources": {"limits": {"memory": "64Mi"}},
                "env": [
                    {"name": "A", "value": "1"},
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "L", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['a']"}}},
                    {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                    {"name": "A", "value": "2"},
                    {"name": "KUBERNETES_SERVICE_PORT", "value": "1"},
                    {"name": "REF", "value": "$(NODE)/$(A)/$(KUBERNETES_SERVICE_HOST)/$(LATER)/$$(A)"},
                    {"name": "LATER", "value": "x"},
                ]}]}
        }))
        .expect("pod");
        let container = &pod.spec.as_ref().expect("spec").containers[0];
        let env = container_env(&ctx, &pod, container).await.expect("env");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("A"), Some("2"));
        assert_eq!(get("NODE"), Some("node01"));
        assert_eq!(get("L"), Some("b"));
        assert_eq!(get("MEM"), Some("64"));
        assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some("127.0.0.1"));
        assert_eq!(
            get("KUBERNETES_SERVICE_PORT"),
            Some("1"),
            "the container's own wins"
        );
        assert_eq!(env.iter().filter(|(n, _)| n == "A").count(), 1);
        assert_eq!(
            get("REF"),
            Some("node01/2/127.0.0.1/$(LATER)/$(A)"),
            "earlier entries and service variables expand, later ones do not"
        );
    }

    #[test]
    fn only_valid_names_become_variables() {
        assert!(valid_env_name("A_1"));
        assert!(valid_env_name("my.key-1"));
        assert!(!valid_env_name("1A"));
        assert!(!valid_env_name("a b"));
        assert!(!valid_env_name(""));
    }
}
