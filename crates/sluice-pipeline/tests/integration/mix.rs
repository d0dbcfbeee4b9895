//! Mixed sources on real loaders: a spec's `kind = "mix"` source draws its sources in the
//! given proportions in every batch, deterministically, resumes exactly, and takes new
//! weights from a checkpoint's next epoch.

#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use std::path::{Path, PathBuf};

use sluice_core::{LocationRef, PipelineSpec, SamplingSpec, SpecError};
use sluice_pipeline::{Loader, Shard};
use sluice_synth::{write_dataset, DatasetOptions};

fn folder(dir: &Path, name: &str, images: usize) -> PathBuf {
    let root = dir.join(name);
    write_dataset(&root, &DatasetOptions { images, classes: 2, texture: 2, ..Default::default() }, &|_| {}).unwrap();
    root
}

fn spec(a: &Path, b: &Path, weights: (f64, f64), batch: usize) -> PipelineSpec {
    try_spec(a, b, weights, batch).unwrap()
}

fn try_spec(a: &Path, b: &Path, weights: (f64, f64), batch: usize) -> Result<PipelineSpec, SpecError> {
    let toml = format!(
        r#"
        seed = 3
        threads = 1
        prefetch = 1
        ops = [{{ op = "decode" }}, {{ op = "center_crop", size = 8 }}]
        [source]
        kind = "mix"
        sources = [
            {{ kind = "image_folder", root = "{}", weight = {} }},
            {{ kind = "image_folder", root = "{}", weight = {} }},
        ]
        [batch]
        size = {batch}
        "#,
        a.display(),
        weights.0,
        b.display(),
        weights.1
    );
    PipelineSpec::from_toml_str(&toml)
}

/// Per batch: (samples of the first source, of the second), and the keys.
fn run(loader: &Loader, first: &Path) -> Vec<((usize, usize), Vec<u64>)> {
    loader
        .iter()
        .map(|b| {
            let b = b.unwrap();
            let from_first = b
                .keys
                .iter()
                .filter(|&&k| match loader.manifest().at(k as usize).location {
                    LocationRef::File { path } => path.starts_with(first),
                    LocationRef::TarMember { .. } | LocationRef::ParquetRow { .. } => false,
                })
                .count();
            ((from_first, b.keys.len() - from_first), b.keys)
        })
        .collect()
}

#[test]
fn each_batch_holds_the_sources_in_their_proportions_and_the_epoch_ends_with_the_first_to_run_out() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (folder(dir.path(), "a", 30), folder(dir.path(), "b", 20));
    let loader = Loader::new(spec(&a, &b, (0.7, 0.3), 10), Shard::default()).unwrap();
    assert_eq!(loader.manifest().len(), 50);
    // 7 of a and 3 of b per batch: a (30) runs out after 4 batches.
    assert_eq!(loader.batches_per_epoch(), 4);
    let epoch0 = run(&loader, &a);
    assert!(epoch0.iter().all(|(counts, _)| *counts == (7, 3)), "{epoch0:?}");
    let mut keys: Vec<u64> = epoch0.iter().flat_map(|(_, k)| k.clone()).collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), 40, "a sample twice in one epoch");

    // Same seed, same batches; the next epoch draws another order.
    let again = Loader::new(spec(&a, &b, (0.7, 0.3), 10), Shard::default()).unwrap();
    assert_eq!(run(&again, &a), epoch0);
    assert_ne!(run(&loader, &a), epoch0);

    // Weights that do not divide the batch: 1/3 of 10 is 3 or 4, never further off.
    let third = Loader::new(spec(&a, &b, (2.0, 1.0), 10), Shard::default()).unwrap();
    for ((x, y), _) in run(&third, &a) {
        assert!((6..=7).contains(&x) && (3..=4).contains(&y) && x + y == 10, "{x} + {y}");
    }
}

