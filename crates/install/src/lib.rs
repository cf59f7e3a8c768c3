//! `kubevirt-install`: KubeVirt's install manifests, generated from code.
//!
//! An [`InstallConfig`] (namespace, images, pull policy, replicas, extra flags per component)
//! goes in; typed k8s-openapi objects come out, in groups by component (named as the numbered
//! files `deploy/` once held) and in upstream's install order ([`manifests`]):
//!
//! | file | objects | module |
//! |---|---|---|
//! | `00-namespace.yaml` | Namespace, PriorityClass, ServiceAccounts | [`namespace`] |
//! | `10-crds.yaml` | the KubeVirt CRDs ([`kubevirt_api::crd::all_crds`]) | here |
//! | `20-rbac.yaml` | component and aggregated user roles and bindings | [`rbac`] |
//! | `30-virt-api.yaml` | virt-api Deployment, Services, PDB, webhooks, APIServices | [`virt_api`] |
//! | `40-virt-controller.yaml` | virt-controller Deployment, PDB | [`virt_controller`] |
//! | `50-virt-handler.yaml` | virt-handler DaemonSet | [`virt_handler`] |
//! | `60-kubevirt-cr.yaml` | the default `KubeVirt` CR | [`kubevirt_cr`] |
//!
//! These groups are the full rendering, by component. Upstream's two-step install splits it
//! ([`deploy_files`], the files of `deploy/`): `kubevirt-operator.yaml`
//! ([`virt_operator::objects`]: namespace, `KubeVirt` CRD, the operator's RBAC and Deployment)
//! and `kubevirt-cr.yaml`; the rest is the operator's install strategy ([`install_strategy`]),
//! in upstream's order.
//!
//! [`render_yaml`] turns a group into a multi-document YAML stream; [`kustomization_yaml`]
//! lists the files. Objects are `serde_json::Value`s of typed objects, so a caller (the
//! embedded server, the operator) can apply them with a dynamic client.
//!
//! Names, labels, rules, ports and probes follow upstream's virt-operator
//! (`pkg/virt-operator/resource/generate`). Where kubevirt-rs differs (the multi-call binary
//! `kubevirt-rs` and its flags, probes only where an endpoint exists, rules only for API groups
//! that exist) the module says so.

use std::collections::BTreeMap;

use serde_json::Value;

pub mod kubevirt_cr;
pub mod namespace;
pub mod rbac;
pub mod virt_api;
pub mod virt_controller;
pub mod virt_handler;
pub mod virt_operator;

mod meta;
mod pod;

/// The binary every component runs (with a subcommand).
pub const BINARY: &str = "kubevirt-rs";

/// Failures building or rendering the manifests.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// Generating the KubeVirt CRDs failed.
    #[error("generating the KubeVirt CRDs")]
    Crds(#[source] kubevirt_api::crd::CrdError),
    /// Encoding an object as JSON failed (a bug in the types).
    #[error("encoding {what} as JSON")]
    Encode {
        /// The object.
        what: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// Rendering an object as YAML failed.
    #[error("rendering {what} as YAML")]
    Yaml {
        /// The object.
        what: String,
        /// The cause.
        #[source]
        source: serde_saphyr::SerializeError,
    },
}

/// Extra command-line arguments appended to a component's generated ones; a flag named here
/// replaces the generated flag of that name. The operator fills these from the KubeVirt CR's
/// `customizeComponents.flags` with [`flags_to_args`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ComponentArgs {
    /// virt-api.
    pub api: Vec<String>,
    /// virt-controller.
    pub controller: Vec<String>,
    /// virt-handler.
    pub handler: Vec<String>,
}

/// What an installation looks like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstallConfig {
    /// Namespace of the components and the KubeVirt CR (`kubevirt`).
    pub namespace: String,
    /// Registry (with any path) of the images (`kubevirt-rs`); empty for none.
    pub image_registry: String,
    /// Prefix of the image names (empty): `<registry>/<prefix>virt-api:<tag>`.
    pub image_prefix: String,
    /// Tag of the images (this crate's version).
    pub image_tag: String,
    /// Pull policy of every container (`IfNotPresent`, as upstream).
    pub image_pull_policy: String,
    /// virt-api's replicas (2).
    pub api_replicas: i32,
    /// virt-controller's replicas (2).
    pub controller_replicas: i32,
    /// virt-launcher's image, for `--launcher-image` (default: the launcher image of the
    /// registry, prefix and tag).
    pub launcher_image: Option<String>,
    /// Extra arguments per component.
    pub extra_args: ComponentArgs,
}

