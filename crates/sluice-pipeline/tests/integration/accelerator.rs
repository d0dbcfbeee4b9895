//! The trainer's accelerator busy fraction in the loader's stats: measured from its step
//! timing (compute between `next()` calls against the wait for data), or as it reports it.

#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use std::time::{Duration, Instant};

use sluice_autoscale::BusySource;
use sluice_core::{OpSpec, PipelineSpec, SourceSpec};
use sluice_pipeline::{Loader, Shard};
use sluice_synth::{write_dataset, DatasetOptions};

#[test]
fn step_timing_reads_the_share_of_each_step_the_trainer_computes_and_a_report_overrides_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("train");
    write_dataset(&root, &DatasetOptions { images: 48, classes: 2, texture: 4, ..Default::default() }, &|_| {})
        .unwrap();
    // One thread makes a batch of 4 in at least 40 ms; the trainer computes 25 ms a step,
    // so it waits for about the rest.
    let mut spec = PipelineSpec::train_default(SourceSpec::ImageFolder { root }, 32, 4);
    spec.threads = 1.into();
    spec.prefetch = 1;
    spec.ops.push(OpSpec::Sleep { us: 10_000 });
    let loader = Loader::new(spec, Shard::default()).unwrap();
    assert!(loader.stats().accelerator.is_none(), "no step yet");
    let compute = Duration::from_millis(25);
    let mut iter = loader.iter();
    iter.next().unwrap().unwrap();
    // From the first batch handed out: each step is 25 ms of compute and then the wait.
    let t0 = Instant::now();
    let mut steps = 0;
    while let Some(b) = {
        std::thread::sleep(compute);
        iter.next()
    } {
        b.unwrap();
        steps += 1;
    }
    // The last call (the end of the epoch) computed too but took no batch.
    let known = (steps + 1) as f64 * compute.as_secs_f64() / t0.elapsed().as_secs_f64();
    assert!((0.2..0.8).contains(&known), "the trainer computed {known:.2} of the time");
    let a = loader.stats().accelerator.unwrap();
    assert_eq!(a.source, BusySource::StepTiming);
    assert!((a.busy - known).abs() < 0.1, "step timing reads {:.3}, the trainer computed {known:.3}", a.busy);

    // A trainer that reads a device counter reports it, and the stats show that instead.
    loader.report_accelerator_busy(0.97);
    let a = loader.stats().accelerator.unwrap();
    assert_eq!((a.busy, a.source), (0.97, BusySource::Reported));
    let json = serde_json::to_string(&loader.stats()).unwrap();
    assert!(json.contains(r#""accelerator":{"busy":0.97,"source":"reported"}"#), "{json}");
}
