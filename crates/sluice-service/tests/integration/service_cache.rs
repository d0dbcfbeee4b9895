//! The importance cache on the service's workers: the dispatcher places the job's hot set
//! on the workers' caches (disjoint shares), and cache-aware assignment sends each task to
//! the worker caching its samples. Real `sluice` processes on 127.0.0.1, [`RemoteLoader`]s
//! in this process, and a local [`Loader`] with the same total cache as the reference.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use sluice_client::{JobCacheStats, RemoteLoader, ReportKind};
use sluice_core::{ByteBudget, CacheLevel, CachePolicyKind, CacheSpec, OpSpec, PipelineSpec, SamplingSpec};
use sluice_pipeline::{Loader, Shard};

use crate::support::*;

const EPOCHS: usize = 8;
/// Epochs before the hit rate is measured: the first fills the caches and brings the
/// first losses, the second is the first drawn with a hot set.
const WARM: usize = 2;

/// The trainer's per-sample loss: a few hard samples, the rest rising slowly with the key.
fn loss(key: u64) -> f64 {
    if key < 8 {
        10.0
    } else {
        0.1 + key as f64 / 100.0
    }
}

/// Importance sampling with the `importance` cache policy, `budget` bytes of raw files.
fn cached_spec(root: &std::path::Path, budget: u64) -> PipelineSpec {
    let mut s = spec(root, 5);
    s.sampling = SamplingSpec::Importance { floor: 0.05, coverage_epochs: 40, miss_discount: 0.1, max_draws: 4.0 };
    s.cache = Some(CacheSpec {
        budget: ByteBudget::Bytes(budget),
        level: CacheLevel::Raw,
        resize: None,
        policy: CachePolicyKind::Importance,
        disk: None,
        share: false,
    });
    s
}

fn rate(before: (u64, u64), after: (u64, u64)) -> f64 {
    let (h, m) = (after.0 - before.0, after.1 - before.1);
    h as f64 / (h + m).max(1) as f64
}

/// The local loader's hit rate over the epochs after [`WARM`].
fn local_hit_rate(s: &PipelineSpec) -> f64 {
    let local = Loader::new(s.clone(), Shard::default()).unwrap();
    let mut before = (0, 0);
    for epoch in 0..EPOCHS {
        if epoch == WARM {
            let c = local.stats().cache.unwrap();
            before = (c.tier.hits, c.tier.misses);
        }
        for b in local.iter() {
            let b = b.unwrap();
            let values: Vec<f64> = b.keys.iter().map(|&k| loss(k)).collect();
            local.report(&b.keys, &values).unwrap();
        }
    }
    let c = local.stats().cache.unwrap();
    rate(before, (c.tier.hits, c.tier.misses))
}

