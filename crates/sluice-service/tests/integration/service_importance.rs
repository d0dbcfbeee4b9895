//! Importance sampling through the service: trainers report to the dispatcher, which holds
//! the job's importance store, draws each epoch with the local sampler and journals it.
//! A dispatcher and workers in this process (processes where they are killed) on
//! 127.0.0.1, [`RemoteLoader`]s in this process, and a local [`Loader`] fed the same
//! reports as the reference.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sluice_client::{RemoteLoader, ReportKind, ServiceErrorKind};
use sluice_core::{PipelineSpec, SamplingSpec};
use sluice_pipeline::importance::MAX_IMPORTANCE;
use sluice_pipeline::{Loader, Shard};

use crate::support::*;

fn importance_spec(root: &std::path::Path) -> PipelineSpec {
    let mut s = spec(root, 11);
    s.sampling = SamplingSpec::Importance { floor: 0.1, coverage_epochs: 4, miss_discount: 1.0, max_draws: 4.0 };
    s
}

/// The trainer's per-sample loss: the first 8 samples are hard.
fn loss(key: u64) -> f64 {
    if key < 8 {
        10.0
    } else {
        0.1 + key as f64 / 100.0
    }
}

/// An epoch as a sorted multiset of (key, weight bits): what was drawn, and how weighted.
type Drawn = Vec<(u64, u32)>;

fn drawn(batches: &[sluice_core::Batch]) -> Drawn {
    let mut v: Drawn = batches
        .iter()
        .flat_map(|b| {
            let w = b.weights.clone().unwrap_or_else(|| vec![1.0; b.keys.len()]);
            b.keys.iter().copied().zip(w.into_iter().map(f32::to_bits)).collect::<Vec<_>>()
        })
        .collect();
    v.sort_unstable();
    v
}

/// One local epoch, each batch's losses reported as it is taken.
fn local_epoch(local: &Loader) -> Drawn {
    let batches: Vec<sluice_core::Batch> = local
        .iter()
        .map(|b| {
            let b = b.unwrap();
            let values: Vec<f64> = b.keys.iter().map(|&k| loss(k)).collect();
            local.report(&b.keys, &values).unwrap();
            b
        })
        .collect();
    drawn(&batches)
}

/// One remote epoch (or its rest), each batch's losses reported as the trainer uses it,
/// before it asks for the next; stops after `stop` batches if given.
fn remote_epoch(remote: &mut RemoteLoader, stop: Option<usize>) -> Vec<sluice_core::Batch> {
    let mut out = Vec::new();
    remote.start_epoch();
    while stop.is_none_or(|s| out.len() < s) {
        let Some(b) = remote.next_batch(&mut || false) else { break };
        let b = b.unwrap();
        let values: Vec<f64> = b.keys.iter().map(|&k| loss(k)).collect();
        let r = remote.report(&b.keys, &values, ReportKind::Loss).unwrap();
        assert_eq!((r.accepted, r.invalid, r.unknown), (b.keys.len() as u64, 0, 0));
        out.push(b);
    }
    out
}

