//! The cache and the importance sampler inside the loader, on real JPEG files: hits give
//! the same pixels as misses, `auto` picks the level the storage calls for, importance
//! feedback reshapes epochs with unbiasing weights, and resume stays exact.

#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use std::path::{Path, PathBuf};

use sluice_core::{
    Batch, ByteBudget, CacheLevel, CachePolicyKind, CacheSpec, OpSpec, PipelineSpec, SamplingSpec, SourceSpec,
    StorageSpec,
};
use sluice_pipeline::{Loader, LoaderState, Shard};
use sluice_synth::{write_dataset, DatasetOptions};

fn dataset(dir: &Path, images: usize) -> PathBuf {
    let root = dir.join("train");
    let o = DatasetOptions { images, classes: 3, texture: 4, ..Default::default() };
    write_dataset(&root, &o, &|_| {}).unwrap();
    root
}

fn spec(root: &Path, batch: usize, threads: usize, cache: Option<CacheSpec>) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(SourceSpec::ImageFolder { root: root.to_path_buf() }, 32, batch);
    s.threads = threads.into();
    s.seed = 5;
    s.prefetch = 2;
    s.cache = cache;
    s
}

fn cache(budget: u64, level: CacheLevel, resize: Option<u32>, policy: CachePolicyKind) -> Option<CacheSpec> {
    Some(CacheSpec { budget: ByteBudget::Bytes(budget), level, resize, policy, disk: None, share: false })
}

fn collect(loader: &Loader) -> Vec<Batch> {
    loader.iter().map(|b| b.unwrap()).collect()
}

#[test]
fn hits_and_misses_give_bit_identical_batches_at_every_level_and_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 24);
    for (level, resize) in [
        (CacheLevel::Raw, None),
        (CacheLevel::Decoded, None),
        (CacheLevel::Resized, Some(48)),
        (CacheLevel::Raw, Some(48)),
    ] {
        // A cache that holds everything: epoch 1 is all hits.
        let big = Loader::new(spec(&root, 5, 3, cache(1 << 30, level, resize, CachePolicyKind::Lru)), Shard::default())
            .unwrap();
        let e0 = collect(&big);
        let e1 = collect(&big);
        let s = big.stats().cache.unwrap();
        assert_eq!((s.tier.misses, s.tier.hits, s.tier.entries), (24, 24, 24), "{level:?}");
        assert!((s.tier.hit_rate - 0.5).abs() < 1e-9);
        assert!(s.est_time_saved_s > 0.0);
        // A cache too small for any entry: every sample is a miss.
        let none =
            Loader::new(spec(&root, 5, 1, cache(1, level, resize, CachePolicyKind::Lru)), Shard::default()).unwrap();
        let m0 = collect(&none);
        let m1 = collect(&none);
        assert_eq!(none.stats().cache.unwrap().tier.hits, 0);
        assert_eq!(e0, m0, "{level:?}: epoch 0 differs");
        assert_eq!(e1, m1, "{level:?}: hits differ from misses");
        assert_ne!(e0[0].images, e1[0].images, "cached samples are re-augmented each epoch");
    }
}

#[test]
fn a_loader_sharing_another_loaders_cache_hits_what_the_first_decoded() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 24);
    let s = spec(&root, 5, 2, cache(1 << 30, CacheLevel::Decoded, None, CachePolicyKind::Lru));
    let first = Loader::new(s.clone(), Shard::default()).unwrap();
    let e0 = collect(&first);
    let manifest = first.manifest().clone();
    let second =
        Loader::with_shared_cache(s.clone(), manifest.clone(), Shard::default(), first.cache().unwrap()).unwrap();
    // Same pipeline, same epoch 0: the same pixels, every sample a hit on the first's entries.
    assert_eq!(collect(&second), e0);
    let shared = second.stats().cache.unwrap();
    assert_eq!((shared.tier.misses, shared.tier.hits, shared.tier.entries), (24, 24, 24));
    assert_eq!(first.stats().cache.unwrap().tier.hits, 24, "one cache, seen from both loaders");

    // Refused: a pipeline without a cache, or a cache made for another dataset size.
    let mut plain = s.clone();
    plain.cache = None;
    let e = Loader::with_shared_cache(plain, manifest, Shard::default(), first.cache().unwrap()).err().unwrap();
    assert!(e.to_string().contains("needs a pipeline with a cache section"), "{e}");
    let other = Loader::new(spec(&dataset(&dir.path().join("b"), 7), 5, 1, s.cache.clone()), Shard::default()).unwrap();
    let e =
        Loader::with_shared_cache(s, other.manifest().clone(), Shard::default(), first.cache().unwrap()).err().unwrap();
    assert!(e.to_string().contains("the shared cache is for 24 samples, this dataset has 7"), "{e}");
}

