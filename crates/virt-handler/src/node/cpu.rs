//! CPU and machine-type labels from QEMU's own answers (pure).
//!
//! Upstream's node labeller reads libvirt's domain capabilities; libvirt builds them from
//! QEMU's QMP answers. Here the handler asks QEMU directly ([`super::probe`]) and
//! [`cpu_labels`] turns the recorded answers into upstream's labels:
//!
//! - `cpu-model.node.kubevirt.io/<m>`: the named models QEMU can run here
//!   (`query-cpu-definitions` with no `unavailable-features`), without the obsolete ones;
//! - `cpu-model-migration.node.kubevirt.io/<m>`: every named model QEMU knows, without the
//!   obsolete ones (upstream labels libvirt's whole custom-model list, usable or not);
//! - `cpu-feature.node.kubevirt.io/<f>`: the features of the host CPU as QEMU exposes it
//!   (`query-cpu-model-expansion type=static` of `host`, or of `max` under TCG), in
//!   libvirt's spelling;
//! - `host-model-cpu.node.kubevirt.io/<m>`: libvirt's host model, the usable named model
//!   closest to the host CPU (the most features, none missing), and
//!   `host-model-required-features.node.kubevirt.io/<f>` for the host features it lacks;
//!   `node-labeller.kubevirt.io/obsolete-host-model` when that model is obsolete;
//! - `cpu-vendor.node.kubevirt.io/<v>`: the host CPU's vendor as libvirt names it;
//! - `machine-type.node.kubevirt.io/<t>`: every machine type of `query-machines` and its
//!   alias (`q35`, `pc`), except `none`, as libvirt lists them.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

/// Label prefix of CPU features.
pub const CPU_FEATURE_PREFIX: &str = kubevirt_api::constants::CPU_FEATURE_LABEL_PREFIX;
/// Label prefix of usable CPU models.
pub const CPU_MODEL_PREFIX: &str = kubevirt_api::constants::CPU_MODEL_LABEL_PREFIX;
/// Label prefix of the models a host-model guest may migrate to.
pub const CPU_MODEL_MIGRATION_PREFIX: &str = "cpu-model-migration.node.kubevirt.io/";
/// Label prefix of the host CPU model.
pub const HOST_MODEL_PREFIX: &str = "host-model-cpu.node.kubevirt.io/";
/// Label prefix of the features the host model needs on top of its named model.
pub const HOST_MODEL_REQUIRED_FEATURES_PREFIX: &str =
    "host-model-required-features.node.kubevirt.io/";
/// Label prefix of the CPU vendor.
pub const CPU_VENDOR_PREFIX: &str = "cpu-vendor.node.kubevirt.io/";
/// Label prefix of supported machine types.
pub const MACHINE_TYPE_PREFIX: &str = "machine-type.node.kubevirt.io/";
/// Set when the host model is one of the obsolete models.
pub const OBSOLETE_HOST_MODEL_LABEL: &str = "node-labeller.kubevirt.io/obsolete-host-model";

/// Upstream's default `obsoleteCPUModels` (used when the KubeVirt CR sets none).
pub const DEFAULT_OBSOLETE_CPU_MODELS: &[&str] = &[
    "486",
    "486-v1",
    "pentium",
    "pentium-v1",
    "pentium2",
    "pentium2-v1",
    "pentium3",
    "pentium3-v1",
    "pentiumpro",
    "pentiumpro-v1",
    "coreduo",
    "coreduo-v1",
    "n270",
    "n270-v1",
    "core2duo",
    "core2duo-v1",
    "Conroe",
    "Conroe-v1",
    "athlon",
    "athlon-v1",
    "phenom",
    "phenom-v1",
    "qemu64",
    "qemu64-v1",
    "qemu32",
    "qemu32-v1",
    "kvm64",
    "kvm64-v1",
    "kvm32",
    "kvm32-v1",
    "Opteron_G1",
    "Opteron_G1-v1",
    "Opteron_G2",
    "Opteron_G2-v1",
];

