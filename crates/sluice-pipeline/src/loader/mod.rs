//! The loader: runs a pipeline spec over its manifest on the worker pool and hands out
//! batches in epoch order, with bounded prefetch, exact checkpoints and per-op stats.
//!
//! Work is cut into chunks of a few samples. Workers write each sample straight into its
//! slot of the batch's one contiguous buffer, so a batch is assembled without copies; the
//! consumer only waits for its chunks to finish. At most `prefetch` batches are in flight,
//! which bounds memory by `prefetch × batch bytes`, whatever the dataset size.
//!
//! With a cache ([`crate::cache`]) each sample is looked up by key first. Every sample then
//! goes through the same split path whether it hit or missed: the deterministic prefix
//! (skipped when the hit holds pixels), the optional cache resize, then the random ops,
//! so pixels never depend on timing. Only a cache of raw bytes with no resize keeps the
//! fused decode+crop path. The epoch order comes from the importance store
//! ([`crate::importance`]), which the trainer feeds through [`Loader::report`].

mod sample;
mod slab;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sluice_codec::Plan;
use sluice_core::{
    Batch, BatchSpec, ByteBudget, CacheLevel, DType, ErrorPolicy, ImportanceSpec, Layout, Manifest, PipelineSpec,
    SampleError, SamplingSpec, ShuffleSpec, Tensor, TensorData,
};

use crate::cache::{total_ram_bytes, Cache};
use crate::error::PipelineError;
use crate::executor::Pool;
use crate::importance::{DrawInputs, ImportanceState, ImportanceStore};
use crate::sampler::Shard;
use crate::source::build_manifest;
use crate::stats::{Stats, StatsSnapshot};
use crate::storage::{open_storage, open_storage_in, Roots, Storage};
use sample::{ChunkDone, ChunkJob};
use slab::Slab;

/// Samples per job: small enough to spread a batch over the threads and keep the first
/// batch quick, large enough that queueing costs nothing next to decoding.
const CHUNK: usize = 8;

/// How often a waiting consumer checks whether it was interrupted.
const POLL: Duration = Duration::from_millis(50);

/// Where a loader stands: enough to resume to exactly the batches an uninterrupted run
/// would have produced next.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoaderState {
    pub epoch: u64,
    /// Batches of `epoch` already handed out.
    pub batch: u64,
    pub seed: u64,
    pub fingerprint: String,
    pub rank: usize,
    pub world_size: usize,
    /// Reported importance, smoothed scores and coverage bookkeeping: the epoch order is
    /// drawn from it, so resuming needs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub importance: Option<ImportanceState>,
    /// The parts of the spec that decide which samples batch `batch` holds; `None` in
    /// states saved before they were carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<OrderSpec>,
}

/// What, besides dataset, seed and shard, fixes the samples behind a batch index: a
/// checkpoint restored under a different one would repeat or skip samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OrderSpec {
    pub batch: BatchSpec,
    pub shuffle: ShuffleSpec,
    pub sampling: SamplingSpec,
    /// The smoothing of reported importance, from which importance-driven orders are drawn.
    pub importance: ImportanceSpec,
}

impl OrderSpec {
    fn of(spec: &PipelineSpec) -> Self {
        Self { batch: spec.batch, shuffle: spec.shuffle, sampling: spec.sampling, importance: spec.importance }
    }

    /// The first difference between a checkpoint's (`self`) and this loader's, as
    /// (what, theirs, ours).
    fn difference(&self, ours: &Self) -> Option<(&'static str, String, String)> {
        let differs = |what, theirs: String, ours: String| (theirs != ours).then_some((what, theirs, ours));
        differs("batch size", self.batch.size.to_string(), ours.batch.size.to_string())
            .or_else(|| differs("batch.drop_last", self.batch.drop_last.to_string(), ours.batch.drop_last.to_string()))
            .or_else(|| differs("shuffle", format!("{:?}", self.shuffle), format!("{:?}", ours.shuffle)))
            .or_else(|| differs("sampling", format!("{:?}", self.sampling), format!("{:?}", ours.sampling)))
            .or_else(|| differs("importance.ema", self.importance.ema.to_string(), ours.importance.ema.to_string()))
    }
}

struct Progress {
    epoch: u64,
    batch: u64,
    /// Bumped whenever a new iterator starts, so an older one stops handing out batches.
    generation: u64,
}

