//! The distributed rehearsal buffer: each learner serves its shard over loopback TCP and
//! draws uniformly from all shards, the remote samples prefetched in the background.
//!
//! The peers are real processes: this test binary run again with `PEER_SPEC` set, which
//! makes `peer_process` (otherwise a no-op) read its stream to the end, write the ids in
//! its shard to `PEER_READY`, and keep serving the shard until the test kills it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use redis::Commands;
use sluice_core::PeerToken;
use sluice_stream::{StreamLoader, StreamSpec};

#[test]
fn peer_process() {
    let Ok(spec) = std::env::var("PEER_SPEC") else { return };
    let spec: StreamSpec = serde_json::from_str(&spec).unwrap();
    let ready = PathBuf::from(std::env::var("PEER_READY").unwrap());
    let mut loader = StreamLoader::new(spec).unwrap();
    while loader.next_batch().unwrap().is_some() {}
    let tmp = ready.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(&loader.rehearsal_ids()).unwrap()).unwrap();
    std::fs::rename(&tmp, &ready).unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(1)); // serving the shard until killed
    }
}

/// Starts a peer learner for `spec` and waits until its shard is full; returns the ids in it.
fn peer(spec: &StreamSpec, dir: &Path, name: &str) -> (Child, Vec<u64>) {
    let ready = dir.join(format!("{name}.ready"));
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", sluice_testing::test_name!("peer_process").as_str(), "--nocapture", "--test-threads", "1"])
        .env("PEER_SPEC", serde_json::to_string(spec).unwrap())
        .env("PEER_READY", &ready)
        .stdout(Stdio::null());
    die_with_parent(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    let t0 = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(&ready) {
            return (child, serde_json::from_str(&text).unwrap());
        }
        assert!(child.try_wait().unwrap().is_none(), "peer {name} exited early");
        assert!(t0.elapsed() < Duration::from_secs(60), "peer {name} did not fill its shard");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Pushes one small (24×24) JPEG sample per id (label: id % 4), then the end marker.
fn push_ids(url: &str, stream: &str, ids: Range<u64>) {
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    for id in ids {
        let rgb: Vec<u8> = (0..24 * 24 * 3).map(|i| (i as u64 * 7 + id * 13) as u8).collect();
        let image = sluice_codec::encode_jpeg(&rgb, 24, 24, 90).unwrap();
        let (id_s, label) = (id.to_string(), (id % 4).to_string());
        let _: String =
            con.xadd(stream, "*", &[("id", id_s.as_bytes()), ("label", label.as_bytes()), ("image", &image)]).unwrap();
    }
    let _: String = con.xadd(stream, "*", &[("end", b"1")]).unwrap();
}

/// A learner of rank `rank` reading `stream`, with a shard of `capacity`.
fn learner(url: &str, stream: &str, dir: &Path, capacity: usize, peers: &[String], rank: usize) -> StreamSpec {
    let mut spec = stream_spec(url, stream, "job", 4, 8, Some(&dir.join(format!("rehearsal-{rank}"))));
    let r = spec.rehearsal.as_mut().unwrap();
    r.capacity = capacity;
    r.peers = peers.to_vec();
    r.rank = rank;
    r.token = Some(PeerToken::new("distributed-test-token"));
    spec
}

/// Waits until the loader has `n` of its peers' samples prefetched.
fn wait_ready(loader: &StreamLoader, n: u64) {
    let t0 = Instant::now();
    while loader.stats().stream.peer_ready < n {
        assert!(t0.elapsed() < Duration::from_secs(30), "peers' samples never arrived: {:?}", loader.stats());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The rehearsal samples of a batch, by id.
fn rehearsal_ids(b: &sluice_stream::StreamBatch) -> Vec<u64> {
    b.batch.keys.iter().zip(&b.rehearsal).filter(|(_, r)| **r).map(|(k, _)| *k).collect()
}

#[test]
fn rehearsal_draws_come_from_every_shard_in_proportion_to_its_size() {
    let _w = watchdog("distributed draws", 120);
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), false);
    let url = redis.url();
    // Shards: this learner 16 samples (ids < 1000), peer 1 32 (1000..), peer 2 16 (2000..).
    push_ids(&url, "a", 0..216);
    push_ids(&url, "b", 1000..1032);
    push_ids(&url, "c", 2000..2016);
    let peers = [free_addr(), free_addr(), free_addr()];
    let (mut p1, shard1) = peer(&learner(&url, "b", dir.path(), 32, &peers, 1), dir.path(), "b");
    let (mut p2, shard2) = peer(&learner(&url, "c", dir.path(), 16, &peers, 2), dir.path(), "c");
    assert_eq!((shard1.len(), shard2.len()), (32, 16));

    let mut loader = StreamLoader::new(learner(&url, "a", dir.path(), 16, &peers, 0)).unwrap();
    wait_ready(&loader, 2 * 24); // both peers' pools full: 2 × (r + b) each
                                 // Until this learner's shard is full (16 = 4 batches of 4 new), proportions move.
    for _ in 0..5 {
        loader.next_batch().unwrap().unwrap();
    }
    let before = loader.stats().stream.counters;
    let (mut local, mut from1, mut from2) = (0usize, 0usize, 0usize);
    while let Some(b) = loader.next_batch().unwrap() {
        for id in rehearsal_ids(&b) {
            match id {
                0..1000 => local += 1,
                1000..2000 => {
                    assert!(shard1.contains(&id), "{id} is not in peer 1's shard");
                    from1 += 1;
                }
                _ => {
                    assert!(shard2.contains(&id), "{id} is not in peer 2's shard");
                    from2 += 1;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10)); // the training step
    }
    let after = loader.stats().stream.counters;
    let drawn = local + from1 + from2;
    assert_eq!(drawn as u64, after.rehearsed - before.rehearsed);
    assert_eq!((from1 + from2) as u64, after.rehearsed_remote - before.rehearsed_remote);
    // Draws meant for a peer whose samples had not arrived went local: set them aside.
    let missed = (after.remote_missed - before.remote_missed) as usize;
    assert!(missed < drawn / 4, "{missed} of {drawn} draws missed their peer's samples");
    let fair = (drawn - missed) as f64;
    let shares = [(local - missed) as f64 / fair, from1 as f64 / fair, from2 as f64 / fair];
    // 16 : 32 : 16 of ~300 draws; ±0.1 is over 3 standard deviations.
    for (share, expected) in shares.iter().zip([0.25, 0.5, 0.25]) {
        assert!((share - expected).abs() < 0.1, "shares {shares:?}, expected 1/4, 1/2, 1/4 ({drawn} draws)");
    }
    p1.kill().unwrap();
    p2.kill().unwrap();
    let _ = (p1.wait(), p2.wait());
}

#[test]
fn a_killed_or_silent_peer_never_holds_up_a_step_and_draws_fall_back_to_local_samples() {
    let _w = watchdog("dead peers", 120);
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), false);
    let url = redis.url();
    push_ids(&url, "a", 0..160);
    push_ids(&url, "b", 1000..1032);
    // Peer 2 accepts connections and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let peers = [free_addr(), free_addr(), silent.local_addr().unwrap().to_string()];
    let (mut p1, _) = peer(&learner(&url, "b", dir.path(), 32, &peers, 1), dir.path(), "b");

    let mut loader = StreamLoader::new(learner(&url, "a", dir.path(), 16, &peers, 0)).unwrap();
    wait_ready(&loader, 24);
    let mut remote_before_kill = 0;
    for _ in 0..10 {
        let b = loader.next_batch().unwrap().unwrap();
        remote_before_kill += rehearsal_ids(&b).iter().filter(|&&id| id >= 1000).count();
    }
    assert!(remote_before_kill > 0, "peer 1's samples were drawn while it lived");
    p1.kill().unwrap(); // SIGKILL
    p1.wait().unwrap();

    let mut slowest = Duration::ZERO;
    let mut last: Vec<Vec<u64>> = Vec::new();
    let t0 = Instant::now();
    loop {
        let step = Instant::now();
        let Some(b) = loader.next_batch().unwrap() else { break };
        slowest = slowest.max(step.elapsed());
        assert_eq!(rehearsal_ids(&b).len(), 8, "every batch gets its 8 rehearsal samples");
        last.push(rehearsal_ids(&b));
        std::thread::sleep(Duration::from_millis(10)); // the training step
    }
    let steps = last.len();
    // A step waiting on either peer would take a peer timeout (1 s) or forever.
    assert!(slowest < Duration::from_millis(900), "a step took {slowest:?}");
    assert!(t0.elapsed() < Duration::from_secs(steps as u64 / 4), "{steps} steps took {:?}", t0.elapsed());
    // What was prefetched from peer 1 before it died is drawn; then only local samples.
    assert!(last[steps - 10..].iter().flatten().all(|&id| id < 1000), "{:?}", &last[steps - 10..]);
    let stats = loader.stats().stream;
    assert!(stats.peer_errors > 0, "the dead and the silent peer are counted: {stats:?}");
    assert_eq!(stats.counters.rehearsed, stats.counters.batches * 8, "every batch is full");
    drop(silent);
}

#[test]
fn a_taken_address_or_a_rank_outside_the_peer_list_is_a_clear_error() {
    let _w = watchdog("bad peer config", 60);
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), false);
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let peers = [addr.clone(), free_addr()];
    let err = StreamLoader::new(learner(&redis.url(), "a", dir.path(), 8, &peers, 0)).err().unwrap();
    assert!(matches!(err, sluice_stream::StreamError::RehearsalListen { .. }), "{err}");
    assert!(
        err.to_string().starts_with(&format!("rehearsal buffer: cannot serve this learner's shard on {addr}")),
        "{err}"
    );
    let err = StreamLoader::new(learner(&redis.url(), "a", dir.path(), 8, &peers, 2)).err().unwrap();
    assert_eq!(err.to_string(), "stream config: `rehearsal.rank` 2 is not below the 2 peers listed");
}