#[test]
fn a_mixed_epoch_resumes_exactly_and_new_weights_apply_from_the_next_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (folder(dir.path(), "a", 30), folder(dir.path(), "b", 20));
    let whole = Loader::new(spec(&a, &b, (0.7, 0.3), 10), Shard::default()).unwrap();
    let reference = run(&whole, &a);

    let first = Loader::new(spec(&a, &b, (0.7, 0.3), 10), Shard::default()).unwrap();
    let head: Vec<u64> = first.iter().take(2).flat_map(|b| b.unwrap().keys).collect();
    let state = first.state();
    assert_eq!((state.epoch, state.batch), (0, 2));

    // Same weights: the rest of the epoch as the uninterrupted run.
    let same = Loader::new(spec(&a, &b, (0.7, 0.3), 10), Shard::default()).unwrap();
    same.load_state(&state).unwrap();
    let rest = run(&same, &a);
    assert_eq!(rest, reference[2..]);
    let all: Vec<u64> = head.iter().copied().chain(rest.iter().flat_map(|(_, k)| k.clone())).collect();
    assert_eq!(all, reference.iter().flat_map(|(_, k)| k.clone()).collect::<Vec<_>>());

    // New weights: the checkpoint's epoch finishes with the old ones, the next uses the new.
    let reweighted = Loader::new(spec(&a, &b, (0.5, 0.5), 10), Shard::default()).unwrap();
    reweighted.load_state(&state).unwrap();
    assert_eq!(run(&reweighted, &a), reference[2..]);
    let next = run(&reweighted, &a);
    assert!(next.iter().all(|(counts, _)| *counts == (5, 5)), "{next:?}");
    assert_eq!(next.len(), 4, "b (20) runs out after 4 batches of 5");
    // A state of the new loader mid-epoch carries the weights it draws with.
    assert_eq!(reweighted.state().order.unwrap().mix, Some(vec![0.5, 0.5]));

    // A checkpoint at an epoch's start takes the new weights at once.
    let fresh = Loader::new(spec(&a, &b, (0.5, 0.5), 10), Shard::default()).unwrap();
    fresh.load_state(&Loader::new(spec(&a, &b, (0.7, 0.3), 10), Shard::default()).unwrap().state()).unwrap();
    assert!(run(&fresh, &a).iter().all(|(counts, _)| *counts == (5, 5)));
}

#[test]
fn bad_mixes_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (folder(dir.path(), "a", 4), folder(dir.path(), "b", 4));
    let err = try_spec(&a, &b, (0.0, 1.0), 4).unwrap_err();
    assert_eq!(err.field, "source.sources[0].weight", "{err}");
    let mut s = spec(&a, &b, (1.0, 1.0), 4);
    s.sampling = SamplingSpec::Fastmatch;
    assert_eq!(s.validate().unwrap_err().field, "sampling");
    let nested = format!(
        r#"
        ops = [{{ op = "decode" }}, {{ op = "center_crop", size = 8 }}]
        [source]
        kind = "mix"
        sources = [{{ kind = "mix", weight = 1, sources = [{{ kind = "image_folder", root = "{}", weight = 1 }}] }}]
        [batch]
        size = 4
        "#,
        a.display()
    );
    let err = PipelineSpec::from_toml_str(&nested).and_then(|s| s.validate().map(|_| s)).unwrap_err();
    assert!(err.to_string().contains("cannot hold another mix"), "{err}");
    let missing = format!(
        r#"
        ops = [{{ op = "decode" }}, {{ op = "center_crop", size = 8 }}]
        [source]
        kind = "mix"
        sources = [{{ kind = "image_folder", root = "{}" }}]
        [batch]
        size = 4
        "#,
        a.display()
    );
    let err = PipelineSpec::from_toml_str(&missing).unwrap_err();
    assert!(err.to_string().contains("needs a `weight`"), "{err}");
}

#[test]
fn a_mixed_two_rank_checkpoint_resumes_on_three_ranks_in_the_same_global_batches() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (folder(dir.path(), "a", 30), folder(dir.path(), "b", 20));
    let ranks = |world: usize| -> Vec<Loader> {
        (0..world)
            .map(|rank| Loader::new(spec(&a, &b, (0.5, 0.5), 12 / world), Shard { rank, world_size: world }).unwrap())
            .collect()
    };
    // Global batches: every rank's batch g, keys sorted.
    let global = |loaders: &[Loader], limit: usize| -> Vec<Vec<u64>> {
        let per_rank: Vec<Vec<Vec<u64>>> =
            loaders.iter().map(|l| l.iter().take(limit).map(|b| b.unwrap().keys).collect()).collect();
        (0..per_rank[0].len())
            .map(|g| {
                let mut k: Vec<u64> = per_rank.iter().flat_map(|r| r[g].clone()).collect();
                k.sort_unstable();
                k
            })
            .collect()
    };
    let reference = global(&ranks(2), usize::MAX);
    // 6 + 6 per global batch of 12: b (20) runs out after 3.
    assert_eq!(reference.len(), 3);
    let two = ranks(2);
    let mut got = global(&two, 1);
    let states: Vec<_> = two.iter().map(Loader::state).collect();
    let three = ranks(3);
    for (rank, l) in three.iter().enumerate() {
        l.load_state(&states[rank % 2]).unwrap();
    }
    got.extend(global(&three, usize::MAX));
    assert_eq!(got, reference);
}
