//! The entropy indexes of one loader's files, shared by its decoding threads.
//!
//! A file's index ([`crate::entropy_index`]) is made the first time a crop of it is
//! decoded, and kept under the file's fingerprint (a 128-bit hash of its bytes): a file that
//! changes is a new file, never cut with an old index. Files the index cannot serve
//! (progressive, arithmetic-coded, damaged, ...) are remembered as such, so each is tried
//! once. The store holds at most `budget` bytes; once full, further files decode the
//! ordinary way (counted in [`IndexStats::over_budget`]).
//!
//! With a folder ([`IndexStore::with_dir`]), each index is also written there as
//! `<fingerprint>.slix` (atomically: a temporary file renamed), and a file met for the
//! first time is looked up there before it is indexed: a second run, another rank or
//! another worker of the machine starts from the indexes the first one made, and
//! `sluice index` can make them ahead. What is read back is checked (a checksum, the
//! image's MCUs, every point's bounds); a damaged index is refused with its path named,
//! made again and written over.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use xxhash_rust::xxh3::xxh3_128;

use crate::entropy_index::{EntropyIndex, Frame};

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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
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
    /// Indexes read from the folder instead of made, and ones there refused as damaged.
    pub loaded: u64,
    pub rejected: u64,
}

#[derive(Debug)]
pub struct IndexStore {
    spacing: u32,
    budget: usize,
    known: Mutex<(HashMap<u128, Known>, usize)>,
    dir: Option<PathBuf>,
    over_budget: AtomicU64,
    cut: AtomicU64,
    loaded: AtomicU64,
    rejected: AtomicU64,
    /// Whether writing to `dir` failed once (said once, then the store goes on in memory).
    write_failed: std::sync::atomic::AtomicBool,
}

impl IndexStore {
    /// A store of at most `budget` bytes whose indexes have a point every `spacing` MCUs.
    pub fn new(spacing: u32, budget: usize) -> Self {
        Self {
            spacing: spacing.max(1),
            budget,
            known: Mutex::new((HashMap::new(), 0)),
            dir: None,
            over_budget: AtomicU64::new(0),
            cut: AtomicU64::new(0),
            loaded: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            write_failed: Default::default(),
        }
    }

