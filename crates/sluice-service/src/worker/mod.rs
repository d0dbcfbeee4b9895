//! A worker: registers with the dispatcher, heartbeats, and serves `RunTask` by running
//! the same [`Loader`] as local mode over one task's range of an epoch, streaming the
//! batches to the client that asked.
//!
//! Loaders are kept per job (each job has its own epochs and importance feedback), but
//! jobs with the same fingerprint (same pipeline, same data) share one cache: a sample
//! one job decoded is a hit for the others. Running a task is [`task`].

mod draw;
mod python_op;
mod task;
mod trace;

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sluice_core::PipelineSpec;
use sluice_pipeline::cache::Cache;
use sluice_pipeline::{CacheStats, Loader, Shard};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::TcpIncoming;

use crate::error::ServiceError;
use crate::job_table::JobTable;
use crate::limits::WorkerLimits;
use crate::security::{AllowedRoots, TokenCheck};
use crate::user_code::PythonModules;
use sluice_client::proto::worker_server::WorkerServer;
use sluice_client::proto::*;
use sluice_client::tls::ClientTls;
use sluice_client::{dispatcher_client, DispatcherConn};
use sluice_dashboard::metrics::{self, LatencyHistogram, Scrape};

use crate::tls::{ServerTls, TlsFiles};
use sluice_client::{MAX_CONTROL_MESSAGE_BYTES, MAX_MESSAGE_BYTES};

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// `host:port` for the data plane; port 0 picks a free one.
    pub listen: String,
    /// Address to tell clients (default: the bound address).
    pub advertise: Option<String>,
    /// `host:port` for the TCP data plane; port 0 picks a free one.
    pub data_listen: String,
    /// Data-plane address to tell clients (default: the bound address).
    pub advertise_data: Option<String>,
    /// The dispatcher, `host:port` or `http://host:port`.
    pub dispatcher: String,
    pub allow_roots: Vec<PathBuf>,
    pub token: Option<String>,
    pub metrics_listen: Option<String>,
    /// Decode threads per job; 0 keeps the spec's own setting.
    pub threads: usize,
    /// Serve gRPC and the data plane over TLS with this certificate and key.
    pub tls: Option<TlsFiles>,
    /// The CA of the dispatcher's certificate: reach it over TLS.
    pub dispatcher_ca: Option<PathBuf>,
    /// Also serve the local data plane (Linux): clients on this machine get batches
    /// through shared memory instead of loopback TCP.
    pub shared_memory: bool,
    /// What a job's spec may ask of this worker, and how many job loaders it keeps.
    pub limits: WorkerLimits,
    /// Record each job's pipeline events (per sample and op, per batch) and write them
    /// here, one Perfetto trace per job and worker, extended after every task.
    pub trace_dir: Option<PathBuf>,
    /// The name its supervisor knows it by (`sluice up`'s `worker-3`), for draining: a
    /// drained worker finishes its tasks and exits. Empty: none.
    pub name: String,
    /// The interpreter that runs specs' Python `map` ops (see [`python_op`]).
    pub python: PathBuf,
    /// The Python modules a job's `map` ops may import (`user_code`); none: a job with a
    /// `map` op is refused.
    pub allow_python_modules: Vec<String>,
}

struct JobRunner {
    loader: Loader,
    /// The job's fingerprint: a task for this job id with another is for another job (the
    /// dispatcher restarted without its journal and reused the id).
    fingerprint: String,
    /// Parallel epochs: full passes per epoch (1 in distributed mode). Batch `p * B + i`
    /// of epoch `e` is batch `i` of the loader's epoch `e * passes + p`, so each pass has
    /// its own order and augmentation, the same on every worker.
    passes: u64,
    /// Tasks of this job running at once: two, so the next task's samples fill the
    /// loader's threads while the last batches of the one before finish (one at a time
    /// left a thread idle at every task's tail). Bounds the worker's memory to
    /// `TASKS_AT_ONCE × prefetch` batches per job.
    running: Arc<tokio::sync::Semaphore>,
    /// Importance sampling: the dispatcher draws the epochs; these are the ones fetched.
    /// `None` for a uniformly sampled job (every worker computes its order itself).
    draws: Option<draw::Draws>,
    /// The job's trace file, with `--trace-dir` (see [`trace`]).
    trace: Option<trace::JobTrace>,
}

