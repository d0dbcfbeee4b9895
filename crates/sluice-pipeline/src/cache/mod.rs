//! The sample cache: sits between the deterministic ops and the random ones, so a cached
//! entry is re-augmented every epoch by the ops after it. It holds encoded bytes, decoded
//! pixels or decoded-and-resized pixels ([`level`]), within a byte budget, and gives up
//! entries by a named policy ([`policy`]: `lru`, `shade`, `fastmatch`, `importance`).
//!
//! Under the memory tier an optional local-disk tier ([`disk`], `cache.disk`) keeps
//! entries in files within a budget of its own, evicts by Belady's rule over the known
//! order of the coming epochs, and survives a restart.
//!
//! Whatever a hit returns, the loader finishes the sample through the same split path
//! (deterministic prefix → optional resize → random suffix), so a sample's pixels do not
//! depend on whether it was a hit: output stays independent of timing and thread count.

pub mod disk;
mod future;
pub mod level;
pub mod policy;
pub mod ram;
pub mod share;
mod tier_stats;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;

use serde::Serialize;
use sluice_core::{BoxTargets, CacheLevel, CachePolicyKind, CacheSpec, Image, Manifest, Mask};

pub use disk::{DiskCacheError, DiskStats, DiskTier};
pub use level::{choose_level, CostModel, LevelEstimate, NotWorth, SampleCost, MEASURE_SAMPLES, MIN_SAVED_FRACTION};
use policy::{make_policy, Policy};
pub use ram::total_ram_bytes;
pub use share::{share_key, shared_in_process};
use tier_stats::TierCounts;
pub use tier_stats::TierStats;

use crate::importance::ImportanceStore;
use crate::sampler::{fastmatch_normalise, EpochDraw};

/// What an entry holds. The pixel levels keep the sample's targets (its boxes) and its
/// mask moved by the same ops as the pixels (the mask by the cache resize too, nearest),
/// so a hit finishes the sample as a miss would; `None` for a source without them. Raw
/// bytes need neither: the source's own boxes go with them, and its mask is read again.
#[derive(Debug, Clone, PartialEq)]
pub enum CachedData {
    /// Encoded file bytes.
    Raw(Vec<u8>),
    /// RGB8 HWC pixels after the deterministic ops, with the targets in their pixels and
    /// the mask their size.
    Decoded(Image, Option<BoxTargets>, Option<Mask>),
    /// As `Decoded`, then shrunk by the cache resize.
    Resized(Image, Option<BoxTargets>, Option<Mask>),
}

impl CachedData {
    /// What the entry takes against the budget: its bytes, pixels, boxes and mask.
    pub fn bytes(&self) -> u64 {
        match self {
            CachedData::Raw(b) => b.len() as u64,
            CachedData::Decoded(img, t, m) | CachedData::Resized(img, t, m) => {
                img.as_bytes().len() as u64
                    + t.as_ref().map_or(0, targets_bytes)
                    + m.as_ref().map_or(0, |m| m.data.len() as u64)
            }
        }
    }

    /// Whether the entry keeps a sample's boxes or mask with its pixels (what the disk
    /// tier and the peer protocol cannot carry).
    pub fn keeps_records(&self) -> bool {
        matches!(self, CachedData::Decoded(_, t, m) | CachedData::Resized(_, t, m) if t.is_some() || m.is_some())
    }

    pub fn level(&self) -> CacheLevel {
        match self {
            CachedData::Raw(_) => CacheLevel::Raw,
            CachedData::Decoded(..) => CacheLevel::Decoded,
            CachedData::Resized(..) => CacheLevel::Resized,
        }
    }
}

/// What a sample's targets take in an entry (counted against the budget).
fn targets_bytes(t: &BoxTargets) -> u64 {
    (t.boxes.len() * std::mem::size_of::<[f32; 4]>() + t.labels.len() * std::mem::size_of::<i64>()) as u64
}

