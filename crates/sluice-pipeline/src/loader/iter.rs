//! The consumer side of an epoch: keeps up to `prefetch` batches in flight on the pool,
//! cut into chunks of a few samples, waits for each batch's chunks in order, drops the
//! samples that failed (or fails the batch, by the error policy) and records the
//! loader's position as batches are handed out.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use sluice_core::{Batch, BatchBoxes, BoxTargets, DType, ErrorPolicy, SampleError, Tensor, TensorData};

use super::engine::{Engine, CHUNK};
use super::sample::{ChunkDone, ChunkJob};
use super::slab::Slab;
use super::{batches_for, Loader, Shared};
use crate::error::PipelineError;
use crate::stats::SkippedSample;
use crate::trace::{current_tid, now_ns, Event, What};

/// How often a waiting consumer checks whether it was interrupted.
const POLL: Duration = Duration::from_millis(50);

/// A batch in flight: its buffer, what goes with its images, and the chunks still out.
struct Assembly {
    slab: Arc<Slab>,
    keys: Vec<u64>,
    labels: Vec<i64>,
    weights: Option<Vec<f32>>,
    /// Each slot's boxes, when the source carries boxes.
    boxes: Option<Vec<BoxTargets>>,
    /// Each slot's mask (the output's size), when the source reads masks.
    masks: Option<Vec<Vec<u8>>>,
    chunks_left: usize,
    failures: Vec<(usize, SampleError)>,
    /// When its first job was submitted, if a trace was being recorded then (or build
    /// spans were asked for).
    submitted_ns: Option<u64>,
    /// When its last sample was done, with `submitted_ns`.
    built_ns: Option<u64>,
}

/// The batches of one epoch, in order. Dropping it mid-epoch cancels the work in flight.
pub struct EpochIter {
    shared: Arc<Shared>,
    engine: Engine,
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
    /// The last batch handed out and when, for its `batch_consumed` trace event.
    handed: Option<(u64, u64)>,
    /// Stamp each batch's build span even while no trace is recorded ([`Self::with_build_spans`]).
    spans: bool,
    /// The build span of the last batch handed out, when stamped.
    built: Option<(u64, u64)>,
    /// When the last batch was handed out: the consumer's step starts there.
    handed_at: Option<Instant>,
}

/// Memory to build a batch's images in, asked for each batch with its dtype and element
/// count: e.g. a service worker's shared memory, so the batch is made where the client
/// reads it. `None` (or a tensor that does not fit): the loader's own memory.
pub type BufferSource = Arc<dyn Fn(DType, usize) -> Option<Tensor> + Send + Sync>;

impl EpochIter {
    /// The batches `start..` of `epoch` in `order`; `generation` ties it to the loader's
    /// position, `None` leaves it standing apart (a task).
    pub(super) fn new(
        loader: &Loader,
        epoch: u64,
        start: u64,
        generation: Option<u64>,
        order: Arc<Vec<u32>>,
        weights: Option<Arc<Vec<f32>>>,
    ) -> Self {
        let n_batches = {
            let b = loader.shared.data.spec.batch;
            batches_for(order.len(), b.size, b.drop_last) as u64
        };
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        Self {
            shared: loader.shared.clone(),
            engine: loader.engine.clone(),
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
            handed: None,
            spans: false,
            built: None,
            handed_at: None,
        }
    }

    /// Stops after batch `end` (clamped to the epoch): nothing past it is prefetched.
    pub(super) fn end_at(mut self, end: u64) -> Self {
        self.n_batches = self.n_batches.min(end);
        self
    }

