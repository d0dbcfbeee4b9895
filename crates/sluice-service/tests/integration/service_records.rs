//! Samples with boxes through the service: a COCO or sidecar source read by a
//! [`RemoteLoader`] through a dispatcher and workers gives every sample exactly once, with
//! the boxes (and, with `masks = true`, the masks) the local loader gives it, a worker
//! SIGKILLed mid-epoch included.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::Path;

use sluice_client::{DataPlane, RemoteLoader, ReportKind};
use sluice_core::{
    Batch, ByteBudget, CacheLevel, CachePolicyKind, CacheSpec, Layout, PipelineSpec, SamplingSpec, SourceSpec,
};
use sluice_pipeline::{Loader, Shard};
use sluice_synth::DatasetOptions;

use crate::support::*;

/// Each sample's boxes, box labels and mask (its bytes, when the source reads masks) in
/// a batch, by key.
type Boxes = HashMap<u64, (Vec<[f32; 4]>, Vec<i64>, Option<Vec<u8>>)>;

fn boxes_by_key(batch: &Batch, into: &mut Boxes) {
    let b = batch.boxes.as_ref().expect("a batch of a source with boxes carries them");
    let masks = b.masks.as_ref().map(|m| {
        let (h, w) = match batch.layout {
            Layout::Hwc => (batch.images.shape[1], batch.images.shape[2]),
            Layout::Chw => (batch.images.shape[2], batch.images.shape[3]),
        };
        assert_eq!(m.shape, vec![batch.keys.len(), h, w], "batch {}: masks the images' size", batch.index);
        m.as_bytes()
    });
    for (i, &key) in batch.keys.iter().enumerate() {
        let rows = i * b.max_boxes..i * b.max_boxes + b.counts[i] as usize;
        let boxes = rows.clone().map(|r| [b.boxes[r * 4], b.boxes[r * 4 + 1], b.boxes[r * 4 + 2], b.boxes[r * 4 + 3]]);
        let mask = masks.map(|m| m.chunks_exact(m.len() / batch.keys.len()).nth(i).unwrap().to_vec());
        let previous = into.insert(key, (boxes.collect(), b.labels[rows].to_vec(), mask));
        assert!(previous.is_none(), "key {key} twice in one epoch");
    }
}

/// A batch's index, keys and masks (their bytes, as the batch holds them).
fn masks_of(batch: &Batch) -> (u64, Vec<u64>, Option<Vec<u8>>) {
    let masks = batch.boxes.as_ref().and_then(|b| b.masks.as_ref()).map(|m| m.as_bytes().to_vec());
    (batch.index, batch.keys.clone(), masks)
}

/// [`IMAGES`] generated images with their boxes and masks (a sidecar and a mask beside
/// each, and `instances.json` with RLE segmentations).
fn box_dataset(dir: &Path) -> std::path::PathBuf {
    let root = dir.join("data");
    let options =
        DatasetOptions { images: IMAGES, classes: 4, texture: 8, boxes: true, masks: true, ..Default::default() };
    sluice_synth::write_dataset(&root, &options, &|_| {}).unwrap();
    root
}

fn box_spec(source: SourceSpec) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(source, 32, BATCH);
    s.seed = 11;
    s.threads = 1.into();
    s
}