/// See [`JobRunner::running`].
const TASKS_AT_ONCE: usize = 2;

#[derive(Default)]
struct Counters {
    tasks_started: AtomicU64,
    tasks_done: AtomicU64,
    tasks_running: AtomicU64,
    batches: AtomicU64,
    samples: AtomicU64,
    bytes: AtomicU64,
    pixel_bytes: AtomicU64,
    task_time: LatencyHistogram,
    refused: AtomicU64,
}

struct Inner {
    dispatcher: DispatcherConn,
    roots: AllowedRoots,
    threads: usize,
    limits: WorkerLimits,
    jobs: tokio::sync::Mutex<JobTable<u64, JobRunner>>,
    /// Caches by job fingerprint (only taken while `jobs` is held); jobs of one
    /// [`share_group`] hold the same cache.
    caches: Mutex<HashMap<String, Arc<Cache>>>,
    /// The cache of each [`share_group`] (taken after `caches`).
    groups: Mutex<HashMap<String, std::sync::Weak<Cache>>>,
    counters: Counters,
    started: Instant,
    trace_dir: Option<PathBuf>,
    /// The id the dispatcher gave this worker (0 until registered): names trace files.
    worker_id: AtomicU64,
    /// This worker's process in traces ([`sluice_pipeline::trace::random_pid`]): its trace
    /// files' and its batches' `BatchTrace.pid`.
    trace_pid: u32,
    /// The address this worker registers with: its name in a draw's placement.
    addr: std::sync::OnceLock<String>,
    /// Per cache (job fingerprint), the keys of the hot set placed on this worker by the
    /// latest draw: what its cache holds (see [`draw`]).
    shares: Mutex<HashMap<String, Vec<u64>>>,
    /// The interpreter for Python `map` ops.
    python: PathBuf,
    python_modules: PythonModules,
    /// Every job's Python `map` children (`limits.max_python_children`).
    children: Arc<python_op::ChildPool>,
}

#[derive(Clone)]
pub struct WorkerService {
    inner: Arc<Inner>,
}

impl WorkerService {
    pub fn new(config: &WorkerConfig) -> Result<Self, ServiceError> {
        if let Some(dir) = &config.trace_dir {
            trace::create_dir(dir)?;
        }
        Ok(Self {
            inner: Arc::new(Inner {
                dispatcher: {
                    let ca = config.dispatcher_ca.as_deref().map(ClientTls::load).transpose()?;
                    dispatcher_client(&config.dispatcher, config.token.as_deref(), ca.as_ref())?
                },
                roots: AllowedRoots::new(&config.allow_roots)?,
                threads: config.threads,
                limits: config.limits,
                jobs: tokio::sync::Mutex::new(JobTable::new(config.limits.max_jobs, config.limits.job_idle)),
                caches: Mutex::new(HashMap::new()),
                groups: Mutex::new(HashMap::new()),
                counters: Counters::default(),
                started: Instant::now(),
                trace_dir: config.trace_dir.clone(),
                worker_id: AtomicU64::new(0),
                trace_pid: sluice_pipeline::trace::random_pid(),
                addr: std::sync::OnceLock::new(),
                shares: Mutex::new(HashMap::new()),
                python: config.python.clone(),
                python_modules: PythonModules::new(&config.allow_python_modules)?,
                children: python_op::ChildPool::new(config.limits.max_python_children)
                    .map_err(|e| ServiceError::Thread { what: "the Python map watchdog", source: e })?,
            }),
        })
    }

