//! Parquet files, read with the low-level reader of the `parquet` crate (arrow-rs, no arrow
//! arrays): the footer by two ranged reads from the end, and one column chunk of one row
//! group by one ranged read, decoded in memory. Local files and objects (`s3://`) are read
//! the same way, by byte range, so the reader never holds a whole file.
//!
//! The image column is a binary column, or a struct whose `bytes` field is binary (the
//! Hugging Face `datasets` layout, `{bytes: binary, path: string}`); the label column is an
//! integer column. Nothing here panics on a hostile file: sizes are checked against the
//! file's length before anything is allocated, and the crate's own decoding runs under
//! `catch_unwind`, its failures reported as errors naming the file and row group.

use std::ops::Range;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Buf, Bytes};
use parquet::basic::{Repetition, Type as PhysicalType};
use parquet::column::page::{Page, PageMetadata, PageReader};
use parquet::column::reader::{get_column_reader, ColumnReader, ColumnReaderImpl};
use parquet::data_type::{ByteArray, ByteArrayType};
use parquet::errors::ParquetError as CrateError;
use parquet::file::metadata::{ColumnChunkMetaData, ParquetMetaData, ParquetMetaDataReader, RowGroupMetaData};
use parquet::file::page_index::index_reader::decode_offset_index;
use parquet::file::page_index::offset_index::PageLocation;
use parquet::file::reader::{ChunkReader, Length};
use parquet::file::serialized_reader::SerializedPageReader;
use parquet::schema::types::ColumnDescPtr;

use super::confine::{open_regular, Roots};
use super::object::ObjectUrl;

/// A column chunk (the image column of one row group) larger than this is refused, unless
/// `SLUICE_PARQUET_MAX_CHUNK_BYTES` says otherwise: 1 GiB.
pub const DEFAULT_MAX_CHUNK_BYTES: u64 = 1 << 30;
/// A footer larger than this is refused (a real one is kilobytes to a few megabytes).
pub const MAX_FOOTER_BYTES: u64 = 256 << 20;

/// Why a Parquet file, or one of its row groups, could not be read. Every variant names
/// the file, and the row group where there is one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParquetError {
    #[error("{file}: cannot read bytes {start}..{end}: {message}")]
    Read { file: String, start: u64, end: u64, message: String },
    #[error("{file}: not a Parquet file: {why}")]
    NotParquet { file: String, why: String },
    #[error("{file}: corrupt footer: {message}")]
    CorruptFooter { file: String, message: String },
    #[error("{file}: no column `{column}` (the file has: {available})")]
    MissingColumn { file: String, column: String, available: String },
    #[error("{file}: column `{column}` is {found}; expected {expected}")]
    WrongType { file: String, column: String, found: String, expected: &'static str },
    #[error(
        "{file}: row group {row_group}: column chunk of {bytes} bytes is over the limit of {limit} \
         (SLUICE_PARQUET_MAX_CHUNK_BYTES); write smaller row groups"
    )]
    HugeRowGroup { file: String, row_group: usize, bytes: u64, limit: u64 },
    #[error("{file}: row group {row_group}: {message}")]
    CorruptRowGroup { file: String, row_group: usize, message: String },
}

impl ParquetError {
    /// The file the error is about.
    pub fn file(&self) -> &str {
        match self {
            Self::Read { file, .. }
            | Self::NotParquet { file, .. }
            | Self::CorruptFooter { file, .. }
            | Self::MissingColumn { file, .. }
            | Self::WrongType { file, .. }
            | Self::HugeRowGroup { file, .. }
            | Self::CorruptRowGroup { file, .. } => file,
        }
    }
}

/// A Parquet file: a local path (read beneath `roots` when confined) or an object.
#[derive(Debug, Clone)]
pub(crate) enum ParquetFile {
    Local(PathBuf),
    Object(ObjectUrl),
}

impl ParquetFile {
    pub(crate) fn new(path: &Path) -> Self {
        match ObjectUrl::parse(path) {
            Some(url) => Self::Object(url),
            None => Self::Local(path.to_path_buf()),
        }
    }

    pub(crate) fn name(&self) -> String {
        match self {
            Self::Local(p) => p.display().to_string(),
            Self::Object(u) => u.to_string(),
        }
    }

    /// Bytes `range` of the file, exactly (a short read is an error).
    pub(crate) fn read_range(&self, range: Range<u64>, roots: Option<&Roots>) -> Result<Bytes, ParquetError> {
        let failed =
            |message: String| ParquetError::Read { file: self.name(), start: range.start, end: range.end, message };
        let want = usize::try_from(range.end - range.start).map_err(|_| failed("range too large".into()))?;
        let bytes = match self {
            Self::Local(path) => {
                use std::os::unix::fs::FileExt;
                let file = open_regular(path, roots).map_err(|e| failed(e.to_string()))?;
                let mut buf = Vec::new();
                buf.try_reserve_exact(want).map_err(|e| failed(format!("cannot allocate {want} bytes: {e}")))?;
                buf.resize(want, 0);
                file.read_exact_at(&mut buf, range.start).map_err(|e| failed(e.to_string()))?;
                Bytes::from(buf)
            }
            Self::Object(url) => {
                if let Some(roots) = roots.filter(|r| !r.allows_url(url)) {
                    return Err(failed(format!("outside the allowed roots ({})", roots.describe())));
                }
                super::object::fetch_range(url, range.clone()).map_err(|e| failed(e.message))?
            }
        };
        if bytes.len() != want {
            return Err(failed(format!("short read: {} bytes (truncated?)", bytes.len())));
        }
        Ok(bytes)
    }