/// The job's cache stats once the workers' heartbeats count `lookups` lookups.
fn settled(remote: &RemoteLoader, lookups: u64) -> JobCacheStats {
    let t0 = Instant::now();
    loop {
        let c = remote.cache_stats().unwrap();
        if c.hits + c.misses >= lookups {
            return c;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the workers reported {c:?}, not {lookups} lookups");
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct ServiceRun {
    hit_rate: f64,
    /// The dispatcher's metrics after the last epoch.
    metrics: String,
}

/// [`EPOCHS`] epochs through a dispatcher (`--cache-assignment assignment`) and 2 workers
/// whose caches hold `budget` bytes each, every batch's losses reported; checks that each
/// epoch delivers every batch once, and every drawn sample.
fn service_run(root: &std::path::Path, budget: u64, assignment: &'static str) -> ServiceRun {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let metrics = free_addr();
    let port = metrics.rsplit(':').next().unwrap().to_string();
    let _d = dispatcher(
        &addr,
        &dir.path().join("journal"),
        root,
        &["--cache-assignment", assignment, "--metrics-port", &port],
    );
    let _w: Vec<Server> = (0..2).map(|_| worker(&addr, root, &[])).collect();
    let s = cached_spec(root, budget);
    // One batch per task: a task is one owner's run of draws, and the epoch's last,
    // mixed runs are short.
    let mut o = options(&addr, "cached");
    o.task_batches = 1;
    let remote = RemoteLoader::connect(&s, o).unwrap();
    let batches = IMAGES.div_ceil(BATCH) as u64;
    let (remote, before, after) = within(150, "epochs through the service", move || {
        let mut remote = remote;
        let mut before = JobCacheStats::default();
        for epoch in 0..EPOCHS {
            if epoch == WARM {
                before = settled(&remote, (IMAGES * epoch) as u64);
            }
            remote.start_epoch();
            let mut got = Vec::new();
            while let Some(b) = remote.next_batch(&mut || false) {
                let b = b.unwrap();
                let values: Vec<f64> = b.keys.iter().map(|&k| loss(k)).collect();
                remote.report(&b.keys, &values, ReportKind::Loss).unwrap();
                got.push(b);
            }
            let mut indices: Vec<u64> = got.iter().map(|b| b.index).collect();
            indices.sort_unstable();
            assert_eq!(indices, (0..batches).collect::<Vec<_>>(), "{assignment}, epoch {epoch}: every batch once");
            let samples: usize = got.iter().map(|b| b.keys.len()).sum();
            assert_eq!(samples, IMAGES, "{assignment}, epoch {epoch}: every drawn occurrence");
            assert!(epoch == 0 || got.iter().all(|b| b.weights.is_some()), "importance epochs carry weights");
        }
        let after = settled(&remote, (IMAGES * EPOCHS) as u64);
        (remote, before, after)
    });
    // A heartbeat after the last epoch: the caches as they are now.
    std::thread::sleep(Duration::from_millis(600));
    let text = http_get(&metrics);
    drop(remote);
    ServiceRun { hit_rate: rate((before.hits, before.misses), (after.hits, after.misses)), metrics: text }
}

/// `name{...worker="addr"...} value` lines of one metric, as (worker, value).
fn per_worker(text: &str, name: &str) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .map(|l| {
            let worker = l.split("worker=\"").nth(1).unwrap().split('"').next().unwrap().to_string();
            (worker, l.rsplit(' ').next().unwrap().parse().unwrap())
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn workers_cache_disjoint_shares_of_the_hot_set_and_aware_assignment_hits_more_than_blind() {
    let _watchdog = watchdog("workers_cache_disjoint_shares_of_the_hot_set_and_aware_assignment_hits", 400);
    let dir = tempfile::tempdir().unwrap();
    let (root, total) = dataset_and_bytes(dir.path());
    // Half the dataset in cache: locally in one, through the service a quarter per worker.
    let local = local_hit_rate(&cached_spec(&root, total / 2));
    let aware = service_run(&root, total / 4, "aware");
    let blind = service_run(&root, total / 4, "blind");
    eprintln!("hit rate from epoch {WARM}: local {local:.3}, aware {:.3}, blind {:.3}", aware.hit_rate, blind.hit_rate);

    // (a) Each worker's cache holds only its own share of the hot set (so the two are
    // disjoint), the shares split the hot set, and together the caches hold (nearly) all
    // of it: entry sizes vary, so a share may be a little over its cache.
    let m = &aware.metrics;
    let hot = metric_value(m, "sluice_cache_hot{");
    assert!(hot >= 0.4 * IMAGES as f64 && hot <= 0.6 * IMAGES as f64, "hot set of {hot} for half the dataset\n{m}");
    let entries = per_worker(m, "sluice_worker_cache_entries");
    let share = per_worker(m, "sluice_worker_cache_share");
    let held = per_worker(m, "sluice_worker_cache_share_held");
    assert_eq!(entries.len(), 2, "{m}");
    assert_eq!(entries, held, "every cached sample is of the worker's own share\n{m}");
    assert_eq!(share.iter().map(|s| s.1).sum::<f64>(), hot, "the shares split the hot set\n{m}");
    let union: f64 = held.iter().map(|h| h.1).sum();
    assert!(union >= hot - 3.0, "the caches hold {union} of the {hot} hot samples\n{m}");

    // (b) Aware assignment hits more than blind assignment, and close to local mode. On 48
    // samples a stolen task or a hot sample whose share outgrew its cache costs a few
    // points: measured here aware 0.80-0.87, blind 0.74-0.76, local 0.93.
    assert!(aware.hit_rate > blind.hit_rate, "aware {} vs blind {}", aware.hit_rate, blind.hit_rate);
    assert!(aware.hit_rate > local - 0.2, "aware {} vs local {local}", aware.hit_rate);
}

/// Decoded pixels in an ample cache, uniform sampling: what a hyper-parameter search runs.
fn search_spec(root: &std::path::Path, seed: u64) -> PipelineSpec {
    let mut s = spec(root, seed);
    s.cache = Some(CacheSpec {
        budget: ByteBudget::Bytes(64 << 20),
        level: CacheLevel::Decoded,
        resize: None,
        policy: CachePolicyKind::Lru,
        disk: None,
        share: false,
    });
    s
}

/// One epoch of job `job` through the service; its cache stats once they count `lookups`,
/// and the client (the job stays open while it is kept).
fn one_epoch(addr: &str, job: &'static str, s: &PipelineSpec, lookups: u64) -> (JobCacheStats, RemoteLoader) {
    let remote = RemoteLoader::connect(s, options(addr, job)).unwrap();
    within(60, "one epoch through the service", move || {
        let mut remote = remote;
        remote.start_epoch();
        let mut keys = Vec::new();
        while let Some(b) = remote.next_batch(&mut || false) {
            keys.extend(b.unwrap().keys);
        }
        assert_exactly_once(keys, job);
        (settled(&remote, lookups), remote)
    })
}

/// Jobs that differ only in seed and random ops share the worker's cache (keyed by the
/// data and the deterministic ops before the cache seam): the second job's first epoch is
/// all hits. A job with another deterministic prefix keeps a cache of its own.
#[test]
fn jobs_differing_in_seed_and_random_ops_share_the_workers_cache_other_prefixes_do_not() {
    let _watchdog = watchdog("jobs_differing_in_seed_and_random_ops_share_the_workers_cache", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let _w = worker(&addr, &root, &[]);
    let n = IMAGES as u64;

    let first = search_spec(&root, 1);
    let (a, _a) = one_epoch(&addr, "a", &first, n);
    // Each sample decoded once (the client may have asked for more tasks than one epoch's).
    assert_eq!(a.misses, n, "the first job fills the cache: {a:?}");

    // Another seed, another flip probability, another batch size: the same entries.
    let mut second = search_spec(&root, 2);
    second.ops[2] = OpSpec::RandomHorizontalFlip { p: 0.25 };
    second.batch.size = 8;
    let (b, _b) = one_epoch(&addr, "b", &second, a.hits + a.misses + n);
    assert_eq!(b.misses, n, "the second job decodes nothing: {b:?} after {a:?}");
    assert!(b.hits >= a.hits + n, "the second job's first epoch is served from the first's cache: {b:?} after {a:?}");

    // A resize before the random crop: other entries, a cache of its own.
    let mut other = search_spec(&root, 1);
    other.ops.insert(1, OpSpec::resize(40));
    let (c, _c) = one_epoch(&addr, "c", &other, n);
    assert!(c.misses == n && c.hits < n, "another deterministic prefix does not share: {c:?}");
}

/// Importance-sampled jobs point the cache at their own draws, so two with other seeds
/// (other fingerprints) keep a cache each, whatever their prefix (a documented limit).
#[test]
fn importance_sampled_jobs_with_other_seeds_do_not_share_the_workers_cache() {
    let _watchdog = watchdog("importance_sampled_jobs_with_other_seeds_do_not_share", 120);
    let dir = tempfile::tempdir().unwrap();
    let (root, total) = dataset_and_bytes(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let _w = worker(&addr, &root, &[]);
    let n = IMAGES as u64;
    let (a, _a) = one_epoch(&addr, "a", &cached_spec(&root, 2 * total), n);
    assert_eq!(a.misses, n, "{a:?}");
    let mut other = cached_spec(&root, 2 * total);
    other.seed = 6;
    let (b, _b) = one_epoch(&addr, "b", &other, n);
    assert!(b.misses == n && b.hits < n, "the second importance job keeps a cache of its own: {b:?} after {a:?}");
}

/// The standard deviation of each epoch's batches' mean weights, from epoch [`WARM`] on
/// (the first drawn with a hot set), over the full batches.
fn batch_weight_spread(epochs: &[Vec<sluice_core::Batch>], batch: usize) -> f64 {
    let mut sds = Vec::new();
    for batches in &epochs[WARM..] {
        let means: Vec<f64> = batches
            .iter()
            .filter(|b| b.keys.len() == batch)
            .map(|b| b.weights.as_ref().unwrap().iter().map(|&w| f64::from(w)).sum::<f64>() / batch as f64)
            .collect();
        let mean = means.iter().sum::<f64>() / means.len() as f64;
        sds.push((means.iter().map(|m| (m - mean).powi(2)).sum::<f64>() / means.len() as f64).sqrt());
    }
    sds.iter().sum::<f64>() / sds.len() as f64
}

#[test]
fn aware_assignment_mixes_the_cold_draws_into_every_batch_as_the_local_loader_does() {
    let _watchdog = watchdog("aware_assignment_mixes_the_cold_draws_into_every_batch", 300);
    // The coverage sweep (its defaults) over 512 images, half of them cached: about a
    // quarter of each epoch's draws are cold, with weights near 2 against ~0.7 for hot ones.
    // Regrouped in blocks, batches through the service held none of them or only them, so
    // their mean weights (SGD's step sizes) spread nearly twice as far as the local
    // loader's (0.23 against 0.125); mixed in evenly, 0.045.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    let data = sluice_synth::DatasetOptions { images: 512, classes: 4, texture: 8, ..Default::default() };
    let total = sluice_synth::write_dataset(&root, &data, &|_| {}).unwrap().bytes;
    let batch = 16;
    let spec_with = |budget: u64| {
        let mut s = cached_spec(&root, budget);
        s.sampling = SamplingSpec::Importance { floor: 0.05, coverage_epochs: 2, miss_discount: 0.1, max_draws: 4.0 };
        s.batch.size = batch;
        s
    };
    let epochs = 4;
    let local = Loader::new(spec_with(total / 2), Shard::default()).unwrap();
    let local_epochs: Vec<Vec<sluice_core::Batch>> = (0..epochs)
        .map(|_| {
            local
                .iter()
                .map(|b| {
                    let b = b.unwrap();
                    let values: Vec<f64> = b.keys.iter().map(|&k| loss(k)).collect();
                    local.report(&b.keys, &values).unwrap();
                    b
                })
                .collect()
        })
        .collect();

    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &["--cache-assignment", "aware"]);
    let _w: Vec<Server> = (0..2).map(|_| worker(&addr, &root, &[])).collect();
    let remote = RemoteLoader::connect(&spec_with(total / 4), options(&addr, "mixed")).unwrap();
    let remote_epochs = within(200, "epochs through the service", move || {
        let mut remote = remote;
        (0..epochs)
            .map(|_| {
                remote.start_epoch();
                let mut got = Vec::new();
                while let Some(b) = remote.next_batch(&mut || false) {
                    let b = b.unwrap();
                    let values: Vec<f64> = b.keys.iter().map(|&k| loss(k)).collect();
                    remote.report(&b.keys, &values, ReportKind::Loss).unwrap();
                    got.push(b);
                }
                got
            })
            .collect::<Vec<_>>()
    });
    let (local_sd, remote_sd) = (batch_weight_spread(&local_epochs, batch), batch_weight_spread(&remote_epochs, batch));
    eprintln!("batches' mean weight, sd within an epoch: local {local_sd:.3}, through the service {remote_sd:.3}");
    assert!(local_sd > 0.0, "importance epochs weigh their draws");
    assert!(remote_sd <= 1.5 * local_sd, "through the service {remote_sd:.3}, locally {local_sd:.3}");
}
