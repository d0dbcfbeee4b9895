//! `sluice-bench service` (formerly `sluice bench-service`): the service against local mode
//! and the hardware, in one run.
//!
//! * throughput: images/s of the training pipeline through dispatcher + N worker processes
//!   + RemoteLoader over loopback, against the local Loader with the same total threads;
//! * data plane: bytes/s of a no-op worker through gRPC, against raw loopback TCP;
//! * dispatcher: GetTask/AckTask rate and latency from 1..64 concurrent clients, with the
//!   journal fsync'd on disk.
//!
//! Medians over `--runs`, ratios taken within the run: the machine is shared and noisy.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;
use sluice_client::wire::{message_to_batch, Outgoing};
use sluice_client::{Compression, DataPlane, RemoteLoader, RemoteOptions};
use sluice_core::{PipelineSpec, SourceSpec};
use sluice_pipeline::{Loader, Shard};
use sluice_profile::local_service::{self, proc_cpu, tree_cpu, Proc};
use sluice_profile::{median, self_cpu};

use crate::dataset;

mod importance_scale;
mod measure;

#[derive(clap::Args)]
pub struct Args {
    /// What to measure: all, throughput, dataplane, compression, dispatcher;
    /// importance-scale (not in all): an importance-sampled job of --samples samples, each
    /// epoch checked against the local loader's draw.
    #[arg(long, default_value = "all", value_parser = ["all", "throughput", "dataplane", "compression", "dispatcher", "importance-scale"])]
    what: String,
    /// Samples of the importance-scale job.
    #[arg(long, default_value_t = 2_000_000)]
    samples: usize,
    /// Batches per task in the throughput runs (0: the dispatcher's default).
    #[arg(long, default_value_t = 0)]
    task_batches: u64,
    /// How pixels travel in the throughput runs: none or zstd.
    #[arg(long, default_value = "none", value_parser = ["none", "zstd"])]
    compression: String,
    /// How batches travel in the throughput runs: auto (shared memory, the workers being
    /// on this machine), tcp or grpc.
    #[arg(long, default_value = "auto", value_parser = ["auto", "tcp", "grpc"])]
    data_plane: String,
    /// An ImageFolder of JPEGs; without it one is generated in data/bench-service.
    #[arg(long)]
    data: Option<PathBuf>,
    #[arg(long, default_value_t = 256)]
    images: usize,
    /// Worker process counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    workers: Vec<usize>,
    /// Total decode threads, local and remote alike (default: cores).
    #[arg(long)]
    threads: Option<usize>,
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Measured epochs per run (after one warm-up epoch).
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Concurrent clients for the dispatcher load, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    clients: Vec<usize>,
    /// Seconds per dispatcher load point.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    #[arg(long)]
    json: bool,
}

/// `sluice service dispatcher` and `workers` workers of `threads` threads on this machine
/// ([`local_service::start`]), the dispatcher given `dispatcher_args` besides.
pub(crate) fn service_with(
    dir: &Path,
    root: &Path,
    workers: usize,
    threads: usize,
    dispatcher_args: &[&str],
) -> Result<(String, Vec<Proc>)> {
    Ok(local_service::start(&dataset::sluice_exe()?, dir, root, workers, threads, dispatcher_args)?)
}

pub(crate) fn service(dir: &Path, root: &Path, workers: usize, threads: usize) -> Result<(String, Vec<Proc>)> {
    service_with(dir, root, workers, threads, &[])
}

fn spec(root: &Path, batch: usize, threads: usize, seed: u64) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(SourceSpec::ImageFolder { root: root.to_path_buf() }, 224, batch);
    s.threads = threads.into();
    s.seed = seed;
    s
}