#[test]
fn a_raw_cache_without_resize_keeps_the_uncached_pixels() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 12);
    let plain = collect(&Loader::new(spec(&root, 4, 2, None), Shard::default()).unwrap());
    let raw =
        Loader::new(spec(&root, 4, 2, cache(1 << 30, CacheLevel::Raw, None, CachePolicyKind::Lru)), Shard::default())
            .unwrap();
    assert_eq!(collect(&raw), plain);
}

#[test]
fn auto_caches_raw_bytes_on_slow_storage_and_pixels_on_fast_storage() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 40);
    // A budget of ~20 raw entries but under 2 decoded ones.
    let mut slow = spec(&root, 8, 2, cache(1_000_000, CacheLevel::Auto, None, CachePolicyKind::Lru));
    slow.storage = StorageSpec::Throttled { latency_ms: 20.0, bandwidth_mb_s: 200.0, shared_link: None };
    let loader = Loader::new(slow, Shard::default()).unwrap();
    collect(&loader);
    let s = loader.stats().cache.unwrap();
    assert_eq!(s.level, CacheLevel::Raw, "{:?}", s.estimates);
    assert!(s.costs.read_s > 0.015);

    // Local files, a budget that holds every resized entry but only a few decoded ones.
    let fast = spec(&root, 8, 2, cache(200_000, CacheLevel::Auto, Some(32), CachePolicyKind::Lru));
    let loader = Loader::new(fast, Shard::default()).unwrap();
    collect(&loader);
    let s = loader.stats().cache.unwrap();
    assert_eq!(s.level, CacheLevel::Resized, "{:?} {:?}", s.costs, s.estimates);
    assert_eq!(s.estimates.len(), 3);
}

#[test]
fn auto_caches_nothing_when_its_budget_could_save_under_a_twentieth_of_an_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 40);
    // 100 KB holds two raw entries of the 40 (~49 KB each) and no decoded one (~560 KB):
    // at most 2 reads skipped of 40 samples' work, under 5% whatever the machine's load.
    let small = spec(&root, 8, 2, cache(100_000, CacheLevel::Auto, None, CachePolicyKind::Lru));
    let loader = Loader::new(small, Shard::default()).unwrap();
    collect(&loader);
    collect(&loader);
    let s = loader.stats().cache.unwrap();
    let off = s.off.unwrap_or_else(|| panic!("auto cached at {:?}: {:?} {:?}", s.level, s.costs, s.estimates));
    assert!(off.saved_fraction < 0.05 && off.pipeline_per_epoch_s > 0.0, "{off:?}");
    assert_eq!((off.best, s.level), (CacheLevel::Raw, CacheLevel::Auto), "{off:?}");
    assert_eq!((s.tier.entries, s.tier.used_bytes, s.tier.hits, s.tier.misses), (0, 0, 0, 80), "{s:?}");

    // A budget for the whole dataset: auto caches, and the third epoch is all hits.
    let large = spec(&root, 8, 2, cache(1 << 30, CacheLevel::Auto, None, CachePolicyKind::Lru));
    let loader = Loader::new(large, Shard::default()).unwrap();
    for _ in 0..3 {
        collect(&loader);
    }
    let s = loader.stats().cache.unwrap();
    assert_eq!((s.off, s.level), (None, CacheLevel::Decoded), "{:?} {:?}", s.costs, s.estimates);
    assert!(s.tier.hits >= 40, "{s:?}");
}

