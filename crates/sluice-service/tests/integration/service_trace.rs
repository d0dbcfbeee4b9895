//! Service tracing end to end, with a dispatcher, two workers and a client in this process:
//! the client's trace holds both workers' batch builds and the trainer's events in one
//! timeline, each batch the trainer took flowing from exactly one build, forward in time
//! once the clocks are aligned; each worker's `--trace-dir` file holds its per-op events,
//! and [`sluice_service::merge_traces`] (`sluice trace-merge`) puts those into the client's
//! timeline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::time::Duration;

use prost::Message;
use sluice_client::RemoteLoader;
use sluice_pipeline::trace::pb;
use sluice_pipeline::trace::pb::debug_annotation::{NameField, Value};
use sluice_pipeline::trace::pb::trace_packet::Data;
use sluice_pipeline::trace::pb::track_event::{NameField as EventName, Type};

use crate::support::*;

/// A slice or instant read back from a Perfetto trace.
#[derive(Debug, Clone)]
struct Slice {
    name: String,
    track: u64,
    start: u64,
    end: u64,
    args: BTreeMap<String, i128>,
    flows: Vec<u64>,
    terminating: Vec<u64>,
}

struct Decoded {
    /// Process tracks: pid by track uuid.
    processes: BTreeMap<u64, i32>,
    /// Every track's parent (its process), by uuid.
    parent: BTreeMap<u64, u64>,
    slices: Vec<Slice>,
}

fn decode(path: &Path) -> Decoded {
    let trace = pb::Trace::decode(std::fs::read(path).unwrap().as_slice()).unwrap();
    let (mut processes, mut parent) = (BTreeMap::new(), BTreeMap::new());
    let mut open: HashMap<u64, Vec<Slice>> = HashMap::new();
    let mut slices = Vec::new();
    for p in trace.packet {
        match p.data {
            Some(Data::TrackDescriptor(t)) => {
                let uuid = t.uuid.unwrap();
                if let Some(proc) = t.process {
                    processes.insert(uuid, proc.pid.unwrap());
                }
                if let Some(thread) = t.thread {
                    // Thread tracks belong to their pid's process track.
                    let pid = thread.pid.unwrap();
                    let owner = processes.iter().find(|(_, &p)| p == pid).map(|(&u, _)| u).unwrap();
                    parent.insert(uuid, owner);
                }
                if let Some(up) = t.parent_uuid {
                    parent.insert(uuid, up);
                }
            }
            Some(Data::TrackEvent(e)) => {
                let ts = p.timestamp.unwrap();
                let track = e.track_uuid.unwrap();
                let name = match e.name_field {
                    Some(EventName::Name(n)) => n,
                    _ => String::new(),
                };
                let args = e
                    .debug_annotations
                    .iter()
                    .map(|a| {
                        let Some(NameField::Name(n)) = &a.name_field else { panic!("unnamed annotation") };
                        let v = match a.value {
                            Some(Value::UintValue(v)) => i128::from(v),
                            Some(Value::IntValue(v)) => i128::from(v),
                            ref other => panic!("annotation {n}: {other:?}"),
                        };
                        (n.clone(), v)
                    })
                    .collect();
                let slice = Slice {
                    name,
                    track,
                    start: ts,
                    end: ts,
                    args,
                    flows: e.flow_ids,
                    terminating: e.terminating_flow_ids,
                };
                match Type::try_from(e.r#type.unwrap()).unwrap() {
                    Type::SliceBegin => open.entry(track).or_default().push(slice),
                    Type::SliceEnd => {
                        let mut s = open.get_mut(&track).and_then(Vec::pop).expect("an end without a begin");
                        s.end = ts;
                        slices.push(s);
                    }
                    Type::Instant => slices.push(slice),
                    other => panic!("unexpected event type {other:?}"),
                }
            }
            _ => {}
        }
    }
    assert!(open.values().all(Vec::is_empty), "slices left open");
    Decoded { processes, parent, slices }
}

impl Decoded {
    /// The pid of the process a track belongs to.
    fn pid_of(&self, mut track: u64) -> i32 {
        loop {
            if let Some(&pid) = self.processes.get(&track) {
                return pid;
            }
            track = self.parent[&track];
        }
    }

    fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Slice> + 'a {
        self.slices.iter().filter(move |s| s.name == name)
    }
}