/// The per-position priorities a policy ranks entries by in the epoch `draw` starts, from
/// the same state the draw came from: `importance` keeps the samples drawn most often this
/// epoch, `fastmatch` (once there are scores) the highest-scoring ones; `None` for the
/// other policies (they rank entries by what they see themselves).
pub fn epoch_priorities(
    policy: CachePolicyKind,
    draw: &EpochDraw,
    store: &ImportanceStore,
    manifest: &Manifest,
) -> Option<Vec<f64>> {
    match policy {
        CachePolicyKind::Importance => Some(draw.expected.clone()),
        CachePolicyKind::Fastmatch if store.has_scores() => {
            Some(fastmatch_normalise(&store.scores_by_position(manifest)))
        }
        _ => None,
    }
}

/// Maps an `f64` to an integer with the same order (total order, NaN last).
fn ordered(p: f64) -> i64 {
    let b = p.to_bits() as i64;
    b ^ ((((b >> 63) as u64) >> 1) as i64)
}

struct Entry {
    data: Arc<CachedData>,
    bytes: u64,
    prio: i64,
}

struct Inner {
    entries: HashMap<u64, Entry>,
    /// (priority, key) of every entry: the first is the next victim.
    order: BTreeSet<(i64, u64)>,
    used: u64,
    policy: Box<dyn Policy>,
    /// What new entries hold; `None` while `auto` is still measuring.
    level: Option<CacheLevel>,
    costs: CostModel,
    estimates: Vec<LevelEstimate>,
    /// `auto` found that caching cannot pay: nothing is stored, for good.
    off: Option<NotWorth>,
    /// Entry bytes of every key offered so far, to size the hot set.
    sizes: HashMap<u64, u64>,
    counts: TierCounts,
    saved_s: f64,
    /// The keys this cache may hold, when it is one part of a partitioned cache (a service
    /// worker's share of the job's hot set); `None`: any key.
    share: Option<HashSet<u64>>,
}

/// Counters and decisions, in [`crate::StatsSnapshot`].
#[derive(Debug, Clone, Serialize)]
pub struct CacheStats {
    pub policy: CachePolicyKind,
    /// The level entries are stored at (`auto` while still measuring).
    pub level: CacheLevel,
    /// The memory tier's occupancy and counters.
    #[serde(flatten)]
    pub tier: TierStats,
    /// Hits × the measured read (+ decode, + resize) time they skipped.
    pub est_time_saved_s: f64,
    /// Measured per-sample costs.
    pub costs: CostModel,
    /// The per-level estimates behind the last `auto` decision.
    pub estimates: Vec<LevelEstimate>,
    /// Set when `auto` decided not to cache (Cachew's "don't cache"): why.
    pub off: Option<NotWorth>,
    /// The disk tier's counters (the fields above are the memory tier's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskStats>,
}

pub struct Cache {
    inner: Mutex<Inner>,
    budget: u64,
    has_resize: bool,
    dataset_len: usize,
    disk: Option<DiskTier>,
}