#[test]
fn importance_epochs_are_drawn_by_the_dispatcher_as_the_local_loader_draws_them_across_a_restart() {
    let _watchdog = watchdog("importance_epochs_are_drawn_by_the_dispatcher_as_the_local_loader_draws_them", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let journal = dir.path().join("journal");
    let addr = free_addr();
    let mut d = dispatcher_process(&addr, &journal, &root, &[]);
    let _w: Vec<Server> = (0..2).map(|_| worker(&addr, &root, &[])).collect();
    let s = importance_spec(&root);
    let local = Loader::new(s.clone(), Shard::default()).unwrap();
    let expected: Vec<Drawn> = (0..3).map(|_| local_epoch(&local)).collect();
    assert!(expected[1].iter().filter(|(k, _)| *k < 8).count() > 8, "the hard samples are drawn more");

    let mut remote = RemoteLoader::connect(&s, options(&addr, "imp")).unwrap();
    for (epoch, want) in expected.iter().enumerate().take(2) {
        let got = within(60, "an importance epoch", {
            let mut r = remote;
            move || {
                let b = remote_epoch(&mut r, None);
                (r, b)
            }
        });
        remote = got.0;
        assert_eq!(&drawn(&got.1), want, "epoch {epoch}: the service's draw is the local loader's");
        assert!(epoch == 0 || got.1.iter().all(|b| b.weights.is_some()), "importance epochs carry weights");
    }

    // Epoch 2: half of it, then the dispatcher restarts from its journal; the rest of the
    // epoch is the same draw.
    let (first, r) = within(60, "half an epoch", move || {
        let mut r = remote;
        let b = remote_epoch(&mut r, Some(3));
        (b, r)
    });
    let state = r.state();
    drop(r);
    d.kill();
    let _d2 = dispatcher_process(&addr, &journal, &root, &[]);
    let rest = within(60, "the rest of the epoch after a restart", move || {
        let mut r = RemoteLoader::connect(&s, options(&addr, "imp")).unwrap();
        r.load_state(&state).unwrap();
        let b = remote_epoch(&mut r, None);
        assert_eq!(r.epoch(), 3);
        b
    });
    let mut all = first;
    all.extend(rest);
    assert_eq!(drawn(&all), expected[2], "epoch 2 resumed after the restart: the same draw, each occurrence once");
}

#[test]
fn reports_are_validated_and_bad_values_never_reach_the_store() {
    let _watchdog = watchdog("reports_are_validated_and_bad_values_never_reach_the_store", 90);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let _w = worker(&addr, &root, &[]);

    // A uniformly sampled job takes no reports.
    let uniform = RemoteLoader::connect(&spec(&root, 1), options(&addr, "uniform")).unwrap();
    let e = uniform.report(&[1], &[1.0], ReportKind::Loss).unwrap_err();
    assert_eq!(e.kind(), ServiceErrorKind::FailedPrecondition, "{e}");
    assert!(e.to_string().contains("samples uniformly"), "{e}");

    let s = importance_spec(&root);
    let local = Loader::new(s.clone(), Shard::default()).unwrap();
    let want = [local_epoch(&local), local_epoch(&local)];
    let mut remote = RemoteLoader::connect(&s, options(&addr, "imp")).unwrap();
    // Bad reports in the middle of epoch 0: the wrong length, NaN, infinite and negative
    // values, unknown keys, and gradient norms into a job of losses.
    let bad = |remote: &RemoteLoader| {
        let e = remote.report(&[1, 2], &[1.0], ReportKind::Loss).unwrap_err();
        assert_eq!(e.kind(), ServiceErrorKind::InvalidRequest, "{e}");
        let r = remote.report(&[0, 1, 2, 9999], &[f64::NAN, f64::INFINITY, -1.0, 5.0], ReportKind::Loss).unwrap();
        assert_eq!((r.accepted, r.invalid, r.unknown), (0, 3, 1));
        let e = remote.report(&[1], &[1.0], ReportKind::GradNorm).unwrap_err();
        assert_eq!(e.kind(), ServiceErrorKind::InvalidRequest, "{e}");
        assert!(e.to_string().contains("REPORT_KIND_LOSS"), "{e}");
    };
    let epochs = within(60, "two epochs", move || {
        let mut first = remote_epoch(&mut remote, Some(2));
        bad(&remote);
        first.extend(remote_epoch(&mut remote, None));
        [first, remote_epoch(&mut remote, None)]
    });
    // None of it changed the store: epoch 1 is the local loader's, fed only good values.
    assert_eq!(drawn(&epochs[0]), want[0]);
    assert_eq!(drawn(&epochs[1]), want[1]);
}

#[test]
fn a_1e308_report_is_clamped_at_the_door_counted_in_the_reply_and_metrics_and_weights_stay_correct() {
    let _watchdog = watchdog("a_1e308_report_is_clamped_at_the_door", 90);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let (addr, metrics) = (free_addr(), free_addr());
    let port = metrics.rsplit(':').next().unwrap().to_string();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &["--metrics-port", &port]);
    let _w = worker(&addr, &root, &[]);
    let s = importance_spec(&root);
    // Four keys reported at 1e308 on top of the trainer's losses: their sum overflowed,
    // so every probability was the floor's and epoch 1 came out uniform.
    let absurd = [0u64, 1, 2, 3];
    // The reference: a local loader fed the same reports, the absurd values (and key 6's
    // f64::MAX below) at the bound.
    let local = Loader::new(s.clone(), Shard::default()).unwrap();
    let first = local_epoch(&local);
    local.report(&[0, 1, 2, 3, 6], &[MAX_IMPORTANCE; 5]).unwrap();
    let want = [first, local_epoch(&local)];

    let mut remote = RemoteLoader::connect(&s, options(&addr, "absurd")).unwrap();
    let epochs = within(60, "two epochs", move || {
        let mut first = remote_epoch(&mut remote, Some(2));
        let r = remote.report(&absurd, &[1e308; 4], ReportKind::Loss).unwrap();
        assert_eq!((r.accepted, r.clamped, r.invalid, r.unknown), (4, 4, 0, 0));
        let r = remote.report(&[4, 5, 6], &[f64::NAN, -1.0, f64::MAX], ReportKind::Loss).unwrap();
        assert_eq!((r.accepted, r.clamped, r.invalid, r.unknown), (1, 1, 2, 0));
        first.extend(remote_epoch(&mut remote, None));
        [first, remote_epoch(&mut remote, None)]
    });
    assert_eq!(drawn(&epochs[0]), want[0]);
    assert_eq!(drawn(&epochs[1]), want[1], "epoch 1 is drawn as if the 1e308s were the bound");
    let weights: Vec<f32> = drawn(&epochs[1]).iter().map(|(_, w)| f32::from_bits(*w)).collect();
    let outliers = drawn(&epochs[1]).iter().filter(|(k, _)| *k <= 3 || *k == 6).count();
    assert!(outliers >= 12, "the five outliers take the ceiling's draws: {outliers}");
    assert!(weights.iter().any(|&w| w > 1.0), "the rest are weighted up: {weights:?}");

    let text = http_get(&metrics);
    assert_eq!(metric_value(&text, "sluice_job_importance_clamped_total{job=\"absurd\"}"), 5.0, "{text}");
    assert_eq!(metric_value(&text, "sluice_job_importance_refused_total{job=\"absurd\"}"), 2.0, "{text}");
}

