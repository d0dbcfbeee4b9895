//! `sluice-bench cache --service`: the throttled-storage epoch time through the service.
//!
//! Real JPEGs on throttled storage (2 ms per read, 200 MB/s per worker process), a real
//! dispatcher and 2 worker processes on loopback, a [`RemoteLoader`] in this process whose
//! trainer reports the simulated per-sample losses (deterministic, as in the local timing)
//! after every batch. Three configurations, interleaved within each repetition:
//!
//! * (a) no cache, uniform sampling;
//! * (b) importance sampling with the `importance` cache, a quarter of the dataset's decoded
//!   bytes per worker (half in all), cache-aware assignment;
//! * (c) the same through a dispatcher started with `--cache-assignment blind`.
//!
//! Each configuration is a fresh job (a fresh importance store) per repetition; its
//! epoch time is the median from epoch 2 on (epochs 0 and 1 fill the caches and bring the
//! first losses), its hit rate the workers' lookups over the same epochs.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;
use sluice_client::{JobCacheStats, RemoteLoader, RemoteOptions, ReportKind};
use sluice_core::{
    ByteBudget, CacheLevel, CachePolicyKind, CacheSpec, PipelineSpec, SamplingSpec, SourceSpec, StorageSpec,
};
use sluice_pipeline::{Loader, Shard};
use sluice_profile::local_service::Proc;
use sluice_profile::median;

use super::sim::{sampler_for, SimTrainer};
use super::Args;
use crate::dataset;
use crate::service::service_with;

const WORKERS: usize = 2;
/// Epochs before the measured ones: the first fills the caches and brings the first
/// losses, the second is the first drawn with a hot set.
const WARM: u64 = 2;

struct Config {
    name: &'static str,
    cache: bool,
    /// Index into the running services: 0 aware, 1 blind.
    service: usize,
}

const CONFIGS: [Config; 3] = [
    Config { name: "no cache, uniform", cache: false, service: 0 },
    Config { name: "importance 50%, aware", cache: true, service: 0 },
    Config { name: "importance 50%, blind", cache: true, service: 1 },
];

struct RunResult {
    epoch_s: Vec<f64>,
    steady_s: f64,
    hit_rate: Option<f64>,
}

pub fn main(a: &Args) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(a.timed_epochs > WARM, "--timed-epochs must be > {WARM} with --service");
    anyhow::ensure!(a.reps > 0, "--reps must be >= 1");
    let work = PathBuf::from("data/bench-cache-service");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let work = work.canonicalize()?;
    let root = PathBuf::from("data/bench-cache");
    dataset::ensure(&root, a.images, 0)?;
    let root = root.canonicalize()?;
    let n = Loader::new(spec(&root, a, None), Shard::default()).context("indexing data/bench-cache")?.manifest().len();
    // 500x375 RGB8 per decoded entry: a quarter of the dataset's decoded bytes per worker.
    let per_worker = (n as u64 * 500 * 375 * 3) / (2 * WORKERS as u64);
    let cache = CacheSpec {
        budget: ByteBudget::Bytes(per_worker),
        level: CacheLevel::Decoded,
        resize: None,
        policy: CachePolicyKind::Importance,
        disk: None,
        share: false,
    };
    let threads = a.threads.max(1);
    let services: Vec<(String, Vec<Proc>)> = ["aware", "blind"]
        .iter()
        .map(|mode| service_with(&work, &root, WORKERS, threads, &["--cache-assignment", mode]))
        .collect::<anyhow::Result<_>>()?;

    let mut results: Vec<Vec<RunResult>> = CONFIGS.iter().map(|_| Vec::new()).collect();
    for rep in 0..a.reps {
        for (k, c) in CONFIGS.iter().enumerate() {
            let mut s = spec(&root, a, c.cache.then(|| cache.clone()));
            // A fresh job (importance store, draws) per repetition.
            s.seed = a.seed + rep as u64;
            let job = format!("bench-cache-{k}-{rep}");
            let r = timed_run(&services[c.service].0, &job, s, n, a)?;
            eprintln!(
                "rep {rep}, {}: epochs {:?} s, median from epoch {WARM} {:.2} s, hit rate {}",
                c.name,
                r.epoch_s.iter().map(|t| (t * 100.0).round() / 100.0).collect::<Vec<_>>(),
                r.steady_s,
                r.hit_rate.map_or("-".into(), |h| format!("{h:.3}"))
            );
            results[k].push(r);
        }
    }
    drop(services);

    let ratio = |k: usize| {
        median(&mut results[k].iter().zip(&results[0]).map(|(r, base)| r.steady_s / base.steady_s).collect::<Vec<_>>())
    };
    let hit = |k: usize| median(&mut results[k].iter().filter_map(|r| r.hit_rate).collect::<Vec<_>>());
    let (aware_ratio, blind_ratio) = (ratio(1), ratio(2));
    let (aware_hit, blind_hit) = (hit(1), hit(2));
    eprintln!(
        "{n} images, {WORKERS} workers x {threads} thread(s), 2 ms + 200 MB/s storage per worker, median of {} reps:",
        a.reps
    );
    let mut rows = Vec::new();
    for (k, c) in CONFIGS.iter().enumerate() {
        let epoch = median(&mut results[k].iter().map(|r| r.steady_s).collect::<Vec<_>>());
        let vs = if k == 0 { "-".to_string() } else { format!("{:.2}x", ratio(k)) };
        let hit_rate = if c.cache { Some(hit(k)) } else { None };
        eprintln!(
            "  {:<24} epoch {epoch:.2} s  vs no cache {vs:>6}  hit rate {}",
            c.name,
            hit_rate.map_or("-".into(), |h| format!("{h:.3}"))
        );
        rows.push(json!({
            "run": c.name,
            "median_epoch_s": epoch,
            "epoch_s": results[k].iter().map(|r| r.epoch_s.clone()).collect::<Vec<_>>(),
            "hit_rate": hit_rate,
        }));
    }
    eprintln!(
        "importance aware {aware_ratio:.2}x no cache (hit rate {aware_hit:.3}), blind {blind_ratio:.2}x (hit rate {blind_hit:.3})"
    );
    Ok(json!({
        "images": n,
        "workers": WORKERS,
        "threads_per_worker": threads,
        "reps": a.reps,
        "runs": rows,
        "aware_vs_no_cache": aware_ratio,
        "blind_vs_no_cache": blind_ratio,
        "aware_hit_rate": aware_hit,
        "blind_hit_rate": blind_hit,
    }))
}

