//! Elastic resume on real loaders: a checkpoint taken with `p` ranks resumes with `q`
//! ranks at the same global batch size, and delivers the rest of the epoch exactly once,
//! in the same global batches as an uninterrupted `p`-rank run.
//!
//! The property test draws its cases from a fixed seed (so a failure names a case that
//! reruns) over (dataset size, global batch, p, q, step, epoch, drop_last).

#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use sluice_core::{OpSpec, PipelineSpec, SampleKey, SampleRng, ShuffleSpec, SourceSpec};
use sluice_pipeline::{epoch_order, Loader, LoaderState, PipelineError, Shard};
use sluice_synth::{write_dataset, DatasetOptions};

const MAX_SAMPLES: usize = 40;

/// A file list over the first `n` images of `root` (an ImageFolder), written beside it.
fn file_list(dir: &Path, root: &Path, n: usize) -> PathBuf {
    let mut files: Vec<PathBuf> = Vec::new();
    for class in std::fs::read_dir(root).unwrap() {
        for f in std::fs::read_dir(class.unwrap().path()).unwrap() {
            files.push(f.unwrap().path());
        }
    }
    files.sort();
    let list = dir.join(format!("list-{n}.txt"));
    let text: String = files[..n].iter().map(|p| format!("{}\n", p.display())).collect();
    std::fs::write(&list, text).unwrap();
    list
}

fn spec(list: &Path, batch: usize, drop_last: bool, seed: u64) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(SourceSpec::FileList { path: list.to_path_buf(), root: None }, 8, batch);
    // Decode and crop only: the samples, not the pixels, are under test.
    s.ops.retain(|op| !matches!(op, OpSpec::RandomHorizontalFlip { .. }));
    s.threads = 1.into();
    s.prefetch = 1;
    s.seed = seed;
    s.batch.drop_last = drop_last;
    s
}

/// `world` loaders of one job, with `global / world` samples per batch each.
fn ranks(list: &Path, world: usize, global: usize, drop_last: bool, seed: u64) -> Vec<Loader> {
    (0..world)
        .map(|rank| {
            Loader::new(spec(list, global / world, drop_last, seed), Shard { rank, world_size: world }).unwrap()
        })
        .collect()
}

/// Runs every rank's iterator for up to `limit` batches: the global batches (each the
/// sorted keys of all ranks' batch g), in order.
fn global_batches(loaders: &[Loader], limit: Option<usize>) -> Vec<Vec<u64>> {
    let per_rank: Vec<Vec<Vec<u64>>> =
        loaders.iter().map(|l| l.iter().take(limit.unwrap_or(usize::MAX)).map(|b| b.unwrap().keys).collect()).collect();
    let count = per_rank.iter().map(Vec::len).max().unwrap_or(0);
    assert!(per_rank.iter().all(|r| r.len() == count), "ranks handed out different numbers of batches");
    (0..count)
        .map(|g| {
            let mut keys: Vec<u64> = per_rank.iter().flat_map(|r| r[g].iter().copied()).collect();
            keys.sort_unstable();
            keys
        })
        .collect()
}

