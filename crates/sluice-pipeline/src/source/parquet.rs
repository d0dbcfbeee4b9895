//! Parquet datasets (the Hugging Face image-dataset layout): each row a sample, its image
//! in a binary column (or a struct `{bytes, path}`), its label in an optional integer
//! column. `path` is one `.parquet` file, a folder (every `*.parquet` below it, in path
//! order), an object `s3://bucket/x.parquet`, or a prefix `s3://bucket/prefix` (every
//! `.parquet` object under it, from the cached listing).
//!
//! The index is built once from the footers: one manifest entry per row, naming its file,
//! row group and row within the group; labels come from the label column (one ranged read
//! of a small column chunk per row group). Images are not read here. The manifest's
//! fingerprint also covers every file's size, footer bytes and (for objects) ETag, so a
//! rewritten file with the same row counts still changes it and a checkpoint of the old
//! data is refused.

use std::path::{Path, PathBuf};

use sluice_core::fields::FieldValue;
use sluice_core::{FieldKindName, FieldSpec, FieldTable, Location, Manifest};
use xxhash_rust::xxh3::Xxh3;

use super::sidecar::FieldsRead;
use super::SourceError;
use crate::storage::parquet::{
    field_leaf, has_leaf, image_leaf, label_leaf, max_chunk_bytes, read_column_chunk, read_footer, ChunkValues,
    ParquetFile,
};
use crate::storage::{ObjectUrl, Roots};

/// The label column used when the spec names none and the files have it.
pub const DEFAULT_LABEL_COLUMN: &str = "label";

/// A file to index: its path relative to the root, its size and ETag (empty when local).
struct Listed {
    rel: PathBuf,
    size: u64,
    etag: String,
}

/// Enumerates the rows of the Parquet files at `path` (see the module docs).
pub fn enumerate(path: &Path, image_column: &str, label_column: Option<&str>) -> Result<Manifest, SourceError> {
    enumerate_with_fields(path, image_column, label_column, None)
}

/// As [`enumerate`], also reading the metadata fields `fields` names, each from the column
/// of its name (`int`: an integer column; `float`: a number column; `text`: a string
/// column; `json`: a string column holding JSON; `multi_label`: a list column of integer
/// class indices, as `datasets` writes a `Sequence(ClassLabel)`). A null, or a value that is
/// not of its kind, fails that row's sample when loaded.
pub fn enumerate_with_fields(
    path: &Path,
    image_column: &str,
    label_column: Option<&str>,
    fields: Option<FieldsRead<'_>>,
) -> Result<Manifest, SourceError> {
    enumerate_within(path, image_column, label_column, fields, None)
}

/// As [`enumerate_with_fields`], every file read beneath `roots` when given (an object
/// under one of their prefixes).
pub fn enumerate_within(
    path: &Path,
    image_column: &str,
    label_column: Option<&str>,
    fields: Option<FieldsRead<'_>>,
    roots: Option<&Roots>,
) -> Result<Manifest, SourceError> {
    let mut table = fields.map(|f| FieldTable::new(f.specs));
    let (root, files) = match ObjectUrl::parse(path) {
        Some(url) => {
            super::check_object("Parquet dataset", &url, roots)?;
            list_objects(&url)?
        }
        None => list_local(path)?,
    };
    if files.is_empty() {
        return Err(SourceError::NoSamples { dataset: path.display().to_string(), hint: "no .parquet files" });
    }
    let max_chunk = max_chunk_bytes();
    let mut items = Vec::new();
    let mut files_hash = Xxh3::new();
    for listed in &files {
        let file = ParquetFile::new(&root.join(&listed.rel));
        let name = file.name();
        let footer = read_footer(&file, listed.size, roots)?;
        let meta = &footer.meta;
        files_hash.update(listed.rel.as_os_str().as_encoded_bytes());
        files_hash.update(&listed.size.to_le_bytes());
        files_hash.update(listed.etag.as_bytes());
        files_hash.update(&footer.raw);
        let image = image_leaf(meta, &name, image_column)?;
        let label = match label_column {
            Some(column) => Some(label_leaf(meta, &name, column)?),
            None if has_leaf(meta, DEFAULT_LABEL_COLUMN) => match label_leaf(meta, &name, DEFAULT_LABEL_COLUMN) {
                Ok(i) => Some(i),
                Err(e) => {
                    tracing::warn!(error = %e, "not using the `label` column as labels");
                    None
                }
            },
            None => None,
        };
        let column = u32::try_from(image).map_err(|_| too_many(&name, "columns"))?;
        let field_leaves = match fields {
            Some(f) => {
                f.specs.iter().map(|s| field_leaf(meta, &name, &s.name, s.kind)).collect::<Result<Vec<_>, _>>()?
            }
            None => Vec::new(),
        };
        for (g, rg) in meta.row_groups().iter().enumerate() {
            let rows = usize::try_from(rg.num_rows()).map_err(|_| too_many(&name, "rows"))?;
            let row_group = u32::try_from(g).map_err(|_| too_many(&name, "row groups"))?;
            u32::try_from(rows).map_err(|_| too_many(&name, "rows in a row group"))?;
            let labels = match label {
                Some(leaf) => match read_column_chunk(&file, meta, g, leaf, max_chunk, roots)? {
                    ChunkValues::Int(v) => v,
                    ChunkValues::Binary(_) | ChunkValues::Float(_) | ChunkValues::IntLists(_) => Vec::new(),
                },
                None => Vec::new(),
            };
            if let (Some(t), Some(f)) = (table.as_mut(), fields) {
                let columns = field_leaves
                    .iter()
                    .map(|&leaf| read_column_chunk(&file, meta, g, leaf, max_chunk, roots))
                    .collect::<Result<Vec<_>, _>>()?;
                for row in 0..rows {
                    let values =
                        f.specs.iter().zip(&columns).map(|(s, c)| field_value(s, c, row, f.max_bytes)).collect();
                    t.push(values);
                }
            }
            let bytes = rg.columns().get(image).map_or(0, |c| u64::try_from(c.uncompressed_size()).unwrap_or(0));
            let size = if rows == 0 { 0 } else { bytes / rows as u64 };
            items.try_reserve(rows).map_err(|_| too_many(&name, "rows to index in memory"))?;
            for row in 0..rows {
                let label = labels.get(row).copied().flatten().unwrap_or(-1);
                let location = Location::ParquetRow { file: listed.rel.clone(), row_group, row: row as u32, column };
                items.push((location, label, size));
            }
        }
        tracing::debug!(file = %name, row_groups = meta.num_row_groups(), "indexed Parquet file");
    }
    if items.is_empty() {
        return Err(SourceError::NoSamples {
            dataset: format!("{} Parquet file(s) under {}", files.len(), root.display()),
            hint: "the files hold no rows",
        });
    }
    let mut manifest = Manifest::new(root, items, Vec::new());
    files_hash.update(&manifest.fingerprint.to_le_bytes());
    manifest.fingerprint = files_hash.digest();
    Ok(match table {
        Some(t) => manifest.with_fields(t),
        None => manifest,
    })
}

