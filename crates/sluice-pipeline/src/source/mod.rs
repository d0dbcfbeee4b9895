//! Sources enumerate a dataset once into a [`Manifest`]: a stable list of sample locations,
//! labels and sizes. Enumeration touches metadata only (one `read_dir` per folder, one
//! `stat` per file, tar headers by seeking); sample bytes are read later through
//! [`crate::storage`].
//!
//! A service enumerates with its allowed roots ([`build_pipeline_manifest_within`]): every
//! file a source opens to enumerate (a sidecar, a file list, a COCO annotation file, a tar
//! shard, a Parquet footer or column) is opened beneath them, symlinks resolved by the
//! kernel, and one that resolves outside them fails the enumeration
//! ([`SourceError::OutsideRoots`]), so the job is refused before anything is served.

pub mod coco;
pub mod file_list;
pub mod image_folder;
pub mod object;
pub mod parquet;
pub mod segmentation;
pub mod sidecar;
pub mod tar;

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use sluice_core::{FieldTable, Manifest, PipelineSpec, SampleErrorKind, SourceSpec};

use crate::storage::confine::{open_regular_within, OpenFailure};
use crate::storage::{ObjectUrl, Roots};

/// Why a dataset could not be enumerated. Every variant names the path to look at.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{what} not found: {}", path.display())]
    NotFound { what: &'static str, path: PathBuf },
    #[error("dataset root is not a directory: {}", path.display())]
    NotADirectory { path: PathBuf },
    #[error("no class folders in {} (an image folder dataset is root/<class>/<image>)", root.display())]
    NoClasses { root: PathBuf },
    #[error("no samples found in {dataset}: {hint}")]
    NoSamples { dataset: String, hint: &'static str },
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: not a COCO annotation file: {message}", path.display())]
    BadAnnotations { path: PathBuf, message: String },
    #[error("{}:{line}: label `{text}` is not an integer (a line is `path` or `path <label>`)", path.display())]
    BadLabel { path: PathBuf, line: usize, text: String },
    #[error("{}: corrupt tar header at or after byte offset {offset}: {message}", shard.display())]
    CorruptTar { shard: PathBuf, offset: u64, message: String },
    #[error("{}:{member}: label `{text}` is not an integer", shard.display())]
    BadClassFile { shard: PathBuf, member: String, text: String },
    #[error(
        "{}:{member}: shard is truncated (member data ends at byte {end}, the file has {file_len} bytes)",
        shard.display()
    )]
    TruncatedShard { shard: PathBuf, member: String, end: u64, file_len: u64 },
    #[error("{}: a {len}-byte tar shard, over the limit of {cap} bytes a shard", shard.display())]
    ShardTooLarge { shard: PathBuf, len: u64, cap: u64 },
    /// Object storage refused or failed a LIST or GET (credentials, a missing bucket, a
    /// server that does not answer after the retries).
    #[error(transparent)]
    Object(#[from] crate::storage::object::ObjectError),
    /// A Parquet file that cannot be indexed: not Parquet, a corrupt footer, a missing or
    /// mistyped column.
    #[error(transparent)]
    Parquet(#[from] crate::storage::ParquetError),
    /// The spec asks for metadata fields from a source that carries none.
    #[error(
        "the {source_kind} source carries no metadata fields (`fields`); they come from sidecars or Parquet columns"
    )]
    NoFields { source_kind: &'static str },
    /// A file the source reads to enumerate (or an object it fetches) lies outside the
    /// roots enumeration is confined to (a service's `--allow-root`).
    #[error("{what} {}: refused: {why}", path.display())]
    OutsideRoots { what: &'static str, path: PathBuf, why: String },
}

impl SourceError {
    /// Maps an I/O error on `path`: not-found becomes [`SourceError::NotFound`].
    pub(crate) fn io(what: &'static str, path: &Path, source: io::Error) -> Self {
        if source.kind() == io::ErrorKind::NotFound {
            SourceError::NotFound { what, path: path.to_path_buf() }
        } else {
            SourceError::Io { path: path.to_path_buf(), source }
        }
    }
}

/// Opens the regular file `path` (a `what`) that a source reads to enumerate, beneath
/// `roots` when given: a FIFO never blocks, and a path out of the roots is
/// [`SourceError::OutsideRoots`].
pub(crate) fn open_source_file(what: &'static str, path: &Path, roots: Option<&Roots>) -> Result<File, SourceError> {
    open_regular_within(path, roots).map_err(|f| match f {
        OpenFailure::OutsideRoots(why) => SourceError::OutsideRoots { what, path: path.to_path_buf(), why },
        OpenFailure::Other(SampleErrorKind::Missing) => SourceError::NotFound { what, path: path.to_path_buf() },
        OpenFailure::Other(SampleErrorKind::Io(m)) => {
            SourceError::Io { path: path.to_path_buf(), source: io::Error::other(m) }
        }
        OpenFailure::Other(kind) => {
            SourceError::Io { path: path.to_path_buf(), source: io::Error::other(kind.to_string()) }
        }
    })
}

/// Refuses the object `url` (a `what`) unless it lies under one of `roots`' object prefixes.
pub(crate) fn check_object(what: &'static str, url: &ObjectUrl, roots: Option<&Roots>) -> Result<(), SourceError> {
    match roots {
        Some(r) if !r.allows_url(url) => Err(SourceError::OutsideRoots {
            what,
            path: PathBuf::from(url.to_string()),
            why: format!("outside the allowed roots ({})", r.describe()),
        }),
        _ => Ok(()),
    }
}

/// Enumerates the dataset a pipeline spec describes, with the metadata fields it asks for
/// (`spec.fields`; none: as [`build_manifest`]).
pub fn build_pipeline_manifest(spec: &PipelineSpec) -> Result<Manifest, SourceError> {
    build_pipeline_manifest_within(spec, None)
}

/// As [`build_pipeline_manifest`], every file enumeration opens opened beneath `roots`
/// when given (see the module doc).
pub fn build_pipeline_manifest_within(spec: &PipelineSpec, roots: Option<&Roots>) -> Result<Manifest, SourceError> {
    if spec.fields.is_empty() {
        return build_manifest_within(&spec.source, roots);
    }
    let fields = sidecar::FieldsRead { specs: &spec.fields, max_bytes: spec.limits.max_field_bytes };
    let manifest = match &spec.source {
        // Each source's rows and fields, joined in the mix's order (as `build_manifest` joins).
        SourceSpec::Mix { sources } => {
            let mut table = FieldTable::new(&spec.fields);
            let mut parts = Vec::with_capacity(sources.len());
            for s in sources {
                let mut part = enumerate_with_fields(&s.source, fields, roots)?;
                let Some(part_fields) = part.fields.take() else {
                    return Err(SourceError::NoFields { source_kind: source_kind(&s.source) });
                };
                table.append(part_fields);
                parts.push(part);
            }
            Manifest::join(parts).with_fields(table)
        }
        other => enumerate_with_fields(other, fields, roots)?,
    };
    let bad = manifest.fields.as_ref().map_or(0, |t| t.invalid.len());
    if let Some((pos, why)) = manifest.fields.as_ref().and_then(|t| t.invalid.first()) {
        tracing::warn!(bad, first = pos, why, "samples whose fields cannot be read; they fail when loaded");
    }
    Ok(manifest)
}

/// Enumerates one source (not a mix) with the metadata fields `fields` names.
fn enumerate_with_fields(
    spec: &SourceSpec,
    fields: sidecar::FieldsRead<'_>,
    roots: Option<&Roots>,
) -> Result<Manifest, SourceError> {
    let fields = Some(fields);
    Ok(match spec {
        SourceSpec::Sidecar { root, masks } => sidecar::enumerate_within(root, *masks, fields, roots)?,
        SourceSpec::Tar { shards, sidecars: true, masks } => {
            self::tar::enumerate_within(shards, self::tar::Records { sidecars: true, masks: *masks, fields }, roots)?
        }
        SourceSpec::Parquet { path, image_column, label_column } => {
            self::parquet::enumerate_within(path, image_column, label_column.as_deref(), fields, roots)?
        }
        other => return Err(SourceError::NoFields { source_kind: source_kind(other) }),
    })
}

/// The `kind` of a source, as a spec names it.
fn source_kind(spec: &SourceSpec) -> &'static str {
    match spec {
        SourceSpec::ImageFolder { .. } => "image_folder",
        SourceSpec::FileList { .. } => "file_list",
        SourceSpec::Tar { .. } => "tar (without sidecars)",
        SourceSpec::Mix { .. } => "mix",
        SourceSpec::Parquet { .. } => "parquet",
        SourceSpec::Coco { .. } => "coco",
        SourceSpec::Sidecar { .. } => "sidecar",
    }
}

