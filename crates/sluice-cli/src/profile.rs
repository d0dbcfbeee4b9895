//! `sluice profile SPEC --sweep threads=1,2,4` (or `workers=1,2`): the sweep, knee and
//! report of [`sluice_profile`]; a workers sweep starts a real dispatcher and worker
//! processes on this machine ([`sluice_profile::local_service`], as `sluice-bench service`
//! does).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use sluice_client::{RemoteLoader, RemoteOptions};
use sluice_core::{PipelineSpec, SourceSpec};
use sluice_profile::local_service::{self, tree_cpu};
use sluice_profile::{knee, parse_sweep, row, sweep, threads_point, Row, Unit};

#[derive(clap::Args)]
pub struct Args {
    /// Pipeline spec, .toml or .json.
    pub spec: PathBuf,
    /// What to vary and its values: `threads=1,2,4` (local loader threads) or
    /// `workers=1,2` (service worker processes on this machine, splitting the spec's threads).
    #[arg(long)]
    pub sweep: String,
    /// Measured epochs per setting (after one warm-up epoch).
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// Runs over all settings, interleaved; each setting reports its median-throughput run.
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Where to write the HTML report.
    #[arg(long, default_value = "profile.html")]
    pub report: PathBuf,
    /// Print the table as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn main(a: Args) -> Result<()> {
    let spec = PipelineSpec::from_path(&a.spec)?;
    let (unit, values) = parse_sweep(&a.sweep)?;
    let point = |n, run| match unit {
        Unit::Threads => Ok(threads_point(&spec, n, a.epochs)?),
        Unit::Workers => workers_point(&spec, n, a.epochs, run),
    };
    let rows = sweep(unit, &values, a.runs, point, |line| eprintln!("{line}"))?;
    let knee = knee(&rows);
    std::fs::write(&a.report, sluice_profile::html(&a.spec.display().to_string(), &rows, knee)?)
        .with_context(|| format!("writing the report to {}", a.report.display()))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", sluice_profile::text_table(&rows, knee));
    }
    eprintln!("report written to {}", a.report.display());
    Ok(())
}

fn workers_point(spec: &PipelineSpec, workers: usize, epochs: u64, run: usize) -> Result<Row> {
    let SourceSpec::ImageFolder { root } = &spec.source else {
        bail!("--sweep workers needs an ImageFolder source (the workers read it from this machine)");
    };
    let root = root.canonicalize().with_context(|| format!("the dataset {}", root.display()))?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = spec.threads.initial().max(1).min(cores.max(1));
    let per = (threads / workers).max(1);
    let dir = tempfile::tempdir()?;
    let sluice = std::env::current_exe().context("finding the sluice binary")?;
    let (addr, procs) = local_service::start(&sluice, dir.path(), &root, workers, per, &[])?;
    let mut s = spec.clone();
    s.threads = per.into();
    let mut o = RemoteOptions::new(addr, format!("profile-{workers}-{run}"));
    o.token = None;
    o.tasks_in_flight = 2 * workers;
    let mut loader = RemoteLoader::connect(&s, o)?;
    for b in loader.iter() {
        b?;
    }
    let (t0, c0) = (Instant::now(), tree_cpu(&procs));
    let mut images = 0;
    for _ in 0..epochs {
        for b in loader.iter() {
            images += b?.len();
        }
    }
    let (seconds, cpu) = (t0.elapsed().as_secs_f64(), tree_cpu(&procs) - c0);
    drop(loader);
    drop(procs);
    Ok(row(Unit::Workers, workers, images, seconds, cpu, Vec::new()))
}