    /// The file's length in bytes.
    pub(crate) fn len(&self, roots: Option<&Roots>) -> Result<u64, ParquetError> {
        let failed = |message: String| ParquetError::Read { file: self.name(), start: 0, end: 0, message };
        match self {
            Self::Local(path) => {
                let file = open_regular(path, roots).map_err(|e| failed(e.to_string()))?;
                file.metadata().map(|m| m.len()).map_err(|e| failed(e.to_string()))
            }
            Self::Object(url) => super::object::head(url).map(|h| h.0).map_err(|e| failed(e.message)),
        }
    }
}

/// A file's decoded footer and the raw bytes it was decoded from (for the fingerprint).
pub(crate) struct Footer {
    pub(crate) meta: ParquetMetaData,
    pub(crate) raw: Bytes,
}

/// Reads and decodes the footer of `file` (`len` bytes long).
pub(crate) fn read_footer(file: &ParquetFile, len: u64, roots: Option<&Roots>) -> Result<Footer, ParquetError> {
    let name = file.name();
    let not_parquet = |why: String| ParquetError::NotParquet { file: name.clone(), why };
    if len < 12 {
        return Err(not_parquet(format!("{len} bytes, shorter than the smallest Parquet file (12)")));
    }
    let tail = file.read_range(len - 8..len, roots)?;
    if &tail[4..] != b"PAR1" {
        return Err(not_parquet("no PAR1 magic at its end (truncated, or another format)".into()));
    }
    let meta_len = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    if meta_len > len - 12 || meta_len > MAX_FOOTER_BYTES {
        return Err(ParquetError::CorruptFooter {
            file: name,
            message: format!("declares {meta_len} bytes of metadata in a file of {len} bytes"),
        });
    }
    let raw = file.read_range(len - 8 - meta_len..len - 8, roots)?;
    let meta = guarded(|| ParquetMetaDataReader::decode_metadata(&raw))
        .map_err(|message| ParquetError::CorruptFooter { file: name.clone(), message })?;
    // Row groups and column chunks must lie inside the file before anything is read by them.
    for (i, rg) in meta.row_groups().iter().enumerate() {
        if rg.num_rows() < 0 || rg.num_rows() as u64 > len {
            return Err(ParquetError::CorruptFooter {
                file: name,
                message: format!("row group {i} declares {} rows in a file of {len} bytes", rg.num_rows()),
            });
        }
        for c in rg.columns() {
            let (start, size) = chunk_range(c).unwrap_or((u64::MAX, u64::MAX));
            if start.checked_add(size).is_none_or(|end| end > len) {
                return Err(ParquetError::CorruptFooter {
                    file: name,
                    message: format!(
                        "row group {i}: column `{}` lies at bytes {start}..+{size}, past the end ({len}) (truncated?)",
                        c.column_path()
                    ),
                });
            }
        }
    }
    Ok(Footer { meta, raw })
}

/// Where a column chunk lies (offset, length); `None` when the footer says a negative.
fn chunk_range(c: &ColumnChunkMetaData) -> Option<(u64, u64)> {
    let start = c.dictionary_page_offset().unwrap_or_else(|| c.data_page_offset());
    Some((u64::try_from(start).ok()?, u64::try_from(c.compressed_size()).ok()?))
}

/// Runs the crate's decoding, turning its errors and any panic into a message.
fn guarded<T>(f: impl FnOnce() -> Result<T, CrateError>) -> Result<T, String> {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(payload) => Err(format!(
            "the Parquet decoder failed: {}",
            payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("panic")
        )),
    }
}

/// The leaf column (index into the schema's columns) holding the images: `column` itself
/// when binary, or its `bytes` field when it is a struct.
pub(crate) fn image_leaf(meta: &ParquetMetaData, file: &str, column: &str) -> Result<usize, ParquetError> {
    let schema = meta.file_metadata().schema_descr();
    let leaves = schema.columns();
    let find = |path: &str| leaves.iter().position(|c| c.path().string() == path);
    let Some(i) = find(column).or_else(|| find(&format!("{column}.bytes"))) else {
        return Err(missing_or_wrong(meta, file, column, "a binary column or a struct {bytes: binary, path: string}"));
    };
    check_leaf(meta, file, i, &[PhysicalType::BYTE_ARRAY], "binary (BYTE_ARRAY)")?;
    Ok(i)
}

/// The integer leaf column holding the labels.
pub(crate) fn label_leaf(meta: &ParquetMetaData, file: &str, column: &str) -> Result<usize, ParquetError> {
    let leaves = meta.file_metadata().schema_descr().columns();
    let Some(i) = leaves.iter().position(|c| c.path().string() == column) else {
        return Err(missing_or_wrong(meta, file, column, "an integer column"));
    };
    check_leaf(meta, file, i, &[PhysicalType::INT32, PhysicalType::INT64], "an integer (INT32 or INT64)")?;
    Ok(i)
}

