//! `20-rbac.yaml`: each component's ClusterRole, ClusterRoleBinding, Role and RoleBinding
//! ([`components`]) and KubeVirt's user roles ([`cluster`]), with upstream's names and rules
//! (`pkg/virt-operator/resource/generate/rbac`), in upstream's order: apiserver, controller,
//! handler, cluster, operator.
//!
//! Rules are written as upstream has them, then [`retain_served`] keeps only the API groups
//! that exist: the Kubernetes groups ([`KUBERNETES_GROUPS`]), the groups of the KubeVirt CRDs
//! this project generates and `subresources.kubevirt.io`. A rule left without a group is
//! dropped; [`dropped_groups`] names what was dropped (snapshots, exports, backups, clones,
//! instance types, migration policies, CDI, OpenShift, Prometheus operator, CSI snapshots…).
//! A new CRD group brings its upstream rules back without an edit here.

use std::collections::BTreeSet;

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use serde_json::Value;

use crate::meta::{APP_LABEL, cluster_meta, namespaced_meta, strings};
use crate::{InstallConfig, InstallError, to_value};

pub mod cluster;
pub mod components;

/// `rbac.authorization.k8s.io`.
pub const RBAC_GROUP: &str = "rbac.authorization.k8s.io";
/// The aggregated API group of virt-api.
pub const SUBRESOURCES_GROUP: &str = "subresources.kubevirt.io";

/// The API groups of Kubernetes 1.33 itself (served by any cluster and by the embedded one).
pub const KUBERNETES_GROUPS: &[&str] = &[
    "",
    "admissionregistration.k8s.io",
    "apiextensions.k8s.io",
    "apiregistration.k8s.io",
    "apps",
    "authentication.k8s.io",
    "authorization.k8s.io",
    "autoscaling",
    "batch",
    "certificates.k8s.io",
    "coordination.k8s.io",
    "discovery.k8s.io",
    "events.k8s.io",
    "flowcontrol.apiserver.k8s.io",
    "networking.k8s.io",
    "node.k8s.io",
    "policy",
    RBAC_GROUP,
    "resource.k8s.io",
    "scheduling.k8s.io",
    "storage.k8s.io",
];

/// A policy rule over resources of API groups.
pub(crate) fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(strings(groups)),
        resources: Some(strings(resources)),
        verbs: strings(verbs),
        ..PolicyRule::default()
    }
}

/// A policy rule limited to named objects.
pub(crate) fn named_rule(
    groups: &[&str],
    resources: &[&str],
    names: &[&str],
    verbs: &[&str],
) -> PolicyRule {
    PolicyRule {
        resource_names: Some(strings(names)),
        ..rule(groups, resources, verbs)
    }
}

/// The API groups that exist: Kubernetes' and KubeVirt's served ones, and CDI's
/// (`cdi.kubevirt.io`, whose DataVolumes virt-controller creates from VM templates wherever
/// CDI is installed — the embedded server installs its own).
///
/// # Errors
///
/// [`InstallError::Crds`] if the CRDs cannot be generated.
pub fn served_groups() -> Result<BTreeSet<String>, InstallError> {
    let mut groups: BTreeSet<String> = KUBERNETES_GROUPS.iter().map(|g| (*g).to_owned()).collect();
    for crd in kubevirt_api::crd::all_crds().map_err(InstallError::Crds)? {
        groups.insert(crd.spec.group);
    }
    groups.insert(SUBRESOURCES_GROUP.to_owned());
    groups.insert(kubevirt_api::cdi::GROUP.to_owned());
    Ok(groups)
}

/// Keeps of each rule the groups in `served`; drops rules left without one. Rules without
/// groups (non-resource URLs) are kept.
pub(crate) fn retain_served(rules: Vec<PolicyRule>, served: &BTreeSet<String>) -> Vec<PolicyRule> {
    rules
        .into_iter()
        .filter_map(|mut rule| {
            let Some(groups) = rule.api_groups.as_mut() else {
                return Some(rule);
            };
            groups.retain(|g| served.contains(g));
            (!groups.is_empty()).then_some(rule)
        })
        .collect()
}

/// The API groups of upstream's rules that this installation drops.
///
/// # Errors
///
/// [`InstallError::Crds`] if the CRDs cannot be generated.
pub fn dropped_groups(config: &InstallConfig) -> Result<BTreeSet<String>, InstallError> {
    let served = served_groups()?;
    let mut dropped = BTreeSet::new();
    for role in components::upstream_roles(config)
        .iter()
        .chain(&cluster::upstream_roles())
    {
        for rule in &role.rules {
            for group in rule.api_groups.iter().flatten() {
                if !served.contains(group) {
                    dropped.insert(group.clone());
                }
            }
        }
    }
    Ok(dropped)
}

