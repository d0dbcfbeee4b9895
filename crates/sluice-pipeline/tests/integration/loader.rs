//! The loader end to end on real JPEG files: determinism across thread counts, exact
//! resume, epochs, DDP shards, and every kind of bad sample under both policies.

#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use std::path::{Path, PathBuf};

use sluice_core::{Batch, ErrorPolicy, OpSpec, PipelineSpec, ShuffleSpec, SourceSpec};
use sluice_pipeline::{Loader, LoaderState, PipelineError, Shard};
use sluice_synth::{write_dataset, DatasetOptions};

fn dataset(dir: &Path, images: usize, corrupt: usize) -> PathBuf {
    let root = dir.join("train");
    let o = DatasetOptions { images, classes: 3, corrupt, texture: 4, ..Default::default() };
    write_dataset(&root, &o, &|_| {}).unwrap();
    root
}

fn spec(root: &Path, batch: usize, threads: usize) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(SourceSpec::ImageFolder { root: root.to_path_buf() }, 32, batch);
    s.threads = threads.into();
    s.seed = 11;
    s.prefetch = 2;
    s
}

fn collect(loader: &Loader) -> Vec<Batch> {
    loader.iter().map(|b| b.unwrap()).collect()
}

fn keys(batches: &[Batch]) -> Vec<u64> {
    batches.iter().flat_map(|b| b.keys.clone()).collect()
}

#[test]
fn same_seed_gives_bit_identical_batches_whatever_the_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 30, 0);
    let runs: Vec<Vec<Batch>> =
        [1, 2, 3].iter().map(|&t| collect(&Loader::new(spec(&root, 7, t), Shard::default()).unwrap())).collect();
    assert_eq!(runs[0].len(), 5, "30 samples in batches of 7");
    assert_eq!(runs[0][4].len(), 2);
    assert_eq!(runs[0][0].images.shape, vec![7, 32, 32, 3]);
    assert_eq!(runs[0], runs[1]);
    assert_eq!(runs[0], runs[2]);
    let mut all = keys(&runs[0]);
    all.sort_unstable();
    assert_eq!(all, (0..30).collect::<Vec<_>>());
    // Labels follow the ImageFolder classes: image i is in class i % 3, and class folders
    // sort so that keys 0..10 are class 0.
    for b in &runs[0] {
        for (k, l) in b.keys.iter().zip(&b.labels) {
            assert_eq!(*l, (*k / 10) as i64);
        }
    }
}

#[test]
fn resizing_the_pool_mid_epoch_changes_nothing_in_the_output() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 24, 0);
    let reference = collect(&Loader::new(spec(&root, 4, 1), Shard::default()).unwrap());
    let loader = Loader::new(spec(&root, 4, 1), Shard::default()).unwrap();
    let mut got = Vec::new();
    for (i, b) in loader.iter().enumerate() {
        got.push(b.unwrap());
        loader.set_threads(if i % 2 == 0 { 3 } else { 1 });
    }
    assert_eq!(got, reference);
}

#[test]
fn task_ranges_run_side_by_side_give_the_epochs_batches_and_leave_the_loader_where_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 30, 0);
    let whole: Vec<Batch> = {
        let l = Loader::new(spec(&root, 4, 2), Shard::default()).unwrap();
        l.set_epoch(3);
        collect(&l)
    };
    assert_eq!(whole.len(), 8);
    let loader = Loader::new(spec(&root, 4, 2), Shard::default()).unwrap();
    let before = (loader.state().epoch, loader.state().batch);
    // Two tasks of epoch 3 and one of epoch 4 in flight at once on one pool, read in turns,
    // as a service worker runs a job's tasks: none retires another.
    let mut a = loader.iter_range(3, 0, 3);
    let mut b = loader.iter_range(3, 3, 8);
    let mut next_epoch = loader.iter_range(4, 0, 2);
    let mut got = Vec::new();
    loop {
        let (x, y) = (a.next(), b.next());
        if x.is_none() && y.is_none() {
            break;
        }
        got.extend(x.into_iter().chain(y).map(|r| r.unwrap()));
    }
    got.sort_by_key(|b| b.index);
    assert_eq!(got, whole);
    assert_eq!(next_epoch.by_ref().count(), 2);
    assert_eq!(
        (loader.state().epoch, loader.state().batch),
        before,
        "task ranges leave the loader's own position alone"
    );
    // And the loader's own iterator still runs its epoch from the start.
    assert_eq!(collect(&loader).len(), 8);
}

