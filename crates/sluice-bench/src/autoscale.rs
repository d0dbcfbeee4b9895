//! `sluice-bench autoscale` (formerly `sluice bench-autoscale`): the autoscaling policies
//! side by side on one demand schedule.
//!
//! A synthetic trainer takes batches from a local loader and "trains" for a step time set
//! by a schedule of phases (demand changes between them). Each sample costs an emulated
//! `cost_us` (the spec's `sleep` op) after a cached decode, so a thread is one unit of a
//! known rate and a dozen units fit on two cores. Per policy, on the same schedule: how
//! many decisions and windows it takes to come within one unit of the oracle (the
//! fewest units whose production covers the demand) after each change, unit-seconds
//! against the oracle's, stall fractions; then, at stable demand with ±10% noise on the
//! signals, actions per 10 windows. `--runs N` repeats the whole comparison (the policies'
//! order rotating run by run) and reports medians with their spread; `--out DIR` gets the
//! table, the JSON and one SVG per policy (units and P/Q over time, from the last run).
//!
//! A cost model puts the policies side by side as Cachew's headline does (training time
//! and cost): the run is a fixed wall-clock schedule, so the time to train the schedule's
//! work is its length ÷ (1 − stall); over that time the workers cost their mean units at
//! `--price-core-hour`, the cache its bytes at `--price-gb-hour`, and the trainer its
//! accelerator at `--price-accelerator-hour`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use sluice_autoscale::{AutoscaleConfig, PolicyKind, Window, WindowBy};
use sluice_core::PipelineSpec;
use sluice_pipeline::{Loader, Shard};

use sluice_profile::chart::{self, Panel, Series};

use crate::dataset;

mod real;

#[derive(clap::Args)]
pub struct Args {
    /// Emulated cost per sample, µs (the `sleep` op).
    #[arg(long, default_value_t = 10_000)]
    pub cost_us: u32,
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// The trainer's demand per phase, in units' worth (one unit: one thread).
    #[arg(long, value_delimiter = ',', default_values_t = [3.5, 9.5, 2.5, 6.5], value_parser = parse_demand)]
    pub demand: Vec<f64>,
    /// Seconds per phase.
    #[arg(long, default_value_t = 10.0)]
    pub phase_s: f64,
    /// Decision window, ms.
    #[arg(long, default_value_t = 500)]
    pub window_ms: u64,
    #[arg(long, default_value_t = 16)]
    pub max_units: usize,
    #[arg(long, value_delimiter = ',', default_values_t = ["fastmatch".to_string(), "cachew".to_string(), "tfdata".to_string(), "utilisation".to_string(), "fixed".to_string()])]
    pub policies: Vec<String>,
    /// Seconds of the noise run (stable demand, ±10% on P and Q); 0 skips it.
    #[arg(long, default_value_t = 20.0)]
    pub noise_s: f64,
    /// Images generated in data/bench-autoscale.
    #[arg(long, default_value_t = 2000)]
    pub images: usize,
    /// Print the results as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Repeats of the whole comparison; the table shows medians and spreads.
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Where the table (autoscale.md), the JSON and the plots (autoscale-POLICY.svg) go.
    #[arg(long, default_value = "data/bench-autoscale-out")]
    pub out: PathBuf,
    /// Instead: `threads = "auto"` on the real JPEG pipeline vs every fixed thread count.
    #[arg(long)]
    pub real: bool,
    /// Seconds per setting in the `--real` runs.
    #[arg(long, default_value_t = 10.0)]
    pub real_seconds: f64,
    /// Cost model: one unit (one core) per hour.
    #[arg(long, default_value_t = 0.04)]
    pub price_core_hour: f64,
    /// Cost model: one GB of cache memory per hour.
    #[arg(long, default_value_t = 0.005)]
    pub price_gb_hour: f64,
    /// Cost model: the trainer's accelerator per hour (it is held while the trainer stalls).
    #[arg(long, default_value_t = 2.5)]
    pub price_accelerator_hour: f64,
}

/// Prices of the cost model, per hour.
#[derive(Debug, Serialize, Clone, Copy)]
struct Prices {
    core_hour: f64,
    gb_hour: f64,
    accelerator_hour: f64,
}

/// What training the schedule's work takes under one policy, by the cost model.
#[derive(Debug, Serialize, Clone, Copy, PartialEq)]
struct Cost {
    /// Seconds to train the schedule's work: its length ÷ (1 − stall).
    time_s: f64,
    workers: f64,
    cache: f64,
    accelerator: f64,
    total: f64,
}