/// An epoch, its order and its weights.
type TaskDraw = (u64, Arc<Vec<u32>>, Option<Arc<Vec<f32>>>);

struct Shared {
    spec: PipelineSpec,
    manifest: Manifest,
    storage: Arc<dyn Storage>,
    plan: Plan,
    shard: Shard,
    sample_shape: [usize; 3],
    dtype: DType,
    layout: Layout,
    stats: Mutex<Stats>,
    progress: Mutex<Progress>,
    /// Image buffers of batches their consumer is done with, for the next batches.
    spare: Mutex<Vec<Tensor>>,
    /// Epoch orders drawn for task iterators ([`Loader::iter_range`]), newest last.
    task_draws: Mutex<Vec<TaskDraw>>,
    /// Shared with other loaders of the same pipeline when built by
    /// [`Loader::with_shared_cache`].
    cache: Option<Arc<Cache>>,
    /// Run every sample through prefix → (resize) → suffix rather than the fused plan.
    split: bool,
    /// Where the split path's step timings go in the stats' op list.
    steps: StepSlots,
    importance: Mutex<ImportanceStore>,
}

/// Index ranges into the per-op timing list: 0 is `read`, then either the fused plan's
/// steps, or the prefix's, the cache resize and the suffix's.
#[derive(Debug, Clone)]
struct StepSlots {
    prefix: std::ops::Range<usize>,
    resize: Option<usize>,
    suffix: std::ops::Range<usize>,
}

pub struct Loader {
    shared: Arc<Shared>,
    pool: Pool,
}

impl Loader {
    /// Enumerates the source and prepares the pipeline; no sample is read yet.
    pub fn new(spec: PipelineSpec, shard: Shard) -> Result<Self, PipelineError> {
        spec.validate()?;
        let manifest = build_manifest(&spec.source)?;
        Self::with_manifest(spec, manifest, shard)
    }

    /// As [`Loader::new`], over a manifest built elsewhere (e.g. shared by a service).
    pub fn with_manifest(spec: PipelineSpec, manifest: Manifest, shard: Shard) -> Result<Self, PipelineError> {
        spec.validate()?;
        let cache = match &spec.cache {
            None => None,
            Some(c) => {
                let budget = match c.budget {
                    ByteBudget::Bytes(b) => b,
                    ByteBudget::RamFraction(_) => c.budget.resolve(total_ram_bytes().ok_or(PipelineError::RamUnknown)?),
                };
                Some(Arc::new(Cache::new(c, budget, manifest.len())))
            }
        };
        Self::build(spec, manifest, shard, cache)
    }

    /// As [`Loader::with_manifest`], filling and reading `cache` (another loader's, from
    /// [`Loader::cache`]) instead of a cache of its own: loaders of the same pipeline over
    /// the same data (a service's jobs with one fingerprint) then decode each sample once.
    /// The caller vouches that the pipelines match; the dataset size is checked.
    pub fn with_shared_cache(
        spec: PipelineSpec,
        manifest: Manifest,
        shard: Shard,
        cache: Arc<Cache>,
    ) -> Result<Self, PipelineError> {
        spec.validate()?;
        if spec.cache.is_none() {
            return Err(PipelineError::SharedCache("it needs a pipeline with a cache section".into()));
        }
        if cache.dataset_len() != manifest.len() {
            return Err(PipelineError::SharedCache(format!(
                "the shared cache is for {} samples, this dataset has {}",
                cache.dataset_len(),
                manifest.len()
            )));
        }
        Self::build(spec, manifest, shard, Some(cache))
    }

