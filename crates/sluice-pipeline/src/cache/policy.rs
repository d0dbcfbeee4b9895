//! Eviction policies. Each gives every key a priority; a full cache evicts the entry with
//! the lowest priority, and (except LRU, which always makes room) admits a new entry only
//! when it outranks that victim, so a scan of unimportant samples cannot flush the cache.

use std::collections::{HashMap, VecDeque};

use sluice_core::CachePolicyKind;

use crate::importance::shade_rank_scores;

pub trait Policy: Send {
    fn kind(&self) -> CachePolicyKind;
    /// The priority `key` would be stored with now.
    fn priority(&mut self, key: u64) -> f64;
    /// Called on a hit; returns the entry's new priority if a hit changes it.
    fn on_hit(&mut self, key: u64) -> Option<f64>;
    /// Called when `key` enters the cache.
    fn on_insert(&mut self, _key: u64) {}
    /// Called when `key` leaves the cache.
    fn on_evict(&mut self, _key: u64) {}
    /// True if a new entry always displaces the lowest (LRU); false if it must outrank it.
    fn always_admit(&self) -> bool {
        false
    }
    /// The trainer's per-sample values for one batch; returns keys whose priority changed.
    fn on_report(&mut self, _keys: &[u64], _values: &[f64]) -> Vec<u64> {
        Vec::new()
    }
    /// Per-key priorities for the epoch about to start (importance-driven policies).
    fn set_epoch_priorities(&mut self, _priorities: HashMap<u64, f64>) {}
}

pub fn make_policy(kind: CachePolicyKind) -> Box<dyn Policy> {
    match kind {
        CachePolicyKind::Lru => Box::new(Lru::default()),
        CachePolicyKind::Shade => Box::new(Shade::new(4096)),
        CachePolicyKind::Fastmatch => Box::new(EpochPriority::new(CachePolicyKind::Fastmatch)),
        CachePolicyKind::Importance => Box::new(EpochPriority::new(CachePolicyKind::Importance)),
    }
}

/// Least recently used: priority is a logical clock of the last access.
#[derive(Default)]
pub struct Lru {
    clock: u64,
}

impl Policy for Lru {
    fn kind(&self) -> CachePolicyKind {
        CachePolicyKind::Lru
    }
    fn priority(&mut self, _key: u64) -> f64 {
        self.clock += 1;
        self.clock as f64
    }
    fn on_hit(&mut self, key: u64) -> Option<f64> {
        Some(self.priority(key))
    }
    fn always_admit(&self) -> bool {
        true
    }
}

/// SHADE: within each reported batch, the sample with the i-th smallest loss scores
/// `ln(i + 10)`; a key keeps its latest score. The lowest score is evicted. Scores are kept
/// for cached keys and for ghost entries: the `ghost_capacity` most recently evicted (or
/// reported but not cached) keys, so a key that comes back is judged by its history;
/// anything older is forgotten and comes back as unknown, ranking lowest (`ln(10)`).
pub struct Shade {
    scores: HashMap<u64, f64>,
    ghosts: VecDeque<u64>,
    ghost_capacity: usize,
    cached: std::collections::HashSet<u64>,
}

impl Shade {
    pub fn new(ghost_capacity: usize) -> Self {
        Self { scores: HashMap::new(), ghosts: VecDeque::new(), ghost_capacity, cached: Default::default() }
    }

    fn push_ghost(&mut self, key: u64) {
        if self.ghosts.contains(&key) {
            return;
        }
        self.ghosts.push_back(key);
        while self.ghosts.len() > self.ghost_capacity {
            if let Some(old) = self.ghosts.pop_front() {
                if !self.cached.contains(&old) {
                    self.scores.remove(&old);
                }
            }
        }
    }
}

impl Policy for Shade {
    fn kind(&self) -> CachePolicyKind {
        CachePolicyKind::Shade
    }
    fn priority(&mut self, key: u64) -> f64 {
        self.scores.get(&key).copied().unwrap_or(10f64.ln())
    }
    fn on_insert(&mut self, key: u64) {
        self.cached.insert(key);
        if let Some(pos) = self.ghosts.iter().position(|&g| g == key) {
            self.ghosts.remove(pos);
        }
    }
    fn on_hit(&mut self, _key: u64) -> Option<f64> {
        None
    }
    fn on_evict(&mut self, key: u64) {
        self.cached.remove(&key);
        self.push_ghost(key);
    }
    fn on_report(&mut self, keys: &[u64], values: &[f64]) -> Vec<u64> {
        let ranks = shade_rank_scores(values);
        let mut changed = Vec::new();
        for (&k, r) in keys.iter().zip(ranks) {
            self.scores.insert(k, r);
            if self.cached.contains(&k) {
                changed.push(k);
            } else {
                self.push_ghost(k);
            }
        }
        changed
    }
}

/// Priorities fixed per epoch from the importance store:
/// * `fastmatch`: the normalised score `(g − median)/IQR` (evict the least important, as
///   published);
/// * `importance`: the number of times the importance sampler expects to draw the key this
///   epoch. With equal entry sizes that is the expected hits the entry buys per epoch, so
///   keeping the highest maximises the hit rate for the budget; before scores exist every
///   key expects 1 draw, all tie, and a full cache stops churning (a scan cannot flush it).
pub struct EpochPriority {
    kind: CachePolicyKind,
    priorities: HashMap<u64, f64>,
    default: f64,
}

impl EpochPriority {
    pub fn new(kind: CachePolicyKind) -> Self {
        Self { kind, priorities: HashMap::new(), default: 0.0 }
    }
}

impl Policy for EpochPriority {
    fn kind(&self) -> CachePolicyKind {
        self.kind
    }
    fn priority(&mut self, key: u64) -> f64 {
        self.priorities.get(&key).copied().unwrap_or(self.default)
    }
    fn on_hit(&mut self, _key: u64) -> Option<f64> {
        None
    }
    fn set_epoch_priorities(&mut self, priorities: HashMap<u64, f64>) {
        let n = priorities.len().max(1) as f64;
        self.default = priorities.values().sum::<f64>() / n;
        self.priorities = priorities;
    }
}
