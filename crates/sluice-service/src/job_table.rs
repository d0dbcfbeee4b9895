//! A worker's job loaders: kept while their jobs run, dropped once idle too long, and at
//! most so many (the least recently used goes first), so clients creating job after job
//! cannot make a worker hold loaders, threads and caches without end.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct JobTable<K, V> {
    /// Each entry and when it was last used.
    entries: HashMap<K, (Arc<V>, Instant)>,
    max: usize,
    idle: Duration,
}

/// An entry is in use while anyone else holds it (a running task, a connection).
fn in_use<V>(v: &Arc<V>) -> bool {
    Arc::strong_count(v) > 1
}

impl<K: Hash + Eq + Clone, V> JobTable<K, V> {
    /// At most `max` entries (at least 1); an entry unused for `idle` goes.
    pub fn new(max: usize, idle: Duration) -> Self {
        Self { entries: HashMap::new(), max: max.max(1), idle }
    }

    /// The entry for `key`, now its most recently used.
    pub fn get(&mut self, key: &K, now: Instant) -> Option<Arc<V>> {
        let (v, used) = self.entries.get_mut(key)?;
        *used = now;
        Some(v.clone())
    }

    /// Makes room for one more entry, dropping the least recently used not in use; false
    /// if every entry is in use.
    pub fn make_room(&mut self, now: Instant) -> bool {
        self.evict_idle(now);
        if self.entries.len() < self.max {
            return true;
        }
        let lru = self.entries.iter().filter(|(_, (v, _))| !in_use(v)).min_by_key(|(_, (_, used))| *used);
        match lru.map(|(k, _)| k.clone()) {
            Some(k) => {
                self.entries.remove(&k);
                true
            }
            None => false,
        }
    }

    /// Keeps `value` under `key` (after [`Self::make_room`]).
    pub fn insert(&mut self, key: K, value: Arc<V>, now: Instant) {
        self.entries.insert(key, (value, now));
    }

    /// Drops the entries unused for the idle time; one in use counts as used now.
    pub fn evict_idle(&mut self, now: Instant) -> usize {
        let before = self.entries.len();
        let idle = self.idle;
        self.entries.retain(|_, (v, used)| {
            if in_use(v) {
                *used = now;
            }
            now.saturating_duration_since(*used) < idle
        });
        before - self.entries.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &Arc<V>)> {
        self.entries.iter().map(|(k, (v, _))| (k, v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_entries_go_and_the_least_recently_used_makes_room_unless_in_use() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut t: JobTable<u64, &str> = JobTable::new(2, Duration::from_secs(60));
        assert!(t.make_room(s(0)));
        t.insert(1, Arc::new("one"), s(0));
        t.insert(2, Arc::new("two"), s(1));
        assert!(t.get(&1, s(2)).is_some()); // 2 is now the least recently used
        assert!(t.make_room(s(3)));
        t.insert(3, Arc::new("three"), s(3));
        assert!(t.get(&2, s(3)).is_none(), "the least recently used made room");

        // Entries in use are kept, past the cap's pressure and the idle time.
        let running = t.get(&1, s(4)).unwrap();
        let also = t.get(&3, s(4)).unwrap();
        assert!(!t.make_room(s(5)), "every entry is in use: no room");
        assert_eq!(t.evict_idle(s(200)), 0);
        drop((running, also));
        // Idle from their last use (200 s, when the sweep saw them in use) on.
        assert_eq!(t.evict_idle(s(259)), 0);
        assert_eq!(t.evict_idle(s(260)), 2);
        assert_eq!(t.len(), 0);
    }
}