/// The leaf column holding a metadata field of `kind`: an integer column for `int`, a
/// floating-point (or integer) one for `float`, a binary (string) one for `text` and `json`,
/// a list of integers for `multi_label`.
pub(crate) fn field_leaf(
    meta: &ParquetMetaData,
    file: &str,
    column: &str,
    kind: sluice_core::FieldKindName,
) -> Result<usize, ParquetError> {
    use sluice_core::FieldKindName as K;
    if kind == K::MultiLabel {
        return int_list_leaf(meta, file, column);
    }
    let (types, expected): (&[PhysicalType], &'static str) = match kind {
        K::Int => (&[PhysicalType::INT32, PhysicalType::INT64], "an integer (INT32 or INT64)"),
        K::Float => (
            &[PhysicalType::FLOAT, PhysicalType::DOUBLE, PhysicalType::INT32, PhysicalType::INT64],
            "a number (FLOAT, DOUBLE, INT32 or INT64)",
        ),
        K::Text | K::Json | K::MultiLabel => (&[PhysicalType::BYTE_ARRAY], "a string (BYTE_ARRAY)"),
    };
    let leaves = meta.file_metadata().schema_descr().columns();
    let Some(i) = leaves.iter().position(|c| c.path().string() == column) else {
        return Err(missing_or_wrong(meta, file, column, expected));
    };
    check_leaf(meta, file, i, types, expected)?;
    Ok(i)
}

/// The leaf of a list column of integers (`column` a list whose one leaf, `column.list.element`
/// or another name, is INT32 or INT64 and repeated once): class indices of a multi-label field.
fn int_list_leaf(meta: &ParquetMetaData, file: &str, column: &str) -> Result<usize, ParquetError> {
    const EXPECTED: &str = "a list of integers (INT32 or INT64), e.g. a `Sequence(ClassLabel)`";
    let leaves = meta.file_metadata().schema_descr().columns();
    let under: Vec<usize> =
        (0..leaves.len()).filter(|&i| leaves[i].path().parts().first().is_some_and(|p| p == column)).collect();
    let [i] = under[..] else {
        return Err(missing_or_wrong(meta, file, column, EXPECTED));
    };
    let c = &leaves[i];
    if c.max_rep_level() != 1 || !matches!(c.physical_type(), PhysicalType::INT32 | PhysicalType::INT64) {
        let shape = if c.max_rep_level() == 0 { "not a list" } else { "a list" };
        return Err(ParquetError::WrongType {
            file: file.to_string(),
            column: c.path().string(),
            found: format!("{:?} ({shape}, nested {} deep)", c.physical_type(), c.max_rep_level()),
            expected: EXPECTED,
        });
    }
    Ok(i)
}

/// Whether the file has a leaf column named `column`.
pub(crate) fn has_leaf(meta: &ParquetMetaData, column: &str) -> bool {
    meta.file_metadata().schema_descr().columns().iter().any(|c| c.path().string() == column)
}

fn check_leaf(
    meta: &ParquetMetaData,
    file: &str,
    i: usize,
    types: &[PhysicalType],
    expected: &'static str,
) -> Result<(), ParquetError> {
    let c = meta.file_metadata().schema_descr().column(i);
    let wrong =
        |found: String| ParquetError::WrongType { file: file.to_string(), column: c.path().string(), found, expected };
    if !types.contains(&c.physical_type()) {
        return Err(wrong(format!("{:?}", c.physical_type())));
    }
    if c.max_rep_level() > 0 {
        return Err(wrong("a list (repeated)".into()));
    }
    Ok(())
}

fn missing_or_wrong(meta: &ParquetMetaData, file: &str, column: &str, expected: &'static str) -> ParquetError {
    let leaves = meta.file_metadata().schema_descr().columns();
    let under: Vec<String> = leaves
        .iter()
        .filter(|c| c.path().parts().first().is_some_and(|p| p == column))
        .map(|c| format!("{} ({:?})", c.path().string(), c.physical_type()))
        .collect();
    if !under.is_empty() {
        return ParquetError::WrongType {
            file: file.to_string(),
            column: column.to_string(),
            found: under.join(", "),
            expected,
        };
    }
    let available: Vec<String> = leaves.iter().map(|c| c.path().string()).collect();
    ParquetError::MissingColumn { file: file.to_string(), column: column.to_string(), available: available.join(", ") }
}

/// Bytes of a file read into memory from offset `start`, served to the crate's page reader
/// as if they were the file (offsets outside them are an error, not a panic).
struct InMemoryRange {
    start: u64,
    data: Bytes,
}

impl Length for InMemoryRange {
    fn len(&self) -> u64 {
        self.start + self.data.len() as u64
    }
}

impl InMemoryRange {
    fn slice(&self, start: u64, len: Option<usize>) -> Result<Bytes, CrateError> {
        let outside = || CrateError::EOF(format!("offset {start} lies outside the column chunk read"));
        let from = usize::try_from(start.checked_sub(self.start).ok_or_else(outside)?).map_err(|_| outside())?;
        let to = match len {
            Some(n) => from.checked_add(n).ok_or_else(outside)?,
            None => self.data.len(),
        };
        if from > self.data.len() || to > self.data.len() {
            return Err(outside());
        }
        Ok(self.data.slice(from..to))
    }
}

