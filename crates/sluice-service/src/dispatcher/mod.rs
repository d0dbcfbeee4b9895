//! The dispatcher: owns jobs, epochs and task assignment; journals every decision before
//! answering, so a restarted dispatcher resumes every job where it stood.

mod autoscale;
mod http;
pub(crate) mod journal;
mod metrics;
pub mod state;
mod view;

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use sluice_autoscale::AutoscaleConfig;
use sluice_core::PipelineSpec;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};
use xxhash_rust::xxh3::Xxh3;

use sluice_client::proto::dispatcher_server::{Dispatcher, DispatcherServer};
use sluice_client::proto::*;
use sluice_client::MAX_CONTROL_MESSAGE_BYTES;

use crate::error::ServiceError;
use crate::security::{check_client, require_operator, AllowedRoots, TokenCheck};
use crate::user_code::PythonModules;
use autoscale::ServiceAutoscale;
use journal::{Journal, Record};
use sluice_client::AutoscaleOff;
use sluice_dashboard::metrics::LatencyHistogram;
use state::{ClientReport, JobImportance, State};

/// Batches per task when the client does not say: small enough to balance a short epoch
/// over workers, large enough that task RPCs cost nothing next to the batches.
pub const DEFAULT_TASK_BATCHES: u64 = 4;
/// Longest a GetTask waits for a task to free up before answering WAIT.
const LONG_POLL: Duration = Duration::from_millis(500);

#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    /// `host:port` for gRPC; 127.0.0.1 unless exposed on purpose.
    pub listen: String,
    /// Append-only journal; `None` keeps state in memory only.
    pub journal: Option<PathBuf>,
    pub allow_roots: Vec<PathBuf>,
    pub token: Option<String>,
    /// What operator calls (`SetScale`, `DrainWorker`) must carry. `None`: they are
    /// refused where `token` is set (a client's token is not enough), and open to anyone
    /// where neither is.
    pub operator_token: Option<String>,
    /// `host:port` for `/metrics`; `None` serves none.
    pub metrics_listen: Option<String>,
    /// Serve gRPC over TLS with this certificate and key.
    pub tls: Option<crate::tls::TlsFiles>,
    /// Run the autoscaler: a policy, worker bounds and a window (by time).
    pub autoscale: Option<AutoscaleConfig>,
    /// Cache-aware assignment of importance-sampled jobs (see `state::placement`); off:
    /// cache-blind, tasks go to the least loaded worker whatever it caches.
    pub cache_aware: bool,
    /// The Python modules a job's `map` ops may import (`user_code`); none: a job with a
    /// `map` op is refused.
    pub allow_python_modules: Vec<String>,
}

#[derive(Default)]
struct Counters {
    get_task: LatencyHistogram,
    requests: AtomicU64,
    errors: AtomicU64,
    assigned: AtomicU64,
    acked: AtomicU64,
    failed: AtomicU64,
    batches_acked: AtomicU64,
    /// Importance values taken into a store, and ignored (unknown keys, NaN/inf, negative).
    reported: AtomicU64,
    reports_ignored: AtomicU64,
}

struct Inner {
    state: Mutex<State>,
    /// Wakes long-polling GetTask calls when anything they wait on may have changed.
    changed: tokio::sync::Notify,
    journal: Journal,
    roots: AllowedRoots,
    python_modules: PythonModules,
    counters: Counters,
    /// The autoscaler, with `--autoscale` (its lock is taken after `state`'s, never before).
    autoscale: Option<Mutex<ServiceAutoscale>>,
}

#[derive(Clone)]
pub struct DispatcherService {
    inner: Arc<Inner>,
}

/// Refuses what only multi-learner local loaders may ask for. In the service, workers would
/// act on it for any client: dial every address in `locality.peers`, create the
/// `storage.shared_link` file, write `cache.disk` files; and the dispatcher assigns samples to workers itself.
fn refuse_learner_only(spec: &PipelineSpec) -> Result<(), ServiceError> {
    let refuse = |field: &str, why: &str| Err(ServiceError::Spec(sluice_core::SpecError::new(field, why)));
    if spec.locality.is_some() {
        return refuse("locality", "is for learners loading locally (Loader with rank/world_size), not service jobs");
    }
    if matches!(spec.storage, sluice_core::StorageSpec::Throttled { shared_link: Some(_), .. }) {
        return refuse("storage.shared_link", "is for learner processes on one machine, not service jobs");
    }
    if spec.cache.as_ref().is_some_and(|c| c.disk.is_some()) {
        return refuse(
            "cache.disk",
            "is for loaders on one machine (it writes files in the folder it names), not service jobs",
        );
    }
    Ok(())
}

/// Bytes a batch's metadata fields may take: they travel in its header, whose data-plane
/// frame a client reads up to [`MAX_HEADER`](sluice_client::dataplane::MAX_HEADER) (16 MiB);
/// 2 MiB of it are left for the keys, labels and boxes (26 bytes a box row: 256 samples of
/// 300 boxes). Masks travel after the pixels (`RunTaskRequest.masks_in_body`), not here.
pub const MAX_BATCH_FIELD_BYTES: u64 = sluice_client::dataplane::MAX_HEADER as u64 - (2 << 20);