    fn build(
        spec: PipelineSpec,
        manifest: Manifest,
        shard: Shard,
        cache: Option<Arc<Cache>>,
    ) -> Result<Self, PipelineError> {
        if shard.world_size == 0 || shard.rank >= shard.world_size {
            return Err(PipelineError::BadRank { rank: shard.rank, world_size: shard.world_size });
        }
        let plan = Plan::compile(&spec.ops, spec.limits);
        // The one gate for the batch buffer arithmetic (`batch_bytes`, `Slab`): a full batch
        // must be countable and within the spec's bound, so the products below cannot wrap.
        let batch_bytes = plan.output_bytes().checked_mul(spec.batch.size);
        if plan.output_bytes() == 0 || batch_bytes.is_none_or(|b| b as u64 > sluice_core::spec::MAX_BATCH_BYTES) {
            return Err(sluice_core::SpecError::new(
                "batch.size",
                format!("a batch of {} samples is too large to hold", spec.batch.size),
            )
            .into());
        }
        let (dtype, layout, _) = spec.output();
        let resize = spec.cache.as_ref().and_then(|c| c.resize);
        let split = spec.cache.as_ref().is_some_and(|c| c.level != CacheLevel::Raw || c.resize.is_some());
        let mut names = vec!["read".to_string()];
        let steps = if split {
            names.extend(plan.prefix_step_names().iter().map(|s| s.to_string()));
            let prefix = 1..names.len();
            let resize_slot = resize.map(|_| {
                names.push("cache_resize".to_string());
                names.len() - 1
            });
            let start = names.len();
            names.extend(plan.suffix_step_names().iter().map(|s| s.to_string()));
            StepSlots { prefix, resize: resize_slot, suffix: start..names.len() }
        } else {
            names.extend(plan.step_names().iter().map(|s| s.to_string()));
            StepSlots { prefix: 1..names.len(), resize: None, suffix: 1..names.len() }
        };
        let threads = match spec.threads {
            0 => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            n => n,
        };
        let shared = Arc::new(Shared {
            storage: open_storage(&spec.storage),
            sample_shape: plan.output_shape(),
            dtype,
            layout,
            stats: Mutex::new(Stats::new(names)),
            progress: Mutex::new(Progress { epoch: 0, batch: 0, generation: 0 }),
            spare: Mutex::new(Vec::new()),
            task_draws: Mutex::new(Vec::new()),
            importance: Mutex::new(ImportanceStore::new(spec.importance.ema)),
            cache,
            split,
            steps,
            plan,
            manifest,
            shard,
            spec,
        });
        Ok(Self { shared, pool: Pool::new(threads) })
    }

    /// Confines every read beneath `roots` (a service's allowed roots): each file is opened
    /// relative to the root it lies under and may not resolve out of it, so a file swapped
    /// for a symlink after the job's paths were checked is refused, not read. Call it
    /// before iterating.
    pub fn confine_reads(self, roots: &[PathBuf]) -> Result<Self, PipelineError> {
        let storage = open_storage_in(&self.shared.spec.storage, Some(Arc::new(Roots::open(roots)?)));
        self.replace_storage(storage)
    }

    /// Reads through `storage` instead of the one the spec names: possible only before the
    /// loader hands out work, while nothing else shares its state.
    fn replace_storage(mut self, storage: Arc<dyn Storage>) -> Result<Self, PipelineError> {
        let shared = Arc::get_mut(&mut self.shared).ok_or(PipelineError::AlreadyStarted)?;
        shared.storage = storage;
        Ok(self)
    }

    /// The cache, to share with another loader of the same pipeline
    /// ([`Loader::with_shared_cache`]); `None` without a cache section.
    pub fn cache(&self) -> Option<Arc<Cache>> {
        self.shared.cache.clone()
    }

    pub fn manifest(&self) -> &Manifest {
        &self.shared.manifest
    }

    pub fn spec(&self) -> &PipelineSpec {
        &self.shared.spec
    }

    /// Samples this rank sees per epoch.
    pub fn samples_per_epoch(&self) -> usize {
        let n = self.shared.manifest.len();
        n / self.shared.shard.world_size
    }