#[test]
fn a_source_with_boxes_or_masks_is_served_exactly_once_with_the_local_ones_across_a_worker_kill() {
    let _watchdog =
        watchdog("a_source_with_boxes_or_masks_is_served_exactly_once_with_the_local_ones_across_a_worker_kill", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = box_dataset(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let mut workers: Vec<Proc> = (0..2).map(|_| worker_process(&addr, &root, &[])).collect();
    let batches = IMAGES.div_ceil(BATCH) as u64;
    let sources = [
        SourceSpec::Sidecar { root: root.clone(), masks: false },
        SourceSpec::Sidecar { root: root.clone(), masks: true },
        SourceSpec::Coco { annotations: root.join("instances.json"), images: root.clone(), masks: true },
    ];
    for (round, source) in sources.into_iter().enumerate() {
        let spec = box_spec(source.clone());
        let local = Loader::new(spec.clone(), Shard::default()).unwrap();
        let mut remote = RemoteLoader::connect(&spec, options(&addr, &format!("boxes-{round}"))).unwrap();
        // Killed mid-way through epoch 0 of the first two sources, restarted at once.
        let kill_at = (round < 2).then_some(batches / 2);
        let mut read = 0;
        for epoch in 0..2 {
            let (mut want, mut want_batches) = (Boxes::new(), Vec::new());
            for b in local.iter() {
                let b = b.unwrap();
                boxes_by_key(&b, &mut want);
                want_batches.push(masks_of(&b));
            }
            assert!(want.values().any(|(b, _, _)| !b.is_empty()), "{source:?}: no boxes to compare");
            let masked = want.values().filter(|(_, _, m)| m.as_ref().is_some_and(|m| m.iter().any(|&v| v != 0)));
            assert_eq!(masked.count() > 0, source.has_masks(), "{source:?}: masks to compare, and only with masks");
            let (mut got, mut keys, mut got_batches) = (Boxes::new(), Vec::new(), Vec::new());
            for b in remote.iter() {
                let b = b.unwrap();
                if Some(read) == kill_at {
                    workers[0].kill();
                    workers[0] = worker_process(&addr, &root, &[]);
                }
                read += 1;
                assert_eq!(b.epoch, epoch);
                keys.extend(b.keys.iter().copied());
                boxes_by_key(&b, &mut got);
                got_batches.push(masks_of(&b));
            }
            let what = format!("{source:?}, epoch {epoch}");
            assert_exactly_once(keys, &what);
            assert!(got == want, "{what}: the service's boxes or masks differ from the local loader's");
            got_batches.sort_unstable();
            assert!(
                got_batches == want_batches,
                "{what}: the service's batches of masks differ from the local loader's"
            );
        }
    }
}

/// Masks over the 16 MiB a batch header holds travel after the pixels: 64 masks of
/// 512x512 (16 MiB) a batch, on the shared-memory and TCP data planes, give the local
/// loader's masks byte for byte (gRPC carries them in its message, as before).
#[test]
fn masks_over_a_batch_headers_16_mib_are_served_as_the_local_loader_gives_them() {
    let _watchdog = watchdog("masks_over_a_batch_headers_16_mib_are_served_as_the_local_loader_gives_them", 120);
    const MANY: usize = 64;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    let options_ =
        DatasetOptions { images: MANY, classes: 4, texture: 0, boxes: true, masks: true, ..Default::default() };
    sluice_synth::write_dataset(&root, &options_, &|_| {}).unwrap();
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let _w = worker_process(&addr, &root, &[]);
    let mut spec = PipelineSpec::train_default(SourceSpec::Sidecar { root: root.clone(), masks: true }, 512, MANY);
    spec.seed = 5;
    let want: Vec<_> =
        Loader::new(spec.clone(), Shard::default()).unwrap().iter().map(|b| masks_of(&b.unwrap())).collect();
    let bytes = want[0].2.as_ref().map_or(0, Vec::len);
    assert_eq!((want.len(), bytes), (1, MANY * 512 * 512), "one batch of 16 MiB of masks");
    for (i, plane) in [DataPlane::Auto, DataPlane::Tcp].into_iter().enumerate() {
        let mut o = options(&addr, &format!("big-masks-{i}"));
        o.data_plane = plane;
        let mut remote = RemoteLoader::connect(&spec, o).unwrap();
        let got: Vec<_> = remote.iter().map(|b| masks_of(&b.unwrap())).collect();
        assert!(got == want, "{plane:?}: the service's masks differ from the local loader's");
    }
}

/// Each drawn sample's key and boxes (as bits), sorted: an epoch as a multiset, so samples
/// an importance draw repeats count once each time.
fn drawn_with_boxes(batches: &[Batch]) -> Vec<(u64, Vec<u32>, Vec<i64>)> {
    let mut out = Vec::new();
    for batch in batches {
        let b = batch.boxes.as_ref().expect("a batch of a source with boxes carries them");
        for (i, &key) in batch.keys.iter().enumerate() {
            let rows = i * b.max_boxes..i * b.max_boxes + b.counts[i] as usize;
            let bits = b.boxes[rows.start * 4..rows.end * 4].iter().map(|v| v.to_bits()).collect();
            out.push((key, bits, b.labels[rows].to_vec()));
        }
    }
    out.sort_unstable();
    out
}

#[test]
fn importance_sampling_and_the_workers_cache_serve_boxes_as_the_local_loader_does() {
    let _watchdog = watchdog("importance_sampling_and_the_workers_cache_serve_boxes_as_the_local_loader_does", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = box_dataset(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let _w = worker(&addr, &root, &[]);
    let mut spec = box_spec(SourceSpec::Sidecar { root: root.clone(), masks: false });
    spec.sampling = SamplingSpec::Importance { floor: 0.1, coverage_epochs: 4, miss_discount: 1.0, max_draws: 4.0 };
    spec.cache = Some(CacheSpec {
        budget: ByteBudget::Bytes(64 << 20),
        level: CacheLevel::Decoded,
        resize: None,
        policy: CachePolicyKind::Importance,
        disk: None,
        share: false,
    });
    let loss = |k: u64| if k < 8 { 10.0 } else { 0.1 };
    let local = Loader::new(spec.clone(), Shard::default()).unwrap();
    let mut remote = RemoteLoader::connect(&spec, options(&addr, "boxes-importance")).unwrap();
    for epoch in 0..3 {
        // Each batch's losses reported as the trainer takes it, before it asks for the next.
        let mut mine = Vec::new();
        for b in local.iter() {
            let b = b.unwrap();
            local.report(&b.keys, &b.keys.iter().map(|&k| loss(k)).collect::<Vec<_>>()).unwrap();
            mine.push(b);
        }
        let mut theirs = Vec::new();
        remote.start_epoch();
        while let Some(b) = remote.next_batch(&mut || false) {
            let b = b.unwrap();
            remote.report(&b.keys, &b.keys.iter().map(|&k| loss(k)).collect::<Vec<_>>(), ReportKind::Loss).unwrap();
            theirs.push(b);
        }
        let keys = |e: &[Batch]| {
            let mut k: Vec<u64> = e.iter().flat_map(|b| b.keys.clone()).collect();
            k.sort_unstable();
            k
        };
        assert_eq!(keys(&theirs), keys(&mine), "epoch {epoch}: the service drew other samples");
        let (want, got) = (drawn_with_boxes(&mine), drawn_with_boxes(&theirs));
        assert!(want.iter().any(|s| !s.1.is_empty()), "epoch {epoch}: no boxes to compare");
        assert!(got == want, "epoch {epoch}: the service's draws or boxes differ from the local loader's");
        if epoch == 2 {
            let hard = got.iter().filter(|s| s.0 < 8).count();
            assert!(hard > 16, "hard samples (8 of 48) should dominate a reshaped epoch; drew {hard}");
        }
    }
}

/// Each sample's metadata fields, by key: (key, field name, the value as text).
fn fields_by_key(batch: &Batch, into: &mut Vec<(u64, String, String)>) {
    let fields = batch.fields.as_ref().expect("a batch of a spec with fields carries them");
    for f in &fields.fields {
        for (row, &key) in batch.keys.iter().enumerate() {
            let value = match &f.values {
                sluice_core::FieldValues::Float(v) => v[row].to_bits().to_string(),
                sluice_core::FieldValues::Int(v) => v[row].to_string(),
                sluice_core::FieldValues::MultiHot { classes, values } => {
                    format!("{:?}", &values[row * classes..(row + 1) * classes])
                }
                sluice_core::FieldValues::Text(v) | sluice_core::FieldValues::Json(v) => v[row].clone(),
            };
            into.push((key, f.name.clone(), value));
        }
    }
}

fn fields_spec(root: &Path) -> PipelineSpec {
    use sluice_core::{FieldKindName as K, FieldSpec};
    let mut spec = box_spec(SourceSpec::Sidecar { root: root.to_path_buf(), masks: false });
    let field = |name: &str, kind, classes| FieldSpec { name: name.into(), kind, classes };
    spec.fields = vec![
        field("id", K::Int, None),
        field("caption", K::Text, None),
        field("score", K::Float, None),
        field("tags", K::MultiLabel, Some(4)),
    ];
    spec
}

#[test]
fn metadata_fields_are_served_exactly_once_with_the_local_ones_across_a_worker_kill() {
    let _watchdog = watchdog("metadata_fields_are_served_exactly_once_with_the_local_ones_across_a_worker_kill", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    let options_ = DatasetOptions { images: IMAGES, classes: 4, texture: 0, fields: true, ..Default::default() };
    sluice_synth::write_dataset(&root, &options_, &|_| {}).unwrap();
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let mut workers: Vec<Proc> = (0..2).map(|_| worker_process(&addr, &root, &[])).collect();
    let spec = fields_spec(&root);
    let local = Loader::new(spec.clone(), Shard::default()).unwrap();
    let mut want = Vec::new();
    for b in local.iter() {
        fields_by_key(&b.unwrap(), &mut want);
    }
    want.sort();
    assert_eq!(want.len(), IMAGES * 4);
    let mut remote = RemoteLoader::connect(&spec, options(&addr, "fields")).unwrap();
    let kill_at = IMAGES.div_ceil(BATCH) / 2;
    let (mut got, mut keys) = (Vec::new(), Vec::new());
    for (read, b) in remote.iter().enumerate() {
        let b = b.unwrap();
        if read == kill_at {
            workers[0].kill();
            workers[0] = worker_process(&addr, &root, &[]);
        }
        keys.extend(b.keys.iter().copied());
        fields_by_key(&b, &mut got);
    }
    assert_exactly_once(keys, "fields, epoch 0");
    got.sort();
    assert!(got == want, "the service's fields differ from the local loader's");

    // A job whose batches' fields could outgrow a batch header is refused, naming the limit.
    let mut big = spec;
    big.batch.size = 512;
    big.limits.max_field_bytes = 1 << 20;
    let err = RemoteLoader::connect(&big, options(&addr, "fields-big")).err().unwrap().to_string();
    assert!(err.contains("limits.max_field_bytes") && err.contains("header"), "{err}");
}