/// Refuses a job whose batches' metadata fields could outgrow a batch header at their
/// limits: `batch.size` × (each text or JSON field's `limits.max_field_bytes`, each
/// multi-label field's classes × 4, 8 for the rest): over [`MAX_BATCH_FIELD_BYTES`].
fn refuse_oversized_fields(spec: &PipelineSpec) -> Result<(), ServiceError> {
    use sluice_core::FieldKindName as K;
    let per_sample: u64 = spec
        .fields
        .iter()
        .map(|f| match f.kind {
            K::Text | K::Json => spec.limits.max_field_bytes.saturating_add(8),
            K::MultiLabel => f.classes.unwrap_or(0).saturating_mul(4),
            K::Float | K::Int => 8,
        })
        .fold(0u64, u64::saturating_add);
    let bytes = per_sample.saturating_mul(spec.batch.size as u64);
    let budget = MAX_BATCH_FIELD_BYTES;
    if bytes > budget {
        return Err(ServiceError::Spec(sluice_core::SpecError::new(
            "limits.max_field_bytes",
            format!(
                "a batch's fields may take {bytes} bytes ({} samples of up to {per_sample}), over the \
                 {budget} bytes a served batch's header has for them; lower \
                 limits.max_field_bytes or batch.size",
                spec.batch.size
            ),
        )));
    }
    Ok(())
}

/// Gives a replayed importance-sampled job its store again, from its dataset enumerated
/// afresh. A dataset that cannot be read or changed leaves the job without one (its reports
/// and draws are then refused) rather than keep the dispatcher from starting.
fn replay_importance(
    state: &mut State,
    roots: &AllowedRoots,
    job_id: u64,
    spec_json: &str,
    manifest_fingerprint: &str,
) {
    let Ok(spec) = PipelineSpec::from_json_str(spec_json) else { return };
    if spec.sampling == sluice_core::SamplingSpec::Uniform {
        return;
    }
    // Within the roots, as when the job was created: the dataset may have changed since.
    match roots.manifest(&spec) {
        Ok(m) if m.fingerprint_hex() == manifest_fingerprint => {
            if let Some(importance) = JobImportance::for_job(&spec, m) {
                let _ = state.attach_importance(job_id, importance);
            }
        }
        Ok(m) => {
            tracing::warn!(job_id, was = manifest_fingerprint, now = %m.fingerprint_hex(), "journal: the job's dataset changed; its importance store is dropped")
        }
        Err(e) => {
            tracing::warn!(job_id, error = %e, "journal: the job's dataset cannot be read; its importance store is dropped")
        }
    }
}

/// Positions of an epoch's draw in one `EpochDrawReply` chunk, which must fit
/// [`MAX_CONTROL_MESSAGE_BYTES`]: each position takes at most 20 bytes there (its place in
/// the order, ≤ 5; its weight, 4; a place in the hot set, ≤ 5; its owner, ≤ 2; its cache
/// priority, 4), and an eighth of the message is left for the workers' addresses.
pub const DRAW_CHUNK: usize = (MAX_CONTROL_MESSAGE_BYTES / 8 * 7) / 20;

fn valid_name(what: &str, s: &str) -> Result<(), ServiceError> {
    if s.is_empty() || s.len() > 256 || s.chars().any(|c| c.is_control()) {
        return Err(ServiceError::InvalidArgument(format!("{what} must be 1 to 256 printable characters")));
    }
    Ok(())
}