#[test]
fn loaders_of_one_process_with_cache_share_decode_each_sample_once_and_keep_their_own_pixels() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 24);
    let shared = |seed: u64, batch: usize| {
        let mut s = spec(&root, batch, 2, cache(1 << 30, CacheLevel::Decoded, None, CachePolicyKind::Lru));
        s.seed = seed;
        s.cache.as_mut().unwrap().share = true;
        s
    };
    // An ensemble's first member fills the cache.
    let a = Loader::new(shared(1, 4), Shard::default()).unwrap();
    collect(&a);
    let s = a.stats().cache.unwrap();
    assert_eq!((s.tier.misses, s.tier.hits), (24, 0));
    // A member with another seed, batch size and flip probability reads it: no decode.
    let mut b_spec = shared(2, 6);
    if let Some(OpSpec::RandomHorizontalFlip { p }) = b_spec.ops.last_mut() {
        *p = 0.25;
    }
    let b = Loader::new(b_spec.clone(), Shard::default()).unwrap();
    let from_shared = collect(&b);
    let s = b.stats().cache.unwrap();
    assert_eq!((s.tier.misses, s.tier.hits), (24, 24), "one cache: the second loader missed nothing");
    // Its batches are those it makes alone.
    b_spec.cache.as_mut().unwrap().share = false;
    assert_eq!(from_shared, collect(&Loader::new(b_spec, Shard::default()).unwrap()));
    // Another deterministic prefix (a resize before the random crop) has a cache of its own.
    let mut c_spec = shared(1, 4);
    c_spec.ops.insert(1, OpSpec::resize(40));
    let c = Loader::new(c_spec, Shard::default()).unwrap();
    collect(&c);
    assert_eq!(c.stats().cache.unwrap().tier.misses, 24);
    assert_eq!(a.stats().cache.unwrap().tier.misses, 24);

    // A sampler that steers the cache by one loader's draws cannot share it.
    let mut d_spec = shared(1, 4);
    d_spec.sampling = SamplingSpec::Importance { floor: 0.1, coverage_epochs: 3, miss_discount: 0.5, max_draws: 4.0 };
    let e = d_spec.validate().unwrap_err();
    assert!(e.to_string().contains("cache.share"), "{e}");
}

fn importance_spec(root: &Path, threads: usize) -> PipelineSpec {
    let mut s = spec(root, 6, threads, cache(1 << 30, CacheLevel::Decoded, None, CachePolicyKind::Importance));
    s.sampling = SamplingSpec::Importance { floor: 0.1, coverage_epochs: 3, miss_discount: 0.5, max_draws: 4.0 };
    s
}

/// A fake trainer: key k has loss 5 if k % 5 == 0, else 0.1.
fn report_all(loader: &Loader, batches: &[Batch]) {
    for b in batches {
        let losses: Vec<f64> = b.keys.iter().map(|k| if k % 5 == 0 { 5.0 } else { 0.1 }).collect();
        loader.report(&b.keys, &losses).unwrap();
    }
}