    /// The job's loader, built on first use from the dispatcher's definition, after
    /// checking every path it would read against the allowed roots. A cached loader whose
    /// fingerprint is not `fingerprint` (when given) belonged to an earlier job of this id:
    /// the job is loaded afresh, and refused if the dispatcher's differs too.
    async fn runner(&self, job_id: u64, fingerprint: &str) -> Result<Arc<JobRunner>, ServiceError> {
        let mut jobs = self.inner.jobs.lock().await;
        if let Some(r) = jobs.get(&job_id, Instant::now()) {
            if fingerprint.is_empty() || r.fingerprint == fingerprint {
                return Ok(r);
            }
            tracing::info!(job_id, old = %r.fingerprint, new = %fingerprint, "job id reused for another job; loading it afresh");
        }
        let room = jobs.make_room(Instant::now());
        self.forget_unused_caches();
        if !room {
            return Err(ServiceError::TooManyJobs { max: self.inner.limits.max_jobs });
        }
        let def = self
            .inner
            .dispatcher
            .clone()
            .get_job(GetJobRequest { job_id })
            .await
            .map_err(|s| sluice_client::ClientError::rpc("GetJob", s))?
            .into_inner();
        if !fingerprint.is_empty() && def.fingerprint != fingerprint {
            return Err(ServiceError::NotFound {
                what: "job",
                id: format!(
                    "{job_id} with fingerprint {fingerprint} (the dispatcher's job {job_id} is {})",
                    def.fingerprint
                ),
            });
        }
        let job_fingerprint = def.fingerprint.clone();
        let passes = def.passes.max(1);
        let mut spec = PipelineSpec::from_json_str(&def.spec_json)?;
        if self.inner.threads > 0 {
            spec.threads = self.inner.threads.into();
        }
        let ram = sluice_pipeline::cache::total_ram_bytes().unwrap_or(u64::MAX);
        self.inner.limits.check(&spec, ram)?;
        self.inner.python_modules.check(&spec)?;
        self.inner.roots.check_source(&spec.source)?;
        // Out of the registry again once the loader is built (or failed to be).
        let maps = python_op::JobMaps::register(&spec, &self.inner.python, &self.inner.children);
        let roots = self.inner.roots.clone();
        let inner = self.inner.clone();
        let loader = tokio::task::spawn_blocking(move || -> Result<Loader, ServiceError> {
            let manifest = roots.manifest(&spec)?;
            if manifest.fingerprint_hex() != def.manifest_fingerprint {
                return Err(ServiceError::InvalidArgument(format!(
                    "the dataset this worker sees (fingerprint {}) differs from the dispatcher's ({})",
                    manifest.fingerprint_hex(),
                    def.manifest_fingerprint
                )));
            }
            let group = share_group(&spec, &manifest, &def.fingerprint);
            let mut caches = inner.caches.lock();
            let mut groups = inner.groups.lock();
            let shared = caches.get(&def.fingerprint).cloned().or_else(|| groups.get(&group).and_then(|c| c.upgrade()));
            let loader = match shared {
                Some(cache) => {
                    tracing::info!(job_id, fingerprint = %def.fingerprint, %group, "job shares the cache of an earlier job");
                    Loader::with_shared_cache(spec, manifest, Shard::default(), cache)?
                }
                None => Loader::with_manifest(spec, manifest, Shard::default())?,
            };
            if let Some(cache) = loader.cache() {
                groups.entry(group).or_insert_with(|| Arc::downgrade(&cache));
                caches.entry(def.fingerprint.clone()).or_insert(cache);
            }
            roots.confine(loader)
        })
        .await
        .map_err(|source| ServiceError::Blocking { what: "building the job's loader", source })?;
        drop(maps);
        let loader = loader?;
        tracing::info!(job_id, samples = loader.manifest().len(), threads = loader.threads(), "job loaded");
        let trace = match &self.inner.trace_dir {
            Some(dir) => {
                let worker_id = self.inner.worker_id.load(Ordering::Relaxed);
                Some(trace::JobTrace::start(&loader, dir, job_id, worker_id, self.inner.trace_pid)?)
            }
            None => None,
        };
        let runner = Arc::new(JobRunner {
            trace,
            fingerprint: job_fingerprint,
            passes,
            running: Arc::new(tokio::sync::Semaphore::new(TASKS_AT_ONCE)),
            draws: (loader.spec().sampling != sluice_core::SamplingSpec::Uniform).then(draw::Draws::default),
            loader,
        });
        jobs.insert(job_id, runner.clone(), Instant::now());
        Ok(runner)
    }

