//! `sluice model`: predicted epoch loading time of a multi-learner job vs the number of
//! learners, and where storage stops being the bottleneck (`docs/locality.md`).

use clap::Args as ClapArgs;
use sluice_pipeline::locality::model::{predict, ModelInputs, Prediction};

#[derive(ClapArgs)]
pub struct Args {
    /// Samples in the dataset.
    #[arg(long, default_value_t = 100_000)]
    samples: usize,
    /// Mean bytes per sample as read from storage.
    #[arg(long, default_value_t = 110.0)]
    sample_kb: f64,
    /// Mean bytes per sample as a peer sends it (the cache entry; default: --sample-kb).
    #[arg(long)]
    peer_sample_kb: Option<f64>,
    /// Samples each learner caches.
    #[arg(long, default_value_t = 25_000)]
    cache_samples: u64,
    /// Local batch size.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Shared storage bandwidth (MB/s) and per-read latency (ms).
    #[arg(long, default_value_t = 200.0)]
    storage_mb_s: f64,
    #[arg(long, default_value_t = 2.0)]
    storage_latency_ms: f64,
    /// Each learner's network bandwidth (MB/s) and per-request latency (ms).
    #[arg(long, default_value_t = 1000.0)]
    net_mb_s: f64,
    #[arg(long, default_value_t = 0.1)]
    net_latency_ms: f64,
    /// Preprocessing time per sample on one thread (ms), and threads per learner.
    #[arg(long, default_value_t = 5.0)]
    compute_ms: f64,
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Learner counts to predict.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    learners: Vec<usize>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn main(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(a.samples > 0 && a.storage_mb_s > 0.0 && a.net_mb_s > 0.0, "sizes and bandwidths must be > 0");
    anyhow::ensure!(a.learners.iter().all(|&p| p > 0), "--learners: every count must be at least 1");
    let m = ModelInputs {
        samples: a.samples,
        sample_bytes: a.sample_kb * 1e3,
        peer_sample_bytes: a.peer_sample_kb.unwrap_or(a.sample_kb) * 1e3,
        cache_samples: a.cache_samples,
        local_batch: a.batch.max(1),
        storage_bytes_per_s: a.storage_mb_s * 1e6,
        storage_latency_s: a.storage_latency_ms / 1e3,
        net_bytes_per_s: a.net_mb_s * 1e6,
        net_latency_s: a.net_latency_ms / 1e3,
        compute_s: a.compute_ms / 1e3,
        threads: a.threads.max(1),
    };
    let rows: Vec<Prediction> = a.learners.iter().map(|&p| predict(&m, p)).collect();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!("| p | compute s | storage s | network s | epoch s | baseline s | speedup | cross-learner (aware / plain) | bottleneck |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}x | {:.1}% / {:.1}% | {} |",
            r.learners,
            r.compute_s,
            r.storage_s,
            r.network_s,
            r.epoch_s,
            r.baseline_s,
            r.baseline_s / r.epoch_s.max(1e-12),
            r.remote_aware * 100.0,
            r.remote_partitioned * 100.0,
            r.bottleneck
        );
    }
    match rows.iter().rposition(|r| r.bottleneck == "storage") {
        None => println!("storage is not the bottleneck at any p here"),
        Some(i) => match rows.get(i + 1) {
            Some(r) => {
                println!("storage stops being the bottleneck at p = {} ({} bound there)", r.learners, r.bottleneck)
            }
            None => println!("storage stays the bottleneck up to p = {}", rows[i].learners),
        },
    }
    Ok(())
}
