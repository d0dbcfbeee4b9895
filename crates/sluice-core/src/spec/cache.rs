//! The cache, sampling and importance parts of a pipeline spec: how much memory a cache
//! may use (a byte budget), at which level and under which policy it keeps samples, how
//! the epoch order is drawn, and how reported importance is smoothed.

use std::fmt;
use std::path::PathBuf;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use super::{check_count, MAX_CACHE_BYTES, MAX_SIDE};
use crate::error::SpecError;

/// How much memory a cache may use: bytes, or a fraction of the machine's RAM. Written as
/// a number of bytes, a fraction in (0, 1], or a string: `"8GiB"`, `"512MB"`, `"25%"`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ByteBudget {
    Bytes(u64),
    RamFraction(f64),
}

impl ByteBudget {
    /// Parses `"8GiB"`, `"1.5GB"`, `"4096"`, `"25%"` or `"0.25"` (a fraction of RAM).
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if let Some(pct) = t.strip_suffix('%') {
            let v: f64 = pct.trim().parse().map_err(|_| format!("`{s}`: not a percentage"))?;
            return Ok(ByteBudget::RamFraction(v / 100.0));
        }
        let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let v: f64 = num.parse().map_err(|_| format!("`{s}`: expected e.g. \"8GiB\", \"512MB\" or \"25%\""))?;
        let scale = match unit.trim().to_ascii_lowercase().as_str() {
            "" if num.contains('.') => return Ok(ByteBudget::RamFraction(v)),
            "" | "b" => 1.0,
            "kb" | "k" => 1e3,
            "mb" | "m" => 1e6,
            "gb" | "g" => 1e9,
            "tb" | "t" => 1e12,
            "kib" => 1024.0,
            "mib" => 1024.0 * 1024.0,
            "gib" => 1024.0 * 1024.0 * 1024.0,
            "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
            other => return Err(format!("`{s}`: unknown unit `{other}` (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB or %)")),
        };
        let bytes = (v * scale).round();
        // `as u64` would saturate: a budget too large to count is an error, not u64::MAX.
        if !(bytes >= 0.0 && bytes < u64::MAX as f64) {
            return Err(format!("`{s}`: too large"));
        }
        Ok(ByteBudget::Bytes(bytes as u64))
    }

    /// The budget in bytes on a machine with `ram_bytes` of memory.
    pub fn resolve(self, ram_bytes: u64) -> u64 {
        match self {
            ByteBudget::Bytes(b) => b,
            ByteBudget::RamFraction(f) => (ram_bytes as f64 * f) as u64,
        }
    }
}

impl Serialize for ByteBudget {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match *self {
            ByteBudget::Bytes(b) => s.serialize_u64(b),
            ByteBudget::RamFraction(f) => s.serialize_f64(f),
        }
    }
}

