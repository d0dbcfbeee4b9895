//! `sluice`: generate and pack datasets, run a pipeline spec, benchmark the engine against
//! plain libjpeg-turbo decoding, and run the service (dispatcher, workers, `up`, a client).

// A command-line tool: printing its report is its job.
#![allow(clippy::print_stdout)]

mod barrier;
mod bench;
mod bench_autoscale;
mod bench_autoscale_real;
mod bench_cache;
mod bench_cache_service;
mod bench_locality;
mod bench_service;
mod bench_workers;
mod demo;
mod duration_flags;
mod gen;
mod model;
mod netns;
mod pack;
mod plot;
mod profile;
mod progress;
mod run;
mod service;
mod stream_push;
mod trace_merge;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(name = "sluice", version, about = "Feed training data to accelerators as fast as the hardware allows")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a deterministic ImageNet-like JPEG dataset (ImageFolder layout).
    GenImages(gen::Args),
    /// Copy a dataset with every JPEG rewritten losslessly with restart markers, so random
    /// crops decode only what they cover.
    Pack(pack::Args),
    /// Run a pipeline spec (TOML or JSON) for some epochs and report throughput.
    Run(run::Args),
    /// Run a spec at several thread or worker counts: throughput, CPU per image, per-op
    /// time, percentiles and counters, the knee, and an HTML report with plots.
    Profile(profile::Args),
    /// Images/s per thread of the standard training pipeline vs plain full JPEG decode.
    Bench(bench::Args),
    /// Cache policies compared: hit rate vs cache size, epoch time on throttled storage.
    BenchCache(bench_cache::Args),
    /// Generate a dataset if needed, write a spec for it and run it: sluice's main job on
    /// data of its own.
    Demo(demo::Args),
    /// Serve jobs: own epochs, cut them into tasks, journal, hand tasks to workers.
    Dispatcher(service::DispatcherArgs),
    /// Run tasks for a dispatcher and stream their batches to clients.
    Worker(service::WorkerArgs),
    /// Start a dispatcher and N worker processes on this machine.
    Up(service::UpArgs),
    /// Follow the dispatcher's autoscaler on Kubernetes: set the worker StatefulSet's
    /// replicas to its target (beside the dispatcher; see deploy/).
    KubeScaler(service::KubeScalerArgs),
    /// Read epochs of a job from a running dispatcher (the service's client, from the shell).
    RemoteRun(service::RemoteRunArgs),
    /// The service against local mode, raw loopback TCP, and many clients.
    BenchService(bench_service::Args),
    /// Predicted epoch loading time of a multi-learner job vs learners (locality model).
    Model(model::Args),
    /// Stream a dataset into a Redis stream (continual learning's producer).
    StreamPush(stream_push::Args),
    /// Autoscaling policies side by side on a changing demand (emulated per-sample cost).
    BenchAutoscale(bench_autoscale::Args),
    /// Epoch times of learner processes on a shared throttled link: locality-aware with the
    /// collaborative cache vs the baseline, and the model's prediction for each.
    BenchLocality(bench_locality::Args),
    /// Service throughput from 1 to 64 worker processes (emulated per-sample cost) vs linear.
    BenchWorkers(bench_workers::Args),
    /// Merge a client's trace and its workers' `--trace-dir` files into one timeline.
    TraceMerge(trace_merge::Args),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("SLUICE_LOG").unwrap_or_else(|_| EnvFilter::new("warn")))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::GenImages(a) => gen::main(a),
        Command::Pack(a) => pack::main(a),
        Command::Run(a) => run::main(a),
        Command::Profile(a) => profile::main(a),
        Command::Bench(a) => bench::main(a),
        Command::BenchCache(a) => bench_cache::main(a),
        Command::Demo(a) => demo::main(a),
        Command::Dispatcher(a) => service::dispatcher(a),
        Command::Worker(a) => service::worker(a),
        Command::Up(a) => service::up(a),
        Command::KubeScaler(a) => service::kube_scaler(a),
        Command::BenchService(a) => bench_service::main(a),
        Command::RemoteRun(a) => service::remote_run(a),
        Command::Model(a) => model::main(a),
        Command::StreamPush(a) => stream_push::main(a),
        Command::BenchAutoscale(a) => bench_autoscale::main(a),
        Command::BenchLocality(a) => bench_locality::main(a),
        Command::BenchWorkers(a) => bench_workers::main(a),
        Command::TraceMerge(a) => trace_merge::main(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
