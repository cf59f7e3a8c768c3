//! The kube client and calls to `subresources.kubevirt.io/v1`.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::Value;

use crate::Error;

/// The API group/version of the subresources.
pub const SUBRESOURCES: &str = "/apis/subresources.kubevirt.io/v1";

/// A connected command context.
pub struct Ctx {
    /// Client to the API server.
    pub client: kube::Client,
    /// Namespace of the command (flag, else the kubeconfig context's, else `default`).
    pub namespace: String,
}

/// VMs or VMIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `virtualmachines`.
    Vm,
    /// `virtualmachineinstances`.
    Vmi,
}

impl Kind {
    fn plural(self) -> &'static str {
        match self {
            Kind::Vm => "virtualmachines",
            Kind::Vmi => "virtualmachineinstances",
        }
    }
}

/// Builds the client from `kubeconfig` (or `KUBECONFIG`/`~/.kube/config`/in-cluster).
///
/// # Errors
/// [`Error::Client`] when no usable configuration is found.
pub async fn connect(
    kubeconfig: Option<&Path>,
    namespace: Option<&str>,
) -> Result<(kube::Client, String), Error> {
    let boxed = |e: Box<dyn std::error::Error + Send + Sync>| Error::Client(e);
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|e| boxed(Box::new(e)))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| boxed(Box::new(e)))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| boxed(Box::new(e)))?,
    };
    let ns = namespace.map_or_else(|| config.default_namespace.clone(), str::to_owned);
    let mut config = config;
    // As kubectl names itself: the API server's request log shows who wrote.
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(concat!(
            "virtctl/",
            env!("CARGO_PKG_VERSION"),
            " kubevirt-rs"
        )),
    ));
    let client = kube::Client::try_from(config).map_err(|e| boxed(Box::new(e)))?;
    Ok((client, ns))
}

/// The path of subresource `sub` of `kind`/`name` in `namespace`.
pub fn subresource_path(namespace: &str, kind: Kind, name: &str, sub: &str) -> String {
    format!(
        "{SUBRESOURCES}/namespaces/{namespace}/{}/{name}/{sub}",
        kind.plural()
    )
}

/// The user-facing text of a failed call: the API's `Status.message`, else the error.
pub fn api_message(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        other => other.to_string(),
    }
}

impl Ctx {
    /// `PUT`s `body` to subresource `sub`.
    ///
    /// # Errors
    /// The failed call.
    pub async fn put(
        &self,
        kind: Kind,
        name: &str,
        sub: &str,
        body: &Value,
    ) -> Result<(), kube::Error> {
        let path = subresource_path(&self.namespace, kind, name, sub);
        let req = http::Request::put(path)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body).map_err(kube::Error::SerdeError)?)
            .map_err(kube::Error::HttpError)?;
        self.client.request_text(req).await.map(drop)
    }

    /// `GET`s `path` and decodes the JSON answer.
    ///
    /// # Errors
    /// The failed call.
    pub async fn get_json(&self, path: String) -> Result<Value, kube::Error> {
        let req = http::Request::get(path)
            .body(Vec::new())
            .map_err(kube::Error::HttpError)?;
        self.client.request::<Value>(req).await
    }
}
