//! `sluice-bench engine` (formerly `sluice bench`): images/s of the standard training
//! pipeline (decode + RandomResizedCrop 224 + flip, u8 out) against plain libjpeg-turbo
//! full decoding of the same files, in the same run, at each thread count. The pipeline
//! runs three ways: with the entropy index (the default) in its first epoch, which builds
//! the indexes, and in a steady-state epoch after it; and without the index
//! (`decode.entropy_index = false`). With `--packed`, also on a packed copy of the files
//! (`sluice pack`), against the same plain decode of the originals. Reported as medians
//! over several runs, interleaved, and as ratios, because machines are noisy.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use serde_json::json;
use sluice_codec::JpegDecoder;
use sluice_core::{Manifest, PipelineSpec, SourceSpec};
use sluice_pipeline::pack::{pack_dataset, PackOptions};
use sluice_pipeline::source::build_manifest;
use sluice_pipeline::{Loader, Shard};

use sluice_profile::median;

use crate::dataset;

#[derive(clap::Args)]
pub struct Args {
    /// An ImageFolder of JPEGs. Without it, one is generated in data/bench.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Images to generate when --data is not given.
    #[arg(long, default_value_t = 1000)]
    pub images: usize,
    /// Thread counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub threads: Vec<usize>,
    /// Runs per measurement; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Also run the pipeline on a packed copy of the data (`sluice pack`, written to
    /// DATA-packed if that does not exist yet).
    #[arg(long)]
    pub packed: bool,
    /// MCUs between entropy index points (`decode.index_spacing`).
    #[arg(long, default_value_t = sluice_core::DecodeSpec::default().index_spacing)]
    pub index_spacing: u32,
    /// Print results as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// A row of the report: img/s at one thread count (medians).
#[derive(Debug, Clone, Copy)]
struct Row {
    threads: usize,
    /// The pipeline with the entropy index, after its first epoch.
    pipeline: f64,
    /// Its first epoch (indexing every file).
    first_epoch: f64,
    /// The pipeline with `decode.entropy_index = false`.
    no_index: f64,
    plain: f64,
    packed: Option<f64>,
    /// The indexes' bytes over the dataset's.
    index_share: f64,
}

pub fn main(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(a.runs > 0, "--runs must be at least 1");
    anyhow::ensure!(!a.threads.is_empty() && a.threads.iter().all(|&t| t > 0), "--threads needs counts >= 1");
    let root = match &a.data {
        Some(d) => d.clone(),
        None => {
            let out = PathBuf::from("data/bench");
            dataset::ensure(&out, a.images, 0)?;
            out
        }
    };
    let all = build_manifest(&SourceSpec::ImageFolder { root: root.clone() })
        .with_context(|| format!("indexing {}", root.display()))?;
    // Reading and decoding every file once warms the page cache (both sides then read from
    // memory) and leaves out files that do not decode: a benchmark measures good images.
    let (manifest, bytes, bad) = decodable_only(&all)?;
    if !bad.is_empty() {
        eprintln!("left out {} files that do not decode, e.g. {}", bad.len(), bad[0]);
    }
    anyhow::ensure!(!manifest.is_empty(), "no decodable JPEGs in {}", root.display());
    let files: Vec<PathBuf> = manifest.entries().map(|e| manifest.display_path(e.key)).collect();
    let packed = if a.packed { Some(packed_copy(&root)?) } else { None };
    eprintln!(
        "{} images, {:.0} KB average, {} runs per point",
        files.len(),
        bytes as f64 / files.len() as f64 / 1000.0,
        a.runs
    );

    let mut rows = Vec::new();
    for &t in &a.threads {
        let (mut pipe, mut first, mut no_index, mut plain, mut pipe_packed) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut index_bytes = 0;
        for run in 0..a.runs {
            let epoch = 2 * run as u64;
            plain.push(plain_decode(&files, t)?);
            // A new loader each run: its first epoch indexes every file, the next is cut.
            let indexed = loader(&manifest, &root, t, a.batch, Some(a.index_spacing))?;
            first.push(epoch_rate(&indexed, epoch)?);
            pipe.push(epoch_rate(&indexed, epoch + 1)?);
            index_bytes = indexed.stats().entropy_index.map_or(0, |s| s.bytes);
            no_index.push(epoch_rate(&loader(&manifest, &root, t, a.batch, None)?, epoch + 1)?);
            if let Some((m, r)) = &packed {
                pipe_packed.push(epoch_rate(&loader(m, r, t, a.batch, Some(a.index_spacing))?, epoch + 1)?);
            }
        }
        let row = Row {
            threads: t,
            pipeline: median(&mut pipe),
            first_epoch: median(&mut first),
            no_index: median(&mut no_index),
            plain: median(&mut plain),
            packed: (!pipe_packed.is_empty()).then(|| median(&mut pipe_packed)),
            index_share: index_bytes as f64 / bytes as f64,
        };
        eprintln!(
            "threads {t}: pipeline {:.0} img/s (first epoch {:.0}, without the index {:.0}), plain decode {:.0} img/s, ratio {:.2}",
            row.pipeline, row.first_epoch, row.no_index, row.plain, row.pipeline / row.plain
        );
        if let Some(pk) = row.packed {
            eprintln!(
                "threads {t}: pipeline on packed files {pk:.0} img/s, ratio to plain decode {:.2}",
                pk / row.plain
            );
        }
        rows.push(row);
    }
    report(&a, &rows);
    Ok(())
}

/// The packed copy of `root` (made if missing) and its manifest, good files only.
fn packed_copy(root: &Path) -> anyhow::Result<(Manifest, PathBuf)> {
    let name = root.file_name().map_or_else(|| "data".into(), |n| n.to_string_lossy().into_owned());
    let out = root.with_file_name(format!("{name}-packed"));
    if out.is_dir() {
        eprintln!("using the packed copy in {}", out.display());
    } else {
        eprintln!("packing {} into {} (sluice pack)", root.display(), out.display());
        pack_dataset(root, &out, &PackOptions::default(), &|_, _| {})?;
    }
    let all = build_manifest(&SourceSpec::ImageFolder { root: out.clone() })
        .with_context(|| format!("indexing {}", out.display()))?;
    Ok((decodable_only(&all)?.0, out))
}

fn report(a: &Args, rows: &[Row]) {
    let scaling = match (rows.iter().find(|r| r.threads == 1), rows.iter().find(|r| r.threads == 2)) {
        (Some(one), Some(two)) => Some(two.pipeline / one.pipeline),
        _ => None,
    };
    if a.json {
        let rows: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({"threads": r.threads, "pipeline_img_s": r.pipeline, "plain_decode_img_s": r.plain,
                       "ratio": r.pipeline / r.plain, "pipeline_img_s_per_thread": r.pipeline / r.threads as f64,
                       "first_epoch_img_s": r.first_epoch, "no_index_img_s": r.no_index,
                       "no_index_ratio": r.no_index / r.plain,
                       "first_epoch_cost": r.no_index / r.first_epoch, "index_share": r.index_share,
                       "packed_pipeline_img_s": r.packed, "packed_ratio": r.packed.map(|pk| pk / r.plain)})
            })
            .collect();
        println!(
            "{}",
            json!({"runs": a.runs, "index_spacing": a.index_spacing, "rows": rows, "scaling_2_vs_1": scaling})
        );
        return;
    }
    println!(
        "standard pipeline = decode + random_resized_crop 224 + flip, u8 HWC; entropy index every {} MCUs; medians of {} runs",
        a.index_spacing, a.runs
    );
    println!(
        "{:>7} {:>14} {:>11} {:>13} {:>8} {:>14} {:>11} {:>8} {:>11} {:>7}",
        "threads",
        "pipeline img/s",
        "per thread",
        "decode img/s",
        "ratio",
        "no index img/s",
        "ratio",
        "1st epoch",
        "1st cost",
        "index"
    );
    for r in rows {
        println!(
            "{:>7} {:>14.0} {:>11.0} {:>13.0} {:>8.2} {:>14.0} {:>11.2} {:>8.0} {:>10.2}x {:>6.1}%",
            r.threads,
            r.pipeline,
            r.pipeline / r.threads as f64,
            r.plain,
            r.pipeline / r.plain,
            r.no_index,
            r.no_index / r.plain,
            r.first_epoch,
            r.no_index / r.first_epoch,
            100.0 * r.index_share
        );
    }
    println!(
        "(1st cost: the indexing epoch's time over an epoch without the index; index: its bytes over the dataset's)"
    );
    if rows.iter().any(|r| r.packed.is_some()) {
        println!("on the packed copy (sluice pack), against plain decode of the original files:");
        println!("{:>7} {:>14} {:>12} {:>8}", "threads", "pipeline img/s", "per thread", "ratio");
        for r in rows {
            if let Some(pk) = r.packed {
                println!("{:>7} {pk:>14.0} {:>12.0} {:>8.2}", r.threads, pk / r.threads as f64, pk / r.plain);
            }
        }
    }
    if let Some(s) = scaling {
        println!("pipeline scaling, 2 threads vs 1: {s:.2}x");
    }
}

