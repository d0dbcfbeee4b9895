//! The cache's disk tier inside the loader, on real files: a new loader over the same
//! folder hits what an earlier one wrote (same pixels), a corrupt or half-written entry is
//! a miss and never served, the tier keeps to its budget, and with half the dataset on
//! disk Belady's rule over the known next epoch beats LRU on the second epoch.

#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use std::path::{Path, PathBuf};

use sluice_core::{
    Batch, ByteBudget, CacheLevel, CachePolicyKind, CacheSpec, DiskCacheSpec, DiskPolicyKind, PipelineSpec, SourceSpec,
};
use sluice_pipeline::cache::DiskStats;
use sluice_pipeline::{Loader, Shard};
use sluice_synth::{write_dataset, DatasetOptions};

fn dataset(dir: &Path, images: usize) -> PathBuf {
    let root = dir.join("train");
    let o = DatasetOptions { images, classes: 3, texture: 4, ..Default::default() };
    write_dataset(&root, &o, &|_| {}).unwrap();
    root
}

/// A memory tier too small for any entry over a disk tier of `budget` bytes in `dir`.
fn spec(root: &Path, dir: &Path, budget: u64, level: CacheLevel, policy: DiskPolicyKind) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(SourceSpec::ImageFolder { root: root.to_path_buf() }, 32, 4);
    s.threads = 2.into();
    s.seed = 5;
    s.prefetch = 2;
    s.cache = Some(CacheSpec {
        budget: ByteBudget::Bytes(1),
        level,
        resize: None,
        policy: CachePolicyKind::Lru,
        disk: Some(DiskCacheSpec { dir: dir.to_path_buf(), budget: ByteBudget::Bytes(budget), policy }),
        share: false,
    });
    s
}

fn collect(loader: &Loader) -> Vec<Batch> {
    loader.iter().map(|b| b.unwrap()).collect()
}

fn disk(loader: &Loader) -> DiskStats {
    loader.stats().cache.unwrap().disk.unwrap()
}

/// The entry files of the one pipeline folder under `dir`, and their total size.
fn entry_files(dir: &Path) -> (Vec<PathBuf>, u64) {
    let mut files = Vec::new();
    for ns in std::fs::read_dir(dir).unwrap() {
        for f in std::fs::read_dir(ns.unwrap().path()).unwrap() {
            let path = f.unwrap().path();
            if path.extension().is_some_and(|e| e == "entry") {
                files.push(path);
            }
        }
    }
    files.sort();
    let bytes = files.iter().map(|f| std::fs::metadata(f).unwrap().len()).sum();
    (files, bytes)
}

#[test]
fn a_new_loader_over_the_same_folder_hits_what_an_earlier_one_wrote() {
    let tmp = tempfile::tempdir().unwrap();
    let root = dataset(tmp.path(), 12);
    let dir = tmp.path().join("disk");
    let s = spec(&root, &dir, 1 << 30, CacheLevel::Decoded, DiskPolicyKind::Belady);
    let first = Loader::new(s.clone(), Shard::default()).unwrap();
    let e0 = collect(&first);
    let d = disk(&first);
    assert_eq!((d.tier.hits, d.tier.misses, d.tier.insertions, d.tier.entries), (0, 12, 12, 12));
    drop(first);

    let second = Loader::new(s.clone(), Shard::default()).unwrap();
    assert_eq!(disk(&second).recovered, 12);
    assert_eq!(collect(&second), e0, "entries read back give the same pixels");
    let d = disk(&second);
    assert_eq!((d.tier.hits, d.tier.misses, d.corrupt, d.tier.insertions), (12, 0, 0, 0));

    // Another dataset (its manifest fingerprint differs, its keys overlap): none served.
    let other_root = dataset(&tmp.path().join("other"), 11);
    let third =
        Loader::new(spec(&other_root, &dir, 1 << 30, CacheLevel::Decoded, DiskPolicyKind::Belady), Shard::default())
            .unwrap();
    assert_eq!(disk(&third).recovered, 0);
    collect(&third);
    assert_eq!(disk(&third).tier.hits, 0);
}

