//! The pipeline spec: one serialisable description of source, storage, ops, shuffle, batch,
//! prefetch and bad-data policy. The CLI, the Python builder and the service all speak it.
//! Parse errors and validation errors name the offending field (`ops[2].size`); validation
//! bounds every size and count (the `MAX_*` constants below), so no spec can make size
//! arithmetic overflow or ask for unbounded threads or memory.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::error::SpecError;
use crate::image::{DType, Layout};
use ops::{default_flip_p, default_ratio, default_scale};

mod cache;
mod decode;
mod locality;
mod mix;
mod ops;
mod threads;

pub use cache::{
    ByteBudget, CacheLevel, CachePolicyKind, CacheSpec, DiskCacheSpec, DiskPolicyKind, ImportanceSpec, SamplingSpec,
    MIN_DISK_CACHE_BYTES,
};
pub use decode::{DecodeSpec, MAX_INDEX_SPACING};
pub use locality::{Assignment, LocalitySpec, PeerToken, MAX_LEARNERS, MAX_PEER_TIMEOUT_MS};
pub use mix::{MixedSource, MAX_MIXED_SOURCES};
pub use ops::{
    AutoAugmentPolicy, ErasingValue, Geometry, Interpolation, IouCropParams, KernelSize, OpSpec, PaddingMode,
    RandomTag, Range, IOU_CROP_MAX_ROUNDS,
};
pub use threads::Threads;

// Absolute bounds on what a spec may ask for: far beyond any real training pipeline, they
// keep size arithmetic from overflowing and stop a spec from asking a worker for unbounded
// threads or memory. (Operators may set tighter limits of their own.)

/// Largest output side (height or width), and largest resize: JPEG's own limit.
pub const MAX_SIDE: u32 = 65_535;
/// Largest `batch.size`.
pub const MAX_BATCH_SIZE: usize = 1 << 20;
/// Largest batch of images in bytes (`batch.size × height × width × 3 × dtype size`): 32 GiB.
pub const MAX_BATCH_BYTES: u64 = 32 << 30;
/// Largest `threads`.
pub const MAX_THREADS: usize = 1024;
/// Largest `prefetch` (batches).
pub const MAX_PREFETCH: usize = 1024;
/// Largest tf.data-style shuffle buffer (samples).
pub const MAX_SHUFFLE_BUFFER: usize = 1 << 26;
/// Largest `limits.max_pixels`: libjpeg-turbo takes the limit as a C `int`.
pub const MAX_PIXELS: u64 = i32::MAX as u64;
/// Largest `limits.max_file_bytes`: 4 GiB.
pub const MAX_FILE_BYTES: u64 = 4 << 30;
/// Largest cache budget in bytes: 1 PiB.
pub const MAX_CACHE_BYTES: u64 = 1 << 50;
/// Most ops in one pipeline.
pub const MAX_OPS: usize = 64;
/// Most boxes `limits.max_boxes` may allow in one sample.
pub const MAX_BOXES: u64 = 1 << 24;
/// Largest `limits.max_field_bytes`: 16 MiB, the size of the largest sidecar.
pub const MAX_FIELD_BYTES: u64 = 16 << 20;
/// Largest emulated storage latency (ms): a minute.
pub const MAX_LATENCY_MS: f64 = 60_000.0;
/// Largest emulated per-sample cost of a `sleep` op (µs): a second.
pub const MAX_SLEEP_US: u32 = 1_000_000;
/// Smallest emulated storage bandwidth (MB/s): 1 kB/s.
pub const MIN_BANDWIDTH_MB_S: f64 = 0.001;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    pub source: SourceSpec,
    #[serde(default)]
    pub storage: StorageSpec,
    pub ops: Vec<OpSpec>,
    #[serde(default)]
    pub shuffle: ShuffleSpec,
    pub batch: BatchSpec,
    /// Batches prepared ahead of the consumer. Batch buffers take about
    /// `prefetch × batch bytes`, plus the batches the consumer still holds (the threads
    /// write into those buffers, they hold none of their own). `"auto"` (kept as 0, as
    /// `threads = 0` is one per core): the loader sizes it while it runs from how the
    /// consumer drains it, within [`PipelineSpec::prefetch_max_bytes`].
    #[serde(default = "default_prefetch", with = "prefetch_auto")]
    pub prefetch: usize,
    /// The memory bound of `prefetch = "auto"`: bytes of batches in flight at most
    /// (default [`DEFAULT_PREFETCH_MAX_BYTES`]); at least one batch is always in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch_max_bytes: Option<u64>,
    /// Worker threads; 0 means one per available core, `"auto"` as many as the trainer
    /// needs (the autoscaler moves the count while it runs).
    #[serde(default)]
    pub threads: Threads,
    /// Seed of every random choice (epoch order and augmentations).
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub on_error: ErrorPolicy,
    #[serde(default)]
    pub limits: Limits,
    /// How JPEGs are decoded: the entropy index (off by default).
    #[serde(default)]
    pub decode: DecodeSpec,
    /// A cache of preprocessed samples (none by default): where, how big, which policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheSpec>,
    /// How each epoch's order is drawn: uniform (default) or from importance scores.
    #[serde(default)]
    pub sampling: SamplingSpec,
    /// How reported per-sample importance is smoothed across epochs.
    #[serde(default)]
    pub importance: ImportanceSpec,
    /// Several learners sharing one dataset: locality-aware assignment of each global
    /// batch and a collaborative cache (none by default: each rank takes its plain slice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locality: Option<LocalitySpec>,
    /// `module:qualname` of a Python function run on each whole batch after the ops
    /// (`Pipeline.map_batch`, docs/map.md). Only the Python `sluice.Loader` runs it (in its
    /// worker processes); the native engine leaves it to that loader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map_batch: Option<String>,
    /// Metadata fields each sample carries besides its image (a caption, a score, a
    /// multi-label vector, an id, JSON), read by sources that have them (sidecar folders,
    /// tar shards with sidecars, Parquet columns); batches carry one entry per field
    /// (docs/records.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<crate::fields::FieldSpec>,
}

fn default_prefetch() -> usize {
    4
}

/// `prefetch = "auto"`, as the spec keeps it.
pub const PREFETCH_AUTO: usize = 0;
/// Most batches `prefetch = "auto"` keeps in flight, whatever its memory bound allows.
pub const MAX_AUTO_PREFETCH: usize = 64;
/// The default memory bound of `prefetch = "auto"`: 1 GiB of batches in flight.
pub const DEFAULT_PREFETCH_MAX_BYTES: u64 = 1 << 30;