#[test]
fn batches_built_in_recycled_buffers_equal_those_built_in_fresh_ones() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 30, 2);
    let mut s = spec(&root, 7, 2);
    s.on_error = ErrorPolicy::Skip;
    let fresh = collect(&Loader::new(s.clone(), Shard::default()).unwrap());
    let loader = Loader::new(s, Shard::default()).unwrap();
    let mut recycled = Vec::new();
    for b in loader.iter() {
        let b = b.unwrap();
        recycled.push(b.clone());
        // Scribble over the buffer first: nothing of it may show in a later batch.
        let mut images = b.images;
        images.as_bytes_mut().fill(0xAB);
        loader.recycle(images);
    }
    assert_eq!(recycled, fresh);
    assert!(fresh.iter().any(|b| b.len() < 7), "the bad files leave short batches");
}

#[test]
fn epochs_differ_in_order_and_augmentation_and_repeat_across_runs() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 16, 0);
    let loader = Loader::new(spec(&root, 16, 2), Shard::default()).unwrap();
    let e0 = collect(&loader);
    let e1 = collect(&loader); // the loader moved on to epoch 1 by itself
    assert_eq!((e0[0].epoch, e1[0].epoch), (0, 1));
    assert_ne!(keys(&e0), keys(&e1));
    // Same key, different epoch: a different crop.
    let pos0 = e0[0].keys.iter().position(|&k| k == 5).unwrap();
    let pos1 = e1[0].keys.iter().position(|&k| k == 5).unwrap();
    let slot = 32 * 32 * 3;
    assert_ne!(
        e0[0].images.as_bytes()[pos0 * slot..(pos0 + 1) * slot],
        e1[0].images.as_bytes()[pos1 * slot..(pos1 + 1) * slot]
    );
    let again = Loader::new(spec(&root, 16, 1), Shard::default()).unwrap();
    again.set_epoch(1);
    assert_eq!(collect(&again), e1);
}

#[test]
fn stopping_mid_epoch_and_resuming_gives_exactly_the_remaining_batches() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 40, 0);
    let full = Loader::new(spec(&root, 6, 2), Shard::default()).unwrap();
    full.set_epoch(3);
    let reference = collect(&full);

    let first = Loader::new(spec(&root, 6, 2), Shard::default()).unwrap();
    first.set_epoch(3);
    let mut head = Vec::new();
    for b in first.iter() {
        head.push(b.unwrap());
        if head.len() == 3 {
            break;
        }
    }
    let state = first.state();
    assert_eq!((state.epoch, state.batch), (3, 3));
    // The checkpoint travels as JSON, as it would to disk.
    let saved = serde_json::to_string(&state).unwrap();
    drop(first);

    let resumed = Loader::new(spec(&root, 6, 1), Shard::default()).unwrap();
    resumed.load_state(&serde_json::from_str::<LoaderState>(&saved).unwrap()).unwrap();
    let tail = collect(&resumed);
    assert_eq!(head.len() + tail.len(), reference.len());
    assert_eq!(head, reference[..3]);
    assert_eq!(tail, reference[3..]);
    assert_eq!((resumed.state().epoch, resumed.state().batch), (4, 0));
}

#[test]
fn a_checkpoint_from_another_dataset_or_seed_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 8, 0);
    let loader = Loader::new(spec(&root, 4, 1), Shard::default()).unwrap();
    let mut state = loader.state();
    state.fingerprint = "0000000000000000".into();
    let e = loader.load_state(&state).unwrap_err();
    assert!(e.to_string().contains("fingerprint"), "{e}");
    let mut state = loader.state();
    state.seed += 1;
    assert!(loader.load_state(&state).unwrap_err().to_string().contains("seed"));
    let mut state = loader.state();
    state.batch = 99;
    assert!(loader.load_state(&state).unwrap_err().to_string().contains("past the end"));
}

