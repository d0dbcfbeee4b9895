//! Where a pipeline's time and cores go as it gets more threads (or, through the service,
//! more worker processes): each setting run and measured, the knee of the throughput
//! curve, and a report ([`report`]) as a terminal table or one self-contained HTML page
//! with plots. The `sluice profile` command and Python's `sluice.profile` both use it.

pub mod chart;
pub mod local_service;
pub mod report;

use std::time::Instant;

use serde::Serialize;
use sluice_core::PipelineSpec;
use sluice_pipeline::{Loader, OpCounters, PipelineError, Shard};

pub use report::{html, text_table};

/// What can go wrong in a profile.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// A `--sweep` (or `sweep=`) that is not `threads=1,2,...` or `workers=1,2,...`.
    #[error("sweep {sweep:?}: {why}")]
    Sweep { sweep: String, why: String },
    /// The pipeline failed at one setting.
    #[error("at {units} threads: {source}")]
    Pipeline { units: usize, source: PipelineError },
    /// A chart could not be drawn (or its file written).
    #[error("drawing {what}: {message}")]
    Chart { what: String, message: String },
    /// A process of the local service could not be started.
    #[error("starting {command}: {source}")]
    Spawn { command: String, source: std::io::Error },
}

/// What is swept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    Threads,
    Workers,
}

impl Unit {
    pub fn name(self) -> &'static str {
        match self {
            Unit::Threads => "threads",
            Unit::Workers => "workers",
        }
    }
}

/// `threads=1,2,4` → (threads, [1, 2, 4]).
pub fn parse_sweep(s: &str) -> Result<(Unit, Vec<usize>), ProfileError> {
    let bad = |why: &str| ProfileError::Sweep { sweep: s.to_string(), why: why.to_string() };
    let Some((what, values)) = s.split_once('=') else {
        return Err(bad("expected threads=1,2,4 or workers=1,2"));
    };
    let unit = match what.trim() {
        "threads" => Unit::Threads,
        "workers" => Unit::Workers,
        other => return Err(bad(&format!("cannot sweep {other:?}; expected threads or workers"))),
    };
    let values: Vec<usize> = values
        .split(',')
        .map(|v| v.trim().parse::<usize>().ok().filter(|&n| n > 0))
        .collect::<Option<_>>()
        .ok_or_else(|| bad("values must be positive integers, comma-separated"))?;
    Ok((unit, values))
}

/// One op at one setting.
#[derive(Debug, Clone, Serialize)]
pub struct OpRow {
    pub op: String,
    /// Wall time in the op summed over threads, per image (its CPU time is the counters'
    /// `task_clock_ns`).
    pub busy_us_per_image: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counters: Option<OpCounters>,
}

/// One setting of the sweep: the report's main table has one line per row.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub unit: Unit,
    pub units: usize,
    pub images: usize,
    pub seconds: f64,
    pub images_per_s: f64,
    /// CPU time of every process involved (this one, and the dispatcher and workers in a
    /// workers sweep) per image.
    pub cpu_s_per_image: f64,
    /// Throughput against the previous setting, in percent (none for the first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gain_pct: Option<f64>,
    /// Per op; empty in a workers sweep (the ops run in the worker processes: see their
    /// metrics or `sluice worker --trace-dir`).
    pub ops: Vec<OpRow>,
}

/// The setting past which one more unit adds less than 3% throughput (the last one if every
/// step still paid).
pub fn knee(rows: &[Row]) -> Option<usize> {
    rows.windows(2)
        .find(|w| w[1].images_per_s < 1.03 * w[0].images_per_s)
        .map(|w| w[0].units)
        .or_else(|| rows.last().map(|r| r.units))
}