impl DispatcherService {
    /// Replays the journal (if any) into a fresh state.
    pub fn new(config: &DispatcherConfig) -> Result<Self, ServiceError> {
        let roots = AllowedRoots::new(&config.allow_roots)?;
        let python_modules = PythonModules::new(&config.allow_python_modules)?;
        let base = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(1);
        let mut state = State::new(base);
        state.cache_aware = config.cache_aware;
        // The autoscaler's last target before a restart.
        let mut scaled = None;
        let journal = match &config.journal {
            None => Journal::disabled(),
            Some(path) => {
                let (journal, records) = Journal::open(path)?;
                scaled = records.iter().rev().find_map(|r| match r {
                    Record::Scale { workers } => Some(usize::try_from(*workers).unwrap_or(usize::MAX)),
                    _ => None,
                });
                let now = Instant::now();
                for r in &records {
                    match r {
                        Record::Report { job_id, .. } | Record::Draw { job_id, .. }
                            if state.importance(*job_id).is_err() =>
                        {
                            tracing::warn!(
                                job_id,
                                "journal: an importance record for a job without its store; skipped"
                            );
                            continue;
                        }
                        _ => state.apply(r, now, 0)?,
                    }
                    if let Record::Job { job_id, spec_json, manifest_fingerprint, .. } = r {
                        replay_importance(&mut state, &roots, *job_id, spec_json, manifest_fingerprint);
                    }
                }
                tracing::info!(path = %path.display(), records = records.len(), jobs = state.jobs.len(), "journal replayed");
                journal
            }
        };
        Ok(Self {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                changed: tokio::sync::Notify::new(),
                journal,
                roots,
                python_modules,
                counters: Counters::default(),
                autoscale: config
                    .autoscale
                    .clone()
                    .map(|c| ServiceAutoscale::new(c, Instant::now(), scaled))
                    .transpose()?
                    .map(Mutex::new),
            }),
        })
    }

    /// Applies `record` and queues it for the journal under one lock, so the journal's order
    /// is the order of decisions. Refused before anything changes while the journal cannot
    /// write (see `journal`): the request fails, the dispatcher goes on. Compacts the
    /// journal when it has grown enough.
    fn commit(&self, state: &mut State, record: &Record, worker: u64) -> Result<(), ServiceError> {
        self.inner.journal.ready()?;
        state.apply(record, Instant::now(), worker)?;
        self.inner.journal.append(record)?;
        if self.inner.journal.wants_compaction() {
            self.compact(state);
        }
        self.inner.changed.notify_waiters();
        Ok(())
    }

    /// Hands the journal a snapshot of `state` to replace it with (under the state's lock;
    /// the autoscaler's lock is taken after it, as everywhere).
    fn compact(&self, state: &State) {
        // Held until the snapshot is queued: a `Scale` appended meanwhile would come before
        // it in the journal, its target missing from it.
        let autoscale = self.inner.autoscale.as_ref().map(|a| a.lock());
        let (head, tail) = state.snapshot(autoscale.as_ref().map(|a| a.target() as u64));
        if let Err(e) = self.inner.journal.compact(&head, &tail) {
            tracing::warn!(error = %e, "journal compaction not started");
        }
    }

    /// What a reply decided now must wait for (call it under the state's lock): every
    /// record appended so far, its own and others' it may depend on, durable.
    fn barrier(&self) -> u64 {
        self.inner.journal.appended()
    }

    /// Waits until the records up to `seq` ([`DispatcherService::barrier`]) are on disk.
    async fn durable(&self, seq: u64) -> Result<(), ServiceError> {
        self.inner.journal.durable(seq).await
    }

    #[allow(clippy::result_large_err)] // the trait's own return type
    fn counted<T>(&self, r: Result<T, ServiceError>) -> Result<Response<T>, Status> {
        self.inner.counters.requests.fetch_add(1, Ordering::Relaxed);
        match r {
            Ok(v) => Ok(Response::new(v)),
            Err(e) => {
                self.inner.counters.errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(error = %e, "request refused");
                Err(e.into())
            }
        }
    }

    async fn create_job_inner(&self, req: CreateJobRequest) -> Result<JobInfo, ServiceError> {
        valid_name("job_name", &req.job_name)?;
        let spec = PipelineSpec::from_json_str(&req.spec_json)?;
        // Importance sampling: the dispatcher draws each epoch of the whole job from one
        // store; parallel epochs would need a store per pass.
        if spec.sampling != sluice_core::SamplingSpec::Uniform && req.parallel_epochs > 1 {
            return Err(ServiceError::Spec(sluice_core::SpecError::new(
                "sampling",
                "importance sampling runs distributed epochs only (parallel_epochs 0 or 1)",
            )));
        }
        refuse_learner_only(&spec)?;
        refuse_oversized_fields(&spec)?;
        self.inner.python_modules.check(&spec)?;
        let (for_manifest, roots) = (spec.clone(), self.inner.roots.clone());
        let manifest = tokio::task::spawn_blocking(move || roots.manifest(&for_manifest))
            .await
            .map_err(|source| ServiceError::Blocking { what: "reading the manifest", source })??;
        // A mix's epoch is the global batches its weights fill before a source runs out,
        // sized by the plan the workers' loaders draw it with (each worker orders the mix
        // from the spec alone, as for one source, so no draw is shipped).
        let samples = match sluice_pipeline::sampler::MixPlan::of(&spec.source, &manifest)? {
            Some(plan) => (plan.batches(spec.batch.size) * spec.batch.size) as u64,
            None => manifest.len() as u64,
        };
        let manifest_fingerprint = manifest.fingerprint_hex();
        let manifest_hash = manifest.fingerprint;
        let importance = JobImportance::for_job(&spec, manifest);
        let b = spec.batch.size as u64;
        let batches = if spec.batch.drop_last { samples / b } else { samples.div_ceil(b) };
        let canonical = serde_json::to_string(&spec)
            .map_err(|source| ServiceError::SpecJson { job: req.job_name.clone(), source })?;
        let mut h = Xxh3::new();
        h.update(&manifest_hash.to_le_bytes());
        h.update(canonical.as_bytes());
        // Distributed jobs keep the fingerprints they always had.
        let passes = req.parallel_epochs.max(1);
        if passes > 1 {
            if passes > 1024 {
                return Err(ServiceError::InvalidArgument(format!("parallel_epochs {passes} is over 1024")));
            }
            h.update(b"parallel_epochs");
            h.update(&passes.to_le_bytes());
        }
        let fingerprint = format!("{:016x}", h.digest());
        let task_batches = if req.task_batches == 0 { DEFAULT_TASK_BATCHES } else { req.task_batches.min(1 << 20) };

        let (seq, job_id) = {
            let mut state = self.inner.state.lock();
            if let Some(&id) = state.names.get(&req.job_name) {
                let job = state.job(id)?;
                if job.fingerprint != fingerprint {
                    return Err(ServiceError::JobConflict {
                        name: req.job_name,
                        existing: job.fingerprint.clone(),
                        requested: fingerprint,
                    });
                }
                (self.barrier(), id)
            } else {
                let job_id = state.next_job_id();
                let record = Record::Job {
                    job_id,
                    name: req.job_name.clone(),
                    spec_json: canonical,
                    fingerprint: fingerprint.clone(),
                    manifest_fingerprint,
                    batches_per_epoch: batches,
                    samples_per_epoch: samples,
                    task_batches,
                    passes: if passes > 1 { passes } else { 0 },
                };
                self.commit(&mut state, &record, 0)?;
                if let Some(importance) = importance {
                    state.attach_importance(job_id, importance)?;
                }
                tracing::info!(job_id, name = %req.job_name, %fingerprint, batches, samples, "job created");
                (self.barrier(), job_id)
            }
        };
        self.durable(seq).await?;
        let (info, seq) = {
            let state = self.inner.state.lock();
            (state.job(job_id)?.info(), self.barrier())
        };
        self.durable(seq).await?;
        Ok(info)
    }
}

#[tonic::async_trait]
impl Dispatcher for DispatcherService {
    async fn register_worker(
        &self,
        request: Request<RegisterWorkerRequest>,
    ) -> Result<Response<RegisterWorkerReply>, Status> {
        let req = request.into_inner();
        let r = (|| {
            valid_name("addr", &req.addr)?;
            for (what, addr) in [("data_addr", &req.data_addr), ("local_data_addr", &req.local_data_addr)] {
                if !addr.is_empty() {
                    valid_name(what, addr)?;
                }
            }
            let id = self.inner.state.lock().register_worker(&req, Instant::now());
            self.inner.changed.notify_waiters();
            tracing::info!(worker_id = id, addr = %req.addr, "worker registered");
            Ok(RegisterWorkerReply { worker_id: id })
        })();
        self.counted(r)
    }

