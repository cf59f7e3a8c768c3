//! Property tests: arbitrary VMI/VM shapes (random values at real field paths, plus random
//! nested JSON) never make a validator, mutator or the patch generator panic, and a mutation's
//! patch always applies back to the submitted object.

use proptest::prelude::*;
use proptest::strategy::Union;
use serde_json::{Value, json};
use virt_api::ClusterConfig;
use virt_api::mutate::{diff, mutate_vm_create, mutate_vmi_create};
use virt_api::validate::{validate_vm, validate_vmi_create, validate_vmi_update};

fn text() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(""),
        Just("x"),
        Just("-bad"),
        Just("virtio"),
        Just("sata"),
        Just("ide"),
        Just("scsi"),
        Just("1Gi"),
        Just("100m"),
        Just("-1"),
        Just("2Mi"),
        Just("1.5"),
        Just("abc"),
        Just("0"),
        Just("Paused"),
        Just("None"),
        Just("q35"),
        Just("pc-q35-9.0"),
        Just("arm64"),
        Just("s390x"),
        Just("bridge"),
        Just("masquerade"),
        Just("root"),
        Just("default"),
        Just("1e3"),
        Just("999999999999Ei"),
    ]
    .prop_map(|s| json!(s))
    .boxed()
}

fn leaf() -> BoxedStrategy<Value> {
    prop_oneof![
        text(),
        any::<u32>().prop_map(|n| json!(n)),
        (0u32..6).prop_map(|n| json!(n)),
        any::<bool>().prop_map(|b| json!(b)),
        Just(Value::Null),
        Just(json!({})),
    ]
    .boxed()
}

fn disk() -> BoxedStrategy<Value> {
    (
        text(),
        prop::option::of(0usize..3),
        text(),
        any::<bool>(),
        prop::option::of(0u32..4),
        prop::option::of((any::<u32>(), any::<u32>())),
    )
        .prop_map(|(name, kind, bus, ro, boot, bs)| {
            let mut d = json!({"name": name});
            if let Some(k) = kind {
                d[["disk", "cdrom", "lun"][k]] = json!({"bus": bus, "readonly": ro});
            }
            if let Some(b) = boot {
                d["bootOrder"] = json!(b);
            }
            if let Some((l, p)) = bs {
                d["blockSize"] = json!({"custom": {"logical": l, "physical": p}});
            }
            d
        })
        .boxed()
}

fn volume() -> BoxedStrategy<Value> {
    (text(), 0usize..6, text())
        .prop_map(|(name, kind, s)| match kind {
            0 => json!({"name": name, "containerDisk": {"image": s}}),
            1 => json!({"name": name, "cloudInitNoCloud": {"userDataBase64": s}}),
            2 => json!({"name": name, "hostDisk": {"path": s, "type": s}}),
            3 => json!({"name": name, "dataVolume": {"name": s}}),
            4 => json!({"name": name, "downwardMetrics": {}}),
            _ => json!({"name": name, "persistentVolumeClaim": {"claimName": s}, "emptyDisk": {"capacity": s}}),
        })
        .boxed()
}

fn iface() -> BoxedStrategy<Value> {
    (text(), 0usize..4, prop::option::of(0u32..3), text())
        .prop_map(|(name, b, boot, mac)| {
            let mut i = json!({"name": name, "macAddress": mac});
            if b < 3 {
                i[["bridge", "masquerade", "slirp"][b]] = json!({});
            }
            if let Some(o) = boot {
                i["bootOrder"] = json!(o);
            }
            i
        })
        .boxed()
}

fn network() -> BoxedStrategy<Value> {
    (text(), any::<bool>(), any::<bool>())
        .prop_map(|(name, pod, multus)| {
            let mut n = json!({"name": name});
            if pod {
                n["pod"] = json!({});
            }
            if multus {
                n["multus"] = json!({"networkName": "", "default": true});
            }
            n
        })
        .boxed()
}

