//! Packing a dataset for fast random crops: a copy of a directory tree in which every JPEG is
//! rewritten losslessly with restart markers (`sluice_codec::add_restart_markers`), so the
//! decoder can cut a crop's MCUs out of the file instead of entropy-decoding everything
//! above and beside it. Pixels do not change; other files are copied as they are, and so is
//! a JPEG that cannot be rewritten (corrupt, 12-bit, lossless...): it is listed in the
//! summary, and the loader's `on_error` policy decides about it later, as it would have.
//!
//! [`index_dataset`] gets most of that without a copy: it writes the entropy index of
//! every JPEG into a folder the loader reads them from (`decode.index_dir`), so the first
//! epoch is as fast as the next ones.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use sluice_codec::{add_restart_markers, IndexStore};

#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("dataset {0} not found")]
    NotFound(PathBuf),
    #[error("the output {out} lies inside the dataset {src}")]
    OutputInsideSource { src: PathBuf, out: PathBuf },
    #[error("cannot {action} {path}: {source}")]
    Io { action: &'static str, path: PathBuf, source: std::io::Error },
}

impl PackError {
    /// The file or directory the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Self::NotFound(p) | Self::Io { path: p, .. } => p,
            Self::OutputInsideSource { out, .. } => out,
        }
    }
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> PackError + 'a {
    move |source| PackError::Io { action, path: path.to_path_buf(), source }
}

#[derive(Debug, Clone)]
pub struct PackOptions {
    /// MCUs per restart interval (lowered per image to divide its MCU row). Smaller
    /// intervals let crops skip more; each marker costs ~2.5 bytes.
    pub interval: u32,
    /// Worker threads; 0 = one per core.
    pub threads: usize,
    /// Images declaring more pixels are copied unchanged, not rewritten.
    pub max_pixels: u64,
}

impl Default for PackOptions {
    fn default() -> Self {
        Self { interval: 2, threads: 0, max_pixels: sluice_core::spec::Limits::default().max_pixels }
    }
}

#[derive(Debug, Clone, Default)]
pub struct PackSummary {
    /// JPEGs rewritten with restart markers.
    pub packed: usize,
    /// Other files, copied as they are.
    pub copied: usize,
    /// JPEGs copied unchanged because they could not be rewritten, with the reason.
    pub not_packed: Vec<(PathBuf, String)>,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

fn is_jpeg(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("jpg") || e.eq_ignore_ascii_case("jpeg"))
}

/// Every file under `dir`, relative to it, sorted (symlinks followed).
fn files(dir: &Path) -> Result<Vec<PathBuf>, PackError> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let abs = dir.join(&rel);
        for entry in std::fs::read_dir(&abs).map_err(io("read", &abs))? {
            let entry = entry.map_err(io("read", &abs))?;
            let path = rel.join(entry.file_name());
            if std::fs::metadata(entry.path()).map_err(io("read", &entry.path()))?.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Copies the tree `src` to `out` (created), packing every JPEG. `progress(done, total)` is
/// called after each file.
pub fn pack_dataset(
    src: &Path,
    out: &Path,
    o: &PackOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<PackSummary, PackError> {
    let src = src.canonicalize().map_err(|_| PackError::NotFound(src.to_path_buf()))?;
    std::fs::create_dir_all(out).map_err(io("create", out))?;
    let out = out.canonicalize().map_err(io("open", out))?;
    if out.starts_with(&src) {
        return Err(PackError::OutputInsideSource { src, out });
    }
    let all = files(&src)?;
    let threads = match o.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let (bytes_in, bytes_out, packed) = (AtomicU64::new(0), AtomicU64::new(0), AtomicUsize::new(0));
    let not_packed = Mutex::new(Vec::new());
    let work = || -> Result<(), PackError> {
        while let Some(rel) = all.get(next.fetch_add(1, Ordering::Relaxed)) {
            let (from, to) = (src.join(rel), out.join(rel));
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent).map_err(io("create", parent))?;
            }
            let data = std::fs::read(&from).map_err(io("read", &from))?;
            let rewritten = if is_jpeg(rel) {
                match add_restart_markers(&data, o.interval, o.max_pixels) {
                    Ok(jpg) => Some(jpg),
                    Err(e) => {
                        not_packed.lock().push((from.clone(), e.to_string()));
                        None
                    }
                }
            } else {
                None
            };
            let written = rewritten.as_deref().unwrap_or(&data);
            std::fs::write(&to, written).map_err(io("write", &to))?;
            if rewritten.is_some() {
                packed.fetch_add(1, Ordering::Relaxed);
            }
            bytes_in.fetch_add(data.len() as u64, Ordering::Relaxed);
            bytes_out.fetch_add(written.len() as u64, Ordering::Relaxed);
            progress(done.fetch_add(1, Ordering::Relaxed) + 1, all.len());
        }
        Ok(())
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1)).map(|_| s.spawn(work)).collect();
        // A panicking thread re-panics here: it is a bug, not a data error.
        handles.into_iter().try_for_each(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })?;
    let mut not_packed = not_packed.into_inner();
    not_packed.sort();
    Ok(PackSummary {
        packed: packed.into_inner(),
        copied: all.iter().filter(|p| !is_jpeg(p)).count(),
        not_packed,
        bytes_in: bytes_in.into_inner(),
        bytes_out: bytes_out.into_inner(),
    })
}

