//! The resource registry: which resources this server serves, built-in and from CRDs.
//!
//! Built-ins come from a static table; CRDs add entries when a CustomResourceDefinition is
//! created or updated (see [`crate::crd`]) and lose them when it is deleted. Lookups by
//! `(group, version, plural)` serve requests; lookups by `(apiVersion, kind)` serve internal
//! creates (initial objects).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use serde_json::Value;

use crate::metadata::NameRule;
use crate::schema::Schema;

/// An `additionalPrinterColumns` entry of a CRD version.
#[derive(Clone, Debug)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    pub json_path: String,
}

/// What a CRD version adds to a resource.
#[derive(Clone, Debug, Default)]
pub struct CrdVersionInfo {
    /// The compiled `openAPIV3Schema`, if it compiled.
    pub schema: Option<Arc<Schema>>,
    /// The raw schema (served in OpenAPI).
    pub raw_schema: Value,
    pub printer_columns: Vec<PrinterColumn>,
    /// `subresources.scale` paths (`specReplicasPath`, `statusReplicasPath`,
    /// `labelSelectorPath` — empty when absent), if any.
    pub scale: Option<(String, String, String)>,
}

/// One served resource at one version.
#[derive(Clone, Debug)]
pub struct ResourceInfo {
    /// Group (`""` for core).
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub short_names: Vec<String>,
    pub namespaced: bool,
    pub categories: Vec<String>,
    /// Subresources beyond the object itself (`status`, `binding`, `scale`).
    pub subresources: Vec<String>,
    pub name_rule: NameRule,
    /// Present for CRD-backed resources.
    pub crd: Option<CrdVersionInfo>,
    /// A review resource (`tokenreviews`, `selfsubjectreviews`): only `create`, answered
    /// without storing anything.
    pub create_only: bool,
}

impl ResourceInfo {
    /// `group/version` (or `v1` for core).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Whether `/status` is a subresource (so updates of the main resource ignore status).
    pub fn has_status(&self) -> bool {
        self.subresources.iter().any(|s| s == "status")
    }

    /// The verbs of the main resource.
    pub fn verbs(&self) -> Vec<&'static str> {
        if self.create_only {
            return vec!["create"];
        }
        vec![
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ]
    }

    /// `/registry/{group}/{plural}/` — the store prefix of every object of this resource.
    pub fn key_prefix(&self) -> String {
        let g = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        format!("/registry/{g}/{}/", self.plural)
    }

    /// The store prefix of one namespace (or all objects when `None` / cluster-scoped).
    pub fn list_prefix(&self, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) if self.namespaced => format!("{}{ns}/", self.key_prefix()),
            _ => self.key_prefix(),
        }
    }

    /// The store key of one object.
    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        format!("{}{name}", self.list_prefix(namespace))
    }

    /// Whether this resource is a CRD-backed one.
    pub fn is_custom(&self) -> bool {
        self.crd.is_some()
    }
}

struct Builtin {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    short: &'static [&'static str],
    namespaced: bool,
    all: bool,
    subresources: &'static [&'static str],
    rule: NameRule,
    create_only: bool,
}

const fn b(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    short: &'static [&'static str],
    namespaced: bool,
) -> Builtin {
    Builtin {
        group,
        version,
        kind,
        plural,
        short,
        namespaced,
        all: false,
        subresources: &[],
        rule: NameRule::Subdomain,
        create_only: false,
    }
}

const fn review(group: &'static str, kind: &'static str, plural: &'static str) -> Builtin {
    let mut x = b(group, "v1", kind, plural, &[], false);
    x.create_only = true;
    x
}

const fn namespaced(mut x: Builtin) -> Builtin {
    x.namespaced = true;
    x
}

const fn all(mut x: Builtin) -> Builtin {
    x.all = true;
    x
}

const fn sub(mut x: Builtin, s: &'static [&'static str]) -> Builtin {
    x.subresources = s;
    x
}

const fn rule(mut x: Builtin, r: NameRule) -> Builtin {
    x.rule = r;
    x
}