    /// Drops the job loaders idle for the operator's idle time, and caches no loader uses.
    async fn evict_idle(&self) {
        let mut jobs = self.inner.jobs.lock().await;
        let evicted = jobs.evict_idle(Instant::now());
        if evicted > 0 {
            self.forget_unused_caches();
            tracing::info!(evicted, kept = jobs.len(), "dropped idle job loaders");
        }
    }

    /// Drops the caches of fingerprints no kept loader uses (called with `jobs` held).
    fn forget_unused_caches(&self) {
        let mut caches = self.inner.caches.lock();
        // A cache several fingerprints share is held once by each of their entries.
        let mut held: HashMap<*const Cache, usize> = HashMap::new();
        for cache in caches.values() {
            *held.entry(Arc::as_ptr(cache)).or_default() += 1;
        }
        caches.retain(|_, cache| Arc::strong_count(cache) > held.get(&Arc::as_ptr(cache)).copied().unwrap_or(1));
        self.inner.groups.lock().retain(|_, cache| cache.strong_count() > 0);
    }

    /// Each job's seconds spent producing (its thread-busy time over its threads) and
    /// batches made. `None` while the job table is busy (the heartbeat sends its last
    /// reading again).
    fn job_work(&self) -> Option<Vec<JobWork>> {
        let jobs = self.inner.jobs.try_lock().ok()?;
        Some(
            jobs.iter()
                .map(|(id, r)| {
                    let stats = r.loader.stats();
                    let busy: f64 = stats.op_seconds.iter().map(|(_, s)| s).sum();
                    JobWork { job_id: *id, busy_s: busy / r.loader.threads().max(1) as f64, batches: stats.batches }
                })
                .collect(),
        )
    }

    /// Hits and lookups of the caches held now, for the heartbeat: all together, and each.
    fn cache_lookups(&self) -> WorkerHeartbeatRequest {
        let caches = self.inner.caches.lock();
        let shares = self.inner.shares.lock();
        let mut out = WorkerHeartbeatRequest::default();
        let mut counted = std::collections::HashSet::new();
        for (fingerprint, cache) in caches.iter() {
            let s = cache.stats();
            // Jobs sharing a cache each report it; the totals count it once.
            if counted.insert(Arc::as_ptr(cache)) {
                out.cache_hits += s.tier.hits;
                out.cache_lookups += s.tier.hits + s.tier.misses;
            }
            let share = shares.get(fingerprint).map_or(&[][..], Vec::as_slice);
            out.caches.push(CacheReport {
                fingerprint: fingerprint.clone(),
                hits: s.tier.hits,
                misses: s.tier.misses,
                capacity_entries: cache.capacity_entries().unwrap_or(0),
                entries: s.tier.entries,
                share: share.len() as u64,
                share_held: cache.held(share),
                off: s.off.is_some(),
            });
        }
        out
    }