#[test]
fn a_checkpoint_from_another_batch_size_shuffle_or_sampling_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 16, 0);
    let first = Loader::new(spec(&root, 4, 1), Shard::default()).unwrap();
    let mut it = first.iter();
    it.next().unwrap().unwrap();
    it.next().unwrap().unwrap();
    drop(it);
    let saved: LoaderState = serde_json::from_str(&serde_json::to_string(&first.state()).unwrap()).unwrap();
    assert_eq!(saved.batch, 2);

    // Batch 2 of 4 samples is sample 8; batch 2 of 2 would be sample 4: samples 4..8 again.
    let halved = Loader::new(spec(&root, 2, 1), Shard::default()).unwrap();
    let e = halved.load_state(&saved).unwrap_err().to_string();
    assert!(e.contains("batch size differs") && e.contains("has 4") && e.contains("has 2"), "{e}");
    let mut s = spec(&root, 4, 1);
    s.batch.drop_last = true;
    let e = Loader::new(s, Shard::default()).unwrap().load_state(&saved).unwrap_err().to_string();
    assert!(e.contains("drop_last"), "{e}");
    let mut s = spec(&root, 4, 1);
    s.shuffle = ShuffleSpec::None;
    let e = Loader::new(s, Shard::default()).unwrap().load_state(&saved).unwrap_err().to_string();
    assert!(e.contains("shuffle"), "{e}");
    let mut s = spec(&root, 4, 1);
    s.sampling = sluice_core::SamplingSpec::Fastmatch;
    let e = Loader::new(s, Shard::default()).unwrap().load_state(&saved).unwrap_err().to_string();
    assert!(e.contains("sampling"), "{e}");
    // The same spec resumes.
    assert!(Loader::new(spec(&root, 4, 2), Shard::default()).unwrap().load_state(&saved).is_ok());
}

#[test]
fn ddp_ranks_get_disjoint_equal_shards() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 21, 0);
    let shards: Vec<Vec<u64>> = (0..2)
        .map(|rank| keys(&collect(&Loader::new(spec(&root, 4, 1), Shard { rank, world_size: 2 }).unwrap())))
        .collect();
    assert_eq!(shards[0].len(), 10);
    assert_eq!(shards[1].len(), 10);
    assert!(shards[0].iter().all(|k| !shards[1].contains(k)));
    assert!(Loader::new(spec(&root, 4, 1), Shard { rank: 2, world_size: 2 }).is_err());
}

#[test]
fn skip_policy_reports_every_bad_file_and_delivers_every_good_one() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 20, 5); // truncated, empty, not an image, garbage, huge header
    let mut s = spec(&root, 8, 2);
    s.on_error = ErrorPolicy::Skip;
    let loader = Loader::new(s, Shard::default()).unwrap();
    let batches = collect(&loader);
    let delivered = keys(&batches);
    let stats = loader.stats();
    assert_eq!(delivered.len(), 20, "{:#?}", stats.skipped);
    assert_eq!(stats.skipped.len(), 5, "{:#?}", stats.skipped);
    let manifest = loader.manifest();
    for kind in ["truncated", "empty", "notimage", "garbage", "huge"] {
        let s = stats.skipped.iter().find(|s| s.path.contains(kind)).unwrap_or_else(|| panic!("{kind} not reported"));
        assert!(!delivered.contains(&s.key));
        assert!(manifest.display_path(sluice_core::SampleKey(s.key)).to_string_lossy().contains(kind));
    }
    let huge = stats.skipped.iter().find(|s| s.path.contains("huge")).unwrap();
    assert!(huge.error.contains("limit"), "{}", huge.error);
    // Batches stay contiguous: shapes match the samples they hold.
    for b in &batches {
        assert_eq!(b.images.shape[0], b.len());
        assert_eq!(b.images.as_bytes().len(), b.len() * 32 * 32 * 3);
    }
}

#[test]
fn fail_policy_names_the_key_and_path_of_the_first_bad_sample() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 6, 2);
    let mut s = spec(&root, 4, 2);
    s.shuffle = ShuffleSpec::None;
    let loader = Loader::new(s, Shard::default()).unwrap();
    let err = loader.iter().find_map(|b| b.err()).expect("a bad sample must fail the run");
    let PipelineError::Sample(e) = &err else { panic!("unexpected error {err}") };
    let msg = err.to_string();
    assert!(msg.contains(&format!("sample #{}", e.key.0)), "{msg}");
    assert!(msg.contains("bad_000"), "{msg}");
}

#[test]
fn missing_and_unreadable_files_in_a_file_list_are_reported_per_sample() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 4, 0);
    // Unreadable: a directory where a file is expected (permissions do not stop root).
    std::fs::create_dir(root.join("unreadable.jpg")).unwrap();
    let list = dir.path().join("list.txt");
    std::fs::write(
        &list,
        format!("{0}/class_000/img_0000000.jpg 0\n{0}/class_000/gone.jpg 1\n{0}/unreadable.jpg 2\n", root.display()),
    )
    .unwrap();
    let mut s = spec(&root, 4, 1);
    s.source = SourceSpec::FileList { path: list, root: None };
    s.on_error = ErrorPolicy::Skip;
    let loader = Loader::new(s.clone(), Shard::default()).unwrap();
    assert_eq!(keys(&collect(&loader)), vec![0]);
    let skipped = loader.stats().skipped;
    assert_eq!(skipped.len(), 2, "{skipped:#?}");
    let gone = skipped.iter().find(|s| s.key == 1).unwrap();
    assert!(gone.error.contains("not found") && gone.error.contains("gone.jpg"), "{}", gone.error);
    let unreadable = skipped.iter().find(|s| s.key == 2).unwrap();
    assert!(unreadable.error.contains("read") && unreadable.error.contains("unreadable.jpg"), "{}", unreadable.error);

    s.on_error = ErrorPolicy::Fail;
    s.shuffle = ShuffleSpec::None;
    let loader = Loader::new(s, Shard::default()).unwrap();
    let err = loader.iter().find_map(|b| b.err()).unwrap().to_string();
    assert!(err.contains("gone.jpg") && err.contains("#1"), "{err}");
}

