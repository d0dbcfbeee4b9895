//! Decoded row groups of Parquet files, shared by the loader's threads: how a shuffled
//! Parquet dataset is read without one row-group read per sample.
//!
//! A sample is a row; its bytes come from its row group's image column chunk, which is
//! read (one ranged read) and decoded whole. The decoded chunk is kept while it is among
//! the most recently used within a byte budget (`SLUICE_PARQUET_CACHE_MB`, default 256
//! MiB): every other sample of that row group that comes up in the shuffled order while it
//! is kept is served without a read. That budget is the coalescing **window**: with row
//! groups of `b` bytes, the last `budget / b` distinct row groups the order touched stay
//! decoded, so a row group is read at most once per visit of the window, and once per
//! epoch when the budget holds the dataset. Threads that want a row group another thread
//! is reading wait for that read instead of reading it again. A sample never costs more
//! than one row-group read; footers are read once per file and kept.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use parquet::data_type::ByteArray;
use parquet::file::metadata::ParquetMetaData;
use sluice_core::SampleErrorKind;

use super::check_size;
use super::confine::Roots;
use super::parquet::{max_chunk_bytes, read_column_chunk, read_footer, ChunkValues, ParquetError, ParquetFile};

/// The decoded-row-group budget unless `SLUICE_PARQUET_CACHE_MB` says otherwise.
pub const DEFAULT_CACHE_MB: u64 = 256;

type Decoded = Result<Arc<Vec<Option<ByteArray>>>, ParquetError>;

struct Kept {
    slot: Arc<Mutex<Option<Decoded>>>,
    last_use: u64,
    bytes: u64,
}

#[derive(Default)]
struct KeptSet {
    entries: HashMap<(String, u32, u32), Kept>,
    tick: u64,
    bytes: u64,
}

/// The row groups kept decoded, and the footers of the files read so far.
pub struct RowGroupCache {
    kept: Mutex<KeptSet>,
    footers: Mutex<HashMap<String, Arc<Result<ParquetMetaData, ParquetError>>>>,
    budget: u64,
    max_chunk: u64,
    roots: Option<Arc<Roots>>,
    reads: AtomicU64,
}

impl std::fmt::Debug for RowGroupCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowGroupCache").field("budget", &self.budget).field("reads", &self.reads()).finish()
    }
}

impl RowGroupCache {
    /// A cache of `budget` bytes reading beneath `roots` when given.
    pub fn new(budget: u64, roots: Option<Arc<Roots>>) -> Self {
        Self::with_max_chunk(budget, max_chunk_bytes(), roots)
    }

    /// The same, refusing column chunks over `max_chunk` bytes.
    pub fn with_max_chunk(budget: u64, max_chunk: u64, roots: Option<Arc<Roots>>) -> Self {
        Self {
            kept: Mutex::new(KeptSet::default()),
            footers: Mutex::new(HashMap::new()),
            budget,
            max_chunk,
            roots,
            reads: AtomicU64::new(0),
        }
    }

    /// The budget from `SLUICE_PARQUET_CACHE_MB` (default [`DEFAULT_CACHE_MB`]).
    pub fn from_env(roots: Option<Arc<Roots>>) -> Self {
        let mb = std::env::var("SLUICE_PARQUET_CACHE_MB")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(DEFAULT_CACHE_MB);
        Self::new(mb.saturating_mul(1 << 20), roots)
    }

    /// Column chunks read so far (each a row group's image column).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// Replaces `buf` with the image bytes of row `row` of row group `row_group` of `path`
    /// (leaf column `column`).
    pub fn read(
        &self,
        path: &Path,
        row_group: u32,
        row: u32,
        column: u32,
        max_bytes: u64,
        buf: &mut Vec<u8>,
    ) -> Result<(), SampleErrorKind> {
        let file = ParquetFile::new(path);
        let name = file.name();
        let values = self.row_group(&file, &name, row_group, column).map_err(|e| SampleErrorKind::Io(e.to_string()))?;
        let value = values.get(row as usize).ok_or_else(|| {
            SampleErrorKind::Io(format!("{name}: row group {row_group} has {} rows, not {}", values.len(), row + 1))
        })?;
        let Some(value) = value else {
            return Err(SampleErrorKind::Io(format!("{name}: row group {row_group}, row {row}: the image is null")));
        };
        check_size(value.len() as u64, max_bytes)?;
        buf.clear();
        buf.extend_from_slice(value.data());
        Ok(())
    }

