//! `sluice-bench engine` on a dataset with bad files: they are left out, and the pipeline,
//! plain decode and (with `--packed`) the packed copy are each measured.

#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use std::process::Command;

use sluice_synth::{write_dataset, DatasetOptions};

#[test]
fn the_engine_bench_leaves_out_bad_files_and_measures_the_packed_copy() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train");
    let options = DatasetOptions { images: 12, classes: 3, corrupt: 5, ..Default::default() };
    write_dataset(&train, &options, &|_| {}).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args(["engine", "--data", "train", "--runs", "1", "--threads", "1", "--batch", "4", "--json", "--packed"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "sluice-bench engine failed:\n{stderr}");
    assert!(stderr.contains("left out 5 files"), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = &report["rows"][0];
    assert_eq!(row["threads"], 1);
    assert!(row["pipeline_img_s"].as_f64().unwrap() > 0.0 && row["ratio"].as_f64().unwrap() > 0.0);
    assert!(row["packed_pipeline_img_s"].as_f64().unwrap() > 0.0, "{row}");
    assert!(dir.path().join("train-packed").is_dir(), "--packed writes the copy next to the data");
}