#[test]
fn importance_feedback_reshapes_epochs_with_weights_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 30);
    let run = |threads: usize| {
        let loader = Loader::new(importance_spec(&root, threads), Shard::default()).unwrap();
        let e0 = collect(&loader);
        assert!(
            e0.iter().all(|b| b.weights.as_ref().is_some_and(|w| w.iter().all(|&x| x == 1.0))),
            "uniform until scores exist"
        );
        report_all(&loader, &e0);
        let e1 = collect(&loader);
        (loader, e0, e1)
    };
    let (loader, e0, e1) = run(1);
    let keys1: Vec<u64> = e1.iter().flat_map(|b| b.keys.clone()).collect();
    assert_eq!(keys1.len(), 30);
    let hard = keys1.iter().filter(|k| *k % 5 == 0).count();
    assert!(hard > 12, "hard samples (6 of 30) should dominate epoch 1; drew {hard}");
    // Hard samples are drawn often and weighted down; easy ones the reverse.
    let w_of = |hard: bool| -> f32 {
        e1.iter()
            .flat_map(|b| b.keys.iter().zip(b.weights.as_ref().unwrap()))
            .filter(|(k, _)| (**k % 5 == 0) == hard)
            .map(|(_, w)| *w)
            .next()
            .unwrap()
    };
    assert!(w_of(true) < 1.0 && w_of(false) > 1.0, "{} {}", w_of(true), w_of(false));
    // Thread count changes nothing.
    let (_, e0b, e1b) = run(3);
    assert_eq!((e0.clone(), e1.clone()), (e0b, e1b));

    // Checkpoint mid-epoch 2 after some reports, resume in a fresh loader: same batches.
    report_all(&loader, &e1);
    let mut it = loader.iter();
    let head: Vec<Batch> = (0..2).map(|_| it.next().unwrap().unwrap()).collect();
    drop(it);
    report_all(&loader, &head);
    let saved = serde_json::to_string(&loader.state()).unwrap();
    let rest: Vec<Batch> = collect(&loader);
    report_all(&loader, &rest);
    let e3 = collect(&loader);

    let resumed = Loader::new(importance_spec(&root, 2), Shard::default()).unwrap();
    resumed.load_state(&serde_json::from_str::<LoaderState>(&saved).unwrap()).unwrap();
    let rest_b = collect(&resumed);
    assert_eq!(rest, rest_b);
    report_all(&resumed, &rest_b);
    assert_eq!(collect(&resumed), e3, "the epoch after the resume matches too");
    assert_eq!(resumed.importance_state(), loader.importance_state());
}

#[test]
fn report_rejects_mismatched_lengths() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 4);
    let loader = Loader::new(importance_spec(&root, 1), Shard::default()).unwrap();
    let e = loader.report(&[1, 2], &[0.5]).unwrap_err();
    assert!(e.to_string().contains("2 keys but 1 values"), "{e}");
}

/// Sources with boxes: `sidecar` and `coco` over the same generated images (shapes and
/// their boxes).
fn box_sources(dir: &Path, images: usize) -> Vec<SourceSpec> {
    let root = dir.join("boxes");
    let o = DatasetOptions { images, classes: 3, texture: 4, boxes: true, ..Default::default() };
    write_dataset(&root, &o, &|_| {}).unwrap();
    vec![
        SourceSpec::Sidecar { root: root.clone(), masks: false },
        SourceSpec::Coco { annotations: root.join("instances.json"), images: root, masks: false },
    ]
}

#[test]
fn a_cached_epoch_of_a_source_with_boxes_gives_the_boxes_of_an_uncached_one_at_every_level() {
    let dir = tempfile::tempdir().unwrap();
    for source in box_sources(dir.path(), 12) {
        // A deterministic resize before the cache split moves the boxes the entries keep;
        // the random crop and flip after it move them again every epoch.
        let mut s = PipelineSpec::train_default(source.clone(), 32, 5);
        s.ops.insert(1, sluice_core::OpSpec::resize(48));
        (s.threads, s.seed, s.prefetch) = (2.into(), 5, 2);
        let with =
            |c: Option<CacheSpec>| Loader::new(PipelineSpec { cache: c, ..s.clone() }, Shard::default()).unwrap();
        let plain = with(None);
        let (u0, u1) = (collect(&plain), collect(&plain));
        let boxes = |e: &[Batch]| e.iter().map(|b| b.boxes.clone().unwrap()).collect::<Vec<_>>();
        assert!(boxes(&u0).iter().any(|b| b.counts.iter().any(|&c| c > 0)), "{source:?}: no boxes to compare");
        for (level, resize) in [
            (CacheLevel::Raw, None),
            (CacheLevel::Decoded, None),
            (CacheLevel::Resized, Some(40)),
            (CacheLevel::Raw, Some(40)),
        ] {
            // A cache that holds everything (epoch 1 all hits) against one that holds
            // nothing (every sample computed through the same path).
            let big = with(cache(1 << 30, level, resize, CachePolicyKind::Lru));
            let (e0, e1) = (collect(&big), collect(&big));
            let st = big.stats().cache.unwrap();
            assert_eq!((st.tier.misses, st.tier.hits), (12, 12), "{source:?} {level:?}");
            let none = with(cache(1, level, resize, CachePolicyKind::Lru));
            let (m0, m1) = (collect(&none), collect(&none));
            assert_eq!(none.stats().cache.unwrap().tier.hits, 0);
            assert_eq!(boxes(&e0), boxes(&m0), "{source:?} {level:?} {resize:?}: epoch 0 boxes differ");
            assert_eq!(boxes(&e1), boxes(&m1), "{source:?} {level:?} {resize:?}: boxes of hits differ from misses");
            assert_eq!((e0.clone(), e1.clone()), (m0, m1), "{source:?} {level:?} {resize:?}: batches differ");
            if resize.is_none() {
                // No cache resize: the same boxes as without a cache at all.
                assert_eq!(boxes(&e0), boxes(&u0), "{source:?} {level:?}: epoch 0 boxes differ from uncached");
                assert_eq!(boxes(&e1), boxes(&u1), "{source:?} {level:?}: epoch 1 boxes differ from uncached");
            }
        }
    }
}

