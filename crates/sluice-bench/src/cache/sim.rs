//! A cache-policy simulator: the loader's own sampler, importance store and cache, driven
//! by a simulated trainer instead of real images, so hit rates of every policy can be
//! swept over cache sizes in seconds. Nothing is read or decoded; each entry is a
//! placeholder of the sample's size, and the trainer's per-sample losses come from a
//! model (below), not from a network.
//!
//! **The simulated trainer.** Sample `i` has a difficulty `d_i` drawn log-normal
//! (σ = 1.5: heavy-tailed, as per-sample losses of real classifiers are: most samples are
//! easy, a few stay hard). Each time it is trained on, its loss decays towards a floor of
//! half its difficulty: `L = d_i·(0.5 + 0.5·0.7^seen_i)·ε`, with multiplicative noise ε
//! (log-normal, σ = 0.2). Losses are reported per batch, as a trainer would.

use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;
use sluice_core::{
    ByteBudget, CacheLevel, CachePolicyKind, CacheSpec, Location, Manifest, SampleKey, SampleRng, SamplingSpec,
    ShuffleSpec,
};

use sluice_pipeline::cache::Cache;
use sluice_pipeline::importance::{DrawInputs, ImportanceStore};
use sluice_pipeline::{CachedData, Shard};

/// First epoch counted in [`SimResult::steady_hit_rate`].
pub const STEADY_FROM: u64 = 3;

/// One simulated training run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SimConfig {
    pub samples: usize,
    pub epochs: u64,
    pub batch: usize,
    /// Cache budget as a fraction of the dataset's bytes.
    pub cache_fraction: f64,
    pub seed: u64,
    /// Bytes of every entry.
    pub entry_bytes: u64,
}

/// What a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct SimResult {
    pub policy: CachePolicyKind,
    pub cache_fraction: f64,
    /// Hit rate over every epoch after the first (the first only fills the cache).
    pub hit_rate: f64,
    /// Hit rate from the fourth epoch on: after the first epoch with scores (epoch 1) and
    /// the one after it, while the cache moves to the samples that matter.
    pub steady_hit_rate: f64,
    pub hit_rate_per_epoch: Vec<f64>,
    /// Distinct samples trained on over the run, as a share of the dataset.
    pub coverage: f64,
    pub evictions: u64,
}

/// The sampler each policy was designed with: LRU under uniform epochs, SHADE and
/// FastMatch under their own samplers, `importance` under sluice's importance sampler.
pub fn sampler_for(policy: CachePolicyKind) -> SamplingSpec {
    match policy {
        CachePolicyKind::Lru => SamplingSpec::Uniform,
        CachePolicyKind::Shade => SamplingSpec::Shade,
        CachePolicyKind::Fastmatch => SamplingSpec::Fastmatch,
        CachePolicyKind::Importance => {
            SamplingSpec::Importance { floor: 0.05, coverage_epochs: 40, miss_discount: 0.1, max_draws: 4.0 }
        }
    }
}

fn lognormal(rng: &mut SampleRng, sigma: f64) -> f64 {
    // Box–Muller.
    let u1 = rng.next_f64().max(1e-12);
    let u2 = rng.next_f64();
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    (sigma * z).exp()
}

/// The simulated trainer's per-sample losses (see the module docs).
pub struct SimTrainer {
    difficulty: Vec<f64>,
    seen: Vec<u32>,
    rng: SampleRng,
}

impl SimTrainer {
    pub fn new(samples: usize, seed: u64) -> Self {
        let mut rng = SampleRng::new(seed, 0, SampleKey(u64::MAX - 1), 99);
        let difficulty = (0..samples).map(|_| 0.3 * lognormal(&mut rng, 1.5)).collect();
        Self { difficulty, seen: vec![0; samples], rng }
    }

    /// One training step on sample `i`: its loss now, and it gets a little easier.
    pub fn train(&mut self, i: usize) -> f64 {
        let (Some(d), Some(seen)) = (self.difficulty.get(i), self.seen.get_mut(i)) else {
            return 0.0;
        };
        let loss = d * (0.5 + 0.5 * 0.7f64.powi(*seen as i32)) * lognormal(&mut self.rng, 0.2);
        *seen += 1;
        loss
    }

    /// Share of samples trained on at least once.
    pub fn coverage(&self) -> f64 {
        self.seen.iter().filter(|&&s| s > 0).count() as f64 / self.seen.len().max(1) as f64
    }
}

