//! Several learners (DDP ranks) over one dataset. Every learner draws the same global
//! order from (seed, epoch); each global batch (`batch.size × p` consecutive samples of
//! it) is split into p local batches of `batch.size`, either by the plain strided split
//! or by Yang & Cong's locality-aware assignment against a placement every learner derives
//! from the seed ([`Owners::seeded_runs`], one of sluice-core's placement rules). Both are
//! pure functions, so the learners agree without messages, and per step the global batch
//! is the same multiset either way.
//!
//! Here: the per-rank view of an epoch. [`Locality::placement`]: who caches what.
//! `assign`: who loads what of one global batch. `barrier`: learner processes on one
//! machine lined up at named points (`sluice run --barrier`).

pub mod assign;
pub mod barrier;
pub mod model;
pub mod peer;

use sluice_core::{Assignment, LocalitySpec, Owners, SpecError};

use crate::sampler::{EpochDraw, Shard};

/// One learner's view of a locality-aware job.
#[derive(Debug, Clone)]
pub struct Locality {
    /// Which learner caches which manifest position.
    pub placement: Owners,
    pub assignment: Assignment,
    pub shard: Shard,
    /// The local batch size: a global batch is `batch × world_size` samples.
    pub batch: usize,
}

impl Locality {
    pub fn new(spec: &LocalitySpec, n: usize, seed: u64, shard: Shard, batch: usize) -> Result<Self, SpecError> {
        let budgets = spec.cache_samples_for(shard.world_size)?;
        Ok(Self { placement: Owners::seeded_runs(n, seed, &budgets), assignment: spec.assignment, shard, batch })
    }

    /// Positions (indices into `global`, the job's whole epoch order) of every learner's
    /// samples, step by step: `result[rank]` in the order that rank loads them. Every
    /// learner gets `global.len() / p` samples; the last `len mod p` go to none.
    pub fn split(&self, global: &[u32]) -> Vec<Vec<usize>> {
        let p = self.shard.world_size.max(1);
        let total = global.len() / p * p;
        let step = self.batch.max(1) * p;
        let mut out: Vec<Vec<usize>> = vec![Vec::with_capacity(total / p); p];
        let mut start = 0;
        while start < total {
            let end = (start + step).min(total);
            let parts = match self.assignment {
                Assignment::Partitioned => assign::partitioned(end - start, p),
                Assignment::Aware => assign::locality_aware(&global[start..end], &self.placement, p),
            };
            for (rank, part) in parts.into_iter().enumerate() {
                out[rank].extend(part.into_iter().map(|i| start + i));
            }
            start = end;
        }
        out
    }

    /// This learner's share of a global draw.
    pub fn share(&self, draw: EpochDraw) -> EpochDraw {
        let mine = self.split(&draw.order).into_iter().nth(self.shard.rank).unwrap_or_default();
        let order = mine.iter().map(|&i| draw.order[i]).collect();
        let weights = draw.weights.map(|w| mine.iter().map(|&i| w[i]).collect());
        EpochDraw { order, weights, expected: draw.expected }
    }

    /// Whether this learner caches manifest position `pos`.
    pub fn caches(&self, pos: u32) -> bool {
        self.placement.owner(pos) == Some(self.shard.rank)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::epoch_order;
    use sluice_core::ShuffleSpec;

    fn locality(assignment: Assignment, budgets: &[u64], n: usize, batch: usize) -> Locality {
        let p = budgets.len();
        let spec = LocalitySpec {
            assignment,
            cache_samples: budgets.to_vec(),
            peers: vec![],
            peer_timeout_ms: 100,
            token: None,
        };
        Locality::new(&spec, n, 11, Shard { rank: 0, world_size: p }, batch).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Per step (global batch), the sorted samples each assignment hands out, and each
    /// learner's local batch size at that step.
    fn steps(l: &Locality, global: &[u32]) -> (Vec<Vec<u32>>, Vec<Vec<usize>>) {
        let p = l.shard.world_size;
        let split = l.split(global);
        let per_rank = global.len() / p;
        let n_steps = per_rank.div_ceil(l.batch);
        let mut sets = Vec::new();
        let mut sizes = Vec::new();
        for s in 0..n_steps {
            let lo = s * l.batch;
            let hi = (lo + l.batch).min(per_rank);
            let mut set: Vec<u32> = split.iter().flat_map(|part| part[lo..hi].iter().map(|&i| global[i])).collect();
            set.sort_unstable();
            sets.push(set);
            sizes.push(split.iter().map(|part| part[lo..hi].len()).collect());
        }
        (sets, sizes)
    }

    #[test]
    fn every_step_hands_out_the_baselines_multiset_in_equal_local_batches() {
        let n = 1003;
        let batch = 16;
        for budgets in [
            vec![300, 300],
            vec![500, 10, 200],
            vec![250; 4],
            vec![400, 0, 100, 300],
            vec![90, 10, 150, 50, 125, 125, 0, 300],
            vec![200; 8],
        ] {
            let p = budgets.len();
            let global = epoch_order(n, 11, 3, ShuffleSpec::Global, Shard::default());
            let aware = locality(Assignment::Aware, &budgets, n, batch);
            let base = locality(Assignment::Partitioned, &budgets, n, batch);
            let (aware_sets, aware_sizes) = steps(&aware, &global);
            let (base_sets, base_sizes) = steps(&base, &global);
            assert_eq!(aware_sets, base_sets, "p = {p}: a step's multiset changed");
            assert_eq!(aware_sizes, base_sizes, "p = {p}: local batch sizes changed");
            for sizes in &aware_sizes {
                assert!(sizes.iter().all(|&s| s == sizes[0]), "p = {p}: unequal local batches {sizes:?}");
            }
            // The baseline is today's strided shard.
            for rank in 0..p {
                let today = epoch_order(n, 11, 3, ShuffleSpec::Global, Shard { rank, world_size: p });
                let mine: Vec<u32> = base.split(&global)[rank].iter().map(|&i| global[i]).collect();
                assert_eq!(mine, today, "p = {p}, rank {rank}");
            }
        }
    }

    #[test]
    fn locality_aware_moves_few_samples_when_the_caches_hold_the_dataset() {
        let n = 4096;
        let p = 4;
        let l = locality(Assignment::Aware, &[1024; 4], n, 32);
        let base = locality(Assignment::Partitioned, &[1024; 4], n, 32);
        let global = epoch_order(n, 11, 0, ShuffleSpec::Global, Shard::default());
        let remote = |l: &Locality| -> usize {
            l.split(&global)
                .iter()
                .enumerate()
                .map(|(rank, part)| part.iter().filter(|&&i| l.placement.owner(global[i]) != Some(rank)).count())
                .sum()
        };
        let aware = remote(&l) as f64 / n as f64;
        let plain = remote(&base) as f64 / n as f64;
        assert!(aware <= 0.07, "locality-aware moved {aware:.3} of the samples");
        assert!((plain - (p - 1) as f64 / p as f64).abs() < 0.05, "partitioned moved {plain:.3}");
    }
}