#[test]
fn importance_sampling_with_a_cache_over_boxes_resumes_mid_epoch_with_the_same_boxes() {
    let dir = tempfile::tempdir().unwrap();
    let source = box_sources(dir.path(), 30).swap_remove(0);
    let spec = || {
        let mut s = PipelineSpec::train_default(source.clone(), 32, 6);
        (s.threads, s.seed, s.prefetch) = (2.into(), 5, 2);
        s.cache = cache(1 << 30, CacheLevel::Decoded, None, CachePolicyKind::Importance);
        s.sampling = SamplingSpec::Importance { floor: 0.1, coverage_epochs: 3, miss_discount: 0.5, max_draws: 4.0 };
        s
    };
    let loader = Loader::new(spec(), Shard::default()).unwrap();
    let e0 = collect(&loader);
    report_all(&loader, &e0);
    let e1 = collect(&loader);
    let keys1: Vec<u64> = e1.iter().flat_map(|b| b.keys.clone()).collect();
    let hard = keys1.iter().filter(|k| *k % 5 == 0).count();
    assert!(hard > 12, "hard samples (6 of 30) should dominate epoch 1; drew {hard}");
    // Every sample of the reshaped epoch carries its boxes, drawn again from the cache.
    for b in &e1 {
        let boxes = b.boxes.as_ref().unwrap();
        assert_eq!(boxes.counts.len(), b.keys.len());
        assert!(b.weights.is_some());
    }
    assert!(e1.iter().any(|b| b.boxes.as_ref().unwrap().counts.iter().any(|&c| c > 0)));
    assert!(loader.stats().cache.unwrap().tier.hits > 0);

    // Checkpoint two batches into epoch 2, resume in a fresh loader: the same batches,
    // boxes included, for the rest of the epoch and the next.
    report_all(&loader, &e1);
    let mut it = loader.iter();
    let head: Vec<Batch> = (0..2).map(|_| it.next().unwrap().unwrap()).collect();
    drop(it);
    report_all(&loader, &head);
    let saved = serde_json::to_string(&loader.state()).unwrap();
    let rest = collect(&loader);
    report_all(&loader, &rest);
    let e3 = collect(&loader);
    let resumed = Loader::new(spec(), Shard::default()).unwrap();
    resumed.load_state(&serde_json::from_str::<LoaderState>(&saved).unwrap()).unwrap();
    let rest_b = collect(&resumed);
    assert_eq!(rest, rest_b, "the rest of the epoch after the resume");
    report_all(&resumed, &rest_b);
    assert_eq!(collect(&resumed), e3, "the epoch after the resume");
}