/// Runs `policy` (with its sampler) over the simulated trainer.
pub fn simulate(policy: CachePolicyKind, sampling: SamplingSpec, cfg: &SimConfig) -> SimResult {
    let n = cfg.samples;
    let items = (0..n).map(|i| (Location::File { path: PathBuf::from(format!("{i}")) }, 0, cfg.entry_bytes)).collect();
    let manifest = Manifest::new(PathBuf::from("/sim"), items, Vec::new());
    let budget = (cfg.cache_fraction * (n as u64 * cfg.entry_bytes) as f64) as u64;
    let spec = CacheSpec {
        budget: ByteBudget::Bytes(budget),
        level: CacheLevel::Raw,
        resize: None,
        policy,
        disk: None,
        share: false,
    };
    let cache = Cache::new(&spec, budget.max(1), n);
    let mut store = ImportanceStore::new(0.5);
    let inputs = DrawInputs {
        manifest: &manifest,
        seed: cfg.seed,
        shuffle: ShuffleSpec::Global,
        sampling,
        shard: Shard::default(),
        locality: None,
    };

    let mut trainer = SimTrainer::new(n, cfg.seed);
    let mut per_epoch = Vec::new();
    let (mut hits_after, mut lookups_after) = (0u64, 0u64);
    let (mut hits_steady, mut lookups_steady) = (0u64, 0u64);
    for epoch in 0..cfg.epochs {
        let draw = store.draw(epoch, cache.capacity_entries(), &inputs);
        cache.set_priorities_for(&draw, &store, &manifest);
        let mut hits = 0u64;
        for batch in draw.order.chunks(cfg.batch) {
            let mut keys = Vec::with_capacity(batch.len());
            let mut losses = Vec::with_capacity(batch.len());
            for &i in batch {
                let key = i as u64;
                if cache.get(key).is_some() {
                    hits += 1;
                } else {
                    cache.offer(key, Arc::new(CachedData::Raw(vec![0; cfg.entry_bytes as usize])));
                }
                keys.push(key);
                losses.push(trainer.train(i as usize));
            }
            store.report(&keys, &losses);
            cache.report(&keys, &losses);
        }
        let rate = hits as f64 / draw.order.len().max(1) as f64;
        per_epoch.push(rate);
        if epoch > 0 {
            hits_after += hits;
            lookups_after += draw.order.len() as u64;
        }
        if epoch >= STEADY_FROM {
            hits_steady += hits;
            lookups_steady += draw.order.len() as u64;
        }
    }
    SimResult {
        policy,
        cache_fraction: cfg.cache_fraction,
        hit_rate: if lookups_after > 0 { hits_after as f64 / lookups_after as f64 } else { 0.0 },
        steady_hit_rate: if lookups_steady > 0 { hits_steady as f64 / lookups_steady as f64 } else { 0.0 },
        hit_rate_per_epoch: per_epoch,
        coverage: trainer.coverage(),
        evictions: cache.stats().tier.evictions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICIES: [CachePolicyKind; 4] =
        [CachePolicyKind::Lru, CachePolicyKind::Shade, CachePolicyKind::Fastmatch, CachePolicyKind::Importance];

    #[test]
    fn importance_beats_lru_and_shade_at_every_cache_size_and_reaches_96_percent_at_half() {
        for tenth in 1..=9 {
            let cfg = SimConfig {
                samples: 2000,
                epochs: 16,
                batch: 64,
                cache_fraction: tenth as f64 / 10.0,
                seed: 1,
                entry_bytes: 1000,
            };
            let r: Vec<SimResult> = POLICIES.iter().map(|&p| simulate(p, sampler_for(p), &cfg)).collect();
            let imp = r[3].hit_rate;
            assert!(imp > r[0].hit_rate && imp > r[1].hit_rate, "at {tenth}0%: {r:?}");
            assert!(r[3].steady_hit_rate > r[0].steady_hit_rate && r[3].steady_hit_rate > r[1].steady_hit_rate);
            if tenth == 5 {
                // ~0.96 on this seed; the margin absorbs seed-to-seed noise.
                assert!(r[3].steady_hit_rate >= 0.95, "importance at 50%: {:?}", r[3]);
            }
            // LRU under uniform epochs hits about the cached share, never more.
            assert!(r[0].hit_rate <= cfg.cache_fraction + 0.02, "{r:?}");
        }
    }
}
