//! The admission seam: hooks called on every write before it is stored.
//!
//! The server calls each registered [`Admission`] twice per write, as kube-apiserver runs
//! its admission chain: in the [`Phase::Mutating`] phase before schema validation (a hook
//! may change the object) and in the [`Phase::Validating`] phase after it, just before the
//! store write (changes are ignored). A hook may add warnings or refuse the request with an
//! [`ApiError`]. Two hooks are registered, in kube-apiserver's order: the built-in
//! [`ServiceAccountAdmission`] (a pod's service account and its projected API credentials)
//! and webhook admission ([`crate::webhook`]: Mutating/Validating webhook configurations).

use serde_json::Value;

use crate::registry::ResourceInfo;
use crate::status::ApiError;

/// The write being admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

/// The two admission phases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Before validation: hooks may change the object.
    Mutating,
    /// After validation: hooks may only refuse.
    Validating,
}

impl Operation {
    /// The operation as AdmissionReview and webhook rules spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }
}

/// Everything a hook knows about the request.
#[derive(Debug)]
pub struct AdmissionRequest<'a> {
    pub operation: Operation,
    pub resource: &'a ResourceInfo,
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    /// The stored object for updates and deletes.
    pub old_object: Option<&'a Value>,
    pub dry_run: bool,
    /// The authenticated user name.
    pub user: &'a str,
    /// The caller's groups; `None` for the server's own writes.
    pub groups: Option<&'a [String]>,
}

/// A hook called before every write.
#[async_trait::async_trait]
pub trait Admission: Send + Sync {
    /// Admits (in the mutating phase possibly changing `object`) or refuses the write;
    /// returns warnings for the client. For deletes `object` is the object about to be
    /// deleted.
    async fn admit(
        &self,
        phase: Phase,
        request: &AdmissionRequest<'_>,
        object: &mut Value,
    ) -> Result<Vec<String>, ApiError>;
}

/// kube-apiserver's `ServiceAccount` admission plugin, for pods being created: defaults
/// `spec.serviceAccountName` to `default` and, unless `automountServiceAccountToken` is
/// `false` on the pod (or, when the pod does not say, on its ServiceAccount), adds the
/// projected volume `kube-api-access-<5 random characters>` (a bound token of
/// [`API_ACCESS_TOKEN_SECONDS`], the `kube-root-ca.crt` ConfigMap's `ca.crt` and the
/// namespace) and mounts it read-only at [`API_ACCESS_MOUNT_PATH`] in every container that
/// mounts nothing there itself.
///
/// # Caveats
/// A ServiceAccount that does not exist (yet) does not refuse the pod, as upstream's plugin
/// does: the node retries the token until the account exists.
pub struct ServiceAccountAdmission {
    store: kubevirt_store::Store,
}

/// Where containers find their service-account credentials.
pub const API_ACCESS_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The name prefix of the projected service-account volume.
pub const API_ACCESS_VOLUME_PREFIX: &str = "kube-api-access-";

/// The token lifetime of the projected service-account volume (an hour and 7 s, as upstream
/// asks, so the token is told apart from one of a user's projections).
pub const API_ACCESS_TOKEN_SECONDS: i64 = 3607;

/// The characters of upstream's random name suffixes (no vowels, no look-alikes).
const SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

impl ServiceAccountAdmission {
    /// The plugin, reading ServiceAccounts from `store`.
    pub fn new(store: kubevirt_store::Store) -> ServiceAccountAdmission {
        ServiceAccountAdmission { store }
    }
}

/// A random 5-character name suffix, as upstream's `utilrand.String(5)`.
pub fn random_suffix() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..5)
        .map(|_| char::from(SUFFIX_ALPHABET[rng.random_range(0..SUFFIX_ALPHABET.len())]))
        .collect()
}

/// The projected service-account volume named `name`.
pub fn api_access_volume(name: &str) -> Value {
    serde_json::json!({
        "name": name,
        "projected": {
            "defaultMode": 0o644,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": API_ACCESS_TOKEN_SECONDS, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace",
                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ],
        },
    })
}

