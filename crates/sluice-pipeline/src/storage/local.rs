//! Local files. Whole files: open, fstat, one read into a buffer sized by the metadata.
//! Tar members: positional reads (`pread`) on one cached handle per shard; `pread` does
//! not move a shared cursor, so all threads read through the same handle. Files are opened
//! through [`open_regular`]: regular files only, beneath the allowed roots if any.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use sluice_core::{LocationRef, SampleErrorKind};

use super::confine::{open_regular, Roots};
use super::{check_size, io_error, Storage};

/// Shard handles kept open by default; beyond this, one is closed to stay far from the
/// process's file-descriptor limit (often 1024).
pub const DEFAULT_MAX_OPEN_SHARDS: usize = 256;

#[derive(Debug)]
pub struct LocalStorage {
    shards: Mutex<HashMap<PathBuf, Arc<File>>>,
    max_open_shards: usize,
    /// Where reads are confined to; `None`: anywhere.
    roots: Option<Arc<Roots>>,
}

impl Default for LocalStorage {
    fn default() -> Self {
        Self::new()
    }
}

impl LocalStorage {
    pub fn new() -> Self {
        Self::with_max_open_shards(DEFAULT_MAX_OPEN_SHARDS)
    }

    /// Keeps at most `max` shard files open (at least 1).
    pub fn with_max_open_shards(max: usize) -> Self {
        Self { shards: Mutex::new(HashMap::new()), max_open_shards: max.max(1), roots: None }
    }

    /// Reads only files beneath `roots`, however the paths resolve when they are read.
    pub fn confined(roots: Arc<Roots>) -> Self {
        Self { roots: Some(roots), ..Self::new() }
    }

    /// Shard files currently held open.
    pub fn open_shards(&self) -> usize {
        self.shards.lock().len()
    }

    fn read_file(&self, path: &Path, max_bytes: u64, buf: &mut Vec<u8>) -> Result<(), SampleErrorKind> {
        let mut file = open_regular(path, self.roots.as_deref())?;
        let len = file.metadata().map_err(io_error)?.len();
        check_size(len, max_bytes)?;
        fill(buf, len, |b| file.read_exact(b)).map_err(|e| short_read(e, len, "the file shrank while being read"))
    }

    fn read_member(
        &self,
        shard: &Path,
        offset: u64,
        len: u64,
        max_bytes: u64,
        buf: &mut Vec<u8>,
    ) -> Result<(), SampleErrorKind> {
        check_size(len, max_bytes)?;
        let file = self.shard(shard)?;
        fill(buf, len, |b| file.read_exact_at(b, offset))
            .map_err(|e| short_read(e, len, &format!("the shard ends before offset {offset} + {len}: truncated?")))
    }

    /// The cached handle of `path`, opened on first use.
    fn shard(&self, path: &Path) -> Result<Arc<File>, SampleErrorKind> {
        // The map is only a cache: a panic elsewhere cannot leave it inconsistent.
        let mut shards = self.shards.lock();
        if let Some(file) = shards.get(path) {
            return Ok(Arc::clone(file));
        }
        let file = Arc::new(open_regular(path, self.roots.as_deref())?);
        if shards.len() >= self.max_open_shards {
            // Readers holding the evicted handle keep it alive until they finish.
            if let Some(victim) = shards.keys().next().cloned() {
                shards.remove(&victim);
            }
        }
        shards.insert(path.to_path_buf(), Arc::clone(&file));
        Ok(file)
    }
}

impl Storage for LocalStorage {
    fn read(&self, root: &Path, loc: LocationRef<'_>, max: u64, buf: &mut Vec<u8>) -> Result<(), SampleErrorKind> {
        match loc {
            LocationRef::File { path } => self.read_file(&root.join(path), max, buf),
            LocationRef::TarMember { shard, offset, len, .. } => {
                self.read_member(&root.join(shard), offset, len, max, buf)
            }
            LocationRef::ParquetRow { .. } => Err(SampleErrorKind::Refused(
                "Parquet rows are read through the storage `open_storage` makes, not LocalStorage alone".into(),
            )),
        }
    }

    fn name(&self) -> &str {
        "local"
    }
}

/// Resizes `buf` to `len` (reusing its allocation) and fills it with one read. Zeroing
/// the buffer first costs far less than the extra system calls of growing reads.
fn fill(buf: &mut Vec<u8>, len: u64, read: impl FnOnce(&mut [u8]) -> io::Result<()>) -> Result<(), io::Error> {
    buf.clear();
    let want = usize::try_from(len).map_err(|_| io::Error::other(format!("{len} bytes do not fit in memory")))?;
    buf.try_reserve_exact(want).map_err(|e| io::Error::other(format!("cannot allocate {len} bytes: {e}")))?;
    buf.resize(want, 0);
    read(buf).inspect_err(|_| buf.clear())
}

fn short_read(e: io::Error, len: u64, why: &str) -> SampleErrorKind {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        SampleErrorKind::Io(format!("short read: fewer than the expected {len} bytes ({why})"))
    } else {
        io_error(e)
    }
}