const BUILTINS: &[Builtin] = &[
    rule(
        sub(
            b("", "v1", "Namespace", "namespaces", &["ns"], false),
            &["status"],
        ),
        NameRule::Label,
    ),
    all(sub(
        b("", "v1", "Pod", "pods", &["po"], true),
        &["status", "binding", "eviction", "log"],
    )),
    sub(b("", "v1", "Node", "nodes", &["no"], false), &["status"]),
    rule(
        b("", "v1", "Event", "events", &["ev"], true),
        NameRule::Path,
    ),
    b("", "v1", "ConfigMap", "configmaps", &["cm"], true),
    b("", "v1", "Secret", "secrets", &[], true),
    rule(
        all(sub(
            b("", "v1", "Service", "services", &["svc"], true),
            &["status"],
        )),
        NameRule::Label,
    ),
    b("", "v1", "Endpoints", "endpoints", &["ep"], true),
    b(
        "discovery.k8s.io",
        "v1",
        "EndpointSlice",
        "endpointslices",
        &[],
        true,
    ),
    sub(
        b("", "v1", "ServiceAccount", "serviceaccounts", &["sa"], true),
        &["token"],
    ),
    sub(
        b(
            "",
            "v1",
            "PersistentVolumeClaim",
            "persistentvolumeclaims",
            &["pvc"],
            true,
        ),
        &["status"],
    ),
    sub(
        b(
            "",
            "v1",
            "PersistentVolume",
            "persistentvolumes",
            &["pv"],
            false,
        ),
        &["status"],
    ),
    all(sub(
        b("apps", "v1", "Deployment", "deployments", &["deploy"], true),
        &["status", "scale"],
    )),
    all(sub(
        b("apps", "v1", "DaemonSet", "daemonsets", &["ds"], true),
        &["status"],
    )),
    all(sub(
        b("apps", "v1", "ReplicaSet", "replicasets", &["rs"], true),
        &["status", "scale"],
    )),
    b(
        "apps",
        "v1",
        "ControllerRevision",
        "controllerrevisions",
        &[],
        true,
    ),
    b("coordination.k8s.io", "v1", "Lease", "leases", &[], true),
    sub(
        b(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            &["crd", "crds"],
            false,
        ),
        &["status"],
    ),
    b(
        "admissionregistration.k8s.io",
        "v1",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        &[],
        false,
    ),
    b(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        &[],
        false,
    ),
    sub(
        b(
            "apiregistration.k8s.io",
            "v1",
            "APIService",
            "apiservices",
            &[],
            false,
        ),
        &["status"],
    ),
    rule(
        b(
            "rbac.authorization.k8s.io",
            "v1",
            "Role",
            "roles",
            &[],
            true,
        ),
        NameRule::Path,
    ),
    rule(
        b(
            "rbac.authorization.k8s.io",
            "v1",
            "RoleBinding",
            "rolebindings",
            &[],
            true,
        ),
        NameRule::Path,
    ),
    rule(
        b(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRole",
            "clusterroles",
            &[],
            false,
        ),
        NameRule::Path,
    ),
    rule(
        b(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRoleBinding",
            "clusterrolebindings",
            &[],
            false,
        ),
        NameRule::Path,
    ),
    sub(
        b(
            "policy",
            "v1",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
            &["pdb"],
            true,
        ),
        &["status"],
    ),
    b(
        "storage.k8s.io",
        "v1",
        "StorageClass",
        "storageclasses",
        &["sc"],
        false,
    ),
    rule(
        b("events.k8s.io", "v1", "Event", "events", &["ev"], true),
        NameRule::Path,
    ),
    b(
        "scheduling.k8s.io",
        "v1",
        "PriorityClass",
        "priorityclasses",
        &["pc"],
        false,
    ),
    review("authentication.k8s.io", "TokenReview", "tokenreviews"),
    review(
        "authentication.k8s.io",
        "SelfSubjectReview",
        "selfsubjectreviews",
    ),
    review(
        "authorization.k8s.io",
        "SubjectAccessReview",
        "subjectaccessreviews",
    ),
    review(
        "authorization.k8s.io",
        "SelfSubjectAccessReview",
        "selfsubjectaccessreviews",
    ),
    review(
        "authorization.k8s.io",
        "SelfSubjectRulesReview",
        "selfsubjectrulesreviews",
    ),
    namespaced(review(
        "authorization.k8s.io",
        "LocalSubjectAccessReview",
        "localsubjectaccessreviews",
    )),
];