    /// Keeps the indexes in `dir` too (created if missing), shared with every process
    /// that uses the same folder.
    pub fn with_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.dir = dir;
        self
    }

    /// Where the index of the file with fingerprint `key` is stored in `dir`.
    pub fn path_in(dir: &Path, key: u128) -> PathBuf {
        dir.join(format!("{key:032x}.slix"))
    }

    /// The fingerprint a file's index is kept under.
    pub fn fingerprint(bytes: &[u8]) -> u128 {
        xxh3_128(bytes)
    }

    /// An index stored in the folder for this file, if there is a sound one.
    fn load(&self, key: u128, bytes: &[u8], frame: &Frame) -> Option<EntropyIndex> {
        let path = Self::path_in(self.dir.as_deref()?, key);
        let stored = std::fs::read(&path).ok()?;
        let index = EntropyIndex::from_bytes(&stored, frame, bytes.len().saturating_sub(frame.data_offset()));
        if index.is_none() {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(path = %path.display(), "entropy index: a damaged index is refused; the file is indexed again");
        } else {
            self.loaded.fetch_add(1, Ordering::Relaxed);
        }
        index
    }

    /// Writes `index` to the folder (a temporary file, then renamed, so that a reader
    /// never sees half of one); without a folder, nothing.
    fn store(&self, key: u128, index: &EntropyIndex) -> std::io::Result<()> {
        let Some(dir) = self.dir.as_deref() else { return Ok(()) };
        let tmp = dir.join(format!(".{key:032x}.{}.tmp", std::process::id()));
        let written = std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(&tmp, index.to_bytes()))
            .and_then(|()| std::fs::rename(&tmp, Self::path_in(dir, key)));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
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
        let built = frame.as_ref().and_then(|f| {
            self.load(key, bytes, f).or_else(|| {
                let index = EntropyIndex::build(bytes, f, self.spacing)?;
                if let Err(e) = self.store(key, &index) {
                    if !self.write_failed.swap(true, Ordering::Relaxed) {
                        let dir = self.dir.as_deref().unwrap_or(Path::new("")).display().to_string();
                        tracing::warn!(%dir, error = %e, "entropy index: cannot write indexes; they stay in memory");
                    }
                }
                Some(index)
            })
        });
        let built = built.map(Arc::new);
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

    /// Makes the index of `bytes` and writes it to the folder, keeping nothing in memory
    /// (`sluice index`); an index already there and sound is kept (counted in
    /// [`IndexStats::loaded`]). `Ok(false)` when the index cannot serve the file.
    pub fn index_to_dir(&self, bytes: &[u8], max_pixels: u64) -> std::io::Result<bool> {
        let Some(frame) = Frame::parse(bytes, max_pixels) else { return Ok(false) };
        let key = xxh3_128(bytes);
        if self.load(key, bytes, &frame).is_some() {
            return Ok(true);
        }
        match EntropyIndex::build(bytes, &frame, self.spacing) {
            Some(index) => self.store(key, &index).map(|()| true),
            None => Ok(false),
        }
    }

    /// Whether `a` and `b` are the same store (or both none).
    pub(crate) fn same(a: Option<&Arc<Self>>, b: Option<&Arc<Self>>) -> bool {
        match (a, b) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (a, b) => a.is_none() && b.is_none(),
        }
    }

    pub(crate) fn count_cut(&self) {
        self.cut.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stats(&self) -> IndexStats {
        let guard = self.lock();
        let mut s = IndexStats {
            over_budget: self.over_budget.load(Ordering::Relaxed),
            cut: self.cut.load(Ordering::Relaxed),
            loaded: self.loaded.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::encode_jpeg;
    use crate::jpeg::tests::test_rgb;
    use crate::jpeg::JpegDecoder;
    use crate::resize::SubRect;

    const LIMIT: u64 = 1 << 26;

    fn crop(store: &Arc<IndexStore>, file: &[u8]) -> Vec<u8> {
        let mut d = JpegDecoder::new(LIMIT).unwrap();
        d.set_index(Some(store));
        let mut out = Vec::new();
        d.decode_region(file, SubRect { left: 120.0, top: 90.0, width: 60.0, height: 50.0 }, (60, 50), &mut out)
            .unwrap();
        out
    }

    #[test]
    fn stores_sharing_a_folder_make_each_index_once_and_refuse_a_damaged_one() {
        let dir = std::env::temp_dir().join(format!("sluice-index-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let file = encode_jpeg(&test_rgb(320, 240), 320, 240, 90).unwrap();
        let store = |spacing| Arc::new(IndexStore::new(spacing, 1 << 20).with_dir(Some(dir.clone())));

        let first = store(2);
        let want = crop(&first, &file);
        let s = first.stats();
        assert_eq!((s.indexed, s.loaded, s.cut), (1, 0, 1), "{s:?}");
        let path = IndexStore::path_in(&dir, IndexStore::fingerprint(&file));
        assert!(path.is_file());

        // Another store (another process) reads it instead of indexing; its own spacing
        // does not matter: the index carries its own.
        let second = store(4);
        assert_eq!(crop(&second, &file), want);
        assert_eq!((second.stats().loaded, second.stats().cut), (1, 1));

        // A damaged index is refused, the file indexed again, and the index written over.
        let mut stored = std::fs::read(&path).unwrap();
        let mid = stored.len() / 2;
        stored[mid] ^= 0xFF;
        std::fs::write(&path, &stored).unwrap();
        let third = store(2);
        assert_eq!(crop(&third, &file), want);
        let s = third.stats();
        assert_eq!((s.rejected, s.loaded, s.indexed), (1, 0, 1), "{s:?}");
        assert!(store(2).index_of(&file, LIMIT).is_some());

        // A changed file is another file: its own index, never the old one.
        let changed = encode_jpeg(&test_rgb(320, 240), 320, 240, 80).unwrap();
        assert_ne!(IndexStore::fingerprint(&changed), IndexStore::fingerprint(&file));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_full_store_and_an_unservable_file_decode_the_ordinary_way_and_are_counted() {
        let file = encode_jpeg(&test_rgb(320, 240), 320, 240, 90).unwrap();
        let tiny = Arc::new(IndexStore::new(2, 10));
        let plain = {
            let mut d = JpegDecoder::new(LIMIT).unwrap();
            let mut out = Vec::new();
            d.decode_region(&file, SubRect { left: 120.0, top: 90.0, width: 60.0, height: 50.0 }, (60, 50), &mut out)
                .unwrap();
            out
        };
        assert_eq!(crop(&tiny, &file), plain);
        assert_eq!((tiny.stats().over_budget, tiny.stats().cut), (1, 0));
        let progressive = crate::encode::encode_jpeg_progressive(&test_rgb(320, 240), 320, 240, 90).unwrap();
        let store = Arc::new(IndexStore::new(2, 1 << 20));
        crop(&store, &progressive);
        crop(&store, &progressive);
        let s = store.stats();
        assert_eq!((s.unservable, s.indexed, s.cut), (1, 0, 0), "{s:?}");
    }
}
