//! A figure, not an assertion: how long `kubevirt-rs server --fake-qemu` takes from its start
//! to "ready" (the KubeVirt CR Available and the components' readiness checks passing).
//! Ignored by default; run with
//! `cargo nextest run -p kubevirt-rs --test start_to_ready --run-ignored only --no-capture`
//! (`KUBEVIRT_RS_MEASURE_BINARY` measures another build of the binary).

use std::path::PathBuf;
use std::time::Instant;

use testkit::ServerProcess;

#[test]
#[ignore = "a measurement: prints the start-to-ready time"]
fn server_start_to_ready() -> anyhow::Result<()> {
    let binary = std::env::var_os("KUBEVIRT_RS_MEASURE_BINARY").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_kubevirt-rs")),
        PathBuf::from,
    );
    for run in 1..=2 {
        let started = Instant::now();
        let server = ServerProcess::start(&binary, "server", &["--fake-qemu"])?;
        println!(
            "run {run}: {} ready in {:.1} s",
            binary.display(),
            started.elapsed().as_secs_f64()
        );
        drop(server);
    }
    Ok(())
}
