//! The collaborative cache between learners on loopback TCP: with the caches together
//! holding the dataset, no learner reads storage after the first epoch, and a learner
//! whose peer is gone still finishes its epoch, from storage, without waiting on it.

#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sluice_core::{
    Assignment, ByteBudget, CacheLevel, CachePolicyKind, CacheSpec, LocalitySpec, PeerToken, PipelineSpec, SourceSpec,
};
use sluice_pipeline::{Loader, Shard};
use sluice_synth::{write_dataset, DatasetOptions};

fn dataset(dir: &Path, images: usize) -> PathBuf {
    let root = dir.join("train");
    let o = DatasetOptions { images, classes: 3, texture: 4, ..Default::default() };
    write_dataset(&root, &o, &|_| {}).unwrap();
    root
}

/// Loopback addresses nobody listens on yet.
fn free_addrs(k: usize) -> Vec<String> {
    let ls: Vec<TcpListener> = (0..k).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    ls.iter().map(|l| l.local_addr().unwrap().to_string()).collect()
}

fn learners(root: &Path, p: usize, cache_samples: u64, peers: &[String]) -> Vec<Loader> {
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
                cache_samples: vec![cache_samples],
                peers: peers.to_vec(),
                peer_timeout_ms: 300,
                token: Some(PeerToken::new("locality-peers-test")),
            });
            Loader::new(s, Shard { rank, world_size: p }).unwrap()
        })
        .collect()
}

/// One epoch on every learner at once, as DDP runs them; fails the test past 60 s.
fn epoch(loaders: &[Loader]) {
    let t = Instant::now();
    std::thread::scope(|scope| {
        for l in loaders {
            scope.spawn(move || {
                for b in l.iter() {
                    b.unwrap();
                }
            });
        }
    });
    assert!(t.elapsed() < Duration::from_secs(60), "an epoch took {:?}", t.elapsed());
}

#[test]
fn after_the_first_epoch_no_learner_reads_storage() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 48);
    let p = 3;
    let ls = learners(&root, p, 16, &free_addrs(p));
    epoch(&ls);
    let reads = |ls: &[Loader]| ls.iter().map(|l| l.locality_stats().unwrap().storage_reads).sum::<u64>();
    let first = reads(&ls);
    assert_eq!(first, 48, "each sample read once, by its owner");
    for _ in 0..2 {
        epoch(&ls);
    }
    assert_eq!(reads(&ls), first, "storage was read after the first epoch");
    let from_peers: u64 = ls.iter().map(|l| l.locality_stats().unwrap().from_peers).sum();
    let served: u64 = ls.iter().map(|l| l.locality_stats().unwrap().served_to_peers).sum();
    assert!(from_peers > 0 && from_peers == served, "from peers {from_peers}, served {served}");
    assert!(ls.iter().all(|l| l.locality_stats().unwrap().peer_fallbacks == 0));
}

#[test]
fn a_learner_whose_peer_is_gone_falls_back_to_storage_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 48);
    let p = 3;
    let mut ls = learners(&root, p, 16, &free_addrs(p));
    epoch(&ls);
    // Learner 2 goes away with its cache and its server.
    drop(ls.pop());
    let before: u64 = ls.iter().map(|l| l.locality_stats().unwrap().storage_reads).sum();
    let t = Instant::now();
    epoch(&ls);
    assert!(t.elapsed() < Duration::from_secs(20), "the survivors waited on the dead peer: {:?}", t.elapsed());
    let stats: Vec<_> = ls.iter().map(|l| l.locality_stats().unwrap()).collect();
    let after: u64 = stats.iter().map(|s| s.storage_reads).sum();
    assert!(after > before, "samples placed on the dead learner must come from storage");
    assert!(stats.iter().any(|s| s.peer_fallbacks > 0), "{stats:?}");
}

#[test]
fn a_learner_with_peers_and_no_token_refuses_to_start() {
    if std::env::var_os("SLUICE_PEER_TOKEN").is_some() {
        return; // the environment supplies the token
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 6);
    let mut s = PipelineSpec::train_default(SourceSpec::ImageFolder { root }, 16, 2);
    s.cache = Some(CacheSpec {
        budget: ByteBudget::Bytes(1 << 20),
        level: CacheLevel::Raw,
        resize: None,
        policy: CachePolicyKind::Lru,
        disk: None,
        share: false,
    });
    s.locality = Some(LocalitySpec {
        assignment: Assignment::Aware,
        cache_samples: vec![3],
        peers: free_addrs(2),
        peer_timeout_ms: 300,
        token: None,
    });
    let err = Loader::new(s, Shard { rank: 0, world_size: 2 }).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("locality.token") && err.contains("SLUICE_PEER_TOKEN"), "{err}");
}