/// The obsolete models in effect: the CR's `obsoleteCPUModels` keys, or upstream's default
/// when the CR sets none (upstream checks key presence, not the value).
pub fn obsolete_models(configured: Option<&BTreeMap<String, bool>>) -> BTreeSet<String> {
    match configured {
        Some(models) if !models.is_empty() => models.keys().cloned().collect(),
        _ => DEFAULT_OBSOLETE_CPU_MODELS
            .iter()
            .map(|m| (*m).to_owned())
            .collect(),
    }
}

/// QEMU's answers the labels are computed from, as recorded by [`super::probe`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QemuCpuAnswers {
    /// The `return` of `query-cpu-definitions`.
    pub definitions: Value,
    /// The `return` of `query-machines`.
    pub machines: Value,
    /// The `return` of `query-cpu-model-expansion` (`static`) of the host CPU.
    pub host: Value,
    /// The `return` of `query-cpu-model-expansion` (`static`) of each usable named model.
    pub models: BTreeMap<String, Value>,
}

impl QemuCpuAnswers {
    /// The answers as one JSON document (the recorded form under `testdata/`).
    pub fn to_json(&self) -> Value {
        json!({
            "query-cpu-definitions": self.definitions,
            "query-machines": self.machines,
            "host": self.host,
            "models": self.models,
        })
    }

    /// Reads the form [`QemuCpuAnswers::to_json`] writes.
    pub fn from_json(doc: &Value) -> Self {
        Self {
            definitions: doc["query-cpu-definitions"].clone(),
            machines: doc["query-machines"].clone(),
            host: doc["host"].clone(),
            models: doc["models"]
                .as_object()
                .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default(),
        }
    }
}

/// Models QEMU lists that are not named models (libvirt lists none of them).
const NOT_NAMED: &[&str] = &["host", "max", "base"];

/// A named model of `query-cpu-definitions` and whether it runs here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuDefinition {
    /// QEMU's name.
    pub name: String,
    /// No feature of it is unavailable.
    pub usable: bool,
}

/// The named models of a `query-cpu-definitions` answer.
pub fn named_models(definitions: &Value) -> Vec<CpuDefinition> {
    definitions
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| {
            let name = d["name"].as_str()?;
            if NOT_NAMED.contains(&name) {
                return None;
            }
            let usable = d["unavailable-features"]
                .as_array()
                .is_none_or(Vec::is_empty);
            Some(CpuDefinition {
                name: name.to_owned(),
                usable,
            })
        })
        .collect()
}

/// QEMU property names whose libvirt feature name differs.
const LIBVIRT_SPELLING: &[(&str, &str)] = &[
    ("pclmulqdq", "pclmuldq"),
    ("lahf-lm", "lahf_lm"),
    ("fxsr-opt", "fxsr_opt"),
    ("cmp-legacy", "cmp_legacy"),
    ("nodeid-msr", "nodeid_msr"),
    ("perfctr-core", "perfctr_core"),
    ("perfctr-nb", "perfctr_nb"),
    ("tsc-adjust", "tsc_adjust"),
    ("ds-cpl", "ds_cpl"),
];

/// Property prefixes of a static expansion that are not CPUID features libvirt labels
/// (VMX capabilities, KVM paravirtual and Hyper-V enlightenments).
const NOT_FEATURES: &[&str] = &["vmx-", "kvm-", "hv-"];

/// The enabled CPU features of a static expansion, in libvirt's spelling.
pub fn expansion_features(expansion: &Value) -> BTreeSet<String> {
    expansion
        .pointer("/model/props")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(name, value)| {
            value.as_bool() == Some(true) && !NOT_FEATURES.iter().any(|p| name.starts_with(p))
        })
        .map(|(name, _)| {
            LIBVIRT_SPELLING
                .iter()
                .find(|(qemu, _)| qemu == name)
                .map_or_else(|| name.clone(), |(_, libvirt)| (*libvirt).to_owned())
        })
        .collect()
}

/// libvirt's vendor name for a CPUID vendor string.
fn vendor_name(cpuid_vendor: &str) -> &str {
    match cpuid_vendor {
        "GenuineIntel" => "Intel",
        "AuthenticAMD" => "AMD",
        "HygonGenuine" => "Hygon",
        other => other,
    }
}

