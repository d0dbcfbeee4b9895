//! The entropy indexes of one loader's files, shared by its decoding threads.
//!
//! A file's index ([`crate::entropy_index`]) is made the first time a crop of it is
//! decoded, and kept under the file's fingerprint (a 128-bit hash of its bytes): a file that
//! changes is a new file, never cut with an old index. Files the index cannot serve
//! (progressive, arithmetic-coded, damaged, ...) are remembered as such, so each is tried
//! once. The store holds at most `budget` bytes; once full, further files decode the
//! ordinary way (counted in [`IndexStats::over_budget`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use xxhash_rust::xxh3::xxh3_128;

use crate::entropy_index::{EntropyIndex, Frame};

/// Index points every this many MCUs, unless the store is told otherwise: measured in
/// BENCHMARKS.md ("Entropy index"), the spacing that decoded crops fastest.
pub const DEFAULT_SPACING: u32 = 2;

/// What one file is to the store.
#[derive(Debug)]
enum Known {
    Indexed(Arc<EntropyIndex>),
    /// The index cannot serve it: it decodes the ordinary way.
    Unservable,
}

/// Bytes an entry costs beyond its index: the key, the map's slot, the `Arc`.
const ENTRY_BYTES: usize = 64;

/// Counts since the store was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Files indexed, and the bytes their indexes hold.
    pub indexed: u64,
    pub bytes: u64,
    /// Files the index cannot serve (they decode whole, the ordinary way).
    pub unservable: u64,
    /// Files not indexed because the store was full.
    pub over_budget: u64,
    /// Decodes that were cut down to their window with an index.
    pub cut: u64,
}

#[derive(Debug)]
pub struct IndexStore {
    spacing: u32,
    budget: usize,
    known: Mutex<(HashMap<u128, Known>, usize)>,
    over_budget: AtomicU64,
    cut: AtomicU64,
}

impl IndexStore {
    /// A store of at most `budget` bytes whose indexes have a point every `spacing` MCUs.
    pub fn new(spacing: u32, budget: usize) -> Self {
        Self {
            spacing: spacing.max(1),
            budget,
            known: Mutex::new((HashMap::new(), 0)),
            over_budget: AtomicU64::new(0),
            cut: AtomicU64::new(0),
        }
    }

    /// The headers and index of `bytes`, the index made now if this is the first time;
    /// `None` when the file cannot be indexed (images of more than `max_pixels` pixels
    /// among them) or the store is full.
    pub(crate) fn index_of(&self, bytes: &[u8], max_pixels: u64) -> Option<(Frame, Arc<EntropyIndex>)> {
        let key = xxh3_128(bytes);
        let known = match self.lock().0.get(&key) {
            Some(Known::Indexed(index)) => Some(index.clone()),
            Some(Known::Unservable) => return None,
            None => None,
        };
        let frame = Frame::parse(bytes, max_pixels);
        if let Some(index) = known {
            // The key is the content's, so the headers are the ones it was built from.
            return Some((frame?, index));
        }
        // Built outside the lock: other threads keep decoding. Two threads that meet the
        // same new file both build it; the second insert finds the first's.
        let built = frame.as_ref().and_then(|f| EntropyIndex::build(bytes, f, self.spacing)).map(Arc::new);
        let cost = ENTRY_BYTES + built.as_ref().map_or(0, |i| i.heap_bytes());
        let mut guard = self.lock();
        let (map, used) = &mut *guard;
        if let std::collections::hash_map::Entry::Vacant(slot) = map.entry(key) {
            if *used + cost > self.budget {
                self.over_budget.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            *used += cost;
            slot.insert(built.clone().map_or(Known::Unservable, Known::Indexed));
        }
        Some((frame?, built?))
    }

    pub(crate) fn count_cut(&self) {
        self.cut.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stats(&self) -> IndexStats {
        let guard = self.lock();
        let mut s = IndexStats {
            over_budget: self.over_budget.load(Ordering::Relaxed),
            cut: self.cut.load(Ordering::Relaxed),
            ..IndexStats::default()
        };
        for known in guard.0.values() {
            match known {
                Known::Indexed(i) => {
                    s.indexed += 1;
                    s.bytes += i.heap_bytes() as u64;
                }
                Known::Unservable => s.unservable += 1,
            }
        }
        s
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (HashMap<u128, Known>, usize)> {
        // A thread that panicked while holding the lock left the map whole (inserts are
        // single steps): go on with it.
        self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
