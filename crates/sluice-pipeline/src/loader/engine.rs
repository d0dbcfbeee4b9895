//! The batch engine: the resizable worker pool with what watches it (stats with per-op
//! times and percentiles, the trace, per-op CPU counters, the `threads = "auto"`
//! autoscaler) and the batch buffers it recycles. There is one: the file [`Loader`]
//! runs its chunks of manifest samples on it, and [`BatchRunner`] runs jobs whose bytes
//! are already in memory (a stream's entries and rehearsal draws) through a plan on it.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use sluice_pipeline::loader::{BatchRunner, BytesJob};
//! # fn demo(plan: sluice_codec::Plan, jpegs: Vec<Arc<Vec<u8>>>) -> Result<(), sluice_pipeline::PipelineError> {
//! let runner = BatchRunner::new(plan, sluice_core::Threads::Auto, jpegs.len())?;
//! let jobs = jpegs
//!     .into_iter()
//!     .enumerate()
//!     .map(|(i, bytes)| BytesJob {
//!         key: i as u64,
//!         bytes,
//!         rng: sluice_core::SampleRng::new(7, 0, sluice_core::SampleKey(i as u64), 0),
//!     })
//!     .collect::<Vec<_>>();
//! let ran = runner.run_batch(0, jobs);
//! runner.engine().batch_done(ran.results.iter().filter(|r| r.is_ok()).count(), ran.waited, 0);
//! println!("{:?}", runner.engine().stats().op_percentiles);
//! # Ok(()) }
//! ```
//!
//! [`Loader`]: super::Loader

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sluice_autoscale::{AcceleratorBusy, AcceleratorMeter, AutoscaleConfig};
use sluice_codec::{CodecError, Plan, Records};
use sluice_core::{DType, SampleRng, Tensor, TensorData, Threads};

use super::autoscale::{auto_threads_config, LocalAutoscale, Perturb};
use super::prefetch::PrefetchTuner;
use super::slab::Slab;
use crate::counters::{CounterSource, ThreadCounters};
use crate::error::PipelineError;
use crate::executor::{Pool, WorkerLocal};
use crate::stats::{Stats, StatsSnapshot};
use crate::trace::{now_ns, CacheUse, Recorder, SampleId, TraceData, TraceSwitch};

/// Samples per pool job: small enough to spread a batch over the threads and keep the first
/// batch quick, large enough that queueing costs nothing next to decoding.
pub(super) const CHUNK: usize = 8;

/// What watches the pool's work, shared by the consumer and the jobs.
pub(super) struct Observers {
    pub(super) stats: Mutex<Stats>,
    /// Profiling events, off unless [`Engine::start_trace`].
    pub(super) trace: TraceSwitch,
    /// CPU counters read at op boundaries, off unless [`Engine::set_op_counters`].
    pub(super) op_counters: AtomicBool,
    /// The stats' op names, which name the trace's ops too.
    pub(super) op_names: Vec<String>,
    /// Sizes the pool to the consumer, when autoscaling is on.
    pub(super) autoscale: LocalAutoscale,
    /// The trainer's accelerator: step timing and what the trainer reports.
    pub(super) accelerator: Accelerator,
    /// How many batches a loader keeps in flight (`None` for a [`BatchRunner`]).
    pub(super) prefetch: Mutex<Option<PrefetchTuner>>,
    /// Samples per batch.
    pub(super) batch_size: usize,
    /// Image buffers of batches their consumer is done with, for the next batches.
    spare: Mutex<Vec<Tensor>>,
    keep_spare: usize,
}

impl Observers {
    /// The buffer for a batch of `slots` samples: `given`, else a recycled one, else fresh.
    pub(super) fn slab(&self, dtype: DType, slots: usize, shape: [usize; 3], given: Option<Tensor>) -> Slab {
        let spare = given.or_else(|| self.spare.lock().pop());
        Slab::new(dtype, slots, shape, spare)
    }

    /// A chunk's work came back after the consumer waited `waited` for it.
    pub(super) fn fold(&self, waited: Duration, work: &ChunkWork) {
        self.autoscale.on_work(work.busy, work.samples);
        let mut stats = self.stats.lock();
        stats.add_wait(waited);
        stats.add_work(&work.times, &work.per_sample, work.bytes);
        if let Some((source, per_op)) = &work.counters {
            stats.add_counters(*source, per_op);
        }
    }
}

/// The consumer's accelerator, as its step timing and its own reports tell.
pub(super) struct Accelerator {
    clock: Instant,
    meter: Mutex<AcceleratorMeter>,
}