pub fn main(a: Args) -> Result<()> {
    anyhow::ensure!((0.0..=1e9).contains(&a.seconds), "--seconds must be from 0 to 1e9");
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let threads = a.threads.unwrap_or(cores);
    let work = PathBuf::from("data/bench-service");
    std::fs::create_dir_all(&work)?;
    let work = work.canonicalize()?;
    let mut out = serde_json::Map::new();
    let all = a.what == "all";

    let images = || -> Result<PathBuf> {
        Ok(match &a.data {
            Some(d) => d.canonicalize()?,
            None => {
                let root = work.join("images");
                dataset::ensure(&root, a.images, 0)?;
                root
            }
        })
    };
    let compression = Compression::parse(&a.compression)?;
    let data_plane = DataPlane::parse(&a.data_plane)?;

    if all || a.what == "throughput" {
        let root = images()?;
        // Every service is started up front (idle processes cost nothing) and each run
        // measures local and every worker count back to back, so the machine's noise hits
        // them alike; the ratio is taken per run, then the median.
        let services: Vec<(usize, usize, String, Vec<Proc>)> = a
            .workers
            .iter()
            .map(|&w| {
                let per = (threads / w.max(1)).max(1);
                service(&work, &root, w, per).map(|(addr, procs)| (w, per, addr, procs))
            })
            .collect::<Result<_>>()?;
        let mut local = Vec::new();
        let mut remote: Vec<Vec<f64>> = vec![Vec::new(); services.len()];
        let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); services.len()];
        // Images per CPU-second (client, dispatcher and workers together): what the
        // service costs in CPU, unaffected by other load on a shared machine.
        let mut local_eff = Vec::new();
        let mut eff_ratios: Vec<Vec<f64>> = vec![Vec::new(); services.len()];
        for run in 0..a.runs {
            let loader = Loader::new(spec(&root, a.batch, threads, run as u64), Shard::default())?;
            for b in loader.iter() {
                b?;
            }
            let t0 = Instant::now();
            let c0 = self_cpu();
            let mut n = 0;
            for _ in 0..a.epochs {
                for b in loader.iter() {
                    n += b?.len();
                }
            }
            let l = n as f64 / t0.elapsed().as_secs_f64();
            let le = n as f64 / (self_cpu() - c0).max(1e-9);
            local.push(l);
            local_eff.push(le);
            for (k, (w, per, addr, procs)) in services.iter().enumerate() {
                let mut o = RemoteOptions::new(addr.clone(), format!("bench-{w}-{run}"));
                o.token = None;
                o.tasks_in_flight = 2 * w;
                o.compression = compression;
                o.data_plane = data_plane;
                o.task_batches = a.task_batches;
                let mut loader = RemoteLoader::connect(&spec(&root, a.batch, *per, run as u64), o)?;
                for b in loader.iter() {
                    b?;
                }
                let t0 = Instant::now();
                let c0 = tree_cpu(procs);
                let (client0, dispatcher0) = (self_cpu(), proc_cpu(procs[0].0.id()));
                let mut n = 0;
                for _ in 0..a.epochs {
                    for b in loader.iter() {
                        n += b?.len();
                    }
                }
                let r = n as f64 / t0.elapsed().as_secs_f64();
                let cpu = tree_cpu(procs) - c0;
                let re = n as f64 / cpu.max(1e-9);
                eff_ratios[k].push(re / le);
                // Where the CPU went, in µs per image: client, dispatcher, workers.
                let client = self_cpu() - client0;
                let dispatcher = proc_cpu(procs[0].0.id()) - dispatcher0;
                let per_img = |s: f64| 1e6 * s / n.max(1) as f64;
                eprintln!(
                    "run {run}: local {l:.0} img/s ({le:.0} img/CPU-s), {w} workers x {per} threads {r:.0} img/s ({:.1}%), {re:.0} img/CPU-s ({:.1}%); \
                     CPU µs/img: local {:.0}, remote {:.0} = workers {:.0} + client {:.0} + dispatcher {:.0}",
                    100.0 * r / l,
                    100.0 * re / le,
                    1e6 / le,
                    per_img(cpu),
                    per_img(cpu - client - dispatcher),
                    per_img(client),
                    per_img(dispatcher)
                );
                remote[k].push(r);
                ratios[k].push(r / l);
            }
        }
        let local = median(&mut local);
        let local_eff = median(&mut local_eff);
        eprintln!("local: {local:.0} img/s, {local_eff:.0} img/CPU-s ({threads} threads), median of {} runs", a.runs);
        let mut rows = Vec::new();
        for (k, (w, per, _, _)) in services.iter().enumerate() {
            let r = median(&mut remote[k]);
            let ratio = median(&mut ratios[k]);
            let eff = median(&mut eff_ratios[k]);
            eprintln!(
                "remote, {w} workers x {per} threads: {r:.0} img/s; median per-run ratio to local: throughput {:.1}%, img per CPU-second {:.1}%",
                100.0 * ratio,
                100.0 * eff
            );
            rows.push(json!({"workers": w, "threads_per_worker": per, "img_per_s": r, "vs_local": ratio, "cpu_efficiency_vs_local": eff}));
        }
        out.insert(
            "throughput".into(),
            json!({"local_img_per_s": local, "local_img_per_cpu_s": local_eff, "threads": threads, "remote": rows}),
        );
    }

    if all || a.what == "dataplane" {
        let (samples, side) = (64usize, 224usize);
        let batch_bytes = (samples * side * side * 3) as u64;
        let batches = 200u64;
        let (mut raw, mut grpc, mut tcp, mut local) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..a.runs {
            raw.push(measure::raw_tcp(batch_bytes * batches, 1 << 20)?);
            tcp.push(measure::own_data_plane(samples, side, batches, 2, false)?);
            local.push(measure::own_data_plane(samples, side, batches, 2, true)?);
            grpc.push(measure::data_plane(samples, side, batches, 2)?);
        }
        let (raw, grpc, tcp, local) = (median(&mut raw), median(&mut grpc), median(&mut tcp), median(&mut local));
        eprintln!(
            "data plane ({} MB batches, no-op worker): TCP data plane {:.2} GB/s = {:.1}% of raw loopback TCP {:.2} GB/s; \
             local (shared memory) {:.2} GB/s = {:.1}%; gRPC streaming {:.2} GB/s = {:.1}%",
            batch_bytes / 1_000_000,
            tcp / 1e9,
            100.0 * tcp / raw,
            raw / 1e9,
            local / 1e9,
            100.0 * local / raw,
            grpc / 1e9,
            100.0 * grpc / raw
        );
        out.insert(
            "dataplane".into(),
            json!({"tcp_bytes_per_s": tcp, "local_bytes_per_s": local, "grpc_bytes_per_s": grpc, "raw_tcp_bytes_per_s": raw,
                   "tcp_ratio": tcp / raw, "local_ratio": local / raw, "grpc_ratio": grpc / raw, "batch_bytes": batch_bytes}),
        );
    }

    if all || a.what == "compression" {
        let root = images()?;
        let row = compression_on_batches(&root, a.batch, threads)?;
        eprintln!(
            "delta + zstd on the pipeline's batches: {:.1} MB -> {:.1} MB (ratio {:.3}); one core compresses {:.2} GB/s ({:.0} µs/img), \
             decompresses {:.2} GB/s ({:.0} µs/img)",
            row.raw_bytes as f64 / 1e6,
            row.packed_bytes as f64 / 1e6,
            row.ratio,
            row.compress_bytes_per_s / 1e9,
            row.compress_us_per_img,
            row.decompress_bytes_per_s / 1e9,
            row.decompress_us_per_img
        );
        out.insert(
            "compression".into(),
            json!({"raw_bytes": row.raw_bytes, "packed_bytes": row.packed_bytes, "ratio": row.ratio,
                   "compress_bytes_per_s": row.compress_bytes_per_s, "decompress_bytes_per_s": row.decompress_bytes_per_s,
                   "compress_us_per_img": row.compress_us_per_img, "decompress_us_per_img": row.decompress_us_per_img}),
        );
    }

    if a.what == "importance-scale" {
        let workers = a.workers.first().copied().unwrap_or(2);
        out.insert("importance_scale".into(), importance_scale::run(&work, a.samples, a.epochs, workers, threads)?);
    }

    if all || a.what == "dispatcher" {
        // One tiny image listed many times: a job of many one-sample tasks.
        let dir = work.join("load");
        std::fs::create_dir_all(&dir)?;
        let img = dir.join("one.jpg");
        if !img.exists() {
            let jpeg = sluice_synth::image_jpeg(0, &sluice_synth::DatasetOptions::default())?;
            std::fs::write(&img, jpeg)?;
        }
        let list = dir.join("list.txt");
        std::fs::write(&list, "one.jpg 0\n".repeat(50_000))?;
        let mut s = spec(&dir, 1, 1, 0);
        s.source = SourceSpec::FileList { path: list, root: None };
        let mut rows = Vec::new();
        for &c in &a.clients {
            let (addr, _procs) = service(&work, &dir, 0, 1)?;
            let job_id = create_job(&addr, &s)?;
            let row = measure::dispatcher_load(&addr, job_id, c, a.seconds)?;
            eprintln!(
                "dispatcher, {c:>3} clients: {:>6.0} GetTask/s ({:>6.0} RPC/s), p50 {:.2} ms, p99 {:.2} ms",
                row.get_task_per_s, row.rpcs_per_s, row.get_task_p50_ms, row.get_task_p99_ms
            );
            rows.push(serde_json::to_value(row)?);
        }
        out.insert("dispatcher".into(), json!(rows));
    }

    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    Ok(())
}