    async fn worker_heartbeat(
        &self,
        request: Request<WorkerHeartbeatRequest>,
    ) -> Result<Response<WorkerHeartbeatReply>, Status> {
        let r = request.into_inner();
        let (known, drained, draining) = {
            let mut state = self.inner.state.lock();
            state.worker_cache(r.worker_id, r.cache_hits, r.cache_lookups);
            state.worker_caches(r.worker_id, r.caches);
            state.worker_busy(r.worker_id, r.busy_s, r.jobs);
            if r.drain {
                state.drain_worker_id(r.worker_id);
            }
            let known = state.worker_heartbeat(r.worker_id, r.tasks_running, r.batches_produced, Instant::now());
            (known, state.is_drained(r.worker_id), state.workers.get(&r.worker_id).is_some_and(|w| w.draining))
        };
        if drained {
            tracing::info!(worker_id = r.worker_id, "worker drained: it holds no task; telling it to exit");
        }
        // A worker back from suspicion can take tasks again.
        self.inner.changed.notify_waiters();
        self.counted(Ok(WorkerHeartbeatReply { known, drained, draining }))
    }

    async fn create_job(&self, request: Request<CreateJobRequest>) -> Result<Response<JobInfo>, Status> {
        let r = self.create_job_inner(request.into_inner()).await;
        self.counted(r)
    }

    async fn get_job(&self, request: Request<GetJobRequest>) -> Result<Response<JobDefinition>, Status> {
        let id = request.into_inner().job_id;
        let r = async {
            let (def, seq) = {
                let state = self.inner.state.lock();
                let def = state.job(id).map(|j| JobDefinition {
                    job_id: id,
                    spec_json: j.spec_json.clone(),
                    manifest_fingerprint: j.manifest_fingerprint.clone(),
                    passes: j.passes,
                    fingerprint: j.fingerprint.clone(),
                })?;
                (def, self.barrier())
            };
            self.durable(seq).await?;
            Ok(def)
        }
        .await;
        self.counted(r)
    }

    async fn get_task(&self, request: Request<GetTaskRequest>) -> Result<Response<GetTaskReply>, Status> {
        let t0 = Instant::now();
        let req = request.into_inner();
        let r = async {
            valid_name("client_id", &req.client_id)?;
            check_client(&req.client_id, &req.client_secret)?;
            if let Some(r) = &req.streamed {
                self.inner.state.lock().streamed(req.job_id, &req.client_id, r);
            }
            // Long poll: rather than answer WAIT at once (and have clients poll), hold the
            // request until something changes (an ack, a failure, a worker) or LONG_POLL.
            let deadline = tokio::time::Instant::now() + LONG_POLL;
            let (reply, seq) = loop {
                let changed = self.inner.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                let decided = {
                    let mut state = self.inner.state.lock();
                    self.draw_current(&mut state, req.job_id, req.epoch)?;
                    let (reply, record, worker) = state.get_task(
                        req.job_id,
                        &req.client_id,
                        req.epoch,
                        req.request_id,
                        req.lookahead,
                        Instant::now(),
                    )?;
                    if let Some(r) = record {
                        self.commit(&mut state, &r, worker)?;
                    }
                    (reply, self.barrier())
                };
                if decided.0.status() != get_task_reply::Status::Wait || tokio::time::Instant::now() >= deadline {
                    break decided;
                }
                let _ = tokio::time::timeout_at(deadline, changed).await;
            };
            self.durable(seq).await?;
            if reply.status() == get_task_reply::Status::Task {
                self.inner.counters.assigned.fetch_add(1, Ordering::Relaxed);
            }
            Ok(reply)
        }
        .await;
        if r.as_ref().is_ok_and(|reply| reply.status() != get_task_reply::Status::Wait) {
            self.inner.counters.get_task.observe(t0.elapsed());
        }
        self.counted(r)
    }

    async fn ack_task(&self, request: Request<AckTaskRequest>) -> Result<Response<Empty>, Status> {
        let req = request.into_inner();
        let r = async {
            check_client(&req.client_id, &req.client_secret)?;
            let (acked, seq) = {
                let mut state = self.inner.state.lock();
                let acked = match state.ack_task(
                    req.job_id,
                    &req.client_id,
                    req.epoch,
                    req.task_index,
                    req.generation,
                    req.lease,
                )? {
                    Some(record) => {
                        let batches = state
                            .job(req.job_id)
                            .ok()
                            .and_then(|j| j.current.tasks.get(req.task_index as usize))
                            .map(|t| t.end - t.start)
                            .unwrap_or(0);
                        self.inner.counters.batches_acked.fetch_add(batches, Ordering::Relaxed);
                        self.commit(&mut state, &record, 0)?;
                        true
                    }
                    None => false,
                };
                (acked, self.barrier())
            };
            self.durable(seq).await?;
            if acked {
                self.inner.counters.acked.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Empty {})
        }
        .await;
        self.counted(r)
    }

