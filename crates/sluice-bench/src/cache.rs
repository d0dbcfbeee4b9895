//! `sluice-bench cache` (formerly `sluice bench-cache`): the cache policies compared.
//!
//! 1. **Hit rate vs cache size.** Every policy (`lru`, `shade`, `fastmatch`, `importance`,
//!    each with the sampler it was designed with) on the same simulated training run with
//!    importance feedback, at cache sizes of 10%…90% of the dataset. The trainer is
//!    simulated (heavy-tailed, decaying per-sample losses; see
//!    [`sim`]): the sweep measures the policies, not a network.
//! 2. **Epoch time on throttled storage** (2 ms per read, 200 MB/s shared): real JPEGs
//!    through the real loader, no cache vs the `importance` cache at 50% of the dataset's
//!    decoded bytes, the simulated trainer reporting losses per batch. Medians over the
//!    epochs after the cache has warmed.
//! 3. With `--service`, the same timing through a dispatcher and 2 worker processes, with
//!    cache-aware and cache-blind assignment ([`service`]).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use serde_json::json;
use sluice_core::{
    ByteBudget, CacheLevel, CachePolicyKind, CacheSpec, PipelineSpec, SamplingSpec, SourceSpec, StorageSpec,
};
use sluice_pipeline::{Loader, Shard};
use sluice_profile::median;

use crate::dataset;

mod service;
pub mod sim;

use sim::{sampler_for, simulate, SimConfig, SimResult, SimTrainer};

const POLICIES: [CachePolicyKind; 4] =
    [CachePolicyKind::Lru, CachePolicyKind::Shade, CachePolicyKind::Fastmatch, CachePolicyKind::Importance];

#[derive(clap::Args)]
pub struct Args {
    /// Samples in the simulated hit-rate sweep.
    #[arg(long, default_value_t = 10_000)]
    pub samples: usize,
    /// Epochs of the simulated run.
    #[arg(long, default_value_t = 30)]
    pub epochs: u64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Images for the throttled-storage timing (generated in data/bench-cache); 0 skips it.
    #[arg(long, default_value_t = 400)]
    pub images: usize,
    /// Epochs per throttled-storage run.
    #[arg(long, default_value_t = 8)]
    pub timed_epochs: u64,
    /// Worker threads for the timing (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Time the throttled epochs through the service instead (a dispatcher and 2 worker
    /// processes with `--threads` threads each): no cache vs importance at 50%, cache-aware
    /// vs cache-blind assignment. Skips the simulated sweep and the local timing.
    #[arg(long)]
    pub service: bool,
    /// Repetitions of the service timing (configurations interleaved; medians reported).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Print results as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn main(a: Args) -> anyhow::Result<()> {
    if a.service {
        anyhow::ensure!(a.images > 0, "--images must be >= 1 with --service");
        let service = service::main(&a)?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&json!({ "service": service }))?);
        }
        return Ok(());
    }
    anyhow::ensure!(a.samples > 0 && a.epochs > 1, "--samples must be >= 1 and --epochs >= 2");
    let sweep = hit_rate_sweep(&a);
    let timing = if a.images > 0 { Some(throttled_timing(&a)?) } else { None };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&json!({ "hit_rate": sweep, "throttled": timing }))?);
    }
    Ok(())
}

fn hit_rate_sweep(a: &Args) -> Vec<SimResult> {
    eprintln!(
        "hit rate after the first epoch (steady state, epochs >= 3, in brackets); {} samples, {} epochs, simulated trainer",
        a.samples, a.epochs
    );
    eprintln!("{:>6} {:>16} {:>16} {:>16} {:>16}", "cache", "lru", "shade", "fastmatch", "importance");
    let mut all = Vec::new();
    for tenth in 1..=9 {
        let cfg = SimConfig {
            samples: a.samples,
            epochs: a.epochs,
            batch: 64,
            cache_fraction: f64::from(tenth) / 10.0,
            seed: a.seed,
            entry_bytes: 1000,
        };
        let row: Vec<SimResult> = POLICIES.iter().map(|&p| simulate(p, sampler_for(p), &cfg)).collect();
        let cells: Vec<String> = row.iter().map(|r| format!("{:.3} ({:.3})", r.hit_rate, r.steady_hit_rate)).collect();
        eprintln!("{:>5}% {:>16} {:>16} {:>16} {:>16}", tenth * 10, cells[0], cells[1], cells[2], cells[3]);
        all.extend(row);
    }
    all
}

