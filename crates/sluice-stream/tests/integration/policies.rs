//! Rate policies with a producer at half and at twice the trainer's rate, claiming a dead
//! reader's entries, and malformed entries.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use crate::common::*;
use redis::Commands;
use sluice_core::ErrorPolicy;
use sluice_stream::{push_dataset, Overflow, StreamError, StreamLoader, StreamSpec, StreamStats, Underflow};

const ENTRIES: usize = 48;
/// The trainer's step: with 4 new samples a batch, about 100 samples/s. Steps follow a
/// fixed schedule (step n ends at n × STEP), as the producer's entries do, so a stall on a
/// loaded machine is caught up and both keep their average rate: the ratio the tests rely
/// on holds whatever the scheduler does.
const STEP: Duration = Duration::from_millis(40);
const TRAINER_RATE: f64 = 100.0;

/// What a run saw: new ids per batch, rehearsal samples per batch, stats midway and at the end.
struct Run {
    new_per_batch: Vec<Vec<u64>>,
    rehearsal_per_batch: Vec<usize>,
    max_read_ahead: u64,
    /// The largest backlog the broker held while the trainer ran.
    max_backlog: u64,
    midway: StreamStats,
    end: StreamStats,
}

/// Streams the dataset at `rate_factor` × the trainer's rate into a loader of `spec`.
fn run(rate_factor: f64, configure: impl FnOnce(&mut StreamSpec)) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), false);
    let manifest = dataset(dir.path(), ENTRIES, 4);
    let opts = push_options(&redis.url(), "s", TRAINER_RATE * rate_factor);
    let producer = std::thread::spawn(move || push_dataset(&manifest, &opts).unwrap());
    let mut spec = stream_spec(&redis.url(), "s", "job", 4, 0, Some(&dir.path().join("rehearsal")));
    configure(&mut spec);
    let mut loader = StreamLoader::new(spec).unwrap();
    let mut out = Run {
        new_per_batch: Vec::new(),
        rehearsal_per_batch: Vec::new(),
        max_read_ahead: 0,
        max_backlog: 0,
        midway: StreamStats::default(),
        end: StreamStats::default(),
    };
    let t0 = Instant::now();
    while let Some(b) = loader.next_batch().unwrap() {
        let new = b.batch.keys.iter().zip(&b.rehearsal).filter(|(_, r)| !**r).map(|(k, _)| *k).collect();
        out.new_per_batch.push(new);
        out.rehearsal_per_batch.push(b.rehearsal.iter().filter(|r| **r).count());
        let stats = loader.stats().stream;
        out.max_read_ahead = out.max_read_ahead.max(stats.read_ahead);
        out.max_backlog = out.max_backlog.max(stats.backlog);
        if out.new_per_batch.len() == 5 {
            out.midway = stats;
        }
        let due = t0 + STEP * out.new_per_batch.len() as u32;
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
    }
    out.end = loader.stats().stream;
    assert_eq!(producer.join().unwrap().pushed, ENTRIES as u64);
    out
}

fn trained(run: &Run) -> Vec<u64> {
    run.new_per_batch.iter().flatten().copied().collect()
}

#[test]
fn half_rate_stream_with_wait_trains_full_batches_of_new_samples_only() {
    let _w = watchdog("half rate, wait", 60);
    let r = run(0.5, |s| s.rate.underflow = Underflow::Wait);
    assert_exactly_once(trained(&r), ENTRIES, "wait");
    assert!(r.new_per_batch.iter().all(|b| b.len() == 4), "every batch waits for 4 new samples");
    assert_eq!((r.end.counters.filled, r.end.counters.rehearsed), (0, 0));
    assert!(r.midway.arrival_rate > 0.0 && r.midway.consumption_rate > 0.0, "{:?}", r.midway);
}

#[test]
fn half_rate_stream_with_rehearsal_fill_completes_batches_from_the_buffer_and_counts_it() {
    let _w = watchdog("half rate, rehearsal", 60);
    let r = run(0.5, |s| {
        s.rate.underflow = Underflow::Rehearsal;
        s.rate.fill_after_ms = 5;
    });
    assert_exactly_once(trained(&r), ENTRIES, "rehearsal fill");
    let filled: usize = r.rehearsal_per_batch.iter().sum();
    assert!(filled > 0, "a stream at half the rate leaves gaps to fill");
    assert_eq!(r.end.counters.filled, filled as u64);
    assert_eq!(r.end.counters.rehearsed, filled as u64);
    for (new, rehearsal) in r.new_per_batch.iter().zip(&r.rehearsal_per_batch) {
        assert!(new.len() + rehearsal == 4 || *rehearsal == 0, "a filled batch is full: {new:?} + {rehearsal}");
    }
    assert!(r.new_per_batch.len() > ENTRIES / 4, "fills add batches");
}