    fn row_group(&self, file: &ParquetFile, name: &str, row_group: u32, column: u32) -> Decoded {
        let key = (name.to_string(), row_group, column);
        let slot = {
            let mut kept = self.kept.lock();
            kept.tick += 1;
            let tick = kept.tick;
            let e = kept.entries.entry(key.clone()).or_insert_with(|| Kept {
                slot: Arc::new(Mutex::new(None)),
                last_use: tick,
                bytes: 0,
            });
            e.last_use = tick;
            Arc::clone(&e.slot)
        };
        // Held while reading: a thread wanting the same row group waits for this read.
        let mut filled = slot.lock();
        if let Some(done) = filled.as_ref() {
            return done.clone();
        }
        let decoded = self.load(file, name, row_group as usize, column as usize);
        let bytes = decoded.as_ref().map_or(0, |v| v.iter().flatten().map(|b| b.len() as u64).sum());
        *filled = Some(decoded.clone());
        drop(filled);
        self.account(&key, bytes);
        decoded
    }

    /// Records `bytes` for `key` and evicts the least recently used others over budget.
    fn account(&self, key: &(String, u32, u32), bytes: u64) {
        let mut kept = self.kept.lock();
        let Some(e) = kept.entries.get_mut(key) else { return };
        e.bytes = bytes;
        kept.bytes = kept.bytes.saturating_add(bytes);
        while kept.bytes > self.budget {
            let victim = kept
                .entries
                .iter()
                .filter(|(k, e)| *k != key && e.bytes > 0)
                .min_by_key(|(_, e)| e.last_use)
                .map(|(k, _)| k.clone());
            let Some(victim) = victim else { break };
            if let Some(gone) = kept.entries.remove(&victim) {
                kept.bytes = kept.bytes.saturating_sub(gone.bytes);
            }
        }
    }

    fn load(&self, file: &ParquetFile, name: &str, row_group: usize, column: usize) -> Decoded {
        let footer = self.footer(file, name);
        let meta = footer.as_ref().as_ref().map_err(Clone::clone)?;
        let leaf = meta.file_metadata().schema_descr().columns().get(column).cloned();
        let Some(leaf) = leaf else {
            return Err(ParquetError::CorruptRowGroup {
                file: name.to_string(),
                row_group,
                message: format!("no leaf column {column}: the file changed since it was indexed"),
            });
        };
        self.reads.fetch_add(1, Ordering::Relaxed);
        let started = std::time::Instant::now();
        match read_column_chunk(file, meta, row_group, column, self.max_chunk, self.roots.as_deref())? {
            ChunkValues::Binary(values) => {
                tracing::debug!(
                    file = name,
                    row_group,
                    rows = values.len(),
                    elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                    "read row group"
                );
                Ok(Arc::new(values))
            }
            ChunkValues::Int(_) | ChunkValues::Float(_) | ChunkValues::IntLists(_) => Err(ParquetError::WrongType {
                file: name.to_string(),
                column: leaf.path().string(),
                found: format!("{:?}", leaf.physical_type()),
                expected: "binary (BYTE_ARRAY)",
            }),
        }
    }

    fn footer(&self, file: &ParquetFile, name: &str) -> Arc<Result<ParquetMetaData, ParquetError>> {
        if let Some(f) = self.footers.lock().get(name) {
            return Arc::clone(f);
        }
        let roots = self.roots.as_deref();
        let read = file.len(roots).and_then(|len| read_footer(file, len, roots)).map(|f| f.meta);
        let read = Arc::new(read);
        self.footers.lock().insert(name.to_string(), Arc::clone(&read));
        read
    }
}