#[test]
fn normalize_and_chw_produce_f32_planar_batches() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 4, 0);
    let mut s = spec(&root, 4, 1);
    s.ops.push(OpSpec::Normalize { mean: [0.5; 3], std: [0.25; 3] });
    s.ops.push(OpSpec::Layout { order: sluice_core::Layout::Chw });
    let b = collect(&Loader::new(s, Shard::default()).unwrap()).remove(0);
    assert_eq!(b.images.shape, vec![4, 3, 32, 32]);
    let sluice_core::TensorData::F32(v) = &b.images.data else { panic!("expected f32") };
    assert!(v.iter().all(|x| (-2.0..=2.0).contains(x)));
    assert!(v.iter().any(|x| *x < 0.0) && v.iter().any(|x| *x > 0.0));
}

#[test]
fn a_dataset_packed_with_restart_markers_gives_bit_identical_batches() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("train");
    let o = DatasetOptions { images: 24, classes: 3, corrupt: 2, ..Default::default() };
    write_dataset(&root, &o, &|_| {}).unwrap();
    let packed = dir.path().join("packed");
    let mut cut = 0;
    for class in std::fs::read_dir(&root).unwrap() {
        let class = class.unwrap().path();
        let to = packed.join(class.file_name().unwrap());
        std::fs::create_dir_all(&to).unwrap();
        for f in std::fs::read_dir(&class).unwrap() {
            let f = f.unwrap().path();
            let bytes = std::fs::read(&f).unwrap();
            let out = match sluice_codec::add_restart_markers(&bytes, 2, 1 << 26) {
                Ok(p) => {
                    cut += 1;
                    p
                }
                Err(_) => bytes, // the bad files stay as they are
            };
            std::fs::write(to.join(f.file_name().unwrap()), out).unwrap();
        }
    }
    assert_eq!(cut, 24);
    let run = |root: &Path| {
        let mut s = PipelineSpec::train_default(SourceSpec::ImageFolder { root: root.to_path_buf() }, 96, 5);
        s.on_error = ErrorPolicy::Skip;
        s.seed = 3;
        let loader = Loader::new(s, Shard::default()).unwrap();
        (0..3)
            .flat_map(|e| {
                loader.set_epoch(e);
                collect(&loader)
            })
            .collect::<Vec<_>>()
    };
    let (a, b) = (run(&root), run(&packed));
    assert_eq!(keys(&a).len(), 72, "24 good images, 3 epochs");
    assert!(a == b, "packed files must decode to the same pixels");
}

#[test]
fn a_checkpoint_at_the_last_representable_epoch_or_seen_later_is_refused_or_harmless() {
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 8, 0);
    let loader = Loader::new(spec(&root, 4, 1), Shard::default()).unwrap();
    // An epoch with no next one: refused, rather than overflowing when it ends.
    let mut state = loader.state();
    state.epoch = u64::MAX;
    let e = loader.load_state(&state).unwrap_err().to_string();
    assert!(e.contains("epoch"), "{e}");

    // Importance bookkeeping from a hand-edited checkpoint (drawn in the last
    // representable epoch) draws an epoch instead of panicking.
    let mut s = spec(&root, 4, 1);
    s.sampling =
        sluice_core::SamplingSpec::Importance { floor: 0.2, coverage_epochs: 2, miss_discount: 1.0, max_draws: 4.0 };
    let loader = Loader::new(s, Shard::default()).unwrap();
    let mut state = loader.state();
    let mut importance = state.importance.clone().unwrap();
    importance.scores = vec![(0, 1.0), (1, 2.0)];
    importance.drawn_epoch = Some(u64::MAX - 1);
    state.importance = Some(importance);
    state.epoch = u64::MAX - 1;
    loader.load_state(&state).unwrap();
    assert_eq!(collect(&loader).len(), 2);
}
