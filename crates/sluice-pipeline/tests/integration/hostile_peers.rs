//! Hostile clients against the locality peer servers of a running three-learner job
//! (issue 29): missing and wrong tokens, a wrong protocol, truncated and oversized
//! frames, absurd lengths and a flood of idle connections, round after round, while the
//! learners run their epochs. Every learner must finish every epoch with every sample
//! exactly once, no hostile client may get a sample, and the flood may not cost a thread
//! per connection.

#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sluice_testing::hostile::{attack, frame, hello};
use sluice_testing::threads::{one_at_a_time, threads};

use sluice_core::{
    Assignment, ByteBudget, CacheLevel, CachePolicyKind, CacheSpec, LocalitySpec, PeerToken, PipelineSpec, SourceSpec,
};
use sluice_pipeline::{Loader, Shard};
use sluice_synth::{write_dataset, DatasetOptions};

const TOKEN: &str = "locality-hostile-token";
const IMAGES: usize = 48;

fn dataset(dir: &Path) -> PathBuf {
    let root = dir.join("train");
    let o = DatasetOptions { images: IMAGES, classes: 3, texture: 4, ..Default::default() };
    write_dataset(&root, &o, &|_| {}).unwrap();
    root
}

fn free_addrs(k: usize) -> Vec<String> {
    let ls: Vec<TcpListener> = (0..k).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    ls.iter().map(|l| l.local_addr().unwrap().to_string()).collect()
}

fn learners(root: &Path, peers: &[String]) -> Vec<Loader> {
    let p = peers.len();
    (0..p)
        .map(|rank| {
            let mut s = PipelineSpec::train_default(SourceSpec::ImageFolder { root: root.to_path_buf() }, 16, 4);
            s.threads = 2.into();
            s.seed = 3;
            s.prefetch = 2;
            s.cache = Some(CacheSpec {
                budget: ByteBudget::Bytes(1 << 30),
                level: CacheLevel::Decoded,
                resize: None,
                policy: CachePolicyKind::Lru,
                disk: None,
                share: false,
            });
            s.locality = Some(LocalitySpec {
                assignment: Assignment::Aware,
                cache_samples: vec![(IMAGES / p) as u64],
                peers: peers.to_vec(),
                peer_timeout_ms: 300,
                token: Some(PeerToken::new(TOKEN)),
            });
            Loader::new(s, Shard { rank, world_size: p }).unwrap()
        })
        .collect()
}

/// One epoch on every learner at once; returns every key delivered, all learners together.
fn epoch(loaders: &[Loader]) -> Vec<u64> {
    std::thread::scope(|scope| {
        let runs: Vec<_> = loaders
            .iter()
            .map(|l| scope.spawn(move || l.iter().flat_map(|b| b.unwrap().keys).collect::<Vec<u64>>()))
            .collect();
        runs.into_iter().flat_map(|r| r.join().unwrap()).collect()
    })
}

/// What a hostile client sends, by name.
fn attacks() -> Vec<(&'static str, Vec<u8>)> {
    let good = hello("sluice-locality/1", TOKEN);
    vec![
        ("a request without a hello", frame(&0u32.to_le_bytes())),
        ("requests without a hello", [frame(&1u32.to_le_bytes()), frame(&2u32.to_le_bytes())].concat()),
        ("a wrong token", [hello("sluice-locality/1", "not-the-token"), frame(&0u32.to_le_bytes())].concat()),
        ("an empty token", [hello("sluice-locality/1", ""), frame(&0u32.to_le_bytes())].concat()),
        ("the token as a prefix", [hello("sluice-locality/1", &TOKEN[..5]), frame(&0u32.to_le_bytes())].concat()),
        ("another protocol", [hello("sluice-rehearsal/1", TOKEN), frame(&0u32.to_le_bytes())].concat()),
        ("http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        ("a 4 GiB hello", u32::MAX.to_le_bytes().to_vec()),
        ("a truncated length", vec![9, 0]),
        ("a truncated hello", hello("sluice-locality/1", TOKEN)[..10].to_vec()),
        ("a 4 GiB request", [&good[..], &u32::MAX.to_le_bytes()].concat()),
        ("a 5-byte request", [&good[..], &frame(&[0; 5])].concat()),
        ("a truncated request", [&good[..], &[4, 0, 0, 0, 1]].concat()),
    ]
}

/// Issue 29 item 1: an 8-byte request returned a decoded image to anyone who connected.
#[test]
fn a_client_without_the_token_gets_no_sample() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let peers = free_addrs(2);
    let ls = learners(&root, &peers);
    epoch(&ls);
    for pos in 0..IMAGES as u32 {
        attack(&peers[0], "a request without a hello", &frame(&pos.to_le_bytes()));
    }
}

/// Issue 29 item 1: 5,000 idle connections made 5,000 threads (1,000 here: the same point).
#[test]
fn a_flood_of_idle_connections_does_not_cost_a_thread_each() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let peers = free_addrs(2);
    let ls = learners(&root, &peers);
    let before = threads(std::process::id());
    let flood: Vec<TcpStream> = (0..1000).filter_map(|_| TcpStream::connect(&peers[0]).ok()).collect();
    std::thread::sleep(Duration::from_millis(500));
    let during = threads(std::process::id());
    assert!(during < before + 100, "{} idle connections took {} threads", flood.len(), during - before);
    drop(flood);
    let keys = epoch(&ls);
    assert_eq!(keys.len(), IMAGES);
}

#[test]
fn hostile_clients_get_nothing_while_every_learner_finishes_its_epochs() {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let peers = free_addrs(3);
    let ls = learners(&root, &peers);
    let all: Vec<u64> = (0..IMAGES as u64).collect();
    let mut first = epoch(&ls);
    first.sort_unstable();
    assert_eq!(first, all);
    let before = threads(std::process::id());
    let done = AtomicBool::new(false);
    let t = Instant::now();
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
                peak = peak.max(threads(std::process::id()));
                drop(flood);
            }
            peak
        });
        for e in 0..3 {
            let mut keys = epoch(&ls);
            keys.sort_unstable();
            assert_eq!(keys, all, "epoch {e} under attack: not every sample exactly once");
        }
        done.store(true, Ordering::SeqCst);
        let rounds = attacker.join().unwrap();
        let peak = flooder.join().unwrap();
        assert!(rounds >= 2);
        // Each server keeps at most 32 connections waiting to authenticate.
        assert!(peak < before + 3 * 32 + 50, "the flood took {} threads", peak.saturating_sub(before));
    });
    assert!(t.elapsed() < Duration::from_secs(25), "{:?}", t.elapsed());
    // After the attack the learners still serve each other.
    let served = |ls: &[Loader]| ls.iter().map(|l| l.locality_stats().unwrap().from_peers).sum::<u64>();
    let (from_peers, t) = (served(&ls), Instant::now());
    while served(&ls) == from_peers {
        assert!(t.elapsed() < Duration::from_secs(10), "the peers stopped serving each other");
        epoch(&ls);
    }
}
