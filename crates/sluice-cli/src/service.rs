//! `sluice dispatcher`, `sluice worker` and `sluice up`: the service's processes, and
//! `sluice remote-run`, its client from the shell. A worker's `--max-*` flags are the
//! operator's limits on what a job's spec may ask of it; `up` passes them to every worker.

mod kube_scaler;
mod up;

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
pub use kube_scaler::{kube_scaler, KubeScalerArgs};
use sluice_core::ByteBudget;
use sluice_service::{DispatcherConfig, WorkerConfig, WorkerLimits};
pub use up::{up, UpArgs};

/// The token from `--token`, else `SLUICE_TOKEN`.
fn token(flag: Option<String>) -> Option<String> {
    flag.or_else(|| std::env::var("SLUICE_TOKEN").ok()).filter(|t| !t.is_empty())
}

/// The operator token from `--operator-token`, else `SLUICE_OPERATOR_TOKEN`.
fn operator_token(flag: Option<String>) -> Option<String> {
    flag.or_else(|| std::env::var("SLUICE_OPERATOR_TOKEN").ok()).filter(|t| !t.is_empty())
}

/// `--allow-root` as given, or the current folder when none is.
fn roots(given: Vec<PathBuf>) -> Result<Vec<PathBuf>> {
    if !given.is_empty() {
        return Ok(given);
    }
    let cwd = std::env::current_dir().context("no --allow-root given and the current folder is unknown")?;
    tracing::warn!(root = %cwd.display(), "no --allow-root given: allowing only the current folder");
    Ok(vec![cwd])
}

fn announce(what: &str, addr: std::net::SocketAddr) {
    println!("sluice {what} listening on {addr}");
    let _ = std::io::stdout().flush();
}

/// What a dispatcher and a worker both take: where specs may read, the shared token,
/// and where to serve metrics.
#[derive(clap::Args)]
struct ServeArgs {
    /// A folder specs may read from (repeatable; default: the current folder).
    #[arg(long = "allow-root")]
    allow_root: Vec<PathBuf>,
    /// Shared secret every RPC must carry (default: $SLUICE_TOKEN; none: no check).
    #[arg(long)]
    token: Option<String>,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics.
    #[arg(long)]
    metrics_port: Option<u16>,
    /// Interface for the metrics endpoint (0.0.0.0 inside a pod).
    #[arg(long, default_value = "127.0.0.1")]
    metrics_host: String,
    /// Serve over TLS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

/// `--tls-ca`, else `SLUICE_TLS_CA`.
fn tls_ca(flag: Option<PathBuf>) -> Option<PathBuf> {
    flag.or_else(|| std::env::var_os("SLUICE_TLS_CA").filter(|v| !v.is_empty()).map(PathBuf::from))
}

impl ServeArgs {
    fn tls(&self) -> Option<sluice_service::TlsFiles> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(sluice_service::TlsFiles { cert: cert.clone(), key: key.clone() }),
            _ => None,
        }
    }

    fn metrics_listen(&self) -> Option<String> {
        self.metrics_port.map(|p| format!("{}:{p}", self.metrics_host))
    }
}

#[derive(clap::Args)]
pub struct DispatcherArgs {
    /// gRPC address; keep 127.0.0.1 unless the port is protected (token, network policy).
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: String,
    /// Append-only journal that lets a restarted dispatcher resume every job.
    #[arg(long)]
    journal: Option<PathBuf>,
    /// How importance-sampled jobs' tasks go to workers: `aware` places the hot set on the
    /// workers' caches and sends each task to the worker caching its samples; `blind` sends
    /// it to the least loaded worker (for comparison).
    #[arg(long, value_enum, default_value_t = CacheAssignment::Aware)]
    cache_assignment: CacheAssignment,
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

/// The dispatcher's autoscaler; `sluice up` passes these on and follows its target.
#[derive(clap::Args, Clone)]
struct AutoscaleArgs {
    /// Scale the workers to what the trainers consume: fastmatch, cachew, tfdata, utilisation or fixed.
    #[arg(long, value_name = "POLICY")]
    autoscale: Option<sluice_autoscale::PolicyKind>,
    /// Fewest workers the autoscaler keeps (`sluice up` starts this many).
    #[arg(long, default_value_t = 1, requires = "autoscale")]
    min_workers: usize,
    /// Most workers the autoscaler asks for.
    #[arg(long, default_value_t = 8, requires = "autoscale")]
    max_workers: usize,
    /// The autoscaler reads the signals and decides once per this many milliseconds.
    #[arg(long, default_value_t = 1000, requires = "autoscale")]
    autoscale_window_ms: u64,
}

impl AutoscaleArgs {
    fn config(&self) -> Option<sluice_autoscale::AutoscaleConfig> {
        self.autoscale.map(|policy| sluice_autoscale::AutoscaleConfig {
            window: sluice_autoscale::WindowBy::Millis(self.autoscale_window_ms),
            ..sluice_autoscale::AutoscaleConfig::new(policy, self.min_workers, self.max_workers)
        })
    }

