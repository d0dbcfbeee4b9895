//! `sluice-bench autoscale --real`: `threads = "auto"` on the real JPEG training pipeline
//! (decode + random_resized_crop 224 + flip, no cache) against every fixed thread count
//! from 1 to the cores, for a synthetic trainer slower than one thread can feed and one
//! faster than all cores can. Per setting: the trainer's images/s, the threads it ran at
//! over the second half, and the CPU seconds the process used. Settings interleave within
//! each run; medians over the runs, ratios to the best fixed count taken within each run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use sluice_core::{PipelineSpec, SourceSpec, Threads};
use sluice_pipeline::{Loader, Shard};

use sluice_profile::{median, self_cpu};

use super::Args;
use crate::dataset;

#[derive(Debug, Serialize, Clone)]
struct Measured {
    images_per_s: f64,
    /// Mean threads over the second half of the run.
    threads: f64,
    cpu_s: f64,
}

#[derive(Debug, Serialize)]
struct Row {
    trainer: &'static str,
    setting: String,
    images_per_s: f64,
    min: f64,
    max: f64,
    /// Median over runs of (this ÷ the best fixed setting in the same run).
    vs_best_fixed: f64,
    threads: f64,
    cpu_s: f64,
}

fn spec(root: &Path, batch: usize, threads: Threads) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(SourceSpec::ImageFolder { root: root.to_path_buf() }, 224, batch);
    s.threads = threads;
    s
}

/// Images per second of one thread against a trainer that never waits.
fn one_thread_rate(root: &Path, batch: usize, seconds: f64) -> anyhow::Result<f64> {
    let loader = Loader::new(spec(root, batch, Threads::Count(1)), Shard::default())?;
    let t0 = Instant::now();
    let mut n = 0;
    while t0.elapsed().as_secs_f64() < seconds {
        for b in loader.iter() {
            n += b?.len();
            if t0.elapsed().as_secs_f64() >= seconds {
                break;
            }
        }
    }
    Ok(n as f64 / t0.elapsed().as_secs_f64())
}

