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

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use serde::{Deserialize, Serialize};
use sluice_codec::{CodecError, Plan, Scratch};
use sluice_core::{
    Batch, ByteBudget, CacheLevel, CachePolicyKind, DType, ErrorPolicy, Image, Layout, Manifest, PipelineSpec, Pixels,
    SampleError, SampleErrorKind, SampleKey, SampleRng, Stage, Tensor, TensorData,
};

use crate::cache::{total_ram_bytes, Cache, CachedData, SampleCost};
use crate::error::PipelineError;
use crate::executor::{Pool, WorkerLocal};
use crate::importance::{DrawInputs, ImportanceState, ImportanceStore};
use crate::sampler::{fastmatch_normalise, Shard};
use crate::source::build_manifest;
use crate::stats::{SkippedSample, Stats, StatsSnapshot};
use crate::storage::{open_storage, Storage};

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

/// Locks a mutex, recovering it if a thread panicked while holding it: the data under our
/// locks (counters, progress) stays meaningful after a panic.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
                    ByteBudget::RamFraction(_) => c.budget.resolve(total_ram_bytes().ok_or_else(|| {
                        PipelineError::State(
                            "cache.budget is a fraction of RAM, but this system does not report its memory \
                             (/proc/meminfo); give the budget in bytes"
                                .into(),
                        )
                    })?),
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
            return Err(PipelineError::State("a shared cache needs a pipeline with a cache section".into()));
        }
        if cache.dataset_len() != manifest.len() {
            return Err(PipelineError::State(format!(
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
            return Err(PipelineError::State(format!(
                "rank {} is not in 0..world_size ({})",
                shard.rank, shard.world_size
            )));
        }
        let plan = Plan::compile(&spec.ops, spec.limits);
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
        let mut spare = lock(&self.shared.spare);
        if spare.len() < self.shared.spec.prefetch + 2 {
            spare.push(images);
        }
    }

    /// Bytes of a full batch's images: the most any batch of this loader carries.
    pub fn batch_bytes(&self) -> usize {
        self.shared.spec.batch.size * self.shared.sample_shape.iter().product::<usize>() * self.shared.dtype.size()
    }

    /// Resizes the worker pool while it runs.
    pub fn set_threads(&self, threads: usize) {
        self.pool.set_threads(threads);
    }

    /// Starts `epoch` from its first batch at the next [`Loader::iter`].
    pub fn set_epoch(&self, epoch: u64) {
        let mut p = lock(&self.shared.progress);
        p.epoch = epoch;
        p.batch = 0;
        p.generation += 1;
    }

    pub fn state(&self) -> LoaderState {
        let p = lock(&self.shared.progress);
        LoaderState {
            epoch: p.epoch,
            batch: p.batch,
            seed: self.shared.spec.seed,
            fingerprint: self.shared.manifest.fingerprint_hex(),
            rank: self.shared.shard.rank,
            world_size: self.shared.shard.world_size,
            importance: Some(lock(&self.shared.importance).state()),
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
        if state.batch > self.batches_per_epoch() {
            return Err(PipelineError::State(format!(
                "batch {} is past the end of the epoch ({} batches)",
                state.batch,
                self.batches_per_epoch()
            )));
        }
        if let Some(imp) = &state.importance {
            lock(&self.shared.importance).restore(imp);
            lock(&self.shared.task_draws).clear();
        }
        let mut p = lock(&self.shared.progress);
        p.epoch = state.epoch;
        p.batch = state.batch;
        p.generation += 1;
        Ok(())
    }

    pub fn stats(&self) -> StatsSnapshot {
        let mut s = lock(&self.shared.stats).snapshot();
        s.cache = self.shared.cache.as_deref().map(Cache::stats);
        s
    }

    /// The trainer's per-sample values for `keys`: losses, or per-sample gradient norms
    /// (FastMatch's `update_gradient_info`). They shape the epochs after the current one
    /// and the cache's priorities. Non-finite or negative values are ignored.
    pub fn report(&self, keys: &[u64], values: &[f64]) -> Result<(), PipelineError> {
        if keys.len() != values.len() {
            return Err(PipelineError::State(format!(
                "report: {} keys but {} values; give one value per key",
                keys.len(),
                values.len()
            )));
        }
        let ignored = lock(&self.shared.importance).report(keys, values);
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
        lock(&self.shared.importance).state()
    }

    /// Draws the order (and weights) of `epoch` from the importance state and hands the
    /// cache its priorities for the epoch.
    fn draw_epoch(&self, epoch: u64) -> crate::sampler::EpochDraw {
        let shared = &self.shared;
        let hot = shared.cache.as_deref().and_then(Cache::capacity_entries);
        let inputs = DrawInputs {
            manifest: &shared.manifest,
            seed: shared.spec.seed,
            shuffle: shared.spec.shuffle,
            sampling: shared.spec.sampling,
            shard: shared.shard,
        };
        let mut store = lock(&shared.importance);
        let draw = store.draw(epoch, hot, &inputs);
        if let Some(cache) = &shared.cache {
            let keyed = |v: &[f64]| -> HashMap<u64, f64> {
                shared.manifest.entries.iter().zip(v).map(|(e, &p)| (e.key.0, p)).collect()
            };
            match cache.policy_kind() {
                CachePolicyKind::Importance => cache.set_epoch_priorities(keyed(&draw.expected)),
                CachePolicyKind::Fastmatch if store.has_scores() => {
                    cache.set_epoch_priorities(keyed(&fastmatch_normalise(&store.scores_by_position(&shared.manifest))))
                }
                _ => {}
            }
        }
        draw
    }

    /// Iterates the rest of the current epoch (all of it, unless resuming). When the epoch
    /// ends the loader moves on to the next one, so calling `iter` again starts it. Starting
    /// a new iterator retires any older one.
    pub fn iter(&self) -> EpochIter {
        let (epoch, start, generation) = {
            let mut p = lock(&self.shared.progress);
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
        let mut draws = lock(&self.shared.task_draws);
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
            skipped: Vec::new(),
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

/// One batch's buffer while workers fill it. Each worker writes only the slots of its own
/// chunk, so the writes never overlap.
struct Slab {
    tensor: UnsafeCell<Tensor>,
    base: *mut u8,
    slot_bytes: usize,
    slots: usize,
}

// SAFETY: workers write disjoint slots (one chunk each) through `base`; the consumer reads
// the tensor only after every chunk has reported done and dropped its handle.
unsafe impl Send for Slab {}
unsafe impl Sync for Slab {}

impl Slab {
    /// A buffer for `slots` samples: the given one (from a [`BufferSource`], or recycled by
    /// [`Loader::recycle`]) when it fits, else zeroed memory. Every slot is overwritten or dropped before the batch is
    /// handed out, so what a recycled buffer held never shows.
    fn new(dtype: DType, slots: usize, shape: [usize; 3], spare: Option<Tensor>) -> Self {
        let dims = vec![slots, shape[0], shape[1], shape[2]];
        let n = dims.iter().product();
        let mut tensor = match spare {
            Some(Tensor { data: TensorData::U8(mut v), .. }) if dtype == DType::U8 => {
                v.resize(n, 0);
                Tensor { shape: dims, data: TensorData::U8(v) }
            }
            Some(Tensor { data: TensorData::F32(mut v), .. }) if dtype == DType::F32 => {
                v.resize(n, 0.0);
                Tensor { shape: dims, data: TensorData::F32(v) }
            }
            Some(Tensor { data: TensorData::SharedU8(mut b), .. }) if dtype == DType::U8 && n <= b.capacity() => {
                b.set_len(n);
                Tensor { shape: dims, data: TensorData::SharedU8(b) }
            }
            _ => Tensor::zeros(dtype, dims),
        };
        let base = tensor.as_bytes_mut().as_mut_ptr();
        let slot_bytes = shape.iter().product::<usize>() * dtype.size();
        Self { tensor: UnsafeCell::new(tensor), base, slot_bytes, slots }
    }

    /// # Safety
    /// No other reference to slot `i` may exist while the returned slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slot(&self, i: usize) -> &mut [u8] {
        debug_assert!(i < self.slots);
        // SAFETY: in bounds (i < slots); exclusivity is the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(i * self.slot_bytes), self.slot_bytes) }
    }

    fn into_tensor(self) -> Tensor {
        self.tensor.into_inner()
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

struct ChunkDone {
    batch: u64,
    failures: Vec<(usize, SampleError)>,
    times: Vec<Duration>,
    bytes: u64,
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
    /// A task iterator's skipped samples, by batch index, until [`EpochIter::take_skipped`].
    skipped: Vec<(u64, SkippedSample)>,
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

    /// The samples skipped (`on_error = "skip"`) in the batches this task iterator has
    /// assembled since the last call, with their batch index; a batch whose samples were
    /// all skipped is not handed out, so this is the only word of it. Empty for a loader's
    /// own iterator (its stats list them).
    pub fn take_skipped(&mut self) -> Vec<(u64, SkippedSample)> {
        std::mem::take(&mut self.skipped)
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
        let spare = spare.or_else(|| lock(&self.shared.spare).pop());
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
        self.generation.is_none_or(|g| lock(&self.shared.progress).generation == g)
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
                    lock(&self.shared.stats).add_wait(t0.elapsed());
                    if interrupted() {
                        return Err(PipelineError::Interrupted);
                    }
                    continue;
                }
            };
            let waited = t0.elapsed();
            let mut stats = lock(&self.shared.stats);
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
            Err(_) => return Some(Err(PipelineError::State("batch buffer still shared".into()))),
        };
        let slot_bytes = slab.slot_bytes;
        let mut images = slab.into_tensor();
        let mut keys = a.keys;
        let mut labels = a.labels;
        let mut weights = a.weights;
        if !a.failures.is_empty() {
            let mut stats = lock(&self.shared.stats);
            for (_, e) in &a.failures {
                stats.add_skipped(e);
                if self.generation.is_none() {
                    self.skipped.push((b, e.into()));
                }
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
        let mut p = lock(&self.shared.progress);
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
                    lock(&self.shared.stats).add_batch(batch.len());
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

/// A few consecutive samples of one batch, run by one worker.
struct ChunkJob {
    shared: Arc<Shared>,
    slab: Arc<Slab>,
    order: Arc<Vec<u32>>,
    /// Position in `order` of the batch's slot 0.
    first: usize,
    slots: std::ops::Range<usize>,
    epoch: u64,
    batch: u64,
    cancel: Arc<AtomicBool>,
    reply: Sender<ChunkDone>,
}

impl ChunkJob {
    fn run(self, local: &mut WorkerLocal) {
        let shared = &self.shared;
        let mut times = vec![Duration::ZERO; 1 + shared.steps.suffix.end.max(shared.steps.prefix.end)];
        let mut failures = Vec::new();
        let mut bytes = 0u64;
        for slot in self.slots.clone() {
            if self.cancel.load(Ordering::Relaxed) {
                break;
            }
            let entry = &shared.manifest.entries[self.order[self.first + slot] as usize];
            let fail = |stage, kind| SampleError {
                key: entry.key,
                path: shared.manifest.display_path(entry.key),
                stage,
                kind,
            };
            let mut rng = SampleRng::new(shared.spec.seed, self.epoch, SampleKey(entry.key.0), 0);
            if let Some(cache) = &shared.cache {
                // SAFETY: this job is the only writer of its chunk's slots.
                let out = unsafe { self.slab.slot(slot) };
                match shared.run_cached(cache, entry, local, &mut rng, out, &mut times) {
                    Ok(read) => bytes += read,
                    Err((stage, kind)) => failures.push((slot, fail(stage, kind))),
                }
                continue;
            }
            let t0 = Instant::now();
            let read = shared.storage.read(
                &shared.manifest.root,
                &entry.location,
                shared.spec.limits.max_file_bytes,
                &mut local.read_buf,
            );
            times[0] += t0.elapsed();
            if let Err(kind) = read {
                failures.push((slot, fail(Stage::Read, kind)));
                continue;
            }
            bytes += local.read_buf.len() as u64;
            // SAFETY: this job is the only writer of its chunk's slots.
            let out = unsafe { self.slab.slot(slot) };
            if let Err(e) = shared.plan.run(&local.read_buf, &mut rng, &mut local.scratch, out, &mut times[1..]) {
                failures.push((slot, fail(Stage::Decode, e.into())));
            }
        }
        let Self { slab, reply, batch, .. } = self;
        // Release the buffer before reporting, so the consumer finds itself its only owner.
        drop(slab);
        let _ = reply.send(ChunkDone { batch, failures, times, bytes });
    }
}

type SampleFailure = (Stage, SampleErrorKind);

fn decode_err(e: CodecError) -> SampleFailure {
    (Stage::Decode, e.into())
}

/// Shrinks a cached-path image so its shorter side is `size`.
fn resize_image(image: &Image, size: u32, scratch: &mut Scratch) -> Result<Image, CodecError> {
    let Pixels::U8(px) = &image.pixels else {
        return Err(CodecError::Shape("the cache resize takes u8 pixels".into()));
    };
    let mut dst = Vec::new();
    let (w, h) = scratch.resizer().resize_shorter_side(px, image.width, image.height, size, &mut dst)?;
    Ok(Image::rgb8(w, h, dst))
}

impl Shared {
    /// One sample through the cache: a hit skips the read (and the decode, and the resize,
    /// depending on its level); a miss reads, runs, measures its costs and offers an entry.
    /// Returns the bytes read from storage.
    fn run_cached(
        &self,
        cache: &Cache,
        entry: &sluice_core::Entry,
        local: &mut WorkerLocal,
        rng: &mut SampleRng,
        out: &mut [u8],
        times: &mut [Duration],
    ) -> Result<u64, SampleFailure> {
        let key = entry.key.0;
        let resize = self.spec.cache.as_ref().and_then(|c| c.resize);
        let steps = &self.steps;
        if let Some(hit) = cache.get(key) {
            match &*hit {
                CachedData::Raw(bytes) => {
                    self.compute(bytes, local, rng, out, times, resize).map(|_| ())?;
                }
                CachedData::Decoded(img) => {
                    let t = Instant::now();
                    let resized = match resize {
                        Some(s) => Some(resize_image(img, s, &mut local.scratch).map_err(decode_err)?),
                        None => None,
                    };
                    if let Some(slot) = steps.resize {
                        times[slot] += t.elapsed();
                    }
                    let img = resized.as_ref().unwrap_or(img);
                    self.plan
                        .run_from_image(img, rng, &mut local.scratch, out, &mut times[steps.suffix.clone()])
                        .map_err(decode_err)?;
                }
                CachedData::Resized(img) => {
                    self.plan
                        .run_from_image(img, rng, &mut local.scratch, out, &mut times[steps.suffix.clone()])
                        .map_err(decode_err)?;
                }
            }
            return Ok(0);
        }
        let t0 = Instant::now();
        self.storage
            .read(&self.manifest.root, &entry.location, self.spec.limits.max_file_bytes, &mut local.read_buf)
            .map_err(|k| (Stage::Read, k))?;
        let read_time = t0.elapsed();
        times[0] += read_time;
        let raw = std::mem::take(&mut local.read_buf);
        let result = self.compute(&raw, local, rng, out, times, resize);
        let read_bytes = raw.len() as u64;
        let level = cache.level();
        let computed = match result {
            Ok(c) => c,
            Err(e) => {
                local.read_buf = raw;
                return Err(e);
            }
        };
        cache.observe(&SampleCost {
            read_s: read_time.as_secs_f64(),
            decode_s: computed.decode.as_secs_f64(),
            resize_s: computed.resize.as_secs_f64(),
            raw_bytes: read_bytes,
            decoded_bytes: computed.decoded.as_ref().map_or(0, |i| i.as_bytes().len() as u64),
            resized_bytes: computed
                .resized
                .as_ref()
                .or(computed.decoded.as_ref())
                .map_or(0, |i| i.as_bytes().len() as u64),
        });
        match level {
            Some(CacheLevel::Raw) => {
                cache.offer(key, Arc::new(CachedData::Raw(raw.clone())));
            }
            Some(CacheLevel::Decoded) => {
                if let Some(img) = computed.decoded {
                    cache.offer(key, Arc::new(CachedData::Decoded(img)));
                }
            }
            Some(CacheLevel::Resized) => {
                if let Some(img) = computed.resized.or(computed.decoded) {
                    cache.offer(key, Arc::new(CachedData::Resized(img)));
                }
            }
            Some(CacheLevel::Auto) | None => {}
        }
        local.read_buf = raw;
        Ok(read_bytes)
    }

    /// Encoded bytes to the output slot: the fused plan, or (split path) the prefix, the
    /// optional resize and the suffix, keeping the intermediate images for the cache.
    fn compute(
        &self,
        bytes: &[u8],
        local: &mut WorkerLocal,
        rng: &mut SampleRng,
        out: &mut [u8],
        times: &mut [Duration],
        resize: Option<u32>,
    ) -> Result<Computed, SampleFailure> {
        let steps = &self.steps;
        let t = Instant::now();
        if !self.split {
            self.plan.run(bytes, rng, &mut local.scratch, out, &mut times[steps.prefix.clone()]).map_err(decode_err)?;
            return Ok(Computed { decode: t.elapsed(), resize: Duration::ZERO, decoded: None, resized: None });
        }
        let decoded = self
            .plan
            .run_deterministic_prefix(bytes, &mut local.scratch, &mut times[steps.prefix.clone()])
            .map_err(decode_err)?;
        let decode = t.elapsed();
        let t = Instant::now();
        let resized = match resize {
            Some(s) => Some(resize_image(&decoded, s, &mut local.scratch).map_err(decode_err)?),
            None => None,
        };
        let resize_time = t.elapsed();
        if let Some(slot) = steps.resize {
            times[slot] += resize_time;
        }
        let img = resized.as_ref().unwrap_or(&decoded);
        self.plan
            .run_from_image(img, rng, &mut local.scratch, out, &mut times[steps.suffix.clone()])
            .map_err(decode_err)?;
        Ok(Computed { decode, resize: resize_time, decoded: Some(decoded), resized })
    }
}

/// What [`Shared::compute`] measured and kept.
struct Computed {
    decode: Duration,
    resize: Duration,
    decoded: Option<Image>,
    resized: Option<Image>,
}
