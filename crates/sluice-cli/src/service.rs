//! `sluice dispatcher`, `sluice worker` and `sluice up`: the service's processes, and
//! `sluice remote-run`, its client from the shell. A worker's `--max-*` flags are the
//! operator's limits on what a job's spec may ask of it; `up` passes them to every worker.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result};
use sluice_core::ByteBudget;
use sluice_service::{DispatcherConfig, WorkerConfig, WorkerLimits};

/// The token from `--token`, else `SLUICE_TOKEN`.
fn token(flag: Option<String>) -> Option<String> {
    flag.or_else(|| std::env::var("SLUICE_TOKEN").ok()).filter(|t| !t.is_empty())
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
    #[command(flatten)]
    serve: ServeArgs,
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
    };
    sluice_service::serve_worker(config, |addr| announce("worker", addr))?;
    Ok(())
}

#[derive(clap::Args)]
pub struct UpArgs {
    /// Worker processes to start.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// The dispatcher's gRPC address.
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: String,
    /// The dispatcher's journal, kept across restarts of `up`. Without it, a temporary
    /// one (removed when `up` stops) still lets a crashed dispatcher resume its jobs.
    #[arg(long)]
    journal: Option<PathBuf>,
    /// Decode threads per worker (default: cores / workers).
    #[arg(long)]
    threads: Option<usize>,
    #[arg(long = "allow-root")]
    allow_root: Vec<PathBuf>,
    #[arg(long)]
    token: Option<String>,
    /// Metrics: the dispatcher on PORT, worker i on PORT+1+i.
    #[arg(long)]
    metrics_port: Option<u16>,
    /// TLS for the dispatcher and every worker: certificate chain (PEM; valid for the
    /// listen addresses), its key, and the CA workers check the dispatcher's against.
    #[arg(long, requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    #[arg(long, requires = "tls_cert")]
    tls_ca: Option<PathBuf>,
    /// Every worker records each job's pipeline events into
    /// DIR/job-<job id>-worker-<worker id>.pftrace (as `sluice worker --trace-dir`).
    #[arg(long, value_name = "DIR")]
    trace_dir: Option<PathBuf>,
    #[command(flatten)]
    limits: LimitArgs,
}

struct Supervised {
    name: String,
    args: Vec<String>,
    child: Child,
}

/// Starts a dispatcher and N workers as child processes of this one, restarts any that
/// dies, and stops them all on Ctrl-C/SIGTERM.
pub fn up(a: UpArgs) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find the sluice binary")?;
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let threads = a.threads.unwrap_or((cores / a.workers.max(1)).max(1));
    let roots = roots(a.allow_root)?;
    let token = token(a.token);
    let mut root_args = Vec::new();
    for r in &roots {
        root_args.push("--allow-root".to_string());
        root_args.push(r.display().to_string());
    }
    let mut tls_args = Vec::new();
    for (flag, v) in [("--tls-cert", &a.tls_cert), ("--tls-key", &a.tls_key)] {
        if let Some(p) = v {
            tls_args.extend([flag.to_string(), p.display().to_string()]);
        }
    }
    // Declared before the children: removed only after they have stopped.
    let (journal, temp_dir) = match a.journal {
        Some(path) => (path, None),
        None => {
            let dir = tempfile::Builder::new()
                .prefix("sluice-up-")
                .tempdir()
                .context("cannot create a temporary folder for the dispatcher's journal")?;
            (dir.path().join("dispatcher.journal"), Some(dir))
        }
    };
    let mut specs: Vec<(String, Vec<String>)> = Vec::new();
    let mut d = vec!["dispatcher".into(), "--listen".into(), a.listen.clone(), "--journal".into()];
    d.push(journal.display().to_string());
    d.extend(root_args.iter().cloned());
    d.extend(tls_args.iter().cloned());
    if let Some(p) = a.metrics_port {
        d.extend(["--metrics-port".into(), p.to_string()]);
    }
    specs.push(("dispatcher".into(), d));
    for i in 0..a.workers {
        let mut w = vec!["worker".into(), "--dispatcher".into(), a.listen.clone(), "--threads".into()];
        w.push(threads.to_string());
        w.extend(root_args.iter().cloned());
        w.extend(tls_args.iter().cloned());
        w.extend(a.limits.to_args());
        if let Some(ca) = &a.tls_ca {
            w.extend(["--tls-ca".to_string(), ca.display().to_string()]);
        }
        if let Some(p) = a.metrics_port {
            w.extend(["--metrics-port".into(), (p as usize + 1 + i).to_string()]);
        }
        if let Some(dir) = &a.trace_dir {
            w.extend(["--trace-dir".to_string(), dir.display().to_string()]);
        }
        specs.push((format!("worker {i}"), w));
    }
    let spawn = |args: &[String]| -> Result<Child> {
        let mut cmd = Command::new(&exe);
        cmd.args(args);
        if let Some(t) = &token {
            // Through the environment, not argv, so `ps` does not show it.
            cmd.env("SLUICE_TOKEN", t);
        }
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: prctl is async-signal-safe; the closure touches no memory of ours.
            // Children get SIGTERM if `up` itself dies, even by SIGKILL.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                    Ok(())
                });
            }
        }
        cmd.spawn().with_context(|| format!("cannot start `sluice {}`", args.join(" ")))
    };
    let stop = sluice_service::signal_flag()?;
    let mut children = Vec::new();
    for (name, args) in specs {
        let child = spawn(&args)?;
        children.push(Supervised { name, args, child });
    }
    println!("sluice up: dispatcher on {} with {} workers ({threads} threads each); Ctrl-C stops", a.listen, a.workers);
    match &temp_dir {
        Some(_) => println!("journal: {} (temporary; pass --journal to keep state across restarts)", journal.display()),
        None => println!("journal: {}", journal.display()),
    }
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(200));
        for s in &mut children {
            if let Ok(Some(status)) = s.child.try_wait() {
                tracing::warn!(process = %s.name, %status, "exited; restarting it");
                s.child = spawn(&s.args)?;
            }
        }
    }
    for s in &mut children {
        let _ = terminate(&mut s.child);
    }
    Ok(())
}

/// SIGTERM (a clean stop), then SIGKILL if it lingers.
fn terminate(child: &mut Child) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        for _ in 0..50 {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    child.kill()?;
    child.wait().map(|_| ())
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
    let mut options = sluice_service::RemoteOptions::new(a.dispatcher, a.job);
    options.token = token(a.token);
    options.tls_ca = tls_ca(a.tls_ca);
    options.parallel_epochs = a.parallel_epochs;
    options.compression = sluice_service::Compression::parse(&a.compression)?;
    options.data_plane = sluice_service::DataPlane::parse(&a.data_plane)?;
    let mut loader = sluice_service::RemoteLoader::connect(&spec, options)?;
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
