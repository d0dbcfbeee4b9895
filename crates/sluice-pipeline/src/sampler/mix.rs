//! The epoch order of a mixed source (`kind = "mix"`): global batches of `B` samples, each
//! holding `floor(w·B)` or `ceil(w·B)` samples of each source (weights `w` normalised),
//! taken from each source's own order of the epoch, until the first source runs out.
//!
//! How many samples of each source a batch holds does not depend on the seed: each source
//! gets `floor(w·B)`, and the samples left over go to the sources furthest behind their
//! share so far (ties to the lower index). A source's running total then stays within one
//! sample of `w·B·g` after `g` batches, and an epoch's length is fixed by the sizes, the
//! weights and `B` alone. What the seed decides: each source's order within the epoch (as
//! for one source: a permutation, a shuffle buffer or none) and the order of the samples
//! within each batch (unless `shuffle = "none"`).

use sluice_core::{Manifest, SampleRng, ShuffleSpec, SourceSpec, SpecError};

use super::{buffer_shuffle, permutation, EPOCH_KEY};

/// RNG stream of a mix: each source's order seed, and each batch's inner shuffle.
const MIX_STREAM: u64 = 7;

/// The sources of a mix: how many samples each has (in manifest order: source `s` holds
/// positions `sizes[..s].sum() ..`), and their weights.
#[derive(Debug, Clone, PartialEq)]
pub struct MixPlan {
    pub sizes: Vec<usize>,
    pub weights: Vec<f64>,
}

impl MixPlan {
    /// The plan of `source` over its joined `manifest`: `None` unless it is a mix; refused
    /// when the manifest was not built from this mix (another number of sources). The local
    /// loader and the service's dispatcher both size a mix's epoch with it.
    pub fn of(source: &SourceSpec, manifest: &Manifest) -> Result<Option<Self>, SpecError> {
        let SourceSpec::Mix { sources } = source else { return Ok(None) };
        if manifest.parts.len() != sources.len() {
            return Err(SpecError::new(
                "source.sources",
                format!(
                    "the mix names {} sources but the manifest joins {} (it was not built from this spec)",
                    sources.len(),
                    manifest.parts.len()
                ),
            ));
        }
        Ok(Some(Self { sizes: manifest.parts.clone(), weights: sources.iter().map(|s| s.weight).collect() }))
    }

    /// The share of each source: weights normalised to add up to 1.
    fn shares(&self) -> Vec<f64> {
        let total: f64 = self.weights.iter().sum();
        self.weights.iter().map(|w| w / total).collect()
    }

    /// Samples of each source in every global batch of an epoch of `global_batch`, batch
    /// after batch, until one source has too few left for the next.
    pub fn batch_counts(&self, global_batch: usize) -> Vec<Vec<usize>> {
        let mut batches = Vec::new();
        self.each_batch(global_batch, |counts| batches.push(counts.to_vec()));
        batches
    }

    /// Calls `f` with each global batch's samples per source; returns how many batches.
    fn each_batch(&self, global_batch: usize, mut f: impl FnMut(&[usize])) -> usize {
        let shares = self.shares();
        let quota: Vec<f64> = shares.iter().map(|s| s * global_batch as f64).collect();
        let base: Vec<usize> = quota.iter().map(|q| q.floor() as usize).collect();
        let extra = global_batch.saturating_sub(base.iter().sum());
        let mut taken = vec![0usize; self.sizes.len()];
        let mut batches = 0usize;
        if global_batch == 0 || self.sizes.is_empty() {
            return batches;
        }
        let mut behind: Vec<(f64, usize)> = Vec::with_capacity(quota.len());
        let mut counts = base.clone();
        loop {
            let g = batches as f64;
            // How far each source is behind its share, counting this batch's quota.
            behind.clear();
            behind.extend((0..quota.len()).map(|s| (quota[s] * (g + 1.0) - (taken[s] + base[s]) as f64, s)));
            behind.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            counts.copy_from_slice(&base);
            for &(_, s) in behind.iter().take(extra) {
                counts[s] += 1;
            }
            if (0..counts.len()).any(|s| taken[s] + counts[s] > self.sizes[s]) {
                return batches;
            }
            for (t, c) in taken.iter_mut().zip(&counts) {
                *t += c;
            }
            f(&counts);
            batches += 1;
        }
    }

    /// Global batches per epoch.
    pub fn batches(&self, global_batch: usize) -> usize {
        self.each_batch(global_batch, |_| {})
    }

