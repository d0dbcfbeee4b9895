//! `sluice-bench workers` (formerly `sluice bench-workers`): the service's throughput from
//! 1 to 64 worker processes.
//!
//! Real `sluice dispatcher` and `sluice worker` processes (one thread each) and a
//! RemoteLoader over loopback, on a pipeline whose per-sample cost is emulated by the
//! `sleep` op after a small decode, so dozens of workers do not contend for a few cores
//! (FastMatch's Fig. 11 setting). Each worker count gets the same work per worker, so the
//! ideal is a constant epoch time and a throughput linear in workers. Where it stops being
//! linear, the CPU seconds of the dispatcher, the client and the workers per second of the
//! epoch, and the bytes per second of the data plane, say which side ran out.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use serde::Serialize;
use sluice_client::{RemoteLoader, RemoteOptions};
use sluice_core::PipelineSpec;

use sluice_profile::chart::{self, Panel, Series};
use sluice_profile::local_service::{proc_cpu, Proc};
use sluice_profile::{median, self_cpu};

use crate::service::service;

#[derive(clap::Args)]
pub struct Args {
    /// Worker process counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4, 8, 16, 32, 64])]
    workers: Vec<usize>,
    /// Emulated cost per sample, µs (the `sleep` op).
    #[arg(long, default_value_t = 50_000)]
    cost_us: u32,
    /// Samples per worker in each measured epoch (the ideal epoch time is this × cost).
    #[arg(long, default_value_t = 100)]
    per_worker: usize,
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Batches per task: small tasks keep every worker busy to the end of the epoch.
    #[arg(long, default_value_t = 1)]
    task_batches: u64,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Where the table (workers.md), the JSON and the plot (workers.svg) go.
    #[arg(long, default_value = "data/bench-workers/out")]
    out: PathBuf,
    #[arg(long)]
    json: bool,
}

/// One measured epoch at one worker count.
#[derive(Debug, Serialize, Clone)]
struct Point {
    workers: usize,
    samples: usize,
    seconds: f64,
    samples_per_s: f64,
    /// CPU seconds per second of the epoch, each side.
    dispatcher_cpu: f64,
    client_cpu: f64,
    workers_cpu: f64,
    /// Pixels delivered to the client, bytes per second.
    data_plane_bytes_per_s: f64,
}

#[derive(Debug, Serialize)]
struct Row {
    workers: usize,
    samples_per_s: f64,
    min: f64,
    max: f64,
    /// Median throughput ÷ (workers × the 1-worker median).
    vs_linear: f64,
    /// Median throughput ÷ (workers ÷ cost): the sleep's own limit.
    vs_cost_limit: f64,
    dispatcher_cpu: f64,
    client_cpu: f64,
    workers_cpu: f64,
    data_plane_bytes_per_s: f64,
}

fn spec(list: &Path, root: &Path, a: &Args, seed: u64) -> anyhow::Result<PipelineSpec> {
    let json = serde_json::json!({
        "source": { "kind": "file_list", "path": list, "root": root },
        "ops": [
            { "op": "decode" },
            { "op": "random_resized_crop", "size": 32 },
            { "op": "sleep", "us": a.cost_us },
        ],
        "batch": { "size": a.batch },
        "threads": 1,
        "seed": seed,
    });
    Ok(PipelineSpec::from_json_str(&json.to_string())?)
}

/// A few small JPEGs listed `samples` times over: decoding stays cheap next to the sleep.
fn dataset(dir: &Path, samples: usize) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let options = sluice_synth::DatasetOptions { texture: 0, quality: 50, ..Default::default() };
    for i in 0..8 {
        let path = dir.join(format!("{i}.jpg"));
        if !path.exists() {
            std::fs::write(&path, sluice_synth::image_jpeg(i, &options)?)?;
        }
    }
    let list = dir.join(format!("list-{samples}.txt"));
    let lines: String = (0..samples).map(|i| format!("{}.jpg {}\n", i % 8, i % 8)).collect();
    std::fs::write(&list, lines)?;
    Ok(list)
}

fn measure(work: &Path, data: &Path, a: &Args, workers: usize, run: usize) -> anyhow::Result<Point> {
    let samples = workers * a.per_worker;
    let list = dataset(data, samples)?;
    let (addr, procs) = service(work, data, workers, 1)?;
    let mut o = RemoteOptions::new(addr, format!("workers-{workers}-{run}"));
    o.token = None;
    o.tasks_in_flight = 2 * workers;
    o.task_batches = a.task_batches;
    let mut loader = RemoteLoader::connect(&spec(&list, data, a, run as u64)?, o)
        .with_context(|| format!("connecting to the service of {workers} workers"))?;
    // The first epoch waits for every worker to start and register; measure the second.
    for b in loader.iter() {
        b?;
    }
    let cpu = |procs: &[Proc]| -> (f64, f64, f64) {
        let dispatcher = procs.first().map_or(0.0, |p| proc_cpu(p.0.id()));
        let workers = procs.iter().skip(1).map(|p| proc_cpu(p.0.id())).sum();
        (dispatcher, self_cpu(), workers)
    };
    let (d0, c0, w0) = cpu(&procs);
    let t0 = Instant::now();
    let (mut n, mut bytes) = (0usize, 0usize);
    for b in loader.iter() {
        let b = b?;
        n += b.len();
        bytes += b.images.as_bytes().len();
    }
    let seconds = t0.elapsed().as_secs_f64();
    let (d1, c1, w1) = cpu(&procs);
    drop(loader);
    drop(procs);
    Ok(Point {
        workers,
        samples: n,
        seconds,
        samples_per_s: n as f64 / seconds,
        dispatcher_cpu: (d1 - d0) / seconds,
        client_cpu: (c1 - c0) / seconds,
        workers_cpu: (w1 - w0) / seconds,
        data_plane_bytes_per_s: bytes as f64 / seconds,
    })
}