#[test]
fn twice_rate_stream_with_backpressure_leaves_the_backlog_in_the_broker() {
    let _w = watchdog("twice rate, backpressure", 60);
    let r = run(2.0, |s| {
        s.rate.buffer = 8;
        s.rate.overflow = Overflow::Backpressure;
    });
    assert_exactly_once(trained(&r), ENTRIES, "backpressure");
    assert_eq!((r.end.counters.dropped, r.end.counters.spilled), (0, 0));
    assert!(r.max_read_ahead <= 8, "read ahead {} past the buffer of 8", r.max_read_ahead);
    // The stream outran the trainer: the surplus waited in the broker, not in sluice. (A
    // snapshot at one fixed batch was flaky on a slow first run: the peak is what counts.)
    assert!(r.max_backlog > 8, "the broker held at most {} entries of backlog: {:?}", r.max_backlog, r.end);
}

#[test]
fn twice_rate_stream_with_drop_oldest_drops_and_counts_the_surplus() {
    let _w = watchdog("twice rate, drop oldest", 60);
    let r = run(2.0, |s| {
        s.rate.buffer = 8;
        s.rate.overflow = Overflow::DropOldest;
    });
    let trained = trained(&r);
    let dropped = r.end.counters.dropped;
    assert!(dropped > 0, "a stream at twice the rate overflows a buffer of 8");
    assert_eq!(trained.len() as u64 + dropped, ENTRIES as u64, "each entry is trained on or dropped");
    let mut unique = trained.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), trained.len(), "none twice");
    assert_eq!(r.end.ledger_len, ENTRIES as u64);
}

#[test]
fn twice_rate_stream_with_drop_random_drops_and_counts_the_surplus() {
    let _w = watchdog("twice rate, drop random", 60);
    let r = run(2.0, |s| {
        s.rate.buffer = 8;
        s.rate.overflow = Overflow::DropRandom;
    });
    let trained = trained(&r);
    let dropped = r.end.counters.dropped;
    assert!(dropped > 0, "a stream at twice the rate overflows a buffer of 8");
    assert_eq!(trained.len() as u64 + dropped, ENTRIES as u64, "each entry is trained on or dropped");
    let mut unique = trained.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), trained.len(), "none twice");
    assert_eq!(r.end.ledger_len, ENTRIES as u64);
}

#[test]
fn twice_rate_stream_with_spill_moves_the_surplus_into_the_rehearsal_buffer() {
    let _w = watchdog("twice rate, spill", 60);
    let r = run(2.0, |s| {
        s.rate.buffer = 8;
        s.rate.overflow = Overflow::Spill;
    });
    let spilled = r.end.counters.spilled;
    assert!(spilled > 0);
    assert_eq!(trained(&r).len() as u64 + spilled, ENTRIES as u64, "each entry is trained on or spilled");
    assert_eq!(r.end.counters.dropped, 0);
}

#[test]
fn a_dead_readers_pending_entries_are_claimed_by_another_reader() {
    let _w = watchdog("claim", 60);
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), false);
    let manifest = dataset(dir.path(), 12, 2);
    push_dataset(&manifest, &push_options(&redis.url(), "s", 0.0)).unwrap();
    let mut spec = stream_spec(&redis.url(), "s", "job", 4, 0, None);
    spec.rate.buffer = 4;
    spec.claim_idle_ms = 300;
    let mut dead = StreamLoader::new(spec.clone()).unwrap();
    let taken = dead.next_batch().unwrap().unwrap().batch.keys;
    drop(dead); // took a batch, never checkpointed it: its entries stay pending
    std::thread::sleep(Duration::from_millis(400));
    spec.consumer = "learner-1".into();
    let mut alive = StreamLoader::new(spec).unwrap();
    let mut trained = Vec::new();
    while let Some(b) = alive.next_batch().unwrap() {
        trained.extend(b.batch.keys);
    }
    assert_eq!(alive.stats().stream.counters.claimed, taken.len() as u64, "the dead reader's batch is claimed");
    assert_exactly_once(trained, 12, "claimed");
}

