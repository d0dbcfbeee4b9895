//! `sluice service dispatcher|worker|up`: the service's processes, and `remote-run`, its
//! client from the shell. Each reads its settings from `--config FILE`
//! (`sluice_service::config`, where every setting and its default is listed), with its
//! flags over the file; this module only parses the flags. A worker's `--max-*` flags are
//! the operator's limits on what a job's spec may ask of it; `up` hands its settings to
//! every child in one file.

mod kube_scaler;
mod up;

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::builder::{PossibleValuesParser, TypedValueParser};
pub use kube_scaler::{kube_scaler, KubeScalerArgs};
use sluice_autoscale::PolicyKind;
use sluice_core::ByteBudget;
use sluice_service::config::{flag, AutoscaleSettings, CacheAssignment, ServiceConfig};
use sluice_service::WorkerLimits;
pub use up::{up, UpArgs};

/// The token from `--token`, else `SLUICE_TOKEN`.
fn token(flag: Option<String>) -> Option<String> {
    flag.or_else(|| std::env::var("SLUICE_TOKEN").ok()).filter(|t| !t.is_empty())
}

/// The operator token from `--operator-token`, else `SLUICE_OPERATOR_TOKEN`.
fn operator_token(flag: Option<String>) -> Option<String> {
    flag.or_else(|| std::env::var("SLUICE_OPERATOR_TOKEN").ok()).filter(|t| !t.is_empty())
}

fn announce(what: &str, addr: std::net::SocketAddr) {
    println!("sluice {what} listening on {addr}");
    let _ = std::io::stdout().flush();
}

/// What a dispatcher and a worker both take (`[serve]` in a config file): where specs may
/// read, the shared token, where to serve metrics, TLS.
#[derive(clap::Args)]
struct ServeArgs {
    /// Service config file (TOML; see docs/service.md); these flags override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// A folder specs may read from (repeatable; default: the current folder).
    #[arg(long = "allow-root")]
    allow_root: Vec<PathBuf>,
    /// Shared secret every RPC must carry (default: $SLUICE_TOKEN; none: no check).
    #[arg(long)]
    token: Option<String>,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics.
    #[arg(long)]
    metrics_port: Option<u16>,
    /// Interface for the metrics endpoint (0.0.0.0 inside a pod) [default: 127.0.0.1].
    #[arg(long)]
    metrics_host: Option<String>,
    /// Serve over TLS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// A Python module (with its package's modules) a job's `map` ops may import on the
    /// workers (repeatable; default: none, so a job with a `map` op is refused). Give the
    /// same list to the dispatcher (it refuses a job at submission) and the workers (they
    /// refuse it again before running anything).
    #[arg(long = "allow-python-module", value_name = "MODULE")]
    allow_python_module: Vec<String>,
}

/// `--tls-ca`, else `SLUICE_TLS_CA`.
fn tls_ca(flag: Option<PathBuf>) -> Option<PathBuf> {
    flag.or_else(|| std::env::var_os("SLUICE_TLS_CA").filter(|v| !v.is_empty()).map(PathBuf::from))
}

impl ServeArgs {
    /// The `--config` file's settings with these flags over them, and the metrics port
    /// given (if any), which the caller puts in its own table.
    fn load(self) -> Result<(ServiceConfig, Option<u16>)> {
        let mut c = ServiceConfig::load(self.config.as_deref())?;
        if !self.allow_root.is_empty() {
            c.serve.allow_roots = self.allow_root;
        }
        c.serve.token = token(self.token).or(c.serve.token.take());
        flag(&mut c.serve.metrics_host, self.metrics_host);
        if self.tls_cert.is_some() {
            (c.serve.tls_cert, c.serve.tls_key) = (self.tls_cert, self.tls_key);
        }
        if !self.allow_python_module.is_empty() {
            c.serve.allow_python_modules = self.allow_python_module;
        }
        Ok((c, self.metrics_port))
    }
}

