//! Which node (a learner, a service worker) caches which sample: every placement in sluice
//! is an [`Owners`] table, manifest position → owner or nobody, that its readers ask with
//! [`Owners::owner`]. Two rules fill it, both pure functions of what every node knows, so
//! all agree without a message:
//!
//! * [`Owners::seeded_runs`], the learners' collaborative cache (Liu, Nicolae et al. §4.3):
//!   a seeded permutation of the dataset cut into consecutive runs, one per node, as long
//!   as its cache; samples past the last run are cached nowhere.
//! * [`Rendezvous`], the service's workers: each key goes to the node whose hash with it
//!   ranks highest, so a node that comes or goes moves only its own keys.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::{SampleKey, SampleRng};

/// In an [`Owners`] table: a position no node caches.
pub const NOBODY: u32 = u32::MAX;

/// The owner (index of the caching node) of every manifest position, or [`NOBODY`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Owners {
    owner: Vec<u32>,
}

/// RNG stream of [`Owners::seeded_runs`], apart from the sampler's (1..=6) and
/// augmentations' (0).
const PLACEMENT_STREAM: u64 = 7;
/// The seeded placement is the same every epoch: it uses an epoch slot no epoch reaches.
const PLACEMENT_EPOCH: u64 = u64::MAX;

impl Owners {
    /// A table from each position's owner ([`NOBODY`] for none).
    pub fn new(owner: Vec<u32>) -> Self {
        Self { owner }
    }

    /// Places `n` samples on nodes whose caches hold `capacities[node]` samples each: a
    /// permutation seeded by `seed`, cut into one run per node (see the module).
    pub fn seeded_runs(n: usize, seed: u64, capacities: &[u64]) -> Self {
        let mut rng = SampleRng::new(seed, PLACEMENT_EPOCH, SampleKey(u64::MAX), PLACEMENT_STREAM);
        let mut order: Vec<u32> = (0..n as u32).collect();
        for i in (1..n).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
        let mut owner = vec![NOBODY; n];
        let mut next = order.iter();
        for (node, size) in fit(capacities, n as u64).into_iter().enumerate() {
            for &pos in next.by_ref().take(usize::try_from(size).unwrap_or(usize::MAX)) {
                owner[pos as usize] = node as u32;
            }
        }
        Self { owner }
    }

    /// The node that caches position `pos`, if any.
    pub fn owner(&self, pos: u32) -> Option<usize> {
        self.owner.get(pos as usize).copied().filter(|&o| o != NOBODY).map(|o| o as usize)
    }

    /// Each position's owner, [`NOBODY`] for none.
    pub fn as_slice(&self) -> &[u32] {
        &self.owner
    }

    /// How many positions each of `nodes` nodes owns.
    pub fn counts(&self, nodes: usize) -> Vec<usize> {
        let mut c = vec![0; nodes];
        for &o in &self.owner {
            if let Some(x) = c.get_mut(o as usize) {
                *x += 1;
            }
        }
        c
    }
}

/// The cache sizes scaled down, in proportion, when together they exceed the dataset, so
/// every node holds its share instead of the first ones holding everything.
fn fit(capacities: &[u64], n: u64) -> Vec<u64> {
    let total: u128 = capacities.iter().map(|&c| u128::from(c)).sum();
    if total <= u128::from(n) {
        return capacities.to_vec();
    }
    let mut sizes: Vec<u64> = capacities.iter().map(|&c| (u128::from(c) * u128::from(n) / total) as u64).collect();
    // Rounding down leaves a few samples over: one more each to the first nodes.
    let mut left = n - sizes.iter().sum::<u64>();
    for (s, &c) in sizes.iter_mut().zip(capacities) {
        if left > 0 && *s < c {
            *s += 1;
            left -= 1;
        }
    }
    sizes
}

/// Rendezvous (highest random weight) hashing of keys onto nodes named by strings.
#[derive(Debug, Clone)]
pub struct Rendezvous {
    seeds: Vec<u64>,
}

impl Rendezvous {
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        Self { seeds: names.into_iter().map(|n| xxh3_64_with_seed(n.as_bytes(), 0x51ce)).collect() }
    }

    fn score(&self, key: u64, node: usize) -> (u64, usize) {
        (xxh3_64_with_seed(&key.to_le_bytes(), self.seeds[node]), node)
    }

    /// `key`'s first choice (none without nodes).
    pub fn owner(&self, key: u64) -> Option<usize> {
        (0..self.seeds.len()).max_by_key(|&j| self.score(key, j))
    }

    /// Every node, `key`'s first choice first.
    pub fn ranked(&self, key: u64) -> Vec<usize> {
        let mut ranked: Vec<usize> = (0..self.seeds.len()).collect();
        ranked.sort_by_key(|&j| std::cmp::Reverse(self.score(key, j)));
        ranked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_runs_are_a_pure_function_of_seed_and_capacities() {
        let a = Owners::seeded_runs(1000, 5, &[100, 300, 50]);
        assert_eq!(a, Owners::seeded_runs(1000, 5, &[100, 300, 50]));
        assert_ne!(a, Owners::seeded_runs(1000, 6, &[100, 300, 50]));
        assert_eq!(a.counts(3), vec![100, 300, 50]);
        let cached = (0..1000).filter(|&p| a.owner(p).is_some()).count();
        assert_eq!(cached, 450);
        assert_eq!(a.owner(5000), None);
    }

    #[test]
    fn capacities_beyond_the_dataset_place_every_sample_once() {
        let a = Owners::seeded_runs(100, 1, &[80, 80]);
        assert_eq!(a.counts(2), vec![50, 50], "an oversized aggregate is shared in proportion");
        assert!((0..100).all(|p| a.owner(p).is_some()));
    }

    #[test]
    fn rendezvous_moves_only_the_keys_of_a_node_that_goes() {
        let names: Vec<String> = (0..3).map(|i| format!("127.0.0.1:{}", 7000 + i)).collect();
        let three = Rendezvous::new(names.iter().map(String::as_str));
        let two = Rendezvous::new(names[..2].iter().map(String::as_str));
        let per: Vec<usize> = (0..3).map(|j| (0..3000u64).filter(|&k| three.owner(k) == Some(j)).count()).collect();
        assert!(per.iter().all(|&c| (800..1200).contains(&c)), "{per:?}");
        for k in 0..3000u64 {
            assert_eq!(three.ranked(k)[0], three.owner(k).unwrap_or(usize::MAX));
            if three.owner(k) != Some(2) {
                assert_eq!(two.owner(k), three.owner(k), "key {k} moved though its node stayed");
            }
        }
        assert_eq!(Rendezvous::new([]).owner(1), None);
    }
}
