//! Learners of one job share its consumer group: a live learner keeps what it holds (read
//! ahead, or trained and waiting for a checkpoint) however slow its steps; only a dead
//! learner's entries go to the others. What a learner reads ahead is bounded
//! (`rate.read_ahead` batches), so a slow one leaves the backlog to the others.
//!
//! The learners of the three-learner test are real processes: this test binary run again
//! with `LEARNER_SPEC` set, which makes `learner_process` (otherwise a no-op) train until a
//! stop file appears, writing what it trained after every batch.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use redis::Commands;
use serde::{Deserialize, Serialize};
use sluice_stream::{push_dataset, StreamLoader, StreamSpec};

#[test]
fn a_learner_that_pauses_past_claim_idle_keeps_what_it_read_ahead() {
    let _w = watchdog("pause past claim_idle_ms", 60);
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), false);
    let n = 64;
    push_dataset(&dataset(dir.path(), n, 4), &push_options(&redis.url(), "s", 0.0)).unwrap();
    let mut spec = stream_spec(&redis.url(), "s", "job", 4, 0, None);
    spec.claim_idle_ms = 1000;
    // Room for the whole stream and its end marker, so that `a` holds all of it.
    spec.rate.read_ahead = 32;
    spec.consumer = "a".into();
    let mut a = StreamLoader::new(spec.clone()).unwrap();
    spec.consumer = "b".into();
    let mut b = StreamLoader::new(spec).unwrap();

    // `a` reads the whole stream ahead, takes one batch, then steps for longer than claim_idle_ms.
    let mut trained_a: Vec<u64> = a.next_batch().unwrap().unwrap().batch.keys;
    std::thread::sleep(Duration::from_millis(1500));
    // `b` finds nothing to read and must not take what `a` holds.
    let mut trained_b = Vec::new();
    let t0 = Instant::now();
    while let Some(batch) = b.next_batch_interruptible(&mut || t0.elapsed() > Duration::from_millis(1200)).unwrap() {
        trained_b.extend(batch.batch.keys);
    }
    while let Some(batch) = a.next_batch().unwrap() {
        trained_a.extend(batch.batch.keys);
    }
    let a_set: HashSet<u64> = trained_a.iter().copied().collect();
    let overlap = trained_b.iter().filter(|k| a_set.contains(k)).count();
    assert_eq!(overlap, 0, "both learners trained {overlap} samples; `b` claimed from a live learner");
    assert_eq!(b.stats().stream.counters.claimed, 0);
    assert_exactly_once([trained_a, trained_b].concat(), n, "two learners, one pausing");
}

/// Entries of the group that `consumer` holds (read and not acknowledged).
fn held_by(con: &mut redis::Connection, consumer: &str) -> usize {
    // No group yet (NOGROUP) until the first learner has started: nothing held.
    let pending: Option<redis::streams::StreamPendingReply> = con.xpending("s", "job").ok();
    let Some(redis::streams::StreamPendingReply::Data(data)) = pending else { return 0 };
    data.consumers.iter().find(|c| c.name == consumer).map_or(0, |c| c.pending)
}

