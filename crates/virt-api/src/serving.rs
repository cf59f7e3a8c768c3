//! The bridge from virt-api's servers (stopped by a future) to [`kubevirt_tls::serve`]
//! (stopped by a cancellation token).

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use kubevirt_tls::ServeOptions;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Serves `app` over TLS with the default limits until `shutdown` completes and the
/// requests in flight have finished.
pub(crate) async fn serve_until(
    listener: TcpListener,
    tls: rustls::ServerConfig,
    app: Router,
    shutdown: impl Future<Output = ()>,
) {
    let token = CancellationToken::new();
    let serving = kubevirt_tls::serve(
        listener,
        Arc::new(tls),
        app,
        ServeOptions::default(),
        token.clone(),
    );
    tokio::pin!(serving);
    tokio::select! {
        () = &mut serving => {}
        () = shutdown => {
            token.cancel();
            serving.await;
        }
    }
}
