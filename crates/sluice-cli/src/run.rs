//! `sluice run SPEC`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use sluice_core::PipelineSpec;
use sluice_pipeline::loader::LocalityStats;
use sluice_pipeline::locality::barrier::Barrier;
use sluice_pipeline::{Loader, Shard, StatsSnapshot};

use crate::duration_flags;
use crate::progress;

/// A line of `--epoch-log`.
#[derive(Serialize)]
struct EpochLine {
    rank: usize,
    epoch: u64,
    samples: usize,
    seconds: f64,
    /// Cumulative since the loader started, taken once every learner is done with the
    /// epoch (with `--barrier`).
    locality: Option<LocalityStats>,
}

#[derive(clap::Args)]
pub struct Args {
    /// Pipeline spec, .toml or .json.
    pub spec: PathBuf,
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// Worker threads (overrides the spec; 0 = one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print the final stats as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Record a profiling trace of the run (per sample and op, per batch) to this file:
    /// Perfetto protobuf (open in ui.perfetto.dev), or Chrome trace JSON for `.json`.
    #[arg(long, value_name = "PATH")]
    pub trace: Option<PathBuf>,
    #[command(flatten)]
    pub learner: Learner,
    #[command(flatten)]
    pub dashboard: Dashboard,
}

/// The live dashboard of this run's loader, on request.
#[derive(clap::Args, Default)]
pub struct Dashboard {
    /// Serve the dashboard (`/`), its JSON (`/api/state`, `/api/autoscale`) and `/metrics`
    /// at this address while the run lasts, e.g. 127.0.0.1:9100.
    #[arg(long, value_name = "ADDR")]
    pub dashboard: Option<String>,
    /// Seconds to keep serving the dashboard after the last epoch.
    #[arg(long, default_value = "0", value_parser = duration_flags::seconds, requires = "dashboard")]
    pub dashboard_hold_s: Duration,
}

/// One learner (DDP rank) of a multi-learner job (`docs/locality.md`): every learner runs
/// the same spec with its own `--rank`.
#[derive(clap::Args)]
pub struct Learner {
    /// This learner's rank, 0..world_size.
    #[arg(long, default_value_t = 0)]
    pub rank: usize,
    /// Learners in the job.
    #[arg(long, default_value_t = 1)]
    pub world_size: usize,
    /// Wait for all `world_size` learners at the start and the end of every epoch (as
    /// DDP's collectives do), through files in this folder.
    #[arg(long, value_name = "DIR")]
    pub barrier: Option<PathBuf>,
    /// Append one JSON line per epoch (samples, seconds, where samples came from) here.
    #[arg(long, value_name = "PATH")]
    pub epoch_log: Option<PathBuf>,
}

/// A job of one learner, as `sluice run` without `--rank`/`--world-size`.
impl Default for Learner {
    fn default() -> Self {
        Learner { rank: 0, world_size: 1, barrier: None, epoch_log: None }
    }
}

pub fn main(a: Args) -> anyhow::Result<()> {
    let mut spec = PipelineSpec::from_path(&a.spec)?;
    if let Some(t) = a.threads {
        spec.threads = t.into();
    }
    run_spec(spec, a.epochs, a.json, a.trace.as_deref(), &a.learner, &a.dashboard)
}

