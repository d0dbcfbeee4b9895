//! Python `map` ops through the service: a worker process runs each `{op = "map"}` in
//! Python children (`--python`; the functions are tests/python/service_map_fns.py, found
//! through `PYTHONPATH`), and a [`RemoteLoader`] in this process gets every sample of the
//! epoch once with the function applied, even when a child is SIGKILLed mid-epoch. The
//! expected pixels come from a local loader of the same spec without the `map` op.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sluice_client::RemoteLoader;
use sluice_core::{ErrorPolicy, OpSpec, PipelineSpec};
use sluice_pipeline::{Loader, Shard};

use crate::support::*;

const SIZE: usize = 32;

/// The repository's venv Python (what the project's tests run with: it has numpy), else
/// `python3`.
pub(crate) fn python() -> String {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    if venv.exists() {
        venv.display().to_string()
    } else {
        "python3".into()
    }
}

/// The flags that let the service run the test functions' module.
pub(crate) const ALLOW_FNS: &[&str] = &["--allow-python-module", "service_map_fns"];

pub(crate) fn fns_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python")
}

/// The service spec with `map(func)` after the crop (nothing random after it).
pub(crate) fn map_spec(root: &Path, func: &str) -> PipelineSpec {
    let mut s = spec(root, 11);
    s.ops.truncate(2);
    s.ops.push(OpSpec::map(func));
    s
}

/// Each sample's (label, pixels) from a local loader of `spec` without its `map` op.
pub(crate) fn local_images(spec: &PipelineSpec) -> HashMap<u64, (i64, Vec<u8>)> {
    let mut plain = spec.clone();
    plain.ops.retain(|op| !matches!(op, OpSpec::Map { .. }));
    let loader = Loader::new(plain, Shard::default()).unwrap();
    let mut out = HashMap::new();
    for b in loader.iter() {
        let b = b.unwrap();
        for (i, chunk) in b.images.as_bytes().chunks(SIZE * SIZE * 3).enumerate() {
            out.insert(b.keys[i], (b.labels[i], chunk.to_vec()));
        }
    }
    out
}

/// A worker process with `--python` and the test functions on `PYTHONPATH`.
pub(crate) fn python_worker(addr: &str, root: &Path, extra: &[&str]) -> Proc {
    let python = python();
    let mut flags = vec!["--python", python.as_str(), "--allow-python-module", "service_map_fns"];
    flags.extend(extra);
    let path = fns_dir().display().to_string();
    worker_process_env(addr, root, &flags, &[("PYTHONPATH", path.as_str())])
}

/// Reads one epoch; checks that every sample came once, inverted with key, label and epoch
/// in its first pixel (`service_map_fns.mark`). Calls `each_batch` after each batch.
pub(crate) fn check_epoch(
    loader: &mut RemoteLoader,
    local: &HashMap<u64, (i64, Vec<u8>)>,
    mut each_batch: impl FnMut(usize),
) {
    let mut keys = Vec::new();
    for (n, b) in loader.iter().enumerate() {
        let b = b.unwrap();
        for (i, got) in b.images.as_bytes().chunks(SIZE * SIZE * 3).enumerate() {
            let key = b.keys[i];
            let (label, plain) = &local[&key];
            assert_eq!(b.labels[i], *label, "key {key}");
            assert_eq!(&got[..3], &[(key % 256) as u8, (*label % 256) as u8, (b.epoch % 256) as u8], "key {key}");
            let inverted: Vec<u8> = plain[3..].iter().map(|v| 255 - v).collect();
            assert!(got[3..] == inverted[..], "key {key}: the pixels are not the local ones inverted");
            keys.push(key);
        }
        each_batch(n);
    }
    assert_exactly_once(keys, "an epoch through Python map");
}

/// The pids of `parent`'s children whose command line holds `needle`.
pub(crate) fn children_running(parent: u32, needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // `pid (comm) state ppid ...`; comm may hold spaces, so split after its `)`.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { continue };
        let ppid: u32 = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if ppid == parent && String::from_utf8_lossy(&cmdline).contains(needle) {
            out.push(pid);
        }
    }
    out
}

/// Slices named `name` begun in the Perfetto traces under `dir`, each with its `key`.
fn trace_slices(dir: &Path, name: &str) -> Vec<u64> {
    use prost::Message;
    use sluice_pipeline::trace::pb;
    use sluice_pipeline::trace::pb::debug_annotation::{NameField, Value};
    use sluice_pipeline::trace::pb::trace_packet::Data;
    use sluice_pipeline::trace::pb::track_event::{NameField as EventName, Type};
    let mut keys = Vec::new();
    for f in std::fs::read_dir(dir).unwrap() {
        let trace = pb::Trace::decode(std::fs::read(f.unwrap().path()).unwrap().as_slice()).unwrap();
        for p in trace.packet {
            let Some(Data::TrackEvent(e)) = p.data else { continue };
            let named = matches!(&e.name_field, Some(EventName::Name(n)) if n == name);
            if named && e.r#type == Some(Type::SliceBegin as i32) {
                let key = e.debug_annotations.iter().find_map(|a| match (&a.name_field, &a.value) {
                    (Some(NameField::Name(n)), Some(Value::UintValue(v))) if n == "key" => Some(*v),
                    _ => None,
                });
                keys.push(key.expect("a map slice without its sample's key"));
            }
        }
    }
    keys
}

