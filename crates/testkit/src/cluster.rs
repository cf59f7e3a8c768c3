//! The embedded API server in the test's own process, with KubeVirt's CRDs installed and an
//! admin kube-rs client: what controller, webhook, handler and client tests run against.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context;
use kubevirt_apiserver::{Config, RunningServer};

/// An in-process API server on a temporary data directory (removed on drop). The server's
/// tasks live on the test's runtime and end with it.
pub struct InProcessCluster {
    /// An admin client of the server.
    pub client: kube::Client,
    server: Option<RunningServer>,
    data: tempfile::TempDir,
    with_crds: bool,
}

impl InProcessCluster {
    /// Starts a server with KubeVirt's CRDs on a free loopback port.
    pub async fn start() -> anyhow::Result<InProcessCluster> {
        Self::start_with(true).await
    }

    /// Starts a server with only the built-in kinds.
    pub async fn start_without_crds() -> anyhow::Result<InProcessCluster> {
        Self::start_with(false).await
    }

    async fn start_with(with_crds: bool) -> anyhow::Result<InProcessCluster> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let data = tempfile::Builder::new()
            .prefix("kubevirt-rs-cluster")
            .tempdir()
            .context("temp dir")?;
        let listen: SocketAddr = "127.0.0.1:0".parse().context("loopback address")?;
        let server = start_server(&data.path().join("apiserver"), listen, with_crds).await?;
        let client = client_for(&server.kubeconfig).await?;
        Ok(InProcessCluster {
            client,
            server: Some(server),
            data,
            with_crds,
        })
    }

    /// The running server (address, kubeconfig, state).
    pub fn server(&self) -> anyhow::Result<&RunningServer> {
        self.server.as_ref().context("the server is stopped")
    }

    /// A directory of the test's own beside the server's (`<dir>/apiserver`), removed on drop.
    pub fn data_dir(&self) -> &Path {
        self.data.path()
    }

    /// Stops the server (clients see connections refused until [`InProcessCluster::restart`]).
    pub async fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            server.stop().await;
        }
    }

    /// Starts the server again on the same data directory and address; the client keeps
    /// working, as after an API server restart.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        let addr = self.server()?.addr;
        self.stop().await;
        let server =
            start_server(&self.data.path().join("apiserver"), addr, self.with_crds).await?;
        self.server = Some(server);
        Ok(())
    }
}

async fn start_server(
    data_dir: &Path,
    listen: SocketAddr,
    with_crds: bool,
) -> anyhow::Result<RunningServer> {
    // With KubeVirt's CRDs comes its namespace, as its install manifests bring both.
    let initial_objects = if with_crds {
        let mut objects = vec![serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kubevirt"}})];
        for crd in kubevirt_api::crd::all_crds().context("generating the CRDs")? {
            objects.push(serde_json::to_value(crd).context("encoding the CRDs")?);
        }
        objects
    } else {
        Vec::new()
    };
    kubevirt_apiserver::start(Config {
        data_dir: data_dir.to_owned(),
        listen,
        initial_objects,
    })
    .await
    .context("starting the API server")
}

/// A kube-rs client from a kubeconfig file.
pub async fn client_for(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig).context("kubeconfig")?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .context("client config")?;
    kube::Client::try_from(config).context("client")
}