    /// Builds the batches in memory from `source` where it has some.
    pub fn with_buffers(mut self, source: BufferSource) -> Self {
        self.buffers = Some(source);
        self
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Stamps each batch's build span (first job submitted to last sample done), read
    /// with [`Self::built_span`]: two clock reads per batch. A service worker asks for it
    /// when its client traces.
    pub fn with_build_spans(mut self) -> Self {
        self.spans = true;
        self
    }

    /// The build span of the batch last handed out, `CLOCK_MONOTONIC` ns (start, end), when
    /// stamped: with [`Self::with_build_spans`] or while a trace is being recorded.
    pub fn built_span(&self) -> Option<(u64, u64)> {
        self.built
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
        let window = self.engine.prefetch_depth() as u64;
        while self.next_submit < self.n_batches && self.next_submit < self.next_emit + window {
            self.submit_batch(self.next_submit);
            self.next_submit += 1;
        }
    }

    fn submit_batch(&mut self, b: u64) {
        let bs = self.shared.data.spec.batch.size;
        let start = b as usize * bs;
        let end = (start + bs).min(self.order.len());
        let indices = &self.order[start..end];
        self.read_ahead(indices);
        let n = indices.len() * self.shared.data.sample_shape.iter().product::<usize>();
        let spare = match &self.buffers {
            Some(source) => source(self.shared.data.dtype, n),
            None => None,
        };
        let slab = Arc::new(self.shared.observers.slab(
            self.shared.data.dtype,
            indices.len(),
            self.shared.data.sample_shape,
            spare,
        ));
        let labels = self.shared.data.manifest.labels();
        let keys = indices.iter().map(|&i| u64::from(i)).collect();
        let labels = indices.iter().map(|&i| labels[i as usize]).collect();
        let weights = self.weights.as_ref().map(|w| w[start..end].to_vec());
        let chunks = indices.len().div_ceil(CHUNK);
        let submitted_ns = (self.spans || self.shared.observers.trace.is_on()).then(now_ns);
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
            self.engine.pool.submit(Box::new(move |local| job.run(local)));
        }
        self.pending.insert(
            b,
            Assembly {
                slab,
                keys,
                labels,
                weights,
                boxes: self.shared.data.manifest.has_boxes().then(|| vec![BoxTargets::default(); indices.len()]),
                masks: self.shared.data.manifest.masks.is_some().then(|| vec![Vec::new(); indices.len()]),
                chunks_left: chunks,
                failures: Vec::new(),
                submitted_ns,
                built_ns: None,
            },
        );
    }

    /// Names the batch's samples to the storage, which may start reading them now (object
    /// storage does): all but those a cache holds, and none when peers serve samples or
    /// no sample is remote.
    fn read_ahead(&self, indices: &[u32]) {
        if !self.shared.data.remote_samples || self.shared.peering.locality.is_some() {
            return;
        }
        let data = &self.shared.data;
        let cache = self.shared.priority.cache.as_deref();
        let wanted: Vec<_> = indices
            .iter()
            .map(|&i| data.manifest.at(i as usize))
            .filter(|e| cache.is_none_or(|c| !c.contains(e.key.0)))
            .map(|e| (e.location, e.size))
            .collect();
        data.storage.read_ahead(&data.manifest.root, &wanted, data.spec.limits.max_file_bytes);
    }

    fn finish(&mut self) {
        self.finished = true;
        self.cancel.store(true, Ordering::SeqCst);
        self.pending.clear();
    }

    fn is_current(&self) -> bool {
        self.generation.is_none_or(|g| self.shared.position.progress.lock().generation == g)
    }

    /// Blocks until batch `b` is complete, folding in whatever other chunks finish first;
    /// returns how long it waited. Asks `interrupted` every [`POLL`] while waiting and
    /// gives up if it says so.
    fn wait_for(&mut self, b: u64, interrupted: &mut dyn FnMut() -> bool) -> Result<Duration, PipelineError> {
        let mut total = Duration::ZERO;
        loop {
            if self.pending.get(&b).is_none_or(|a| a.chunks_left == 0) {
                return Ok(total);
            }
            let t0 = Instant::now();
            let done = match self.done_rx.recv_timeout(POLL) {
                Ok(done) => done,
                Err(_) => {
                    total += t0.elapsed();
                    self.shared.observers.stats.lock().add_wait(t0.elapsed());
                    if interrupted() {
                        return Err(PipelineError::Interrupted);
                    }
                    continue;
                }
            };
            let waited = t0.elapsed();
            total += waited;
            self.absorb(done, waited);
        }
    }

    /// Batches ready in order from the next one out, after taking in every chunk already
    /// done (without waiting): what the consumer finds when it asks.
    fn ready_in_order(&mut self) -> usize {
        while let Ok(done) = self.done_rx.try_recv() {
            self.absorb(done, Duration::ZERO);
        }
        (self.next_emit..self.next_submit)
            .take_while(|b| self.pending.get(b).is_some_and(|a| a.chunks_left == 0))
            .count()
    }

    /// A chunk came back after the consumer waited `waited` for it.
    fn absorb(&mut self, done: ChunkDone, waited: Duration) {
        self.shared.observers.fold(waited, &done.work);
        let Some(a) = self.pending.get_mut(&done.batch) else { return };
        a.chunks_left -= 1;
        a.failures.extend(done.failures);
        if let Some(slots) = a.boxes.as_mut() {
            for (slot, t) in done.boxes {
                if let Some(s) = slots.get_mut(slot) {
                    *s = t;
                }
            }
        }
        if let Some(slots) = a.masks.as_mut() {
            for (slot, m) in done.masks {
                if let Some(s) = slots.get_mut(slot) {
                    *s = m;
                }
            }
        }
        if let (0, Some(start_ns)) = (a.chunks_left, a.submitted_ns) {
            let end_ns = now_ns();
            a.built_ns = Some(end_ns);
            if let Some(recorder) = self.shared.observers.trace.current() {
                recorder.record(self.batch_event(done.batch, start_ns, end_ns, What::BatchPreprocessed));
            }
        }
    }

