//! `create vm`: prints a VirtualMachine manifest (YAML) built from flags, like upstream.
//! Disks are left to the VMI mutator (one per volume) unless a boot order is given.

use rand::Rng;
use serde_json::{Map, Value, json};

use crate::Error;
use crate::cli::{Create, CreateVm};

/// Runs `create <kind>`.
///
/// # Errors
/// Bad flags.
pub fn run(create: &Create) -> Result<(), Error> {
    let Create::Vm(args) = create;
    let vm = vm_manifest(args)?;
    let yaml = serde_saphyr::to_string(&vm).map_err(|e| Error::Encode(Box::new(e)))?;
    print!("{yaml}");
    Ok(())
}

fn random_suffix() -> String {
    const CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| char::from(CHARS[rng.random_range(0..CHARS.len())]))
        .collect()
}

/// Parses `key:value,key:value` volume parameters.
///
/// # Errors
/// A parameter without `:` or an unknown key.
fn params(flag: &str, raw: &str) -> Result<Map<String, Value>, Error> {
    let mut out = Map::new();
    for part in raw.split(',').filter(|p| !p.is_empty()) {
        let Some((k, v)) = part.split_once(':') else {
            return Err(Error::Message(format!(
                "failed to parse \"--{flag}\" flag: params need to have at least one colon: {part}"
            )));
        };
        if !matches!(k, "src" | "name" | "bootorder") {
            return Err(Error::Message(format!(
                "failed to parse \"--{flag}\" flag: unknown param(s): {part}"
            )));
        }
        out.insert(k.to_owned(), json!(v));
    }
    if !out.contains_key("src") {
        return Err(Error::Message(format!(
            "failed to parse \"--{flag}\" flag: src must be specified"
        )));
    }
    Ok(out)
}

fn matcher(raw: &str, cluster_kind: &str) -> Value {
    match raw.split_once('/') {
        Some((kind, name)) => json!({"kind": kind, "name": name}),
        None => json!({"kind": cluster_kind, "name": raw}),
    }
}

struct Volumes {
    volumes: Vec<Value>,
    disks: Vec<Value>,
}

impl Volumes {
    fn push(&mut self, name: &str, source: Value, boot_order: Option<&Value>) -> Result<(), Error> {
        let mut volume = json!({"name": name});
        if let (Some(v), Value::Object(s)) = (volume.as_object_mut(), source) {
            v.extend(s);
        }
        self.volumes.push(volume);
        if let Some(order) = boot_order {
            let order: u32 = order
                .as_str()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| Error::Message(format!("invalid bootorder: {order}")))?;
            self.disks.push(json!({"bootOrder": order, "name": name}));
        }
        Ok(())
    }
}

fn volumes(args: &CreateVm, name: &str) -> Result<Volumes, Error> {
    let mut vols = Volumes {
        volumes: Vec::new(),
        disks: Vec::new(),
    };
    for (i, raw) in args.volume_containerdisk.iter().enumerate() {
        let p = params("volume-containerdisk", raw)?;
        let vname = p
            .get("name")
            .and_then(Value::as_str)
            .map_or_else(|| format!("{name}-containerdisk-{i}"), str::to_owned);
        vols.push(
            &vname,
            json!({"containerDisk": {"image": p["src"]}}),
            p.get("bootorder"),
        )?;
    }
    for raw in &args.volume_pvc {
        let p = params("volume-pvc", raw)?;
        let src = p["src"].as_str().unwrap_or_default().to_owned();
        let vname = p
            .get("name")
            .and_then(Value::as_str)
            .map_or(src.clone(), str::to_owned);
        vols.push(
            &vname,
            json!({"persistentVolumeClaim": {"claimName": src}}),
            p.get("bootorder"),
        )?;
    }
    let user_data = match (&args.cloud_init_user_data, &args.user) {
        (Some(b64), _) => Some(json!({"userDataBase64": b64})),
        (None, Some(user)) => Some(json!({"userData": format!("#cloud-config\nuser: {user}\n")})),
        (None, None) => None,
    };
    if let Some(source) = user_data {
        vols.push("cloudinitdisk", json!({"cloudInitNoCloud": source}), None)?;
    }
    Ok(vols)
}

