//! VMI → launcher pod sync of selected labels and annotations (upstream's
//! `syncDynamicAnnotationsAndLabelsToPod`).
//!
//! Data flow: the VMI's labels (as the status pass left them, so a freshly set
//! `kubevirt.io/outdatedLauncherImage` reaches the pod in the same reconcile) and annotations
//! (overlaid with the velero backup hooks unless the VMI skips them) are the source; the
//! existing launcher pod is the target. [`pod_sync_ops`] returns one JSON Patch for both maps
//! (`test` of the pod's original map + `replace`, or `add` when the pod has none), or nothing
//! when the pod already agrees; the pod is patched in place, so its UID never changes.
//!
//! Patterns per map (see [`crate::metadata_sync`] for their syntax):
//! - labels: `kubevirt.io/nodeName`, `kubevirt.io/outdatedLauncherImage`, then
//!   `--additional-launcher-labels-sync`;
//! - annotations: `descheduler.alpha.kubernetes.io/evict`,
//!   `descheduler.alpha.kubernetes.io/prefer-no-eviction`, then
//!   `--additional-launcher-annotations-sync`, then the five velero hook keys.
//!
//! Whether the hooks are skipped is `kubevirt.io/skip-backup-hooks` of the VMI or, when the
//! VMI lacks it, of the KubeVirt CR (as upstream); a change of the CR's value re-queues every
//! VMI.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kubevirt_api::constants as c;
use kubevirt_api::v1::VirtualMachineInstance;
use serde_json::Value;

use super::template::{backup_hook_annotations, skip_backup_hooks};
use crate::metadata_sync::{MetadataSyncPatterns, SyncPatterns, patch_ops, sync_map};

/// Label keys always synced to the pod.
pub const BUILTIN_LABEL_KEYS: &[&str] = &[c::NODE_NAME_LABEL, c::OUTDATED_LAUNCHER_IMAGE_LABEL];
/// Annotation keys always synced to the pod (before the additional ones).
pub const BUILTIN_ANNOTATION_KEYS: &[&str] = &[
    "descheduler.alpha.kubernetes.io/evict",
    "descheduler.alpha.kubernetes.io/prefer-no-eviction",
];
/// The velero hook keys, synced after the additional annotation patterns.
pub const BACKUP_HOOK_KEYS: &[&str] = &[
    c::VELERO_PRE_BACKUP_HOOK_CONTAINER_ANNOTATION,
    c::VELERO_PRE_BACKUP_HOOK_COMMAND_ANNOTATION,
    c::VELERO_PRE_BACKUP_HOOK_TIMEOUT_ANNOTATION,
    c::VELERO_POST_BACKUP_HOOK_CONTAINER_ANNOTATION,
    c::VELERO_POST_BACKUP_HOOK_COMMAND_ANNOTATION,
];

fn exact(keys: &[&str]) -> SyncPatterns {
    SyncPatterns::parse(keys).0
}

