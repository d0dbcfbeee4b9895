//! One chunk of a batch on a worker thread: each sample read (or looked up in the cache),
//! decoded and augmented straight into its slot of the batch buffer, and failures and
//! panics turned into per-sample errors, so the consumer always hears back.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use sluice_codec::{decode_png_mask, move_boxes, resize_mask, CodecError, Motion, Records, SampleInfo, Scratch};
use sluice_core::{
    Annotation, BoxTargets, CacheLevel, Image, LocationRef, Mask, MaskSource, Pixels, SampleError, SampleErrorKind,
    SampleKey, SampleRng, Stage,
};

use super::engine::{panic_message, probe, ChunkMeter, ChunkWork};
use super::slab::Slab;
use super::Shared;
use crate::cache::{Cache, CachedData, SampleCost};
use crate::executor::WorkerLocal;
use crate::trace::{CacheUse, SampleId};

/// A few consecutive samples of one batch, run by one worker.
pub(super) struct ChunkJob {
    pub(super) shared: Arc<Shared>,
    pub(super) slab: Arc<Slab>,
    pub(super) order: Arc<Vec<u32>>,
    /// Position in `order` of the batch's slot 0.
    pub(super) first: usize,
    pub(super) slots: std::ops::Range<usize>,
    pub(super) epoch: u64,
    pub(super) batch: u64,
    pub(super) cancel: Arc<AtomicBool>,
    pub(super) reply: Sender<ChunkDone>,
}