impl Default for Accelerator {
    fn default() -> Self {
        // Step timing over the last 5 seconds.
        Self { clock: Instant::now(), meter: Mutex::new(AcceleratorMeter::new(5.0)) }
    }
}

impl Accelerator {
    fn now(&self) -> f64 {
        self.clock.elapsed().as_secs_f64()
    }

    fn busy(&self) -> Option<AcceleratorBusy> {
        self.meter.lock().busy(self.now())
    }

    fn reported(&self) -> Option<f64> {
        self.meter.lock().reported(self.now())
    }
}

/// The pool and its observers. Cloning gives another handle to the same engine.
#[derive(Clone)]
pub struct Engine {
    pub(super) observers: Arc<Observers>,
    pub(super) pool: Pool,
}

impl Engine {
    /// An engine whose stats list `op_names`, with `threads` workers (`auto`: autoscaled),
    /// for batches of `batch_size` samples, keeping up to `keep_spare` recycled buffers.
    pub(super) fn new(
        op_names: Vec<String>,
        threads: Threads,
        batch_size: usize,
        keep_spare: usize,
    ) -> Result<Self, PipelineError> {
        let observers = Arc::new(Observers {
            stats: Mutex::new(Stats::new(op_names.clone())),
            trace: TraceSwitch::default(),
            op_counters: AtomicBool::new(false),
            op_names,
            autoscale: LocalAutoscale::new(batch_size),
            accelerator: Accelerator::default(),
            prefetch: Mutex::new(None),
            batch_size,
            spare: Mutex::new(Vec::new()),
            keep_spare,
        });
        let engine = Self { observers, pool: Pool::new(threads.initial()) };
        if threads == Threads::Auto {
            engine.autoscale(auto_threads_config())?;
        }
        Ok(engine)
    }

    /// Worker threads now.
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// Resizes the worker pool while it runs.
    pub fn set_threads(&self, threads: usize) {
        self.pool.set_threads(threads);
    }

    /// Lets `config`'s policy size the worker pool from here on, deciding on the batches
    /// handed out ([`Engine::batch_done`]); what `threads = "auto"` turns on, with
    /// [`auto_threads_config`]. Each decision is logged and listed in [`Engine::stats`].
    pub fn autoscale(&self, config: AutoscaleConfig) -> Result<(), PipelineError> {
        Ok(self.observers.autoscale.enable(config, &self.pool, None)?)
    }

    /// As [`Engine::autoscale`], with each window's readings passed through `perturb`
    /// before the policy sees them (a benchmark's injected noise).
    pub fn autoscale_perturbed(&self, config: AutoscaleConfig, perturb: Perturb) -> Result<(), PipelineError> {
        Ok(self.observers.autoscale.enable(config, &self.pool, Some(perturb))?)
    }

    /// Starts recording profiling events: per sample and op, per batch (see
    /// [`crate::trace`]). Fails if a trace is already being recorded.
    pub fn start_trace(&self) -> Result<(), PipelineError> {
        Ok(self.observers.trace.start(self.observers.op_names.clone())?)
    }

    /// Stops recording and returns the events; `None` if no trace was being recorded.
    pub fn stop_trace(&self) -> Option<TraceData> {
        self.observers.trace.stop()
    }

    /// The events recorded since the trace started or was last drained, leaving it
    /// recording. `None` if no trace is being recorded.
    pub fn drain_trace(&self) -> Option<TraceData> {
        self.observers.trace.drain()
    }

    /// Turns per-op CPU counters on or off (see [`crate::counters`]); the totals appear in
    /// [`StatsSnapshot::op_counters`]. Off (the default) costs nothing.
    pub fn set_op_counters(&self, on: bool) {
        self.observers.op_counters.store(on, Ordering::Relaxed);
    }

    /// Batches, samples, consumer wait, per-op times and percentiles, CPU counters and
    /// autoscaling decisions so far.
    pub fn stats(&self) -> StatsSnapshot {
        let mut s = self.observers.stats.lock().snapshot();
        s.autoscale = self.observers.autoscale.stats();
        s.accelerator = self.observers.accelerator.busy();
        s.prefetch = self
            .observers
            .prefetch
            .lock()
            .as_ref()
            .map(|t| t.stats(self.pool.threads(), CHUNK, self.observers.batch_size));
        s
    }

    /// Keeps batches in flight as `tuner` says (a loader's prefetch).
    pub(super) fn set_prefetch(&self, tuner: PrefetchTuner) {
        *self.observers.prefetch.lock() = Some(tuner);
    }