impl ChunkReader for InMemoryRange {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> Result<Self::T, CrateError> {
        Ok(self.slice(start, None)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> Result<Bytes, CrateError> {
        self.slice(start, Some(length))
    }
}

/// The values of one column chunk, row by row: `None` for a null.
pub(crate) enum ChunkValues {
    Binary(Vec<Option<ByteArray>>),
    Int(Vec<Option<i64>>),
    Float(Vec<Option<f64>>),
    /// A list column of integers: `None` for a null list, an inner `None` for a null element.
    IntLists(Vec<Option<Vec<Option<i64>>>>),
}

impl ChunkValues {
    fn len(&self) -> usize {
        match self {
            Self::Binary(v) => v.len(),
            Self::Int(v) => v.len(),
            Self::Float(v) => v.len(),
            Self::IntLists(v) => v.len(),
        }
    }
}

/// Row group `row_group`, its column chunk of leaf `leaf` and the chunk's byte range,
/// refused when the chunk is over `max_chunk_bytes`.
fn chunk_of<'a>(
    file: &ParquetFile,
    meta: &'a ParquetMetaData,
    row_group: usize,
    leaf: usize,
    max_chunk_bytes: u64,
) -> Result<(&'a RowGroupMetaData, &'a ColumnChunkMetaData, u64, u64), ParquetError> {
    let corrupt = |message: String| ParquetError::CorruptRowGroup { file: file.name(), row_group, message };
    let rg = meta
        .row_groups()
        .get(row_group)
        .ok_or_else(|| corrupt(format!("the file has {} row groups", meta.num_row_groups())))?;
    let chunk = rg.columns().get(leaf).ok_or_else(|| corrupt(format!("no column chunk {leaf}")))?;
    let (start, size) = chunk_range(chunk).ok_or_else(|| corrupt("negative column chunk range".into()))?;
    let uncompressed = u64::try_from(chunk.uncompressed_size()).unwrap_or(u64::MAX);
    let biggest = size.max(uncompressed);
    if biggest > max_chunk_bytes {
        return Err(ParquetError::HugeRowGroup {
            file: file.name(),
            row_group,
            bytes: biggest,
            limit: max_chunk_bytes,
        });
    }
    let end = start.checked_add(size).ok_or_else(|| corrupt("column chunk range overflows".into()))?;
    Ok((rg, chunk, start, end))
}

/// Reads and decodes leaf column `leaf` of row group `row_group` (one ranged read).
pub(crate) fn read_column_chunk(
    file: &ParquetFile,
    meta: &ParquetMetaData,
    row_group: usize,
    leaf: usize,
    max_chunk_bytes: u64,
    roots: Option<&Roots>,
) -> Result<ChunkValues, ParquetError> {
    let corrupt = |message: String| ParquetError::CorruptRowGroup { file: file.name(), row_group, message };
    let (rg, chunk, start, end) = chunk_of(file, meta, row_group, leaf, max_chunk_bytes)?;
    let data = file.read_range(start..end, roots)?;
    let rows = usize::try_from(rg.num_rows()).map_err(|_| corrupt(format!("{} rows", rg.num_rows())))?;
    let (descr, column) = leaf_column(rg, leaf).map_err(corrupt)?;
    let max_def = descr.max_def_level();
    let lists = (descr.max_rep_level() > 0).then(|| ListLevels {
        // The column's top node: a null list below this level, an empty one from it.
        top: i16::from(rg.schema_descr().get_column_root(leaf).get_basic_info().repetition() == Repetition::OPTIONAL),
        slot: descr.repeated_ancestor_def_level(),
        value: max_def,
    });
    let values = guarded(|| {
        let pages = SerializedPageReader::new(Arc::new(InMemoryRange { start, data }), chunk, rows, None)?;
        if let Some(levels) = lists {
            // A list's length is not bounded by the rows: a few bytes of RLE can declare
            // billions of elements, so the pages' declared values are capped first.
            let cap = max_chunk_bytes / DECODED_LIST_VALUE_BYTES;
            let pages = CappedPages { pages, values: 0, cap };
            let reader = get_column_reader(descr.clone(), Box::new(pages));
            return match reader {
                ColumnReader::Int32ColumnReader(mut r) => {
                    read_lists(rows, levels, |d, p, v, n| r.read_records(n, Some(d), Some(p), v), i64::from)
                }
                ColumnReader::Int64ColumnReader(mut r) => {
                    read_lists(rows, levels, |d, p, v, n| r.read_records(n, Some(d), Some(p), v), |v| v)
                }
                _ => Err(CrateError::General(format!("list column `{column}` is not of integers"))),
            }
            .map(ChunkValues::IntLists);
        }
        let reader = get_column_reader(descr.clone(), Box::new(pages));
        match reader {
            ColumnReader::ByteArrayColumnReader(mut r) => read_binary(&mut r, rows, max_def).map(ChunkValues::Binary),
            ColumnReader::Int32ColumnReader(mut r) => {
                read_plain(rows, max_def, |d, v, n| r.read_records(n, Some(d), None, v), i64::from)
                    .map(ChunkValues::Int)
            }
            ColumnReader::Int64ColumnReader(mut r) => {
                read_plain(rows, max_def, |d, v, n| r.read_records(n, Some(d), None, v), |v| v).map(ChunkValues::Int)
            }
            ColumnReader::FloatColumnReader(mut r) => {
                read_plain(rows, max_def, |d, v, n| r.read_records(n, Some(d), None, v), f64::from)
                    .map(ChunkValues::Float)
            }
            ColumnReader::DoubleColumnReader(mut r) => {
                read_plain(rows, max_def, |d, v, n| r.read_records(n, Some(d), None, v), |v| v).map(ChunkValues::Float)
            }
            _ => Err(CrateError::General(format!("column `{column}` has an unsupported type"))),
        }
    })
    .map_err(|m| corrupt(format!("column `{}`: {m}", descr.path())))?;
    let got = values.len();
    if got != rows {
        return Err(corrupt(format!(
            "column `{}` holds {got} rows, the footer says {rows} (truncated or corrupt pages)",
            descr.path()
        )));
    }
    Ok(values)
}

/// Reads the next `rows` values of a binary column: `None` for a null.
fn read_binary(
    r: &mut ColumnReaderImpl<ByteArrayType>,
    rows: usize,
    max_def: i16,
) -> Result<Vec<Option<ByteArray>>, CrateError> {
    let mut out = Vec::with_capacity(rows.min(1 << 16));
    let (mut defs, mut values) = (Vec::new(), Vec::new());
    while out.len() < rows {
        defs.clear();
        values.clear();
        let (records, _, _) = r.read_records(rows - out.len(), Some(&mut defs), None, &mut values)?;
        if records == 0 {
            break;
        }
        let mut vals = values.drain(..);
        for k in 0..records {
            let present = max_def == 0 || defs.get(k).is_some_and(|&d| d == max_def);
            out.push(if present { vals.next() } else { None });
        }
    }
    Ok(out)
}

fn read_plain<T: Copy, U>(
    rows: usize,
    max_def: i16,
    mut read: impl FnMut(&mut Vec<i16>, &mut Vec<T>, usize) -> Result<(usize, usize, usize), CrateError>,
    widen: impl Fn(T) -> U,
) -> Result<Vec<Option<U>>, CrateError> {
    let mut out = Vec::with_capacity(rows.min(1 << 16));
    let (mut defs, mut values) = (Vec::new(), Vec::new());
    while out.len() < rows {
        defs.clear();
        values.clear();
        let (records, _, _) = read(&mut defs, &mut values, rows - out.len())?;
        if records == 0 {
            break;
        }
        let mut vals = values.iter().copied();
        for k in 0..records {
            let present = max_def == 0 || defs.get(k).is_some_and(|&d| d == max_def);
            out.push(if present { vals.next().map(&widen) } else { None });
        }
    }
    Ok(out)
}

/// What one value of a list column takes once decoded (its levels, the value, its slot in
/// the row's list), at most: a chunk of more than `max_chunk_bytes` / this is refused.
const DECODED_LIST_VALUE_BYTES: u64 = 32;

/// A column chunk's pages, refused once their data pages declare more than `cap` values.
struct CappedPages<P> {
    pages: P,
    values: u64,
    cap: u64,
}

impl<P: PageReader> Iterator for CappedPages<P> {
    type Item = Result<Page, CrateError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.get_next_page().transpose()
    }
}

