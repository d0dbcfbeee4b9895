//! Checkpoint JSON (what `Loader.load_state_dict` parses) → `LoaderState` → `load_state`
//! on a loader of each sampling kind → the epoch it resumes, drawn and run. Properties:
//! nothing panics; a state a loader takes is where it then stands, and the epoch it
//! resumes hands out no more batches than an epoch has.
//!
//! Each state is tried as given and with the loader's own dataset, seed and shard, so the
//! fuzzer reaches past the identity checks into the position and importance state.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_core::{Location, Manifest, PipelineSpec};
use sluice_pipeline::{Loader, LoaderState, Shard};

/// Samples in the in-memory dataset (its files do not exist: every read fails, and the
/// `skip` policy leaves each failed sample out).
const SAMPLES: usize = 12;

fn loaders() -> Vec<Loader> {
    let items =
        (0..SAMPLES).map(|i| (Location::File { path: format!("{i}.jpg").into() }, (i % 3) as i64, 100)).collect();
    let manifest = Manifest::new("/nonexistent-sluice-fuzz".into(), items, vec![]);
    let samplings = [
        r#"{"kind": "uniform"}"#,
        r#"{"kind": "importance", "floor": 0.2, "coverage_epochs": 2}"#,
        r#"{"kind": "fastmatch"}"#,
        r#"{"kind": "shade"}"#,
    ];
    samplings
        .iter()
        .map(|sampling| {
            let json = format!(
                r#"{{"source": {{"kind": "image_folder", "root": "/nonexistent-sluice-fuzz"}},
                    "ops": [{{"op": "decode"}}, {{"op": "center_crop", "size": 4}}],
                    "batch": {{"size": 5}}, "threads": 1, "prefetch": 1, "on_error": "skip",
                    "sampling": {sampling}}}"#
            );
            let spec = PipelineSpec::from_json_str(&json).expect("the fixture spec parses");
            Loader::with_manifest(spec, manifest.clone(), Shard { rank: 0, world_size: 1 }).expect("the fixture loader")
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(state) = serde_json::from_str::<LoaderState>(text) else { return };
    for loader in loaders() {
        let me = loader.state();
        let ours = LoaderState {
            fingerprint: me.fingerprint.clone(),
            seed: me.seed,
            rank: me.rank,
            world_size: me.world_size,
            ..state.clone()
        };
        for s in [&state, &ours] {
            if loader.load_state(s).is_err() {
                continue;
            }
            let now = loader.state();
            assert_eq!((now.epoch, now.batch), (s.epoch, s.batch), "the loader stands where the state says");
            let per_epoch = loader.batches_per_epoch();
            let mut handed = 0;
            for batch in loader.iter() {
                match batch {
                    Ok(_) => handed += 1,
                    Err(e) => panic!("every sample is skipped, nothing fails: {e}"),
                }
            }
            assert!(handed <= per_epoch, "{handed} batches out of a {per_epoch}-batch epoch");
        }
    }
});
