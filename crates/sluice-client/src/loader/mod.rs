//! [`RemoteLoader`]: a loader whose batches come from the service. Same shape as the local
//! [`sluice_pipeline::Loader`]: `iter()` yields the epoch's batches, `state()`/`load_state()`
//! checkpoint and resume exactly.
//!
//! Exactly once: the client acknowledges a task only after the trainer has taken every
//! batch of it; when a worker dies mid-task the client reports how many batches it got, and
//! the dispatcher queues only the rest. Batches are also deduplicated by index, so a batch
//! can never reach the trainer twice in an epoch.

mod clock;
mod conn;
mod fetch;
mod options;
mod trace;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sluice_autoscale::AcceleratorBusy;
use sluice_core::{Batch, PipelineSpec};
use sluice_pipeline::{PipelineError, SkippedSample, TraceError};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};

use crate::error::{AutoscaleOff, ClientError, ReportLengths};
use crate::proto::*;
use crate::runtime::{runtime, Threads};
use conn::{heartbeat, retry, with_retry, Conn};
use fetch::{drive, Flow, Item, TaskKey};
pub use options::{DataPlane, RemoteOptions};
pub use trace::{ClockOffset, RemoteTrace, WorkerBuild};

/// Where a remote loader stands: the job, its epoch and the batches of that epoch already
/// handed to the trainer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteState {
    pub job_name: String,
    pub fingerprint: String,
    pub epoch: u64,
    pub delivered: Vec<u64>,
}

pub struct RemoteLoader {
    rt: Runtime,
    conn: Arc<Conn>,
    job: JobInfo,
    epoch: u64,
    tasks_in_flight: usize,
    delivered: HashSet<u64>,
    /// Assignments with batches delivered, not yet acknowledged: (end, batches taken).
    open: HashMap<TaskKey, (u64, u64)>,
    /// Samples the workers skipped (`on_error = "skip"`), in the order their batches came.
    skipped: Vec<SkippedSample>,
    duplicates: u64,
    shared_memory_batches: u64,
    /// An iterator was dropped mid-epoch: the next one restarts the epoch from `state()`.
    abandoned: bool,
    /// Importance sampling: a task is acked only when the trainer comes back for the next
    /// batch (having reported the last one), so an epoch ends, and the next is drawn, only
    /// once every report of it is in. These wait for that call.
    deferred_acks: Option<Vec<TaskKey>>,
    current: Option<EpochStream>,
    /// Recording a trace ([`RemoteLoader::start_trace`]).
    trace: Option<trace::Recording>,
    /// When the last batch went to the trainer: its step starts there.
    handed_at: Option<Instant>,
}

/// The stream of batches, from the epoch it was started at on.
struct EpochStream {
    rx: mpsc::Receiver<Item>,
    driver: tokio::task::JoinHandle<()>,
    /// Dropped to stop the driver (see [`RemoteLoader::stop_stream`]).
    stop: oneshot::Sender<()>,
    flow: Arc<Flow>,
    /// An error ended the stream; the epoch is not over.
    failed: bool,
}

impl RemoteState {
    /// Whether this state can restart `job`: taken for its pipeline, naming only batches
    /// of its epoch, each once. What [`RemoteLoader::load_state`] checks before asking the
    /// dispatcher.
    pub fn check(&self, job: &JobInfo) -> Result<(), ClientError> {
        if self.fingerprint != job.fingerprint {
            return Err(ClientError::InvalidArgument(format!(
                "checkpoint is for pipeline {}, this job is {}",
                self.fingerprint, job.fingerprint
            )));
        }
        let mut seen = HashSet::with_capacity(self.delivered.len().min(job.batches_per_epoch as usize));
        for &b in &self.delivered {
            if b >= job.batches_per_epoch {
                return Err(ClientError::InvalidArgument(format!(
                    "checkpoint lists batch {b} as delivered, past the epoch's {} batches",
                    job.batches_per_epoch
                )));
            }
            if !seen.insert(b) {
                return Err(ClientError::InvalidArgument(format!("checkpoint lists batch {b} as delivered twice")));
            }
        }
        Ok(())
    }
}

/// Asks the dispatcher for a job's cache stats without borrowing its [`RemoteLoader`]
/// (from [`RemoteLoader::cache_stats_probe`]): what a monitoring thread uses while the
/// trainer's thread waits in [`RemoteLoader::next_batch`].
#[derive(Clone)]
pub struct CacheStatsProbe {
    rt: tokio::runtime::Handle,
    conn: Arc<Conn>,
}

