//! `sluice run --trace`: a real run writes a trace whose per-op time, read back from the
//! Chrome JSON, adds up to the run's own report; the Perfetto file is written too. Service
//! traces of workers that share a pid merge into a track each.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::*;
use prost::Message;
use sluice_client::{ClockOffset, RemoteLoader};
use sluice_pipeline::trace::pb;
use sluice_pipeline::trace::pb::debug_annotation::{NameField, Value};
use sluice_pipeline::trace::pb::trace_packet::Data;
use sluice_pipeline::trace::pb::track_event::NameField as EventName;
use sluice_service::{run_dispatcher, run_worker, DispatcherConfig, WorkerConfig, WorkerLimits};

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

/// A packet of a Perfetto trace as these tests read it: a process track's pid, or an
/// event's name and integer args.
struct Packet {
    process: Option<i32>,
    name: String,
    args: BTreeMap<String, i64>,
}

impl Packet {
    fn int(&self, name: &str) -> i64 {
        self.args[name]
    }
}

fn decode(path: &Path) -> Vec<Packet> {
    let trace = pb::Trace::decode(std::fs::read(path).unwrap().as_slice()).unwrap();
    let packet = |process, name, args| Packet { process, name, args };
    trace
        .packet
        .into_iter()
        .filter_map(|p| match p.data? {
            Data::TrackDescriptor(t) => Some(packet(t.process?.pid, String::new(), BTreeMap::new())),
            Data::TrackEvent(e) => {
                let Some(EventName::Name(name)) = e.name_field else { return None };
                let args = e.debug_annotations.into_iter().filter_map(|a| {
                    let Some(NameField::Name(n)) = a.name_field else { return None };
                    match a.value? {
                        Value::UintValue(v) => Some((n, v as i64)),
                        Value::IntValue(v) => Some((n, v)),
                        _ => None,
                    }
                });
                Some(packet(None, name, args.collect()))
            }
        })
        .collect()
}

/// Two workers whose traces carry the same OS pid (in-process here, as every container's
/// worker is pid 1 under `deploy/worker.yaml`): `trace-merge` keeps them apart, two process
/// tracks, each moved by its own clock offset.
#[test]
fn workers_sharing_a_pid_merge_into_their_own_tracks_with_their_own_clock_offsets() {
    let _watchdog = watchdog("workers_sharing_a_pid_merge_into_their_own_tracks", 90);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let traces = dir.path().join("traces");
    let (addr, metrics) = (free_addr(), free_addr());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dispatcher = DispatcherConfig {
        listen: addr.clone(),
        journal: None,
        allow_roots: vec![root.clone()],
        token: None,
        operator_token: None,
        metrics_listen: Some(metrics.clone()),
        tls: None,
        autoscale: None,
        cache_aware: false,
        allow_python_modules: Vec::new(),
    };
    rt.spawn(run_dispatcher(dispatcher, std::future::pending(), |_| {}));
    for _ in 0..2 {
        let worker = WorkerConfig {
            listen: "127.0.0.1:0".into(),
            advertise: None,
            data_listen: "127.0.0.1:0".into(),
            advertise_data: None,
            dispatcher: addr.clone(),
            allow_roots: vec![root.clone()],
            token: None,
            metrics_listen: None,
            threads: 1,
            tls: None,
            dispatcher_ca: None,
            shared_memory: false,
            limits: WorkerLimits::default(),
            trace_dir: Some(traces.clone()),
            name: String::new(),
            python: "python3".into(),
            allow_python_modules: Vec::new(),
        };
        rt.spawn(run_worker(worker, std::future::pending(), |_| {}));
    }
    let t0 = std::time::Instant::now();
    while metric_value(&http_get(&metrics), "sluice_dispatcher_workers_live") != 2.0 {
        assert!(t0.elapsed() < Duration::from_secs(20), "2 workers did not register");
        std::thread::sleep(Duration::from_millis(50));
    }

    let mut loader = RemoteLoader::connect(&spec(&root, 5), options(&addr, "one-pid")).unwrap();
    loader.start_trace().unwrap();
    let mut batches = 0;
    for b in loader.iter() {
        b.unwrap();
        batches += 1;
    }
    let client = dir.path().join("client.pftrace");
    loader.stop_trace().unwrap().write(&client).unwrap();
    let job = loader.job().job_id;

    // Each build the client saw, by the worker that made it: the least uncertain offset.
    let mut best: BTreeMap<u64, ClockOffset> = BTreeMap::new();
    for e in decode(&client).iter().filter(|e| e.name == "batch_built") {
        let clock = ClockOffset { offset_ns: e.int("clock_offset_ns"), bound_ns: e.int("clock_error_ns") as u64 };
        let b = best.entry(e.int("worker_id") as u64).or_insert(clock);
        if clock.bound_ns < b.bound_ns {
            *b = clock;
        }
    }
    assert_eq!(best.len(), 2, "both workers built the client's batches");
    // The workers append a task's events once it is done: wait for both files.
    let files: Vec<PathBuf> = best.keys().map(|w| traces.join(format!("job-{job}-worker-{w}.pftrace"))).collect();
    let t0 = std::time::Instant::now();
    let built = |f: &PathBuf| decode(f).iter().filter(|e| e.name == "batch_preprocessed").count();
    while files.iter().map(|f| if f.exists() { built(f) } else { 0 }).sum::<usize>() < batches {
        assert!(t0.elapsed() < Duration::from_secs(10), "the workers did not write their traces");
        std::thread::sleep(Duration::from_millis(100));
    }

    let merged = sluice_service::merge_traces(&client, &files, &dir.path().join("merged.pftrace")).unwrap();
    assert_ne!(merged[0].pid, merged[1].pid, "two workers of one process merged as one: {merged:?}");
    for (m, worker) in merged.iter().zip(best.keys()) {
        assert_eq!(m.clock, best[worker], "worker {worker}'s file moved by another worker's offset");
    }
    let pids: BTreeSet<i32> = decode(&dir.path().join("merged.pftrace")).iter().filter_map(|e| e.process).collect();
    assert_eq!(pids.len(), 3, "one process track each for the client and both workers: {pids:?}");
    rt.shutdown_background();
}
