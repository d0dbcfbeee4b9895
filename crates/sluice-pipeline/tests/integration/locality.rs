//! Several learners over one dataset, each a real loader over real JPEG files: per step
//! the locality-aware split hands out the baseline's samples in equal local batches, and
//! every learner's cache holds exactly the samples the seed placed on it.

#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use std::path::{Path, PathBuf};

use sluice_core::{
    Assignment, ByteBudget, CacheLevel, CachePolicyKind, CacheSpec, LocalitySpec, PipelineSpec, SourceSpec,
};
use sluice_pipeline::{Loader, PipelineError, Shard};
use sluice_synth::{write_dataset, DatasetOptions};

fn dataset(dir: &Path, images: usize) -> PathBuf {
    let root = dir.join("train");
    let o = DatasetOptions { images, classes: 3, texture: 4, ..Default::default() };
    write_dataset(&root, &o, &|_| {}).unwrap();
    root
}

fn spec(root: &Path, assignment: Assignment, cache_samples: Vec<u64>) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(SourceSpec::ImageFolder { root: root.to_path_buf() }, 16, 4);
    s.threads = 1.into();
    s.seed = 21;
    s.prefetch = 2;
    s.cache = Some(CacheSpec {
        budget: ByteBudget::Bytes(1 << 30),
        level: CacheLevel::Decoded,
        resize: None,
        policy: CachePolicyKind::Lru,
        disk: None,
        share: false,
    });
    s.locality = Some(LocalitySpec { assignment, cache_samples, peers: vec![], peer_timeout_ms: 100, token: None });
    s
}

/// Every learner's batches of one epoch: `[rank][step] -> keys`.
fn epoch(loaders: &[Loader]) -> Vec<Vec<Vec<u64>>> {
    loaders.iter().map(|l| l.iter().map(|b| b.unwrap().keys).collect()).collect()
}

fn learners(root: &Path, assignment: Assignment, cache_samples: &[u64]) -> Vec<Loader> {
    let p = cache_samples.len();
    (0..p)
        .map(|rank| Loader::new(spec(root, assignment, cache_samples.to_vec()), Shard { rank, world_size: p }).unwrap())
        .collect()
}

#[test]
fn learners_agree_on_each_steps_samples_and_cache_only_what_is_placed_on_them() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 50);
    // Uneven caches, 48 of 50 samples placed somewhere.
    let budgets = [20, 4, 24];
    let aware = learners(&root, Assignment::Aware, &budgets);
    let plain = learners(&root, Assignment::Partitioned, &budgets);
    for _ in 0..2 {
        let a = epoch(&aware);
        let b = epoch(&plain);
        let steps = a[0].len();
        assert_eq!(steps, 4, "16 samples per learner in local batches of 4");
        for step in 0..steps {
            let mut sa: Vec<u64> = a.iter().flat_map(|r| r[step].clone()).collect();
            let mut sb: Vec<u64> = b.iter().flat_map(|r| r[step].clone()).collect();
            sa.sort_unstable();
            sb.sort_unstable();
            assert_eq!(sa, sb, "step {step}: the global batch changed");
            let sizes: Vec<usize> = a.iter().map(|r| r[step].len()).collect();
            assert!(sizes.iter().all(|&s| s == sizes[0]), "step {step}: local batches {sizes:?}");
        }
    }
    for (rank, l) in aware.iter().enumerate() {
        let locality = l.locality().unwrap();
        let cache = l.cache().unwrap();
        for (pos, e) in l.manifest().entries().enumerate() {
            if cache.contains(e.key.0) {
                assert!(locality.caches(pos as u32), "rank {rank} cached sample {pos}, placed elsewhere");
            }
        }
        let held = cache.stats().tier.entries as usize;
        assert!(held <= budgets[rank] as usize, "rank {rank} holds {held} entries");
    }
    // Learners mostly load what they cache: far more hits than the plain split's.
    let hits = |ls: &[Loader]| ls.iter().map(|l| l.cache().unwrap().stats().tier.hits).sum::<u64>();
    assert!(hits(&aware) > 2 * hits(&plain), "aware {} vs plain {} hits", hits(&aware), hits(&plain));
}

#[test]
fn a_cache_size_per_rank_must_match_the_learner_count() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 4);
    let err = Loader::new(spec(&root, Assignment::Aware, vec![1, 2]), Shard { rank: 0, world_size: 3 }).err().unwrap();
    assert!(matches!(err, PipelineError::Spec(_)), "{err}");
    assert!(err.to_string().contains("locality.cache_samples"), "{err}");
}

/// A checkpoint names the locality it was taken under: which samples a learner's remaining
/// batches hold follows from the assignment and the cache budgets, so restoring it under
/// another one is refused, naming the field; under the same one it resumes exactly.
#[test]
fn a_checkpoint_restored_under_another_locality_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 40);
    let taken = Loader::new(spec(&root, Assignment::Aware, vec![10, 20]), Shard { rank: 0, world_size: 2 }).unwrap();
    let mut it = taken.iter();
    it.next().unwrap().unwrap();
    let state = taken.state();
    let rest: Vec<Vec<u64>> = it.map(|b| b.unwrap().keys).collect();

    let refused = |s: PipelineSpec, field: &str| {
        let other = Loader::new(s, Shard { rank: 0, world_size: 2 }).unwrap();
        let err = other.load_state(&state).err().unwrap_or_else(|| panic!("restored under another {field}"));
        assert!(err.to_string().contains(field), "{field}: {err}");
    };
    refused(spec(&root, Assignment::Partitioned, vec![10, 20]), "locality.assignment");
    refused(spec(&root, Assignment::Aware, vec![20, 10]), "locality.cache_samples");
    refused(spec(&root, Assignment::Aware, vec![15]), "locality.cache_samples");
    let mut none = spec(&root, Assignment::Aware, vec![10, 20]);
    none.locality = None;
    refused(none, "locality");

    // Under the same locality it resumes where it was.
    let same = Loader::new(spec(&root, Assignment::Aware, vec![10, 20]), Shard { rank: 0, world_size: 2 }).unwrap();
    same.load_state(&state).unwrap();
    let resumed: Vec<Vec<u64>> = same.iter().map(|b| b.unwrap().keys).collect();
    assert_eq!(resumed, rest);
}
