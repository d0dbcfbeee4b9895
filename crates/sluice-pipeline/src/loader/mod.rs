//! The loader: runs a pipeline spec over its manifest on the worker pool and hands out
//! batches in epoch order, with bounded prefetch, exact checkpoints and per-op stats.
//!
//! Work is cut into chunks of a few samples. Workers write each sample straight into its
//! slot of the batch's one contiguous buffer, so a batch is assembled without copies; the
//! consumer only waits for its chunks to finish. At most `prefetch` batches are in flight,
//! which bounds memory by `prefetch × batch bytes` (plus the batches the consumer still
//! holds), whatever the dataset size.
//!
//! With a cache ([`crate::cache`]) each sample is looked up by key first. Every sample then
//! goes through the same split path whether it hit or missed: the deterministic prefix
//! (skipped when the hit holds pixels), the optional cache resize, then the random ops,
//! so pixels never depend on timing. Only a cache of raw bytes with no resize keeps the
//! fused decode+crop path. The epoch order comes from the importance store
//! ([`crate::importance`]), which the trainer feeds through [`Loader::report`].
//!
//! Here: the loader API and the epoch draw. `checkpoint`: saving and restoring position.
//! `iter`: prefetch and batch assembly. `sample`: one chunk of samples on a worker.
//! `slab`: the batch buffer the workers write into.

mod autoscale;
mod checkpoint;
mod engine;
mod iter;
mod peers;
mod prefetch;
mod sample;
mod slab;

pub use autoscale::{auto_threads_config, Perturb};
pub use checkpoint::{LoaderState, LocalityOrder, OrderSpec};
pub use engine::{BatchRunner, BytesJob, Engine, JobBytes, PendingBatch, RanBatch, RunError};
pub use iter::{BufferSource, EpochIter};
pub use peers::LocalityStats;
pub use prefetch::PrefetchStats;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sluice_autoscale::AutoscaleConfig;
use sluice_codec::{IndexStore, Plan};
use sluice_core::{ByteBudget, CacheLevel, DType, Layout, Manifest, PipelineSpec, SamplingSpec, Tensor};

use crate::cache::{share_key, shared_in_process, total_ram_bytes, Cache, DiskTier};
use crate::error::PipelineError;
use crate::importance::{checked_report, DrawInputs, ImportanceState, ImportanceStore, ReportCounts};
use crate::locality::peer::{PeerClient, PeerServer};
use crate::locality::Locality;
use crate::sampler::{epoch_order, EpochDraw, MixPlan, Shard};
use crate::source::build_pipeline_manifest;
use crate::stats::StatsSnapshot;
use crate::storage::{any_remote, open_storage, open_storage_in, ReadAheadStats, Roots, Storage};
use crate::trace::TraceData;

struct Progress {
    epoch: u64,
    batch: u64,
    /// Bumped whenever a new iterator starts, so an older one stops handing out batches.
    generation: u64,
}

/// An epoch, its order and its weights.
type TaskDraw = (u64, Arc<Vec<u32>>, Option<Arc<Vec<f32>>>);

/// What the loader's consumer side and its worker jobs share, in four parts.
struct Shared {
    /// What the data is and how each sample is made.
    data: Data,
    /// The engine's stats, trace, counters, autoscaler and recycled buffers.
    observers: Arc<engine::Observers>,
    /// Where the loader stands in its epochs.
    position: Position,
    /// What the trainer's reports steer: the epoch order and what the cache keeps.
    priority: Priority,
    /// The other learners of a job with a `locality` section.
    peering: Peering,
}

