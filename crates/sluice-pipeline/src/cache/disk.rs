//! The cache's local-disk tier: entries in files under `cache.disk.dir`, within a byte
//! budget of their own, under the memory tier. The memory tier writes every entry it is
//! offered through to this one (so what memory gives up or refuses is still on disk, and
//! the tier holds the hot set again after a restart), and looks here on a memory miss.
//!
//! * One file per entry, `<key>.entry`, in a folder named for the dataset and the
//!   deterministic part of the pipeline ([`super::share_key`]): an entry of another dataset or of
//!   other deterministic ops is never served. Each file is written to a temporary name
//!   and renamed, and carries an xxh3 checksum over its header and payload: a half-written
//!   or corrupt file is a miss (counted in `corrupt`), deleted, never served.
//! * The index is rebuilt from the folder when the tier opens, so a restarted job (or a
//!   new loader of the same pipeline) hits what an earlier one wrote.
//! * One owner at a time: the tier holds an exclusive lock (`flock`) on the folder's
//!   `.lock` file for its life, taken before it looks at a file. A second opener, in this
//!   process or another (a second rank of the node, a `map` worker process), is refused
//!   with [`DiskCacheError::InUse`]: two indexes over one folder would each keep the
//!   whole budget and delete the other's entries (and live temporary files) as stray.
//! * Eviction is Belady's rule ([`DiskPolicyKind::Belady`]) over the known order of the
//!   coming epoch(s) ([`super::future::NextUse`]): the entry needed furthest in the future
//!   goes first, and an entry needed later than everything held is not admitted (NoPFS).
//!   Entries no known order needs rank by the importance sampler's expected draws, so the
//!   importance policy still decides beyond the horizon. `lru` is there for comparison.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::Serialize;
use sluice_core::{CacheLevel, DiskCacheSpec, DiskPolicyKind, Image, Layout, Pixels};
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use super::future::NextUse;
use super::{ordered, CachedData, TierCounts, TierStats};

const MAGIC: &[u8; 4] = b"SLDC";
const VERSION: u8 = 1;
/// magic, version, level, 2 reserved, key, namespace, width, height, payload length.
const HEADER: usize = 4 + 1 + 1 + 2 + 8 + 8 + 4 + 4 + 8;
const CHECKSUM: usize = 8;
const ENTRY_SUFFIX: &str = ".entry";
const TMP_MARK: &str = ".tmp";
/// The file the owner of a folder locks (neither an entry nor a temporary name).
const LOCK_FILE: &str = ".lock";

/// The disk tier cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum DiskCacheError {
    #[error("cache.disk.dir {}: cannot create or list the folder: {source}", dir.display())]
    Open { dir: PathBuf, source: io::Error },
    #[error("cache.disk.dir {}: cannot lock the folder's {LOCK_FILE} file: {source}", dir.display())]
    Lock { dir: PathBuf, source: io::Error },
    #[error(
        "cache.disk.dir {}: another loader has this folder open (in this process or another: a second rank \
         of this machine, another job over the same data and pipeline); a disk-cache folder has one owner at \
         a time, so give each process its own cache.disk.dir (e.g. one per rank: `.../rank0`, `.../rank1`), \
         or close the other loader first",
        dir.display()
    )]
    InUse { dir: PathBuf },
}

/// Why an entry file was not served.
#[derive(Debug, thiserror::Error)]
enum EntryError {
    #[error("read: {0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Corrupt(&'static str),
}

/// Eviction rank: the lowest is the next victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Rank {
    /// Belady: `u64::MAX - next use` (0 when no known order needs it); LRU: last access.
    keep: u64,
    /// Belady's tie-break among entries no known order needs: expected draws.
    tie: i64,
}

struct DiskEntry {
    bytes: u64,
    rank: Rank,
    /// Told apart from a later entry of the same key, so a failed read drops only its own.
    gen: u64,
}

struct Inner {
    entries: HashMap<u64, DiskEntry>,
    order: BTreeSet<(Rank, u64)>,
    /// Keys being written, with their reserved bytes (counted in `used`).
    pending: HashSet<u64>,
    used: u64,
    next_use: NextUse,
    /// Expected draws per key this epoch (Belady's tie-break).
    importance: HashMap<u64, f64>,
    clock: u64,
    gen: u64,
    counts: TierCounts,
    corrupt: u64,
    write_errors: u64,
    bytes_read: u64,
    bytes_written: u64,
    recovered: u64,
}

impl Inner {
    fn rank(&mut self, policy: DiskPolicyKind, key: u64) -> Rank {
        match policy {
            DiskPolicyKind::Lru => {
                self.clock += 1;
                Rank { keep: self.clock, tie: 0 }
            }
            DiskPolicyKind::Belady => Rank {
                keep: u64::MAX - self.next_use.next(key),
                tie: ordered(self.importance.get(&key).copied().unwrap_or(0.0)),
            },
        }
    }