impl ChunkJob {
    pub(super) fn run(self, local: &mut WorkerLocal) {
        let shared = &self.shared;
        let ops = 1 + shared.data.steps.suffix.end.max(shared.data.steps.prefix.end);
        let mut meter = ChunkMeter::start(&shared.observers, local, ops, self.slots.len());
        let mut failures = Vec::new();
        let mut boxes = Vec::new();
        let mut masks = Vec::new();
        for slot in self.slots.clone() {
            if self.cancel.load(Ordering::Relaxed) {
                break;
            }
            let pos = self.order[self.first + slot];
            let entry = shared.data.manifest.at(pos as usize);
            let mut stage = Stage::Read;
            meter.begin();
            let mut cache_use = CacheUse::None;
            // A panic here is a bug, but it must fail this sample (by key), not leave the
            // consumer waiting forever for a chunk that never reports.
            let times = &mut meter.sample;
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let records = (&mut boxes, &mut masks);
                self.run_sample(slot, pos, local, times, &mut stage, &mut cache_use, records)
            }));
            let id = SampleId { key: entry.key.0, batch: self.batch, epoch: self.epoch };
            meter.end(local, cache_use, id);
            let failure = match outcome {
                Ok(Ok(read)) => {
                    meter.add_bytes(read);
                    continue;
                }
                Ok(Err(failure)) => failure,
                Err(payload) => {
                    // The scratch state may be half-way through a decode: start afresh.
                    *local = WorkerLocal::default();
                    (stage, SampleErrorKind::Panicked(panic_message(payload.as_ref())))
                }
            };
            let (stage, kind) = failure;
            let path = shared.data.manifest.display_path(entry.key);
            failures.push((slot, SampleError { key: entry.key, path, stage, kind }));
        }
        let work = meter.finish(local);
        let Self { slab, reply, batch, .. } = self;
        // Release the buffer before reporting, so the consumer finds itself its only owner.
        drop(slab);
        let _ = reply.send(ChunkDone { batch, failures, work, boxes, masks });
    }

    /// One sample into its slot; returns the bytes read from storage. Keeps `stage` at the
    /// step it is in, for the report of a panic, and `cache_use` at what the cache did. A
    /// sample with boxes pushes them, moved with its pixels, onto `boxes`; one with a mask
    /// pushes it (the output's size) onto `masks`.
    #[allow(clippy::too_many_arguments)]
    fn run_sample(
        &self,
        slot: usize,
        pos: u32,
        local: &mut WorkerLocal,
        times: &mut [Duration],
        stage: &mut Stage,
        cache_use: &mut CacheUse,
        (boxes, masks): SlotRecords<'_>,
    ) -> Result<u64, SampleFailure> {
        let shared = &self.shared;
        let entry = shared.data.manifest.at(pos as usize);
        let mut rng = SampleRng::new(shared.data.spec.seed, self.epoch, SampleKey(entry.key.0), 0);
        // What a `map` op is told about the sample (its seed comes from `rng`).
        local.scratch.sample =
            SampleInfo { key: entry.key.0, label: entry.label, epoch: self.epoch, seed: 0, max_pixels: 0 };
        // SAFETY: this job is the only writer of its chunk's slots, and runs each slot once.
        let out = unsafe { self.slab.slot(slot) };
        // A source with boxes: checked before the read, so a bad annotation costs no I/O.
        shared.check_fields(pos)?;
        let mut targets = shared.source_targets(pos)?;
        if let Some(cache) = &shared.priority.cache {
            // A panic on the cache path counts as the decode's: most of its work is.
            *stage = Stage::Decode;
            let mut mask = None;
            let (read, used) = shared.run_cached(cache, pos, local, &mut rng, out, times, (&mut targets, &mut mask))?;
            *cache_use = used;
            if let Some(t) = targets {
                boxes.push((slot, t));
            }
            if let Some(m) = mask {
                masks.push((slot, m.data));
            }
            return Ok(read);
        }
        if let Some(c) = probe(local) {
            c.mark();
        }
        let t0 = Instant::now();
        let read = shared.data.storage.read(
            &shared.data.manifest.root,
            entry.location,
            shared.data.spec.limits.max_file_bytes,
            &mut local.read_buf,
        );
        times[0] += t0.elapsed();
        if let Some(c) = probe(local) {
            c.done(0);
            c.base = 1;
        }
        read.map_err(|kind| (Stage::Read, kind))?;
        let mut mask = shared.sample_mask(pos, &local.read_buf, &mut local.scratch)?;
        *stage = Stage::Decode;
        let plan = &shared.data.plan;
        let (bytes, scratch, times) = (&local.read_buf, &mut local.scratch, &mut times[1..]);
        // A mask moves only with the sample's boxes on this path.
        let records = match targets.as_mut() {
            None => Records::default(),
            Some(t) => Records { boxes: Some(t), mask: mask.as_mut() },
        };
        plan.run(bytes, &mut rng, scratch, out, times, records).map_err(decode_err)?;
        if let Some(t) = targets {
            boxes.push((slot, t));
        }
        if let Some(m) = mask {
            masks.push((slot, m.data));
        }
        Ok(local.read_buf.len() as u64)
    }
}

/// Points the counters at the op list's slot for the plan's step 0 (the cached paths run
/// parts of the plan whose steps start further along).
fn counters_base(local: &mut WorkerLocal, base: usize) {
    if let Some(c) = probe(local) {
        c.base = base;
    }
}

type SampleFailure = (Stage, SampleErrorKind);

/// A sample's boxes and mask on the cached path: in, the source's (the mask is loaded
/// there, only when needed); out, moved with the pixels to the output.
type SampleRecords<'a> = (&'a mut Option<BoxTargets>, &'a mut Option<Mask>);

/// Where a chunk collects its samples' boxes and masks, by slot.
type SlotRecords<'a> = (&'a mut Vec<(usize, BoxTargets)>, &'a mut Vec<(usize, Vec<u8>)>);

fn decode_err(e: CodecError) -> SampleFailure {
    // A user function's failure is the transform's, not the decoder's.
    let stage = match e {
        CodecError::UserOp { .. } | CodecError::UnknownUserOp(_) => Stage::Transform,
        _ => Stage::Decode,
    };
    (stage, e.into())
}