    /// The same settings as `sluice dispatcher` flags.
    fn to_args(&self) -> Vec<String> {
        let Some(policy) = self.autoscale else { return Vec::new() };
        [
            ("--autoscale", policy.name().to_string()),
            ("--min-workers", self.min_workers.to_string()),
            ("--max-workers", self.max_workers.to_string()),
            ("--autoscale-window-ms", self.autoscale_window_ms.to_string()),
        ]
        .into_iter()
        .flat_map(|(flag, v)| [flag.to_string(), v])
        .collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CacheAssignment {
    Aware,
    Blind,
}

pub fn dispatcher(a: DispatcherArgs) -> Result<()> {
    if a.journal.is_none() {
        tracing::warn!("no --journal: a restarted dispatcher will not remember its jobs");
    }
    let config = DispatcherConfig {
        listen: a.listen,
        journal: a.journal,
        metrics_listen: a.serve.metrics_listen(),
        tls: a.serve.tls(),
        allow_roots: roots(a.serve.allow_root)?,
        token: token(a.serve.token),
        operator_token: operator_token(a.operator_token),
        autoscale: a.autoscale.config(),
        cache_aware: a.cache_assignment == CacheAssignment::Aware,
    };
    sluice_service::serve_dispatcher(config, |addr| announce("dispatcher", addr))?;
    Ok(())
}

/// What a worker grants each job: a spec asking for more is refused with the field and
/// the limit.
#[derive(clap::Args)]
struct LimitArgs {
    /// Most decode threads a job's spec may ask for (`threads`).
    #[arg(long, default_value_t = WorkerLimits::default().max_threads)]
    max_threads: usize,
    /// Most batches a job's spec may prepare ahead (`prefetch`).
    #[arg(long, default_value_t = WorkerLimits::default().max_prefetch)]
    max_prefetch: usize,
    /// Most memory a job's cache may take (`cache.budget`): bytes, "8GiB", or a share of
    /// RAM like "50%".
    #[arg(long, default_value = "50%", value_parser = ByteBudget::parse)]
    max_cache_bytes: ByteBudget,
    /// Largest image, in pixels, a job's spec may allow (`limits.max_pixels`).
    #[arg(long, default_value_t = WorkerLimits::default().max_pixels)]
    max_pixels: u64,
    /// Job loaders kept at most (the least recently used goes first).
    #[arg(long, default_value_t = WorkerLimits::default().max_jobs)]
    max_jobs: usize,
    /// Seconds a job's loader is kept without tasks (rebuilt if the job comes back).
    #[arg(long, default_value_t = WorkerLimits::default().job_idle.as_secs())]
    job_idle_secs: u64,
}

impl LimitArgs {
    fn limits(&self) -> WorkerLimits {
        WorkerLimits {
            max_threads: self.max_threads,
            max_prefetch: self.max_prefetch,
            max_cache: self.max_cache_bytes,
            max_pixels: self.max_pixels,
            max_jobs: self.max_jobs,
            job_idle: Duration::from_secs(self.job_idle_secs),
        }
    }

    /// The same limits as `sluice worker` flags.
    fn to_args(&self) -> Vec<String> {
        let cache = match self.max_cache_bytes {
            ByteBudget::Bytes(b) => b.to_string(),
            ByteBudget::RamFraction(f) => format!("{}%", f * 100.0),
        };
        [
            ("--max-threads", self.max_threads.to_string()),
            ("--max-prefetch", self.max_prefetch.to_string()),
            ("--max-cache-bytes", cache),
            ("--max-pixels", self.max_pixels.to_string()),
            ("--max-jobs", self.max_jobs.to_string()),
            ("--job-idle-secs", self.job_idle_secs.to_string()),
        ]
        .into_iter()
        .flat_map(|(flag, v)| [flag.to_string(), v])
        .collect()
    }
}

#[derive(clap::Args)]
pub struct WorkerArgs {
    /// The dispatcher's address.
    #[arg(long, default_value = "127.0.0.1:7070")]
    dispatcher: String,
    /// Data-plane address; port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Address clients should use to reach this worker (default: the bound address).
    #[arg(long)]
    advertise: Option<String>,
    /// TCP data-plane address (batches as raw buffers); port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:0")]
    data_listen: String,
    /// Data-plane address clients should use (default: the bound address).
    #[arg(long)]
    advertise_data: Option<String>,
    /// Decode threads per job (default: the spec's `threads`).
    #[arg(long, default_value_t = 0)]
    threads: usize,
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
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    serve: ServeArgs,
}

pub fn worker(a: WorkerArgs) -> Result<()> {
    let config = WorkerConfig {
        listen: a.listen,
        advertise: a.advertise,
        data_listen: a.data_listen,
        advertise_data: a.advertise_data,
        dispatcher: a.dispatcher,
        metrics_listen: a.serve.metrics_listen(),
        tls: a.serve.tls(),
        dispatcher_ca: tls_ca(a.tls_ca),
        allow_roots: roots(a.serve.allow_root)?,
        token: token(a.serve.token),
        shared_memory: !a.no_shared_memory,
        threads: a.threads,
        limits: a.limits.limits(),
        trace_dir: a.trace_dir,
        name: a.name.unwrap_or_default(),
    };
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
