//! A mixed source (`kind = "mix"`) through the service: a [`RemoteLoader`] gets, batch by
//! batch, the samples the local [`Loader`] draws for the same spec (each batch holding the
//! sources in their weights' proportions), each sample of the epoch's draw once, across a
//! checkpoint and across a worker SIGKILLed mid-epoch. What the service still refuses in
//! a mix is refused by the field or path at fault.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sluice_client::RemoteLoader;
use sluice_core::{Batch, MixedSource, PipelineSpec, SourceSpec};
use sluice_pipeline::{Loader, Shard};
use sluice_synth::DatasetOptions;

use crate::support::*;

/// Images per source: `data/a`, `data/b`, `data/c` (keys of the joined manifest in that order).
const SIZES: [usize; 3] = [40, 20, 12];
/// 0.5, 0.3 and 0.2 of each batch of [`MIX_BATCH`]: 4, 2.4 and 1.6 samples.
const WEIGHTS: [f64; 3] = [5.0, 3.0, 2.0];
const MIX_BATCH: usize = 8;
/// `c` (12 samples, 1.6 a batch) runs out first: 7 batches an epoch.
const MIX_BATCHES: usize = 7;

/// The three sources under `dir/data`.
fn sources(dir: &Path) -> (PathBuf, Vec<PathBuf>) {
    let root = dir.join("data");
    let roots: Vec<PathBuf> = ["a", "b", "c"].iter().map(|n| root.join(n)).collect();
    for (i, (r, &images)) in roots.iter().zip(&SIZES).enumerate() {
        let options = DatasetOptions { images, classes: 2, texture: 8, seed: i as u64 + 1, ..Default::default() };
        sluice_synth::write_dataset(r, &options, &|_| {}).unwrap();
    }
    (root, roots)
}

fn mix_spec(roots: &[PathBuf], seed: u64) -> PipelineSpec {
    let sources = roots
        .iter()
        .zip(WEIGHTS)
        .map(|(r, weight)| MixedSource { source: SourceSpec::ImageFolder { root: r.clone() }, weight })
        .collect();
    let mut s = PipelineSpec::train_default(SourceSpec::Mix { sources }, 32, MIX_BATCH);
    s.seed = seed;
    s.threads = 1.into();
    s
}

/// Which source a key of the joined manifest is from.
fn source_of(key: u64) -> usize {
    let mut end = 0;
    for (s, n) in SIZES.iter().enumerate() {
        end += *n as u64;
        if key < end {
            return s;
        }
    }
    usize::MAX
}

/// The local loader's next epoch: each batch's keys, by index.
fn local_epoch(local: &Loader) -> BTreeMap<u64, Vec<u64>> {
    local.iter().map(|b| b.unwrap()).map(|b| (b.index, b.keys)).collect()
}

/// Adds a served batch to `got`, refusing a batch index served twice.
fn take(got: &mut BTreeMap<u64, Vec<u64>>, b: Batch, what: &str) {
    let index = b.index;
    assert!(got.insert(index, b.keys).is_none(), "{what}: batch {index} served twice");
}

/// The service's epoch equals the local one batch by batch; each batch holds each source
/// within one sample of its share; no sample twice.
fn assert_as_local(got: &BTreeMap<u64, Vec<u64>>, want: &BTreeMap<u64, Vec<u64>>, what: &str) {
    assert_eq!(want.len(), MIX_BATCHES, "{what}: the local loader's epoch");
    let total: f64 = WEIGHTS.iter().sum();
    for (index, keys) in want {
        assert_eq!(got.get(index), Some(keys), "{what}: batch {index} differs from the local loader's");
        let mut counts = [0usize; 3];
        keys.iter().for_each(|&k| counts[source_of(k)] += 1);
        for (s, &c) in counts.iter().enumerate() {
            let quota = WEIGHTS[s] / total * MIX_BATCH as f64;
            assert!(
                c as f64 >= quota.floor() && c as f64 <= quota.ceil(),
                "{what}: batch {index} holds {counts:?} of the sources, quota {quota} for source {s}"
            );
        }
    }
    assert_eq!(got.len(), want.len(), "{what}: batches {:?}, locally {:?}", got.keys(), want.keys());
    let mut all: Vec<u64> = got.values().flatten().copied().collect();
    all.sort_unstable();
    let n = all.len();
    all.dedup();
    assert_eq!(all.len(), n, "{what}: a sample served twice");
    assert_eq!(n, MIX_BATCHES * MIX_BATCH);
}

