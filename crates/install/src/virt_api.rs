//! `30-virt-api.yaml`: virt-api's Deployment, the `virt-api` Service (443 → 8443), the shared
//! metrics Service `kubevirt-prometheus-metrics`, the PodDisruptionBudget `virt-api-pdb`,
//! the webhook configurations `virt-api-mutator`/`virt-api-validator` (virt-api's own,
//! [`virt_api::webhook::webhook_configurations_for`], pointed at the Service) and the
//! APIServices of `subresources.kubevirt.io` (`v1`, `v1alpha3`).
//!
//! The webhook configurations and APIServices carry no `caBundle`: the CA belongs to whoever
//! issues virt-api's certificate (virt-operator, or the embedded server), which injects it.
//!
//! The container runs `kubevirt-rs api` with upstream's `--port 8443 --console-server-port
//! 8186`; that subcommand is not written yet (the embedded server runs virt-api in-process).

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{
    ContainerPort, ResourceRequirements, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::{
    APIService, APIServiceSpec, ServiceReference,
};
use serde_json::Value;
use virt_api::webhook::WebhookTarget;

use crate::meta::{
    APP_LABEL, MANAGED_BY_LABEL, MANAGED_BY_OPERATOR, PROMETHEUS_LABEL, cluster_meta, labels,
    namespaced_meta, strings,
};
use crate::namespace::API_SERVICE_ACCOUNT;
use crate::pod::{self, attach_certificate, attach_profile_volume, https_probe, restrict};
use crate::{BINARY, InstallConfig, InstallError, to_value};

/// virt-api's name (Deployment, Service, container, `kubevirt.io` label).
pub const NAME: &str = "virt-api";
/// virt-api's HTTPS port (webhooks, subresources, metrics).
pub const PORT: i32 = 8443;
/// The Secret of virt-api's serving certificate.
pub const CERT_SECRET: &str = "kubevirt-virt-api-certs";
/// The Secret of virt-handler's client certificate, which virt-api uses towards handlers.
pub const HANDLER_CLIENT_CERT_SECRET: &str = "kubevirt-virt-handler-certs";

/// The container's arguments: upstream's, then the configured extra ones (which override).
#[must_use]
pub fn args(config: &InstallConfig) -> Vec<String> {
    crate::merge_args(
        &[
            ("--port", PORT.to_string()),
            ("--console-server-port", "8186".to_owned()),
        ],
        &config.extra_args.api,
    )
}

/// virt-api's Deployment.
#[must_use]
pub fn deployment(config: &InstallConfig) -> k8s_openapi::api::apps::v1::Deployment {
    let mut template = pod::template(
        config,
        NAME,
        API_SERVICE_ACCOUNT,
        strings(&[BINARY, "api"]),
        args(config),
    );
    template.metadata.get_or_insert_default().annotations =
        Some(labels(&[("openshift.io/required-scc", "restricted-v2")]));
    if let Some(spec) = template.spec.as_mut() {
        attach_certificate(spec, CERT_SECRET, "/etc/virt-api/certificates");
        attach_certificate(
            spec,
            HANDLER_CLIENT_CERT_SECRET,
            "/etc/virt-handler/clientcertificates",
        );
        attach_profile_volume(spec);
        restrict(spec);
        if let Some(c) = spec.containers.first_mut() {
            c.ports = Some(vec![tcp_port(NAME, PORT), tcp_port("metrics", PORT)]);
            // Deviation: upstream waits 15 s before the first probe and probes every 10 s,
            // so a new virt-api takes at least 15 s to be Ready; probing every second from
            // the start makes it Ready about a second after it listens.
            c.readiness_probe = Some(k8s_openapi::api::core::v1::Probe {
                period_seconds: Some(1),
                ..https_probe(PORT, "/apis/subresources.kubevirt.io/v1/healthz")
            });
            c.resources = Some(requests("5m", "500Mi"));
        }
    }
    pod::deployment(config, NAME, config.api_replicas, template)
}

/// A named TCP container port.
pub(crate) fn tcp_port(name: &str, port: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.to_owned()),
        protocol: Some("TCP".into()),
        container_port: port,
        ..ContainerPort::default()
    }
}

/// CPU and memory requests.
pub(crate) fn requests(cpu: &str, memory: &str) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(
            [
                ("cpu".to_owned(), Quantity(cpu.to_owned())),
                ("memory".to_owned(), Quantity(memory.to_owned())),
            ]
            .into(),
        ),
        ..ResourceRequirements::default()
    }
}

