//! `sluice-bench prefetch`: `prefetch = "auto"` against fixed depths, on a producer whose
//! cost comes in hiccups.
//!
//! A synthetic trainer takes batches from a local loader and "trains" for a fixed step time
//! while it holds each batch. Each sample costs an emulated `--cost-us` (the spec's `sleep`
//! op) after a cached decode, and one sample in `--hiccup-every` sleeps `--hiccup-ms` more
//! (a registered `map` op: a slow read, a retried request), which holds back its whole
//! batch. On average the producers are faster than the trainer, so a queue deep enough to
//! cover a hiccup hides it and a shallow one stalls the trainer. The hiccups fall on the
//! same samples at every depth (they follow the per-sample seed), so every configuration
//! sees the same producer.
//!
//! Each run of one configuration is a child process (this binary with `--one DEPTH`), so
//! its peak RSS is its own. Per configuration: the trainer's stall fraction (time waiting
//! for a batch ÷ wall time), its throughput, the process's peak RSS, and for `auto` the
//! depth it ended at and how often it grew. Configurations interleave, their order rotating
//! run by run; the table shows medians with the range.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use sluice_core::PipelineSpec;
use sluice_pipeline::{register_user_op, ImageRef, Loader, SampleInfo, Shard, UserOp, UserOpError};
use sluice_profile::median;

use crate::dataset;

/// The name the hiccup op is registered under.
const HICCUP_OP: &str = "sluice_bench:hiccup";

#[derive(clap::Args)]
pub struct Args {
    /// Prefetch settings compared, comma-separated: counts of batches or `auto`.
    #[arg(long, value_delimiter = ',', default_values_t = ["1".to_string(), "2".to_string(), "4".to_string(), "8".to_string(), "auto".to_string()])]
    pub depths: Vec<String>,
    /// The trainer's step: how long it holds each batch, ms.
    #[arg(long, default_value_t = 20.0)]
    pub step_ms: f64,
    /// Emulated cost per sample, µs (the `sleep` op).
    #[arg(long, default_value_t = 3000)]
    pub cost_us: u32,
    /// One sample in this many (by its seed) costs `--hiccup-ms` more.
    #[arg(long, default_value_t = 400)]
    pub hiccup_every: u64,
    #[arg(long, default_value_t = 150)]
    pub hiccup_ms: u64,
    /// Trainer steps measured per run (after one unmeasured epoch that fills the cache).
    #[arg(long, default_value_t = 400)]
    pub steps: usize,
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Output side (`random_resized_crop`): sets the bytes of a batch.
    #[arg(long, default_value_t = 224)]
    pub size: u32,
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Images generated in `--data`.
    #[arg(long, default_value_t = 1024)]
    pub images: usize,
    #[arg(long, default_value = "data/bench-prefetch")]
    pub data: PathBuf,
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Print the runs as JSON on stdout after the table.
    #[arg(long)]
    pub json: bool,
    /// Internal: run one configuration in this process and print its [`Run`] as JSON.
    #[arg(long, hide = true)]
    pub one: Option<String>,
}

/// One run of one configuration, as the child process reports it.
#[derive(Debug, Serialize, Deserialize, Clone)]
struct Run {
    prefetch: String,
    steps: usize,
    seconds: f64,
    /// Time the trainer waited for a batch ÷ wall time.
    stall: f64,
    batches_per_s: f64,
    peak_rss: u64,
    batch_bytes: u64,
    /// Batches in flight at most at the end (`auto`: where it settled).
    depth: usize,
    max_depth: usize,
    /// Times `auto` grew while measured, and during the warm-up epoch.
    grows: u64,
    warm_grows: u64,
}

/// Sleeps `ms` on one sample in `every` (by the sample's seed); leaves the pixels as they are.
struct Hiccup {
    every: u64,
    ms: u64,
}

impl Hiccup {
    fn pause(&self, sample: &SampleInfo) {
        if self.every > 0 && sample.seed.is_multiple_of(self.every) {
            std::thread::sleep(Duration::from_millis(self.ms));
        }
    }
}

impl UserOp for Hiccup {
    fn apply(&self, image: ImageRef<'_>, sample: &SampleInfo, out: &mut Vec<u8>) -> Result<(u32, u32), UserOpError> {
        self.pause(sample);
        out.clear();
        out.extend_from_slice(image.pixels);
        Ok((image.width, image.height))
    }

    fn apply_in_place(
        &self,
        _pixels: &mut Vec<u8>,
        size: (u32, u32),
        sample: &SampleInfo,
        _spare: &mut Vec<u8>,
    ) -> Result<(u32, u32), UserOpError> {
        self.pause(sample);
        Ok(size)
    }
}

pub fn main(a: Args) -> anyhow::Result<()> {
    if let Some(prefetch) = &a.one {
        let run = one(&a, prefetch)?;
        println!("{}", serde_json::to_string(&run)?);
        return Ok(());
    }
    anyhow::ensure!(a.runs >= 1 && !a.depths.is_empty(), "--runs and --depths need at least one");
    dataset::ensure(&a.data, a.images, 0)?;
    let exe = std::env::current_exe().context("finding the sluice-bench binary")?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); a.depths.len()];
    for r in 0..a.runs {
        for k in 0..a.depths.len() {
            let i = (k + r) % a.depths.len();
            let out = Command::new(&exe)
                .args(&args)
                .args(["--one", &a.depths[i]])
                .output()
                .with_context(|| format!("starting {}", exe.display()))?;
            anyhow::ensure!(
                out.status.success(),
                "prefetch {} failed ({}): {}",
                a.depths[i],
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            let run: Run = serde_json::from_slice(&out.stdout).context("reading a run's report")?;
            eprintln!(
                "run {}/{}, prefetch {}: stall {:.1}%, {:.1} batches/s, peak RSS {:.1} MB, depth {} ({} grows)",
                r + 1,
                a.runs,
                run.prefetch,
                100.0 * run.stall,
                run.batches_per_s,
                run.peak_rss as f64 / 1e6,
                run.depth,
                run.grows
            );
            runs[i].push(run);
        }
    }
    print!("{}", table(&a, &runs));
    if a.json {
        println!("{}", serde_json::to_string_pretty(&runs)?);
    }
    Ok(())
}