/// The trainer takes a batch, then "trains" for `step`, for `seconds`.
fn train(root: &Path, batch: usize, threads: Threads, step: Duration, seconds: f64) -> anyhow::Result<Measured> {
    let loader = Loader::new(spec(root, batch, threads), Shard::default())?;
    let c0 = self_cpu();
    let t0 = Instant::now();
    let (mut n, mut late_threads, mut late_batches) = (0usize, 0usize, 0usize);
    'run: loop {
        for b in loader.iter() {
            n += b?.len();
            let t = t0.elapsed().as_secs_f64();
            if t >= seconds {
                break 'run;
            }
            if t >= seconds / 2.0 {
                late_threads += loader.threads();
                late_batches += 1;
            }
            std::thread::sleep(step);
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    Ok(Measured {
        images_per_s: n as f64 / elapsed,
        threads: late_threads as f64 / late_batches.max(1) as f64,
        cpu_s: self_cpu() - c0,
    })
}

pub fn main(a: &Args) -> anyhow::Result<()> {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let root = PathBuf::from("data/bench-autoscale-real");
    dataset::ensure(&root, a.images.min(1000), 0)?;
    let settings: Vec<Threads> = std::iter::once(Threads::Auto).chain((1..=cores).map(Threads::Count)).collect();
    let name = |t: &Threads| match t {
        Threads::Auto => "auto".to_string(),
        Threads::Count(n) => format!("fixed {n}"),
    };
    let rate = one_thread_rate(&root, a.batch, 3.0)?;
    // Slow: 0.6 of one thread's rate; fast: twice what all cores make.
    let trainers = [("slower than 1 thread", 0.6 * rate), ("faster than all cores", 2.0 * cores as f64 * rate)];
    eprintln!(
        "one thread makes {rate:.0} images/s; trainers take {:.0} and {:.0} images/s",
        trainers[0].1, trainers[1].1
    );
    let mut measured: Vec<Vec<Vec<Measured>>> =
        trainers.iter().map(|_| settings.iter().map(|_| Vec::new()).collect()).collect();
    let mut ratios: Vec<Vec<Vec<f64>>> =
        trainers.iter().map(|_| settings.iter().map(|_| Vec::new()).collect()).collect();
    for run in 0..a.runs {
        for (ti, (trainer, demand)) in trainers.iter().enumerate() {
            let step = Duration::try_from_secs_f64(a.batch as f64 / demand).with_context(|| {
                format!("a trainer step of {} s: no thread made any images", a.batch as f64 / demand)
            })?;
            let mut this_run = vec![0.0; settings.len()];
            // Each run starts at a different setting, so drift in the machine's load is shared.
            for k in (0..settings.len()).map(|i| (i + run) % settings.len()) {
                let m = train(&root, a.batch, settings[k], step, a.real_seconds)?;
                eprintln!(
                    "run {}/{}, trainer {trainer}, {}: {:.1} images/s, {:.2} threads (second half), {:.2} CPU-s",
                    run + 1,
                    a.runs,
                    name(&settings[k]),
                    m.images_per_s,
                    m.threads,
                    m.cpu_s
                );
                this_run[k] = m.images_per_s;
                measured[ti][k].push(m);
            }
            let best = this_run.iter().skip(1).copied().fold(0.0, f64::max).max(1e-9);
            for (k, v) in this_run.iter().enumerate() {
                ratios[ti][k].push(v / best);
            }
        }
    }
    let mut rows = Vec::new();
    for (ti, (trainer, _)) in trainers.iter().enumerate() {
        for (k, s) in settings.iter().enumerate() {
            let ms = &measured[ti][k];
            let med = |f: fn(&Measured) -> f64| median(&mut ms.iter().map(f).collect::<Vec<_>>());
            rows.push(Row {
                trainer,
                setting: name(s),
                images_per_s: med(|m| m.images_per_s),
                min: ms.iter().map(|m| m.images_per_s).fold(f64::INFINITY, f64::min),
                max: ms.iter().map(|m| m.images_per_s).fold(0.0, f64::max),
                vs_best_fixed: median(&mut ratios[ti][k]),
                threads: med(|m| m.threads),
                cpu_s: med(|m| m.cpu_s),
            });
        }
    }
    let mut table = format!(
        "Median of {} run(s) of {:.0} s each; {cores} cores; one thread made {rate:.0} images/s; batches of {}.\n\n",
        a.runs, a.real_seconds, a.batch
    );
    table += "| trainer | threads | images/s | vs best fixed (per-run median) | threads over 2nd half | CPU-s |\n|---|---|---|---|---|---|\n";
    for r in &rows {
        table += &format!(
            "| {} | {} | {:.1} ({:.1}–{:.1}) | {:.3} | {:.2} | {:.2} |\n",
            r.trainer, r.setting, r.images_per_s, r.min, r.max, r.vs_best_fixed, r.threads, r.cpu_s
        );
    }
    let auto = |ti: usize| rows.iter().filter(|r| r.setting == "auto").nth(ti);
    let check = match (auto(0), auto(1)) {
        (Some(slow), Some(fast)) => format!(
            "auto vs issue 14: fewer threads than cores for the slower trainer ({:.2} < {cores}): {}; \
             ≤ 2% throughput cost vs the best fixed count ({:.3}, {:.3}): {}",
            slow.threads,
            if slow.threads < cores as f64 { "yes" } else { "NO" },
            slow.vs_best_fixed,
            fast.vs_best_fixed,
            if slow.vs_best_fixed >= 0.98 && fast.vs_best_fixed >= 0.98 { "yes" } else { "NO" }
        ),
        _ => String::new(),
    };
    let report = |line: &str| if a.json { eprintln!("{line}") } else { println!("{line}") };
    report(&table);
    report(&check);
    std::fs::create_dir_all(&a.out)?;
    std::fs::write(a.out.join("threads-auto.md"), format!("{table}\n{check}\n"))?;
    let json = serde_json::to_string_pretty(&serde_json::json!({ "one_thread_images_per_s": rate, "rows": rows }))?;
    std::fs::write(a.out.join("threads-auto.json"), &json)?;
    if a.json {
        println!("{json}");
    }
    Ok(())
}
