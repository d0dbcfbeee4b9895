//! `sluice run --trace`: a real run writes a trace whose per-op time, read back from the
//! Chrome JSON, adds up to the run's own report; the Perfetto file is written too.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::process::Command;

use common::*;

fn run(dir: &std::path::Path, trace: &str) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["run", "spec.json", "--json", "--trace", trace])
        .current_dir(dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("events written to {trace}")), "{stderr}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn run_with_trace_writes_per_op_events_that_add_up_to_the_report() {
    let _watchdog = watchdog("sluice run --trace", 60);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    std::fs::write(dir.path().join("spec.json"), spec(&root, 3).to_json_string().unwrap()).unwrap();

    let stats = run(dir.path(), "run.json");
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("run.json")).unwrap()).unwrap();
    let mut traced: HashMap<String, (f64, usize)> = HashMap::new();
    for e in trace["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X") {
        let t = traced.entry(e["name"].as_str().unwrap().to_string()).or_default();
        t.0 += e["dur"].as_f64().unwrap() / 1e6;
        t.1 += 1;
    }
    for op in stats["op_seconds"].as_array().unwrap() {
        let (name, seconds) = (op[0].as_str().unwrap(), op[1].as_f64().unwrap());
        let (t, n) = traced[name];
        assert_eq!(n, IMAGES, "{name}: one event per sample");
        assert!((t - seconds).abs() <= 0.01 * seconds, "{name}: trace {t}s, report {seconds}s");
    }
    assert_eq!(traced["batch_preprocessed"].1, IMAGES / BATCH);

    run(dir.path(), "run.pftrace");
    assert!(std::fs::metadata(dir.path().join("run.pftrace")).unwrap().len() > 1000);
}