/// The dataset, where it is read from, and the plan that turns a file into a sample.
struct Data {
    spec: PipelineSpec,
    manifest: Manifest,
    storage: Arc<dyn Storage>,
    plan: Plan,
    /// The entropy indexes of the dataset's JPEGs, made as they are first cropped
    /// (`decode.entropy_index`), which the plan's fused crops cut with.
    index: Option<Arc<IndexStore>>,
    shard: Shard,
    sample_shape: [usize; 3],
    dtype: DType,
    layout: Layout,
    /// Run every sample through prefix → (resize) → suffix rather than the fused plan.
    split: bool,
    /// Where the split path's step timings go in the stats' op list.
    steps: StepSlots,
    /// The sources and weights of a mixed source (`kind = "mix"`).
    mix: Option<MixPlan>,
    /// Some sample lives in object storage: batches are named to the storage's read-ahead
    /// (a local dataset skips that per-sample work).
    remote_samples: bool,
}

struct Position {
    progress: Mutex<Progress>,
    /// Epoch orders drawn for task iterators ([`Loader::iter_range`]), newest last.
    task_draws: Mutex<Vec<TaskDraw>>,
    /// A mix's weights for one epoch, when they differ from the spec's: a checkpoint taken
    /// mid-epoch under other weights finishes that epoch with them.
    mix_weights: Mutex<Option<(u64, Vec<f64>)>>,
}

struct Priority {
    /// Shared with other loaders of the same pipeline when built by
    /// [`Loader::with_shared_cache`].
    cache: Option<Arc<Cache>>,
    importance: Mutex<ImportanceStore>,
}

struct Peering {
    /// How this rank's share of each global batch is chosen, with a `locality` section.
    locality: Option<Locality>,
    /// Connections to the other learners' peer servers (collaborative cache).
    peers: Option<PeerClient>,
    counters: peers::Counters,
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
    engine: Engine,
    /// Serves the samples placed on this learner to its peers, while the loader lives
    /// ([`Loader::serve_peers`]).
    peer_server: Option<PeerServer>,
}

impl Loader {
    /// Enumerates the source and prepares the pipeline; no sample is read yet.
    pub fn new(spec: PipelineSpec, shard: Shard) -> Result<Self, PipelineError> {
        spec.validate()?;
        let manifest = build_pipeline_manifest(&spec)?;
        Self::with_manifest(spec, manifest, shard)
    }

    /// As [`Loader::new`], over a manifest built elsewhere (e.g. shared by a service).
    pub fn with_manifest(spec: PipelineSpec, manifest: Manifest, shard: Shard) -> Result<Self, PipelineError> {
        spec.validate()?;
        if !spec.fields.is_empty() && manifest.fields.is_none() {
            return Err(PipelineError::ManifestWithoutFields);
        }
        let cache = match &spec.cache {
            None => None,
            Some(c) => {
                let key = share_key(&spec, &manifest);
                let make = || -> Result<Arc<Cache>, PipelineError> {
                    let budget = match c.budget {
                        ByteBudget::Bytes(b) => b,
                        ByteBudget::RamFraction(_) => {
                            c.budget.resolve(total_ram_bytes().ok_or(PipelineError::RamUnknown)?)
                        }
                    };
                    let mut cache = Cache::new(c, budget, manifest.len());
                    if let Some(disk) = &c.disk {
                        cache = cache.with_disk(DiskTier::open(disk, key)?);
                    }
                    Ok(Arc::new(cache))
                };
                Some(if c.share { shared_in_process(key, make)? } else { make()? })
            }
        };
        Self::build(spec, manifest, shard, cache)?.serving_peers()
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
        if !spec.fields.is_empty() && manifest.fields.is_none() {
            return Err(PipelineError::ManifestWithoutFields);
        }
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
        Self::build(spec, manifest, shard, Some(cache))?.serving_peers()
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
        let index = spec.decode.entropy_index.then(|| {
            let store = IndexStore::new(spec.decode.index_spacing, spec.decode.index_budget_bytes());
            Arc::new(store.with_dir(spec.index_dir()))
        });
        let plan = Plan::compile(&spec.ops, spec.limits).with_index(index.clone());
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
        let mix = MixPlan::of(&spec.source, &manifest)?;
        let locality = match &spec.locality {
            Some(l) => Some(Locality::new(l, manifest.len(), spec.seed, shard, spec.batch.size)?),
            None => None,
        };
        // Up to `prefetch` batches in flight, one being built, and the one handed out.
        let max_depth = spec.prefetch_max_depth(batch_bytes.unwrap_or(0) as u64);
        let engine = Engine::new(names, spec.threads, spec.batch.size, max_depth + 2)?;
        engine.set_prefetch(if spec.prefetch_is_auto() {
            prefetch::PrefetchTuner::auto(max_depth)
        } else {
            prefetch::PrefetchTuner::fixed(spec.prefetch)
        });
        let peers = match spec.locality.as_ref().filter(|l| !l.peers.is_empty() && locality.is_some()) {
            Some(l) => Some(PeerClient::new(
                l.peers.clone(),
                crate::locality::peer::token(l)?,
                Duration::from_millis(l.peer_timeout_ms),
                spec.limits,
            )),
            None => None,
        };
        let shared = Arc::new(Shared {
            observers: Arc::clone(&engine.observers),
            position: Position {
                progress: Mutex::new(Progress { epoch: 0, batch: 0, generation: 0 }),
                task_draws: Mutex::new(Vec::new()),
                mix_weights: Mutex::new(None),
            },
            priority: Priority { cache, importance: Mutex::new(ImportanceStore::new(spec.importance.ema)) },
            peering: Peering { locality, peers, counters: peers::Counters::default() },
            data: Data {
                storage: open_storage(&spec.storage)?,
                sample_shape: plan.output_shape(),
                dtype,
                layout,
                split,
                steps,
                plan,
                index,
                remote_samples: any_remote(&manifest),
                manifest,
                shard,
                spec,
                mix,
            },
        });
        Ok(Self { shared, engine, peer_server: None })
    }

