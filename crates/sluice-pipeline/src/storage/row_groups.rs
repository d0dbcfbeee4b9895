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
//!
//! When the budget no longer holds the image columns of the files read so far, a miss
//! reads only the page holding the row (located by the file's offset index, or by the
//! pages' headers in a local file without one) and keeps that page's rows: a small window
//! then costs about a page per sample, not a row group.

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
use super::parquet::{
    max_chunk_bytes, offset_indexes, page_of, read_column_chunk, read_footer, read_page, scan_pages, ChunkValues,
    Pages, ParquetError, ParquetFile,
};

/// The decoded-row-group budget unless `SLUICE_PARQUET_CACHE_MB` says otherwise.
pub const DEFAULT_CACHE_MB: u64 = 256;

/// A row of a row group as kept: `None` until read, then its image (`None` when null).
type KeptRow = Option<Option<ByteArray>>;

/// What is kept of one row group: the rows read so far (all of them after a whole read),
/// or the error its whole read failed with.
#[derive(Default)]
struct Group {
    rows: Vec<KeptRow>,
    failed: Option<ParquetError>,
}

struct Kept {
    slot: Arc<Mutex<Group>>,
    last_use: u64,
    bytes: u64,
}

#[derive(Default)]
struct KeptSet {
    entries: HashMap<(String, u32, u32), Kept>,
    tick: u64,
    bytes: u64,
}

/// What is known of a file's image column: its row groups' bytes (counted once) and the
/// pages of each row group, where known (`None`: unknown or not usable, read it whole).
struct Layout {
    /// Whether the offset index was looked for (on the first read of a page).
    index_read: bool,
    pages: Vec<Option<Pages>>,
    /// Whether a row group's pages were looked for by their headers already.
    scanned: Vec<bool>,
}

type SharedLayout = Arc<Mutex<Layout>>;

/// What a read brought in for a row.
enum Loaded {
    /// The whole row group.
    Whole(Vec<Option<ByteArray>>),
    /// One page: the group's row count, the page's first row and its rows.
    Page { rows: usize, first_row: usize, values: Vec<Option<ByteArray>> },
    /// Nothing: the row is past the end of its group (of this many rows).
    PastTheEnd(usize),
}

/// Why a read failed: a whole row group's failure is kept (its rows fail alike without
/// another read), a page's is not.
enum Failed {
    Whole(ParquetError),
    Page(ParquetError),
}

/// The row groups kept decoded, and the footers of the files read so far.
pub struct RowGroupCache {
    kept: Mutex<KeptSet>,
    footers: Mutex<HashMap<String, Arc<Result<ParquetMetaData, ParquetError>>>>,
    budget: u64,
    max_chunk: u64,
    roots: Option<Arc<Roots>>,
    /// Per (file, leaf column): the pages of its row groups.
    layouts: Mutex<HashMap<(String, u32), SharedLayout>>,
    /// Bytes of the image column chunks of every file read so far: while the budget holds
    /// them, every row of a row group read now will be wanted while it is kept.
    seen_bytes: AtomicU64,
    reads: AtomicU64,
    pages_read: AtomicU64,
    bytes_read: AtomicU64,
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
            layouts: Mutex::new(HashMap::new()),
            seen_bytes: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            pages_read: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
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

    /// Whole column chunks read so far (each a row group's image column).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// Single pages of image column chunks read so far (rows read without their row group).
    pub fn pages_read(&self) -> u64 {
        self.pages_read.load(Ordering::Relaxed)
    }

