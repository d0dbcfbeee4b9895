//! Profiling traces from a real loader on real JPEG files: every sample's ops, cache
//! lookups and every batch's events are recorded, their per-op sums equal the loader's own
//! stats, and nothing is recorded unless asked.

#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use sluice_core::{ByteBudget, CacheLevel, CachePolicyKind, CacheSpec, PipelineSpec, SourceSpec};
use sluice_pipeline::trace::What;
use sluice_pipeline::{Loader, Shard};
use sluice_synth::{write_dataset, DatasetOptions};

fn dataset(dir: &Path, images: usize) -> PathBuf {
    let root = dir.join("train");
    write_dataset(&root, &DatasetOptions { images, classes: 3, ..Default::default() }, &|_| {}).unwrap();
    root
}

fn spec(root: &Path, threads: usize) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(SourceSpec::ImageFolder { root: root.to_path_buf() }, 32, 8);
    s.threads = threads.into();
    s.prefetch = 2;
    s
}

fn run_epoch(loader: &Loader) -> usize {
    loader.iter().map(|b| b.unwrap().len()).sum()
}

#[test]
fn a_trace_holds_every_samples_ops_and_every_batch_and_adds_up_to_the_stats() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 24);
    let loader = Loader::new(spec(&root, 2), Shard::default()).unwrap();
    loader.start_trace().unwrap();
    assert_eq!(run_epoch(&loader), 24);
    let trace = loader.stop_trace().unwrap();
    let stats = loader.stats();

    // Per-op sums equal the stats' (both add the same measured durations).
    let totals = trace.op_totals();
    assert_eq!(totals.len(), stats.op_seconds.len());
    for ((name, t), (s_name, s)) in totals.iter().zip(&stats.op_seconds) {
        assert_eq!(name, s_name);
        assert!(*s > 0.0, "{name} took no time");
        assert!((t.as_secs_f64() - s).abs() <= 1e-6 * s, "{name}: trace {t:?} vs stats {s}s");
    }
    // Every sample read once, with its key, on a named worker thread.
    let reads: Vec<_> = trace.events.iter().filter(|e| e.what == What::Op(0)).collect();
    let keys: BTreeSet<u64> = reads.iter().map(|e| e.key).collect();
    assert_eq!((reads.len(), keys.len()), (24, 24));
    assert!(reads.iter().all(|e| trace.threads.get(&e.tid).map(String::as_str) == Some("sluice-worker")));
    // Each batch: preprocessed, waited for, handed over, consumed.
    let mut per_batch: BTreeMap<u64, Vec<What>> = BTreeMap::new();
    for e in trace.events.iter().filter(|e| !e.what.has_key()) {
        per_batch.entry(e.batch).or_default().push(e.what);
    }
    assert_eq!(per_batch.len(), 3);
    for (b, mut whats) in per_batch {
        whats.sort_by_key(|w| format!("{w:?}"));
        let want = [What::BatchConsumed, What::BatchHandedOver, What::BatchPreprocessed, What::BatchWait];
        assert_eq!(whats, want, "batch {b}");
    }
    // A sample's ops lie end to end, in op order, inside its batch's preprocessing span.
    let preprocessed: BTreeMap<u64, (u64, u64)> = trace
        .events
        .iter()
        .filter(|e| e.what == What::BatchPreprocessed)
        .map(|e| (e.batch, (e.start_ns, e.start_ns + e.dur_ns)))
        .collect();
    for e in trace.events.iter().filter(|e| matches!(e.what, What::Op(_))) {
        let (start, end) = preprocessed[&e.batch];
        assert!(e.start_ns >= start && e.start_ns + e.dur_ns <= end, "{e:?} outside its batch {start}..{end}");
    }

    let pf = dir.path().join("out.pftrace");
    trace.write(&pf).unwrap();
    let json = dir.path().join("out.json");
    trace.write(&json).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let complete = v["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X").count();
    assert!(complete >= 24 * totals.len(), "{complete} complete events");
    assert!(std::fs::metadata(&pf).unwrap().len() > 1000);
}

#[test]
fn tracing_is_off_until_started_and_records_nothing_after_it_stops() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 16);
    let loader = Loader::new(spec(&root, 1), Shard::default()).unwrap();
    assert!(loader.stop_trace().is_none(), "a loader traces only when asked");
    run_epoch(&loader);
    loader.start_trace().unwrap();
    let e = loader.start_trace().unwrap_err();
    assert!(e.to_string().contains("already being recorded"), "{e}");
    run_epoch(&loader);
    let trace = loader.stop_trace().unwrap();
    assert!(trace.events.iter().all(|e| e.epoch == 1), "only the traced epoch is in the trace");
    assert_eq!(trace.events.iter().filter(|e| e.what == What::Op(0)).count(), 16);
    run_epoch(&loader);
    assert!(loader.stop_trace().is_none());
}

#[test]
fn cache_misses_fill_and_hits_skip_the_read() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 16);
    let mut s = spec(&root, 2);
    s.cache = Some(CacheSpec {
        budget: ByteBudget::Bytes(1 << 30),
        level: CacheLevel::Decoded,
        resize: None,
        policy: CachePolicyKind::Lru,
        disk: None,
        share: false,
    });
    let loader = Loader::new(s, Shard::default()).unwrap();
    loader.start_trace().unwrap();
    run_epoch(&loader);
    run_epoch(&loader);
    let trace = loader.stop_trace().unwrap();
    let count = |what: What, epoch: u64| trace.events.iter().filter(|e| e.what == what && e.epoch == epoch).count();
    assert_eq!((count(What::CacheMiss, 0), count(What::CacheFill, 0), count(What::Op(0), 0)), (16, 16, 16));
    assert_eq!((count(What::CacheHit, 1), count(What::CacheMiss, 1), count(What::Op(0), 1)), (16, 0, 0));
}
