//! `sluice-bench disk-cache`: the cache's disk tier, through the real loader on real JPEGs.
//!
//! 1. **Second-epoch hit rate at half the dataset.** A disk tier of raw entries with half
//!    the bytes the whole dataset takes there (a memory tier too small for any entry),
//!    shuffled epochs: Belady over the known next epoch vs LRU, interleaved, `--reps`
//!    runs each (each from an empty folder), medians.
//! 2. **Warm-epoch throughput.** The same pipeline on plain local files (no cache) vs
//!    with a disk tier that holds the whole dataset (raw bytes, and decoded pixels),
//!    warmed by one epoch; epochs interleaved, medians of `--reps`, as ratios to the
//!    plain pipeline measured in the same run.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use serde_json::json;
use sluice_core::{
    ByteBudget, CacheLevel, CachePolicyKind, CacheSpec, DiskCacheSpec, DiskPolicyKind, PipelineSpec, SourceSpec,
};
use sluice_pipeline::{Loader, Shard};
use sluice_profile::median;

use crate::dataset;

#[derive(clap::Args)]
pub struct Args {
    /// Images (generated in data/bench-disk-cache).
    #[arg(long, default_value_t = 400)]
    pub images: usize,
    /// Runs of each configuration (interleaved); medians reported.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Worker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Folder for the disk tiers (emptied before each hit-rate run).
    #[arg(long, default_value = "data/bench-disk-cache-tier")]
    pub dir: PathBuf,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print results as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

fn spec(a: &Args, root: &Path, disk: Option<(PathBuf, u64, DiskPolicyKind, CacheLevel)>) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(SourceSpec::ImageFolder { root: root.to_path_buf() }, 224, 32);
    s.threads = a.threads.into();
    s.seed = a.seed;
    s.cache = disk.map(|(dir, budget, policy, level)| CacheSpec {
        // Memory too small for any entry: every lookup goes to the disk tier.
        budget: ByteBudget::Bytes(1),
        level,
        resize: None,
        policy: CachePolicyKind::Lru,
        disk: Some(DiskCacheSpec { dir, budget: ByteBudget::Bytes(budget), policy }),
        share: false,
    });
    s
}

fn epoch(loader: &Loader) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    let mut n = 0usize;
    for b in loader.iter() {
        n += b?.len();
    }
    Ok(n as f64 / t0.elapsed().as_secs_f64())
}

fn disk_stats(loader: &Loader) -> anyhow::Result<sluice_pipeline::cache::DiskStats> {
    loader.stats().cache.and_then(|c| c.disk).context("the loader has no disk tier")
}

pub fn main(a: Args) -> anyhow::Result<()> {
    let root = PathBuf::from("data/bench-disk-cache");
    dataset::ensure(&root, a.images, 0)?;
    let fresh = |dir: &Path| -> anyhow::Result<()> {
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("emptying {}", dir.display()))?;
        }
        Ok(())
    };

    // The whole dataset's bytes in the tier, raw.
    let full_dir = a.dir.join("full-raw");
    fresh(&full_dir)?;
    let full = Loader::new(
        spec(&a, &root, Some((full_dir, 1 << 40, DiskPolicyKind::Lru, CacheLevel::Raw))),
        Shard::default(),
    )?;
    epoch(&full)?;
    let full_bytes = disk_stats(&full)?.tier.used_bytes;
    let n = full.manifest().len();
    let half = full_bytes / 2;
    eprintln!("{n} images, {full_bytes} bytes of raw entries; disk budget {half} (50%)");

    // 1. Second-epoch hit rate, Belady vs LRU, interleaved.
    let mut rates: Vec<(DiskPolicyKind, Vec<f64>)> =
        vec![(DiskPolicyKind::Belady, Vec::new()), (DiskPolicyKind::Lru, Vec::new())];
    for rep in 0..a.reps {
        for (policy, out) in rates.iter_mut() {
            let dir = a.dir.join("half");
            fresh(&dir)?;
            let loader = Loader::new(spec(&a, &root, Some((dir, half, *policy, CacheLevel::Raw))), Shard::default())?;
            epoch(&loader)?;
            let before = disk_stats(&loader)?;
            epoch(&loader)?;
            let after = disk_stats(&loader)?;
            let lookups = (after.tier.hits + after.tier.misses) - (before.tier.hits + before.tier.misses);
            let rate = (after.tier.hits - before.tier.hits) as f64 / lookups.max(1) as f64;
            eprintln!(
                "rep {rep}: {policy:?} epoch-2 disk hit rate {rate:.3} (used {} of {half})",
                after.tier.used_bytes
            );
            out.push(rate);
        }
    }
    let hit = |i: usize| median(&mut rates[i].1.clone());
    let (belady, lru) = (hit(0), hit(1));
    eprintln!("epoch-2 hit rate at 50%: belady {belady:.3}, lru {lru:.3} (medians of {})", a.reps);

    // 2. Warm-epoch throughput: plain local files vs the disk tier holding the dataset.
    let configs: Vec<(&str, PipelineSpec)> = vec![
        ("local files, no cache", spec(&a, &root, None)),
        (
            "disk tier, raw",
            spec(&a, &root, Some((a.dir.join("warm-raw"), 1 << 40, DiskPolicyKind::Belady, CacheLevel::Raw))),
        ),
        (
            "disk tier, decoded",
            spec(&a, &root, Some((a.dir.join("warm-decoded"), 1 << 40, DiskPolicyKind::Belady, CacheLevel::Decoded))),
        ),
    ];
    let mut loaders = Vec::new();
    for (name, s) in configs {
        if let Some(d) = s.cache.as_ref().and_then(|c| c.disk.as_ref()) {
            fresh(&d.dir)?;
        }
        let loader = Loader::new(s, Shard::default())?;
        epoch(&loader)?; // warms the tier (and the page cache for the plain pipeline)
        loaders.push((name, loader, Vec::new()));
    }
    for rep in 0..a.reps {
        for (name, loader, out) in loaders.iter_mut() {
            let rate = epoch(loader)?;
            eprintln!("rep {rep}: {name}: {rate:.0} samples/s");
            out.push(rate);
        }
    }
    let mut throughput = Vec::new();
    let base = median(&mut loaders[0].2.clone());
    for (name, loader, rates) in &loaders {
        let m = median(&mut rates.clone());
        let disk = loader.stats().cache.and_then(|c| c.disk);
        eprintln!("{name}: median {m:.0} samples/s, {:.3}x local files", m / base);
        throughput.push(
            json!({ "run": name, "samples_per_s": rates, "median": m, "vs_local_files": m / base, "disk": disk }),
        );
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "images": n,
                "full_raw_bytes": full_bytes,
                "hit_rate_epoch2_half": { "belady": rates[0].1, "lru": rates[1].1, "belady_median": belady, "lru_median": lru },
                "warm_throughput": throughput,
            }))?
        );
    }
    Ok(())
}