impl CacheStatsProbe {
    /// As [`RemoteLoader::report_accelerator_busy`], from any thread.
    pub fn report_accelerator_busy(&self, fraction: f64) {
        self.conn.report_accelerator_busy(fraction);
    }

    /// As [`RemoteLoader::accelerator_busy`], from any thread.
    pub fn accelerator_busy(&self) -> Option<AcceleratorBusy> {
        self.conn.accelerator_busy()
    }

    /// As [`RemoteLoader::cache_stats`].
    pub fn cache_stats(&self) -> Result<JobCacheStats, ClientError> {
        let req = GetJobRequest { job_id: self.conn.job_id };
        let give_up = Some(Duration::from_secs(1));
        self.rt.block_on(retry(
            &self.conn,
            "GetCacheStats",
            give_up,
            |mut d| async move { d.get_cache_stats(req).await },
        ))
    }
}

impl RemoteLoader {
    /// Submits `spec` as job `options.job_name` (or joins it, if it exists with the same
    /// fingerprint) and starts heartbeating.
    pub fn connect(spec: &PipelineSpec, options: RemoteOptions) -> Result<Self, ClientError> {
        spec.validate()?;
        let spec_json = serde_json::to_string(spec).map_err(ClientError::SpecJson)?;
        let rt = runtime("remote", Threads::Workers(2))?;
        let mut conn = Conn::new(&options, &rt)?;
        if options.autoscale {
            let scale = rt.block_on(with_retry(&conn, "GetScale", |mut d| async move {
                d.get_scale(crate::proto::GetScaleRequest {}).await
            }))?;
            if !scale.enabled {
                return Err(AutoscaleOff { what: "RemoteLoader option `autoscale`" }.into());
            }
            tracing::info!(policy = %scale.policy, workers = scale.target, "the service autoscales its workers");
        }
        let req = CreateJobRequest {
            job_name: options.job_name.clone(),
            spec_json,
            task_batches: options.task_batches,
            parallel_epochs: options.parallel_epochs,
        };
        let job = rt.block_on(with_retry(&conn, "CreateJob", |mut d| {
            let req = req.clone();
            async move { d.create_job(req).await }
        }))?;
        conn.job_id = job.job_id;
        conn.fingerprint = job.fingerprint.clone();
        conn.masks = spec.source.has_masks();
        let conn = Arc::new(conn);
        rt.spawn(heartbeat(conn.clone()));
        tracing::info!(job_id = job.job_id, name = %job.job_name, epoch = job.epoch, "joined job");
        Ok(Self {
            rt,
            conn,
            epoch: job.epoch,
            job,
            tasks_in_flight: options.tasks_in_flight.max(1),
            delivered: HashSet::new(),
            open: HashMap::new(),
            skipped: Vec::new(),
            duplicates: 0,
            shared_memory_batches: 0,
            abandoned: false,
            deferred_acks: (spec.sampling != sluice_core::SamplingSpec::Uniform).then(Vec::new),
            current: None,
            trace: None,
            handed_at: None,
        })
    }