    async fn fail_task(&self, request: Request<FailTaskRequest>) -> Result<Response<Empty>, Status> {
        let req = request.into_inner();
        let r = async {
            check_client(&req.client_id, &req.client_secret)?;
            let seq = {
                let mut state = self.inner.state.lock();
                if let Some(record) = state.fail_task(&req)? {
                    self.commit(&mut state, &record, 0)?;
                }
                self.barrier()
            };
            self.durable(seq).await?;
            self.inner.counters.failed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                job_id = req.job_id,
                task = req.task_index,
                received = req.received,
                worker_id = req.worker_id,
                "task failed on its worker; the rest is queued again"
            );
            Ok(Empty {})
        }
        .await;
        self.counted(r)
    }

    async fn client_heartbeat(&self, request: Request<ClientHeartbeatRequest>) -> Result<Response<Empty>, Status> {
        let req = request.into_inner();
        let r = (|| {
            valid_name("client_id", &req.client_id)?;
            check_client(&req.client_id, &req.client_secret)?;
            let report = ClientReport {
                job_id: req.job_id,
                batches: req.batches,
                stall_s: req.stall_s,
                elapsed_s: req.elapsed_s,
                accelerator_busy: req.accelerator_busy.filter(|b| b.is_finite()).map(|b| b.clamp(0.0, 1.0)),
                accelerator_reported: req.accelerator_reported,
            };
            self.inner.state.lock().client_heartbeat(req.job_id, &req.client_id, report, Instant::now())?;
            Ok(Empty {})
        })();
        self.counted(r)
    }

    async fn reset_job(&self, request: Request<ResetJobRequest>) -> Result<Response<JobInfo>, Status> {
        let req = request.into_inner();
        let r = async {
            let (info, seq) = {
                let mut state = self.inner.state.lock();
                let job = state.job(req.job_id)?;
                if let Some(b) = req.delivered.iter().find(|&&b| b >= job.batches_per_epoch) {
                    return Err(ServiceError::InvalidArgument(format!(
                        "delivered batch {b} is past the epoch's {} batches",
                        job.batches_per_epoch
                    )));
                }
                if !req.client_id.is_empty() {
                    valid_name("client_id", &req.client_id)?;
                    check_client(&req.client_id, &req.client_secret)?;
                    state.stop_stream(&req.client_id, req.first_request);
                }
                if req.release_client.is_empty() {
                    let record = Record::Epoch { job_id: req.job_id, epoch: req.epoch, skip: req.delivered.clone() };
                    self.commit(&mut state, &record, 0)?;
                } else {
                    valid_name("release_client", &req.release_client)?;
                    check_client(&req.release_client, &req.client_secret)?;
                    let records = state.release_client(req.job_id, req.epoch, &req.release_client, &req.delivered)?;
                    for record in &records {
                        self.commit(&mut state, record, 0)?;
                    }
                    tracing::info!(job_id = req.job_id, client = %req.release_client, tasks = records.len(), "a client restarting its epoch handed its tasks back");
                }
                (state.job(req.job_id)?.info(), self.barrier())
            };
            self.durable(seq).await?;
            Ok(info)
        }
        .await;
        self.counted(r)
    }

    async fn report(&self, request: Request<ReportRequest>) -> Result<Response<ReportReply>, Status> {
        let req = request.into_inner();
        let r = async {
            valid_name("client_id", &req.client_id)?;
            check_client(&req.client_id, &req.client_secret)?;
            let kind = ReportKind::try_from(req.kind)
                .map_err(|_| ServiceError::InvalidArgument(format!("report kind {} is not known", req.kind)))?;
            let (reply, seq) = {
                let mut state = self.inner.state.lock();
                let (record, reply) = state.report(req.job_id, req.epoch, &req.keys, &req.values, kind)?;
                if let Some(record) = record {
                    self.commit(&mut state, &record, 0)?;
                }
                (reply, self.barrier())
            };
            if reply.invalid + reply.unknown + reply.clamped > 0 {
                tracing::warn!(job_id = req.job_id, client = %req.client_id, invalid = reply.invalid, unknown = reply.unknown, clamped = reply.clamped, "importance report: values ignored or clamped");
            }
            self.inner.counters.reports_ignored.fetch_add(reply.invalid + reply.unknown, Ordering::Relaxed);
            self.inner.counters.reported.fetch_add(reply.accepted, Ordering::Relaxed);
            self.durable(seq).await?;
            Ok(reply)
        }
        .await;
        self.counted(r)
    }

    async fn get_cache_stats(&self, request: Request<GetJobRequest>) -> Result<Response<JobCacheStats>, Status> {
        let id = request.into_inner().job_id;
        let r = self
            .inner
            .state
            .lock()
            .job_cache(id)
            .ok_or_else(|| ServiceError::NotFound { what: "job", id: id.to_string() });
        self.counted(r)
    }

    async fn get_draw(&self, request: Request<GetDrawRequest>) -> Result<Response<EpochDrawReply>, Status> {
        let req = request.into_inner();
        let r = async {
            let (draw, seq) = {
                let mut state = self.inner.state.lock();
                let draw = match state.draw(req.job_id, req.epoch, Instant::now())? {
                    Ok(d) => d,
                    Err(record) => {
                        self.commit(&mut state, &record, 0)?;
                        state
                            .draw(req.job_id, req.epoch, Instant::now())?
                            .map_err(|_| ServiceError::DrawLost { job_id: req.job_id, epoch: req.epoch })?
                    }
                };
                (draw, self.barrier())
            };
            // A draw is answered only once its record (and the reports before it) is on
            // disk: a restarted dispatcher draws the same.
            self.durable(seq).await?;
            // Entries `first..first + DRAW_CHUNK` of each list, cut at its own length.
            let first = usize::try_from(req.first).unwrap_or(usize::MAX);
            fn chunk<T: Clone>(v: &[T], first: usize) -> Vec<T> {
                v.get(first.min(v.len())..first.saturating_add(DRAW_CHUNK).min(v.len())).unwrap_or_default().to_vec()
            }
            let priorities: Vec<f32> = draw.priorities.iter().flatten().map(|&p| p as f32).collect();
            Ok(EpochDrawReply {
                epoch: req.epoch,
                total: draw.draw.order.len() as u64,
                hot_total: draw.hot.len() as u64,
                order: chunk(&draw.draw.order, first),
                weights: chunk(draw.draw.weights.as_deref().unwrap_or_default(), first),
                hot: chunk(&draw.hot, first),
                members: draw.members.iter().map(|m| m.addr.clone()).collect(),
                owners: chunk(&draw.owners, first),
                priorities: chunk(&priorities, first),
            })
        }
        .await;
        self.counted(r)
    }

    async fn get_scale(&self, _request: Request<GetScaleRequest>) -> Result<Response<ScaleReply>, Status> {
        // The target told is on disk: a restarted dispatcher tells the same.
        let reply = self.scale_reply();
        let r = self.durable(self.barrier()).await.map(|()| reply);
        self.counted(r)
    }

    async fn set_scale(&self, request: Request<SetScaleRequest>) -> Result<Response<ScaleReply>, Status> {
        let operator = require_operator(&request, "SetScale");
        let workers = usize::try_from(request.into_inner().workers).unwrap_or(usize::MAX);
        let r = async {
            operator?;
            let seq = {
                let a = self.inner.autoscale.as_ref().ok_or(ServiceError::from(AutoscaleOff { what: "SetScale" }))?;
                self.inner.journal.ready()?;
                let mut a = a.lock();
                if let Some(d) = a.set_target(workers, Instant::now()) {
                    self.inner.journal.append(&Record::Scale { workers: d.to as u64 })?;
                }
                self.barrier()
            };
            self.durable(seq).await?;
            Ok(self.scale_reply())
        }
        .await;
        self.counted(r)
    }

    async fn drain_worker(&self, request: Request<DrainWorkerRequest>) -> Result<Response<DrainWorkerReply>, Status> {
        let operator = require_operator(&request, "DrainWorker");
        let name = request.into_inner().name;
        let r = operator.and_then(|()| valid_name("name", &name)).map(|()| {
            let drained = self.inner.state.lock().drain_worker(&name);
            // Long-polling GetTask calls pick among the others now.
            self.inner.changed.notify_waiters();
            DrainWorkerReply { known: drained.is_some(), idle: drained.unwrap_or(false) }
        });
        self.counted(r)
    }
}

