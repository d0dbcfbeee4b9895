//! `sluice-bench locality` end to end: real `sluice run --rank` learner processes on one
//! shared throttled link, on loopback and, where network namespaces can be made, across
//! bandwidth-limited veth links shaped by `tc`.

#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The `sluice` binary the learners run: beside `sluice-bench` (`cargo build -p sluice-cli`;
/// `cargo test --workspace` builds it).
fn sluice() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_sluice-bench")).with_file_name("sluice");
    assert!(exe.is_file(), "{} is missing: build it first with `cargo build -p sluice-cli`", exe.display());
    exe
}

/// Runs the benchmark small (killed after `secs`); its JSON points and its process id.
fn bench(dir: &std::path::Path, extra: &[&str], secs: u64) -> (Vec<Value>, u32) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args(["locality", "--out"])
        .arg(dir)
        .args(["--samples", "128", "--side", "64", "--batch", "8", "--compute-us", "2000", "--runs", "1"])
        .args(["--storage-mb-s", "1", "--cache-fraction", "0.25", "--json"])
        .args(extra)
        .env("SLUICE_LOG", "warn")
        .env("SLUICE_BIN", sluice())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (mut stdout, mut stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out = std::thread::spawn(move || {
        let mut s = Vec::new();
        stdout.read_to_end(&mut s).map(|_| s)
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        stderr.read_to_string(&mut s).map(|_| s)
    });
    let deadline = Instant::now() + Duration::from_secs(secs);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sluice-bench locality still running after {secs} s: {}", err.join().unwrap().unwrap());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (out.join().unwrap().unwrap(), err.join().unwrap().unwrap());
    assert!(status.success(), "sluice-bench locality failed: {err}");
    let v: Value = serde_json::from_slice(&out).unwrap();
    (v["points"].as_array().unwrap().clone(), pid)
}

fn point<'a>(points: &'a [Value], mode: &str, throttled: bool) -> &'a Value {
    points
        .iter()
        .find(|p| p["config"]["mode"] == mode && p["config"]["storage_mb_s"].is_null() != throttled)
        .unwrap_or_else(|| panic!("no {mode} point in {points:?}"))
}

#[test]
fn learner_processes_share_the_link_and_the_aware_job_reads_no_storage_after_epoch_one() {
    let dir = tempfile::tempdir().unwrap();
    let (points, _) = bench(dir.path(), &["--learners", "4", "--baseline", "4"], 120);
    let aware = point(&points, "aware", true);
    let base = point(&points, "baseline", true);
    assert_eq!(aware["storage_reads"], 0.0, "{aware}");
    assert!(aware["from_peers"].as_f64().unwrap() > 0.0, "{aware}");
    // 128 samples of ~4 kB over one 1 MB/s link: the baseline's epoch is storage-bound at
    // ~0.55 s whatever p is; the aware job's is 32 cached samples per learner (~0.15 s).
    let (a, b) = (aware["median_s"].as_f64().unwrap(), base["median_s"].as_f64().unwrap());
    assert!(b > 0.45, "the baseline did not share one throttled link: {b:.3}s");
    assert!(a * 2.0 < b, "aware {a:.3}s vs baseline {b:.3}s");
}

#[test]
fn peers_in_network_namespaces_talk_over_shaped_links() {
    let probe = format!("sluice-probe-{}", std::process::id());
    let made = Command::new("ip").args(["netns", "add", &probe]).output();
    if !matches!(&made, Ok(o) if o.status.success()) {
        eprintln!(
            "SKIPPED peers_in_network_namespaces_talk_over_shaped_links: cannot create a network namespace \
             (needs root and iproute2): {made:?}"
        );
        return;
    }
    let _ = Command::new("ip").args(["netns", "del", &probe]).output();
    let dir = tempfile::tempdir().unwrap();
    let (points, pid) = bench(dir.path(), &["--learners", "4", "--baseline", "4", "--netns-mbit", "40"], 120);
    let aware = point(&points, "aware", true);
    assert!(aware["from_peers"].as_f64().unwrap() > 0.0, "{aware}");
    // Each peer reply is 64×64×3 decoded bytes, and all of it crossed the shaped links.
    let sent = aware["link_bytes"].as_u64().unwrap();
    assert!(sent as f64 >= aware["from_peers"].as_f64().unwrap() * 64.0 * 64.0 * 3.0, "{aware}");
    let left = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let listed = String::from_utf8_lossy(&left.stdout);
    let mine = format!("sluice-{pid}-");
    assert!(!listed.lines().any(|l| l.starts_with(&mine)), "namespaces left behind: {listed}");
}