impl Cost {
    /// `schedule_s` of trainer work done at `stall`, with `mean_units` units and
    /// `cache_bytes` of cache held throughout.
    fn of(schedule_s: f64, stall: f64, mean_units: f64, cache_bytes: u64, p: Prices) -> Self {
        let time_s = schedule_s / (1.0 - stall.clamp(0.0, 0.99));
        let hours = time_s / 3600.0;
        let workers = mean_units * hours * p.core_hour;
        let cache = cache_bytes as f64 / 1e9 * hours * p.gb_hour;
        let accelerator = hours * p.accelerator_hour;
        Self { time_s, workers, cache, accelerator, total: workers + cache + accelerator }
    }
}

/// A phase's demand, in units: a trainer step (its inverse, scaled by a unit's rate)
/// must be a `Duration`.
fn parse_demand(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(d) if d.is_finite() && d >= 1e-3 => Ok(d),
        _ => Err(format!("`{s}` is not a demand: units' worth from 0.001 up, finite")),
    }
}

#[derive(Debug, Serialize)]
struct PhaseResult {
    demand: f64,
    oracle: usize,
    /// Decisions and windows after the change until units were within ±1 of the oracle.
    decisions_to_reach: Option<usize>,
    windows_to_reach: Option<f64>,
    /// Mean units over the phase's second half.
    settled_units: f64,
    /// Stall over the phase's second half, epoch starts excluded.
    steady_stall: f64,
}

#[derive(Debug, Serialize)]
struct PolicyResult {
    policy: String,
    phases: Vec<PhaseResult>,
    unit_seconds: f64,
    oracle_unit_seconds: f64,
    stall: f64,
    decisions: u64,
    noise_actions_per_10_windows: Option<f64>,
    /// Bytes the loader's cache held at the end (the cost model's cache).
    cache_bytes: u64,
    cost: Cost,
}

/// What one policy did over time in one run, for the plots.
struct Timeline {
    /// (seconds, units) at each batch.
    units: Vec<(f64, f64)>,
    /// (seconds, P, Q) of each window the policy read, batches/s.
    windows: Vec<(f64, f64, f64)>,
    /// (seconds, the trainer's demand in batches/s) at each phase start.
    demand: Vec<(f64, f64)>,
    oracle: Vec<(f64, f64)>,
    unit_rate: f64,
}

/// One batch as the trainer saw it.
struct Tick {
    t: f64,
    units: usize,
    wait: f64,
    step: f64,
    epoch_start: bool,
}

fn spec(root: &Path, a: &Args, threads: usize) -> anyhow::Result<PipelineSpec> {
    let json = serde_json::json!({
        "source": { "kind": "image_folder", "root": root },
        "ops": [
            { "op": "decode" },
            { "op": "random_resized_crop", "size": 32 },
            { "op": "sleep", "us": a.cost_us },
        ],
        "cache": { "budget": 1_000_000_000u64, "level": "resized", "resize": 40 },
        "batch": { "size": a.batch },
        "prefetch": 2 * a.max_units,
        "threads": threads,
        "seed": 1,
    });
    Ok(PipelineSpec::from_json_str(&json.to_string())?)
}

/// Runs the trainer for `phases` (demand in batches/s, seconds each) and records each batch.
fn drive(loader: &Loader, phases: &[(f64, f64)], start: Instant) -> anyhow::Result<Vec<Tick>> {
    let total: f64 = phases.iter().map(|p| p.1).sum();
    let mut ticks = Vec::new();
    'run: loop {
        let mut it = loader.iter();
        let mut first = true;
        loop {
            let t0 = Instant::now();
            let Some(b) = it.next() else { break };
            b?;
            let wait = t0.elapsed().as_secs_f64();
            let t = start.elapsed().as_secs_f64();
            if t >= total {
                break 'run;
            }
            let mut end = 0.0;
            let rate = phases.iter().find(|p| {
                end += p.1;
                t < end
            });
            let step = 1.0 / rate.map_or(1.0, |p| p.0);
            let pause = Duration::try_from_secs_f64(step)
                .with_context(|| format!("a trainer step of {step} s: --demand too small for this machine"))?;
            ticks.push(Tick { t, units: loader.threads(), wait, step, epoch_start: first });
            first = false;
            std::thread::sleep(pause);
        }
    }
    Ok(ticks)
}