impl<'de> Deserialize<'de> for ByteBudget {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct BudgetVisitor;
        impl Visitor<'_> for BudgetVisitor {
            type Value = ByteBudget;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("bytes, a fraction of RAM in (0, 1], or a string like \"8GiB\" or \"25%\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteBudget, E> {
                Ok(ByteBudget::Bytes(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteBudget, E> {
                u64::try_from(v).map(ByteBudget::Bytes).map_err(|_| E::custom("budget must be positive"))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<ByteBudget, E> {
                Ok(ByteBudget::RamFraction(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteBudget, E> {
                ByteBudget::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(BudgetVisitor)
    }
}

/// What a cache entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheLevel {
    /// Encoded file bytes: saves the read only.
    Raw,
    /// Pixels after the deterministic ops (decode, resize, center crop): saves read + decode.
    Decoded,
    /// Decoded pixels shrunk by the cache's `resize` (shorter side): saves read + decode +
    /// resize and takes far fewer bytes per entry.
    Resized,
    /// Measure read time, decode/resize time and bytes per entry online, then pick the level
    /// that saves the most time for the budget.
    #[default]
    Auto,
}

/// Which entries a full cache gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CachePolicyKind {
    /// Least recently used.
    Lru,
    /// SHADE: per-batch rank scores `ln(rank + 10)`, evict the lowest, ghost scores for
    /// recently evicted keys.
    Shade,
    /// FastMatch as published: (g − median)/IQR scores, evict the least important.
    Fastmatch,
    /// sluice's: keep the samples the importance sampler will draw most often per byte.
    #[default]
    Importance,
}

/// A cache of samples, placed between the deterministic and the random ops.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheSpec {
    /// Memory for entries: `"8GiB"`, `"512MB"`, `"25%"` (of RAM), a fraction or bytes.
    pub budget: ByteBudget,
    #[serde(default)]
    pub level: CacheLevel,
    /// A deterministic shorter-side resize inserted before the random ops; needed by the
    /// `resized` level (and offered to `auto`). It changes the pipeline's pixels, whatever
    /// the level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resize: Option<u32>,
    #[serde(default)]
    pub policy: CachePolicyKind,
    /// A local-disk tier under the memory one (none by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskCacheSpec>,
    /// Loaders in one process whose pipelines put the same bytes in a sample's entry (the
    /// same dataset, record options, limits, deterministic ops and cache level: see
    /// `sluice_pipeline::cache::share_key`) fill and read one memory cache, with the first
    /// one's budget, policy and disk tier: an ensemble, or a hyper-parameter search, decodes
    /// each sample once. Off by default.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub share: bool,
}

/// Smallest disk tier budget: one filesystem block.
pub const MIN_DISK_CACHE_BYTES: u64 = 4096;

/// Which entries a full disk tier gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiskPolicyKind {
    /// Belady's rule over the known order of the coming epoch(s): give up the entry needed
    /// furthest in the future, and admit nothing needed later than everything held.
    #[default]
    Belady,
    /// Least recently used (for comparison).
    Lru,
}

/// A local-disk tier of the cache: entries the memory tier gives up or refuses are kept
/// in files under `dir`, within `budget` bytes, and survive a restart of the job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskCacheSpec {
    /// The folder for entry files (created if missing); relative to the spec file's folder.
    pub dir: PathBuf,
    /// Bytes of entry files: a number of bytes or `"50GiB"`, `"500MB"` (not a fraction).
    pub budget: ByteBudget,
    #[serde(default)]
    pub policy: DiskPolicyKind,
}

impl DiskCacheSpec {
    /// The budget in bytes (validated specs only hold byte counts).
    pub fn budget_bytes(&self) -> u64 {
        match self.budget {
            ByteBudget::Bytes(b) => b,
            ByteBudget::RamFraction(_) => 0,
        }
    }

    fn validate(&self) -> Result<(), SpecError> {
        if self.dir.as_os_str().is_empty() {
            return Err(SpecError::new("cache.disk.dir", "must name a folder"));
        }
        match self.budget {
            ByteBudget::RamFraction(_) => Err(SpecError::new(
                "cache.disk.budget",
                "a fraction of RAM is not a disk size: give bytes or a size such as \"50GiB\"",
            )),
            ByteBudget::Bytes(b) if b < MIN_DISK_CACHE_BYTES => Err(SpecError::new(
                "cache.disk.budget",
                format!("must be at least {MIN_DISK_CACHE_BYTES} bytes (got {b})"),
            )),
            ByteBudget::Bytes(b) if b > MAX_CACHE_BYTES => Err(SpecError::new(
                "cache.disk.budget",
                format!("must be at most 1 PiB ({MAX_CACHE_BYTES} bytes), got {b}"),
            )),
            ByteBudget::Bytes(_) => Ok(()),
        }
    }
}

impl CacheSpec {
    /// The part of this cache that process `index` of `count` holds, when one loader runs
    /// in several processes (the Python loader's `map` worker processes): the memory and
    /// disk budgets split evenly between them (one budget for the loader, whatever its
    /// processes), and the disk tier in a subfolder of its own, `<dir>/process-<index>-of-<count>`
    /// (a folder has one owner at a time). A disk budget whose share falls under
    /// [`MIN_DISK_CACHE_BYTES`] is refused, naming the split.
    pub fn process_share(&self, index: usize, count: usize) -> Result<CacheSpec, SpecError> {
        let count = count.max(1);
        let share = |budget: ByteBudget, field: &str| match budget {
            ByteBudget::Bytes(b) if b / (count as u64) == 0 => Err(SpecError::new(
                field,
                format!("{b} bytes split between {count} processes is 0 bytes each: raise it or use fewer processes"),
            )),
            ByteBudget::Bytes(b) => Ok(ByteBudget::Bytes(b / count as u64)),
            ByteBudget::RamFraction(f) => Ok(ByteBudget::RamFraction(f / count as f64)),
        };
        let mut out = self.clone();
        out.budget = share(self.budget, "cache.budget")?;
        if let Some(disk) = &mut out.disk {
            let each = disk.budget_bytes() / count as u64;
            if each < MIN_DISK_CACHE_BYTES {
                return Err(SpecError::new(
                    "cache.disk.budget",
                    format!(
                        "{} bytes split between {count} processes is {each} bytes each, under the \
                         {MIN_DISK_CACHE_BYTES}-byte minimum: raise it or use fewer processes",
                        disk.budget_bytes()
                    ),
                ));
            }
            disk.budget = ByteBudget::Bytes(each);
            disk.dir = disk.dir.join(format!("process-{index}-of-{count}"));
        }
        Ok(out)
    }

    pub(super) fn validate(&self) -> Result<(), SpecError> {
        match self.budget {
            ByteBudget::Bytes(0) => return Err(SpecError::new("cache.budget", "must be more than 0 bytes")),
            ByteBudget::Bytes(b) if b > MAX_CACHE_BYTES => {
                return Err(SpecError::new("cache.budget", format!("must be at most 1 PiB ({MAX_CACHE_BYTES} bytes)")))
            }
            ByteBudget::RamFraction(f) if !(f > 0.0 && f <= 1.0) => {
                return Err(SpecError::new("cache.budget", "a fraction of RAM must be in (0, 1] (0%..100%)"))
            }
            _ => {}
        }
        if let Some(side) = self.resize {
            check_count("cache.resize", u64::from(side), 1, u64::from(MAX_SIDE))?;
        }
        if self.level == CacheLevel::Resized && self.resize.is_none() {
            return Err(SpecError::new("cache.level", "`resized` needs `cache.resize` (the shorter side)"));
        }
        if let Some(disk) = &self.disk {
            disk.validate()?;
        }
        Ok(())
    }
}

fn default_floor() -> f64 {
    0.05
}
/// Chosen by `bench/time_to_accuracy.py --sweep coverage_epochs=...` (BENCHMARKS.md,
/// "Importance sampling: the accuracy it costs").
fn default_coverage_epochs() -> u32 {
    2
}
fn default_miss_discount() -> f64 {
    0.1
}
fn default_max_draws() -> f64 {
    4.0
}

/// How an epoch's order is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SamplingSpec {
    /// A permutation (or the `shuffle` order): every sample once per epoch.
    #[default]
    Uniform,
    /// sluice's importance sampler: a coverage sweep that visits every sample once in every
    /// `coverage_epochs` epochs, the rest of each epoch drawn proportional to smoothed
    /// scores with a floor, and unbiasing weights in each batch.
    Importance {
        /// Share of the proposal's draws spread uniformly over all samples: every sample keeps
        /// at least `floor / n` probability per draw. Outside the cache's hot set the floor
        /// is most of what the proposal gives a sample, so it is also about the share of
        /// those draws that miss (half of it at a cache of half the dataset).
        #[serde(default = "default_floor")]
        floor: f64,
        /// Every sample appears at least once in any `coverage_epochs` consecutive epochs
        /// (a sweep of `1/coverage_epochs` of the dataset in every epoch). It also bounds
        /// every weight by `coverage_epochs`: the fewer, the closer to uniform training and
        /// the more reads of samples outside the cache; 1 is a uniform permutation.
        #[serde(default = "default_coverage_epochs")]
        coverage_epochs: u32,
        /// Draw probability factor for samples outside the cache's hot set: misses cost
        /// more, so drawing them less (and weighting them more) buys time at a small
        /// variance cost. 1 disables it.
        #[serde(default = "default_miss_discount")]
        miss_discount: f64,
        /// At most this many expected draws of one sample per epoch: loss-proportional
        /// sampling would otherwise spend most of an epoch on a handful of outliers
        /// (mislabelled or ambiguous samples), and SGD needs diverse batches as much as an
        /// unbiased loss.
        #[serde(default = "default_max_draws")]
        max_draws: f64,
    },
    /// FastMatch's Algorithm 1 as published (a baseline).
    Fastmatch,
    /// SHADE's sampler as published: n draws with replacement, probability ∝ rank score.
    Shade,
}

impl SamplingSpec {
    pub(super) fn validate(&self) -> Result<(), SpecError> {
        if let SamplingSpec::Importance { floor, coverage_epochs, miss_discount, max_draws } = *self {
            if !(max_draws >= 1.0 && max_draws.is_finite()) {
                return Err(SpecError::new("sampling.max_draws", "must be a number >= 1"));
            }
            if !(floor > 0.0 && floor <= 1.0) {
                return Err(SpecError::new("sampling.floor", "must be in (0, 1]: every sample must stay reachable"));
            }
            if coverage_epochs == 0 {
                return Err(SpecError::new("sampling.coverage_epochs", "must be at least 1"));
            }
            if !(miss_discount > 0.0 && miss_discount <= 1.0) {
                return Err(SpecError::new("sampling.miss_discount", "must be in (0, 1]"));
            }
        }
        Ok(())
    }
}

fn default_ema() -> f64 {
    0.5
}

/// The importance store: per-key scores reported by the trainer, smoothed across epochs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportanceSpec {
    /// Weight of the newest epoch's report in the exponential moving average.
    #[serde(default = "default_ema")]
    pub ema: f64,
}