/// Which object a [`RoleSpec`] becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// A ClusterRole.
    Cluster,
    /// A Role in the install namespace.
    Namespaced,
}

/// A role as upstream writes it, before [`retain_served`].
#[derive(Clone, Debug)]
pub(crate) struct RoleSpec {
    pub scope: Scope,
    pub name: &'static str,
    pub labels: Vec<(&'static str, &'static str)>,
    pub annotations: Vec<(&'static str, &'static str)>,
    pub rules: Vec<PolicyRule>,
}

impl RoleSpec {
    /// A role with upstream's default label `kubevirt.io: ""`.
    pub fn new(scope: Scope, name: &'static str, rules: Vec<PolicyRule>) -> Self {
        Self {
            scope,
            name,
            labels: vec![(APP_LABEL, "")],
            annotations: Vec::new(),
            rules,
        }
    }

    fn to_object(&self, namespace: &str, served: &BTreeSet<String>) -> Result<Value, InstallError> {
        let rules = Some(retain_served(self.rules.clone(), served));
        let mut metadata = match self.scope {
            Scope::Cluster => cluster_meta(self.name, &self.labels),
            Scope::Namespaced => namespaced_meta(namespace, self.name, &self.labels),
        };
        if !self.annotations.is_empty() {
            metadata.annotations = Some(crate::meta::labels(&self.annotations));
        }
        match self.scope {
            Scope::Cluster => to_value(
                "ClusterRole",
                &ClusterRole {
                    metadata,
                    rules,
                    ..ClusterRole::default()
                },
            ),
            Scope::Namespaced => to_value("Role", &Role { metadata, rules }),
        }
    }
}

/// A binding of a role to subjects.
#[derive(Clone, Debug)]
pub(crate) struct BindingSpec {
    pub scope: Scope,
    pub name: &'static str,
    /// Kind of the role (`ClusterRole` or `Role`).
    pub role_kind: &'static str,
    pub role: &'static str,
    pub annotations: Vec<(&'static str, &'static str)>,
    pub subjects: Vec<Subject>,
}

impl BindingSpec {
    fn to_object(&self, namespace: &str) -> Result<Value, InstallError> {
        let role_ref = RoleRef {
            api_group: RBAC_GROUP.into(),
            kind: self.role_kind.into(),
            name: self.role.into(),
        };
        let mut metadata = match self.scope {
            Scope::Cluster => cluster_meta(self.name, &[(APP_LABEL, "")]),
            Scope::Namespaced => namespaced_meta(namespace, self.name, &[(APP_LABEL, "")]),
        };
        if !self.annotations.is_empty() {
            metadata.annotations = Some(crate::meta::labels(&self.annotations));
        }
        let subjects = Some(self.subjects.clone());
        match self.scope {
            Scope::Cluster => to_value(
                "ClusterRoleBinding",
                &ClusterRoleBinding {
                    metadata,
                    role_ref,
                    subjects,
                },
            ),
            Scope::Namespaced => to_value(
                "RoleBinding",
                &RoleBinding {
                    metadata,
                    role_ref,
                    subjects,
                },
            ),
        }
    }
}

/// A ServiceAccount subject.
pub(crate) fn service_account(namespace: &str, name: &str) -> Subject {
    Subject {
        kind: "ServiceAccount".into(),
        name: name.into(),
        namespace: Some(namespace.into()),
        api_group: None,
    }
}

/// A Group subject.
pub(crate) fn group(name: &str) -> Subject {
    Subject {
        kind: "Group".into(),
        name: name.into(),
        namespace: None,
        api_group: Some(RBAC_GROUP.into()),
    }
}

/// One object of the group, before rendering.
#[derive(Clone, Debug)]
pub(crate) enum RbacObject {
    Role(RoleSpec),
    Binding(BindingSpec),
}

/// The group's objects.
///
/// # Errors
///
/// [`InstallError`] if the CRDs cannot be generated or an object encoded.
pub fn objects(config: &InstallConfig) -> Result<Vec<Value>, InstallError> {
    let served = served_groups()?;
    let ns = &config.namespace;
    let mut all = components::api_objects(ns);
    all.extend(components::controller_objects(config));
    all.extend(components::handler_objects(ns));
    all.extend(cluster::objects());
    all.extend(components::operator_objects(ns));
    all.iter()
        .map(|object| match object {
            RbacObject::Role(role) => role.to_object(ns, &served),
            RbacObject::Binding(binding) => binding.to_object(ns),
        })
        .collect()
}