/// Batches per second one unit (one thread) makes against a trainer that never waits: the
/// best of three passes over the cached dataset at one thread, so that a pass slowed by
/// other work on the machine does not set the oracle's unit (several threads at once would
/// also measure their contention for the cores, not one unit).
fn calibrate(root: &Path, a: &Args) -> anyhow::Result<f64> {
    let loader = warm_loader(root, a, 1)?;
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t0 = Instant::now();
        let mut n = 0u64;
        for b in loader.iter() {
            b?;
            n += 1;
        }
        best = best.max(n as f64 / t0.elapsed().as_secs_f64());
    }
    Ok(best)
}

fn noise(seed: &mut u64) -> f64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    1.0 + 0.1 * (2.0 * ((*seed >> 11) as f64 / (1u64 << 53) as f64) - 1.0)
}

fn config(a: &Args, policy: PolicyKind) -> AutoscaleConfig {
    AutoscaleConfig {
        window: WindowBy::Millis(a.window_ms),
        settle_batches: 2,
        ..AutoscaleConfig::new(policy, 1, a.max_units)
    }
}

fn warm_loader(root: &Path, a: &Args, threads: usize) -> anyhow::Result<Loader> {
    let loader = Loader::new(spec(root, a, threads)?, Shard::default())?;
    // The first epoch decodes into the cache; the schedule runs on cached samples.
    for b in loader.iter() {
        b?;
    }
    Ok(loader)
}

fn run_policy(root: &Path, a: &Args, policy: PolicyKind, rate: f64) -> anyhow::Result<(PolicyResult, Timeline)> {
    let oracle: Vec<usize> = a.demand.iter().map(|d| d.ceil() as usize).collect();
    let peak = oracle.iter().copied().max().unwrap_or(1);
    let loader = warm_loader(root, a, if policy == PolicyKind::Fixed { peak } else { 1 })?;
    loader.set_threads(if policy == PolicyKind::Fixed { peak } else { 1 });
    // `fixed` runs under the autoscaler too (it never moves), so its windows are recorded.
    let windows = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let record = Arc::clone(&windows);
    let perturb = Box::new(move |w: &mut Window| {
        if let Ok(mut v) = record.lock() {
            v.push((start.elapsed().as_secs_f64(), w.production(), w.consumption()));
        }
    });
    loader.autoscale_perturbed(config(a, policy), perturb)?;
    let phases: Vec<(f64, f64)> = a.demand.iter().map(|d| (d * rate, a.phase_s)).collect();
    let ticks = drive(&loader, &phases, start)?;
    let stats = loader.stats();
    let decisions = stats.autoscale.map_or(0, |s| s.ups + s.downs);
    let cache_bytes = stats.cache.map_or(0, |c| c.tier.used_bytes);

    let mut unit_seconds = 0.0;
    for w in ticks.windows(2) {
        unit_seconds += w[0].units as f64 * (w[1].t - w[0].t);
    }
    let elapsed = ticks.last().map_or(0.0, |t| t.t);
    let waited: f64 = ticks.iter().map(|t| t.wait).sum();
    let mut results = Vec::new();
    for (i, (&demand, &o)) in a.demand.iter().zip(&oracle).enumerate() {
        let (start, end) = (i as f64 * a.phase_s, (i + 1) as f64 * a.phase_s);
        let phase: Vec<&Tick> = ticks.iter().filter(|t| t.t >= start && t.t < end).collect();
        let mut changes = 0;
        let mut last = phase.first().map_or(0, |t| t.units);
        let mut reached = None;
        for t in &phase {
            if t.units != last {
                changes += 1;
                last = t.units;
            }
            if t.units.abs_diff(o) <= 1 {
                reached = Some((changes, t.t - start));
                break;
            }
        }
        let half: Vec<&&Tick> = phase.iter().filter(|t| t.t >= (start + end) / 2.0).collect();
        let settled = half.iter().map(|t| t.units as f64).sum::<f64>() / half.len().max(1) as f64;
        let steady: Vec<&&&Tick> = half.iter().filter(|t| !t.epoch_start).collect();
        let (w, s): (f64, f64) = steady.iter().fold((0.0, 0.0), |(w, s), t| (w + t.wait, s + t.step));
        results.push(PhaseResult {
            demand,
            oracle: o,
            decisions_to_reach: reached.map(|r| r.0),
            windows_to_reach: reached.map(|r| (r.1 * 1000.0 / a.window_ms as f64).ceil()),
            settled_units: settled,
            steady_stall: if w + s > 0.0 { w / (w + s) } else { 0.0 },
        });
    }
    let noise_actions =
        if a.noise_s > 0.0 && policy != PolicyKind::Fixed { Some(noise_run(root, a, policy, rate)?) } else { None };
    let at_phase = |i: usize| i as f64 * a.phase_s;
    let timeline = Timeline {
        units: ticks.iter().map(|t| (t.t, t.units as f64)).collect(),
        windows: windows.lock().map(|v| v.clone()).unwrap_or_default(),
        demand: phases
            .iter()
            .enumerate()
            .map(|(i, p)| (at_phase(i), p.0))
            .chain([(elapsed, phases[phases.len() - 1].0)])
            .collect(),
        oracle: oracle
            .iter()
            .enumerate()
            .map(|(i, &o)| (at_phase(i), o as f64))
            .chain([(elapsed, peak_last(&oracle))])
            .collect(),
        unit_rate: rate,
    };
    let stall = if elapsed > 0.0 { waited / elapsed } else { 0.0 };
    let mean_units = if elapsed > 0.0 { unit_seconds / elapsed } else { 0.0 };
    let prices =
        Prices { core_hour: a.price_core_hour, gb_hour: a.price_gb_hour, accelerator_hour: a.price_accelerator_hour };
    let schedule_s = a.phase_s * a.demand.len() as f64;
    let result = PolicyResult {
        policy: policy.name().to_string(),
        phases: results,
        unit_seconds,
        oracle_unit_seconds: oracle.iter().map(|&o| o as f64 * a.phase_s).sum(),
        stall,
        decisions,
        noise_actions_per_10_windows: noise_actions,
        cache_bytes,
        cost: Cost::of(schedule_s, stall, mean_units, cache_bytes, prices),
    };
    Ok((result, timeline))
}