impl Default for InstallConfig {
    fn default() -> Self {
        Self {
            namespace: "kubevirt".into(),
            image_registry: "kubevirt-rs".into(),
            image_prefix: String::new(),
            image_tag: env!("CARGO_PKG_VERSION").into(),
            image_pull_policy: "IfNotPresent".into(),
            api_replicas: 2,
            controller_replicas: 2,
            launcher_image: None,
            extra_args: ComponentArgs::default(),
        }
    }
}

impl InstallConfig {
    /// The image of component `name` (`virt-api`, `virt-controller`, …).
    #[must_use]
    pub fn image(&self, name: &str) -> String {
        let registry = self.image_registry.trim_end_matches('/');
        let sep = if registry.is_empty() { "" } else { "/" };
        format!(
            "{registry}{sep}{}{name}:{}",
            self.image_prefix, self.image_tag
        )
    }

    /// The launcher image virt-controller puts into launcher pods.
    #[must_use]
    pub fn launcher_image(&self) -> String {
        self.launcher_image
            .clone()
            .unwrap_or_else(|| self.image("virt-launcher"))
    }
}

/// Upstream's `customizeComponents.flags` map (flag name without dashes → value) as
/// arguments, formatted as virt-operator does: names and values lower-cased, in name order;
/// `--name` alone for an empty value, `--name=true|false` for booleans, else `--name value`.
#[must_use]
pub fn flags_to_args(flags: &BTreeMap<String, String>) -> Vec<String> {
    let mut args = Vec::new();
    for (name, value) in flags {
        let (name, value) = (name.to_lowercase(), value.to_lowercase());
        match value.as_str() {
            "" => args.push(format!("--{name}")),
            "true" | "false" => args.push(format!("--{name}={value}")),
            _ => {
                args.push(format!("--{name}"));
                args.push(value);
            }
        }
    }
    args
}

/// The flag name of an argument (`--name` or `--name=value`), if it is one.
fn flag_name(arg: &str) -> Option<&str> {
    let name = arg.strip_prefix("--")?;
    Some(name.split_once('=').map_or(name, |(n, _)| n))
}

/// `generated` (`--name value` pairs) followed by `extra`; a generated pair whose flag
/// `extra` names again is left out, so an extra flag overrides instead of repeating (the
/// binary refuses a repeated flag).
pub(crate) fn merge_args(generated: &[(&str, String)], extra: &[String]) -> Vec<String> {
    let overridden: std::collections::BTreeSet<&str> =
        extra.iter().filter_map(|a| flag_name(a)).collect();
    let mut args = Vec::new();
    for (flag, value) in generated {
        if !overridden.contains(flag.trim_start_matches('-')) {
            args.push((*flag).to_owned());
            args.push(value.clone());
        }
    }
    args.extend(extra.iter().cloned());
    args
}

/// One file of `deploy/`: its name and its objects in apply order.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// File name (`00-namespace.yaml`).
    pub file: &'static str,
    /// The objects.
    pub objects: Vec<Value>,
}

/// Encodes a typed object as JSON.
pub(crate) fn to_value<T: serde::Serialize>(what: &str, object: &T) -> Result<Value, InstallError> {
    serde_json::to_value(object).map_err(|source| InstallError::Encode {
        what: what.to_owned(),
        source,
    })
}

/// The KubeVirt CRDs.
///
/// # Errors
///
/// [`InstallError`] if a CRD cannot be generated or encoded.
pub fn crds() -> Result<Vec<Value>, InstallError> {
    kubevirt_api::crd::all_crds()
        .map_err(InstallError::Crds)?
        .iter()
        .map(|crd| {
            let name = crd.metadata.name.as_deref().unwrap_or_default();
            to_value(&format!("CRD {name}"), crd)
        })
        .collect()
}

