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
//!
//! And Cachew's other outcome, "don't cache": when even the best level would save less
//! than [`MIN_SAVED_FRACTION`] of the pipeline's time per epoch (`saved(level)` over `n` ×
//! the measured time of a whole sample, random ops included), caching cannot pay for the
//! memory it holds, and `auto` stores nothing ([`NotWorth`] says why, in the stats). A
//! cheap read before an expensive random op is the usual case: only the read could be
//! skipped.

use serde::Serialize;
use sluice_core::CacheLevel;

/// Misses measured before `auto` decides.
pub const MEASURE_SAMPLES: u64 = 32;

/// The least share of the pipeline's time per epoch a cache must save for `auto` to cache.
pub const MIN_SAVED_FRACTION: f64 = 0.05;

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
    /// The whole sample: the read and every op, the random ones after the seam included.
    pub sample_s: f64,
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
    pub sample_s: f64,
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
        upd(&mut self.sample_s, c.sample_s);
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

/// Why `auto` caches nothing: the best level's saving per epoch against the pipeline's
/// time per epoch, both estimated from the measured misses.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct NotWorth {
    /// The level that would have saved the most.
    pub best: CacheLevel,
    pub saved_per_epoch_s: f64,
    /// `n` × the measured time of a whole sample.
    pub pipeline_per_epoch_s: f64,
    /// `saved_per_epoch_s / pipeline_per_epoch_s`, under [`MIN_SAVED_FRACTION`].
    pub saved_fraction: f64,
    pub min_fraction: f64,
}

/// Picks the level that saves the most time per epoch with `budget` bytes over a dataset
/// of `n` samples, or none when that saving is under [`MIN_SAVED_FRACTION`] of the
/// pipeline's time per epoch. `resized` is a candidate only when the pipeline has a cache
/// resize. Ties go to the cheaper-to-serve level (raw, then decoded).
pub fn choose_level(
    costs: &CostModel,
    budget: u64,
    n: usize,
    has_resize: bool,
) -> (Result<CacheLevel, NotWorth>, Vec<LevelEstimate>) {
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
    let pipeline_per_epoch_s = n as f64 * costs.sample_s;
    let saved_fraction = if pipeline_per_epoch_s > 0.0 { best.saved_per_epoch_s / pipeline_per_epoch_s } else { 1.0 };
    if saved_fraction < MIN_SAVED_FRACTION {
        let why = NotWorth {
            best: best.level,
            saved_per_epoch_s: best.saved_per_epoch_s,
            pipeline_per_epoch_s,
            saved_fraction,
            min_fraction: MIN_SAVED_FRACTION,
        };
        return (Err(why), estimates);
    }
    (Ok(best.level), estimates)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(read_s: f64, decode_s: f64, resize_s: f64, raw: u64, decoded: u64, resized: u64) -> CostModel {
        model_with_suffix(read_s, decode_s, resize_s, raw, decoded, resized, 1e-4)
    }

    /// `suffix_s`: the random ops after the seam, which no cache level skips.
    fn model_with_suffix(
        read_s: f64,
        decode_s: f64,
        resize_s: f64,
        raw: u64,
        decoded: u64,
        resized: u64,
        suffix_s: f64,
    ) -> CostModel {
        let mut m = CostModel::default();
        for _ in 0..MEASURE_SAMPLES {
            m.add(&SampleCost {
                read_s,
                decode_s,
                resize_s,
                raw_bytes: raw,
                decoded_bytes: decoded,
                resized_bytes: resized,
                sample_s: read_s + decode_s + resize_s + suffix_s,
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
        assert_eq!(level, Ok(CacheLevel::Raw), "{est:?}");
        assert!((est[0].entries_fit - 200.0).abs() < 1e-9);
    }

    #[test]
    fn cpu_bound_profile_caches_decoded_pixels_or_resized_when_offered() {
        // Local NVMe: reads are ~50 µs, decoding is 6 ms; the budget holds everything.
        let m = model(5e-5, 6e-3, 4e-4, 100_000, 562_500, 21_760);
        let (level, est) = choose_level(&m, 1_000_000_000, 1000, false);
        assert_eq!(level, Ok(CacheLevel::Decoded), "{est:?}");
        // With a cache resize to 64 px the resized entries (26x smaller) win.
        let (level, est) = choose_level(&m, 100_000_000, 1000, true);
        assert_eq!(level, Ok(CacheLevel::Resized), "{est:?}");
    }

    #[test]
    fn caching_that_saves_under_a_twentieth_of_the_pipeline_is_not_worth_it() {
        // Page-cached reads (20 µs) and a cheap decode (50 µs) before 2 ms of random ops:
        // even all of it cached saves 3.4% of the epoch.
        let m = model_with_suffix(2e-5, 5e-5, 0.0, 10_000, 50_000, 50_000, 2e-3);
        let (level, est) = choose_level(&m, 1_000_000_000, 1000, false);
        let why = level.expect_err("caching 3.4% of the work was chosen");
        assert_eq!(why.best, CacheLevel::Decoded, "{est:?}");
        assert!((why.saved_fraction - 0.07 / 2.07).abs() < 1e-9, "{why:?}");
        // The same pipeline with a 2 ms decode: caching saves half, and pays.
        let m = model_with_suffix(2e-5, 2e-3, 0.0, 10_000, 50_000, 50_000, 2e-3);
        assert_eq!(choose_level(&m, 1_000_000_000, 1000, false).0, Ok(CacheLevel::Decoded));
        // A budget for 2% of the dataset cannot save 5% of an epoch, however costly the decode.
        let (level, _) = choose_level(&m, 20 * 50_000, 1000, false);
        assert!(level.is_err(), "{level:?}");
    }

    #[test]
    fn cost_model_means_follow_the_measurements() {
        let m = model(1.0, 2.0, 3.0, 10, 20, 30);
        assert!((m.saved_per_hit(CacheLevel::Decoded) - 3.0).abs() < 1e-9);
        assert!((m.bytes_per_entry(CacheLevel::Resized) - 30.0).abs() < 1e-9);
    }
}