fn peak_last(oracle: &[usize]) -> f64 {
    oracle.last().copied().unwrap_or(0) as f64
}

/// Stable demand (the first phase's), started at the oracle's count, ±10% noise on P and Q.
fn noise_run(root: &Path, a: &Args, policy: PolicyKind, rate: f64) -> anyhow::Result<f64> {
    let demand = a.demand.first().copied().unwrap_or(1.0);
    let start = (demand * 1.02).ceil() as usize;
    let loader = warm_loader(root, a, start)?;
    loader.set_threads(start);
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let perturb = Box::new(move |w: &mut Window| {
        w.produced *= noise(&mut seed);
        let q = noise(&mut seed);
        let working = (w.elapsed_s - w.wait_s) / q;
        w.elapsed_s = w.wait_s + working;
    });
    let mut c = config(a, policy);
    if policy == PolicyKind::Cachew {
        // Cachew always starts at its lower bound; start it converged at the oracle instead.
        c.min_units = start;
    }
    loader.autoscale_perturbed(c, perturb)?;
    drive(&loader, &[(demand * rate, a.noise_s)], Instant::now())?;
    let s = loader.stats().autoscale.context("the loader lost its autoscaler")?;
    Ok((s.ups + s.downs) as f64 * 10.0 / s.windows.max(1) as f64)
}