/// The manifest's entries that read and decode, their total bytes, and what failed.
fn decodable_only(manifest: &Manifest) -> anyhow::Result<(Manifest, u64, Vec<String>)> {
    let mut dec = JpegDecoder::new(sluice_core::Limits::default().max_pixels)?;
    let mut out = Vec::new();
    let (mut good, mut bytes, mut bad) = (Vec::new(), 0u64, Vec::new());
    for e in manifest.entries() {
        let path = manifest.display_path(e.key);
        match std::fs::read(&path)
            .map_err(|err| err.to_string())
            .and_then(|b| dec.decode_full(&b, &mut out).map(|_| b.len()).map_err(|err| err.to_string()))
        {
            Ok(n) => {
                bytes += n as u64;
                good.push((e.location.owned(), e.label, e.size));
            }
            Err(err) => bad.push(format!("{}: {err}", path.display())),
        }
    }
    Ok((Manifest::new(manifest.root.clone(), good, manifest.classes.clone()), bytes, bad))
}

/// Read + full-size decode of every file, `threads` threads, one decoder each.
fn plain_decode(files: &[PathBuf], threads: usize) -> anyhow::Result<f64> {
    let start = Instant::now();
    std::thread::scope(|s| -> anyhow::Result<()> {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || -> anyhow::Result<()> {
                    let mut dec = JpegDecoder::new(sluice_core::Limits::default().max_pixels)?;
                    let mut out = Vec::new();
                    for f in files.iter().skip(t).step_by(threads) {
                        let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
                        dec.decode_full(&bytes, &mut out).with_context(|| format!("decoding {}", f.display()))?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| anyhow::anyhow!("decode thread panicked"))??;
        }
        Ok(())
    })?;
    Ok(files.len() as f64 / start.elapsed().as_secs_f64())
}

/// The standard training pipeline over `manifest`, with the entropy index at `spacing` or
/// without it.
fn loader(
    manifest: &Manifest,
    root: &Path,
    threads: usize,
    batch: usize,
    spacing: Option<u32>,
) -> anyhow::Result<Loader> {
    let mut spec = PipelineSpec::train_default(SourceSpec::ImageFolder { root: root.to_path_buf() }, 224, batch);
    spec.threads = threads.into();
    spec.decode.entropy_index = spacing.is_some();
    spec.decode.index_spacing = spacing.unwrap_or(spec.decode.index_spacing);
    Ok(Loader::with_manifest(spec, manifest.clone(), Shard::default())?)
}

/// Images/s of one epoch of `loader`.
fn epoch_rate(loader: &Loader, epoch: u64) -> anyhow::Result<f64> {
    loader.set_epoch(epoch);
    let start = Instant::now();
    let mut n = 0;
    for b in loader.iter() {
        n += b?.len();
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}