#[derive(clap::Args)]
pub struct DispatcherArgs {
    /// gRPC address; keep 127.0.0.1 unless the port is protected (token, network policy)
    /// [default: 127.0.0.1:7070].
    #[arg(long)]
    listen: Option<String>,
    /// Append-only journal that lets a restarted dispatcher resume every job.
    #[arg(long)]
    journal: Option<PathBuf>,
    /// How importance-sampled jobs' tasks go to workers: `aware` places the hot set on the
    /// workers' caches and sends each task to the worker caching its samples; `blind` sends
    /// it to the least loaded worker (for comparison) [default: aware].
    #[arg(long, value_parser = PossibleValuesParser::new(CacheAssignment::NAMES).try_map(|s| s.parse::<CacheAssignment>()))]
    cache_assignment: Option<CacheAssignment>,
    /// A second secret, for operator calls only (`SetScale`, `DrainWorker`); the clients'
    /// token does not make them (default: $SLUICE_OPERATOR_TOKEN; none: with --token set,
    /// operator calls are refused).
    #[arg(long)]
    operator_token: Option<String>,
    #[command(flatten)]
    autoscale: AutoscaleArgs,
    #[command(flatten)]
    serve: ServeArgs,
}

/// The dispatcher's autoscaler (`[autoscale]` in a config file); `sluice up` follows its
/// target.
#[derive(clap::Args, Clone)]
struct AutoscaleArgs {
    /// Scale the workers to what the trainers consume: fastmatch, cachew, tfdata, utilisation or fixed.
    #[arg(long, value_name = "POLICY")]
    autoscale: Option<PolicyKind>,
    /// Fewest workers the autoscaler keeps (`sluice up` starts this many) [default: 1].
    #[arg(long)]
    min_workers: Option<usize>,
    /// Most workers the autoscaler asks for [default: 8].
    #[arg(long)]
    max_workers: Option<usize>,
    /// The autoscaler reads the signals and decides once per this many milliseconds
    /// [default: 1000].
    #[arg(long)]
    autoscale_window_ms: Option<u64>,
}

impl AutoscaleArgs {
    fn apply(self, c: &mut AutoscaleSettings) {
        c.policy = self.autoscale.or(c.policy);
        flag(&mut c.min_workers, self.min_workers);
        flag(&mut c.max_workers, self.max_workers);
        flag(&mut c.window_ms, self.autoscale_window_ms);
    }
}

impl DispatcherArgs {
    /// The config file's settings with these flags over them.
    fn settings(self) -> Result<ServiceConfig> {
        let (mut c, metrics_port) = self.serve.load()?;
        let d = &mut c.dispatcher;
        flag(&mut d.listen, self.listen);
        d.journal = self.journal.or(d.journal.take());
        flag(&mut d.cache_assignment, self.cache_assignment);
        d.metrics_port = metrics_port.or(d.metrics_port);
        d.operator_token = operator_token(self.operator_token).or(d.operator_token.take());
        self.autoscale.apply(&mut c.autoscale);
        Ok(c)
    }
}

pub fn dispatcher(a: DispatcherArgs) -> Result<()> {
    let config = a.settings()?.dispatcher()?;
    sluice_service::serve_dispatcher(config, |addr| announce("dispatcher", addr))?;
    Ok(())
}

