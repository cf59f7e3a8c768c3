//! The end of a process: SIGINT or SIGTERM (kubelet's stop signal), shared by the
//! `kubevirt-rs` multi-call binary and the small `virt-launcher` binary.

/// Resolves on the first SIGINT or SIGTERM (on Ctrl-C alone if the handlers cannot be
/// installed).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut int), Ok(mut term)) => {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