/// The `virt-api` Service: 443 → 8443.
#[must_use]
pub fn service(config: &InstallConfig) -> Service {
    Service {
        metadata: namespaced_meta(&config.namespace, NAME, &[(APP_LABEL, NAME)]),
        spec: Some(ServiceSpec {
            selector: Some(labels(&[(APP_LABEL, NAME)])),
            ports: Some(vec![ServicePort {
                port: 443,
                target_port: Some(IntOrString::Int(PORT)),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            type_: Some("ClusterIP".into()),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// `kubevirt-prometheus-metrics`: a headless Service over every pod labelled
/// `prometheus.kubevirt.io: "true"`, port `metrics`.
#[must_use]
pub fn prometheus_service(config: &InstallConfig) -> Service {
    Service {
        metadata: namespaced_meta(
            &config.namespace,
            "kubevirt-prometheus-metrics",
            &[(APP_LABEL, ""), (PROMETHEUS_LABEL, "true")],
        ),
        spec: Some(ServiceSpec {
            selector: Some(labels(&[(PROMETHEUS_LABEL, "true")])),
            ports: Some(vec![ServicePort {
                name: Some("metrics".into()),
                port: 443,
                target_port: Some(IntOrString::String("metrics".into())),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            type_: Some("ClusterIP".into()),
            cluster_ip: Some("None".into()),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// The webhook configurations, pointing at the `virt-api` Service, without `caBundle`.
///
/// # Errors
///
/// [`InstallError::Encode`] if virt-api's configurations do not decode (a bug).
pub fn webhook_configurations(
    config: &InstallConfig,
) -> Result<(MutatingWebhookConfiguration, ValidatingWebhookConfiguration), InstallError> {
    let target = WebhookTarget::Service {
        namespace: config.namespace.clone(),
        name: NAME.into(),
        port: 443,
    };
    let (mut mutating, mut validating) =
        virt_api::webhook::webhook_configurations_for(&[], &target);
    for configuration in [&mut mutating, &mut validating] {
        for hook in configuration["webhooks"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            if let Some(client) = hook["clientConfig"].as_object_mut() {
                client.remove("caBundle");
            }
        }
    }
    Ok((
        decode("MutatingWebhookConfiguration", mutating)?,
        decode("ValidatingWebhookConfiguration", validating)?,
    ))
}

/// Decodes a JSON object as `T`.
fn decode<T: serde::de::DeserializeOwned>(what: &str, value: Value) -> Result<T, InstallError> {
    serde_json::from_value(value).map_err(|source| InstallError::Encode {
        what: what.to_owned(),
        source,
    })
}

/// The APIServices of `subresources.kubevirt.io`, one per served version.
#[must_use]
pub fn api_services(config: &InstallConfig) -> Vec<APIService> {
    virt_api::subresources::discovery::VERSIONS
        .iter()
        .map(|version| {
            let mut metadata = cluster_meta(
                &format!("{version}.{}", virt_api::subresources::GROUP),
                &[
                    (APP_LABEL, "virt-api-aggregator"),
                    (MANAGED_BY_LABEL, MANAGED_BY_OPERATOR),
                ],
            );
            metadata.annotations =
                Some(labels(&[("certificates.kubevirt.io/secret", CERT_SECRET)]));
            APIService {
                metadata,
                spec: Some(APIServiceSpec {
                    group: Some(virt_api::subresources::GROUP.into()),
                    version: Some((*version).to_owned()),
                    group_priority_minimum: 1000,
                    version_priority: 15,
                    service: Some(ServiceReference {
                        namespace: Some(config.namespace.clone()),
                        name: Some(NAME.into()),
                        port: None,
                    }),
                    ca_bundle: None::<ByteString>,
                    insecure_skip_tls_verify: None,
                }),
                status: None,
            }
        })
        .collect()
}

/// The group's objects.
///
/// # Errors
///
/// [`InstallError::Encode`] (a bug in the types).
pub fn objects(config: &InstallConfig) -> Result<Vec<Value>, InstallError> {
    let (mutating, validating) = webhook_configurations(config)?;
    let mut out = vec![
        to_value(
            "Service kubevirt-prometheus-metrics",
            &prometheus_service(config),
        )?,
        to_value("Service virt-api", &service(config))?,
        to_value("Deployment virt-api", &deployment(config))?,
        to_value(
            "PodDisruptionBudget virt-api-pdb",
            &pod::disruption_budget(config, NAME, config.api_replicas),
        )?,
        to_value("MutatingWebhookConfiguration", &mutating)?,
        to_value("ValidatingWebhookConfiguration", &validating)?,
    ];
    for api_service in api_services(config) {
        out.push(to_value("APIService", &api_service)?);
    }
    Ok(out)
}