impl<P: PageReader> PageReader for CappedPages<P> {
    fn get_next_page(&mut self) -> Result<Option<Page>, CrateError> {
        let page = self.pages.get_next_page()?;
        if let Some(p) = page.as_ref().filter(|p| !p.is_dictionary_page()) {
            self.values += u64::from(p.num_values());
            if self.values > self.cap {
                return Err(CrateError::General(format!(
                    "the list column's pages declare {} values or more, over the limit of {} \
                     (SLUICE_PARQUET_MAX_CHUNK_BYTES / {DECODED_LIST_VALUE_BYTES})",
                    self.values, self.cap
                )));
            }
        }
        Ok(page)
    }

    fn peek_next_page(&mut self) -> Result<Option<PageMetadata>, CrateError> {
        self.pages.peek_next_page()
    }

    fn skip_next_page(&mut self) -> Result<(), CrateError> {
        self.pages.skip_next_page()
    }

    fn supports_deferred_dictionary(&self) -> bool {
        self.pages.supports_deferred_dictionary()
    }

    fn take_deferred_dictionary(&mut self) -> Result<Option<Page>, CrateError> {
        self.pages.take_deferred_dictionary()
    }

    fn at_record_boundary(&mut self) -> Result<bool, CrateError> {
        self.pages.at_record_boundary()
    }
}

/// The definition levels of a list column (one repeated level): below `top` the list is
/// null, below `slot` empty, at `slot` and above an element, null below `value`.
#[derive(Clone, Copy)]
struct ListLevels {
    top: i16,
    slot: i16,
    value: i16,
}

/// Reads `rows` lists of a column repeated once: a level of repetition 0 starts a row.
fn read_lists<T: Copy>(
    rows: usize,
    levels: ListLevels,
    mut read: impl FnMut(&mut Vec<i16>, &mut Vec<i16>, &mut Vec<T>, usize) -> Result<(usize, usize, usize), CrateError>,
    widen: impl Fn(T) -> i64,
) -> Result<Vec<Option<Vec<Option<i64>>>>, CrateError> {
    let mut out: Vec<Option<Vec<Option<i64>>>> = Vec::with_capacity(rows.min(1 << 16));
    let (mut defs, mut reps, mut values) = (Vec::new(), Vec::new(), Vec::new());
    while out.len() < rows {
        defs.clear();
        reps.clear();
        values.clear();
        let (records, _, read_levels) = read(&mut defs, &mut reps, &mut values, rows - out.len())?;
        if records == 0 && read_levels == 0 {
            break;
        }
        let mut vals = values.iter().copied();
        for (&d, &r) in defs.iter().zip(&reps).take(read_levels) {
            if r == 0 {
                out.push((d >= levels.top).then(Vec::new));
            }
            if d < levels.slot {
                continue;
            }
            let item = if d >= levels.value { vals.next().map(&widen) } else { None };
            match out.last_mut() {
                Some(Some(list)) => list.push(item),
                _ => return Err(CrateError::General("a list element outside any list".into())),
            }
        }
    }
    Ok(out)
}