/// What a worker grants each job (`[limits]` in a config file): a spec asking for more is
/// refused with the field and the limit.
#[derive(clap::Args)]
struct LimitArgs {
    /// Most decode threads a job's spec may ask for (`threads`) [default: 128].
    #[arg(long)]
    max_threads: Option<usize>,
    /// Most batches a job's spec may prepare ahead (`prefetch`) [default: 64].
    #[arg(long)]
    max_prefetch: Option<usize>,
    /// Most memory a job's cache may take (`cache.budget`): bytes, "8GiB", or a share of
    /// RAM like "50%" [default: 50%].
    #[arg(long, value_parser = ByteBudget::parse)]
    max_cache_bytes: Option<ByteBudget>,
    /// Largest image, in pixels, a job's spec may allow (`limits.max_pixels`)
    /// [default: 268435456].
    #[arg(long)]
    max_pixels: Option<u64>,
    /// Job loaders kept at most (the least recently used goes first) [default: 64].
    #[arg(long)]
    max_jobs: Option<usize>,
    /// Seconds a job's loader is kept without tasks (rebuilt if the job comes back)
    /// [default: 600].
    #[arg(long)]
    job_idle_secs: Option<u64>,
    /// Python children (jobs' `map` ops, one per pipeline thread, ~30 MB each) a worker
    /// runs at most over all its jobs; past it an idle child of another job is ended
    /// first, else the call waits (at most the op's `timeout_ms`) [default: 32].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=4096))]
    max_python_children: Option<u64>,
}

impl LimitArgs {
    fn apply(self, l: &mut WorkerLimits) {
        flag(&mut l.max_threads, self.max_threads);
        flag(&mut l.max_prefetch, self.max_prefetch);
        flag(&mut l.max_cache, self.max_cache_bytes);
        flag(&mut l.max_pixels, self.max_pixels);
        flag(&mut l.max_jobs, self.max_jobs);
        flag(&mut l.job_idle, self.job_idle_secs.map(Duration::from_secs));
        flag(&mut l.max_python_children, self.max_python_children.map(|n| n as usize));
    }
}

#[derive(clap::Args)]
pub struct WorkerArgs {
    /// The dispatcher's address [default: 127.0.0.1:7070].
    #[arg(long)]
    dispatcher: Option<String>,
    /// gRPC address; port 0 picks a free one [default: 127.0.0.1:0].
    #[arg(long)]
    listen: Option<String>,
    /// Address clients should use to reach this worker (default: the bound address).
    #[arg(long)]
    advertise: Option<String>,
    /// TCP data-plane address (batches as raw buffers); port 0 picks a free one
    /// [default: 127.0.0.1:0].
    #[arg(long)]
    data_listen: Option<String>,
    /// Data-plane address clients should use (default: the bound address).
    #[arg(long)]
    advertise_data: Option<String>,
    /// Decode threads per job (default: the spec's `threads`).
    #[arg(long)]
    threads: Option<usize>,
    /// CA (PEM) of the dispatcher's certificate: reach it over TLS (default: $SLUICE_TLS_CA).
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// Serve clients on this machine over TCP only, not through shared memory.
    #[arg(long)]
    no_shared_memory: bool,
    /// Record each job's pipeline events (per sample and op, per batch) into
    /// DIR/job-<job id>-worker-<worker id>.pftrace (Perfetto), extended after every task.
    #[arg(long, value_name = "DIR")]
    trace_dir: Option<PathBuf>,
    /// A name to drain this worker by (`DrainWorker`); `sluice up` names its workers.
    #[arg(long)]
    name: Option<String>,
    /// The Python that runs specs' `map` ops, one child process per pipeline thread; it
    /// needs numpy and the functions' modules (on its path or `PYTHONPATH`)
    /// [default: python3].
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    serve: ServeArgs,
}

impl WorkerArgs {
    /// The config file's settings with these flags over them.
    fn settings(self) -> Result<ServiceConfig> {
        let (mut c, metrics_port) = self.serve.load()?;
        let w = &mut c.worker;
        flag(&mut w.dispatcher, self.dispatcher);
        flag(&mut w.listen, self.listen);
        w.advertise = self.advertise.or(w.advertise.take());
        flag(&mut w.data_listen, self.data_listen);
        w.advertise_data = self.advertise_data.or(w.advertise_data.take());
        flag(&mut w.threads, self.threads);
        w.tls_ca = tls_ca(self.tls_ca).or(w.tls_ca.take());
        if self.no_shared_memory {
            w.shared_memory = false;
        }
        w.trace_dir = self.trace_dir.or(w.trace_dir.take());
        flag(&mut w.name, self.name);
        flag(&mut w.python, self.python);
        w.metrics_port = metrics_port.or(w.metrics_port);
        self.limits.apply(&mut c.limits);
        Ok(c)
    }
}