/// The VirtualMachine manifest of `args` (keys in upstream's alphabetical output order).
///
/// # Errors
/// Bad volume parameters or run strategy.
pub fn vm_manifest(args: &CreateVm) -> Result<Value, Error> {
    const STRATEGIES: &[&str] = &[
        "Always",
        "Halted",
        "Manual",
        "RerunOnFailure",
        "Once",
        "WaitAsReceiver",
    ];
    if !STRATEGIES.contains(&args.run_strategy.as_str()) {
        return Err(Error::Message(format!(
            "failed to parse \"--run-strategy\" flag: invalid RunStrategy \"{}\", supported values are: {}",
            args.run_strategy,
            STRATEGIES.join(", ")
        )));
    }
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| format!("vm-{}", random_suffix()));
    let vols = volumes(args, &name)?;
    let mut devices = Map::new();
    if !vols.disks.is_empty() {
        devices.insert("disks".into(), json!(vols.disks));
    }
    let mut domain = Map::new();
    domain.insert("devices".into(), Value::Object(devices));
    if args.instancetype.is_none() {
        let memory = args.memory.clone().unwrap_or_else(|| "512Mi".to_owned());
        domain.insert("memory".into(), json!({"guest": memory}));
    }
    domain.insert("resources".into(), json!({}));
    let mut template_spec = Map::new();
    template_spec.insert("domain".into(), Value::Object(domain));
    template_spec.insert(
        "terminationGracePeriodSeconds".into(),
        json!(args.termination_grace_period),
    );
    if !vols.volumes.is_empty() {
        template_spec.insert("volumes".into(), json!(vols.volumes));
    }
    let mut spec = Map::new();
    if let Some(it) = &args.instancetype {
        spec.insert(
            "instancetype".into(),
            matcher(it, "virtualmachineclusterinstancetype"),
        );
    }
    if let Some(pref) = &args.preference {
        spec.insert(
            "preference".into(),
            matcher(pref, "virtualmachineclusterpreference"),
        );
    }
    spec.insert("runStrategy".into(), json!(args.run_strategy));
    spec.insert(
        "template".into(),
        json!({"metadata": {"creationTimestamp": null}, "spec": template_spec}),
    );
    Ok(json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"creationTimestamp": null, "name": name},
        "spec": spec,
        "status": {},
    }))
}

#[cfg(test)]
mod tests {
    use kubevirt_api::v1::{RunStrategy, VirtualMachine};

    use super::*;

    #[test]
    fn created_vm_decodes_as_a_virtual_machine() {
        let args = CreateVm {
            name: Some("my-vm".into()),
            run_strategy: "Halted".into(),
            termination_grace_period: 180,
            volume_containerdisk: vec![
                "src:quay.io/containerdisks/fedora:latest,bootorder:1".into(),
            ],
            ..Default::default()
        };
        let yaml = serde_saphyr::to_string(&vm_manifest(&args).unwrap()).unwrap();
        let vm: VirtualMachine = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(vm.metadata.name.as_deref(), Some("my-vm"));
        assert_eq!(vm.spec.run_strategy, Some(RunStrategy::Halted));
        let spec = vm.spec.template.spec.unwrap();
        assert_eq!(spec.volumes[0].name, "my-vm-containerdisk-0");
        assert_eq!(spec.domain.devices.disks[0].boot_order, Some(1));
        assert_eq!(spec.termination_grace_period_seconds, Some(180));
    }

    #[test]
    fn volume_params_need_a_source() {
        let args = CreateVm {
            run_strategy: "Always".into(),
            volume_pvc: vec!["name:x".into()],
            ..Default::default()
        };
        let Err(Error::Message(m)) = vm_manifest(&args) else {
            panic!("expected an error");
        };
        assert_eq!(
            m,
            "failed to parse \"--volume-pvc\" flag: src must be specified"
        );
    }

    #[test]
    fn instancetype_replaces_the_default_memory() {
        let args = CreateVm {
            run_strategy: "Always".into(),
            instancetype: Some("u1.medium".into()),
            ..Default::default()
        };
        let vm = vm_manifest(&args).unwrap();
        assert_eq!(
            vm["spec"]["instancetype"],
            json!({"kind": "virtualmachineclusterinstancetype", "name": "u1.medium"})
        );
        assert!(vm["spec"]["template"]["spec"]["domain"]["memory"].is_null());
        assert!(vm["metadata"]["name"].as_str().unwrap().starts_with("vm-"));
    }
}