pub fn main(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(!a.demand.is_empty() && a.demand.iter().all(|&d| d > 0.0), "--demand needs positive values");
    anyhow::ensure!(
        a.batch > 0 && a.phase_s > 0.0 && a.window_ms > 0 && a.runs > 0,
        "--batch, --phase-s, --window-ms and --runs must be > 0"
    );
    if a.real {
        return real::main(&a);
    }
    let policies: Vec<PolicyKind> = a.policies.iter().map(|p| p.parse()).collect::<Result<_, _>>()?;
    let root = PathBuf::from("data/bench-autoscale");
    dataset::ensure(&root, a.images, 0)?;
    let mut results: Vec<Vec<PolicyResult>> = policies.iter().map(|_| Vec::new()).collect();
    let mut timelines: Vec<Option<Timeline>> = policies.iter().map(|_| None).collect();
    let mut rates = Vec::new();
    for run in 0..a.runs {
        let rate = calibrate(&root, &a)?;
        rates.push(rate);
        eprintln!(
            "run {}/{}: one unit makes {rate:.2} batches/s ({} µs per sample, batches of {})",
            run + 1,
            a.runs,
            a.cost_us,
            a.batch
        );
        // Each run starts with a different policy, so drift in the machine's load is shared.
        for k in (0..policies.len()).map(|i| (i + run) % policies.len()) {
            let (r, t) = run_policy(&root, &a, policies[k], rate)?;
            eprintln!("{}", render(&r));
            results[k].push(r);
            timelines[k] = Some(t);
        }
    }
    let summaries: Vec<Summary> = results.iter().map(|r| summarize(r)).collect();
    let mut table = table(&summaries, a.runs, &rates);
    table += "\n";
    table += &cost_table(&summaries, &a);
    // With --json, stdout carries only the JSON.
    let report = |line: &str| if a.json { eprintln!("{line}") } else { println!("{line}") };
    report(&table);
    for s in summaries.iter().filter(|s| s.policy == "fastmatch") {
        report(&done_when(s));
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    std::fs::write(a.out.join("autoscale.md"), &table)?;
    let json = serde_json::to_string_pretty(
        &serde_json::json!({ "unit_rates": rates, "summaries": summaries, "runs": results }),
    )?;
    std::fs::write(a.out.join("autoscale.json"), &json)?;
    for (p, t) in policies.iter().zip(&timelines) {
        if let Some(t) = t {
            let path = a.out.join(format!("autoscale-{}.svg", p.name()));
            chart::write_svg(&path, &panels(p.name(), t))?;
        }
    }
    eprintln!("wrote the table, JSON and plots to {}", a.out.display());
    if a.json {
        println!("{json}");
    }
    Ok(())
}

/// Median, lowest and highest over the runs.
#[derive(Debug, Serialize, Clone, Copy)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut v: Vec<f64> = values.into_iter().collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Some(Self { median, min: v[0], max: v[n - 1] })
    }

    fn show(s: Option<Self>, scale: f64, digits: usize) -> String {
        match s {
            None => "never".into(),
            Some(s) if s.min == s.max => format!("{:.digits$}", s.median * scale),
            Some(s) => format!("{:.digits$} ({:.digits$}–{:.digits$})", s.median * scale, s.min * scale, s.max * scale),
        }
    }
}

#[derive(Debug, Serialize)]
struct PhaseSummary {
    demand: f64,
    oracle: usize,
    /// Runs in which the policy came within ±1 of the oracle during the phase.
    reached_in: usize,
    decisions_to_reach: Option<Spread>,
    windows_to_reach: Option<Spread>,
    settled_units: Option<Spread>,
    steady_stall: Option<Spread>,
}

#[derive(Debug, Serialize)]
struct Summary {
    policy: String,
    runs: usize,
    unit_seconds_vs_oracle: Option<Spread>,
    stall: Option<Spread>,
    decisions: Option<Spread>,
    noise_actions_per_10_windows: Option<Spread>,
    phases: Vec<PhaseSummary>,
    time_s: Option<Spread>,
    cost_workers: Option<Spread>,
    cost_cache: Option<Spread>,
    cost_accelerator: Option<Spread>,
    cost: Option<Spread>,
}

fn summarize(runs: &[PolicyResult]) -> Summary {
    let phases = runs.first().map_or(0, |r| r.phases.len());
    Summary {
        policy: runs.first().map_or_else(String::new, |r| r.policy.clone()),
        runs: runs.len(),
        unit_seconds_vs_oracle: Spread::of(runs.iter().map(|r| r.unit_seconds / r.oracle_unit_seconds)),
        stall: Spread::of(runs.iter().map(|r| r.stall)),
        decisions: Spread::of(runs.iter().map(|r| r.decisions as f64)),
        noise_actions_per_10_windows: Spread::of(runs.iter().filter_map(|r| r.noise_actions_per_10_windows)),
        time_s: Spread::of(runs.iter().map(|r| r.cost.time_s)),
        cost_workers: Spread::of(runs.iter().map(|r| r.cost.workers)),
        cost_cache: Spread::of(runs.iter().map(|r| r.cost.cache)),
        cost_accelerator: Spread::of(runs.iter().map(|r| r.cost.accelerator)),
        cost: Spread::of(runs.iter().map(|r| r.cost.total)),
        phases: (0..phases)
            .map(|i| {
                let ps: Vec<&PhaseResult> = runs.iter().filter_map(|r| r.phases.get(i)).collect();
                PhaseSummary {
                    demand: ps[0].demand,
                    oracle: ps[0].oracle,
                    reached_in: ps.iter().filter(|p| p.decisions_to_reach.is_some()).count(),
                    decisions_to_reach: Spread::of(ps.iter().filter_map(|p| p.decisions_to_reach.map(|d| d as f64))),
                    windows_to_reach: Spread::of(ps.iter().filter_map(|p| p.windows_to_reach)),
                    settled_units: Spread::of(ps.iter().map(|p| p.settled_units)),
                    steady_stall: Spread::of(ps.iter().map(|p| p.steady_stall)),
                }
            })
            .collect(),
    }
}

