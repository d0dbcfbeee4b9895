//! A spec whose output size overflowed the batch arithmetic: the loader must refuse it
//! with an error naming the field, not build a batch buffer smaller than its slots (which
//! made every worker write out of bounds and crash).

#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use sluice_core::{OpSpec, PipelineSpec, Size, SourceSpec};
use sluice_pipeline::{Loader, PipelineError, Shard};
use sluice_synth::{write_dataset, DatasetOptions};

#[test]
fn a_spec_whose_batch_size_overflowed_is_refused_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("train");
    let o = DatasetOptions { images: 4, classes: 2, texture: 4, ..Default::default() };
    write_dataset(&root, &o, &|_| {}).unwrap();
    let mut spec = PipelineSpec::train_default(SourceSpec::ImageFolder { root }, 32, 2);
    spec.threads = 1.into();
    // 2 × 4294967295 × 715827883 × 3 = 2^64 + 2^32 - 2: wrapped, a 4 GiB buffer for two
    // slots of 2^63 bytes each.
    spec.ops[1] = OpSpec::CenterCrop { size: Size { height: 4_294_967_295, width: 715_827_883 } };
    let loader = Loader::new(spec, Shard::default());
    let err = match loader {
        Err(PipelineError::Spec(e)) => e,
        Err(other) => panic!("refused for the wrong reason: {other}"),
        Ok(loader) => {
            // Before the fix the loader was built; reading a batch wrote past its buffer.
            let first = loader.iter().next().map(|b| b.map(|b| b.len()));
            panic!("the loader accepted the spec and produced {first:?}")
        }
    };
    assert_eq!(err.field, "ops[1].size", "{err}");
}
