//! Samples with boxes through the service: a COCO or sidecar source read by a
//! [`RemoteLoader`] through a dispatcher and workers gives every sample exactly once, with
//! the boxes the local loader gives it, a worker SIGKILLed mid-epoch included.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::Path;

use sluice_client::RemoteLoader;
use sluice_core::{Batch, PipelineSpec, SourceSpec};
use sluice_pipeline::{Loader, Shard};
use sluice_synth::DatasetOptions;

mod support;

use support::*;

serve_entry!();

/// Each sample's boxes and box labels in a batch, by key.
type Boxes = HashMap<u64, (Vec<[f32; 4]>, Vec<i64>)>;

fn boxes_by_key(batch: &Batch, into: &mut Boxes) {
    let b = batch.boxes.as_ref().expect("a batch of a source with boxes carries them");
    for (i, &key) in batch.keys.iter().enumerate() {
        let rows = i * b.max_boxes..i * b.max_boxes + b.counts[i] as usize;
        let boxes = rows.clone().map(|r| [b.boxes[r * 4], b.boxes[r * 4 + 1], b.boxes[r * 4 + 2], b.boxes[r * 4 + 3]]);
        let previous = into.insert(key, (boxes.collect(), b.labels[rows].to_vec()));
        assert!(previous.is_none(), "key {key} twice in one epoch");
    }
}

/// [`IMAGES`] generated images with their boxes (a sidecar beside each, and
/// `instances.json`).
fn box_dataset(dir: &Path) -> std::path::PathBuf {
    let root = dir.join("data");
    let options = DatasetOptions { images: IMAGES, classes: 4, texture: 8, boxes: true, ..Default::default() };
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
fn a_source_with_boxes_is_served_exactly_once_with_the_local_boxes_across_a_worker_kill() {
    let _watchdog =
        watchdog("a_source_with_boxes_is_served_exactly_once_with_the_local_boxes_across_a_worker_kill", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = box_dataset(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let mut workers: Vec<Proc> = (0..2).map(|_| worker_process(&addr, &root, &[])).collect();
    let batches = IMAGES.div_ceil(BATCH) as u64;
    let sources = [
        SourceSpec::Sidecar { root: root.clone() },
        SourceSpec::Coco { annotations: root.join("instances.json"), images: root.clone() },
    ];
    for (round, source) in sources.into_iter().enumerate() {
        let spec = box_spec(source.clone());
        let local = Loader::new(spec.clone(), Shard::default()).unwrap();
        let mut remote = RemoteLoader::connect(&spec, options(&addr, &format!("boxes-{round}"))).unwrap();
        // Killed mid-way through epoch 0 of the first source, restarted at once.
        let kill_at = (round == 0).then_some(batches / 2);
        let mut read = 0;
        for epoch in 0..2 {
            let mut want = Boxes::new();
            for b in local.iter() {
                boxes_by_key(&b.unwrap(), &mut want);
            }
            assert!(want.values().any(|(b, _)| !b.is_empty()), "{source:?}: no boxes to compare");
            let (mut got, mut keys) = (Boxes::new(), Vec::new());
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
            }
            let what = format!("{source:?}, epoch {epoch}");
            assert_exactly_once(keys, &what);
            assert!(got == want, "{what}: the service's boxes differ from the local loader's");
        }
    }
}