#[test]
fn a_mix_is_served_batch_by_batch_as_the_local_loader_draws_it_across_a_checkpoint() {
    let _watchdog = watchdog("a_mix_is_served_batch_by_batch_as_the_local_loader_draws_it_across_a_checkpoint", 120);
    let dir = tempfile::tempdir().unwrap();
    let (root, roots) = sources(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let _w: Vec<Server> = (0..2).map(|_| worker(&addr, &root, &[])).collect();
    let spec = mix_spec(&roots, 9);
    let local = Loader::new(spec.clone(), Shard::default()).unwrap();

    // Epoch 0: 3 batches, a checkpoint, the trainer gone; its successor reads the rest.
    let mut first = RemoteLoader::connect(&spec, options(&addr, "mix")).unwrap();
    assert_eq!(first.batches_per_epoch(), MIX_BATCHES as u64);
    let mut got = BTreeMap::new();
    for b in first.iter().take(3) {
        take(&mut got, b.unwrap(), "epoch 0 before the checkpoint");
    }
    let json = serde_json::to_string(&first.state()).unwrap();
    drop(first);
    let mut second = RemoteLoader::connect(&spec, options(&addr, "mix")).unwrap();
    second.load_state(&serde_json::from_str(&json).unwrap()).unwrap();
    for b in second.iter() {
        take(&mut got, b.unwrap(), "epoch 0 after the checkpoint");
    }
    assert_as_local(&got, &local_epoch(&local), "epoch 0, checkpoint + resume");

    // Epoch 1: another order, still the local loader's.
    let mut got = BTreeMap::new();
    for b in second.iter() {
        take(&mut got, b.unwrap(), "epoch 1");
    }
    let want = local_epoch(&local);
    assert_as_local(&got, &want, "epoch 1");
    assert_eq!(second.epoch(), 2);
}

#[test]
fn a_mix_is_served_exactly_once_across_a_worker_kill() {
    let _watchdog = watchdog("a_mix_is_served_exactly_once_across_a_worker_kill", 120);
    let dir = tempfile::tempdir().unwrap();
    let (root, roots) = sources(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let mut workers: Vec<Proc> = (0..2).map(|_| worker_process(&addr, &root, &[])).collect();
    let spec = mix_spec(&roots, 4);
    let local = Loader::new(spec.clone(), Shard::default()).unwrap();
    // One batch a task, few ahead: the kill leaves tasks of the epoch to run elsewhere.
    let mut o = options(&addr, "mix-kill");
    o.task_batches = 1;
    o.tasks_in_flight = 2;
    let mut remote = RemoteLoader::connect(&spec, o).unwrap();
    let mut got = BTreeMap::new();
    for (read, b) in remote.iter().enumerate() {
        if read == MIX_BATCHES / 2 {
            workers[0].kill();
            workers[0] = worker_process(&addr, &root, &[]);
        }
        take(&mut got, b.unwrap(), "epoch 0 across a worker kill");
    }
    assert_as_local(&got, &local_epoch(&local), "epoch 0 across a worker kill");
}

#[test]
fn a_mix_is_refused_only_for_what_the_service_refuses_in_any_source() {
    let _watchdog = watchdog("a_mix_is_refused_only_for_what_the_service_refuses_in_any_source", 60);
    let dir = tempfile::tempdir().unwrap();
    let (root, mut roots) = sources(dir.path());
    // A third source outside the allowed root.
    let outside = dir.path().join("outside");
    std::fs::rename(&roots[2], &outside).unwrap();
    roots[2] = outside.clone();
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let err = RemoteLoader::connect(&mix_spec(&roots, 1), options(&addr, "mix-outside")).err().unwrap().to_string();
    assert!(err.contains(&outside.display().to_string()) && err.contains("allowed"), "{err}");
    // The refusals of one source's spec still hold: no disk tier in a service job.
    roots[2] = root.join("c");
    std::fs::rename(&outside, &roots[2]).unwrap();
    let mut spec = mix_spec(&roots, 1);
    spec.cache = Some(sluice_core::CacheSpec {
        budget: sluice_core::ByteBudget::Bytes(1 << 20),
        level: sluice_core::CacheLevel::Decoded,
        resize: None,
        policy: sluice_core::CachePolicyKind::Lru,
        disk: Some(sluice_core::DiskCacheSpec {
            dir: dir.path().join("disk"),
            budget: sluice_core::ByteBudget::Bytes(1 << 20),
            policy: Default::default(),
        }),
        share: false,
    });
    let err = RemoteLoader::connect(&spec, options(&addr, "mix-disk")).err().unwrap().to_string();
    assert!(err.contains("cache.disk"), "{err}");
    // A source with masks cannot be mixed at all (its boxes): refused by the mixed
    // source's field.
    let mut spec = mix_spec(&roots, 1);
    if let SourceSpec::Mix { sources } = &mut spec.source {
        sources[1].source = SourceSpec::Sidecar { root: roots[1].clone(), masks: true };
    }
    let err = RemoteLoader::connect(&spec, options(&addr, "mix-masks")).err().unwrap().to_string();
    assert!(err.contains("source.sources[1]") && err.contains("boxes"), "{err}");
    // Accepted now: the same mix within the root.
    let remote = RemoteLoader::connect(&mix_spec(&roots, 1), options(&addr, "mix-ok")).unwrap();
    assert_eq!(remote.batches_per_epoch(), MIX_BATCHES as u64);
}

#[test]
fn parallel_epochs_of_a_mix_are_the_local_loaders_consecutive_epochs() {
    let _watchdog = watchdog("parallel_epochs_of_a_mix_are_the_local_loaders_consecutive_epochs", 120);
    let dir = tempfile::tempdir().unwrap();
    let (root, roots) = sources(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let _w: Vec<Server> = (0..2).map(|_| worker(&addr, &root, &[])).collect();
    let spec = mix_spec(&roots, 6);
    let local = Loader::new(spec.clone(), Shard::default()).unwrap();
    let mut o = options(&addr, "mix-parallel");
    o.parallel_epochs = 2;
    let mut remote = RemoteLoader::connect(&spec, o).unwrap();
    let pass = MIX_BATCHES as u64;
    assert_eq!(remote.batches_per_epoch(), 2 * pass);
    let mut got = BTreeMap::new();
    for b in remote.iter() {
        take(&mut got, b.unwrap(), "two passes");
    }
    // Pass p of service epoch 0 is the local loader's epoch p, its batches numbered on.
    for p in 0..2 {
        let want = local_epoch(&local);
        let mine: BTreeMap<u64, Vec<u64>> =
            got.range(p * pass..(p + 1) * pass).map(|(i, keys)| (i - p * pass, keys.clone())).collect();
        assert_as_local(&mine, &want, &format!("pass {p}"));
    }
}