    fn rerank(&mut self, policy: DiskPolicyKind, key: u64) {
        if !self.entries.contains_key(&key) {
            return;
        }
        let rank = self.rank(policy, key);
        if let Some(e) = self.entries.get_mut(&key) {
            self.order.remove(&(e.rank, key));
            e.rank = rank;
            self.order.insert((rank, key));
        }
    }

    fn remove(&mut self, key: u64) -> Option<DiskEntry> {
        let e = self.entries.remove(&key)?;
        self.order.remove(&(e.rank, key));
        self.used -= e.bytes;
        Some(e)
    }
}

/// The disk tier's stats, in [`super::CacheStats`].
#[derive(Debug, Clone, Serialize)]
pub struct DiskStats {
    /// The folder entries of this pipeline live in (`cache.disk.dir/<namespace>`).
    pub dir: PathBuf,
    pub policy: DiskPolicyKind,
    /// Occupancy and counters: `hits` are memory misses served from disk, `misses` memory
    /// misses the disk did not hold either.
    #[serde(flatten)]
    pub tier: TierStats,
    /// Entry files found half-written or corrupt: counted as misses, deleted, never served.
    pub corrupt: u64,
    pub write_errors: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Entries found in the folder when the tier opened.
    pub recovered: u64,
}

pub struct DiskTier {
    dir: PathBuf,
    namespace: u64,
    budget: u64,
    policy: DiskPolicyKind,
    tmp_seq: AtomicU64,
    inner: Mutex<Inner>,
    /// Holds the folder's lock while the tier lives (released when the file is closed).
    _lock: fs::File,
}

fn entry_name(key: u64) -> String {
    format!("{key:016x}{ENTRY_SUFFIX}")
}

fn level_code(level: CacheLevel) -> u8 {
    match level {
        CacheLevel::Raw => 0,
        CacheLevel::Decoded => 1,
        CacheLevel::Resized | CacheLevel::Auto => 2,
    }
}

/// The payload and image size of an entry; `None` for what a file cannot hold: only u8 HWC
/// images are stored, and not those kept with a sample's boxes or mask (raw entries of a
/// source with boxes or masks are stored: its boxes come from the source again, and its
/// mask is read again).
fn payload(data: &CachedData) -> Option<(&[u8], u32, u32)> {
    match data {
        CachedData::Raw(b) => Some((b, 0, 0)),
        d if d.keeps_records() => None,
        CachedData::Decoded(img, ..) | CachedData::Resized(img, ..) => match (&img.pixels, img.layout) {
            (Pixels::U8(px), Layout::Hwc) => Some((px, img.width, img.height)),
            _ => None,
        },
    }
}

