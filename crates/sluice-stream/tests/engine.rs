//! The stream loader's batches come from the pipeline's engine: the same pixels as the
//! loader's own threads gave (pinned), per-op stats with percentiles, `threads = "auto"`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
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
        let (hash, batches, ..) = run(|s| s.threads = threads);
        assert_eq!(batches, ENTRIES / 4, "{threads} threads");
        assert_eq!(hash, PINNED, "{threads} threads: the batches changed (got {hash:#x})");
    }
}