#[test]
fn a_cached_epoch_of_a_source_with_masks_gives_the_masks_of_an_uncached_one_at_every_level() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("masks");
    let o = DatasetOptions { images: 10, classes: 3, texture: 4, boxes: true, masks: true, ..Default::default() };
    write_dataset(&root, &o, &|_| {}).unwrap();
    let sources = [
        SourceSpec::Sidecar { root: root.clone(), masks: true },
        SourceSpec::Coco { annotations: root.join("instances.json"), images: root.clone(), masks: true },
    ];
    for source in sources {
        // A deterministic resize before the cache split moves the masks the entries keep;
        // the random crop and flip after it move them again every epoch.
        let mut s = PipelineSpec::train_default(source.clone(), 32, 4);
        s.ops.insert(1, sluice_core::OpSpec::resize(48));
        (s.threads, s.seed, s.prefetch) = (2.into(), 5, 2);
        let with =
            |c: Option<CacheSpec>| Loader::new(PipelineSpec { cache: c, ..s.clone() }, Shard::default()).unwrap();
        let plain = with(None);
        let (u0, u1) = (collect(&plain), collect(&plain));
        let masks =
            |e: &[Batch]| e.iter().map(|b| b.boxes.as_ref().unwrap().masks.clone().unwrap()).collect::<Vec<_>>();
        let classes = |e: &[Batch]| {
            masks(e).iter().flat_map(|m| m.as_bytes().to_vec()).collect::<std::collections::BTreeSet<u8>>().len()
        };
        assert!(classes(&u0) > 1, "{source:?}: the masks must hold more than one class to compare");
        let mut used = Vec::new();
        for (level, resize) in [
            (CacheLevel::Raw, None),
            (CacheLevel::Decoded, None),
            (CacheLevel::Resized, Some(40)),
            (CacheLevel::Raw, Some(40)),
        ] {
            // A cache that holds everything (epoch 1 all hits) against one that holds
            // nothing (every sample computed through the same path).
            let big = with(cache(1 << 30, level, resize, CachePolicyKind::Lru));
            let (e0, e1) = (collect(&big), collect(&big));
            let st = big.stats().cache.unwrap();
            assert_eq!(
                (st.tier.misses, st.tier.hits, st.tier.hit_rate),
                (10, 10, 0.5),
                "{source:?} {level:?} {resize:?}"
            );
            used.push(st.tier.used_bytes);
            let none = with(cache(1, level, resize, CachePolicyKind::Lru));
            let (m0, m1) = (collect(&none), collect(&none));
            assert_eq!(none.stats().cache.unwrap().tier.hits, 0);
            let what = format!("{source:?} {level:?} {resize:?}");
            assert_eq!(masks(&e1).len(), e1.len(), "{what}: every batch of hits carries masks");
            assert_eq!(masks(&e0), masks(&m0), "{what}: epoch 0 masks differ");
            assert_eq!(masks(&e1), masks(&m1), "{what}: masks of hits differ from misses");
            assert_eq!((e0.clone(), e1.clone()), (m0, m1), "{what}: batches (boxes, masks, pixels) differ");
            if resize.is_none() {
                // No cache resize: the same masks (and boxes) as without a cache at all.
                assert_eq!(masks(&e1), masks(&u1), "{what}: masks of hits differ from uncached");
                assert_eq!(e0, u0, "{what}: epoch 0 differs from uncached");
                assert_eq!(e1, u1, "{what}: epoch 1 (hits) differs from uncached");
            }
        }
        // A decoded entry counts its mask (48 px on the shorter side, one byte a pixel)
        // against the budget besides its pixels (three bytes a pixel) and boxes.
        let decoded = used[1];
        let plain_boxes = SourceSpec::Sidecar { root: root.clone(), masks: false };
        if matches!(source, SourceSpec::Sidecar { .. }) {
            let c = cache(1 << 30, CacheLevel::Decoded, None, CachePolicyKind::Lru);
            let no_masks =
                Loader::new(PipelineSpec { cache: c, source: plain_boxes, ..s.clone() }, Shard::default()).unwrap();
            collect(&no_masks);
            let without = no_masks.stats().cache.unwrap().tier.used_bytes;
            // The masks are a quarter of what the entries hold, less the boxes.
            let mask_bytes = decoded - without;
            assert!(
                mask_bytes > 0 && mask_bytes * 3 <= without && mask_bytes * 3 > without * 9 / 10,
                "{mask_bytes} {without}"
            );
        }
    }
}