fn wait_for_workers(metrics: &str, n: f64) {
    let t0 = std::time::Instant::now();
    while metric_value(&http_get(metrics), "sluice_dispatcher_workers_live") != n {
        assert!(t0.elapsed() < Duration::from_secs(10), "{n} workers did not register");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_service_trace_puts_both_workers_and_the_client_in_one_timeline_with_aligned_flows() {
    let _watchdog =
        watchdog("a_service_trace_puts_both_workers_and_the_client_in_one_timeline_with_aligned_flows", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let traces = dir.path().join("traces");
    let addr = free_addr();
    let metrics = free_addr();
    let port = metrics.rsplit(':').next().unwrap().to_string();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &["--metrics-port", &port]);
    let workers: Vec<Server> =
        (0..2).map(|_| worker(&addr, &root, &["--trace-dir", traces.to_str().unwrap()])).collect();
    // The workers share this process's pid with the client: tracks named by OS pids would
    // fold into the client's, which the count of worker tracks below catches.
    let os_pids: BTreeSet<i32> = BTreeSet::from([std::process::id() as i32]);
    assert_eq!(workers.len(), 2);
    wait_for_workers(&metrics, 2.0);

    let mut loader = RemoteLoader::connect(&spec(&root, 5), options(&addr, "traced")).unwrap();
    loader.start_trace().unwrap();
    assert!(loader.start_trace().is_err(), "a second trace at once is refused");
    let mut consumed = Vec::new();
    for epoch in 0..2 {
        let mut keys = Vec::new();
        for b in loader.iter() {
            let b = b.unwrap();
            consumed.push((b.epoch, b.index));
            keys.extend(b.keys);
            std::thread::sleep(Duration::from_millis(2)); // the trainer's step
        }
        assert_exactly_once(keys, &format!("epoch {epoch}"));
    }
    let trace = loader.stop_trace().unwrap();
    assert!(loader.stop_trace().is_none());
    let path = dir.path().join("client.pftrace");
    trace.write(&path).unwrap();

    let t = decode(&path);
    let client_pid = std::process::id() as i32;
    let pids: BTreeSet<i32> = t.processes.values().copied().collect();
    // Workers go by their trace ids, not their OS pids (1 in every container).
    let worker_pids: BTreeSet<i32> = pids.iter().copied().filter(|&p| p != client_pid).collect();
    assert!(
        pids.contains(&client_pid) && worker_pids.len() == 2,
        "a process track for the client and each worker: {pids:?}"
    );
    assert!(worker_pids.is_disjoint(&os_pids), "workers' tracks named by OS pids {worker_pids:?}");

    // Each batch the trainer took: one hand-over on the client, flowing from exactly one
    // build on a worker.
    let handed: Vec<&Slice> = t.named("batch_handed_over").collect();
    let got: Vec<(u64, u64)> = handed.iter().map(|s| (s.args["epoch"] as u64, s.args["batch"] as u64)).collect();
    assert_eq!(got, consumed, "one hand-over per batch taken, in order");
    let builds: Vec<&Slice> = t.named("batch_built").collect();
    let received: HashMap<(i128, i128), &Slice> =
        t.named("batch_received").map(|s| ((s.args["epoch"], s.args["batch"]), s)).collect();
    let mut builders = BTreeSet::new();
    for h in &handed {
        assert_eq!(t.pid_of(h.track), client_pid, "hand-overs are on the client's tracks");
        assert_eq!(h.terminating.len(), 1, "{h:?}");
        let from: Vec<&&Slice> = builds.iter().filter(|b| b.flows.contains(&h.terminating[0])).collect();
        assert_eq!(from.len(), 1, "batch {:?}: flows from {} builds", (h.args["epoch"], h.args["batch"]), from.len());
        let b = from[0];
        assert_eq!((b.args["epoch"], b.args["batch"]), (h.args["epoch"], h.args["batch"]));
        let pid = t.pid_of(b.track);
        assert!(worker_pids.contains(&pid), "batch built on a worker's track, not pid {pid}");
        builders.insert(pid);
        // On one machine both clocks are one: the true offset, 0, lies within the bound.
        let (offset, bound) = (b.args["clock_offset_ns"], b.args["clock_error_ns"]);
        assert!(offset.abs() <= bound, "clock offset {offset} ns outside its error bound {bound} ns");
        assert!(bound < 50_000_000, "an error bound of {bound} ns on loopback");
        // Forward in time: built, then received, then handed over.
        let r = received[&(b.args["epoch"], b.args["batch"])];
        assert!(b.start < b.end, "{b:?}");
        assert!(b.end <= r.start, "batch built until {} but received at {}", b.end, r.start);
        assert!(r.start <= h.start, "batch received at {} but handed over at {}", r.start, h.start);
    }
    assert_eq!(builders, worker_pids, "both workers built batches the trainer took");
    // The trainer's side of each batch.
    assert_eq!(t.named("batch_wait").count(), consumed.len());
    assert!(t.named("batch_consumed").all(|s| s.end - s.start >= 2_000_000), "a step of 2 ms at least");
    // The trainer came back after each, the last one included (the epoch's end).
    assert_eq!(t.named("batch_consumed").count(), consumed.len());

    // Each worker's own trace: its per-op events per sample, written as its tasks ended.
    let t0 = std::time::Instant::now();
    loop {
        let files: Vec<_> = std::fs::read_dir(&traces).unwrap().map(|e| e.unwrap().path()).collect();
        let decoded: Vec<Decoded> = files.iter().map(|f| decode(f)).collect();
        let built: usize = decoded.iter().map(|d| d.named("batch_preprocessed").count()).sum();
        if built >= consumed.len() {
            let mut names: Vec<String> =
                files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into()).collect();
            names.sort();
            let worker_ids: BTreeSet<i128> = builds.iter().map(|b| b.args["worker_id"]).collect();
            let expected: Vec<String> =
                worker_ids.iter().map(|w| format!("job-{}-worker-{w}.pftrace", loader.job().job_id)).collect();
            assert_eq!(names, expected, "one file per job and worker, named by their ids");
            for (d, f) in decoded.iter().zip(&files) {
                let pids: BTreeSet<i32> = d.processes.values().copied().collect();
                assert_eq!(pids.len(), 1, "{f:?}: one process");
                assert!(worker_pids.is_superset(&pids), "{f:?}: a worker's pid");
                let decodes: Vec<&Slice> = d.slices.iter().filter(|s| s.name.starts_with("decode")).collect();
                assert!(!decodes.is_empty(), "{f:?}: no decode events");
                assert!(decodes.iter().all(|s| s.args.contains_key("key") && s.end > s.start));
            }
            merged_into_one_timeline(&path, &files, &t, &decoded, &dir.path().join("merged.pftrace"));
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "workers wrote {built} of {} batches", consumed.len());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// [`sluice_service::merge_traces`] (what `sluice trace-merge` runs) of the client's trace and the workers' files: every worker event
/// lands in one timeline, each worker's `batch_preprocessed` where the client saw that
/// batch built (the same span, moved by offsets each within their bound of the truth).
fn merged_into_one_timeline(client: &Path, files: &[std::path::PathBuf], t: &Decoded, own: &[Decoded], out: &Path) {
    let merged = sluice_service::merge_traces(client, files, out).unwrap();
    assert_eq!(merged.len(), files.len(), "one merged worker per file: {merged:?}");
    let m = decode(out);
    let pids: BTreeSet<i32> = m.processes.values().copied().collect();
    assert_eq!(pids, t.processes.values().copied().collect(), "the same processes: the client and both workers");
    // The workers may still be appending (tasks prefetched past the trainer's last batch):
    // what the merge took lies between the file before and the file after.
    for (before, f) in own.iter().zip(files) {
        let pid = *before.processes.values().next().unwrap();
        let ops =
            |x: &Decoded| x.slices.iter().filter(|s| s.name.starts_with("decode") && x.pid_of(s.track) == pid).count();
        let (merged, after) = (ops(&m), ops(&decode(f)));
        assert!(
            ops(before) <= merged && merged <= after,
            "worker {pid}: {merged} per-op slices merged, its file had {} then {after}",
            ops(before)
        );
    }
    let preprocessed: Vec<&Slice> = m.named("batch_preprocessed").collect();
    for b in t.named("batch_built") {
        let (pid, slack) = (t.pid_of(b.track), 2 * b.args["clock_error_ns"] as u64 + 2);
        let near = |x: u64, y: u64| x.abs_diff(y) <= slack;
        assert!(
            preprocessed.iter().any(|s| m.pid_of(s.track) == pid && near(s.start, b.start) && near(s.end, b.end)),
            "batch {:?}: no batch_preprocessed of worker {pid} within {slack} ns of {b:?}",
            (b.args["epoch"], b.args["batch"])
        );
    }
}