    /// Bytes read from files for images so far: whole chunks, pages, page headers and
    /// offset indexes (not footers).
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
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
        let (value, rows) =
            self.row(&file, &name, row_group, row, column).map_err(|e| SampleErrorKind::Io(e.to_string()))?;
        let Some(value) = value else {
            return Err(SampleErrorKind::Io(format!("{name}: row group {row_group} has {rows} rows, not {}", row + 1)));
        };
        let Some(value) = value else {
            return Err(SampleErrorKind::Io(format!("{name}: row group {row_group}, row {row}: the image is null")));
        };
        check_size(value.len() as u64, max_bytes)?;
        buf.clear();
        buf.extend_from_slice(value.data());
        Ok(())
    }

    /// Row `row` of the row group as kept (reading it first when it is not), and the
    /// group's row count; `None` for a row past its end.
    fn row(
        &self,
        file: &ParquetFile,
        name: &str,
        row_group: u32,
        row: u32,
        column: u32,
    ) -> Result<(KeptRow, usize), ParquetError> {
        let key = (name.to_string(), row_group, column);
        let slot = {
            let mut kept = self.kept.lock();
            kept.tick += 1;
            let tick = kept.tick;
            let e = kept.entries.entry(key.clone()).or_insert_with(|| Kept {
                slot: Arc::new(Mutex::new(Group::default())),
                last_use: tick,
                bytes: 0,
            });
            e.last_use = tick;
            Arc::clone(&e.slot)
        };
        // Held while reading: a thread wanting the same row group waits for this read.
        let mut group = slot.lock();
        if let Some(e) = &group.failed {
            return Err(e.clone());
        }
        if let Some(Some(value)) = group.rows.get(row as usize) {
            return Ok((Some(value.clone()), group.rows.len()));
        }
        let row_at = row as usize;
        let added = match self.load(file, name, row_group as usize, row_at, column as usize) {
            Ok(Loaded::Whole(values)) => {
                let bytes = values.iter().flatten().map(|b| b.len() as u64).sum::<u64>();
                let before = group.rows.iter().flatten().flatten().map(|b| b.len() as u64).sum::<u64>();
                group.rows = values.into_iter().map(Some).collect();
                bytes.saturating_sub(before)
            }
            Ok(Loaded::Page { rows, first_row, values }) => {
                if group.rows.len() != rows {
                    group.rows = vec![None; rows];
                }
                let mut added = 0;
                for (slot, value) in group.rows.iter_mut().skip(first_row).zip(values) {
                    if slot.is_none() {
                        added += value.as_ref().map_or(0, |b| b.len() as u64);
                        *slot = Some(value);
                    }
                }
                added
            }
            Ok(Loaded::PastTheEnd(rows)) => return Ok((None, rows)),
            Err(Failed::Whole(e)) => {
                group.failed = Some(e.clone());
                return Err(e);
            }
            Err(Failed::Page(e)) => return Err(e),
        };
        let rows = group.rows.len();
        let value = group.rows.get(row_at).cloned().flatten();
        drop(group);
        self.account(&key, added);
        match value {
            Some(v) => Ok((Some(v), rows)),
            None if row_at >= rows => Ok((None, rows)),
            None => Err(ParquetError::CorruptRowGroup {
                file: name.to_string(),
                row_group: row_group as usize,
                message: format!("row {row} is in no page of the column chunk"),
            }),
        }
    }

    /// Adds `bytes` to what `key` keeps and evicts the least recently used others over budget.
    fn account(&self, key: &(String, u32, u32), bytes: u64) {
        let mut kept = self.kept.lock();
        let Some(e) = kept.entries.get_mut(key) else { return };
        e.bytes = e.bytes.saturating_add(bytes);
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

    /// Reads what row `row` of the row group needs: the whole row group while the budget
    /// holds every file's row groups seen so far (its other rows will be wanted while it
    /// is kept), else only the page holding the row, where the pages are known.
    fn load(
        &self,
        file: &ParquetFile,
        name: &str,
        row_group: usize,
        row: usize,
        column: usize,
    ) -> Result<Loaded, Failed> {
        let footer = self.footer(file, name);
        let meta = footer.as_ref().as_ref().map_err(|e| Failed::Whole(e.clone()))?;
        let leaf = meta.file_metadata().schema_descr().columns().get(column).cloned();
        let Some(leaf) = leaf else {
            return Err(Failed::Whole(ParquetError::CorruptRowGroup {
                file: name.to_string(),
                row_group,
                message: format!("no leaf column {column}: the file changed since it was indexed"),
            }));
        };
        let layout = self.layout(name, meta, column);
        let rows = meta.row_groups().get(row_group).and_then(|rg| usize::try_from(rg.num_rows()).ok());
        if let (Some(rows), false) = (rows, self.seen_bytes.load(Ordering::Relaxed) <= self.budget) {
            if row >= rows {
                return Ok(Loaded::PastTheEnd(rows));
            }
            if let Some(pages) = self.pages(file, meta, &layout, row_group, column) {
                let page = page_of(&pages, row);
                self.pages_read.fetch_add(1, Ordering::Relaxed);
                let started = std::time::Instant::now();
                let read =
                    read_page(file, meta, row_group, column, &pages, page, self.max_chunk, self.roots.as_deref())
                        .map_err(Failed::Page)?;
                self.bytes_read.fetch_add(read.bytes, Ordering::Relaxed);
                tracing::debug!(
                    file = name,
                    row_group,
                    page,
                    rows = read.values.len(),
                    elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                    "read page"
                );
                return Ok(Loaded::Page { rows, first_row: read.first_row, values: read.values });
            }
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        if let Some(c) = meta.row_groups().get(row_group).and_then(|rg| rg.columns().get(column)) {
            self.bytes_read.fetch_add(u64::try_from(c.compressed_size()).unwrap_or(0), Ordering::Relaxed);
        }
        let started = std::time::Instant::now();
        let values = read_column_chunk(file, meta, row_group, column, self.max_chunk, self.roots.as_deref())
            .map_err(Failed::Whole)?;
        match values {
            ChunkValues::Binary(values) => {
                tracing::debug!(
                    file = name,
                    row_group,
                    rows = values.len(),
                    elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                    "read row group"
                );
                Ok(Loaded::Whole(values))
            }
            ChunkValues::Int(_) | ChunkValues::Float(_) | ChunkValues::IntLists(_) => {
                Err(Failed::Whole(ParquetError::WrongType {
                    file: name.to_string(),
                    column: leaf.path().string(),
                    found: format!("{:?}", leaf.physical_type()),
                    expected: "binary (BYTE_ARRAY)",
                }))
            }
        }
    }

    /// What is known of the pages of `file`'s leaf column `column`; made on its first read,
    /// when its bytes are counted.
    fn layout(&self, name: &str, meta: &ParquetMetaData, column: usize) -> SharedLayout {
        let key = (name.to_string(), column as u32);
        let mut layouts = self.layouts.lock();
        if let Some(l) = layouts.get(&key) {
            return Arc::clone(l);
        }
        let groups = meta.num_row_groups();
        let bytes: u64 = meta
            .row_groups()
            .iter()
            .filter_map(|rg| rg.columns().get(column))
            .map(|c| u64::try_from(c.uncompressed_size()).unwrap_or(0))
            .sum();
        self.seen_bytes.fetch_add(bytes, Ordering::Relaxed);
        let layout =
            Arc::new(Mutex::new(Layout { index_read: false, pages: vec![None; groups], scanned: vec![false; groups] }));
        layouts.insert(key, Arc::clone(&layout));
        drop(layouts);
        layout
    }

    /// The pages of row group `row_group`: from the offset index (read once for the whole
    /// file, one ranged read, when it has one), or found by their headers in a local file
    /// (once); `None` when unknown (an object without an offset index is read whole: its
    /// page headers would take one request each).
    fn pages(
        &self,
        file: &ParquetFile,
        meta: &ParquetMetaData,
        layout: &Mutex<Layout>,
        row_group: usize,
        column: usize,
    ) -> Option<Pages> {
        let mut l = layout.lock();
        if !l.index_read {
            l.index_read = true;
            let has_index = meta
                .row_groups()
                .iter()
                .any(|rg| rg.columns().get(column).is_some_and(|c| c.offset_index_range().is_some()));
            if has_index {
                match offset_indexes(file, meta, column, self.roots.as_deref()) {
                    Ok(pages) => {
                        let read: u64 = meta
                            .row_groups()
                            .iter()
                            .filter_map(|rg| rg.columns().get(column)?.offset_index_range())
                            .map(|r| r.end - r.start)
                            .sum();
                        self.bytes_read.fetch_add(read, Ordering::Relaxed);
                        l.scanned = pages.iter().map(Option::is_some).collect();
                        l.pages = pages;
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot read the offset index: reading whole row groups"),
                }
            }
        }
        if let Some(p) = l.pages.get(row_group).cloned().flatten() {
            return Some(p);
        }
        let ParquetFile::Local(path) = file else { return None };
        if l.scanned.get(row_group).copied().unwrap_or(true) {
            return None;
        }
        l.scanned[row_group] = true;
        match scan_pages(path, meta, row_group, column, self.roots.as_deref()) {
            Ok((pages, bytes)) => {
                self.bytes_read.fetch_add(bytes, Ordering::Relaxed);
                l.pages[row_group] = pages.clone();
                pages
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot find the pages by their headers: reading the row group whole");
                None
            }
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
