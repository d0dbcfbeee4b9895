//! Per-sample randomness. Every random choice derives from `(seed, epoch, key)`, so what a
//! sample looks like never depends on which thread made it or when.

use crate::manifest::SampleKey;

/// SplitMix64 finaliser: a bijective mix with good avalanche, enough to turn structured
/// inputs (seed, epoch, key) into independent-looking streams.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A small, fast generator (SplitMix64) seeded per sample.
#[derive(Debug, Clone)]
pub struct SampleRng {
    state: u64,
}

impl SampleRng {
    /// The generator for one sample in one epoch. `stream` separates independent uses
    /// (e.g. the epoch permutation vs. a sample's augmentations).
    pub fn new(seed: u64, epoch: u64, key: SampleKey, stream: u64) -> Self {
        let s = mix(mix(mix(seed ^ 0x5851_f42d_4c95_7f2d) ^ epoch) ^ key.0) ^ mix(stream);
        Self { state: s }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.state)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
    }

    /// Uniform integer in [0, n). `n` must be > 0.
    pub fn below(&mut self, n: u64) -> u64 {
        // Lemire's multiply-shift; the bias is < n / 2^64, negligible here.
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_inputs_same_stream_and_different_inputs_differ() {
        let a: Vec<u64> = {
            let mut r = SampleRng::new(1, 2, SampleKey(3), 0);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = SampleRng::new(1, 2, SampleKey(3), 0);
            (0..4).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        for (s, e, k, st) in [(2, 2, 3, 0), (1, 3, 3, 0), (1, 2, 4, 0), (1, 2, 3, 1)] {
            let mut r = SampleRng::new(s, e, SampleKey(k), st);
            assert_ne!(r.next_u64(), a[0], "({s},{e},{k},{st}) collides");
        }
    }

    #[test]
    fn uniform_and_below_stay_in_range_and_spread() {
        let mut r = SampleRng::new(7, 0, SampleKey(0), 0);
        let mut buckets = [0u32; 10];
        for _ in 0..10_000 {
            let x = r.uniform(2.0, 3.0);
            assert!((2.0..3.0).contains(&x));
            buckets[r.below(10) as usize] += 1;
        }
        // Each bucket expects 1000; a fair generator stays well within ±200.
        assert!(buckets.iter().all(|&c| (800..1200).contains(&c)), "{buckets:?}");
    }
}
