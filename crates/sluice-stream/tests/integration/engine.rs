//! The stream loader's batches come from the pipeline's engine: the same pixels as the
//! loader's own threads gave (pinned), per-op stats with percentiles, `threads = "auto"`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::*;
use sluice_stream::{push_dataset, StreamLoader, StreamSpec};

const ENTRIES: usize = 24;

/// FNV-1a over every batch's keys, labels, rehearsal flags and image bytes.
struct Fnv(u64);

impl Fnv {
    fn eat(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
}

/// Streams the dataset (all of it pushed first) through a loader of r = b = 4 and hashes
/// what it hands out; returns the hash, the batches and the loader (for its stats).
fn run(configure: impl FnOnce(&mut StreamSpec)) -> (u64, usize, StreamLoader, tempfile::TempDir, Redis) {
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), false);
    let manifest = dataset(dir.path(), ENTRIES, 4);
    let report = push_dataset(&manifest, &push_options(&redis.url(), "s", 0.0)).unwrap();
    assert_eq!(report.pushed, ENTRIES as u64);
    let mut spec = stream_spec(&redis.url(), "s", "job", 4, 4, Some(&dir.path().join("rehearsal")));
    configure(&mut spec);
    let mut loader = StreamLoader::new(spec).unwrap();
    let mut hash = Fnv(0xcbf2_9ce4_8422_2325);
    let mut batches = 0;
    while let Some(b) = loader.next_batch().unwrap() {
        batches += 1;
        for (k, l) in b.batch.keys.iter().zip(&b.batch.labels) {
            hash.eat(&k.to_le_bytes());
            hash.eat(&l.to_le_bytes());
        }
        hash.eat(&b.rehearsal.iter().map(|r| u8::from(*r)).collect::<Vec<_>>());
        hash.eat(b.batch.images.as_bytes());
    }
    (hash.0, batches, loader, dir, redis)
}

/// The hash of the batches the loader's own scoped threads made before the stream loader
/// ran on the pipeline's engine: the per-sample RNG, the order and the pixels are the same.
const PINNED: u64 = 0x195e_d119_e975_1238;

#[test]
fn batches_are_bit_identical_to_the_loaders_own_threads_whatever_the_thread_count() {
    let _w = watchdog("pinned batches", 60);
    for threads in [1, 3] {
        let (hash, batches, ..) = run(|s| s.threads = threads.into());
        assert_eq!(batches, ENTRIES / 4, "{threads} threads");
        assert_eq!(hash, PINNED, "{threads} threads: the batches changed (got {hash:#x})");
    }
}

#[test]
fn stats_have_the_engines_per_op_times_and_percentiles_like_a_file_loaders() {
    let _w = watchdog("per-op stats", 60);
    let (_, batches, loader, ..) = run(|s| s.threads = 2.into());
    let stats = loader.stats();
    assert_eq!(stats.stream.counters.batches, batches as u64);
    assert_eq!(stats.threads, 2);
    let ops: Vec<&str> = stats.op_percentiles.iter().map(|p| p.op.as_str()).collect();
    let seconds: Vec<&str> = stats.op_seconds.iter().map(|(op, _)| op.as_str()).collect();
    assert_eq!(ops, seconds, "one percentile entry per op, in the same order");
    assert!(ops[0].starts_with("decode") && ops.contains(&"center_crop"), "{ops:?}");
    // Every new sample is decoded once, every rehearsal draw once more.
    let decoded = stats.stream.counters.trained + stats.stream.counters.rehearsed;
    let decode = &stats.op_percentiles[0];
    assert_eq!(decode.samples, decoded, "{decode:?}");
    assert!(decode.p50_s > 0.0 && decode.p99_s >= decode.p50_s, "{decode:?}");
    assert!(stats.op_seconds[0].1 > 0.0, "{:?}", stats.op_seconds);
    assert!(stats.autoscale.is_none(), "a fixed thread count does not autoscale");
    // What another thread reads while the loader waits: the same, as of the last batch.
    let monitored = loader.monitor().stats();
    assert_eq!(monitored.op_percentiles.len(), ops.len());
    let json = serde_json::to_value(&stats).unwrap();
    assert!(json["op_percentiles"][0]["p99_s"].as_f64().is_some() && json["trained"].as_u64().is_some(), "{json}");
}

#[test]
fn threads_auto_runs_autoscaled_reports_its_threads_and_keeps_the_pixels() {
    let _w = watchdog("threads auto", 60);
    let spec: StreamSpec = serde_json::from_value(serde_json::json!({
        "url": "redis://127.0.0.1:1/", "stream": "s", "group": "g", "ops": [{"op": "decode"}],
        "new_per_batch": 4, "threads": "auto"
    }))
    .unwrap();
    assert_eq!(spec.threads, sluice_core::Threads::Auto);
    let (hash, batches, loader, ..) = run(|s| s.threads = sluice_core::Threads::Auto);
    assert_eq!((hash, batches), (PINNED, ENTRIES / 4), "autoscaled threads change no pixel");
    let stats = loader.stats();
    let auto = stats.autoscale.as_ref().expect("threads = \"auto\" autoscales the engine");
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    assert!((1..=cores).contains(&stats.threads), "{} threads on {cores} cores", stats.threads);
    assert_eq!(auto.units, stats.threads, "{auto:?}");
}