#[test]
fn two_clients_of_one_importance_job_get_disjoint_batches_whose_union_is_the_draw() {
    let _watchdog = watchdog("two_clients_of_one_importance_job_get_disjoint_batches_whose_union_is_the_draw", 90);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let _w: Vec<Server> = (0..2).map(|_| worker(&addr, &root, &[])).collect();
    let s = importance_spec(&root);
    let local = Loader::new(s.clone(), Shard::default()).unwrap();
    let want = [local_epoch(&local), local_epoch(&local)];

    // Two ranks, each reading its share and reporting only its own samples.
    let ranks: Vec<std::thread::JoinHandle<Vec<Vec<sluice_core::Batch>>>> = (0..2)
        .map(|_| {
            let (s, addr) = (s.clone(), addr.clone());
            std::thread::spawn(move || {
                let mut r = RemoteLoader::connect(&s, options(&addr, "ddp")).unwrap();
                (0..2).map(|_| remote_epoch(&mut r, None)).collect()
            })
        })
        .collect();
    let per_rank: Vec<Vec<Vec<sluice_core::Batch>>> =
        within(80, "two ranks, two epochs", move || ranks.into_iter().map(|h| h.join().unwrap()).collect());
    for (epoch, want) in want.iter().enumerate() {
        let (a, b) = (&per_rank[0][epoch], &per_rank[1][epoch]);
        assert!(!a.is_empty() && !b.is_empty(), "epoch {epoch}: both ranks got batches");
        let mut indices: Vec<u64> = a.iter().chain(b).map(|x| x.index).collect();
        indices.sort_unstable();
        let n = indices.len();
        indices.dedup();
        assert_eq!(indices.len(), n, "epoch {epoch}: the ranks' batches are disjoint");
        let union: Vec<sluice_core::Batch> = a.iter().chain(b).cloned().collect();
        assert_eq!(&drawn(&union), want, "epoch {epoch}: together, exactly the drawn multiset");
    }
}

#[test]
fn every_drawn_occurrence_arrives_once_across_20_worker_kills_and_a_dispatcher_restart() {
    let _watchdog =
        watchdog("every_drawn_occurrence_arrives_once_across_20_worker_kills_and_a_dispatcher_restart", 240);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let journal = dir.path().join("journal");
    let addr = free_addr();
    let mut d = dispatcher_process(&addr, &journal, &root, &[]);
    let mut workers: Vec<Proc> = (0..3).map(|_| worker_process(&addr, &root, &[])).collect();
    let s = importance_spec(&root);
    let local = Loader::new(s.clone(), Shard::default()).unwrap();
    let rounds = 20;
    let want: Vec<Drawn> = (0..rounds).map(|_| local_epoch(&local)).collect();
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    eprintln!("rng seed {seed}");
    let mut rng = Rng(seed);
    let batches = IMAGES.div_ceil(BATCH) as u64;
    let mut remote = RemoteLoader::connect(&s, options(&addr, "kills")).unwrap();
    for (round, want) in want.iter().enumerate() {
        // Each epoch (one round): a worker killed and replaced at a random batch; in round
        // 10 the dispatcher too, restarted from its journal.
        let kill_at = rng.below(batches);
        let victim = rng.below(workers.len() as u64) as usize;
        let mut got = Vec::new();
        remote.start_epoch();
        while let Some(b) = remote.next_batch(&mut || false) {
            let b = b.unwrap();
            if got.len() as u64 == kill_at {
                std::thread::sleep(Duration::from_millis(rng.below(20)));
                workers[victim].kill();
                workers[victim] = worker_process(&addr, &root, &[]);
                if round == 10 {
                    d.kill();
                    d = dispatcher_process(&addr, &journal, &root, &[]);
                }
            }
            let values: Vec<f64> = b.keys.iter().map(|&k| loss(k)).collect();
            remote.report(&b.keys, &values, ReportKind::Loss).unwrap();
            got.push(b);
        }
        let mut indices: Vec<u64> = got.iter().map(|b| b.index).collect();
        indices.sort_unstable();
        assert_eq!(indices, (0..batches).collect::<Vec<_>>(), "round {round}: every batch once");
        assert_eq!(&drawn(&got), want, "round {round} (worker {victim} killed at batch {kill_at}): the drawn multiset");
    }
    eprintln!("duplicates dropped by the client: {}", remote.duplicates_dropped());
}