    pub fn render_metrics(&self) -> String {
        let c = &self.inner.counters;
        let count = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let up = self.inner.started.elapsed().as_secs_f64();
        let samples = count(&c.samples);
        let mut m = Scrape::default();
        m.counter("sluice_worker_tasks_started", "tasks started", count(&c.tasks_started));
        m.counter("sluice_worker_tasks_done", "tasks streamed to the end", count(&c.tasks_done));
        m.gauge("sluice_worker_tasks_running", "tasks running or queued (queue depth)", count(&c.tasks_running));
        m.counter("sluice_worker_batches", "batches sent", count(&c.batches));
        m.counter("sluice_worker_samples", "samples sent", samples);
        m.counter("sluice_worker_bytes_sent", "pixel bytes sent, after compression", count(&c.bytes));
        m.counter("sluice_worker_pixel_bytes", "pixel bytes produced, before compression", count(&c.pixel_bytes));
        m.gauge(
            "sluice_worker_samples_per_second",
            "mean throughput since start",
            if up > 0.0 { samples as f64 / up } else { 0.0 },
        );
        m.counter("sluice_worker_requests_refused", "RunTask calls refused", count(&c.refused));
        m.gauge(
            "sluice_worker_python_children",
            "Python map processes alive, over all jobs (--max-python-children)",
            self.inner.children.live() as u64,
        );
        m.histogram("sluice_worker_task_seconds", "time to run and stream one task", &c.task_time);
        // Each cache once (jobs with one fingerprint share it).
        if let Some(caches) = self.inner.caches.try_lock() {
            let stats: Vec<_> = caches.iter().map(|(f, c)| (vec![("fingerprint", f.clone())], c.stats())).collect();
            let each = |value: fn(&CacheStats) -> u64| stats.iter().map(move |(l, s)| (l.clone(), value(s)));
            m.counters("sluice_worker_cache_hits", "cache hits", each(|s| s.tier.hits));
            m.counters("sluice_worker_cache_misses", "cache misses", each(|s| s.tier.misses));
            m.gauges("sluice_worker_cache_bytes", "bytes held", each(|s| s.tier.used_bytes));
            m.gauges(
                "sluice_worker_cache_hit_rate",
                "hits / lookups since start",
                stats.iter().map(|(l, s)| (l.clone(), s.tier.hit_rate)),
            );
        }
        // Per-op busy time of every job's loader.
        if let Ok(jobs) = self.inner.jobs.try_lock() {
            m.counters(
                "sluice_worker_op_seconds",
                "busy time per op, summed over threads",
                jobs.iter().flat_map(|(id, r)| {
                    r.loader
                        .stats()
                        .op_seconds
                        .into_iter()
                        .map(move |(op, s)| (vec![("job_id", id.to_string()), ("op", op)], s))
                }),
            );
        }
        m.render()
    }
}

/// A stopping worker's drain, between [`drain_on_stop`] and [`heartbeat_loop`].
#[derive(Default)]
struct Drain {
    /// The worker is stopping: its heartbeats ask to be drained.
    asked: AtomicBool,
    /// A heartbeat reply said the dispatcher drains it.
    taken: tokio::sync::Notify,
}

