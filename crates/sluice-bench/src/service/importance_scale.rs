//! `sluice-bench service --what importance-scale`: an importance-sampled job of millions of
//! samples through the service (issue 28: 2×10^6 samples, each epoch exactly once).
//!
//! A file list of `--samples` lines over 16 small JPEGs (64x64; many lines per file, each
//! its own sample), decode and a 32 px random resized crop, batches of 1024; a dispatcher
//! and worker processes on this machine, one `RemoteLoader` that reports each batch's
//! losses before it takes the next. The same epochs are run by a local `Loader` given the
//! same reports: every remote epoch must hold exactly the local epoch's draw (the same
//! multiset of samples and weights, so nothing was lost or delivered twice). Reports each
//! epoch's time, its samples and the dispatcher's resident memory.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use sluice_client::{RemoteLoader, RemoteOptions, ReportKind};
use sluice_core::{Batch, PipelineSpec, SamplingSpec, SourceSpec};
use sluice_pipeline::{Loader, Shard};

/// Distinct JPEGs the list's lines point at.
const FILES: usize = 16;

/// The trainer's loss for a sample: a few hard ones, the rest easy and spread.
fn loss(key: u64) -> f64 {
    if key.is_multiple_of(1000) {
        10.0
    } else {
        0.1 + (key % 97) as f64 / 100.0
    }
}

/// Adds a batch to an epoch's draw, (key, weight bits) of each sample.
fn add(drawn: &mut Vec<(u64, u32)>, b: &Batch) {
    let w = b.weights.clone().unwrap_or_else(|| vec![1.0; b.keys.len()]);
    drawn.extend(b.keys.iter().copied().zip(w.into_iter().map(f32::to_bits)));
}

fn write_data(dir: &Path, samples: usize) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    for f in 0..FILES {
        let rgb: Vec<u8> = (0..64 * 64 * 3).map(|i| ((i * (f + 3)) % 251) as u8).collect();
        std::fs::write(dir.join(format!("img_{f:02}.jpg")), sluice_codec::encode_jpeg(&rgb, 64, 64, 85)?)?;
    }
    let list = dir.join(format!("list-{samples}.txt"));
    let mut out = std::io::BufWriter::new(std::fs::File::create(&list)?);
    for i in 0..samples {
        writeln!(out, "img_{:02}.jpg {}", i % FILES, i % 10)?;
    }
    out.flush()?;
    Ok(list)
}

/// Dispatcher's resident memory, MiB, from `/proc/PID/status`.
fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

pub fn run(work: &Path, samples: usize, epochs: u64, workers: usize, threads: usize) -> Result<Value> {
    let dir = work.join("importance-scale");
    let list = write_data(&dir, samples)?;
    let mut spec = PipelineSpec::train_default(SourceSpec::FileList { path: list, root: None }, 32, 1024);
    spec.sampling = SamplingSpec::Importance { floor: 0.1, coverage_epochs: 4, miss_discount: 1.0, max_draws: 4.0 };
    spec.threads = threads.into();
    spec.seed = 7;
    let per_worker = threads.div_ceil(workers.max(1));
    let (addr, procs) = super::service(&dir, &dir, workers, per_worker)?;
    let dispatcher = procs.first().map(|p| p.0.id());
    let mut options = RemoteOptions::new(addr, "importance-scale");
    options.token = None;
    options.give_up_after = Duration::from_secs(60);
    let t0 = Instant::now();
    let mut remote = RemoteLoader::connect(&spec, options).context("creating the job")?;
    eprintln!("job of {samples} samples created in {:.1} s", t0.elapsed().as_secs_f64());
    let local = Loader::new(spec, Shard::default())?;
    let mut rows = Vec::new();
    for epoch in 0..epochs {
        let t = Instant::now();
        remote.start_epoch();
        let mut got = Vec::with_capacity(samples);
        while let Some(b) = remote.next_batch(&mut || false) {
            let b = b.with_context(|| format!("remote epoch {epoch}"))?;
            let values: Vec<f64> = b.keys.iter().map(|&k| loss(k)).collect();
            remote.report(&b.keys, &values, ReportKind::Loss).context("report")?;
            add(&mut got, &b);
        }
        got.sort_unstable();
        let remote_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut want = Vec::with_capacity(samples);
        for b in local.iter() {
            let b = b?;
            let values: Vec<f64> = b.keys.iter().map(|&k| loss(k)).collect();
            local.report(&b.keys, &values)?;
            add(&mut want, &b);
        }
        want.sort_unstable();
        let local_s = t.elapsed().as_secs_f64();
        let distinct = {
            let mut keys: Vec<u64> = got.iter().map(|&(k, _)| k).collect();
            keys.dedup();
            keys.len()
        };
        ensure!(
            got == want,
            "epoch {epoch}: the service delivered {} samples, the local draw has {}: not the same draw",
            got.len(),
            want.len()
        );
        let row = json!({
            "epoch": epoch, "samples": got.len(), "distinct": distinct,
            "remote_s": remote_s, "local_s": local_s,
            "dispatcher_rss_mib": dispatcher.and_then(rss_mib),
        });
        eprintln!("{row}");
        rows.push(row);
    }
    drop(procs);
    Ok(json!({ "samples": samples, "workers": workers, "threads": threads, "epochs": rows }))
}