    /// Batches to keep in flight now (1 without a prefetch).
    pub(super) fn prefetch_depth(&self) -> usize {
        let threads = self.pool.threads();
        self.observers.prefetch.lock().as_ref().map_or(1, |t| t.depth(threads, CHUNK, self.observers.batch_size))
    }

    /// The consumer asked for a batch and found `ready` ready in order: the autotuner's reading.
    pub(super) fn prefetch_consumed(&self, ready: usize) {
        let threads = self.pool.threads();
        if let Some(t) = self.observers.prefetch.lock().as_mut() {
            t.record(ready, threads, CHUNK, self.observers.batch_size);
        }
    }

    /// Takes back the image buffer of a batch whose pixels the consumer no longer needs: a
    /// later batch is built in it instead of in fresh memory. Keeps as many as it can use.
    pub fn recycle(&self, images: Tensor) {
        if matches!(images.data, TensorData::SharedU8(_)) {
            // Borrowed memory goes back to its owner, not to this engine.
            return;
        }
        let mut spare = self.observers.spare.lock();
        if spare.len() < self.observers.keep_spare {
            spare.push(images);
        }
    }

    /// A batch of `samples` went to the consumer, who waited `waited` for it, with `ready`
    /// more batches built behind it: counted in the stats, and the autoscaler's signal.
    pub fn batch_done(&self, samples: usize, waited: Duration, ready: usize) {
        self.observers.stats.lock().add_batch(samples);
        let reported = self.observers.accelerator.reported();
        self.observers.autoscale.on_batch(waited, ready, &self.pool, reported);
    }

    /// The consumer computed for `compute` since it took its last batch, then waited
    /// `waited` for the next: one step of its accelerator's busy fraction.
    pub fn step_done(&self, compute: Duration, waited: Duration) {
        let a = &self.observers.accelerator;
        a.meter.lock().record_step(a.now(), compute.as_secs_f64(), waited.as_secs_f64());
    }

    /// The trainer's own reading of its accelerator's busy fraction (0..=1, e.g.
    /// `torch.cuda.utilization() / 100`): shown in the stats and read by the autoscaler's
    /// policy in place of step timing for the next 10 s. NaN is ignored; others are clamped.
    pub fn report_accelerator_busy(&self, fraction: f64) {
        let a = &self.observers.accelerator;
        a.meter.lock().report(a.now(), fraction);
    }
}

/// What a chunk measured while it ran, for the stats and the autoscaler.
pub(super) struct ChunkWork {
    pub(super) times: Vec<Duration>,
    /// Each sample's op times, `times.len()` per sample.
    pub(super) per_sample: Vec<Duration>,
    /// What the CPU counters moved per op, when they are on.
    pub(super) counters: Option<(CounterSource, Vec<[u64; crate::counters::N]>)>,
    pub(super) bytes: u64,
    /// Samples the chunk ran (all of them unless cancelled) and the wall time it took:
    /// the autoscaler's production signal.
    pub(super) samples: usize,
    pub(super) busy: Duration,
}

/// Measures one chunk on a worker: op times per sample and in total, trace events, CPU
/// counters. Both kinds of chunk (manifest samples, bytes jobs) go through it.
pub(super) struct ChunkMeter {
    started: Instant,
    work: ChunkWork,
    /// The sample being run's op times.
    pub(super) sample: Vec<Duration>,
    start_ns: u64,
    trace: Option<Arc<Recorder>>,
}

impl ChunkMeter {
    /// Starts a chunk of up to `samples` samples over `ops` ops (the stats' op list).
    pub(super) fn start(observers: &Observers, local: &mut WorkerLocal, ops: usize, samples: usize) -> Self {
        if observers.op_counters.load(Ordering::Relaxed) {
            if probe(local).is_none() {
                local.scratch.probe = Some(Box::new(ThreadCounters::open(ops)));
            }
        } else {
            local.scratch.probe = None;
        }
        Self {
            started: Instant::now(),
            work: ChunkWork {
                times: vec![Duration::ZERO; ops],
                per_sample: Vec::with_capacity(samples * ops),
                counters: None,
                bytes: 0,
                samples: 0,
                busy: Duration::ZERO,
            },
            sample: vec![Duration::ZERO; ops],
            start_ns: 0,
            trace: observers.trace.current(),
        }
    }

    /// A sample starts.
    pub(super) fn begin(&mut self) {
        self.work.samples += 1;
        self.sample.fill(Duration::ZERO);
        if self.trace.is_some() {
            self.start_ns = now_ns();
        }
    }