#[test]
fn a_malformed_entry_fails_with_its_entry_id_or_is_skipped_and_counted() {
    let _w = watchdog("malformed", 60);
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), false);
    let mut con = redis::Client::open(redis.url()).unwrap().get_connection().unwrap();
    let good = sluice_synth::image_jpeg(0, &Default::default()).unwrap();
    let _: String = con.xadd("s", "*", &[("id", b"0".as_slice()), ("label", b"1"), ("image", &good)]).unwrap();
    let bad: String = con.xadd("s", "*", &[("id", b"1".as_slice()), ("label", b"cat"), ("image", &good)]).unwrap();
    let junk: String = con.xadd("s", "*", &[("id", b"2".as_slice()), ("label", b"1"), ("image", b"junk")]).unwrap();
    let _: String = con.xadd("s", "*", &[("end", b"1")]).unwrap();

    let spec = stream_spec(&redis.url(), "s", "strict", 3, 0, None);
    let err = StreamLoader::new(spec).unwrap().next_batch().err().unwrap();
    assert!(matches!(err, StreamError::MalformedEntry { .. }), "{err}");
    assert_eq!(err.to_string(), format!("stream `s` entry {bad}: field `label` `cat` is not an integer"));

    let mut spec = stream_spec(&redis.url(), "s", "lenient", 3, 0, None);
    spec.on_error = ErrorPolicy::Skip;
    let mut loader = StreamLoader::new(spec).unwrap();
    let b = loader.next_batch().unwrap().unwrap();
    assert_eq!(b.batch.keys, vec![0], "the good sample only");
    assert_eq!(loader.stats().stream.counters.malformed, 2);
    assert!(loader.next_batch().unwrap().is_none());

    let mut spec = stream_spec(&redis.url(), "s", "strict-decode", 3, 0, None);
    spec.on_error = ErrorPolicy::Fail;
    let _: i64 = con.xdel("s", &[bad.as_str()]).unwrap();
    let err = StreamLoader::new(spec).unwrap().next_batch().err().unwrap();
    assert!(matches!(err, StreamError::Decode { id: 2, .. }), "{err}");
    assert!(err.to_string().contains(&junk), "{err}");
}

#[test]
fn a_learner_that_never_takes_a_state_keeps_the_brokers_pending_list_bounded() {
    let _w = watchdog("pending bound", 60);
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), false);
    push_dataset(&dataset(dir.path(), ENTRIES, 4), &push_options(&redis.url(), "s", 0.0)).unwrap();
    let mut spec = stream_spec(&redis.url(), "s", "job", 4, 0, None);
    spec.rate.buffer = 4;
    spec.max_unacked = 8;
    let mut loader = StreamLoader::new(spec).unwrap();
    let mut con = redis::Client::open(redis.url()).unwrap().get_connection().unwrap();
    let mut trained = Vec::new();
    let mut most_pending = 0;
    while let Some(b) = loader.next_batch().unwrap() {
        trained.extend(b.batch.keys);
        let pending: redis::streams::StreamPendingReply = con.xpending("s", "job").unwrap();
        most_pending = most_pending.max(pending.count());
    }
    assert_exactly_once(trained, ENTRIES, "without states");
    // max_unacked, the batch just handed out and what is read ahead.
    assert!(most_pending <= 8 + 4 + 4, "{most_pending} entries pending at once");
}

#[test]
fn an_undecodable_sample_under_fail_leaves_the_rest_of_its_batch_to_the_next() {
    let _w = watchdog("decode failure", 60);
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), false);
    let mut con = redis::Client::open(redis.url()).unwrap().get_connection().unwrap();
    let good = sluice_synth::image_jpeg(0, &Default::default()).unwrap();
    for (id, image) in [(b"0", good.as_slice()), (b"1", b"junk"), (b"2", &good), (b"3", &good)] {
        let _: String = con.xadd("s", "*", &[("id", id.as_slice()), ("label", b"1"), ("image", image)]).unwrap();
    }
    let _: String = con.xadd("s", "*", &[("end", b"1")]).unwrap();
    let mut spec = stream_spec(&redis.url(), "s", "job", 4, 0, None);
    spec.on_error = ErrorPolicy::Fail;
    let mut loader = StreamLoader::new(spec).unwrap();
    let err = loader.next_batch().err().unwrap();
    assert!(matches!(err, StreamError::Decode { id: 1, .. }), "{err}");
    // The caller goes on: the samples that decode are trained, the bad one is not.
    let again = loader.next_batch().unwrap().map(|b| b.batch.keys);
    assert_eq!(again, Some(vec![0, 2, 3]), "the rest of the failed batch");
    assert!(loader.next_batch().unwrap().is_none());
    assert_eq!(loader.stats().stream.counters.malformed, 1);
}