    fn serving_peers(mut self) -> Result<Self, PipelineError> {
        self.serve_peers()?;
        Ok(self)
    }

    /// Starts this learner's peer server, when the spec's `locality` section lists peers
    /// (the constructors do, once the loader is built): it serves the samples placed on
    /// this learner to the others while the loader lives. Returns whether one runs.
    pub fn serve_peers(&mut self) -> Result<bool, PipelineError> {
        if self.peer_server.is_none() {
            self.peer_server = peers::start_server(&self.shared)?;
        }
        Ok(self.peer_server.is_some())
    }

    /// Confines every read beneath `roots` (a service's allowed roots): each file is opened
    /// relative to the root it lies under and may not resolve out of it, so a file swapped
    /// for a symlink after the job's paths were checked is refused, not read. Call it
    /// before iterating.
    pub fn confine_reads(self, roots: &[PathBuf]) -> Result<Self, PipelineError> {
        let storage = open_storage_in(&self.shared.data.spec.storage, Some(Arc::new(Roots::open(roots)?)))?;
        self.replace_storage(storage)
    }

    /// Reads through `storage` instead of the one the spec names: possible only before the
    /// loader hands out work, while nothing else shares its state.
    fn replace_storage(mut self, storage: Arc<dyn Storage>) -> Result<Self, PipelineError> {
        let shared = Arc::get_mut(&mut self.shared).ok_or(PipelineError::AlreadyStarted)?;
        shared.data.storage = storage;
        Ok(self)
    }

    /// The cache, to share with another loader of the same pipeline
    /// ([`Loader::with_shared_cache`]); `None` without a cache section.
    pub fn cache(&self) -> Option<Arc<Cache>> {
        self.shared.priority.cache.clone()
    }

    /// This learner's view of a multi-learner job (placement and assignment), with a
    /// `locality` section.
    pub fn locality(&self) -> Option<&Locality> {
        self.shared.peering.locality.as_ref()
    }

    /// Where this learner's samples came from (peers, storage), with a `locality` section.
    pub fn locality_stats(&self) -> Option<LocalityStats> {
        self.shared.peering.locality.as_ref().map(|_| self.shared.peering.counters.snapshot())
    }