/// Registers with the dispatcher and heartbeats every 250 ms, registering again whenever
/// the dispatcher does not know us (it restarted) and retrying while it is away. Returns
/// when the dispatcher says this worker was drained: it holds no task and should exit.
async fn heartbeat_loop(service: WorkerService, register: RegisterWorkerRequest, drain: Arc<Drain>) {
    let mut client = service.inner.dispatcher.clone();
    let mut id: Option<u64> = None;
    let mut backoff = Duration::from_millis(50);
    let mut jobs: Vec<JobWork> = Vec::new();
    loop {
        let c = &service.inner.counters;
        jobs = service.job_work().unwrap_or(jobs);
        let result = match id {
            None => client.register_worker(register.clone()).await.map(|r| {
                let wid = r.into_inner().worker_id;
                tracing::info!(worker_id = wid, addr = %register.addr, "registered with the dispatcher");
                service.inner.worker_id.store(wid, Ordering::Relaxed);
                id = Some(wid);
                // Not drained: just registered.
                false
            }),
            Some(wid) => client
                .worker_heartbeat(WorkerHeartbeatRequest {
                    worker_id: wid,
                    tasks_running: c.tasks_running.load(Ordering::Relaxed),
                    batches_produced: c.batches.load(Ordering::Relaxed),
                    busy_s: jobs.iter().map(|j| j.busy_s).sum(),
                    jobs: jobs.clone(),
                    drain: drain.asked.load(Ordering::Relaxed),
                    ..service.cache_lookups()
                })
                .await
                .map(|r| {
                    let r = r.into_inner();
                    if !r.known {
                        id = None;
                    }
                    if r.draining {
                        drain.taken.notify_waiters();
                    }
                    r.drained
                }),
        };
        match result {
            Ok(true) => {
                tracing::info!(name = %register.name, "drained: every task is done; exiting");
                return;
            }
            Ok(false) => {
                backoff = Duration::from_millis(50);
                if id.is_some() {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
            Err(status) => {
                tracing::debug!(error = %status, "dispatcher unreachable; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// Runs a worker until `shutdown` resolves.
pub async fn run_worker(
    config: WorkerConfig,
    shutdown: impl Future<Output = ()> + Send,
    on_listening: impl FnOnce(std::net::SocketAddr),
) -> Result<(), ServiceError> {
    let service = WorkerService::new(&config)?;
    let tls = config.tls.as_ref().map(ServerTls::load).transpose()?;
    if let Some(addr) = &config.metrics_listen {
        let s = service.clone();
        let bound = metrics::serve(addr, Arc::new(move || s.render_metrics())).await?;
        tracing::info!(%bound, "worker metrics at /metrics");
    }
    let listen_err = |e: String| ServiceError::Listen { addr: config.listen.clone(), message: e };
    let listener = tokio::net::TcpListener::bind(&config.listen).await.map_err(|e| listen_err(e.to_string()))?;
    let local = listener.local_addr().map_err(|e| listen_err(e.to_string()))?;
    let incoming = TcpIncoming::from_listener(listener, true, Some(Duration::from_secs(30)))
        .map_err(|e| listen_err(e.to_string()))?;
    let advertise = config.advertise.clone().unwrap_or_else(|| local.to_string());
    let data_listener = tokio::net::TcpListener::bind(&config.data_listen)
        .await
        .map_err(|e| ServiceError::Listen { addr: config.data_listen.clone(), message: e.to_string() })?;
    let data_local = data_listener
        .local_addr()
        .map_err(|e| ServiceError::Listen { addr: config.data_listen.clone(), message: e.to_string() })?;
    let advertise_data = config.advertise_data.clone().unwrap_or_else(|| data_local.to_string());
    tracing::info!(addr = %local, %advertise, data = %data_local, roots = ?service.inner.roots.roots(), "worker listening");
    on_listening(local);
    let s = service.clone();
    let start: crate::dataplane::StartTask = Arc::new(move |req| {
        let s = s.clone();
        Box::pin(async move { s.start_task(req).await })
    });
    let local_data =
        if config.shared_memory { serve_local_data_plane(start.clone(), config.token.clone()) } else { None };
    let data = tokio::spawn(crate::dataplane::serve(
        data_listener,
        start,
        config.token.clone(),
        tls.as_ref().map(|t| t.data.clone()),
        crate::dataplane::ConnectionLimits::default(),
    ));
    let _ = service.inner.addr.set(advertise.clone());
    let register = RegisterWorkerRequest {
        addr: advertise,
        data_addr: advertise_data,
        local_data_addr: local_data.as_ref().map(|(name, _)| name.clone()).unwrap_or_default(),
        name: config.name.clone(),
    };
    let drain = Arc::new(Drain::default());
    let mut hb = tokio::spawn(heartbeat_loop(service.clone(), register, drain.clone()));
    let sweep = {
        let service = service.clone();
        let every = (config.limits.job_idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(30));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                service.evict_idle().await;
            }
        })
    };
    // Requests are small; only the batches going out are large.
    let server = WorkerServer::new(service)
        .max_decoding_message_size(MAX_CONTROL_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = &tls {
        builder = builder.tls_config(tls.grpc.clone()).map_err(|e| ServiceError::Tls(e.to_string()))?;
    }
    let result = builder
        .initial_stream_window_size(Some(8 << 20))
        .initial_connection_window_size(Some(32 << 20))
        .add_service(InterceptedService::new(server, TokenCheck::new(config.token.as_deref())))
        .serve_with_incoming_shutdown(incoming, async {
            tokio::select! {
                () = shutdown => drain_on_stop(&drain, &config.name, &mut hb).await,
                // The heartbeat loop ends only when the dispatcher drained this worker.
                _ = &mut hb => {}
            }
        })
        .await
        .map_err(|source| ServiceError::Serve { what: "worker", source });
    hb.abort();
    sweep.abort();
    data.abort();
    if let Some((_, task)) = local_data {
        task.abort();
    }
    result
}

/// Longest a stopped worker waits to finish the tasks it holds (Kubernetes' default
/// grace period before SIGKILL is 30 s; deploy/worker.yaml gives it 60).
const DRAIN_ON_STOP: Duration = Duration::from_secs(50);

/// Stopped (SIGTERM: Kubernetes scaling the worker StatefulSet down, or any supervisor), a
/// named worker drains first, as one that `sluice up` scales down does: its heartbeats ask
/// the dispatcher for no new task (`WorkerHeartbeatRequest.drain`) and it serves the ones
/// it holds until the heartbeat says it is drained. An unnamed worker, or one whose
/// dispatcher does not take the drain, stops at once (the dispatcher hands its tasks to
/// others when their leases run out).
async fn drain_on_stop(drain: &Drain, name: &str, hb: &mut tokio::task::JoinHandle<()>) {
    if name.is_empty() {
        return;
    }
    let taken = drain.taken.notified();
    tokio::pin!(taken);
    taken.as_mut().enable();
    drain.asked.store(true, Ordering::Relaxed);
    tokio::select! {
        () = &mut taken => {
            tracing::info!(name, "stopping: draining first (no new tasks; finishing the ones held)");
            if tokio::time::timeout(DRAIN_ON_STOP, hb).await.is_err() {
                tracing::warn!(name, seconds = DRAIN_ON_STOP.as_secs(), "not drained in time; stopping anyway");
            }
        }
        // Drained already (it held nothing): the heartbeat loop ended.
        _ = &mut *hb => {}
        () = tokio::time::sleep(Duration::from_secs(2)) => {
            tracing::warn!(name, "stopping without draining: the dispatcher did not take the drain");
        }
    }
}

/// Listens for clients on this machine on a fresh abstract socket name; `None` (and TCP
/// only) where that is impossible.
#[cfg(target_os = "linux")]
fn serve_local_data_plane(
    start: crate::dataplane::StartTask,
    token: Option<String>,
) -> Option<(String, tokio::task::JoinHandle<()>)> {
    let name = format!("sluice-worker-{}-{:016x}", std::process::id(), sluice_client::shm::random_u64());
    match sluice_client::shm::listen_abstract(&name) {
        Ok(listener) => {
            tracing::info!(socket = %name, "local data plane (shared memory) listening");
            let pool = Arc::new(crate::dataplane::RegionPool::default());
            Some((
                name.clone(),
                tokio::spawn(crate::dataplane::serve_local(listener, start, token, pool, Default::default())),
            ))
        }
        Err(e) => {
            tracing::warn!(error = %e, "no local data plane; clients on this machine use TCP");
            None
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn serve_local_data_plane(
    _: crate::dataplane::StartTask,
    _: Option<String>,
) -> Option<(String, tokio::task::JoinHandle<()>)> {
    None
}

/// Which jobs on this worker fill and read one cache. A job drawn uniformly shares with
/// every job of the same [`share_key`](sluice_pipeline::cache::share_key) (same data,
/// record options, limits, deterministic ops before the cache seam, cache level and
/// resize): jobs that differ only in seed, batch, random ops or the cache's budget and
/// policy decode each sample once. A job with another sampling (importance) points its
/// cache at its own epoch draws (priorities, its placement share), which another job's
/// draws would overwrite, so it shares only with jobs of its own fingerprint.
fn share_group(spec: &PipelineSpec, manifest: &sluice_core::Manifest, fingerprint: &str) -> String {
    if spec.sampling == sluice_core::SamplingSpec::Uniform {
        format!("prefix {:016x}", sluice_pipeline::cache::share_key(spec, manifest))
    } else {
        format!("job {fingerprint}")
    }
}
