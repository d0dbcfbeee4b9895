//! Hostile clients against the rehearsal shard servers of a running two-learner job
//! (issue 29): missing and wrong tokens, a wrong protocol, truncated and oversized
//! frames, absurd lengths and floods of idle connections, while the learners draw from
//! each other's shards. The peer learner is a real process (this test binary run again
//! with `PEER_SPEC` set, as in `distributed.rs`); it must survive, keep its threads
//! bounded and keep serving, and no hostile client may get a sample.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpStream;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_testing::hostile::{attack, frame, hello};
use sluice_testing::threads::{one_at_a_time, threads};

use crate::common::*;
use redis::Commands;
use sluice_core::PeerToken;
use sluice_stream::rehearsal::Rehearsal;
use sluice_stream::shards::ShardServer;
use sluice_stream::{RehearsalPolicy, StreamLoader, StreamSpec};

const TOKEN: &str = "rehearsal-hostile-token";

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

fn peer(spec: &StreamSpec, dir: &Path, name: &str) -> Child {
    let ready = dir.join(format!("{name}.ready"));
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", sluice_testing::test_name!("peer_process").as_str(), "--nocapture", "--test-threads", "1"])
        .env("PEER_SPEC", serde_json::to_string(spec).unwrap())
        .env("PEER_READY", &ready)
        .stdout(Stdio::null());
    die_with_parent(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    let t0 = Instant::now();
    while !ready.exists() {
        assert!(child.try_wait().unwrap().is_none(), "peer {name} exited early");
        assert!(t0.elapsed() < Duration::from_secs(60), "peer {name} did not fill its shard");
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

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

fn learner(url: &str, stream: &str, dir: &Path, peers: &[String], rank: usize) -> StreamSpec {
    let mut spec = stream_spec(url, stream, "job", 4, 8, Some(&dir.join(format!("rehearsal-{rank}"))));
    let r = spec.rehearsal.as_mut().unwrap();
    r.capacity = 32;
    r.peers = peers.to_vec();
    r.rank = rank;
    r.token = Some(PeerToken::new(TOKEN));
    spec
}

fn attacks() -> Vec<(&'static str, Vec<u8>)> {
    let good = hello("sluice-rehearsal/1", TOKEN);
    let ask = frame(&1024u32.to_le_bytes());
    vec![
        ("a request without a hello", ask.clone()),
        ("a wrong token", [hello("sluice-rehearsal/1", "not-the-token"), ask.clone()].concat()),
        ("an empty token", [hello("sluice-rehearsal/1", ""), ask.clone()].concat()),
        ("another protocol", [hello("sluice-locality/1", TOKEN), ask.clone()].concat()),
        ("noise", (0..300u32).map(|i| (i * 37 % 251) as u8).collect()),
        ("a 4 GiB hello", u32::MAX.to_le_bytes().to_vec()),
        ("a truncated length", vec![9, 0]),
        ("a truncated hello", good[..12].to_vec()),
        ("a 4 GiB request", [&good[..], &u32::MAX.to_le_bytes()].concat()),
        ("an 8-byte request", [&good[..], &frame(&[0; 8])].concat()),
        ("a truncated request", [&good[..], &[4, 0, 0, 0, 1]].concat()),
    ]
}

/// A shard of `n` samples served on a free loopback port.
fn served_shard(n: u64) -> (ShardServer, String) {
    let mut shard = Rehearsal::new(RehearsalPolicy::Reservoir, n as usize, 1);
    for id in 0..n {
        let s = sluice_stream::entry::Sample { entry: format!("{id}-0"), id, label: 0, image: vec![1; 64] };
        shard.offer(&s);
    }
    let addr = free_addr();
    let token = sluice_transport::Token::new(TOKEN, "test").unwrap();
    let server = ShardServer::start(&addr, token, Arc::new(parking_lot::Mutex::new(shard)), 1).unwrap();
    (server, addr)
}

/// Issue 29 item 1: an 8-byte request returned up to 1,024 samples to anyone.
#[test]
fn a_client_without_the_token_gets_no_sample() {
    let _one = one_at_a_time();
    let (_server, addr) = served_shard(8);
    attack(&addr, "a request without a hello", &frame(&1024u32.to_le_bytes()));
}

/// Issue 29 item 1: every connection got a thread, without a bound.
#[test]
fn a_flood_of_idle_connections_does_not_cost_a_thread_each() {
    let _one = one_at_a_time();
    let (_server, addr) = served_shard(8);
    let before = threads(std::process::id());
    let flood: Vec<TcpStream> = (0..1000).filter_map(|_| TcpStream::connect(&addr).ok()).collect();
    std::thread::sleep(Duration::from_millis(500));
    let during = threads(std::process::id());
    assert!(during < before + 100, "{} idle connections took {} threads", flood.len(), during - before);
}

#[test]
fn hostile_clients_get_nothing_while_the_learners_keep_drawing_from_each_other() {
    let _one = one_at_a_time();
    let _w = watchdog("hostile rehearsal peers", 120);
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), false);
    let url = redis.url();
    push_ids(&url, "a", 0..400);
    push_ids(&url, "b", 1000..1032);
    let peers = [free_addr(), free_addr()];
    let mut p1 = peer(&learner(&url, "b", dir.path(), &peers, 1), dir.path(), "b");
    let p1_threads = threads(p1.id());
    let mut loader = StreamLoader::new(learner(&url, "a", dir.path(), &peers, 0)).unwrap();
    let done = AtomicBool::new(false);
    let (mut remote, mut batches) = (0u64, 0u64);
    std::thread::scope(|scope| {
        let attacker = scope.spawn(|| {
            let mut rounds = 0;
            while !done.load(Ordering::SeqCst) || rounds < 2 {
                for addr in &peers {
                    for (what, bytes) in attacks() {
                        attack(addr, what, &bytes);
                    }
                }
                rounds += 1;
            }
            rounds
        });
        let flooder = scope.spawn(|| {
            let mut peak = 0;
            while !done.load(Ordering::SeqCst) {
                let flood: Vec<TcpStream> =
                    peers.iter().flat_map(|a| (0..200).filter_map(move |_| TcpStream::connect(a).ok())).collect();
                std::thread::sleep(Duration::from_millis(200));
                peak = peak.max(threads(p1.id()));
                drop(flood);
            }
            peak
        });
        while let Some(b) = loader.next_batch().unwrap() {
            batches += 1;
            remote += b.batch.keys.iter().zip(&b.rehearsal).filter(|(k, r)| **r && **k >= 1000).count() as u64;
        }
        done.store(true, Ordering::SeqCst);
        assert!(attacker.join().unwrap() >= 2);
        let peak = flooder.join().unwrap();
        assert!(peak < p1_threads + 32 + 20, "the flood took {} of the peer's threads", peak - p1_threads);
    });
    assert_eq!(batches, 100, "the learner did not read its whole stream");
    assert!(p1.try_wait().unwrap().is_none(), "the peer learner died");
    // The learners still serve each other: the peer's samples keep arriving.
    let t = Instant::now();
    while loader.stats().stream.peer_ready == 0 {
        assert!(t.elapsed() < Duration::from_secs(10), "the peer stopped serving: {:?}", loader.stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(remote > 0, "no rehearsal sample came from the peer during the attack");
    p1.kill().unwrap();
    p1.wait().unwrap();
}