    pub fn manifest(&self) -> &Manifest {
        &self.shared.data.manifest
    }

    pub fn spec(&self) -> &PipelineSpec {
        &self.shared.data.spec
    }

    /// Samples this rank sees per epoch (of the current one, for a mix whose weights a
    /// checkpoint changed for it).
    pub fn samples_per_epoch(&self) -> usize {
        let data = &self.shared.data;
        let epoch = self.shared.position.progress.lock().epoch;
        match self.mix_plan(epoch) {
            Some(plan) => plan.batches(self.global_batch()) * data.spec.batch.size,
            None => data.manifest.len() / data.shard.world_size,
        }
    }

    /// Samples in one step of the whole job: every rank's batch.
    fn global_batch(&self) -> usize {
        self.shared.data.spec.batch.size.saturating_mul(self.shared.data.shard.world_size)
    }

    /// A mixed source's sources and the weights `epoch` is drawn with.
    fn mix_plan(&self, epoch: u64) -> Option<MixPlan> {
        let mut plan = self.shared.data.mix.clone()?;
        if let Some((e, weights)) = &*self.shared.position.mix_weights.lock() {
            if *e == epoch {
                plan.weights = weights.clone();
            }
        }
        Some(plan)
    }

    /// Batches per epoch for this rank (the short last batch counts unless `drop_last`).
    pub fn batches_per_epoch(&self) -> u64 {
        batches_for(self.samples_per_epoch(), self.shared.data.spec.batch.size, self.shared.data.spec.batch.drop_last)
            as u64
    }

    pub fn threads(&self) -> usize {
        self.engine.threads()
    }

    /// The engine the batches are built on: its pool, stats, trace and autoscaler.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Takes back the image buffer of a batch whose pixels the consumer no longer needs
    /// (a service worker, once it has sent them): a later batch is built in it instead of
    /// in fresh memory, which the allocator would zero, or the kernel fault in, each time.
    /// Keeps as many as the prefetch window can use.
    pub fn recycle(&self, images: Tensor) {
        self.engine.recycle(images);
    }

    /// Most batches this loader keeps in flight: `prefetch`, or for `prefetch = "auto"`
    /// what its memory bound holds.
    pub fn prefetch_max_depth(&self) -> usize {
        self.shared.data.spec.prefetch_max_depth(self.batch_bytes() as u64)
    }

    /// Bytes of a full batch's images: the most any batch of this loader carries.
    pub fn batch_bytes(&self) -> usize {
        // Cannot wrap: `build` checked it.
        self.shared.data.spec.batch.size * self.shared.data.plan.output_bytes()
    }

    /// Resizes the worker pool while it runs.
    pub fn set_threads(&self, threads: usize) {
        self.engine.set_threads(threads);
    }

    /// Lets `config`'s policy size the worker pool from here on, deciding on the batches
    /// this loader hands out (what `threads = "auto"` turns on, with
    /// [`auto_threads_config`]). Each decision is logged and listed in [`Loader::stats`].
    pub fn autoscale(&self, config: AutoscaleConfig) -> Result<(), PipelineError> {
        self.engine.autoscale(config)
    }

    /// The trainer's own reading of its accelerator's busy fraction (0..=1, e.g.
    /// `torch.cuda.utilization() / 100`, or device time per step over step time): shown in
    /// [`Loader::stats`] (`accelerator`) and read by the autoscaler's policy in place of
    /// the step timing the loader measures itself, while fresh (10 s). NaN is ignored;
    /// other values are clamped to 0..=1.
    pub fn report_accelerator_busy(&self, fraction: f64) {
        self.engine.report_accelerator_busy(fraction);
    }

    /// As [`Loader::autoscale`], with each window's readings passed through `perturb`
    /// before the policy sees them: how `sluice-bench autoscale` injects noise.
    pub fn autoscale_perturbed(&self, config: AutoscaleConfig, perturb: Perturb) -> Result<(), PipelineError> {
        self.engine.autoscale_perturbed(config, perturb)
    }