#[test]
fn a_truncated_or_corrupt_entry_is_a_counted_miss_and_never_served() {
    let tmp = tempfile::tempdir().unwrap();
    let root = dataset(tmp.path(), 12);
    let dir = tmp.path().join("disk");
    let s = spec(&root, &dir, 1 << 30, CacheLevel::Decoded, DiskPolicyKind::Belady);
    let e0 = collect(&Loader::new(s.clone(), Shard::default()).unwrap());
    let (files, _) = entry_files(&dir);
    assert_eq!(files.len(), 12);
    // A half-written entry (truncated), a flipped pixel byte, and a temporary file left by
    // a write that never finished.
    let len = std::fs::metadata(&files[0]).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&files[0]).unwrap().set_len(len / 2).unwrap();
    let mut bytes = std::fs::read(&files[1]).unwrap();
    bytes[100] ^= 0x55;
    std::fs::write(&files[1], bytes).unwrap();
    let leftover = files[2].with_extension("tmp.1.1");
    std::fs::write(&leftover, b"half").unwrap();

    let second = Loader::new(s, Shard::default()).unwrap();
    assert!(!leftover.exists(), "a leftover temporary file is deleted at open");
    assert_eq!(collect(&second), e0, "a bad entry is decoded again, not served");
    let d = disk(&second);
    assert_eq!((d.tier.hits, d.tier.misses, d.corrupt), (10, 2, 2));
    // Both were written again, whole.
    assert_eq!((d.tier.insertions, d.tier.entries), (2, 12));
}

#[test]
fn the_disk_tier_keeps_to_its_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let root = dataset(tmp.path(), 16);
    let dir = tmp.path().join("disk");
    for policy in [DiskPolicyKind::Belady, DiskPolicyKind::Lru] {
        let _ = std::fs::remove_dir_all(&dir);
        // Raw entries of these images are a few KB each: about a third fit.
        let full = Loader::new(spec(&root, &dir, 1 << 30, CacheLevel::Raw, policy), Shard::default()).unwrap();
        collect(&full);
        let total = disk(&full).tier.used_bytes;
        drop(full);
        let _ = std::fs::remove_dir_all(&dir);
        let budget = total / 3;
        let loader = Loader::new(spec(&root, &dir, budget, CacheLevel::Raw, policy), Shard::default()).unwrap();
        for _ in 0..3 {
            collect(&loader);
            let d = disk(&loader);
            let (files, on_disk) = entry_files(&dir);
            assert!(d.tier.used_bytes <= budget && on_disk <= budget, "{policy:?}: {d:?}");
            assert_eq!((files.len() as u64, on_disk), (d.tier.entries, d.tier.used_bytes), "{policy:?}");
            assert!(d.tier.entries >= 3, "{policy:?}: {d:?}");
        }
    }
}

/// Disk hits of epoch 1 over its lookups, with `budget` bytes of disk.
fn second_epoch_hit_rate(root: &Path, dir: &Path, budget: u64, policy: DiskPolicyKind) -> f64 {
    let _ = std::fs::remove_dir_all(dir);
    let loader = Loader::new(spec(root, dir, budget, CacheLevel::Raw, policy), Shard::default()).unwrap();
    collect(&loader);
    let before = disk(&loader);
    collect(&loader);
    let after = disk(&loader);
    let lookups = (after.tier.hits + after.tier.misses) - (before.tier.hits + before.tier.misses);
    (after.tier.hits - before.tier.hits) as f64 / lookups as f64
}

