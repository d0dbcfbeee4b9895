//! `prefetch = "auto"` end to end: a consumer that takes batches in bursts grows the
//! depth, the memory bound caps it, and a consumer faster than its producers leaves it
//! where it started.

#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use sluice_core::spec::PREFETCH_AUTO;
use sluice_core::{OpSpec, PipelineSpec, SourceSpec};
use sluice_pipeline::{Loader, PrefetchStats, Shard};
use sluice_synth::{write_dataset, DatasetOptions};

/// Epochs each test runs over the dataset.
const EPOCHS: usize = 4;

/// 48 small JPEGs, written once for all the tests of this file.
fn dataset() -> &'static Path {
    static DIR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("train");
        let o = DatasetOptions { images: 48, classes: 2, texture: 4, ..Default::default() };
        write_dataset(&root, &o, &|_| {}).unwrap();
        (dir, root)
    })
    .1
}

/// Batches of `batch` 32×32 images on two threads, each sample taking `sleep_us` more.
fn auto_spec(root: &Path, batch: usize, sleep_us: u32) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(SourceSpec::ImageFolder { root: root.to_path_buf() }, 32, batch);
    s.threads = 2.into();
    s.prefetch = PREFETCH_AUTO;
    s.ops.push(OpSpec::Sleep { us: sleep_us });
    s
}

/// Takes every batch of [`EPOCHS`] epochs, pausing `pause` after each `burst` of them.
fn consume(loader: &Loader, burst: usize, pause: Duration) -> PrefetchStats {
    let mut taken = 0;
    for _ in 0..EPOCHS {
        for b in loader.iter() {
            b.unwrap();
            taken += 1;
            if taken % burst == 0 {
                std::thread::sleep(pause);
            }
        }
    }
    loader.stats().prefetch.unwrap()
}

#[test]
fn a_slow_bursty_consumer_grows_the_depth() {
    let root = dataset();
    // Batches of 4 on 2 threads: 4 batches being built at once, plus one ready to start.
    let loader = Loader::new(auto_spec(root, 4, 1000), Shard::default()).unwrap();
    let start = loader.stats().prefetch.unwrap();
    assert_eq!((start.auto, start.depth, start.ready_limit), (true, 5, 1), "{start:?}");
    // The consumer takes 6 batches at once and then computes for 200 ms: the buffer
    // fills during the pause and runs dry in the burst.
    let end = consume(&loader, 6, Duration::from_millis(200));
    assert!(end.grows >= 2 && end.depth >= 7, "the depth grew: {start:?} → {end:?}");
    assert_eq!(end.max_depth, 64, "1 GiB holds more than 64 batches of 12 KiB: the count bounds it");
}

#[test]
fn the_memory_bound_caps_the_depth() {
    let root = dataset();
    let mut spec = auto_spec(root, 4, 1000);
    let batch_bytes = 4 * 32 * 32 * 3;
    spec.prefetch_max_bytes = Some(7 * batch_bytes + batch_bytes / 2);
    let loader = Loader::new(spec, Shard::default()).unwrap();
    assert_eq!(loader.prefetch_max_depth(), 7);
    let end = consume(&loader, 6, Duration::from_millis(200));
    assert_eq!((end.depth, end.max_depth), (7, 7), "grew to the bound and no further: {end:?}");
    assert!(end.grows >= 1, "{end:?}");
}

#[test]
fn a_fast_consumer_of_a_slow_producer_keeps_the_depth_it_started_with() {
    let root = dataset();
    // Batches of 16 on 2 threads: one batch being built at once, 40 ms each; the consumer
    // takes each as soon as it comes, so the buffer is never full.
    let loader = Loader::new(auto_spec(root, 16, 5000), Shard::default()).unwrap();
    let end = consume(&loader, usize::MAX, Duration::ZERO);
    assert_eq!(
        (end.depth, end.ready_limit, end.grows),
        (2, 1, 0),
        "one building and one ready, less than the fixed default of 4: {end:?}"
    );
}

/// Sleeps `ms` on the sample with key 0 (once an epoch, where the shuffle puts it).
struct Hiccup {
    ms: u64,
}

impl sluice_pipeline::UserOp for Hiccup {
    fn apply(
        &self,
        image: sluice_pipeline::ImageRef<'_>,
        sample: &sluice_pipeline::SampleInfo,
        out: &mut Vec<u8>,
    ) -> Result<(u32, u32), sluice_pipeline::UserOpError> {
        if sample.key == 0 {
            std::thread::sleep(Duration::from_millis(self.ms));
        }
        out.clear();
        out.extend_from_slice(image.pixels);
        Ok((image.width, image.height))
    }
}

#[test]
fn a_steady_consumer_faster_than_one_batch_is_built_grows_the_depth_after_a_hiccup() {
    let root = dataset();
    sluice_pipeline::register_user_op("prefetch_auto_test:hiccup", std::sync::Arc::new(Hiccup { ms: 150 }));
    // Batches of 4 on 2 threads, 8 ms a sample: a batch takes 32 ms to build, and the two
    // threads make one every 16 ms. The trainer's 22 ms step is slower than the producers,
    // so ready batches pile up, but faster than one batch's build, so the batch submitted
    // as it took the last one is never ready yet: the depth is never all ready at once.
    let mut spec = auto_spec(root, 4, 8000);
    spec.ops.push(OpSpec::map("prefetch_auto_test:hiccup"));
    let loader = Loader::new(spec, Shard::default()).unwrap();
    let start = loader.stats().prefetch.unwrap();
    // One sample an epoch holds its batch back 150 ms: the ready batches run dry.
    let end = consume(&loader, 1, Duration::from_millis(22));
    assert!(end.grows >= 1 && end.depth > start.depth, "a hiccup drained the ready batches: {start:?} → {end:?}");
    assert!(end.depth <= 16, "an epoch start (nothing in flight yet) is not a drained buffer: {end:?}");
}

#[test]
fn an_epoch_start_is_not_a_drained_buffer() {
    let root = dataset();
    // Producers far ahead of a steady 20 ms trainer: the ready batches never run dry
    // within an epoch, but each epoch starts with nothing in flight.
    let loader = Loader::new(auto_spec(root, 4, 0), Shard::default()).unwrap();
    let end = consume(&loader, 1, Duration::from_millis(20));
    // One grow of slack for a stall of the shared machine; an epoch start read as a drained
    // buffer doubles the limit at each of the 3 epochs after the first.
    assert!(end.grows <= 1, "the buffer never ran dry within an epoch: {end:?}");
}