pub fn run_spec(
    spec: PipelineSpec,
    epochs: u64,
    json: bool,
    trace: Option<&Path>,
    learner: &Learner,
    dashboard: &Dashboard,
) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let shard = Shard { rank: learner.rank, world_size: learner.world_size };
    let loader = Arc::new(Loader::new(spec, shard).context("preparing the pipeline")?);
    let served = match &dashboard.dashboard {
        Some(addr) => {
            let d = sluice_dashboard::serve_loader(addr, Arc::clone(&loader))
                .with_context(|| format!("--dashboard {addr}"))?;
            eprintln!("dashboard: http://{}/", d.addr());
            Some(d)
        }
        None => None,
    };
    let barrier = learner.barrier.as_deref().map(|dir| Barrier::new(dir, shard));
    let mut epoch_log = match &learner.epoch_log {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("--epoch-log {}", path.display()))?,
        ),
        None => None,
    };
    eprintln!(
        "{} samples ({} classes, fingerprint {}) indexed in {:.2}s; {} threads, {} batches/epoch",
        loader.manifest().len(),
        loader.manifest().classes.len(),
        loader.manifest().fingerprint_hex(),
        t0.elapsed().as_secs_f64(),
        loader.threads(),
        loader.batches_per_epoch()
    );
    if trace.is_some() {
        loader.start_trace()?;
    }
    for epoch in 0..epochs {
        if let Some(b) = &barrier {
            b.wait(&format!("epoch-{epoch}"))?;
        }
        loader.set_epoch(epoch);
        let pb = progress::bar(loader.samples_per_epoch() as u64, &format!("epoch {epoch}"));
        let start = Instant::now();
        let mut samples = 0usize;
        for batch in loader.iter() {
            let batch = batch?;
            samples += batch.len();
            pb.inc(batch.len() as u64);
        }
        pb.finish_and_clear();
        let secs = start.elapsed().as_secs_f64();
        eprintln!("epoch {epoch}: {samples} samples in {secs:.2}s = {:.0} samples/s", samples as f64 / secs);
        if let Some(b) = &barrier {
            // Until every learner is done with the epoch, peers may still ask this one for
            // its samples (and it may read them from storage for them): the counters below
            // then hold all of this epoch's work.
            b.wait(&format!("done-{epoch}"))?;
        }
        if let Some(f) = &mut epoch_log {
            let line =
                EpochLine { rank: learner.rank, epoch, samples, seconds: secs, locality: loader.locality_stats() };
            // One write per line: learners append to the same file at the same moment.
            let mut text = serde_json::to_string(&line)?;
            text.push('\n');
            f.write_all(text.as_bytes())?;
        }
    }
    if let Some(d) = &served {
        // The run is over: the page shows its final numbers, not a stall diluted by idling.
        d.freeze();
    }
    let stats = loader.stats();
    if let (Some(path), Some(events)) = (trace, loader.stop_trace()) {
        events.write(path)?;
        eprintln!("trace: {} events written to {}", events.events.len(), path.display());
        if events.dropped.events > 0 {
            eprintln!(
                "trace: {} more events dropped: a trace holds {} at most (`{}` marks where it filled up)",
                events.dropped.events,
                sluice_pipeline::trace::MAX_TRACE_EVENTS,
                sluice_pipeline::trace::DROPPED_EVENT
            );
        }
    }
    if let Some(peak) = peak_rss_bytes() {
        eprintln!("peak resident memory: {:.1} MB", peak as f64 / 1e6);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&stats)?);
    } else {
        print_report(&stats);
    }
    if served.is_some() && !dashboard.dashboard_hold_s.is_zero() {
        eprintln!("dashboard: serving for {:.0} s more", dashboard.dashboard_hold_s.as_secs_f64());
        std::thread::sleep(dashboard.dashboard_hold_s);
    }
    Ok(())
}

pub fn print_report(s: &StatsSnapshot) {
    println!(
        "{} samples in {} batches, {:.1} MB read, {:.0} samples/s overall, consumer waited {:.2}s",
        s.samples,
        s.batches,
        s.bytes_read as f64 / 1e6,
        s.samples_per_s,
        s.wait_s
    );
    if let Some(c) = &s.cache {
        println!(
            "cache ({:?}, {:?}): hit rate {:.1}% ({} hits, {} misses), {} entries, {:.1} of {:.1} MB, {} evictions, ~{:.1}s saved",
            c.policy,
            c.level,
            100.0 * c.tier.hit_rate,
            c.tier.hits,
            c.tier.misses,
            c.tier.entries,
            c.tier.used_bytes as f64 / 1e6,
            c.tier.budget_bytes as f64 / 1e6,
            c.tier.evictions,
            c.est_time_saved_s
        );
        if let Some(off) = &c.off {
            println!(
                "cache off: at best ({:?}) it would save {:.2}s of {:.2}s per epoch ({:.1}%, under {:.0}%); \
                 drop the cache section (or use level = \"raw\") to keep the decode fused with the ops after it",
                off.best,
                off.saved_per_epoch_s,
                off.pipeline_per_epoch_s,
                100.0 * off.saved_fraction,
                100.0 * off.min_fraction
            );
        }
    }
    if let Some(i) = &s.entropy_index {
        let files = i.indexed + i.unservable + i.over_budget;
        let share = if files > 0 { 100.0 * i.indexed as f64 / files as f64 } else { 0.0 };
        println!(
            "entropy index: {share:.0}% of the files seen can be cut ({} indexed, {:.2} MB; {} decode whole: \
             {} progressive or not baseline, {} over the memory budget), {} crops cut",
            i.indexed,
            i.bytes as f64 / 1e6,
            i.unservable + i.over_budget,
            i.unservable,
            i.over_budget,
            i.cut
        );
    }
    let busy: f64 = s.op_seconds.iter().map(|(_, t)| t).sum();
    println!("worker time per op:{:>25} {:>6}  {:>11}  {:>6} {:>7}", "total", "share", "mean/sample", "p50", "p99");
    for ((name, t), p) in s.op_seconds.iter().zip(&s.op_percentiles) {
        let share = if busy > 0.0 { 100.0 * t / busy } else { 0.0 };
        let per_sample = if s.samples > 0 { 1e6 * t / s.samples as f64 } else { 0.0 };
        println!(
            "  {name:<32} {t:>8.2}s {share:>5.1}%  {per_sample:>8.0} us  {:>6.0} {:>7.0} us",
            1e6 * p.p50_s,
            1e6 * p.p99_s
        );
    }
    if !s.skipped.is_empty() {
        // A bad file is skipped once per epoch; list each one once.
        let mut seen = std::collections::HashSet::new();
        let distinct: Vec<_> = s.skipped.iter().filter(|k| seen.insert(k.key)).collect();
        println!("skipped {} bad samples ({} distinct files):", s.skipped.len(), distinct.len());
        for k in distinct {
            println!("  {}", k.error);
        }
    }
}

/// The process's peak resident set size (Linux `VmHWM`), if the platform reports it.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
