//! Per-kind patch strategies of list fields, for [`strategic_merge_patch`](super::strategic_merge_patch).
//!
//! Built-in Kubernetes types tag some list fields with a patch strategy: `merge` with a
//! merge key (a Pod's `containers` merge by `name`) or `merge` without one (a set of
//! strings, such as `metadata.finalizers`). Every other list is replaced as a whole. This
//! module holds that knowledge as tables of (path from the object root → strategy),
//! selected by the object's group and kind, so the API server needs no typed Kubernetes
//! structs.
//!
//! Paths are the object-member names from the root with list positions left out:
//! `spec.template.spec.containers.env` is the `env` list of any container of a
//! Deployment's pod template.
//!
//! Kinds outside the tables (custom resources, KubeVirt's own kinds) keep only the
//! `metadata` rules that hold for every object; their other lists are replaced and their
//! maps merged, as with a JSON merge patch. [`Schema::is_builtin`] tells the two apart for
//! callers that, like kube-apiserver, refuse strategic merge patches of custom resources.
//!
//! Upstream leaves some lists without a strategy; they are replaced here as well:
//! `tolerations`, `readinessGates`, `envFrom`, node `spec.taints`, endpoint `subsets`,
//! container statuses.

/// How a list field is patched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListStrategy {
    /// The patch's list replaces the stored one.
    Replace,
    /// A list of primitives merged as a set (union, then the `$deleteFromPrimitiveList`
    /// directive removes values).
    MergeSet,
    /// A list of objects merged element by element, matched by the value of this member.
    MergeByKey(&'static str),
}

use ListStrategy::{MergeByKey, MergeSet};

