//! VM → VMI metadata sync (upstream `syncDynamicAnnotationsAndLabelsToVMI`, reference §2.8),
//! together with the `kubevirt.io/vm-generation` bump of the VMI.
//!
//! Three passes, each with its own source and patterns:
//! 1. labels from `spec.template.metadata.labels`, patterns `--additional-launcher-labels-sync`;
//! 2. annotations from `spec.template.metadata.annotations`, patterns: the two descheduler
//!    annotations, then `--additional-launcher-annotations-sync`;
//! 3. annotations from the VM's own `metadata.annotations`, pattern `kubevirt.io/skip-backup-hooks`.
//!
//! Everything goes into one JSON Patch on the VMI, each changed map as `test` of the original
//! + `replace` (or `add` when the VMI had no map).
//!
//! Deviation from upstream: upstream appends one `test`+`replace` pair per annotation pass, so
//! when both annotation passes change something its second `test` fails after the first
//! `replace` and the request is rejected on every reconcile. We emit a single pair per map
//! carrying the final map, so such a request succeeds.

use std::collections::BTreeMap;

use kubevirt_api::constants::SKIP_BACKUP_HOOKS_ANNOTATION;
use kubevirt_api::v1::{VirtualMachine, VirtualMachineInstance};
use serde_json::Value;

use crate::metadata_sync::{MetadataSyncPatterns, SyncPatterns, patch_ops, sync_map};

/// Template annotations upstream always syncs to the VMI.
pub const DESCHEDULER_ANNOTATIONS: [&str; 2] = [
    "descheduler.alpha.kubernetes.io/evict",
    "descheduler.alpha.kubernetes.io/prefer-no-eviction",
];

/// The JSON Patch operations that bring the VMI's metadata in line with `vm`, or an empty
/// list. `generation` (when `Some`) is a new value for the `kubevirt.io/vm-generation`
/// annotation to write in the same patch.
pub fn vmi_metadata_ops(
    vm: &VirtualMachine,
    vmi: &VirtualMachineInstance,
    config: &MetadataSyncPatterns,
    generation: Option<&str>,
) -> Vec<Value> {
    let mut ops = Vec::new();
    if let Some(g) = &generation {
        let original = vmi.metadata.annotations.as_ref();
        let mut next = original.cloned().unwrap_or_default();
        next.insert(
            kubevirt_api::constants::VM_GENERATION_ANNOTATION.to_owned(),
            (*g).to_owned(),
        );
        let synced = sync_annotations(vm, &next, config).unwrap_or(next);
        ops.extend(patch_ops("/metadata/annotations", original, &synced));
    } else if vmi.metadata.deletion_timestamp.is_none() {
        let original = vmi.metadata.annotations.as_ref();
        let empty = BTreeMap::new();
        if let Some(next) = sync_annotations(vm, original.unwrap_or(&empty), config) {
            ops.extend(patch_ops("/metadata/annotations", original, &next));
        }
    }
    if vmi.metadata.deletion_timestamp.is_none() {
        let original = vmi.metadata.labels.as_ref();
        let empty = BTreeMap::new();
        let source = vm
            .spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.as_ref())
            .unwrap_or(&empty);
        if let Some(next) = sync_map(source, original.unwrap_or(&empty), &config.labels) {
            ops.splice(0..0, patch_ops("/metadata/labels", original, &next));
        }
    }
    ops
}