impl DiskTier {
    /// Opens (creating it if missing) the tier's folder for `namespace` under `spec.dir`,
    /// takes its lock, and indexes the entries already there; leftover temporary files of
    /// an interrupted write are deleted, entries beyond the budget too. A folder another
    /// tier holds is refused ([`DiskCacheError::InUse`]) before anything in it is touched.
    pub fn open(spec: &DiskCacheSpec, namespace: u64) -> Result<Self, DiskCacheError> {
        let dir = spec.dir.join(format!("{namespace:016x}"));
        let open_err = |source| DiskCacheError::Open { dir: dir.clone(), source };
        fs::create_dir_all(&dir).map_err(open_err)?;
        let lock_err = |source| DiskCacheError::Lock { dir: dir.clone(), source };
        let lock = fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(LOCK_FILE));
        let lock = lock.map_err(lock_err)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => return Err(DiskCacheError::InUse { dir }),
            Err(fs::TryLockError::Error(e)) => return Err(lock_err(e)),
        }
        let budget = spec.budget_bytes();
        let mut inner = Inner {
            entries: HashMap::new(),
            order: BTreeSet::new(),
            pending: HashSet::new(),
            used: 0,
            next_use: NextUse::default(),
            importance: HashMap::new(),
            clock: 0,
            gen: 0,
            counts: TierCounts::default(),
            corrupt: 0,
            write_errors: 0,
            bytes_read: 0,
            bytes_written: 0,
            recovered: 0,
        };
        for item in fs::read_dir(&dir).map_err(open_err)? {
            let Ok(item) = item else { continue };
            let name = item.file_name();
            let Some(name) = name.to_str() else { continue };
            if name == LOCK_FILE {
                continue;
            }
            if name.contains(TMP_MARK) {
                if let Err(e) = fs::remove_file(item.path()) {
                    tracing::warn!(path = %item.path().display(), "disk cache: cannot delete a half-written entry: {e}");
                }
                continue;
            }
            let Some(key) = name.strip_suffix(ENTRY_SUFFIX).and_then(|k| u64::from_str_radix(k, 16).ok()) else {
                continue;
            };
            let Ok(meta) = item.metadata() else { continue };
            let bytes = meta.len();
            if inner.used + bytes > budget {
                // The budget shrank since the entries were written.
                let _ = fs::remove_file(item.path());
                continue;
            }
            inner.gen += 1;
            let rank = inner.rank(spec.policy, key);
            inner.entries.insert(key, DiskEntry { bytes, rank, gen: inner.gen });
            inner.order.insert((rank, key));
            inner.used += bytes;
            inner.recovered += 1;
        }
        tracing::info!(dir = %dir.display(), budget, recovered = inner.recovered, policy = ?spec.policy, "disk cache tier open");
        Ok(Self {
            dir,
            namespace,
            budget,
            policy: spec.policy,
            tmp_seq: AtomicU64::new(0),
            inner: Mutex::new(inner),
            _lock: lock,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The order of the coming epoch(s) as keys, from the first sample not yet consumed,
    /// and each key's expected draws this epoch (`importance`; empty: all alike). Every
    /// entry is re-ranked.
    pub fn set_future(&self, keys: impl IntoIterator<Item = u64>, importance: HashMap<u64, f64>) {
        let mut g = self.inner.lock();
        let inner = &mut *g;
        inner.next_use = NextUse::new(keys);
        inner.importance = importance;
        if self.policy == DiskPolicyKind::Belady {
            let keys: Vec<u64> = inner.entries.keys().copied().collect();
            for k in keys {
                inner.rerank(self.policy, k);
            }
        }
    }

    /// Whether the tier holds `key` (its index says so; the file is not read).
    pub fn contains(&self, key: u64) -> bool {
        self.inner.lock().entries.contains_key(&key)
    }

    /// A lookup of `key` that the memory tier answered: the disk tier only notes that the
    /// key was used.
    pub fn touch(&self, key: u64) {
        let mut g = self.inner.lock();
        g.next_use.consume(key);
        if self.policy == DiskPolicyKind::Belady {
            g.rerank(self.policy, key);
        }
    }

    /// The entry for `key` after a memory miss: verified, or `None` (a miss; a corrupt or
    /// half-written file is deleted and counted).
    pub fn get(&self, key: u64) -> Option<CachedData> {
        let gen = {
            let mut g = self.inner.lock();
            g.next_use.consume(key);
            let Some(gen) = g.entries.get(&key).map(|e| e.gen) else {
                g.counts.misses += 1;
                return None;
            };
            g.rerank(self.policy, key);
            gen
        };
        let path = self.dir.join(entry_name(key));
        match self.read_entry(&path, key) {
            Ok((data, bytes)) => {
                let mut g = self.inner.lock();
                g.counts.hits += 1;
                g.bytes_read += bytes;
                Some(data)
            }
            Err(e) => {
                let mut g = self.inner.lock();
                g.counts.misses += 1;
                if g.entries.get(&key).is_some_and(|e| e.gen == gen) {
                    g.remove(key);
                    if let EntryError::Corrupt(_) = e {
                        g.corrupt += 1;
                    }
                    if let Err(rm) = fs::remove_file(&path) {
                        if rm.kind() != io::ErrorKind::NotFound {
                            tracing::warn!(path = %path.display(), "disk cache: cannot delete a bad entry: {rm}");
                        }
                    }
                }
                tracing::warn!(key, path = %path.display(), "disk cache entry not served: {e}");
                None
            }
        }
    }

    fn read_entry(&self, path: &Path, key: u64) -> Result<(CachedData, u64), EntryError> {
        let mut buf = fs::read(path)?;
        let total = buf.len() as u64;
        if buf.len() < HEADER + CHECKSUM {
            return Err(EntryError::Corrupt("shorter than an entry header (half-written?)"));
        }
        let body = buf.len() - CHECKSUM;
        let stored = u64::from_le_bytes(buf[body..].try_into().map_err(|_| EntryError::Corrupt("checksum"))?);
        if xxh3_64(&buf[..body]) != stored {
            return Err(EntryError::Corrupt("checksum mismatch (half-written or corrupt)"));
        }
        let u64_at = |at: usize| buf[at..at + 8].try_into().map(u64::from_le_bytes);
        let u32_at = |at: usize| buf[at..at + 4].try_into().map(u32::from_le_bytes);
        let bad = |_| EntryError::Corrupt("header");
        if &buf[..4] != MAGIC || buf[4] != VERSION {
            return Err(EntryError::Corrupt("not a sluice disk cache entry of this version"));
        }
        let level = buf[5];
        if u64_at(8).map_err(bad)? != key || u64_at(16).map_err(bad)? != self.namespace {
            return Err(EntryError::Corrupt("entry of another sample or pipeline"));
        }
        let (width, height) = (u32_at(24).map_err(bad)?, u32_at(28).map_err(bad)?);
        let len = u64_at(32).map_err(bad)?;
        if len != (body - HEADER) as u64 {
            return Err(EntryError::Corrupt("payload length"));
        }
        buf.truncate(body);
        buf.drain(..HEADER);
        let image = |px: Vec<u8>| {
            if px.len() as u64 != u64::from(width) * u64::from(height) * Image::CHANNELS as u64 {
                return Err(EntryError::Corrupt("pixel count"));
            }
            Ok(Image::rgb8(width, height, px))
        };
        let data = match level {
            0 => CachedData::Raw(buf),
            1 => CachedData::Decoded(image(buf)?, None, None),
            2 => CachedData::Resized(image(buf)?, None, None),
            _ => return Err(EntryError::Corrupt("level")),
        };
        Ok((data, total))
    }

    /// Offers an entry (after a miss of both tiers); writes it if the budget and the policy
    /// admit it. Returns whether it was stored.
    pub fn offer(&self, key: u64, data: &CachedData) -> bool {
        let Some((payload, width, height)) = payload(data) else {
            return false;
        };
        let bytes = (HEADER + payload.len() + CHECKSUM) as u64;
        {
            let mut g = self.inner.lock();
            let inner = &mut *g;
            if bytes > self.budget || inner.entries.contains_key(&key) || inner.pending.contains(&key) {
                return false;
            }
            let rank = inner.rank(self.policy, key);
            let mut victims = Vec::new();
            let mut freed = 0u64;
            for &(vr, vk) in &inner.order {
                if inner.used - freed + bytes <= self.budget {
                    break;
                }
                if self.policy == DiskPolicyKind::Belady && vr >= rank {
                    inner.counts.rejected += 1;
                    return false;
                }
                victims.push(vk);
                freed += inner.entries.get(&vk).map_or(0, |e| e.bytes);
            }
            if inner.used - freed + bytes > self.budget {
                inner.counts.rejected += 1;
                return false;
            }
            for v in victims {
                inner.remove(v);
                inner.counts.evictions += 1;
                let path = self.dir.join(entry_name(v));
                if let Err(e) = fs::remove_file(&path) {
                    tracing::warn!(path = %path.display(), "disk cache: cannot delete an evicted entry: {e}");
                }
            }
            inner.pending.insert(key);
            inner.used += bytes;
        }
        let written = self.write_entry(key, data.level(), payload, width, height);
        let mut g = self.inner.lock();
        let inner = &mut *g;
        inner.pending.remove(&key);
        match written {
            Ok(()) => {
                inner.gen += 1;
                let rank = inner.rank(self.policy, key);
                inner.entries.insert(key, DiskEntry { bytes, rank, gen: inner.gen });
                inner.order.insert((rank, key));
                inner.counts.insertions += 1;
                inner.bytes_written += bytes;
                true
            }
            Err(e) => {
                inner.used -= bytes;
                inner.write_errors += 1;
                tracing::warn!(key, dir = %self.dir.display(), "disk cache: cannot write an entry: {e}");
                false
            }
        }
    }

    /// Writes to a temporary name, then renames: a crash leaves a temporary file (deleted at
    /// the next open) or a whole entry, never half of one under an entry's name.
    fn write_entry(&self, key: u64, level: CacheLevel, payload: &[u8], width: u32, height: u32) -> io::Result<()> {
        let mut header = [0u8; HEADER];
        header[..4].copy_from_slice(MAGIC);
        header[4] = VERSION;
        header[5] = level_code(level);
        header[8..16].copy_from_slice(&key.to_le_bytes());
        header[16..24].copy_from_slice(&self.namespace.to_le_bytes());
        header[24..28].copy_from_slice(&width.to_le_bytes());
        header[28..32].copy_from_slice(&height.to_le_bytes());
        header[32..40].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        let mut h = Xxh3::new();
        h.update(&header);
        h.update(payload);
        let seq = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        let tmp = self.dir.join(format!("{key:016x}{TMP_MARK}.{}.{seq}", std::process::id()));
        let result = (|| {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&header)?;
            f.write_all(payload)?;
            f.write_all(&h.digest().to_le_bytes())?;
            drop(f);
            fs::rename(&tmp, self.dir.join(entry_name(key)))
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    pub fn stats(&self) -> DiskStats {
        let g = self.inner.lock();
        DiskStats {
            dir: self.dir.clone(),
            policy: self.policy,
            tier: g.counts.snapshot(self.budget, g.used, g.entries.len() as u64),
            corrupt: g.corrupt,
            write_errors: g.write_errors,
            bytes_read: g.bytes_read,
            bytes_written: g.bytes_written,
            recovered: g.recovered,
        }
    }
}