/// Each sample's boxes (as bits), box labels and mask (empty without masks) in
/// `batches`, by key.
type Records = (Vec<u32>, Vec<i64>, Vec<u8>);

fn boxes_by_key(batches: &[sluice_core::Batch]) -> std::collections::BTreeMap<u64, Records> {
    let mut out = std::collections::BTreeMap::new();
    for batch in batches {
        let b = batch.boxes.as_ref().unwrap();
        for (i, &key) in batch.keys.iter().enumerate() {
            let rows = i * b.max_boxes..i * b.max_boxes + b.counts[i] as usize;
            let bits = b.boxes[rows.start * 4..rows.end * 4].iter().map(|v| v.to_bits()).collect();
            let mask = b.masks.as_ref().map_or(Vec::new(), |m| {
                let n = m.shape[1] * m.shape[2];
                m.as_bytes()[i * n..(i + 1) * n].to_vec()
            });
            out.insert(key, (bits, b.labels[rows].to_vec(), mask));
        }
    }
    out
}

#[test]
fn learners_of_a_source_with_boxes_take_only_raw_bytes_from_peers_and_keep_every_box() {
    records_between_learners(false, CacheLevel::Decoded);
}

#[test]
fn learners_of_a_source_with_masks_keep_every_mask_at_each_level() {
    // Decoded: entries keep masks, so peers serve none of them (each learner reads storage
    // instead); raw: peers serve file bytes, and the asking learner reads the mask again.
    for level in [CacheLevel::Decoded, CacheLevel::Raw] {
        records_between_learners(true, level);
    }
}

fn records_between_learners(masks: bool, level: CacheLevel) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("boxes");
    let o = DatasetOptions { images: 24, classes: 3, texture: 4, boxes: true, masks, ..Default::default() };
    write_dataset(&root, &o, &|_| {}).unwrap();
    let source = SourceSpec::Sidecar { root, masks };
    let plain = {
        let mut s = PipelineSpec::train_default(source.clone(), 16, 4);
        (s.threads, s.seed) = (2.into(), 3);
        Loader::new(s, Shard::default()).unwrap()
    };
    let p = 2;
    let peers = free_addrs(p);
    let ls: Vec<Loader> = (0..p)
        .map(|rank| {
            let mut s = PipelineSpec::train_default(source.clone(), 16, 4);
            (s.threads, s.seed, s.prefetch) = (2.into(), 3, 2);
            s.cache = Some(CacheSpec {
                budget: ByteBudget::Bytes(1 << 30),
                level,
                resize: None,
                policy: CachePolicyKind::Lru,
                disk: None,
                share: false,
            });
            s.locality = Some(LocalitySpec {
                assignment: Assignment::Aware,
                cache_samples: vec![12],
                peers: peers.clone(),
                peer_timeout_ms: 300,
                token: Some(PeerToken::new("locality-boxes-test")),
            });
            Loader::new(s, Shard { rank, world_size: p }).unwrap()
        })
        .collect();
    for epoch in 0..2 {
        let want = boxes_by_key(&plain.iter().map(|b| b.unwrap()).collect::<Vec<_>>());
        assert!(want.values().any(|b| !b.0.is_empty()));
        assert!(want.values().all(|b| b.2.is_empty() != masks), "masks = {masks}");
        let got: Vec<Vec<sluice_core::Batch>> = std::thread::scope(|scope| {
            let hs: Vec<_> = ls.iter().map(|l| scope.spawn(move || l.iter().map(|b| b.unwrap()).collect())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (rank, batches) in got.iter().enumerate() {
            for (key, boxes) in boxes_by_key(batches) {
                let what = format!("{level:?} epoch {epoch}, rank {rank}, key {key}");
                assert_eq!(Some(&boxes), want.get(&key), "{what}: boxes or mask differ");
            }
        }
    }
    let from_peers: u64 = ls.iter().map(|l| l.locality_stats().unwrap().from_peers).sum();
    if level == CacheLevel::Raw {
        assert!(from_peers > 0, "raw entries are served to peers");
    } else {
        // The peers' decoded entries hold boxes (and masks) the peer protocol cannot carry:
        // not served.
        assert_eq!(from_peers, 0);
        assert!(ls.iter().any(|l| l.locality_stats().unwrap().peer_fallbacks > 0));
    }
}