/// The annotations after passes 2 and 3, or `None` when they change nothing.
fn sync_annotations(
    vm: &VirtualMachine,
    target: &BTreeMap<String, String>,
    config: &MetadataSyncPatterns,
) -> Option<BTreeMap<String, String>> {
    let empty = BTreeMap::new();
    let template = vm
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .unwrap_or(&empty);
    let (descheduler, _) = SyncPatterns::parse(&DESCHEDULER_ANNOTATIONS);
    let template_patterns = descheduler.chain(&config.annotations);
    let after_template = sync_map(template, target, &template_patterns);
    let current = after_template.as_ref().unwrap_or(target);
    let (backup, _) = SyncPatterns::parse(&[SKIP_BACKUP_HOOKS_ANNOTATION]);
    let own = vm.metadata.annotations.as_ref().unwrap_or(&empty);
    sync_map(own, current, &backup).or(after_template)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use serde_json::json;

    fn map(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    fn vm(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> VirtualMachine {
        let mut vm = VirtualMachine::default();
        vm.spec.template.metadata = Some(ObjectMeta {
            labels: map(labels),
            annotations: map(annotations),
            ..ObjectMeta::default()
        });
        vm
    }

    fn vmi(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> VirtualMachineInstance {
        let mut vmi = VirtualMachineInstance::default();
        vmi.metadata.labels = map(labels);
        vmi.metadata.annotations = map(annotations);
        vmi
    }

    fn config(labels: &str, annotations: &str) -> MetadataSyncPatterns {
        MetadataSyncPatterns {
            labels: SyncPatterns::parse_flag(labels).0,
            annotations: SyncPatterns::parse_flag(annotations).0,
        }
    }

    const PNE: &str = "descheduler.alpha.kubernetes.io/prefer-no-eviction";

    #[test]
    fn template_and_vmi_metadata_sync_as_upstream_scenarios() {
        // (name, config labels, config annotations, vm, vmi, expected labels, expected annotations)
        type Case = (
            &'static str,
            (&'static str, &'static str),
            VirtualMachine,
            VirtualMachineInstance,
            Option<Value>,
            Option<Value>,
        );
        let cases: Vec<Case> = vec![
            (
                "descheduler annotation is updated",
                ("", ""),
                vm(&[], &[(PNE, "updated")]),
                vmi(&[], &[(PNE, "initial")]),
                None,
                Some(json!({PNE: "updated"})),
            ),
            (
                "dropped synced annotation is removed, unrelated kept",
                ("", ""),
                vm(&[], &[]),
                vmi(&[], &[(PNE, "x"), ("other", "y")]),
                None,
                Some(json!({"other": "y"})),
            ),
            (
                "equal synced keys need no patch",
                ("", ""),
                vm(&[], &[(PNE, "x")]),
                vmi(&[], &[(PNE, "x")]),
                None,
                None,
            ),
            (
                "only the synced key changes",
                ("", ""),
                vm(&[], &[(PNE, "new"), ("unrelated", "new")]),
                vmi(&[], &[(PNE, "old"), ("unrelated", "old")]),
                None,
                Some(json!({PNE: "new", "unrelated": "old"})),
            ),
            (
                "an unrelated template annotation is not copied",
                ("", ""),
                vm(&[], &[("unrelated", "v")]),
                vmi(&[], &[]),
                None,
                None,
            ),
            (
                "an exact custom annotation is copied",
                ("", "custom/annotation"),
                vm(&[], &[("custom/annotation", "v")]),
                vmi(&[], &[]),
                None,
                Some(json!({"custom/annotation": "v"})),
            ),
            (
                "prefix annotations are copied, others not",
                ("", "custom/annotation-prefix/*"),
                vm(
                    &[],
                    &[
                        ("custom/annotation-prefix/one", "updated"),
                        ("custom/annotation-prefix/two", "updated"),
                        ("custom/other", "x"),
                    ],
                ),
                vmi(&[], &[("custom/annotation-prefix/one", "initial")]),
                None,
                Some(
                    json!({"custom/annotation-prefix/one": "updated", "custom/annotation-prefix/two": "updated"}),
                ),
            ),
            (
                "prefix annotations absent from the template are removed",
                ("", "custom/annotation-prefix/*"),
                vm(&[], &[]),
                vmi(
                    &[],
                    &[
                        ("custom/annotation-prefix/one", "a"),
                        ("custom/annotation-prefix/two", "b"),
                    ],
                ),
                None,
                Some(json!({})),
            ),
            (
                "a bare star syncs nothing",
                ("*", "*"),
                vm(&[("l", "v")], &[("a", "v")]),
                vmi(&[], &[]),
                None,
                None,
            ),
            (
                "an exact custom label is copied",
                ("custom/label", ""),
                vm(&[("custom/label", "v")], &[]),
                vmi(&[("kubevirt.io/nodeName", "n1")], &[]),
                Some(json!({"custom/label": "v", "kubevirt.io/nodeName": "n1"})),
                None,
            ),
            (
                "prefix labels are added, updated and deleted, others untouched",
                ("custom/label-prefix/*", ""),
                vm(
                    &[
                        ("custom/label-prefix/a", "2"),
                        ("custom/label-prefix/c", "3"),
                        ("team", "x"),
                    ],
                    &[],
                ),
                vmi(
                    &[
                        ("custom/label-prefix/a", "1"),
                        ("custom/label-prefix/b", "1"),
                        ("team", "y"),
                    ],
                    &[],
                ),
                Some(
                    json!({"custom/label-prefix/a": "2", "custom/label-prefix/c": "3", "team": "y"}),
                ),
                None,
            ),
            (
                "equal labels need no patch",
                ("custom/label", ""),
                vm(&[("custom/label", "v")], &[]),
                vmi(&[("custom/label", "v")], &[]),
                None,
                None,
            ),
        ];
        for (name, (labels, annotations), vm, vmi, want_labels, want_annotations) in cases {
            let ops = vmi_metadata_ops(&vm, &vmi, &config(labels, annotations), None);
            let replaced = |path: &str| {
                ops.iter()
                    .find(|op| op["path"] == path && (op["op"] == "replace" || op["op"] == "add"))
                    .map(|op| op["value"].clone())
            };
            assert_eq!(replaced("/metadata/labels"), want_labels, "{name}: labels");
            assert_eq!(
                replaced("/metadata/annotations"),
                want_annotations,
                "{name}: annotations"
            );
            let expected_ops = usize::from(want_labels.is_some()) * 2
                + usize::from(want_annotations.is_some()) * 2;
            assert_eq!(ops.len(), expected_ops, "{name}: {ops:?}");
        }
    }

    #[test]
    fn a_patch_tests_the_original_map_and_adds_a_missing_one() {
        let ops = vmi_metadata_ops(
            &vm(&[("custom/label", "v")], &[]),
            &VirtualMachineInstance::default(),
            &config("custom/label", ""),
            None,
        );
        assert_eq!(
            ops,
            vec![json!({"op": "add", "path": "/metadata/labels", "value": {"custom/label": "v"}})]
        );
        let ops = vmi_metadata_ops(
            &vm(&[], &[(PNE, "b")]),
            &vmi(&[], &[(PNE, "a")]),
            &config("", ""),
            None,
        );
        assert_eq!(
            ops[0],
            json!({"op": "test", "path": "/metadata/annotations", "value": {PNE: "a"}})
        );
    }

    #[test]
    fn skip_backup_hooks_comes_from_the_vm_itself_in_the_same_annotation_replace() {
        let mut vm = vm(&[], &[(PNE, "b")]);
        vm.metadata.annotations = map(&[(SKIP_BACKUP_HOOKS_ANNOTATION, "true")]);
        let ops = vmi_metadata_ops(&vm, &vmi(&[], &[(PNE, "a")]), &config("", ""), None);
        assert_eq!(ops.len(), 2);
        assert_eq!(
            ops[1]["value"],
            json!({PNE: "b", SKIP_BACKUP_HOOKS_ANNOTATION: "true"})
        );
    }

    #[test]
    fn a_generation_bump_and_synced_annotations_share_one_replace() {
        let ops = vmi_metadata_ops(
            &vm(&[], &[(PNE, "b")]),
            &vmi(&[], &[("kubevirt.io/vm-generation", "1")]),
            &config("", ""),
            Some("2"),
        );
        assert_eq!(ops.len(), 2);
        assert_eq!(
            ops[1]["value"],
            json!({"kubevirt.io/vm-generation": "2", PNE: "b"})
        );
    }

    #[test]
    fn a_deleting_vmi_is_not_synced() {
        let mut target = vmi(&[], &[]);
        target.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        let ops = vmi_metadata_ops(
            &vm(&[("custom/label", "v")], &[]),
            &target,
            &config("custom/label", ""),
            None,
        );
        assert!(ops.is_empty());
    }
}
