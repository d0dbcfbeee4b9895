//! Which learner caches which sample: a pure function of (seed, per-learner cache sizes,
//! dataset size), so every learner knows every other learner's cache contents without a
//! message (Liu, Nicolae et al. §4.3). A seeded permutation of the dataset is cut into
//! consecutive runs, one per learner, as long as its cache; samples past the last run are
//! cached nowhere.

use sluice_core::{SampleKey, SampleRng};

/// RNG stream of the placement, apart from the sampler's (1..=6) and augmentations' (0).
const PLACEMENT_STREAM: u64 = 7;
/// The placement is the same every epoch: it uses an epoch slot no epoch reaches.
const PLACEMENT_EPOCH: u64 = u64::MAX;

/// The owner (caching learner) of every manifest position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    owner: Vec<Option<u32>>,
}

impl Placement {
    /// Places `n` samples on learners whose caches hold `cache_samples[rank]` samples each.
    pub fn new(n: usize, seed: u64, cache_samples: &[u64]) -> Self {
        let mut rng = SampleRng::new(seed, PLACEMENT_EPOCH, SampleKey(u64::MAX), PLACEMENT_STREAM);
        let mut order: Vec<u32> = (0..n as u32).collect();
        for i in (1..n).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
        let mut owner = vec![None; n];
        let mut next = order.iter();
        for (rank, size) in fit(cache_samples, n as u64).into_iter().enumerate() {
            for &pos in next.by_ref().take(usize::try_from(size).unwrap_or(usize::MAX)) {
                owner[pos as usize] = Some(rank as u32);
            }
        }
        Self { owner }
    }

    /// The learner that caches manifest position `pos`, if any.
    pub fn owner(&self, pos: u32) -> Option<usize> {
        self.owner.get(pos as usize).copied().flatten().map(|r| r as usize)
    }

    /// How many samples each of `world_size` learners caches.
    pub fn counts(&self, world_size: usize) -> Vec<usize> {
        let mut c = vec![0; world_size];
        for r in self.owner.iter().flatten() {
            if let Some(x) = c.get_mut(*r as usize) {
                *x += 1;
            }
        }
        c
    }
}

/// The cache sizes scaled down, in proportion, when together they exceed the dataset, so
/// every learner holds its share instead of the first ones holding everything.
fn fit(cache_samples: &[u64], n: u64) -> Vec<u64> {
    let total: u128 = cache_samples.iter().map(|&c| u128::from(c)).sum();
    if total <= u128::from(n) {
        return cache_samples.to_vec();
    }
    let mut sizes: Vec<u64> = cache_samples.iter().map(|&c| (u128::from(c) * u128::from(n) / total) as u64).collect();
    // Rounding down leaves a few samples over: one more each to the first learners.
    let mut left = n - sizes.iter().sum::<u64>();
    for (s, &c) in sizes.iter_mut().zip(cache_samples) {
        if left > 0 && *s < c {
            *s += 1;
            left -= 1;
        }
    }
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_is_a_pure_function_of_seed_and_budgets() {
        let a = Placement::new(1000, 5, &[100, 300, 50]);
        assert_eq!(a, Placement::new(1000, 5, &[100, 300, 50]));
        assert_ne!(a, Placement::new(1000, 6, &[100, 300, 50]));
        assert_eq!(a.counts(3), vec![100, 300, 50]);
        let cached = (0..1000).filter(|&p| a.owner(p).is_some()).count();
        assert_eq!(cached, 450);
        assert_eq!(a.owner(5000), None);
    }

    #[test]
    fn budgets_beyond_the_dataset_place_every_sample_once() {
        let a = Placement::new(100, 1, &[80, 80]);
        assert_eq!(a.counts(2), vec![50, 50], "an oversized aggregate is shared in proportion");
        assert!((0..100).all(|p| a.owner(p).is_some()));
    }
}