/// Shrinks a cached-path image so its shorter side is `size`; the sample's targets, if
/// any, are scaled with it, and its mask resized with it (nearest).
pub(super) fn resize_image(
    image: &Image,
    size: u32,
    scratch: &mut Scratch,
    targets: Option<&mut BoxTargets>,
    mask: Option<&mut Mask>,
    max_pixels: u64,
) -> Result<Image, CodecError> {
    let Pixels::U8(px) = &image.pixels else {
        return Err(CodecError::Shape("the cache resize takes u8 pixels".into()));
    };
    let mut dst = Vec::new();
    let (w, h) = scratch.resizer().resize_shorter_side(px, image.width, image.height, size, &mut dst)?;
    if let Some(t) = targets {
        let (sx, sy) = (f64::from(w) / f64::from(image.width), f64::from(h) / f64::from(image.height));
        move_boxes(t, Motion::Scale { sx, sy, tx: 0.0, ty: 0.0 }, w, h);
    }
    if let Some(m) = mask {
        resize_mask(m, (w, h), max_pixels)?;
    }
    Ok(Image::rgb8(w, h, dst))
}

impl Shared {
    /// The targets (boxes) the source read for the sample at `pos`, checked against the
    /// spec's limits; `None` for a source without them. An invalid annotation fails the
    /// sample.
    pub(super) fn source_targets(&self, pos: u32) -> Result<Option<BoxTargets>, SampleFailure> {
        match self.data.manifest.annotation(pos as usize) {
            None => Ok(None),
            Some(Annotation::Invalid(why)) => Err((Stage::Read, SampleErrorKind::BadAnnotation(why.clone()))),
            Some(Annotation::Boxes(t)) => {
                let max = self.data.spec.limits.max_boxes;
                if t.len() as u64 > max {
                    let why = format!("{} boxes, over the limit of {max} (limits.max_boxes)", t.len());
                    return Err((Stage::Read, SampleErrorKind::BadAnnotation(why)));
                }
                Ok(Some(t.clone()))
            }
        }
    }

    /// Fails the sample at `pos` if its metadata fields could not be read at enumeration
    /// (missing, mistyped, too long): the message names the field and what was found.
    pub(super) fn check_fields(&self, pos: u32) -> Result<(), SampleFailure> {
        match self.data.manifest.fields.as_ref().and_then(|t| t.invalid(u64::from(pos))) {
            Some(why) => Err((Stage::Read, SampleErrorKind::BadField(why.to_string()))),
            None => Ok(()),
        }
    }

    /// The mask of the sample at `pos` (whose encoded image is `image`), read (or painted)
    /// afresh; `None` for a source without masks. A mask that cannot be read fails the
    /// sample.
    pub(super) fn sample_mask(
        &self,
        pos: u32,
        image: &[u8],
        scratch: &mut Scratch,
    ) -> Result<Option<Mask>, SampleFailure> {
        match self.data.manifest.mask_source(pos as usize) {
            None => Ok(None),
            Some(source) => self
                .load_mask(source, image, scratch)?
                .map(Some)
                .map_err(|why| (Stage::Read, SampleErrorKind::BadMask(why))),
        }
    }

    /// Reads a sample's mask: a PNG file, or COCO objects painted; says what is wrong. An
    /// image whose header cannot be read fails the sample as its decode would.
    fn load_mask(
        &self,
        source: &MaskSource,
        image: &[u8],
        scratch: &mut Scratch,
    ) -> Result<Result<Mask, String>, SampleFailure> {
        let limits = &self.data.spec.limits;
        Ok(match source {
            MaskSource::Invalid(why) => Err(why.clone()),
            MaskSource::Objects { width, height, objects } => {
                // The size the annotations declare must be the image's, checked before
                // anything is painted: painting costs the declared area, not the image's.
                let (w, h) = sluice_codec::image_size(image, scratch, limits.max_pixels).map_err(decode_err)?;
                if (w, h) != (*width, *height) {
                    Err(format!(
                        "the annotations declare a {width}x{height} image (its mask's size) but the image is {w}x{h}"
                    ))
                } else {
                    crate::source::segmentation::paint(*width, *height, objects, limits.max_pixels)
                }
            }
            MaskSource::File(path) => self.load_png_mask(LocationRef::File { path }),
            MaskSource::Member(location) => self.load_png_mask(location.view()),
        })
    }