/// Applies the plugin to a pod (pure): `service_account` is the pod's account if it exists,
/// `suffix` the random suffix of a new volume's name.
pub fn mount_service_account(pod: &mut Value, service_account: Option<&Value>, suffix: &str) {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if spec
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        spec.insert("serviceAccountName".into(), "default".into());
    }
    let automount = spec
        .get("automountServiceAccountToken")
        .and_then(Value::as_bool)
        .or_else(|| {
            service_account?
                .get("automountServiceAccountToken")?
                .as_bool()
        })
        .unwrap_or(true);
    if !automount {
        return;
    }
    let existing = spec
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str())
        .find(|n| n.starts_with(API_ACCESS_VOLUME_PREFIX))
        .map(str::to_owned);
    let name = existing
        .clone()
        .unwrap_or_else(|| format!("{API_ACCESS_VOLUME_PREFIX}{suffix}"));
    let mount =
        serde_json::json!({"name": name, "readOnly": true, "mountPath": API_ACCESS_MOUNT_PATH});
    let mut needed = false;
    for list in ["initContainers", "containers"] {
        let Some(containers) = spec.get_mut(list).and_then(Value::as_array_mut) else {
            continue;
        };
        for container in containers.iter_mut().filter_map(Value::as_object_mut) {
            let mounts = container
                .entry("volumeMounts")
                .or_insert_with(|| Value::Array(Vec::new()));
            let Some(mounts) = mounts.as_array_mut() else {
                continue;
            };
            if mounts
                .iter()
                .any(|m| m["mountPath"].as_str() == Some(API_ACCESS_MOUNT_PATH))
            {
                continue;
            }
            mounts.push(mount.clone());
            needed = true;
        }
    }
    if needed && existing.is_none() {
        let volumes = spec
            .entry("volumes")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Some(volumes) = volumes.as_array_mut() {
            volumes.push(api_access_volume(&name));
        }
    }
}

#[async_trait::async_trait]
impl Admission for ServiceAccountAdmission {
    async fn admit(
        &self,
        phase: Phase,
        request: &AdmissionRequest<'_>,
        object: &mut Value,
    ) -> Result<Vec<String>, ApiError> {
        let info = request.resource;
        let is_pod = info.group.is_empty() && info.plural == "pods";
        if phase != Phase::Mutating
            || request.operation != Operation::Create
            || request.subresource.is_some()
            || !is_pod
        {
            return Ok(Vec::new());
        }
        // Mirror pods (static pods of a kubelet) get no API credentials, as upstream.
        if object["metadata"]["annotations"]
            .get("kubernetes.io/config.mirror")
            .is_some()
        {
            return Ok(Vec::new());
        }
        let namespace = request
            .namespace
            .or_else(|| object["metadata"]["namespace"].as_str())
            .unwrap_or("default")
            .to_owned();
        let account = object["spec"]["serviceAccountName"]
            .as_str()
            .filter(|n| !n.is_empty())
            .unwrap_or("default")
            .to_owned();
        let service_account = self
            .store
            .get(&format!(
                "/registry/core/serviceaccounts/{namespace}/{account}"
            ))
            .and_then(|r| serde_json::from_slice::<Value>(&r.value).ok());
        mount_service_account(object, service_account.as_ref(), &random_suffix());
        Ok(Vec::new())
    }
}

/// The annotation that makes a StorageClass the default one.
pub const DEFAULT_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";

/// The beta spelling of [`DEFAULT_CLASS_ANNOTATION`], still honoured by kube.
const BETA_DEFAULT_CLASS_ANNOTATION: &str = "storageclass.beta.kubernetes.io/is-default-class";

/// kube-apiserver's `DefaultStorageClass` admission plugin: a PersistentVolumeClaim created
/// without `spec.storageClassName` (absent or null; an empty string asks for no class) gets
/// the default StorageClass, the one annotated [`DEFAULT_CLASS_ANNOTATION`]`: "true"`. With
/// several defaults the newest wins (ties: the name first in order), as in kube ≥ 1.26; with
/// none the claim keeps no class.
pub struct DefaultStorageClass {
    store: kubevirt_store::Store,
}

impl DefaultStorageClass {
    /// The plugin, reading StorageClasses from `store`.
    pub fn new(store: kubevirt_store::Store) -> DefaultStorageClass {
        DefaultStorageClass { store }
    }
}

/// Whether `class` is marked as the default class.
fn is_default_class(class: &Value) -> bool {
    let annotations = &class["metadata"]["annotations"];
    [DEFAULT_CLASS_ANNOTATION, BETA_DEFAULT_CLASS_ANNOTATION]
        .iter()
        .any(|a| annotations[*a].as_str() == Some("true"))
}

