use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::*;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// The files `deploy/` must hold: each group's and the kustomization.
fn expected_files() -> BTreeMap<String, String> {
    let groups = deploy_files(&InstallConfig::default()).unwrap();
    let mut files: BTreeMap<String, String> = groups
        .iter()
        .map(|g| (g.file.to_owned(), render_file(g).unwrap()))
        .collect();
    files.insert("kustomization.yaml".into(), kustomization_yaml(&groups));
    files
}

#[test]
fn committed_deploy_files_are_what_the_code_renders() {
    let dir = deploy_dir();
    let expected = expected_files();
    if std::env::var_os("KUBEVIRT_RS_BLESS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (file, text) in &expected {
            std::fs::write(dir.join(file), text).unwrap();
        }
    }
    let hint = "regenerate with `KUBEVIRT_RS_BLESS=1 cargo nextest run -p kubevirt-install` \
                (or `kubevirt-rs manifests --output-dir deploy`)";
    for (file, text) in &expected {
        let committed = std::fs::read_to_string(dir.join(file))
            .unwrap_or_else(|e| panic!("deploy/{file}: {e}; {hint}"));
        assert!(committed == *text, "deploy/{file} is stale; {hint}");
    }
    let yaml_files: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".yaml"))
        .collect();
    let expected_names: BTreeSet<String> = expected.keys().cloned().collect();
    assert_eq!(yaml_files, expected_names, "stray YAML files in deploy/");
}

/// Decodes `value` as `T` and encodes it again: a field `T` does not know is lost, so the
/// comparison refuses unknown (or misspelled) fields.
fn strict<T: DeserializeOwned + Serialize>(value: &Value) -> Result<(), String> {
    let typed: T = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
    let again = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    if again == *value {
        Ok(())
    } else {
        Err(format!(
            "does not round-trip:\n{}\nbecame\n{}",
            serde_json::to_string_pretty(value).unwrap(),
            serde_json::to_string_pretty(&again).unwrap()
        ))
    }
}

fn strict_by_kind(value: &Value) -> Result<(), String> {
    match value["kind"].as_str().unwrap_or_default() {
        "Namespace" => strict::<Namespace>(value),
        "PriorityClass" => strict::<PriorityClass>(value),
        "ServiceAccount" => strict::<ServiceAccount>(value),
        "CustomResourceDefinition" => strict::<CustomResourceDefinition>(value),
        "ClusterRole" => strict::<ClusterRole>(value),
        "ClusterRoleBinding" => strict::<ClusterRoleBinding>(value),
        "Role" => strict::<Role>(value),
        "RoleBinding" => strict::<RoleBinding>(value),
        "Deployment" => strict::<Deployment>(value),
        "DaemonSet" => strict::<DaemonSet>(value),
        "Service" => strict::<Service>(value),
        "PodDisruptionBudget" => strict::<PodDisruptionBudget>(value),
        "MutatingWebhookConfiguration" => strict::<MutatingWebhookConfiguration>(value),
        "ValidatingWebhookConfiguration" => strict::<ValidatingWebhookConfiguration>(value),
        "APIService" => strict::<APIService>(value),
        "KubeVirt" => strict::<kubevirt_api::v1::KubeVirt>(value),
        other => Err(format!("unexpected kind {other:?}")),
    }
}

#[test]
fn every_rendered_object_decodes_strictly_as_its_kind() {
    let mut count = 0;
    for group in manifests(&InstallConfig::default()).unwrap() {
        let text = render_yaml(&group.objects).unwrap();
        let parsed: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        assert_eq!(
            parsed, group.objects,
            "{}: YAML does not read back",
            group.file
        );
        for object in &parsed {
            strict_by_kind(object)
                .unwrap_or_else(|e| panic!("{}: {}: {e}", group.file, meta::describe(object)));
            count += 1;
        }
    }
    assert!(count > 40, "only {count} objects");
}

#[test]
fn a_misspelled_field_is_refused_by_the_strict_decode() {
    let mut sa = namespace::objects(&InstallConfig::default()).unwrap()[2].clone();
    sa["metadata"]["labelz"] = serde_json::json!({"a": "b"});
    assert!(strict_by_kind(&sa).is_err());
}