#[derive(Debug, Clone, Copy)]
struct Case {
    n: usize,
    global: usize,
    p: usize,
    q: usize,
    step: usize,
    epoch: u64,
    drop_last: bool,
    seed: u64,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn draw_case(i: u64) -> Case {
    let mut rng = SampleRng::new(2024, 0, SampleKey(i), 0);
    let mut pick = |lo: usize, hi: usize| lo + rng.below((hi - lo + 1) as u64) as usize;
    let p = pick(1, 4);
    let mut q = pick(1, 4);
    if q == p {
        q = p % 4 + 1;
    }
    let lcm = p * q / gcd(p, q);
    let global = lcm * pick(1, (12 / lcm).max(1));
    let n = pick(global.min(MAX_SAMPLES), MAX_SAMPLES);
    let batches = n.div_ceil(global);
    Case {
        n,
        global,
        p,
        q,
        step: pick(0, batches),
        epoch: pick(0, 3) as u64,
        drop_last: pick(0, 1) == 1,
        seed: pick(0, 1000) as u64,
    }
}

fn check(dir: &Path, root: &Path, c: Case) {
    let list = file_list(dir, root, c.n);
    let position = |ls: &[Loader]| ls.iter().for_each(|l| l.set_epoch(c.epoch));

    let whole = ranks(&list, c.p, c.global, c.drop_last, c.seed);
    position(&whole);
    let reference = global_batches(&whole, None);

    let before = ranks(&list, c.p, c.global, c.drop_last, c.seed);
    position(&before);
    let mut delivered = global_batches(&before, Some(c.step));
    let states: Vec<LoaderState> = before.iter().map(Loader::state).collect();
    drop(before);

    let after = ranks(&list, c.q, c.global, c.drop_last, c.seed);
    for (rank, loader) in after.iter().enumerate() {
        // Any rank's state will do: they all stand at the same global batch.
        loader.load_state(&states[rank % c.p]).unwrap_or_else(|e| panic!("{c:?}: {e}"));
    }
    // A checkpoint taken after the epoch's last batch already stands at the next epoch.
    let epoch_over = states[0].epoch > c.epoch;
    assert!(states.iter().all(|s| (s.epoch, s.batch) == (states[0].epoch, states[0].batch)));
    let resumed = if epoch_over { Vec::new() } else { global_batches(&after, None) };
    delivered.extend(resumed.iter().cloned());

    // No sample twice.
    let flat: Vec<u64> = delivered.iter().flatten().copied().collect();
    let unique: BTreeSet<u64> = flat.iter().copied().collect();
    assert_eq!(unique.len(), flat.len(), "{c:?}: a sample was delivered twice");

    // Every global batch both runs hold is the same; the epoch's global order says which
    // samples each run's epoch has: the whole global batches, then (without drop_last) the
    // short last one cut to a multiple of the world size that delivers it.
    let order = epoch_order(c.n, c.seed, c.epoch, ShuffleSpec::Global, Shard::default());
    let manifest = after[0].manifest();
    let key = |pos: &u32| manifest.at(*pos as usize).key.0;
    let span = |world: usize| {
        if c.drop_last {
            c.n / c.global * c.global
        } else {
            c.n / world * world
        }
    };
    let full = c.n / c.global;
    for g in 0..full {
        assert_eq!(delivered[g], reference[g], "{c:?}: global batch {g} differs from the uninterrupted run");
    }
    let end = if epoch_over { span(c.p) } else { (c.step * c.global).max(span(c.q)) };
    let expected: BTreeSet<u64> = order[..end].iter().map(key).collect();
    assert_eq!(unique, expected, "{c:?}: the resumed epoch does not deliver the rest of the epoch");
    if c.drop_last || span(c.p) == span(c.q) || epoch_over {
        assert_eq!(delivered, reference, "{c:?}");
    }
}

#[test]
fn resuming_on_another_world_size_delivers_the_rest_once_in_the_same_global_batches() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("train");
    let o = DatasetOptions { images: MAX_SAMPLES, classes: 2, texture: 2, ..Default::default() };
    write_dataset(&root, &o, &|_| {}).unwrap();
    for i in 0..32 {
        check(dir.path(), &root, draw_case(i));
    }
}

#[test]
fn a_resume_that_cannot_keep_the_global_batch_is_refused_with_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("train");
    write_dataset(&root, &DatasetOptions { images: 12, classes: 2, texture: 2, ..Default::default() }, &|_| {})
        .unwrap();
    let list = file_list(dir.path(), &root, 12);
    let two = ranks(&list, 2, 4, false, 1);
    let state = two[0].state();

    // 4 samples per global batch do not split over 3 ranks.
    let three = Loader::new(spec(&list, 1, false, 1), Shard { rank: 0, world_size: 3 }).unwrap();
    let err = three.load_state(&state).unwrap_err();
    assert!(matches!(err, PipelineError::State(_)));
    assert!(err.to_string().contains("does not split into 3 equal shares"), "{err}");

    // 4 ranks of 2 make a global batch of 8, not 4: the message names the batch size to use.
    let four = Loader::new(spec(&list, 2, false, 1), Shard { rank: 3, world_size: 4 }).unwrap();
    let err = four.load_state(&state).unwrap_err().to_string();
    assert!(err.contains("set batch.size = 1"), "{err}");

    // Same world size, another rank's state: still refused (a rank's own checkpoint only).
    let err = two[1].load_state(&state).unwrap_err().to_string();
    assert!(err.contains("rank/world_size differs"), "{err}");
}