    /// Reads and decodes a mask PNG stored at `location`; says which mask on error.
    fn load_png_mask(&self, location: LocationRef<'_>) -> Result<Mask, String> {
        let limits = &self.data.spec.limits;
        let mut bytes = Vec::new();
        let root = &self.data.manifest.root;
        let shown = location.display_path(root);
        self.data
            .storage
            .read(root, location, limits.max_file_bytes, &mut bytes)
            .map_err(|e| format!("mask {}: {e}", shown.display()))?;
        decode_png_mask(&bytes, limits.max_pixels).map_err(|e| format!("mask {}: {e}", shown.display()))
    }

    /// One sample through the cache: a hit skips the read (and the decode, and the resize,
    /// depending on its level); a miss reads, runs, measures its costs and offers an entry.
    /// Returns the bytes read from storage and what the cache did. `targets` (the source's
    /// boxes) leave moved with the pixels: from the entry on a pixel-level hit, where they
    /// were kept with the pixels; so does `mask`, which comes from the entry on a
    /// pixel-level hit and is read from the source otherwise (a raw hit, a miss).
    #[allow(clippy::too_many_arguments)]
    fn run_cached(
        &self,
        cache: &Cache,
        pos: u32,
        local: &mut WorkerLocal,
        rng: &mut SampleRng,
        out: &mut [u8],
        times: &mut [Duration],
        (targets, mask): SampleRecords<'_>,
    ) -> Result<(u64, CacheUse), SampleFailure> {
        let max_pixels = self.data.spec.limits.max_pixels;
        let entry = self.data.manifest.at(pos as usize);
        let key = entry.key.0;
        let resize = self.data.spec.cache.as_ref().and_then(|c| c.resize);
        let steps = &self.data.steps;
        let hit = cache.get(key);
        let peer = if hit.is_none() { self.fetch_from_peer(pos) } else { None };
        if let Some(data) = hit.as_deref().or(peer.as_ref()) {
            match data {
                CachedData::Raw(bytes) => {
                    *mask = self.sample_mask(pos, bytes, &mut local.scratch)?;
                    let records = (targets.as_mut(), mask.as_mut());
                    self.compute(bytes, local, rng, out, times, resize, records).map(|_| ())?;
                }
                CachedData::Decoded(img, kept, kept_mask) | CachedData::Resized(img, kept, kept_mask) => {
                    *targets = kept.clone();
                    *mask = kept_mask.clone();
                    // A decoded entry still takes the cache's resize; a resized one has had it.
                    let mut resized = None;
                    if let (CachedData::Decoded(..), Some(s)) = (data, resize) {
                        let t = Instant::now();
                        let (b, m) = (targets.as_mut(), mask.as_mut());
                        resized = Some(resize_image(img, s, &mut local.scratch, b, m, max_pixels).map_err(decode_err)?);
                        if let Some(slot) = steps.resize {
                            times[slot] += t.elapsed();
                        }
                    }
                    let img = resized.as_ref().unwrap_or(img);
                    counters_base(local, steps.suffix.start);
                    let suffix_times = &mut times[steps.suffix.clone()];
                    self.data
                        .plan
                        .run_from_image(
                            img,
                            rng,
                            &mut local.scratch,
                            out,
                            suffix_times,
                            targets.as_mut(),
                            mask.as_mut(),
                        )
                        .map_err(decode_err)?;
                }
            }
            return Ok((0, CacheUse::Hit));
        }
        if self.peering.locality.is_some() {
            self.peering.counters.storage_read();
        }
        if let Some(c) = probe(local) {
            c.mark();
        }
        let t0 = Instant::now();
        self.data
            .storage
            .read(&self.data.manifest.root, entry.location, self.data.spec.limits.max_file_bytes, &mut local.read_buf)
            .map_err(|k| (Stage::Read, k))?;
        let read_time = t0.elapsed();
        if let Some(c) = probe(local) {
            c.done(0);
        }
        times[0] += read_time;
        let raw = std::mem::take(&mut local.read_buf);
        *mask = match self.sample_mask(pos, &raw, &mut local.scratch) {
            Ok(m) => m,
            Err(e) => {
                local.read_buf = raw;
                return Err(e);
            }
        };
        let result = self.compute(&raw, local, rng, out, times, resize, (targets.as_mut(), mask.as_mut()));
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
            sample_s: t0.elapsed().as_secs_f64(),
            read_s: read_time.as_secs_f64(),
            decode_s: computed.decode.as_secs_f64(),
            resize_s: computed.resize.as_secs_f64(),
            raw_bytes: read_bytes,
            decoded_bytes: computed.decoded.as_ref().map_or(0, |i| i.0.as_bytes().len() as u64),
            resized_bytes: computed
                .resized
                .as_ref()
                .or(computed.decoded.as_ref())
                .map_or(0, |i| i.0.as_bytes().len() as u64),
        });
        // With several learners, each caches only the samples placed on it.
        let level = level.filter(|_| self.peering.locality.as_ref().is_none_or(|l| l.caches(pos)));
        let fill = Instant::now();
        match level {
            Some(CacheLevel::Raw) => {
                cache.offer(key, Arc::new(CachedData::Raw(raw.clone())));
            }
            Some(CacheLevel::Decoded) => {
                if let Some((img, t, m)) = computed.decoded {
                    cache.offer(key, Arc::new(CachedData::Decoded(img, t, m)));
                }
            }
            Some(CacheLevel::Resized) => {
                if let Some((img, t, m)) = computed.resized.or(computed.decoded) {
                    cache.offer(key, Arc::new(CachedData::Resized(img, t, m)));
                }
            }
            Some(CacheLevel::Auto) | None => {}
        }
        let fill = fill.elapsed();
        local.read_buf = raw;
        Ok((read_bytes, CacheUse::Miss { fill }))
    }

    /// Encoded bytes to the output slot: the fused plan, or (split path) the prefix, the
    /// optional resize and the suffix, keeping the intermediate images (with the targets in
    /// their pixels and the mask their size) for the cache. `targets` and `mask` move with
    /// the pixels to the output.
    #[allow(clippy::too_many_arguments)]
    fn compute(
        &self,
        bytes: &[u8],
        local: &mut WorkerLocal,
        rng: &mut SampleRng,
        out: &mut [u8],
        times: &mut [Duration],
        resize: Option<u32>,
        (mut targets, mut mask): (Option<&mut BoxTargets>, Option<&mut Mask>),
    ) -> Result<Computed, SampleFailure> {
        let max_pixels = self.data.spec.limits.max_pixels;
        let steps = &self.data.steps;
        counters_base(local, steps.prefix.start);
        let t = Instant::now();
        let plan = &self.data.plan;
        if !self.data.split {
            let times = &mut times[steps.prefix.clone()];
            let records = match targets {
                None => Records::default(),
                Some(boxes) => Records { boxes: Some(boxes), mask },
            };
            plan.run(bytes, rng, &mut local.scratch, out, times, records).map_err(decode_err)?;
            return Ok(Computed { decode: t.elapsed(), resize: Duration::ZERO, decoded: None, resized: None });
        }
        let decoded = plan
            .run_deterministic_prefix(
                bytes,
                &mut local.scratch,
                &mut times[steps.prefix.clone()],
                targets.as_deref_mut(),
                mask.as_deref_mut(),
            )
            .map_err(decode_err)?;
        let decoded_records = (targets.as_deref().cloned(), mask.as_deref().cloned());
        let decode = t.elapsed();
        let t = Instant::now();
        let resized = match resize {
            Some(s) => {
                let (t, m) = (targets.as_deref_mut(), mask.as_deref_mut());
                let img = resize_image(&decoded, s, &mut local.scratch, t, m, max_pixels).map_err(decode_err)?;
                Some((img, targets.as_deref().cloned(), mask.as_deref().cloned()))
            }
            None => None,
        };
        let resize_time = t.elapsed();
        if let Some(slot) = steps.resize {
            times[slot] += resize_time;
        }
        let img = resized.as_ref().map_or(&decoded, |r| &r.0);
        counters_base(local, steps.suffix.start);
        plan.run_from_image(img, rng, &mut local.scratch, out, &mut times[steps.suffix.clone()], targets, mask)
            .map_err(decode_err)?;
        let (dt, dm) = decoded_records;
        Ok(Computed { decode, resize: resize_time, decoded: Some((decoded, dt, dm)), resized })
    }
}