/// A list field below some prefix, and how it is patched.
type Rule = (&'static str, ListStrategy);

/// A set of rules that applies below a path prefix (`""` for the object root).
type Mount = (&'static str, &'static [Rule]);

const OBJECT_META: &[Rule] = &[
    ("finalizers", MergeSet),
    ("ownerReferences", MergeByKey("uid")),
];

const POD_SPEC: &[Rule] = &[
    ("containers", MergeByKey("name")),
    ("containers.ports", MergeByKey("containerPort")),
    ("containers.env", MergeByKey("name")),
    ("containers.volumeMounts", MergeByKey("mountPath")),
    ("containers.volumeDevices", MergeByKey("devicePath")),
    ("initContainers", MergeByKey("name")),
    ("initContainers.ports", MergeByKey("containerPort")),
    ("initContainers.env", MergeByKey("name")),
    ("initContainers.volumeMounts", MergeByKey("mountPath")),
    ("initContainers.volumeDevices", MergeByKey("devicePath")),
    ("ephemeralContainers", MergeByKey("name")),
    ("ephemeralContainers.ports", MergeByKey("containerPort")),
    ("ephemeralContainers.env", MergeByKey("name")),
    ("ephemeralContainers.volumeMounts", MergeByKey("mountPath")),
    (
        "ephemeralContainers.volumeDevices",
        MergeByKey("devicePath"),
    ),
    ("volumes", MergeByKey("name")),
    ("imagePullSecrets", MergeByKey("name")),
    ("hostAliases", MergeByKey("ip")),
    ("topologySpreadConstraints", MergeByKey("topologyKey")),
    ("resourceClaims", MergeByKey("name")),
    ("schedulingGates", MergeByKey("name")),
];

const POD_STATUS: &[Rule] = &[
    ("conditions", MergeByKey("type")),
    ("podIPs", MergeByKey("ip")),
    ("hostIPs", MergeByKey("ip")),
    ("resourceClaimStatuses", MergeByKey("name")),
];

const CONDITIONS: &[Rule] = &[("conditions", MergeByKey("type"))];

const SERVICE_SPEC: &[Rule] = &[("ports", MergeByKey("port"))];

const NODE_SPEC: &[Rule] = &[("podCIDRs", MergeSet)];

const NODE_STATUS: &[Rule] = &[
    ("conditions", MergeByKey("type")),
    ("addresses", MergeByKey("type")),
];

const SERVICE_ACCOUNT: &[Rule] = &[("secrets", MergeByKey("name"))];

/// Rules for every object.
const EVERY_OBJECT: &[Mount] = &[("metadata", OBJECT_META)];

const POD: &[Mount] = &[("spec", POD_SPEC), ("status", POD_STATUS)];

const POD_TEMPLATE: &[Mount] = &[
    ("template.metadata", OBJECT_META),
    ("template.spec", POD_SPEC),
];

/// Deployment, ReplicaSet, DaemonSet, StatefulSet, Job and ReplicationController.
const WORKLOAD: &[Mount] = &[
    ("spec.template.metadata", OBJECT_META),
    ("spec.template.spec", POD_SPEC),
    ("status", CONDITIONS),
];

const CRON_JOB: &[Mount] = &[
    ("spec.jobTemplate.metadata", OBJECT_META),
    ("spec.jobTemplate.spec.template.metadata", OBJECT_META),
    ("spec.jobTemplate.spec.template.spec", POD_SPEC),
];

const SERVICE: &[Mount] = &[("spec", SERVICE_SPEC), ("status", CONDITIONS)];

const NODE: &[Mount] = &[("spec", NODE_SPEC), ("status", NODE_STATUS)];

const STATUS_CONDITIONS: &[Mount] = &[("status", CONDITIONS)];

const SERVICE_ACCOUNT_MOUNTS: &[Mount] = &[("", SERVICE_ACCOUNT)];

const METADATA_ONLY: &[Mount] = &[];

/// (group, kind) → the kind's own mounts, on top of [`EVERY_OBJECT`].
const KINDS: &[(&str, &str, &[Mount])] = &[
    ("", "Pod", POD),
    ("", "PodTemplate", POD_TEMPLATE),
    ("", "ReplicationController", WORKLOAD),
    ("", "Service", SERVICE),
    ("", "Node", NODE),
    ("", "Namespace", STATUS_CONDITIONS),
    ("", "PersistentVolumeClaim", STATUS_CONDITIONS),
    ("", "ServiceAccount", SERVICE_ACCOUNT_MOUNTS),
    ("", "ConfigMap", METADATA_ONLY),
    ("", "Secret", METADATA_ONLY),
    ("", "Endpoints", METADATA_ONLY),
    ("", "PersistentVolume", METADATA_ONLY),
    ("", "Event", METADATA_ONLY),
    ("", "LimitRange", METADATA_ONLY),
    ("", "ResourceQuota", METADATA_ONLY),
    ("apps", "Deployment", WORKLOAD),
    ("apps", "DaemonSet", WORKLOAD),
    ("apps", "ReplicaSet", WORKLOAD),
    ("apps", "StatefulSet", WORKLOAD),
    ("extensions", "Deployment", WORKLOAD),
    ("extensions", "DaemonSet", WORKLOAD),
    ("extensions", "ReplicaSet", WORKLOAD),
    ("batch", "Job", WORKLOAD),
    ("batch", "CronJob", CRON_JOB),
];

/// The list-patch rules of one kind.
#[derive(Clone, Copy, Debug)]
pub struct Schema {
    mounts: &'static [Mount],
    builtin: bool,
}

/// The rules for objects of `api_version` (`v1`, `apps/v1`, …) and `kind`; the version is
/// ignored, so `apps/v1beta2` Deployments patch like `apps/v1` ones.
pub fn schema_for(api_version: &str, kind: &str) -> Schema {
    let group = match api_version.split_once('/') {
        Some((group, _version)) => group,
        None => "",
    };
    match KINDS.iter().find(|(g, k, _)| *g == group && *k == kind) {
        Some((_, _, mounts)) => Schema {
            mounts,
            builtin: true,
        },
        None => Schema {
            mounts: METADATA_ONLY,
            builtin: false,
        },
    }
}

impl Schema {
    /// Whether the kind is a built-in one listed in this module's tables.
    pub fn is_builtin(&self) -> bool {
        self.builtin
    }

    /// How the list at `path` (member names from the object root, list positions left out)
    /// is patched.
    pub fn list_strategy<S: AsRef<str>>(&self, path: &[S]) -> ListStrategy {
        EVERY_OBJECT
            .iter()
            .chain(self.mounts)
            .find_map(|(prefix, rules)| {
                let rest = strip_prefix(path, prefix)?;
                rules
                    .iter()
                    .find(|(rule, _)| strip_prefix(rest, rule).is_some_and(<[S]>::is_empty))
                    .map(|(_, strategy)| *strategy)
            })
            .unwrap_or(ListStrategy::Replace)
    }
}

/// `path` without the dotted `prefix`, if it starts with it.
fn strip_prefix<'p, S: AsRef<str>>(path: &'p [S], prefix: &str) -> Option<&'p [S]> {
    if prefix.is_empty() {
        return Some(path);
    }
    let mut rest = path;
    for segment in prefix.split('.') {
        let (first, tail) = rest.split_first()?;
        if first.as_ref() != segment {
            return None;
        }
        rest = tail;
    }
    Some(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strategy(api_version: &str, kind: &str, path: &str) -> ListStrategy {
        let segments: Vec<&str> = path.split('.').collect();
        schema_for(api_version, kind).list_strategy(&segments)
    }

    #[test]
    fn table_of_paths_gives_expected_strategies() {
        let cases = [
            ("v1", "Pod", "spec.containers", MergeByKey("name")),
            ("v1", "Pod", "spec.containers.env", MergeByKey("name")),
            (
                "v1",
                "Pod",
                "spec.initContainers.ports",
                MergeByKey("containerPort"),
            ),
            (
                "v1",
                "Pod",
                "spec.containers.volumeMounts",
                MergeByKey("mountPath"),
            ),
            (
                "v1",
                "Pod",
                "spec.ephemeralContainers.volumeDevices",
                MergeByKey("devicePath"),
            ),
            ("v1", "Pod", "spec.volumes", MergeByKey("name")),
            ("v1", "Pod", "spec.tolerations", ListStrategy::Replace),
            ("v1", "Pod", "spec.containers.args", ListStrategy::Replace),
            ("v1", "Pod", "status.conditions", MergeByKey("type")),
            ("v1", "Pod", "metadata.finalizers", MergeSet),
            ("v1", "Pod", "metadata.ownerReferences", MergeByKey("uid")),
            (
                "apps/v1",
                "Deployment",
                "spec.template.spec.containers",
                MergeByKey("name"),
            ),
            (
                "apps/v1",
                "Deployment",
                "spec.containers",
                ListStrategy::Replace,
            ),
            (
                "apps/v1",
                "StatefulSet",
                "status.conditions",
                MergeByKey("type"),
            ),
            (
                "apps/v1beta2",
                "DaemonSet",
                "spec.template.spec.volumes",
                MergeByKey("name"),
            ),
            (
                "batch/v1",
                "Job",
                "spec.template.spec.containers.env",
                MergeByKey("name"),
            ),
            (
                "batch/v1",
                "CronJob",
                "spec.jobTemplate.spec.template.spec.containers",
                MergeByKey("name"),
            ),
            (
                "v1",
                "PodTemplate",
                "template.spec.imagePullSecrets",
                MergeByKey("name"),
            ),
            ("v1", "Service", "spec.ports", MergeByKey("port")),
            ("v1", "Service", "spec.externalIPs", ListStrategy::Replace),
            ("v1", "Node", "status.addresses", MergeByKey("type")),
            ("v1", "Node", "spec.taints", ListStrategy::Replace),
            ("v1", "ServiceAccount", "secrets", MergeByKey("name")),
            ("v1", "ConfigMap", "metadata.finalizers", MergeSet),
            (
                "kubevirt.io/v1",
                "VirtualMachine",
                "metadata.ownerReferences",
                MergeByKey("uid"),
            ),
            (
                "kubevirt.io/v1",
                "VirtualMachine",
                "status.conditions",
                ListStrategy::Replace,
            ),
            ("apps/v1", "Pod", "spec.containers", ListStrategy::Replace),
        ];
        for (api_version, kind, path, want) in cases {
            assert_eq!(
                strategy(api_version, kind, path),
                want,
                "{api_version} {kind} {path}"
            );
        }
    }

    #[test]
    fn custom_kinds_are_not_builtin() {
        assert!(schema_for("v1", "Pod").is_builtin());
        assert!(schema_for("apps/v1", "Deployment").is_builtin());
        assert!(!schema_for("kubevirt.io/v1", "VirtualMachineInstance").is_builtin());
    }
}
