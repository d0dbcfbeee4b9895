//! `sluice pack`: copy a dataset, rewriting every JPEG losslessly with restart markers so
//! that random crops decode only the MCUs they cover (see `sluice_codec::transcode`). The
//! pixels do not change. Other files are copied as they are, and so is a JPEG that cannot
//! be rewritten (corrupt, 12-bit, lossless...): it is listed, and the loader's `on_error`
//! policy decides about it later, as it would have.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use sluice_codec::add_restart_markers;
use sluice_core::spec::Limits;

use crate::progress;

#[derive(clap::Args)]
pub struct Args {
    /// The dataset to read (any directory tree, e.g. an ImageFolder).
    pub src: PathBuf,
    /// Where to write the packed copy (created; must not lie inside `src`).
    pub out: PathBuf,
    /// MCUs per restart interval (lowered to divide each image's MCU row). Smaller
    /// intervals let crops skip more, and cost ~2.5 bytes each.
    #[arg(long, default_value_t = 2)]
    pub interval: u32,
    /// Worker threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
}

fn is_jpeg(p: &Path) -> bool {
    p.extension().and_then(|e| e.to_str()).is_some_and(|e| matches!(e.to_ascii_lowercase().as_str(), "jpg" | "jpeg"))
}

/// Every file under `dir`, relative to it, sorted.
fn files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let abs = dir.join(&rel);
        for entry in std::fs::read_dir(&abs).with_context(|| format!("reading {}", abs.display()))? {
            let entry = entry?;
            let path = rel.join(entry.file_name());
            if std::fs::metadata(entry.path())?.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

pub fn main(a: Args) -> Result<()> {
    let src = a.src.canonicalize().with_context(|| format!("dataset {} not found", a.src.display()))?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let out = a.out.canonicalize()?;
    if out.starts_with(&src) {
        bail!("the output {} lies inside the dataset {}", out.display(), src.display());
    }
    let all = files(&src)?;
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
    let limit = Limits::default().max_pixels;
    let next = AtomicUsize::new(0);
    let (bytes_in, bytes_out, packed) = (AtomicU64::new(0), AtomicU64::new(0), AtomicUsize::new(0));
    let failed = Mutex::new(Vec::new());
    let bar = progress::bar(all.len() as u64, "packing");
    let work = || -> Result<()> {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(rel) = all.get(i) else { return Ok(()) };
            let (from, to) = (src.join(rel), out.join(rel));
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let data = std::fs::read(&from).with_context(|| format!("reading {}", from.display()))?;
            let written = if is_jpeg(rel) {
                match add_restart_markers(&data, a.interval, limit) {
                    Ok(jpg) => {
                        packed.fetch_add(1, Ordering::Relaxed);
                        jpg
                    }
                    Err(e) => {
                        failed.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.push(format!("{}: {e}", from.display()));
                        data.clone()
                    }
                }
            } else {
                data.clone()
            };
            std::fs::write(&to, &written).with_context(|| format!("writing {}", to.display()))?;
            bytes_in.fetch_add(data.len() as u64, Ordering::Relaxed);
            bytes_out.fetch_add(written.len() as u64, Ordering::Relaxed);
            bar.inc(1);
        }
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads).map(|_| s.spawn(work)).collect();
        handles.into_iter().try_for_each(|h| h.join().map_err(|_| anyhow::anyhow!("a packing thread panicked"))?)
    })?;
    bar.finish_and_clear();
    let failed = failed.into_inner().map_err(|_| anyhow::anyhow!("poisoned"))?;
    let (bi, bo) = (bytes_in.into_inner(), bytes_out.into_inner());
    println!(
        "packed {} JPEGs with restart markers every {} MCUs, copied {} other files, into {} ({:.1} MB -> {:.1} MB, {:+.1}%)",
        packed.into_inner(),
        a.interval,
        all.iter().filter(|p| !is_jpeg(p)).count(),
        out.display(),
        bi as f64 / 1e6,
        bo as f64 / 1e6,
        100.0 * (bo as f64 / bi.max(1) as f64 - 1.0)
    );
    if !failed.is_empty() {
        println!("{} JPEGs could not be rewritten and were copied unchanged:", failed.len());
        for f in &failed {
            println!("  {f}");
        }
    }
    Ok(())
}