#[test]
fn kubectl_kustomize_renders_the_deploy_directory() {
    let out = std::process::Command::new("/usr/bin/kubectl")
        .arg("kustomize")
        .arg(deploy_dir())
        .output()
        .expect("running kubectl");
    assert!(
        out.status.success(),
        "kubectl kustomize failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered: Vec<Value> =
        serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap();
    let key = |o: &Value| meta::describe(o);
    let got: BTreeSet<String> = rendered.iter().map(key).collect();
    let want: BTreeSet<String> = deploy_files(&InstallConfig::default())
        .unwrap()
        .iter()
        .flat_map(|g| g.objects.iter().map(key))
        .collect();
    assert_eq!(got, want);
    assert_eq!(rendered.len(), want.len(), "duplicate objects");
}

fn all_objects(config: &InstallConfig) -> Vec<Value> {
    manifests(config)
        .unwrap()
        .into_iter()
        .flat_map(|g| g.objects)
        .collect()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

#[test]
fn groups_come_in_upstreams_order_with_the_namespace_first_and_the_cr_last() {
    let groups = manifests(&InstallConfig::default()).unwrap();
    let files: Vec<_> = groups.iter().map(|g| g.file).collect();
    assert_eq!(
        files,
        [
            "00-namespace.yaml",
            "10-crds.yaml",
            "20-rbac.yaml",
            "30-virt-api.yaml",
            "40-virt-controller.yaml",
            "50-virt-handler.yaml",
            "60-kubevirt-cr.yaml"
        ]
    );
    assert_eq!(groups[0].objects[0]["kind"], "Namespace");
    assert_eq!(
        groups[0].objects[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "privileged"
    );
    let cr = &groups[6].objects[0];
    assert_eq!(cr["kind"], "KubeVirt");
    assert_eq!(cr["metadata"]["namespace"], "kubevirt");
    assert_eq!(groups[1].objects.len(), 7, "the seven KubeVirt CRDs");
}

#[test]
fn the_operator_manifest_the_strategy_and_the_cr_split_the_rendering_in_upstreams_order() {
    let config = InstallConfig::default();
    let files = deploy_files(&config).unwrap();
    let names: Vec<_> = files.iter().map(|g| g.file).collect();
    assert_eq!(names, ["kubevirt-operator.yaml", "kubevirt-cr.yaml"]);
    let operator = &files[0].objects;
    assert_eq!(operator[0]["kind"], "Namespace");
    let crds: Vec<_> = operator
        .iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
        .map(|o| o["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(crds, ["kubevirts.kubevirt.io"]);
    let deployment = find(operator, "Deployment", "virt-operator");
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(
        deployment["spec"]["template"]["spec"]["serviceAccountName"],
        "kubevirt-operator"
    );
    find(operator, "ClusterRole", "kubevirt-operator");
    find(operator, "RoleBinding", "kubevirt-operator-rolebinding");
    assert_eq!(files[1].objects[0]["kind"], "KubeVirt");

    let strategy = install_strategy(&config).unwrap();
    let key = |o: &Value| meta::describe(o);
    let mut together: Vec<String> = operator
        .iter()
        .chain(&strategy)
        .chain(&files[1].objects)
        .map(key)
        .collect();
    let mut all: Vec<String> = all_objects(&config).iter().map(key).collect();
    all.push("Deployment kubevirt/virt-operator".into());
    // The operator's own webhooks are strategy-only: the full rendering is applied without an
    // operator (then nothing would answer them).
    all.extend(
        crate::virt_operator::strategy_objects(&config)
            .unwrap()
            .iter()
            .map(key),
    );
    together.sort();
    all.sort();
    assert_eq!(together, all, "every object in exactly one place");
    let kinds: Vec<&str> = strategy
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.first(), Some(&"CustomResourceDefinition"));
    assert_eq!(kinds.last(), Some(&"PodDisruptionBudget"));
    let at = |kind: &str, name: &str| {
        strategy
            .iter()
            .position(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap()
    };
    assert!(at("ServiceAccount", "kubevirt-handler") < at("ClusterRole", "kubevirt-handler"));
    assert!(at("DaemonSet", "virt-handler") < at("Deployment", "virt-controller"));
    assert!(at("Deployment", "virt-controller") < at("Deployment", "virt-api"));
    assert!(at("Deployment", "virt-api") < at("APIService", "v1.subresources.kubevirt.io"));
}

#[test]
fn service_accounts_are_the_identities_the_embedded_pki_issues() {
    // crates/apiserver/src/pki.rs `COMPONENTS`.
    let objects = all_objects(&InstallConfig::default());
    for user in [
        "system:serviceaccount:kubevirt:kubevirt-controller",
        "system:serviceaccount:kubevirt:kubevirt-handler",
        "system:serviceaccount:kubevirt:kubevirt-apiserver",
    ] {
        let name = user.rsplit(':').next().unwrap();
        let sa = find(&objects, "ServiceAccount", name);
        assert_eq!(sa["metadata"]["namespace"], "kubevirt");
    }
    find(&objects, "ServiceAccount", "kubevirt-operator");
}

fn rules(object: &Value) -> Vec<Value> {
    object["rules"].as_array().cloned().unwrap_or_default()
}

#[test]
fn no_role_has_wildcards_except_where_upstream_has_them() {
    let objects = all_objects(&InstallConfig::default());
    let mut wildcards = BTreeSet::new();
    for role in objects
        .iter()
        .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role")
    {
        for rule in rules(role) {
            let has_star = |field: &str| {
                rule[field]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|s| s.as_str().unwrap_or("").contains('*')))
            };
            if has_star("verbs") || has_star("resources") || has_star("apiGroups") {
                wildcards.insert((
                    role["metadata"]["name"].as_str().unwrap().to_owned(),
                    rule["apiGroups"].to_string(),
                ));
            }
        }
    }
    // virt-controller owns every kubevirt.io resource and CDI's (the DataVolumes of VM
    // templates); the operator holds what it grants.
    let expected: BTreeSet<(String, String)> = [
        (
            "kubevirt-controller".to_owned(),
            r#"["cdi.kubevirt.io"]"#.to_owned(),
        ),
        (
            "kubevirt-controller".to_owned(),
            r#"["kubevirt.io"]"#.to_owned(),
        ),
        (
            "kubevirt-operator".to_owned(),
            r#"["cdi.kubevirt.io"]"#.to_owned(),
        ),
        (
            "kubevirt-operator".to_owned(),
            r#"["kubevirt.io"]"#.to_owned(),
        ),
    ]
    .into();
    assert_eq!(wildcards, expected);
}

#[test]
fn rules_name_only_api_groups_that_exist_and_the_dropped_ones_are_known() {
    let config = InstallConfig::default();
    let served = rbac::served_groups().unwrap();
    for role in all_objects(&config)
        .iter()
        .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role")
    {
        for rule in rules(role) {
            for group in rule["apiGroups"].as_array().into_iter().flatten() {
                assert!(
                    served.contains(group.as_str().unwrap()),
                    "{group} in {role}"
                );
            }
        }
    }
    let dropped: Vec<String> = rbac::dropped_groups(&config).unwrap().into_iter().collect();
    assert_eq!(
        dropped,
        [
            "backup.kubevirt.io",
            "clone.kubevirt.io",
            "export.kubevirt.io",
            "instancetype.kubevirt.io",
            "k8s.cni.cncf.io",
            "monitoring.coreos.com",
            "plugin.kubevirt.io",
            "route.openshift.io",
            "security.openshift.io",
            "snapshot.kubevirt.io",
            "snapshot.storage.k8s.io",
            "template.kubevirt.io",
        ]
    );
}

/// Whether `role` has a rule granting `verb` on `resource` of `group`.
fn grants(role: &Value, group: &str, resource: &str, verb: &str) -> bool {
    rules(role).iter().any(|r| {
        let has = |field: &str, want: &str| {
            r[field]
                .as_array()
                .is_some_and(|v| v.iter().any(|s| s == want || s == "*"))
        };
        has("apiGroups", group) && has("resources", resource) && has("verbs", verb)
    })
}

#[test]
fn component_roles_grant_what_the_components_do() {
    let objects = all_objects(&InstallConfig::default());
    let controller_role = find(&objects, "Role", "kubevirt-controller");
    assert!(grants(
        controller_role,
        "coordination.k8s.io",
        "leases",
        "update"
    ));
    let controller = find(&objects, "ClusterRole", "kubevirt-controller");
    assert!(grants(controller, "", "pods", "create"));
    assert!(grants(
        controller,
        "kubevirt.io",
        "virtualmachineinstances",
        "patch"
    ));
    assert!(grants(
        controller,
        "pool.kubevirt.io",
        "virtualmachinepools",
        "get"
    ));
    let handler = find(&objects, "ClusterRole", "kubevirt-handler");
    assert!(grants(
        handler,
        "kubevirt.io",
        "virtualmachineinstances",
        "update"
    ));
    assert!(grants(handler, "", "nodes", "patch"));
    assert!(
        !grants(handler, "", "pods", "create"),
        "handler creates no pods"
    );
    assert!(
        grants(handler, "", "secrets", "get"),
        "handler reads a VMI's image pull secret by name"
    );
    assert!(
        !grants(handler, "", "secrets", "list") && !grants(handler, "", "secrets", "watch"),
        "handler cannot list or watch secrets"
    );
    let api = find(&objects, "ClusterRole", "kubevirt-apiserver");
    assert!(grants(api, "kubevirt.io", "virtualmachines", "patch"));
    assert!(!grants(api, "", "secrets", "get"));
    let delegator = find(
        &objects,
        "ClusterRoleBinding",
        "kubevirt-apiserver-auth-delegator",
    );
    assert_eq!(delegator["roleRef"]["name"], "system:auth-delegator");
    let operator_role = find(&objects, "Role", "kubevirt-operator");
    let secrets = rules(operator_role)
        .into_iter()
        .find(|r| r["resources"] == serde_json::json!(["secrets"]))
        .unwrap();
    assert!(
        secrets["resourceNames"]
            .as_array()
            .unwrap()
            .contains(&"kubevirt-ca".into()),
        "the operator's Secrets are named"
    );
}

#[test]
fn user_roles_aggregate_into_kubernetes_admin_edit_and_view() {
    let objects = all_objects(&InstallConfig::default());
    for (name, label) in [
        ("kubevirt.io:admin", "aggregate-to-admin"),
        ("kubevirt.io:edit", "aggregate-to-edit"),
        ("kubevirt.io:view", "aggregate-to-view"),
    ] {
        let role = find(&objects, "ClusterRole", name);
        assert_eq!(
            role["metadata"]["labels"][format!("rbac.authorization.k8s.io/{label}")],
            "true"
        );
        assert!(grants(role, "kubevirt.io", "virtualmachines", "get"));
    }
    let admin = find(&objects, "ClusterRole", "kubevirt.io:admin");
    assert!(grants(
        admin,
        "subresources.kubevirt.io",
        "virtualmachines/start",
        "update"
    ));
    assert!(grants(
        admin,
        "kubevirt.io",
        "virtualmachines",
        "deletecollection"
    ));
    let view = find(&objects, "ClusterRole", "kubevirt.io:view");
    assert!(!grants(view, "kubevirt.io", "virtualmachines", "create"));
    assert!(!grants(
        view,
        "subresources.kubevirt.io",
        "virtualmachineinstances/console",
        "get"
    ));
    for name in ["kubevirt.io:default", "instancetype.kubevirt.io:view"] {
        let binding = find(&objects, "ClusterRoleBinding", name);
        assert_eq!(binding["subjects"][0]["name"], "system:authenticated");
        assert_eq!(binding["subjects"][0]["kind"], "Group");
    }
}

#[test]
fn virt_api_is_two_replicas_behind_its_service_webhooks_and_api_services() {
    let objects = all_objects(&InstallConfig::default());
    let d = find(&objects, "Deployment", "virt-api");
    assert_eq!(d["spec"]["replicas"], 2);
    let pod = &d["spec"]["template"];
    assert_eq!(pod["metadata"]["labels"]["kubevirt.io"], "virt-api");
    assert_eq!(pod["metadata"]["labels"]["prometheus.kubevirt.io"], "true");
    let c = &pod["spec"]["containers"][0];
    assert_eq!(c["command"], serde_json::json!(["kubevirt-rs", "api"]));
    assert_eq!(c["ports"][0]["containerPort"], 8443);
    assert_eq!(
        c["readinessProbe"]["httpGet"]["path"],
        "/apis/subresources.kubevirt.io/v1/healthz"
    );
    assert_eq!(
        c["image"],
        format!("kubevirt-rs/virt-api:{}", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(pod["spec"]["serviceAccountName"], "kubevirt-apiserver");
    let svc = find(&objects, "Service", "virt-api");
    assert_eq!(svc["spec"]["ports"][0]["port"], 443);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], 8443);
    assert_eq!(svc["spec"]["selector"]["kubevirt.io"], "virt-api");
    for (kind, name) in [
        ("MutatingWebhookConfiguration", "virt-api-mutator"),
        ("ValidatingWebhookConfiguration", "virt-api-validator"),
    ] {
        for hook in find(&objects, kind, name)["webhooks"].as_array().unwrap() {
            let client = &hook["clientConfig"];
            assert_eq!(client["service"]["name"], "virt-api");
            assert_eq!(client["service"]["namespace"], "kubevirt");
            assert!(client["service"]["path"].as_str().unwrap().starts_with('/'));
            assert!(client.get("caBundle").is_none() && client.get("url").is_none());
        }
    }
    for version in ["v1", "v1alpha3"] {
        let s = find(
            &objects,
            "APIService",
            &format!("{version}.subresources.kubevirt.io"),
        );
        assert_eq!(s["spec"]["service"]["name"], "virt-api");
        assert_eq!(s["spec"]["version"], version);
    }
    let pdb = find(&objects, "PodDisruptionBudget", "virt-api-pdb");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    let metrics = find(&objects, "Service", "kubevirt-prometheus-metrics");
    assert_eq!(metrics["spec"]["clusterIP"], "None");
}

#[test]
fn virt_controller_runs_the_controller_subcommand_with_the_launcher_image() {
    let objects = all_objects(&InstallConfig::default());
    let d = find(&objects, "Deployment", "virt-controller");
    assert_eq!(d["spec"]["replicas"], 2);
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        c["command"],
        serde_json::json!(["kubevirt-rs", "controller"])
    );
    let launcher = format!("kubevirt-rs/virt-launcher:{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(
        c["args"],
        serde_json::json!([
            "--launcher-image",
            launcher,
            "--namespace",
            "kubevirt",
            "--port",
            "8443"
        ])
    );
    assert_eq!(c["ports"][0]["name"], "metrics");
    find(&objects, "PodDisruptionBudget", "virt-controller-pdb");
}

#[test]
fn virt_handler_is_a_privileged_daemon_set_with_the_shared_host_directories() {
    let objects = all_objects(&InstallConfig::default());
    let ds = find(&objects, "DaemonSet", "virt-handler");
    assert_eq!(ds["metadata"]["labels"]["kubevirt.io"], "virt-handler");
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["hostPID"], true);
    assert_eq!(spec["tolerations"][0]["key"], "CriticalAddonsOnly");
    let c = &spec["containers"][0];
    assert_eq!(c["securityContext"]["privileged"], true);
    assert_eq!(c["command"], serde_json::json!(["kubevirt-rs", "handler"]));
    let host_paths: BTreeMap<&str, &str> = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| Some((v["name"].as_str()?, v["hostPath"]["path"].as_str()?)))
        .collect();
    assert_eq!(host_paths["virt-share-dir"], "/var/run/kubevirt");
    assert_eq!(host_paths["virt-private-dir"], "/var/run/kubevirt-private");
    assert_eq!(host_paths["kubelet-pods"], "/var/lib/kubelet/pods");
    let pods_mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "kubelet-pods")
        .unwrap();
    assert_eq!(pods_mount["mountPropagation"], "HostToContainer");
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let pods_dir = args
        .iter()
        .position(|a| *a == "--kubelet-pods-dir")
        .unwrap();
    assert_eq!(args[pods_dir + 1], pods_mount["mountPath"]);
}