    /// The sample ends: its times join the chunk's, and its events the thread's trace.
    pub(super) fn end(&mut self, local: &mut WorkerLocal, cache: CacheUse, id: SampleId) {
        for (total, t) in self.work.times.iter_mut().zip(&self.sample) {
            *total += *t;
        }
        self.work.per_sample.extend_from_slice(&self.sample);
        if self.trace.is_some() {
            local.trace.sample(self.start_ns, &self.sample, cache, id);
        }
    }

    pub(super) fn add_bytes(&mut self, bytes: u64) {
        self.work.bytes += bytes;
    }

    /// The chunk is done: hands the thread's events to the trace (before the consumer
    /// hears of the chunk, so a batch it holds has all its events) and its counters over.
    pub(super) fn finish(mut self, local: &mut WorkerLocal) -> ChunkWork {
        if let Some(recorder) = &self.trace {
            recorder.flush(&mut local.trace);
        }
        self.work.counters = probe(local).map(|c| (c.source(), c.take()));
        self.work.busy = self.started.elapsed();
        self.work
    }
}

/// This worker's CPU counters, when they are on.
pub(super) fn probe(local: &mut WorkerLocal) -> Option<&mut ThreadCounters> {
    local.scratch.probe.as_mut()?.as_any_mut().downcast_mut()
}

/// The text of a caught panic.
pub(super) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => (*s).to_string(),
        (_, Some(s)) => s.clone(),
        _ => "a panic without a message".to_string(),
    }
}

/// Encoded bytes already in memory.
pub type JobBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// One sample for [`BatchRunner`]: its bytes, and the generator its random ops draw from
/// (each job owns one, so the output does not depend on which thread runs it).
pub struct BytesJob {
    /// Names the sample in the trace.
    pub key: u64,
    pub bytes: JobBytes,
    pub rng: SampleRng,
}

/// Why one job gave no pixels.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// sluice itself panicked on the sample: a bug, caught so the batch does not hang.
    #[error("sluice panicked on this sample (a bug): {0}")]
    Panicked(String),
}

/// Runs batches of [`BytesJob`]s through one plan on an [`Engine`] of its own: each job's
/// pixels go straight into its slot of the batch's buffer, on the pool's threads.
pub struct BatchRunner {
    engine: Engine,
    plan: Arc<Plan>,
}

impl BatchRunner {
    /// A runner of `plan` on `threads` workers (`auto`: autoscaled) for batches of about
    /// `batch_size` jobs. Its stats list the plan's steps.
    pub fn new(plan: Plan, threads: Threads, batch_size: usize) -> Result<Self, PipelineError> {
        let names = plan.step_names().iter().map(|s| s.to_string()).collect();
        // A buffer in flight besides the one being built, and the one the consumer holds.
        let engine = Engine::new(names, threads, batch_size, 2)?;
        Ok(Self { engine, plan: Arc::new(plan) })
    }

    /// The engine: threads, stats, trace, counters, autoscaling, buffer recycling.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Starts `jobs` on the pool and returns at once: their pixels fill rows
    /// `0..jobs.len()` of a buffer of `rows` rows (at least as many as jobs; the caller
    /// fills the rest). `batch` names the batch in the trace.
    pub fn submit(&self, batch: u64, jobs: Vec<BytesJob>, rows: usize) -> PendingBatch {
        let n = jobs.len();
        let rows = rows.max(n);
        let (tx, rx) = crossbeam_channel::unbounded();
        let slab = Arc::new(self.engine.observers.slab(self.plan.output_dtype(), rows, self.plan.output_shape(), None));
        let cancel = Arc::new(AtomicBool::new(false));
        let mut jobs = jobs.into_iter();
        let mut first = 0;
        let mut chunks = 0;
        while first < n {
            let chunk: Vec<BytesJob> = jobs.by_ref().take(CHUNK).collect();
            let job = BytesChunk {
                observers: Arc::clone(&self.engine.observers),
                plan: Arc::clone(&self.plan),
                slab: Arc::clone(&slab),
                first,
                jobs: chunk,
                batch,
                cancel: Arc::clone(&cancel),
                reply: tx.clone(),
            };
            first += CHUNK;
            chunks += 1;
            self.engine.pool.submit(Box::new(move |local| job.run(local)));
        }
        PendingBatch {
            observers: Arc::clone(&self.engine.observers),
            slab: Some(slab),
            rx,
            chunks,
            results: (0..n).map(|_| Ok(())).collect(),
            cancel,
            dtype: self.plan.output_dtype(),
            shape: self.plan.output_shape(),
            rows,
        }
    }

    /// Runs `jobs` into one batch buffer of as many rows and waits for them.
    pub fn run_batch(&self, batch: u64, jobs: Vec<BytesJob>) -> RanBatch {
        let rows = jobs.len();
        self.submit(batch, jobs, rows).wait()
    }
}