/// A random value at one real field path of a VMI.
fn field_edit() -> impl Strategy<Value = (&'static str, Value)> {
    let text_paths: Vec<&'static str> = vec![
        "/spec/domain/resources/requests/memory",
        "/spec/domain/resources/limits/memory",
        "/spec/domain/resources/requests/cpu",
        "/spec/domain/resources/limits/cpu",
        "/spec/domain/memory/guest",
        "/spec/domain/memory/maxGuest",
        "/spec/domain/memory/hugepages/pageSize",
        "/spec/domain/cpu/model",
        "/spec/domain/machine/type",
        "/spec/architecture",
        "/spec/hostname",
        "/spec/subdomain",
        "/spec/startStrategy",
        "/spec/evictionStrategy",
        "/spec/dnsPolicy",
        "/spec/domain/ioThreadsPolicy",
        "/spec/domain/firmware/uuid",
        "/spec/serviceAccountName",
    ];
    let number_paths: Vec<&'static str> = vec![
        "/spec/domain/cpu/sockets",
        "/spec/domain/cpu/cores",
        "/spec/domain/cpu/threads",
        "/spec/domain/cpu/maxSockets",
    ];
    let bool_paths: Vec<&'static str> = vec![
        "/spec/domain/cpu/dedicatedCpuPlacement",
        "/spec/domain/cpu/isolateEmulatorThread",
        "/spec/domain/firmware/bootloader/efi/secureBoot",
        "/spec/domain/devices/autoattachPodInterface",
        "/spec/domain/devices/autoattachVSOCK",
        "/spec/domain/features/hyperv/spinlocks/enabled",
        "/spec/domain/clock/timer/hpet/present",
    ];
    let number = prop_oneof![
        (0u32..6).prop_map(|n| json!(n)),
        any::<u32>().prop_map(|n| json!(n))
    ];
    let scalars = Union::new(vec![
        (prop::sample::select(text_paths), text()).boxed(),
        (prop::sample::select(number_paths), number).boxed(),
        (
            prop::sample::select(bool_paths),
            any::<bool>().prop_map(|b| json!(b)),
        )
            .boxed(),
        (
            Just("/spec/readinessProbe/periodSeconds"),
            any::<i32>().prop_map(|n| json!(n)),
        )
            .boxed(),
    ]);
    let lists = Union::new(vec![
        prop::collection::vec(disk(), 0..4)
            .prop_map(|v| ("/spec/domain/devices/disks", json!(v)))
            .boxed(),
        prop::collection::vec(volume(), 0..4)
            .prop_map(|v| ("/spec/volumes", json!(v)))
            .boxed(),
        prop::collection::vec(iface(), 0..3)
            .prop_map(|v| ("/spec/domain/devices/interfaces", json!(v)))
            .boxed(),
        prop::collection::vec(network(), 0..3)
            .prop_map(|v| ("/spec/networks", json!(v)))
            .boxed(),
    ]);
    prop_oneof![3 => scalars, 2 => lists]
}

fn set_path(doc: &mut Value, path: &str, value: Value) {
    let mut cur = doc;
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    for (i, p) in parts.iter().enumerate() {
        if !cur.is_object() {
            *cur = json!({});
        }
        let map = cur.as_object_mut().unwrap();
        if i + 1 == parts.len() {
            map.insert((*p).to_owned(), value);
            return;
        }
        cur = map.entry((*p).to_owned()).or_insert_with(|| json!({}));
    }
}

fn vmi_doc(edits: &[(&str, Value)]) -> Value {
    let mut doc = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "f", "namespace": "default"},
        "spec": {"domain": {"devices": {}}}
    });
    for (p, v) in edits {
        set_path(&mut doc, p, v.clone());
    }
    doc
}

/// Runs every validator and mutator on `doc`; returns whether it decoded as a VMI.
fn check_vmi(doc: &Value) -> bool {
    let cfg = ClusterConfig::default();
    let Ok(vmi) = serde_json::from_value::<kubevirt_api::v1::VirtualMachineInstance>(doc.clone())
    else {
        return false;
    };
    let _ = validate_vmi_create(&vmi, &cfg, false);
    let mut mutated = vmi.clone();
    if mutate_vmi_create(&mut mutated, &cfg).is_ok() {
        let _ = validate_vmi_create(&mutated, &cfg, false);
        let _ = validate_vmi_update(&vmi, &mutated, true);
        let before = serde_json::to_value(&vmi).unwrap();
        let after = serde_json::to_value(&mutated).unwrap();
        let patch: json_patch::Patch =
            serde_json::from_value(Value::Array(diff(&before, &after))).unwrap();
        let mut applied = before;
        json_patch::patch(&mut applied, &patch).unwrap();
        assert_eq!(applied, after);
    }
    let mut vm: kubevirt_api::v1::VirtualMachine = serde_json::from_value(json!({
        "metadata": {"name": "vm"},
        "spec": {"runStrategy": "Always", "template": {"spec": doc["spec"].clone()}}
    }))
    .unwrap();
    let _ = validate_vm(&vm, &cfg);
    mutate_vm_create(&mut vm, &cfg);
    let _ = validate_vm(&vm, &cfg);
    true
}

fn any_json() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "domain",
                    "devices",
                    "disks",
                    "cpu",
                    "memory",
                    "resources",
                    "requests",
                    "limits",
                    "volumes",
                    "networks",
                    "interfaces",
                    "name",
                    "bus",
                    "disk",
                    "firmware",
                    "features"
                ]),
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn validators_and_mutators_never_panic_on_field_level_edits(edits in prop::collection::vec(field_edit(), 0..12)) {
        let decoded = check_vmi(&vmi_doc(&edits));
        // Field-level edits are well typed, so they always decode and reach the rules.
        prop_assert!(decoded);
    }

    #[test]
    fn validators_never_panic_on_arbitrary_nested_spec_json(spec in any_json()) {
        let mut doc = vmi_doc(&[]);
        doc["spec"] = spec;
        let _ = check_vmi(&doc);
    }
}
