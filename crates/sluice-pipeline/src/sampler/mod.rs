//! Epoch order: which samples an epoch visits, in what order, and which of them belong to
//! this rank. A pure function of (seed, epoch, shuffle, rank, world size) — and, for the
//! importance-driven samplers, of the importance state the epoch starts from — so every
//! rank and every resumed run computes the same order without talking to anyone.
//!
//! Here: the uniform orders (a permutation or a shuffle buffer) and sharding. The three
//! importance-driven samplers ([`importance_draw`], [`fastmatch_draw`], [`shade_draw`])
//! are in `scored`.

mod mix;
mod scored;

pub use mix::MixPlan;

pub use scored::{
    fastmatch_draw, fastmatch_normalise, hot_set, importance_draw, shade_draw, ImportanceParams, ImportanceView,
    HOT_SET_MARGIN, PROMOTION_OVER_FLOOR,
};

use sluice_core::{SampleKey, SampleRng, ShuffleSpec};

/// RNG stream ids, kept apart from the per-sample augmentation stream (0).
const PERMUTATION_STREAM: u64 = 1;
const BUFFER_STREAM: u64 = 2;
const IMPORTANCE_STREAM: u64 = 3;
const FASTMATCH_STREAM: u64 = 4;
const SHADE_STREAM: u64 = 5;
const COVERAGE_STREAM: u64 = 6;
/// The key slot used for epoch-wide (not per-sample) randomness.
const EPOCH_KEY: SampleKey = SampleKey(u64::MAX);

/// This rank's share of the job: `rank` in `0..world_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub rank: usize,
    pub world_size: usize,
}

impl Default for Shard {
    fn default() -> Self {
        Self { rank: 0, world_size: 1 }
    }
}

/// The samples (manifest positions) this rank visits in `epoch`, in order.
///
/// With several ranks every rank gets a disjoint, equally long slice of the same global
/// order (rank r takes positions r, r + w, r + 2w, ...); the last `n mod w` samples of the
/// global order are left out of that epoch, and since the order changes every epoch, so do
/// they.
///
/// The global order does not depend on the world size, and neither do the global batches:
/// with `b` samples per rank, batch `g` of every rank together hold positions
/// `g·b·w .. (g+1)·b·w` of the global order (rank r the ones ≡ r mod w), so for a constant
/// global batch `B = b·w` global batch `g` is the same `B` samples on any number of ranks.
/// That is what lets a checkpoint resume on another world size (elastic resume). Only the
/// short last global batch of an epoch without `drop_last` depends on `w`, through the
/// `n mod w` samples left out.
pub fn epoch_order(n: usize, seed: u64, epoch: u64, shuffle: ShuffleSpec, shard: Shard) -> Vec<u32> {
    let global = match shuffle {
        ShuffleSpec::None => (0..n as u32).collect(),
        ShuffleSpec::Global => permutation(n, seed, epoch),
        ShuffleSpec::Buffer { size } => buffer_shuffle(n, size, seed, epoch),
    };
    if shard.world_size <= 1 {
        return global;
    }
    let per_rank = n / shard.world_size;
    global.into_iter().skip(shard.rank).step_by(shard.world_size).take(per_rank).collect()
}

/// Fisher–Yates over 0..n.
fn permutation(n: usize, seed: u64, epoch: u64) -> Vec<u32> {
    let mut rng = SampleRng::new(seed, epoch, EPOCH_KEY, PERMUTATION_STREAM);
    let mut order: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// tf.data's shuffle buffer over the manifest order: fill `size` slots, then repeatedly emit
/// a random slot and refill it with the next sample. Reads stay near-sequential.
fn buffer_shuffle(n: usize, size: usize, seed: u64, epoch: u64) -> Vec<u32> {
    let mut rng = SampleRng::new(seed, epoch, EPOCH_KEY, BUFFER_STREAM);
    let mut next = 0u32;
    let mut buffer: Vec<u32> = Vec::with_capacity(size.min(n));
    let mut order = Vec::with_capacity(n);
    while (next as usize) < n && buffer.len() < size {
        buffer.push(next);
        next += 1;
    }
    while !buffer.is_empty() {
        let i = rng.below(buffer.len() as u64) as usize;
        order.push(buffer[i]);
        if (next as usize) < n {
            buffer[i] = next;
            next += 1;
        } else {
            buffer.swap_remove(i);
        }
    }
    order
}

/// One epoch's draw: manifest positions in order and, when the sampler is not uniform,
/// the weight of each position that makes the weighted loss an unbiased estimate of the
/// uniform mean loss.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochDraw {
    pub order: Vec<u32>,
    pub weights: Option<Vec<f32>>,
    /// Expected number of times each manifest position appears in this epoch (1 for a
    /// permutation). The `importance` cache policy keeps the entries with the most.
    pub expected: Vec<f64>,
}