    /// Starts `epoch` from its first batch at the next [`Loader::iter`].
    pub fn set_epoch(&self, epoch: u64) {
        let mut p = self.shared.position.progress.lock();
        p.epoch = epoch;
        p.batch = 0;
        p.generation += 1;
    }

    /// Starts recording profiling events: per sample and op, per cache lookup, per batch
    /// (see [`crate::trace`]). Fails if a trace is already being recorded.
    pub fn start_trace(&self) -> Result<(), PipelineError> {
        self.engine.start_trace()
    }

    /// Stops recording and returns the events, to write with [`TraceData::write`]; `None`
    /// if no trace was being recorded.
    pub fn stop_trace(&self) -> Option<TraceData> {
        self.engine.stop_trace()
    }

    /// The events recorded since the trace started or was last drained, leaving it
    /// recording: a long-running loader (a service worker's) writes its trace in parts.
    /// `None` if no trace is being recorded.
    pub fn drain_trace(&self) -> Option<TraceData> {
        self.engine.drain_trace()
    }

    /// Turns per-op CPU counters on or off (see [`crate::counters`]): each worker thread
    /// opens its counters on its next chunk and reads them at every op boundary; the
    /// totals appear in [`StatsSnapshot::op_counters`]. Off (the default) costs nothing.
    pub fn set_op_counters(&self, on: bool) {
        self.engine.set_op_counters(on);
    }

    pub fn stats(&self) -> StatsSnapshot {
        let mut s = self.engine.stats();
        s.cache = self.shared.priority.cache.as_deref().map(Cache::stats);
        s.entropy_index = self.shared.data.index.as_deref().map(IndexStore::stats);
        s.read_ahead = self.shared.data.storage.read_ahead_stats().filter(|r| *r != ReadAheadStats::default());
        s
    }

    /// The trainer's per-sample values for `keys`: losses, or per-sample gradient norms
    /// (FastMatch's `update_gradient_info`). They shape the epochs after the current one
    /// and the cache's priorities. NaN, infinite or negative values are refused, finite ones
    /// above [`crate::importance::MAX_IMPORTANCE`] clamped to it; the counts are returned
    /// and added up in [`StatsSnapshot::importance_reports`].
    ///
    /// With several ranks (DDP), the epoch order is drawn from the reports, and every rank
    /// must draw the same one for the shards to stay disjoint: so every rank reports every
    /// rank's values, in the same order (gather them, e.g. `all_gather`, and report each
    /// rank's in rank order), before the next epoch starts.
    pub fn report(&self, keys: &[u64], values: &[f64]) -> Result<ReportCounts, PipelineError> {
        if keys.len() != values.len() {
            return Err(PipelineError::ReportLengths { keys: keys.len(), values: values.len() });
        }
        let (keys, values, counts) = checked_report(keys, values);
        if counts.refused + counts.clamped > 0 {
            tracing::warn!(
                refused = counts.refused,
                clamped = counts.clamped,
                "importance report: refused NaN, infinite or negative values, clamped huge ones"
            );
        }
        self.shared.priority.importance.lock().report(&keys, &values);
        self.shared.observers.stats.lock().add_importance_report(counts);
        if let Some(cache) = &self.shared.priority.cache {
            cache.report(&keys, &values);
        }
        Ok(counts)
    }

    /// The importance state (smoothed scores, pending reports, coverage bookkeeping).
    pub fn importance_state(&self) -> ImportanceState {
        self.shared.priority.importance.lock().state()
    }

