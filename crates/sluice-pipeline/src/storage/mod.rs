//! Storage reads a sample's bytes given its [`Location`]. Sources say *what* the samples
//! are; storage says how their bytes are fetched: local positional reads, or the same
//! behind an emulated network link to study loaders under slow storage; object URLs
//! (`s3://`, `az://`, `gs://`, `http(s)://`) are read from object storage ([`object`]).

pub mod confine;
pub mod local;
pub mod object;
pub mod parquet;
mod profile;
mod read_ahead;
pub mod row_groups;
pub mod throttled;
mod url;

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::{LocationRef, SampleErrorKind, StorageSpec};

pub use confine::{RootError, Roots};
pub use local::LocalStorage;
pub use object::{any_remote, ObjectAware, ObjectUrl};
pub use parquet::ParquetError;
pub use read_ahead::ReadAheadStats;
pub use row_groups::RowGroupCache;
pub use throttled::{LinkError, ThrottledStorage};

/// Reads whole samples into caller-owned buffers. Shared by all worker threads.
pub trait Storage: Send + Sync {
    /// Replaces the contents of `buf` with the bytes at `loc` (relative to `root` unless
    /// absolute). `buf` keeps its allocation: a read that fits its capacity allocates
    /// nothing. Samples over `max` bytes are rejected before they are read.
    fn read(&self, root: &Path, loc: LocationRef<'_>, max: u64, buf: &mut Vec<u8>) -> Result<(), SampleErrorKind>;

    /// A short name for logs and metrics.
    fn name(&self) -> &str;

    /// Names reads the loader will ask for soon, in order, each with its size as
    /// enumerated: a storage whose reads wait on a network (object storage) starts them now
    /// ([`read_ahead`]). Nothing by default.
    fn read_ahead(&self, _root: &Path, _wanted: &[(LocationRef<'_>, u64)], _max_bytes: u64) {}

    /// The read-ahead's counters, for a storage that reads ahead.
    fn read_ahead_stats(&self) -> Option<ReadAheadStats> {
        None
    }
}

/// The storage a spec asks for.
pub fn open_storage(spec: &StorageSpec) -> Result<Arc<dyn Storage>, LinkError> {
    open_storage_in(spec, None)
}

/// The storage a spec asks for, reading only beneath `roots` when given.
pub fn open_storage_in(spec: &StorageSpec, roots: Option<Arc<Roots>>) -> Result<Arc<dyn Storage>, LinkError> {
    let local = match &roots {
        Some(roots) => LocalStorage::confined(Arc::clone(roots)),
        None => LocalStorage::new(),
    };
    // Object URLs (`s3://`, `az://`, `gs://`, `http(s)://`) go to object storage, everything
    // else to local files.
    let local = ObjectAware::new(Arc::new(local), roots);
    Ok(match spec {
        StorageSpec::Local => Arc::new(local),
        StorageSpec::Throttled { latency_ms, bandwidth_mb_s, shared_link } => {
            let latency = Duration::try_from_secs_f64(latency_ms / 1e3).unwrap_or(Duration::ZERO);
            let bandwidth = bandwidth_mb_s * 1e6;
            match shared_link {
                Some(name) => {
                    let path = throttled::link_path(name);
                    Arc::new(ThrottledStorage::shared(Arc::new(local), latency, bandwidth, &path)?)
                }
                None => Arc::new(ThrottledStorage::new(Arc::new(local), latency, bandwidth)),
            }
        }
    })
}

/// Rejects a sample by its size alone: empty, or over the configured limit.
pub(crate) fn check_size(len: u64, max_bytes: u64) -> Result<(), SampleErrorKind> {
    if len == 0 {
        return Err(SampleErrorKind::Empty);
    }
    if len > max_bytes {
        return Err(SampleErrorKind::Io(format!(
            "sample is {len} bytes, over the limit of {max_bytes} (limits.max_file_bytes); not read"
        )));
    }
    Ok(())
}

pub(crate) fn io_error(e: io::Error) -> SampleErrorKind {
    match e.kind() {
        io::ErrorKind::NotFound => SampleErrorKind::Missing,
        _ => SampleErrorKind::Io(e.to_string()),
    }
}