fn spec(a: &Args, prefetch: &str) -> anyhow::Result<PipelineSpec> {
    let prefetch = match prefetch {
        "auto" => serde_json::json!("auto"),
        n => serde_json::json!(n.parse::<usize>().with_context(|| format!("prefetch {n:?}: a count or auto"))?),
    };
    let json = serde_json::json!({
        "source": { "kind": "image_folder", "root": a.data },
        "ops": [
            { "op": "decode" },
            { "op": "random_resized_crop", "size": a.size },
            { "op": "sleep", "us": a.cost_us },
            { "op": "map", "fn": HICCUP_OP },
        ],
        "cache": { "budget": 1_000_000_000u64, "level": "resized", "resize": 64 },
        "batch": { "size": a.batch },
        "prefetch": prefetch,
        "threads": a.threads,
        "seed": 1,
    });
    Ok(PipelineSpec::from_json_str(&json.to_string())?)
}

/// One configuration in this process: a warm-up epoch, then `steps` trainer steps.
fn one(a: &Args, prefetch: &str) -> anyhow::Result<Run> {
    register_user_op(HICCUP_OP, Arc::new(Hiccup { every: a.hiccup_every, ms: a.hiccup_ms }));
    let loader = Loader::new(spec(a, prefetch)?, Shard::default())?;
    // The first epoch decodes into the cache; the trainer runs on cached samples.
    for b in loader.iter() {
        b?;
    }
    let warm_grows = loader.stats().prefetch.map_or(0, |p| p.grows);
    let step = Duration::try_from_secs_f64(a.step_ms / 1e3).context("--step-ms")?;
    let (mut steps, mut waited) = (0, 0.0);
    let start = Instant::now();
    'run: loop {
        let mut it = loader.iter();
        loop {
            let t0 = Instant::now();
            let Some(b) = it.next() else { break };
            let batch = b?;
            waited += t0.elapsed().as_secs_f64();
            // The trainer holds the batch through its step, as a device copy would.
            std::thread::sleep(step);
            drop(batch);
            steps += 1;
            if steps >= a.steps {
                break 'run;
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let p = loader.stats().prefetch.context("the loader reports no prefetch stats")?;
    Ok(Run {
        prefetch: prefetch.to_owned(),
        steps,
        seconds,
        stall: waited / seconds,
        batches_per_s: steps as f64 / seconds,
        peak_rss: peak_rss(),
        batch_bytes: loader.batch_bytes() as u64,
        depth: p.depth,
        max_depth: p.max_depth,
        grows: p.grows - warm_grows,
        warm_grows,
    })
}

/// This process's peak resident set size, bytes (`ru_maxrss`, KiB on Linux).
fn peak_rss() -> u64 {
    // SAFETY: getrusage writes into the struct we pass; a zeroed rusage is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0;
    }
    ru.ru_maxrss.max(0) as u64 * 1024
}

/// Median (min–max) of `f` over `runs`.
fn spread(runs: &[Run], f: impl Fn(&Run) -> f64) -> (f64, f64, f64) {
    let mut v: Vec<f64> = runs.iter().map(f).collect();
    let m = median(&mut v);
    (m, v.first().copied().unwrap_or(f64::NAN), v.last().copied().unwrap_or(f64::NAN))
}

fn table(a: &Args, runs: &[Vec<Run>]) -> String {
    let batch_mb = runs.iter().flatten().next().map_or(0.0, |r| r.batch_bytes as f64 / 1e6);
    let mut s = format!(
        "\nprefetch: trainer step {} ms, {} threads, batch {} ({batch_mb:.2} MB), {} µs/sample, \
         1 sample in {} +{} ms; {} steps per run, medians of {} runs (min–max)\n\n",
        a.step_ms, a.threads, a.batch, a.cost_us, a.hiccup_every, a.hiccup_ms, a.steps, a.runs
    );
    s += "| prefetch | stall | batches/s | peak RSS (MB) | depth at the end (grows) |\n|---|---:|---:|---:|---|\n";
    for (depth, rs) in a.depths.iter().zip(runs) {
        let (stall, lo, hi) = spread(rs, |r| 100.0 * r.stall);
        let (rate, rlo, rhi) = spread(rs, |r| r.batches_per_s);
        let (rss, mlo, mhi) = spread(rs, |r| r.peak_rss as f64 / 1e6);
        let depths: Vec<String> = rs.iter().map(|r| format!("{} ({})", r.depth, r.grows)).collect();
        s += &format!(
            "| {depth} | {stall:.1}% ({lo:.1}–{hi:.1}) | {rate:.1} ({rlo:.1}–{rhi:.1}) | {rss:.1} ({mlo:.1}–{mhi:.1}) | {} |\n",
            depths.join(", ")
        );
    }
    s
}