// ---- pages of a column chunk ------------------------------------------------------------

/// Where the data pages of one column chunk lie, from the file's offset index or from the
/// pages' own headers, checked against the chunk (in order, inside it, each starting a
/// row): what lets a sample's row be read without the rest of its row group.
pub(crate) type Pages = Arc<Vec<PageLocation>>;

/// A page header is read this many bytes at a time when the pages are found by their headers.
const HEADER_READ_BYTES: usize = 256;

/// The page locations of leaf column `leaf` in every row group of `file`, from its offset
/// index (written by `datasets`, and by pyarrow with `write_page_index=True`): one ranged
/// read spanning the row groups' indexes. `None` for a row group with no index, or one
/// that does not fit its column chunk.
pub(crate) fn offset_indexes(
    file: &ParquetFile,
    meta: &ParquetMetaData,
    leaf: usize,
    roots: Option<&Roots>,
) -> Result<Vec<Option<Pages>>, ParquetError> {
    let ranges: Vec<Option<Range<u64>>> =
        meta.row_groups().iter().map(|rg| rg.columns().get(leaf).and_then(|c| c.offset_index_range())).collect();
    let none = vec![None; ranges.len()];
    let start = ranges.iter().flatten().map(|r| r.start).min();
    let end = ranges.iter().flatten().map(|r| r.end).max();
    let (Some(start), Some(end)) = (start, end) else { return Ok(none) };
    if end - start > MAX_FOOTER_BYTES {
        tracing::warn!(file = file.name(), bytes = end - start, "offset index too large: reading whole row groups");
        return Ok(none);
    }
    let data = file.read_range(start..end, roots)?;
    Ok(ranges
        .iter()
        .enumerate()
        .map(|(g, range)| {
            let range = range.as_ref()?;
            let from = usize::try_from(range.start - start).ok()?;
            let to = usize::try_from(range.end - start).ok()?;
            let index = guarded(|| decode_offset_index(data.get(from..to).unwrap_or_default())).ok()?;
            checked_pages(meta, g, leaf, index.page_locations().clone())
        })
        .collect())
}

/// `locations` if they fit the column chunk of `leaf` in row group `g`: the first page
/// holds row 0, rows and offsets increase, every page lies inside the chunk.
fn checked_pages(meta: &ParquetMetaData, g: usize, leaf: usize, locations: Vec<PageLocation>) -> Option<Pages> {
    let rg = meta.row_groups().get(g)?;
    let rows = u64::try_from(rg.num_rows()).ok()?;
    let (start, size) = chunk_range(rg.columns().get(leaf)?)?;
    let end = start.checked_add(size)?;
    let first = locations.first()?;
    if first.first_row_index != 0 || u64::try_from(first.offset).ok()? < start {
        return None;
    }
    for (i, page) in locations.iter().enumerate() {
        let offset = u64::try_from(page.offset).ok()?;
        let len = u64::try_from(page.compressed_page_size).ok().filter(|&n| n > 0)?;
        let row = u64::try_from(page.first_row_index).ok()?;
        let (next_offset, next_row) = match locations.get(i + 1) {
            Some(next) => (u64::try_from(next.offset).ok()?, u64::try_from(next.first_row_index).ok()?),
            None => (end, rows),
        };
        if offset.checked_add(len)? > next_offset.min(end) || row >= next_row {
            return None;
        }
    }
    Some(Arc::new(locations))
}

/// A local file served to the crate's page reader by positioned reads, counting the bytes
/// read and remembering where the last page header was read from.
struct FileChunk {
    file: Arc<std::fs::File>,
    len: u64,
    last_read_at: AtomicU64,
    bytes: Arc<AtomicU64>,
}

/// Reads of a [`FileChunk`] from one offset on.
struct FileAt {
    file: Arc<std::fs::File>,
    at: u64,
    bytes: Arc<AtomicU64>,
}

impl std::io::Read for FileAt {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let n = self.file.read_at(buf, self.at)?;
        self.at += n as u64;
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

impl Length for FileChunk {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for FileChunk {
    type T = std::io::BufReader<FileAt>;

    fn get_read(&self, start: u64) -> Result<Self::T, CrateError> {
        self.last_read_at.store(start, Ordering::Relaxed);
        let at = FileAt { file: Arc::clone(&self.file), at: start, bytes: Arc::clone(&self.bytes) };
        Ok(std::io::BufReader::with_capacity(HEADER_READ_BYTES, at))
    }