impl DispatcherService {
    fn scale_reply(&self) -> ScaleReply {
        match &self.inner.autoscale {
            None => ScaleReply::default(),
            Some(a) => {
                let a = a.lock();
                let c = a.config();
                ScaleReply {
                    enabled: true,
                    target: a.target() as u64,
                    policy: c.policy.name().to_string(),
                    min_workers: c.min_units as u64,
                    max_workers: c.max_units as u64,
                }
            }
        }
    }

    /// Closes the autoscaler's window (called every window by [`run_dispatcher`]).
    fn autoscale_tick(&self) {
        if let Some(a) = &self.inner.autoscale {
            let state = self.inner.state.lock();
            // No decision while the journal cannot write it (see `journal`).
            if self.inner.journal.ready().is_err() {
                return;
            }
            let mut a = a.lock();
            let Some(d) = a.tick(&state, Instant::now()) else { return };
            // Journaled under the autoscaler's lock, so the last record is the last target.
            // A journal that stopped stops the dispatcher (see `journal`), so this only logs.
            if let Err(e) = self.inner.journal.append(&Record::Scale { workers: d.to as u64 }) {
                tracing::error!(error = %e, "autoscale: the target is not journaled");
            }
        }
    }

    /// `/api/autoscale`: the policy, the target and the latest decisions with their
    /// inputs; `None` without `--autoscale`.
    pub fn autoscale_json(&self) -> Option<String> {
        let stats = self.inner.autoscale.as_ref()?.lock().stats();
        // Numbers and strings only: serializing cannot fail.
        Some(serde_json::to_string(&stats).unwrap_or_default())
    }

    /// Draws an importance-sampled job's current epoch, if `epoch` is it and it is not
    /// drawn yet: its tasks are then assigned knowing where their samples are cached.
    fn draw_current(&self, state: &mut State, job_id: u64, epoch: u64) -> Result<(), ServiceError> {
        let job = state.job(job_id)?;
        let now = Instant::now();
        // With no worker yet (e.g. a restarted dispatcher they have not found again) the
        // placement would be empty: the draw waits for one (the task would too).
        if job.importance.is_none()
            || epoch != job.current.epoch
            || job.current.is_done()
            || state.live_workers(now) == 0
        {
            return Ok(());
        }
        if let Ok(Err(record)) = state.draw(job_id, epoch, now) {
            self.commit(state, &record, 0)?;
        }
        Ok(())
    }
}