#[test]
fn belady_over_the_next_epochs_order_beats_lru_at_half_the_dataset() {
    let tmp = tempfile::tempdir().unwrap();
    let root = dataset(tmp.path(), 64);
    let dir = tmp.path().join("disk");
    let full = Loader::new(spec(&root, &dir, 1 << 30, CacheLevel::Raw, DiskPolicyKind::Lru), Shard::default()).unwrap();
    collect(&full);
    let half = disk(&full).tier.used_bytes / 2;
    drop(full);
    let belady = second_epoch_hit_rate(&root, &dir, half, DiskPolicyKind::Belady);
    let lru = second_epoch_hit_rate(&root, &dir, half, DiskPolicyKind::Lru);
    assert!(belady >= 0.45, "belady {belady:.3}, lru {lru:.3}");
    assert!(belady > lru + 0.1, "belady {belady:.3}, lru {lru:.3}");
}

#[test]
fn a_source_with_boxes_keeps_every_box_over_the_disk_tier() {
    // Raw entries go to disk (a sample's boxes come from its source again); pixel entries
    // carry the boxes the deterministic ops moved, which the disk's file format does not
    // hold, so they stay out of it rather than coming back without boxes.
    records_over_the_disk_tier(false);
}

#[test]
fn a_source_with_masks_keeps_every_mask_over_the_disk_tier() {
    // As with boxes: raw entries go to disk (the mask is read again on a hit), pixel
    // entries keep the moved mask in memory only.
    records_over_the_disk_tier(true);
}

fn records_over_the_disk_tier(masks: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("boxes");
    let o = DatasetOptions { images: 12, classes: 3, texture: 4, boxes: true, masks, ..Default::default() };
    write_dataset(&root, &o, &|_| {}).unwrap();
    let boxes = |e: &[Batch]| e.iter().map(|b| b.boxes.clone().unwrap()).collect::<Vec<_>>();
    for level in [CacheLevel::Raw, CacheLevel::Decoded] {
        let dir = tmp.path().join(format!("disk-{level:?}"));
        let mut s = spec(&root, &dir, 1 << 30, level, DiskPolicyKind::Belady);
        s.source = SourceSpec::Sidecar { root: root.clone(), masks };
        let plain = Loader::new(PipelineSpec { cache: None, ..s.clone() }, Shard::default()).unwrap();
        let want = [collect(&plain), collect(&plain)];
        assert!(boxes(&want[0]).iter().any(|b| b.counts.iter().any(|&c| c > 0)), "no boxes to compare");
        assert!(boxes(&want[0]).iter().all(|b| b.masks.is_some() == masks), "masks = {masks}");
        for run in 0..2 {
            // The second loader reads what the first left on disk.
            let cached = Loader::new(s.clone(), Shard::default()).unwrap();
            let got = [collect(&cached), collect(&cached)];
            for e in 0..2 {
                // `boxes` carries the masks too.
                assert_eq!(boxes(&got[e]), boxes(&want[e]), "{level:?} run {run} epoch {e}: boxes or masks differ");
            }
            let d = disk(&cached);
            match level {
                CacheLevel::Raw if run == 1 => assert!(d.tier.hits >= 12, "{level:?}: {d:?}"),
                CacheLevel::Raw => assert_eq!(d.tier.insertions, 12, "{level:?}: {d:?}"),
                _ => assert_eq!(
                    (d.tier.insertions, d.tier.hits),
                    (0, 0),
                    "{level:?}: entries with records reached the disk"
                ),
            }
        }
    }
}

/// What the second process of [`a_second_process_is_refused_the_folder_and_touches_none_of_its_files`]
/// opens: rank 1 of 2 over the same data, pipeline and folder (a second DDP rank of the node).
fn second_rank_spec() -> (PipelineSpec, Shard) {
    let var = |k: &str| PathBuf::from(std::env::var(k).unwrap());
    let budget = std::env::var("SLUICE_TEST_BUDGET").unwrap().parse().unwrap();
    let s = spec(&var("SLUICE_TEST_ROOT"), &var("SLUICE_TEST_DIR"), budget, CacheLevel::Raw, DiskPolicyKind::Belady);
    (s, Shard { rank: 1, world_size: 2 })
}