    fn get_bytes(&self, start: u64, length: usize) -> Result<Bytes, CrateError> {
        use std::io::Read;
        let mut buf = vec![0; length];
        self.get_read(start)?.into_inner().read_exact(&mut buf).map_err(|e| CrateError::EOF(e.to_string()))?;
        Ok(Bytes::from(buf))
    }
}

/// The pages of leaf column `leaf` in row group `g` of the local file `path`, found by
/// reading their headers only (a file without an offset index: pyarrow's default), and
/// the bytes that took; `None` when they cannot be told apart by rows.
pub(crate) fn scan_pages(
    path: &Path,
    meta: &ParquetMetaData,
    g: usize,
    leaf: usize,
    roots: Option<&Roots>,
) -> Result<(Option<Pages>, u64), ParquetError> {
    let name = path.display().to_string();
    let corrupt = |message: String| ParquetError::CorruptRowGroup { file: name.clone(), row_group: g, message };
    let rg = meta
        .row_groups()
        .get(g)
        .ok_or_else(|| corrupt(format!("the file has {} row groups", meta.num_row_groups())))?;
    let chunk = rg.columns().get(leaf).ok_or_else(|| corrupt(format!("no column chunk {leaf}")))?;
    let rows = usize::try_from(rg.num_rows()).map_err(|_| corrupt(format!("{} rows", rg.num_rows())))?;
    let failed = |message: String| ParquetError::Read { file: name.clone(), start: 0, end: 0, message };
    let file = open_regular(path, roots).map_err(|e| failed(e.to_string()))?;
    let len = file.metadata().map_err(|e| failed(e.to_string()))?.len();
    let bytes = Arc::new(AtomicU64::new(0));
    let reader =
        Arc::new(FileChunk { file: Arc::new(file), len, last_read_at: AtomicU64::new(0), bytes: Arc::clone(&bytes) });
    let found = guarded(|| {
        let mut pages = SerializedPageReader::new(Arc::clone(&reader), chunk, rows, None)?;
        let mut locations = Vec::new();
        let mut row = 0usize;
        while let Some(page) = pages.peek_next_page()? {
            let at = reader.last_read_at.load(Ordering::Relaxed);
            if !page.is_dict {
                let Some(n) = page.num_rows.or(page.num_levels) else { return Ok(None) };
                let (offset, first_row_index) = (i64::try_from(at), i64::try_from(row));
                let (Ok(offset), Ok(first_row_index)) = (offset, first_row_index) else { return Ok(None) };
                locations.push(PageLocation { offset, compressed_page_size: 0, first_row_index });
                row = row.saturating_add(n);
            }
            pages.skip_next_page()?;
        }
        Ok((row == rows).then_some(locations))
    })
    .map_err(|m| corrupt(format!("column `{}`: {m}", chunk.column_path())))?;
    let Some(mut locations) = found else { return Ok((None, bytes.load(Ordering::Relaxed))) };
    // A page runs to the next one's header, the last to the chunk's end.
    let end = chunk_range(chunk).and_then(|(start, size)| start.checked_add(size)).and_then(|e| i64::try_from(e).ok());
    let ends: Vec<i64> = locations.iter().skip(1).map(|p| p.offset).chain(end).collect();
    for (page, end) in locations.iter_mut().zip(ends) {
        page.compressed_page_size = i32::try_from(end - page.offset).unwrap_or(0);
    }
    Ok((checked_pages(meta, g, leaf, locations), bytes.load(Ordering::Relaxed)))
}

/// Bytes of a file read into memory as several ranges, served to the crate's page reader
/// as if they were the file (an offset outside them is an error).
struct SparseRanges(Vec<InMemoryRange>);

impl SparseRanges {
    fn at(&self, start: u64) -> Result<&InMemoryRange, CrateError> {
        self.0
            .iter()
            .find(|r| r.start <= start && start < r.len())
            .ok_or_else(|| CrateError::EOF(format!("offset {start} lies outside the pages read")))
    }
}

impl Length for SparseRanges {
    fn len(&self) -> u64 {
        self.0.iter().map(Length::len).max().unwrap_or(0)
    }
}

impl ChunkReader for SparseRanges {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> Result<Self::T, CrateError> {
        self.at(start)?.get_read(start)
    }