/// Runs a dispatcher until `shutdown` resolves. `on_listening` gets the bound gRPC address.
pub async fn run_dispatcher(
    config: DispatcherConfig,
    shutdown: impl Future<Output = ()> + Send,
    on_listening: impl FnOnce(std::net::SocketAddr),
) -> Result<(), ServiceError> {
    let service = DispatcherService::new(&config)?;
    let journal = service.inner.journal.clone();
    if let Some(addr) = &config.metrics_listen {
        let bound = http::serve(&service, addr).await?;
        tracing::info!(%bound, "dispatcher metrics at /metrics, dashboard at /");
    }
    let ticker = service.inner.autoscale.as_ref().map(|a| {
        let every = Duration::from_millis(a.lock().window_ms().max(1));
        let service = service.clone();
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(every);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                service.autoscale_tick();
            }
        })
    });
    let tls = config.tls.as_ref().map(crate::tls::ServerTls::load).transpose()?;
    let listen_err = |e: String| ServiceError::Listen { addr: config.listen.clone(), message: e };
    let listener = tokio::net::TcpListener::bind(&config.listen).await.map_err(|e| listen_err(e.to_string()))?;
    let local = listener.local_addr().map_err(|e| listen_err(e.to_string()))?;
    let incoming = TcpIncoming::from_listener(listener, true, Some(Duration::from_secs(30)))
        .map_err(|e| listen_err(e.to_string()))?;
    tracing::info!(addr = %local, roots = ?service.inner.roots.roots(), "dispatcher listening");
    on_listening(local);
    let server = DispatcherServer::new(service)
        .max_decoding_message_size(MAX_CONTROL_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_CONTROL_MESSAGE_BYTES);
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls.grpc).map_err(|e| ServiceError::Tls(e.to_string()))?;
    }
    // A journal that stopped (a torn write it could not cut back) stops the dispatcher:
    // what it holds in memory is then ahead of what a restart replays, and no reply may
    // claim otherwise. A write that merely fails is written again (see `journal`).
    let stop = {
        let journal = journal.clone();
        async move {
            tokio::select! {
                () = shutdown => {}
                why = journal.failed() => tracing::error!(error = %why, "the journal failed; the dispatcher stops"),
            }
        }
    };
    let served = builder
        .add_service(InterceptedService::new(
            server,
            TokenCheck::new(config.token.as_deref()).with_operator(config.operator_token.as_deref()),
        ))
        .serve_with_incoming_shutdown(incoming, stop)
        .await
        .map_err(|source| ServiceError::Serve { what: "dispatcher", source });
    if let Some(t) = ticker {
        t.abort();
    }
    // Whatever was queued (a compaction included) is done before the dispatcher returns.
    journal.settle().await;
    served?;
    match (journal.failure(), &config.journal) {
        (Some(message), Some(path)) => Err(ServiceError::Journal { path: path.clone(), message }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    use crate::dispatcher::journal::COMPACT_MIN_BYTES;

    /// Runs epochs of a job on a dispatcher with a journal, one client, by its RPCs.
    async fn run_epochs(service: &DispatcherService, job_id: u64, epochs: std::ops::Range<u64>) {
        let worker = RegisterWorkerRequest { addr: "127.0.0.1:1".into(), ..Default::default() };
        let worker_id = service.register_worker(Request::new(worker)).await.unwrap().into_inner().worker_id;
        let mut request_id = epochs.start * 1000;
        for epoch in epochs {
            let beat = WorkerHeartbeatRequest { worker_id, ..Default::default() };
            service.worker_heartbeat(Request::new(beat)).await.unwrap();
            loop {
                request_id += 1;
                let get = GetTaskRequest { job_id, client_id: "c".into(), epoch, request_id, ..Default::default() };
                let reply = service.get_task(Request::new(get)).await.unwrap().into_inner();
                match reply.status() {
                    get_task_reply::Status::Task => {
                        let t = reply.task.unwrap();
                        let ack = AckTaskRequest {
                            job_id,
                            client_id: "c".into(),
                            epoch: t.epoch,
                            task_index: t.task_index,
                            generation: t.generation,
                            lease: t.lease,
                            ..Default::default()
                        };
                        service.ack_task(Request::new(ack)).await.unwrap();
                    }
                    get_task_reply::Status::EpochDone => break,
                    get_task_reply::Status::Wait => panic!("epoch {epoch}: told to wait with one client"),
                }
            }
        }
    }

    /// A dispatcher on a free port serving `root`, journaling to `journal`, with nothing else.
    fn test_config(root: &std::path::Path, journal: Option<std::path::PathBuf>) -> DispatcherConfig {
        DispatcherConfig {
            listen: "127.0.0.1:0".into(),
            journal,
            allow_roots: vec![root.to_path_buf()],
            token: None,
            operator_token: None,
            metrics_listen: None,
            tls: None,
            autoscale: None,
            cache_aware: false,
            allow_python_modules: Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_long_run_keeps_its_journal_bounded_and_a_restart_resumes_it() {
        // In memory where there is a tmpfs: 2,400 fsyncs take seconds on a disk.
        let shm = std::path::Path::new("/dev/shm");
        let dir = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.unwrap();
        let root = dir.path().join("data");
        let options = sluice_synth::DatasetOptions { images: 48, classes: 2, ..Default::default() };
        sluice_synth::write_dataset(&root, &options, &|_| {}).unwrap();
        let journal = dir.path().join("journal.jsonl");
        let config = test_config(&root, Some(journal.clone()));
        let mut spec = PipelineSpec::train_default(sluice_core::SourceSpec::ImageFolder { root }, 16, 4);
        spec.shuffle = sluice_core::ShuffleSpec::None;
        let create = CreateJobRequest {
            job_name: "long".into(),
            spec_json: serde_json::to_string(&spec).unwrap(),
            task_batches: 1,
            parallel_epochs: 0,
        };
        let service = DispatcherService::new(&config).unwrap();
        let job_id = service.create_job(Request::new(create)).await.unwrap().into_inner().job_id;
        // 12 tasks an epoch, each an `Assign` and an `Ack`: ~170 KiB of journal in 100
        // epochs without compaction.
        run_epochs(&service, job_id, 0..100).await;
        service.inner.journal.settle().await;
        let len = std::fs::metadata(&journal).unwrap().len();
        assert!(len < COMPACT_MIN_BYTES + 4096, "the journal of 100 epochs holds {len} bytes");
        // A restart (its writer done, as when the process exits) resumes the job where it
        // stood, and goes on.
        drop(service);
        let service = DispatcherService::new(&config).unwrap();
        let info = service.inner.state.lock().job(job_id).unwrap().info();
        assert_eq!(info.epoch, 100, "{info:?}");
        run_epochs(&service, job_id, 100..102).await;
    }

    #[tokio::test]
    async fn a_draw_larger_than_one_message_comes_in_chunks_that_add_up_to_it() {
        // Before, a job this large was refused when created: "importance sampling through
        // the service draws each epoch into one control message, which fits 229376 samples".
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("data");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("tiny.jpg"), sluice_synth::noise_jpeg(0, 16).unwrap()).unwrap();
        let n = DRAW_CHUNK + 1000;
        std::fs::write(root.join("list.txt"), "tiny.jpg 0\n".repeat(n)).unwrap();
        let config = test_config(&root, None);
        let source = sluice_core::SourceSpec::FileList { path: root.join("list.txt"), root: None };
        let mut spec = PipelineSpec::train_default(source, 16, 1024);
        spec.sampling = sluice_core::SamplingSpec::Importance {
            floor: 0.1,
            coverage_epochs: 4,
            miss_discount: 1.0,
            max_draws: 4.0,
        };
        let create = CreateJobRequest {
            job_name: "big".into(),
            spec_json: serde_json::to_string(&spec).unwrap(),
            task_batches: 16,
            parallel_epochs: 0,
        };
        let service = DispatcherService::new(&config).unwrap();
        let job_id = service.create_job(Request::new(create)).await.unwrap().into_inner().job_id;
        run_epochs(&service, job_id, 0..1).await;
        let keys: Vec<u64> = (0..n as u64).collect();
        let losses: Vec<f64> = keys.iter().map(|&k| if k % 100 == 0 { 10.0 } else { 0.1 }).collect();
        let report =
            ReportRequest { job_id, client_id: "c".into(), epoch: 0, keys, values: losses, ..Default::default() };
        service.report(Request::new(report)).await.unwrap();
        let get = |first: usize| Request::new(GetDrawRequest { job_id, epoch: 1, first: first as u64 });
        let a = service.get_draw(get(0)).await.unwrap().into_inner();
        let b = service.get_draw(get(DRAW_CHUNK)).await.unwrap().into_inner();
        assert_eq!((a.total, a.order.len(), a.weights.len()), (n as u64, DRAW_CHUNK, DRAW_CHUNK));
        assert_eq!((b.total, b.order.len(), b.weights.len()), (n as u64, 1000, 1000));
        assert!(a.encoded_len() <= MAX_CONTROL_MESSAGE_BYTES, "{} bytes", a.encoded_len());
        // Every chunk comes from the one draw of the epoch: asked again, the same.
        assert_eq!(service.get_draw(get(0)).await.unwrap().into_inner(), a);
        let order = [a.order, b.order].concat();
        assert!(order.iter().all(|&p| (p as usize) < n));
        let hard = order.iter().filter(|&&p| p % 100 == 0).count();
        assert!(hard > 2 * n / 100, "the reported samples are drawn more: {hard} of {n}");
        let past = service.get_draw(get(n)).await.unwrap().into_inner();
        assert!(past.order.is_empty() && past.weights.is_empty() && past.total == n as u64);
    }

    #[test]
    fn the_largest_draw_chunk_fits_one_control_message() {
        // Every field at its widest: the largest position everywhere, every sample hot, 1,024
        // workers with 256-character addresses, the last of them owning every sample.
        let n = DRAW_CHUNK;
        let last = u32::MAX;
        let reply = EpochDrawReply {
            epoch: u64::MAX,
            total: u64::MAX,
            hot_total: u64::MAX,
            order: vec![last; n],
            weights: vec![1.5; n],
            hot: vec![last; n],
            members: vec!["w".repeat(256); 1024],
            owners: vec![1023; n],
            priorities: vec![0.5; n],
        };
        let len = reply.encoded_len();
        assert!(len <= MAX_CONTROL_MESSAGE_BYTES, "{len} bytes for {n} samples");
        assert!(len > MAX_CONTROL_MESSAGE_BYTES * 3 / 4, "{len} bytes: the bound wastes a quarter of the message");
    }

    #[test]
    fn a_job_spec_with_a_disk_cache_tier_is_refused() {
        // A client would otherwise make every worker write files in a folder it names.
        let mut spec =
            PipelineSpec::train_default(sluice_core::SourceSpec::ImageFolder { root: "/data".into() }, 32, 4);
        spec.cache = Some(sluice_core::CacheSpec {
            budget: sluice_core::ByteBudget::Bytes(1 << 20),
            level: sluice_core::CacheLevel::Raw,
            resize: None,
            policy: sluice_core::CachePolicyKind::Lru,
            disk: Some(sluice_core::DiskCacheSpec {
                dir: "/etc/anywhere".into(),
                budget: sluice_core::ByteBudget::Bytes(1 << 30),
                policy: sluice_core::DiskPolicyKind::Belady,
            }),
            share: false,
        });
        let err = refuse_learner_only(&spec).unwrap_err().to_string();
        assert!(err.contains("cache.disk"), "{err}");
        spec.cache.as_mut().unwrap().disk = None;
        assert!(refuse_learner_only(&spec).is_ok());
    }

    #[test]
    fn masks_are_served_whatever_their_size_and_fields_are_held_to_the_header() {
        let sidecar = |masks| sluice_core::SourceSpec::Sidecar { root: "/data".into(), masks };
        // 320 masks of 224x224 (15.3 MiB) are over the header's room: they travel after
        // the pixels, so nothing refuses them.
        let spec = PipelineSpec::train_default(sidecar(true), 224, 320);
        assert!(refuse_learner_only(&spec).is_ok() && refuse_oversized_fields(&spec).is_ok());
    }
}