impl Default for ImportanceSpec {
    fn default() -> Self {
        Self { ema: default_ema() }
    }
}

impl ImportanceSpec {
    pub(super) fn validate(&self) -> Result<(), SpecError> {
        if !(self.ema > 0.0 && self.ema <= 1.0) {
            return Err(SpecError::new("importance.ema", "must be in (0, 1]"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn cache(budget: ByteBudget, disk: u64) -> CacheSpec {
        CacheSpec {
            budget,
            level: CacheLevel::Raw,
            resize: None,
            policy: CachePolicyKind::Lru,
            disk: Some(DiskCacheSpec {
                dir: PathBuf::from("/scratch/c"),
                budget: ByteBudget::Bytes(disk),
                policy: DiskPolicyKind::Belady,
            }),
            share: false,
        }
    }

    #[test]
    fn a_process_share_splits_both_budgets_and_gives_the_disk_tier_a_folder_of_its_own() {
        let whole = cache(ByteBudget::Bytes(48 << 10), 3 * 8192);
        let parts: Vec<CacheSpec> = (0..3).map(|i| whole.process_share(i, 3).unwrap()).collect();
        for (i, p) in parts.iter().enumerate() {
            assert_eq!(p.budget, ByteBudget::Bytes(16 << 10));
            let disk = p.disk.as_ref().unwrap();
            assert_eq!(disk.budget, ByteBudget::Bytes(8192));
            assert_eq!(disk.dir, PathBuf::from(format!("/scratch/c/process-{i}-of-3")));
        }
        let half = cache(ByteBudget::RamFraction(0.5), 8192).process_share(1, 2).unwrap();
        assert_eq!(half.budget, ByteBudget::RamFraction(0.25), "50% for the loader: 25% a process");
        assert_eq!(whole.process_share(0, 1).unwrap().budget, whole.budget);
    }

    #[test]
    fn a_share_under_the_disk_minimum_is_refused_naming_the_split() {
        let err = cache(ByteBudget::Bytes(1 << 20), 8192).process_share(0, 4).unwrap_err();
        assert_eq!(err.field, "cache.disk.budget");
        let text = err.to_string();
        assert!(text.contains("8192 bytes split between 4 processes is 2048 bytes each"), "{text}");
        let err = cache(ByteBudget::Bytes(3), 8192).process_share(0, 4).unwrap_err();
        assert_eq!(err.field, "cache.budget");
    }
}