impl Cache {
    pub fn new(spec: &CacheSpec, budget: u64, dataset_len: usize) -> Self {
        let level = (spec.level != CacheLevel::Auto).then_some(spec.level);
        tracing::info!(policy = ?spec.policy, level = ?spec.level, budget, "cache enabled");
        Self {
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                order: BTreeSet::new(),
                used: 0,
                policy: make_policy(spec.policy),
                level,
                costs: CostModel::default(),
                estimates: Vec::new(),
                off: None,
                sizes: HashMap::new(),
                counts: TierCounts::default(),
                saved_s: 0.0,
                share: None,
            }),
            budget,
            has_resize: spec.resize.is_some(),
            dataset_len,
            disk: None,
        }
    }

    /// Puts `disk` under the memory tier: every entry offered is written through to it,
    /// and a memory miss looks there.
    pub fn with_disk(mut self, disk: DiskTier) -> Self {
        self.disk = Some(disk);
        self
    }

    pub fn disk(&self) -> Option<&DiskTier> {
        self.disk.as_ref()
    }

    /// The keys the coming epoch(s) will look up, in order, from the first one not yet
    /// looked up (Belady's rule in the disk tier), with each key's expected draws this
    /// epoch (empty: all alike). Without a disk tier, nothing to do.
    pub fn set_future(&self, keys: impl IntoIterator<Item = u64>, importance: HashMap<u64, f64>) {
        if let Some(d) = &self.disk {
            d.set_future(keys, importance);
        }
    }

    /// Samples in the dataset the cache was made for.
    pub fn dataset_len(&self) -> usize {
        self.dataset_len
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// The entry for `key`, counting a hit or a miss: the memory tier, then the disk tier
    /// (a disk hit is offered to memory again).
    pub fn get(&self, key: u64) -> Option<Arc<CachedData>> {
        if let Some(data) = self.get_ram(key) {
            if let Some(d) = &self.disk {
                d.touch(key);
            }
            return Some(data);
        }
        let data = Arc::new(self.disk.as_ref()?.get(key)?);
        self.offer_ram(key, data.clone());
        Some(data)
    }

    fn get_ram(&self, key: u64) -> Option<Arc<CachedData>> {
        let mut g = self.inner.lock();
        let inner = &mut *g;
        let Some(e) = inner.entries.get_mut(&key) else {
            inner.counts.misses += 1;
            return None;
        };
        let data = e.data.clone();
        let level = data.level();
        if let Some(p) = inner.policy.on_hit(key) {
            inner.order.remove(&(e.prio, key));
            e.prio = ordered(p);
            inner.order.insert((e.prio, key));
        }
        inner.counts.hits += 1;
        inner.saved_s += inner.costs.saved_per_hit(level);
        Some(data)
    }

    /// The level new entries are stored at; `None` while `auto` is measuring, and after it
    /// decided not to cache.
    pub fn level(&self) -> Option<CacheLevel> {
        self.inner.lock().level
    }

    /// Adds one miss's measured costs; `auto` decides once it has enough.
    pub fn observe(&self, cost: &SampleCost) {
        let mut g = self.inner.lock();
        g.costs.add(cost);
        if g.level.is_none() && g.off.is_none() && g.costs.samples >= MEASURE_SAMPLES {
            let (level, estimates) = choose_level(&g.costs, self.budget, self.dataset_len, self.has_resize);
            tracing::info!(
                ?level,
                sample_ms = g.costs.sample_s * 1e3,
                read_ms = g.costs.read_s * 1e3,
                decode_ms = g.costs.decode_s * 1e3,
                resize_ms = g.costs.resize_s * 1e3,
                raw_kb = g.costs.raw_bytes / 1e3,
                decoded_kb = g.costs.decoded_bytes / 1e3,
                resized_kb = g.costs.resized_bytes / 1e3,
                "cache level chosen: {:?}",
                estimates
            );
            match level {
                Ok(level) => g.level = Some(level),
                Err(why) => {
                    tracing::warn!(
                        saved_per_epoch_s = why.saved_per_epoch_s,
                        pipeline_per_epoch_s = why.pipeline_per_epoch_s,
                        "the cache stores nothing: it would save {:.1}% of the pipeline's time; without a cache \
                         section (or with level = \"raw\") the decode is not split from the ops after it",
                        100.0 * why.saved_fraction
                    );
                    g.off = Some(why);
                }
            }
            g.estimates = estimates;
        }
    }

    /// Offers an entry; stores it if it fits the budget and the policy admits it, and
    /// writes it through to the disk tier (within its own budget and policy). Returns
    /// whether memory stored it.
    pub fn offer(&self, key: u64, data: Arc<CachedData>) -> bool {
        let stored = self.offer_ram(key, data.clone());
        if let Some(d) = &self.disk {
            if self.inner.lock().share.as_ref().is_none_or(|s| s.contains(&key)) {
                d.offer(key, &data);
            }
        }
        stored
    }

    fn offer_ram(&self, key: u64, data: Arc<CachedData>) -> bool {
        let bytes = data.bytes();
        let mut g = self.inner.lock();
        let inner = &mut *g;
        inner.sizes.insert(key, bytes);
        if inner.entries.contains_key(&key) || bytes > self.budget {
            return false;
        }
        if inner.share.as_ref().is_some_and(|s| !s.contains(&key)) {
            inner.counts.rejected += 1;
            return false;
        }
        let prio = ordered(inner.policy.priority(key));
        // Decide first, evict after: a refused offer must not cost an entry.
        let mut victims = Vec::new();
        let mut freed = 0u64;
        for &(vp, vk) in &inner.order {
            if inner.used - freed + bytes <= self.budget {
                break;
            }
            if !inner.policy.always_admit() && vp >= prio {
                inner.counts.rejected += 1;
                return false;
            }
            victims.push((vp, vk));
            freed += inner.entries.get(&vk).map_or(0, |e| e.bytes);
        }
        if inner.used - freed + bytes > self.budget {
            inner.counts.rejected += 1;
            return false;
        }
        for v in victims {
            inner.order.remove(&v);
            if let Some(e) = inner.entries.remove(&v.1) {
                inner.used -= e.bytes;
            }
            inner.policy.on_evict(v.1);
            inner.counts.evictions += 1;
        }
        inner.policy.on_insert(key);
        inner.entries.insert(key, Entry { data, bytes, prio });
        inner.order.insert((prio, key));
        inner.used += bytes;
        inner.counts.insertions += 1;
        true
    }

    /// The trainer's per-sample values for one batch (SHADE rescoring).
    pub fn report(&self, keys: &[u64], values: &[f64]) {
        let mut g = self.inner.lock();
        let inner = &mut *g;
        for k in inner.policy.on_report(keys, values) {
            let p = ordered(inner.policy.priority(k));
            if let Some(e) = inner.entries.get_mut(&k) {
                inner.order.remove(&(e.prio, k));
                e.prio = p;
                inner.order.insert((p, k));
            }
        }
    }

    pub fn policy_kind(&self) -> CachePolicyKind {
        self.inner.lock().policy.kind()
    }

    /// Per-key priorities for the epoch about to start; every entry is re-ranked.
    pub fn set_epoch_priorities(&self, priorities: HashMap<u64, f64>) {
        let mut g = self.inner.lock();
        let inner = &mut *g;
        inner.policy.set_epoch_priorities(priorities);
        inner.order.clear();
        for (k, e) in inner.entries.iter_mut() {
            e.prio = ordered(inner.policy.priority(*k));
            inner.order.insert((e.prio, *k));
        }
    }

    /// Makes this cache one part of a partitioned one: from now on it holds only keys of
    /// `share` (entries outside it are dropped, offers of other keys refused), ranked by
    /// `priorities` as [`Cache::set_epoch_priorities`] ranks them (none: as before). A service worker's cache
    /// holds its share of the job's hot set this way, and no key another worker holds.
    pub fn set_epoch_share(&self, priorities: HashMap<u64, f64>, share: HashSet<u64>) {
        {
            let mut g = self.inner.lock();
            let inner = &mut *g;
            let gone: Vec<u64> = inner.entries.keys().filter(|k| !share.contains(k)).copied().collect();
            for k in gone {
                if let Some(e) = inner.entries.remove(&k) {
                    inner.order.remove(&(e.prio, k));
                    inner.used -= e.bytes;
                    inner.policy.on_evict(k);
                    inner.counts.evictions += 1;
                }
            }
            inner.share = Some(share);
        }
        if !priorities.is_empty() {
            self.set_epoch_priorities(priorities);
        }
    }

    /// Ends [`Cache::set_epoch_share`]: any key may be cached again.
    pub fn unshare(&self) {
        self.inner.lock().share = None;
    }

    /// Hands the policy its priorities for the epoch `draw` starts, from the same state the
    /// draw came from (see [`epoch_priorities`]). The loader calls it at each epoch; a
    /// caller driving a cache and an [`ImportanceStore`] of its own (a simulation of the
    /// policies) calls it the same way.
    pub fn set_priorities_for(&self, draw: &EpochDraw, store: &ImportanceStore, manifest: &Manifest) {
        if let Some(p) = epoch_priorities(self.policy_kind(), draw, store, manifest) {
            let keyed = manifest.entries().zip(p).map(|(e, p)| (e.key.0, p)).collect();
            self.set_epoch_priorities(keyed);
        }
    }

    /// How many of `keys` are held now.
    pub fn held(&self, keys: &[u64]) -> u64 {
        let g = self.inner.lock();
        keys.iter().filter(|k| g.entries.contains_key(k)).count() as u64
    }

    /// How many entries the budget holds, from the sizes of every sample offered so far.
    pub fn capacity_entries(&self) -> Option<u64> {
        let g = self.inner.lock();
        if g.sizes.is_empty() {
            return None;
        }
        let mean = g.sizes.values().sum::<u64>() as f64 / g.sizes.len() as f64;
        Some((self.budget as f64 / mean.max(1.0)) as u64)
    }

    /// Whether either tier holds `key` (a lookup now would hit, unless it is evicted first).
    pub fn contains(&self, key: u64) -> bool {
        self.inner.lock().entries.contains_key(&key) || self.disk.as_ref().is_some_and(|d| d.contains(key))
    }

    pub fn stats(&self) -> CacheStats {
        let g = self.inner.lock();
        CacheStats {
            policy: g.policy.kind(),
            level: g.level.unwrap_or(CacheLevel::Auto),
            tier: g.counts.snapshot(self.budget, g.used, g.entries.len() as u64),
            est_time_saved_s: g.saved_s,
            costs: g.costs,
            estimates: g.estimates.clone(),
            off: g.off,
            disk: self.disk.as_ref().map(DiskTier::stats),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::ByteBudget;

    fn cache(policy: CachePolicyKind, entries: u64) -> Cache {
        let spec = CacheSpec {
            budget: ByteBudget::Bytes(entries * 10),
            level: CacheLevel::Raw,
            resize: None,
            policy,
            disk: None,
            share: false,
        };
        Cache::new(&spec, entries * 10, 100)
    }

    fn put(c: &Cache, key: u64) -> bool {
        c.offer(key, Arc::new(CachedData::Raw(vec![0; 10])))
    }

    fn held(c: &Cache, keys: std::ops::Range<u64>) -> Vec<u64> {
        keys.filter(|&k| c.contains(k)).collect()
    }

    /// The keys `stats()` shows (Python's `stats()["cache"]`, `sluice run`'s JSON), both tiers.
    #[test]
    fn stats_serialize_the_same_keys_for_both_tiers() {
        let dir = tempfile::tempdir().unwrap();
        let disk_spec = sluice_core::DiskCacheSpec {
            dir: dir.path().to_path_buf(),
            budget: ByteBudget::Bytes(1000),
            policy: Default::default(),
        };
        let c = cache(CachePolicyKind::Lru, 3).with_disk(DiskTier::open(&disk_spec, 7).unwrap());
        assert!(put(&c, 1));
        assert!(c.get(1).is_some() && c.get(2).is_none());
        let v = serde_json::to_value(c.stats()).unwrap();
        let keys = |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>().join(" ");
        assert_eq!(
            keys(&v),
            "budget_bytes costs disk entries est_time_saved_s estimates evictions hit_rate hits insertions level \
             misses off policy rejected used_bytes"
        );
        assert_eq!(
            keys(&v["disk"]),
            "budget_bytes bytes_read bytes_written corrupt dir entries evictions hit_rate hits insertions misses \
             policy recovered rejected used_bytes write_errors"
        );
        assert_eq!((v["hits"].as_u64(), v["misses"].as_u64(), v["entries"].as_u64()), (Some(1), Some(1), Some(1)));
        assert_eq!(
            (v["hit_rate"].as_f64(), v["budget_bytes"].as_u64(), v["used_bytes"].as_u64()),
            (Some(0.5), Some(30), Some(10))
        );
        let d = &v["disk"];
        assert_eq!((d["hits"].as_u64(), d["misses"].as_u64(), d["insertions"].as_u64()), (Some(0), Some(1), Some(1)));
        assert_eq!((d["budget_bytes"].as_u64(), d["entries"].as_u64()), (Some(1000), Some(1)));
    }

    #[test]
    fn lru_evicts_the_least_recently_used() {
        let c = cache(CachePolicyKind::Lru, 3);
        for k in 0..3 {
            assert!(put(&c, k));
        }
        assert!(c.get(0).is_some()); // 1 is now the oldest
        assert!(put(&c, 3));
        assert_eq!(held(&c, 0..4), vec![0, 2, 3]);
        assert!(put(&c, 4));
        assert_eq!(held(&c, 0..5), vec![0, 3, 4]);
        let s = c.stats();
        assert_eq!((s.tier.evictions, s.tier.hits, s.tier.used_bytes), (2, 1, 30));
    }

    #[test]
    fn shade_evicts_the_lowest_rank_score_and_remembers_ghosts() {
        let c = cache(CachePolicyKind::Shade, 3);
        for k in 0..3 {
            assert!(put(&c, k));
        }
        // One batch: key 1 has the smallest loss (score ln 11), then 0 (ln 12), then 2 (ln 13).
        c.report(&[0, 1, 2], &[0.5, 0.1, 0.9]);
        // A key never scored ranks ln 10: it cannot displace anything.
        assert!(!put(&c, 7));
        // Key 8 reported with the highest loss of its batch: it displaces key 1 (lowest).
        c.report(&[8, 9, 10, 11], &[3.0, 0.0, 0.0, 0.0]);
        assert!(put(&c, 8));
        assert_eq!(held(&c, 0..12), vec![0, 2, 8]);
        // Key 1 is now a ghost with its score ln 11 remembered: it still cannot beat ln 12.
        assert!(!put(&c, 1));
        c.report(&[1, 3, 4, 5, 6], &[9.0, 0.0, 0.0, 0.0, 0.0]); // now ln 15
        assert!(put(&c, 1));
        assert_eq!(held(&c, 0..12), vec![1, 2, 8], "key 0 (ln 12) was the lowest");
    }

    #[test]
    fn fastmatch_and_importance_evict_the_lowest_epoch_priority_and_refuse_lower_offers() {
        for kind in [CachePolicyKind::Fastmatch, CachePolicyKind::Importance] {
            let c = cache(kind, 2);
            c.set_epoch_priorities((0..10).map(|k| (k, k as f64)).collect());
            assert!(put(&c, 5));
            assert!(put(&c, 3));
            assert!(!put(&c, 1), "{kind:?}: a less important key must not displace");
            assert!(put(&c, 9));
            assert_eq!(held(&c, 0..10), vec![5, 9], "{kind:?}: 3 was the least important");
            // Priorities change at the next epoch; entries are re-ranked.
            c.set_epoch_priorities((0..10).map(|k| (k, -(k as f64))).collect());
            assert!(put(&c, 0));
            assert_eq!(held(&c, 0..10), vec![0, 5], "{kind:?}");
            assert_eq!(c.stats().tier.rejected, 1);
        }
    }

    #[test]
    fn a_cache_given_a_share_holds_only_keys_of_it() {
        let c = cache(CachePolicyKind::Importance, 4);
        assert!(put(&c, 1) && put(&c, 2));
        let share: HashSet<u64> = [2, 3, 4].into_iter().collect();
        c.set_epoch_share((2..5).map(|k| (k, 1.0)).collect(), share);
        assert_eq!(held(&c, 0..10), vec![2], "key 1 is another worker's: dropped");
        assert!(!put(&c, 7), "a key outside the share is refused, even with room");
        assert!(put(&c, 3) && put(&c, 4));
        assert_eq!(held(&c, 0..10), vec![2, 3, 4]);
        assert_eq!(c.held(&[1, 2, 3, 9]), 2);
        let s = c.stats();
        assert_eq!((s.tier.entries, s.tier.used_bytes, s.tier.rejected), (3, 30, 1));
    }

    #[test]
    fn importance_before_scores_keeps_what_it_has_instead_of_churning() {
        let c = cache(CachePolicyKind::Importance, 2);
        assert!(put(&c, 1) && put(&c, 2));
        assert!(!put(&c, 3), "all keys tie before scores exist: no churn");
        assert_eq!(held(&c, 0..4), vec![1, 2]);
    }

    #[test]
    fn entries_over_budget_are_refused_and_capacity_follows_entry_sizes() {
        let c = cache(CachePolicyKind::Lru, 2);
        assert!(!c.offer(1, Arc::new(CachedData::Raw(vec![0; 21]))));
        assert!(put(&c, 2));
        // Sizes seen: 21 and 10 -> mean 15.5 -> 20 / 15.5 = 1 entry.
        assert_eq!(c.capacity_entries(), Some(1));
        assert!(c.get(99).is_none());
        let s = c.stats();
        assert_eq!((s.tier.hits, s.tier.misses, s.tier.entries), (0, 1, 1));
    }

    #[test]
    fn a_pixel_entry_counts_its_boxes_and_mask_against_the_budget() {
        let img = Image::rgb8(4, 2, vec![0; 24]);
        let boxes = BoxTargets { boxes: vec![[0.0, 0.0, 1.0, 1.0]], labels: vec![1] };
        let mask = Mask { width: 4, height: 2, data: vec![0; 8] };
        let plain = CachedData::Decoded(img.clone(), None, None);
        assert_eq!((plain.bytes(), plain.keeps_records()), (24, false));
        let kept = CachedData::Resized(img, Some(boxes), Some(mask));
        assert_eq!((kept.bytes(), kept.keeps_records()), (24 + 16 + 8 + 8, true));
        assert!(!CachedData::Raw(vec![0; 3]).keeps_records());
        // A budget that holds the pixels but not the mask refuses the entry.
        let c = cache(CachePolicyKind::Lru, 5); // 50 bytes
        assert!(!c.offer(1, Arc::new(kept)));
        assert!(c.offer(2, Arc::new(plain)));
    }

    #[test]
    fn auto_measures_then_decides() {
        let spec = CacheSpec {
            budget: ByteBudget::Bytes(1 << 20),
            level: CacheLevel::Auto,
            resize: None,
            policy: CachePolicyKind::Lru,
            disk: None,
            share: false,
        };
        let c = Cache::new(&spec, 1 << 20, 1000);
        let cost = SampleCost {
            read_s: 1e-4,
            decode_s: 5e-3,
            resize_s: 0.0,
            raw_bytes: 1000,
            decoded_bytes: 3000,
            resized_bytes: 3000,
            sample_s: 6e-3,
        };
        for _ in 0..MEASURE_SAMPLES - 1 {
            c.observe(&cost);
        }
        assert_eq!(c.level(), None);
        c.observe(&cost);
        assert_eq!(c.level(), Some(CacheLevel::Decoded));
        assert_eq!(c.stats().estimates.len(), 2);
        assert_eq!(c.stats().off, None);

        // 5.1 ms of every 105.1 ms could be saved: under 5%, so nothing is cached, for good.
        let c = Cache::new(&spec, 1 << 20, 1000);
        let cheap = SampleCost { sample_s: 0.1051, ..cost };
        for _ in 0..MEASURE_SAMPLES {
            c.observe(&cheap);
        }
        let off = c.stats().off.expect("a cache saving 4.9% of the work was kept");
        assert_eq!((c.level(), off.best), (None, CacheLevel::Decoded));
        c.observe(&cost);
        assert_eq!(c.level(), None, "decided once");
    }
}