/// An image for the cache with the sample's targets in its pixels and its mask its size
/// (`None` for a source without them).
type Kept = (Image, Option<BoxTargets>, Option<Mask>);

/// What [`Shared::compute`] measured and kept: the images for the cache.
struct Computed {
    decode: Duration,
    resize: Duration,
    decoded: Option<Kept>,
    resized: Option<Kept>,
}

/// What a chunk reports when its samples are done (or cancelled).
pub(super) struct ChunkDone {
    pub(super) batch: u64,
    pub(super) failures: Vec<(usize, SampleError)>,
    pub(super) work: ChunkWork,
    /// The boxes of each sample done, by slot, when the source carries boxes.
    pub(super) boxes: Vec<(usize, BoxTargets)>,
    /// The mask of each sample done (the output's size), by slot, when the source reads masks.
    pub(super) masks: Vec<(usize, Vec<u8>)>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test fixtures: a failed setup is a failed test

    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    use sluice_core::{Batch, LocationRef, PipelineSpec, SampleErrorKind, ShuffleSpec, SourceSpec};
    use sluice_synth::{write_dataset, DatasetOptions};

    use crate::sampler::Shard;
    use crate::storage::{LocalStorage, Storage};
    use crate::{Loader, PipelineError};

    /// Local storage with a bug: it panics when asked for the file named `bad`.
    struct PanicsOn {
        bad: &'static str,
        inner: LocalStorage,
    }