/// Whether `name` ends in a QEMU model version (`-v1`, `-v12`).
fn is_versioned(name: &str) -> bool {
    name.rsplit_once("-v")
        .is_some_and(|(_, v)| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
}

/// The host model: among the expanded usable models whose features the host has, the one
/// with the most features; on a tie an unversioned name, then the shorter, then the first.
pub fn host_model<'a>(
    host_features: &BTreeSet<String>,
    models: &'a BTreeMap<String, Value>,
) -> Option<(&'a str, BTreeSet<String>)> {
    models
        .iter()
        .map(|(name, expansion)| (name.as_str(), expansion_features(expansion)))
        .filter(|(_, features)| features.is_subset(host_features))
        .min_by(|(a, fa), (b, fb)| {
            fb.len()
                .cmp(&fa.len())
                .then(is_versioned(a).cmp(&is_versioned(b)))
                .then(a.len().cmp(&b.len()))
                .then(a.cmp(b))
        })
}

/// Whether `name` may follow a label prefix (a label name: at most 63 characters of
/// `[A-Za-z0-9._-]`, alphanumeric at both ends).
fn valid_label_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(b))
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
}

/// The CPU and machine-type labels of this node; see the module documentation.
pub fn cpu_labels(
    answers: &QemuCpuAnswers,
    obsolete: &BTreeSet<String>,
) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut obsolete_host = false;
    let mut set = |prefix: &str, name: &str| {
        if valid_label_name(name) {
            labels.insert(format!("{prefix}{name}"), "true".to_owned());
        }
    };
    for model in named_models(&answers.definitions) {
        if obsolete.contains(&model.name) {
            continue;
        }
        if model.usable {
            set(CPU_MODEL_PREFIX, &model.name);
        }
        set(CPU_MODEL_MIGRATION_PREFIX, &model.name);
    }
    let host_features = expansion_features(&answers.host);
    for feature in &host_features {
        set(CPU_FEATURE_PREFIX, feature);
    }
    if let Some((model, model_features)) = host_model(&host_features, &answers.models) {
        set(HOST_MODEL_PREFIX, model);
        for feature in host_features.difference(&model_features) {
            set(HOST_MODEL_REQUIRED_FEATURES_PREFIX, feature);
        }
        obsolete_host = obsolete.contains(model);
    }
    if let Some(vendor) = answers
        .host
        .pointer("/model/props/vendor")
        .and_then(Value::as_str)
    {
        set(CPU_VENDOR_PREFIX, vendor_name(vendor));
    }
    for machine in answers.machines.as_array().into_iter().flatten() {
        for key in ["name", "alias"] {
            if let Some(name) = machine[key].as_str()
                && name != "none"
            {
                set(MACHINE_TYPE_PREFIX, name);
            }
        }
    }
    if obsolete_host {
        labels.insert(OBSOLETE_HOST_MODEL_LABEL.to_owned(), "true".to_owned());
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    /// QEMU 7.2's answers under TCG (`max` stands for the host CPU), recorded with
    /// [`super::super::probe`].
    fn tcg_answers() -> QemuCpuAnswers {
        let text = include_str!("../../testdata/qemu-cpu/qemu-7.2-tcg.json");
        QemuCpuAnswers::from_json(&serde_json::from_str(text).expect("recorded answers"))
    }

    fn defaults() -> BTreeSet<String> {
        obsolete_models(None)
    }

    #[test]
    fn usable_models_are_labelled_and_obsolete_ones_are_not() {
        let labels = cpu_labels(&tcg_answers(), &defaults());
        assert_eq!(labels["cpu-model.node.kubevirt.io/Westmere"], "true");
        assert_eq!(labels["cpu-model.node.kubevirt.io/Penryn"], "true");
        for obsolete in ["qemu64", "qemu64-v1", "kvm64", "pentium", "Opteron_G2"] {
            let key = format!("cpu-model.node.kubevirt.io/{obsolete}");
            assert!(!labels.contains_key(&key), "{key}");
        }
        // Unusable under TCG (features missing), yet known: a migration target label only.
        assert!(!labels.contains_key("cpu-model.node.kubevirt.io/Skylake-Client"));
        assert_eq!(
            labels["cpu-model-migration.node.kubevirt.io/Skylake-Client"],
            "true"
        );
        assert!(!labels.contains_key("cpu-model-migration.node.kubevirt.io/qemu64"));
        assert!(
            !labels
                .keys()
                .any(|k| k.ends_with("/host") || k.ends_with("/max"))
        );
    }

    #[test]
    fn features_come_from_the_host_expansion_in_libvirt_spelling() {
        let labels = cpu_labels(&tcg_answers(), &defaults());
        for feature in ["sse4.2", "pclmuldq", "lahf_lm", "avx2", "svm", "hypervisor"] {
            let key = format!("cpu-feature.node.kubevirt.io/{feature}");
            assert_eq!(labels.get(&key).map(String::as_str), Some("true"), "{key}");
        }
        assert!(!labels.contains_key("cpu-feature.node.kubevirt.io/pclmulqdq"));
        assert!(
            !labels
                .keys()
                .any(|k| k.starts_with(CPU_FEATURE_PREFIX) && k.contains("vmx-"))
        );
    }

    #[test]
    fn host_model_is_the_closest_usable_model_and_the_rest_are_required_features() {
        let answers = tcg_answers();
        let labels = cpu_labels(&answers, &defaults());
        let host_models: Vec<_> = labels
            .keys()
            .filter_map(|k| k.strip_prefix(HOST_MODEL_PREFIX))
            .collect();
        assert_eq!(host_models.len(), 1, "{host_models:?}");
        let model = host_models[0];
        assert!(!is_versioned(model), "{model}");
        assert_eq!(labels[&format!("{CPU_MODEL_PREFIX}{model}")], "true");
        let host = expansion_features(&answers.host);
        let own = expansion_features(&answers.models[model]);
        let required: BTreeSet<_> = labels
            .keys()
            .filter_map(|k| k.strip_prefix(HOST_MODEL_REQUIRED_FEATURES_PREFIX))
            .map(str::to_owned)
            .collect();
        assert_eq!(required, host.difference(&own).cloned().collect());
        assert!(!required.is_empty());
        assert!(!labels.contains_key(OBSOLETE_HOST_MODEL_LABEL));
    }

    #[test]
    fn an_obsolete_host_model_is_flagged() {
        let answers = tcg_answers();
        let model = host_model(&expansion_features(&answers.host), &answers.models)
            .expect("host model")
            .0
            .to_owned();
        let obsolete = obsolete_models(Some(&BTreeMap::from([(model.clone(), true)])));
        let labels = cpu_labels(&answers, &obsolete);
        assert_eq!(labels[OBSOLETE_HOST_MODEL_LABEL], "true");
        assert!(!labels.contains_key(&format!("{CPU_MODEL_PREFIX}{model}")));
        // A configured list replaces the default one.
        assert_eq!(labels["cpu-model.node.kubevirt.io/qemu64"], "true");
    }

    #[test]
    fn vendor_and_machine_types_with_their_aliases() {
        let labels = cpu_labels(&tcg_answers(), &defaults());
        assert_eq!(labels["cpu-vendor.node.kubevirt.io/AMD"], "true");
        for machine in ["q35", "pc", "pc-q35-7.2", "pc-i440fx-7.2", "pc-q35-4.0.1"] {
            let key = format!("machine-type.node.kubevirt.io/{machine}");
            assert_eq!(labels.get(&key).map(String::as_str), Some("true"), "{key}");
        }
        assert!(!labels.contains_key("machine-type.node.kubevirt.io/none"));
    }

    #[test]
    fn empty_answers_give_no_labels_and_odd_names_are_skipped() {
        assert!(cpu_labels(&QemuCpuAnswers::default(), &defaults()).is_empty());
        let answers = QemuCpuAnswers {
            definitions: json!([{"name": "bad/name", "unavailable-features": []}]),
            machines: json!([{"name": "-x"}]),
            ..QemuCpuAnswers::default()
        };
        assert!(cpu_labels(&answers, &defaults()).is_empty());
        assert!(is_versioned("Westmere-v1") && !is_versioned("Westmere-IBRS"));
    }
}
