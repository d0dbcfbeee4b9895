//! `sluice stream-push`: a real `sluice` process pushes a dataset into a real
//! `redis-server`, and a stream loader reads every sample back once, task after task.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use sluice_stream::{StreamLoader, StreamSpec};

fn redis(dir: &std::path::Path) -> (Proc, String) {
    let port = free_addr().rsplit(':').next().unwrap().to_string();
    let mut cmd = Command::new("redis-server");
    cmd.args(["--bind", "127.0.0.1", "--port", &port, "--save", "", "--dir", dir.to_str().unwrap()])
        .stdout(Stdio::null());
    die_with_parent(&mut cmd);
    let p = Proc(cmd.spawn().expect("redis-server must be installed (scripts/setup.sh)"));
    let t0 = Instant::now();
    while std::net::TcpStream::connect(format!("127.0.0.1:{port}")).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(10), "redis-server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (p, format!("redis://127.0.0.1:{port}/"))
}

#[test]
fn stream_push_sends_every_sample_once_in_class_incremental_tasks() {
    let _w = watchdog("stream-push", 60);
    let dir = tempfile::tempdir().unwrap();
    let (_redis, url) = redis(dir.path());
    let root = dataset(dir.path());
    let root_s = root.to_str().unwrap();
    let args = ["stream-push", root_s, "--url", &url, "--stream", "s", "--rate", "2000/s"];
    let mut push = sluice(&[&args[..], &["--order", "class-incremental", "--classes-per-task", "2"]].concat());
    assert!(push.0.wait().unwrap().success(), "stream-push failed");

    let ops = serde_json::json!([{"op": "decode"}, {"op": "resize", "size": 16}, {"op": "center_crop", "size": 16}]);
    let spec: StreamSpec = serde_json::from_value(serde_json::json!({
        "url": url, "stream": "s", "group": "g", "ops": ops, "new_per_batch": 4, "threads": 1
    }))
    .unwrap();
    let mut loader = StreamLoader::new(spec).unwrap();
    let (mut keys, mut labels) = (Vec::new(), Vec::new());
    while let Some(b) = loader.next_batch().unwrap() {
        keys.extend(b.batch.keys);
        labels.extend(b.batch.labels);
    }
    assert_exactly_once(keys, "pushed and read back");
    let tasks: Vec<i64> = labels.iter().map(|l| l / 2).collect();
    assert!(tasks.windows(2).all(|w| w[0] <= w[1]), "tasks of 2 classes in order: {labels:?}");
    assert!(labels[..IMAGES / 2].contains(&0) && labels[..IMAGES / 2].contains(&1), "each task is mixed");

    let mut bad = sluice(&["stream-push", root_s, "--url", &url, "--rate", "fast"]);
    assert!(!bad.0.wait().unwrap().success(), "a bad rate is refused");
    // A rate so small that the time to a sample is no `Duration`: refused, naming the flag,
    // where it used to panic in `Duration::from_secs_f64` at the second sample.
    for rate in ["1e-310", "1e-300/s"] {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["stream-push", root_s, "--url", &url, "--stream", "tiny", "--rate", rate])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--rate {rate}: a usage error, not {}:\n{stderr}", out.status);
        assert!(stderr.contains("--rate") && !stderr.contains("panicked"), "{stderr}");
    }
}