/// Enumerates the dataset `spec` describes.
pub fn build_manifest(spec: &SourceSpec) -> Result<Manifest, SourceError> {
    build_manifest_within(spec, None)
}

/// As [`build_manifest`], every file enumeration opens opened beneath `roots` when given
/// (see the module doc).
pub fn build_manifest_within(spec: &SourceSpec, roots: Option<&Roots>) -> Result<Manifest, SourceError> {
    let started = std::time::Instant::now();
    let manifest = match spec {
        SourceSpec::ImageFolder { root } => match ObjectUrl::parse(root) {
            Some(url) => {
                check_object("image folder", &url, roots)?;
                object::enumerate_image_folder(&url)?
            }
            None => image_folder::enumerate(root)?,
        },
        SourceSpec::FileList { path, root } => file_list::enumerate_within(path, root.as_deref(), roots)?,
        SourceSpec::Tar { shards, sidecars, masks } => self::tar::enumerate_within(
            shards,
            self::tar::Records { sidecars: *sidecars, masks: *masks, fields: None },
            roots,
        )?,
        SourceSpec::Mix { sources } => {
            Manifest::join(sources.iter().map(|s| build_manifest_within(&s.source, roots)).collect::<Result<_, _>>()?)
        }
        SourceSpec::Parquet { path, image_column, label_column } => {
            self::parquet::enumerate_within(path, image_column, label_column.as_deref(), None, roots)?
        }
        SourceSpec::Coco { annotations, images, masks } => coco::enumerate_within(annotations, images, *masks, roots)?,
        SourceSpec::Sidecar { root, masks } => sidecar::enumerate_within(root, *masks, None, roots)?,
    };
    tracing::info!(
        samples = manifest.len(),
        classes = manifest.classes.len(),
        root = %manifest.root.display(),
        fingerprint = %manifest.fingerprint_hex(),
        elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
        "enumerated dataset"
    );
    Ok(manifest)
}

/// Whether a file name (or a WebDataset extension) names an image sluice decodes.
pub(crate) fn is_image_extension(ext: &str) -> bool {
    ["jpg", "jpeg", "png"].iter().any(|e| ext.eq_ignore_ascii_case(e))
}

/// Whether `path`'s extension is an image extension.
pub(crate) fn has_image_extension(path: &Path) -> bool {
    path.extension().and_then(|e| e.to_str()).is_some_and(is_image_extension)
}