pub fn worker(a: WorkerArgs) -> Result<()> {
    let config = a.settings()?.worker()?;
    sluice_service::serve_worker(config, |addr| announce("worker", addr))?;
    Ok(())
}

#[derive(clap::Args)]
pub struct RemoteRunArgs {
    /// Pipeline spec (TOML or JSON).
    spec: PathBuf,
    #[arg(long, default_value = "127.0.0.1:7070")]
    dispatcher: String,
    /// Job name; clients naming the same job share its stream.
    #[arg(long, default_value = "default")]
    job: String,
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    #[arg(long)]
    token: Option<String>,
    /// CA (PEM) of the service's certificates: talk TLS (default: $SLUICE_TLS_CA).
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// When creating the job: each epoch is N full passes, each in its own order (parallel
    /// epochs, e.g. N = workers); 0 or 1: a distributed epoch (every sample once).
    #[arg(long, default_value_t = 0)]
    parallel_epochs: u64,
    /// Have workers compress pixels: none or zstd (pays only on links slower than the compressor).
    #[arg(long, default_value = "none", value_parser = ["none", "zstd"])]
    compression: String,
    /// How batches travel: auto (shared memory from workers on this machine, TCP from the
    /// rest), tcp, or grpc.
    #[arg(long, default_value = "auto", value_parser = ["auto", "tcp", "grpc"])]
    data_plane: String,
    /// Record a trace of the run to this file: the trainer's events and every worker's
    /// batch builds in one timeline (Perfetto protobuf, or Chrome trace JSON for `.json`).
    #[arg(long)]
    trace: Option<PathBuf>,
}

/// Reads epochs of a job through the service and reports throughput, checking that every
/// sample arrived exactly once.
pub fn remote_run(a: RemoteRunArgs) -> Result<()> {
    let spec = sluice_core::PipelineSpec::from_path(&a.spec)?;
    let mut options = sluice_client::RemoteOptions::new(a.dispatcher, a.job);
    options.token = token(a.token);
    options.tls_ca = tls_ca(a.tls_ca);
    options.parallel_epochs = a.parallel_epochs;
    options.compression = sluice_client::Compression::parse(&a.compression)?;
    options.data_plane = sluice_client::DataPlane::parse(&a.data_plane)?;
    let mut loader = sluice_client::RemoteLoader::connect(&spec, options)?;
    if a.trace.is_some() {
        loader.start_trace()?;
    }
    let info = loader.job().clone();
    println!(
        "job {} (id {}, fingerprint {}): {} samples, {} batches per epoch, starting at epoch {}",
        info.job_name, info.job_id, info.fingerprint, info.samples_per_epoch, info.batches_per_epoch, info.epoch
    );
    for _ in 0..a.epochs {
        let epoch = loader.epoch();
        let t0 = std::time::Instant::now();
        let mut keys = Vec::new();
        for b in loader.iter() {
            keys.extend(b?.keys);
        }
        let secs = t0.elapsed().as_secs_f64();
        let n = keys.len();
        keys.sort_unstable();
        keys.dedup();
        println!(
            "epoch {epoch}: {n} samples in {secs:.2} s = {:.0} samples/s; {} distinct; {} duplicate batches dropped; \
             {} batches so far through shared memory",
            n as f64 / secs,
            keys.len(),
            loader.duplicates_dropped(),
            loader.shared_memory_batches()
        );
    }
    if let (Some(path), Some(trace)) = (&a.trace, loader.stop_trace()) {
        trace.write(path)?;
        eprintln!(
            "trace: {} trainer events and {} worker builds written to {}",
            trace.events.len(),
            trace.builds.len(),
            path.display()
        );
    }
    Ok(())
}
