//! Exactly-once across a killed trainer and across a broker restart.
//!
//! The trainer is a real process: this test binary run again with `TRAINER_SPEC` set,
//! which makes `trainer_process` (otherwise a no-op) train: take a batch, "train" on it,
//! then save the state and the ids trained so far together, atomically, like a model
//! checkpoint. The test SIGKILLs it mid-stream and starts it again from that checkpoint.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use serde::{Deserialize, Serialize};
use sluice_stream::{push_dataset, StreamLoader, StreamSpec, StreamState};

const ENTRIES: usize = 48;

/// What the trainer saves after each batch: the loader's state and what it trained on.
#[derive(Serialize, Deserialize)]
struct Checkpoint {
    state: StreamState,
    trained: Vec<u64>,
    rehearsal: Vec<u64>,
    done: bool,
}

#[test]
fn trainer_process() {
    let Ok(spec) = std::env::var("TRAINER_SPEC") else { return };
    let spec: StreamSpec = serde_json::from_str(&spec).unwrap();
    let ckpt_path = std::path::PathBuf::from(std::env::var("TRAINER_CHECKPOINT").unwrap());
    let mut loader = StreamLoader::new(spec).unwrap();
    let mut trained = Vec::new();
    if let Ok(text) = std::fs::read_to_string(&ckpt_path) {
        let ckpt: Checkpoint = serde_json::from_str(&text).unwrap();
        loader.restore(&ckpt.state).unwrap();
        trained = ckpt.trained;
        let restored = serde_json::to_string(&loader.rehearsal_ids()).unwrap();
        std::fs::write(ckpt_path.with_extension("restored"), restored).unwrap();
    }
    while let Some(b) = loader.next_batch().unwrap() {
        std::thread::sleep(Duration::from_millis(30)); // the training step
        trained.extend(b.batch.keys.iter().zip(&b.rehearsal).filter(|(_, r)| !**r).map(|(k, _)| *k));
        let state = loader.state().unwrap();
        save(
            &ckpt_path,
            &Checkpoint { state, trained: trained.clone(), rehearsal: loader.rehearsal_ids(), done: false },
        );
    }
    let state = loader.state().unwrap();
    save(&ckpt_path, &Checkpoint { state, trained, rehearsal: loader.rehearsal_ids(), done: true });
}

fn save(path: &Path, ckpt: &Checkpoint) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(ckpt).unwrap()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn load(path: &Path) -> Option<Checkpoint> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

fn trainer(spec: &StreamSpec, ckpt: &Path) -> std::process::Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", sluice_testing::test_name!("trainer_process").as_str(), "--nocapture", "--test-threads", "1"])
        .env("TRAINER_SPEC", serde_json::to_string(spec).unwrap())
        .env("TRAINER_CHECKPOINT", ckpt)
        .stdout(Stdio::null());
    die_with_parent(&mut cmd);
    cmd.spawn().unwrap()
}

#[test]
fn a_trainer_killed_mid_stream_resumes_from_its_state_and_trains_each_entry_exactly_once() {
    let _w = watchdog("killed trainer", 120);
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), false);
    let manifest = dataset(dir.path(), ENTRIES, 4);
    push_dataset(&manifest, &push_options(&redis.url(), "s", 0.0)).unwrap();
    let spec = stream_spec(&redis.url(), "s", "job", 4, 2, Some(&dir.path().join("rehearsal")));
    let ckpt = dir.path().join("ckpt.json");

    let mut first = trainer(&spec, &ckpt);
    let t0 = Instant::now();
    while load(&ckpt).is_none_or(|c| c.state.batches < 4) {
        assert!(first.try_wait().unwrap().is_none(), "the trainer exited early");
        assert!(t0.elapsed() < Duration::from_secs(60), "the trainer made no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    first.kill().unwrap(); // SIGKILL
    first.wait().unwrap();
    let at_kill = load(&ckpt).unwrap();
    assert!(!at_kill.done && at_kill.trained.len() < ENTRIES, "killed mid-stream");
    assert!(!at_kill.rehearsal.is_empty());

    let mut second = trainer(&spec, &ckpt);
    let status = second.wait().unwrap();
    assert!(status.success(), "the resumed trainer failed: {status}");
    let restored: Vec<u64> =
        serde_json::from_str(&std::fs::read_to_string(ckpt.with_extension("restored")).unwrap()).unwrap();
    assert_eq!(restored, at_kill.rehearsal, "the rehearsal buffer comes back as it was checkpointed");
    let end = load(&ckpt).unwrap();
    assert!(end.done);
    assert_exactly_once(end.trained, ENTRIES, "trained across the kill");
}

#[test]
fn a_broker_restart_mid_stream_loses_no_entry() {
    let _w = watchdog("broker restart", 120);
    let dir = tempfile::tempdir().unwrap();
    let mut redis = Redis::start(dir.path(), true);
    let manifest = dataset(dir.path(), ENTRIES, 4);
    let url = redis.url();
    // The producer keeps pushing through the restart (it waits the broker out).
    let producer = std::thread::spawn(move || push_dataset(&manifest, &push_options(&url, "s", 100.0)).unwrap());
    let spec = stream_spec(&redis.url(), "s", "job", 4, 0, None);
    let mut loader = StreamLoader::new(spec).unwrap();
    let mut trained = Vec::new();
    let mut restarted = false;
    while let Some(b) = loader.next_batch().unwrap() {
        trained.extend(b.batch.keys.iter().copied());
        loader.state().unwrap();
        if !restarted && trained.len() >= ENTRIES / 3 {
            redis.restart();
            restarted = true;
        }
    }
    let report = producer.join().unwrap();
    assert!(restarted);
    assert_eq!(report.pushed, ENTRIES as u64);
    assert_exactly_once(trained, ENTRIES, "trained across the broker restart");
}

#[test]
fn a_resume_rereads_every_pending_entry_before_trusting_the_end_marker() {
    let _w = watchdog("resume after the end marker", 120);
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), false);
    // More entries than one re-read of the pending list returns (256).
    let n = 300;
    let manifest = dataset(dir.path(), n, 2);
    push_dataset(&manifest, &push_options(&redis.url(), "s", 0.0)).unwrap();
    let mut spec = stream_spec(&redis.url(), "s", "job", 4, 0, None);
    // Room for the whole stream and its end marker.
    spec.rate.read_ahead = 100;
    let mut first = StreamLoader::new(spec.clone()).unwrap();
    let mut trained = Vec::new();
    // The trainer reads the end marker early (read-ahead) and checkpoints only once, late:
    // nothing is acknowledged, the first 256 pending entries are all in its ledger.
    while trained.len() < 260 {
        trained.extend(first.next_batch().unwrap().unwrap().batch.keys);
    }
    let state = first.state().unwrap();
    assert!(state.ended, "the end marker was read ahead");
    std::mem::forget(first); // killed: no acknowledgement on the way out
    let mut second = StreamLoader::new(spec).unwrap();
    second.restore(&state).unwrap();
    while let Some(b) = second.next_batch().unwrap() {
        trained.extend(b.batch.keys);
    }
    assert_exactly_once(trained, n, "resumed after the end marker");
}
