//! The counters both cache tiers keep (memory and disk), so each tier's stats type embeds
//! one [`TierStats`] (flattened: the keys stay where they were in `stats()` and on the wire).

use serde::Serialize;

/// The lookup and admission counters a tier updates as it runs.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TierCounts {
    pub hits: u64,
    pub misses: u64,
    pub insertions: u64,
    pub evictions: u64,
    pub rejected: u64,
}

impl TierCounts {
    /// A snapshot, with the tier's budget, the bytes and entries it holds now.
    pub fn snapshot(&self, budget_bytes: u64, used_bytes: u64, entries: u64) -> TierStats {
        let lookups = self.hits + self.misses;
        TierStats {
            budget_bytes,
            used_bytes,
            entries,
            hits: self.hits,
            misses: self.misses,
            hit_rate: if lookups > 0 { self.hits as f64 / lookups as f64 } else { 0.0 },
            insertions: self.insertions,
            evictions: self.evictions,
            rejected: self.rejected,
        }
    }
}

/// One tier's occupancy and counters, in [`super::CacheStats`] (memory) and
/// [`super::DiskStats`] (disk).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct TierStats {
    pub budget_bytes: u64,
    pub used_bytes: u64,
    pub entries: u64,
    /// Lookups this tier served (the disk tier is looked up on memory misses only).
    pub hits: u64,
    /// Lookups this tier did not hold.
    pub misses: u64,
    pub hit_rate: f64,
    pub insertions: u64,
    pub evictions: u64,
    /// Offers not admitted: memory, the entry did not outrank the least valuable one held;
    /// disk (Belady), it is needed later than everything held.
    pub rejected: u64,
}