fn spec(root: &Path, a: &Args, cache: Option<CacheSpec>) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(SourceSpec::ImageFolder { root: root.to_path_buf() }, 224, 32);
    s.storage = StorageSpec::Throttled { latency_ms: 2.0, bandwidth_mb_s: 200.0, shared_link: None };
    s.threads = a.threads.max(1).into();
    s.seed = a.seed;
    if cache.is_some() {
        s.sampling = sampler_for(CachePolicyKind::Importance);
    } else {
        s.sampling = SamplingSpec::Uniform;
    }
    s.cache = cache;
    s
}

/// `a.timed_epochs` epochs of job `job` on the dispatcher at `addr`, the simulated
/// trainer's losses reported after every batch of an importance job.
fn timed_run(addr: &str, job: &str, s: PipelineSpec, n: usize, a: &Args) -> anyhow::Result<RunResult> {
    let importance = s.cache.is_some();
    let mut o = RemoteOptions::new(addr, job);
    o.token = None;
    // One batch per task: a task is one owner's run of draws (see docs/importance-service.md).
    o.task_batches = 1;
    o.tasks_in_flight = 2 * WORKERS;
    let mut remote = RemoteLoader::connect(&s, o).with_context(|| format!("connecting job {job} to {addr}"))?;
    let mut trainer = SimTrainer::new(n, s.seed);
    let mut epoch_s = Vec::new();
    // The workers count lookups per cache since they started, and jobs with the same
    // fingerprint share a cache: count from what the earlier jobs left.
    let start = if importance {
        let c = remote.cache_stats()?;
        c.hits + c.misses
    } else {
        0
    };
    let mut before = None;
    for epoch in 0..a.timed_epochs {
        if importance && epoch == WARM {
            before = Some(settled(&remote, start + n as u64 * epoch)?);
        }
        let t0 = Instant::now();
        remote.start_epoch();
        while let Some(b) = remote.next_batch(&mut || false) {
            let b = b.with_context(|| format!("job {job}, epoch {epoch}"))?;
            if importance {
                let losses: Vec<f64> = b.keys.iter().map(|&k| trainer.train(k as usize)).collect();
                remote.report(&b.keys, &losses, ReportKind::Loss)?;
            }
        }
        epoch_s.push(t0.elapsed().as_secs_f64());
    }
    let hit_rate = match before {
        Some(before) => {
            let after = settled(&remote, start + n as u64 * a.timed_epochs)?;
            let (hits, misses) = (after.hits - before.hits, after.misses - before.misses);
            Some(hits as f64 / (hits + misses).max(1) as f64)
        }
        None => None,
    };
    let steady_s = median(&mut epoch_s.iter().skip(WARM as usize).copied().collect::<Vec<_>>());
    Ok(RunResult { epoch_s, steady_s, hit_rate })
}

/// The job's cache stats once the workers' heartbeats (every 250 ms) count `lookups`.
fn settled(remote: &RemoteLoader, lookups: u64) -> anyhow::Result<JobCacheStats> {
    let t0 = Instant::now();
    loop {
        let c = remote.cache_stats()?;
        if c.hits + c.misses >= lookups {
            return Ok(c);
        }
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(10),
            "the workers' heartbeats count {} cache lookups, not {lookups}",
            c.hits + c.misses
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
