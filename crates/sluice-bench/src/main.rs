//! `sluice-bench`: sluice's benchmarks, apart from the `sluice` product binary (as
//! DataFusion's `dfbench` is apart from `datafusion-cli`). Each subcommand measures one
//! thing against a reference taken in the same run (machines here are noisy); BENCHMARKS.md
//! says what was run and what it gave.
//!
//! The benchmarks that start service or learner processes run the `sluice` binary found
//! beside this one (`SLUICE_BIN` overrides it): build both, `cargo build --release -p
//! sluice-cli -p sluice-bench`.

// A command-line tool: printing its report is its job.
#![allow(clippy::print_stdout)]

mod autoscale;
mod cache;
mod dataset;
mod disk_cache;
mod engine;
mod locality;
mod manifest;
mod netns;
mod prefetch;
mod s3;
mod service;
mod workers;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "sluice-bench",
    version,
    about = "sluice's benchmarks: each against a reference measured in the same run"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Images/s per thread of the standard training pipeline vs plain full JPEG decode.
    Engine(engine::Args),
    /// Cache policies compared: hit rate vs cache size, epoch time on throttled storage
    /// (`--service`: through a dispatcher and workers).
    Cache(cache::Args),
    /// The cache's disk tier: epoch-2 hit rate of Belady vs LRU at half the dataset, and
    /// warm-epoch throughput with the tier holding the dataset vs plain local files.
    DiskCache(disk_cache::Args),
    /// The service against local mode, raw loopback TCP, and many clients.
    Service(service::Args),
    /// Autoscaling policies side by side on a changing demand (emulated per-sample cost);
    /// `--real`: `threads = "auto"` on the real JPEG pipeline.
    Autoscale(autoscale::Args),
    /// Epoch times of learner processes on a shared throttled link: locality-aware with the
    /// collaborative cache vs the baseline, and the model's prediction for each.
    Locality(locality::Args),
    /// `prefetch = "auto"` against fixed depths: trainer stall, throughput and peak RSS on a
    /// producer with hiccups.
    Prefetch(prefetch::Args),
    /// Service throughput from 1 to 64 worker processes (emulated per-sample cost) vs linear.
    Workers(workers::Args),
    /// Cold epochs from a real S3 server (SeaweedFS) behind a shaped link (network
    /// namespaces, `tc`): bytes/s against the link's rate, read-ahead on and off, and the
    /// same pipeline on local files.
    S3(s3::Args),
    /// A manifest's cost per sample at 10^6 and 10^7 samples (index time, memory, first
    /// batch, checkpoint size) vs issue 28's limits.
    Manifest(manifest::Args),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("SLUICE_LOG").unwrap_or_else(|_| EnvFilter::new("warn")))
        .with_writer(std::io::stderr)
        .with_ansi(sluice_core::logging::stderr_colours())
        .init();
    let result = match Cli::parse().command {
        Command::Engine(a) => engine::main(a),
        Command::Cache(a) => cache::main(a),
        Command::DiskCache(a) => disk_cache::main(a),
        Command::Service(a) => service::main(a),
        Command::Autoscale(a) => autoscale::main(a),
        Command::Locality(a) => locality::main(a),
        Command::Prefetch(a) => prefetch::main(a),
        Command::Workers(a) => workers::main(a),
        Command::Manifest(a) => manifest::main(a),
        Command::S3(a) => s3::main(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