    pub fn job(&self) -> &JobInfo {
        &self.job
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn batches_per_epoch(&self) -> u64 {
        self.job.batches_per_epoch
    }

    /// Batches handed to the trainer that came through shared memory from workers on this
    /// machine (the rest came over the network).
    pub fn shared_memory_batches(&self) -> u64 {
        self.shared_memory_batches
    }

    /// Samples the workers left out under `on_error = "skip"`, each with its key, path and
    /// error, as the local loader's `stats().skipped` lists them: once per epoch a bad
    /// sample is met. A batch whose samples were all skipped is not handed out.
    pub fn skipped(&self) -> &[SkippedSample] {
        &self.skipped
    }

    /// Batches that arrived twice and were dropped (after worker failures).
    pub fn duplicates_dropped(&self) -> u64 {
        self.duplicates
    }

    /// Starts recording a trace: for every batch, how long the trainer waited for it, when
    /// it got it and how long it kept it, and where and when a worker built it (tasks
    /// started from now on bring their batches' times; see [`RemoteTrace`]). Fails if a
    /// trace is already being recorded.
    pub fn start_trace(&mut self) -> Result<(), ClientError> {
        if self.trace.is_some() {
            return Err(PipelineError::from(TraceError::AlreadyTracing).into());
        }
        self.trace = Some(trace::Recording::default());
        self.conn.tracing.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Stops recording and returns the trace, to write with [`RemoteTrace::write`]; `None`
    /// if no trace was being recorded.
    pub fn stop_trace(&mut self) -> Option<RemoteTrace> {
        self.conn.tracing.store(false, Ordering::Relaxed);
        self.trace.take().map(trace::Recording::finish)
    }

    pub fn state(&self) -> RemoteState {
        let mut delivered: Vec<u64> = self.delivered.iter().copied().collect();
        delivered.sort_unstable();
        RemoteState {
            job_name: self.job.job_name.clone(),
            fingerprint: self.job.fingerprint.clone(),
            epoch: self.epoch,
            delivered,
        }
    }

    /// Restarts the job at `state`: its epoch, minus the batches already delivered. Meant for
    /// a job with one client (a shared job restarts for everyone).
    pub fn load_state(&mut self, state: &RemoteState) -> Result<(), ClientError> {
        state.check(&self.job)?;
        // The stream may be past `state` (an epoch ended since) or before it: it goes, with
        // whatever it fetched ahead, and the next iterator starts one at `state`.
        self.stop_stream();
        self.abandoned = false;
        let req = ResetJobRequest {
            job_id: self.job.job_id,
            epoch: state.epoch,
            delivered: state.delivered.clone(),
            release_client: String::new(),
            client_secret: self.conn.client_secret.clone(),
            client_id: self.conn.client_id.clone(),
            first_request: self.conn.next_request.load(Ordering::SeqCst),
        };
        self.job = self.reset(req)?;
        self.epoch = state.epoch;
        self.delivered = state.delivered.iter().copied().collect();
        self.open.clear();
        self.deferred_acks.iter_mut().for_each(Vec::clear);
        Ok(())
    }

    /// The trainer's per-sample values for `keys` (the keys of batches it took this epoch):
    /// losses, or gradient norms, into the job's importance store at the dispatcher, which
    /// every client of the job feeds. They shape the epochs drawn after this report, as
    /// [`sluice_pipeline::Loader::report`] does locally. The reply counts what was taken
    /// and what was ignored (unknown keys; NaN, infinite or negative values) or clamped
    /// (finite values above `sluice_pipeline::importance::MAX_IMPORTANCE`).
    ///
    /// Retried through dispatcher restarts like every call; a retry whose first reply was
    /// lost counts its values twice, which leaves a key's epoch mean as it was when the
    /// key had no other report that epoch.
    pub fn report(&self, keys: &[u64], values: &[f64], kind: ReportKind) -> Result<ReportReply, ClientError> {
        let job_id = self.job.job_id;
        if keys.len() != values.len() {
            return Err(ReportLengths { job_id, keys: keys.len(), values: values.len() }.into());
        }
        let req = ReportRequest {
            job_id,
            client_id: self.conn.client_id.clone(),
            epoch: self.epoch,
            keys: keys.to_vec(),
            values: values.to_vec(),
            kind: kind.into(),
            client_secret: self.conn.client_secret.clone(),
        };
        self.rt.block_on(with_retry(&self.conn, "Report", |mut d| {
            let req = req.clone();
            async move { d.report(req).await }
        }))
    }

    /// The job's cache on every worker, as their last heartbeats told the dispatcher:
    /// hits, misses and hit rate (named as the local loader's `CacheStats`), the entries
    /// held, the hot set's size and how much of it is held. Retried for a second at most:
    /// the numbers are informational, and `stats()` must not hang on a dispatcher that is
    /// gone.
    pub fn cache_stats(&self) -> Result<JobCacheStats, ClientError> {
        self.cache_stats_probe().cache_stats()
    }

    /// The trainer's own reading of its accelerator's busy fraction (0..=1, e.g.
    /// `torch.cuda.utilization() / 100`): sent to the dispatcher with each heartbeat in
    /// place of the step timing this client measures (compute between `next_batch` calls
    /// over compute + wait), while fresh (10 s). The dispatcher shows it per client
    /// (`sluice_client_accelerator_busy`) and its autoscaler's policy reads it. NaN is
    /// ignored; other values are clamped to 0..=1.
    pub fn report_accelerator_busy(&self, fraction: f64) {
        self.conn.report_accelerator_busy(fraction);
    }

    /// The trainer's accelerator busy fraction now, as the heartbeats send it; `None`
    /// before its first step.
    pub fn accelerator_busy(&self) -> Option<AcceleratorBusy> {
        self.conn.accelerator_busy()
    }

    /// Asks for [`RemoteLoader::cache_stats`] from another thread, without this loader
    /// (and takes the trainer's accelerator reports there).
    pub fn cache_stats_probe(&self) -> CacheStatsProbe {
        CacheStatsProbe { rt: self.rt.handle().clone(), conn: self.conn.clone() }
    }

    fn reset(&self, req: ResetJobRequest) -> Result<JobInfo, ClientError> {
        self.rt.block_on(with_retry(&self.conn, "ResetJob", |mut d| {
            let req = req.clone();
            async move { d.reset_job(req).await }
        }))
    }

    /// Stops the current stream and waits until none of its fetchers runs: no request of
    /// it is sent after this returns, so a reset's `first_request` (the next request id)
    /// is above every id the stopped stream used.
    fn stop_stream(&mut self) {
        if let Some(EpochStream { rx, driver, stop, .. }) = self.current.take() {
            drop((rx, stop));
            let _ = self.rt.block_on(driver);
        }
    }

    /// After an iterator was dropped mid-epoch: hands this client's tasks back to the
    /// dispatcher, less the batches the trainer already has. Only this client's: in a
    /// shared job the others go on with the epoch (a reset would give them their batches
    /// again).
    fn release(&mut self) -> Result<(), ClientError> {
        let RemoteState { epoch, delivered, .. } = self.state();
        let req = ResetJobRequest {
            job_id: self.job.job_id,
            epoch,
            delivered,
            release_client: self.conn.client_id.clone(),
            client_secret: self.conn.client_secret.clone(),
            client_id: self.conn.client_id.clone(),
            first_request: self.conn.next_request.load(Ordering::SeqCst),
        };
        self.job = self.reset(req)?;
        self.open.clear();
        self.deferred_acks.iter_mut().for_each(Vec::clear);
        Ok(())
    }

    /// The rest of the current epoch's batches, in arrival order. When it ends, the loader
    /// moves to the next epoch.
    pub fn iter(&mut self) -> RemoteEpoch<'_> {
        self.start_epoch();
        RemoteEpoch { loader: self }
    }

    /// Starts streaming the rest of the current epoch; [`RemoteLoader::next_batch`] takes
    /// its batches. (What [`RemoteLoader::iter`] does, for callers that cannot hold a
    /// borrowing iterator, like the Python binding.)
    pub fn start_epoch(&mut self) {
        // The stream that ended the last epoch goes on into this one (its fetchers may
        // already hold tasks of it).
        if let Some(s) = &self.current {
            if !self.abandoned && !s.failed && !s.driver.is_finished() {
                s.flow.reading.send_replace(self.epoch);
                self.abandoned = true;
                return;
            }
        }
        self.stop_stream();
        // An earlier iterator was dropped mid-epoch: its leases and half-read tasks are
        // handed back, without what the trainer already has.
        if self.abandoned {
            if let Err(e) = self.release() {
                tracing::warn!(error = %e, "could not hand back the abandoned epoch's tasks");
            }
        }
        self.abandoned = true;
        let (tx, rx) = mpsc::channel(2 * self.tasks_in_flight);
        let flow = Arc::new(Flow {
            floor: AtomicU64::new(self.epoch),
            reading: watch::Sender::new(self.epoch),
            ahead: Arc::new(Semaphore::new(self.tasks_in_flight - 1)),
        });
        let (stop, stopped) = oneshot::channel();
        let driver = self.rt.spawn(drive(self.conn.clone(), flow.clone(), self.tasks_in_flight, tx, stopped));
        self.current = Some(EpochStream { rx, driver, stop, flow, failed: false });
    }

    /// The next batch of the epoch started by [`RemoteLoader::start_epoch`]; `None` at its
    /// end (the loader then moves to the next epoch). While waiting it asks `interrupted`
    /// every 50 ms and returns [`ClientError::Interrupted`] if it says so; nothing is lost.
    pub fn next_batch(&mut self, interrupted: &mut dyn FnMut() -> bool) -> Option<Result<Batch, ClientError>> {
        for task in self.deferred_acks.as_mut().map(std::mem::take).unwrap_or_default() {
            self.ack(task);
        }
        let asked_ns = self.trace.as_mut().map(trace::Recording::asked);
        let computed = self.handed_at.take().map(|t| t.elapsed());
        let mut waited = Duration::ZERO;
        loop {
            let stream = self.current.as_mut()?;
            if stream.failed {
                return None;
            }
            let t0 = Instant::now();
            // The timer must be made inside the runtime: build it in the async block.
            let item =
                self.rt.block_on(async { tokio::time::timeout(Duration::from_millis(50), stream.rx.recv()).await });
            waited += t0.elapsed();
            self.conn.stall_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            let item = match item {
                Ok(item) => item,
                Err(_) => {
                    if interrupted() {
                        return Some(Err(ClientError::Interrupted));
                    }
                    continue;
                }
            };
            match item {
                None => {
                    stream.failed = true;
                    return Some(Err(ClientError::StreamEnded { epoch: self.epoch }));
                }
                Some(Item::EpochEnd(e)) if e == self.epoch => {
                    self.abandoned = false;
                    self.epoch += 1;
                    self.delivered.clear();
                    self.open.clear();
                    return None;
                }
                // An end reported twice (or of an epoch before a reset): nothing to do.
                Some(Item::EpochEnd(_)) => {}
                Some(Item::Error(e)) => {
                    stream.failed = true;
                    return Some(Err(e));
                }
                Some(Item::Batch { batch, .. }) if batch.epoch != self.epoch => {
                    stream.failed = true;
                    return Some(Err(ClientError::WrongEpoch { got: batch.epoch, reading: self.epoch }));
                }
                Some(Item::Batch { task, end, batch, skipped, local, built }) => {
                    let entry = self.open.entry(task).or_insert((end, 0));
                    entry.1 += 1;
                    if entry.1 == end - task.start {
                        self.open.remove(&task);
                        match &mut self.deferred_acks {
                            Some(deferred) => deferred.push(task),
                            None => self.ack(task),
                        }
                    }
                    if self.delivered.insert(batch.index) {
                        self.skipped.extend(skipped.into_iter().map(|s| SkippedSample {
                            key: s.key,
                            path: s.path,
                            error: s.error,
                        }));
                        if batch.is_empty() {
                            // Every sample of it was skipped: nothing for the trainer.
                            continue;
                        }
                        self.conn.batches.fetch_add(1, Ordering::Relaxed);
                        if local {
                            self.shared_memory_batches += 1;
                        }
                        if let (Some(rec), Some(asked_ns)) = (self.trace.as_mut(), asked_ns) {
                            rec.handed(batch.epoch, batch.index, asked_ns, built);
                        }
                        if let Some(computed) = computed {
                            self.conn.step_done(computed, waited);
                        }
                        self.handed_at = Some(Instant::now());
                        return Some(Ok(batch));
                    }
                    self.duplicates += 1;
                    tracing::warn!(index = batch.index, "dropped a duplicate batch");
                }
            }
        }
    }

    /// Acknowledges a task whose batches the trainer has all taken, in the background,
    /// retried for as long as this client lives: its heartbeats keep the task's lease, so
    /// an ack given up on would hold the epoch open for good.
    fn ack(&self, task: TaskKey) {
        let conn = self.conn.clone();
        let req = AckTaskRequest {
            job_id: self.job.job_id,
            client_id: conn.client_id.clone(),
            epoch: self.epoch,
            task_index: task.task,
            generation: task.generation,
            lease: task.lease,
            client_secret: conn.client_secret.clone(),
        };
        self.rt.spawn(async move {
            let r = retry(&conn, "AckTask", None, |mut d| {
                let req = req.clone();
                async move { d.ack_task(req).await }
            })
            .await;
            if let Err(e) = r {
                tracing::warn!(error = %e, task = task.task, "the dispatcher refused an ack");
            }
        });
    }
}

/// The batches of one epoch from the service.
pub struct RemoteEpoch<'a> {
    loader: &'a mut RemoteLoader,
}

impl Iterator for RemoteEpoch<'_> {
    type Item = Result<Batch, ClientError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.loader.next_batch(&mut || false)
    }
}

impl Drop for RemoteEpoch<'_> {
    fn drop(&mut self) {
        // Stop fetching if the epoch is unfinished (the next `iter` restarts it exactly);
        // after its end the stream goes on into the next epoch.
        if self.loader.abandoned {
            self.loader.stop_stream();
        }
    }
}
