//! Throttled storage timing: per-read latency that overlaps across concurrent reads, and
//! one bandwidth cap shared by all reads. Small numbers keep the tests well under a second.
// Fixture helpers sit outside #[test] fns; a failed setup should fail the test.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::{Location, SampleErrorKind};
use sluice_pipeline::storage::{LocalStorage, Storage, ThrottledStorage};

fn throttled(latency_ms: u64, bandwidth: f64) -> ThrottledStorage {
    ThrottledStorage::new(Arc::new(LocalStorage::new()), Duration::from_millis(latency_ms), bandwidth)
}

fn fixture(bytes: usize) -> (tempfile::TempDir, Location) {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("s.jpg"), vec![7u8; bytes]).unwrap();
    (dir, Location::File { path: "s.jpg".into() })
}

fn read(s: &dyn Storage, root: &Path, loc: &Location) -> Vec<u8> {
    let mut buf = Vec::new();
    s.read(root, loc.view(), u64::MAX, &mut buf).unwrap();
    buf
}

#[test]
fn sequential_reads_take_at_least_their_bytes_over_the_bandwidth() {
    // 5 reads × 20 kB at 1 MB/s = 100 ms of transfer.
    let (dir, loc) = fixture(20_000);
    let s = throttled(0, 1e6);
    let t = Instant::now();
    for _ in 0..5 {
        assert_eq!(read(&s, dir.path(), &loc).len(), 20_000);
    }
    assert!(t.elapsed() >= Duration::from_millis(100), "{:?}", t.elapsed());
}

#[test]
fn concurrent_reads_share_one_bandwidth_cap() {
    // 4 threads × 2 reads × 10 kB at 1 MB/s = 80 ms on the shared link, however parallel.
    let (dir, loc) = fixture(10_000);
    let s = throttled(0, 1e6);
    let t = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..2 {
                    read(&s, dir.path(), &loc);
                }
            });
        }
    });
    assert!(t.elapsed() >= Duration::from_millis(80), "{:?}", t.elapsed());
}

#[test]
fn latency_applies_to_every_read_including_failed_ones() {
    let (dir, loc) = fixture(10);
    let s = throttled(30, 1e9);
    let t = Instant::now();
    for _ in 0..3 {
        read(&s, dir.path(), &loc);
    }
    assert!(t.elapsed() >= Duration::from_millis(90), "{:?}", t.elapsed());

    let t = Instant::now();
    let mut buf = Vec::new();
    let missing = Location::File { path: "missing.jpg".into() };
    assert_eq!(s.read(dir.path(), missing.view(), 100, &mut buf), Err(SampleErrorKind::Missing));
    assert!(t.elapsed() >= Duration::from_millis(30), "{:?}", t.elapsed());
}

#[test]
fn concurrent_reads_overlap_their_latencies() {
    let (dir, loc) = fixture(10);
    let s = throttled(200, 1e9);
    let t = Instant::now();
    let per_read: Vec<Duration> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                    let t = Instant::now();
                    read(&s, dir.path(), &loc);
                    t.elapsed()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let total = t.elapsed();
    for d in per_read {
        assert!(d >= Duration::from_millis(200), "{d:?}");
    }
    // Back to back they would take 400 ms.
    assert!(total < Duration::from_millis(350), "{total:?}");
}

#[test]
fn storages_on_one_link_file_share_its_bandwidth_like_processes_on_one_machine() {
    // Two storages (as two learner processes would: each opens the link file itself),
    // each reading 5 × 20 kB at 1 MB/s: 100 ms apiece on its own link, but one shared
    // link carries 200 kB, so both together take at least 200 ms.
    let (dir, loc) = fixture(20_000);
    let link = dir.path().join("storage.link");
    let open = || {
        ThrottledStorage::shared(Arc::new(LocalStorage::new()), Duration::ZERO, 1e6, &link)
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let (a, b) = (open(), open());
    let t = Instant::now();
    std::thread::scope(|scope| {
        for s in [&a, &b] {
            let (dir, loc) = (&dir, &loc);
            scope.spawn(move || {
                for _ in 0..5 {
                    read(s, dir.path(), loc);
                }
            });
        }
    });
    let shared = t.elapsed();
    assert!(shared >= Duration::from_millis(200), "the link was not shared: {shared:?}");
    // Separate links (no file) each run at the full rate, side by side.
    let (a, b) = (throttled(0, 1e6), throttled(0, 1e6));
    let t = Instant::now();
    std::thread::scope(|scope| {
        for s in [&a, &b] {
            let (dir, loc) = (&dir, &loc);
            scope.spawn(move || {
                for _ in 0..5 {
                    read(s, dir.path(), loc);
                }
            });
        }
    });
    assert!(t.elapsed() < Duration::from_millis(190), "separate links: {:?}", t.elapsed());
}

#[test]
fn a_link_file_that_cannot_be_opened_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("no-such-dir").join("storage.link");
    let err = ThrottledStorage::shared(Arc::new(LocalStorage::new()), Duration::ZERO, 1e6, &link).err().unwrap();
    assert!(err.to_string().contains("no-such-dir"), "{err}");
}
