//! A loader with `threads = "auto"` on real JPEG files sizes its pool to its consumer.

#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use std::path::{Path, PathBuf};
use std::time::Duration;

use sluice_autoscale::{AutoscaleConfig, PolicyKind, WindowBy};
use sluice_core::{PipelineSpec, SourceSpec, Threads};
use sluice_pipeline::{Loader, Shard};
use sluice_synth::{write_dataset, DatasetOptions};

fn dataset(dir: &Path, images: usize) -> PathBuf {
    let root = dir.join("train");
    let o = DatasetOptions { images, classes: 3, texture: 4, ..Default::default() };
    write_dataset(&root, &o, &|_| {}).unwrap();
    root
}

fn spec(root: &Path) -> PipelineSpec {
    let s = PipelineSpec::train_default(SourceSpec::ImageFolder { root: root.to_path_buf() }, 32, 8);
    let mut json = serde_json::to_value(&s).unwrap();
    json["threads"] = "auto".into();
    json["prefetch"] = 2.into();
    PipelineSpec::from_json_str(&json.to_string()).unwrap()
}

#[test]
fn a_slow_consumer_gets_one_thread_and_every_sample_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 160);
    let s = spec(&root);
    assert_eq!(s.threads, Threads::Auto);
    let loader = Loader::new(s, Shard::default()).unwrap();
    assert!(loader.stats().autoscale.is_some(), "threads = \"auto\" turns the autoscaler on");
    let config = AutoscaleConfig {
        window: WindowBy::Batches(4),
        settle_batches: 1,
        ..AutoscaleConfig::new(PolicyKind::Fastmatch, 1, 4)
    };
    loader.set_threads(4);
    loader.autoscale(config).unwrap();
    let mut keys = Vec::new();
    for b in loader.iter() {
        let b = b.unwrap();
        keys.extend(b.keys.iter().copied());
        // The trainer takes 80 ms a batch: several times what a thread needs for 8 small
        // JPEGs, even in a debug build on a busy machine.
        std::thread::sleep(Duration::from_millis(80));
    }
    keys.sort_unstable();
    assert_eq!(keys, (0..160).collect::<Vec<u64>>());
    let stats = loader.stats().autoscale.unwrap();
    assert_eq!(stats.units, 1, "{stats:?}");
    assert_eq!(loader.threads(), 1);
    let first = &stats.decisions[0];
    assert_eq!((first.from, first.to), (4, 1), "one decision closes the gap: {stats:?}");
    assert!(first.production > first.consumption && first.consumption > 0.0, "{first:?}");
    assert_eq!((stats.ups, stats.downs), (0, 1));
}