fn builtin_infos() -> Vec<Arc<ResourceInfo>> {
    BUILTINS
        .iter()
        .map(|x| {
            Arc::new(ResourceInfo {
                group: x.group.into(),
                version: x.version.into(),
                kind: x.kind.into(),
                plural: x.plural.into(),
                singular: x.kind.to_ascii_lowercase(),
                short_names: x.short.iter().map(|s| (*s).to_owned()).collect(),
                namespaced: x.namespaced,
                categories: if x.all {
                    vec!["all".into()]
                } else {
                    Vec::new()
                },
                subresources: x.subresources.iter().map(|s| (*s).to_owned()).collect(),
                name_rule: x.rule,
                crd: None,
                create_only: x.create_only,
            })
        })
        .collect()
}

/// All served resources; cheap to share (`Arc`) and safe to update while serving.
#[derive(Debug)]
pub struct Registry {
    builtins: Vec<Arc<ResourceInfo>>,
    /// CRD name → its served versions (in the CRD's order).
    custom: RwLock<BTreeMap<String, Vec<Arc<ResourceInfo>>>>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}

impl Registry {
    /// The built-in resources and no CRDs.
    pub fn new() -> Registry {
        Registry {
            builtins: builtin_infos(),
            custom: RwLock::new(BTreeMap::new()),
        }
    }

    /// Every served resource: built-ins first, then CRD versions.
    pub fn all(&self) -> Vec<Arc<ResourceInfo>> {
        let mut v = self.builtins.clone();
        if let Ok(c) = self.custom.read() {
            v.extend(c.values().flatten().cloned());
        }
        v
    }

    /// The resource served at `group/version/plural`.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceInfo>> {
        self.all()
            .into_iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
    }

    /// The resource of an object's `apiVersion` and `kind`.
    pub fn find_kind(&self, api_version: &str, kind: &str) -> Option<Arc<ResourceInfo>> {
        self.all()
            .into_iter()
            .find(|r| r.api_version() == api_version && r.kind == kind)
    }

    /// Replaces the versions served for the CRD named `crd_name`.
    pub fn set_custom(&self, crd_name: &str, versions: Vec<Arc<ResourceInfo>>) {
        if let Ok(mut c) = self.custom.write() {
            if versions.is_empty() {
                c.remove(crd_name);
            } else {
                c.insert(crd_name.to_owned(), versions);
            }
        }
    }

    /// Stops serving the CRD named `crd_name`.
    pub fn remove_custom(&self, crd_name: &str) {
        self.set_custom(crd_name, Vec::new());
    }

    /// Whether `group/plural` names a built-in resource (CRDs may not shadow them).
    pub fn is_builtin(&self, group: &str, plural: &str) -> bool {
        self.builtins
            .iter()
            .any(|r| r.group == group && r.plural == plural)
    }

    /// Distinct groups with their versions, in a stable order (core first, then by name with
    /// built-ins before CRDs in registration order).
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for r in self.all() {
            match out.iter_mut().find(|(g, _)| *g == r.group) {
                Some((_, vs)) => {
                    if !vs.contains(&r.version) {
                        vs.push(r.version.clone());
                    }
                }
                None => out.push((r.group.clone(), vec![r.version.clone()])),
            }
        }
        out
    }

    /// Resources of one group version.
    pub fn in_group_version(&self, group: &str, version: &str) -> Vec<Arc<ResourceInfo>> {
        self.all()
            .into_iter()
            .filter(|r| r.group == group && r.version == version)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_are_found_by_path_and_by_kind() {
        let r = Registry::new();
        let pods = r.find("", "v1", "pods").unwrap();
        assert!(pods.namespaced && pods.has_status());
        assert_eq!(pods.short_names, vec!["po"]);
        assert_eq!(pods.categories, vec!["all"]);
        assert_eq!(
            pods.key(Some("ns"), "p").as_str(),
            "/registry/core/pods/ns/p"
        );
        let crd = r
            .find_kind("apiextensions.k8s.io/v1", "CustomResourceDefinition")
            .unwrap();
        assert_eq!(
            crd.key(None, "a.b"),
            "/registry/apiextensions.k8s.io/customresourcedefinitions/a.b"
        );
    }

    #[test]
    fn custom_resources_come_and_go() {
        let r = Registry::new();
        let mut info = (*r.find("", "v1", "configmaps").unwrap()).clone();
        info.group = "example.com".into();
        info.plural = "widgets".into();
        r.set_custom("widgets.example.com", vec![Arc::new(info)]);
        assert!(r.find("example.com", "v1", "widgets").is_some());
        assert!(r.groups().iter().any(|(g, _)| g == "example.com"));
        r.remove_custom("widgets.example.com");
        assert!(r.find("example.com", "v1", "widgets").is_none());
    }
}