/// Row `row`'s value of field `spec` from its column chunk, checked as a sidecar's is.
fn field_value(spec: &FieldSpec, column: &ChunkValues, row: usize, max_bytes: u64) -> Result<FieldValue, String> {
    let name = &spec.name;
    let value = match column {
        ChunkValues::Int(v) => v.get(row).copied().flatten().map(serde_json::Value::from),
        // A list of class indices, as a sidecar's JSON list would hold it (a null item stays null).
        ChunkValues::IntLists(v) => v.get(row).cloned().flatten().map(serde_json::Value::from),
        ChunkValues::Float(v) => match v.get(row).copied().flatten() {
            Some(x) if !x.is_finite() => return Err(format!("field `{name}`: {x} is not a finite number")),
            x => x.map(serde_json::Value::from),
        },
        ChunkValues::Binary(v) => match v.get(row).cloned().flatten() {
            None => None,
            Some(bytes) => {
                let len = bytes.len() as u64;
                if len > max_bytes {
                    return Err(format!(
                        "field `{name}`: {len} bytes, over the limit of {max_bytes} (limits.max_field_bytes)"
                    ));
                }
                let text = String::from_utf8(bytes.data().to_vec())
                    .map_err(|_| format!("field `{name}`: the column's value is not UTF-8 text"))?;
                if spec.kind == FieldKindName::Json {
                    Some(
                        serde_json::from_str(&text)
                            .map_err(|e| format!("field `{name}`: the column's text is not JSON: {e}"))?,
                    )
                } else {
                    Some(serde_json::Value::String(text))
                }
            }
        },
    };
    spec.read(value.as_ref(), max_bytes)
}

fn too_many(file: &str, what: &str) -> SourceError {
    SourceError::Parquet(crate::storage::ParquetError::CorruptFooter {
        file: file.to_string(),
        message: format!("too many {what}"),
    })
}

fn is_parquet(name: &str) -> bool {
    Path::new(name).extension().and_then(|e| e.to_str()).is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
}

/// One object, or every `.parquet` object under a prefix (from the cached listing).
fn list_objects(url: &ObjectUrl) -> Result<(PathBuf, Vec<Listed>), SourceError> {
    if is_parquet(&url.key) {
        let (size, etag) = crate::storage::object::head(url)?;
        let (parent, name) = url.key.rsplit_once('/').unwrap_or(("", url.key.as_str()));
        let root = url.with_key(parent);
        return Ok((PathBuf::from(root.to_string()), vec![Listed { rel: PathBuf::from(name), size, etag }]));
    }
    let files = super::object::listing(url)?
        .into_iter()
        .filter(|o| is_parquet(&o.key))
        .map(|o| Listed { rel: PathBuf::from(o.key), size: o.size, etag: o.etag })
        .collect();
    Ok((PathBuf::from(url.to_string()), files))
}

/// One file, or every `*.parquet` file below a folder, sorted by path.
fn list_local(path: &Path) -> Result<(PathBuf, Vec<Listed>), SourceError> {
    let meta = std::fs::metadata(path).map_err(|e| SourceError::io("Parquet dataset", path, e))?;
    if meta.is_file() {
        let root = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let rel = path.file_name().map(PathBuf::from).unwrap_or_else(|| path.to_path_buf());
        return Ok((root, vec![Listed { rel, size: meta.len(), etag: String::new() }]));
    }
    let mut files = Vec::new();
    let mut folders = vec![PathBuf::new()];
    while let Some(rel) = folders.pop() {
        let dir = path.join(&rel);
        for entry in std::fs::read_dir(&dir).map_err(|e| SourceError::io("folder", &dir, e))? {
            let entry = entry.map_err(|e| SourceError::io("folder", &dir, e))?;
            let kind = entry.file_type().map_err(|e| SourceError::io("folder", &dir, e))?;
            let child = rel.join(entry.file_name());
            if kind.is_dir() {
                folders.push(child);
            } else if kind.is_file() && entry.file_name().to_str().is_some_and(is_parquet) {
                let size = entry.metadata().map_err(|e| SourceError::io("Parquet file", &path.join(&child), e))?.len();
                files.push(Listed { rel: child, size, etag: String::new() });
            }
        }
    }
    files.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok((path.to_path_buf(), files))
}