struct PackRow {
    raw_bytes: u64,
    packed_bytes: u64,
    /// Packed / raw bytes.
    ratio: f64,
    compress_bytes_per_s: f64,
    decompress_bytes_per_s: f64,
    compress_us_per_img: f64,
    decompress_us_per_img: f64,
}

/// The data plane's compression over one epoch of the training pipeline's real batches
/// (augmented pixels, not the no-op worker's zeros), on one core with the loader stopped:
/// what `compression = zstd` saves on the wire and costs in worker and client CPU.
fn compression_on_batches(root: &Path, batch: usize, threads: usize) -> Result<PackRow> {
    let loader = Loader::new(spec(root, batch, threads, 0), Shard::default())?;
    let batches = loader.iter().collect::<Result<Vec<_>, _>>()?;
    drop(loader);
    let (mut raw, mut packed, mut imgs) = (0u64, 0u64, 0usize);
    let (mut tc, mut td) = (0f64, 0f64);
    for b in batches {
        imgs += b.len();
        raw += b.images.as_bytes().len() as u64;
        let t0 = Instant::now();
        let out = Outgoing::new(b, Compression::Zstd);
        let t1 = Instant::now();
        packed += out.payload().len() as u64;
        let m = out.into_message();
        let t2 = Instant::now();
        let back = message_to_batch(m)?;
        let t3 = Instant::now();
        std::hint::black_box(back);
        tc += (t1 - t0).as_secs_f64();
        td += (t3 - t2).as_secs_f64();
    }
    let n = imgs.max(1) as f64;
    Ok(PackRow {
        raw_bytes: raw,
        packed_bytes: packed,
        ratio: packed as f64 / raw.max(1) as f64,
        compress_bytes_per_s: raw as f64 / tc.max(1e-9),
        decompress_bytes_per_s: raw as f64 / td.max(1e-9),
        compress_us_per_img: 1e6 * tc / n,
        decompress_us_per_img: 1e6 * td / n,
    })
}

/// Creates the job through a RemoteLoader-free path: the loader would start fetching.
fn create_job(addr: &str, spec: &PipelineSpec) -> Result<u64> {
    let t0 = Instant::now();
    loop {
        let mut o = RemoteOptions::new(addr.to_string(), "load");
        o.token = None;
        o.give_up_after = Duration::from_secs(10);
        match RemoteLoader::connect(spec, o) {
            Ok(l) => return Ok(l.job().job_id),
            Err(e) if t0.elapsed() < Duration::from_secs(10) => {
                tracing::debug!(error = %e, "dispatcher not up yet");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e).context("creating the load job"),
        }
    }
}