/// `prefetch`: a count of batches or `"auto"` (0 in the struct).
mod prefetch_auto {
    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};

    use super::PREFETCH_AUTO;

    pub fn serialize<S: Serializer>(n: &usize, s: S) -> Result<S::Ok, S::Error> {
        if *n == PREFETCH_AUTO {
            s.serialize_str("auto")
        } else {
            s.serialize_u64(*n as u64)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = usize;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a count of batches (at least 1) or \"auto\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<usize, E> {
                match usize::try_from(v) {
                    Ok(0) => Err(E::custom("prefetch must be at least 1 (or \"auto\")")),
                    Ok(n) => Ok(n),
                    Err(_) => Err(E::custom(format!("prefetch {v} is too many"))),
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<usize, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(format!("prefetch {v} is negative")))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<usize, E> {
                match v {
                    "auto" => Ok(PREFETCH_AUTO),
                    _ => Err(E::custom(format!("prefetch {v:?}: a count of batches or \"auto\""))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SourceSpec {
    /// `root/<class>/<image>`: classes sorted by name get labels 0..n. `root` may be an
    /// object-storage prefix, `s3://bucket/prefix` (see [`is_url`]).
    ImageFolder { root: PathBuf },
    /// A text file, one sample per line: `path` or `path<TAB or space>label`. Relative
    /// paths are taken from `root` (default: the list's own folder).
    FileList {
        path: PathBuf,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        root: Option<PathBuf>,
    },
    /// WebDataset-style tar shards: members `<basename>.jpg|jpeg|png` with an optional
    /// `<basename>.cls` holding the integer label. Indexed once, read by offset. A shard
    /// may be an object, `s3://bucket/key.tar`, read by byte range. With `sidecars`, each
    /// image has a `<basename>.json` member in the same shard, the sidecar source's JSON
    /// (boxes, labels, optional `label`); with `masks` (needs `sidecars`), each sidecar
    /// names its mask PNG member: `"mask": "0001.mask.png"`.
    Tar {
        shards: Vec<PathBuf>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        sidecars: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        masks: bool,
    },
    /// Several sources mixed by weight: every batch holds them in proportion to their
    /// weights (±1 sample), in an order fixed by the seed; an epoch ends when the first
    /// source runs out (docs/sharding.md).
    Mix { sources: Vec<MixedSource> },
    /// Parquet files (the Hugging Face image-dataset layout): `path` is a `.parquet` file,
    /// a folder (every `*.parquet` below it, sorted), or an object, `s3://bucket/x.parquet`,
    /// or prefix, `s3://bucket/prefix`. Each row is a sample: its image from
    /// `image_column` (binary, or a struct `{bytes, path}` as `datasets` writes it), its
    /// label from `label_column` (an integer column; default: `label` when the files have
    /// one). Indexed once from the footers; rows are read by row group.
    Parquet {
        path: PathBuf,
        #[serde(default = "default_image_column")]
        image_column: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        label_column: Option<String>,
    },
    /// COCO-style detection: an `instances_*.json` (`images`, `annotations` with XYWH
    /// `bbox` and `category_id`) and the folder its `file_name`s are in. Samples are the
    /// listed images in `id` order; each box's label is its `category_id`. With `masks`,
    /// each sample also gets a semantic mask painted from the `segmentation`s.
    Coco {
        annotations: PathBuf,
        images: PathBuf,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        masks: bool,
    },
    /// A folder of images, each with a JSON sidecar of the same stem (WebDataset's
    /// convention: `0001.jpg` + `0001.json` holding `{"boxes": [[x1, y1, x2, y2], ...],
    /// "labels": [...]}`, optionally `"label"`: the sample's own integer label). With
    /// `masks`, each sidecar names its mask PNG: `"mask": "0001.mask.png"`.
    Sidecar {
        root: PathBuf,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        masks: bool,
    },
}

impl SourceSpec {
    /// Whether the source's samples carry boxes.
    pub fn has_boxes(&self) -> bool {
        matches!(self, SourceSpec::Coco { .. } | SourceSpec::Sidecar { .. } | SourceSpec::Tar { sidecars: true, .. })
    }

    /// Whether the source can read metadata fields (from its sidecars, or Parquet columns; a
    /// mix when each of its sources can).
    pub fn has_fields(&self) -> bool {
        match self {
            SourceSpec::Mix { sources } => sources.iter().all(|s| s.source.has_fields()),
            _ => matches!(
                self,
                SourceSpec::Sidecar { .. } | SourceSpec::Tar { sidecars: true, .. } | SourceSpec::Parquet { .. }
            ),
        }
    }

    /// Whether the source's samples carry segmentation masks.
    pub fn has_masks(&self) -> bool {
        matches!(
            self,
            SourceSpec::Coco { masks: true, .. }
                | SourceSpec::Sidecar { masks: true, .. }
                | SourceSpec::Tar { sidecars: true, masks: true, .. }
        )
    }
}

fn default_image_column() -> String {
    "image".into()
}

/// Whether a spec path is a URL (`s3://bucket/prefix`, any `scheme://`) rather than a
/// local path: URLs are never made relative to the spec's folder.
pub fn is_url(path: &Path) -> bool {
    path.to_str().and_then(|s| s.split_once("://")).is_some_and(|(scheme, _)| {
        !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '-' || c == '.')
    })
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum StorageSpec {
    /// Local files, positional reads.
    #[default]
    Local,
    /// Local files behind an emulated network link: every read waits `latency_ms`, and
    /// all reads share `bandwidth_mb_s` (MB = 10^6 bytes): those of this process, or,
    /// with `shared_link`, those of every process on the machine naming the same link.
    Throttled {
        latency_ms: f64,
        bandwidth_mb_s: f64,
        /// A name (letters, digits, `-`, `_`) for a link shared across processes; its
        /// timeline lives in `/dev/shm` (or the temp folder). A name, not a path, so a
        /// service client's spec cannot make a worker write anywhere else.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        shared_link: Option<String>,
    },
}

/// An output size, `height × width`. Written as one number (square) or `[height, width]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub height: u32,
    pub width: u32,
}

impl Size {
    pub fn square(side: u32) -> Self {
        Self { height: side, width: side }
    }
}

impl Serialize for Size {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.height == self.width {
            s.serialize_u32(self.height)
        } else {
            [self.height, self.width].serialize(s)
        }
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct SizeVisitor;
        impl<'de> Visitor<'de> for SizeVisitor {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a side length or [height, width]")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Size, E> {
                u32::try_from(v).map(Size::square).map_err(|_| E::custom("size too large"))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Size, E> {
                u32::try_from(v).map(Size::square).map_err(|_| E::custom("size must be positive"))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Size, A::Error> {
                let height = seq.next_element()?.ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let width = seq.next_element()?.ok_or_else(|| de::Error::invalid_length(1, &self))?;
                if seq.next_element::<u32>()?.is_some() {
                    return Err(de::Error::invalid_length(3, &self));
                }
                Ok(Size { height, width })
            }
        }
        d.deserialize_any(SizeVisitor)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ShuffleSpec {
    /// Epoch order as in the manifest.
    None,
    /// A fresh permutation of the whole dataset every epoch (from seed and epoch).
    #[default]
    Global,
    /// tf.data-style shuffle buffer over the manifest order: for sources that read best
    /// sequentially (tar shards).
    Buffer { size: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSpec {
    pub size: usize,
    /// Drop the last, short batch of each epoch.
    #[serde(default)]
    pub drop_last: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorPolicy {
    /// Stop at the first bad sample; the error names its key and path.
    #[default]
    Fail,
    /// Leave bad samples out of their batch, count them and log key and path.
    Skip,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Images whose header declares more pixels than this are rejected before decoding,
    /// and a resize whose output would be larger fails the sample as too large.
    #[serde(default = "default_max_pixels")]
    pub max_pixels: u64,
    /// Files larger than this are rejected before reading.
    #[serde(default = "default_max_file_bytes")]
    pub max_file_bytes: u64,
    /// A sample with more boxes than this fails (under `on_error`) instead of being loaded.
    #[serde(default = "default_max_boxes")]
    pub max_boxes: u64,
    /// A sample whose text or JSON field is longer than this (bytes) fails instead of
    /// being loaded.
    #[serde(default = "default_max_field_bytes")]
    pub max_field_bytes: u64,
}

fn default_max_field_bytes() -> u64 {
    64 * 1024
}

fn default_max_boxes() -> u64 {
    10_000
}

fn default_max_pixels() -> u64 {
    64 * 1024 * 1024
}
fn default_max_file_bytes() -> u64 {
    256 * 1024 * 1024
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_pixels: default_max_pixels(),
            max_file_bytes: default_max_file_bytes(),
            max_boxes: default_max_boxes(),
            max_field_bytes: default_max_field_bytes(),
        }
    }
}

impl PipelineSpec {
    /// Fields need a source that reads them, and each must be well formed and named once.
    fn validate_fields(&self) -> Result<(), SpecError> {
        if self.fields.is_empty() {
            return Ok(());
        }
        const NO_FIELDS: &str = "this source carries no metadata fields; they come from sidecars (a `sidecar` \
                                 source, or `tar` with `sidecars = true`) or Parquet columns";
        if let SourceSpec::Mix { sources } = &self.source {
            if let Some(i) = sources.iter().position(|s| !s.source.has_fields()) {
                return Err(SpecError::new(format!("source.sources[{i}]"), NO_FIELDS));
            }
        }
        if !self.source.has_fields() {
            return Err(SpecError::new("fields", NO_FIELDS));
        }
        if self.fields.len() > crate::fields::MAX_FIELDS {
            return Err(SpecError::new("fields", format!("at most {} fields", crate::fields::MAX_FIELDS)));
        }
        for (i, f) in self.fields.iter().enumerate() {
            f.check(i).map_err(|(field, message)| SpecError::new(field, message))?;
            if self.fields[..i].iter().any(|g| g.name == f.name) {
                return Err(SpecError::new(format!("fields[{i}].name"), format!("`{}` is named twice", f.name)));
            }
        }
        Ok(())
    }

    /// What a source with boxes cannot do: the ops whose [`OpSpec::geometry`] refuses boxes
    /// (the augmentation policies, AugMix included), as torchvision v2 refuses boxes and
    /// masks in them (`_AutoAugmentBase` raises `TypeError`).
    fn validate_for_boxes(&self) -> Result<(), SpecError> {
        for (i, op) in self.ops.iter().enumerate() {
            if op.geometry() == Geometry::RefusesBoxes {
                return Err(SpecError::new(
                    format!("ops[{i}]"),
                    format!(
                        "`{}` does not move boxes (nor does torchvision's); a source with boxes cannot use it",
                        op.name()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The standard training pipeline: decode, RandomResizedCrop(size), flip, u8 HWC.
    pub fn train_default(source: SourceSpec, size: u32, batch: usize) -> Self {
        Self {
            source,
            storage: StorageSpec::Local,
            ops: vec![
                OpSpec::Decode,
                OpSpec::random_resized_crop(Size::square(size), default_scale(), default_ratio()),
                OpSpec::RandomHorizontalFlip { p: default_flip_p() },
            ],
            shuffle: ShuffleSpec::Global,
            batch: BatchSpec { size: batch, drop_last: false },
            prefetch: default_prefetch(),
            prefetch_max_bytes: None,
            threads: Threads::Count(0),
            seed: 0,
            on_error: ErrorPolicy::Fail,
            limits: Limits::default(),
            decode: DecodeSpec::default(),
            cache: None,
            sampling: SamplingSpec::Uniform,
            importance: ImportanceSpec::default(),
            locality: None,
            map_batch: None,
            fields: Vec::new(),
        }
    }

    pub fn from_toml_str(s: &str) -> Result<Self, SpecError> {
        let de = toml::Deserializer::new(s);
        let spec: Self = serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            SpecError::new(field, e.into_inner().message().trim().to_string())
        })?;
        spec.validate()?;
        Ok(spec)
    }

    pub fn from_json_str(s: &str) -> Result<Self, SpecError> {
        let mut de = serde_json::Deserializer::from_str(s);
        let spec: Self = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let field = e.path().to_string();
            SpecError::new(field, e.into_inner().to_string())
        })?;
        spec.validate()?;
        Ok(spec)
    }

    /// Reads a `.toml` or `.json` spec file. Relative source paths are resolved against
    /// the spec file's folder.
    pub fn from_path(path: &Path) -> Result<Self, SpecError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| SpecError::new("<file>", format!("cannot read {}: {e}", path.display())))?;
        let mut spec = match path.extension().and_then(|e| e.to_str()) {
            Some("json") => Self::from_json_str(&text)?,
            Some("toml") => Self::from_toml_str(&text)?,
            _ => {
                return Err(SpecError::new(
                    "<file>",
                    format!("{}: a spec file must end in .toml or .json", path.display()),
                ))
            }
        };
        if let Some(dir) = path.parent() {
            spec.source.resolve_relative(dir);
            if let Some(disk) = spec.cache.as_mut().and_then(|c| c.disk.as_mut()) {
                if disk.dir.is_relative() {
                    disk.dir = dir.join(&disk.dir);
                }
            }
            if let Some(index_dir) = spec.decode.index_dir.as_mut().filter(|d| d.is_relative()) {
                *index_dir = dir.join(&*index_dir);
            }
        }
        Ok(spec)
    }

    pub fn to_toml_string(&self) -> Result<String, SpecError> {
        toml::to_string_pretty(self).map_err(|e| SpecError::new("<spec>", e.to_string()))
    }

    pub fn to_json_string(&self) -> Result<String, SpecError> {
        serde_json::to_string_pretty(self).map_err(|e| SpecError::new("<spec>", e.to_string()))
    }

    /// Index of the first random op: where a cache of deterministic work goes by default.
    pub fn first_random_op(&self) -> Option<usize> {
        self.ops.iter().position(OpSpec::is_random)
    }

    /// Element type and per-sample shape of the batches this spec produces.
    pub fn output(&self) -> (DType, Layout, Size) {
        let mut dtype = DType::U8;
        let mut layout = Layout::Hwc;
        let mut size = None;
        for op in &self.ops {
            size = op.out_size(size);
            match op {
                OpSpec::Normalize { .. } => dtype = DType::F32,
                OpSpec::Dtype { dtype: d } => dtype = *d,
                OpSpec::Layout { order } => layout = *order,
                _ => {}
            }
        }
        (dtype, layout, size.unwrap_or(Size::square(0)))
    }

    /// Checks everything serde cannot: ranges, op order, a fixed output size.
    /// The folder the entropy indexes are kept in, if any: `decode.index_dir`, else the
    /// disk cache tier's folder.
    pub fn index_dir(&self) -> Option<PathBuf> {
        let disk = self.cache.as_ref().and_then(|c| c.disk.as_ref()).map(|d| d.dir.join("entropy-index"));
        self.decode.index_dir.clone().or(disk)
    }

    pub fn validate(&self) -> Result<(), SpecError> {
        check_count("batch.size", self.batch.size as u64, 1, MAX_BATCH_SIZE as u64)?;
        self.decode.validate()?;
        if !self.prefetch_is_auto() {
            check_count("prefetch", self.prefetch as u64, 1, MAX_PREFETCH as u64)?;
        }
        if let Some(bytes) = self.prefetch_max_bytes {
            check_count("prefetch_max_bytes", bytes, 1, MAX_CACHE_BYTES)?;
        }
        if let Some(name) = &self.map_batch {
            ops::check_map_name(name, "map_batch")?;
        }
        if self.threads.count().is_some_and(|n| n > MAX_THREADS) {
            return Err(SpecError::new("threads", format!("must be at most {MAX_THREADS} (0: one per core)")));
        }
        if let ShuffleSpec::Buffer { size } = self.shuffle {
            check_count("shuffle.size", size as u64, 1, MAX_SHUFFLE_BUFFER as u64)?;
        }
        if let StorageSpec::Throttled { latency_ms, bandwidth_mb_s, .. } = self.storage {
            if !(0.0..=MAX_LATENCY_MS).contains(&latency_ms) {
                return Err(SpecError::new("storage.latency_ms", format!("must be in [0, {MAX_LATENCY_MS}]")));
            }
            if !(bandwidth_mb_s >= MIN_BANDWIDTH_MB_S && bandwidth_mb_s.is_finite()) {
                return Err(SpecError::new(
                    "storage.bandwidth_mb_s",
                    format!("must be a number >= {MIN_BANDWIDTH_MB_S}"),
                ));
            }
        }
        if let StorageSpec::Throttled { shared_link: Some(name), .. } = &self.storage {
            let ok = (1..=64).contains(&name.len())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !ok {
                return Err(SpecError::new(
                    "storage.shared_link",
                    "must be 1 to 64 letters, digits, `-` or `_` (a name, not a path)",
                ));
            }
        }
        check_count("limits.max_pixels", self.limits.max_pixels, 1, MAX_PIXELS)?;
        check_count("limits.max_file_bytes", self.limits.max_file_bytes, 1, MAX_FILE_BYTES)?;
        check_count("limits.max_boxes", self.limits.max_boxes, 1, MAX_BOXES)?;
        check_count("limits.max_field_bytes", self.limits.max_field_bytes, 1, MAX_FIELD_BYTES)?;
        self.validate_fields()?;
        self.source.validate()?;
        if matches!(self.source, SourceSpec::Mix { .. }) {
            if self.sampling != SamplingSpec::Uniform {
                return Err(SpecError::new(
                    "sampling",
                    "a mixed source is drawn by its weights; it needs uniform sampling",
                ));
            }
            if self.locality.is_some() {
                return Err(SpecError::new("locality", "a mixed source cannot be used with a locality section"));
            }
        }
        ops::validate_ops(&self.ops)?;
        if self.source.has_boxes() {
            self.validate_for_boxes()?;
        }
        if self.batch_bytes().is_none_or(|b| b > MAX_BATCH_BYTES) {
            let (dtype, _, size) = self.output();
            return Err(SpecError::new(
                "batch.size",
                format!(
                    "a batch of {} × {}x{}x3 {dtype:?} is over the {} GiB limit on one batch: use a smaller \
                     batch or output size",
                    self.batch.size,
                    size.height,
                    size.width,
                    MAX_BATCH_BYTES >> 30
                ),
            ));
        }
        if let Some(cache) = &self.cache {
            cache.validate()?;
            // Other samplers steer the cache by this loader's draws and reports, which a
            // loader sharing it would overwrite.
            if cache.share && (self.sampling != SamplingSpec::Uniform || self.locality.is_some()) {
                return Err(SpecError::new(
                    "cache.share",
                    "a cache shared between loaders takes uniform sampling and no locality section: \
                     importance-driven samplers and placements steer the cache by one loader's draws",
                ));
            }
        }
        self.sampling.validate()?;
        if let Some(locality) = &self.locality {
            if self.cache.is_none() {
                return Err(SpecError::new("locality", "needs a `cache` section: it places samples in the caches"));
            }
            locality.validate()?;
        }
        self.importance.validate()
    }

    /// Bytes of a full batch's images (`batch.size × height × width × 3 × dtype size`);
    /// `None` if that does not fit in a `u64`.
    /// `prefetch = "auto"`.
    pub fn prefetch_is_auto(&self) -> bool {
        self.prefetch == PREFETCH_AUTO
    }

    /// Most batches of `batch_bytes` each that may be in flight: the count, or for `auto`
    /// what its memory bound holds (at least one, at most [`MAX_AUTO_PREFETCH`]).
    pub fn prefetch_max_depth(&self, batch_bytes: u64) -> usize {
        if !self.prefetch_is_auto() {
            return self.prefetch;
        }
        let bound = self.prefetch_max_bytes.unwrap_or(DEFAULT_PREFETCH_MAX_BYTES);
        let fits = bound.checked_div(batch_bytes).unwrap_or(u64::MAX);
        usize::try_from(fits).unwrap_or(usize::MAX).clamp(1, MAX_AUTO_PREFETCH)
    }

    pub fn batch_bytes(&self) -> Option<u64> {
        let (dtype, _, size) = self.output();
        [self.batch.size as u64, u64::from(size.height), u64::from(size.width), 3, dtype.size() as u64]
            .into_iter()
            .try_fold(1u64, u64::checked_mul)
    }
}

/// `value` must be in `min..=max`.
fn check_count(field: &str, value: u64, min: u64, max: u64) -> Result<(), SpecError> {
    if value < min {
        return Err(SpecError::new(field, format!("must be at least {min}")));
    }
    if value > max {
        return Err(SpecError::new(field, format!("must be at most {max}; got {value}")));
    }
    Ok(())
}

impl SourceSpec {
    fn validate(&self) -> Result<(), SpecError> {
        match self {
            SourceSpec::Coco { annotations, .. } if annotations.as_os_str().is_empty() => {
                Err(SpecError::new("source.annotations", "must not be empty"))
            }
            SourceSpec::Coco { images, .. } if images.as_os_str().is_empty() => {
                Err(SpecError::new("source.images", "must not be empty"))
            }
            SourceSpec::Sidecar { root, .. } if root.as_os_str().is_empty() => {
                Err(SpecError::new("source.root", "must not be empty"))
            }
            SourceSpec::ImageFolder { root } if root.as_os_str().is_empty() => {
                Err(SpecError::new("source.root", "must not be empty"))
            }
            SourceSpec::FileList { path, .. } if path.as_os_str().is_empty() => {
                Err(SpecError::new("source.path", "must not be empty"))
            }
            SourceSpec::Tar { shards, .. } if shards.is_empty() => {
                Err(SpecError::new("source.shards", "needs at least one shard"))
            }
            SourceSpec::Tar { sidecars: false, masks: true, .. } => {
                Err(SpecError::new("source.masks", "masks are named by the sidecars: set `sidecars = true` too"))
            }
            SourceSpec::Mix { sources } => mix::validate(sources),
            SourceSpec::Parquet { path, .. } if path.as_os_str().is_empty() => {
                Err(SpecError::new("source.path", "must not be empty"))
            }
            SourceSpec::Parquet { image_column, .. } if image_column.is_empty() => {
                Err(SpecError::new("source.image_column", "must not be empty"))
            }
            _ => Ok(()),
        }
    }

    /// Makes relative paths relative to `dir` (the spec file's folder).
    pub fn resolve_relative(&mut self, dir: &Path) {
        let fix = |p: &mut PathBuf| {
            if p.is_relative() && !is_url(p) {
                *p = dir.join(&*p);
            }
        };
        match self {
            SourceSpec::ImageFolder { root } => fix(root),
            SourceSpec::FileList { path, root } => {
                fix(path);
                if let Some(r) = root {
                    fix(r);
                }
            }
            SourceSpec::Tar { shards, .. } => shards.iter_mut().for_each(fix),
            SourceSpec::Mix { sources } => sources.iter_mut().for_each(|s| s.source.resolve_relative(dir)),
            SourceSpec::Parquet { path, .. } => fix(path),
            SourceSpec::Coco { annotations, images, .. } => {
                fix(annotations);
                fix(images);
            }
            SourceSpec::Sidecar { root, .. } => fix(root),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOML: &str = r#"
seed = 7
prefetch = 2
on_error = "skip"

[source]
kind = "image_folder"
root = "/data/train"

[[ops]]
op = "decode"

[[ops]]
op = "random_resized_crop"
size = 224

[[ops]]
op = "random_horizontal_flip"

[[ops]]
op = "normalize"
mean = [0.485, 0.456, 0.406]
std = [0.229, 0.224, 0.225]

[[ops]]
op = "layout"
order = "chw"

[batch]
size = 32
"#;

    #[test]
    fn prefetch_auto_round_trips_and_its_memory_bound_sizes_the_most_in_flight() {
        let auto = TOML.replace("prefetch = 2", "prefetch = \"auto\"\nprefetch_max_bytes = 1000");
        let spec = PipelineSpec::from_toml_str(&auto).unwrap();
        assert!(spec.prefetch_is_auto() && spec.validate().is_ok());
        let json = spec.to_json_string().unwrap();
        assert!(json.contains(r#""prefetch": "auto""#), "{json}");
        assert_eq!(PipelineSpec::from_json_str(&json).unwrap(), spec);
        assert_eq!(spec.prefetch_max_depth(300), 3, "1000 bytes hold three batches of 300");
        assert_eq!(spec.prefetch_max_depth(5000), 1, "one batch is always in flight");
        assert_eq!(spec.prefetch_max_depth(1), MAX_AUTO_PREFETCH);
        let fixed = PipelineSpec::from_toml_str(TOML).unwrap();
        assert_eq!((fixed.prefetch_is_auto(), fixed.prefetch_max_depth(1)), (false, 2));
        assert!(!fixed.to_json_string().unwrap().contains("prefetch_max_bytes"), "absent unless set");
        for bad in ["prefetch = 0", "prefetch = \"many\"", "prefetch = -1"] {
            let e = PipelineSpec::from_toml_str(&TOML.replace("prefetch = 2", bad));
            assert!(e.is_err(), "{bad} is refused");
        }
    }

    #[test]
    fn toml_parses_with_defaults_and_round_trips_through_json_and_toml() {
        let spec = PipelineSpec::from_toml_str(TOML).unwrap();
        assert_eq!(spec.seed, 7);
        assert_eq!(spec.shuffle, ShuffleSpec::Global);
        assert_eq!(spec.on_error, ErrorPolicy::Skip);
        assert_eq!(spec.ops[1], OpSpec::random_resized_crop(Size::square(224), [0.08, 1.0], [0.75, 4.0 / 3.0]));
        assert_eq!(spec.output(), (DType::F32, Layout::Chw, Size::square(224)));
        assert_eq!(spec.first_random_op(), Some(1));
        let json = spec.to_json_string().unwrap();
        assert_eq!(PipelineSpec::from_json_str(&json).unwrap(), spec);
        let toml = spec.to_toml_string().unwrap();
        assert_eq!(PipelineSpec::from_toml_str(&toml).unwrap(), spec);
    }

    #[test]
    fn cache_and_sampling_parse_round_trip_and_validate_with_field_names() {
        let src = format!(
            "{TOML}\n[cache]\nbudget = \"8GiB\"\nlevel = \"resized\"\nresize = 64\npolicy = \"shade\"\n\n\
             [sampling]\nkind = \"importance\"\ncoverage_epochs = 5\n"
        );
        let spec = PipelineSpec::from_toml_str(&src).unwrap();
        let cache = spec.cache.clone().unwrap();
        assert_eq!(cache.budget, ByteBudget::Bytes(8 << 30));
        assert_eq!((cache.level, cache.resize, cache.policy), (CacheLevel::Resized, Some(64), CachePolicyKind::Shade));
        assert_eq!(
            spec.sampling,
            SamplingSpec::Importance { floor: 0.05, coverage_epochs: 5, miss_discount: 0.1, max_draws: 4.0 }
        );
        assert_eq!(PipelineSpec::from_toml_str(&spec.to_toml_string().unwrap()).unwrap(), spec);
        assert_eq!(PipelineSpec::from_json_str(&spec.to_json_string().unwrap()).unwrap(), spec);

        assert_eq!(ByteBudget::parse("25%").unwrap(), ByteBudget::RamFraction(0.25));
        assert_eq!(ByteBudget::parse("512MB").unwrap(), ByteBudget::Bytes(512_000_000));
        assert_eq!(ByteBudget::parse("0.5").unwrap(), ByteBudget::RamFraction(0.5));
        assert_eq!(ByteBudget::RamFraction(0.5).resolve(1000), 500);
        assert!(ByteBudget::parse("8 parsecs").is_err());

        assert_eq!(err_of(&src.replace("resize = 64\n", "")).field, "cache.level");
        assert_eq!(err_of(&src.replace("\"8GiB\"", "\"150%\"")).field, "cache.budget");
        assert_eq!(
            err_of(&src.replace("coverage_epochs = 5", "coverage_epochs = 0")).field,
            "sampling.coverage_epochs"
        );
        assert_eq!(err_of(&src.replace("coverage_epochs = 5", "floor = 0.0")).field, "sampling.floor");
    }

    #[test]
    fn a_disk_cache_tier_parses_resolves_relative_to_the_spec_and_refuses_absurd_budgets() {
        let src = format!("{TOML}\n[cache]\nbudget = \"1GiB\"\ndisk = {{ dir = \"tier\", budget = \"50GiB\" }}\n");
        let spec = PipelineSpec::from_toml_str(&src).unwrap();
        let disk = spec.cache.clone().unwrap().disk.unwrap();
        assert_eq!((disk.budget, disk.policy), (ByteBudget::Bytes(50 << 30), DiskPolicyKind::Belady));
        assert_eq!(PipelineSpec::from_json_str(&spec.to_json_string().unwrap()).unwrap(), spec);
        let lru = PipelineSpec::from_toml_str(&src.replace("\" }", "\", policy = \"lru\" }")).unwrap();
        assert_eq!(lru.cache.unwrap().disk.unwrap().policy, DiskPolicyKind::Lru);

        let dir = std::env::temp_dir().join(format!("sluice-disk-spec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("spec.toml");
        std::fs::write(&file, &src).unwrap();
        let from_file = PipelineSpec::from_path(&file);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(from_file.unwrap().cache.unwrap().disk.unwrap().dir, dir.join("tier"));

        for (budget, why) in [
            ("\"25%\"", "fraction of RAM"),
            ("0", "at least 4096"),
            ("100", "at least 4096"),
            ("\"2PiB\"", "unknown unit"),
            ("\"2000TiB\"", "at most 1 PiB"),
        ] {
            let bad = src.replace("\"50GiB\"", budget);
            let msg = match PipelineSpec::from_toml_str(&bad) {
                Err(e) => format!("{}: {}", e.field, e),
                Ok(_) => panic!("{budget}: accepted"),
            };
            assert!(msg.contains("cache.disk.budget") || msg.contains("budget"), "{budget}: {msg}");
            assert!(msg.contains(why), "{budget}: {msg}");
        }
        assert_eq!(err_of(&src.replace("dir = \"tier\"", "dir = \"\"")).field, "cache.disk.dir");
        assert!(PipelineSpec::from_toml_str(&src.replace("}", ", size = 3 }")).is_err(), "unknown fields refused");
    }

    #[test]
    fn rectangular_size_round_trips() {
        let mut spec = PipelineSpec::train_default(SourceSpec::ImageFolder { root: "/d".into() }, 224, 8);
        spec.ops[1] = OpSpec::CenterCrop { size: Size { height: 100, width: 50 } };
        let json = spec.to_json_string().unwrap();
        assert!(json.contains("100"), "{json}");
        assert_eq!(PipelineSpec::from_json_str(&json).unwrap(), spec);
    }

    fn err_of(toml_src: &str) -> SpecError {
        PipelineSpec::from_toml_str(toml_src).unwrap_err()
    }

    #[test]
    fn errors_name_the_offending_field() {
        let e = err_of(&TOML.replace("size = 224", "size = \"big\""));
        // Ops are internally tagged, so serde reports the op; the message says what is wrong.
        assert_eq!(e.field, "ops[1]", "{e}");
        assert!(e.message.contains("side length or [height, width]"), "{e}");
        let e = err_of(&TOML.replace("size = 32", "size = 0"));
        assert_eq!(e.field, "batch.size");
        let e = err_of(&TOML.replace("op = \"random_horizontal_flip\"", "op = \"twirl\""));
        assert_eq!(e.field, "ops[2].op", "{e}");
        assert!(e.message.contains("random_resized_crop"), "{e}");
        let e = err_of(&TOML.replace("seed = 7", "seed = 7\nthreadz = 3"));
        assert!(e.message.contains("threadz"), "{e}");
        let e = err_of(&TOML.replace("std = [0.229, 0.224, 0.225]", "std = [0.229, 0.0, 0.225]"));
        assert_eq!(e.field, "ops[3].std");
        let e = err_of(&TOML.replace("kind = \"image_folder\"", "kind = \"ftp\""));
        assert!(e.field.starts_with("source"), "{e}");
    }

    #[test]
    fn tar_sidecars_and_masks_parse_round_trip_and_masks_need_sidecars() {
        let src =
            TOML.replace("kind = \"image_folder\"\nroot = \"/data/train\"", "kind = \"tar\"\nshards = [\"/d/a.tar\"]");
        let plain = PipelineSpec::from_toml_str(&src).unwrap();
        assert!(!plain.source.has_boxes() && !plain.source.has_masks());
        let with = src.replace("shards = [", "sidecars = true\nmasks = true\nshards = [");
        let spec = PipelineSpec::from_toml_str(&with).unwrap();
        let want = SourceSpec::Tar { shards: vec!["/d/a.tar".into()], sidecars: true, masks: true };
        assert_eq!(spec.source, want);
        assert!(spec.source.has_boxes() && spec.source.has_masks());
        assert_eq!(PipelineSpec::from_toml_str(&spec.to_toml_string().unwrap()).unwrap(), spec);
        let e = PipelineSpec::from_toml_str(&src.replace("shards = [", "masks = true\nshards = [")).unwrap_err();
        assert_eq!(e.field, "source.masks", "{e}");
    }

    #[test]
    fn masks_are_accepted_with_a_cache_and_with_map() {
        let source = SourceSpec::Tar { shards: vec!["a.tar".into()], sidecars: true, masks: true };
        let mut spec = PipelineSpec::train_default(source, 224, 8);
        spec.cache = Some(CacheSpec {
            budget: ByteBudget::Bytes(1 << 20),
            level: CacheLevel::Resized,
            resize: Some(256),
            policy: CachePolicyKind::Lru,
            disk: None,
            share: false,
        });
        spec.validate().unwrap();
        // A `map` op gets the mask with the image (docs/map.md, "Masks").
        spec.ops.insert(1, OpSpec::map("aug:blur"));
        spec.validate().unwrap();
    }

    #[test]
    fn augmentation_policies_are_refused_with_boxes_by_their_op_as_torchvision_refuses_them() {
        for name in ["trivial_augment_wide", "rand_augment", "auto_augment", "augmix"] {
            let policy: OpSpec = serde_json::from_str(&format!(r#"{{"op": "{name}"}}"#)).unwrap();
            let mut spec = PipelineSpec::train_default(
                SourceSpec::Tar { shards: vec!["a.tar".into()], sidecars: false, masks: false },
                224,
                8,
            );
            spec.ops.insert(1, policy);
            assert!(spec.validate().is_ok(), "{name} without boxes");
            spec.source = SourceSpec::Tar { shards: vec!["a.tar".into()], sidecars: true, masks: false };
            let Err(e) = spec.validate() else { panic!("{name}: accepted on a source with boxes") };
            assert_eq!(e.field, "ops[1]", "{name}: {e}");
            assert!(e.message.contains(name) && e.message.contains("boxes"), "{name}: {e}");
        }
    }

    #[test]
    fn op_order_and_fixed_size_are_enforced() {
        let src = SourceSpec::ImageFolder { root: "/d".into() };
        let mut spec = PipelineSpec::train_default(src, 224, 8);
        spec.ops.swap(0, 1);
        assert_eq!(spec.validate().unwrap_err().field, "ops[0]");

        let mut spec = PipelineSpec::train_default(
            SourceSpec::Tar { shards: vec!["a.tar".into()], sidecars: false, masks: false },
            224,
            8,
        );
        spec.ops = vec![OpSpec::Decode, OpSpec::resize(256)];
        assert_eq!(spec.validate().unwrap_err().field, "ops");

        spec.ops = vec![
            OpSpec::Decode,
            OpSpec::CenterCrop { size: Size::square(8) },
            OpSpec::Dtype { dtype: DType::F32 },
            OpSpec::Normalize { mean: [0.0; 3], std: [1.0; 3] },
        ];
        assert_eq!(spec.validate().unwrap_err().field, "ops[3]");

        spec.ops =
            vec![OpSpec::Decode, OpSpec::Layout { order: Layout::Chw }, OpSpec::CenterCrop { size: Size::square(8) }];
        assert_eq!(spec.validate().unwrap_err().field, "ops[2]");
    }

    #[test]
    fn map_batch_names_an_importable_function_and_round_trips() {
        let mut spec = cropped(Size::square(32), 4);
        let plain = serde_json::to_string(&spec).unwrap();
        assert!(!plain.contains("map_batch"), "absent unless set: {plain}");
        spec.map_batch = Some("my_pkg.aug:mix".into());
        assert!(spec.validate().is_ok());
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(PipelineSpec::from_json_str(&json).unwrap(), spec);
        for bad in ["tests:<lambda>", "tests:outer.<locals>.inner", "no_colon", ""] {
            spec.map_batch = Some(bad.into());
            let e = spec.validate().unwrap_err();
            assert_eq!(e.field, "map_batch", "{bad}: {e}");
        }
    }

    fn cropped(size: Size, batch: usize) -> PipelineSpec {
        let mut spec = PipelineSpec::train_default(SourceSpec::ImageFolder { root: "/d".into() }, 224, batch);
        spec.ops[1] = OpSpec::CenterCrop { size };
        spec
    }

    #[test]
    fn a_sleep_op_parses_and_its_cost_is_bounded() {
        let mut spec = cropped(Size::square(32), 4);
        spec.ops.push(serde_json::from_str(r#"{"op": "sleep", "us": 250}"#).unwrap());
        let last = spec.ops.len() - 1;
        assert_eq!(spec.ops[last], OpSpec::Sleep { us: 250 });
        assert!(spec.validate().is_ok());
        spec.ops[last] = OpSpec::Sleep { us: MAX_SLEEP_US + 1 };
        let e = spec.validate().unwrap_err();
        assert_eq!(e.field, format!("ops[{last}].us"), "{e}");
        assert!(!spec.ops[last].is_random(), "a sleep does not stop the cache seam's determinism");
    }

    #[test]
    fn output_sizes_are_bounded_and_the_error_names_the_field() {
        // Before: this passed validation, and 2 × h × w × 3 wrapped to 4 GiB in release
        // builds, so each slot was far larger than the batch buffer and workers wrote past it.
        let hostile = cropped(Size { height: 4_294_967_295, width: 715_827_883 }, 2);
        let e = hostile.validate().unwrap_err();
        assert_eq!(e.field, "ops[1].size", "{e}");
        assert!(e.message.contains("65535"), "{e}");
        assert!(cropped(Size { height: 65_535, width: 1 }, 1).validate().is_ok());
        assert_eq!(cropped(Size { height: 1, width: 65_536 }, 1).validate().unwrap_err().field, "ops[1].size");

        let mut spec = cropped(Size::square(224), 8);
        spec.ops.insert(1, OpSpec::resize(70_000));
        assert_eq!(spec.validate().unwrap_err().field, "ops[1].size");
        let mut spec = cropped(Size::square(224), 8);
        spec.ops[1] = OpSpec::random_resized_crop(Size::square(100_000), [0.5, 1.0], [1.0, 1.0]);
        assert_eq!(spec.validate().unwrap_err().field, "ops[1].size");
        let mut spec = cropped(Size::square(224), 8);
        spec.cache = Some(CacheSpec {
            budget: ByteBudget::Bytes(1 << 30),
            level: CacheLevel::Auto,
            resize: Some(1 << 20),
            policy: CachePolicyKind::Lru,
            disk: None,
            share: false,
        });
        assert_eq!(spec.validate().unwrap_err().field, "cache.resize");

        // Every side in range, but the batch is too large to hold: refused with the sizes.
        let mut spec = cropped(Size::square(65_535), 64);
        spec.ops.push(OpSpec::Dtype { dtype: DType::F32 });
        let e = spec.validate().unwrap_err();
        assert_eq!(e.field, "batch.size", "{e}");
        assert!(e.message.contains("GiB"), "{e}");
        let mut spec = cropped(Size::square(224), 4096);
        spec.ops.push(OpSpec::Normalize { mean: [0.5; 3], std: [0.5; 3] });
        assert!(spec.validate().is_ok(), "a large real batch (4096 × 224² f32, 2.5 GB) stays valid");
        assert_eq!(spec.batch_bytes(), Some(4096 * 224 * 224 * 3 * 4));
    }

    #[test]
    fn resource_fields_are_bounded_and_the_error_names_the_field() {
        let base = || cropped(Size::square(224), 8);
        let field_of = |edit: &dyn Fn(&mut PipelineSpec)| {
            let mut spec = base();
            edit(&mut spec);
            spec.validate().map(|()| String::new()).unwrap_or_else(|e| e.field)
        };
        assert_eq!(field_of(&|_| {}), "");
        assert_eq!(field_of(&|s| s.threads = 1024.into()), "");
        assert_eq!(field_of(&|s| s.threads = 1025.into()), "threads");
        assert_eq!(field_of(&|s| s.threads = usize::MAX.into()), "threads");
        assert_eq!(field_of(&|s| s.prefetch = 1024), "");
        assert_eq!(field_of(&|s| s.prefetch = usize::MAX), "prefetch");
        assert_eq!(field_of(&|s| s.batch.size = usize::MAX), "batch.size");
        assert_eq!(field_of(&|s| s.shuffle = ShuffleSpec::Buffer { size: usize::MAX }), "shuffle.size");
        assert_eq!(field_of(&|s| s.shuffle = ShuffleSpec::Buffer { size: 1 << 20 }), "");
        assert_eq!(field_of(&|s| s.limits.max_pixels = u64::MAX), "limits.max_pixels");
        assert_eq!(field_of(&|s| s.limits.max_file_bytes = u64::MAX), "limits.max_file_bytes");
        assert_eq!(field_of(&|s| s.ops.resize(1000, OpSpec::RandomHorizontalFlip { p: 0.5 })), "ops");
        let throttled =
            |latency_ms, bandwidth_mb_s| StorageSpec::Throttled { latency_ms, bandwidth_mb_s, shared_link: None };
        assert_eq!(field_of(&|s| s.storage = throttled(1e300, 100.0)), "storage.latency_ms");
        assert_eq!(field_of(&|s| s.storage = throttled(5.0, 1e-300)), "storage.bandwidth_mb_s");
        let cache = |budget| CacheSpec {
            budget,
            level: CacheLevel::Auto,
            resize: None,
            policy: CachePolicyKind::Lru,
            disk: None,
            share: false,
        };
        assert_eq!(field_of(&|s| s.cache = Some(cache(ByteBudget::Bytes(u64::MAX)))), "cache.budget");
        assert_eq!(field_of(&|s| s.cache = Some(cache(ByteBudget::Bytes(64 << 30)))), "");

        // The budget parser refuses what does not fit instead of saturating to u64::MAX.
        assert!(ByteBudget::parse("99999999999999999999999TiB").is_err());
        let src = format!("{TOML}\n[cache]\nbudget = \"99999999999999999999TB\"\n");
        assert_eq!(err_of(&src).field, "cache.budget");
        let e = err_of(&TOML.replace("seed = 7", "seed = 7\nthreads = 100000"));
        assert_eq!(e.field, "threads", "{e}");
        assert!(e.message.contains("1024"), "{e}");
    }

    #[test]
    fn from_path_resolves_relative_roots_and_rejects_unknown_extensions() {
        let dir = std::env::temp_dir().join(format!("sluice-spec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("spec.toml");
        std::fs::write(&p, TOML.replace("/data/train", "train")).unwrap();
        let spec = PipelineSpec::from_path(&p).unwrap();
        assert_eq!(spec.source, SourceSpec::ImageFolder { root: dir.join("train") });
        let bad = dir.join("spec.yaml");
        std::fs::write(&bad, "x").unwrap();
        assert!(PipelineSpec::from_path(&bad).unwrap_err().message.contains(".toml or .json"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