/// The default class among `classes` (pure): the newest marked one, ties by name.
pub fn default_class(classes: &[Value]) -> Option<&str> {
    classes
        .iter()
        .filter(|c| is_default_class(c))
        .max_by(|a, b| {
            let created = |c: &Value| {
                c["metadata"]["creationTimestamp"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            };
            let name = |c: &'_ Value| {
                c["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            };
            // RFC 3339 in UTC with whole seconds orders as text; the smaller name wins a tie.
            created(a)
                .cmp(&created(b))
                .then_with(|| name(b).cmp(&name(a)))
        })
        .and_then(|c| c["metadata"]["name"].as_str())
}

#[async_trait::async_trait]
impl Admission for DefaultStorageClass {
    async fn admit(
        &self,
        phase: Phase,
        request: &AdmissionRequest<'_>,
        object: &mut Value,
    ) -> Result<Vec<String>, ApiError> {
        let info = request.resource;
        if phase != Phase::Mutating
            || request.operation != Operation::Create
            || request.subresource.is_some()
            || !info.group.is_empty()
            || info.plural != "persistentvolumeclaims"
        {
            return Ok(Vec::new());
        }
        // A malformed spec is validation's to refuse; a class already named (even "") stays.
        let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) else {
            return Ok(Vec::new());
        };
        if spec.get("storageClassName").is_some_and(|c| !c.is_null()) {
            return Ok(Vec::new());
        }
        let classes: Vec<Value> = self
            .store
            .list("/registry/storage.k8s.io/storageclasses/", None, None)
            .records
            .iter()
            .filter_map(|r| serde_json::from_slice(&r.value).ok())
            .collect();
        if let Some(name) = default_class(&classes) {
            spec.insert("storageClassName".into(), name.into());
        }
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_container_mounts_one_api_access_volume_read_only() {
        let mut pod = json!({"spec": {
            "initContainers": [{"name": "init"}],
            "containers": [{"name": "a"}, {"name": "b", "volumeMounts": [{"name": "x", "mountPath": "/x"}]}],
        }});
        mount_service_account(&mut pod, None, "abcde");
        assert_eq!(pod["spec"]["serviceAccountName"], "default");
        let volumes = pod["spec"]["volumes"].as_array().expect("volumes");
        assert_eq!(volumes.len(), 1);
        assert_eq!(volumes[0], api_access_volume("kube-api-access-abcde"));
        for c in ["initContainers", "containers"] {
            for container in pod["spec"][c].as_array().expect("containers") {
                let mounts = container["volumeMounts"].as_array().expect("mounts");
                let m = mounts.last().expect("mount");
                assert_eq!(m["name"], "kube-api-access-abcde");
                assert_eq!(m["mountPath"], API_ACCESS_MOUNT_PATH);
                assert_eq!(m["readOnly"], true);
            }
        }
    }

    #[test]
    fn automount_false_on_the_pod_or_its_account_mounts_nothing() {
        let mut pod =
            json!({"spec": {"automountServiceAccountToken": false, "containers": [{"name": "a"}]}});
        mount_service_account(&mut pod, None, "abcde");
        assert!(pod["spec"]["volumes"].is_null());
        assert_eq!(pod["spec"]["serviceAccountName"], "default");
        let mut pod =
            json!({"spec": {"serviceAccountName": "robot", "containers": [{"name": "a"}]}});
        mount_service_account(
            &mut pod,
            Some(&json!({"automountServiceAccountToken": false})),
            "abcde",
        );
        assert!(pod["spec"]["volumes"].is_null());
        assert_eq!(pod["spec"]["serviceAccountName"], "robot");
        // The pod's own choice wins over its account's.
        let mut pod =
            json!({"spec": {"automountServiceAccountToken": true, "containers": [{"name": "a"}]}});
        mount_service_account(
            &mut pod,
            Some(&json!({"automountServiceAccountToken": false})),
            "abcde",
        );
        assert_eq!(pod["spec"]["volumes"].as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn an_existing_mount_at_the_path_is_kept() {
        let mut pod = json!({"spec": {"containers": [{"name": "a", "volumeMounts": [
            {"name": "mine", "mountPath": API_ACCESS_MOUNT_PATH}]}]}});
        mount_service_account(&mut pod, None, "abcde");
        assert!(pod["spec"]["volumes"].is_null());
        assert_eq!(
            pod["spec"]["containers"][0]["volumeMounts"]
                .as_array()
                .map(Vec::len),
            Some(1)
        );
    }

    #[test]
    fn suffixes_use_upstreams_alphabet() {
        let s = random_suffix();
        assert_eq!(s.len(), 5);
        assert!(s.bytes().all(|b| SUFFIX_ALPHABET.contains(&b)));
    }

    #[test]
    fn the_newest_default_class_wins_and_unmarked_classes_never_do() {
        let class = |name: &str, default: Option<&str>, created: &str| {
            let mut c = json!({"metadata": {"name": name, "creationTimestamp": created}});
            if let Some(v) = default {
                c["metadata"]["annotations"] = json!({DEFAULT_CLASS_ANNOTATION: v});
            }
            c
        };
        assert_eq!(default_class(&[]), None);
        assert_eq!(
            default_class(&[class("fast", None, "2026-01-01T00:00:00Z")]),
            None
        );
        assert_eq!(
            default_class(&[class("fast", Some("false"), "2026-01-01T00:00:00Z")]),
            None
        );
        let classes = [
            class("old", Some("true"), "2026-01-01T00:00:00Z"),
            class("new", Some("true"), "2026-02-01T00:00:00Z"),
            class("newest-but-not-default", None, "2026-03-01T00:00:00Z"),
        ];
        assert_eq!(default_class(&classes), Some("new"));
        let tie = [
            class("b", Some("true"), "2026-01-01T00:00:00Z"),
            class("a", Some("true"), "2026-01-01T00:00:00Z"),
        ];
        assert_eq!(default_class(&tie), Some("a"));
        let beta = json!({"metadata": {"name": "beta", "annotations": {
            "storageclass.beta.kubernetes.io/is-default-class": "true"}}});
        assert_eq!(default_class(&[beta]), Some("beta"));
    }
}