impl EpochDraw {
    /// This rank's share of a global draw (same striding as [`epoch_order`]).
    pub fn shard(self, shard: Shard) -> Self {
        if shard.world_size <= 1 {
            return self;
        }
        let per_rank = self.order.len() / shard.world_size;
        let pick = |i: usize| i % shard.world_size == shard.rank && i / shard.world_size < per_rank;
        let order = self.order.iter().enumerate().filter(|(i, _)| pick(*i)).map(|(_, &o)| o).collect();
        let weights = self.weights.map(|w| w.iter().enumerate().filter(|(i, _)| pick(*i)).map(|(_, &x)| x).collect());
        Self { order, weights, expected: self.expected }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(mut v: Vec<u32>) -> Vec<u32> {
        v.sort_unstable();
        v
    }

    #[test]
    fn global_shuffle_is_a_permutation_that_changes_per_epoch_and_repeats_per_seed() {
        let a = epoch_order(1000, 3, 0, ShuffleSpec::Global, Shard::default());
        assert_eq!(sorted(a.clone()), (0..1000).collect::<Vec<_>>());
        assert_eq!(a, epoch_order(1000, 3, 0, ShuffleSpec::Global, Shard::default()));
        assert_ne!(a, epoch_order(1000, 3, 1, ShuffleSpec::Global, Shard::default()));
        assert_ne!(a, epoch_order(1000, 4, 0, ShuffleSpec::Global, Shard::default()));
        assert_ne!(a, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn buffer_shuffle_visits_everything_and_stays_local() {
        let order = epoch_order(1000, 1, 0, ShuffleSpec::Buffer { size: 10 }, Shard::default());
        assert_eq!(sorted(order.clone()), (0..1000).collect::<Vec<_>>());
        // A sample can only be emitted once it has entered the 10-slot buffer.
        for (pos, &s) in order.iter().enumerate() {
            assert!((s as usize) < pos + 10, "sample {s} emitted at {pos}");
        }
        let big = epoch_order(5, 1, 0, ShuffleSpec::Buffer { size: 100 }, Shard::default());
        assert_eq!(sorted(big), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn ranks_get_disjoint_equal_shards_of_one_global_order() {
        let n = 103;
        let shards: Vec<Vec<u32>> =
            (0..4).map(|rank| epoch_order(n, 9, 2, ShuffleSpec::Global, Shard { rank, world_size: 4 })).collect();
        assert!(shards.iter().all(|s| s.len() == 25));
        let mut all: Vec<u32> = shards.concat();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 100, "shards overlap");
        let global = epoch_order(n, 9, 2, ShuffleSpec::Global, Shard::default());
        assert_eq!(shards[1][..3], [global[1], global[5], global[9]]);
    }

    #[test]
    fn global_batches_are_the_same_on_any_world_size_with_the_same_global_batch() {
        // Random (n, global batch, world size): rank r's batch g, over all ranks, is
        // positions g·B .. (g+1)·B of the one global order (the whole global batches).
        for case in 0..500u64 {
            let mut rng = SampleRng::new(7, 0, SampleKey(case), 0);
            let world = 1 + rng.below(8) as usize;
            let global = world * (1 + rng.below(6) as usize);
            let n = rng.below(200) as usize;
            let order = epoch_order(n, case, 1, ShuffleSpec::Global, Shard::default());
            let ranks: Vec<Vec<u32>> = (0..world)
                .map(|rank| epoch_order(n, case, 1, ShuffleSpec::Global, Shard { rank, world_size: world }))
                .collect();
            let b = global / world;
            for g in 0..n / global {
                let mut got: Vec<u32> = ranks.iter().flat_map(|r| r[g * b..(g + 1) * b].iter().copied()).collect();
                got.sort_unstable();
                assert_eq!(got, sorted(order[g * global..(g + 1) * global].to_vec()), "n {n} B {global} w {world}");
            }
        }
    }

    #[test]
    fn sharding_a_draw_keeps_weights_aligned() {
        let n = 10;
        let d = EpochDraw {
            order: (0..10).collect(),
            weights: Some((0..10).map(|x| x as f32).collect()),
            expected: vec![1.0; n],
        };
        let s = d.shard(Shard { rank: 1, world_size: 3 });
        assert_eq!(s.order, vec![1, 4, 7]);
        assert_eq!(s.weights.unwrap(), vec![1.0, 4.0, 7.0]);
    }
}
