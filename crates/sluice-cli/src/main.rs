//! `sluice`: generate and pack datasets, run and profile a pipeline spec, and run the
//! service (dispatcher, workers, `up`, a client). The benchmarks are the `sluice-bench`
//! binary (`crates/sluice-bench`); their old `sluice bench-*` names forward to it.

// A command-line tool: printing its report is its job.
#![allow(clippy::print_stdout)]

mod demo;
mod duration_flags;
mod gen;
mod index;
mod model;
mod moved;
mod pack;
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
    /// Write the entropy index of every JPEG of a dataset into a folder (the pipeline's
    /// `decode.index_dir`), so the first epoch's crops decode only what they cover too.
    Index(index::Args),
    /// Run a pipeline spec (TOML or JSON) for some epochs and report throughput.
    Run(run::Args),
    /// Run a spec at several thread or worker counts: throughput, CPU per image, per-op
    /// time, percentiles and counters, the knee, and an HTML report with plots.
    Profile(profile::Args),
    /// Generate a dataset if needed, write a spec for it and run it: sluice's main job on
    /// data of its own.
    Demo(demo::Args),
    /// The service: dispatcher, workers, `up` (both on this machine), the Kubernetes scaler
    /// and a client from the shell.
    #[command(subcommand)]
    Service(ServiceCommand),
    /// Predicted epoch loading time of a multi-learner job vs learners (locality model).
    Model(model::Args),
    /// Stream a dataset into a Redis stream (continual learning's producer).
    StreamPush(stream_push::Args),
    /// Merge a client's trace and its workers' `--trace-dir` files into one timeline.
    TraceMerge(trace_merge::Args),
    // The service's commands under their old top-level names (one release; each says
    // where it went).
    #[command(hide = true)]
    Dispatcher(service::DispatcherArgs),
    #[command(hide = true)]
    Worker(service::WorkerArgs),
    #[command(hide = true)]
    Up(service::UpArgs),
    #[command(hide = true)]
    KubeScaler(service::KubeScalerArgs),
    #[command(hide = true)]
    RemoteRun(service::RemoteRunArgs),
}

#[derive(Subcommand)]
enum ServiceCommand {
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
}

impl ServiceCommand {
    fn run(self) -> anyhow::Result<()> {
        match self {
            Self::Dispatcher(a) => service::dispatcher(a),
            Self::Worker(a) => service::worker(a),
            Self::Up(a) => service::up(a),
            Self::KubeScaler(a) => service::kube_scaler(a),
            Self::RemoteRun(a) => service::remote_run(a),
        }
    }
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("SLUICE_LOG").unwrap_or_else(|_| EnvFilter::new("warn")))
        .with_writer(std::io::stderr)
        .with_ansi(sluice_core::logging::stderr_colours())
        .init();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(bench) = args.get(1).and_then(|a| moved::bench_command(a)) {
        return moved::to_sluice_bench(bench, &args[2..]);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::GenImages(a) => gen::main(a),
        Command::Pack(a) => pack::main(a),
        Command::Index(a) => index::main(a),
        Command::Run(a) => run::main(a),
        Command::Profile(a) => profile::main(a),
        Command::Demo(a) => demo::main(a),
        Command::Service(c) => c.run(),
        Command::Model(a) => model::main(a),
        Command::StreamPush(a) => stream_push::main(a),
        Command::TraceMerge(a) => trace_merge::main(a),
        Command::Dispatcher(a) => moved::service("dispatcher", ServiceCommand::Dispatcher(a)),
        Command::Worker(a) => moved::service("worker", ServiceCommand::Worker(a)),
        Command::Up(a) => moved::service("up", ServiceCommand::Up(a)),
        Command::KubeScaler(a) => moved::service("kube-scaler", ServiceCommand::KubeScaler(a)),
        Command::RemoteRun(a) => moved::service("remote-run", ServiceCommand::RemoteRun(a)),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