    /// Draws the order (and weights) of `epoch` from the importance state and hands the
    /// cache its priorities for the epoch.
    /// `consumed`: samples of the epoch already delivered (a resumed epoch).
    fn draw_epoch(&self, epoch: u64, consumed: usize) -> crate::sampler::EpochDraw {
        let shared = &self.shared;
        if let Some(plan) = self.mix_plan(epoch) {
            let order = plan.order(self.global_batch(), shared.data.spec.seed, epoch, shared.data.spec.shuffle);
            let mut expected = vec![0.0; shared.data.manifest.len()];
            order.iter().for_each(|&i| expected[i as usize] = 1.0);
            let draw = EpochDraw { order, weights: None, expected }.shard(shared.data.shard);
            if let Some(cache) = &shared.priority.cache {
                cache.set_priorities_for(&draw, &shared.priority.importance.lock(), &shared.data.manifest);
                if cache.disk().is_some() {
                    self.tell_future(cache, epoch, &draw, consumed);
                }
            }
            return draw;
        }
        // A rank's cache sees only its own shard, so its size in entries differs from rank to
        // rank; the draw, which must be the same on every rank, then ignores the cache.
        let hot = match shared.data.shard.world_size {
            1 => shared.priority.cache.as_deref().and_then(Cache::capacity_entries),
            _ => None,
        };
        let inputs = DrawInputs {
            manifest: &shared.data.manifest,
            seed: shared.data.spec.seed,
            shuffle: shared.data.spec.shuffle,
            sampling: shared.data.spec.sampling,
            shard: shared.data.shard,
            locality: shared.peering.locality.as_ref(),
        };
        let mut store = shared.priority.importance.lock();
        let draw = store.draw(epoch, hot, &inputs);
        if let Some(cache) = &shared.priority.cache {
            cache.set_priorities_for(&draw, &store, &shared.data.manifest);
            if cache.disk().is_some() {
                self.tell_future(cache, epoch, &draw, consumed);
            }
        }
        draw
    }

    /// Hands the disk tier the order of the rest of `epoch` and, when it is known from the
    /// seed alone (uniform sampling without locality), of the next epoch too: Belady's rule
    /// then keeps, across the epoch boundary, what the next epoch needs first. `consumed`
    /// samples of `draw` were looked up already (a resumed epoch).
    fn tell_future(&self, cache: &Cache, epoch: u64, draw: &EpochDraw, consumed: usize) {
        let data = &self.shared.data;
        let key = |&p: &u32| ((p as usize) < data.manifest.len()).then_some(u64::from(p));
        let mut keys: Vec<u64> = draw.order.iter().skip(consumed).filter_map(key).collect();
        if data.spec.sampling == SamplingSpec::Uniform && data.mix.is_none() && self.shared.peering.locality.is_none() {
            let next = epoch_order(data.manifest.len(), data.spec.seed, epoch + 1, data.spec.shuffle, data.shard);
            keys.extend(next.iter().filter_map(key));
        }
        let importance = match data.spec.sampling {
            SamplingSpec::Uniform => std::collections::HashMap::new(),
            _ => data.manifest.entries().zip(&draw.expected).map(|(e, &x)| (e.key.0, x)).collect(),
        };
        cache.set_future(keys, importance);
    }

    /// For one of `count` processes that make the batches `i % count == index` of an epoch
    /// over an order drawn elsewhere ([`Loader::iter_draw`]; the Python loader's `map`
    /// worker processes): hands this loader's disk tier the keys those batches look up, from
    /// batch `first` on, and those of its batches of the next epoch when the seed alone
    /// decides that one, as [`Loader::iter`] tells its own tier. The expected draws of a
    /// non-uniform sampling stay with the process that drew the order: every key ranks alike
    /// beyond the horizon. Without a disk tier, nothing to do.
    pub fn tell_future_of_share(&self, epoch: u64, order: &[u32], first: u64, index: u64, count: u64) {
        let Some(cache) = &self.shared.priority.cache else { return };
        if cache.disk().is_none() {
            return;
        }
        let data = &self.shared.data;
        let b = data.spec.batch;
        let count = count.max(1);
        let samples = data.manifest.len();
        let mine = |order: &[u32], from: u64| -> Vec<u64> {
            let batches = batches_for(order.len(), b.size, b.drop_last);
            (from as usize..batches)
                .filter(|&i| i as u64 % count == index)
                .flat_map(|i| order[i * b.size..((i + 1) * b.size).min(order.len())].iter())
                .filter(|&&p| (p as usize) < samples)
                .map(|&p| u64::from(p))
                .collect()
        };
        let mut keys = mine(order, first);
        if data.spec.sampling == SamplingSpec::Uniform && data.mix.is_none() && self.shared.peering.locality.is_none() {
            let next = epoch_order(samples, data.spec.seed, epoch + 1, data.spec.shuffle, data.shard);
            keys.extend(mine(&next, 0));
        }
        cache.set_future(keys, std::collections::HashMap::new());
    }