/// The median of `values` (sorted in place): the middle value for an odd count, the mean
/// of the two middle values for an even one, NaN for none. The one median of the tree:
/// profiles and benchmarks report it over runs.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// CPU seconds (user + system) this process has used.
pub fn self_cpu() -> f64 {
    // SAFETY: getrusage writes into the struct we pass; a zeroed rusage is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// Runs every setting `runs` times, interleaved, and keeps each setting's median run.
/// `point(units, run)` measures one setting; `progress` hears a line before and after each.
pub fn sweep<E>(
    unit: Unit,
    values: &[usize],
    runs: usize,
    mut point: impl FnMut(usize, usize) -> Result<Row, E>,
    mut progress: impl FnMut(&str),
) -> Result<Vec<Row>, E> {
    let mut results: Vec<Vec<Row>> = vec![Vec::new(); values.len()];
    let total = values.len() * runs.max(1);
    let mut done = 0;
    for run in 0..runs.max(1) {
        for (k, &n) in values.iter().enumerate() {
            progress(&format!("[{}/{total}] run {run}: {n} {} ...", done + 1, unit.name()));
            let row = point(n, run)?;
            progress(&format!(
                "[{}/{total}] run {run}: {n} {}: {:.0} images/s, {:.2} CPU-ms/image",
                done + 1,
                unit.name(),
                row.images_per_s,
                1e3 * row.cpu_s_per_image
            ));
            done += 1;
            results[k].push(row);
        }
    }
    let mut rows: Vec<Row> = results
        .into_iter()
        .filter_map(|mut runs| {
            runs.sort_by(|a, b| a.images_per_s.total_cmp(&b.images_per_s));
            let middle = runs.len() / 2;
            (!runs.is_empty()).then(|| runs.swap_remove(middle))
        })
        .collect();
    for i in 1..rows.len() {
        let prev = rows[i - 1].images_per_s;
        rows[i].gain_pct = (prev > 0.0).then(|| 100.0 * (rows[i].images_per_s / prev - 1.0));
    }
    Ok(rows)
}

/// One local setting: `threads` worker threads, one warm-up epoch, then `epochs` measured
/// ones with per-op counters on.
pub fn threads_point(spec: &PipelineSpec, threads: usize, epochs: u64) -> Result<Row, ProfileError> {
    let failed = |source| ProfileError::Pipeline { units: threads, source };
    let mut spec = spec.clone();
    spec.threads = threads.into();
    let loader = Loader::new(spec, Shard::default()).map_err(failed)?;
    // Warm-up: page cache, decoder state, thread start.
    for b in loader.iter() {
        b.map_err(failed)?;
    }
    let before = loader.stats();
    loader.set_op_counters(true);
    let (t0, c0) = (Instant::now(), self_cpu());
    let mut images = 0;
    for epoch in 1..=epochs {
        loader.set_epoch(epoch);
        for b in loader.iter() {
            images += b.map_err(failed)?.len();
        }
    }
    let (seconds, cpu) = (t0.elapsed().as_secs_f64(), self_cpu() - c0);
    let after = loader.stats();
    let per = |s: f64| 1e6 * s / images.max(1) as f64;
    // Busy times are cumulative: the measured epochs are the difference. The percentiles
    // and counters include the warm-up epoch (counters: only the measured ones).
    let ops = after
        .op_seconds
        .iter()
        .zip(&before.op_seconds)
        .zip(&after.op_percentiles)
        .enumerate()
        .map(|(i, (((op, t1), (_, t0)), p))| OpRow {
            op: op.clone(),
            busy_us_per_image: per(t1 - t0),
            p50_us: 1e6 * p.p50_s,
            p99_us: 1e6 * p.p99_s,
            counters: after.op_counters.as_ref().and_then(|c| c.get(i).cloned()),
        })
        .collect();
    Ok(row(Unit::Threads, threads, images, seconds, cpu, ops))
}

/// A row from what a setting measured (no gain yet: [`sweep`] fills it in).
pub fn row(unit: Unit, units: usize, images: usize, seconds: f64, cpu: f64, ops: Vec<OpRow>) -> Row {
    Row {
        unit,
        units,
        images,
        seconds,
        images_per_s: images as f64 / seconds.max(1e-9),
        cpu_s_per_image: cpu / images.max(1) as f64,
        gain_pct: None,
        ops,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn at(units: usize, images_per_s: f64) -> Row {
        row(Unit::Threads, units, 100, 100.0 / images_per_s, 1.0, Vec::new())
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&mut [7.0]), 7.0);
        assert!(median(&mut []).is_nan());
    }

    #[test]
    fn the_knee_is_the_last_setting_before_a_step_that_adds_under_three_percent() {
        assert_eq!(knee(&[at(1, 100.0), at(2, 190.0), at(4, 195.0), at(8, 300.0)]), Some(2));
        assert_eq!(knee(&[at(1, 100.0), at(2, 190.0)]), Some(2), "every step paid: the last");
        assert_eq!(knee(&[]), None);
    }

    #[test]
    fn a_sweep_names_threads_or_workers_and_positive_counts() {
        assert_eq!(parse_sweep("threads=1,2,4").unwrap(), (Unit::Threads, vec![1, 2, 4]));
        assert_eq!(parse_sweep("workers= 1, 2").unwrap(), (Unit::Workers, vec![1, 2]));
        for bad in ["threads", "cores=1,2", "threads=1,x", "threads=0,1", "threads="] {
            let e = parse_sweep(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }
}