#[test]
fn the_configuration_reaches_every_object() {
    let config = InstallConfig {
        namespace: "kv".into(),
        image_registry: "registry.example/kv/".into(),
        image_prefix: "rs-".into(),
        image_tag: "v9".into(),
        image_pull_policy: "Always".into(),
        api_replicas: 3,
        controller_replicas: 1,
        launcher_image: None,
        extra_args: ComponentArgs {
            api: vec![],
            controller: flags_to_args(&BTreeMap::from([
                (
                    "additional-launcher-labels-sync".to_owned(),
                    "team".to_owned(),
                ),
                ("use-emulation".to_owned(), "True".to_owned()),
            ])),
            handler: vec!["--use-emulation".into(), "true".into()],
        },
    };
    let objects = all_objects(&config);
    for o in &objects {
        if let Some(ns) = o["metadata"]["namespace"].as_str() {
            assert_eq!(ns, "kv", "{}", meta::describe(o));
        }
    }
    let text = serde_json::to_string(&objects).unwrap();
    assert!(!text.contains(r#""namespace":"kubevirt""#));
    let api = find(&objects, "Deployment", "virt-api");
    assert_eq!(api["spec"]["replicas"], 3);
    let c = &api["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "registry.example/kv/rs-virt-api:v9");
    assert_eq!(c["imagePullPolicy"], "Always");
    let ctl = find(&objects, "Deployment", "virt-controller");
    let args = &ctl["spec"]["template"]["spec"]["containers"][0]["args"];
    assert_eq!(
        *args,
        serde_json::json!([
            "--launcher-image",
            "registry.example/kv/rs-virt-launcher:v9",
            "--namespace",
            "kv",
            "--port",
            "8443",
            "--additional-launcher-labels-sync",
            "team",
            "--use-emulation=true"
        ])
    );
    assert_eq!(
        find(&objects, "PodDisruptionBudget", "virt-controller-pdb")["spec"]["minAvailable"],
        0
    );
    let ds = find(&objects, "DaemonSet", "virt-handler");
    let handler_args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap();
    assert_eq!(
        handler_args[handler_args.len() - 2..],
        ["--use-emulation", "true"]
    );
    let hook = &find(
        &objects,
        "ValidatingWebhookConfiguration",
        "virt-api-validator",
    )["webhooks"][0];
    assert_eq!(hook["clientConfig"]["service"]["namespace"], "kv");
    let binding = find(&objects, "ClusterRoleBinding", "kubevirt-handler");
    assert_eq!(binding["subjects"][0]["namespace"], "kv");
    assert_eq!(find(&objects, "Namespace", "kv")["kind"], "Namespace");
}

#[test]
fn an_explicit_launcher_image_is_passed_as_is() {
    let config = InstallConfig {
        launcher_image: Some("quay.io/x/launcher@sha256:abc".into()),
        ..InstallConfig::default()
    };
    assert_eq!(
        virt_controller::args(&config)[..2],
        ["--launcher-image", "quay.io/x/launcher@sha256:abc"]
    );
    let bare = InstallConfig {
        image_registry: String::new(),
        ..InstallConfig::default()
    };
    assert_eq!(
        bare.image("virt-handler"),
        format!("virt-handler:{}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn an_extra_flag_overrides_the_generated_one_instead_of_repeating_it() {
    let config = InstallConfig {
        extra_args: ComponentArgs {
            api: vec!["--port=9443".into()],
            controller: vec!["--namespace".into(), "other".into()],
            handler: flags_to_args(&BTreeMap::from([(
                "Listen".to_owned(),
                "127.0.0.1:1".to_owned(),
            )])),
        },
        ..InstallConfig::default()
    };
    assert_eq!(
        virt_api::args(&config),
        ["--console-server-port", "8186", "--port=9443"]
    );
    let controller = virt_controller::args(&config);
    assert_eq!(controller[2..], ["--port", "8443", "--namespace", "other"]);
    assert_eq!(controller.iter().filter(|a| *a == "--namespace").count(), 1);
    let handler = virt_handler::args(&config);
    assert_eq!(handler[handler.len() - 2..], ["--listen", "127.0.0.1:1"]);
    assert_eq!(handler.iter().filter(|a| *a == "--listen").count(), 1);
    assert_eq!(
        flags_to_args(&BTreeMap::from([
            ("b".to_owned(), String::new()),
            ("a".to_owned(), "FALSE".to_owned()),
        ])),
        ["--a=false", "--b"]
    );
}
