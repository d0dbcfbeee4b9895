//! Importance sampling across DDP ranks: every rank must draw the same global order, so
//! the ranks' shards stay disjoint and together are exactly the epoch's draw, and the
//! coverage guarantee holds for the job, not per rank. The contract: every rank reports
//! every rank's values, in rank order (the Python loader gathers them with
//! `torch.distributed.all_gather_object`).

#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use std::collections::HashSet;
use std::path::Path;

use sluice_core::{PipelineSpec, SamplingSpec, SourceSpec};
use sluice_pipeline::{Loader, Shard};
use sluice_synth::{write_dataset, DatasetOptions};

fn spec(root: &Path) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(SourceSpec::ImageFolder { root: root.to_path_buf() }, 16, 5);
    s.threads = 1.into();
    s.seed = 9;
    s.prefetch = 2;
    s.sampling = SamplingSpec::Importance { floor: 0.1, coverage_epochs: 3, miss_discount: 0.5, max_draws: 4.0 };
    s
}

/// A fake trainer's per-sample loss: a few hard samples.
fn loss(key: u64) -> f64 {
    if key.is_multiple_of(5) {
        5.0
    } else {
        0.1 + (key % 3) as f64 * 0.05
    }
}

fn epoch_keys(loader: &Loader) -> Vec<Vec<u64>> {
    loader.iter().map(|b| b.unwrap().keys).collect()
}

fn sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v
}

#[test]
fn ranks_reporting_only_their_own_losses_draw_one_order_once_reports_are_shared() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("train");
    write_dataset(&root, &DatasetOptions { images: 30, classes: 3, ..Default::default() }, &|_| {}).unwrap();
    let world = 3;
    let ranks: Vec<Loader> =
        (0..world).map(|rank| Loader::new(spec(&root), Shard { rank, world_size: world }).unwrap()).collect();
    // One loader over the whole job, fed the same reports: its epoch is the global draw.
    let whole = Loader::new(spec(&root), Shard::default()).unwrap();
    let mut seen_since: Vec<HashSet<u64>> = Vec::new();
    for epoch in 0..6 {
        let shards: Vec<Vec<Vec<u64>>> = ranks.iter().map(epoch_keys).collect();
        let drawn: Vec<u64> = epoch_keys(&whole).concat();
        let per_rank: Vec<Vec<u64>> = shards.iter().map(|s| s.concat()).collect();
        for (r, keys) in per_rank.iter().enumerate() {
            assert_eq!(keys.len(), 10, "epoch {epoch}: rank {r}'s share");
        }
        // Disjoint as positions of one draw: together they are exactly the drawn multiset
        // (importance draws with replacement, so a key may repeat, but never beyond its draws).
        assert_eq!(
            sorted(per_rank.concat()),
            sorted(drawn.clone()),
            "epoch {epoch}: the ranks' shards are not a split of one draw: {per_rank:?}"
        );
        let epoch_set: HashSet<u64> = drawn.iter().copied().collect();
        seen_since.push(epoch_set);
        // Each rank reports its own losses; the job shares them (all_gather) and every
        // rank, in rank order, hands all of them to its loader.
        let reports: Vec<(Vec<u64>, Vec<f64>)> =
            shards.iter().flatten().map(|batch| (batch.clone(), batch.iter().map(|&k| loss(k)).collect())).collect();
        for loader in ranks.iter().chain([&whole]) {
            for (keys, values) in &reports {
                loader.report(keys, values).unwrap();
            }
        }
    }
    // Coverage for the job: every sample drawn in any 3 consecutive epochs.
    for w in seen_since.windows(3) {
        let union: HashSet<u64> = w.iter().flatten().copied().collect();
        assert_eq!(union.len(), 30, "a sample went 3 epochs undrawn");
    }
    // The sampler did act on the scores: hard samples dominate the late epochs.
    let hard = seen_since.last().unwrap().iter().filter(|k| *k % 5 == 0).count();
    assert_eq!(hard, 6);
}
