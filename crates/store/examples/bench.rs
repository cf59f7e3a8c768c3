//! Create throughput of the SQLite store with 1 and 16 concurrent writers (group commit),
//! and of the in-memory store for comparison. Prints figures; asserts nothing.
//!
//! `cargo run --release -p kubevirt-store --example bench [creates-per-run]`

use std::sync::Arc;
use std::time::Instant;

use kubevirt_store::Store;

async fn run(store: &Store, writers: usize, total: usize, run: usize) -> anyhow::Result<f64> {
    let per_writer = total / writers;
    let payload: Arc<[u8]> = Arc::from(vec![b'x'; 1024]);
    let start = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let store = store.clone();
            let payload = Arc::clone(&payload);
            tokio::spawn(async move {
                for i in 0..per_writer {
                    let key = format!("/bench/{run}/{w:02}/{i:06}");
                    let payload = Arc::clone(&payload);
                    store
                        .create(&key, Box::new(move |_| payload.to_vec()))
                        .await?;
                }
                Ok::<_, kubevirt_store::StoreError>(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    let rate = (per_writer * writers) as f64 / start.elapsed().as_secs_f64();
    Ok(rate)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let total: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse())
        .transpose()?
        .unwrap_or(2000);
    let dir = tempfile::tempdir()?;
    let sqlite = Store::open_sqlite(&dir.path().join("bench.db"))?;
    let memory = Store::in_memory();
    for (name, store) in [("sqlite", &sqlite), ("memory", &memory)] {
        for (run_index, writers) in [1usize, 16].into_iter().enumerate() {
            let creates = if writers == 1 && name == "sqlite" {
                total / 4
            } else {
                total
            };
            let rate = run(store, writers, creates, run_index).await?;
            println!(
                "{name:>6}: {writers:>2} writer(s): {rate:>9.0} creates/s ({creates} creates, 1 KiB values)"
            );
        }
    }
    Ok(())
}