/// The markdown table: medians, (lowest–highest) where runs differ.
fn table(summaries: &[Summary], runs: usize, rates: &[f64]) -> String {
    let mut out = format!(
        "Median of {runs} run(s), (lowest–highest) where they differ; one unit made {} batches/s.\n\n",
        Spread::show(Spread::of(rates.iter().copied()), 1.0, 2)
    );
    out += "| policy | reach per phase: decisions / windows (runs reached) | settled units | steady stall per phase | unit-s vs oracle | overall stall | decisions | noise: actions / 10 windows |\n";
    out += "|---|---|---|---|---|---|---|---|\n";
    for s in summaries {
        let per = |f: &dyn Fn(&PhaseSummary) -> String| s.phases.iter().map(f).collect::<Vec<_>>().join("; ");
        out += &format!(
            "| {} | {} | {} | {} | ×{} | {}% | {} | {} |\n",
            s.policy,
            per(&|p| format!(
                "{} / {} ({}/{})",
                Spread::show(p.decisions_to_reach, 1.0, 0),
                Spread::show(p.windows_to_reach, 1.0, 0),
                p.reached_in,
                s.runs
            )),
            per(&|p| format!("{} (oracle {})", Spread::show(p.settled_units, 1.0, 1), p.oracle)),
            per(&|p| format!("{}%", Spread::show(p.steady_stall, 100.0, 1))),
            Spread::show(s.unit_seconds_vs_oracle, 1.0, 2),
            Spread::show(s.stall, 100.0, 1),
            Spread::show(s.decisions, 1.0, 0),
            s.noise_actions_per_10_windows.map_or("–".into(), |n| Spread::show(Some(n), 1.0, 2)),
        );
    }
    out
}

/// The cost model's table: time, cost and stall side by side, with each policy's time and
/// cost against fastmatch's (or the first policy's, without fastmatch).
fn cost_table(summaries: &[Summary], a: &Args) -> String {
    let base = summaries.iter().find(|s| s.policy == "fastmatch").or(summaries.first());
    let median = |s: Option<Spread>| s.map_or(f64::NAN, |s| s.median);
    let (base_name, base_time, base_cost) =
        base.map_or(("–".to_string(), f64::NAN, f64::NAN), |b| (b.policy.clone(), median(b.time_s), median(b.cost)));
    let mut out = format!(
        "Cost model: workers at ${}/core-hour, cache at ${}/GB-hour, the accelerator at ${}/hour; time = the \
         schedule's {:.0} s of training ÷ (1 − stall). Medians; cost in milli-dollars.\n\n",
        a.price_core_hour,
        a.price_gb_hour,
        a.price_accelerator_hour,
        a.phase_s * a.demand.len() as f64
    );
    out += &format!(
        "| policy | time (s) | time vs {base_name} | workers (m$) | cache (m$) | accelerator (m$) | total (m$) | cost vs {base_name} | overall stall |\n"
    );
    out += "|---|---|---|---|---|---|---|---|---|\n";
    for s in summaries {
        let (t, c) = (median(s.time_s), median(s.cost));
        out += &format!(
            "| {} | {} | ×{:.2} | {} | {} | {} | {} | ×{:.2} | {}% |\n",
            s.policy,
            Spread::show(s.time_s, 1.0, 1),
            t / base_time,
            Spread::show(s.cost_workers, 1000.0, 2),
            Spread::show(s.cost_cache, 1000.0, 3),
            Spread::show(s.cost_accelerator, 1000.0, 2),
            Spread::show(s.cost, 1000.0, 2),
            c / base_cost,
            Spread::show(s.stall, 100.0, 1),
        );
    }
    out
}