pub fn main(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        !a.workers.is_empty() && a.workers.iter().all(|&w| w > 0) && a.runs > 0 && a.per_worker > 0,
        "--workers, --runs and --per-worker need positive values"
    );
    let work = PathBuf::from("data/bench-workers");
    std::fs::create_dir_all(&work)?;
    let work = work.canonicalize()?;
    let data = work.join("images");
    let mut points: Vec<Vec<Point>> = a.workers.iter().map(|_| Vec::new()).collect();
    for run in 0..a.runs {
        // Each run starts at a different count, so drift in the machine's load is shared.
        for k in (0..a.workers.len()).map(|i| (i + run) % a.workers.len()) {
            let p = measure(&work, &data, &a, a.workers[k], run)?;
            eprintln!(
                "run {}/{}: {:>2} workers: {:.0} samples/s ({} in {:.2} s); CPU s/s: dispatcher {:.3}, client {:.3}, workers {:.3}",
                run + 1,
                a.runs,
                p.workers,
                p.samples_per_s,
                p.samples,
                p.seconds,
                p.dispatcher_cpu,
                p.client_cpu,
                p.workers_cpu
            );
            points[k].push(p);
        }
    }
    let med = |ps: &[Point], f: fn(&Point) -> f64| median(&mut ps.iter().map(f).collect::<Vec<_>>());
    let one = a.workers.iter().position(|&w| w == 1).map(|k| med(&points[k], |p| p.samples_per_s));
    let per_worker = one.unwrap_or(1e6 / a.cost_us as f64);
    let rows: Vec<Row> = a
        .workers
        .iter()
        .zip(&points)
        .map(|(&w, ps)| {
            let s = med(ps, |p| p.samples_per_s);
            Row {
                workers: w,
                samples_per_s: s,
                min: ps.iter().map(|p| p.samples_per_s).fold(f64::INFINITY, f64::min),
                max: ps.iter().map(|p| p.samples_per_s).fold(0.0, f64::max),
                vs_linear: s / (w as f64 * per_worker),
                vs_cost_limit: s / (w as f64 * 1e6 / a.cost_us as f64),
                dispatcher_cpu: med(ps, |p| p.dispatcher_cpu),
                client_cpu: med(ps, |p| p.client_cpu),
                workers_cpu: med(ps, |p| p.workers_cpu),
                data_plane_bytes_per_s: med(ps, |p| p.data_plane_bytes_per_s),
            }
        })
        .collect();
    let table = table(&rows, &a, per_worker);
    if a.json {
        eprintln!("{table}");
    } else {
        println!("{table}");
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    std::fs::write(a.out.join("workers.md"), &table)?;
    let json = serde_json::to_string_pretty(&serde_json::json!({ "rows": rows, "runs": points }))?;
    std::fs::write(a.out.join("workers.json"), &json)?;
    chart::write_svg(&a.out.join("workers.svg"), &panels(&rows, per_worker))?;
    eprintln!("wrote the table, JSON and plot to {}", a.out.display());
    if a.json {
        println!("{json}");
    }
    Ok(())
}

fn table(rows: &[Row], a: &Args, per_worker: f64) -> String {
    let mut out = format!(
        "Median of {} run(s) (lowest–highest); {} µs per sample, 1 thread per worker, batches of {}, \
         {} batch(es) per task, {} samples per worker per epoch; linear = workers × {per_worker:.1} samples/s.\n\n",
        a.runs, a.cost_us, a.batch, a.task_batches, a.per_worker
    );
    out += "| workers | samples/s | vs linear | vs cost limit | dispatcher CPU s/s | client CPU s/s | workers CPU s/s | data plane MB/s |\n";
    out += "|---|---|---|---|---|---|---|---|\n";
    for r in rows {
        out += &format!(
            "| {} | {:.0} ({:.0}–{:.0}) | {:.1}% | {:.1}% | {:.3} | {:.3} | {:.3} | {:.2} |\n",
            r.workers,
            r.samples_per_s,
            r.min,
            r.max,
            100.0 * r.vs_linear,
            100.0 * r.vs_cost_limit,
            r.dispatcher_cpu,
            r.client_cpu,
            r.workers_cpu,
            r.data_plane_bytes_per_s / 1e6
        );
    }
    out
}

fn panels(rows: &[Row], per_worker: f64) -> [Panel; 2] {
    let throughput = Panel {
        title: "service throughput vs worker processes (sleep op)".into(),
        x: "worker processes".into(),
        y: "samples/s".into(),
        series: vec![
            Series::marked("measured (median)", rows.iter().map(|r| (r.workers as f64, r.samples_per_s)).collect()),
            Series::line("linear", rows.iter().map(|r| (r.workers as f64, r.workers as f64 * per_worker)).collect()),
        ],
        log_x: true,
    };
    let cpu = Panel {
        title: "CPU seconds per second of the epoch".into(),
        x: "worker processes".into(),
        y: "CPU s/s".into(),
        series: vec![
            Series::marked("dispatcher", rows.iter().map(|r| (r.workers as f64, r.dispatcher_cpu)).collect()),
            Series::marked("client", rows.iter().map(|r| (r.workers as f64, r.client_cpu)).collect()),
            Series::marked("all workers", rows.iter().map(|r| (r.workers as f64, r.workers_cpu)).collect()),
        ],
        log_x: true,
    };
    [throughput, cpu]
}
