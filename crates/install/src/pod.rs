//! Pieces of the components' pod templates, as upstream's `newPodTemplateSpec` and
//! `newBaseDeployment` build them.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, HTTPGetAction, PodAffinityTerm, PodAntiAffinity,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, SeccompProfile, SecretVolumeSource,
    SecurityContext, Toleration, Volume, VolumeMount, WeightedPodAffinityTerm,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::InstallConfig;
use crate::meta::{
    ALLOW_ACCESS_CLUSTER_SERVICES_LABEL, APP_LABEL, APP_NAME_LABEL, PRIORITY_CLASS,
    PROMETHEUS_LABEL, labels, namespaced_meta,
};

/// `kubevirt.io: <name>`: the selector of a component's pods.
pub fn selector(name: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels(&[(APP_LABEL, name)])),
        match_expressions: None,
    }
}

/// The pod template of component `name`: upstream's labels, priority class, tolerations and
/// one container running `kubevirt-rs <subcommand> <args…>`.
pub fn template(
    config: &InstallConfig,
    name: &str,
    service_account: &str,
    command: Vec<String>,
    args: Vec<String>,
) -> PodTemplateSpec {
    let container = Container {
        name: name.to_owned(),
        image: Some(config.image(name)),
        image_pull_policy: Some(config.image_pull_policy.clone()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        command: Some(command),
        args: Some(args),
        ..Container::default()
    };
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels(&[
                (APP_LABEL, name),
                (PROMETHEUS_LABEL, "true"),
                (ALLOW_ACCESS_CLUSTER_SERVICES_LABEL, "true"),
            ])),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            priority_class_name: Some(PRIORITY_CLASS.into()),
            tolerations: Some(vec![Toleration {
                key: Some("CriticalAddonsOnly".into()),
                operator: Some("Exists".into()),
                ..Toleration::default()
            }]),
            service_account_name: Some(service_account.to_owned()),
            containers: vec![container],
            ..PodSpec::default()
        }),
    }
}

/// Prefer one replica of `name` per node.
pub fn anti_affinity(name: &str) -> Affinity {
    Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                WeightedPodAffinityTerm {
                    weight: 1,
                    pod_affinity_term: PodAffinityTerm {
                        label_selector: Some(LabelSelector {
                            match_expressions: Some(vec![LabelSelectorRequirement {
                                key: APP_LABEL.into(),
                                operator: "In".into(),
                                values: Some(vec![name.to_owned()]),
                            }]),
                            match_labels: None,
                        }),
                        topology_key: "kubernetes.io/hostname".into(),
                        ..PodAffinityTerm::default()
                    },
                },
            ]),
            ..PodAntiAffinity::default()
        }),
        ..Affinity::default()
    }
}

/// A Deployment of the template with upstream's labels.
pub fn deployment(
    config: &InstallConfig,
    name: &str,
    replicas: i32,
    mut template: PodTemplateSpec,
) -> Deployment {
    if let Some(spec) = template.spec.as_mut() {
        spec.affinity = Some(anti_affinity(name));
    }
    Deployment {
        metadata: namespaced_meta(
            &config.namespace,
            name,
            &[(APP_LABEL, name), (APP_NAME_LABEL, name)],
        ),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: selector(name),
            template,
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

/// Upstream's PodDisruptionBudget of a Deployment: `<name>-pdb`, one replica less.
pub fn disruption_budget(config: &InstallConfig, name: &str, replicas: i32) -> PodDisruptionBudget {
    let pdb = format!("{name}-pdb");
    PodDisruptionBudget {
        metadata: namespaced_meta(&config.namespace, &pdb, &[(APP_LABEL, &pdb)]),
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int((replicas - 1).max(0))),
            selector: Some(selector(name)),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }
}

/// A certificate Secret volume at `mount_path`. The Secrets are virt-operator's to create;
/// the volumes are optional so that the pods start before (or without) it.
pub fn attach_certificate(spec: &mut PodSpec, secret: &str, mount_path: &str) {
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: secret.to_owned(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.to_owned()),
            optional: Some(true),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    });
    mount(spec, secret, mount_path, true);
}

/// Upstream's `profile-data` emptyDir at `/profile-data`.
pub fn attach_profile_volume(spec: &mut PodSpec) {
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: "profile-data".into(),
        empty_dir: Some(Default::default()),
        ..Volume::default()
    });
    mount(spec, "profile-data", "/profile-data", false);
}

/// Mounts volume `name` into the first container.
pub fn mount(spec: &mut PodSpec, name: &str, mount_path: &str, read_only: bool) {
    if let Some(container) = spec.containers.first_mut() {
        container
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(VolumeMount {
                name: name.to_owned(),
                mount_path: mount_path.to_owned(),
                read_only: read_only.then_some(true),
                ..VolumeMount::default()
            });
    }
}

/// Upstream's restricted pod and container security contexts (non-root, no privilege
/// escalation, no capabilities, the runtime's seccomp profile).
pub fn restrict(spec: &mut PodSpec) {
    let seccomp = || {
        Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        })
    };
    spec.security_context = Some(PodSecurityContext {
        run_as_non_root: Some(true),
        seccomp_profile: seccomp(),
        ..PodSecurityContext::default()
    });
    if let Some(container) = spec.containers.first_mut() {
        container.security_context = Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            seccomp_profile: seccomp(),
            ..SecurityContext::default()
        });
    }
}

/// An HTTPS GET probe of `path` on `port`.
pub fn https_probe(port: i32, path: &str) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            scheme: Some("HTTPS".into()),
            port: IntOrString::Int(port),
            path: Some(path.to_owned()),
            ..HTTPGetAction::default()
        }),
        ..Probe::default()
    }
}