/// What [`index_dataset`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexSummary {
    /// JPEGs indexed now, and ones whose index was already in the folder.
    pub indexed: usize,
    pub already: usize,
    /// JPEGs the index cannot serve (progressive, arithmetic-coded, damaged...): they
    /// decode the ordinary way.
    pub unservable: Vec<PathBuf>,
    /// Bytes of the JPEGs, and of their indexes in the folder.
    pub bytes_in: u64,
    pub index_bytes: u64,
}

/// Writes the entropy index of every JPEG under `src` into `out` (created), a point every
/// `spacing` MCUs, on `threads` threads (0: one per core). `progress(done, total)` is
/// called after each file.
pub fn index_dataset(
    src: &Path,
    out: &Path,
    spacing: u32,
    threads: usize,
    max_pixels: u64,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<IndexSummary, PackError> {
    let src = src.canonicalize().map_err(|_| PackError::NotFound(src.to_path_buf()))?;
    std::fs::create_dir_all(out).map_err(io("create", out))?;
    let jpegs: Vec<PathBuf> = files(&src)?.into_iter().filter(|p| is_jpeg(p)).collect();
    let store = IndexStore::new(spacing, 0).with_dir(Some(out.to_path_buf()));
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let (next, done) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let (bytes_in, index_bytes, indexed) = (AtomicU64::new(0), AtomicU64::new(0), AtomicUsize::new(0));
    let unservable = Mutex::new(Vec::new());
    let work = || -> Result<(), PackError> {
        while let Some(rel) = jpegs.get(next.fetch_add(1, Ordering::Relaxed)) {
            let from = src.join(rel);
            let data = std::fs::read(&from).map_err(io("read", &from))?;
            if store.index_to_dir(&data, max_pixels).map_err(io("write an index into", out))? {
                indexed.fetch_add(1, Ordering::Relaxed);
                let stored = IndexStore::path_in(out, IndexStore::fingerprint(&data));
                index_bytes.fetch_add(std::fs::metadata(&stored).map_or(0, |m| m.len()), Ordering::Relaxed);
            } else {
                unservable.lock().push(from);
            }
            bytes_in.fetch_add(data.len() as u64, Ordering::Relaxed);
            progress(done.fetch_add(1, Ordering::Relaxed) + 1, jpegs.len());
        }
        Ok(())
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1)).map(|_| s.spawn(work)).collect();
        handles.into_iter().try_for_each(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })?;
    let already = store.stats().loaded as usize;
    let mut unservable = unservable.into_inner();
    unservable.sort();
    Ok(IndexSummary {
        indexed: indexed.into_inner() - already,
        already,
        unservable,
        bytes_in: bytes_in.into_inner(),
        index_bytes: index_bytes.into_inner(),
    })
}