    impl Storage for PanicsOn {
        fn read(
            &self,
            root: &Path,
            location: LocationRef<'_>,
            max: u64,
            buf: &mut Vec<u8>,
        ) -> Result<(), SampleErrorKind> {
            if matches!(location, LocationRef::File { path } if path.ends_with(self.bad)) {
                panic!("a storage bug");
            }
            self.inner.read(root, location, max, buf)
        }

        fn name(&self) -> &str {
            "panics-on"
        }
    }

    #[test]
    fn a_sample_whose_job_panics_fails_with_its_key_instead_of_hanging_the_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("train");
        write_dataset(&root, &DatasetOptions { images: 8, classes: 2, ..Default::default() }, &|_| {}).unwrap();
        let mut spec = PipelineSpec::train_default(SourceSpec::ImageFolder { root }, 16, 4);
        spec.threads = 1.into();
        spec.shuffle = ShuffleSpec::None;
        let bad = "img_0000002.jpg";
        let loader = Loader::new(spec, Shard::default())
            .unwrap()
            .replace_storage(Arc::new(PanicsOn { bad, inner: LocalStorage::new() }))
            .unwrap();
        let (tx, rx) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            let results: Vec<Result<Batch, PipelineError>> = loader.iter().collect();
            let _ = tx.send(results.into_iter().map(|r| r.map(|b| b.keys)).collect::<Vec<_>>());
        });
        let results = rx.recv_timeout(Duration::from_secs(20)).expect("the epoch hung after a sample's job panicked");
        let err = results.iter().find_map(|r| r.as_ref().err()).expect("the panicking sample must fail the run");
        let PipelineError::Sample(e) = err else { panic!("unexpected error {err}") };
        assert!(matches!(e.kind, SampleErrorKind::Panicked(_)), "{e}");
        let msg = e.to_string();
        assert!(msg.contains(bad) && msg.contains("a storage bug") && msg.contains("at read"), "{msg}");
    }
}