/// The second process: its loader must be refused the folder, with an error naming it and
/// saying what to do. (Without the lock it opened, and then ran its epoch as a rank would.)
#[test]
#[ignore = "a child process of a_second_process_is_refused_the_folder_and_touches_none_of_its_files"]
fn child_opens_a_disk_folder_another_process_holds() {
    let (s, shard) = second_rank_spec();
    match Loader::new(s, shard) {
        Ok(loader) => {
            collect(&loader);
            let d = disk(&loader);
            panic!(
                "the second process opened the folder another holds and wrote {} bytes in {} entries ({} evicted)",
                d.bytes_written, d.tier.insertions, d.tier.evictions
            );
        }
        Err(e) => {
            let text = e.to_string();
            let dir = std::env::var("SLUICE_TEST_NS").unwrap();
            assert!(text.contains(&dir), "the error names the folder {dir}: {text}");
            assert!(text.contains("give each process its own cache.disk.dir"), "{text}");
            eprintln!("refused: {text}");
        }
    }
}

/// Two processes over one disk-cache folder (two ranks of a node): the second is refused
/// before it lists, deletes or writes anything, so the folder keeps to its budget, the
/// owner's entries and its in-flight temporary files stay, and once the owner is gone a
/// restarted job opens the folder and recovers every entry.
#[test]
fn a_second_process_is_refused_the_folder_and_touches_none_of_its_files() {
    let tmp = tempfile::tempdir().unwrap();
    let root = dataset(tmp.path(), 24);
    let dir = tmp.path().join("disk");
    let full = Loader::new(
        spec(&root, &tmp.path().join("full"), 1 << 30, CacheLevel::Raw, DiskPolicyKind::Lru),
        Shard::default(),
    )
    .unwrap();
    collect(&full);
    // A quarter of the dataset's entries: each rank (half the samples) fills it.
    let budget = (disk(&full).tier.used_bytes / 4).max(4096);
    drop(full);
    let s = spec(&root, &dir, budget, CacheLevel::Raw, DiskPolicyKind::Belady);
    let owner = Loader::new(s.clone(), Shard { rank: 0, world_size: 2 }).unwrap();
    let ns = disk(&owner).dir;
    // A write of the owner's in flight: its temporary file.
    let in_flight = ns.join(format!("00000000000000ff.tmp.{}.7", std::process::id()));
    std::fs::write(&in_flight, b"half an entry").unwrap();

    let env = [
        ("SLUICE_TEST_ROOT", root.display().to_string()),
        ("SLUICE_TEST_DIR", dir.display().to_string()),
        ("SLUICE_TEST_NS", ns.display().to_string()),
        ("SLUICE_TEST_BUDGET", budget.to_string()),
    ];
    let child = "cache_disk::child_opens_a_disk_folder_another_process_holds";
    let (refused, text, _) = crate::source_s3::run_test_child(child, &env, &[]);
    collect(&owner);
    let d = disk(&owner);
    let (files, on_disk) = entry_files(&dir);
    eprintln!(
        "budget {budget} B: owner wrote {} B in {} entries; the folder holds {on_disk} B in {} entry files",
        d.bytes_written,
        d.tier.insertions,
        files.len()
    );
    assert!(refused, "the second process was not refused:\n{text}");
    assert!(in_flight.exists(), "the second process deleted the owner's temporary file");
    assert!(on_disk <= budget, "two processes wrote {on_disk} bytes into a folder of {budget}");
    assert_eq!((files.len() as u64, on_disk), (d.tier.entries, d.tier.used_bytes), "the owner's index is the folder");
    // In this process too, a second loader over the folder is refused.
    let err = Loader::new(s.clone(), Shard { rank: 1, world_size: 2 }).err().expect("a second loader opened it");
    assert!(err.to_string().contains(&ns.display().to_string()), "{err}");

    drop(owner);

    // A restart: the lock went with the owner; every entry is recovered, none deleted.
    let restarted = Loader::new(s, Shard { rank: 0, world_size: 2 }).unwrap();
    assert_eq!(disk(&restarted).recovered, files.len() as u64);
    assert_eq!(entry_files(&dir).0, files);
    assert!(!in_flight.exists(), "a temporary file of a process gone is deleted at open");
}