fn throttled_timing(a: &Args) -> anyhow::Result<serde_json::Value> {
    let root = PathBuf::from("data/bench-cache");
    dataset::ensure(&root, a.images, 0)?;
    let base = |cache: Option<CacheSpec>, sampling: SamplingSpec| {
        let mut s = PipelineSpec::train_default(SourceSpec::ImageFolder { root: root.clone() }, 224, 32);
        s.storage = StorageSpec::Throttled { latency_ms: 2.0, bandwidth_mb_s: 200.0, shared_link: None };
        s.threads = a.threads.into();
        s.seed = a.seed;
        s.cache = cache;
        s.sampling = sampling;
        s
    };
    let probe =
        Loader::new(base(None, SamplingSpec::Uniform), Shard::default()).context("indexing data/bench-cache")?;
    let n = probe.manifest().len();
    drop(probe);
    // 500x375 RGB8 per decoded entry: half the dataset's decoded bytes.
    let budget = (n as u64 * 500 * 375 * 3) / 2;
    let importance = CacheSpec {
        budget: ByteBudget::Bytes(budget),
        level: CacheLevel::Decoded,
        resize: None,
        policy: CachePolicyKind::Importance,
        disk: None,
        share: false,
    };
    let lru = CacheSpec { policy: CachePolicyKind::Lru, ..importance.clone() };
    let runs = [
        ("no cache, uniform", base(None, SamplingSpec::Uniform)),
        ("importance cache 50%", base(Some(importance), sampler_for(CachePolicyKind::Importance))),
        ("lru cache 50%, uniform", base(Some(lru), SamplingSpec::Uniform)),
    ];
    let mut results = Vec::new();
    for (name, spec) in runs {
        let loader = Loader::new(spec, Shard::default())?;
        let mut trainer = SimTrainer::new(n, a.seed);
        let mut times = Vec::new();
        for epoch in 0..a.timed_epochs {
            let t0 = Instant::now();
            for batch in loader.iter() {
                let batch = batch?;
                let losses: Vec<f64> = batch.keys.iter().map(|&k| trainer.train(k as usize)).collect();
                loader.report(&batch.keys, &losses)?;
            }
            let secs = t0.elapsed().as_secs_f64();
            eprintln!("{name}: epoch {epoch} {secs:.2}s");
            times.push(secs);
        }
        // Epochs 0 and 1 fill the cache and gather the first scores.
        let steady = median(&mut times.iter().skip(2).copied().collect::<Vec<_>>());
        let stats = loader.stats();
        let hit_rate = stats.cache.as_ref().map(|c| c.tier.hit_rate);
        eprintln!("{name}: median epoch (from epoch 2) {steady:.2}s, hit rate {hit_rate:?}");
        results.push(json!({ "run": name, "epoch_s": times, "median_epoch_s": steady, "cache": stats.cache }));
    }
    let epoch_s = |i: usize| results[i]["median_epoch_s"].as_f64().unwrap_or(f64::NAN);
    let (ratio, lru_ratio) = (epoch_s(1) / epoch_s(0), epoch_s(2) / epoch_s(0));
    eprintln!(
        "epoch time vs no cache ({n} images, 2 ms + 200 MB/s storage): importance 50% {ratio:.2}x, lru 50% {lru_ratio:.2}x"
    );
    Ok(json!({ "images": n, "runs": results, "importance_vs_no_cache": ratio, "lru_vs_no_cache": lru_ratio }))
}
