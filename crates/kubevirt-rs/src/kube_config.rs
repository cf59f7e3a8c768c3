//! How a KubeVirt component finds its API server, as upstream's components do: the
//! `--kubeconfig` file when one is given; otherwise, in a pod (`KUBERNETES_SERVICE_HOST`
//! set), the in-cluster configuration — `KUBERNETES_SERVICE_HOST`/`PORT` and the projected
//! service-account token and CA under `/var/run/secrets/kubernetes.io/serviceaccount/`;
//! otherwise `KUBECONFIG` or `~/.kube/config`.

use std::path::Path;

use anyhow::Context;
use base64::Engine;
use kubevirt_api::rest_client_metrics::RestClientMetrics;

/// Where a service account's files are mounted in a pod.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The `User-Agent` a component sends, in client-go's form
/// (`virt-controller/0.1.0 (linux/amd64) kubevirt-rs`): the API server's request log and
/// audit name the writer by it.
pub fn user_agent(component: &str) -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    format!(
        "{component}/{} ({}/{arch}) kubevirt-rs",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS
    )
}

/// `config` sending [`user_agent`]`(component)` with every request.
pub fn with_user_agent(mut config: kube::Config, component: &str) -> kube::Config {
    let value = http::HeaderValue::from_str(&user_agent(component))
        .unwrap_or_else(|_| http::HeaderValue::from_static("kubevirt-rs"));
    config
        .headers
        .retain(|(name, _)| name != http::header::USER_AGENT);
    config.headers.push((http::header::USER_AGENT, value));
    config
}

/// The client configuration of `component` (see the module documentation).
pub async fn load(kubeconfig: Option<&Path>, component: &str) -> anyhow::Result<kube::Config> {
    let config = if let Some(path) = kubeconfig {
        let kc = kube::config::Kubeconfig::read_from(path)
            .with_context(|| format!("reading {}", path.display()))?;
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .context("client configuration")?
    } else if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        tracing::info!("in-cluster configuration (service-account token)");
        kube::Config::incluster().context("in-cluster client configuration")?
    } else {
        kube::Config::infer().await.context(
            "client configuration (no --kubeconfig, KUBECONFIG or in-cluster configuration)",
        )?
    };
    Ok(with_user_agent(config, component))
}

/// A client built from [`load`].
pub async fn client(kubeconfig: Option<&Path>, component: &str) -> anyhow::Result<kube::Client> {
    build(load(kubeconfig, component).await?)
}

/// A component's client for `config`: kube-rs' stack with the REST client metrics layer
/// ([`RestClientMetrics`]) around it, so the component's `/metrics` counts its requests.
pub fn build(config: kube::Config) -> anyhow::Result<kube::Client> {
    let host = config
        .cluster_url
        .authority()
        .map_or_else(|| "none".to_owned(), ToString::to_string);
    let builder = kube::client::ClientBuilder::try_from(config).context("client")?;
    Ok(builder
        .with_layer(&RestClientMetrics::shared().layer(host))
        .build())
}

/// The cluster CA of a configuration as PEM, when it names one.
pub fn cluster_ca_pem(config: &kube::Config) -> Option<Vec<u8>> {
    let certs = config.root_cert.as_ref().filter(|c| !c.is_empty())?;
    let mut pem = String::new();
    for der in certs {
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        pem.push_str("-----BEGIN CERTIFICATE-----\n");
        for line in b64.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
    }
    Some(pem.into_bytes())
}

/// The namespace a component runs in: the pod's service-account namespace, else `fallback`.
pub fn pod_namespace(fallback: &str) -> String {
    std::fs::read_to_string(Path::new(SERVICE_ACCOUNT_DIR).join("namespace"))
        .ok()
        .map(|ns| ns.trim().to_owned())
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| fallback.to_owned())
}
