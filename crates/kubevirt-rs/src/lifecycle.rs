//! How every process of this package starts and ends, shared by the `kubevirt-rs` multi-call
//! binary and the small `virt-launcher` binary: logs to standard error filtered by `RUST_LOG`
//! (default `info`), and the end on SIGINT or SIGTERM (kubelet's stop signal).

/// Logs to standard error, filtered by `RUST_LOG` (default `info`), in colour on a terminal.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

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