    /// The epoch's global order (manifest positions), `batches(global_batch)` batches of
    /// `global_batch`.
    pub fn order(&self, global_batch: usize, seed: u64, epoch: u64, shuffle: ShuffleSpec) -> Vec<u32> {
        let starts: Vec<usize> = self.sizes.iter().scan(0, |acc, n| Some(std::mem::replace(acc, *acc + n))).collect();
        let per_source: Vec<Vec<u32>> = self
            .sizes
            .iter()
            .enumerate()
            .map(|(s, &n)| {
                // Each source's order has a seed of its own, so equal-sized sources differ.
                let seed = SampleRng::new(seed, s as u64, EPOCH_KEY, MIX_STREAM).next_u64();
                match shuffle {
                    ShuffleSpec::None => (0..n as u32).collect(),
                    ShuffleSpec::Global => permutation(n, seed, epoch),
                    ShuffleSpec::Buffer { size } => buffer_shuffle(n, size, seed, epoch),
                }
            })
            .collect();
        let mut next = vec![0usize; self.sizes.len()];
        let mut order = Vec::with_capacity(self.sizes.iter().sum());
        let mut g = 0u64;
        self.each_batch(global_batch, |batch| {
            let first = order.len();
            for (s, &c) in batch.iter().enumerate() {
                order.extend(per_source[s][next[s]..next[s] + c].iter().map(|&i| i + starts[s] as u32));
                next[s] += c;
            }
            if shuffle != ShuffleSpec::None {
                let mut rng = SampleRng::new(seed, epoch, sluice_core::SampleKey(g), MIX_STREAM);
                let slots = &mut order[first..];
                for i in (1..slots.len()).rev() {
                    let j = rng.below(i as u64 + 1) as usize;
                    slots.swap(i, j);
                }
            }
            g += 1;
        });
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source_of(plan: &MixPlan, pos: u32) -> usize {
        let mut end = 0;
        for (s, n) in plan.sizes.iter().enumerate() {
            end += n;
            if (pos as usize) < end {
                return s;
            }
        }
        usize::MAX
    }

    #[test]
    fn every_batch_holds_the_sources_in_proportion_and_the_epoch_ends_with_the_first_to_run_out() {
        for case in 0..300u64 {
            let mut rng = SampleRng::new(5, 0, sluice_core::SampleKey(case), 0);
            let k = 1 + rng.below(4) as usize;
            let plan = MixPlan {
                sizes: (0..k).map(|_| rng.below(300) as usize).collect(),
                weights: (0..k).map(|_| 0.05 + rng.next_f64()).collect(),
            };
            let b = 1 + rng.below(40) as usize;
            let order = plan.order(b, case, 2, ShuffleSpec::Global);
            let batches = plan.batches(b);
            assert_eq!(order.len(), batches * b);
            let shares = plan.shares();
            let mut taken = vec![0usize; k];
            for (g, batch) in order.chunks(b).enumerate() {
                let mut counts = vec![0usize; k];
                batch.iter().for_each(|&p| counts[source_of(&plan, p)] += 1);
                for s in 0..k {
                    let quota = shares[s] * b as f64;
                    assert!(
                        counts[s] as f64 >= quota.floor() && counts[s] as f64 <= quota.ceil(),
                        "{plan:?} B {b} batch {g}: {counts:?}"
                    );
                    taken[s] += counts[s];
                    let drift = taken[s] as f64 - quota * (g + 1) as f64;
                    assert!(drift.abs() < 1.0 + 1e-9, "{plan:?} B {b}: source {s} drifts {drift} by batch {g}");
                }
            }
            // No sample twice, and one more batch would overrun a source.
            let mut seen = order.clone();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), order.len());
            let next = plan.batch_counts(b).len();
            assert_eq!(next, batches);
            assert_eq!(plan.order(b, case, 2, ShuffleSpec::Global), order, "not deterministic");
        }
    }

    #[test]
    fn the_seed_changes_the_order_not_the_counts() {
        let plan = MixPlan { sizes: vec![100, 50], weights: vec![0.7, 0.3] };
        let a = plan.order(10, 1, 0, ShuffleSpec::Global);
        let b = plan.order(10, 2, 0, ShuffleSpec::Global);
        assert_ne!(a, b);
        assert_eq!(a.len(), b.len());
        assert_ne!(a, plan.order(10, 1, 1, ShuffleSpec::Global), "epochs repeat");
        // 7 + 3 per batch: 100 / 7 runs out after 14 batches (50 / 3 after 16).
        assert_eq!(plan.batches(10), 14);
        let none = plan.order(10, 1, 0, ShuffleSpec::None);
        assert_eq!(&none[..10], &[0, 1, 2, 3, 4, 5, 6, 100, 101, 102]);
    }
}