/// Two learners of one group over a backlog of 40 entries: `slow` steps 1 s per batch
/// and reads first, `fast` starts 0.5 s later. What `slow` takes from the group ahead of
/// its training is bounded by what it trains soon, so `fast` trains the rest at once
/// instead of waiting while `slow` works through a backlog it hoarded.
#[test]
fn a_slow_learner_leaves_the_backlog_to_a_fast_one() {
    let _w = watchdog("slow learner, shared backlog", 90);
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), false);
    let n = 40u64;
    let mut con = redis::Client::open(redis.url()).unwrap().get_connection().unwrap();
    push_ids(&mut con, 0..n, f64::INFINITY);
    let mut spec = stream_spec(&redis.url(), "s", "job", 4, 0, None);
    spec.claim_idle_ms = 1000;
    let named = |name: &str| StreamSpec { consumer: name.into(), ..spec.clone() };

    let t0 = Instant::now();
    let (mut slow, slow_out) = learner(&named("slow"), dir.path(), 1000, true);
    // `slow` has read from the group before `fast` exists.
    let slow_first_read = loop {
        let held = held_by(&mut con, "slow");
        if held > 0 {
            break held;
        }
        assert!(slow.try_wait().unwrap().is_none(), "the slow learner exited early");
        assert!(t0.elapsed() < Duration::from_secs(30), "the slow learner read nothing");
        std::thread::sleep(Duration::from_millis(5));
    };
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let (mut fast, fast_out) = learner(&named("fast"), dir.path(), 10, true);
    loop {
        let (f, s) = (read(&fast_out), read(&slow_out));
        let distinct: HashSet<u64> = f.trained.iter().chain(&s.trained).copied().collect();
        if distinct.len() == n as usize {
            break;
        }
        for (child, name) in [(&mut fast, "fast"), (&mut slow, "slow")] {
            assert!(child.try_wait().unwrap().is_none(), "learner {name} exited early");
        }
        assert!(started.elapsed() < Duration::from_secs(60), "{} of {n} entries trained", distinct.len());
        std::thread::sleep(Duration::from_millis(10));
    }
    let (wall, since_slow) = (started.elapsed(), t0.elapsed());
    std::fs::write(dir.path().join("stop"), b"").unwrap();
    for (child, name) in [(&mut fast, "fast"), (&mut slow, "slow")] {
        let status = child.wait().unwrap();
        assert!(status.success(), "learner {name} failed: {status}");
    }
    let (f, s) = (read(&fast_out), read(&slow_out));
    eprintln!(
        "two learners over {n} entries: slow read {slow_first_read} at first and trained {}, fast trained {}; \
         all trained {:.2} s after fast started ({:.2} s after slow did)",
        s.trained.len(),
        f.trained.len(),
        wall.as_secs_f64(),
        since_slow.as_secs_f64()
    );
    assert_exactly_once([f.trained.clone(), s.trained.clone()].concat(), n as usize, "two learners, one slow");
    let bound = spec.rate.read_ahead * spec.new_per_batch;
    assert!(slow_first_read <= bound, "the slow learner read {slow_first_read} entries at first, past {bound}");
    assert!(
        f.trained.len() as u64 * 10 >= n * 4,
        "the fast learner trained {} of {n} entries and the slow one {}: the slow one took the backlog \
         ({slow_first_read} entries at its first read) and the fast one waited",
        f.trained.len(),
        s.trained.len()
    );
}

/// What a learner process writes after every batch.
#[derive(Serialize, Deserialize, Default)]
struct Report {
    trained: Vec<u64>,
    claimed: u64,
    done: bool,
}

#[test]
fn learner_process() {
    let Ok(spec) = std::env::var("LEARNER_SPEC") else { return };
    let spec: StreamSpec = serde_json::from_str(&spec).unwrap();
    let out = PathBuf::from(std::env::var("LEARNER_OUT").unwrap());
    let stop = PathBuf::from(std::env::var("LEARNER_STOP").unwrap());
    let step = Duration::from_millis(std::env::var("LEARNER_STEP_MS").unwrap().parse().unwrap());
    let checkpoint = std::env::var("LEARNER_STATE").is_ok_and(|v| v == "1");
    let mut loader = StreamLoader::new(spec).unwrap();
    let mut report = Report::default();
    while let Some(b) = loader.next_batch_interruptible(&mut || stop.exists()).unwrap() {
        std::thread::sleep(step); // the training step
        report.trained.extend(b.batch.keys);
        if checkpoint {
            loader.state().unwrap();
        }
        report.claimed = loader.stats().stream.counters.claimed;
        write(&out, &report);
    }
    report.done = true;
    write(&out, &report);
}

fn write(path: &Path, report: &Report) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(report).unwrap()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn read(path: &Path) -> Report {
    std::fs::read_to_string(path).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default()
}

fn learner(spec: &StreamSpec, dir: &Path, step_ms: u64, checkpoint: bool) -> (Child, PathBuf) {
    let out = dir.join(format!("{}.json", spec.consumer));
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", sluice_testing::test_name!("learner_process").as_str(), "--nocapture", "--test-threads", "1"])
        .env("LEARNER_SPEC", serde_json::to_string(spec).unwrap())
        .env("LEARNER_OUT", &out)
        .env("LEARNER_STOP", dir.join("stop"))
        .env("LEARNER_STEP_MS", step_ms.to_string())
        .env("LEARNER_STATE", if checkpoint { "1" } else { "0" })
        .stdout(Stdio::null());
    die_with_parent(&mut cmd);
    (cmd.spawn().unwrap(), out)
}