/// Every group of the installation, in apply order.
///
/// # Errors
///
/// [`InstallError`] if an object cannot be generated or encoded.
pub fn manifests(config: &InstallConfig) -> Result<Vec<Group>, InstallError> {
    Ok(vec![
        Group {
            file: "00-namespace.yaml",
            objects: namespace::objects(config)?,
        },
        Group {
            file: "10-crds.yaml",
            objects: crds()?,
        },
        Group {
            file: "20-rbac.yaml",
            objects: rbac::objects(config)?,
        },
        Group {
            file: "30-virt-api.yaml",
            objects: virt_api::objects(config)?,
        },
        Group {
            file: "40-virt-controller.yaml",
            objects: virt_controller::objects(config)?,
        },
        Group {
            file: "50-virt-handler.yaml",
            objects: virt_handler::objects(config)?,
        },
        Group {
            file: "60-kubevirt-cr.yaml",
            objects: kubevirt_cr::objects(config)?,
        },
    ])
}

/// The files of `deploy/`: `kubevirt-operator.yaml` and `kubevirt-cr.yaml`.
///
/// # Errors
///
/// [`InstallError`] if an object cannot be generated or encoded.
pub fn deploy_files(config: &InstallConfig) -> Result<Vec<Group>, InstallError> {
    Ok(vec![
        Group {
            file: "kubevirt-operator.yaml",
            objects: virt_operator::objects(config)?,
        },
        Group {
            file: "kubevirt-cr.yaml",
            objects: kubevirt_cr::objects(config)?,
        },
    ])
}

/// Upstream's order of the install strategy's kinds (`reconcile.go` `Sync`): CRDs, accounts
/// and RBAC, Services, then the workloads (virt-handler's DaemonSet before the Deployments),
/// and the registration objects and disruption budgets last. A kind not named goes last.
pub const STRATEGY_ORDER: [&str; 13] = [
    "CustomResourceDefinition",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "Service",
    "DaemonSet",
    "Deployment",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "APIService",
    "PodDisruptionBudget",
];

/// The install strategy: every object the operator installs for `config` (everything of
/// [`manifests`] but the operator's own manifest and the CR), in [`STRATEGY_ORDER`]; within a
/// kind, virt-controller's Deployment before virt-api's (upstream rolls the controller first).
///
/// # Errors
///
/// [`InstallError`] if an object cannot be generated or encoded.
pub fn install_strategy(config: &InstallConfig) -> Result<Vec<Value>, InstallError> {
    let mut objects: Vec<Value> = manifests(config)?
        .into_iter()
        .flat_map(|g| g.objects)
        .filter(|o| o["kind"] != "KubeVirt" && !virt_operator::is_operator_object(o))
        .collect();
    objects.extend(virt_operator::strategy_objects(config)?);
    let rank = |o: &Value| {
        let kind = o["kind"].as_str().unwrap_or_default();
        let position = STRATEGY_ORDER
            .iter()
            .position(|k| *k == kind)
            .unwrap_or(STRATEGY_ORDER.len());
        let api_last = o["metadata"]["name"] == "virt-api" && kind == "Deployment";
        (position, api_last)
    };
    // A stable sort: within a kind, the rendering's order.
    objects.sort_by_key(rank);
    Ok(objects)
}

/// Objects as a multi-document YAML stream, each document starting with `---`.
///
/// # Errors
///
/// [`InstallError::Yaml`] if an object cannot be rendered.
pub fn render_yaml(objects: &[Value]) -> Result<String, InstallError> {
    let mut out = String::new();
    for object in objects {
        let yaml = serde_saphyr::to_string(object).map_err(|source| InstallError::Yaml {
            what: meta::describe(object),
            source,
        })?;
        out.push_str("---\n");
        out.push_str(&yaml);
        if !yaml.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}

/// The header of every rendered file.
pub const GENERATED_HEADER: &str =
    "# Generated by `kubevirt-rs manifests` (crates/install); do not edit.\n";

/// A group's file content: [`GENERATED_HEADER`] and the YAML stream.
///
/// # Errors
///
/// [`InstallError::Yaml`] if an object cannot be rendered.
pub fn render_file(group: &Group) -> Result<String, InstallError> {
    Ok(format!(
        "{GENERATED_HEADER}{}",
        render_yaml(&group.objects)?
    ))
}

/// `kustomization.yaml` listing the groups' files in order.
#[must_use]
pub fn kustomization_yaml(groups: &[Group]) -> String {
    let mut out = format!(
        "{GENERATED_HEADER}apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n"
    );
    for group in groups {
        out.push_str("- ");
        out.push_str(group.file);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests;