fn metric(text: &str, op: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("sluice_worker_op_seconds") && l.contains(&format!("op=\"{op}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn a_python_map_runs_on_a_worker_once_per_sample_and_is_timed_as_an_op() {
    let _watchdog = watchdog("a_python_map_runs_on_a_worker_once_per_sample_and_is_timed_as_an_op", 60);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, ALLOW_FNS);
    let metrics_port = free_addr().rsplit_once(':').unwrap().1.to_string();
    let traces = dir.path().join("traces");
    std::fs::create_dir(&traces).unwrap();
    let trace_dir = traces.display().to_string();
    let _w = python_worker(&addr, &root, &["--metrics-port", &metrics_port, "--trace-dir", &trace_dir]);

    let s = map_spec(&root, "service_map_fns:mark");
    let local = local_images(&s);
    let mut remote = RemoteLoader::connect(&s, options(&addr, "map")).unwrap();
    let remote = within(45, "an epoch through Python map", move || {
        check_epoch(&mut remote, &local, |_| {});
        remote
    });
    assert_eq!(remote.epoch(), 1);
    // The function's time is the `map` op's, beside the native ones.
    let text = http_get(&format!("127.0.0.1:{metrics_port}"));
    assert!(metric(&text, "map") > 0.0, "no map op time in the worker's metrics:\n{text}");
    // And a `map` slice for every sample in the worker's trace (written as each task ends;
    // the client may have asked for the next epoch's first tasks too).
    let t0 = Instant::now();
    let traced = loop {
        let mut keys = trace_slices(&traces, "map");
        keys.sort_unstable();
        keys.dedup();
        if keys.len() >= IMAGES || t0.elapsed() > Duration::from_secs(10) {
            break keys;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_exactly_once(traced, "the samples with a map slice in the worker's trace");

    // What the function raises is the sample's error, skipped under on_error = "skip".
    let mut s = map_spec(&root, "service_map_fns:fail_on_key_5");
    s.on_error = ErrorPolicy::Skip;
    let mut remote = RemoteLoader::connect(&s, options(&addr, "map-skip")).unwrap();
    let (keys, remote) = within(45, "an epoch with a failing sample", move || {
        let keys: Vec<u64> = remote.iter().flat_map(|b| b.unwrap().keys).collect();
        (keys, remote)
    });
    let mut keys = keys;
    keys.sort_unstable();
    assert_eq!(keys, (0..IMAGES as u64).filter(|&k| k != 5).collect::<Vec<_>>());
    let skipped = remote.skipped();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0].key, 5);
    assert!(
        skipped[0].error.contains("service_map_fns:fail_on_key_5 raised ValueError: cannot augment sample 5"),
        "{}",
        skipped[0].error
    );
}

#[test]
fn a_python_child_killed_mid_epoch_is_restarted_and_every_sample_comes_once() {
    let _watchdog = watchdog("a_python_child_killed_mid_epoch_is_restarted_and_every_sample_comes_once", 60);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, ALLOW_FNS);
    let w = python_worker(&addr, &root, &[]);
    let worker_pid = w.id();

    let s = map_spec(&root, "service_map_fns:slow_mark");
    let local = local_images(&s);
    let mut remote = RemoteLoader::connect(&s, options(&addr, "map-kill")).unwrap();
    let killed = within(45, "an epoch with a Python child killed", move || {
        let mut killed = None;
        check_epoch(&mut remote, &local, |n| {
            if n != 0 {
                return;
            }
            // After the first batch: the one child (one thread) is busy with the next ones.
            let children = children_running(worker_pid, "service_map_fns:slow_mark");
            assert_eq!(children.len(), 1, "one Python child per worker thread: {children:?}");
            // SAFETY: kill(2) on a pid we just read as the worker's child.
            assert_eq!(unsafe { libc::kill(children[0] as i32, libc::SIGKILL) }, 0);
            killed = Some(children[0]);
        });
        killed.unwrap()
    });
    // The kill was mid-epoch: the worker started another child to finish it.
    let t0 = Instant::now();
    let now = loop {
        let now = children_running(worker_pid, "service_map_fns:slow_mark");
        if !now.contains(&killed) || t0.elapsed() > Duration::from_secs(5) {
            break now;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(now.len(), 1, "a new child replaced the killed {killed}: {now:?}");
    assert_ne!(now[0], killed);
}