/// Appends one small JPEG sample per id (label: id % 4), no end marker: one marker would
/// stop one learner of three; the test stops them.
fn push_ids(con: &mut redis::Connection, ids: std::ops::Range<u64>, per_second: f64) {
    let t0 = Instant::now();
    for (n, id) in ids.enumerate() {
        let due = Duration::from_secs_f64(n as f64 / per_second);
        std::thread::sleep(due.saturating_sub(t0.elapsed()));
        let rgb: Vec<u8> = (0..24 * 24 * 3).map(|i| (i as u64 * 7 + id * 13) as u8).collect();
        let image = sluice_codec::encode_jpeg(&rgb, 24, 24, 90).unwrap();
        let (id_s, label) = (id.to_string(), (id % 4).to_string());
        let _: String =
            con.xadd("s", "*", &[("id", id_s.as_bytes()), ("label", label.as_bytes()), ("image", &image)]).unwrap();
    }
}

#[test]
fn three_learners_one_slow_and_one_killed_train_every_entry_exactly_once() {
    let _w = watchdog("three learners", 90);
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), false);
    let n = 60u64;
    let mut con = redis::Client::open(redis.url()).unwrap().get_connection().unwrap();
    let mut spec = stream_spec(&redis.url(), "s", "job", 1, 0, None);
    spec.rate.buffer = 4;
    spec.rate.read_ahead = 4;
    spec.claim_idle_ms = 1000;
    let named = |name: &str| StreamSpec { consumer: name.into(), ..spec.clone() };

    // `slow` steps for 1.5 × claim_idle_ms and checkpoints after every step. It starts
    // alone on a first burst, so that it reads ahead a full buffer it takes seconds to train.
    push_ids(&mut con, 0..8, f64::INFINITY);
    let (mut slow, slow_out) = learner(&named("slow"), dir.path(), 1500, true);
    let t0 = Instant::now();
    while read(&slow_out).trained.is_empty() {
        assert!(slow.try_wait().unwrap().is_none(), "the slow learner exited early");
        assert!(t0.elapsed() < Duration::from_secs(30), "the slow learner made no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    // `fast` checkpoints after every step; `doomed` never does: everything it reads stays
    // pending until it is claimed. The rest of the stream arrives while they run.
    let (mut fast, fast_out) = learner(&named("fast"), dir.path(), 10, true);
    let (mut doomed, doomed_out) = learner(&named("doomed"), dir.path(), 10, false);
    let url = redis.url();
    let producer = std::thread::spawn(move || {
        let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
        push_ids(&mut con, 8..n, 50.0);
    });
    while read(&doomed_out).trained.len() < 3 {
        assert!(doomed.try_wait().unwrap().is_none(), "the doomed learner exited early");
        assert!(t0.elapsed() < Duration::from_secs(30), "the doomed learner made no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    doomed.kill().unwrap(); // SIGKILL, never restarted
    doomed.wait().unwrap();
    let killed = read(&doomed_out);

    // Wait until every entry was trained by a survivor and nothing is pending any more:
    // no entry is left that anyone could train again.
    loop {
        let (f, s) = (read(&fast_out), read(&slow_out));
        let distinct: HashSet<u64> = f.trained.iter().chain(&s.trained).copied().collect();
        let pending: redis::streams::StreamPendingReply = con.xpending("s", "job").unwrap();
        if distinct.len() == n as usize && pending.count() == 0 && producer.is_finished() {
            break;
        }
        for (child, name) in [(&mut fast, "fast"), (&mut slow, "slow")] {
            assert!(child.try_wait().unwrap().is_none(), "learner {name} exited early");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "not every entry was trained: {} of {n}, {} pending",
            distinct.len(),
            pending.count()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::write(dir.path().join("stop"), b"").unwrap();
    for (child, name) in [(&mut fast, "fast"), (&mut slow, "slow")] {
        let status = child.wait().unwrap();
        assert!(status.success(), "learner {name} failed: {status}");
    }
    producer.join().unwrap();
    let (f, s) = (read(&fast_out), read(&slow_out));
    assert!(f.done && s.done);
    assert!(killed.trained.len() >= 3);
    assert_exactly_once([f.trained, s.trained.clone()].concat(), n as usize, "across the survivors");
    // The slow learner lost nothing: it trained the whole buffer it read ahead at the start.
    assert!(s.trained.len() >= 4, "the slow learner trained {:?}", s.trained);
    // The dead learner's entries (what it trained unacknowledged, and what it read ahead)
    // were claimed; nothing the slow learner held was.
    let claimed = f.claimed + s.claimed;
    let dead_held = killed.trained.len() as u64 + 1 + spec.rate.buffer as u64;
    assert!(claimed >= killed.trained.len() as u64, "claimed {claimed} of the dead learner's entries");
    assert!(claimed <= dead_held, "claimed {claimed}: more than the dead learner held");
}