/// A batch of jobs on the pool. Dropping it cancels the jobs not started yet.
pub struct PendingBatch {
    observers: Arc<Observers>,
    slab: Option<Arc<Slab>>,
    rx: crossbeam_channel::Receiver<BytesDone>,
    chunks: usize,
    results: Vec<Result<(), RunError>>,
    cancel: Arc<AtomicBool>,
    dtype: DType,
    shape: [usize; 3],
    rows: usize,
}

/// A finished batch of jobs.
pub struct RanBatch {
    /// `rows` rows; row `i < jobs` holds job `i`'s pixels when `results[i]` is `Ok`.
    pub images: Tensor,
    pub results: Vec<Result<(), RunError>>,
    /// How long the consumer waited for it.
    pub waited: Duration,
}

impl PendingBatch {
    /// Whether every job is done (then [`PendingBatch::wait`] returns at once).
    pub fn is_ready(&self) -> bool {
        self.rx.len() == self.chunks
    }

    /// Blocks until every job is done.
    pub fn wait(mut self) -> RanBatch {
        let mut waited = Duration::ZERO;
        while self.chunks > 0 {
            let t = Instant::now();
            let Ok(done) = self.rx.recv() else {
                // A chunk was dropped unrun (the pool is stopping): its jobs never ran.
                for r in self.results.iter_mut().filter(|r| r.is_ok()) {
                    *r = Err(RunError::Panicked("the job was dropped before it ran".into()));
                }
                break;
            };
            let w = t.elapsed();
            waited += w;
            self.chunks -= 1;
            self.observers.fold(w, &done.work);
            for (i, r) in done.results.into_iter().enumerate() {
                if let Some(slot) = self.results.get_mut(done.first + i) {
                    *slot = r;
                }
            }
        }
        let images = match self.slab.take().map(Arc::try_unwrap) {
            Some(Ok(slab)) => slab.into_tensor(),
            // Every chunk drops its handle before reporting, or with its job when the job is
            // dropped unrun: not expected.
            _ => {
                let [c, h, w] = self.shape;
                Tensor::zeros(self.dtype, vec![self.rows, c, h, w])
            }
        };
        RanBatch { images, results: std::mem::take(&mut self.results), waited }
    }
}

impl Drop for PendingBatch {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

/// Up to [`CHUNK`] jobs of a batch, run by one worker.
struct BytesChunk {
    observers: Arc<Observers>,
    plan: Arc<Plan>,
    slab: Arc<Slab>,
    /// The batch row of `jobs[0]`.
    first: usize,
    jobs: Vec<BytesJob>,
    batch: u64,
    cancel: Arc<AtomicBool>,
    reply: crossbeam_channel::Sender<BytesDone>,
}

/// What a chunk of bytes jobs reports.
struct BytesDone {
    first: usize,
    results: Vec<Result<(), RunError>>,
    work: ChunkWork,
}

impl BytesChunk {
    fn run(self, local: &mut WorkerLocal) {
        let Self { observers, plan, slab, first, jobs, batch, cancel, reply } = self;
        let ops = observers.op_names.len();
        let mut meter = ChunkMeter::start(&observers, local, ops, jobs.len());
        let mut results = Vec::with_capacity(jobs.len());
        for (i, mut job) in jobs.into_iter().enumerate() {
            if cancel.load(Ordering::Relaxed) {
                // Nobody waits for this batch any more: nothing will read the result.
                results.push(Ok(()));
                continue;
            }
            meter.begin();
            if let Some(c) = probe(local) {
                c.base = 0;
            }
            // SAFETY: this chunk is the only writer of its rows, and writes each once.
            let out = unsafe { slab.slot(first + i) };
            let times = &mut meter.sample;
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                plan.run((*job.bytes).as_ref(), &mut job.rng, &mut local.scratch, out, times, Records::default())
            }));
            let result = match outcome {
                Ok(r) => r.map_err(RunError::from),
                Err(payload) => {
                    // The scratch state may be half-way through a decode: start afresh.
                    *local = WorkerLocal::default();
                    Err(RunError::Panicked(panic_message(payload.as_ref())))
                }
            };
            if result.is_ok() {
                meter.add_bytes((*job.bytes).as_ref().len() as u64);
            }
            meter.end(local, CacheUse::None, SampleId { key: job.key, batch, epoch: 0 });
            results.push(result);
        }
        let work = meter.finish(local);
        // Release the buffer before reporting, so the consumer finds itself its only owner.
        drop(slab);
        let _ = reply.send(BytesDone { first, results, work });
    }
}