    fn assemble(&mut self, b: u64) -> Option<Result<Batch, PipelineError>> {
        let mut a = self.pending.remove(&b)?;
        self.built = a.submitted_ns.zip(a.built_ns);
        a.failures.sort_by_key(|f| f.0);
        if let Some((_, first)) = a.failures.first() {
            if self.shared.data.spec.on_error == ErrorPolicy::Fail {
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
        let mut boxes = a.boxes;
        let mut masks = a.masks;
        if !a.failures.is_empty() {
            let mut stats = self.shared.observers.stats.lock();
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
                    if let Some(b) = boxes.as_mut() {
                        b.swap(kept, slot);
                    }
                    if let Some(m) = masks.as_mut() {
                        m.swap(kept, slot);
                    }
                }
                kept += 1;
            }
            keys.truncate(kept);
            labels.truncate(kept);
            if let Some(w) = weights.as_mut() {
                w.truncate(kept);
            }
            if let Some(b) = boxes.as_mut() {
                b.truncate(kept);
            }
            if let Some(m) = masks.as_mut() {
                m.truncate(kept);
            }
            images.truncate_rows(kept);
        }
        let (w, h) = self.shared.data.plan.output_size();
        let boxes = boxes.map(|b| {
            let mut padded = BatchBoxes::pad(&b);
            padded.masks = masks
                .map(|m| Tensor { shape: vec![m.len(), h as usize, w as usize], data: TensorData::U8(m.concat()) });
            Box::new(padded)
        });
        let layout = self.shared.data.layout;
        // Keys are manifest positions: each kept sample's fields are its row of the table.
        let fields = self.shared.data.manifest.fields.as_ref().map(|t| Box::new(t.gather(&keys)));
        Some(Ok(Batch { epoch: self.epoch, index: b, keys, labels, images, layout, weights, boxes, fields }))
    }

    /// A batch-level trace event on the calling (consumer's) thread.
    fn batch_event(&self, batch: u64, start_ns: u64, end_ns: u64, what: What) -> Event {
        Event {
            start_ns,
            dur_ns: end_ns.saturating_sub(start_ns),
            key: 0,
            batch,
            epoch: self.epoch,
            tid: current_tid(),
            what,
        }
    }

    fn record_progress(&self, batches_done: u64) {
        let Some(generation) = self.generation else { return };
        let mut p = self.shared.position.progress.lock();
        if p.generation != generation {
            return;
        }
        if batches_done >= self.n_batches {
            p.epoch = self.epoch.saturating_add(1);
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
        let recorder = self.shared.observers.trace.current();
        let asked_ns = recorder.as_ref().map(|_| now_ns());
        let computed = self.handed_at.take().map(|t| t.elapsed());
        if let (Some(recorder), Some(now), Some((batch, handed_ns))) = (&recorder, asked_ns, self.handed.take()) {
            recorder.record(self.batch_event(batch, handed_ns, now, What::BatchConsumed));
        }
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
            let ready = self.ready_in_order();
            // At an epoch's start nothing was in flight yet: an empty buffer says nothing
            // of the producers' pace.
            if self.next_submit > self.next_emit {
                self.engine.prefetch_consumed(ready);
            }
            self.submit_ahead();
            let b = self.next_emit;
            let waited = match self.wait_for(b, interrupted) {
                Ok(waited) => waited,
                Err(e) => return Some(Err(e)),
            };
            let result = self.assemble(b);
            self.next_emit += 1;
            match result {
                Some(Ok(batch)) if batch.is_empty() => {
                    // Every sample of this batch was skipped: nothing to hand out.
                    self.record_progress(self.next_emit);
                }
                Some(Ok(batch)) => {
                    self.record_progress(self.next_emit);
                    if let (Some(recorder), Some(asked_ns)) = (&recorder, asked_ns) {
                        let now = now_ns();
                        recorder.record(self.batch_event(b, asked_ns, now, What::BatchWait));
                        recorder.record(self.batch_event(b, now, now, What::BatchHandedOver));
                        self.handed = Some((b, now));
                    }
                    let ready = self.pending.values().filter(|a| a.chunks_left == 0).count();
                    self.engine.batch_done(batch.len(), waited, ready);
                    if let Some(computed) = computed {
                        self.engine.step_done(computed, waited);
                    }
                    self.handed_at = Some(Instant::now());
                    // The slot it leaves goes to the next batch now, not when the
                    // consumer comes back: the whole depth is built while it computes.
                    self.submit_ahead();
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