    fn get_bytes(&self, start: u64, length: usize) -> Result<Bytes, CrateError> {
        self.at(start)?.get_bytes(start, length)
    }
}

/// The rows of one page of a binary column, read alone (with the chunk's dictionary page
/// when it has one): where they start in the row group, their values, the bytes read.
pub(crate) struct PageRows {
    pub(crate) first_row: usize,
    pub(crate) values: Vec<Option<ByteArray>>,
    pub(crate) bytes: u64,
}

/// The page of `pages` holding row `row` (`pages` checked: the first holds row 0).
pub(crate) fn page_of(pages: &[PageLocation], row: usize) -> usize {
    let row = i64::try_from(row).unwrap_or(i64::MAX);
    pages.partition_point(|p| p.first_row_index <= row).saturating_sub(1)
}

/// Reads and decodes page `page` of `pages`, of binary leaf column `leaf` in row group
/// `row_group`: one ranged read of the page (two when the chunk has a dictionary page).
#[allow(clippy::too_many_arguments)]
pub(crate) fn read_page(
    file: &ParquetFile,
    meta: &ParquetMetaData,
    row_group: usize,
    leaf: usize,
    pages: &Pages,
    page: usize,
    max_chunk_bytes: u64,
    roots: Option<&Roots>,
) -> Result<PageRows, ParquetError> {
    let corrupt = |message: String| ParquetError::CorruptRowGroup { file: file.name(), row_group, message };
    let (rg, chunk, start, _) = chunk_of(file, meta, row_group, leaf, max_chunk_bytes)?;
    let rows = usize::try_from(rg.num_rows()).map_err(|_| corrupt(format!("{} rows", rg.num_rows())))?;
    let (Some(loc), Some(first)) = (pages.get(page), pages.first()) else {
        return Err(corrupt(format!("no page {page} in the column chunk")));
    };
    // `pages` were checked: offsets and sizes are positive and lie inside the chunk.
    let (offset, first_offset) = (loc.offset as u64, first.offset as u64);
    let end = offset + loc.compressed_page_size as u64;
    let first_row = loc.first_row_index as usize;
    let next_row = pages.get(page + 1).map_or(rows, |p| p.first_row_index as usize);
    let mut ranges = Vec::new();
    if first_offset > start && page > 0 {
        ranges.push(start..first_offset);
    }
    ranges.push(if page == 0 { start..end } else { offset..end });
    let mut bytes = 0;
    let mut read = Vec::new();
    for range in ranges {
        bytes += range.end - range.start;
        read.push(InMemoryRange { start: range.start, data: file.read_range(range, roots)? });
    }
    let (descr, column) = leaf_column(rg, leaf).map_err(corrupt)?;
    let max_def = descr.max_def_level();
    let values = guarded(|| {
        let reader = SerializedPageReader::new(Arc::new(SparseRanges(read)), chunk, rows, Some(pages.to_vec()))?;
        let ColumnReader::ByteArrayColumnReader(mut r) = get_column_reader(descr.clone(), Box::new(reader)) else {
            return Err(CrateError::General(format!("column `{column}` is not binary")));
        };
        let skipped = r.skip_records(first_row)?;
        if skipped != first_row {
            return Err(CrateError::General(format!("skipped {skipped} rows of {first_row}")));
        }
        read_binary(&mut r, next_row - first_row, max_def)
    })
    .map_err(|m| corrupt(format!("column `{column}`, rows {first_row}..{next_row}: {m}")))?;
    if values.len() != next_row - first_row {
        return Err(corrupt(format!(
            "column `{column}`: the page holds {} rows, its index says {} (truncated or corrupt pages)",
            values.len(),
            next_row - first_row
        )));
    }
    Ok(PageRows { first_row, values, bytes })
}

/// Leaf column `leaf` of a row group's schema, and its dotted name.
fn leaf_column(rg: &RowGroupMetaData, leaf: usize) -> Result<(ColumnDescPtr, String), String> {
    let descr = rg
        .schema_descr()
        .columns()
        .get(leaf)
        .cloned()
        .ok_or_else(|| format!("the schema has no leaf column {leaf}"))?;
    let column = descr.path().string();
    Ok((descr, column))
}

/// The limit on one column chunk's bytes (`SLUICE_PARQUET_MAX_CHUNK_BYTES`).
pub(crate) fn max_chunk_bytes() -> u64 {
    std::env::var("SLUICE_PARQUET_MAX_CHUNK_BYTES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_MAX_CHUNK_BYTES)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test fixtures: a failed setup is a failed test

    use parquet::data_type::Int64Type;
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;

    use super::*;

    #[test]
    fn a_list_chunk_declaring_more_values_than_its_bytes_allow_is_refused_before_decoding() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("long.parquet");
        let schema = "message s { optional group labels (LIST) { repeated group list { optional int64 element; } } }";
        let schema = Arc::new(parse_message_type(schema).unwrap());
        let mut w = SerializedFileWriter::new(
            std::fs::File::create(&path).unwrap(),
            schema,
            Arc::new(WriterProperties::default()),
        )
        .unwrap();
        // Row 0: 5000 times class 1 (a few bytes of RLE); row 1: [2].
        let (mut values, mut defs, mut reps) = (vec![1i64; 5000], vec![3i16; 5000], vec![1i16; 5000]);
        reps[0] = 0;
        values.push(2);
        defs.push(3);
        reps.push(0);
        let mut rg = w.next_row_group().unwrap();
        let mut col = rg.next_column().unwrap().unwrap();
        col.typed::<Int64Type>().write_batch(&values, Some(&defs), Some(&reps)).unwrap();
        col.close().unwrap();
        rg.close().unwrap();
        w.close().unwrap();

        let file = ParquetFile::new(&path);
        let len = std::fs::metadata(&path).unwrap().len();
        let footer = read_footer(&file, len, None).unwrap();
        let ChunkValues::IntLists(rows) = read_column_chunk(&file, &footer.meta, 0, 0, 1 << 20, None).unwrap() else {
            panic!("not lists")
        };
        assert_eq!((rows[0].as_ref().unwrap().len(), rows[1].clone()), (5000, Some(vec![Some(2)])));
        let chunk = footer.meta.row_group(0).column(0).compressed_size();
        assert!(chunk < 2048, "the chunk is {chunk} bytes");
        let e = read_column_chunk(&file, &footer.meta, 0, 0, 2048, None).err().unwrap().to_string();
        assert!(e.contains("long.parquet: row group 0") && e.contains("over the limit of 64"), "{e}");
    }
}