    /// Iterates the rest of the current epoch (all of it, unless resuming). When the epoch
    /// ends the loader moves on to the next one, so calling `iter` again starts it. Starting
    /// a new iterator retires any older one.
    pub fn iter(&self) -> EpochIter {
        let (epoch, start, generation) = {
            let mut p = self.shared.position.progress.lock();
            p.generation += 1;
            (p.epoch, p.batch, p.generation)
        };
        let consumed = usize::try_from(start).unwrap_or(usize::MAX).saturating_mul(self.shared.data.spec.batch.size);
        let draw = self.draw_epoch(epoch, consumed);
        EpochIter::new(self, epoch, start, Some(generation), Arc::new(draw.order), draw.weights.map(Arc::new))
    }

    /// Iterates only batches `start..end` of `epoch` (clamped to the epoch): one task of a
    /// distributed epoch, as a service worker runs it. Nothing past `end` is prefetched.
    /// Task iterators stand apart from the loader's own position: they neither retire nor
    /// are retired by other iterators and leave [`Loader::state`] alone, so several tasks
    /// can share the pool at once (the next task's samples fill the threads while the
    /// last one's finish). Each epoch's order is drawn once, for all its tasks.
    pub fn iter_range(&self, epoch: u64, start: u64, end: u64) -> EpochIter {
        let (order, weights) = self.epoch_draw(epoch);
        EpochIter::new(self, epoch, start, None, order, weights).end_at(end)
    }

    /// As [`Loader::iter_range`], over an epoch drawn elsewhere: `order` (manifest
    /// positions) and its `weights`, e.g. by a service dispatcher that owns the job's
    /// importance store. The caller checks that every position is in the manifest.
    pub fn iter_draw(
        &self,
        epoch: u64,
        start: u64,
        end: u64,
        order: Arc<Vec<u32>>,
        weights: Option<Arc<Vec<f32>>>,
    ) -> EpochIter {
        EpochIter::new(self, epoch, start, None, order, weights).end_at(end)
    }

    /// The order and weights of `epoch` for [`Loader::iter_range`], drawn on first use
    /// from this loader's importance state. The last two epochs are kept: a service client
    /// reads ahead into the next epoch while the current one finishes, and the `map`
    /// worker processes of the Python loader run the parent's draw with
    /// [`Loader::iter_draw`].
    pub fn epoch_draw(&self, epoch: u64) -> (Arc<Vec<u32>>, Option<Arc<Vec<f32>>>) {
        let mut draws = self.shared.position.task_draws.lock();
        if let Some((_, order, weights)) = draws.iter().find(|d| d.0 == epoch) {
            return (order.clone(), weights.clone());
        }
        let draw = self.draw_epoch(epoch, 0);
        let (order, weights) = (Arc::new(draw.order), draw.weights.map(Arc::new));
        if draws.len() == 2 {
            draws.remove(0);
        }
        draws.push((epoch, order.clone(), weights.clone()));
        (order, weights)
    }
}

fn batches_for(samples: usize, b: usize, drop_last: bool) -> usize {
    if drop_last {
        samples / b
    } else {
        samples.div_ceil(b)
    }
}