    /// Batches per epoch for this rank (the short last batch counts unless `drop_last`).
    pub fn batches_per_epoch(&self) -> u64 {
        batches_for(self.samples_per_epoch(), &self.shared.spec) as u64
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// Takes back the image buffer of a batch whose pixels the consumer no longer needs
    /// (a service worker, once it has sent them): a later batch is built in it instead of
    /// in fresh memory, which the allocator would zero, or the kernel fault in, each time.
    /// Keeps as many as the prefetch window can use.
    pub fn recycle(&self, images: Tensor) {
        if matches!(images.data, TensorData::SharedU8(_)) {
            // Borrowed memory goes back to its owner, not to this loader.
            return;
        }
        let mut spare = self.shared.spare.lock();
        if spare.len() < self.shared.spec.prefetch + 2 {
            spare.push(images);
        }
    }

    /// Bytes of a full batch's images: the most any batch of this loader carries.
    pub fn batch_bytes(&self) -> usize {
        // Cannot wrap: `build` checked it.
        self.shared.spec.batch.size * self.shared.plan.output_bytes()
    }

    /// Resizes the worker pool while it runs.
    pub fn set_threads(&self, threads: usize) {
        self.pool.set_threads(threads);
    }

    /// Starts `epoch` from its first batch at the next [`Loader::iter`].
    pub fn set_epoch(&self, epoch: u64) {
        let mut p = self.shared.progress.lock();
        p.epoch = epoch;
        p.batch = 0;
        p.generation += 1;
    }

    pub fn state(&self) -> LoaderState {
        let p = self.shared.progress.lock();
        LoaderState {
            epoch: p.epoch,
            batch: p.batch,
            seed: self.shared.spec.seed,
            fingerprint: self.shared.manifest.fingerprint_hex(),
            rank: self.shared.shard.rank,
            world_size: self.shared.shard.world_size,
            importance: Some(self.shared.importance.lock().state()),
            order: Some(OrderSpec::of(&self.shared.spec)),
        }
    }

    /// Makes the next [`Loader::iter`] continue exactly where `state` was taken.
    pub fn load_state(&self, state: &LoaderState) -> Result<(), PipelineError> {
        let me = self.state();
        let mismatch = |what: &str, theirs: String, ours: String| {
            Err(PipelineError::State(format!("{what} differs: checkpoint has {theirs}, this loader has {ours}")))
        };
        if state.fingerprint != me.fingerprint {
            return mismatch("dataset fingerprint", state.fingerprint.clone(), me.fingerprint);
        }
        if state.seed != me.seed {
            return mismatch("seed", state.seed.to_string(), me.seed.to_string());
        }
        if (state.rank, state.world_size) != (me.rank, me.world_size) {
            return mismatch(
                "rank/world_size",
                format!("{}/{}", state.rank, state.world_size),
                format!("{}/{}", me.rank, me.world_size),
            );
        }
        match (&state.order, &me.order) {
            (Some(theirs), Some(ours)) => {
                if let Some((what, theirs, ours)) = theirs.difference(ours) {
                    return mismatch(what, theirs, ours);
                }
            }
            _ => tracing::warn!(
                "this checkpoint predates sluice recording batch size, shuffle and sampling in it: \
                 they cannot be checked, make sure they are the ones it was taken with"
            ),
        }
        if state.batch > self.batches_per_epoch() {
            return Err(PipelineError::State(format!(
                "batch {} is past the end of the epoch ({} batches)",
                state.batch,
                self.batches_per_epoch()
            )));
        }
        if let Some(imp) = &state.importance {
            self.shared.importance.lock().restore(imp);
            self.shared.task_draws.lock().clear();
        }
        let mut p = self.shared.progress.lock();
        p.epoch = state.epoch;
        p.batch = state.batch;
        p.generation += 1;
        Ok(())
    }

    pub fn stats(&self) -> StatsSnapshot {
        let mut s = self.shared.stats.lock().snapshot();
        s.cache = self.shared.cache.as_deref().map(Cache::stats);
        s
    }

    /// The trainer's per-sample values for `keys`: losses, or per-sample gradient norms
    /// (FastMatch's `update_gradient_info`). They shape the epochs after the current one
    /// and the cache's priorities. Non-finite or negative values are ignored.
    ///
    /// With several ranks (DDP), the epoch order is drawn from the reports, and every rank
    /// must draw the same one for the shards to stay disjoint: so every rank reports every
    /// rank's values, in the same order (gather them, e.g. `all_gather`, and report each
    /// rank's in rank order), before the next epoch starts.
    pub fn report(&self, keys: &[u64], values: &[f64]) -> Result<(), PipelineError> {
        if keys.len() != values.len() {
            return Err(PipelineError::ReportLengths { keys: keys.len(), values: values.len() });
        }
        let ignored = self.shared.importance.lock().report(keys, values);
        if ignored > 0 {
            tracing::warn!(ignored, "importance report: ignored non-finite or negative values");
        }
        if let Some(cache) = &self.shared.cache {
            cache.report(keys, values);
        }
        Ok(())
    }

    /// The importance state (smoothed scores, pending reports, coverage bookkeeping).
    pub fn importance_state(&self) -> ImportanceState {
        self.shared.importance.lock().state()
    }

    /// Draws the order (and weights) of `epoch` from the importance state and hands the
    /// cache its priorities for the epoch.
    fn draw_epoch(&self, epoch: u64) -> crate::sampler::EpochDraw {
        let shared = &self.shared;
        // A rank's cache sees only its own shard, so its size in entries differs from rank to
        // rank; the draw, which must be the same on every rank, then ignores the cache.
        let hot = match shared.shard.world_size {
            1 => shared.cache.as_deref().and_then(Cache::capacity_entries),
            _ => None,
        };
        let inputs = DrawInputs {
            manifest: &shared.manifest,
            seed: shared.spec.seed,
            shuffle: shared.spec.shuffle,
            sampling: shared.spec.sampling,
            shard: shared.shard,
        };
        let mut store = shared.importance.lock();
        let draw = store.draw(epoch, hot, &inputs);
        if let Some(cache) = &shared.cache {
            cache.set_priorities_for(&draw, &store, &shared.manifest);
        }
        draw
    }

    /// Iterates the rest of the current epoch (all of it, unless resuming). When the epoch
    /// ends the loader moves on to the next one, so calling `iter` again starts it. Starting
    /// a new iterator retires any older one.
    pub fn iter(&self) -> EpochIter {
        let (epoch, start, generation) = {
            let mut p = self.shared.progress.lock();
            p.generation += 1;
            (p.epoch, p.batch, p.generation)
        };
        let draw = self.draw_epoch(epoch);
        self.epoch_iter(epoch, start, Some(generation), Arc::new(draw.order), draw.weights.map(Arc::new))
    }

    /// Iterates only batches `start..end` of `epoch` (clamped to the epoch): one task of a
    /// distributed epoch, as a service worker runs it. Nothing past `end` is prefetched.
    /// Task iterators stand apart from the loader's own position: they neither retire nor
    /// are retired by other iterators and leave [`Loader::state`] alone, so several tasks
    /// can share the pool at once (the next task's samples fill the threads while the
    /// last one's finish). Each epoch's order is drawn once, for all its tasks.
    pub fn iter_range(&self, epoch: u64, start: u64, end: u64) -> EpochIter {
        let (order, weights) = self.task_draw(epoch);
        let mut it = self.epoch_iter(epoch, start, None, order, weights);
        it.n_batches = it.n_batches.min(end);
        it
    }

    /// The order and weights of `epoch` for [`Loader::iter_range`], drawn on first use.
    /// The last two epochs are kept: a service client reads ahead into the next epoch
    /// while the current one finishes.
    fn task_draw(&self, epoch: u64) -> (Arc<Vec<u32>>, Option<Arc<Vec<f32>>>) {
        let mut draws = self.shared.task_draws.lock();
        if let Some((_, order, weights)) = draws.iter().find(|d| d.0 == epoch) {
            return (order.clone(), weights.clone());
        }
        let draw = self.draw_epoch(epoch);
        let (order, weights) = (Arc::new(draw.order), draw.weights.map(Arc::new));
        if draws.len() == 2 {
            draws.remove(0);
        }
        draws.push((epoch, order.clone(), weights.clone()));
        (order, weights)
    }

    fn epoch_iter(
        &self,
        epoch: u64,
        start: u64,
        generation: Option<u64>,
        order: Arc<Vec<u32>>,
        weights: Option<Arc<Vec<f32>>>,
    ) -> EpochIter {
        let n_batches = batches_for(order.len(), &self.shared.spec) as u64;
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        EpochIter {
            shared: self.shared.clone(),
            pool: self.pool.clone(),
            epoch,
            generation,
            order,
            weights,
            n_batches,
            next_submit: start,
            next_emit: start,
            pending: HashMap::new(),
            done_tx,
            done_rx,
            cancel: Arc::new(AtomicBool::new(false)),
            finished: false,
            buffers: None,
        }
    }
}

fn batches_for(samples: usize, spec: &PipelineSpec) -> usize {
    let b = spec.batch.size;
    if spec.batch.drop_last {
        samples / b
    } else {
        samples.div_ceil(b)
    }
}

struct Assembly {
    slab: Arc<Slab>,
    keys: Vec<u64>,
    labels: Vec<i64>,
    weights: Option<Vec<f32>>,
    chunks_left: usize,
    failures: Vec<(usize, SampleError)>,
}

/// The batches of one epoch, in order. Dropping it mid-epoch cancels the work in flight.
pub struct EpochIter {
    shared: Arc<Shared>,
    pool: Pool,
    epoch: u64,
    /// The loader's iterator generation; `None` for a task iterator, which stands apart.
    generation: Option<u64>,
    order: Arc<Vec<u32>>,
    /// Per-position weights of an importance-sampled epoch.
    weights: Option<Arc<Vec<f32>>>,
    n_batches: u64,
    next_submit: u64,
    next_emit: u64,
    pending: HashMap<u64, Assembly>,
    done_tx: Sender<ChunkDone>,
    done_rx: Receiver<ChunkDone>,
    cancel: Arc<AtomicBool>,
    finished: bool,
    buffers: Option<BufferSource>,
}

/// Memory to build a batch's images in, asked for each batch with its dtype and element
/// count: e.g. a service worker's shared memory, so the batch is made where the client
/// reads it. `None` (or a tensor that does not fit): the loader's own memory.
pub type BufferSource = Arc<dyn Fn(DType, usize) -> Option<Tensor> + Send + Sync>;

impl EpochIter {
    /// Builds the batches in memory from `source` where it has some.
    pub fn with_buffers(mut self, source: BufferSource) -> Self {
        self.buffers = Some(source);
        self
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Batches left in this epoch.
    pub fn remaining(&self) -> u64 {
        if self.finished {
            0
        } else {
            self.n_batches - self.next_emit
        }
    }

    fn submit_ahead(&mut self) {
        let window = self.shared.spec.prefetch as u64;
        while self.next_submit < self.n_batches && self.next_submit < self.next_emit + window {
            self.submit_batch(self.next_submit);
            self.next_submit += 1;
        }
    }

    fn submit_batch(&mut self, b: u64) {
        let bs = self.shared.spec.batch.size;
        let start = b as usize * bs;
        let end = (start + bs).min(self.order.len());
        let indices = &self.order[start..end];
        let n = indices.len() * self.shared.sample_shape.iter().product::<usize>();
        let spare = match &self.buffers {
            Some(source) => source(self.shared.dtype, n),
            None => None,
        };
        let spare = spare.or_else(|| self.shared.spare.lock().pop());
        let slab = Arc::new(Slab::new(self.shared.dtype, indices.len(), self.shared.sample_shape, spare));
        let entries = &self.shared.manifest.entries;
        let keys = indices.iter().map(|&i| entries[i as usize].key.0).collect();
        let labels = indices.iter().map(|&i| entries[i as usize].label).collect();
        let weights = self.weights.as_ref().map(|w| w[start..end].to_vec());
        let chunks = indices.len().div_ceil(CHUNK);
        for c in 0..chunks {
            let slots = c * CHUNK..((c + 1) * CHUNK).min(indices.len());
            let job = ChunkJob {
                shared: self.shared.clone(),
                slab: slab.clone(),
                order: self.order.clone(),
                first: start,
                slots,
                epoch: self.epoch,
                batch: b,
                cancel: self.cancel.clone(),
                reply: self.done_tx.clone(),
            };
            self.pool.submit(Box::new(move |local| job.run(local)));
        }
        self.pending.insert(b, Assembly { slab, keys, labels, weights, chunks_left: chunks, failures: Vec::new() });
    }

    fn finish(&mut self) {
        self.finished = true;
        self.cancel.store(true, Ordering::SeqCst);
        self.pending.clear();
    }

    fn is_current(&self) -> bool {
        self.generation.is_none_or(|g| self.shared.progress.lock().generation == g)
    }

    /// Blocks until batch `b` is complete, folding in whatever other chunks finish first.
    /// Asks `interrupted` every [`POLL`] while waiting and gives up if it says so.
    fn wait_for(&mut self, b: u64, interrupted: &mut dyn FnMut() -> bool) -> Result<(), PipelineError> {
        loop {
            if self.pending.get(&b).is_none_or(|a| a.chunks_left == 0) {
                return Ok(());
            }
            let t0 = Instant::now();
            let done = match self.done_rx.recv_timeout(POLL) {
                Ok(done) => done,
                Err(_) => {
                    self.shared.stats.lock().add_wait(t0.elapsed());
                    if interrupted() {
                        return Err(PipelineError::Interrupted);
                    }
                    continue;
                }
            };
            let waited = t0.elapsed();
            let mut stats = self.shared.stats.lock();
            stats.add_wait(waited);
            stats.add_work(&done.times, done.bytes);
            drop(stats);
            if let Some(a) = self.pending.get_mut(&done.batch) {
                a.chunks_left -= 1;
                a.failures.extend(done.failures);
            }
        }
    }

    fn assemble(&mut self, b: u64) -> Option<Result<Batch, PipelineError>> {
        let mut a = self.pending.remove(&b)?;
        a.failures.sort_by_key(|f| f.0);
        if let Some((_, first)) = a.failures.first() {
            if self.shared.spec.on_error == ErrorPolicy::Fail {
                return Some(Err(PipelineError::Sample(first.clone())));
            }
        }
        let slab = match Arc::try_unwrap(a.slab) {
            Ok(s) => s,
            // Every chunk dropped its handle before reporting done; this cannot happen.
            Err(_) => return Some(Err(PipelineError::BufferStillShared { batch: b })),
        };
        let slot_bytes = slab.slot_bytes;
        let mut images = slab.into_tensor();
        let mut keys = a.keys;
        let mut labels = a.labels;
        let mut weights = a.weights;
        if !a.failures.is_empty() {
            let mut stats = self.shared.stats.lock();
            for (_, e) in &a.failures {
                stats.add_skipped(e);
            }
            drop(stats);
            let bad: Vec<usize> = a.failures.iter().map(|f| f.0).collect();
            let bytes = images.as_bytes_mut();
            let mut kept = 0;
            for slot in 0..keys.len() {
                if bad.binary_search(&slot).is_ok() {
                    continue;
                }
                if kept != slot {
                    bytes.copy_within(slot * slot_bytes..(slot + 1) * slot_bytes, kept * slot_bytes);
                    keys[kept] = keys[slot];
                    labels[kept] = labels[slot];
                    if let Some(w) = weights.as_mut() {
                        w[kept] = w[slot];
                    }
                }
                kept += 1;
            }
            keys.truncate(kept);
            labels.truncate(kept);
            if let Some(w) = weights.as_mut() {
                w.truncate(kept);
            }
            images.truncate_rows(kept);
        }
        Some(Ok(Batch { epoch: self.epoch, index: b, keys, labels, images, layout: self.shared.layout, weights }))
    }

    fn record_progress(&self, batches_done: u64) {
        let Some(generation) = self.generation else { return };
        let mut p = self.shared.progress.lock();
        if p.generation != generation {
            return;
        }
        if batches_done >= self.n_batches {
            p.epoch = self.epoch + 1;
            p.batch = 0;
        } else {
            p.epoch = self.epoch;
            p.batch = batches_done;
        }
    }
}

impl EpochIter {
    /// The next batch, like [`Iterator::next`], but while it waits it asks `interrupted`
    /// every 50 ms and returns [`PipelineError::Interrupted`] if it says so (e.g. on Ctrl-C).
    /// Nothing is lost: the next call picks up the same batch.
    pub fn next_interruptible(
        &mut self,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Option<Result<Batch, PipelineError>> {
        loop {
            if self.finished || !self.is_current() {
                self.finish();
                return None;
            }
            if self.next_emit >= self.n_batches {
                self.record_progress(self.n_batches);
                self.finish();
                return None;
            }
            self.submit_ahead();
            let b = self.next_emit;
            if let Err(e) = self.wait_for(b, interrupted) {
                return Some(Err(e));
            }
            let result = self.assemble(b);
            self.next_emit += 1;
            match result {
                Some(Ok(batch)) if batch.is_empty() => {
                    // Every sample of this batch was skipped: nothing to hand out.
                    self.record_progress(self.next_emit);
                }
                Some(Ok(batch)) => {
                    self.record_progress(self.next_emit);
                    self.shared.stats.lock().add_batch(batch.len());
                    return Some(Ok(batch));
                }
                Some(Err(e)) => {
                    self.finish();
                    return Some(Err(e));
                }
                None => {
                    self.finish();
                    return None;
                }
            }
        }
    }
}

impl Iterator for EpochIter {
    type Item = Result<Batch, PipelineError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_interruptible(&mut || false)
    }
}

impl Drop for EpochIter {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::SeqCst);
    }
}