/// JSON Patch operations that bring the pod's synced labels and annotations in line with the
/// VMI; empty when nothing differs. `vmi_labels` are the VMI labels after the status pass.
pub fn pod_sync_ops(
    vmi: &VirtualMachineInstance,
    vmi_labels: &BTreeMap<String, String>,
    pod: &Pod,
    patterns: &MetadataSyncPatterns,
    cluster_skip_backup_hooks: Option<&str>,
) -> Vec<Value> {
    let mut ops = Vec::new();
    let label_patterns = exact(BUILTIN_LABEL_KEYS).chain(&patterns.labels);
    let pod_labels = pod.metadata.labels.as_ref();
    let empty = BTreeMap::new();
    if let Some(next) = sync_map(vmi_labels, pod_labels.unwrap_or(&empty), &label_patterns) {
        ops.extend(patch_ops("/metadata/labels", pod_labels, &next));
    }

    let annotation_patterns = exact(BUILTIN_ANNOTATION_KEYS)
        .chain(&patterns.annotations)
        .chain(&exact(BACKUP_HOOK_KEYS));
    let vmi_annotations = vmi.metadata.annotations.as_ref();
    let mut source = vmi_annotations.cloned().unwrap_or_default();
    if !skip_backup_hooks(vmi_annotations, cluster_skip_backup_hooks) {
        let name = vmi.metadata.name.as_deref().unwrap_or_default();
        let namespace = vmi.metadata.namespace.as_deref().unwrap_or_default();
        source.extend(backup_hook_annotations(name, namespace));
    }
    let pod_annotations = pod.metadata.annotations.as_ref();
    if let Some(next) = sync_map(
        &source,
        pod_annotations.unwrap_or(&empty),
        &annotation_patterns,
    ) {
        ops.extend(patch_ops("/metadata/annotations", pod_annotations, &next));
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn vmi(annotations: &[(&str, &str)]) -> VirtualMachineInstance {
        let mut vmi = VirtualMachineInstance::new("vm-a", Default::default());
        vmi.metadata.namespace = Some("ns".into());
        let mut a = map(annotations);
        a.insert(c::SKIP_BACKUP_HOOKS_ANNOTATION.into(), "true".into());
        vmi.metadata.annotations = Some(a);
        vmi
    }

    fn pod(labels: &[(&str, &str)], annotations: Option<&[(&str, &str)]>) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.labels = Some(map(labels));
        pod.metadata.annotations = annotations.map(map);
        pod
    }

    fn patterns(labels: &str, annotations: &str) -> MetadataSyncPatterns {
        MetadataSyncPatterns {
            labels: SyncPatterns::parse_flag(labels).0,
            annotations: SyncPatterns::parse_flag(annotations).0,
        }
    }

    const BASE: [(&str, &str); 2] = [
        ("kubevirt.io", "virt-launcher"),
        ("kubevirt.io/created-by", "1234"),
    ];

    #[test]
    fn label_sync_adds_updates_and_deletes_matching_keys_and_leaves_the_rest() {
        // (case, vmi labels, pod labels (besides BASE), label flag, expected pod labels besides BASE or None)
        type Case<'a> = (
            &'a str,
            &'a [(&'a str, &'a str)],
            &'a [(&'a str, &'a str)],
            &'a str,
            Option<&'a [(&'a str, &'a str)]>,
        );
        let cases: &[Case<'_>] = &[
            (
                "node name follows the VMI",
                &[("kubevirt.io/nodeName", "node2")],
                &[("kubevirt.io/nodeName", "node1")],
                "",
                Some(&[("kubevirt.io/nodeName", "node2")]),
            ),
            (
                "outdated image label removed",
                &[],
                &[("kubevirt.io/outdatedLauncherImage", "")],
                "",
                Some(&[]),
            ),
            (
                "equal maps send nothing",
                &[("kubevirt.io/nodeName", "n")],
                &[("kubevirt.io/nodeName", "n")],
                "",
                None,
            ),
            (
                "exact key added",
                &[("custom/label", "v")],
                &[],
                "custom/label",
                Some(&[("custom/label", "v")]),
            ),
            (
                "prefix keys updated and added",
                &[
                    ("custom/p/one", "updated"),
                    ("custom/p/two", "updated"),
                    ("other", "x"),
                ],
                &[("custom/p/one", "old")],
                "custom/p/*",
                Some(&[("custom/p/one", "updated"), ("custom/p/two", "updated")]),
            ),
            (
                "prefix keys missing on the VMI removed",
                &[],
                &[("custom/p/one", "1"), ("custom/p/two", "2")],
                "custom/p/*",
                Some(&[]),
            ),
            (
                "keys outside the patterns untouched",
                &[("unrelated", "new")],
                &[("unrelated", "old")],
                "custom/p/*",
                None,
            ),
            (
                "a bare star is ignored",
                &[("anything", "v")],
                &[],
                "*",
                None,
            ),
        ];
        for (case, vmi_labels, pod_labels, flag, expected) in cases {
            let mut all_pod_labels = BASE.to_vec();
            all_pod_labels.extend_from_slice(pod_labels);
            let pod = pod(&all_pod_labels, Some(&[]));
            let ops = pod_sync_ops(&vmi(&[]), &map(vmi_labels), &pod, &patterns(flag, ""), None);
            match expected {
                None => assert!(ops.is_empty(), "{case}: {ops:?}"),
                Some(expected) => {
                    let mut want = BASE.to_vec();
                    want.extend_from_slice(expected);
                    assert_eq!(
                        ops,
                        vec![
                            json!({"op": "test", "path": "/metadata/labels", "value": map(&all_pod_labels)}),
                            json!({"op": "replace", "path": "/metadata/labels", "value": map(&want)}),
                        ],
                        "{case}"
                    );
                }
            }
        }
    }

    #[test]
    fn annotations_follow_the_builtin_and_additional_patterns() {
        let vmi = vmi(&[
            (
                "descheduler.alpha.kubernetes.io/prefer-no-eviction",
                "updated",
            ),
            ("custom/a", "1"),
            ("free", "x"),
        ]);
        let pod = pod(
            &BASE,
            Some(&[
                (
                    "descheduler.alpha.kubernetes.io/prefer-no-eviction",
                    "initial",
                ),
                ("custom/b", "2"),
            ]),
        );
        let ops = pod_sync_ops(&vmi, &map(&[]), &pod, &patterns("", "custom/*"), None);
        assert_eq!(ops.len(), 2);
        assert_eq!(
            ops[1]["value"],
            json!({"custom/a": "1", "descheduler.alpha.kubernetes.io/prefer-no-eviction": "updated"})
        );
    }

    #[test]
    fn a_pod_without_annotations_gets_an_add_op() {
        let vmi = vmi(&[("descheduler.alpha.kubernetes.io/evict", "true")]);
        let ops = pod_sync_ops(
            &vmi,
            &map(&[]),
            &pod(&BASE, None),
            &MetadataSyncPatterns::default(),
            None,
        );
        assert_eq!(
            ops,
            vec![
                json!({"op": "add", "path": "/metadata/annotations", "value": {"descheduler.alpha.kubernetes.io/evict": "true"}})
            ]
        );
    }

    #[test]
    fn backup_hooks_are_removed_when_skipped_and_restored_when_not() {
        let mut with_hooks = vmi(&[]);
        let hooks = backup_hook_annotations("vm-a", "ns");
        let hook_pairs: Vec<(&str, &str)> = hooks
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let pod_with_hooks = pod(&BASE, Some(&hook_pairs));
        let ops = pod_sync_ops(
            &with_hooks,
            &map(&[]),
            &pod_with_hooks,
            &MetadataSyncPatterns::default(),
            None,
        );
        assert_eq!(ops[1]["value"], json!({}), "skipped: hooks removed");
        if let Some(a) = with_hooks.metadata.annotations.as_mut() {
            a.insert(c::SKIP_BACKUP_HOOKS_ANNOTATION.into(), "false".into());
        }
        assert!(
            pod_sync_ops(
                &with_hooks,
                &map(&[]),
                &pod_with_hooks,
                &MetadataSyncPatterns::default(),
                None,
            )
            .is_empty()
        );
        let ops = pod_sync_ops(
            &with_hooks,
            &map(&[]),
            &pod(&BASE, Some(&[])),
            &MetadataSyncPatterns::default(),
            None,
        );
        assert_eq!(
            ops[1]["value"],
            serde_json::to_value(&hooks).unwrap_or_default(),
            "not skipped: hooks added"
        );
    }

    #[test]
    fn the_kubevirt_crs_skip_backup_hooks_decides_only_for_vmis_without_their_own() {
        let hooks = backup_hook_annotations("vm-a", "ns");
        let bare = pod(&BASE, Some(&[]));
        let mut own = vmi(&[]);
        let sync = |vmi: &VirtualMachineInstance, cluster: Option<&str>| {
            pod_sync_ops(
                vmi,
                &map(&[]),
                &bare,
                &MetadataSyncPatterns::default(),
                cluster,
            )
        };
        // The VMI says true: skipped whatever the CR says.
        assert!(sync(&own, Some("false")).is_empty());
        // No annotation on the VMI: the CR decides.
        own.metadata.annotations = Some(BTreeMap::new());
        assert!(sync(&own, Some("true")).is_empty(), "CR skips the hooks");
        let ops = sync(&own, Some("false"));
        assert_eq!(ops[1]["value"], serde_json::to_value(&hooks).unwrap());
        assert_eq!(sync(&own, None), ops, "no CR annotation: hooks added");
        // A VMI value that is not a boolean still shadows the CR (upstream parses it as false).
        own.metadata.annotations = Some(map(&[(c::SKIP_BACKUP_HOOKS_ANNOTATION, "yes")]));
        assert_eq!(
            sync(&own, Some("true"))[1]["value"]["pre.hook.backup.velero.io/container"],
            "compute"
        );
    }

    #[test]
    fn two_vmis_with_different_keys_under_one_prefix_never_leak_into_each_others_pods() {
        let p = patterns("ops.example.com/*", "");
        let a_labels = map(&[
            ("ops.example.com/vm-id", "vm-a"),
            ("ops.example.com/owner-a", "team-a-v2"),
            ("ops.example.com/dynamic-a", "enabled"),
        ]);
        let b_labels = map(&[
            ("ops.example.com/vm-id", "vm-b"),
            ("ops.example.com/owner-b", "team-b-v2"),
        ]);
        let pod_a = pod(
            &[
                ("kubevirt.io", "virt-launcher"),
                ("ops.example.com/vm-id", "vm-a"),
                ("ops.example.com/owner-a", "team-a-v1"),
            ],
            Some(&[]),
        );
        let pod_b = pod(
            &[
                ("kubevirt.io", "virt-launcher"),
                ("ops.example.com/vm-id", "vm-b"),
                ("ops.example.com/owner-b", "team-b-v1"),
            ],
            Some(&[]),
        );
        let a = pod_sync_ops(&vmi(&[]), &a_labels, &pod_a, &p, None);
        let b = pod_sync_ops(&vmi(&[]), &b_labels, &pod_b, &p, None);
        let mut want_a = a_labels.clone();
        want_a.insert("kubevirt.io".into(), "virt-launcher".into());
        let mut want_b = b_labels.clone();
        want_b.insert("kubevirt.io".into(), "virt-launcher".into());
        assert_eq!(a[1]["value"], json!(want_a));
        assert_eq!(b[1]["value"], json!(want_b));
    }
}
