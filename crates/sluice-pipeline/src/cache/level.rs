//! What a cache entry holds, chosen from measured costs (Cachew's compute-vs-cache
//! decision, made online): every miss times its read, its decode (the deterministic ops)
//! and the optional cache resize, and measures the bytes an entry would take at each
//! level. `auto` waits for [`MEASURE_SAMPLES`] misses, then keeps the level that saves the
//! most time per epoch for the budget:
//!
//! `saved(level) = min(budget / bytes(level), n) × time_saved_per_hit(level)`
//!
//! When the whole dataset fits at several levels this prefers the one that saves the most
//! per hit; when it does not, it is the time saved per cached byte times the budget.

use serde::Serialize;
use sluice_core::CacheLevel;

/// Misses measured before `auto` decides.
pub const MEASURE_SAMPLES: u64 = 32;

/// One miss's measured costs.
#[derive(Debug, Clone, Copy, Default)]
pub struct SampleCost {
    pub read_s: f64,
    pub decode_s: f64,
    pub resize_s: f64,
    pub raw_bytes: u64,
    pub decoded_bytes: u64,
    /// Bytes after the cache resize; equals `decoded_bytes` without one.
    pub resized_bytes: u64,
}

/// Running means of the measured costs.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CostModel {
    pub samples: u64,
    pub read_s: f64,
    pub decode_s: f64,
    pub resize_s: f64,
    pub raw_bytes: f64,
    pub decoded_bytes: f64,
    pub resized_bytes: f64,
}

impl CostModel {
    pub fn add(&mut self, c: &SampleCost) {
        self.samples += 1;
        // Cumulative mean for the first samples, then an EWMA that follows drift.
        let a = (1.0 / self.samples as f64).max(0.01);
        let upd = |m: &mut f64, x: f64| *m += a * (x - *m);
        upd(&mut self.read_s, c.read_s);
        upd(&mut self.decode_s, c.decode_s);
        upd(&mut self.resize_s, c.resize_s);
        upd(&mut self.raw_bytes, c.raw_bytes as f64);
        upd(&mut self.decoded_bytes, c.decoded_bytes as f64);
        upd(&mut self.resized_bytes, c.resized_bytes as f64);
    }

    /// Seconds a hit at `level` saves over a miss.
    pub fn saved_per_hit(&self, level: CacheLevel) -> f64 {
        match level {
            CacheLevel::Raw => self.read_s,
            CacheLevel::Decoded => self.read_s + self.decode_s,
            CacheLevel::Resized | CacheLevel::Auto => self.read_s + self.decode_s + self.resize_s,
        }
    }

    pub fn bytes_per_entry(&self, level: CacheLevel) -> f64 {
        match level {
            CacheLevel::Raw => self.raw_bytes,
            CacheLevel::Decoded => self.decoded_bytes,
            CacheLevel::Resized | CacheLevel::Auto => self.resized_bytes,
        }
    }
}

/// One level's estimate, for stats and logs.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LevelEstimate {
    pub level: CacheLevel,
    pub saved_per_hit_s: f64,
    pub bytes_per_entry: f64,
    pub entries_fit: f64,
    pub saved_per_epoch_s: f64,
}

/// Picks the level that saves the most time per epoch with `budget` bytes over a dataset
/// of `n` samples. `resized` is a candidate only when the pipeline has a cache resize.
/// Ties go to the cheaper-to-serve level (raw, then decoded).
pub fn choose_level(costs: &CostModel, budget: u64, n: usize, has_resize: bool) -> (CacheLevel, Vec<LevelEstimate>) {
    let mut candidates = vec![CacheLevel::Raw, CacheLevel::Decoded];
    if has_resize {
        candidates.push(CacheLevel::Resized);
    }
    let estimates: Vec<LevelEstimate> = candidates
        .into_iter()
        .map(|level| {
            let bytes = costs.bytes_per_entry(level).max(1.0);
            let entries_fit = (budget as f64 / bytes).floor().min(n as f64);
            let saved = costs.saved_per_hit(level);
            LevelEstimate {
                level,
                saved_per_hit_s: saved,
                bytes_per_entry: bytes,
                entries_fit,
                saved_per_epoch_s: entries_fit * saved,
            }
        })
        .collect();
    let mut best = estimates[0];
    for e in &estimates[1..] {
        if e.saved_per_epoch_s > best.saved_per_epoch_s * 1.0001 {
            best = *e;
        }
    }
    (best.level, estimates)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(read_s: f64, decode_s: f64, resize_s: f64, raw: u64, decoded: u64, resized: u64) -> CostModel {
        let mut m = CostModel::default();
        for _ in 0..MEASURE_SAMPLES {
            m.add(&SampleCost {
                read_s,
                decode_s,
                resize_s,
                raw_bytes: raw,
                decoded_bytes: decoded,
                resized_bytes: resized,
            });
        }
        m
    }

    #[test]
    fn io_bound_profile_caches_raw_bytes() {
        // Throttled storage: 2 ms + 100 KB at 200 MB/s per read; a 500x375 JPEG decodes in
        // ~2 ms to 562 KB of pixels. 1000 samples, a 20 MB budget (a fifth of the raw set).
        let m = model(2.5e-3, 2e-3, 0.0, 100_000, 562_500, 562_500);
        let (level, est) = choose_level(&m, 20_000_000, 1000, false);
        assert_eq!(level, CacheLevel::Raw, "{est:?}");
        assert!((est[0].entries_fit - 200.0).abs() < 1e-9);
    }

    #[test]
    fn cpu_bound_profile_caches_decoded_pixels_or_resized_when_offered() {
        // Local NVMe: reads are ~50 µs, decoding is 6 ms; the budget holds everything.
        let m = model(5e-5, 6e-3, 4e-4, 100_000, 562_500, 21_760);
        let (level, est) = choose_level(&m, 1_000_000_000, 1000, false);
        assert_eq!(level, CacheLevel::Decoded, "{est:?}");
        // With a cache resize to 64 px the resized entries (26x smaller) win.
        let (level, est) = choose_level(&m, 100_000_000, 1000, true);
        assert_eq!(level, CacheLevel::Resized, "{est:?}");
    }

    #[test]
    fn cost_model_means_follow_the_measurements() {
        let m = model(1.0, 2.0, 3.0, 10, 20, 30);
        assert!((m.saved_per_hit(CacheLevel::Decoded) - 3.0).abs() < 1e-9);
        assert!((m.bytes_per_entry(CacheLevel::Resized) - 30.0).abs() < 1e-9);
    }
}