/// Issue 14's targets for fastmatch, worst run for reach, medians for the rest.
fn done_when(s: &Summary) -> String {
    let worst_reach =
        s.phases
            .iter()
            .map(|p| {
                if p.reached_in < s.runs {
                    f64::INFINITY
                } else {
                    p.decisions_to_reach.map_or(f64::INFINITY, |d| d.max)
                }
            })
            .fold(0.0, f64::max);
    let units = s.unit_seconds_vs_oracle.map_or(f64::INFINITY, |u| u.median);
    let stall = s.phases.iter().filter_map(|p| p.steady_stall.map(|x| x.median)).fold(0.0, f64::max);
    let noise = s.noise_actions_per_10_windows.map_or(f64::INFINITY, |n| n.median);
    let ok = |b: bool| if b { "yes" } else { "NO" };
    format!(
        "fastmatch vs issue 14: within ±1 in ≤ 3 decisions after every change (worst run: {worst_reach}): {}; \
         unit-s ≤ 1.1× oracle ({units:.2}): {}; steady stall ≤ 2% (worst phase's median {:.1}%): {}; \
         ≤ 1 action / 10 windows with noise ({noise:.2}): {}",
        ok(worst_reach <= 3.0),
        ok(units <= 1.1),
        stall * 100.0,
        ok(stall <= 0.02),
        ok(noise <= 1.0)
    )
}

/// Units with the oracle's, and P and Q per window with the demand.
fn panels(policy: &str, t: &Timeline) -> [Panel; 2] {
    let units = Panel {
        title: format!("{policy}: units (threads) over time"),
        x: "seconds".into(),
        y: "units".into(),
        series: vec![Series::steps(policy, t.units.clone()), Series::steps("oracle", t.oracle.clone())],
        log_x: false,
    };
    let pq = Panel {
        title: format!("{policy}: production P and consumption Q per window (1 unit = {:.1} batches/s)", t.unit_rate),
        x: "seconds".into(),
        y: "batches/s".into(),
        series: vec![
            Series::marked("P (measured)", t.windows.iter().map(|w| (w.0, w.1)).collect()),
            Series::marked("Q (measured)", t.windows.iter().map(|w| (w.0, w.2)).collect()),
            Series::steps("demand", t.demand.clone()),
        ],
        log_x: false,
    };
    [units, pq]
}

fn render(r: &PolicyResult) -> String {
    let phases: Vec<String> = r
        .phases
        .iter()
        .map(|p| {
            let reach = match (p.decisions_to_reach, p.windows_to_reach) {
                (Some(d), Some(w)) => format!("{d} decisions/{w:.0} windows"),
                _ => "never".into(),
            };
            format!(
                "demand {:.1} (oracle {}): within ±1 after {reach}, settled at {:.1}, steady stall {:.1}%",
                p.demand,
                p.oracle,
                p.settled_units,
                p.steady_stall * 100.0
            )
        })
        .collect();
    format!(
        "{}: unit-seconds {:.1} vs oracle {:.1} (×{:.2}), stall {:.1}%, {} decisions, noise: {}; \
         cost model: {:.1} s, {:.2} m$\n  {}",
        r.policy,
        r.unit_seconds,
        r.oracle_unit_seconds,
        r.unit_seconds / r.oracle_unit_seconds,
        r.stall * 100.0,
        r.decisions,
        r.noise_actions_per_10_windows.map_or("-".into(), |n| format!("{n:.2} actions/10 windows")),
        r.cost.time_s,
        r.cost.total * 1000.0,
        phases.join("\n  ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cost_model_charges_stalls_at_the_accelerators_price() {
        let p = Prices { core_hour: 0.04, gb_hour: 0.005, accelerator_hour: 2.5 };
        // An hour of training work at 50% stall takes 2 hours: 4 units, 2 GB held.
        let c = Cost::of(3600.0, 0.5, 4.0, 2_000_000_000, p);
        assert!((c.time_s - 7200.0).abs() < 1e-9);
        assert!((c.workers - 4.0 * 2.0 * 0.04).abs() < 1e-12, "{c:?}");
        assert!((c.cache - 2.0 * 2.0 * 0.005).abs() < 1e-12, "{c:?}");
        assert!((c.accelerator - 5.0).abs() < 1e-12, "{c:?}");
        assert!((c.total - (c.workers + c.cache + c.accelerator)).abs() < 1e-12);
        // No stall: the schedule's own length, whatever the units.
        assert_eq!(Cost::of(60.0, 0.0, 1.0, 0, p).time_s, 60.0);
    }
}
